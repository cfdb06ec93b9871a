"""Emitter: appends backward nodes to a GraphBuilder, computing every output's static shape.

Gradient rules never touch the builder directly: they call these helpers, which know the model's
opset (ReduceSum takes ``axes`` as an input from opset 13, ReduceMean from 18, Squeeze/Split from
13, ...) and give each new tensor a stable name ``<node>__bw_<k>``. Constants become small FROZEN
initializers, shared by value, so the backward adds nothing to the dynamic memory it does not need.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from planner.errors import GraphError
from planner.graph import HALF_DTYPES, GraphBuilder, Tensor

#: Ops whose output is bool (the rest keep their first input's element type).
_COMPARISONS = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or"})


class Emitter:
    """Shape-aware op helpers over a GraphBuilder (one per training graph)."""

    def __init__(self, builder: GraphBuilder, opset: int):
        self.b = builder
        self.opset = opset
        self._prefix = "grad"
        self._k = 0
        self._node_k = 0
        self._consts: dict[tuple[str, tuple[int, ...], bytes], int] = {}

    # ---- naming ------------------------------------------------------------------------------
    def begin(self, prefix: str) -> None:
        """Name the following tensors ``<prefix>__bw_<k>`` (one prefix per forward node)."""
        self._prefix = prefix
        self._k = 0

    def fresh(self, stem: str | None = None) -> str:
        """A tensor name not used yet: ``stem`` itself if free, else ``<prefix>__bw_<k>``."""
        if stem is not None and not self.b.has(stem):
            return stem
        while True:
            name = f"{self._prefix}__bw_{self._k}" if stem is None else f"{stem}_{self._k}"
            self._k += 1
            if not self.b.has(name):
                return name

    # ---- tensors -----------------------------------------------------------------------------
    def tensor(self, t: int) -> Tensor:
        return self.b.tensor(t)

    def shape(self, t: int) -> tuple[int, ...]:
        return self.b.tensor(t).shape

    def dtype(self, t: int) -> str:
        return self.b.tensor(t).dtype

    def rank(self, t: int) -> int:
        return len(self.b.tensor(t).shape)

    def const(self, value: Any, dtype: str | np.dtype | None = None) -> int:
        """A FROZEN initializer holding ``value`` (shared between equal constants)."""
        arr = np.array(value, dtype=dtype, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.b.initializer(f"memplan__const_{len(self._consts)}", arr, trainable=False)
        return self._consts[key]

    def scalar(self, value: float, like: int) -> int:
        """A scalar constant of ``like``'s element type."""
        return self.const(np.asarray(value, dtype=self.dtype(like)))

    def ints(self, values: Sequence[int]) -> int:
        return self.const(np.asarray(list(values), dtype=np.int64))

    # ---- generic node ------------------------------------------------------------------------
    def op(
        self, op_type: str, inputs: Sequence[int], shape: Sequence[int], dtype: str, *, out_name: str | None = None,
        **attrs: Any,
    ) -> int:
        """Append one single-output node; returns its output tensor id (named ``out_name`` if given)."""
        return self.op_n(op_type, inputs, [(shape, dtype)], out_names=[out_name], **attrs)[0]

    def op_n(
        self, op_type: str, inputs: Sequence[int], outs: Sequence[tuple[Sequence[int], str]], *,
        out_names: Sequence[str | None] | None = None, **attrs: Any,
    ) -> tuple[int, ...]:
        names = list(out_names or [None] * len(outs))
        specs = [(name if name is not None else self.fresh(), dtype, tuple(int(d) for d in shape))
                 for name, (shape, dtype) in zip(names, outs)]
        name = f"{self._prefix}__bw_node_{self._node_k}"
        self._node_k += 1
        return self.b.node(op_type, list(inputs), specs, name=name, attrs=attrs)

    # ---- elementwise -------------------------------------------------------------------------
    def unary(self, op_type: str, x: int, *, out_name: str | None = None, **attrs: Any) -> int:
        return self.op(op_type, [x], self.shape(x), self.dtype(x), out_name=out_name, **attrs)

    def binary(self, op_type: str, a: int, b: int, *, out_name: str | None = None) -> int:
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        dtype = "bool" if op_type in _COMPARISONS else self.dtype(a)
        return self.op(op_type, [a, b], shape, dtype, out_name=out_name)

    def add(self, a: int, b: int, *, out_name: str | None = None) -> int:
        return self.binary("Add", a, b, out_name=out_name)

    def accumulate(self, acc: int, g: int) -> int:
        """acc + g, a gradient's running sum and a new term. Where the term is a Gemm's fresh output
        of the sum's shape that nothing reads yet (a weight used at every step of an unrolled RNN,
        a shared Linear), the Gemm adds acc itself (C, beta = 1): ORT's Add does not work in place,
        so a separate Add would hold acc, the term and the sum at once, three weight-sized buffers."""
        node = self.b.producer_node(g)
        if (node is not None and node.op_type == "Gemm" and node.domain == "" and len(node.inputs) == 2
                and self.shape(acc) == self.shape(g) and self.dtype(acc) == self.dtype(g)
                and not self.b.is_read(g) and self.b.tensor(acc).producer < node.id):
            self.b.replace_node(node.id, (*node.inputs, acc), {**node.attrs, "beta": 1.0})
            return g
        return self.add(acc, g)

    def sub(self, a: int, b: int, *, out_name: str | None = None) -> int:
        return self.binary("Sub", a, b, out_name=out_name)

    def mul(self, a: int, b: int, *, out_name: str | None = None) -> int:
        return self.binary("Mul", a, b, out_name=out_name)

    def div(self, a: int, b: int) -> int:
        return self.binary("Div", a, b)

    def neg(self, x: int) -> int:
        return self.unary("Neg", x)

    def scale(self, x: int, factor: float) -> int:
        """x * factor (no node when factor == 1)."""
        return x if factor == 1.0 else self.mul(x, self.scalar(factor, x))

    def where(self, cond: int, a: int, b: int) -> int:
        shape = np.broadcast_shapes(self.shape(cond), self.shape(a), self.shape(b))
        return self.op("Where", [cond, a, b], shape, self.dtype(a))

    def zeros_to_one(self, x: int) -> tuple[int, int]:
        """(x == 0 as bool, x with its zeros replaced by 1): a divisor that is never 0, for rules whose
        quotient is multiplied by 0 (or not read) where x is 0."""
        zero = self.binary("Equal", x, self.scalar(0.0, x))
        return zero, self.where(zero, self.scalar(1.0, x), x)

    def cast(self, x: int, dtype: str) -> int:
        from passes.onnx_import import DTYPE_TO_ONNX  # late: keeps this module importable alone

        if self.dtype(x) == dtype:
            return x
        return self.op("Cast", [x], self.shape(x), dtype, to=DTYPE_TO_ONNX[dtype])

    def scatter_add(self, op_type: str, data: int | None, indices: int, updates: int, shape: Sequence[int],
                    **attrs: Any) -> int:
        """``op_type`` (ScatterND or ScatterElements) with reduction='add' of ``updates`` into ``data``
        (zeros where None), in ``updates``' element type. A float16/bfloat16 sum accumulates in float32
        between Casts: ONNX Runtime's CPU provider has no half-precision scatter-add ("MLFloat16 data
        type is not supported with ScatterND ... when reduction is 'add'"), and float32 keeps the sums
        of repeated indices (an embedding's tokens) from rounding at every step."""
        dtype = self.dtype(updates)
        acc = "float32" if dtype in HALF_DTYPES else dtype
        data = self.zeros(shape, acc) if data is None else self.cast(data, acc)
        out = self.op(op_type, [data, indices, self.cast(updates, acc)], shape, acc, reduction="add", **attrs)
        return self.cast(out, dtype)

    # ---- shape ops ---------------------------------------------------------------------------
    def reshape(self, x: int, shape: Sequence[int]) -> int:
        shape = tuple(int(d) for d in shape)
        if self.shape(x) == shape:
            return x
        return self.op("Reshape", [x, self.ints(shape)], shape, self.dtype(x))

    def transpose(self, x: int, perm: Sequence[int]) -> int:
        perm = [int(p) for p in perm]
        if perm == list(range(len(perm))):
            return x
        shape = [self.shape(x)[p] for p in perm]
        return self.op("Transpose", [x], shape, self.dtype(x), perm=perm)

    def expand(self, x: int, shape: Sequence[int]) -> int:
        shape = tuple(int(d) for d in shape)
        if self.shape(x) == shape:
            return x
        return self.op("Expand", [x, self.ints(shape)], shape, self.dtype(x))

    def concat(self, xs: Sequence[int], axis: int) -> int:
        if len(xs) == 1:
            return xs[0]
        shape = list(self.shape(xs[0]))
        shape[axis] = sum(self.shape(x)[axis] for x in xs)
        return self.op("Concat", list(xs), shape, self.dtype(xs[0]), axis=axis)

    def slice(self, x: int, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int]) -> int:
        """Unit-step slice with in-range starts/ends."""
        shape = list(self.shape(x))
        for s, e, a in zip(starts, ends, axes):
            shape[a] = e - s
        if tuple(shape) == self.shape(x):
            return x
        return self.op("Slice", [x, self.ints(starts), self.ints(ends), self.ints(axes)], shape, self.dtype(x))

    def pad_zeros(self, x: int, begin: Sequence[int], end: Sequence[int]) -> int:
        """Zero padding with non-negative pads, one (begin, end) per axis."""
        if not any(begin) and not any(end):
            return x
        shape = [d + p + q for d, p, q in zip(self.shape(x), begin, end)]
        return self.op("Pad", [x, self.ints(list(begin) + list(end))], shape, self.dtype(x), mode="constant")

    def zeros(self, shape: Sequence[int], dtype: str) -> int:
        """A zero tensor made at run time (ConstantOfShape), not stored in the model."""
        return self.fill(shape, 0.0, dtype)

    def fill(self, shape: Sequence[int], value: float, dtype: str) -> int:
        """A tensor of ``value`` made at run time (ConstantOfShape), not stored in the model."""
        return self.op("ConstantOfShape", [self.ints(shape)], shape, dtype, value=np.full(1, value, dtype=dtype))

    # ---- reductions --------------------------------------------------------------------------
    def reduce(self, op_type: str, x: int, axes: Sequence[int], keepdims: bool = True) -> int:
        """ReduceSum/ReduceMean/... over ``axes`` (sorted, non-negative); opset-correct form."""
        axes = sorted(int(a) for a in axes)
        if not axes:
            return x
        shape = [1 if i in axes else d for i, d in enumerate(self.shape(x))]
        if not keepdims:
            shape = [d for i, d in enumerate(self.shape(x)) if i not in axes]
        axes_as_input = self.opset >= axes_input_since(op_type)
        if axes_as_input:
            return self.op(op_type, [x, self.ints(axes)], shape, self.dtype(x), keepdims=int(keepdims))
        return self.op(op_type, [x], shape, self.dtype(x), axes=axes, keepdims=int(keepdims))

    def reduce_sum(self, x: int, axes: Sequence[int], keepdims: bool = True) -> int:
        return self.reduce("ReduceSum", x, axes, keepdims)

    def reduce_mean(self, x: int, axes: Sequence[int], keepdims: bool = True) -> int:
        return self.reduce("ReduceMean", x, axes, keepdims)

    def unbroadcast(self, g: int, shape: Sequence[int]) -> int:
        """Sum ``g`` over the axes that broadcasting added or stretched, so it gets ``shape``."""
        shape = tuple(int(d) for d in shape)
        gshape = self.shape(g)
        if gshape == shape:
            return g
        lead = len(gshape) - len(shape)
        if lead < 0:
            raise GraphError(f"cannot unbroadcast a gradient of shape {gshape} to {shape}")
        axes = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and gshape[lead + i] != 1]
        return self.reshape(self.reduce_sum(g, axes, keepdims=True), shape)

    # ---- linear algebra ----------------------------------------------------------------------
    def matmul(self, a: int, b: int) -> int:
        sa, sb = self.shape(a), self.shape(b)
        if len(sa) < 2 or len(sb) < 2:
            raise GraphError("Emitter.matmul needs operands of rank >= 2")
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        return self.op("MatMul", [a, b], [*batch, sa[-2], sb[-1]], self.dtype(a))

    def gemm(self, a: int, b: int, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0) -> int:
        sa, sb = self.shape(a), self.shape(b)
        rows = sa[1] if trans_a else sa[0]
        cols = sb[0] if trans_b else sb[1]
        attrs: dict[str, Any] = {}
        if trans_a:
            attrs["transA"] = 1
        if trans_b:
            attrs["transB"] = 1
        if alpha != 1.0:
            attrs["alpha"] = float(alpha)
        return self.op("Gemm", [a, b], [rows, cols], self.dtype(a), **attrs)

    def axis_matmul(self, g: int, axis: int, matrix: np.ndarray) -> int:
        """Contract ``g``'s ``axis`` (length ``matrix.shape[0]``) with a constant: out[.., i, ..] =
        sum_o g[.., o, ..] * matrix[o, i]. The adjoint of any per-axis linear map (Resize, Pad, Slice)."""
        rank = self.rank(g)
        if rank == 1:  # a vector: as one row (Slice/Pad of a 1-D weight; fuzzed, stop 49)
            row = self.axis_matmul(self.reshape(g, [1, self.shape(g)[0]]), 1, matrix)
            return self.reshape(row, [int(np.shape(matrix)[1])])
        if axis == rank - 2:  # the transpose on the left (and no unread constant of the matrix itself)
            return self.matmul(self.const(np.ascontiguousarray(np.asarray(matrix, dtype=self.dtype(g)).T)), g)
        m = self.const(np.asarray(matrix, dtype=self.dtype(g)))
        if axis == rank - 1:
            return self.matmul(g, m)
        perm = [i for i in range(rank) if i != axis] + [axis]
        moved = self.matmul(self.transpose(g, perm), m)
        return self.transpose(moved, np.argsort(perm))


def axes_input_since(op_type: str) -> int:
    """First opset where a Reduce* op takes ``axes`` as an input (an attribute before)."""
    return 13 if op_type == "ReduceSum" else 18


def prod(values: Sequence[int]) -> int:
    return int(math.prod(values))
