"""The swap greedy (planner/swap_greedy.py): with a host link, every budget that holds one step
next to what cannot move gets a plan, and cpsat falls back on it where recompute cannot reach."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from planner.cpsat import PlannerOptions
from planner.planning import solve
from planner.problem import PlanningProblem
from planner.simulate import simulate
from planner.swap_greedy import swap_greedy
from tests.test_planner_props import dags


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_every_budget_that_holds_each_step_gets_a_swap_plan(p):
    q = p.with_swap([s / 10 for s in p.size])
    budget = int(q.step_need.max())  # the inputs, output and scratch of the largest step, outputs made so far
    plan = swap_greedy(q, budget)
    assert plan is not None
    sim = simulate(q, plan, budget)  # raises if invalid or over budget
    assert sim.recomputes == 0 and sim.peak_bytes <= budget
    assert swap_greedy(p, budget) is None  # no host link: nothing to move
    late = swap_greedy(q, budget, prefetch=False)  # each input back only just before its reader
    assert late is not None and sim.added_time <= simulate(q, late, budget).added_time + 1e-9
    if budget >= q.unplanned_peak:
        assert sim.swap_ins == 0


def _held_input() -> PlanningProblem:
    """x (an input: cannot be recomputed) is read first by a and last by out; b and c (100 B each)
    run in between. Recompute cannot drop x; a host link can."""
    return PlanningProblem.build(size=[100, 10, 100, 100, 1], cost=[1, 5, 5, 5, 1],
                                 preds=[[], [0], [1], [2], [0, 3]], names=["x", "a", "b", "c", "out"],
                                 recomputable=[False, True, True, True, True], transfer=[2, 1, 10, 10, 0])


def test_cpsat_falls_back_on_swaps_where_recompute_cannot_reach():
    p = _held_input()
    opts = PlannerOptions(time_limit=10, workers=1, seed=0)
    assert solve(p.without_swap(), 210, "cpsat", opts).plan is None  # x + b + c: 300 B
    res = solve(p, 210, "cpsat", opts)
    assert res.plan is not None
    sim = simulate(p, res.plan, 210)
    assert sim.swap_ins >= 1 and sim.peak_bytes <= 210 and res.added_time == sim.added_time
    assert solve(p, 210, "cpsat", replace(opts, seed=0)).plan.events == res.plan.events  # deterministic
    # with no search at all, the swap greedy's plan is what comes back (never "no plan")
    blind = solve(p, 210, "cpsat", replace(opts, solver_params=(("max_deterministic_time", 0.0),)))
    assert blind.plan is not None and "swap-greedy" in blind.note
    assert simulate(p, blind.plan, 210).swap_ins >= 1


def test_a_swap_greedy_plan_that_adds_no_time_is_returned_as_optimal_at_once():
    """x (an input) is read first and last; d and e (1 B, 10 time units) run while x's copies
    (2 units each way) move, beside b and c (100 B each). The swap greedy's plan hides both copies:
    nothing can be cheaper, so no solver phase spends the limit finding nothing better."""
    p = PlanningProblem.build(size=[100, 10, 1, 100, 100, 1, 1], cost=[1, 5, 10, 5, 5, 10, 1],
                              preds=[[], [0], [1], [2], [3], [4], [0, 5]], names=["x", "a", "d", "b", "c", "e", "out"],
                              recomputable=[False] + [True] * 6, transfer=[2, 1, 1, 10, 10, 1, 0])
    assert p.unplanned_peak == 300
    res = solve(p, 210, "cpsat", PlannerOptions(time_limit=10, workers=1, seed=0))
    assert res.status == "optimal" and res.added_time == 0 and "adds no time" in res.note
    assert res.solver.phases == () and simulate(p, res.plan, 210).swap_ins == 1
