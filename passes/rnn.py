"""Unroll ONNX ``LSTM``, ``GRU`` and ``RNN`` nodes into primitive ops, one time step at a time.

Autodiff has no rule for the fused recurrent ops; unrolled, every step is Gemm, Split, Add, Mul,
Clip and the activation ops, which all have one. Per-step tensors are also what the memory
planner wants: each step's gates are small activations it can free or recompute on their own. Each
step projects its own input (not all steps in one Gemm), so the backward adds each step's weight
gradient as it comes instead of holding every step's gate gradients for one big Gemm.

Per node and direction (``d``: 0 forward, 1 the reverse half of a bidirectional node)::

    per step t, in time order (reversed for the reverse direction):
      xw_t = Gemm(X_t, W[d], Wb + Rb, transB=1)            # [B, G*H], G gates; X_t from one Split of X
      LSTM  i,o,f,c = Split(Gemm(H, R[d], xw_t, transB=1)); peepholes; C' = f*C + i*g(c); H' = o*h(C')
      GRU   z,r = f(xw_t[zr] + H R[d][zr]^T);  h = g(...) per linear_before_reset;  H' = h + z*(H - h)
      RNN   H' = f(Gemm(H, R[d], xw_t, transB=1))

(GRU with linear_before_reset=1 keeps ``Rbh`` on the recurrent side, inside the reset gate's
product, as the ONNX spec says.) Y, Y_h and Y_c are Concats/Reshapes of the step states (a
Transpose more for layout=1); a missing initial_h / initial_c is a runtime zero (ConstantOfShape).

Pre: a validated Graph with static shapes. Supported: directions forward/reverse/bidirectional,
layout 0 and 1, B, initial_h, initial_c, P (peepholes), clip, input_forget (f = 1 - i, as ORT),
linear_before_reset, and activations Sigmoid, Tanh, Relu, LeakyRelu, ThresholdedRelu, HardSigmoid,
Elu, Softsign, Softplus, Affine, ScaledTanh with activation_alpha/beta consumed in order.
Refused with ModelImportError naming the node: sequence_lens unless a constant equal to the full
length everywhere, an unknown attribute or activation, a defaulted alpha the runtimes disagree on
(Affine, ScaledTanh, ThresholdedRelu), non-float types, a zero-length sequence.
Post: a validated Graph where the chosen nodes are gone. Tensor ids of the input graph are kept
(the outputs Y, Y_h, Y_c keep id and name; new tensors are appended); node ids shift.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from planner.errors import FREEZE_HINT, GraphError, ModelImportError
from planner.graph import FLOAT_DTYPES, NO_TENSOR, Graph, GraphAppender, Node, TensorKind

#: Op types this pass unrolls (default ONNX domain).
RECURRENT_OPS = ("LSTM", "GRU", "RNN")
#: Gates stacked in W/R (LSTM iofc, GRU zrh, RNN one).
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: The spec's default activations per direction (f, g, h for LSTM; f, g for GRU; f for RNN).
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"), "RNN": ("Tanh",)}
_COMMON_ATTRS = frozenset({"activation_alpha", "activation_beta", "activations", "clip", "direction",
                           "hidden_size", "layout"})
_ATTRS = {"LSTM": _COMMON_ATTRS | {"input_forget"}, "GRU": _COMMON_ATTRS | {"linear_before_reset"},
          "RNN": _COMMON_ATTRS}
#: lower-case activation -> (uses alpha, uses beta, default alpha, default beta). A None default
#: must be given: ORT takes 0 where the spec points at the ONNX op's default (ThresholdedRelu 1.0)
#: or at no op at all (Affine, ScaledTanh), so guessing could silently disagree with the runtime.
_ACTIVATIONS: dict[str, tuple[bool, bool, float | None, float | None]] = {
    "sigmoid": (False, False, 0.0, 0.0), "tanh": (False, False, 0.0, 0.0), "relu": (False, False, 0.0, 0.0),
    "softsign": (False, False, 0.0, 0.0), "softplus": (False, False, 0.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0), "elu": (True, False, 1.0, 0.0), "hardsigmoid": (True, True, 0.2, 0.5),
    "thresholdedrelu": (True, False, None, 0.0), "affine": (True, True, None, None),
    "scaledtanh": (True, True, None, None),
}


def is_recurrent(node: Node) -> bool:
    return node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx")


def unroll_recurrent(graph: Graph, nodes: Iterable[int] | None = None) -> Graph:
    """Replace the recurrent nodes ``nodes`` (default: all of them) by their unrolled steps.

    Returns ``graph`` itself when there is nothing to unroll."""
    chosen = {n.id for n in graph.nodes if is_recurrent(n)} if nodes is None else set(nodes)
    if not chosen:
        return graph
    return _Unroller(graph).run(chosen)


# ---- what a node asks for ------------------------------------------------------------------------
@dataclass(frozen=True)
class _Act:
    name: str  # lower case, a key of _ACTIVATIONS
    alpha: float
    beta: float


@dataclass(frozen=True)
class _Spec:
    node: Node
    dtype: str
    steps: int  # T
    batch: int  # B
    inputs: int  # I
    hidden: int  # H
    directions: int  # 1 or 2
    reverse: tuple[bool, ...]  # per direction: walks time backwards
    layout: int  # 0: [T, B, ...] tensors, 1: [B, T, ...]
    clip: float | None
    acts: tuple[tuple[_Act, ...], ...]  # per direction, in the spec's order (f, g, h)

    def input(self, slot: int) -> int:
        return self.node.inputs[slot] if slot < len(self.node.inputs) else NO_TENSOR

    def output(self, slot: int) -> int:
        return self.node.outputs[slot] if slot < len(self.node.outputs) else NO_TENSOR

    def order(self, d: int) -> range:
        return range(self.steps - 1, -1, -1) if self.reverse[d] else range(self.steps)


def _refuse(node: Node, what: str, fix: str) -> ModelImportError:
    return ModelImportError(f"node {node.name!r} ({node.op_type}): {what}; {fix}")


def _parse(graph: Graph, node: Node) -> _Spec:
    """Read and check a recurrent node's shapes and attributes; refuse what cannot be unrolled exactly."""
    op = node.op_type
    unknown = sorted(set(node.attrs) - _ATTRS[op])
    if unknown:
        raise _refuse(node, f"attribute(s) {', '.join(unknown)} not supported by memplan's unrolling",
                      f"remove them or freeze the weights before the node {FREEZE_HINT}")
    x = graph.tensors[node.inputs[0]]
    if x.dtype not in FLOAT_DTYPES:
        raise _refuse(node, f"input X is {x.dtype}", "recurrent nodes are unrolled for float types only")
    layout = int(node.attr("layout", 0))
    if layout not in (0, 1):
        raise _refuse(node, f"layout={layout}", "ONNX defines layout 0 and 1 only")
    if len(x.shape) != 3:
        raise _refuse(node, f"X has shape {list(x.shape)}", "X must be 3-D")
    steps, batch, width = (x.shape[1], x.shape[0], x.shape[2]) if layout else x.shape
    if steps == 0:
        raise _refuse(node, "the sequence length is 0", "give at least one time step")
    direction = str(node.attr("direction", "forward"))
    reverse = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}.get(direction)
    if reverse is None:
        raise _refuse(node, f"direction={direction!r}", "use forward, reverse or bidirectional")
    nd = len(reverse)
    gates = _GATES[op]
    w_shape, r_shape = graph.tensors[node.inputs[1]].shape, graph.tensors[node.inputs[2]].shape
    hidden = int(node.attr("hidden_size", r_shape[-1] if r_shape else 0))
    if w_shape != (nd, gates * hidden, width) or r_shape != (nd, gates * hidden, hidden):
        raise _refuse(node, f"W {list(w_shape)} / R {list(r_shape)} do not match hidden_size={hidden}, "
                      f"{nd} direction(s) and input size {width}",
                      f"W must be [{nd}, {gates * hidden}, {width}] and R [{nd}, {gates * hidden}, {hidden}]")
    _check_sequence_lens(graph, node, steps, batch)
    clip = node.attr("clip")
    return _Spec(node, x.dtype, steps, batch, width, hidden, nd, reverse, layout,
                 None if clip is None else float(clip), _activations(node, nd))


