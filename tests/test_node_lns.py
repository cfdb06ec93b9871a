"""The node-set neighbourhood search on phase 2's model (planner/node_lns.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from planner import clock
from planner.cpsat import PhaseResult, PlannerOptions, RematModel
from planner.node_lns import node_lns
from planner.order_bound import closure_bound
from planner.simulate import simulate
from tests.helpers import memory_ordered_with_greedy

ONE = PlannerOptions(time_limit=10, workers=1, seed=0)


@pytest.fixture(scope="module")
def rl100_70(benchmarks_dir):
    """RL100 at 70% in its memory-aware order, the greedy's plan there (+4.77%) and the proven
    optimum's objective (the closure bound's value, which a plan reaches: test_closure_guided)."""
    q, budget, start = memory_ordered_with_greedy(benchmarks_dir, 100, 0.7)
    m2 = model(q, budget, start.plan)
    bound = closure_bound(q, budget, m2.obj_cost, time_limit=20)
    assert bound is not None and bound.exact
    return q, budget, start, bound.value


def model(q, budget, plan) -> RematModel:
    """Phase 2's model hinted with ``plan``, as planning._solve_cpsat builds it."""
    m2 = RematModel(q, budget, ONE, [plan])
    m2.set_objective_time()
    m2.apply_hint(m2.hint_from_plan(plan))
    return m2


def start_of(m2: RematModel, cand) -> PhaseResult:
    return PhaseResult("optimize", "FEASIBLE", 0.0, m2.objective_of_counts(cand.sim.compute_counts), None,
                       cand.plan, None)


def search(q, budget, cand, **kw):
    """node_lns on the work clock (deterministic), from ``cand``'s plan, in a fresh model."""
    m2 = model(q, budget, cand.plan)
    args = dict(time_limit=3.0, step_work=0.5, size=12, seed=0) | kw
    with clock.work_clock():
        return m2, node_lns(m2, start_of(m2, cand), **args)


def test_it_finds_cheaper_plans_that_replay_within_budget(rl100_70):
    q, budget, start, optimum = rl100_70
    m2, found = search(q, budget, start)
    r2 = start_of(m2, start)
    assert found is not None and found.name == "node-lns" and found.plan is not None
    assert optimum <= found.objective < r2.objective
    sim = simulate(q, found.plan, budget)  # raises over budget
    assert m2.objective_of_counts(sim.compute_counts) == found.objective
    assert found.plan.recomputed(q.n) == [i for i, c in enumerate(sim.compute_counts) if c > 1]
    # proven optimal over the model (every node in one neighbourhood): the bound is the plan's
    assert found.bound == (found.objective if found.status == "OPTIMAL" else None)


def test_the_same_seed_gives_the_same_plan_on_the_work_clock(rl100_70):
    q, budget, start, _ = rl100_70
    _, a = search(q, budget, start, time_limit=1.5)
    _, b = search(q, budget, start, time_limit=1.5)
    assert a.plan == b.plan and a.objective == b.objective


def test_a_neighbourhood_of_every_node_proves_the_optimum(rl100_70):
    q, budget, start, optimum = rl100_70
    _, first = search(q, budget, start, time_limit=20.0, size=q.n)  # every node at once: phase 2 itself
    assert first.objective == optimum and first.status == "OPTIMAL"
    best = replace(start, plan=first.plan, sim=simulate(q, first.plan, budget))
    m2, again = search(q, budget, best, size=q.n)
    # nothing is cheaper than the optimum: its plan comes back, proven
    assert again.status == "OPTIMAL" and again.plan == first.plan and again.objective == again.bound == optimum


def test_nothing_to_search_without_a_plan_or_time(rl100_70):
    q, budget, start, _ = rl100_70
    m2 = model(q, budget, start.plan)
    r2 = start_of(m2, start)
    assert node_lns(m2, replace(r2, plan=None, objective=None), 5, 1, 12, 0) is None
    assert node_lns(m2, r2, 0.0, 1, 12, 0) is None


def test_it_hands_back_after_patience_steps_without_a_cheaper_plan(rl100_70, monkeypatch):
    q, budget, start, _ = rl100_70
    m2 = model(q, budget, start.plan)
    r2 = start_of(m2, start)
    calls = []

    def nothing_found(name, time_limit, stop_at=None, model=None, work=None):
        calls.append((time_limit, work))
        return PhaseResult(name, "UNKNOWN", 0.0, None, None, None, None)

    monkeypatch.setattr(m2, "solve", nothing_found)
    found = node_lns(m2, r2, 1e6, 0.25, 12, 0, patience=3)
    # three steps, each capped at the step's deterministic seconds, then the best plan comes back
    assert len(calls) == 3 and all(work == 0.25 for _, work in calls)
    assert found.plan is r2.plan and found.status == "UNKNOWN" and found.bound is None


def test_a_restricted_copy_carries_no_hint(rl100_70):
    """The incumbent breaks a restricted copy's objective cut; with it as a complete hint, CP-SAT
    9.15's deterministic parallel search aborts the process (the next test)."""
    q, budget, start, _ = rl100_70
    m2 = model(q, budget, start.plan)
    assert len(m2.m.Proto().solution_hint.vars) > 0
    sub = m2.restricted(start.plan.recomputed(q.n)[:3], 10**9)
    assert len(sub.Proto().solution_hint.vars) == 0
    assert len(m2.m.Proto().solution_hint.vars) > 0  # the model itself keeps its hint


def test_a_deterministic_two_worker_plan_whose_neighbourhood_is_infeasible_does_not_abort():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    # before the fix: "Check failed: heuristics.fixed_search != nullptr", SIGABRT, in node-lns
    proc = subprocess.run([sys.executable, "-m", "cli", "plan", "zoo:gpt?batch=64", "--budget", "5826738",
                           "--device", "cpu", "--deterministic", "--time-limit", "5", "--workers", "2"],
                          cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "cpsat optimal" in proc.stdout
