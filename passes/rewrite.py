"""Graph + planned schedule -> Graph that runs that schedule: recompute copies, swap nodes, order edges.

Pre: ``graph`` validated; ``schedule`` is the event list of a plan for this graph
(``{"op": "compute", "node": NAME}``, ``{"op": "free" | "swap_out" | "swap_in", "tensor": NAME}``)
that computes every node at least once with its inputs resident.
Post: a validated Graph with the nodes in planned order. The first computation of a node keeps its
names; the k-th recomputation is a copy named ``<node>__rc<k>`` writing ``<tensor>__rc<k>`` (``__rc<k>_<j>``
where the graph holds such a name already: a planned model planned again), and
every later reader uses the newest copy, so ORT frees the original after its last planned reader.
A swap is ``MemcpyToHost`` -> ``<tensor>__host`` and ``MemcpyFromHost`` -> ``<tensor>__sw<k>``.
Each recompute whose inputs equal an earlier computation's (a chain's start) and each swap-in
reads its first input through a zero-copy ordering edge tied to the newest computation before it
in the schedule, the last first computation or one after it (``_Rewriter._gate``), so ORT's CSE
cannot merge it with the original and even ORT's default (DFS) execution order cannot hoist it back
to where the original was (passes/ordering.py).
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from passes.ordering import OrderingEdges, constant_shape_input, dynamic_nodes
from planner.chain_greedy import post_order
from planner.errors import PlannerError
from planner.graph import NO_TENSOR, Graph, GraphAppender, GraphBuilder, Node, Tensor, TensorKind, gc_paused
from planner.liveness import MemoryModel


#: Optional outputs a computation may omit when the plan reads that output only from another copy
#: (ORT would keep an unread output to the end of the run). Required ones get a 1-element reader.
#: A recurrent node's final states (Y_h, LSTM's Y_c) left out go to kernel temporaries instead
#: (planner/liveness.py MemoryModel._recurrent_buffers counts them).
OPTIONAL_OUTPUTS: Mapping[str, tuple[int, ...]] = {
    "MaxPool": (1,), "Dropout": (1,), "SoftmaxCrossEntropyLoss": (1,), "LayerNormalization": (1, 2),
    "LSTM": (1, 2), "GRU": (1,), "RNN": (1,),
}


#: Names of the int64 constants memplan itself writes (autodiff's, sinks' and ordering edges'): the
#: rewrite's edges and sinks read one of these of the value they need rather than make another
#: (``OrderingEdges.share``). A model's own initializer may be a graph input too, fed another value.
SHARED_PREFIX = "memplan__"


def memplans_own(t: Tensor) -> bool:
    """Whether initializer ``t`` is one of memplan's own constants (``SHARED_PREFIX``, not trained)."""
    return t.name.startswith(SHARED_PREFIX) and t.kind is TensorKind.FROZEN


class PlanMismatchError(PlannerError):
    """The plan does not fit this model (other model, edited file, corrupted plan)."""


def add_sink(x: Tensor, bounds: dict[int, tuple[int, int]], const: Callable[[str, np.ndarray], int],
             node: Callable[[str, str, list[int], str, tuple[int, ...], dict], None], opset: int,
             starts: Callable[[str, int], int] | None = None, source: int | None = None) -> None:
    """A tiny reader of tensor ``x`` (its first element), so that ORT frees it at once; the rewriter's
    recompute copies and passes/portable.py release_unread_outputs both append it.

    A 1-element Slice rather than Size: Size of a static shape is folded away by our importer
    (and ORT's constant folding), which would leave ``x`` unread again. A scalar gets a Size.
    ``bounds``: rank -> (starts, ends) of the Slice, made once per rank by ``const(stem, value)``
    (the new initializer's id); ``node(stem, op, inputs, dtype, shape, attrs)`` appends the reader, its
    node and output named from ``stem``. ``opset``: the graph's; below 10 Slice takes its bounds as
    attributes (with inputs, ORT refused the planned model of an opset-9 graph: "Node(..) with
    schema(::Slice:1) has input size 3 not in range [min=1, max=1]").
    ``starts(stem, rank)``: the Slice's starts (zeros) to read instead of the shared initializer,
    made on demand (the rewriter's reads the previous sink, so that ORT frees it: ``_Rewriter._sink``).
    ``source``: a tensor to read in place of ``x``, of its shape and type (the rewriter's: a view of
    ``x`` that waits for the previous sink, where the sink takes no starts: a scalar's or below 10).
    """
    stem, r = f"{x.name}__sink", len(x.shape)
    src = x.id if source is None else source
    if r == 0:
        node(stem, "Size", [src], "int64", (), {})
        return
    if opset < 10:
        node(stem, "Slice", [src], x.dtype, (1,) * r, {"starts": [0] * r, "ends": [1] * r})
        return
    if r not in bounds:
        bounds[r] = (const(f"memplan__sink{r}_starts", np.zeros(r, np.int64)),
                     const(f"memplan__sink{r}_ends", np.ones(r, np.int64)))
    zeros, ends = bounds[r]
    node(stem, "Slice", [src, zeros if starts is None else starts(stem, r), ends], x.dtype, (1,) * r, {})


