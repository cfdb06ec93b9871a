"""Planner: problem loading, simulator, baselines, CP-SAT (recompute and swap), plan JSON, CLI.

Solver tests use 1 worker and a fixed seed and assert validity and objective, never a specific
assignment. Performance numbers live in ``memplan bench remat``, not here.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import cli
from planner.baselines import chen_sqrt, greedy, no_remat
from planner.cpsat import PlannerOptions
from planner.errors import UsageError
from planner.explain import explain
from planner.plan import Plan, plan_from_json
from planner.planning import least_peak, solve
from planner.problem import PlanningProblem, load_remat_json
from planner.simulate import InvalidPlanError, simulate

ROOT = Path(__file__).resolve().parents[1]
ONE = PlannerOptions(time_limit=10, workers=1, seed=0)


def remat(benchmarks_dir: Path, prefix: str) -> Path:
    hits = sorted(p for p in (benchmarks_dir / "remat").glob("*.json") if p.name.startswith(prefix))
    assert hits, prefix
    return hits[0]


def chain(n: int, size: int = 10, cost: float = 1.0) -> PlanningProblem:
    """Forward chain f0..f(n-1), loss, backward b(n-1)..b0 (b_i reads f_i and b_(i+1))."""
    preds: list[list[int]] = [[i - 1] if i else [] for i in range(n)]
    preds.append([n - 1])  # loss
    for i in range(n - 1, -1, -1):
        prev_grad = len(preds) - 1
        preds.append([i, prev_grad])
    m = len(preds)
    return PlanningProblem.build(size=[size] * m, cost=[cost] * m, preds=preds, name=f"chain{n}")


def check_result(problem: PlanningProblem, res, budget: int) -> None:
    """Every returned plan replays within the budget and matches its reported figures."""
    assert res.plan is not None, res.note
    sim = simulate(problem, res.plan, budget)
    assert sim.peak_bytes == res.peak_bytes <= budget
    assert sim.added_time == pytest.approx(res.added_time)


# ---- problem ---------------------------------------------------------------------------------
def _readme_rows(benchmarks_dir: Path) -> dict[str, tuple[int, int, int]]:
    text = (benchmarks_dir / "remat" / "README.md").read_text()
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `(.+\.json)` \|(.*)\|\s*$", line)
        if m:
            cells = [c.strip() for c in m.group(2).split("|")]
            rows[m.group(1)] = (int(cells[-3]), int(cells[-2]), int(cells[-1]))
    return rows


def test_unplanned_peak_matches_readme_for_all_18_graphs(benchmarks_dir):
    rows = _readme_rows(benchmarks_dir)
    assert len(rows) == 18
    for name, (peak, b90, b80) in rows.items():
        p = load_remat_json(benchmarks_dir / "remat" / name)
        assert p.base_bytes == 0 and not p.scratch.any()
        assert p.unplanned_peak == peak, name
        assert (p.budget_for(0.9), p.budget_for(0.8)) == (b90, b80), name
        sim = simulate(p, no_remat(p))
        assert sim.peak_bytes == peak and sim.added_time == 0


def test_build_rejects_edges_against_the_order():
    with pytest.raises(Exception, match="earlier in the schedule"):
        PlanningProblem.build(size=[1, 1], cost=[1, 1], preds=[[1], []])


def _arrays(p: PlanningProblem) -> dict[str, np.ndarray]:
    return {f.name: getattr(p, f.name) for f in fields(p) if isinstance(getattr(p, f.name), np.ndarray)}


def test_a_problems_arrays_cannot_be_written_under_its_cached_values():
    """The problem caches values of its arrays (unplanned_peak, memory_floor, ...), yet build()
    left recomputable and swappable writable, and a problem made directly or by
    dataclasses.replace kept the caller's writable arrays: a write into size left unplanned_peak
    at its old value. Now every array is read-only, and the caller's own arrays stay theirs."""
    built = chain(3).with_swap(np.ones(chain(3).n))
    assert _arrays(built) and not any(a.flags.writeable for a in _arrays(built).values())
    size = np.array([4, 4, 1])
    direct = PlanningProblem(
        name="direct", names=("a", "b", "c"), node_ids=(0, 1, 2), size=size, cost=np.ones(3),
        pred_ptr=np.array([0, 0, 1, 3]), pred_idx=np.array([0, 0, 1]), base_bytes=0, scratch=np.zeros(3, np.int64),
        pinned=np.zeros(3, bool), recomputable=np.ones(3, bool), swappable=np.zeros(3, bool))
    assert direct.unplanned_peak == 9
    assert not any(a.flags.writeable for a in _arrays(direct).values())
    with pytest.raises(ValueError, match="read-only"):
        direct.size[1] = 40
    size[1] = 40  # the caller's array: still writable, and no longer the problem's
    assert direct.unplanned_peak == 9 == replace(direct).unplanned_peak
    swapped = replace(direct, swappable=np.ones(3, bool), transfer=np.ones(3))
    assert not any(a.flags.writeable for a in _arrays(swapped).values())


def test_bad_json_is_a_model_error(tmp_path):
    bad = tmp_path / "g.json"
    bad.write_text('{"nodes": [{"id": 0}], "links": []}')
    res = CliRunner().invoke(cli.main, ["plan", str(bad), "--budget", "50%"])
    assert res.exit_code == 3
    assert "node-link" in res.output and "Traceback" not in res.output


# ---- simulator --------------------------------------------------------------------------------
def test_simulator_rejects_broken_plans():
    p = chain(2)  # nodes: f0 f1 loss b1 b0
    ok = no_remat(p)
    assert simulate(p, ok).peak_bytes == p.unplanned_peak
    cases = {
        "input node 0 is not resident": [("compute", 1)],
        "double free": [("compute", 0), ("free", 0), ("free", 0)],
        "still resident": [("compute", 0), ("compute", 0)],
        "no host copy": [("compute", 0), ("free", 0), ("swap_in", 0)],
        "never computes": [("compute", 0), ("free", 0)],
    }
    for msg, events in cases.items():
        with pytest.raises(InvalidPlanError, match=msg):
            simulate(p.with_swap(np.ones(p.n)), Plan.of(events, "bad"))
    with pytest.raises(InvalidPlanError, match="cannot be swapped"):
        simulate(p, Plan.of([("compute", 0), ("swap_out", 0)], "no link"))
    with pytest.raises(InvalidPlanError, match="over the budget"):
        simulate(p, ok, budget=p.unplanned_peak - 1)
    leak = Plan.of([e for e in ((ev.op, ev.node) for ev in ok.events) if e != ("free", 4)], "leak")
    with pytest.raises(InvalidPlanError, match="never frees"):
        simulate(p, leak)


def test_simulator_counts_a_nodes_scratch_while_it_runs_and_not_after():
    # a (10 B) -> b (20 B, 7 B scratch) -> c (5 B): b's step holds a + b + its scratch
    p = PlanningProblem.build(size=[10, 20, 5], cost=[1, 1, 1], preds=[[], [0], [1]], scratch=[0, 7, 0], base_bytes=3,
                              pinned=[False, False, True])
    sim = simulate(p, Plan.of([("compute", 0), ("compute", 1), ("free", 0), ("compute", 2), ("free", 1)], "s"))
    assert [int(m) for m in sim.memory] == [13, 40, 23, 28, 8]
    assert sim.peak_bytes == 40 == p.unplanned_peak and sim.peak_event == 1
    with pytest.raises(InvalidPlanError, match="over the budget"):
        simulate(p, Plan.of([("compute", 0), ("compute", 1), ("free", 0), ("compute", 2), ("free", 1)], "s"), budget=39)


def test_simulator_times_swaps_with_and_without_overlap():
    # x -> A; x -> c -> d (long); out reads A and d. A goes to host during c and back during d.
    base = PlanningProblem.build(size=[1, 100, 1, 1, 1], cost=[1, 1, 10, 10, 1], preds=[[], [0], [0], [2], [1, 3]])
    events = [("compute", 0), ("compute", 1), ("compute", 2), ("swap_out", 1), ("free", 0), ("swap_in", 1),
              ("compute", 3), ("free", 2), ("compute", 4), ("free", 1), ("free", 3), ("free", 4)]
    hidden = simulate(base.with_swap([0, 4, 0, 0, 0], copy_overlap=True), Plan.of(events, "swap"))
    assert hidden.swap_ins == 1 and hidden.added_time == pytest.approx(0.0)
    # without copy engines both 4-unit transfers block the compute stream
    blocked = simulate(base.with_swap([0, 4, 0, 0, 0], copy_overlap=False), Plan.of(events, "swap"))
    assert blocked.added_time == pytest.approx(8.0)
    # a swap-out listed before c frees A before c allocates: c waits for the copy
    early = [events[0], events[1], events[3], events[2], *events[4:]]
    assert simulate(base.with_swap([0, 4, 0, 0, 0]), Plan.of(early, "swap")).added_time == pytest.approx(4.0)


