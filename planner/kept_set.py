"""Kept-set plans: a set K of nodes kept from their compute to their last read; every other node
recomputed, depth-first, for each kept node that reads it.

Given K (holding every node without readers, every pinned and every non-recomputable node), the
plan walks the kept nodes in node order. Before kept node t it computes each input of t outside
K, and recursively theirs: a node's inputs outside K one after another, each held until the node
is made, the ones needing most memory less their own bytes first (Sethi-Ullman). A node made
there is freed once every node holding it on the recursion has been made. A kept node u stays
resident from its compute to the last kept step that reads it through nodes outside K,
``reach[u]`` (a pinned node to the end). So at kept step t memory holds

    base + bytes of kept u < t with reach[u] >= t + need(t),

need(t) the recursion's bytes (a tree count, an upper bound: where the recursion finds a node
resident it reads that copy). The search (:func:`kept_set_plan`) starts from K = every node (the
plan without recomputes) and flips one random node in or out of K at a time (half of them drawn
among the nodes bearing on a kept step over the budget), keeping a flip unless it raises
(computes over ``max_computes``, bytes over the budget summed over kept steps, highest step),
until K fits or :data:`STALL_FLIPS` per node in a row lower nothing (then again from K = every
node, up to :data:`STARTS` searches in all); each flip updates reach, need and the alive bytes
only where they change. The tree count of computes grows with the depth of the recursion, so
``max_computes`` bounds the plan's length. Once K fits, the same search, from the last K that
fits, asks for ever less estimated time until its deadline (:data:`LADDER_STEP`): the plan is the
last K that fits, or the first where the deadline comes before any other.

RL1000 at 50% of its peak (304,310 bytes): no other planner here finds a plan (every walk and
greedy of bench/results/rl1000_50_stop59.md); this search finds one in a few thousand flips.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np

from planner import clock
from planner.plan import Event, Plan
from planner.problem import PlanningProblem

#: What one basic step of the search (a node whose reach or need is recomputed) charges the work
#: clock (planner/clock.py), in deterministic seconds: about its time on the 2-core machine of the
#: figures, the flip's copies and score included (RL500 and RL1000 at 50%: 330-350 k steps per CPU
#: second), as the other searches' prices are. It was 2e-5, set at load 7 before the walks' lists
#: (:class:`_Kept`) made a step 1.7-1.8 times faster: a --deterministic search then took about a
#: sixth of its counted seconds and ended long before its plan (RL500 at 50%, ``--time-limit 20
#: --deterministic``, 1 worker: no plan -> +661.88%; at 55% +155.77% -> +122.23%; at 60% +57.41%
#: -> +51.35%, in 182 -> 74 wall s; RL1000 at 55%: +1115.34% -> +111.70%, in 540-620 -> 411 wall s).
STEP_SECONDS = 3e-6


#: Flips per node the search makes without lowering its score before it gives up: RL1000 at 50%
#: finds its plan after 7,400-7,700 flips in all; a problem whose score stays put (no set fits)
#: ends at once instead of at its deadline. 50 before the aimed draws (:data:`AIMED_SHARE`): RL500
#: at 50%'s first cap then stalled after 16 wall s, past the 15 s that ``--time-limit 60`` gives
#: the search; with 10, after 4 s, and the second cap fits by 5.3 s (bench/results/rl500_50_stop71.md).
STALL_FLIPS = 10

#: Where no K within the cap on computes fits, the search goes on from where it stalled with
#: this many times the cap: RL500 at 55% stalled at 200 computes per node (48,457 bytes over the
#: budget, summed over kept steps) and fits at 1000 (422,787 computes, 14.6 s in all; polished
#: +36,699%, where no other planner here finds a plan).
CAP_GROWTH = 5.0

#: Searches from K = every node the search makes, one after another with the random stream going
#: on, until a set fits (or the deadline comes): a search that stalls under both caps often fits
#: from another start. RL250 at 72%, first fit, seeds 0-5: 3 of 6 stall in one start (1 s each).
STARTS = 4

#: Share of the flips drawn among the nodes bearing on a kept step over the budget (:func:`_draw`)
#: rather than among all: near a fit few steps are over (RL500 at 50%: 8 of 199 kept steps), and
#: a flip drawn among all nodes rarely bears on them. RL500 at 50%, seed 0, caps 200 and 1000
#: computes per node: drawn among all, the search stalled 163,120 and 74,162 bytes over the budget
#: (summed over kept steps); with half aimed, 196,519 bytes over, then a fit.
AIMED_SHARE = 0.5

#: Once K fits, the rest of the time goes down a ladder: each rung asks the same search, from the
#: last K that fits, for one whose estimated time (:meth:`_Kept.estimated_time`, the added time
#: being the objective) is this share less; a rung that finds none within
#: :data:`RUNG_STALL_FLIPS` halves the step, one that does doubles it (up to this), and a step of
#: an eighth of this ends the ladder (or the deadline does). RL1000 at 50%, a 30 s deadline,
#: seeds 0/1, raw added time: the first plan +18,360/+16,212%; steps 0.05 +4,458/+3,793%,
#: 0.03 +2,885/+2,530%, 0.02 +3,508/+3,805% (bench/results/rl1000_50_stop70.md).
LADDER_STEP = 0.03

#: Flips per node a rung makes without lowering its score before it gives up: 2 ended RL1000's
#: rungs sooner than 3 or 5, for as cheap a plan or cheaper.
RUNG_STALL_FLIPS = 2

#: The search plans in another node order (planner.planning._kept_set_order) only where the plan without
#: recomputes (K = every node, where it starts) holds at most this share of the given order's bytes
#: over the budget, summed over steps (:func:`excess`). Polished plans of a 60 s search (work
#: clock), given -> memory-aware order: RL500 (0.74-0.82 of the excess there) at 50% +755/+1,146% ->
#: +395/+312% (seeds 0/1), at 55% +490/+363% -> +122/+92%, at 60% +213/+196% -> +61/+51%; RL1000
#: (0.90-0.92) at 50% dearer on 5 of seeds 0-5 (+182.5% -> +198% on average, seed 4 no plan at
#: all), at 55% +116/+78% -> +72/+77%, at 60% +40/+39% -> +36/+44% (bench/results/rl500_cost_stop72.md).
ORDER_EXCESS_SHARE = 0.85


#: What :meth:`_Kept.snapshot` saves and :meth:`_Kept.restore` puts back: the arrays, and the lists
#: beside them (copied rather than rebuilt from the arrays: 1.4 against 17 us each, at 1000 nodes).
_SAVED = ("kept", "reach", "need", "count", "work", "alive", "_kept", "_reach", "_need", "_count", "_work")


class _Kept:
    """K with reach, need, tree count and alive bytes, kept up to date flip by flip.

    The arrays serve the vector reads (profile, score, bearing); the flip's walks read Python
    lists holding the same values (a numpy element read costs several list reads: RL1000 at 50%,
    most of the search's time), written with the arrays."""

    def __init__(self, problem: PlanningProblem, kept: np.ndarray) -> None:
        p = problem
        self.p, self.n = p, p.n
        size = p.size.astype(np.float64)
        self.preds, self.succ = p.pred_lists, p.succ_lists
        self._size, self._cost, self._pinned = size.tolist(), p.cost.tolist(), p.pinned.tolist()
        self._need_at = (size + p.scratch).tolist()  # a node's own bytes while it is made
        self.kept = kept.copy()
        self.reach = np.zeros(self.n, dtype=np.int64)
        self.need = np.zeros(self.n)
        self.count = np.zeros(self.n)
        self.work = np.zeros(self.n)  # the tree count with each compute at its cost: the recursion's time
        self.alive = np.zeros(self.n + 1)
        self._prof: np.ndarray | None = None  # profile() of K, until a flip or restore
        self._kept, self._reach, self._need, self._count, self._work = (
            a.tolist() for a in (self.kept, self.reach, self.need, self.count, self.work))
        self.steps = 2 * self.n  # basic steps so far: the build below, then each flip's
        self.charged = 0  # of those, the ones charged to the work clock
        for x in range(self.n - 1, -1, -1):
            self._set_reach(x, self._reach_of(x))
        for x in range(self.n):
            self._set_need(x, self._need_of(x))
        for u in np.nonzero(self.kept)[0]:
            self._span(int(u), self._reach[u], 1.0)

    def _set_reach(self, x: int, r: int) -> None:
        self._reach[x] = self.reach[x] = r

    def _set_need(self, x: int, nc: tuple[float, float, float]) -> None:
        self._need[x], self._count[x], self._work[x] = nc
        self.need[x], self.count[x], self.work[x] = nc

    def _reach_of(self, x: int) -> int:
        if self._pinned[x]:  # resident to the end
            return self.n - 1
        kept, reach = self._kept, self._reach
        r = x
        for w in self.succ[x]:
            y = w if kept[w] else reach[w]
            if y > r:
                r = y
        return r

    def kids(self, x: int) -> list[int]:
        """x's inputs outside K in the order the recursion makes them: those needing most memory
        less their own bytes first (Sethi-Ullman)."""
        kept, size, need = self._kept, self._size, self._need
        ks = [u for u in self.preds[x] if not kept[u]]
        if len(ks) > 1:
            ks.sort(key=lambda u: (size[u] - need[u], u))
        return ks

    def _need_of(self, x: int) -> tuple[float, float, float]:
        size, need, count, work = self._size, self._need, self._count, self._work
        held = most = counts = works = 0.0  # the sums in the kids' order: the same floats every time
        for u in self.kids(x):
            m = held + need[u]
            if m > most:
                most = m
            held += size[u]
            counts += count[u]
            works += work[u]
        return max(most, held + self._need_at[x]), 1.0 + counts, self._cost[x] + works

    def _span(self, u: int, reach: int, sign: float) -> None:
        if reach > u:
            self.alive[u + 1:reach + 1] += sign * self._size[u]

    def flip(self, v: int) -> None:
        """Move v in or out of K, updating what depends on it."""
        kept, reach = self._kept, self._reach
        self._prof = None
        if kept[v]:
            self._span(v, reach[v], -1.0)
        kept[v] = self.kept[v] = not kept[v]
        if kept[v]:
            self._span(v, reach[v], 1.0)
        # reach: v's inputs, and on up through nodes outside K, highest first
        todo = [-u for u in set(self.preds[v])]
        heapq.heapify(todo)
        seen = set(todo)
        while todo:
            x = -heapq.heappop(todo)
            self.steps += 1
            r = self._reach_of(x)
            if r == reach[x]:
                continue
            if kept[x]:
                self._span(x, reach[x], -1.0)
                self._span(x, r, 1.0)
            self._set_reach(x, r)
            if not kept[x]:
                for u in self.preds[x]:
                    if -u not in seen:
                        seen.add(-u)
                        heapq.heappush(todo, -u)
        # need: v's readers, and on down through nodes outside K, lowest first
        todo = sorted(set(self.succ[v]))
        seen = set(todo)
        while todo:
            x = heapq.heappop(todo)
            self.steps += 1
            nc = self._need_of(x)
            if nc == (self._need[x], self._count[x], self._work[x]):
                continue
            self._set_need(x, nc)
            if not kept[x]:
                for w in self.succ[x]:
                    if w not in seen:
                        seen.add(w)
                        heapq.heappush(todo, w)

    def bearing(self, t: int) -> np.ndarray:
        """The nodes whose flip bears on kept step t's bytes: the kept nodes alive there (out of
        K, each lowers the kept bytes there) and t's inputs outside K (into K, each lowers need(t))."""
        alive = np.nonzero(self.kept[:t] & (self.reach[:t] >= t))[0]
        return np.concatenate([alive, [u for u in self.preds[t] if not self.kept[u]]]).astype(np.int64)

    def profile(self) -> np.ndarray:
        """Bytes at each kept step (0 elsewhere), read-only: computed once per set (score() and the
        aimed draw after it both read it)."""
        if self._prof is None:
            self._prof = np.where(self.kept, self.p.base_bytes + self.alive[:self.n] + self.need, 0.0)
            self._prof.flags.writeable = False
        return self._prof

    def estimated_time(self) -> float:
        """The plan's time by the tree counts, each compute at its cost (an upper bound, as need)."""
        return float(self.work[self.kept].sum())

    def score(self, budget: int, max_computes: float, max_time: float = math.inf) -> tuple[float, ...]:
        """Computes over the cap, estimated time over ``max_time``, bytes over the budget summed
        over kept steps, the highest step: K fits where the first three are 0."""
        prof = self.profile()
        computes = float(self.count[self.kept].sum())
        return (max(0.0, computes - max_computes), max(0.0, self.estimated_time() - max_time),
                float(np.maximum(prof - budget, 0).sum()), float(prof.max()))

    def snapshot(self) -> tuple:
        """K and what depends on it, for restore()."""
        return tuple(getattr(self, f).copy() for f in _SAVED) + (self._prof,)

    def restore(self, snap: tuple) -> None:
        for f, a in zip(_SAVED, snap):
            setattr(self, f, a.copy())
        self._prof = snap[-1]

    def charge(self) -> None:
        """Charge the work clock for the basic steps taken since the last charge."""
        clock.charge((self.steps - self.charged) * STEP_SECONDS)
        self.charged = self.steps


def excess(problem: PlanningProblem, budget: int) -> float:
    """Bytes over ``budget`` summed over the steps of the plan without recomputes: the search's
    starting score (:meth:`_Kept.score`, K = every node)."""
    return _Kept(problem, np.ones(problem.n, dtype=bool)).score(budget, math.inf)[2]


def kept_set_plan(problem: PlanningProblem, budget: int, deadline: float = math.inf, seed: int = 0,
                  max_computes: float | None = None) -> Plan | None:
    """A plan from the search of the module docstring whose estimate fits ``budget``, or None where
    none is found by ``deadline`` (planner.clock.now() seconds). The caller simulates it."""
    p = problem
    if not p.runtime_exact or p.can_swap or p.n == 0:
        return None
    fixed = p.pinned | ~p.recomputable | np.array([not s for s in p.succ_lists])
    free = np.nonzero(~fixed)[0]
    if not len(free):
        return None
    first = 200.0 * p.n if max_computes is None else max_computes
    rng = np.random.default_rng(seed)
    for _ in range(STARTS):  # each from K = every node, the random stream going on
        state = _Kept(p, np.ones(p.n, dtype=bool))
        if (cap := _first_fit(state, free, rng, budget, first, deadline)) is not None:
            break
        if clock.now() > deadline:
            return None
    else:
        return None
    best, step = state.snapshot(), LADDER_STEP
    while clock.now() <= deadline and step > LADDER_STEP / 8:
        target = (1.0 - step) * state.estimated_time()
        if _descend(state, free, rng, lambda: state.score(budget, cap, target), deadline, RUNG_STALL_FLIPS, budget):
            best, step = state.snapshot(), min(2 * step, LADDER_STEP)
        else:  # back to the last set that fits
            state.restore(best)
            step /= 2
    return _plan(state)


def _first_fit(state: _Kept, free: np.ndarray, rng: np.random.Generator, budget: int, first: float,
               deadline: float) -> float | None:
    """Flip ``state`` until its K fits ``budget`` within ``first`` computes, or on from where that
    stalled within :data:`CAP_GROWTH` times as many: the cap it fits within, or None."""
    for cap in (first, CAP_GROWTH * first):
        if _descend(state, free, rng, lambda: state.score(budget, cap), deadline, STALL_FLIPS, budget):
            return cap
        if clock.now() > deadline:
            return None
    return None


def _descend(state: _Kept, free: np.ndarray, rng: np.random.Generator, score: Callable[[], tuple[float, ...]],
             deadline: float, stall_flips: float, budget: int) -> bool:
    """Flip random nodes of ``free`` (:func:`_draw`), keeping each flip that does not raise
    ``score()``, until K fits (True), or the deadline or ``stall_flips`` per node in a row that
    lower nothing (False)."""
    best = score()
    stalled = 0
    is_free = np.zeros(state.n, dtype=bool)
    is_free[free] = True
    while best[:3] != (0.0, 0.0, 0.0):
        state.charge()
        if clock.now() > deadline or stalled > stall_flips * state.n:
            return False
        v = _draw(state, free, is_free, rng, budget)
        saved = state.snapshot()
        state.flip(v)
        new = score()
        if new <= best:
            stalled = 0 if new < best else stalled + 1
            best = new
        else:
            stalled += 1
            state.restore(saved)
    return True


def _draw(state: _Kept, free: np.ndarray, is_free: np.ndarray, rng: np.random.Generator, budget: int) -> int:
    """A node of ``free`` to flip: :data:`AIMED_SHARE` of the time one bearing on a kept step over
    ``budget`` drawn at random (:meth:`_Kept.bearing`), else (or where none is over) any."""
    if rng.random() < AIMED_SHARE:
        over = np.nonzero(state.profile() > budget)[0]
        if len(over):
            aimed = state.bearing(int(over[rng.integers(len(over))]))
            aimed = aimed[is_free[aimed]]
            if len(aimed):
                return int(aimed[rng.integers(len(aimed))])
    return int(free[rng.integers(len(free))])


def _plan(state: _Kept) -> Plan:
    """The events of K's plan (module docstring)."""
    kept, n = state.kept, state.n
    resident = np.zeros(n, dtype=bool)
    holders = np.zeros(n, dtype=np.int64)
    events: list[Event] = []
    drops: dict[int, list[int]] = {}
    for u in np.nonzero(kept)[0]:
        drops.setdefault(int(state.reach[u]), []).append(int(u))

    kids = state.kids
    for t in np.nonzero(kept)[0]:
        stack = [(int(t), kids(int(t)), [0])]
        while stack:
            x, ks, at = stack[-1]
            if at[0] < len(ks):
                u = ks[at[0]]
                at[0] += 1
                if resident[u]:
                    holders[u] += 1
                else:
                    stack.append((u, kids(u), [0]))
                continue
            stack.pop()
            events.append(Event("compute", x))
            resident[x] = True
            for u in ks:
                holders[u] -= 1
                if holders[u] == 0:
                    events.append(Event("free", u))
                    resident[u] = False
            if stack:
                holders[x] += 1
        for u in drops.get(int(t), ()):
            if not state.p.pinned[u]:
                events.append(Event("free", u))
                resident[u] = False
    return Plan(tuple(events), "kept-set")