def added_constant_bytes(graph: Graph) -> int:
    """An upper bound, whatever the plan, of the initializer bytes ``apply_schedule(graph, ...)`` adds.

    The planning problem does not see them, yet they join the rewritten graph's constant base: zoo:gpt
    at 70% found plans 68 bytes under the budget whose ordering edges' three int64 constants (72 bytes)
    put the rewritten graph 4 bytes over it, and every tighter solve overshot too. So a plan that
    overshoots is re-solved for the budget less this bound (passes/plan_model.py). What the rewrite
    can add, each value at most once (passes/ordering.py OrderingEdges.const) and none that the graph
    holds under memplan's names already (``SHARED_PREFIX``): an ordering edge's int64 zeros, a scalar
    or one vector per rank r of a tensor it may view (8r bytes), and each constant target shape of a
    Reshape/Expand/ConstantOfShape it may gate; a sink's starts (those zeros) and ends (ones), per
    rank r of an output it may read (opset 10 up: ``add_sink``). Edges and sinks read tensors of this
    graph, so the ranks and shapes of its tensors and nodes bound them."""
    ranks = {len(t.shape) for t in graph.tensors} - {0}
    values = {((), (0,))} | {((r,), (0,) * r) for r in ranks}
    values |= {((len(shape),), shape) for node in graph.nodes
               if (found := constant_shape_input(graph, node)) is not None for shape in [found[1]]}
    if graph.onnx_opset >= 10:
        values |= {((r,), (1,) * r) for r in ranks}
    held = {(v.shape, tuple(v.ravel().tolist())) for t in graph.initializers()
            if memplans_own(t) and (v := graph.values[t.id]).dtype == np.int64}
    return sum(8 * int(np.prod(shape)) for shape, _ in values - held)


def added_helper_bytes(graph: Graph, line: int = MemoryModel().alloc_line) -> int:
    """An upper bound of the bytes of the rewrite's helper tensors live while a computation of the
    plan runs, which the planning problem does not see either (one ``line``, ORT's allocation unit,
    each): the last recompute sink's 1-element output, held until the next computation reads it (zoo:gpt
    at 70%: at the rewritten peak), and a gated target shape its Reshape/Expand reads. An ordering
    edge's ``Size(gate) * 0`` dies at its view, before the computation (``OrderingEdges.forget_gates``)."""
    targets = any(constant_shape_input(graph, node) is not None for node in graph.nodes)
    return line * (1 + targets)


def apply_schedule(graph: Graph, schedule: Sequence[Mapping[str, object]]) -> Graph:
    """Rewrite ``graph`` so that running it in file order executes ``schedule`` (the cyclic GC paused:
    planner.graph.gc_paused)."""
    with gc_paused():
        return _Rewriter(graph).run(schedule)


