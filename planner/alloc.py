"""Static arena allocation: fixed offsets for buffers with known lifespans, in one arena.

A plan's peak is a sum of live bytes; a real arena also pays fragmentation. This module places
every buffer at a fixed offset so that buffers alive at the same time never share bytes, in an
arena whose height is the lower bound (the most bytes ever live) or provably close to it.

    buffers = [Buffer("a", 0, 3, 4), Buffer("b", 3, 9, 4), ...]   # half-open [lower, upper)
    result = solve(buffers, capacity=12)          # decision: fit in 12 bytes
    result = solve(buffers)                       # minimize the height (greedy first, then exact)
    validate(buffers, result.offsets, 12)         # every result has passed this already

Pipeline: the lower bound; the best of a few greedy best-fit orders (often enough, always the
fallback); then, when greedy misses, an exact portfolio per independent block: the skyline
branch and bound of :mod:`planner.alloc_search` interleaved with the CP-SAT model of
:mod:`planner.alloc_cpsat`, under doubling deterministic budgets and the wall-clock limit.
"""
from __future__ import annotations

import bisect
import enum
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from planner import clock
from planner.alloc_cpsat import cpsat_pack
from planner.alloc_greedy import greedy_best
from planner.alloc_search import (
    Reduced, Restarts, SearchStatus, independent_blocks, reduce_problem, section_totals, subproblem,
)
from planner.errors import ModelImportError, PlannerError

log = logging.getLogger(__name__)

#: Default wall-clock limit of :func:`solve` in seconds; the exact search stops there and the
#: best valid placement found so far is returned.
DEFAULT_TIME_LIMIT = 10.0
#: Exact search is skipped for a block whose lifespans cover more (buffer, section) pairs than
#: this: both exact methods hold arrays of that size and step through them at every node, so
#: past it greedy's answer stands (long-lived buffers over thousands of steps get there first).
EXACT_MAX_PAIRS = 2_000_000
#: First CP-SAT deterministic-time slice per block (about 0.3 s of wall time here; doubles each
#: round, like the node budget of the skyline search).
CPSAT_FIRST_SLICE = 0.01
#: The most bytes all buffers may take together (sizes plus alignment padding): every height and
#: offset the solvers compute stays below it, within int64 and under the search's "no place"
#: marker (2**61). 9000 overlapping buffers of 2**50 bytes each wrapped the lower bound negative.
MAX_TOTAL_BYTES = 2**60


@dataclass(frozen=True, slots=True)
class Buffer:
    """One buffer: bytes ``size`` alive over the half-open interval ``[lower, upper)``."""

    id: str
    lower: int
    upper: int
    size: int  # bytes, >= 0
    alignment: int = 1  # the offset must be a multiple of it


class AllocStatus(str, enum.Enum):
    OPTIMAL = "optimal"  # height proven least (it equals the lower bound, or less was infeasible)
    FEASIBLE = "feasible"  # a valid placement; a lower height is not ruled out
    INFEASIBLE = "infeasible"  # proven: nothing fits the capacity
    TIMEOUT = "timeout"  # no placement within the capacity found in time, none ruled out


class PlacementError(PlannerError):
    """Offsets that break the arena: two live buffers overlap, or a buffer is out of bounds."""


@dataclass(frozen=True)
class AllocResult:
    """Outcome of :func:`solve` or :func:`greedy`; offsets follow the input buffer order."""

    status: AllocStatus
    offsets: tuple[int, ...] | None  # None unless a placement was found
    height: int | None  # max(offset + size): the arena bytes the placement needs
    lower_bound: int  # most bytes live at once: no placement is lower
    capacity: int | None  # the capacity asked for (None: minimize freely)
    greedy_height: int  # best greedy arena, for reference
    wall_s: float
    method: str  # "greedy" or "exact": what produced the offsets
    stats: dict = field(default_factory=dict, compare=False)

    @property
    def proven_bound(self) -> int:
        """The least height proven: the lower bound, raised where the exact search ruled lower
        heights out (``stats["proven_bound"]``)."""
        return max(self.lower_bound, int(self.stats.get("proven_bound") or 0))

    @property
    def gap(self) -> float | None:
        """(height - proven bound) / proven bound; 0.0 at the bound (an optimal placement: the
        repro of a height of 11 proven least over a lower bound of 10 said gap 0.1)."""
        if self.height is None:
            return None
        bound = self.proven_bound
        return (self.height - bound) / bound if bound else 0.0

    def to_json(self) -> dict:
        return {
            "status": self.status.value, "height": self.height, "lower_bound": self.lower_bound,
            "gap": self.gap, "capacity": self.capacity, "greedy_height": self.greedy_height,
            "method": self.method, "wall_s": round(self.wall_s, 4), **self.stats,
        }


