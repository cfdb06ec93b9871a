"""CP-SAT must not abort the process on the small problems memplan builds.

CP-SAT 9.15 with interleaved workers (2 or more) aborts (a failed CHECK, no exception) when a
solution callback stops the search on the solution it took from a complete hint
(planner.cpsat.COMPLETE_HINT). The solves run in a child process: an abort there fails the test
instead of killing pytest."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from planner.baselines import no_remat
from planner.cpsat import PlannerOptions, RematModel
from planner.planning import solve
from planner.problem import PlanningProblem
from planner.simulate import simulate
from tests.helpers import random_dag

ROOT = Path(__file__).resolve().parent.parent
# workers=2 and deterministic (the default): interleaved workers, where the abort happens
OPTS = PlannerOptions(time_limit=2, workers=2, seed=0)


def _random_problem(rng: np.random.Generator) -> PlanningProblem:
    """3..7 nodes, the last pinned and others at random where nobody reads them; some nodes write
    into the buffer of an input only they read (takes_over); a node read twice that takes over
    no buffer may have its output in two buffers that die apart (parts)."""
    preds, size, readers, pinned, over = random_dag(rng, 7, lambda r: bool(r.integers(2)))
    n = len(preds)
    parts: list[list[tuple[int, list[int]]]] = [[] for _ in range(n)]
    for v in range(n):
        if len(readers[v]) >= 2 and not pinned[v] and size[v] >= 2 and rng.integers(2) and over[v] < 0:
            a = int(rng.integers(1, size[v]))
            parts[v] = [(a, readers[v][:1]), (size[v] - a, readers[v])]
    return PlanningProblem.build(size=size, cost=[float(x) for x in rng.integers(1, 4, size=n)], preds=preds,
                                 pinned=pinned, takes_over=over, parts=parts if any(parts) else None)


def _check(p: PlanningProblem, budget: int) -> None:
    """A plan within ``budget`` that simulate() accepts, or a clean infeasible / timeout."""
    res = solve(p, budget, "cpsat", OPTS)
    if res.plan is None:
        assert res.status in ("infeasible", "timeout"), res
        return
    assert simulate(p, res.plan, budget).peak_bytes == res.peak_bytes <= budget, res


def _phase1_from_a_fitting_hint(p: PlanningProblem) -> None:
    """Phase 1 (min peak, stopping at a target) hinted with the no-remat plan, the target the
    capacity's upper end: every solution is within it, the complete hint's first (a re-solve
    starts from a plan near its target too)."""
    m = RematModel(p, None, OPTS, [no_remat(p)])
    m.set_objective_peak()
    hint = m.hint_from_plan(no_remat(p))
    assert hint is not None
    m.apply_hint(hint)
    target = int(list(m.m.Proto().variables[m.cap.Index()].domain)[-1])
    r = m.solve("feasibility", 2, stop_at=target)
    assert r.objective is not None and r.objective <= target, r


def run_all(count: int) -> None:
    """Solve ``count`` random problems at a tight, a middle and a loose budget, and phase 1 of each
    from a hint within its target (the child's work)."""
    rng = np.random.default_rng(0)
    for _ in range(count):
        p = _random_problem(rng)
        lo, hi = p.memory_floor, p.unplanned_peak
        for budget in sorted({lo, (lo + hi) // 2, hi, hi + 1}):
            _check(p, budget)
        _phase1_from_a_fitting_hint(p)


def _in_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_hint_that_already_reaches_the_target_does_not_abort_the_process():
    # phase 1 hinted with the no-remat plan, which the model counts at 15 bytes (3 units of 5),
    # its target: the callback stopped on the hint's own solution and CP-SAT aborted
    code = ("from tests.test_cpsat_abort import _check; from planner.problem import PlanningProblem; "
            "_check(PlanningProblem.build(size=[5, 10, 10], cost=[1, 1, 1], preds=[[], [], [0, 1]], "
            "pinned=[False, False, True], takes_over=[-1, -1, 1]), 16)")
    done = _in_child(code)
    assert done.returncode == 0, done.stderr[-2000:]


def test_random_small_problems_plan_or_fail_cleanly_with_two_workers():
    done = _in_child("from tests.test_cpsat_abort import run_all; run_all(12)")
    assert done.returncode == 0, done.stderr[-2000:]
