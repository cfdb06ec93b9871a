"""The closure bound's cut rounds (planner.order_bound.ClosureCuts, planning._closure_cuts) on
random small DAGs: the bound never exceeds the cheapest plan of the model, the plan returned is
never dearer than the one it started from, and "optimal" means the model's optimum."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import clock
from planner.baselines import baseline
from planner.cpsat import PhaseResult, PlannerOptions, RematModel
from planner.order_bound import ClosureCuts, closure_bound
from planner.planning import _closure_cuts
from planner.problem import PlanningProblem
from planner.simulate import simulate
from tests.test_chain_greedy import layered

ONE = PlannerOptions(time_limit=10, workers=1, seed=0, work_limit=True)
DEADLINE_S = 60  # far more than these tiny models take; the limit is for loaded machines


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=layered(max_n=12), share=st.floats(0.0, 0.9))
def test_cut_rounds_bound_the_models_optimum_from_below(p, share):
    budget = int(p.memory_floor + share * (p.unplanned_peak - p.memory_floor))
    start = baseline(p, "chen", budget) or baseline(p, "greedy", budget)
    if start is None or start.sim.peak_bytes > budget:
        return
    m2 = RematModel(p, budget, ONE, [start.plan])
    m2.set_objective_time()
    best = m2.solve("optimize", 10)
    if best.status != "OPTIMAL":
        return  # the oracle needs the model's optimum
    r2 = PhaseResult("start", "FEASIBLE", 0.0, m2.objective_of_counts(start.sim.compute_counts), None,
                     start.plan, None)
    # alone, and from the closure bound proven before them (under the start's cost, as phase 2
    # asks it): its value a floor for every round, its solution the first round's where exact
    known = closure_bound(p, budget, m2.obj_cost, 10, below=int(round(r2.objective)))
    for cut in (_closure_cuts(m2, r2, 10, ONE), _closure_cuts(m2, r2, 10, ONE, known)):
        if cut is None:  # nothing over budget unplanned: no relaxation to cut
            return
        assert cut.objective <= r2.objective
        assert simulate(p, cut.plan, budget).peak_bytes <= budget
        if cut.bound is not None:
            assert cut.bound <= best.objective + 1e-6
        if cut.status == "OPTIMAL":
            assert cut.objective == best.objective


def _free_recompute_outside_the_steps() -> PlanningProblem:
    """Hypothesis's example: at the memory floor (26 bytes) a plan recomputes nodes 0, 1, 2, 3 and
    8, all of cost 0, and adds nothing; node 8 is read by 11 only, past the three steps over budget
    (5, 6, 7), so the relaxation has no recompute event of it."""
    preds = [[], [0], [0], [0], [0], [0], [0], [1, 2], [2], [3, 5], [4], [8]]
    return PlanningProblem.build(size=[1, 1, 1, 1, 2, 21, 1, 1, 1, 1, 1, 25], cost=[0, 0, 0, 0, 1] + [0] * 7,
                                 preds=preds, pinned=[False] * 12, scratch=[0] * 12, base_bytes=0, name="layered")


def test_a_free_recompute_outside_the_modelled_steps_keeps_the_cuts_below_the_optimum():
    """A cut says "a cheaper plan recomputes some node outside Y"; a plan whose only recompute
    outside Y is of a cost-0 node with no event in the relaxation (node 8 here) must still pass it.
    It did not: after the first round cut {0..5} the relaxation had nothing to satisfy the cut
    with, and the rounds called the start's 1 unit optimal where the model's optimum is 0."""
    p = _free_recompute_outside_the_steps()
    budget = p.memory_floor
    start = baseline(p, "chen", budget) or baseline(p, "greedy", budget)
    assert start is not None and start.sim.peak_bytes <= budget
    m2 = RematModel(p, budget, ONE, [start.plan])
    m2.set_objective_time()
    best = m2.solve("optimize", DEADLINE_S)
    assert best.status == "OPTIMAL"
    # the model's optimum is a real plan: it replays within budget at that cost
    sim = simulate(p, best.plan, budget)
    assert sim.peak_bytes <= budget and m2.objective_of_counts(sim.compute_counts) == best.objective
    r2 = PhaseResult("start", "FEASIBLE", 0.0, m2.objective_of_counts(start.sim.compute_counts), None,
                     start.plan, None)
    assert r2.objective > best.objective  # the start is dearer: there is something to find
    known = closure_bound(p, budget, m2.obj_cost, DEADLINE_S, below=int(round(r2.objective)))
    for cut in (_closure_cuts(m2, r2, DEADLINE_S, ONE), _closure_cuts(m2, r2, DEADLINE_S, ONE, known)):
        assert cut is not None and cut.bound is not None
        assert cut.bound <= best.objective + 1e-6
        assert simulate(p, cut.plan, budget).peak_bytes <= budget
        if cut.status == "OPTIMAL":
            assert cut.objective == best.objective


def test_a_cut_leaves_room_for_a_free_recompute_of_a_node_the_steps_do_not_model():
    """ClosureCuts on its own: cutting every node the relaxation has an event for still leaves the
    plans that also recompute a cost-0 node outside them (node 8 above), so the relaxation stays
    solvable at the optimum's cost."""
    p = _free_recompute_outside_the_steps()
    budget = p.memory_floor
    cost = [int(c) for c in p.cost]
    cuts = ClosureCuts(p, budget, cost, 1, clock.now() + DEADLINE_S)
    assert cuts.ready
    modelled = sorted({i for (i, _) in cuts.events})
    assert 8 not in modelled and p.recomputable[8] and cost[8] == 0
    cuts.cut(modelled)
    name, low, nodes = cuts.solve(DEADLINE_S)
    assert name == "OPTIMAL" and low == 0
    assert set(nodes) - set(modelled)  # the cut is met by a recompute outside the cut set
