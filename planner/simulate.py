"""Replay a Plan's event list with its own memory accounting; no solver involved.

Memory is accounted in list order (the order a runtime issues allocations and frees):
  * ``compute i`` needs every input of i resident, i's output not already resident, and i not
    computed before unless it is recomputable; while it
    runs, memory = resident + size[i] + scratch[i] (+ base); afterwards i's output is resident.
    Where i takes over the buffer of its input u (``PlanningProblem.takes_over``) and the frees
    right after it free u, that copy of u is read last here and the runtime writes i into it:
    size[u] is not counted from i's compute on, and u's free releases nothing (the runtime
    releases a node's dead inputs together after it, so where among those frees u's stands
    does not matter);
  * ``free i`` releases a resident output; ``swap_out i`` releases it and leaves a host copy;
  * ``swap_in i`` needs a host copy and re-allocates size[i];
  * where i's output is buffers that die apart (``PlanningProblem.parts``), each is released
    right after the last compute that reads it before i's free (right after i's compute or
    swap-in where none does), as the runtime frees each output after its own last reader; the
    free releases what is left. A swap-out moves them all: they stay until it.
At the end every graph output (pinned) is resident and nothing else is (no leaks).

Time is derived as soon-as-possible from the same order: computes run one at a time in list
order; each transfer takes ``transfer[i]``; with ``copy_overlap`` swap-outs and swap-ins each have
their own stream, otherwise transfers share the compute stream. A swap-out copies the resident
copy: it starts once that copy is there (its compute or its swap-in ended) and its stream is
free. An event may not happen before the one listed before it (memory order is real-time order),
so a compute waits for a swap-out listed before it to finish (the memory it needs is not free
yet) and for its swapped-in inputs. Without ``copy_overlap`` every event runs in list order on one
stream, as ONNX Runtime runs a written model's copies (planner.devices.COPIES_OVERLAP_COMPUTE; ONNX
models are planned so). With it (JSON graphs' ``--swap-bandwidth``: a runtime with copy streams) a
swap-out's copy starts as soon as its buffer is there, wherever the swap-out is listed: a runtime
that starts each copy where it is listed may take longer.
``added_time`` = makespan - sum of every node's cost once.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from planner.errors import GraphError
from planner.plan import OPS, Plan
from planner.problem import PlanningProblem


class InvalidPlanError(GraphError):
    """A plan breaks the memory model (or its budget); for a plan memplan made this is a bug."""


@dataclass(frozen=True)
class Simulation:
    peak_bytes: int  # most bytes resident at any event (base, scratch included)
    peak_event: int  # index of the event where the peak happens
    memory: np.ndarray  # bytes resident during each event (a compute counts its output + scratch)
    makespan: float
    added_time: float  # makespan - problem.total_cost
    recomputes: int  # computes beyond each node's first
    swap_ins: int
    compute_counts: np.ndarray  # per node


def simulate(problem: PlanningProblem, plan: Plan, budget: int | None = None) -> Simulation:
    """Check ``plan`` against the memory model and ``budget``; raise InvalidPlanError if it breaks them."""
    fast = _computes_and_frees(problem, plan, budget)
    if fast is not None:
        return fast
    n = problem.n
    size, scratch, cost = problem.size, problem.scratch, problem.cost
    transfer = problem.transfer
    resident = np.zeros(n, dtype=bool)
    host = np.zeros(n, dtype=bool)
    counts = np.zeros(n, dtype=np.int64)
    ready = np.zeros(n)  # when the resident copy can be read
    host_ready = np.zeros(n)
    read_end = np.zeros(n)  # latest end of a compute reading the resident copy
    mem = problem.base_bytes
    memory = np.zeros(len(plan.events), dtype=np.int64)
    peak, peak_at = mem, -1
    t_prev = 0.0  # memory-order time of the previous event
    compute_free = out_free = in_free = 0.0
    makespan = 0.0
    swap_ins = 0
    over = problem.takes_over
    released, early = ({}, {}) if problem.parts is None else \
        part_releases(problem, [e.op for e in plan.events], [e.node for e in plan.events])
    handed: dict[int, int] = {}  # free event of a taken-over input -> bytes its taker holds

    def fail(k: int, msg: str) -> InvalidPlanError:
        return InvalidPlanError(f"plan {plan.strategy!r}, event {k}: {msg}")

    for k, ev in enumerate(plan.events):
        op, v = ev.op, ev.node
        if op not in OPS or not 0 <= v < n:
            raise fail(k, f"bad event {op!r} on node {v}; ops are {', '.join(OPS)} on nodes 0..{n - 1}")
        label = f"node {problem.node_ids[v]} ({problem.names[v]})"
        if op == "compute":
            if resident[v]:
                raise fail(k, f"computes {label} while its output is still resident")
            if counts[v] and not problem.recomputable[v]:
                raise fail(k, f"computes {label} again, which may not be recomputed (a random op, or a graph "
                              f"output)")
            preds = problem.preds(v)
            missing = [int(u) for u in preds if not resident[u]]
            if missing:
                u = missing[0]
                raise fail(k, f"computes {label} but its input node {problem.node_ids[u]} is not resident")
            start = max([t_prev, compute_free] + [ready[u] for u in preds])
            end = start + cost[v]
            compute_free = end
            if not problem.copy_overlap:
                out_free = in_free = end
            for u in preds:
                read_end[u] = max(read_end[u], end)
            mem += int(size[v])
            if over is not None and over[v] >= 0:
                j = _free_after(plan.events, k, int(over[v]))
                if j is not None:  # u's buffer becomes v's here: its free releases nothing
                    handed[j] = int(size[over[v]]) - early.get(j, 0)
                    mem -= handed[j]
            during = mem + int(scratch[v])
            resident[v] = True
            counts[v] += 1
            ready[v] = read_end[v] = end
            t_now, memory[k] = start, during
            makespan = max(makespan, end)
        elif op == "free":
            if not resident[v]:
                raise fail(k, f"frees {label}, which is not resident (double free?)")
            if problem.pinned[v]:
                raise fail(k, f"frees {label}, a graph output that must stay to the end")
            resident[v] = False
            mem -= int(size[v]) - early.get(k, 0) - handed.pop(k, 0)  # less its parts released before
            t_now = max(t_prev, read_end[v])
            memory[k] = mem
        else:
            if transfer is None or not problem.swappable[v]:
                raise fail(k, f"{op} of {label}, which cannot be swapped (no host link, or pinned)")
            dur = float(transfer[v])
            if op == "swap_out":
                if not resident[v]:
                    raise fail(k, f"swaps out {label}, which is not resident")
                # the copy reads the resident copy: from when its compute or its swap-in ended
                start = max(ready[v], out_free if problem.copy_overlap else compute_free)
                end = start + dur
                if problem.copy_overlap:
                    out_free = end
                else:
                    compute_free = out_free = in_free = end
                resident[v] = False
                host[v] = True
                host_ready[v] = end
                mem -= int(size[v])
                t_now = max(t_prev, end, read_end[v])
                memory[k] = mem
            else:
                if resident[v]:
                    raise fail(k, f"swaps in {label} while it is still resident")
                if not host[v]:
                    raise fail(k, f"swaps in {label}, which has no host copy (no swap_out before)")
                start = max(t_prev, host_ready[v], in_free if problem.copy_overlap else compute_free)
                end = start + dur
                if problem.copy_overlap:
                    in_free = end
                else:
                    compute_free = out_free = in_free = end
                resident[v] = True
                ready[v] = read_end[v] = end
                mem += int(size[v])
                swap_ins += 1
                t_now, memory[k] = start, mem
            makespan = max(makespan, end)
        t_prev = t_now
        makespan = max(makespan, t_now)
        if memory[k] > peak:
            peak, peak_at = int(memory[k]), k
        if budget is not None and memory[k] > budget:
            raise fail(k, f"{op} {label} needs {int(memory[k])} bytes, over the budget of {budget}")
        mem -= released.get(k, 0)  # parts read last here

    never = np.nonzero(counts == 0)[0]
    if len(never):
        v = int(never[0])
        raise InvalidPlanError(f"plan {plan.strategy!r} never computes node {problem.node_ids[v]} ({problem.names[v]})")
    lost = np.nonzero(problem.pinned & ~resident)[0]
    if len(lost):
        v = int(lost[0])
        raise InvalidPlanError(f"plan {plan.strategy!r} does not keep graph output node {problem.node_ids[v]} to the end")
    leaked = np.nonzero(resident & ~problem.pinned)[0]
    if len(leaked):
        v = int(leaked[0])
        raise InvalidPlanError(f"plan {plan.strategy!r} never frees node {problem.node_ids[v]} ({problem.names[v]})")
    return _simulation(problem, peak, peak_at, memory, float(makespan), swap_ins, counts)


def _simulation(problem: PlanningProblem, peak: int, peak_at: int, memory: np.ndarray, makespan: float,
                swap_ins: int, counts: np.ndarray) -> Simulation:
    """The Simulation of a valid plan (:func:`simulate`'s walk or its array path)."""
    added = float(makespan - problem.total_cost)
    # summed in event order vs all at once: rounding (recomputes of free nodes, such as a weight's
    # ConstantOfShape, left 5e-18 s of 2.9e-3 s on onnx's opset-9 ResNet-50)
    if -1e-9 * problem.total_cost <= added <= 1e-12 * problem.total_cost:
        added = 0.0
    return Simulation(peak_bytes=int(peak), peak_event=peak_at, memory=memory, makespan=makespan, added_time=added,
                      recomputes=int((counts - 1).sum()), swap_ins=swap_ins, compute_counts=counts)


def part_releases(problem: PlanningProblem, ops: list[str], nodes: list[int],
                  at: list[int] | None = None) -> tuple[dict[int, int], dict[int, int]]:
    """Where a plan's events (``ops``, ``nodes``) release ``problem.parts`` early: (event -> bytes
    released right after it, free event -> bytes of its node released before it). ``at``: the
    events to look at, in order (the others neither read nor make a node with parts); all by
    default. Each resident copy of a node with parts, from its compute or swap-in to its free,
    releases a part after the last compute in between that reads it (after its own compute or
    swap-in where none does); a copy that is swapped out holds every part until then. Events that
    break the plan are skipped (simulate() says where)."""
    released: dict[int, int] = {}
    early: dict[int, int] = {}
    for j, k, v, i in part_spans(problem, ops, nodes, at):
        nbytes = problem.parts[v][i][0]
        released[j] = released.get(j, 0) + nbytes
        early[k] = early.get(k, 0) + nbytes
    return released, early


def part_spans(problem: PlanningProblem, ops: list[str], nodes: list[int],
               at: list[int] | None = None) -> Iterator[tuple[int, int, int, int]]:
    """Per part released early (:func:`part_releases`): (the event it is released right after,
    the free event of its copy, its node, the part's index in ``problem.parts[node]``)."""
    parts, inputs = problem.parts, problem.part_inputs
    if parts is None:
        return
    last: dict[int, list[int]] = {}  # resident node with parts -> per part, the event reading it last
    for k in range(len(ops)) if at is None else at:
        op, v = ops[k], nodes[k]
        if not 0 <= v < problem.n:
            continue
        if op == "compute":
            for u, ks in inputs.get(v, ()):
                if u in last:
                    for j in ks:
                        last[u][j] = k
        if op in ("compute", "swap_in") and parts[v]:
            last[v] = [k] * len(parts[v])
        elif op == "free" and v in last:
            for i, j in enumerate(last.pop(v)):
                yield j, k, v, i
        elif op == "swap_out":
            last.pop(v, None)


def _free_after(events, k: int, u: int) -> int | None:
    """The event among the frees right after event ``k`` (before any other event) that frees
    ``u``, or None."""
    for j in range(k + 1, len(events)):
        e = events[j]
        if e.op != "free":
            return None
        if e.node == u:
            return j
    return None


def _computes_and_frees(problem: PlanningProblem, plan: Plan, budget: int | None) -> Simulation | None:
    """:func:`simulate` of a plan of computes and frees only, with array operations instead of a
    walk of its events (Chen's plan of the lstm fixture at batch=8, seq=128 has 650k events: the
    walk took 2.5 s): the same Simulation where the plan is valid; None where it is not, or has
    other events, or its times cannot be summed in one go (negative costs, not float64), for
    the walk to say where it breaks."""
    n, m = problem.n, len(plan.events)
    cost = problem.cost
    if m == 0 or cost.dtype != np.float64 or not bool(np.all(cost >= 0)):
        return None
    ops = list(map(attrgetter("op"), plan.events))
    if not set(ops) <= {"compute", "free"}:
        return None
    node = np.array(list(map(attrgetter("node"), plan.events)))
    if node.ndim != 1 or node.dtype.kind not in "iu" or node.min() < 0 or node.max() >= n:
        return None
    node = node.astype(np.int64)
    comp = np.array([op == "compute" for op in ops], dtype=bool)
    idx = np.arange(m, dtype=np.int64)
    # each node's events in list order: compute, free, compute, ... (never computed while
    # resident, never freed while not)
    order = np.argsort(node, kind="stable")
    s_node, s_comp = node[order], comp[order]
    first = np.searchsorted(s_node, np.arange(n))
    rank = idx - first[s_node]
    if not np.array_equal(s_comp, rank % 2 == 0):
        return None
    counts = np.bincount(node[comp], minlength=n).astype(np.int64)
    if (counts == 0).any() or ((counts > 1) & ~problem.recomputable).any():
        return None
    if (~comp & problem.pinned[node]).any():
        return None
    events_of = np.bincount(node, minlength=n)
    resident = events_of % 2 == 1  # the last event is a compute
    if (problem.pinned != resident).any():  # a graph output lost, or a buffer leaked
        return None
    # every input of a compute resident: its input's last event before it is a compute
    key = s_node * m + order  # ascending
    c_at = idx[comp]
    c_node = node[comp]
    ptr, pidx = problem.pred_ptr, problem.pred_idx
    deg = (ptr[c_node + 1] - ptr[c_node]).astype(np.int64)
    total = int(deg.sum())
    if total:
        reads_at = np.repeat(c_at, deg)
        offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(deg) - deg, deg)
        read = pidx[np.repeat(ptr[c_node], deg) + offsets].astype(np.int64)
        last = np.searchsorted(key, read * m + reads_at) - 1
        if (last < 0).any():
            return None
        if not (s_comp[last] & (s_node[last] == read)).all():
            return None
    size = problem.size.astype(np.int64)
    delta = np.where(comp, size[node], -size[node])
    after = problem.base_bytes + np.cumsum(delta)
    memory = after.copy()
    memory[c_at] += problem.scratch.astype(np.int64)[c_node]
    shift = np.zeros(m + 1, dtype=np.int64)  # what each event adds to those from it on
    early: dict[int, int] = {}
    if problem.parts is not None:
        # each part released after its last reader: less from the next event on, up to its free
        holders = np.flatnonzero([bool(x) for x in problem.parts])
        readers = np.fromiter(problem.part_inputs, dtype=np.int64)
        look = np.flatnonzero(np.isin(node, holders) | (comp & np.isin(node, readers))).tolist()
        released, early = part_releases(problem, ops, node.tolist(), look)
        for k, nbytes in released.items():
            shift[k + 1] -= nbytes
        for k, nbytes in early.items():
            shift[k] += nbytes
    over = problem.takes_over
    if over is not None:
        taken = over[c_node] >= 0
        k, u = c_at[taken], over[c_node[taken]].astype(np.int64)
        if len(k):
            # freed among the frees right after the compute: u's next event is a free before
            # the next compute; u's bytes are the taker's from the compute to that free
            nxt_compute = np.append(c_at, m)[np.searchsorted(c_at, k, side="right")]
            nxt = np.searchsorted(key, u * m + k, side="right")
            ok = nxt < m
            nxt_c = np.minimum(nxt, m - 1)
            freed = ok & (s_node[nxt_c] == u) & ~s_comp[nxt_c] & (order[nxt_c] < nxt_compute)
            at, handed = order[nxt_c[freed]], size[u[freed]]
            if early:
                handed = handed - np.array([early.get(j, 0) for j in at.tolist()], dtype=np.int64)
            np.subtract.at(shift, k[freed], handed)
            np.add.at(shift, at, handed)
    memory += np.cumsum(shift[:m])
    if budget is not None and (memory > budget).any():
        return None
    peak, peak_at = problem.base_bytes, -1
    top = int(np.argmax(memory))
    if memory[top] > peak:
        peak, peak_at = int(memory[top]), top
    # computes run back to back in list order: each starts when the one before ends
    return _simulation(problem, peak, peak_at, memory, float(np.cumsum(cost[c_node])[-1]), 0, counts)
