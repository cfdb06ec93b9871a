"""Exact offset search for one arena: a skyline branch and bound with backjumping (our own code).

Problem (built by :func:`reduce_problem`): buffer ``i`` lives in sections ``[first[i], stop[i])``
(times compressed to event ranks, empty stretches dropped), has ``size[i]`` and ``align[i]`` in
units of the gcd of all sizes; the arena holds ``capacity`` units. Find offsets with
``offset % align == 0``, ``offset + size <= capacity`` and no two buffers that share a section
overlapping in ``[offset, offset + size)``.

The search works on *gravity-normal* packings (every buffer rests on another buffer or on 0; any
packing can be pushed down into one). Its state per section ``s`` is a skyline: ``floor[s]``
(everything below is decided: buffers or known-empty space), whether that floor is the top of a
placed buffer (``real``) and whether nothing may start there (``block``). Ideas, each a few lines:

* section bound (MiniMalloc's cross-section inference): a buffer starts no lower than the highest
  floor over its lifespan, so each section's unplaced bytes must fit above
  ``max(floor, least such start of its buffers)``; the gap below is raised into the floor;
* branching on a point: in a *local-minimum niche* (a run of equal floors whose neighbours are
  higher) the point ``(s, floor[s])`` is either the start of a buffer that lies flat inside the
  niche, or empty. The point with the fewest options is taken first (fail first);
* gravity: a buffer may only start where some section of its lifespan has a real top; a niche
  where nothing may start stays empty up to its lower neighbour (one jump, not unit steps).
  Alignment padding breaks "rests on a top", so with alignments > 1 (after the gcd) the rule is
  off and an unfillable point is closed one unit at a time (slower, still complete);
* decomposition: when no unplaced buffer crosses a section boundary the two sides are solved
  one after the other;
* conflict-directed backjumping: a failed subtree returns the sections whose state caused the
  failure; an alternative that does not touch them cannot help, so the search jumps back;
* restarts: several candidate orders (deterministic, then seeded random) under Luby node limits,
  because one bad early choice can trap any single order.

Every result is checked by ``planner.alloc.validate`` before it leaves the package.
"""
from __future__ import annotations

import enum
import math
import sys
from dataclasses import dataclass

import numpy as np

from planner import clock

_BIG = np.iinfo(np.int64).max // 4

#: What a search node charges the work clock (planner/clock.py, ``memplan plan --arena
#: --deterministic``): about its wall time here (MiniMalloc's challenge instances D, E, H, I:
#: 9-13 thousand nodes in 2 s, 155 us each with the probes around them).
NODE_SECONDS = 1.5e-4


@dataclass(frozen=True)
class Reduced:
    """A placement problem in normalized units: event-rank sections, sizes divided by ``unit``."""

    first: np.ndarray  # first section of each buffer (int64)
    stop: np.ndarray  # one past its last section; every buffer spans >= 1 section
    size: np.ndarray  # size / unit (int64, >= 1)
    align: np.ndarray  # alignment / unit (int64, >= 1); offsets are multiples of it
    unit: int  # gcd of sizes and of alignments > 1: offsets scale back by it
    num_sections: int

    @property
    def n(self) -> int:
        return int(self.size.size)