def _check_sequence_lens(graph: Graph, node: Node, steps: int, batch: int) -> None:
    """Only the full length everywhere is static; anything else would need per-sequence masking."""
    if len(node.inputs) <= 4 or node.inputs[4] == NO_TENSOR:
        return
    t = graph.tensors[node.inputs[4]]
    value = graph.values.get(t.id) if t.kind is not TensorKind.ACTIVATION and t.kind is not TensorKind.INPUT \
        else None
    fix = (f"memplan unrolls {node.op_type} over a static length only: drop sequence_lens (every sequence "
           f"then runs all {steps} steps) or pad the batch to one length")
    if value is None:
        raise _refuse(node, f"sequence_lens {t.name!r} is computed at run time", fix)
    lens = np.asarray(value).reshape(-1)
    if lens.size not in (1, batch) or np.any(lens != steps):
        raise _refuse(node, f"sequence_lens {lens.tolist()} is not the full length {steps} for every sequence", fix)


def _activations(node: Node, nd: int) -> tuple[tuple[_Act, ...], ...]:
    """Per direction, the activations with their alpha/beta (consumed in order, as ORT does)."""
    per = len(_DEFAULT_ACTIVATIONS[node.op_type])
    names = node.attr("activations")
    names = list(_DEFAULT_ACTIVATIONS[node.op_type]) * nd if names is None else [str(n) for n in names]
    if len(names) != per * nd:
        raise _refuse(node, f"activations {names} has {len(names)} entries",
                      f"give {per} per direction ({per * nd} in all)")
    alphas = iter(float(a) for a in node.attr("activation_alpha", []) or [])
    betas = iter(float(b) for b in node.attr("activation_beta", []) or [])
    acts = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise _refuse(node, f"activation {name!r} is unknown",
                          f"use one of {', '.join(sorted(_ACTIVATIONS))} (case-insensitive)")
        uses_a, uses_b, default_a, default_b = _ACTIVATIONS[key]
        alpha = next(alphas, default_a) if uses_a else 0.0
        beta = next(betas, default_b) if uses_b else 0.0
        if alpha is None or beta is None:
            raise _refuse(node, f"activation {name!r} has no activation_alpha/activation_beta value",
                          "give it explicitly (runtimes disagree on its default)")
        acts.append(_Act(key, alpha, beta))
    return tuple(tuple(acts[d * per:(d + 1) * per]) for d in range(nd))


