"""The least peak over every recompute plan of a small problem, with a plan that reaches it.

The CP-SAT model's proofs hold over its own plans only: each node computed at most a few times
(``PlannerOptions.max_computations``), recomputes in the slots the model lays out. A plan that
recomputes a buffer before each of many far-apart readers is outside it, so the model's least
peak (or its bound) is no bound on what every plan reaches. The sound bound for any problem is
:attr:`PlanningProblem.memory_floor`; on a small problem :func:`least_plan` finds the exact least
by search over every plan.

Search: a plan runs the originals in order and may, between them, free any buffer and compute
again any recomputable node whose inputs are resident. A state is (next original, resident set);
its cost is the highest memory on the way there, and the least cost of reaching "every original
run, only graph outputs resident" is the least peak (a bottleneck shortest path: Dijkstra on the
running maximum). The resident set only holds nodes computed already, so there are at most
about 2^(n+1) states; the search gives up past ``max_states``.
"""
from __future__ import annotations

import heapq

from planner.plan import Event, Plan
from planner.problem import PlanningProblem

#: Problems up to this many nodes get the exact search; it stops after MAX_STATES states (about
#: 2 s of Python). Random 20-node graphs took up to 0.7 s; at 24 nodes some passed the cap.
MAX_NODES = 20
MAX_STATES = 200_000


def least_plan(problem: PlanningProblem, max_nodes: int = MAX_NODES,
               max_states: int = MAX_STATES) -> tuple[int, Plan] | None:
    """(least peak over every recompute-only plan, a plan reaching it), or None when the problem
    has more than ``max_nodes`` nodes, can swap (swap-ins restore buffers without their inputs:
    not searched here), or the search passes ``max_states`` states."""
    p = problem
    n = p.n
    if n > max_nodes or p.can_swap:
        return None
    size = [int(x) for x in p.size]
    need = [int(p.size[v]) + int(p.scratch[v]) for v in range(n)]
    preds = [sum(1 << int(u) for u in p.pred_lists[v]) for v in range(n)]
    again = [bool(p.recomputable[v]) for v in range(n)]
    pinned = [bool(x) for x in p.pinned]
    done_mask = sum(1 << v for v in range(n) if pinned[v])
    base = p.base_bytes

    start = (0, 0)
    best = {start: base}
    parent: dict[tuple[int, int], tuple[tuple[int, int], Event]] = {}
    heap = [(base, 0, 0)]
    while heap:
        peak, t, mask = heapq.heappop(heap)
        if peak > best[(t, mask)]:
            continue
        if t == n and mask == done_mask:
            return peak, Plan(_events(parent, (t, mask)), "exact")
        held = sum(size[v] for v in range(n) if mask >> v & 1)
        for v in range(min(t + 1, n)):
            if mask >> v & 1:
                if pinned[v]:
                    continue
                nxt, cost, ev = (t, mask & ~(1 << v)), peak, Event("free", v)
            elif (v == t or again[v]) and preds[v] & mask == preds[v]:
                nxt = (t + 1 if v == t else t, mask | 1 << v)
                cost, ev = max(peak, base + held + need[v]), Event("compute", v)
            else:
                continue
            if cost < best.get(nxt, cost + 1):
                if nxt not in best and len(best) >= max_states:
                    return None
                best[nxt] = cost
                parent[nxt] = ((t, mask), ev)
                heapq.heappush(heap, (cost, *nxt))
    return None  # unreachable for a valid problem: running everything once is a plan


def _events(parent: dict, state: tuple[int, int]) -> tuple[Event, ...]:
    out = []
    while state in parent:
        state, ev = parent[state]
        out.append(ev)
    return tuple(reversed(out))
