"""Swap greedy: with a host link, move out what is read furthest ahead (Belady), bring it back
just before its reader.

Walk the fixed order with exact event accounting. Before step t, every input of t that is on
the host comes back (``swap_in``). Before each allocation that would pass the budget, the
resident buffer read furthest ahead (larger first on ties) that t does not read leaves: a plain
``free`` when its host copy from an earlier swap-out is still there, else ``swap_out``. A buffer
is freed after its last reader. With ``prefetch``, where copies run beside compute
(``copy_overlap``: JSON graphs' --swap-bandwidth), the next step's inputs on the host come back
before t computes wherever t still fits, so their transfer overlaps t (measured, swap greedy alone,
when ONNX models were priced so: zoo:gpt?batch=64 at 35% +9.73% -> +3.55%, at 27% +15.04% ->
+7.41%; RL1000 with a link moving the mean buffer in the mean compute time, at 50% +14.68% ->
+8.97%). In line with compute (ONNX models: planner.devices.COPIES_OVERLAP_COMPUTE) every event
runs one after another, so bringing an input back a step early saves no time and only holds its
bytes through a step that does not read it: no prefetch there. No recompute, so no chain of
inputs is ever needed: every budget that holds one step (its inputs, output and scratch) next to
the buffers that cannot move is reached. The time is whatever the transfers cost (simulate prices them); the CP-SAT swap model
refines from there when it can.

It is the plan for budgets below what recompute reaches (zoo:gpt?batch=64 with --swap: the
recompute least is about 33% of the peak, the swap floor 26%).
"""
from __future__ import annotations

import bisect

from planner.plan import Event, Plan
from planner.problem import PlanningProblem
from planner.simulate import simulate


def swap_greedy(problem: PlanningProblem, budget: int, prefetch: bool = True) -> Plan | None:
    """A plan within ``budget`` that only swaps, or None (no host link, or some step does not fit
    next to the buffers that cannot move). ``prefetch`` applies where copies overlap compute."""
    prefetch = prefetch and problem.copy_overlap
    plan = _walk(problem, budget, prefetch)
    if not prefetch:
        return plan
    # a swap-in brought back early holds up the next step even where that step does not read it
    # (an 8-node DAG: +0.5 with prefetch against +0.4 without): the cheaper of the two walks wins
    late = _walk(problem, budget, False)
    if plan is None or (late is not None and simulate(problem, late).added_time < simulate(problem, plan).added_time):
        return late
    return plan


def _walk(problem: PlanningProblem, budget: int, prefetch: bool) -> Plan | None:
    """One walk of the order (the module docstring), with or without prefetching."""
    p = problem
    if not p.can_swap:
        return None
    n = p.n
    size = [int(x) for x in p.size]
    movable = [bool(x) for x in p.swappable & ~p.pinned]
    reads = [sorted(r) for r in p.succ_lists]
    resident = [False] * n
    on_host = [False] * n
    events: list[Event] = []
    mem = int(p.base_bytes)
    live: set[int] = set()

    def next_read(v: int, t: int) -> int:
        """First step at or after t that reads v (n when none)."""
        j = bisect.bisect_left(reads[v], t)
        return reads[v][j] if j < len(reads[v]) else n

    def leave(v: int, op: str) -> None:
        nonlocal mem
        events.append(Event(op, v))
        resident[v] = False
        live.discard(v)
        mem -= size[v]

    def arrive(op: str, v: int) -> None:
        nonlocal mem
        events.append(Event(op, v))
        resident[v] = True
        live.add(v)
        mem += size[v]

    def make_room(need: int, t: int, keep: set[int]) -> bool:
        while mem + need > budget:
            out = [v for v in live if movable[v] and v not in keep]
            if not out:
                return False
            v = max(out, key=lambda x: (next_read(x, t), size[x], -x))
            if on_host[v]:
                leave(v, "free")
            else:
                on_host[v] = True
                leave(v, "swap_out")
        return True

    for t in range(n):
        inputs = set(p.pred_lists[t])
        for u in sorted(inputs):
            if not resident[u]:
                if not make_room(size[u], t, inputs):
                    return None
                arrive("swap_in", u)
        if not make_room(size[t] + int(p.scratch[t]), t, inputs):
            return None
        if prefetch and t + 1 < n:  # the next step's inputs come back while t computes, if t still fits
            for u in sorted(set(p.pred_lists[t + 1]) - inputs):
                if on_host[u] and not resident[u] and mem + size[u] + size[t] + int(p.scratch[t]) <= budget:
                    arrive("swap_in", u)
        arrive("compute", t)
        for u in sorted(inputs | {t}):
            if resident[u] and not p.pinned[u] and next_read(u, t + 1) == n:
                leave(u, "free")
    for v in sorted(live):  # read by nothing after the last step (graph outputs stay)
        if not p.pinned[v]:
            leave(v, "free")
    return Plan(tuple(events), "swap-greedy")
