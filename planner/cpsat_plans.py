"""Plans in and out of the CP-SAT model: a baseline plan as a complete hint, and a solution as
an event schedule. Kept apart from the model so each reads in one sitting."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from planner.plan import Event, Plan
from planner.simulate import simulate

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


def hint_values(model: "RematModel", plan: Plan) -> dict[int, int] | None:
    """Values of every model variable that reproduce a recompute-only ``plan``.

    The k-th compute of a node is its instance k. On slots, an original sits at its slot and
    the recomputes before it take the free slots of its step, one each (so the model counts
    exactly what the simulator counts); on ticks, computes run back to back. A buffer's
    retention ends where the plan frees it. None when the plan needs more instances or slots
    than the model has, or swaps.
    """
    p = model.p
    plan = plan.without_unread(p)  # the model holds no recompute nobody reads
    values: dict[int, int] = {}
    seen = [0] * p.n
    current = [-1] * p.n  # instance of each node resident now
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    chosen: dict[tuple[int, int], int] = {}
    t = 0  # next free slot / tick
    last_end = 0
    done = 0  # originals computed so far: the next one is node ``done`` (fixed order)
    for ev in plan.events:
        v = ev.node
        if ev.op == "free":
            ends[current[v]] = last_end
            current[v] = -1
            continue
        if ev.op != "compute":
            return None
        k = seen[v]
        seen[v] += 1
        if k >= len(model.of_node[v]) or model.inst[model.of_node[v][k]].kind != (ORIGINAL if k == 0 else RECOMPUTE):
            return None
        j = model.of_node[v][k]
        if k == 0:
            done += 1
        if not model.timed:
            if k == 0:
                t = int(model.pos[v])
            elif done >= p.n or t >= int(model.pos[done]):
                return None  # no free slot left before the next original
        starts[j] = t
        for u in p.pred_lists[v]:
            chosen[(j, u)] = current[u]
        current[v] = j
        t += int(model.dur[v])
        last_end = t
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
    for lit, so, _ in model.swap_out.values():
        values[lit.Index()] = 0
        values[so.Index()] = model.lower(so)
    for c, v, j, lit in model.reads:
        if not isinstance(lit, int):
            values[lit.Index()] = int(c in starts and chosen.get((c, v)) == j)
    for length, x in model.lengths:
        values[length.Index()] = values[x.end.Index()] - values[x.start.Index()]
    if model.budget is None:
        peak = simulate(p, plan).peak_bytes
        values[model.cap.Index()] = -((-(peak - p.base_bytes)) // model.mem_unit)
    if model.timed:
        values[model.makespan.Index()] = t
    return values


def decode(model: "RematModel", solver: "cp_model.CpSolver", strategy: str) -> Plan:
    """A solution as events: keep only instances something reads (transitively), shrink each
    retention to its last read, merge overlapping residencies of one node (the later compute
    is dropped), then order allocations and releases by time, releases first at equal times.
    Every step only removes memory or time, so the plan replays within what the model counted.
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
    for v, (_lit, so, idx) in model.swap_out.items():
        if present[idx]:  # the original stays until its copy to host is done
            j0 = model.of_node[v][0]
            end[j0] = max(end[j0], val(so) + int(model.tr[v]))
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
                    events.append((e, 0, v, 0, v, op))
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
