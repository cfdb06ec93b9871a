"""The memory floor (PlanningProblem.memory_floor, planner.problem.last_input_bound) is a lower
bound on every plan's peak: checked against the exact least peak of small DAGs, found by an
exhaustive search over every recompute/free schedule (not the planner), and on RL100, where it
proves the 50% budget infeasible."""
from __future__ import annotations

import heapq
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from planner.cpsat import PlannerOptions
from planner.planning import solve
from planner.problem import PlanningProblem, last_input_bound
from tests.helpers import random_layered
from tests.test_chain_greedy import layered


def exact_least_peak(p: PlanningProblem) -> int:
    """Least peak over all schedules that run the originals in order and may free any buffer
    and recompute any computed node any number of times (bottleneck Dijkstra over
    (next original, resident set))."""
    n = p.n
    size = [int(x) for x in p.size]
    need = [int(p.size[v]) + int(p.scratch[v]) for v in range(n)]
    preds = [sum(1 << u for u in p.pred_lists[v]) for v in range(n)]
    pinned = sum(1 << v for v in range(n) if p.pinned[v])

    def held(mask: int) -> int:
        return sum(size[v] for v in range(n) if mask >> v & 1)

    best = {(0, 0): p.base_bytes}
    heap = [(p.base_bytes, 0, 0)]
    while heap:
        peak, t, mask = heapq.heappop(heap)
        if peak > best.get((t, mask), peak):
            continue
        if t == n and mask == pinned:
            return peak
        moves = []
        for v in range(n):
            if mask >> v & 1:
                if not p.pinned[v]:
                    moves.append((peak, t, mask & ~(1 << v)))  # free
            elif v <= t and v < n and preds[v] & mask == preds[v] and (v < t or t < n):
                at = p.base_bytes + held(mask) + need[v]
                moves.append((max(peak, at), t + 1 if v == t else t, mask | 1 << v))
        for m in moves:
            if m[0] < best.get((m[1], m[2]), 1 << 62):
                best[(m[1], m[2])] = m[0]
                heapq.heappush(heap, m)
    raise AssertionError("no schedule")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layered(max_n=7))
def test_the_floor_never_exceeds_the_exact_least_peak(p):
    exact = exact_least_peak(p)
    assert last_input_bound(p, depth=4) <= exact
    assert p.memory_floor <= exact


def test_the_last_input_raises_the_floor_to_the_exact_least_peak():
    # step 4 reads 2 and 3; whichever is made last, 0 and 1 (its inputs) or the other one and a
    # big input are resident with it: more than step 4 itself needs.
    p = PlanningProblem.build(size=[10, 10, 1, 1, 1], cost=[1] * 5,
                              preds=[[], [], [0, 1], [0, 1], [2, 3]], name="fan")
    assert int(p.step_need.max()) == 21  # step 2 or 3: 10 + 10 + 1
    assert last_input_bound(p) == exact_least_peak(p) == 22  # 10 + 10 + 1 + 1, at the second of 2, 3
    assert p.memory_floor == 22
    # a swappable step still computes from its inputs: only the inputs' swap-ins skip theirs
    swap = PlanningProblem.build(size=[10, 10, 1, 1, 1], cost=[1] * 5, preds=[[], [], [0, 1], [0, 1], [2, 3]],
                                 swappable=[False, False, False, False, True], transfer=[1.0] * 5, name="fan")
    assert last_input_bound(swap) == 22


def test_rl100_at_half_its_peak_is_infeasible(benchmarks_dir: Path):
    p = random_layered(benchmarks_dir, 100)
    budget = p.budget_for(0.5)
    assert int(p.step_need.max()) < budget < p.memory_floor  # only the last-input bound proves it
    res = solve(p, budget, "cpsat", PlannerOptions(time_limit=3, workers=1, seed=0))
    assert res.status == "infeasible" and res.plan is None
    assert res.least_bytes >= p.memory_floor > budget
