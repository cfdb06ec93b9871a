"""Greedy offset assignment: place buffers one by one into the best-fitting gap (several orders).

This is the classic rule of TFLite's greedy-by-size and XLA's decreasing-size best-fit heap,
tried under a few buffer orders; the lowest arena wins. It is fast (numpy per buffer), always
valid, and serves as the default answer, as the upper bound of a minimization and as a fallback
when the exact search runs out of time. Each placement takes a pass over all buffers, so an order
costs O(n^2): the first order always runs (an answer is needed), later ones stop at the deadline.
"""
from __future__ import annotations

import math

import numpy as np

from planner import clock

#: Orders tried, as sort keys (all descending unless noted). Each finds arenas the others miss:
#: size is the classic; area favours long-lived big buffers; span packs long lifespans first;
#: "start" sweeps time left to right (ascending start, then size).
GREEDY_ORDERS = ("size", "area", "span", "start")
#: What one placement charges the work clock (planner/clock.py), and what each buffer its pass
#: looks at adds: about its wall time here (random problems, one order: 37 us a step at 200
#: buffers, 148 us at 20,000).
STEP_SECONDS = 4e-5
BUFFER_SECONDS = 5.5e-9
#: Placements between readings of the clock (each reading charges the steps since the last).
CLOCK_STEPS = 64


def greedy_offsets(first, stop, size, align, order: str, deadline: float = math.inf) -> np.ndarray | None:
    """Offsets from best-fit placement in the given order (lifespans are half-open [first, stop)),
    or None once the clock (planner/clock.py) reads past ``deadline``."""
    first, stop = np.asarray(first, np.int64), np.asarray(stop, np.int64)
    size, align = np.asarray(size, np.int64), np.asarray(align, np.int64)
    n = size.size
    span = stop - first
    keys = {
        "size": (np.arange(n), -span, -size),
        "area": (np.arange(n), -size, -(size * span)),
        "span": (np.arange(n), -size, -span),
        "start": (np.arange(n), -size, first),
    }[order]
    offsets = np.full(n, -1, np.int64)
    placed = np.zeros(n, bool)
    # a mask over all buffers, not a list of the placed ones: turning that list into an array at
    # every step took 69 of the 92 s that 20,000 buffers spent here under --time-limit 3 (the
    # best fit depends only on which intervals are near, not on their order)
    for step, b in enumerate(np.lexsort(keys).tolist(), start=1):
        near = np.flatnonzero(placed & (first < stop[b]) & (first[b] < stop))
        offsets[b] = _best_fit(offsets[near], offsets[near] + size[near], int(size[b]), int(align[b]))
        placed[b] = True
        if step % CLOCK_STEPS == 0 or step == n:  # the last steps are charged too, not read
            clock.charge(((step - 1) % CLOCK_STEPS + 1) * (STEP_SECONDS + n * BUFFER_SECONDS))
            if step < n and clock.now() > deadline:
                return None
    return offsets


def _best_fit(lows: np.ndarray, highs: np.ndarray, size: int, align: int) -> int:
    """Lowest offset of the smallest free gap (between occupied [lows, highs)) that holds ``size``."""
    if lows.size == 0:
        return 0
    order = np.argsort(lows, kind="stable")
    lows, highs = lows[order], np.maximum.accumulate(highs[order])
    gap_lo = np.concatenate([[0], highs])  # a gap starts where everything below has ended
    gap_hi = np.append(lows, np.iinfo(np.int64).max)
    start = -(-gap_lo // align) * align
    fits = start + size <= gap_hi
    fits[-1] = False  # the open space above everything is the fallback, not a gap
    if fits.any():
        room = np.where(fits, gap_hi - start, np.iinfo(np.int64).max)
        return int(start[np.argmin(room)])
    return int(start[-1])


def greedy_best(first, stop, size, align, deadline: float = math.inf) -> tuple[np.ndarray, int]:
    """Best of :data:`GREEDY_ORDERS`: (offsets, height). Ties keep the earlier order. The first
    order always runs to its end; the others stop, and are left out, once the clock reads past
    ``deadline`` (20,000 buffers took 14 s of a ``--time-limit 3`` here, 3.4 s an order)."""
    size = np.asarray(size, np.int64)
    best, best_height = np.zeros(size.size, np.int64), -1
    for k, order in enumerate(GREEDY_ORDERS):
        if k and clock.now() > deadline:
            break
        offsets = greedy_offsets(first, stop, size, align, order, math.inf if k == 0 else deadline)
        if offsets is None:
            break
        height = int((offsets + size).max()) if size.size else 0
        if best_height < 0 or height < best_height:
            best, best_height = offsets, height
    return best, max(best_height, 0)
