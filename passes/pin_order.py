"""Pin a graph's file order so that ORT's DEFAULT execution order runs it in that order too.

Pre: a validated Graph in the order it should run (a planned graph from passes/rewrite.py).
Post: a validated Graph with the same nodes (names, attributes, values) in the same relative order,
plus zero-copy ordering edges that chain every dynamic node (one that depends on a graph input) to
the dynamic node before it, so that every topological order of the result, ORT's default one
(``ort_default_order``) included, runs the dynamic nodes in file order. Constant-only nodes are left
alone: from ORT_ENABLE_BASIC up ORT folds them at load.

Why: ORT's default order is a reverse DFS from the leaves, not file order; it moved a planned
model's recomputes and frees by whole subgraphs (+60% peak on zoo:gpt?batch=64 at 70%, +55% on
zoo:resnet). Pinning only the gaps whose DFS order raises the simulated peak took 35-50% fewer
edges but did not survive ORT_ENABLE_ALL: fusions renumber nodes and the DFS changes again.

An edge into node ``v`` after node ``u`` (DESIGN.md, "How an emitted model must run"): ``v`` reads
its first input ``x`` as ``Reshape(x, shape(x) + Size(G) * 0)`` with ``G`` an output of ``u``. No
optimiser can know that target without running ``u``. Cost: 4 small nodes per edge (Size and Mul
shared by the edges from one ``u``).
"""
from __future__ import annotations

import numpy as np

from planner.graph import NO_TENSOR, Graph, GraphBuilder, Node, TensorKind, fresh_name


def ort_default_order(graph: Graph) -> list[int]:
    """The node order ORT's ``ExecutionOrder.DEFAULT`` runs ``graph`` in (node index = file position).

    ORT's GraphViewer: the leaves (nodes no node reads) go on a stack in index order; a node popped
    the first time is pushed back to be left, then its producers in ascending index order, so the
    highest-index producer is explored first; a node runs when it is left (post-order).
    """
    producers: list[list[int]] = []
    has_reader = [False] * len(graph.nodes)
    for node in graph.nodes:
        prods = sorted({graph.tensors[t].producer for t in node.inputs
                        if t != NO_TENSOR and graph.tensors[t].producer != NO_TENSOR})
        producers.append(prods)
        for p in prods:
            has_reader[p] = True
    stack = [(n, False) for n in range(len(graph.nodes)) if not has_reader[n]]
    seen = [False] * len(graph.nodes)
    order: list[int] = []
    while stack:
        n, leaving = stack.pop()
        if leaving:
            order.append(n)
        elif not seen[n]:
            seen[n] = True
            stack.append((n, True))
            stack.extend((p, False) for p in producers[n])
    return order


def dynamic_nodes(graph: Graph) -> list[bool]:
    """Per node: does it depend on a graph input? (ORT folds the others into constants.)"""
    dynamic = [t.kind is TensorKind.INPUT for t in graph.tensors]
    out = []
    for node in graph.nodes:
        dyn = any(t != NO_TENSOR and dynamic[t] for t in node.inputs)
        out.append(dyn)
        for t in node.outputs:
            if t != NO_TENSOR:
                dynamic[t] = dyn
    return out


def chain_gaps(graph: Graph) -> list[int]:
    """Dynamic nodes that read no output of the dynamic node before them: the ones ``pin_order`` gates."""
    dyn = dynamic_nodes(graph)
    gaps, prev = [], None
    for node in graph.nodes:
        if not dyn[node.id]:
            continue
        if prev is not None and all(t == NO_TENSOR or graph.tensors[t].producer != prev for t in node.inputs):
            gaps.append(node.id)
        prev = node.id
    return gaps


def pin_order(graph: Graph) -> Graph:
    """``graph`` with an ordering edge into each of ``chain_gaps(graph)`` (see module docstring)."""
    return _Pinner(graph).run(set(chain_gaps(graph)), dynamic_nodes(graph))


class _Pinner:
    def __init__(self, graph: Graph):
        self.g = graph
        self.b = GraphBuilder(name=graph.name, opsets=graph.opsets)
        self.taken = {t.name for t in graph.tensors} | {n.name for n in graph.nodes}
        self.new: dict[int, int] = {NO_TENSOR: NO_TENSOR}  # tensor id in graph -> id in the result
        self.zero: dict[int, int] = {}  # gate tensor (result id) -> int64 scalar 0 computed from it
        self.consts: dict[tuple, int] = {}  # (shape, values) -> int64 initializer (result id)

    def run(self, gated: set[int], dyn: list[bool]) -> Graph:
        g, b = self.g, self.b
        for tid in g.inputs:
            t = g.tensors[tid]
            self.new[tid] = b.input(t.name, t.dtype, t.shape)
        for t in g.initializers():
            self.new[t.id] = b.initializer(t.name, g.values[t.id], trainable=t.kind is TensorKind.TRAINABLE)
        gate = None  # result id of an output of the last dynamic node
        for node in g.nodes:
            inputs = [self.new[t] for t in node.inputs]
            if node.id in gated and gate is not None:
                inputs = self._through_edge(inputs, gate, node)
            outs = [None if t == NO_TENSOR else (g.tensors[t].name, g.tensors[t].dtype, g.tensors[t].shape)
                    for t in node.outputs]
            new = b.node(node.op_type, inputs, outs, name=node.name, domain=node.domain, attrs=node.attrs)
            for old, t in zip(node.outputs, new):
                self.new[old] = t
            if dyn[node.id]:
                gate = next((t for t in new if t != NO_TENSOR), gate)
        for tid in g.outputs:
            b.output(self.new[tid])
        return b.build()

    def _const(self, value: np.ndarray) -> int:
        """An int64 initializer holding ``value`` (one per distinct value)."""
        key = (value.shape, tuple(value.ravel().tolist()))
        if key not in self.consts:
            name = fresh_name(f"memplan__pin_const{len(self.consts)}", self.taken)
            self.consts[key] = self.b.initializer(name, value.astype(np.int64), trainable=False)
        return self.consts[key]

    def _add(self, op: str, inputs: list[int], stem: str, dtype: str, shape: tuple[int, ...]) -> int:
        name = fresh_name(stem, self.taken)
        (out,) = self.b.node(op, inputs, [(name, dtype, shape)], name=name)
        return out

    def _through_edge(self, inputs: list[int], gate: int, node: Node) -> list[int]:
        """Route the first present input through a zero-copy view that depends on ``gate``."""
        pos = next((i for i, t in enumerate(inputs) if t != NO_TENSOR), None)
        if pos is None:
            return inputs
        x = self.b.tensor(inputs[pos])
        stem = f"{node.name}__pin"
        if gate not in self.zero:
            size = self._add("Size", [gate], f"{stem}_size", "int64", ())
            self.zero[gate] = self._add("Mul", [size, self._const(np.array(0))], f"{stem}_zero", "int64", ())
        rank = (len(x.shape),)
        target = self._add("Add", [self._const(np.array(x.shape)), self.zero[gate]], f"{stem}_target", "int64", rank)
        out = list(inputs)
        out[pos] = self._add("Reshape", [x.id, target], f"{stem}_x", x.dtype, x.shape)
        return out
