"""A baseline plan hinted to the CP-SAT model must be a solution of the model itself: with every
variable fixed to its hinted value the model stays feasible. CP-SAT drops an infeasible hint (its
search starts without the plan) and 9.15's interleaved search may abort the process on one."""
from __future__ import annotations

import numpy as np

from planner.baselines import greedy, no_remat
from planner.cpsat import PlannerOptions, RematModel
from planner.problem import PlanningProblem
from planner.simulate import simulate
from tests.helpers import feasible_as_hinted
from tests.test_cpsat_abort import _random_problem

ONE = PlannerOptions(time_limit=5, workers=1, seed=0)


def test_baseline_hints_on_problems_with_parts_are_solutions_of_the_model():
    # the capacity was hinted at simulate()'s peak, which counts parts dying apart where the
    # model holds one buffer per node (27 units hinted, the model's range [31, 33]); retentions
    # of a buffer taken over ended after the op taking it over on slots, both counted there
    rng = np.random.default_rng(0)
    checked = 0
    while checked < 12:
        p = _random_problem(rng)
        if p.parts is None:
            continue
        checked += 1
        budget = (p.memory_floor + p.unplanned_peak) // 2
        found = greedy(p, budget)
        for plan in [no_remat(p)] + ([found.plan] if found else []):
            model = RematModel(p, None, ONE, [plan])
            values = model.hint_from_plan(plan)
            assert values is not None and feasible_as_hinted(model, values), (p, plan)


def test_the_parts_aware_model_counts_a_hinted_plan_as_simulate_does():
    # each part ends at its own last read (RematModel(parts=True)): the model holding every
    # variable at the hint is feasible, at simulate()'s peak where it holds every node's parts
    # apart, above it only where it keeps one buffer (a node taking over a buffer or taken over)
    rng = np.random.default_rng(0)
    checked = exact = 0
    while checked < 12:
        p = _random_problem(rng)
        if p.parts is None:
            continue
        checked += 1
        found = greedy(p, (p.memory_floor + p.unplanned_peak) // 2)
        for plan in [no_remat(p)] + ([found.plan] if found else []):
            model = RematModel(p, None, ONE, [plan], parts=True)
            values = model.hint_from_plan(plan)
            assert values is not None and feasible_as_hinted(model, values), (p, plan)
            held = model.bytes_of_capacity(values[model.cap.Index()])
            peak = simulate(p, plan).peak_bytes
            if len(model.parted) < sum(1 for x in p.parts if x):
                assert held >= peak, (p, plan)
                continue
            assert held == peak, (p, plan)
            # and the model of a budget at that peak holds it
            at_peak = RematModel(p, peak, ONE, [plan], parts=True)
            values = at_peak.hint_from_plan(plan)
            assert values is not None and feasible_as_hinted(at_peak, values), (p, plan)
            exact += 1
    assert exact >= 12


def test_a_plan_that_fits_only_as_parts_is_not_hinted_to_a_budget_it_breaks_in_the_model():
    # node 0's 3-byte part dies at node 1, its 1-byte part at node 2: simulate() peaks at 5 bytes
    # (step 1), the model, holding node 0 whole to step 2, at 6
    p = PlanningProblem.build(size=[4, 1, 1], cost=[1.0, 1.0, 1.0], preds=[[], [0], [0, 1]],
                              pinned=[False, False, True], parts=[[(3, [1]), (1, [1, 2])], [], []])
    plan = no_remat(p)
    assert simulate(p, plan).peak_bytes == 5
    assert RematModel(p, 5, ONE, [plan]).hint_from_plan(plan) is None
    model = RematModel(p, 6, ONE, [plan])
    values = model.hint_from_plan(plan)
    assert values is not None and feasible_as_hinted(model, values)


def test_a_no_remat_hint_frees_a_buffer_taken_over_where_the_op_taking_it_starts():
    # 1 writes into 0's buffer: the model (and simulate) count them once, 4 bytes, and so must
    # the hint; ending 0's retention after 1 counted 8, over the capacity's upper end
    p = PlanningProblem.build(size=[4, 4, 2], cost=[1.0, 1.0, 1.0], preds=[[], [0], [1]],
                              pinned=[False, False, True], takes_over=[-1, 0, -1])
    plan = no_remat(p)
    model = RematModel(p, None, ONE, [plan])
    values = model.hint_from_plan(plan)
    assert values is not None and feasible_as_hinted(model, values)
    assert model.bytes_of_capacity(values[model.cap.Index()]) == simulate(p, plan).peak_bytes


def test_a_swap_plan_is_hinted_at_its_peak_with_no_scratch_during_its_swap_in():
    # A (4 B, 8 B of scratch while computed) is copied out and back for the last step: the plan
    # peaks at 12 B (A's compute), as the model counts it (a swap-in has no compute interval);
    # the hint's capacity counted A's scratch again during the swap-in (16 B), over the budget of
    # 12 B and the capacity's upper end, and the plan was not hinted
    from planner.plan import Plan

    p = PlanningProblem.build(size=[4, 4, 4, 1], cost=[1, 1, 1, 1], scratch=[8, 0, 0, 0],
                              preds=[[], [0], [1], [0, 2]], pinned=[False, False, False, True]).with_swap([1, 1, 1, 1])
    plan = Plan.of([("compute", 0), ("compute", 1), ("swap_out", 0), ("compute", 2), ("free", 1), ("swap_in", 0),
                    ("compute", 3), ("free", 0), ("free", 2)], "swap A")
    assert simulate(p, plan).peak_bytes == 12
    opts = PlannerOptions(time_limit=5, workers=1, seed=0, reorder=False)
    model = RematModel(p, None, opts, [plan])
    values = model.hint_from_plan(plan)
    assert values is not None and feasible_as_hinted(model, values)
    assert model.bytes_of_capacity(values[model.cap.Index()]) == 12
    model = RematModel(p, 12, opts, [plan])
    values = model.hint_from_plan(plan)
    assert values is not None and feasible_as_hinted(model, values)
