"""The clock a solve's time limit runs on.

By default, the wall clock: a solve cut short by its limit returns what it found by then, and on a
loaded machine that can be another plan than on an idle one (RL100 at 65%, two runs of one command
on this 2-core machine: +10.03% and +6.72%). On the *work clock* (``PlannerOptions.work_limit``,
``memplan plan --deterministic``) the limit counts CP-SAT's deterministic time instead: every
solver run gets its share as ``max_deterministic_time`` and charges what it used; nothing else
(greedies, model building) advances the clock, so every decision the planner takes on "time
left" is the same on every machine and under any load. The wall time such a solve takes varies.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class _Work:
    def __init__(self) -> None:
        self.spent = 0.0  # deterministic seconds charged so far
        self.wall0 = _wall()


_work: _Work | None = None
_wall = time.perf_counter  # the wall clock (a test may slow it down)


def now() -> float:
    """The limit's clock, in seconds (only differences between readings mean anything)."""
    return _wall() if _work is None else _work.spent


def on_work_clock() -> bool:
    return _work is not None


def charge(seconds: float) -> None:
    """Charge a solver run's deterministic time to the work clock (nothing on the wall clock)."""
    if _work is not None:
        _work.spent += max(0.0, float(seconds))


def wall_since(start: float) -> float:
    """Wall seconds since ``start`` (a :func:`now` reading); on the work clock, since it started."""
    return _wall() - (start if _work is None else _work.wall0)


@contextmanager
def work_clock() -> Iterator[None]:
    """Run the block on a fresh work clock (nested: the outer one's stays as it was)."""
    global _work
    outer, _work = _work, _Work()
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
