"""The work clock (planner/clock.py, `--deterministic`): the same plan however fast the machine."""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

import cli
from planner import clock
from planner.cpsat import PlannerOptions
from planner.planning import solve
from tests.helpers import random_layered

# RL100 at 65% is far from solved in 1 deterministic second: the limit decides where the search stops
OPTS = PlannerOptions(time_limit=1, workers=1, seed=0, work_limit=True)


def crawling_wall(monkeypatch) -> None:
    """A machine so loaded that every reading of the wall clock is 1000 s after the last one."""
    ticks = itertools.count(0.0, 1000.0)
    monkeypatch.setattr(clock, "_wall", lambda: next(ticks))


def events(res) -> list[tuple[str, int]]:
    return [(e.op, e.node) for e in res.plan.events]


def test_the_work_clock_plans_the_same_on_a_crawling_machine(benchmarks_dir, monkeypatch):
    p = random_layered(benchmarks_dir, 100)
    budget = p.budget_for(0.65)
    calm = solve(p, budget, "cpsat", OPTS)
    assert calm.plan is not None and calm.status == "feasible"
    crawling_wall(monkeypatch)
    crawled = solve(p, budget, "cpsat", OPTS)
    assert events(crawled) == events(calm) and crawled.added_time == calm.added_time
    assert crawled.solver.bound == calm.solver.bound and crawled.order == calm.order
    # on the wall clock that machine leaves the search no time: another answer
    hurried = solve(p, budget, "cpsat", replace(OPTS, work_limit=False, time_limit=60))
    assert hurried.plan is None or events(hurried) != events(calm)
    assert not clock.on_work_clock()  # the solve's clock is gone with it


def test_the_wall_cap_stops_a_crawling_solve_and_says_so(benchmarks_dir, monkeypatch, caplog):
    p = random_layered(benchmarks_dir, 100)
    crawling_wall(monkeypatch)
    # the deadline between the first reading (0) and the second (1000): passed at once
    capped = solve(p, p.budget_for(0.65), "cpsat", replace(OPTS, wall_deadline=500.0))
    assert capped.solver.wall_capped and capped.solver.clock == "work"
    assert "--wall-cap stopped the solve" in capped.note and "another machine may return another plan" in capped.note
    assert capped.plan is None or capped.peak_bytes <= capped.budget_bytes
    assert any("--wall-cap stopped" in r.getMessage() for r in caplog.records)
    assert capped.solver.to_json()["wall_capped"] is True
    assert not clock.on_work_clock()
    # a later solve of the same command (a re-solve, a --max-batch probe) is past it from the start
    again = solve(p, p.budget_for(0.8), "cpsat", replace(OPTS, wall_deadline=500.0))
    assert again.solver.wall_capped


def test_the_wall_deadline_ends_the_clocks_deadlines_and_the_solvers_wall_time():
    from ortools.sat.python import cp_model

    ticks = iter([0.0, 0.0, 0.0, 0.0, 5.0, 12.0, 12.0, 12.0])
    old = clock._wall
    clock._wall = lambda: next(ticks)
    try:
        deadline = clock.wall_deadline(10.0)  # reads 0
        with clock.work_clock(deadline):  # reads 0
            start = clock.now()  # reads 0: not past the deadline (nor in capped())
            assert start == 0.0 and not clock.capped()
            prm = cp_model.CpSolver().parameters
            clock.limit_solver(prm, 3.0)  # reads 5: 5 wall s left
            assert prm.max_deterministic_time == 3.0 and prm.max_time_in_seconds == 5.0
            assert clock.now() - start >= clock.CAPPED_JUMP and clock.capped()  # reads 12
            clock.limit_solver(prm, 3.0)
            assert prm.max_time_in_seconds == 0.05  # past it: a solver run stops at once
    finally:
        clock._wall = old
    assert PlannerOptions().wall_deadline == math.inf  # no cap unless asked for


