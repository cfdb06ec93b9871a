"""Optimizer update step appended to a training graph: SGD (momentum) or Adam, torch semantics.

State is explicit: each state tensor is a graph input (``<param>_momentum``, ``<param>_adam_m``,
``<param>_adam_v``, the shared ``adam_step`` count) and its new value an output (``..._new``), so a
caller (``passes/training.py``) feeds the outputs of one step into the next. Initial state is zeros.
Weight decay is the L2 term ``g + wd * p`` of torch.optim.SGD/Adam.

Adam on a float16 or bfloat16 parameter keeps its moments and does its arithmetic in float32 (as
mixed-precision training's fp32 optimizer state does) and rounds only the updated parameter back:
in float16 its eps (1e-8) is 0 and a squared gradient below ~2e-4 is 0, so the first update
divided 0 by 0 and training went NaN at step 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from passes.gradients._emit import Emitter
from passes.onnx_import import DTYPE_TO_ONNX
from planner.errors import ModelImportError, UsageError
from planner.graph import HALF_DTYPES

OPTIMIZERS = ("none", "sgd", "adam")


@dataclass(frozen=True)
class OptimizerOptions:
    kind: str = "none"  # none | sgd | adam
    lr: float = 0.01  # learning rate
    momentum: float = 0.0  # SGD momentum (no dampening, not Nesterov); 0 adds no state
    beta1: float = 0.9  # Adam first-moment decay
    beta2: float = 0.999  # Adam second-moment decay
    eps: float = 1e-8  # Adam denominator guard
    weight_decay: float = 0.0  # L2 penalty folded into the gradient

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise UsageError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.kind!r}")
        rules = {"--lr": lambda v: v > 0, "--momentum": lambda v: 0 <= v < 1, "--beta1": lambda v: 0 <= v < 1,
                 "--beta2": lambda v: 0 <= v < 1, "--weight-decay": lambda v: v >= 0, "eps": lambda v: v > 0}
        values = {"--lr": self.lr, "--momentum": self.momentum, "--beta1": self.beta1, "--beta2": self.beta2,
                  "--weight-decay": self.weight_decay, "eps": self.eps}
        for flag, value in values.items():
            if not (rules[flag](value) and math.isfinite(value)):
                raise UsageError(f"{flag} {value} is out of range (lr > 0; momentum, betas in [0, 1); decay >= 0)")
        for flag, value in values.items():
            # the step writes it as a float32 constant: 1e39 became inf, 1e-50 zero and 0.9999999999
            # one, and training silently went NaN or stood still (fuzzed, stop 50)
            with np.errstate(over="ignore", under="ignore"):
                as32 = float(np.float32(value))
            if not (rules[flag](as32) and math.isfinite(as32)):
                raise UsageError(f"{flag} {value} is {as32:g} as the float32 the training step computes in "
                                 "(lr > 0; momentum, betas below 1; decay finite); pick a value float32 holds")


@dataclass(frozen=True)
class StateSlot:
    input: str  # graph input holding the state before the step
    output: str  # graph output holding it after the step
    initial: np.ndarray  # value to feed before the first step


def plausible_state(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``feeds`` with the optimizer state among them made what a run can hold: Adam's second moments
    (``*_adam_v``) non-negative and its step count (``adam_step``) a whole number >= 1. Seeded random
    normals there (models.example_feeds) take square roots of negatives: every update is NaN."""
    out = dict(feeds)
    for name, value in feeds.items():
        if name.endswith("_adam_v"):
            out[name] = np.abs(value)
        elif name == "adam_step":
            out[name] = np.asarray(np.floor(np.abs(value)) + 1, dtype=value.dtype)
    return out


