"""Tight-budget eviction greedy (planner/tight_greedy.py): it finds plans where the other greedies
find none (two small graphs, and RL100 of the remat benchmark at 60%), every plan it returns
replays within its budget, and greedy() keeps the cheapest fitting plan of all the greedies.
Validity via the simulator, no timings."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from planner.baselines import greedy
from planner.chain_greedy import checkpoint_greedy
from planner.greedy import evict_greedy, split_greedy
from planner.cpsat import PlannerOptions, RematModel
from planner.plan import Plan
from planner.problem import PlanningProblem
from planner.simulate import simulate
from planner import clock
from planner.tight_greedy import STEP_SECONDS, VARIANTS, evict_run, long_run, tight_greedy
from tests.helpers import random_layered
from tests.test_chain_greedy import layered



def fan_in() -> PlanningProblem:
    """A chain 0 -> 1 -> 2 -> 3 and a side branch 0 -> 4; step 5 reads 1, 2 and 4.

    At the least peak (7 bytes: step 5 holds 1, 2, 4 and its own output) the buffers of the chain
    must be dropped around step 3 and made again in the right order: 4 from a recomputed 0,
    then 1 from 0 again, 0 freed, 2 from 1. evict_greedy locks what step 5 already holds while
    it recomputes the rest, and gets stuck."""
    return PlanningProblem.build(size=[3, 2, 2, 4, 2, 1], cost=[1.0] * 6,
                                 preds=[[], [0], [1], [2], [0], [1, 2, 4]], name="fan_in")


def two_chains() -> PlanningProblem:
    """Step 6 reads 2 (via 0 -> 1 -> 2) and 4 (via 0 -> 3 -> 4); 3 is big and 5 reads it too."""
    return PlanningProblem.build(size=[3, 1, 2, 4, 3, 1, 2], cost=[1.0] * 7,
                                 preds=[[], [0], [1], [0, 1], [3], [3], [2, 4]], name="two_chains")


def others_fit(p: PlanningProblem, budget: int) -> bool:
    for make in (evict_greedy, split_greedy, checkpoint_greedy):
        plan = make(p, budget)
        if plan is not None and simulate(p, plan).peak_bytes <= budget:
            return True
    return False


@pytest.mark.parametrize("build", [fan_in, two_chains])
def test_small_graphs_at_the_least_peak(build):
    p = build()
    budget = p.memory_floor  # the lower bound is reached: nothing below it can fit
    assert not others_fit(p, budget), "premise: the older greedies find no plan here"
    plan = tight_greedy(p, budget)
    assert plan is not None
    sim = simulate(p, plan, budget)  # raises on an invalid plan or one over the budget
    assert sim.peak_bytes <= budget
    assert sim.recomputes > 0
    best = greedy(p, budget)
    assert best is not None and best.sim.peak_bytes <= budget


def test_rl100_at_60_percent(benchmarks_dir):
    p = random_layered(benchmarks_dir, 100)
    budget = p.budget_for(0.6)
    plan = tight_greedy(p, budget)
    assert plan is not None
    sim = simulate(p, plan, budget)
    assert sim.peak_bytes <= budget
    best = greedy(p, budget)
    assert best is not None and best.sim.added_time <= sim.added_time


def test_no_remat_needed_costs_nothing():
    p = two_chains()
    plan = tight_greedy(p, p.unplanned_peak)
    assert plan is not None
    assert simulate(p, plan, p.unplanned_peak).added_time == 0


def test_below_the_least_peak_there_is_no_plan():
    p = fan_in()
    assert tight_greedy(p, p.memory_floor - 1) is None


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=layered(max_n=20), frac=st.floats(0.3, 1.0), which=st.integers(0, len(VARIANTS) - 1),
       frozen=st.integers(-1, 19))
def test_every_plan_replays_within_budget(p, frac, which, frozen):
    if 0 <= frozen < p.n:  # one node that may not be recomputed (a random op)
        recomputable = p.recomputable.copy()
        recomputable[frozen] = False
        p = dataclasses.replace(p, recomputable=recomputable)
    budget = max(p.memory_floor, int(frac * p.unplanned_peak))
    plan = evict_run(p, budget, VARIANTS[which])
    if plan is not None:
        assert simulate(p, plan, budget).peak_bytes <= budget
    best = tight_greedy(p, budget)
    if best is not None:
        assert simulate(p, best, budget).peak_bytes <= budget
    for other in (evict_greedy(p, budget), split_greedy(p, budget), checkpoint_greedy(p, budget)):
        if other is not None:  # simulate() refuses a second compute of the frozen node
            assert simulate(p, other, budget).peak_bytes <= budget
    if budget >= p.unplanned_peak:
        assert best is not None  # no remat needed: the executor never gets stuck


def test_greedies_start_no_work_after_their_deadline():
    # the solve's time limit reaches the baselines through this deadline (PlannerOptions.baseline_share)
    import time

    preds = [[], [0], [1], [2], [3], [2, 4], [1, 5], [0, 6]]
    p = PlanningProblem.build(size=[10] * 8, cost=[1] * 8, preds=preds)
    budget = p.budget_for(0.8)
    past = time.perf_counter() - 1
    assert greedy(p, budget) is not None and evict_greedy(p, budget) is not None
    assert greedy(p, budget, past) is None
    assert evict_greedy(p, budget, deadline=past) is None and tight_greedy(p, budget, deadline=past) is None


def test_the_long_run_stops_at_its_deadline_on_either_clock():
    # far_readers(8) at 65 B (tests/test_least.py): the long run (the solve's last resort) finds a
    # plan; it gives up past its deadline, on the wall clock and on the work clock, where each
    # basic step (an event, a buffer weighed) costs STEP_SECONDS
    import time

    from tests.test_least import far_readers

    p, budget = far_readers(8), 65
    plan, sim = long_run(p, budget)
    assert sim.peak_bytes <= budget and simulate(p, plan, budget).added_time == sim.added_time
    assert long_run(p, budget, time.perf_counter() - 1) is None
    with clock.work_clock():
        again = long_run(p, budget, clock.now() + 1e6)
        spent = clock.now()
    assert again is not None and again[0] == plan  # the same run, charged per event
    assert len(plan.events) * STEP_SECONDS <= spent <= 100 * len(plan.events) * STEP_SECONDS
    with clock.work_clock():
        assert long_run(p, budget, clock.now() + 0.5 * spent) is None


def test_split_greedy_counts_the_workspace_of_a_recompute():
    """Buffers 1 and 2 are both held across the peak at steps 3-4 and read again at step 5.
    Dropping 1 is cheaper, but recomputing it before step 5 needs its 7-byte workspace next to
    what step 5 holds: 17 bytes, over the budget of 12. The split greedy's step accounting must
    count that workspace and drop 2 instead (before, it dropped 1 and its replay refused the plan)."""
    p = PlanningProblem.build(size=[1, 4, 4, 6, 1, 1], cost=[1.0, 1.0, 2.0, 1.0, 1.0, 1.0],
                              preds=[[], [0], [0], [0], [3], [1, 2, 4]], scratch=[0, 7, 0, 0, 0, 0])
    budget = 12
    assert p.unplanned_peak == 15
    plan = split_greedy(p, budget)
    assert plan is not None
    sim = simulate(p, plan, budget)
    assert sim.peak_bytes <= budget
    counts = plan.counts(p.n)["compute"]
    assert list(counts) == [1, 1, 2, 1, 1, 1]  # 2 recomputed, 1 kept


def test_split_greedy_picks_the_cheapest_move_with_its_chain():
    """Buffers 2 (A, 10 bytes, cost 1) and 3 (B, 10 bytes, cost 5) are held across the peak at
    step 5 and read again at step 6. Per byte A is the cheaper buffer, but its input 1 (cost 100)
    is gone by then and must be made again too: 101 for A against 5 for B. The split greedy
    ranks moves by cost per byte before resolving their chains (planner/greedy.py): it must still
    drop B, the cheapest move once A's chain is counted."""
    p = PlanningProblem.build(size=[1, 1, 10, 10, 20, 1, 1], cost=[1.0, 100.0, 1.0, 5.0, 1.0, 1.0, 1.0],
                              preds=[[], [0], [1], [0], [0], [4], [0, 2, 3, 5]])
    assert p.unplanned_peak == 42
    budget = 32
    plan = split_greedy(p, budget)
    assert plan is not None
    sim = simulate(p, plan, budget)
    assert sim.peak_bytes <= budget
    assert list(plan.counts(p.n)["compute"]) == [1, 1, 1, 2, 1, 1, 1]  # B again, not A and its input
    assert sim.added_time == 5.0


