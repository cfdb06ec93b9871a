"""Plans in and out of the CP-SAT model: a baseline plan as a complete hint, and a solution as
an event schedule. Kept apart from the model so each reads in one sitting."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from planner.alloc import most_live
from planner.plan import Event, Plan

if TYPE_CHECKING:  # pragma: no cover
    from ortools.sat.python import cp_model

    from planner.cpsat import RematModel

ORIGINAL, RECOMPUTE, SWAP_IN = 0, 1, 2


def recomputes_per_step(plan: Plan, n: int) -> np.ndarray:
    """How many recompute events a plan runs before each node's first computation."""
    out = np.zeros(n, dtype=int)
    seen = np.zeros(n, dtype=bool)
    pending = 0
    for ev in plan.events:
        if ev.op != "compute":
            continue
        if seen[ev.node]:
            pending += 1
        else:
            seen[ev.node] = True
            out[ev.node] = pending
            pending = 0
    return out


def swaps_fit(plan: Plan, n: int, swap_ins: int) -> bool:
    """Does ``plan`` swap each node out at most once and back in at most ``swap_ins`` times (the
    model's swap-out of the original and its swap-in instances, ``PlannerOptions.max_swap_ins``)?"""
    counts = plan.counts(n)
    return max(counts["swap_out"], default=0) <= 1 and max(counts["swap_in"], default=0) <= swap_ins


def hint_values(model: "RematModel", plan: Plan) -> dict[int, int] | None:
    """Values of every model variable that reproduce ``plan``.

    The k-th compute of a node is its instance k. On slots (recompute-only plans), an original
    sits at its slot and the recomputes before it take the free slots of its step, one each (so
    the model counts what the simulator counts, ``parts`` aside). On ticks, a recompute-only plan
    runs its computes back to back; in a plan with swaps every event happens when the
    simulator's replay has it happen (:func:`_tick_times`), a swap-out copies the original and
    its k-th swap-in is the node's k-th swap-in instance. A buffer's retention ends where the plan
    frees it, or where the compute taking it over starts, if one does (the model counts the two
    once there; ending at its end, the hint needed more than the model's no-remat capacity). The
    capacity is what the hint's intervals need (:func:`_capacity_needed`). None when the plan
    needs more instances or slots than the model has, swaps on slots, swaps out a copy other
    than the original, swaps a node in more often than the model has swap-in instances of it,
    swaps in a copy nobody reads (the model holds no swap-in nobody reads), or needs more than
    the capacity's domain (a plan fitting the budget only with its ``parts`` dying apart).
    """
    p = model.p
    plan = plan.without_unread(p)  # the model holds no recompute nobody reads
    swaps = any(ev.op in ("swap_out", "swap_in") for ev in plan.events)
    times = _tick_times(model, plan) if model.timed and swaps else None
    values: dict[int, int] = {}
    seen = [0] * p.n
    current = [-1] * p.n  # instance of each node resident now
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    chosen: dict[tuple[int, int], int] = {}
    swapped: dict[int, int] = {}  # node -> start of its swap-out
    t = 0  # next free slot
    last_end = 0
    done = 0  # originals computed so far: the next one is node ``done`` (fixed order)
    taker = -1  # the compute just before this run of frees, where it takes a buffer over
    for k, ev in enumerate(plan.events):
        v = ev.node
        if ev.op == "free":
            over = taker >= 0 and model.takes_over[model.inst[taker].node] == v
            ends[current[v]] = starts[taker] if over else (times[k][1] if times is not None else last_end)
            current[v] = -1
            continue
        taker = -1
        if ev.op == "swap_out":
            j0 = model.of_node[v][0]
            if times is None or v not in model.swap_out or current[v] != j0 or v in swapped:
                return None
            swapped[v] = times[k][0]
            ends[j0] = times[k][1]
            current[v] = -1
            continue
        if ev.op == "swap_in":
            if times is None or v not in swapped:
                return None
            idxs = model.swap_out[v][2]
            back = sum(1 for i in idxs if i in starts)
            if back >= len(idxs):
                return None  # more swap-ins than the model's instances of this node
            j = idxs[back]
            starts[j] = times[k][0]
            current[v] = j
            continue
        k_inst = seen[v]
        seen[v] += 1
        if k_inst >= len(model.of_node[v]) or \
                model.inst[model.of_node[v][k_inst]].kind != (ORIGINAL if k_inst == 0 else RECOMPUTE):
            return None
        j = model.of_node[v][k_inst]
        if k_inst == 0:
            done += 1
        if times is not None:
            starts[j] = times[k][0]
            last_end = max(last_end, times[k][0] + int(model.dur[v]))
        elif model.timed:
            starts[j] = t
            t += int(model.dur[v])
            last_end = t
        else:
            if k_inst == 0:
                t = int(model.pos[v])
            elif done >= p.n or t >= int(model.pos[done]):
                return None  # no free slot left before the next original
            starts[j] = t
            t += int(model.dur[v])
            last_end = t
        for u in p.pred_lists[v]:
            chosen[(j, u)] = current[u]
        current[v] = j
        taker = j
    for j, x in enumerate(model.inst):
        if j in starts:
            values[x.start.Index()] = starts[j]
            values[x.end.Index()] = model.horizon if p.pinned[x.node] else ends.get(j, model.horizon)
        elif x.kind != ORIGINAL:
            lo = model.lower(x.start)
            values[x.start.Index()] = lo
            values[x.end.Index()] = max(lo + x.dur, model.lower(x.end))
        if not isinstance(x.present, int):
            values[x.present.Index()] = int(j in starts)
    read = set(chosen.values())
    for v, (lit, so, idxs) in model.swap_out.items():
        if any(j in starts and j not in read for j in idxs):
            return None
        if (v in swapped) != (idxs[0] in starts):
            return None  # a host copy never read back, or read back without a swap-out
        values[lit.Index()] = int(v in swapped)
        values[so.Index()] = swapped.get(v, model.lower(so))
    for c, v, j, lit in model.reads:
        if not isinstance(lit, int):
            values[lit.Index()] = int(c in starts and chosen.get((c, v)) == j)
    _hint_part_ends(model, values, starts, chosen)
    for length, end, x in model.lengths:
        values[length.Index()] = values[end.Index()] - values[x.start.Index()]
    need = max(_capacity_needed(model, values, starts), model.lower(model.cap))
    if need > model.upper(model.cap):
        return None
    if model.budget is None:
        values[model.cap.Index()] = need
    if model.timed:
        values[model.makespan.Index()] = last_end
    return values