def test_simulator_starts_a_second_swap_out_when_the_swap_in_before_it_ends():
    # x -> A -> b; x -> c -> d (long); out reads A and d. A goes out and back in for b (2-6, 6-10),
    # then out again for c: that copy reads the swapped-in A, so it runs 10-14 and c, listed after
    # it, starts at 14. It was started at 2 (when A was first computed), as if already done by 11.
    p = PlanningProblem.build(size=[1, 100, 1, 1, 1, 1], cost=[1, 1, 1, 10, 10, 1],
                              preds=[[], [0], [1], [0], [3], [1, 4]], names=["x", "A", "b", "c", "d", "out"])
    p = p.with_swap([0, 4, 0, 0, 0, 0])
    events = [("compute", 0), ("compute", 1), ("swap_out", 1), ("swap_in", 1), ("compute", 2), ("free", 2),
              ("swap_out", 1), ("compute", 3), ("free", 0), ("swap_in", 1), ("compute", 4), ("free", 3),
              ("compute", 5), ("free", 1), ("free", 4), ("free", 5)]
    sim = simulate(p, Plan.of(events, "out twice"))
    assert sim.swap_ins == 2 and sim.makespan == pytest.approx(35.0) and sim.added_time == pytest.approx(11.0)
    # keeping A through b and swapping it once costs the 3 of b's wait only
    once = events[:2] + events[4:]
    assert simulate(p, Plan.of(once, "out once")).added_time == pytest.approx(3.0)


# ---- baselines and CP-SAT ------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["none", "chen", "greedy", "cpsat"])
@pytest.mark.parametrize("n,frac", [(4, 1.0), (6, 0.7), (8, 0.6)])
def test_every_strategy_returns_a_valid_plan_or_says_why(strategy, n, frac):
    p = chain(n)
    budget = p.budget_for(frac)
    res = solve(p, budget, strategy, ONE)
    if res.plan is None:
        assert res.status in ("over_budget", "infeasible", "timeout")
        assert strategy != "cpsat" or res.status == "infeasible" or res.note
        return
    check_result(p, res, budget)
    if frac >= 1.0 and strategy != "chen":  # Chen's checkpoints ignore the budget
        assert res.added_time == 0


def test_solve_called_from_python_takes_whole_bytes_and_names_bad_input():
    """planner.planning.solve from Python: a numpy integer budget came back as the result's
    budget_bytes (np.int64: json.dumps of to_json refused it), a fractional one failed in ortools
    with a TypeError, and an unknown strategy raised a ValueError outside memplan's errors."""
    p = chain(6)
    budget = p.budget_for(0.7)
    res = solve(p, np.int64(budget), "cpsat", ONE)
    check_result(p, res, budget)
    assert type(res.budget_bytes) is int and json.dumps(res.to_json(p))
    with pytest.raises(UsageError, match=r"budget must be a whole number of bytes.*got"):
        solve(p, budget + 0.5, "cpsat", ONE)
    with pytest.raises(UsageError, match=r"unknown strategy 'bogus'; expected one of cpsat"):
        solve(p, budget, "bogus", ONE)


@pytest.mark.parametrize("n,frac", [(8, 0.7), (10, 0.55)])
def test_cpsat_never_costs_more_than_a_fitting_baseline(n, frac):
    p = chain(n)
    budget = p.budget_for(frac)
    res = solve(p, budget, "cpsat", ONE)
    check_result(p, res, budget)
    assert res.status == "optimal" and res.solver.gap == 0
    for plan in (chen_sqrt(p),):
        sim = simulate(p, plan)
        if sim.peak_bytes <= budget:
            assert res.added_time <= sim.added_time
    g = greedy(p, budget)
    if g is not None:
        assert res.added_time <= g.sim.added_time


@pytest.mark.parametrize("prefix,fracs", [("VGG16 (MLSys)_256_(224, 224, 3)_train", (0.9, 0.85)),
                                          ("random_layered_n100_", (0.95, 0.9))])
def test_benchmark_graphs_plan_within_budget(benchmarks_dir, prefix, fracs):
    p = load_remat_json(remat(benchmarks_dir, prefix))
    for frac in fracs:
        budget = p.budget_for(frac)
        res = solve(p, budget, "cpsat", PlannerOptions(time_limit=8, workers=1, seed=0))
        check_result(p, res, budget)
        for base in ("greedy", "chen"):
            b = solve(p, budget, base, ONE)
            if b.plan is not None:
                assert res.added_time <= b.added_time
        assert res.solver.bound is not None and res.solver.bound <= res.added_time + 1e-9


def test_budget_below_floor_is_infeasible_with_the_least_memory(benchmarks_dir):
    p = load_remat_json(remat(benchmarks_dir, "VGG16 (MLSys)_256_(224, 224, 3)_train"))
    budget = p.budget_for(0.7)
    res = solve(p, budget, "cpsat", ONE)
    assert res.status == "infeasible" and res.plan is None
    assert res.least_exact and res.least_bytes == p.memory_floor > budget
    lower, upper, exact = least_peak(p, ONE)
    assert exact and lower == upper == p.memory_floor
    # and the least memory is reachable: a plan at exactly that budget exists
    check_result(p, solve(p, p.memory_floor, "cpsat", ONE), p.memory_floor)


@pytest.mark.parametrize("workers", [0, -3, 1.5, "2", True])
def test_planner_options_refuse_a_worker_count_that_is_not_a_whole_number_from_1(workers):
    """PlannerOptions(workers=0) planned (CP-SAT reads 0 as every core; the model ran 1) and the
    plan said workers 0, as it said -3 or 1.5: the same-plan promise named no real count. The CLI's
    --workers takes 1 and up; so do the options now."""
    with pytest.raises(UsageError, match=rf"workers must be a whole number >= 1 .*got {re.escape(repr(workers))}"):
        PlannerOptions(workers=workers)
    with pytest.raises(UsageError, match="workers must be"):
        replace(ONE, workers=workers)
    assert PlannerOptions(workers=np.int64(3)).workers == 3


def test_same_input_seed_and_workers_give_the_same_plan():
    rng = np.random.default_rng(3)
    n = 14
    preds = [sorted({int(x) for x in rng.integers(0, i, size=2)}) if i else [] for i in range(n)]
    p = PlanningProblem.build(size=rng.integers(1, 20, n), cost=rng.integers(1, 9, n), preds=preds)
    opts = PlannerOptions(time_limit=20, workers=2, seed=7)
    # 0.55: remat is needed in every order (the least unplanned peak of any order is 63 of 110
    # bytes, planner.reorder.least_peak_order); 0.75 in the given order only
    for budget, o in ((p.budget_for(0.55), opts), (p.budget_for(0.75), replace(opts, reorder=False))):
        a, b = solve(p, budget, "cpsat", o), solve(p, budget, "cpsat", o)
        assert a.plan is not None and a.status == "optimal" and a.added_time > 0
        assert a.plan.events == b.plan.events and a.added_time == b.added_time


# ---- swap versus recompute ----------------------------------------------------------------------
#: The swap-or-recompute graphs below decide in their given order: in a memory-aware order
#: (planner/reorder.py) A is computed just before its reader and needs neither.
FIXED = replace(ONE, reorder=False)


def swap_graph(bandwidth: float, overlap: bool) -> PlanningProblem:
    """A (100 B) is read again only at the end; c2 -> c3 -> c4 run long in between and the peak
    forces A out during c3. Recompute A costs 10; a transfer takes 100 / bandwidth each way."""
    p = PlanningProblem.build(
        size=[1, 100, 50, 50, 1, 1], cost=[1, 10, 10, 10, 10, 1],
        preds=[[], [0], [0], [2], [3], [1, 4]], names=["x", "A", "c2", "c3", "c4", "out"])
    return p.with_swap(p.size / bandwidth, copy_overlap=overlap)


def test_swap_when_the_transfer_hides_behind_compute():
    p = swap_graph(bandwidth=20.0, overlap=True)  # 5 per transfer, under the 10 of c2 and of c4
    res = solve(p, 160, "cpsat", FIXED)
    check_result(p, res, 160)
    counts = res.plan.counts(p.n)
    assert counts["swap_in"][1] == 1 and counts["compute"][1] == 1
    assert res.added_time == pytest.approx(0.0, abs=1e-6)


