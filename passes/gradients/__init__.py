"""Gradient rules, one per op family, registered by op_type.

A rule is a function ``rule(ctx) -> {input_slot: grad_tensor_id}`` for the slots ``ctx.needs``.
It reads forward tensors only through ``ctx.x(i)`` / ``ctx.y(i)``, and the context records each
read as *saved* (kept alive from the forward to the backward), so what the backward keeps is
explicit and minimal: Relu's rule reads its output, never its input. Shapes and constant inputs
(``ctx.x_shape``, ``ctx.const_input``) are free: they are static or part of the constant base.

``register`` also states which input slots are differentiable (the others, such as Reshape's
shape or Gather's indices, never get a gradient) and which optional forward outputs the rule
needs added to the forward node (MaxPool's Indices, SoftmaxCrossEntropyLoss's log_prob, ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from passes.gradients._emit import Emitter
from planner.errors import ModelImportError
from planner.graph import NO_TENSOR, Node, Tensor

#: extra_outputs(node, tensor_of, value_of) -> {output slot: (name suffix, dtype, shape)}; value_of(t)
#: is a constant tensor's value or None.
ExtraOutputs = Callable[
    [Node, Callable[[int], Tensor], Callable[[int], "np.ndarray | None"]],
    Mapping[int, tuple[str, str, tuple[int, ...]]],
]
#: differentiable(node) -> input slots that can carry a gradient
Differentiable = Callable[[Node], Sequence[int]]


@dataclass
class BackwardContext:
    """What a rule sees of one forward node (ids are the training graph's)."""

    node: Node
    em: Emitter
    dys: tuple[int | None, ...]  # gradient of each output, None where nothing flows back
    need: frozenset[int]  # input slots that want a gradient
    values: Mapping[int, np.ndarray]  # constant (FROZEN initializer) values by tensor id
    saved: list[int] = field(default_factory=list)  # forward tensors this rule read
    # forward outputs a rule reads another tensor in place of (autodiff._guarded_softmaxes)
    stand_in: Mapping[int, int] = field(default_factory=dict)

    @property
    def opset(self) -> int:
        return self.em.opset

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def int_list(self, name: str, default: Sequence[int]) -> list[int]:
        """An ints attribute as a list; ``default`` where it is absent or empty."""
        value = self.attr(name)
        return [int(v) for v in value] if value is not None and len(value) else list(default)

    def needs(self, i: int) -> bool:
        return i in self.need

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] != NO_TENSOR

    def x(self, i: int) -> int:
        """Forward input ``i`` (recorded as saved for the backward)."""
        return self._save(self.node.inputs[i])

    def y(self, i: int = 0) -> int:
        """Forward output ``i`` (recorded as saved for the backward)."""
        t = self.node.outputs[i]
        return self._save(self.stand_in.get(t, t))

    def dy(self, i: int = 0) -> int | None:
        return self.dys[i] if i < len(self.dys) else None

    def x_shape(self, i: int) -> tuple[int, ...]:
        return self.em.shape(self.node.inputs[i])

    def y_shape(self, i: int = 0) -> tuple[int, ...]:
        return self.em.shape(self.node.outputs[i])

    def x_dtype(self, i: int) -> str:
        return self.em.dtype(self.node.inputs[i])

    def const_input(self, i: int) -> np.ndarray | None:
        """The value of input ``i`` if it is a constant initializer (not saved: it is always alive)."""
        return self.const_value(self.node.inputs[i]) if self.has_input(i) else None

    def require_const(self, i: int, what: str) -> np.ndarray:
        """:meth:`const_input`, or a one-line refusal naming the node and ``what`` input ``i`` is."""
        value = self.const_input(i)
        if value is None:
            raise ModelImportError(
                f"node {self.node.name!r} ({self.node.op_type}) has a {what} computed at run time; memplan needs it "
                "constant to build the gradient (bind symbolic dims with --dim so the importer can fold it)"
            )
        return value

    def const_value(self, t: int) -> np.ndarray | None:
        """The value of tensor ``t`` if it is a constant initializer."""
        return None if t == NO_TENSOR else self.values.get(t)

    def _save(self, t: int) -> int:
        if t not in self.saved:
            self.saved.append(t)
        return t


Rule = Callable[[BackwardContext], Mapping[int, int]]


@dataclass(frozen=True)
class GradRule:
    op_type: str
    backward: Rule
    differentiable: Differentiable  # input slots that can carry a gradient
    extra_outputs: ExtraOutputs | None = None  # optional forward outputs the rule reads
    # Output slots whose gradient the rule uses; None = all (Split). Other outputs (LayerNorm's
    # Mean, MaxPool's Indices, ...) are treated as not differentiable.
    grad_outputs: tuple[int, ...] | None = (0,)
    # Input slots the outputs left out of the gradient are computed from; None = every slot. LayerNorm's
    # Mean reads X only, not Scale: the loss may read it where X depends on no trainable initializer.
    left_out_from: tuple[int, ...] | None = None

    def carries(self, slot: int) -> bool:
        return self.grad_outputs is None or slot in self.grad_outputs


#: op_type -> rule. Filled by the rule modules imported at the bottom.
RULES: dict[str, GradRule] = {}
#: Ops whose float outputs carry no gradient (piecewise constant or random): the path stops there.
STOP_GRADIENT = frozenset({
    "Floor", "Ceil", "Round", "Sign", "RandomNormalLike", "RandomUniformLike", "RandomNormal", "RandomUniform",
    "ConstantOfShape", "Range", "EyeLike", "Shape", "Size", "ArgMax", "ArgMin", "NonZero",
    "Bernoulli", "Multinomial", "Hardmax",
})


def register(
    *op_types: str,
    inputs: Sequence[int] | Differentiable | None = (0,),
    extra_outputs: ExtraOutputs | None = None,
    outputs: tuple[int, ...] | None = (0,),
    left_out_from: tuple[int, ...] | None = None,
) -> Callable[[Rule], Rule]:
    """Register ``fn`` as the rule of ``op_types``; ``inputs=None`` / ``outputs=None`` mean every slot;
    ``left_out_from``: the input slots the outputs outside ``outputs`` are computed from (None: all)."""

    if inputs is None:
        diff: Differentiable = lambda node: range(len(node.inputs))  # noqa: E731
    elif callable(inputs):
        diff = inputs
    else:
        fixed = tuple(inputs)
        diff = lambda node: [i for i in fixed if i < len(node.inputs)]  # noqa: E731

    def deco(fn: Rule) -> Rule:
        for op in op_types:
            if op in RULES:
                raise ValueError(f"two gradient rules for {op}")
            RULES[op] = GradRule(op, fn, diff, extra_outputs, outputs, left_out_from)
        return fn

    return deco


def supported_ops() -> list[str]:
    """Op types with a gradient rule, sorted."""
    return sorted(RULES)


# Rule modules register themselves on import (order does not matter).
from passes.gradients import elementwise, fourier, linalg, conv, norm, sampling, shape  # noqa: E402,F401