# ---- the rewrite -----------------------------------------------------------------------------------
class _Unroller(GraphAppender):
    """Appends tensors and nodes; every helper returns a tensor id and writes into ``out`` if given."""

    def __init__(self, graph: Graph):
        super().__init__(graph)
        self.stem = "rnn"
        self._consts: dict[tuple[str, tuple[int, ...], bytes], int] = {}
        self._parts: dict[tuple[int, int], list[int]] = {}
        self.memo: dict[tuple, object] = {}  # per-node pieces built once (bias halves, picked slices)

    def run(self, chosen: set[int]) -> Graph:
        for node in self.g.nodes:
            if node.id in chosen:
                if not is_recurrent(node):
                    raise GraphError(f"node {node.name!r} ({node.op_type}) is not a recurrent node")
                _EXPAND[node.op_type](self, _parse(self.g, node))
            else:
                self.nodes.append(node)
        return self.finish()

    # -- tensors and nodes ---------------------------------------------------------------------------
    def shape(self, t: int) -> tuple[int, ...]:
        return self.tensors[t].shape

    def const(self, value: np.ndarray) -> int:
        """A FROZEN initializer, shared between equal values."""
        value = np.asarray(value)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key not in self._consts:
            self._consts[key] = self.add_const(f"{self.stem}.const", value)
        return self._consts[key]

    def scalar(self, value: float, dtype: str) -> int:
        return self.const(np.asarray(value, dtype=dtype))

    def ints(self, values: Sequence[int]) -> int:
        return self.const(np.asarray(list(values), dtype=np.int64))

    def op_n(self, op: str, inputs: Sequence[int], shapes: Sequence[Sequence[int]], dtype: str,
             outs: Sequence[int | None] | None = None, **attrs) -> list[int]:
        outs = list(outs or [None] * len(shapes))
        ids = []
        for shape, out in zip(shapes, outs):
            if out is None:
                out = self.add_tensor(f"{self.stem}.{op.lower()}", dtype, shape)
            ids.append(out)
        self.add_node(f"{self.stem}.{op}", op, inputs, ids, attrs)
        return ids

    def op(self, op: str, inputs: Sequence[int], shape: Sequence[int], dtype: str, out: int | None = None,
           **attrs) -> int:
        return self.op_n(op, inputs, [shape], dtype, [out], **attrs)[0]

    def unary(self, op: str, x: int, **attrs) -> int:
        return self.op(op, [x], self.shape(x), self.tensors[x].dtype, **attrs)

    def binary(self, op: str, a: int, b: int) -> int:
        return self.op(op, [a, b], np.broadcast_shapes(self.shape(a), self.shape(b)), self.tensors[a].dtype)

    # -- shape ops -------------------------------------------------------------------------------------
    def reshape(self, x: int, shape: Sequence[int], out: int | None = None) -> int:
        if tuple(shape) == self.shape(x):
            return x if out is None else self.op("Identity", [x], shape, self.tensors[x].dtype, out)
        return self.op("Reshape", [x, self.ints(shape)], shape, self.tensors[x].dtype, out)

    def transpose(self, x: int, perm: Sequence[int], out: int | None = None) -> int:
        shape = [self.shape(x)[p] for p in perm]
        return self.op("Transpose", [x], shape, self.tensors[x].dtype, out, perm=list(perm))

    def concat(self, xs: Sequence[int], axis: int, out: int | None = None) -> int:
        if len(xs) == 1:
            return self.reshape(xs[0], self.shape(xs[0]), out)
        shape = list(self.shape(xs[0]))
        shape[axis] = sum(self.shape(x)[axis] for x in xs)
        return self.op("Concat", list(xs), shape, self.tensors[xs[0]].dtype, out, axis=axis)

    def split(self, x: int, axis: int, sizes: Sequence[int]) -> list[int]:
        if len(sizes) == 1:
            return [x]
        shapes = [[s if a == axis else d for a, d in enumerate(self.shape(x))] for s in sizes]
        if self.opset >= 13:
            return self.op_n("Split", [x, self.ints(sizes)], shapes, self.tensors[x].dtype, axis=axis)
        return self.op_n("Split", [x], shapes, self.tensors[x].dtype, axis=axis, split=list(sizes))

    def pick(self, x: int, axis: int, index: int, count: int) -> int:
        """``x`` indexed at ``index`` along ``axis`` (of length ``count``), that axis dropped."""
        key = (x, axis)
        if key not in self._parts:
            self._parts[key] = self.split(x, axis, [1] * count)
        if (x, axis, index) not in self.memo:
            part = self._parts[key][index]
            self.memo[x, axis, index] = self.reshape(part, [d for a, d in enumerate(self.shape(x)) if a != axis])
        return self.memo[x, axis, index]

    # -- arithmetic --------------------------------------------------------------------------------
    def gemm_t(self, a: int, w: int, c: int | None = None) -> int:
        """a @ w^T (+ c): one Gemm with transB."""
        shape = [self.shape(a)[0], self.shape(w)[0]]
        if c is None and self.opset < 11:  # C is optional from opset 11
            return self.op("MatMul", [a, self.transpose(w, [1, 0])], shape, self.tensors[a].dtype)
        return self.op("Gemm", [a, w] + ([] if c is None else [c]), shape, self.tensors[a].dtype, transB=1)

    def clip(self, x: int, bound: float | None) -> int:
        if bound is None:
            return x
        dtype = self.tensors[x].dtype
        if self.opset >= 11:
            return self.op("Clip", [x, self.scalar(-bound, dtype), self.scalar(bound, dtype)], self.shape(x), dtype)
        return self.unary("Clip", x, min=-bound, max=bound)

    def activate(self, x: int, act: _Act, bound: float | None) -> int:
        """``act`` of ``clip(x)`` (the spec clips every activation's input)."""
        x = self.clip(x, bound)
        dtype = self.tensors[x].dtype
        simple = {"sigmoid": "Sigmoid", "tanh": "Tanh", "relu": "Relu", "softsign": "Softsign",
                  "softplus": "Softplus"}
        if act.name in simple:
            return self.unary(simple[act.name], x)
        if act.name in ("leakyrelu", "elu", "thresholdedrelu"):
            op = {"leakyrelu": "LeakyRelu", "elu": "Elu", "thresholdedrelu": "ThresholdedRelu"}[act.name]
            return self.unary(op, x, alpha=act.alpha)
        if act.name == "hardsigmoid":
            return self.unary("HardSigmoid", x, alpha=act.alpha, beta=act.beta)
        if act.name == "affine":
            return self.binary("Add", self.binary("Mul", x, self.scalar(act.alpha, dtype)),
                               self.scalar(act.beta, dtype))
        # scaledtanh
        inner = self.unary("Tanh", self.binary("Mul", x, self.scalar(act.beta, dtype)))
        return self.binary("Mul", inner, self.scalar(act.alpha, dtype))