def test_without_unread_drops_recomputes_nothing_reads():
    """The second copy of node 1 is recomputed and freed unread, and the second copy of node 0
    is read by it only: both go, with their frees; the original computes and the third copies,
    which node 3 reads, stay. The plan replays no higher and cheaper, and a CP-SAT hint from it
    is the same as from the pruned plan (the model holds no recompute nobody reads, so the raw
    plan as a hint was infeasible)."""
    p = PlanningProblem.build(size=[2, 2, 1, 1], cost=[1.0, 2.0, 1.0, 1.0],
                              preds=[[], [0], [0], [1, 2]], pinned=[False, False, False, True])
    kept = [("compute", 0), ("compute", 1), ("compute", 2), ("free", 0), ("free", 1)]
    tail = [("compute", 0), ("compute", 1), ("free", 0), ("compute", 3), ("free", 1), ("free", 2)]
    raw = Plan.of(kept + [("compute", 0), ("compute", 1), ("free", 0), ("free", 1)] + tail, "test")
    pruned = raw.without_unread(p)
    assert [(e.op, e.node) for e in pruned.events] == kept + tail
    before, after = simulate(p, raw), simulate(p, pruned)
    assert after.added_time == 3.0 < before.added_time == 6.0
    assert after.peak_bytes <= before.peak_bytes
    assert pruned.without_unread(p) is pruned  # nothing left to drop: the same plan
    model = RematModel(p, 8, PlannerOptions(max_computations=4), [raw])
    assert model.hint_from_plan(raw) == model.hint_from_plan(pruned)