def test_recompute_when_the_transfer_cannot_hide():
    for p in (swap_graph(bandwidth=2.0, overlap=True), swap_graph(bandwidth=10.0, overlap=False)):
        res = solve(p, 160, "cpsat", FIXED)
        check_result(p, res, 160)
        counts = res.plan.counts(p.n)
        assert counts["compute"][1] == 2 and counts["swap_in"][1] == 0
        assert res.added_time == pytest.approx(10.0)


def recompute_or_swap_back_graph() -> PlanningProblem:
    """A (100 B, cost 5, transfer 4) is read by b and by out. The scratch of c and of d1 (50 B)
    leaves no room for A beside them at 140 B; e and d2 (no scratch) can hide A's copies. Every
    other transfer (100) is dearer than anything it could save."""
    p = PlanningProblem.build(size=[1, 100, 1, 1, 1, 1, 1, 1], cost=[1, 5, 5, 6, 1, 10, 10, 1],
                              scratch=[0, 0, 0, 50, 0, 50, 0, 0],
                              preds=[[], [0], [0], [2], [1, 3], [4], [5], [1, 6]],
                              names=["x", "A", "e", "c", "b", "d1", "d2", "out"])
    return p.with_swap([100, 4, 100, 100, 100, 100, 100, 100])


#: A plan of recompute_or_swap_back_graph at 140 B: A recomputed for b and again for out (+10).
RECOMPUTE_A_TWICE = Plan.of([("compute", 0), ("compute", 1), ("compute", 2), ("free", 1), ("compute", 3), ("free", 2),
                             ("compute", 1), ("compute", 4), ("free", 1), ("free", 3), ("compute", 5), ("free", 4),
                             ("compute", 6), ("free", 5), ("compute", 1), ("free", 0), ("compute", 7), ("free", 1),
                             ("free", 6), ("free", 7)], "recompute A twice")


def test_the_swap_model_holds_a_recompute_only_plan_that_delays_later_steps():
    # A recomputed for b and again for out: every step after the first recompute starts 5 later
    # than back to back. The model tied an original's swap-out start to its compute end even when
    # the swap was off (pinned to the earliest start then): a delayed step had to be swapped out,
    # so the plan hinted infeasible ("solution hint is complete, but it is infeasible") and the
    # swap solve of this 8-node problem found no plan in 5 s.
    from planner.cpsat import RematModel

    p = recompute_or_swap_back_graph()
    plan = RECOMPUTE_A_TWICE
    assert simulate(p, plan, 140).added_time == pytest.approx(10.0)
    opts = replace(FIXED, solver_params=(("fix_variables_to_their_hinted_value", True),))
    model = RematModel(p, 140, opts, [plan])
    model.set_objective_time()
    values = model.hint_from_plan(plan)
    assert values is not None
    model.apply_hint(values)
    res = model.solve("hinted", 10)
    assert res.status == "OPTIMAL" and res.plan is not None
    assert simulate(p, res.plan, 140).added_time == pytest.approx(10.0)


def test_a_swap_plan_with_a_recompute_before_its_swap_in_replays_at_the_models_time():
    # The model's best plan: A copied to host during e, recomputed for b (5), back from host
    # during d2 for out (hidden). The decode ended the recompute's residency in the swap-out (a
    # second copy, after b, that d1 waited for): simulated +8.0 against the model's +5.0. That is
    # the best plan bringing A back once; with two swap-ins A comes back for b too (+4).
    from planner.cpsat import RematModel

    p = recompute_or_swap_back_graph()
    for swap_ins, added, recomputes in ((1, 5.0, 1), (2, 4.0, 0)):
        model = RematModel(p, 140, replace(FIXED, max_swap_ins=swap_ins), [RECOMPUTE_A_TWICE])
        model.set_objective_time()
        model.apply_hint(model.hint_from_plan(RECOMPUTE_A_TWICE))
        res = model.solve("optimize", 10)
        assert res.status == "OPTIMAL" and res.plan is not None
        sim = simulate(p, res.plan, 140)
        assert model.time_of_objective(res.objective) == pytest.approx(added, abs=model.tick)
        assert sim.added_time == pytest.approx(added) and sim.swap_ins == swap_ins and sim.recomputes == recomputes


def test_a_swap_bound_on_the_tick_axis_never_exceeds_a_plan_the_model_holds():
    """The timed model rounds each copy up to whole ticks: chain(20) with pi-unit copies in line
    gets 767-tick copies of 0.0041 each, so the eight-swap plan (+16 pi = 50.27 in real time) is
    12272 ticks, 50.32 converted. A solver bound of that many ticks is a proof of at most +16 pi,
    not more; where ticks are exact (chain(12): 10-unit ops and copies, one tick each) nothing is
    given back."""
    from planner.cpsat import RematModel
    p = chain(20, cost=10.0).with_swap([math.pi] * 41, copy_overlap=False)
    m = RematModel(p, 140, PlannerOptions(time_limit=1, workers=1, seed=0))
    ticks = 8 * 2 * int(m.tr[0])
    assert m.time_of_objective(ticks) > 16 * math.pi  # the rounding this guards against
    assert 16 * math.pi * 0.95 <= m.time_of_bound(ticks) <= 16 * math.pi
    exact = RematModel(chain(12, cost=10.0).with_swap([10.0] * 25, copy_overlap=False), 100,
                       PlannerOptions(time_limit=1, workers=1, seed=0))
    assert exact.time_of_bound(100) == pytest.approx(exact.time_of_objective(100))
    # a cost-0 node lasts one tick where it costs nothing: a tick per instance of it is given back,
    # not one per interval of the model (RL100's two such nodes took its whole swap bound)
    free = chain(12, cost=10.0)
    free = replace(free, cost=np.where(np.arange(free.n) == 3, 0.0, free.cost)).with_swap([10.0] * 25,
                                                                                            copy_overlap=False)
    m = RematModel(free, 100, PlannerOptions(time_limit=1, workers=1, seed=0))
    assert m.dur[3] == 1 and np.allclose(np.delete(m.dur * m.tick, 3), np.delete(free.cost, 3))
    assert m.time_of_bound(1000) == pytest.approx(m.time_of_objective(1000) - m.counts[3] * m.tick)


def test_swap_ticks_are_the_costs_common_unit_where_they_have_one():
    """x -> A (50) -> {b1 after c1 (10), c2 (10)} -> out, 5-unit copies in line, 210 B: A is
    swapped out and back (or recomputed). At 1e5 ticks per run (a tick of 0.00073) the swap model
    alone, with no hint, found no plan in 10 s (UNKNOWN, bound 9.98); every cost and copy is a
    whole number of units, so one tick is one unit now: exact, and solved to the optimum (+60
    bringing A back once, +15 twice) within a small deterministic budget."""
    from planner.cpsat import RematModel, common_unit
    p = PlanningProblem.build(size=[1, 100, 100, 1, 100, 1], cost=[1, 50, 10, 1, 10, 1], scratch=[0, 0, 100, 0, 100, 0],
                              preds=[[], [0], [0], [1, 2], [3], [1, 4]], names=["x", "A", "c1", "b1", "c2", "out"])
    q = p.with_swap([5.0] * p.n, copy_overlap=False)
    for k, added in ((1, 60.0), (2, 15.0)):
        m = RematModel(q, 210, PlannerOptions(workers=1, seed=0, max_swap_ins=k))
        assert m.tick == 1.0 and list(m.dur) == [1, 50, 10, 1, 10, 1]
        m.set_objective_time()
        res = m.solve("exact", 30, work=2.0)
        assert res.status == "OPTIMAL" and res.plan is not None, k
        assert m.time_of_objective(res.objective) == m.time_of_bound(res.bound) == added
        assert simulate(q, res.plan, 210).added_time == pytest.approx(added)
    # bytes over a bandwidth of 2: half units; float seconds, or a unit finer than the axis: none
    assert common_unit(np.array([4.0, 0.0, 7.0, 2.5]), 1e-3) == 0.5
    assert common_unit(np.array([0.6, 0.9, 0.3]), 1e-3) == pytest.approx(0.3)
    assert common_unit(np.array([1.0, math.pi]), 1e-3) is None
    assert common_unit(np.array([1.0, 1.5]), 0.6) is None
    assert common_unit(np.array([0.0, 0.0]), 1e-3) is None


