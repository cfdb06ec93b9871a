"""The closure bound's cut rounds (planner.order_bound.ClosureCuts, planning._closure_cuts) on
random small DAGs: the bound never exceeds the cheapest plan of the model, the plan returned is
never dearer than the one it started from, and "optimal" means the model's optimum."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.baselines import baseline
from planner.cpsat import PhaseResult, PlannerOptions, RematModel
from planner.order_bound import closure_bound
from planner.planning import _closure_cuts
from planner.simulate import simulate
from tests.test_chain_greedy import layered

ONE = PlannerOptions(time_limit=10, workers=1, seed=0, work_limit=True)


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
