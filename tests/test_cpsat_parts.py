"""The parts-aware CP-SAT model (``RematModel(parts=True)``) never counts less than simulate():
a plan it decodes replays within its budget or capacity, and its knapsack cuts leave every plan
simulate() fits a solution of it. Random small problems with parts of every kind the problem
allows: three parts, a part nobody reads, a reader of two parts, scratch, nodes that may not be
recomputed, and some swappable nodes (the model holds those whole)."""
from __future__ import annotations

import numpy as np

from planner.baselines import greedy, no_remat
from planner import clock
from planner.cpsat import PlannerOptions, RematModel
from planner.planning import _chosen
from planner.problem import PlanningProblem
from planner.simulate import simulate
from tests.helpers import feasible_as_hinted, random_dag

ONE = PlannerOptions(time_limit=1, workers=1, seed=0)


def _parts(rng: np.random.Generator, size: int, readers: list[int]) -> list[tuple[int, list[int]]]:
    """2-3 parts of ``size`` bytes (0-byte ones too), each read by any subset of ``readers``."""
    cuts = sorted(int(x) for x in rng.integers(0, size + 1, size=int(rng.integers(1, 3))))
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [size])]
    return [(b, sorted({int(r) for r in rng.choice(readers, size=int(rng.integers(0, len(readers) + 1)))}))
            for b in sizes]


def _random_problem(rng: np.random.Generator, swaps: bool) -> PlanningProblem:
    """3..8 nodes, the last pinned; parts on unpinned nodes that are read and take over no buffer
    nor are taken over (PlanningProblem refuses those: lowering makes them one buffer)."""
    preds, size, readers, pinned, over = random_dag(rng, 8, lambda r: r.integers(3) == 0)
    n = len(preds)
    parts = [_parts(rng, size[v], readers[v]) if readers[v] and not pinned[v] and size[v] >= 2 and v not in over
             and over[v] < 0 and rng.integers(3) else [] for v in range(n)]
    extra = {}
    if swaps:
        extra = dict(transfer=[float(x) for x in rng.integers(1, 4, size=n)],
                     swappable=[not pinned[v] and bool(rng.integers(2)) for v in range(n)])
    return PlanningProblem.build(size=size, cost=[float(x) for x in rng.integers(1, 4, size=n)], preds=preds,
                                 scratch=[int(x) if rng.integers(3) == 0 else 0 for x in rng.integers(0, 6, size=n)],
                                 recomputable=[bool(rng.integers(4)) for _ in range(n)], pinned=pinned,
                                 takes_over=over, parts=parts, **extra)


def _with_parts(seed: int, count: int, swaps: bool = False):
    rng = np.random.default_rng(seed)
    found = 0
    while found < count:
        p = _random_problem(rng, swaps)
        if p.parts is not None:
            found += 1
            yield p


def _check_decoded(p: PlanningProblem) -> int:
    """Solve the parts-aware model at a few budgets and without one; each decoded plan replays
    within what the model held. How many plans it decoded."""
    decoded = 0
    lo, hi = p.memory_floor, p.unplanned_peak
    for budget in sorted({lo, (2 * lo + hi) // 3, (lo + hi) // 2, hi}):
        model = RematModel(p, budget, ONE, parts=True)
        model.set_objective_time()
        res = model.solve("feasibility", 1)
        if res.plan is not None:
            assert simulate(p, res.plan).peak_bytes <= budget, (p, budget, res.plan)
            decoded += 1
    model = RematModel(p, None, ONE, parts=True)
    model.set_objective_peak()
    res = model.solve("least", 1)
    assert res.plan is not None
    assert simulate(p, res.plan).peak_bytes <= model.bytes_of_capacity(res.objective), (p, res.plan)
    return decoded + 1


def test_plans_the_parts_aware_model_decodes_replay_within_its_budget():
    assert sum(_check_decoded(p) for p in _with_parts(1, 25)) >= 40


def test_plans_the_parts_aware_model_decodes_replay_within_its_budget_with_swaps():
    assert sum(_check_decoded(p) for p in _with_parts(2, 15, swaps=True)) >= 25


def test_the_knapsack_cuts_leave_every_plan_that_fits_a_solution_of_the_parts_aware_model():
    # no_remat, the greedy's plans and the model's own, each at simulate()'s peak: hinted, the
    # model holding every variable there is feasible (cuts included) where it holds every node's
    # parts apart
    checked = 0
    for p in _with_parts(5, 30):
        lo, hi = p.memory_floor, p.unplanned_peak
        plans = [no_remat(p)] + [g.plan for b in sorted({lo, (lo + hi) // 2}) if (g := greedy(p, b))]
        model = RematModel(p, lo, ONE, parts=True)
        model.set_objective_time()
        if (res := model.solve("feasibility", 1)).plan is not None:
            plans.append(res.plan)
        for plan in plans:
            peak = simulate(p, plan).peak_bytes
            model = RematModel(p, peak, ONE, [plan], parts=True)
            values = model.hint_from_plan(plan)
            assert values is not None and feasible_as_hinted(model, values, 2), (p, plan)
            checked += 1
    assert checked >= 45


def test_the_parts_aware_model_holding_no_plan_does_not_say_it_holds_outputs_as_one_buffer():
    # node 1's 3-byte part nobody reads: the parts-aware model holds it apart, and it holds no
    # plan within 29 bytes computing each node once (the greedy's recomputes node 0); the note
    # said "it holds a node's outputs as one buffer" (phase 2 INFEASIBLE again in that model)
    p = PlanningProblem.build(size=[9, 10, 11, 9], cost=[1.0, 1.0, 3.0, 3.0], preds=[[], [0], [1], [0, 2]],
                              pinned=[False, False, False, True], recomputable=[True, True, False, False],
                              scratch=[0, 0, 5, 0], parts=[[], [(3, []), (7, [2])], [], []])
    opt = PlannerOptions(time_limit=1, workers=1, seed=0, max_computations=1)
    found = greedy(p, 29)
    m2 = RematModel(p, 29, opt, parts=True)
    m2.set_objective_time()
    r2 = m2.solve("optimize", 1)
    assert m2.parted and r2.status == "INFEASIBLE"
    res = _chosen(p, 29, opt, clock.now(), [r2], found, "", m2, r2)
    assert res.plan is not None and "one buffer" in res.note and "a node's outputs as one buffer" not in res.note, \
        res.note


def test_a_step_reading_none_of_its_inputs_parts_is_not_cut_as_if_it_held_them():
    # node 5 reads node 0 but none of its parts, all freed by then (simulate(): the no-remat plan
    # peaks at 24 bytes); the knapsack cut at step 5 counted node 0's 11 bytes whole and cut that
    # plan off the parts-aware model at 24 bytes
    p = PlanningProblem.build(size=[11, 10, 3, 11, 1, 1, 10, 3], cost=[2.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 3.0],
                              preds=[[], [0], [0], [1], [1, 3], [0], [1], [4]],
                              pinned=[False, False, True, False, False, False, True, True],
                              recomputable=[True, True, False, True, False, False, False, False],
                              scratch=[5, 4, 0, 0, 0, 0, 0, 0],
                              parts=[[(4, []), (6, [1]), (1, [1, 2])], [], [], [(7, []), (4, [4])], [], [], [], []])
    plan = no_remat(p)
    assert simulate(p, plan).peak_bytes == 24
    model = RematModel(p, 24, ONE, [plan], parts=True)
    values = model.hint_from_plan(plan)
    assert values is not None and feasible_as_hinted(model, values)
