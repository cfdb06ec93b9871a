"""Hypothesis properties of the CP-SAT planner on random DAGs: every plan replays within its
budget, a budget at the unplanned peak costs nothing, and a larger budget never costs more."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings, strategies as st

from planner.cpsat import PlannerOptions
from planner.planning import solve
from planner.problem import PlanningProblem
from planner.simulate import simulate
from tests.helpers import draw_dag

# A model that does not depend on the budget (no hint-grown slots) and has room for every
# recompute chain of these small graphs, so its optimum can be compared across budgets.
OPTS = PlannerOptions(time_limit=10, workers=1, seed=0, grow_from_hints=False)


@st.composite
def dags(draw) -> PlanningProblem:
    preds, size, cost = draw_dag(draw, 8, 30)
    return PlanningProblem.build(size=size, cost=cost, preds=preds, name="dag")


def _options(p: PlanningProblem) -> PlannerOptions:
    return replace(OPTS, spare_slots=2 * p.n, search_slots=2 * p.n)


def _check(p: PlanningProblem, budget: int):
    res = solve(p, budget, "cpsat", _options(p))
    if res.plan is None:
        assert res.status == "infeasible" and res.least_bytes is not None and res.least_bytes > budget
        return res
    sim = simulate(p, res.plan, budget)  # raises if invalid or over budget
    assert sim.peak_bytes == res.peak_bytes <= budget
    return res


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.floats(0.3, 1.0), st.floats(0.0, 0.3))
def test_plans_are_valid_and_a_larger_budget_never_costs_more(p, frac, more):
    lo = max(p.memory_floor, p.budget_for(frac))
    hi = max(lo, p.budget_for(min(1.0, frac + more)))
    a, b = _check(p, lo), _check(p, hi)
    if a.status == "optimal" and b.status == "optimal":
        assert b.added_time <= a.added_time + 1e-9
    if a.plan is not None:
        assert b.plan is not None  # what fits a smaller budget fits a larger one


@settings(max_examples=15, deadline=None)
@given(dags())
def test_budget_at_the_unplanned_peak_costs_nothing(p):
    res = _check(p, p.unplanned_peak)
    assert res.status == "optimal" and res.added_time == 0
