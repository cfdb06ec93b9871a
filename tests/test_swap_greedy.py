"""The swap greedy (planner/swap_greedy.py): with a host link, every budget that holds one step
next to what cannot move gets a plan, and cpsat falls back on it where recompute cannot reach."""
from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from planner import cpsat_plans, interrupt
from planner.cpsat import PlannerOptions, RematModel
from planner.plan import Plan
from planner.planning import solve
from planner.problem import PlanningProblem
from planner.simulate import simulate
from planner.swap_greedy import swap_greedy
from tests.helpers import feasible_as_hinted
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


def test_a_swap_problem_whose_costs_are_all_zero_builds_and_plans():
    """With no compute time the time axis once took a 1e-300 stand-in for the step's: x's 2-unit
    copies (x as in _held_input) became 1e305 ticks and building the model overflowed int64 (TypeError on a Domain)."""
    p = PlanningProblem.build(size=[100, 10, 100, 100, 1], cost=[0] * 5, preds=[[], [0], [1], [2], [0, 3]],
                              recomputable=[False, True, True, True, True], transfer=[2, 1, 10, 10, 0])
    RematModel(p, None, PlannerOptions())
    res = solve(p, 210, "cpsat", PlannerOptions(time_limit=5, workers=1, seed=0))
    assert res.plan is not None
    sim = simulate(p, res.plan, 210)
    assert sim.peak_bytes <= 210 and sim.swap_ins >= 1 and res.added_time == sim.added_time


def test_a_swap_problem_whose_transfers_dwarf_its_costs_builds_and_plans():
    """Transfers 1e13 times the run (a tiny --swap-bandwidth) once took up to 1e19 ticks each on the
    time axis: building the model overflowed int64 (TypeError on a Domain), and a JSON graph with
    --swap-bandwidth 1e-12 got "CP-SAT rejected the remat model: The sum of all variable domains do
    not fit on an int64_t"."""
    p = PlanningProblem.build(size=[100, 10, 100, 100, 1], cost=[1, 5, 5, 5, 1], preds=[[], [0], [1], [2], [0, 3]],
                              recomputable=[False, True, True, True, True], transfer=[2e14, 1e14, 1e15, 1e15, 0])
    res = solve(p, 210, "cpsat", PlannerOptions(time_limit=5, workers=1, seed=0))
    assert res.plan is not None
    sim = simulate(p, res.plan, 210)
    assert sim.peak_bytes <= 210 and sim.swap_ins >= 1 and res.added_time == sim.added_time


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


class _Hinted:
    """A model's variables read from a hint (variable index -> value), as CpSolver.Value reads a
    solution; fixed variables (not hinted) at their value."""

    def __init__(self, model: RematModel, values: dict[int, int]):
        self.model, self.values = model, values

    def Value(self, var) -> int:  # noqa: N802 (CpSolver's name)
        return self.values.get(var.Index(), self.model.lower(var))


def _copies_cross() -> PlanningProblem:
    """b (made first, read by k and last) and a (made third, read by y and s) leave for host, b
    first: b's copy starts first, yet b is held longer (k reads it after a's copy is done)."""
    return PlanningProblem.build(
        size=[100, 10, 100, 10, 10, 100, 100, 10, 10, 1], cost=[2] * 10,
        preds=[[], [], [1], [2], [3, 0], [4], [5], [6], [7, 2], [8, 0]],
        names=["b", "x", "a", "y", "k", "big1", "big2", "r", "s", "t"],
        recomputable=[False] * 10, transfer=[3, 0, 3, 0, 0, 0, 0, 0, 0, 0])


def test_the_swap_greedys_plan_hints_the_swap_model_and_decodes_back_to_its_time():
    p, budget = _copies_cross(), 290
    greedy = swap_greedy(p, budget)
    want = simulate(p, greedy, budget)
    assert [e.node for e in greedy.events if e.op == "swap_out"] == [0, 2] and want.swap_ins == 2
    model = RematModel(p, budget, PlannerOptions(workers=1, seed=0), [greedy])
    model.set_objective_time()
    hint = model.hint_from_plan(greedy)
    assert hint is not None and feasible_as_hinted(model, hint)
    # decoded, the copies to host keep their order (the simulator copies in listed order): b's
    # swap-out is listed first though a's residency ends sooner
    back = cpsat_plans.decode(model, _Hinted(model, hint), "hint")
    assert [e.node for e in back.events if e.op == "swap_out"] == [0, 2]
    assert simulate(p, back, budget).added_time == want.added_time
    # the search starts from it: its first solution is the greedy's plan, at the greedy's time
    first = RematModel(p, budget, PlannerOptions(workers=1, seed=0, solver_params=(("stop_after_first_solution", True),)),
                       [greedy])
    first.set_objective_time()
    first.apply_hint(first.hint_from_plan(greedy))
    got = first.solve("optimize", 10)
    assert got.plan is not None and abs(first.time_of_objective(got.objective) - want.added_time) <= 1e-9
    assert simulate(p, got.plan, budget).added_time == want.added_time
    res = solve(p, budget, "cpsat", PlannerOptions(time_limit=10, workers=1, seed=0))
    assert res.plan is not None and res.added_time <= want.added_time