def test_the_work_clock_charges_only_solver_time():
    with clock.work_clock():
        start = clock.now()
        clock.charge(1.5)
        clock.charge(-3)  # never backwards
        assert clock.now() - start == 1.5 and clock.on_work_clock()
        with clock.work_clock():  # a nested solve gets its own
            assert clock.now() == 0.0
        assert clock.now() == 1.5
    assert not clock.on_work_clock()


def spy_solve(monkeypatch, read) -> list:
    """What ``read(options)`` gives for every solve from now on (planner.planning.solve)."""
    import planner.planning as planning

    seen, real = [], solve

    def spy(problem, budget, strategy="cpsat", options=None, start=None):
        seen.append(read(options))
        return real(problem, budget, strategy, options, start)

    monkeypatch.setattr(planning, "solve", spy)
    return seen


def test_plan_deterministic_flag_reaches_the_planner(benchmarks_dir, monkeypatch):
    seen = spy_solve(monkeypatch, lambda options: options.work_limit)
    graph = str(next(benchmarks_dir.glob("remat/random_layered_n100_*.json")))
    for flags, expected in (([], False), (["--deterministic"], True)):
        out = CliRunner().invoke(cli.main, ["plan", graph, "--budget", "80%", "--time-limit", "5", "--json", *flags])
        assert out.exit_code == 0, out.output
        obj = json.loads(out.stdout)
        assert obj["status"] == "optimal" and obj["solver"]["clock"] == ("work" if expected else "wall")
        assert seen[-1] is expected


def test_plan_wall_cap_reaches_the_planner_and_needs_deterministic(benchmarks_dir, monkeypatch):
    seen = spy_solve(monkeypatch, lambda options: options.wall_deadline)
    graph = str(next(benchmarks_dir.glob("remat/random_layered_n100_*.json")))
    for flags in (["--wall-cap", "600"], []):
        before = clock.wall_deadline(0)
        out = CliRunner().invoke(cli.main, ["plan", graph, "--budget", "80%", "--time-limit", "5", "--json",
                                            "--deterministic", *flags])
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["solver"]["wall_capped"] is False
        assert (before + 600 <= seen[-1] <= clock.wall_deadline(600)) if flags else seen[-1] == math.inf
    planned = len(seen)
    for flags, says in ((["--wall-cap", "5"], "--wall-cap caps a --deterministic solve"),
                        (["--wall-cap", "0", "--deterministic"], "--wall-cap")):
        out = CliRunner().invoke(cli.main, ["plan", graph, "--budget", "80%", *flags])
        assert out.exit_code == 2 and says in out.output, out.output
    assert len(seen) == planned  # refused before planning


def test_bench_remat_records_the_clock(benchmarks_dir, tmp_path):
    out = CliRunner().invoke(cli.main, ["bench", "remat", "--dir", str(benchmarks_dir / "remat"), "--graph", "VGG16",
                                        "--budgets", "90", "--strategies", "cpsat", "--time-limit", "5", "--deterministic",
                                        "-o", str(tmp_path / "rows.json")])
    assert out.exit_code == 0, out.output
    obj = json.loads((tmp_path / "rows.json").read_text())
    assert obj["deterministic"] is True and obj["rows"][0]["status"] == "optimal"


def test_check_deterministic_flag_reaches_the_planner(monkeypatch):
    from tests.helpers import spy_plan_graph

    seen = spy_plan_graph(monkeypatch, lambda options: options.work_limit)
    for flags, expected in (([], False), (["--deterministic"], True)):
        out = CliRunner().invoke(cli.main, ["check", "zoo:gpt", "--train", "--budget", "80%", "--time-limit", "1",
                                            *flags])
        assert out.exit_code == 0, out.output
        assert seen and seen[-1] is expected