def check_buffers(buffers: Sequence[Buffer]) -> None:
    """Reject malformed buffers with one line naming the buffer, the value and the fix."""
    seen: set[str] = set()
    for b in buffers:
        if b.id in seen:
            raise ModelImportError(f"buffer id {b.id!r} appears twice; ids must be unique")
        seen.add(b.id)
        if b.size < 0:
            raise ModelImportError(f"buffer {b.id!r}: size {b.size} is negative; sizes are bytes >= 0")
        if b.upper <= b.lower:
            raise ModelImportError(
                f"buffer {b.id!r}: upper {b.upper} <= lower {b.lower}; lifespans are half-open "
                "[lower, upper) with upper > lower"
            )
        if b.alignment < 1:
            raise ModelImportError(f"buffer {b.id!r}: alignment {b.alignment} must be >= 1")
    total = sum(b.size + b.alignment - 1 for b in buffers)
    if total > MAX_TOTAL_BYTES:
        raise ModelImportError(
            f"the buffers take {total} bytes in all (sizes plus alignment), over the 2**60 the solvers' "
            "64-bit sums hold; give sizes and alignments in a coarser unit or split the problem"
        )


def lower_bound(buffers: Sequence[Buffer]) -> int:
    """Most bytes live at one time (no arena can be lower)."""
    if not buffers:
        return 0
    return most_live([b.lower for b in buffers], [b.upper for b in buffers], [b.size for b in buffers])


def most_live(lower: Sequence[int], upper: Sequence[int], size: Sequence[int]) -> int:
    """Most of ``size`` live at one time over the half-open intervals [lower, upper)."""
    size_a = np.asarray(size, np.int64)
    times = np.concatenate([np.asarray(lower, np.int64), np.asarray(upper, np.int64)])
    delta = np.concatenate([size_a, -size_a])
    order = np.lexsort((delta, times))  # at equal times frees (negative) come first: half-open
    return int(np.cumsum(delta[order]).max(initial=0))


def validate(buffers: Sequence[Buffer], offsets: Sequence[int] | None, capacity: int | None = None) -> None:
    """Raise PlacementError unless offsets are aligned, within ``capacity`` and overlap-free."""
    if offsets is None or len(offsets) != len(buffers):
        raise PlacementError(f"expected {len(buffers)} offsets, got {None if offsets is None else len(offsets)}")
    off = np.asarray(offsets, np.int64)
    lower = np.array([b.lower for b in buffers], np.int64)
    upper = np.array([b.upper for b in buffers], np.int64)
    size = np.array([b.size for b in buffers], np.int64)
    align = np.array([b.alignment for b in buffers], np.int64)
    out = (off < 0) | (off + size > capacity) if capacity is not None else off < 0
    for i in np.flatnonzero(out | (off % np.maximum(align, 1) != 0))[:1].tolist():
        b = buffers[i]
        if out[i]:
            raise PlacementError(f"buffer {b.id!r} at offset {off[i]} (+{b.size} bytes) leaves the arena [0, {capacity})")
        raise PlacementError(f"buffer {b.id!r} at offset {off[i]} is not a multiple of its alignment {b.alignment}")
    clash = _first_overlap(lower, upper, off, size)
    if clash is not None:
        i, j = clash
        raise PlacementError(
            f"buffers {buffers[i].id!r} [{off[i]}, {off[i] + size[i]}) and {buffers[j].id!r} "
            f"[{off[j]}, {off[j] + size[j]}) overlap while both are live"
        )