class _Rewriter:
    def __init__(self, graph: Graph):
        self.g = graph
        self.b = GraphBuilder(name=graph.name, opsets=graph.opsets)
        self.node_by_name = {n.name: n for n in graph.nodes}
        # current[t]: id in the new graph of the newest copy of original tensor t (None once freed)
        self.current: dict[int, int | None] = {}
        self.computed: dict[int, int] = {}  # node id -> times emitted
        self.swapped: dict[int, int] = {}  # tensor id -> host copy id (new graph)
        self.swap_count: dict[int, int] = {}
        # new-graph tensor of the last first computation of a node that depends on a graph input: a
        # gate computed from constants only would be constant-folded by ORT, and the edge with it
        self.last_output: int | None = None
        self.dynamic = dynamic_nodes(graph)
        self.edges = OrderingEdges(self.b, graph.names())
        self.sink_slices: dict[int, tuple[int, int]] = {}  # rank -> (starts, ends) of a 1-element Slice
        self.sink_tail: int | None = None  # the last sink's 1-element output, unread so far (_sink, _read_sink_tail)
        # (node, its inputs as ORT's CSE sees them: _cse_key) of every emitted computation, and
        # ("in", host copy) of every swap-in: a recompute with the same inputs as an earlier copy gets
        # an ordering edge, or ORT's CSE would merge the two (and fail to load where their optional
        # outputs differ); one reading a fresh copy follows that copy anyway
        self.emitted: set[tuple] = set()
        self._cse: dict[int, int] = {}  # new-graph tensor -> its class under ORT's CSE (_cse_class)
        self._cse_ids: dict[tuple, int] = {}
        self._origin: dict[int, int] = {}  # new-graph node -> the node of the graph it computes
        self.skipped: set[int] = set()  # tensors whose current computation was not emitted (never read)
        self.freed_swaps: set[int] = set()  # tensors a swap-out nobody swaps back in freed instead
        # per node, made once rather than per event (a plan of a few hundred thousand events
        # rewrote in minutes): its outputs that are graph outputs, those that are not, and each
        # output's (name, dtype, shape) as its first computation writes it (None: no output there)
        outputs = graph.output_set
        self.graph_outs = [tuple(t for t in n.outputs if t != NO_TENSOR and t in outputs) for n in graph.nodes]
        self.plain_outs = [tuple(t for t in n.outputs if t != NO_TENSOR and t not in outputs) for n in graph.nodes]
        self.specs = [[None if t == NO_TENSOR else (graph.tensors[t].name, graph.tensors[t].dtype,
                                                    graph.tensors[t].shape) for t in n.outputs]
                      for n in graph.nodes]
        self.current[NO_TENSOR] = NO_TENSOR  # an absent input reads as absent (_compute maps inputs at once)
        self._needed: set[int] | None = None

    # ---- setup ---------------------------------------------------------------------------
    def _copy_constants(self) -> None:
        g, b = self.g, self.b
        for tid in g.inputs:
            t = g.tensors[tid]
            self.current[tid] = b.input(t.name, t.dtype, t.shape)
        for t in g.initializers():
            self.current[t.id] = b.initializer(t.name, g.values[t.id], trainable=t.kind is TensorKind.TRAINABLE)
            if memplans_own(t):
                self.edges.share(self.current[t.id], g.values[t.id])

    def _live_nodes(self) -> set[int]:
        """Nodes some graph output depends on (the others are emitted as the plan computes them)."""
        g, live = self.g, set()
        stack = [g.tensors[t].producer for t in g.outputs if g.tensors[t].producer >= 0]
        while stack:
            n = stack.pop()
            if n not in live:
                live.add(n)
                stack.extend(g.tensors[t].producer for t in g.nodes[n].inputs
                             if t != NO_TENSOR and g.tensors[t].producer >= 0)
        return live

    def _decode(self, schedule: Sequence[Mapping[str, object]]) -> list[tuple[object, object]]:
        """Each event as (op, its Node for a compute, its tensor id for a free or swap; None where
        this model has no such name), looked up once for ``_reads``, ``_dead_swap_outs`` and ``run``."""
        node_by_name, by_name = self.node_by_name, self.g.by_name
        out: list[tuple[object, object]] = []
        for ev in schedule:
            op = ev.get("op")
            if op == "compute":
                out.append((op, node_by_name.get(ev.get("node"))))  # type: ignore[arg-type]
            elif op == "free" or op == "swap_out" or op == "swap_in":
                out.append((op, by_name.get(ev.get("tensor"))))  # type: ignore[arg-type]
            else:
                out.append((op, None))
        return out

    def _reads(self, events: Sequence[tuple[object, object]],
               dead: frozenset[int] = frozenset()) -> dict[int, set[int]]:
        """For each emitted compute or swap-in event: the tensors some later emitted event reads
        from it. ``events``: the schedule as ``_decode`` gives it.

        A computation is emitted when a graph output, a swap-out or another emitted computation reads
        it (walking the schedule backwards, as reads only go forwards), or when no graph output
        depends on its node at all. A computation read only by computations that are not emitted
        is not emitted either: ORT would keep its unread outputs to the end of the run. So is a
        swap-in nobody emitted reads (the plan moves a node's outputs as one buffer; a reader may
        need only some of them). ``dead``: swap-out events to take as frees (none of their
        swap-ins is emitted), so that they read nothing.
        """
        live: dict[int, int] = {}  # tensor -> index of the compute or swap-in event whose copy is current
        sources: list[tuple[int, Node, list[tuple[int, int]]]] = []  # compute event, its node, (producer event, tensor) it reads
        used: dict[int, set[int]] = {}
        graph_outs, plain_outs = self.graph_outs, self.plain_outs
        for i, (op, x) in enumerate(events):
            if op == "compute":
                if x is None:
                    continue
                nid = x.id  # type: ignore[union-attr]
                sources.append((i, x, [(live[t], t) for t in x.inputs if t in live]))  # type: ignore[union-attr]
                for t in plain_outs[nid]:
                    live[t] = i
                for t in graph_outs[nid]:  # a graph output: its first copy
                    if t not in live:
                        live[t] = i
            elif op == "free" or op == "swap_out":
                if x in live:
                    if op == "swap_out" and i not in dead:
                        used.setdefault(live[x], set()).add(x)  # type: ignore[index]
                    del live[x]  # type: ignore[arg-type]
            elif op == "swap_in" and x is not None:
                live[x] = i  # type: ignore[index]
        for t in self.g.outputs:
            if t in live:
                used.setdefault(live[t], set()).add(t)
        if self._needed is None:
            self._needed = self._live_nodes()
        needed_nodes = self._needed
        for j, node, reads in reversed(sources):
            if j in used or node.id not in needed_nodes:
                if j not in used:
                    used[j] = set()
                for i, t in reads:
                    got = used.get(i)
                    if got is None:
                        used[i] = {t}
                    else:
                        got.add(t)
        return used

    def run(self, schedule: Sequence[Mapping[str, object]]) -> Graph:
        self._copy_constants()
        events = self._decode(schedule)
        dead = self._dead_swap_outs(events, used := self._reads(events))
        if dead:
            used = self._reads(events, dead)  # the events to emit, and what is read from each
        # outputs some computation's copy is read from: any other copy left unread would dangle
        self.wanted_outputs = {t for outs in used.values() for t in outs} - set(self.g.outputs)
        current, skipped, computed, no_reads = self.current, self.skipped, self.computed, frozenset()
        activation = [t.kind is TensorKind.ACTIVATION for t in self.g.tensors]
        for k, (op, x) in enumerate(events):
            if op == "compute":
                node = x if x is not None else self._node(schedule[k], k)
                if k not in used:
                    # computed, then dropped before anything emitted read it: ORT would keep
                    # its unread outputs to the end of the run, so this computation is not emitted
                    for t in node.inputs:  # type: ignore[union-attr]
                        if t != NO_TENSOR and t not in skipped and current.get(t) is None:
                            self._read(t, node)  # type: ignore[arg-type]
                    computed.setdefault(node.id, 0)  # type: ignore[union-attr]
                    for t in node.outputs:  # type: ignore[union-attr]
                        if t != NO_TENSOR and not self._bound(t):
                            current[t] = None
                            skipped.add(t)
                    continue
                self._compute(node, used.get(k, no_reads))  # type: ignore[arg-type]
            elif op == "free":
                if x is not None and activation[x] and x not in skipped and current.get(x) is not None:
                    current[x] = None  # _free's common case, inline
                else:
                    self._free(x if x is not None else self._tensor(schedule[k], k))  # type: ignore[arg-type]
            elif op == "swap_out":
                tid = x if x is not None else self._tensor(schedule[k], k)
                if k in dead:  # nothing reads it back: a free
                    self._free(tid)  # type: ignore[arg-type]
                    self.freed_swaps.add(tid)  # type: ignore[arg-type]
                else:
                    self._swap_out(tid)  # type: ignore[arg-type]
            elif op == "swap_in":
                tid = x if x is not None else self._tensor(schedule[k], k)
                if k in used:
                    self._swap_in(tid)  # type: ignore[arg-type]
                elif tid not in self.swapped and tid not in self.freed_swaps:
                    raise PlanMismatchError(f"the plan swaps {self.g.tensors[tid].name!r} in before swapping it out")  # type: ignore[index]
                else:  # nobody reads this copy: ORT would keep it to the end of the run
                    current[tid] = None  # type: ignore[index]
                    skipped.add(tid)  # type: ignore[arg-type]
            else:
                raise PlanMismatchError(f"schedule event {k} has unknown op {op!r}")
        missing = [n.name for n in self.g.nodes if n.id not in self.computed]
        if missing:
            raise PlanMismatchError(
                f"the plan never computes node {missing[0]!r} ({len(missing)} nodes missing); "
                "it is another model's plan, or an edited one"
            )
        for tid in self.g.outputs:
            self.b.output(self._read(tid, "graph output"))
        return self.b.build()

    def _dead_swap_outs(self, events: Sequence[tuple[object, object]], used: Mapping[int, set[int]]) -> frozenset[int]:
        """Swap-out events none of whose swap-ins (up to the tensor's next swap-out) is read."""
        dead: set[int] = set()
        out_at: dict[object, int] = {}  # tensor -> its last swap-out event whose swap-ins are all unread so far
        for k, (op, t) in enumerate(events):
            if op == "swap_out":
                out_at[t] = k
                dead.add(k)
            elif op == "swap_in" and k in used and t in out_at:
                dead.discard(out_at[t])
        return frozenset(dead)

    # ---- lookups ---------------------------------------------------------------------------
    def _node(self, event: Mapping[str, object], k: int) -> Node:
        name = event.get("node")
        if name not in self.node_by_name:
            raise PlanMismatchError(f"schedule event {k} computes node {name!r}, which this model does not have")
        return self.node_by_name[name]  # type: ignore[index]

    def _tensor(self, event: Mapping[str, object], k: int) -> int:
        name = event.get("tensor")
        tid = self.g.by_name.get(name)  # type: ignore[arg-type]
        if tid is None:
            raise PlanMismatchError(f"schedule event {k} moves tensor {name!r}, which this model does not have")
        return tid

    def _read(self, tid: int, reader: str | Node) -> int:
        """``tid``'s current copy. ``reader`` (a description, or the node reading it) names the
        reader in the error; a node's is made only then (one string per input read cost seconds
        on graphs of a few hundred thousand computes)."""
        cur = self.current.get(tid)
        if cur is None:
            who = f"node {reader.name!r}" if isinstance(reader, Node) else reader
            raise PlanMismatchError(
                f"{who} reads {self.g.tensors[tid].name!r} while it is not resident in the plan"
            )
        return cur

    def _bound(self, tid: int) -> bool:
        """Is ``tid`` a graph output made already? It stays the first computation's: a recompute's
        copy of it is read by nobody and never replaces it."""
        return tid in self.g.output_set and self.current.get(tid) is not None

    # ---- events ----------------------------------------------------------------------------
    def _compute(self, node: Node, read: set[int] | frozenset[int] = frozenset()) -> None:
        nid, current = node.id, self.current
        k = self.computed.get(nid, 0)
        inputs = [current.get(t) for t in node.inputs]  # current[NO_TENSOR] is NO_TENSOR
        if None in inputs:
            for t in node.inputs:
                if t != NO_TENSOR:
                    self._read(t, node)  # raises for the first input not resident
        if self.sink_tail is not None:
            inputs = self._read_sink_tail(node, inputs)
        if k == 0:
            name, suffix = node.name, ""
            key = self._cse_key(nid, inputs)  # type: ignore[arg-type]
        else:
            suffix = self._copy_suffix(node, f"__rc{k}")
            name = node.name + suffix
            inputs, key = self._distinct(node, inputs, f"{name}__order")  # type: ignore[arg-type]
        # a copy nobody reads of an output the plan reads elsewhere would stay to the end of the run;
        # so would a recompute's copy of a graph output (_bound)
        again = {t for t in self.graph_outs[nid] if current.get(t) is not None}
        wanted = self.wanted_outputs
        unread = {t for t in node.outputs if t != NO_TENSOR and t not in read and t in wanted} | again
        specs = self.specs[nid]
        if unread:
            droppable = OPTIONAL_OUTPUTS.get(node.op_type, ())
            specs = [None if spec is None or (slot in droppable and t in unread) else spec
                     for slot, (t, spec) in enumerate(zip(node.outputs, specs))]
        outs = specs if not suffix else [None if spec is None else (spec[0] + suffix, spec[1], spec[2])
                                         for spec in specs]
        new = self.b.node(node.op_type, inputs, outs, name=name, domain=node.domain, attrs=node.attrs)  # type: ignore[arg-type]
        self._origin[self.b.nodes_added - 1] = nid
        skipped = self.skipped
        for old, t in zip(node.outputs, new):
            if old != NO_TENSOR and old not in again:
                if t != NO_TENSOR:
                    current[old] = t
                    skipped.discard(old)
                else:
                    current[old] = None
                    skipped.add(old)
        if unread:
            for old, t in zip(node.outputs, new):
                if t != NO_TENSOR and old in unread:
                    # a required output nobody reads: hand it to a tiny reader so ORT frees it
                    self._sink(t)
        if k == 0 and self.dynamic[nid]:
            self.last_output = next((t for t in new if t != NO_TENSOR), self.last_output)
        self.emitted.add(key)
        self.computed[nid] = k + 1

    def _distinct(self, node: Node, inputs: list[int], stem: str) -> tuple[list[int], tuple]:
        """``inputs`` of a recompute of ``node``, and its key in ``emitted``: where an emitted
        computation of the node reads the same inputs as ORT's CSE sees them, read through ordering
        edges after the last first computation (passes/ordering.py), one more each time until none
        does. Two recompute chains of one node after the same gate got edges that ORT's
        ConstantSharing and CSE made equal again, merged the two chains and failed to load where
        their LayerNormalization copies dropped other optional outputs (zoo:gpt at 70%, the
        depth-first walk's plan: "Argument type mismatch when adding edge")."""
        key = self._cse_key(node.id, inputs)
        if key in self.emitted and self.last_output is not None:
            shape_input = constant_shape_input(self.g, node)
            gate = self._gate()
            while key in self.emitted:
                inputs = self.edges.route(inputs, gate, stem, shape_input)
                self.edges.forget_gates()  # the planning problem does not see them: each dies at once
                shape_input = None  # a second edge goes through a view of the first input
                key = self._cse_key(node.id, inputs)
        return inputs, key

    def _gate(self) -> int:
        """The tensor an ordering edge made now waits for: the output of the newest computation
        emitted of a node that depends on a graph input (``dynamic_nodes``: ORT folds the others),
        ``last_output`` (the last first computation) or one after it. ORT runs ``Size(gate)`` as soon
        as the gate exists (planner.liveness.run_order) and holds it to the edge, across every
        computation in between: gated on ``last_output``, the Size of a loss's gradient was held
        across a LayerNormalization recompute and the chain after it, one allocator line at the
        rewritten peak that the planning problem does not see (fuzzed seed 3 at 822 bytes: 992
        rewritten, 928 gated on the newest computation). The gate comes after ``last_output`` in the
        file, so PRIORITY_BASED runs the edge's node after it; in ORT's default (DFS) order the node
        follows the gate, and a recompute copy gated so follows its chain's own edge in turn."""
        b, root = self.b, self.last_output
        stop = b.tensor(root).producer  # type: ignore[arg-type]
        for nid in range(b.nodes_added - 1, stop, -1):
            origin = self._origin.get(nid)
            if origin is not None and self.dynamic[origin]:
                out = next((t for t in b.added(nid).outputs if t != NO_TENSOR), None)
                if out is not None:
                    return out
        return root  # type: ignore[return-value]

    def _cse_key(self, nid: int, inputs: Sequence[int]) -> tuple:
        return (nid, tuple(t if t == NO_TENSOR else self._cse_class(t) for t in inputs))

    def _cse_class(self, tid: int) -> int:
        """``tid``'s class under ORT's optimisers at their default level: two tensors in one class
        may be merged into one. ConstantSharing merges equal scalar initializers (small ones are
        taken as equal by value here too: a class too many only costs an ordering edge), then CSE
        merges nodes with the same op, attributes and inputs (a copy of a node of the graph counts
        as that node), output by output."""
        b = self.b

        def inputs(t: int) -> Sequence[int]:
            node = b.producer_node(t)
            return () if node is None else [u for u in node.inputs if u != NO_TENSOR]

        def klass(t: int) -> int:
            node = b.producer_node(t)
            if node is None:
                value = b.value(t)
                key: tuple = (("const", value.dtype.str, value.shape, value.tobytes())
                              if value is not None and value.size <= 16 else ("tensor", t))
            else:
                origin = self._origin.get(node.id)
                what = ("node", origin) if origin is not None else \
                    (node.op_type, node.domain, repr(sorted(node.attrs.items())))
                key = (what, node.outputs.index(t), tuple(u if u == NO_TENSOR else self._cse[u] for u in node.inputs))
            return self._cse_ids.setdefault(key, len(self._cse_ids))

        post_order(tid, inputs, self._cse, klass)  # inputs first, iteratively: chains run deep
        return self._cse[tid]

    def _sink(self, t: int) -> None:
        """A tiny reader of ``t``, so that ORT frees it at once (``add_sink``).

        Nobody reads the sink's own 1-element output, so ORT holds it to the end of the run: one per
        recompute copy with an unread output added up (zoo:gpt at 70%: 24 LayerNormalization copies'
        sinks, 1536 bytes the planning problem does not see, put the rewritten graph 1604 bytes over
        the budget its plan fit). So each sink's starts read the previous sink's output through an
        ordering edge's ``Size(prev) * 0`` (passes/ordering.py): ORT frees it there, and the next
        computation reads the last one (``_read_sink_tail``).
        A sink with no starts to gate (a scalar's ``Size``, a Slice below opset 10: bounds as
        attributes) reads ``t`` through the edge's view instead (a scalar's is a copy): read by none,
        they once all stayed to the end (an opset-9 Split recomputed 5 times for its second half: 6
        sinks; a DynamicQuantizeLinear's unread scale and zero point: 64 bytes more per copy)."""
        made: list[int] = []

        def node(stem: str, op: str, inputs: list[int], dtype: str, shape: tuple[int, ...], attrs: dict) -> None:
            name = self._fresh(stem)
            made.extend(self.b.node(op, inputs, [(name, dtype, shape)], name=name, attrs=attrs))

        tail, x = self.sink_tail, self.b.tensor(t)
        opset = self.g.onnx_opset
        starts = None if tail is None or not x.shape or opset < 10 else \
            (lambda stem, r: self.edges.gated_shape(tail, (0,) * r, f"{stem}__order"))
        source = self.edges.view(t, tail, f"{x.name}__sink__order") if tail is not None and starts is None else None
        # fresh names: a training step's or released forward graph's own sinks hold these already
        add_sink(x, self.sink_slices, lambda stem, value: self.edges.const(value, stem), node, opset, starts, source)
        self.edges.forget_gates()
        if made:
            self.sink_tail = made[-1]  # it read the tail (or there was none)

    def _read_sink_tail(self, node: Node, inputs: list[int]) -> list[int]:
        """``inputs`` of ``node``, its first activation input read through an ordering edge on the
        last sink's output (``sink_tail``), so that ORT frees that output there rather than hold it to
        the end of the run: a byte line the planning problem does not see, at every step after the
        last recompute with an unread output (fuzzed seed 8 at 1300 bytes, ``--add-loss mean``: a
        Split recomputed for its second half, planned at 1272 bytes, rewritten 1336). A node with no
        activation input leaves the tail to the next one."""
        pos = next((i for i, t in enumerate(node.inputs) if t != NO_TENSOR
                    and self.g.tensors[t].kind is TensorKind.ACTIVATION), None)
        if pos is None:
            return inputs
        out = list(inputs)
        out[pos] = self.edges.view(out[pos], self.sink_tail, f"{node.name}__sink__order")  # type: ignore[arg-type]
        self.edges.forget_gates()
        self.sink_tail = None
        return out

    def _copy_suffix(self, node: Node, stem: str) -> str:
        """``stem`` (or ``stem_j``): a suffix that gives ``node``'s name and each of its outputs'
        a name the graph does not hold and the rewrite has not handed out; those names are then
        taken. A planned model planned again holds ``conv__rc1`` already: recomputing ``conv``
        there failed with "tensor name 'conv__rc1' is used twice" (exit 1, as if infeasible)."""
        names = (node.name, *(self.g.tensors[t].name for t in node.outputs if t != NO_TENSOR))
        suffix, j = stem, 0
        while any(self._held(x + suffix) for x in names):
            suffix, j = f"{stem}_{j}", j + 1
        self.edges.taken.update(x + suffix for x in names)
        return suffix

    def _held(self, name: str) -> bool:
        """Is ``name`` the new graph's already, or one the graph's own nodes and tensors will take?"""
        return self.b.has(name) or name in self.edges.taken

    def _fresh(self, stem: str) -> str:
        """``stem`` (or ``stem_k``), a name the new graph does not have yet and the graph's own nodes
        and tensors will not take later: the first computation of a Split whose graph-made reader
        ``d__sink`` ran after a recompute got a sink of that name, and the graph's own ``d__sink``
        then failed with "tensor name 'd__sink' is used twice" (bench/fuzz_e2e.py seed 23)."""
        name, k = stem, 0
        while self._held(name):
            name, k = f"{stem}_{k}", k + 1
        self.edges.taken.add(name)
        return name

    def _free(self, tid: int) -> None:
        if self.g.tensors[tid].kind is not TensorKind.ACTIVATION:
            raise PlanMismatchError(f"the plan frees {self.g.tensors[tid].name!r}, an input or initializer")
        if tid in self.skipped:
            self.skipped.discard(tid)
            return  # its computation was not emitted (nobody read it)
        self._read(tid, "a free event")
        self.current[tid] = None

    def _swap_out(self, tid: int) -> None:
        t = self.g.tensors[tid]
        src = self._read(tid, "a swap_out event")
        # a tensor swapped out again (out, in, out) gets a host copy of a fresh name: the second
        # one was a GraphError "tensor name 'a__host' is used twice"
        (host,) = self.b.node("MemcpyToHost", [src], [(self._fresh(f"{t.name}__host"), t.dtype, t.shape)],
                              name=self._fresh(f"{t.name}__swap_out"))
        self.swapped[tid] = host
        self.current[tid] = None

    def _swap_in(self, tid: int) -> None:
        t = self.g.tensors[tid]
        if tid not in self.swapped:
            raise PlanMismatchError(f"the plan swaps {t.name!r} in before swapping it out")
        k = self.swap_count.get(tid, 0) + 1
        self.swap_count[tid] = k
        host = self.swapped[tid]
        if self.last_output is not None:
            gate = self._gate()
            # one more edge each time as CSE would see an earlier swap-in of it here (_distinct)
            host = self.edges.view(host, gate, f"{t.name}__sw{k}__order")
            self.edges.forget_gates()
            while ("in", self._cse_class(host)) in self.emitted:
                host = self.edges.view(host, gate, f"{t.name}__sw{k}__order")
                self.edges.forget_gates()
        self.emitted.add(("in", self._cse_class(host)))
        (dev,) = self.b.node("MemcpyFromHost", [host], [(self._fresh(f"{t.name}__sw{k}"), t.dtype, t.shape)],
                             name=self._fresh(f"{t.name}__swap_in{k}"))
        self.current[tid] = dev