def test_each_phase_reports_its_own_wall_time_on_the_work_clock(benchmarks_dir):
    """The closure-cuts phase reported clock.wall_since(its start), which on the work clock is the
    time since the whole solve began: on RL100 at 70% each of its rounds said ~1.9 s in a 2 s
    solve, and the phases added up to more than the solve."""
    p = random_layered(benchmarks_dir, 100)
    res = solve(p, p.budget_for(0.70), "cpsat", replace(OPTS, time_limit=2))
    names = [ph["name"] for ph in res.solver.phases]
    assert "closure-cuts" in names, names
    assert sum(ph["wall_s"] for ph in res.solver.phases) <= res.solver.wall_s + 0.05, res.solver.phases


def test_a_model_build_past_the_wall_limit_stops_and_searches_nothing(benchmarks_dir, monkeypatch):
    # The first model of the lstm fixture (batch 8, seq 128: 2294 fused nodes) took 13 s to build,
    # 9 s to hint and 12 s to load into CP-SAT for its 0.05-s search under --time-limit 2, which
    # then found nothing: `memplan plan` took 52 s. Building now stops once the limit has passed.
    import time

    from planner.cpsat import RematModel

    p = random_layered(benchmarks_dir, 100)
    late = [0.0]
    monkeypatch.setattr(clock, "_wall", lambda: time.perf_counter() + late[0])
    add_order = RematModel._add_order

    def slow_order(self):  # building takes the whole limit, halfway through
        add_order(self)
        late[0] += 100.0

    monkeypatch.setattr(RematModel, "_add_order", slow_order)
    searched = []
    run = RematModel.solve
    monkeypatch.setattr(RematModel, "solve", lambda self, *a, **k: searched.append(a[0]) or run(self, *a, **k))
    opt = PlannerOptions(time_limit=2, workers=1, seed=0, reorder=False, early_walk_share=0.0)
    for fraction in (0.65, 0.8):  # phase 1's model (no light plan fits), phase 2's (one does)
        res = solve(p, p.budget_for(fraction), "cpsat", opt)
        assert not searched, searched
        assert res.plan is None or (res.peak_bytes <= res.budget_bytes and "no time left to search" in res.note)
    from planner.cpsat import OutOfTime

    with pytest.raises(OutOfTime):  # on its own: past its deadline, the build stops
        RematModel(p, None, opt, deadline=clock.now() - 1.0)
    # on the work clock no build time counts: the same build completes
    with clock.work_clock(math.inf):
        RematModel(p, None, opt, deadline=clock.now() - 1.0)


def test_max_batch_says_the_wall_cap_warning_once(monkeypatch, caplog):
    """Every --max-batch probe after the --wall-cap passed is capped at once: the warning was printed
    once per batch tried (memplan plan zoo:cnn --budget 4MiB --max-batch --time-limit 2 --deterministic
    --wall-cap 1: 6 times); it is now said once per command, and again by the next command."""
    argv = ["plan", "zoo:mlp", "--budget", "1MiB", "--max-batch", "--time-limit", "1", "--deterministic",
            "--wall-cap", "1", "--json"]
    for _ in range(2):
        caplog.clear()
        crawling_wall(monkeypatch)  # the cap passes in the first probe's solve
        out = CliRunner().invoke(cli.main, argv)
        assert out.exit_code in (0, 4), out.output
        said = [r for r in caplog.records if "--wall-cap stopped" in r.getMessage()]
        assert len(said) == 1, [r.getMessage() for r in said]


def test_the_greedies_charge_their_work_and_stop_at_a_work_clock_deadline(benchmarks_dir):
    # the eviction and checkpoint greedies read their deadline but charged the work clock nothing,
    # so on it no deadline ever ended them: the lstm fixture (batch 8, seq 128) at 80% ran the
    # phase-1 ladder's greedies for over 10 minutes of a `--time-limit 1 --deterministic` solve
    from planner.chain_greedy import checkpoint_greedy
    from planner.greedy import evict_greedy

    for make, n, fraction in ((checkpoint_greedy, 100, 0.72), (evict_greedy, 250, 0.8)):
        p = random_layered(benchmarks_dir, n)
        budget = p.budget_for(fraction)
        with clock.work_clock():
            whole = make(p, budget)
            spent = clock.now()
        assert whole is not None and spent > 0  # in time it finds its plan, and its work shows
        with clock.work_clock():
            again = make(p, budget, deadline=clock.now() + spent)
            assert clock.now() == pytest.approx(spent)  # the same count: the same plan
        assert again is not None and again.events == whole.events
        with clock.work_clock():
            assert make(p, budget, deadline=clock.now() + 0.5 * spent) is None  # stopped half-way
            assert clock.now() < spent


