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

An edge into node ``v`` after node ``u`` (passes/ordering.py): ``v`` reads one input through a
zero-copy view, or its constant target shape as ``shape + Size(G) * 0``, with ``G`` an output of
``u``. No optimiser can know either without running ``u``.

The result also hides the static shapes ORT would infer: graph inputs are read through such views
and each dynamic node's constant target shape (Reshape, Expand) as such a sum, gated on the first
graph input (no order implied); export it with ``value_info=False`` (no static intermediate
shapes; the symbolic ones ORT needs to run an op in place, passes.onnx_export.in_place_shapes).
Why: ORT's memory reuse hands a freed buffer to a later tensor of the same static shape and holds
it idle until then. On zoo:resnet?batch=32 at 70% the stem conv's 1 MiB output, freed in the
forward pass and handed to a backward tensor, plus a 0.5 MiB backward buffer, sat idle across the
peak: 1.36x the plan with memory reuse on, 1.43x under ORT's defaults (arena off); hidden, 1.00x
and 1.02x. The shapes came from the graph inputs and from Expand/Reshape targets (the pooling
backward's Expand): ONNX shape inference derives the rest from those.

It reads the weight initializer of every dynamic Conv through such a view too. ORT_ENABLE_ALL's
NCHWc transformer rewrites a Conv whose weight is a constant into blocked-layout kernels, with
reordered copies of its activations that the plan does not count (zoo:cnn?batch=32 at 80%, ORT defaults
with the arena off: 1.32x the plan; weights hidden, 0.94x; step time unchanged, 17.1 ms either way
at batch 64).

Static sizes also reached ORT through float weights of 1 KiB or more that elementwise nodes read
(an activation-shaped bias, an optimizer's update of a weight), and through graph outputs read later
(an optimizer step reads the gradients and moments it outputs): those are read through views too,
but MatMul's and Gemm's weights, which MLAS prepacks at load. And constant-only ConstantOfShape and
Expand nodes of 1 KiB or more (a loss gradient's Expand, a max-pool backward's zeros) are pinned and
gated like dynamic ones: ORT would fold them into initializers resident for the whole run. Fuzzed
Adam and SGD steps measured up to 2.1x their plan under ORT's defaults (arena off) before, 1.00x
after (stop 49).

ORT's memory pattern (on by default) packs the first run's allocation trace by online best fit into
one block for later runs and fragments (zoo:unet?batch=8 at 70%: 1.34x the plan with the pattern
alone). Pinning does not touch it: the exporter adds the input of passes/mem_pattern.py to pinned
models (``export_model(..., mem_pattern=False)``), which switches the pattern off in every session.
"""
from __future__ import annotations

from passes.ordering import OrderingEdges, constant_shape_input, dynamic_nodes
from passes.rewrite import memplans_own
from planner.graph import FLOAT_DTYPES, NO_TENSOR, Graph, GraphBuilder, TensorKind


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


def chain_gaps(graph: Graph, dyn: list[bool] | None = None) -> list[int]:
    """Dynamic nodes (``pinned_nodes``) that read no output of the dynamic node before them: the
    ones ``pin_order`` gates."""
    dyn = pinned_nodes(graph) if dyn is None else dyn
    gaps, prev = [], None
    for node in graph.nodes:
        if not dyn[node.id]:
            continue
        if prev is not None and all(t == NO_TENSOR or graph.tensors[t].producer != prev for t in node.inputs):
            gaps.append(node.id)
        prev = node.id
    return gaps


def pinned_nodes(graph: Graph) -> list[bool]:
    """Per node: is it pinned in the chain? The dynamic nodes (passes.ordering.dynamic_nodes), and
    the constant-only ones that make a buffer from a constant shape (ConstantOfShape, Expand of a
    constant) of ``SHAPING_WEIGHT_BYTES`` or more: ORT would fold those into initializers at load,
    resident for the whole run instead of at their planned step (the loss gradient's Expand, a
    max-pool backward's zeros: 1.20x the plan under ORT's defaults; fuzzed, stop 49). Their shape
    input is gated like any other, so they are made where the plan makes them."""
    dyn = dynamic_nodes(graph)
    for node in graph.nodes:
        if not dyn[node.id] and node.op_type in ("ConstantOfShape", "Expand") and node.outputs \
                and constant_shape_input(graph, node) is not None \
                and graph.tensors[node.outputs[0]].nbytes >= SHAPING_WEIGHT_BYTES:
            dyn[node.id] = True
    return dyn


def pin_order(graph: Graph) -> Graph:
    """``graph`` with an ordering edge into each of ``chain_gaps(graph)`` and its static shapes
    hidden from ORT (see module docstring)."""
    dyn = pinned_nodes(graph)
    return _Pinner(graph).run(set(chain_gaps(graph, dyn)), dyn)


class _Pinner:
    def __init__(self, graph: Graph):
        self.g = graph
        self.b = GraphBuilder(name=graph.name, opsets=graph.opsets)
        self.edges = OrderingEdges(self.b, graph.names())
        self.new: dict[int, int] = {NO_TENSOR: NO_TENSOR}  # tensor id in graph -> id in the result
        self.read: dict[int, int] = {}  # graph input -> the shape-hiding view its readers read

    def run(self, gated: set[int], dyn: list[bool]) -> Graph:
        g, b = self.g, self.b
        # every dynamic node's constant target shape is replaced (gated, or hidden when not gated)
        shapes = {n.id: s for n in g.nodes if dyn[n.id] and (s := constant_shape_input(g, n)) is not None}
        for tid in g.inputs:
            t = g.tensors[tid]
            self.new[tid] = b.input(t.name, t.dtype, t.shape)
        self._copy_initializers({(nid, pos) for nid, (pos, _) in shapes.items()})
        hide = self.new[g.inputs[0]] if g.inputs else NO_TENSOR  # a gate that orders nothing
        for tid in g.inputs:
            if g.consumers[tid]:
                self.read[tid] = self.edges.view(self.new[tid], hide, f"{g.tensors[tid].name}__hide")
        layout = _layout_weights(g, dyn)
        weights = layout | _shaping_weights(g, dyn)
        for tid in sorted(weights):
            self.read[tid] = self.edges.view(self.new[tid], hide, f"{g.tensors[tid].name}__hide")
        gate = None  # result id of an output of the last dynamic node
        for node in g.nodes:
            direct = () if node.op_type not in PREPACKED_OPS else weights - layout  # MLAS prepacks those
            inputs = [self.read.get(t, self.new.get(t, NO_TENSOR)) if (dyn[node.id] or t not in weights)
                      and t not in direct else self.new[t] for t in node.inputs]
            if node.id in gated and gate is not None:
                inputs = self.edges.route(inputs, gate, f"{node.name}__pin", shapes.get(node.id))
            elif node.id in shapes:
                inputs = self.edges.route(inputs, hide, f"{node.name}__hide", shapes[node.id])
            outs = [None if t == NO_TENSOR else (g.tensors[t].name, g.tensors[t].dtype, g.tensors[t].shape)
                    for t in node.outputs]
            new = b.node(node.op_type, inputs, outs, name=node.name, domain=node.domain, attrs=node.attrs)
            for old, t in zip(node.outputs, new):
                self.new[old] = t
                if old in g.output_set and g.consumers[old] and dyn[node.id]:
                    # a graph output's declared shape is static: its readers read a view, or that
                    # shape reaches what they make (an optimizer step reading the gradients and
                    # moments it outputs: 1.26x under ORT's defaults; fuzzed, stop 49)
                    self.read[old] = self.edges.view(t, hide, f"{g.tensors[old].name}__hide")
            if dyn[node.id]:
                gate = next((t for t in new if t != NO_TENSOR), gate)
        for tid in g.outputs:
            b.output(self.new[tid])
        return b.build()

    def _copy_initializers(self, replaced: set[tuple[int, int]]) -> None:
        """Copy the initializers, but those every reader reads at a ``replaced`` (node, input) slot
        (a target shape the result computes instead; ORT would warn about and drop them unread).
        The edges read memplan's own int64 constants rather than make another of the same value, as
        the rewrite's do (passes.rewrite.memplans_own): a pinned plan held its autodiff's [1] twice."""
        g = self.g
        for t in g.initializers():
            reads = [(c, i) for c in g.consumers[t.id] for i, u in enumerate(g.nodes[c].inputs) if u == t.id]
            if t.id in g.outputs or not reads or not all(r in replaced for r in reads):
                self.new[t.id] = self.b.initializer(t.name, g.values[t.id], trainable=t.kind is TensorKind.TRAINABLE)
                if memplans_own(t):
                    self.edges.share(self.new[t.id], g.values[t.id])


def as_pinned_numerics(graph: Graph) -> Graph | None:
    """``graph`` computing what its pinned file computes, or None where they compute alike.

    Reading a Conv's weight through a view changes more than the layout ORT_ENABLE_ALL picks: ORT
    then runs the Conv with other kernels, whose sums may round differently (measured under the
    planned session options: the mobilenetv2 and efficientnet fixtures, depthwise convs, differ by up
    to 1.2e-5 from the same graph with its weights as initializers; zoo:cnn, resnet and unet and the
    resnet and vgg fixtures are bit-equal either way). The pinned unplanned graph
    computes each node as the pinned planned file does, so ``memplan verify`` still compares the
    plan bit for bit (against it) and reports the difference from the model as given apart."""
    return pin_order(graph) if _layout_weights(graph, dynamic_nodes(graph)) else None


#: Ops that read a weight straight from its initializer in a pinned file: ORT (MLAS) prepacks a
#: constant MatMul/Gemm weight at load, and their output's shape leaks no more than the hidden
#: activation they multiply.
PREPACKED_OPS = frozenset({"MatMul", "Gemm", "MatMulInteger"})
#: Float initializers of at least this many bytes that a dynamic elementwise node reads are hidden.
SHAPING_WEIGHT_BYTES = 1024


def _shaping_weights(graph: Graph, dyn: list[bool]) -> set[int]:
    """Float initializers of ``SHAPING_WEIGHT_BYTES`` or more that a dynamic node other than a
    prepacked one reads: through them the static shape of the weight reached what they broadcast
    into (the optimizer step's updates, a weight gradient's Add, a bias shaped like an
    activation), and ORT's memory reuse paired those same-sized buffers and held freed ones idle
    (fuzzed Adam steps at 90%: 1.26-1.30x their plan under ORT's defaults, arena off; stop 49)."""
    if not graph.inputs:
        return set()
    return {t for node in graph.nodes if dyn[node.id] and node.op_type not in PREPACKED_OPS
            for t in node.inputs if t in graph.values and graph.tensors[t].dtype in FLOAT_DTYPES
            and graph.tensors[t].nbytes >= SHAPING_WEIGHT_BYTES}


def _layout_weights(graph: Graph, dyn: list[bool]) -> set[int]:
    """Initializers a dynamic Conv reads as its weight (see the module docstring: hidden, ORT's
    NCHWc layout transformer leaves the Conv alone)."""
    if not graph.inputs:
        return set()
    return {node.inputs[1] for node in graph.nodes
            if node.op_type == "Conv" and dyn[node.id] and len(node.inputs) > 1 and node.inputs[1] in graph.values}