def _first_overlap(lower: np.ndarray, upper: np.ndarray, off: np.ndarray, size: np.ndarray) -> tuple[int, int] | None:
    """Two buffers (by index, ascending) that share bytes while both are live, or None.

    Any two such buffers meet when the later-starting one starts, so a sweep over starts that
    checks each buffer against those live then finds every overlap (an all-pairs check took 1.8 s
    of 20,000 buffers). Up to the first overlap those live buffers are disjoint, sorted by offset,
    so the neighbours at the new offset are the only ones to check. Empty buffers share nothing;
    lifespans are half-open, so at one time the ends come before the starts.
    """
    real = np.flatnonzero((size > 0) & (upper > lower))  # an empty lifespan is never live
    times = np.concatenate([upper[real], lower[real]])
    kind = np.repeat([0, 1], real.size)  # 0: an end, 1: a start
    who = np.concatenate([real, real])
    lows: list[int] = []  # offsets of the live buffers, ascending
    ids: list[int] = []
    for e in np.lexsort((kind, times)).tolist():
        b = int(who[e])
        lo, hi = int(off[b]), int(off[b] + size[b])
        k = bisect.bisect_left(lows, lo)
        if not kind[e]:  # live buffers have distinct offsets (no overlap yet): ids[k] is b
            del lows[k], ids[k]
            continue
        for j in (ids[k - 1:k] + ids[k:k + 1]):
            if off[j] < hi and lo < off[j] + size[j]:
                return min(b, j), max(b, j)
        lows.insert(k, lo)
        ids.insert(k, b)
    return None


class _Portfolio:
    """Exact decisions on a reduced problem, block by block; each block's greedy answer is cached.

    Independent blocks (no buffer crosses between them) are decided separately, tightest first,
    so an infeasible block is found early and a solved one is never searched again.
    """

    def __init__(self, red: Reduced, deadline: float = math.inf):
        self.red = red
        self.blocks = []
        for idx in independent_blocks(red):  # every block's first greedy order runs, past the deadline too
            sub = subproblem(red, idx)
            off, height = greedy_best(sub.first, sub.stop, sub.size, sub.align, deadline)
            self.blocks.append((idx, sub, off, height, int(section_totals(sub).max())))
        self.stats = {"search_nodes": 0, "cpsat_calls": 0, "probes": 0, "too_large_blocks": 0}

    def greedy(self) -> tuple[np.ndarray, int]:
        offsets = np.zeros(self.red.n, np.int64)
        for idx, _, off, _, _ in self.blocks:
            offsets[idx] = off
        return offsets, max((h for *_, h, _ in self.blocks), default=0)

    def decide(self, capacity: int, deadline: float) -> tuple[SearchStatus, np.ndarray | None]:
        """Find offsets within ``capacity`` units, prove there are none, or run out of time."""
        self.stats["probes"] += 1
        offsets = np.zeros(self.red.n, np.int64)
        for idx, sub, off, height, lb in sorted(self.blocks, key=lambda b: b[4] - b[3]):
            if lb > capacity:
                return SearchStatus.INFEASIBLE, None
            if height > capacity:
                status, off = self._decide_block(sub, capacity, deadline)
                if status is not SearchStatus.FOUND:
                    return status, None
            offsets[idx] = off
        return SearchStatus.FOUND, offsets

    def _decide_block(self, sub: Reduced, capacity: int, deadline: float):
        """Skyline restarts and CP-SAT in turn, each round with twice the budget of the last."""
        if int((sub.stop - sub.first).sum()) > EXACT_MAX_PAIRS:
            self.stats["too_large_blocks"] += 1
            return SearchStatus.UNKNOWN, None
        search = Restarts(sub, capacity)
        nodes, det_time = 4 * search.restart_nodes, CPSAT_FIRST_SLICE
        while clock.now() < deadline:
            before = search.nodes
            status, off = search.run(nodes, deadline)
            self.stats["search_nodes"] += search.nodes - before
            if status is SearchStatus.UNKNOWN and clock.now() < deadline:
                self.stats["cpsat_calls"] += 1
                status, off = cpsat_pack(sub, capacity, det_time, deadline - clock.now())
            if status is not SearchStatus.UNKNOWN:
                return status, off
            nodes, det_time = 2 * nodes, 2 * det_time
        return SearchStatus.UNKNOWN, None


def greedy(buffers: Sequence[Buffer], capacity: int | None = None) -> AllocResult:
    """Best greedy best-fit placement (fast, valid, not optimal in general): every greedy order."""
    return solve(buffers, capacity=capacity, time_limit=0.0, greedy_limit=math.inf)


