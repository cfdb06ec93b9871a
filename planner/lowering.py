"""Graph -> PlanningProblem, and a plan over that problem -> the Graph's own event schedule.

The solvers see one buffer per problem node. A Graph has multi-output nodes, zero-copy views and
outputs nobody reads, so lowering groups them:
  * every ONNX node that allocates is a problem node; its size is the bytes of the buffers it
    allocates (all its outputs, views excluded);
  * a view (Reshape/Identity/... of a produced tensor, other inputs constant) joins its source's
    group: it shares the buffer, so it is freed, recomputed and swapped with it;
  * a view of a constant is a problem node of size 0;
  * a view into a graph output is a problem node of its own (its copy's bytes): ORT copies it
    into the output when the view runs (liveness.py);
  * an output nobody reads stays resident to the end in ORT (liveness.py): its bytes go to a
    *companion* of its node (below), or under 0.1% of the peak to the constant base
    (conservative; ``late_base_bytes``: the floor leaves them out, as ORT holds them only once
    made);
  * a node holding a graph output is pinned; where some of its buffers die, the graph outputs'
    bytes go to a companion and the node is freed after its last read. A companion
    (``PlanningProblem.companion``) follows its node, pinned, at cost 0, and makes no ONNX node;
  * a node's buffers with readers of their own are its ``PlanningProblem.parts``: ORT frees each
    after its own last reader (a MaxPool's Y before its Indices), and so do simulate() and the
    unplanned peak; the solvers still move the node as one buffer;
  * random ops are never recomputed;
  * an in-place op (Relu & co.) run right after the producer of its input, that input read by
    it alone, joins the producer's group with one buffer (``_in_place_group``): ORT writes it
    into that buffer in every plan. The producer may be such an op itself: a chain of them is one
    group and one buffer, as in ORT. Other in-place ops count a buffer of their own (see
    ``lower``); the bytes they may
    write into an input's buffer go to ``PlanningProblem.in_place``, which only the memory floor
    reads, except where the op alone reads that input (``PlanningProblem.takes_over``: simulate()
    and the CP-SAT model count the two once when the op reads the input's copy last). What
    memplan claims no plan can go below must hold with ORT's in-place runs too; so
    do ``kept_bytes`` and ``read_bytes``: a node's outputs that are not graph outputs, or that a
    reader does not read, may be freed apart from the rest).
The problem's memory then never under-states the Graph's (see tests/test_lowering.py), and the
rewritten Graph is analysed again before a plan is returned.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from planner.devices import COPIES_OVERLAP_COMPUTE
from planner.graph import DTYPE_BITS, NO_TENSOR, Graph, Node, TensorKind
from planner.liveness import MemoryModel, analyze
from planner.plan import Plan
from planner.problem import PlanningProblem

#: Never recomputed: a second run would draw other random numbers.
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})


@dataclass(frozen=True)
class Lowering:
    """How problem nodes map back to the Graph."""

    graph: Graph
    groups: tuple[tuple[int, ...], ...]  # problem node -> Graph node ids, in schedule order
    buffers: tuple[tuple[int, ...], ...]  # problem node -> tensor ids of the buffers it allocates
    views: tuple[tuple[int, ...], ...]  # problem node -> Graph node ids of its views (subset of groups)
    dangling_bytes: int  # unread outputs counted in the constant base
    taken: tuple[tuple[int, ...], ...] = ()  # problem node -> Graph nodes whose buffer it writes in place

    def onnx_schedule(self, plan: Plan) -> list[dict[str, Any]]:
        """The plan's events in the Graph's terms: compute NODE, free/swap_* TENSOR."""
        g = self.graph
        out: list[dict[str, Any]] = []
        outputs = g.output_set
        gone: set[int] = set()  # tensors freed and not made again since: a later free skips them

        def made(nodes) -> None:
            gone.difference_update(t for n in nodes for t in g.nodes[n].outputs)

        def free(tensors) -> None:
            for t in tensors:
                if t not in gone:
                    out.append({"op": "free", "tensor": g.tensors[t].name})
                    gone.add(t)

        for e in plan.events:
            nodes = self.groups[e.node]
            if e.op == "compute":
                out.extend({"op": "compute", "node": g.nodes[n].name} for n in nodes)
                made(nodes)
            elif e.op == "free":
                free(t for n in nodes for t in g.nodes[n].outputs if t != NO_TENSOR and t not in outputs)
            elif e.op == "swap_out":
                out.extend({"op": "swap_out", "tensor": g.tensors[t].name} for t in self.buffers[e.node])
                # the group's views and the input buffer its in-place member took over go with it
                # (not swapped back in: a later free of the group must not free them again)
                free(g.nodes[v].outputs[0] for v in self.views[e.node] + (self.taken[e.node] if self.taken else ()))
            elif e.op == "swap_in":
                out.extend({"op": "swap_in", "tensor": g.tensors[t].name} for t in self.buffers[e.node])
                # the views are re-made on the swapped-in copy (zero-copy, no time)
                out.extend({"op": "compute", "node": g.nodes[v].name} for v in self.views[e.node])
                made(self.views[e.node])
        return out


NodeTime = Callable[[Graph, Node], float]


def lower(
    graph: Graph,
    *,
    node_time: NodeTime | None = None,
    transfer_time: Callable[[int], float] | None = None,
    copy_overlap: bool = COPIES_OVERLAP_COMPUTE,
    time_unit: str = "",
    memory: MemoryModel | None = None,
) -> tuple[PlanningProblem, Lowering]:
    """Build the PlanningProblem of ``graph`` (in its node order) and the map back to it."""
    # In-place outputs are counted as buffers of their own: a recompute or free can move the
    # in-place op away from its input's last read, and then ORT gives it a fresh buffer. This
    # over-states memory by one buffer at an in-place step (safe); plans are re-checked with the
    # in-place model on the rewritten graph.
    memory = memory or MemoryModel(in_place=False)
    lv = analyze(graph, model=memory)
    node_time = node_time or (lambda g, n: 1.0)
    group_of = np.full(len(graph.nodes), -1, dtype=np.int64)
    groups: list[list[int]] = []
    views: list[list[int]] = []
    taken: list[list[int]] = []  # per group: the node whose buffer its in-place member takes over
    # ORT's own in-place rule, whatever ``memory`` counts: the groups below and the floor follow it
    ort_rule = MemoryModel()
    for node in graph.nodes:
        src = memory.view_source(graph, node)
        others_constant = all(
            t == NO_TENSOR or graph.tensors[t].is_constant_base for t in node.inputs[1:]
        )
        # a view into a graph output is a copy (liveness.py: ORT allocates it when the view runs),
        # so it is a problem node of its own: grouped with its source, its copy was counted from
        # the source's step on, with the source's inputs (zoo:mlp's bias gradients: ReduceSum,
        # then the Reshape into the graph output; the problem's unplanned peak was 512 B over
        # the model's own)
        if src != NO_TENSOR and len(node.outputs) == 1 and others_constant and graph.tensors[src].producer >= 0 \
                and node.outputs[0] not in graph.output_set:
            j = int(group_of[graph.tensors[src].producer])
            groups[j].append(node.id)
            views[j].append(node.id)
            group_of[node.id] = j
            continue
        j = _in_place_group(graph, node, groups, views, group_of, ort_rule)
        if j >= 0:
            taken[j].append(groups[j][-1])
            groups[j].append(node.id)
            group_of[node.id] = j
            continue
        group_of[node.id] = len(groups)
        groups.append([node.id])
        views.append([])
        taken.append([])

    readers = graph.consumers
    outputs = graph.output_set
    pinned_buffers = {int(lv.buffer_of[t]) for t in outputs if lv.buffer_of[t] >= 0}
    read_buffers = {int(lv.buffer_of[t]) for t in range(len(graph.tensors)) if readers[t] and lv.buffer_of[t] >= 0}
    m = len(groups)
    size = np.zeros(m, dtype=np.int64)
    scratch = np.zeros(m, dtype=np.int64)
    cost = np.zeros(m, dtype=np.float64)
    pinned = np.zeros(m, dtype=bool)
    recomputable = np.ones(m, dtype=bool)
    preds: list[set[int]] = [set() for _ in range(m)]
    buffers: list[list[int]] = [[] for _ in range(m)]
    dangling = 0
    kept = np.zeros(m, dtype=np.int64)  # bytes of graph outputs: what a pinned node keeps
    unread = np.zeros(m, dtype=np.int64)  # bytes of outputs nobody reads (ORT holds them to the end)
    handed_over = {t for ts in taken for n in ts for t in graph.nodes[n].outputs}
    for b, root in enumerate(lv.buffer_root):
        if int(root) in handed_over:  # the in-place member's output is this buffer
            continue
        j = int(group_of[graph.tensors[int(root)].producer])
        if b in pinned_buffers:
            pinned[j] = True
            kept[j] += int(lv.buffer_size[b])
        if b not in read_buffers and b not in pinned_buffers:
            dangling += int(lv.buffer_size[b])
            unread[j] += int(lv.buffer_size[b])
            continue
        size[j] += int(lv.buffer_size[b])
        buffers[j].append(int(root))
    owner = {int(lv.buffer_of[r]): j for j, bs in enumerate(buffers) for r in bs}  # buffer -> its node
    step_of = {nid: s for s, nid in enumerate(lv.order)}
    for j, members in enumerate(groups):
        for nid in members:
            node = graph.nodes[nid]
            cost[j] += float(node_time(graph, node))
            scratch[j] = max(scratch[j], int(lv.scratch[step_of[nid]]))
            if node.op_type in RANDOM_OPS or _updates_running_statistics(node):
                recomputable[j] = False
            for t in node.inputs:
                if t != NO_TENSOR and graph.tensors[t].kind is TensorKind.ACTIVATION:
                    # a view that is a node of its own (its shape computed: a planned file's ordering
                    # edge) shares its source's buffer, which ORT holds for the view's readers: they
                    # read that node too (replanning fuzz_e2e --ops multi seed 401's file, a TopK's
                    # values read so, was refused as parts read by a node not reading it)
                    for p in (int(group_of[graph.tensors[t].producer]), owner.get(int(lv.buffer_of[t]), j)):
                        if p != j:
                            preds[j].add(p)
    # ORT holds an output nobody reads to the end of the run, that of every run of its node: a
    # recompute would make another such copy (a Split recomputed for its read half held the other
    # half twice: the rewritten model overshot its budget, stop 48's fuzzing)
    recomputable &= unread == 0
    # per group, the least bytes of its buffers any reader in another group reads
    read = size.copy()
    buffer_readers: dict[int, set[int]] = {}  # buffer -> the groups reading it (not its own)
    for node in graph.nodes:
        c = int(group_of[node.id])
        by_group: dict[int, set[int]] = {}
        for t in node.inputs:
            if t == NO_TENSOR or graph.tensors[t].kind is not TensorKind.ACTIVATION:
                continue
            b = int(lv.buffer_of[t])
            j = owner.get(b, -1)
            if j not in (c, -1):
                by_group.setdefault(j, set()).add(b)
                buffer_readers.setdefault(b, set()).add(c)
        for j, bs in by_group.items():
            read[j] = min(read[j], sum(int(lv.buffer_size[b]) for b in bs))
    in_place = np.zeros(m, dtype=np.int64)
    for j, members in enumerate(groups):
        node = graph.nodes[members[0]]
        src = ort_rule.in_place_source(node)  # the floor allows for every in-place run ORT may make
        out = node.outputs[0] if node.outputs else NO_TENSOR
        if src == NO_TENSOR or out == NO_TENSOR or out in outputs or graph.tensors[src].kind is not TensorKind.ACTIVATION:
            continue
        if graph.tensors[src].nbytes == graph.tensors[out].nbytes and int(lv.buffer_of[out]) >= 0 \
                and int(lv.buffer_of[out]) in read_buffers:
            in_place[j] = min(int(size[j]), lv.tensor_bytes(out))
    two_step = np.zeros(m, dtype=bool)
    for j, members in enumerate(groups):
        if taken[j]:
            # one op, then the ops writing in place into its output one after the other
            # (_in_place_group): ORT holds the first op's inputs, then the second's, ..., each
            # with the one buffer
            ops = [graph.nodes[n] for n in members]
            ins = [sorted({int(group_of[graph.tensors[t].producer]) for t in n.inputs if t != NO_TENSOR
                           and graph.tensors[t].kind is TensorKind.ACTIVATION} - {j}) for n in ops]
            held = [sum(int(read[p]) for p in ps if not pinned[p]) for ps in ins]
            union = sum(int(read[p]) for p in preds[j] if not pinned[p])
            s_ops = [int(lv.scratch[step_of[n.id]]) for n in ops]
            in_place[j] = union + int(scratch[j]) - max(held[0] + s_ops[0] - int(in_place[j]),
                                                         max(h + sk for h, sk in zip(held[1:], s_ops[1:])))
            # where one of the two ops holds all the inputs and scratch the node counts (a Relu on
            # a MatMul's output), the node's step is the runtime's: nothing to leave out (flagged, a
            # float16 MLP's least was never searched exactly: no plan, no proof, at 97%)
            two_step[j] = in_place[j] > 0
    takes_over = _takes_over(graph, lv, groups, group_of, buffers, taken, preds, size, pinned, ort_rule)
    names = [graph.nodes[g[0]].name for g in groups]
    # each buffer of a node with its own readers: ORT frees it after its own last reader (a MaxPool's Y
    # held until its Indices' last read, the problem's unplanned zoo:cnn peaked 2.1% over the model's)
    parts = [[(int(lv.buffer_size[lv.buffer_of[r]]), sorted(buffer_readers.get(int(lv.buffer_of[r]), ())))
              for r in bs] if len(bs) > 1 else [] for bs in buffers]
    # Bytes that stay to the end from the step that makes them: a pinned node's graph outputs, where
    # its other buffers die (a loss node's log-probabilities), and outputs nobody reads (a gradient
    # op's unused one). Pinned as one with the node, or counted in the base from the start, they over-stated the peak (gpt2: +3.7%; a
    # spatial transformer: +15.6%, a 64 KiB unread output of its backward). Such a node gets a
    # companion right after it: pinned, those bytes, cost 0, reading only the node and making no
    # ONNX node; a node that held graph outputs is then freed after its last read and may be
    # recomputed (the rewrite binds graph outputs to the first computation), never swapped.
    # Unread outputs under 0.1% of the peak stay in the base, except where they are all the node
    # makes (a sink's 1-element Slice, passes/rewrite.py): that node holds them itself, pinned,
    # from its step on, as ORT does (in the base from the start, zoo:cnn?batch=1 --forward's four
    # sinks put the problem's unplanned peak 256 bytes over the model's own, at its first Conv)
    small = unread < max(1, lv.peak_bytes // 1000)
    alone = (unread > 0) & small & (size == 0) & ~pinned
    size[alone] = kept[alone] = read[alone] = unread[alone]
    pinned[alone] = True
    dangling -= int(unread[alone].sum())
    unread[alone] = 0
    moved = np.where(small, 0, unread)
    # ORT allocates them with the node's other outputs, while its inputs are still held: counted
    # in its step as scratch too (the companion right after it comes when an input that dies there
    # is gone; a Split's unread half was 17% of a fuzzed model's peak, left out of its step)
    scratch = scratch + moved
    unpin = pinned & (kept < size)
    split = np.flatnonzero(unpin | (moved > 0)).tolist()
    dangling -= int(moved.sum())
    at = np.arange(m) + np.searchsorted(np.asarray(split, dtype=np.int64), np.arange(m), side="left")
    comp = at[split] + 1  # where each companion goes: right after its node
    swappable = np.ones(m + len(split), dtype=bool)
    companion = np.zeros(m + len(split), dtype=bool)
    companion[comp] = True
    swappable[at[alone]] = False  # ORT holds an unread output to the end, wherever a copy of it goes
    if split:
        def widen(a, fill):
            out = np.empty(m + len(split), dtype=np.asarray(a).dtype)
            out[at] = a
            out[comp] = fill
            return out
        outputs_kept = np.where(unpin, kept, 0)[split]
        size, scratch, cost = widen(size, 0), widen(scratch, 0), widen(cost, 0.0)
        recomputable, in_place, read = widen(recomputable, False), widen(in_place, 0), widen(read, 0)
        two_step, kept = widen(two_step, False), widen(kept, 0)
        size[comp] = read[comp] = kept[comp] = outputs_kept + moved[split]
        # the graph outputs a companion keeps lie in its node's buffers: the floor counts them once
        in_place[comp] = outputs_kept
        takes_over = widen(np.where(takes_over >= 0, at[np.maximum(takes_over, 0)], -1), -1)
        pinned = widen(pinned, True)
        pinned[at[unpin]] = swappable[at[unpin]] = False
        wide_preds: list[set[int]] = [set() for _ in range(m + len(split))]
        for j, ps in enumerate(preds):
            wide_preds[at[j]] = {int(at[u]) for u in ps}
        for j, c in zip(split, comp.tolist()):
            wide_preds[c] = {int(at[j])}
        preds = wide_preds
        wide_parts: list[list] = [[] for _ in range(m + len(split))]
        for j, node_parts in enumerate(parts):
            wide_parts[at[j]] = [(nbytes, [int(at[r]) for r in rs]) for nbytes, rs in node_parts]
        parts = wide_parts
        for j in reversed(split):
            names.insert(j + 1, f"{names[j]} ({'graph' if unpin[j] else 'unread'} outputs)")
            for grouped in (groups, buffers, views, taken):
                grouped.insert(j + 1, [])
    transfer = None
    if transfer_time is not None:
        transfer = [float(transfer_time(int(s))) for s in size]
    problem = PlanningProblem.build(
        size=size,
        cost=cost,
        preds=[sorted(p) for p in preds],
        name=graph.name,
        names=names,
        # the run-long copies of initializers that are graph outputs (MemoryModel.output_copy_bytes)
        base_bytes=graph.base_bytes + dangling + lv.output_copy_bytes,
        scratch=scratch,
        pinned=pinned,
        recomputable=recomputable,
        swappable=swappable,
        transfer=transfer,
        copy_overlap=copy_overlap,
        time_unit=time_unit,
        in_place=in_place,
        late_base_bytes=dangling,
        kept_bytes=np.where(pinned, kept, size),
        read_bytes=read,
        two_step=two_step,
        takes_over=takes_over,
        companion=companion,
        parts=[ps if not p else [] for ps, p in zip(parts, pinned)],
    )
    lowering = Lowering(graph, tuple(map(tuple, groups)), tuple(map(tuple, buffers)), tuple(map(tuple, views)),
                        dangling, tuple(map(tuple, taken)))
    return problem, lowering


def _updates_running_statistics(node: Node) -> bool:
    """A training BatchNormalization with its running mean or variance outputs: ORT's CPU kernel
    writes them into the buffers of the running statistics it reads, initializers included, so each
    run of the node moves them on and a recompute reads statistics the first run already moved
    (fuzz_e2e --ops multi seed 407 --forward: a recomputed BatchNormalization, its running mean
    read, and the outputs differed from the model's by 0.0105 from the session's second run on)."""
    return node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx") \
        and any(t != NO_TENSOR for t in node.outputs[1:3])


def names_of(graph: Graph, ids: Sequence[int]) -> list[str]:
    return [graph.nodes[i].name for i in ids]


def group_table(lowering: Lowering) -> Mapping[str, Sequence[str]]:
    """Problem node name -> the Graph nodes it stands for (for --explain)."""
    g = lowering.graph
    return {g.nodes[grp[0]].name: names_of(g, grp) for grp in lowering.groups}


def _in_place_group(graph: Graph, node: Node, groups: list[list[int]], views: list[list[int]],
                    group_of: np.ndarray, ort_rule: MemoryModel) -> int:
    """The group ``node`` joins as its in-place member, or -1.

    ORT writes an in-place op's output into its input's buffer when that input dies there
    (liveness.py). When the input's producer ran just before ``node``, makes nothing else and
    nobody else reads the input, that happens in every plan: the two run, are freed, recomputed
    and swapped together, as one buffer (``node``'s output; the producer's is handed over).
    Counting both, zoo:cnn's max-pool backward (a 2 MiB zeros tensor scattered into) needed 74%
    of the peak where ORT needs 65%, and at 70% memplan found no plan (now +5.0%, at 64.6%).
    The producer may itself be such a member (a chain Concat -> Softmax -> Softmax -> Relu): ORT
    keeps the whole chain in one buffer, and so does the group (cut into pairs, each pair counted
    a buffer of its own, the chain's problem peaked 16 KiB, 49%, over the model's own)."""
    t = ort_rule.in_place_source(node)
    if t == NO_TENSOR or not node.outputs or node.outputs[0] == NO_TENSOR or node.outputs[0] in graph.output_set:
        return -1
    x, y = graph.tensors[t], graph.tensors[node.outputs[0]]
    u = x.producer
    if x.kind is not TensorKind.ACTIVATION or u < 0 or u != node.id - 1 or t in graph.output_set:
        return -1
    j = int(group_of[u])
    # u alone, or the last of a chain of in-place members (a group with views is not one buffer)
    if groups[j][-1] != u or views[j] or [o for o in graph.nodes[u].outputs if o != NO_TENSOR] != [t]:
        return -1
    if set(graph.consumers[t]) != {node.id} or sum(1 for i in node.inputs if i == t) != 1:
        return -1
    if x.shape != y.shape or DTYPE_BITS[x.dtype] != DTYPE_BITS[y.dtype]:
        return -1
    return j


def _takes_over(graph: Graph, lv, groups: list[list[int]], group_of: np.ndarray, buffers: list[list[int]],
                taken: list[list[int]], preds: list[set[int]], size: np.ndarray, pinned: np.ndarray,
                ort_rule: MemoryModel) -> np.ndarray:
    """Per group, the group whose buffer its in-place op takes over when it reads it last
    (``PlanningProblem.takes_over``), or -1.

    ORT writes the op's output into its input's buffer wherever that read is the buffer's last
    (liveness.py). Counted where that holds for the copy the op reads, whichever plan: the op
    heads its group, whose one buffer is its output or that of the in-place chain it heads (the
    chain's later ops hold less than the group counts, ``two_step``); the input's group is one
    buffer of the same bytes, not a graph output, and the op alone reads it (once), so a copy of
    it dies at the op unless a later compute of the op reads it too; shapes and element sizes
    match."""
    m = len(groups)
    out = np.full(m, -1, dtype=np.int64)
    readers: list[set[int]] = [set() for _ in range(m)]
    for j, ps in enumerate(preds):
        for u in ps:
            readers[u].add(j)
    held: dict[int, list[int]] = {}  # buffer -> its tensors
    for u, b in enumerate(lv.buffer_of.tolist()):
        held.setdefault(b, []).append(u)
    for w, members in enumerate(groups):
        node = graph.nodes[members[0]]
        t = ort_rule.in_place_source(node)
        if t == NO_TENSOR or pinned[w] or not node.outputs or node.outputs[0] == NO_TENSOR:
            continue
        x, y = graph.tensors[t], graph.tensors[node.outputs[0]]
        # the group's one buffer: the op's output, or the last output of the in-place chain it heads
        last = graph.nodes[members[-1]].outputs[0] if taken[w] else node.outputs[0]
        if x.kind is not TensorKind.ACTIVATION or x.producer < 0 or buffers[w] != [last]:
            continue
        v = int(group_of[x.producer])
        if v == w or pinned[v] or len(buffers[v]) != 1 or readers[v] != {w} or size[v] != size[w]:
            continue
        b = int(lv.buffer_of[t])
        if b < 0 or b != int(lv.buffer_of[buffers[v][0]]) or size[w] != lv.tensor_bytes(node.outputs[0]) \
                or size[v] != lv.tensor_bytes(t):
            continue
        # the op is the buffer's only reader, and reads it once
        if any(set(graph.consumers[u]) - {node.id} for u in held[b]):
            continue
        if sum(1 for u in node.inputs if u != NO_TENSOR and int(lv.buffer_of[u]) == b) != 1:
            continue
        if x.shape != y.shape or DTYPE_BITS[x.dtype] != DTYPE_BITS[y.dtype] or node.outputs[0] in graph.output_set:
            continue
        out[w] = v
    return out