def _hint_part_ends(model: "RematModel", values: dict[int, int], starts: dict[int, int],
                    chosen: dict[tuple[int, int], int]) -> None:
    """Each part of a parted instance (the parts-aware model) ends where the last compute reading
    it from that copy ends, or its own compute where none does: where simulate() releases it."""
    if not model.part_end:
        return
    ends = {}
    for j, part_ends in model.part_end.items():
        s = values[model.inst[j].start.Index()]
        ends[j] = [s + model.inst[j].dur] * len(part_ends)
    inputs = model.p.part_inputs
    for (c, u), j in chosen.items():
        if j in ends:
            for k in dict(inputs.get(model.inst[c].node, ())).get(u, ()):
                ends[j][k] = max(ends[j][k], starts[c] + model.inst[c].dur)
    for j, part_ends in model.part_end.items():
        for e, value in zip(part_ends, ends[j]):
            values[e.Index()] = value


def _capacity_needed(model: "RematModel", values: dict[int, int], starts: dict[int, int]) -> int:
    """The least capacity that holds the hinted instances (``starts``: those present) in the
    model's own count: the peak of its cumulative over their retentions (size) and computes
    (scratch; a swap-in is a copy, it has none), in memory units. Not simulate()'s peak, which
    counts a node's ``parts`` dying apart where the model holds them as one buffer: hinted that,
    the capacity fell below what the hint's own intervals need (a random 7-node problem: 27
    units, its intervals 33), an infeasible hint."""
    lower, upper, size = [], [], []
    for j in starts:
        x = model.inst[j]
        s = values[x.start.Index()]
        scratch = 0 if x.kind == SWAP_IN else int(model.scratch[x.node])
        held = [(values[x.end.Index()], int(model.size[x.node]))] if j not in model.part_end else \
            [(values[e.Index()], b // model.mem_unit) for e, b in zip(model.part_end[j], model.parted[x.node])]
        for end, demand in held + [(s + x.dur, scratch)]:
            if demand and end > s:
                lower.append(s)
                upper.append(end)
                size.append(demand)
    return most_live(lower, upper, size)


def _tick_times(model: "RematModel", plan: Plan) -> list[tuple[int, int]]:
    """Per event, (start, when it happens in memory order) in ticks: :func:`simulate`'s timing
    with the model's integer durations. A compute or swap-in allocates at its start; a free or
    swap-out releases once its readers (and its copy) are done, and never before the event
    listed before it."""
    p = model.p
    dur, tr = model.dur, model.tr
    overlap = p.copy_overlap
    ready = [0] * p.n
    host_ready = [0] * p.n
    read_end = [0] * p.n
    t_prev = compute_free = out_free = in_free = 0
    out: list[tuple[int, int]] = []
    for ev in plan.events:
        v = ev.node
        if ev.op == "compute":
            start = max([t_prev, compute_free] + [ready[u] for u in p.pred_lists[v]])
            end = start + int(dur[v])
            compute_free = end
            if not overlap:
                out_free = in_free = end
            for u in p.pred_lists[v]:
                read_end[u] = max(read_end[u], end)
            ready[v] = read_end[v] = end
            t_now = start
        elif ev.op == "free":
            start = t_now = max(t_prev, read_end[v])
        elif ev.op == "swap_out":
            start = max(ready[v], out_free if overlap else compute_free)
            end = start + int(tr[v])
            if overlap:
                out_free = end
            else:
                compute_free = out_free = in_free = end
            host_ready[v] = end
            t_now = max(t_prev, end, read_end[v])
        else:
            start = max(t_prev, host_ready[v], in_free if overlap else compute_free)
            end = start + int(tr[v])
            if overlap:
                in_free = end
            else:
                compute_free = out_free = in_free = end
            ready[v] = read_end[v] = end
            t_now = start
        out.append((start, t_now))
        t_prev = t_now
    return out


def decode(model: "RematModel", solver: "cp_model.CpSolver", strategy: str) -> Plan:
    """A solution as events: keep only instances something reads (transitively), shrink each
    retention to its last read, merge overlapping residencies of one node (the later compute
    is dropped), then order allocations and releases by time, releases first at equal times.
    Every step only removes memory or time, so the plan replays within what the model counted
    (a swap-out may wait for an earlier copy to host, within its retention in the model).
    """
    p = model.p
    val = solver.Value
    inst = model.inst
    present = [True if isinstance(x.present, int) else bool(val(x.present)) for x in inst]
    reads_of: dict[int, list[int]] = {}
    for c, _v, j, lit in model.reads:
        if present[c] and (isinstance(lit, int) or val(lit)):
            reads_of.setdefault(c, []).append(j)
    users = [0] * len(inst)
    for js in reads_of.values():
        for j in js:
            users[j] += 1
    start = [val(x.start) for x in inst]
    for j in sorted(range(len(inst)), key=lambda j: (-start[j], j)):  # readers come later
        if present[j] and inst[j].kind != ORIGINAL and users[j] == 0:
            present[j] = False
            for i in reads_of.get(j, []):
                users[i] -= 1
    end: dict[int, float] = {j: (math.inf if p.pinned[x.node] else start[j] + x.dur)
                             for j, x in enumerate(inst) if present[j]}
    last_read: dict[int, tuple] = {}  # provider -> (end, reader's node, reader): its last read in event order
    for c, js in reads_of.items():
        if present[c]:
            for j in js:
                end[j] = max(end[j], start[c] + inst[c].dur)
                last_read[j] = max(last_read.get(j, (-1, -1, -1)), (start[c] + inst[c].dur, inst[c].node, c))
    # the first swap-in present: a later one may be left where the first's readers were dropped
    first_in = {v: next((j for j in idxs if present[j]), None) for v, (_l, _so, idxs) in model.swap_out.items()}
    for v, (_lit, so, _idxs) in model.swap_out.items():
        if first_in[v] is not None:  # the original stays until its copy to host is done
            j0 = model.of_node[v][0]
            end[j0] = max(end[j0], val(so) + int(model.tr[v]))
    # The simulator copies to host in the order the swap-outs are listed, the model in any order:
    # where a copy that starts later is released sooner, its swap-out waits for the earlier
    # copy's, as far as the model holds the original anyway (its retention end; the swap-in not
    # started), so the listed order is the copies' order (the swap greedy's gpt plans, hinted:
    # decoded +3.65e-5 s where the plan and the model said +3.21e-5 s)
    copy_rank: dict[int, int] = {}
    latest = -math.inf
    for rank, (_so, v, idx) in enumerate(sorted((val(so), v, first_in[v]) for v, (_l, so, _idxs)
                                                in model.swap_out.items() if first_in[v] is not None)):
        j0 = model.of_node[v][0]
        held = min(val(inst[j0].end), start[idx])
        end[j0] = max(end[j0], min(latest, held))
        latest = max(latest, end[j0])
        copy_rank[v] = p.n + rank  # after the frees at the same time, in the copies' order
    events: list[tuple] = []  # (time, rank, node, after, event's node, op): sorted on the first four
    for v in range(p.n):
        spans = sorted((start[j], end[j], inst[j].kind) for j in model.of_node[v] if present[j])
        merged: list[list] = []
        for s, e, kind in spans:
            if merged and s < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e, kind])
        # the model copies the original to host (its residency, the first, lasts until the copy
        # ends): that residency ends in the swap-out, where a swap-in is left to read the copy
        # (a recompute in between ended in it: a second copy the model does not time)
        swapped = any(kind == SWAP_IN for _, _, kind in merged)
        for k, (s, e, kind) in enumerate(merged):
            events.append((s, 1 if kind == SWAP_IN else 2, v, 0, v, "swap_in" if kind == SWAP_IN else "compute"))
            if e != math.inf:
                op = "swap_out" if swapped and k == 0 else "free"
                taker = _taker(model, v, e, last_read, present, start) if op == "free" else None
                if taker is not None:  # read last by a node taking its buffer over: freed right after it
                    events.append((taker[0], 2, taker[1], 1, v, op))
                else:
                    events.append((e, 0, copy_rank[v] if op == "swap_out" else v, 0, v, op))
    events.sort(key=lambda x: x[:4])
    return Plan(tuple(Event(op, v) for *_, v, op in events), strategy)


def _taker(model: "RematModel", v: int, e: float, last_read: dict, present: list, start: list) -> tuple | None:
    """(start, node) of the compute that reads v's copy ending at ``e`` last and takes its buffer
    over (``PlanningProblem.takes_over``), or None."""
    over = model.takes_over
    for j in model.of_node[v]:
        if present[j] and j in last_read and last_read[j][0] == e:
            _, w, c = last_read[j]
            if over[w] == v:
                return start[c], w
    return None
