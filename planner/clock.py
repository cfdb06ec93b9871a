"""The clock a solve's time limit runs on.

By default, the wall clock: a solve cut short by its limit returns what it found by then, and on a
loaded machine that can be another plan than on an idle one (RL100 at 65%, two runs of one command
on this 2-core machine: +10.03% and +6.72%). On the *work clock* (``PlannerOptions.work_limit``,
``memplan plan --deterministic``) the limit counts CP-SAT's deterministic time instead: every
solver run gets its share as ``max_deterministic_time`` and charges what it used, and the Python
searches that read a deadline (greedies, walks, polish, the exact search) charge a fixed price
per basic step they take (a count of their work, calibrated to about a wall second per unit on
the 2-core machine of the figures), so every decision the planner takes on "time left" is the
same on every machine and under any load. Work that charges nothing (model building) never
ends a deadline; a search that read one and charged nothing ran on without end there (the lstm
fixture, batch 8, seq 128, at 80%: over 15 minutes of a ``--time-limit 1`` solve, 98% of it in
the comparison baselines' greedies). Those baselines (planner.planning._baselines: the plans a
solve is never dearer than) run :func:`uncharged`, to a deadline of at least
``PlannerOptions.baseline_work_floor`` charged seconds, so a short limit neither stops nor is
spent by them. A solve's Python searches thus charge at most its limit, plus that floor (or the
baselines' share of the limit, if larger) per set of baselines it runs. The wall time such a solve takes varies,
and CP-SAT's deterministic seconds can run far slower than wall ones: the lstm fixture (batch 32,
2294 fused nodes) at 80% spent 60 wall s on 2.6 deterministic ones, and a ``--time-limit 5``
solve took 532 s. So the work clock may have a wall deadline too (``PlannerOptions.wall_deadline``,
``memplan --wall-cap``, one for the whole command): past it, every solver run stops and the clock
jumps past every deadline, so the solve ends with what it has and :func:`capped` says so (that
plan may then differ on another machine).
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager


#: How far the work clock jumps once its wall deadline is passed: past any deadline a solve sets.
CAPPED_JUMP = 1e9


class _Work:
    def __init__(self, wall_deadline: float) -> None:
        self.spent = 0.0  # deterministic seconds charged so far (less those refunded)
        self.charged = 0.0  # every charge made so far (what :func:`uncharged` refunds from)
        self.wall0 = _wall()
        self.wall_deadline = wall_deadline  # the wall reading past which the clock jumps (math.inf: never)
        self.capped = False

    def check_cap(self) -> None:
        if not self.capped and _wall() > self.wall_deadline:
            self.capped = True
            self.spent += CAPPED_JUMP


_work: _Work | None = None
_wall = time.perf_counter  # the wall clock (a test may slow it down)


def now() -> float:
    """The limit's clock, in seconds (only differences between readings mean anything)."""
    if _work is None:
        return _wall()
    _work.check_cap()
    return _work.spent


def on_work_clock() -> bool:
    return _work is not None


def charge(seconds: float) -> None:
    """Charge a solver run's deterministic time, or a search's counted work, to the work clock
    (nothing on the wall clock)."""
    if _work is not None:
        _work.spent += max(0.0, float(seconds))
        _work.charged += max(0.0, float(seconds))


@contextmanager
def uncharged() -> Iterator[None]:
    """Run the block on the work clock, its charges advancing :func:`now` (so deadlines inside it
    end it), then take them back: the block's work counts against no later deadline. For the
    comparison baselines (planner.planning._baselines), which a short limit must not starve and
    whose own deadline bounds them. A wall cap passed inside stays passed."""
    if _work is None:
        yield
        return
    work, before = _work, _work.charged
    try:
        yield
    finally:
        work.spent -= work.charged - before
        work.charged = before


def wall_deadline(seconds: float) -> float:
    """The wall reading ``seconds`` from now: a work clock's ``wall_deadline``."""
    return _wall() + seconds


def capped() -> bool:
    """The work clock passed its wall deadline (False on the wall clock)."""
    if _work is None:
        return False
    _work.check_cap()
    return _work.capped


def wall_since(start: float) -> float:
    """Wall seconds since ``start`` (a :func:`now` reading); on the work clock, since it started."""
    return _wall() - (start if _work is None else _work.wall0)


@contextmanager
def work_clock(wall_deadline: float = math.inf) -> Iterator[None]:
    """Run the block on a fresh work clock (nested: the outer one's stays as it was) that jumps
    past every deadline once the wall clock reads past ``wall_deadline`` (:func:`wall_deadline`)."""
    global _work
    outer, _work = _work, _Work(wall_deadline)
    try:
        yield
    finally:
        _work = outer


def limit_solver(parameters, seconds: float) -> None:
    """Give a CP-SAT run ``seconds`` on the limit's clock (wall seconds or deterministic ones)."""
    if _work is None:
        parameters.max_time_in_seconds = max(0.05, float(seconds))
    else:
        parameters.max_deterministic_time = max(0.05, float(seconds))
        if math.isfinite(_work.wall_deadline):
            parameters.max_time_in_seconds = max(0.05, _work.wall_deadline - _wall())