def default_schedule(graph: Graph, order: Iterable[int] | None = None) -> list[dict[str, object]]:
    """The unplanned schedule: every node once, in ``order`` (file order by default)."""
    ids = range(len(graph.nodes)) if order is None else order
    return [{"op": "compute", "node": graph.nodes[i].name} for i in ids]


#: The float tensor ``prime_arena`` makes first (and a 1-element Slice of it, so ORT frees it at once).
PRIME, PRIME_READ = "memplan_arena_prime", "memplan_arena_prime_read"
#: Below this a primer is not worth a node, and memplan's importer would fold it into a constant.
MIN_PRIME_BYTES = 64 << 10


def prime_arena(graph: Graph, nbytes: int) -> Graph:
    """``graph`` with a float buffer of ``nbytes`` (rounded down to whole floats) made before any other
    node and freed after one 1-element read. Under ORT's BFC arena with ``kSameAsRequested`` every
    extension is a region of exactly the request, and chunks of different regions never merge: a
    plan's many buffer sizes leave the arena far above its peak (bench/results/gpu_zoo_prep_stop50.md:
    1.3-2.1x on convnets planned at 60%). The primer's region comes first; later buffers are carved
    out of it and merge back into it (mobilenetv2 at 60%: 1.63 -> 1.06x its peak on CPU ORT's arena,
    bench/arena_priming.py). ``passes.plan_model`` picks ``nbytes`` with planner/arena.py's replay."""
    if nbytes < MIN_PRIME_BYTES:
        raise ValueError(f"an arena primer of {nbytes} bytes is below {MIN_PRIME_BYTES}")
    a = GraphAppender(graph)
    shape = a.add_const(f"{PRIME}_shape", np.array([nbytes // 4], dtype=np.int64))
    prime = a.add_tensor(PRIME, "float32", (nbytes // 4,))
    a.add_node(PRIME, "ConstantOfShape", [shape], [prime])
    starts = a.add_const(f"{PRIME}_starts", np.array([0], np.int64))
    ends = a.add_const(f"{PRIME}_ends", np.array([1], np.int64))
    read = a.add_tensor(PRIME_READ, "float32", (1,))
    a.add_node(PRIME_READ, "Slice", [prime, starts, ends], [read])
    a.nodes.extend(graph.nodes)
    return a.finish()