def test_the_swap_solve_proves_its_bound_where_copies_cannot_hide():
    """chain(20) with every op costing 10 and every copy 3 each way, in line with compute: the
    step after the loss holds 220 B, so at 140 B eight 10-B activations must be away from it,
    each by a swap (3 + 3) or a recompute (10): the least added time is 8 * 6 = 48, and the
    bound is 48 too. The model's makespan was tied to its copies only through the no-overlap, so
    CP-SAT's bound stayed at 0 (gap 100%, status feasible after the whole limit)."""
    p = chain(20, cost=10.0)
    p = p.with_swap([3.0] * p.n, copy_overlap=False)
    assert p.unplanned_peak == 220
    res = solve(p, 140, "cpsat", replace(FIXED, time_limit=2, work_limit=True))
    check_result(p, res, 140)
    assert simulate(p, res.plan, 140).swap_ins == 8
    assert res.added_time == pytest.approx(48.0)
    assert (res.status, res.solver.gap) == ("optimal", 0.0)
    assert res.solver.bound == pytest.approx(48.0)


@pytest.mark.parametrize("fraction", [0.8, 0.6])
def test_allowing_swap_never_costs_more_than_recompute_only(fraction):
    # Slow transfers that cannot hide: the swap model starts from the recompute-only plan.
    p = chain(8).with_swap([40.0] * chain(8).n, copy_overlap=False)
    budget = p.budget_for(fraction)
    with_swap = solve(p, budget, "cpsat", ONE)
    recompute_only = solve(p.without_swap(), budget, "cpsat", ONE)
    check_result(p, with_swap, budget)
    assert recompute_only.plan is not None
    assert with_swap.added_time <= recompute_only.added_time + 1e-9


def test_swap_solve_runs_the_whole_recompute_only_solve_first(benchmarks_dir):
    """The recompute-only solve's orders, bounds and early proofs run before the swap solve, in
    its share of the time (planning._swap_after_recompute). Before, only the recompute-only model
    ran, inside each order's swap solve: RL100 at 70%, 3 deterministic seconds, one worker, the
    recompute-only solve's +2.23% (proven in 1.2 s) against +4.77% with a host link."""
    p = load_remat_json(remat(benchmarks_dir, "random_layered_n100_"))
    sp = p.with_swap(p.size / 2.0, copy_overlap=True)
    budget = p.budget_for(0.7)
    opts = PlannerOptions(time_limit=3, workers=1, seed=0, work_limit=True)
    share = replace(opts, time_limit=opts.recompute_first_share * opts.time_limit)
    recompute_only = solve(p, budget, "cpsat", share)
    assert recompute_only.plan is not None
    with_swap = solve(sp, budget, "cpsat", opts)
    check_result(sp, with_swap, budget)
    assert with_swap.added_time <= recompute_only.added_time + 1e-9
    # here the share proves what the whole limit does
    assert with_swap.added_time <= solve(p, budget, "cpsat", opts).added_time + 1e-9


# ---- plan JSON, explain, CLI --------------------------------------------------------------------
def test_plan_json_round_trip_and_explain():
    p = chain(6)
    budget = p.budget_for(0.7)
    res = solve(p, budget, "cpsat", ONE)
    obj = res.to_json(p)
    for key in ("schema", "status", "budget_bytes", "unplanned_peak_bytes", "peak_bytes", "base_bytes",
                "compute_time", "added_time", "solver", "schedule"):
        assert key in obj
    assert obj["schema"] == "memplan.plan/1" and set(obj["solver"]) >= {"wall_s", "bound", "gap", "seed", "workers"}
    again = plan_from_json(json.loads(json.dumps(obj)), p)
    assert again.events == res.plan.events
    entries = explain(p, res.plan, budget)
    counts = res.plan.counts(p.n)["compute"]
    assert [e["decision"].startswith("recompute") for e in entries] == [c > 1 for c in counts]
    assert all(e["why"] for e in entries)


def test_explain_tells_a_recompute_for_a_later_read_from_one_that_feeds_a_chain():
    # s -> a -> big -> m; out reads a and m. a is freed after big and recomputed for out; s was
    # freed too, so it is recomputed only to feed a's recompute.
    p = PlanningProblem.build(size=[1, 10, 100, 1, 1], cost=[1, 2, 5, 1, 1],
                              preds=[[], [0], [1], [2], [1, 3]], names=["s", "a", "big", "m", "out"])
    plan = Plan.of([("compute", 0), ("compute", 1), ("free", 0), ("compute", 2), ("free", 1), ("compute", 3),
                    ("free", 2), ("compute", 0), ("compute", 1), ("free", 0), ("compute", 4), ("free", 1),
                    ("free", 3), ("free", 4)], "hand")
    simulate(p, plan)  # a valid plan
    why = {e["name"]: e["why"] for e in explain(p, plan, 102)}
    assert why["s"].startswith("freed after its reads and recomputed 1x at cost 1 to feed the recompute of a")
    assert why["a"].startswith("freed after its reads and recomputed 1x at cost 2 for later reads: frees 10 B")
    assert why["big"] == "read only by the next step: nothing to free in between"


def test_explain_says_both_when_a_plan_swaps_and_recomputes_one_buffer():
    # A goes to host during c and back for b, then is freed and recomputed for out: its entry
    # said only "swap" (and nothing of the recompute's cost of 10)
    p = PlanningProblem.build(size=[1, 100, 1, 50, 50, 1], cost=[1, 10, 10, 10, 10, 1],
                              preds=[[], [0], [1], [0], [3], [1, 2, 4]], names=["x", "A", "b", "c", "d", "out"])
    p = p.with_swap([0, 4, 0, 0, 0, 0])
    plan = Plan.of([("compute", 0), ("compute", 1), ("swap_out", 1), ("compute", 3), ("swap_in", 1), ("compute", 2),
                    ("free", 1), ("compute", 4), ("free", 3), ("compute", 1), ("compute", 5), ("free", 1),
                    ("free", 2), ("free", 4), ("free", 0), ("free", 5)], "hand")
    sim = simulate(p, plan, 160)
    assert sim.recomputes == 1 and sim.swap_ins == 1
    (a,) = [e for e in explain(p, plan, 160) if e["name"] == "A"]
    assert a["decision"] == "swap + recompute x1"
    assert a["why"].startswith("moved to host and back 1x: frees 100 B")
    assert "transfer 4 each way vs recompute 10" in a["why"] and a["why"].endswith("also recomputed 1x at cost 10")



def test_explain_states_the_cost_of_every_recompute_of_a_swapped_buffer():
    # A to host during c and back for b, then recomputed twice (for e and for out): the reason
    # must give both recomputes' cost (20), not one recompute's (10) beside "2x"
    p = PlanningProblem.build(size=[1, 100, 1, 50, 50, 1, 1], cost=[1, 10, 10, 10, 10, 1, 1],
                              preds=[[], [0], [1], [0], [3], [1, 4], [1, 2, 5]],
                              names=["x", "A", "b", "c", "d", "e", "out"])
    p = p.with_swap([0, 4, 0, 0, 0, 0, 0])
    plan = Plan.of([("compute", 0), ("compute", 1), ("swap_out", 1), ("compute", 3), ("swap_in", 1), ("compute", 2),
                    ("free", 1), ("compute", 4), ("free", 3), ("compute", 1), ("compute", 5), ("free", 1),
                    ("free", 4), ("compute", 1), ("compute", 6), ("free", 1), ("free", 2), ("free", 5), ("free", 0),
                    ("free", 6)], "hand")
    sim = simulate(p, plan, 160)
    assert sim.recomputes == 2 and sim.swap_ins == 1
    (a,) = [e for e in explain(p, plan, 160) if e["name"] == "A"]
    assert a["decision"] == "swap + recompute x2"
    assert a["why"].endswith("also recomputed 2x at cost 20")

def test_explain_does_not_say_an_unread_output_is_read_by_the_next_step():
    # out, the last step, is read by nobody (a JSON graph's last node is not pinned): its reason
    # said "read only by the next step", a step that does not exist
    p = PlanningProblem.build(size=[1, 10, 4], cost=[1, 1, 1], preds=[[], [0], [1]], names=["s", "a", "out"])
    plan = Plan.of([("compute", 0), ("compute", 1), ("free", 0), ("compute", 2), ("free", 1), ("free", 2)], "hand")
    simulate(p, plan)
    why = {e["name"]: e["why"] for e in explain(p, plan, 100)}
    assert why["a"] == "read only by the next step: nothing to free in between"
    assert why["out"] == "read by no later step: freed as soon as it is made"