def _read_across_two_wide_steps(recomputable: bool = True) -> PlanningProblem:
    """A (100 B, cost 50) is read by b1 and by out; c1 and c2 (100 B output, 100 B scratch) each
    leave no room for A at 210 B. Bringing A's host copy back twice (for b1, then for out) adds
    +15 (three 5-unit copies, in line with compute); one swap-in and a recompute of A, +60."""
    p = PlanningProblem.build(size=[1, 100, 100, 1, 100, 1], cost=[1, 50, 10, 1, 10, 1],
                              scratch=[0, 0, 100, 0, 100, 0], preds=[[], [0], [0], [1, 2], [3], [1, 4]],
                              names=["x", "A", "c1", "b1", "c2", "out"],
                              recomputable=[True, recomputable, True, True, True, True])
    return p.with_swap([5.0] * p.n, copy_overlap=False)


def test_a_plan_bringing_a_host_copy_back_twice_hints_the_model_only_where_it_has_two_swap_ins():
    """With one swap-in instance per node such a plan is no hint, not a wrong one; with two
    (PlannerOptions.max_swap_ins, the default) it is a solution that decodes to its own time.
    A plan swapping in a copy nobody reads is no hint either (the model has no such swap-in)."""
    q = _read_across_two_wide_steps()
    twice = Plan.of([("compute", 0), ("compute", 1), ("swap_out", 1), ("compute", 2), ("free", 0), ("swap_in", 1),
                     ("compute", 3), ("free", 1), ("free", 2), ("compute", 4), ("free", 3), ("swap_in", 1),
                     ("compute", 5), ("free", 1), ("free", 4), ("free", 5)], "twice")
    want = simulate(q, twice, 210)
    assert want.swap_ins == 2 and want.added_time == 15
    assert not cpsat_plans.swaps_fit(twice, q.n, 1) and cpsat_plans.swaps_fit(twice, q.n, 2)
    assert RematModel(q, 210, PlannerOptions(workers=1, max_swap_ins=1), [twice]).hint_from_plan(twice) is None
    model = RematModel(q, 210, PlannerOptions(workers=1, seed=0, time_resolution=int(q.total_cost)), [twice])
    model.set_objective_time()
    hint = model.hint_from_plan(twice)
    assert hint is not None and feasible_as_hinted(model, hint)
    assert model.time_of_objective(hint[model.makespan.Index()] - int(model.dur.sum())) == 15  # one tick per unit
    back = cpsat_plans.decode(model, _Hinted(model, hint), "hint")
    assert [(e.op, e.node) for e in back.events if e.op != "compute"] == \
        [(e.op, e.node) for e in twice.events if e.op != "compute"]
    assert simulate(q, back, 210).added_time == want.added_time
    idle = Plan.of([("compute", 0), ("compute", 1), ("swap_out", 1), ("swap_in", 1), ("free", 1), ("swap_in", 1),
                    ("compute", 2), ("free", 0), ("compute", 3), ("free", 2), ("compute", 4), ("free", 3),
                    ("compute", 5), ("free", 1), ("free", 4), ("free", 5)], "idle")
    simulate(q, idle)
    assert model.hint_from_plan(idle) is None