def reduce_problem(lower, upper, size, align) -> Reduced:
    """Compress times to sections and divide sizes and alignments by their gcd (lossless).

    Every gravity-normal offset is a sum of sizes rounded up to alignments, so it stays a
    multiple of the gcd; a time stretch with no live buffer is a natural cut and is dropped.
    """
    lower, upper = np.asarray(lower, np.int64), np.asarray(upper, np.int64)
    size, align = np.asarray(size, np.int64), np.asarray(align, np.int64)
    unit = math.gcd(*size.tolist(), *align[align > 1].tolist()) if size.size else 1
    events = np.unique(np.concatenate([lower, upper]))
    first, stop = np.searchsorted(events, lower), np.searchsorted(events, upper)
    live = np.zeros(events.size + 1, np.int64)
    np.add.at(live, first, 1)
    np.add.at(live, stop, -1)
    nonempty = np.cumsum(live)[: max(events.size - 1, 0)] > 0
    index = np.concatenate([[0], np.cumsum(nonempty)]).astype(np.int64)
    return Reduced(
        first=index[first], stop=index[stop], size=size // max(unit, 1),
        align=np.maximum(align // max(unit, 1), 1), unit=max(unit, 1),
        num_sections=int(nonempty.sum()),
    )


def section_totals(red: Reduced) -> np.ndarray:
    """Units alive in each section (the lower bound is their maximum)."""
    total = np.zeros(red.num_sections + 1, np.int64)
    np.add.at(total, red.first, red.size)
    np.add.at(total, red.stop, -red.size)
    return np.cumsum(total)[: red.num_sections]


def independent_blocks(red: Reduced) -> list[np.ndarray]:
    """Buffer indices of the independent blocks: maximal runs of sections no buffer leaves."""
    crossing = _crossing(red)
    block_of_section = np.concatenate([[0], np.cumsum(crossing == 0)])
    block = block_of_section[red.first] if red.n else np.zeros(0, np.int64)
    return [np.flatnonzero(block == b) for b in np.unique(block)]


def _crossing(red: Reduced) -> np.ndarray:
    """How many buffers cross each section boundary s | s+1 (length num_sections - 1)."""
    cover = np.zeros(red.num_sections + 1, np.int64)
    np.add.at(cover, red.first + 1, 1)
    np.add.at(cover, red.stop, -1)
    return np.cumsum(cover)[1:red.num_sections]


def subproblem(red: Reduced, idx: np.ndarray) -> Reduced:
    """The problem restricted to buffers ``idx`` (an independent block), sections renumbered."""
    base = int(red.first[idx].min())
    return Reduced(
        first=red.first[idx] - base, stop=red.stop[idx] - base, size=red.size[idx],
        align=red.align[idx], unit=red.unit, num_sections=int(red.stop[idx].max()) - base,
    )


class SearchStatus(enum.Enum):
    FOUND = "found"
    INFEASIBLE = "infeasible"  # proven: no packing fits the capacity
    UNKNOWN = "unknown"  # budget or time ran out first


class NodeLimit(Exception):
    """A restart spent its node budget."""


class Deadline(Exception):
    """The wall-clock limit passed."""


class _Static:
    """Per-problem arrays shared by every restart: section and lifespan lists, buffer types."""

    def __init__(self, red: Reduced):
        self.red = red
        n, nsec = red.n, red.num_sections
        self.span = red.stop - red.first
        owners = np.repeat(np.arange(n), self.span)
        secs = np.arange(owners.size) - np.repeat(np.cumsum(self.span) - self.span, self.span)
        secs = secs + np.repeat(red.first, self.span)
        self.buf_ptr = np.concatenate([[0], np.cumsum(self.span)]).astype(np.int64)
        self.buf_sec = secs.astype(np.int64)  # sections of buffer i: buf_sec[buf_ptr[i]:buf_ptr[i+1]]
        order = np.argsort(secs, kind="stable")
        self.sec_buf = owners[order]  # buffers of section s: sec_buf[sec_ptr[s]:sec_ptr[s+1]]
        counts = np.bincount(secs, minlength=nsec) if n else np.zeros(nsec, np.int64)
        self.sec_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.by_first = np.argsort(red.first, kind="stable")
        self.first_sorted = red.first[self.by_first]
        keys = np.stack([red.first, red.stop, red.size, red.align], axis=1) if n else np.zeros((0, 4))
        _, self.type_id = np.unique(keys, axis=0, return_inverse=True)  # twins share a type
        self.type_id = self.type_id.reshape(-1)
        self.aligned = bool((red.align > 1).any())  # switches the gravity rule off
        self.totals = section_totals(red)
        self.crossing = _crossing(red)


@dataclass
class _Choice:
    """Where to branch: point (s, f) of a local-minimum niche, its candidates, and the waste option."""

    section: int  # global section index
    height: int
    candidates: np.ndarray  # buffers that may start at (section, height), in trial order
    may_stay_empty: bool  # the section has slack, so the point may be left empty
    niche: np.ndarray  # conflict sections every outcome depends on (niche and its neighbours)


class _Skyline:
    """One depth-first search at a fixed capacity and candidate order; state restored on backtrack.

    ``_solve_range`` and ``_node`` return ``None`` on success (offsets in ``solution``) or a
    *conflict*: a boolean mask over sections such that every state agreeing with the failed one
    on those sections (floors, flags, unplaced buffers touching them) has no completion.
    """

    def __init__(self, st: _Static, capacity: int, order: str, seed: int, node_limit: int, deadline: float):
        red = st.red
        self.st, self.cap, self.order = st, capacity, order
        self.first, self.stop, self.size, self.align = red.first, red.stop, red.size, red.align
        nsec = red.num_sections
        self.floor = np.zeros(nsec, np.int64)
        self.real = np.ones(nsec, bool)  # floor is a placed buffer's top (or the ground)
        self.block = np.zeros(nsec, bool)  # nothing may start at (s, floor[s])
        self.total = st.totals.copy()  # unplaced units per section
        self.cuts = st.crossing.copy()  # unplaced buffers crossing each boundary s | s+1
        self.placed = np.zeros(red.n, bool)
        self.solution = np.full(red.n, -1, np.int64)
        self.rng = np.random.default_rng(seed)
        self.nodes, self.node_limit, self.deadline = 0, node_limit, deadline

    def run(self) -> bool:
        """True: ``solution`` holds a packing. False: proven infeasible. Raises NodeLimit/Deadline."""
        return self._solve_range(0, self.st.red.num_sections) is None

    # -- search ------------------------------------------------------------------------------
    def _solve_range(self, s0: int, s1: int) -> np.ndarray | None:
        """Solve the independent components of sections [s0, s1), tightest first."""
        cut = np.flatnonzero(self.cuts[s0:s1 - 1] == 0) + s0 + 1
        bounds = [s0, *cut.tolist(), s1]
        comps = [(a, c) for a, c in zip(bounds[:-1], bounds[1:]) if self.total[a:c].any()]
        if len(comps) > 1:
            comps.sort(key=lambda ac: int((self.cap - self.floor[ac[0]:ac[1]] - self.total[ac[0]:ac[1]]).min()))
        for a, c in comps:
            conflict = self._node(a, c)
            if conflict is not None:
                return conflict
        return None

    def _node(self, s0: int, s1: int) -> np.ndarray | None:
        self._tick()
        st = self.st
        i0, i1 = np.searchsorted(st.first_sorted, [s0, s1])
        part = st.by_first[i0:i1]
        part = part[~self.placed[part]]
        saved = (self.floor[s0:s1].copy(), self.real[s0:s1].copy(), self.block[s0:s1].copy())
        log: list = []
        try:
            out = self._propagate(s0, s1, part, log)
            conflict = out if isinstance(out, np.ndarray) else self._branch(s0, s1, out)
            if conflict is not None:
                self._explain(conflict, log, s0, s1)
            return conflict
        finally:
            self.floor[s0:s1], self.real[s0:s1], self.block[s0:s1] = saved

    def _branch(self, s0: int, s1: int, ch: _Choice) -> np.ndarray | None:
        """Try every way to fill the chosen point; jump back when an alternative cannot matter."""
        acc = ch.niche.copy()
        for y in ch.candidates.tolist():
            conflict = self._try_place(y, ch.height, s0, s1)
            if conflict is None:
                return None
            if not conflict[self.first[y]:self.stop[y]].any():
                return conflict  # placing y elsewhere or not at all changes nothing that failed
            acc |= conflict
        if ch.may_stay_empty:
            s = ch.section
            self.block[s] = True
            conflict = self._solve_range(s0, s1)
            self.block[s] = False
            if conflict is None:
                return None
            if not conflict[s]:
                return conflict
            acc |= conflict
        return acc

    def _try_place(self, y: int, f: int, s0: int, s1: int) -> np.ndarray | None:
        a, c, z = int(self.first[y]), int(self.stop[y]), int(self.size[y])
        old_floor, old_real = self.floor[a:c].copy(), self.real[a:c].copy()
        self.floor[a:c], self.real[a:c] = f + z, True
        self.total[a:c] -= z
        self.cuts[a:c - 1] -= 1
        self.placed[y], self.solution[y] = True, f
        try:
            return self._solve_range(s0, s1)
        finally:
            self.placed[y] = False
            self.cuts[a:c - 1] += 1
            self.total[a:c] += z
            self.floor[a:c], self.real[a:c] = old_floor, old_real

    def _tick(self) -> None:
        self.nodes += 1
        if self.nodes > self.node_limit:
            raise NodeLimit
        if self.nodes & 63 == 0:
            clock.charge(64 * NODE_SECONDS)  # on the work clock: nodes are its seconds here
            if clock.now() > self.deadline:
                raise Deadline

    # -- propagation ---------------------------------------------------------------------------
    def _propagate(self, s0: int, s1: int, part: np.ndarray, log: list) -> np.ndarray | _Choice:
        """Raise floors to what is implied, then pick the point to branch on (or a conflict)."""
        st, cap = self.st, self.cap
        fl, tot = self.floor[s0:s1], self.total[s0:s1]
        p0, p1 = int(st.sec_ptr[s0]), int(st.sec_ptr[s1])
        members, seg = st.sec_buf[p0:p1], st.sec_ptr[s0:s1] - p0
        start = np.full(self.st.red.n, _BIG, np.int64)
        while True:
            top = np.maximum.reduceat(self.floor[st.buf_sec], st.buf_ptr[:-1])[part]
            start[part] = -(-top // self.align[part]) * self.align[part] if st.aligned else top
            least = np.minimum(np.minimum.reduceat(start[members], seg), cap)
            over = np.flatnonzero(np.maximum(fl, least) + tot > cap)
            if over.size:
                return self._bound_conflict(s0 + int(over[0]))
            raised = least > fl
            if raised.any():  # nothing unplaced can start lower: the gap is empty for good
                log.append(("start", raised, self.floor.copy()))
                fl[raised] = least[raised]
                self.real[s0:s1][raised] = self.block[s0:s1][raised] = False
                continue
            choice = self._choose(s0, s1, part, top, log)
            if choice is not None:
                return choice

    def _bound_conflict(self, s: int) -> np.ndarray:
        """Section ``s`` cannot hold its unplaced bytes: it and what holds its buffers up."""
        conflict = np.zeros(self.st.red.num_sections, bool)
        conflict[s] = True
        if self.floor[s] + self.total[s] > self.cap:
            return conflict
        conflict[self._highest_sections(self._unplaced_in(s), self.floor)] = True
        return conflict

    def _choose(self, s0: int, s1: int, part: np.ndarray, top: np.ndarray, log: list):
        """The branching point, a conflict, or None after a niche was found empty (re-propagate).

        Candidates for a point lie flat at its height (no floor change inside their lifespan),
        rest on a real top somewhere, start on no blocked section and respect alignment.
        """
        cap, nsec = self.cap, s1 - s0
        fl, tot = self.floor[s0:s1], self.total[s0:s1]
        lo, hi = self.first[part] - s0, self.stop[part] - s0
        gravity = not self.st.aligned  # alignment pads below buffers: support is not a floor
        steps = np.concatenate([[0], np.cumsum(np.diff(fl) != 0)])
        ok = steps[hi - 1] == steps[lo]
        ok &= _count(self.block[s0:s1], lo, hi) == 0
        if gravity:
            ok &= _count(self.real[s0:s1], lo, hi) > 0
        else:
            ok &= top % self.align[part] == 0
        starts = np.flatnonzero(np.concatenate([[True], np.diff(fl) != 0]))
        ends = np.append(starts[1:], nsec)
        run_of = np.repeat(np.arange(starts.size), ends - starts)
        height = fl[starts]
        left, right = np.append(_BIG, height[:-1]), np.append(height[1:], _BIG)
        local_min = ((height < left) & (height < right))[run_of]
        count = np.cumsum(np.bincount(lo[ok], minlength=nsec + 1) - np.bincount(hi[ok], minlength=nsec + 1))[:nsec]
        dead = local_min & (self.block[s0:s1] | (count == 0))
        slack = cap - fl - tot
        niche_lo, niche_hi = np.maximum(starts[run_of] - 1, 0), np.minimum(ends[run_of] + 1, nsec)
        tight = np.flatnonzero(dead & (slack == 0))
        if tight.size:  # a full section whose lowest free point nothing can fill
            return self._range_mask(s0 + niche_lo[tight[0]], s0 + niche_hi[tight[0]])
        if gravity:  # nothing starts anywhere in a niche: it stays empty up to its lower neighbour
            raised = (np.add.reduceat(dead.astype(np.int64), starts) == ends - starts)[run_of]
            new = np.minimum(np.minimum(left, right), cap)[run_of]
        else:  # without gravity a dead point is known empty one unit up
            raised, new = dead, fl + 1
        if raised.any():
            log.append(("niche", raised, (niche_lo, niche_hi)))
            fl[raised] = new[raised]
            self.real[s0:s1][raised] = self.block[s0:s1][raised] = False
            return None
        options = np.where(local_min & ~dead, count + (slack > 0), _BIG)
        best = np.flatnonzero(options == options.min())
        s = int(best[np.argmin(fl[best])])
        pick = ok & (lo <= s) & (s < hi)
        return _Choice(
            section=s0 + s, height=int(fl[s]), candidates=self._ordered(part[pick]),
            may_stay_empty=bool(slack[s] > 0), niche=self._range_mask(s0 + niche_lo[s], s0 + niche_hi[s]),
        )

    def _ordered(self, cands: np.ndarray) -> np.ndarray:
        """Trial order of the candidates (the restart's policy); one buffer per twin type."""
        span, size = self.st.span[cands], self.size[cands]
        if self.order == "wide":
            keys = np.lexsort((-size, -span))
        elif self.order == "big":
            keys = np.lexsort((-span, -size))
        elif self.order == "noisy":
            keys = np.argsort(-(span * (1.0 + self.rng.random(cands.size))), kind="stable")
        else:
            keys = self.rng.permutation(cands.size)
        cands = cands[keys]
        _, first_of_type = np.unique(self.st.type_id[cands], return_index=True)
        return cands[np.sort(first_of_type)]

    # -- conflicts -----------------------------------------------------------------------------
    def _explain(self, conflict: np.ndarray, log: list, s0: int, s1: int) -> None:
        """Rewrite a conflict on the propagated state in terms of the node's entry state."""
        for kind, raised, data in reversed(log):
            hit = np.flatnonzero(conflict[s0:s1] & raised)
            if not hit.size:
                continue
            if kind == "start":
                ys = np.concatenate([self._unplaced_in(s0 + s) for s in hit.tolist()])
                conflict[self._highest_sections(ys, data)] = True
            else:
                niche_lo, niche_hi = data
                for s in hit.tolist():
                    conflict[s0 + niche_lo[s]: s0 + niche_hi[s]] = True

    def _unplaced_in(self, s: int) -> np.ndarray:
        ys = self.st.sec_buf[self.st.sec_ptr[s]:self.st.sec_ptr[s + 1]]
        return ys[~self.placed[ys]]

    def _highest_sections(self, ys: np.ndarray, floor: np.ndarray) -> np.ndarray:
        """For each buffer, a section of its lifespan where ``floor`` is highest (its witness)."""
        if ys.size == 0:
            return ys
        st = self.st
        lens = st.span[ys]
        seg = np.concatenate([[0], np.cumsum(lens)[:-1]])
        secs = st.buf_sec[np.repeat(st.buf_ptr[ys] - seg, lens) + np.arange(int(lens.sum()))]
        vals = floor[secs]
        peak = np.repeat(np.maximum.reduceat(vals, seg), lens)
        where = np.where(vals == peak, np.arange(vals.size), _BIG)
        return secs[np.minimum.reduceat(where, seg)]

    def _range_mask(self, a: int, b: int) -> np.ndarray:
        mask = np.zeros(self.st.red.num_sections, bool)
        mask[a:b] = True
        return mask


def _count(flags: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How many of ``flags[lo[i]:hi[i]]`` are set, for every i."""
    prefix = np.concatenate([[0], np.cumsum(flags)])
    return prefix[hi] - prefix[lo]


# -- restarts ----------------------------------------------------------------------------------
#: Candidate orders of the first restarts; later restarts alternate seeded "noisy" (span with
#: random weight) and "random" orders, which is what breaks the heavy tail of a single order.
FIRST_ORDERS = ("wide", "big")


def luby(i: int) -> int:
    """The Luby sequence 1,1,2,1,1,2,4,1,... (i >= 0): restart lengths within a log factor of optimal."""
    k = 1
    while (1 << k) - 1 < i + 1:
        k += 1
    while (1 << k) - 1 != i + 1:
        i -= (1 << (k - 1)) - 1
        k = 1
        while (1 << k) - 1 < i + 1:
            k += 1
    return 1 << (k - 1)


class Restarts:
    """Skyline searches on one problem at one capacity, resumable in node-budget slices."""

    def __init__(self, red: Reduced, capacity: int, restart_nodes: int | None = None):
        self.static = _Static(red)
        self.capacity = capacity
        self.restart_nodes = restart_nodes or 2 * red.n + 100  # Luby unit: room to place all, and some
        self.attempt = 0
        self.nodes = 0

    def run(self, node_budget: int, deadline: float) -> tuple[SearchStatus, np.ndarray | None]:
        """Run restarts until one decides, ``node_budget`` nodes are spent, or the deadline passes."""
        spent = 0
        while spent < node_budget:
            i = self.attempt
            order = FIRST_ORDERS[i] if i < len(FIRST_ORDERS) else ("noisy", "random")[i % 2]
            sky = _Skyline(self.static, self.capacity, order, i, self.restart_nodes * luby(i), deadline)
            old = sys.getrecursionlimit()
            # ~4 frames per placed buffer and 3 per point left empty along one branch
            sys.setrecursionlimit(max(old, 8 * (self.static.red.n + self.static.red.num_sections) + 10_000))
            try:
                found = sky.run()
            except (NodeLimit, RecursionError):  # a branch too deep to follow counts as a spent restart
                self.attempt += 1
                continue
            except Deadline:
                return SearchStatus.UNKNOWN, None
            finally:
                sys.setrecursionlimit(old)
                spent += sky.nodes
                self.nodes += sky.nodes
            if found:
                return SearchStatus.FOUND, sky.solution.copy()
            return SearchStatus.INFEASIBLE, None
        return SearchStatus.UNKNOWN, None