class OptimizerStep:
    """Emits one parameter's update when its gradient is complete; collects outputs in param order."""

    def __init__(self, em: Emitter, options: OptimizerOptions, params: list[int]):
        self.em, self.opt = em, options
        self.enabled = options.kind != "none"
        self.updates: dict[str, str] = {}
        self.state: list[StateSlot] = []
        self._new: dict[int, int] = {}  # param id -> updated value
        suffixes = {"sgd": ["momentum"] if options.momentum else [], "adam": ["adam_m", "adam_v"]}
        if self.enabled:
            self._refuse_taken_names(params, suffixes[options.kind])
        if options.kind == "adam":
            self._init_adam_step()
        self._inputs = {p: [self._state_input(p, s, self._math_dtype(p)) for s in suffixes.get(options.kind, [])]
                        for p in params}

    def _refuse_taken_names(self, params: list[int], suffixes: list[str]) -> None:
        """Every name the update gives (``<param>_new``, each state and its ``_new``, ``adam_step``)
        must be free: a model tensor named ``W_momentum`` stopped the build with "tensor name
        'W_momentum' is used twice", exit 1, and no word of what to rename."""
        names = [("the step count", n) for n in ("adam_step", "adam_step_new") if self.opt.kind == "adam"]
        for p in params:
            param = self.em.tensor(p).name
            names.append((f"the update of {param!r}", f"{param}_new"))
            for suffix in suffixes:
                names += [(f"the {suffix} state of {param!r}", f"{param}_{suffix}{end}") for end in ("", "_new")]
        taken: set[str] = set()
        for what, name in names:
            if name in taken or self.em.b.has(name):
                raise ModelImportError(f"cannot name {what} in the {self.opt.kind} step: the model already has a "
                                       f"tensor {name!r}, the name the step gives it; rename that tensor in the model")
            taken.add(name)

    def _init_adam_step(self) -> None:
        em, b = self.em, self.em.b
        step = b.input("adam_step", "float32", ())
        em.begin("adam_step")
        t = em.add(step, em.scalar(1.0, step), out_name="adam_step_new")
        self.state.append(StateSlot("adam_step", "adam_step_new", np.zeros((), np.float32)))
        one = em.scalar(1.0, step)
        bc1 = em.sub(one, em.binary("Pow", em.scalar(self.opt.beta1, step), t))
        bc2 = em.sub(one, em.binary("Pow", em.scalar(self.opt.beta2, step), t))
        self._lr_t = em.div(em.scalar(self.opt.lr, step), bc1)  # lr / (1 - beta1^t)
        self._sqrt_bc2 = em.unary("Sqrt", bc2)

    def _math_dtype(self, param: int) -> str:
        """Element type of ``param``'s Adam state and update math: float32 for float16/bfloat16."""
        dtype = self.em.dtype(param)
        return "float32" if self.opt.kind == "adam" and dtype in HALF_DTYPES else dtype

    def _state_input(self, param: int, suffix: str, dtype: str) -> int:
        p = self.em.tensor(param)
        name = f"{p.name}_{suffix}"
        self.state.append(StateSlot(name, f"{name}_new", np.zeros(p.shape, dtype=dtype)))
        return self.em.b.input(name, dtype, p.shape)

    def update(self, param: int, grad: int) -> None:
        if not self.enabled:
            return
        em, o = self.em, self.opt
        name = em.tensor(param).name
        if o.weight_decay:
            grad = em.add(grad, em.scale(param, o.weight_decay))
        if o.kind == "sgd":
            step = grad
            if o.momentum:
                (v,) = self._inputs[param]
                step = em.add(em.scale(v, o.momentum), grad, out_name=f"{name}_momentum_new")
            new = em.sub(param, em.scale(step, o.lr), out_name=f"{name}_new")
        else:
            m, v = self._inputs[param]
            dtype = self._math_dtype(param)
            grad = em.cast(grad, dtype)
            m_new = em.add(em.scale(m, o.beta1), em.scale(grad, 1 - o.beta1), out_name=f"{name}_adam_m_new")
            v_new = em.add(em.scale(v, o.beta2), em.scale(em.mul(grad, grad), 1 - o.beta2),
                           out_name=f"{name}_adam_v_new")
            denom = em.add(em.div(em.unary("Sqrt", v_new), em.cast(self._sqrt_bc2, dtype)), em.scalar(o.eps, v_new))
            step = em.mul(em.div(m_new, denom), em.cast(self._lr_t, dtype))
            if dtype == em.dtype(param):
                new = em.sub(param, step, out_name=f"{name}_new")
            else:  # one rounding, of the updated value
                low = em.dtype(param)
                new = em.op("Cast", [em.sub(em.cast(param, dtype), step)], em.shape(param), low,
                            out_name=f"{name}_new", to=DTYPE_TO_ONNX[low])
        self._new[param] = new
        self.updates[name] = f"{name}_new"

    def outputs(self) -> list[int]:
        """Updated parameters in parameter order, then the state outputs in ``self.state`` order."""
        return [self._new[p] for p in sorted(self._new)] + [self.em.b.id(s.output) for s in self.state]