def test_the_swap_model_alone_brings_a_host_copy_back_twice_where_that_is_cheapest():
    """Unhinted, the model with two swap-in instances per node finds the +15 plan (proven); with
    one it holds +60 at best (README: what CP-SAT's bound and "optimal" cover)."""
    q = _read_across_two_wide_steps()
    got = {}
    for k in (1, 2):
        model = RematModel(q, 210, PlannerOptions(workers=1, seed=0, max_swap_ins=k, time_resolution=int(q.total_cost)))
        model.set_objective_time()
        res = model.solve("exact", 10)
        assert res.status == "OPTIMAL" and res.plan is not None
        sim = simulate(q, res.plan, 210)
        assert sim.added_time == model.time_of_objective(res.objective)
        got[k] = (sim.added_time, sim.swap_ins)
    assert got == {1: (60.0, 1), 2: (15.0, 2)}
    # where A cannot be recomputed, only two swap-ins fit it at all
    q = _read_across_two_wide_steps(recomputable=False)
    for k, status in ((1, "INFEASIBLE"), (2, "OPTIMAL")):
        model = RematModel(q, 210, PlannerOptions(workers=1, seed=0, max_swap_ins=k, time_resolution=int(q.total_cost)))
        model.set_objective_time()
        assert model.solve("exact", 10).status == status, k


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.floats(0.0, 1.0), st.sampled_from([2, 10, 40]), st.booleans())
def test_a_swap_greedy_plan_that_maps_is_a_solution_of_the_model_and_decodes_to_its_time(p, frac, div, overlap):
    assume(p.total_cost > 0)
    q = p.with_swap([s / div for s in p.size], copy_overlap=overlap)
    low = int(q.step_need.max())
    budget = low + int(frac * (q.unplanned_peak - low))
    greedy = swap_greedy(q, budget)
    model = RematModel(q, budget, PlannerOptions(workers=1, seed=0), [greedy])
    model.set_objective_time()
    hint = model.hint_from_plan(greedy)
    assert (hint is not None) == cpsat_plans.swaps_fit(greedy, q.n, model.opt.max_swap_ins)
    if hint is None:
        return
    assert feasible_as_hinted(model, hint)
    want = simulate(q, greedy, budget).added_time
    got = simulate(q, cpsat_plans.decode(model, _Hinted(model, hint), "hint"), budget).added_time
    assert abs(got - want) <= 1e-9 * q.total_cost


def test_the_swap_model_is_searched_without_probing(monkeypatch):
    """Probing the model on ticks took most of a swap solve's time (zoo:resnet?batch=8 at 60%: 15 of
    20 s) and left no time to search from the hint (planner/cpsat.py, RematModel.solve)."""
    probing = []
    real = interrupt.solve

    def spy(solver, model, callback=None):
        probing.append(solver.parameters.cp_model_probing_level)
        return real(solver, model, callback)

    monkeypatch.setattr(interrupt, "solve", spy)
    p, budget = _copies_cross(), 290
    greedy = swap_greedy(p, budget)
    model = RematModel(p, budget, PlannerOptions(workers=1, seed=0), [greedy])
    model.set_objective_time()
    model.apply_hint(model.hint_from_plan(greedy))
    assert model.solve("optimize", 5).plan is not None
    assert probing == [0]


def test_prefetching_never_makes_the_swap_greedy_dearer():
    """Hypothesis found it: step 5 waits for the two swap-ins prefetched before it though it reads
    neither, and the walk with prefetch added 0.5 where the one without adds 0.4."""
    p = PlanningProblem.build(size=[1, 1, 1, 1, 2, 1, 1, 1], cost=[0, 0, 0, 0, 0, 1, 0, 0],
                              preds=[[], [0], [0], [0], [2, 3], [2], [0, 1, 2], [5]], name="dag")
    q = p.with_swap([s / 10 for s in p.size])
    budget = int(q.step_need.max())
    plan, late = swap_greedy(q, budget), swap_greedy(q, budget, prefetch=False)
    assert simulate(q, plan, budget).added_time <= simulate(q, late, budget).added_time + 1e-12
    assert simulate(q, late, budget).added_time > 0  # the case has a price to pay


def test_in_line_with_compute_the_swap_greedy_holds_no_input_back_early():
    """ONNX models' copies run in line with compute (planner.devices.COPIES_OVERLAP_COMPUTE): every
    event runs one after another, so an input brought back while the step before its reader computes
    saves no time and holds its bytes through that step. The swap greedy still prefetched there:
    here its plan peaked at 10 bytes where the walk without prefetch, as fast, peaks at 9."""
    from planner.swap_greedy import _walk

    p = PlanningProblem.build(size=[4, 2, 2, 3, 3, 4], cost=[0, 2, 1, 2, 2, 1],
                              preds=[[], [0], [0, 1], [0], [2, 3], [1, 3]], name="dag")
    q, budget = p.with_swap([s / 10 for s in p.size], copy_overlap=False), 10
    plan, early = swap_greedy(q, budget), _walk(q, budget, True)
    sim, sim_early = simulate(q, plan, budget), simulate(q, early, budget)
    assert sim.swap_ins and sim.added_time == sim_early.added_time
    assert sim.peak_bytes < sim_early.peak_bytes
    # beside compute the early copy hides behind the step before (+0 against +0.2): prefetch stays there
    over = p.with_swap([s / 10 for s in p.size], copy_overlap=True)
    ahead = swap_greedy(over, budget)
    assert ahead == _walk(over, budget, True)
    assert simulate(over, ahead, budget).added_time < simulate(over, _walk(over, budget, False), budget).added_time