def _s_a_big_m_out():
    """s -> a -> big -> m; out reads a and m. The plan frees a after big and recomputes it for
    out; s, freed after a, is recomputed only to feed a's recompute."""
    p = PlanningProblem.build(size=[1, 10, 100, 1, 1], cost=[1, 2, 5, 1, 1],
                              preds=[[], [0], [1], [2], [1, 3]], names=["s", "a", "big", "m", "out"])
    plan = Plan.of([("compute", 0), ("compute", 1), ("free", 0), ("compute", 2), ("free", 1), ("compute", 3),
                    ("free", 2), ("compute", 0), ("compute", 1), ("free", 0), ("compute", 4), ("free", 1),
                    ("free", 3), ("free", 4)], "hand")
    simulate(p, plan)
    return p, plan


def test_explain_counts_only_the_over_budget_steps_a_recompute_leaves_free():
    # a (live 1-4) is held at steps 1-2 and again from its recompute at 4: it frees its 10 B at
    # step 3 alone, yet the reason counted every over-budget step of its interval (2 and 3)
    p, plan = _s_a_big_m_out()
    assert (p.unplanned_memory > 102).nonzero()[0].tolist() == [2, 3]
    (a,) = [e for e in explain(p, plan, 102) if e["name"] == "a"]
    assert a["resident"] == [[1, 2], [4, 4]]
    assert a["why"].endswith(": frees 10 B across 1 step(s) over budget unplanned")


def test_explain_does_not_say_a_buffer_held_through_its_interval_frees_memory():
    # s is held through its whole live interval (0-1) and recomputed later only to feed a's
    # recompute: at a budget of 5 its reason said "frees 1 B across 2 over-budget step(s)"
    # (zoo:cnn at 68%: block1.conv, held 9-18 of 9-18, "frees 64.00 KiB across 8 ...")
    p, plan = _s_a_big_m_out()
    (s,) = [e for e in explain(p, plan, 5) if e["name"] == "s"]
    assert s["resident"][0] == [0, 1] and s["live"] == [0, 1]
    assert s["why"] == ("freed after its reads and recomputed 1x at cost 1 to feed the recompute of a: "
                        "held whenever a step of its live interval runs, so this frees nothing there")


def test_explain_counts_a_buffer_freed_only_while_the_next_steps_recomputes_run():
    # y (live 1-3) is freed after z and recomputed after w's recompute, both before out: the plan
    # holds it at every step boundary, yet not while w's recompute runs at step 3 (zoo:gpt?batch=64
    # --swap at 35%: a 128 KiB gradient said to free nothing). Steps over 90 unplanned: 2 and 3.
    p = PlanningProblem.build(size=[50, 40, 1, 1], cost=[1, 1, 1, 1], preds=[[], [], [0], [0, 1, 2]],
                              names=["w", "y", "z", "out"])
    plan = Plan.of([("compute", 0), ("compute", 1), ("compute", 2), ("free", 0), ("free", 1), ("compute", 0),
                    ("compute", 1), ("compute", 3), ("free", 0), ("free", 1), ("free", 2), ("free", 3)], "hand")
    simulate(p, plan)
    assert (p.unplanned_memory > 90).nonzero()[0].tolist() == [2, 3]
    (y,) = [e for e in explain(p, plan, 90) if e["name"] == "y"]
    assert y["resident"] == [[1, 2], [3, 3]]
    # its first copy was never read: out, its only reader, reads the recompute
    assert y["why"] == "freed unread and recomputed 1x at cost 1 for later reads: frees 40 B across 1 step(s) over budget unplanned"


def test_explain_counts_each_part_of_an_output_apart():
    # t's output is two buffers that die apart (MaxPool's values and indices): 10 B read by r and
    # by l at step 5, 30 B read by r alone. Dropping t after r and recomputing it for l frees its
    # values across steps 3 and 4; its indices are released after r with or without the plan. The
    # reason said "frees 40 B across 2" (zoo:cnn's block1.pool at 68%: "48 KiB across 30", where
    # its 16 KiB values alone are dropped, across 46)
    p = PlanningProblem.build(size=[1, 40, 1, 100, 1, 1], cost=[1] * 6, preds=[[], [0], [1], [2], [3], [1, 4]],
                              names=["x", "t", "r", "big", "s", "l"],
                              parts=[[], [(10, [2, 5]), (30, [2])], [], [], [], []])
    plan = Plan.of([("compute", 0), ("compute", 1), ("compute", 2), ("free", 1), ("compute", 3), ("free", 2),
                    ("compute", 4), ("free", 3), ("compute", 1), ("free", 0), ("compute", 5), ("free", 1),
                    ("free", 4), ("free", 5)], "hand")
    assert simulate(p, plan, 105).peak_bytes == 102
    assert (p.unplanned_memory > 105).nonzero()[0].tolist() == [3, 4]
    (t,) = [e for e in explain(p, plan, 105) if e["name"] == "t"]
    assert t["why"] == "freed after its reads and recomputed 1x at cost 1 for later reads: frees 10 B across 2 step(s) over budget unplanned"


def test_explain_says_a_swap_no_step_runs_without_frees_nothing():
    # a goes to host after b and comes back before c: no computation runs while it is away
    # (RL100 --swap-bandwidth 50 at 50%, node 69), yet its reason said "frees 10 B across 3
    # over-budget step(s)"
    p = PlanningProblem.build(size=[10, 10, 10, 1], cost=[1, 1, 1, 1], preds=[[], [0], [1], [1, 2]],
                              names=["x", "a", "b", "c"]).with_swap([1, 1, 1, 1])
    plan = Plan.of([("compute", 0), ("compute", 1), ("free", 0), ("compute", 2), ("swap_out", 1), ("swap_in", 1),
                    ("compute", 3), ("free", 1), ("free", 2), ("free", 3)], "hand")
    assert simulate(p, plan).swap_ins == 1
    (a,) = [e for e in explain(p, plan, 5) if e["name"] == "a"]
    assert a["decision"] == "swap"
    assert a["why"] == ("moved to host and back 1x: held whenever a step of its live interval runs, so this frees "
                        "nothing there; transfer 1 each way vs recompute 1")


def test_explain_says_a_zero_byte_recompute_frees_nothing():
    # z holds 0 B and costs 0: a plan that computes, frees and computes it again (zoo:cnn's
    # Reshapes at 68%) was explained as "freed after its reads ... frees 0 B across 14
    # over-budget step(s)", though the first copy had no reads and the recompute frees nothing
    p = PlanningProblem.build(size=[10, 0, 10, 1], cost=[1, 0, 1, 1], preds=[[], [], [0], [1, 2]],
                              names=["x", "z", "y", "out"])
    plan = Plan.of([("compute", 0), ("compute", 1), ("free", 1), ("compute", 1), ("compute", 2), ("free", 0),
                    ("compute", 3), ("free", 1), ("free", 2), ("free", 3)], "hand")
    simulate(p, plan)
    (z,) = [e for e in explain(p, plan, 5) if e["name"] == "z"]
    assert z["decision"] == "recompute x1"
    assert z["why"] == "freed unread and recomputed 1x at cost 0 for later reads: it holds 0 B, so this frees nothing"
    plan = Plan.of([("compute", 0), ("compute", 1), ("compute", 2), ("free", 0), ("compute", 3), ("free", 1),
                    ("free", 2), ("free", 3)], "hand")
    (z,) = [e for e in explain(p, plan, 5) if e["name"] == "z"]  # kept, it was "freeing others was cheaper"
    assert z["decision"] == "keep" and z["why"] == "holds 0 B: freeing it would save nothing"


def test_explain_says_what_an_over_budget_step_is_where_the_plan_fits():
    # a plan under the budget at every step said "kept across 1 over-budget step(s)" with no word
    # that those are the unplanned run's steps (zoo:cnn at 68%); the table now says what they are.
    # x (costly) is held while big is freed and recomputed: the plan peaks at 151, unplanned 152.
    from planner.explain import OVER_NOTE, explain_table

    p = PlanningProblem.build(size=[1, 100, 50, 1, 1], cost=[100, 1, 1, 1, 1],
                              preds=[[], [0], [1], [2], [0, 1, 3]], names=["x", "big", "m", "n", "out"])
    plan = Plan.of([("compute", 0), ("compute", 1), ("compute", 2), ("free", 1), ("compute", 3), ("free", 2),
                    ("compute", 1), ("compute", 4), ("free", 0), ("free", 1), ("free", 3), ("free", 4)], "hand")
    assert simulate(p, plan, 151).peak_bytes == 151 and p.unplanned_memory.tolist() == [1, 101, 151, 152, 103]
    entries = explain(p, plan, 151)
    why = {e["name"]: e["why"] for e in entries}
    assert why["x"] == ("held across 1 step(s) over budget unplanned: the plan frees other buffers there "
                        "instead (recompute cost 100, 100/byte)")
    assert why["big"].endswith("frees 100 B across 1 step(s) over budget unplanned")
    assert explain(p, plan, 200)[0]["why"] == "no step of its live interval is over budget unplanned"
    assert explain_table(entries).splitlines()[-1] == f"({OVER_NOTE})"


