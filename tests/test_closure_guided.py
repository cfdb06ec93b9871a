"""Searching first where the closure bound's solution recomputes (planning._closure_guided) and
the restricted copy of the remat model it searches (RematModel.restricted)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner.cpsat import PhaseResult, PlannerOptions, RematModel
from planner.order_bound import closure_bound
from planner.planning import _closure_cuts, _closure_guided
from planner.simulate import simulate
from tests.helpers import memory_ordered_with_greedy

ONE = PlannerOptions(time_limit=10, workers=1, seed=0)


@pytest.fixture(scope="module")
def rl100_70(benchmarks_dir):
    """RL100 at 70% in its memory-aware order (where +2.227% is the proven optimum), phase 2's
    model hinted with the greedy's plan (+4.77%), that plan as phase 2's result, and the closure
    bound with its solution."""
    q, budget, start = memory_ordered_with_greedy(benchmarks_dir, 100, 0.7)
    m2 = RematModel(q, budget, ONE, [start.plan])
    m2.set_objective_time()
    r2 = PhaseResult("optimize", "FEASIBLE", 0.0, m2.objective_of_counts(start.sim.compute_counts), None,
                     start.plan, None)
    bound = closure_bound(q, budget, m2.obj_cost, time_limit=20)
    assert bound is not None and bound.exact
    return q, budget, m2, r2, bound


def recomputed(sim) -> set[int]:
    return {i for i, c in enumerate(sim.compute_counts) if c > 1}


def test_the_bound_names_the_nodes_its_solution_recomputes(rl100_70):
    q, _, m2, _, bound = rl100_70
    assert bound.nodes and list(bound.nodes) == sorted(set(bound.nodes))
    # every node recomputed costs at least one recompute event: never more than the bound
    assert 0 < int(m2.obj_cost[list(bound.nodes)].sum()) <= bound.value


def test_the_guided_search_finds_the_optimum_the_greedy_missed(rl100_70):
    q, budget, m2, r2, bound = rl100_70
    found = _closure_guided(m2, r2, bound, time_limit=60)  # optimal in 0.2 s; the limit is for loaded machines
    assert found is not None and found.plan is not None
    assert found.objective == bound.value < r2.objective  # the bound's value: optimal
    sim = simulate(q, found.plan, budget)  # raises over budget
    assert m2.objective_of_counts(sim.compute_counts) == bound.value
    assert recomputed(sim) <= set(bound.nodes) | recomputed(simulate(q, r2.plan))


def test_the_restricted_model_keeps_its_nodes_and_its_ceiling(rl100_70):
    _, _, m2, _, bound = rl100_70
    before = len(m2.m.Proto().constraints)
    # nothing is cheaper than the optimum (proven in well under a second; the limit is for loaded machines)
    assert m2.solve("cheaper", 60, model=m2.restricted(bound.nodes, bound.value)).status == "INFEASIBLE"
    # 70% needs recomputes: none allowed, no plan
    assert m2.solve("none", 60, model=m2.restricted((), 10**9)).status == "INFEASIBLE"
    # the model itself is left as it was
    assert len(m2.m.Proto().constraints) == before


def test_nothing_to_guide_without_a_solution_or_a_plan(rl100_70):
    _, _, m2, r2, bound = rl100_70
    assert _closure_guided(m2, r2, None, 1) is None
    assert _closure_guided(m2, r2, replace(bound, nodes=()), 1) is None
    assert _closure_guided(m2, replace(r2, plan=None, objective=None), bound, 1) is None


def test_the_cut_rounds_find_the_optimum_and_prove_it(rl100_70):
    """From the greedy's plan (+4.77%), the closure bound's cut rounds (planning._closure_cuts)
    find the optimum (+2.227%, the exact closure bound's value) on the way and end with the
    relaxation refuted below it: optimal, bound = plan."""
    q, budget, m2, r2, bound = rl100_70
    cut = _closure_cuts(m2, r2, 60, ONE)  # a few seconds; the limit is for loaded machines
    assert cut is not None and cut.status == "OPTIMAL"
    assert cut.objective == cut.bound == bound.value < r2.objective
    sim = simulate(q, cut.plan, budget)  # raises over budget
    assert m2.objective_of_counts(sim.compute_counts) == bound.value


def test_nothing_to_cut_from_without_a_plan(rl100_70):
    _, _, m2, r2, _ = rl100_70
    assert _closure_cuts(m2, replace(r2, plan=None, objective=None), 60, ONE) is None
    assert _closure_cuts(m2, r2, 0.0, ONE) is None