def test_the_eviction_greedy_stops_at_its_deadline_within_a_step(benchmarks_dir, monkeypatch):
    """One step's recomputes may weigh millions of buffers (RL1000 at 50% in a memory-aware order:
    29 s past a deadline 18 s away, read only between steps): the deadline ends a step too."""
    from planner import greedy

    p = random_layered(benchmarks_dir, 250)
    budget = p.budget_for(0.8)
    charge, at = clock.charge, []

    def logged(seconds: float) -> None:
        charge(seconds)
        at.append(clock.now())

    monkeypatch.setattr(clock, "charge", logged)
    monkeypatch.setattr(greedy, "WEIGHED_PER_CHECK", 10**12, raising=False)  # charged between steps only
    with clock.work_clock():
        assert greedy.evict_greedy(p, budget) is not None
    start, length = max(((a, b - a) for a, b in zip(at, at[1:])), key=lambda s: s[1])  # the longest step
    monkeypatch.setattr(greedy, "WEIGHED_PER_CHECK", 100)
    with clock.work_clock():
        deadline = start + 0.5 * length
        assert greedy.evict_greedy(p, budget, deadline=deadline) is None
        assert clock.now() - deadline < 0.25 * length  # not at the step's end


def test_the_ladder_stops_once_its_charged_work_passes_its_deadline(benchmarks_dir, monkeypatch):
    # planner.planning._lowest_greedy bisects the budget greedy's budget, each rung running every
    # greedy; on the work clock a deadline that the first greedy's work passes ends the ladder there
    import planner.chain_greedy as cg
    from planner.baselines import chen_sqrt
    from planner.planning import _lowest_greedy
    from planner.simulate import simulate

    p = random_layered(benchmarks_dir, 100)
    budget = p.budget_for(0.6)
    chen = chen_sqrt(p)
    start = baselines_candidate(p, chen, simulate)
    runs = []
    real = cg.chain_run
    monkeypatch.setattr(cg, "chain_run", lambda *a, **k: runs.append(1) or real(*a, **k))
    with clock.work_clock():
        low = _lowest_greedy(p, budget, [start], 6, math.inf, clock.now() + 1e-4)
        spent = clock.now()
    assert low is start and not runs  # the eviction greedy's work passed it: no checkpoint round ran
    assert spent < 0.05
    with clock.work_clock():
        _lowest_greedy(p, budget, [start], 6, math.inf)
    assert len(runs) > 6  # without a deadline, every rung runs the checkpoint greedy's rounds


def baselines_candidate(p, plan, simulate):
    from planner.baselines import Candidate

    return Candidate(plan, simulate(p, plan))


def test_the_comparison_baselines_finish_at_a_short_limit_and_charge_it_nothing(benchmarks_dir):
    # charged, the given order's baselines stopped at a short --deterministic limit, and cpsat
    # returned plans dearer than --strategy greedy (zoo:unet at 60%, 0.3 s); uncharged, they ran
    # on without end (the lstm fixture, batch 8, seq 128: minutes of a --time-limit 1 solve). They
    # now get at least the floor, what they charge is taken back, and a graph whose greedies need
    # more than the floor is stopped there
    from planner.baselines import greedy
    from planner.planning import _baselines

    p = random_layered(benchmarks_dir, 100)
    budget = p.budget_for(0.6)
    with clock.work_clock():
        whole = greedy(p, budget)
        spent = clock.now()
    assert whole is not None and spent > 0
    with clock.work_clock():
        cands = _baselines(p, budget, clock.now() + 1e-6, floor=2 * spent)
        assert clock.now() == 0.0  # charged nothing
    assert cands["greedy"].plan == whole.plan
    with clock.work_clock():
        cut = _baselines(p, budget, clock.now() + 1e-6, floor=0.1 * spent)
        assert clock.now() == 0.0
    assert "greedy" not in cut or cut["greedy"].sim.added_time > whole.sim.added_time


