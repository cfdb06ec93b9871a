"""Zero-copy ordering edges: make a node wait for a tensor it does not read, without copying data.

Used by passes/rewrite.py (a recompute chain or swap-in must not run before the tensor computed
before it in the plan, nor be merged with the original by ORT's CSE) and passes/pin_order.py
(every dynamic node waits for the one before it, so ORT's default DFS order runs file order).

An edge into a node after gate ``G`` (DESIGN.md, "How an emitted model must run"): a node with a
constant target-shape input ``s`` (``Reshape``, ``Expand``) reads ``s + Size(G) * 0`` instead; any
other node reads its first input ``x`` as the view ``Reshape(x, Size(G) * zeros(rank(x)))``: a 0 in
a Reshape target keeps that dimension, so the view has ``x``'s shape and shares its buffer. Only
running ``G``'s producer reveals either value: ORT folds ``Shape`` of a static shape and an empty
``Slice`` (ReshapeFusion) but not ``Size``, no optimiser rewrites ``* 0``, and CSE sees a different
input. A view in front of a ``Reshape`` would be fused into it at ORT_ENABLE_BASIC (contiguous
Reshapes with a constant final shape), hence the gated ``s``. ``Size(G)`` is made once per gate,
each zero once per (gate, shape) and each ``s + 0`` once per (gate, s), so an edge costs a Reshape
or an Add plus, for a new gate, a Size and a Mul.

Why this form (``python bench/edge_forms.py``: every candidate kept all its edges at every ORT
level): it has the fewest nodes (zoo:resnet?batch=32 pinned: 540, against 707 for main's
``Reshape(Size(G), [1]) * [0] + shape`` and 644 for ``Size(G) * 0 + shape`` per edge); sharing one
zero vector between views and targets (539 nodes) measured 1.28x the plan under ORT's defaults
instead of 1.02x: it moves a few int64 tensors in ORT's memory-pattern trace, whose best-fit
packing is that sensitive (passes/pin_order.py).
"""
from __future__ import annotations

import numpy as np

from planner.graph import NO_TENSOR, Graph, GraphBuilder, Node, TensorKind, fresh_name

#: Ops whose input at this position is a target shape (int64, 1-D): an edge adds its zeros there.
SHAPE_INPUT = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0}


def dynamic_nodes(graph: Graph) -> list[bool]:
    """Per node: does it depend on a graph input? ORT folds the others into constants at load,
    so only a dynamic tensor can gate an edge."""
    dynamic = [t.kind is TensorKind.INPUT for t in graph.tensors]
    out = []
    for node in graph.nodes:
        dyn = any(t != NO_TENSOR and dynamic[t] for t in node.inputs)
        out.append(dyn)
        for t in node.outputs:
            if t != NO_TENSOR:
                dynamic[t] = dyn
    return out


def constant_shape_input(graph: Graph, node: Node) -> tuple[int, tuple[int, ...]] | None:
    """(position, value) of ``node``'s target-shape input when it is an initializer, else None."""
    pos = SHAPE_INPUT.get(node.op_type)
    if pos is None or pos >= len(node.inputs) or node.inputs[pos] == NO_TENSOR:
        return None
    value = graph.values.get(node.inputs[pos])
    if value is None or value.dtype != np.int64 or value.ndim != 1:
        return None
    return pos, tuple(int(v) for v in value)