# ---- shared pieces of the three ops --------------------------------------------------------------------
def _bias_halves(u: _Unroller, spec: _Spec, d: int) -> tuple[int, int] | None:
    """(Wb, Rb) of direction d, or None without B."""
    if spec.input(3) == NO_TENSOR:
        return None
    key = ("bias", spec.node.id, d)
    if key not in u.memo:
        b = u.pick(spec.input(3), 0, d, spec.directions)
        u.memo[key] = tuple(u.split(b, 0, [u.shape(b)[0] // 2] * 2))
    return u.memo[key]


def _summed_bias(u: _Unroller, spec: _Spec, d: int) -> int | None:
    """Wb + Rb of direction d (both add to the same pre-activation), or None without B."""
    halves = _bias_halves(u, spec, d)
    return None if halves is None else u.binary("Add", *halves)


def _initial_state(u: _Unroller, spec: _Spec, slot: int, d: int, zeros: list[int]) -> int:
    """initial_h / initial_c of direction d as [B, H]; a runtime zero tensor when absent."""
    if spec.input(slot) == NO_TENSOR:
        if not zeros:
            shape = [spec.batch, spec.hidden]
            zeros.append(u.op("ConstantOfShape", [u.ints(shape)], shape, spec.dtype,
                              value=np.zeros(1, dtype=spec.dtype)))
        return zeros[0]
    return u.pick(spec.input(slot), 1 if spec.layout else 0, d, spec.directions)


def _write_outputs(u: _Unroller, spec: _Spec, states: list[list[int]], finals: dict[int, list[int]]) -> None:
    """Y from every step's H (states[d][t]); Y_h / Y_c (output slots in ``finals``) from the last ones."""
    u.stem = spec.node.name
    T, B, H, nd = spec.steps, spec.batch, spec.hidden, spec.directions
    y = spec.output(0)
    if y != NO_TENSOR:
        per_dir = [u.concat(states[d], 0) for d in range(nd)]  # [T*B, H], time-major
        if nd == 1 and spec.layout == 0:
            u.reshape(per_dir[0], [T, 1, B, H], out=y)
        else:
            stacked = u.concat([u.reshape(p, [T, 1, B, H]) for p in per_dir], 1,
                               out=y if spec.layout == 0 else None)
            if spec.layout == 1:
                u.transpose(stacked, [2, 0, 1, 3], out=y)
    for slot, last in finals.items():
        out = spec.output(slot)
        if out == NO_TENSOR:
            continue
        axis, shape = (1, [B, 1, H]) if spec.layout else (0, [1, B, H])
        if nd == 1:
            u.reshape(last[0], shape, out=out)
        else:
            u.concat([u.reshape(s, shape) for s in last], axis, out=out)


def _unroll(u: _Unroller, spec: _Spec, step: Callable[..., tuple[int, ...]], prepare: Callable, n_state: int,
            input_bias: Callable) -> None:
    """The loop every op shares: per direction, walk the steps, then write the outputs.

    ``prepare(d)`` returns per-direction constants for ``step``; ``input_bias(d)`` the bias folded into
    the input projection (or None); ``step(d, ctx, xw_t, *state) -> new state`` (H first)."""
    zeros: list[int] = []
    states: list[list[int]] = []
    finals: dict[int, list[int]] = {1: [], 2: []} if n_state == 2 else {1: []}
    for d in range(spec.directions):
        u.stem = f"{spec.node.name}.d{d}"
        ctx = prepare(d)
        w, bias = u.pick(spec.input(1), 0, d, spec.directions), input_bias(d)
        state = tuple(_initial_state(u, spec, 5 + k, d, zeros) for k in range(n_state))
        hs = [NO_TENSOR] * spec.steps
        for t in spec.order(d):
            u.stem = f"{spec.node.name}.t{t}"
            x_t = u.pick(spec.input(0), spec.layout, t, spec.steps)  # [B, I]; shared by the directions
            u.stem = f"{spec.node.name}.d{d}.t{t}"
            state = step(d, ctx, u.gemm_t(x_t, w, bias), *state)
            hs[t] = state[0]
        states.append(hs)
        for k, slot in enumerate(finals):
            finals[slot].append(state[k])
    _write_outputs(u, spec, states, finals)


# ---- the three ops -----------------------------------------------------------------------------------
def _lstm(u: _Unroller, spec: _Spec) -> None:
    H = spec.hidden
    coupled = bool(int(spec.node.attr("input_forget", 0)))

    def prepare(d: int) -> dict:
        ctx = {"r": u.pick(spec.input(2), 0, d, spec.directions)}
        if spec.input(7) != NO_TENSOR:
            ctx["pi"], ctx["po"], ctx["pf"] = u.split(u.pick(spec.input(7), 0, d, spec.directions), 0, [H] * 3)
        return ctx

    def step(d: int, ctx: dict, xw: int, h: int, c: int) -> tuple[int, int]:
        f_act, g_act, h_act = spec.acts[d]
        i, o, f, g = u.split(u.gemm_t(h, ctx["r"], xw), 1, [H] * 4)
        if "pi" in ctx:
            i = u.binary("Add", i, u.binary("Mul", ctx["pi"], c))
            f = u.binary("Add", f, u.binary("Mul", ctx["pf"], c))
        i = u.activate(i, f_act, spec.clip)
        if coupled:
            f = u.binary("Sub", u.scalar(1.0, spec.dtype), i)
        else:
            f = u.activate(f, f_act, spec.clip)
        g = u.activate(g, g_act, spec.clip)
        c = u.binary("Add", u.binary("Mul", f, c), u.binary("Mul", i, g))
        if "po" in ctx:
            o = u.binary("Add", o, u.binary("Mul", ctx["po"], c))
        o = u.activate(o, f_act, spec.clip)
        return u.binary("Mul", o, u.activate(c, h_act, None)), c

    _unroll(u, spec, step, prepare, 2, lambda d: _summed_bias(u, spec, d))


def _gru(u: _Unroller, spec: _Spec) -> None:
    H = spec.hidden
    linear_before_reset = bool(int(spec.node.attr("linear_before_reset", 0)))

    def prepare(d: int) -> dict:
        r = u.pick(spec.input(2), 0, d, spec.directions)
        if linear_before_reset:  # Rb stays with the recurrent Gemm: Rbh is inside r * (H Rh^T + Rbh)
            halves = _bias_halves(u, spec, d)
            return {"r": r, "rb": None if halves is None else halves[1]}
        r_zr, r_h = u.split(r, 0, [2 * H, H])
        return {"r_zr": r_zr, "r_h": r_h}

    def input_bias(d: int) -> int | None:
        if not linear_before_reset:
            return _summed_bias(u, spec, d)
        halves = _bias_halves(u, spec, d)
        return None if halves is None else halves[0]

    def step(d: int, ctx: dict, xw: int, h: int) -> tuple[int]:
        f_act, g_act = spec.acts[d]
        x_zr, x_h = u.split(xw, 1, [2 * H, H])
        if linear_before_reset:
            rec_zr, rec_h = u.split(u.gemm_t(h, ctx["r"], ctx["rb"]), 1, [2 * H, H])
            z, r = u.split(u.activate(u.binary("Add", x_zr, rec_zr), f_act, spec.clip), 1, [H, H])
            pre_h = u.binary("Add", x_h, u.binary("Mul", r, rec_h))
        else:
            z, r = u.split(u.activate(u.gemm_t(h, ctx["r_zr"], x_zr), f_act, spec.clip), 1, [H, H])
            pre_h = u.gemm_t(u.binary("Mul", r, h), ctx["r_h"], x_h)
        cand = u.activate(pre_h, g_act, spec.clip)
        # (1 - z) * cand + z * h, with one product fewer
        return (u.binary("Add", cand, u.binary("Mul", z, u.binary("Sub", h, cand))),)

    _unroll(u, spec, step, prepare, 1, input_bias)


def _rnn(u: _Unroller, spec: _Spec) -> None:
    def prepare(d: int) -> dict:
        return {"r": u.pick(spec.input(2), 0, d, spec.directions)}

    def step(d: int, ctx: dict, xw: int, h: int) -> tuple[int]:
        return (u.activate(u.gemm_t(h, ctx["r"], xw), spec.acts[d][0], spec.clip),)

    _unroll(u, spec, step, prepare, 1, lambda d: _summed_bias(u, spec, d))


_EXPAND: dict[str, Callable[[_Unroller, _Spec], None]] = {"LSTM": _lstm, "GRU": _gru, "RNN": _rnn}