def test_strategy_greedy_stops_at_its_time_limit(benchmarks_dir):
    # `plan --strategy greedy` ran its greedies without a deadline: the lstm fixture (batch 8,
    # seq 128) at 80% with --time-limit 1 ran over 300 s. Now they stop at the limit, and a run
    # they found nothing in by then is a timeout (exit 4, "a longer --time-limit"), not a verdict
    from planner.planning import TIMED_OUT

    p = random_layered(benchmarks_dir, 250)
    budget = p.budget_for(0.6)
    with clock.work_clock():
        whole = solve(p, budget, "greedy", replace(OPTS, time_limit=1e6))
        spent = clock.now()
    assert whole.status == "over_budget" and spent > 0  # every greedy ran to its end: no plan fits
    with clock.work_clock():
        cut = solve(p, budget, "greedy", replace(OPTS, time_limit=0.1 * spent))
        assert clock.now() < 0.5 * spent  # stopped near its limit
    assert cut.status == "timeout" and cut.plan is None and cut.note.startswith(TIMED_OUT)


def test_the_split_greedy_stops_at_a_work_clock_deadline(benchmarks_dir):
    from planner.greedy import split_greedy_simulated

    p = random_layered(benchmarks_dir, 250)
    budget = p.budget_for(0.9)
    with clock.work_clock():
        whole = split_greedy_simulated(p, budget)
        spent = clock.now()
    assert whole is not None and spent > 0
    with clock.work_clock():
        again = split_greedy_simulated(p, budget, deadline=clock.now() + spent)
    assert again is not None and again[0].events == whole[0].events
    with clock.work_clock():
        assert split_greedy_simulated(p, budget, deadline=clock.now() + 0.5 * spent) is None
        assert clock.now() < spent


def test_a_short_limit_leaves_the_given_orders_baselines_their_floor(benchmarks_dir):
    # RL100 at 60%: no baseline fits in the memory-aware order, so the given order's baselines
    # decide where the time goes (planner.planning._solve_reordered). At 0.05 deterministic s their
    # share of the limit stops the greedy before its plan; with the floor it finishes, and the solve
    # returns a plan no dearer than it (without the floor there: no plan, a timeout)
    from planner.baselines import greedy

    p = random_layered(benchmarks_dir, 100)
    budget = p.budget_for(0.6)
    res = solve(p, budget, "cpsat", replace(OPTS, time_limit=0.05))
    with clock.work_clock():
        alone = greedy(p, budget)
    assert res.plan is not None and res.peak_bytes <= budget and res.order == "given"
    assert "planned in the given order only" in res.note
    assert alone is not None and res.added_time <= alone.sim.added_time


def test_the_split_greedy_charges_every_buffer_it_weighs(benchmarks_dir, monkeypatch):
    # a step for each buffer weighed at the peak and each move popped (planner.greedy.STEP_SECONDS):
    # a charge for the pops alone counted 58 of the 422 on RL250 at 90%
    import heapq
    import types

    import planner.greedy as g

    weighed, popped = [0], [0]
    counting = types.SimpleNamespace(
        heapify=lambda h: weighed.__setitem__(0, weighed[0] + len(h)) or heapq.heapify(h),
        heappop=lambda h: popped.__setitem__(0, popped[0] + 1) or heapq.heappop(h),
        heappush=heapq.heappush)
    monkeypatch.setattr(g, "heapq", counting)
    p = random_layered(benchmarks_dir, 250)
    with clock.work_clock():
        assert g.split_greedy_simulated(p, p.budget_for(0.9)) is not None
        spent = clock.now()
    assert weighed[0] > popped[0] > 0
    assert spent >= (weighed[0] + popped[0]) * g.STEP_SECONDS