class OrderingEdges:
    """Builds ordering edges into a graph under construction in ``builder``.

    ``taken``: every tensor and node name the result may hold (new names are drawn around them).
    """

    def __init__(self, builder: GraphBuilder, taken: set[str]):
        self.b = builder
        self.taken = taken
        self._sizes: dict[int, int] = {}  # gate -> Size(gate)
        self._zeros_of: dict[tuple[int, tuple[int, ...]], int] = {}  # (gate, shape) -> Size(gate) * 0s
        self._shapes: dict[tuple[int, tuple[int, ...]], int] = {}  # (gate, shape) -> shape + Size(gate) * 0
        self._consts: dict[tuple, int] = {}  # (shape, values) -> int64 initializer holding them
        self._made = 0  # initializers made (``const``), for their names

    def route(self, inputs: list[int], gate: int, stem: str,
              shape_input: tuple[int, tuple[int, ...]] | None = None) -> list[int]:
        """``inputs`` of a node, one of them made to depend on ``gate`` (see the module docstring).

        ``shape_input``: the node's constant target shape (``constant_shape_input``), gated in place;
        otherwise the first present input is read through a view. No present input: unchanged.
        """
        out = list(inputs)
        if shape_input is not None:
            pos, shape = shape_input
            out[pos] = self.gated_shape(gate, shape, stem)
            return out
        pos = next((i for i, t in enumerate(out) if t != NO_TENSOR), None)
        if pos is not None:
            out[pos] = self.view(out[pos], gate, stem)
        return out

    def view(self, x: int, gate: int, stem: str) -> int:
        """``x`` through a zero-copy ``Reshape`` that cannot run before ``gate`` exists.

        A scalar has no such view: its target shape is empty, and ORT folds a product with an empty
        tensor whatever the other factor, then the Reshape (a pinned Adam step's counter ran first
        under ORT's defaults and the step peaked 1.49x its plan; fuzzed, stop 49). A scalar is
        copied instead, plus ``Size(gate) * 0`` in its own type (bytes, not a buffer to speak of).
        """
        t = self.b.tensor(x)
        if not t.shape:
            from passes.onnx_import import DTYPE_TO_ONNX  # late, as passes/gradients/_emit.py

            zero = self._add("Cast", [self._zeros(gate, (), stem)], f"{stem}_cast", t.dtype, (),
                             to=DTYPE_TO_ONNX[t.dtype])
            return self._add("Or" if t.dtype == "bool" else "Add", [x, zero], f"{stem}_x", t.dtype, ())
        target = self._zeros(gate, (len(t.shape),), stem)
        return self._add("Reshape", [x, target], f"{stem}_x", t.dtype, t.shape)

    def gated_shape(self, gate: int, shape: tuple[int, ...], stem: str) -> int:
        """An int64 vector equal to ``shape`` that no optimiser can know before ``gate`` exists."""
        key = (gate, shape)
        if key not in self._shapes:
            self._shapes[key] = self._add("Add", [self.const(shape), self._zeros(gate, (), stem)],
                                          f"{stem}_target", "int64", (len(shape),))
        return self._shapes[key]

    def forget_gates(self) -> None:
        """Make the next edges their own zeros and gated shapes rather than reuse those made so far:
        a reused one stays live from its first reader to its last (the rewriter of zoo:gpt at 70%: a
        Size and its zeros held 128 bytes over 113 steps, through the peak), while one of its own
        dies at its single reader. ``Size(gate)`` stays one per gate: ORT's PRIORITY_BASED order runs
        every Size as soon as its gate exists (planner/liveness.py, run_order), so one of its own per
        edge was made there too and held to its reader, one 64-byte line each (zoo:gpt at 70%: 11 at
        the peak). The int64 constants are still shared."""
        self._zeros_of.clear()
        self._shapes.clear()

    def _zeros(self, gate: int, shape: tuple[int, ...], stem: str) -> int:
        """``Size(gate) * 0`` as an int64 tensor of ``shape`` (a scalar, or a vector of zeros)."""
        key = (gate, shape)
        if key not in self._zeros_of:
            if gate not in self._sizes:
                self._sizes[gate] = self._add("Size", [gate], f"{stem}_size", "int64", ())
            zeros = self.const(np.zeros(shape, np.int64))
            self._zeros_of[key] = self._add("Mul", [self._sizes[gate], zeros], f"{stem}_zero", "int64", shape)
        return self._zeros_of[key]

    def share(self, tid: int, value: np.ndarray) -> None:
        """Let edges (and :meth:`const`) read the int64 initializer ``tid`` of the graph under
        construction, which holds ``value``, rather than make another of the same value: each one
        made joins the constant base, which the planning problem does not see."""
        value = np.asarray(value)
        if value.dtype == np.int64:
            self._consts.setdefault((value.shape, tuple(value.ravel().tolist())), tid)

    def const(self, value: tuple[int, ...] | np.ndarray, stem: str | None = None) -> int:
        """An int64 initializer holding ``value``: one per distinct value and shape, a shared one
        (:meth:`share`) where there is one, else a new one named from ``stem``."""
        value = np.asarray(value, np.int64)
        key = (value.shape, tuple(value.ravel().tolist()))
        if key not in self._consts:
            name = fresh_name(stem or f"memplan__order_const{self._made}", self.taken)
            self._consts[key] = self.b.initializer(name, value, trainable=False)
            self._made += 1
        return self._consts[key]

    def _add(self, op: str, inputs: list[int], stem: str, dtype: str, shape: tuple[int, ...], **attrs) -> int:
        name = fresh_name(stem, self.taken)
        (out,) = self.b.node(op, inputs, [(name, dtype, shape)], name=name, attrs=attrs or None)
        return out