def solve(
    buffers: Iterable[Buffer], capacity: int | None = None, minimize: bool = False,
    time_limit: float = DEFAULT_TIME_LIMIT, greedy_limit: float | None = None,
) -> AllocResult:
    """Offsets for ``buffers`` in one arena.

    With ``capacity`` and not ``minimize``: any placement with every ``offset + size <= capacity``
    (a decision problem). Otherwise: the least height found within ``time_limit`` seconds (and
    within ``capacity`` if given), greedy first, then exact probes from the lower bound up. The
    greedy's first order always runs, its others within ``greedy_limit`` seconds (default
    ``time_limit``). The returned placement, if any, has passed :func:`validate`.
    """
    t0, wall0 = clock.now(), time.monotonic()  # the limit's clock (planner/clock.py), and the wall's
    buffers = tuple(buffers)
    check_buffers(buffers)
    lb = lower_bound(buffers)
    real = [i for i, b in enumerate(buffers) if b.size > 0]  # empty buffers sit at offset 0
    red = reduce_problem(
        [buffers[i].lower for i in real], [buffers[i].upper for i in real],
        [buffers[i].size for i in real], [buffers[i].alignment for i in real],
    )
    unit = red.unit
    portfolio = _Portfolio(red, t0 + (time_limit if greedy_limit is None else greedy_limit))
    g_off, g_height = portfolio.greedy()
    log.info("alloc: %d buffers in %d blocks, lower bound %d, greedy %d bytes",
             len(buffers), len(portfolio.blocks), lb, g_height * unit)

    def result(status: AllocStatus, units: np.ndarray | None, method: str, proven: int = lb) -> AllocResult:
        offsets = None
        if units is not None:
            full = np.zeros(len(buffers), np.int64)
            full[real] = units * unit
            offsets = tuple(int(x) for x in full)
            validate(buffers, offsets, capacity)
        height = None if offsets is None else max((o + b.size for o, b in zip(offsets, buffers)), default=0)
        stats = dict(portfolio.stats, buffers=len(buffers), blocks=len(portfolio.blocks), proven_bound=proven)
        return AllocResult(status, offsets, height, lb, capacity, g_height * unit,
                           time.monotonic() - wall0, method, stats)

    cap_units = None if capacity is None else capacity // unit
    if cap_units is not None and lb > capacity:
        return result(AllocStatus.INFEASIBLE, None, "bound")
    best, best_height, method = None, None, "greedy"
    if cap_units is None or g_height <= cap_units:
        best, best_height = g_off, g_height
    else:
        status, off = portfolio.decide(cap_units, t0 + time_limit)
        if status is SearchStatus.INFEASIBLE:
            return result(AllocStatus.INFEASIBLE, None, "exact")
        if status is SearchStatus.UNKNOWN:
            return result(AllocStatus.TIMEOUT, None, "exact")
        best, best_height, method = off, int((off + red.size).max()), "exact"
    lb_units = lb // unit
    if capacity is not None and not minimize:
        return result(AllocStatus.OPTIMAL if best_height == lb_units else AllocStatus.FEASIBLE, best, method)
    proven, best, best_height, improved = _tighten(portfolio, lb_units, best, best_height, t0 + time_limit)
    status = AllocStatus.OPTIMAL if best_height == proven else AllocStatus.FEASIBLE
    return result(status, best, "exact" if improved else method, proven * unit)


def _tighten(portfolio: _Portfolio, lb: int, best: np.ndarray, best_height: int, deadline: float):
    """Probe capacities below the best height: the lower bound first, then bisection.

    Returns (proven lower bound, offsets, height, improved). A probe that runs out of time proves
    nothing, so later probes look higher. The probe at the bound gets a quarter of the time (it
    is the one most likely to be infeasible without a proof), every later one half of what is left.
    """
    proven = probe_lo = lb
    improved = False
    while best_height > probe_lo and clock.now() < deadline:
        target = lb if probe_lo == lb else (probe_lo + best_height - 1) // 2
        share = 0.25 if target == lb else 0.5
        now = clock.now()
        status, off = portfolio.decide(target, now + share * (deadline - now))
        log.info("alloc: probe at %d units: %s", target, status.value)
        if status is SearchStatus.FOUND:
            best, best_height, improved = off, int((off + portfolio.red.size).max()), True
        elif status is SearchStatus.INFEASIBLE:
            proven = probe_lo = target + 1
        else:
            probe_lo = target + 1
    return proven, best, best_height, improved


def liveness_buffers(lv) -> list[Buffer]:
    """A Liveness's dynamic memory as arena buffers: one per buffer, one per step's kernel scratch.

    Lifespans are steps, half-open: a buffer resident during steps a..b is [a, b+1). The constant
    base (inputs, initializers) is not in the arena.
    """
    out = [Buffer(f"b{i}", int(a), int(f) + 1, int(s))
           for i, (a, f, s) in enumerate(zip(lv.alloc_step, lv.free_step, lv.buffer_size)) if s > 0]
    out += [Buffer(f"scratch{k}", k, k + 1, int(s)) for k, s in enumerate(lv.scratch) if s > 0]
    return out