def test_cli_plan_writes_json_and_explains(benchmarks_dir, tmp_path):
    path = remat(benchmarks_dir, "VGG16 (MLSys)_256_(224, 224, 3)_train")
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(cli.main, ["plan", str(path), "--budget", "90%", "--workers", "1", "--time-limit", "10",
                                        "-o", str(out), "--json", "--explain"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj == json.loads(out.read_text())
    assert obj["status"] == "optimal" and obj["peak_bytes"] <= obj["budget_bytes"]
    assert len(obj["explain"]) == 45 and obj["schedule"][0] == {"op": "compute", "node": 0}


def test_cli_infeasible_budget_exits_1_with_the_least_memory(benchmarks_dir, tmp_path):
    path = remat(benchmarks_dir, "VGG16 (MLSys)_256_(224, 224, 3)_train")
    out = tmp_path / "plan.json"
    res = subprocess.run([sys.executable, "-m", "cli", "plan", str(path), "--budget", "50%", "--workers", "1",
                          "-o", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    problem = load_remat_json(path)
    floor = problem.memory_floor
    assert f"infeasible: the least memory any plan reaches is {floor}" in res.stderr
    # what to ask for: 83.12% reads 83.2% (a budget of 83.1% is below the floor)
    from planner.units import share_up

    assert share_up(floor, problem.unplanned_peak) == "83.2%"
    assert "83.2% of the unplanned peak" in res.stderr
    assert "Traceback" not in res.stderr and not out.exists()


@pytest.mark.parametrize("args,msg", [(["--budget", "12 parsecs"], "unknown unit"),
                                      (["--budget", "50%", "--swap-bandwidth", "-1"], "--swap-bandwidth")])
def test_cli_usage_errors_exit_2(benchmarks_dir, args, msg):
    path = remat(benchmarks_dir, "VGG16 (MLSys)_256_(224, 224, 3)_train")
    res = CliRunner().invoke(cli.main, ["plan", str(path), *args])
    assert res.exit_code == 2 and msg in res.output and "Traceback" not in res.output


def test_cli_bench_remat_table(benchmarks_dir, tmp_path):
    md = tmp_path / "t.md"
    res = CliRunner().invoke(cli.main, ["bench", "remat", "--dir", str(benchmarks_dir / "remat"), "--graph", "VGG16",
                                        "--budgets", "90,70", "--time-limit", "5", "--workers", "1",
                                        "--markdown", str(md), "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert [(r["budget_pct"], r["strategy"]) for r in rows][:3] == [(90, "cpsat"), (90, "greedy"), (90, "chen")]
    assert rows[0]["status"] == "optimal" and rows[0]["not_worse_than_baselines"]
    assert rows[3]["status"] == "infeasible"
    assert md.read_text().count("\n") == 2 + len(rows)


def test_cli_timeout_exits_4_and_names_swapping(benchmarks_dir):
    # RL250 at 60%: no plan has ever been found for it (120 s); 2 s surely find none either
    path = remat(benchmarks_dir, "random_layered_n250_")
    res = CliRunner().invoke(cli.main, ["plan", str(path), "--budget", "60%", "--time-limit", "2", "--workers", "1"])
    assert res.exit_code == 4
    assert "no plan within the budget found" in res.output and "--time-limit" in res.output
    assert "allow swapping to host memory (--swap-bandwidth BW)" in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_cli_bench_remat_with_a_host_link_swaps(benchmarks_dir):
    # RL100 at 70% needs recomputes (+2.23%) without a host link; with a near-free one, swaps
    # move the excess out and back at no added time
    res = CliRunner().invoke(cli.main, ["bench", "remat", "--dir", str(benchmarks_dir / "remat"), "--graph", "RL100",
                                        "--budgets", "70", "--strategies", "cpsat", "--time-limit", "5",
                                        "--workers", "1", "--swap-bandwidth", "1e9", "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert obj["swap_bandwidth"] == 1e9 and obj["swap_overlap"] is True
    (row,) = obj["rows"]
    assert row["status"] in ("optimal", "feasible") and row["peak_over_budget"] <= 1
    assert row["swap_ins"] > 0 and row["added_pct"] == pytest.approx(0, abs=1e-6)
    bad = CliRunner().invoke(cli.main, ["bench", "remat", "--dir", str(benchmarks_dir / "remat"), "--graph", "RL100",
                                        "--swap-bandwidth", "0"])
    assert bad.exit_code == 2 and "--swap-bandwidth must be > 0" in bad.output


def test_cli_bench_remat_decimal_budget_is_the_exact_share(benchmarks_dir):
    # 41.1% of MobileNet's 34701056000-byte peak is 14262134016 bytes exactly; 41.1 / 100 in floats
    # is a hair above 0.411 and the row's budget came out one byte over
    res = CliRunner().invoke(cli.main, ["bench", "remat", "--dir", str(benchmarks_dir / "remat"), "--graph",
                                        "MobileNet", "--budgets", "41.1", "--strategies", "greedy", "--json"])
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["rows"]
    assert row["budget_pct"] == 41.1 and row["budget_bytes"] == 14262134016


def test_coarsening_fuses_single_use_chains_and_expands_valid_plans():
    from planner.coarsen import coarsen

    # chains 1-2-3 and 5-6-7 fuse (3 may have several readers: it ends its chain)
    preds = [[], [0], [1], [2], [3], [0, 4], [5], [6], [7, 3]]
    p = PlanningProblem.build(size=[5, 40, 30, 20, 10, 5, 30, 20, 5], cost=[1] * 9, preds=preds,
                              scratch=[0, 0, 7, 0, 0, 0, 0, 0, 0])
    c = coarsen(p)
    assert c.groups == ((0,), (1, 2, 3), (4,), (5, 6, 7), (8,))
    assert c.coarse.unplanned_peak >= p.unplanned_peak
    assert c.coarse.cost.sum() == p.cost.sum()
    opts = PlannerOptions(time_limit=10, workers=1, coarsen_above=0)
    for frac in (1.0, 0.8):
        budget = max(c.coarse.memory_floor, p.budget_for(frac))
        res = solve(p, budget, "cpsat", opts)
        check_result(p, res, budget)
        assert ("fused nodes" in res.note) == (budget < p.unplanned_peak)


def test_fused_solve_expands_into_a_fine_plan_that_replays():
    # The test above never reaches the fused solve (its budgets are all >= the unplanned peak).
    # Here the fused floor (90) is below the peak (105): the plan is found on the fused problem
    # and expanded; each member of the recomputed chain 1-2-3 runs and its predecessor is freed
    # right after, and the expanded plan replays on the real problem within the budget.
    from planner.coarsen import coarsen

    preds = [[], [0], [1], [2], [3], [0, 4], [5], [6], [7, 3]]
    p = PlanningProblem.build(size=[40, 10, 20, 20, 5, 40, 5, 10, 40], cost=[1] * 9, preds=preds)
    c = coarsen(p)
    assert c.groups == ((0,), (1, 2, 3), (4,), (5, 6, 7), (8,))
    assert c.coarse.memory_floor == 90 < p.unplanned_peak == 105
    res = solve(p, 90, "cpsat", PlannerOptions(time_limit=5, workers=1, coarsen_above=0))
    check_result(p, res, 90)
    # optimal on the fused model is not optimal on the real one: the fused solve never claims it
    assert "fused nodes" in res.note and res.status == "feasible"
    events = [(e.op, e.node) for e in res.plan.events]
    start = events.index(("compute", 1))
    assert events[start:start + 5] == [("compute", 1), ("compute", 2), ("free", 1), ("compute", 3), ("free", 2)]
    # a fused plan for the coarse problem expands to one no higher on the fine problem
    coarse_plan = solve(c.coarse, 90, "cpsat", PlannerOptions(time_limit=5, workers=1, coarsen_above=10**9)).plan
    assert simulate(p, c.expand(coarse_plan), 90).peak_bytes <= simulate(c.coarse, coarse_plan, 90).peak_bytes


def test_a_model_bound_above_the_kept_plans_cost_is_not_claimed(monkeypatch):
    # The model's bound holds over its own plans only; a fallback plan outside the model can be
    # cheaper than it. Claimed anyway, the gap clamps to 0 and the dearer-than-needed status says
    # "optimal" for a plan nothing proved.
    from types import SimpleNamespace

    import planner.planning as planning
    from planner.baselines import baseline
    from planner import clock
    from planner.cpsat import PhaseResult

    p = PlanningProblem.build(size=[40, 10, 20, 20, 5, 40, 5, 10, 40], cost=[1] * 9,
                              preds=[[], [0], [1], [2], [3], [0, 4], [5], [6], [7, 3]])
    budget = 95
    fallback = baseline(p, "greedy", budget)
    assert fallback is not None and fallback.sim.peak_bytes <= budget and fallback.sim.added_time > 0
    monkeypatch.setattr(planning, "_exact_cheapest", lambda *a: None)  # as on a large problem
    monkeypatch.setattr(planning, "polished", lambda problem, plan, sim, *a, **k: (plan, sim))
    added = fallback.sim.added_time
    m2 = SimpleNamespace(time_of_objective=lambda objective: objective, time_of_bound=lambda objective: objective,
                         parted={})
    for bound, status, gap in ((added + 5.0, "feasible", None), (added / 2, "feasible", 0.5), (added, "optimal", 0.0)):
        r2 = PhaseResult("refine", "FEASIBLE", 0.1, None, bound, None, None)
        res = planning._chosen(p, budget, PlannerOptions(time_limit=1, workers=1), clock.now(), [r2], fallback,
                               "", m2, r2)
        assert (res.status, res.solver.gap) == (status, gap) and res.added_time == added
        assert res.solver.bound == (None if gap is None else bound)


def test_a_swap_solves_bound_above_the_recompute_only_plans_cost_is_not_claimed():
    # _recompute_won keeps the recompute-only plan where the swap solve found none cheaper; the
    # swap solve's bound, when above that plan's cost, proves nothing about it
    from dataclasses import replace as dc_replace

    import planner.planning as planning
    from planner import clock
    from planner.baselines import baseline
    from planner.plan import SolverStats

    p = PlanningProblem.build(size=[40, 10, 20, 20, 5, 40, 5, 10, 40], cost=[1] * 9,
                              preds=[[], [0], [1], [2], [3], [0, 4], [5], [6], [7, 3]])
    fb = baseline(p, "greedy", 95)
    added = fb.sim.added_time
    rec = planning._empty(p, 95, "cpsat", status="feasible", plan=fb.plan, peak_bytes=fb.sim.peak_bytes,
                          added_time=added, solver=SolverStats())
    for bound, status, gap in ((added + 5.0, "feasible", None), (added / 2, "feasible", 0.5), (added, "optimal", 0.0)):
        swap = dc_replace(rec, added_time=added + 1, solver=SolverStats(bound=bound))
        res = planning._recompute_won(p, rec, fb.sim, swap, clock.now())
        assert (res.status, res.solver.gap, res.solver.bound) == (status, gap, None if gap is None else bound)


def test_no_fused_solve_below_the_fused_problems_floor(monkeypatch):
    # Fusing 1-2-3 holds 40 + 30 + 20 + scratch at once: the fused floor (85) is above the real
    # one (77). At 80 the fused problem has no plan, and proving its least memory would spend the
    # time the real problem needs, so it is not tried.
    import planner.planning as planning
    from planner.coarsen import coarsen

    preds = [[], [0], [1], [2], [3], [0, 4], [5], [6], [7, 3]]
    p = PlanningProblem.build(size=[5, 40, 30, 20, 10, 5, 30, 20, 5], cost=[1] * 9, preds=preds,
                              scratch=[0, 0, 7, 0, 0, 0, 0, 0, 0])
    assert p.memory_floor <= 80 < coarsen(p).coarse.memory_floor
    tried = []
    monkeypatch.setattr(planning, "_solve_coarse", lambda *a: tried.append(a) or pytest.fail("fused solve"))
    res = solve(p, 80, "cpsat", PlannerOptions(time_limit=10, workers=1, coarsen_above=0))
    check_result(p, res, 80)
    assert res.plan is not None and not tried


def device_swap_graph(dev, copy_overlap: bool) -> PlanningProblem:
    """x -> A (1 GiB Relu) is read again only by out; c2 -> c3 -> c4 are long GEMMs in between and
    the memory between them forces A out. Times and transfers come from the device profile; whether
    copies run beside compute is the runtime's (ONNX Runtime's do not: COPIES_OVERLAP_COMPUTE)."""
    from planner.costs import op_time

    mib = 2**20
    a_elems = 2**28  # 1 GiB of fp32
    gemm = ("MatMul", [(16384, 32768), (32768, 16384)], [(16384, 16384)], {})
    cost = [
        op_time("Relu", [(256,)], [(256,)], {}, dev),
        op_time("Relu", [(a_elems,)], [(a_elems,)], {}, dev),
        op_time(*gemm, dev), op_time(*gemm, dev), op_time(*gemm, dev),
        op_time("Add", [(256,), (256,)], [(256,)], {}, dev),
    ]
    p = PlanningProblem.build(size=[mib, 1024 * mib, 512 * mib, 512 * mib, mib, mib], cost=cost,
                              preds=[[], [0], [0], [2], [3], [1, 4]], time_unit="s")
    return p.with_swap(p.size / dev.link_bandwidth, copy_overlap=copy_overlap)


def test_device_profiles_decide_swap_or_recompute():
    """Where copies run beside compute (a runtime with copy streams) A's 21 ms transfers on an H200
    hide behind ~35 ms GEMMs: swap, at no added time. In line with compute (as ONNX Runtime runs a
    written model's copies, and on a CPU) two transfers cost more than recomputing A: recompute."""
    from planner.devices import COPIES_OVERLAP_COMPUTE, PROFILES, cpu_profile

    budget = 1700 * 2**20  # A cannot stay through c3 (A + c2 + c3 = 2 GiB)
    beside = device_swap_graph(PROFILES["H200"], copy_overlap=True)
    res = solve(beside, budget, "cpsat", FIXED)
    check_result(beside, res, budget)
    assert res.plan.counts(beside.n)["swap_in"][1] == 1 and res.added_time < 1e-3 * beside.cost[1]
    for in_line in (device_swap_graph(PROFILES["H200"], COPIES_OVERLAP_COMPUTE),
                    device_swap_graph(cpu_profile(), copy_overlap=False)):
        res = solve(in_line, budget, "cpsat", FIXED)
        check_result(in_line, res, budget)
        counts = res.plan.counts(in_line.n)
        assert counts["compute"][1] == 2 and counts["swap_in"][1] == 0
        assert res.added_time == pytest.approx(in_line.cost[1], rel=1e-6)


def test_step_need_counts_a_pinned_input_once():
    # node 1 is a graph output (pinned) that node 2 reads: it is one buffer, not two
    p = PlanningProblem.build(size=[10, 20, 40], cost=[1, 1, 1], preds=[[], [0], [1]], pinned=[False, True, False],
                              base_bytes=5)
    assert int(p.step_need[2]) == 5 + 40 + 20


def test_budget_below_the_base_is_infeasible_without_a_search(monkeypatch):
    # Below what is resident throughout, no plan can fit whatever the search finds: the floor is
    # reported at once (least_peak used to spend the whole time limit on it).
    import planner.planning as planning

    def no_search(*args, **kwargs):
        raise AssertionError("least_peak must not run below the constant base")

    p = PlanningProblem.build(size=[10, 20, 40, 10], cost=[1, 1, 1, 1], preds=[[], [0], [1], [2, 0]], base_bytes=50)
    monkeypatch.setattr(planning, "least_peak", no_search)
    res = solve(p, 49, "cpsat", PlannerOptions(time_limit=30, workers=1))
    assert res.status == "infeasible" and res.plan is None
    assert res.least_bytes == p.memory_floor and not res.least_exact
    # at or above the base (still below the floor) the least memory is searched for, as before
    monkeypatch.setattr(planning, "least_peak", lambda *a, **k: (p.memory_floor, p.memory_floor, True))
    res = solve(p, 50, "cpsat", PlannerOptions(time_limit=30, workers=1))
    assert res.status == "infeasible" and res.least_exact


@pytest.mark.parametrize("seed", range(6))
def test_knapsack_cuts_never_cut_off_a_plan_with_pinned_outputs(seed):
    # Random DAGs whose outputs are pinned and read later (as gradients are): the per-step cuts
    # must leave the optimum where it is, at a budget where recomputing is needed.
    rng = np.random.default_rng(seed)
    n = 14
    preds = [[]] + [sorted({i - 1, *rng.choice(i, size=min(i, 2), replace=False).tolist()}) for i in range(1, n)]
    size = rng.integers(5, 40, size=n).tolist()
    pinned = [bool(rng.random() < 0.25) for _ in range(n - 1)] + [True]
    problem = PlanningProblem.build(size=size, cost=rng.uniform(1, 5, size=n).tolist(), preds=preds, pinned=pinned)
    budget = (problem.memory_floor + problem.unplanned_peak) // 2
    results = [solve(problem, budget, "cpsat", PlannerOptions(time_limit=10, workers=1, knapsack_cuts=cuts))
               for cuts in (False, True)]
    # feasible: no plan of the model fits, and planner.least's exact plan (outside it) does (seed 3)
    assert results[1].status == results[0].status and results[0].status in ("optimal", "feasible", "infeasible")
    if results[0].status != "infeasible":
        assert results[1].added_time == pytest.approx(results[0].added_time)


def test_no_model_is_built_without_time_to_search_it(monkeypatch):
    # A fitting baseline and less time than any search is worth: the baseline's plan comes back
    # at once (before, a model was built for a search of 0.05 s; on RL1000 with a host link,
    # --time-limit 20 ran 25 s that way).
    import planner.planning as planning

    p = chain(10)
    budget = p.budget_for(0.7)
    assert greedy(p, budget) is not None
    built = []
    monkeypatch.setattr(planning, "RematModel", lambda *a, **k: built.append(a) or pytest.fail("model built"))
    res = solve(p, budget, "cpsat", PlannerOptions(time_limit=planning.MIN_SEARCH_S / 2, workers=1, reorder=False))
    check_result(p, res, budget)
    assert not built and res.solver.phases == () and "no time left to search" in res.note
    fitting = [c.sim.added_time for c in planning._baselines(p, budget).values() if c.sim.peak_bytes <= budget]
    assert res.added_time == min(fitting) > 0


@pytest.mark.parametrize("args,msg", [
    (["plan", "zoo:mlp", "--budget", "90%", "-o", "{d}/p.json", "--emit", "{d}/p.json"], "--emit {d}/p.json is written by -o too"),
    (["plan", "zoo:mlp", "--budget", "90%", "--emit", "{d}/no/x.onnx"], "folder {d}/no does not exist"),
    (["plan", "{d}/in.csv", "--budget", "90%", "--emit", "{d}/in.csv"], "--emit {d}/in.csv is an input"),
    (["inspect", "{d}/in.csv", "--plot", "{d}/in.csv"], "--plot {d}/in.csv is an input"),
    (["alloc", "{d}/in.csv", "-o", "{d}/in.csv"], "-o {d}/in.csv is an input"),
    (["bench", "remat", "-o", "{d}/r.json", "--markdown", "{d}/r.json"], "--markdown {d}/r.json is written by -o too"),
])
def test_output_paths_are_checked_before_any_work(tmp_path, args, msg):
    # Before, `-o p.json --emit p.json` wrote the plan and then the model over it, and an --emit
    # into a missing folder failed after the solve, naming a temporary file.
    d = tmp_path.resolve()
    (d / "in.csv").write_text("id,lower,upper,size\n0,0,2,8\n")
    res = CliRunner().invoke(cli.main, [a.format(d=d) for a in args])
    assert res.exit_code == 2 and msg.format(d=d) in res.output, res.output
    assert sorted(p.name for p in d.iterdir()) == ["in.csv"] and (d / "in.csv").read_text().startswith("id,")


def test_explain_reads_a_plan_in_its_own_node_order():
    """A plan that computes c before b (another order, as a memory-aware or reverse-walk plan does)
    was explained in the problem's order: b's live interval [1, 3] and a's residency [0, 1], where
    the plan runs a at step 0, c at 1, b at 2 and holds a until b has read it."""
    p = PlanningProblem.build(size=[4, 8, 16, 2], cost=[1, 1, 1, 1], preds=[[], [0], [0], [1, 2]],
                              names=["a", "b", "c", "d"])
    plan = Plan.of([("compute", 0), ("compute", 2), ("compute", 1), ("free", 0), ("compute", 3), ("free", 1),
                    ("free", 2), ("free", 3)], "hand")
    simulate(p, plan)  # a valid plan
    entries = explain(p, plan, 10**6)
    assert [e["name"] for e in entries] == ["a", "c", "b", "d"]
    got = {e["name"]: (e["live"], e["resident"]) for e in entries}
    assert got == {"a": ([0, 2], [[0, 2]]), "c": ([1, 3], [[1, 3]]), "b": ([2, 3], [[2, 3]]), "d": ([3, 3], [[3, 3]])}


def test_the_unfused_solve_builds_no_model_the_fused_ones_build_time_says_it_has_no_time_for(monkeypatch):
    # A fused (coarsened) solve that ends without a plan hands the rest of the limit to the
    # unfused problem, whose solve started with a fresh pace: with no plan to fall back on it
    # built its (larger) phase-1 model however little time was left (zoo:gpt?layers=32 at 67%,
    # --time-limit 2: two model builds, 8.4 s). The fused solve's builds now count there.
    import planner.planning as planning
    from passes.plan_model import lower_graph

    graph, _ = cli._graph_to_plan("zoo:gpt?layers=1", {}, False)
    p, _ = lower_graph(graph)
    built = []
    model = planning.RematModel
    monkeypatch.setattr(planning, "RematModel", lambda problem, *a, **k: built.append(problem.n) or model(problem, *a, **k))
    # each build takes longer than the limit
    monkeypatch.setattr(planning._Pace, "built", lambda self, since: setattr(self, "model_s", 100.0))
    res = solve(p, p.budget_for(0.7), "cpsat", PlannerOptions(time_limit=1.0, workers=1, coarsen_above=50))
    assert built and all(n < p.n for n in built)  # the fused problem's model only
    assert res.plan is None or simulate(p, res.plan).peak_bytes <= p.budget_for(0.7)


def test_chen_keeps_every_kth_forward_output_and_recomputes_the_rest():
    # 10 forward nodes (f0..f8, loss), k = ceil(sqrt(10)) = 4: f3 and f7 are the checkpoints;
    # f8 and the loss are read at once by the backward pass, so none of those four is made twice
    c = chain(9)
    p = PlanningProblem.build(size=c.size, cost=c.cost, preds=c.pred_lists, backward=[False] * 10 + [True] * 9)
    sim = simulate(p, chen_sqrt(p))
    assert sim.compute_counts.tolist() == [2, 2, 2, 1, 2, 2, 2, 1, 1, 1] + [1] * 9
    assert sim.peak_bytes == 60 < p.unplanned_peak == 110


def test_the_model_rounds_a_budget_between_its_memory_units_down():
    # every size is 10 B, so the CP-SAT model counts memory in 10-byte units; a budget 5 B under
    # the unplanned peak leaves room for one unit less, not the whole peak again
    from planner.cpsat import RematModel

    p = chain(6)
    budget = p.unplanned_peak - 5
    model = RematModel(p, budget, PlannerOptions(workers=1))
    model.set_objective_time()
    res = model.solve("units", 5)
    assert res.plan is not None and model.mem_unit == 10
    assert simulate(p, res.plan, budget).peak_bytes <= budget - 5


@pytest.mark.parametrize("n,frac", [(8, 0.6), (10, 0.55)])
def test_the_budget_greedy_returns_its_cheapest_fitting_plan(n, frac):
    # the four greedies disagree here (the split greedy's plan is the dearest): greedy() keeps the cheapest
    from planner.chain_greedy import checkpoint_greedy
    from planner.greedy import evict_greedy, split_greedy_simulated
    from planner.tight_greedy import tight_greedy_simulated

    c = chain(n)
    p = PlanningProblem.build(size=c.size, cost=np.arange(1, c.n + 1, dtype=float), preds=c.pred_lists)
    budget = p.budget_for(frac)
    costs = []
    for make in (evict_greedy, split_greedy_simulated, checkpoint_greedy, tight_greedy_simulated):
        made = make(p, budget)
        if made is not None:
            sim = simulate(p, (made[0] if isinstance(made, tuple) else made).without_unread(p))
            if sim.peak_bytes <= budget:
                costs.append(sim.added_time)
    assert len(set(costs)) > 1
    best = greedy(p, budget)
    assert best is not None and best.sim.added_time == min(costs)
    assert simulate(p, best.plan, budget).added_time == min(costs)
