"""Polishing a recompute plan: drop each recompute whose earlier copy memory allows keeping.

The last resorts (planner/pebble.py's walks, planner/tight_greedy.py's long run) find plans where
nothing else does, but they free every buffer as soon as they can and so recompute far more than
memory requires: the depth-first walk's plan for RL250 at 60% of its peak computes its 250 nodes
5,953 times (415,468 times in stop 41's move order). This pass takes any recompute-only plan as
its sequence of computes, each copy freed right after its last read
(:func:`planner.pebble.plan_of`), and removes recomputes one by one where the budget allows:

* Removing the recompute k of node v keeps v's copy before it (j) resident from its last read to
  k, so its readers read j: memory rises by size(v) over the steps between j's last read and k.
* k no longer reads its inputs: a copy whose last read was k is freed at its read before (memory
  falls over the steps between), and a copy nobody reads any more is not computed at all (where
  its node keeps another copy), which frees its own inputs in turn.

A removal is made where the memory of every step between j's last read and k, with all of these
changes, stays within the budget; the memory of each step is kept in a blocked array with lazy
block offsets (range add and range max in O(sqrt(steps)) numpy work). Recomputes are weighed
dearest first, in passes until one removes nothing. Each removal keeps the plan valid, so the
pass may stop at any point (``deadline``). The memory of a step is what
:func:`planner.simulate.simulate` counts (base, every copy alive, the step's scratch) on problems
whose accounting is the runtime's (``PlanningProblem.runtime_exact``): only those are polished.

RL250 at 60%, the depth-first walk's plan: +2195% -> +207.8% added time (+131140% -> +223% in
stop 41's move order); RL100 at 55%, the beams' plan: +695% -> +64%; RL1000 at 55%, the long
run's: +710% -> +251%. The planner polishes the last resorts' plans
and a baseline's plan where a solve returns one (RL1000 at 60%, the tight greedy's: +225% ->
+148%); CP-SAT's own plans lose nothing to it (RL100 at 60%: +21.36% either way).
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import numpy as np

from planner import clock
from planner.pebble import fitting, plan_of
from planner.plan import Plan
from planner.problem import PlanningProblem
from planner.simulate import Simulation

#: Steps per block of the memory profile.
BLOCK = 512
#: What weighing one recompute charges the work clock (planner/clock.py), in deterministic
#: seconds: about its wall time on the 2-core machine of the figures.
WEIGH_SECONDS = 4e-5
#: Passes at most (RL250 at 60% stops removing after 7).
PASSES = 30
_GONE = -(1 << 62)  # the memory of a step no longer in the plan


class _Profile:
    """Bytes resident during each step, with range add and range max."""

    def __init__(self, memory: np.ndarray):
        m = len(memory)
        blocks = max(1, -(-m // BLOCK))
        self.v = np.full(blocks * BLOCK, _GONE, dtype=np.int64)
        self.v[:m] = memory
        self.lazy = np.zeros(blocks, dtype=np.int64)
        self.top = self.v.reshape(blocks, BLOCK).max(axis=1)

    def _retop(self, b: int) -> None:
        self.top[b] = self.v[b * BLOCK:(b + 1) * BLOCK].max()

    def add(self, lo: int, hi: int, d: int) -> None:
        """Add ``d`` to steps lo .. hi-1."""
        if lo >= hi:
            return
        bl, br = lo // BLOCK, (hi - 1) // BLOCK
        if bl == br:
            self.v[lo:hi] += d
            self._retop(bl)
            return
        self.v[lo:(bl + 1) * BLOCK] += d
        self._retop(bl)
        self.v[br * BLOCK:hi] += d
        self._retop(br)
        self.lazy[bl + 1:br] += d

    def drop(self, k: int) -> None:
        """Step k is no longer in the plan."""
        self.v[k] = _GONE
        self._retop(k // BLOCK)

    def max(self, lo: int, hi: int) -> int:
        """The most of steps lo .. hi-1 (hi > lo)."""
        bl, br = lo // BLOCK, (hi - 1) // BLOCK
        if bl == br:
            return int(self.v[lo:hi].max() + self.lazy[bl])
        most = max(int(self.v[lo:(bl + 1) * BLOCK].max() + self.lazy[bl]),
                   int(self.v[br * BLOCK:hi].max() + self.lazy[br]))
        if br > bl + 1:
            most = max(most, int((self.top[bl + 1:br] + self.lazy[bl + 1:br]).max()))
        return most


class _Copies:
    """A compute sequence as copies: copy k is the output of the k-th compute, read by later
    steps until its node's next copy; each copy is resident from its step to its last read (to
    the end for a pinned output's last copy)."""

    def __init__(self, problem: PlanningProblem, computes: Sequence[int], keep_firsts: bool):
        p = problem
        self.keep_firsts = keep_firsts
        m = len(computes)
        self.node = node = [int(t) for t in computes]
        self.size = p.size.tolist()
        inputs: list[list[int]] = []  # the copies step k reads
        readers: list[list[int]] = [[] for _ in range(m)]  # the steps reading copy c, ascending
        self.copies: list[list[int]] = [[] for _ in range(p.n)]  # each node's copies, ascending
        latest = [-1] * p.n  # each node's current copy (a valid plan computes inputs first)
        preds, copies = p.pred_lists, self.copies
        for k, t in enumerate(node):
            mine = []
            for u in preds[t]:  # distinct nodes, so distinct copies
                c = latest[u]
                mine.append(c)
                readers[c].append(k)
            inputs.append(mine)
            latest[t] = k
            copies[t].append(k)
        self.inputs, self.readers = inputs, readers
        self.kept = {latest[v] for v in np.flatnonzero(p.pinned).tolist()}  # resident to the end
        kept = self.kept
        self.end = [m - 1 if c in kept else (r[-1] if r else c) for c, r in enumerate(readers)]
        self.alive = [True] * m
        nodes = np.asarray(node, dtype=np.int64)
        sizes = p.size.astype(np.int64)[nodes]
        change = np.zeros(m + 1, dtype=np.int64)
        change[:m] += sizes
        np.subtract.at(change, np.asarray(self.end, dtype=np.int64) + 1, sizes)
        scratch = p.scratch.astype(np.int64)[nodes]
        self.profile = _Profile(np.cumsum(change[:m]) + scratch + p.base_bytes)

    def removal(self, k: int, j: int) -> tuple[list[tuple[int, int, int]], dict[int, int], list[int], dict[int, set[int]]]:
        """What removing step k (its node's copy before it: j) changes, without changing it:
        (lo, hi, bytes) added to steps lo .. hi-1; copies' new last reads; the steps removed
        (k and the computes nobody reads any more); the reads each copy loses."""
        size, end = self.size, self.end
        v = self.node[k]
        delta: list[tuple[int, int, int]] = []
        ends: dict[int, int] = {}
        if self.readers[k]:  # j serves k's readers (k is not a pinned output's last copy)
            delta.append((end[j] + 1, k, size[v]))
            ends[j] = end[k]
        removed = [k]
        fewer = {v: 1}  # copies each node loses
        lost: dict[int, set[int]] = {}
        stack = [k]
        while stack:
            s = stack.pop()
            for c in self.inputs[s]:
                lost.setdefault(c, set()).add(s)
                if c in self.kept or ends.get(c, end[c]) != s:
                    continue  # s was not c's last read
                rest = [r for r in self.readers[c] if r not in lost[c]]
                last = rest[-1] if rest else c
                delta.append((last + 1, s, -size[self.node[c]]))
                ends[c] = last
                u = self.node[c]
                if not rest and len(self.copies[u]) - fewer.get(u, 0) > 1 and \
                        not (self.keep_firsts and c == self.copies[u][0]):  # nobody reads c: drop it
                    fewer[u] = fewer.get(u, 0) + 1
                    removed.append(c)
                    stack.append(c)
        return delta, ends, removed, lost

    def fits(self, delta: list[tuple[int, int, int]], removed: list[int], budget: int) -> bool:
        """Whether the steps where memory rises (the kept copy's, :meth:`removal`'s first change
        where it is one; every other change frees) stay within ``budget`` with every change made."""
        if not delta or delta[0][2] <= 0:
            return True  # nothing rises
        lo, hi, _ = delta[0]
        if lo >= hi:
            return True
        cuts = {lo, hi}
        for a, b, _ in delta[1:]:
            cuts.update(x for x in (a, b) if lo < x < hi)
        gone = {s for s in removed if lo <= s < hi}
        for s in gone:
            cuts.update((s, s + 1))
        points = sorted(cuts)
        for a, b in zip(points, points[1:]):
            if b == a + 1 and a in gone:
                continue
            rise = sum(d for x, y, d in delta if x <= a and b <= y)
            if self.profile.max(a, b) + rise > budget:
                return False
        return True

    def remove(self, k: int, j: int, delta, ends, removed, lost) -> None:
        """Make the changes :meth:`removal` worked out."""
        for lo, hi, d in delta:
            self.profile.add(lo, hi, d)
        for s in removed:
            self.alive[s] = False
            self.profile.drop(s)
            mine = self.copies[self.node[s]]
            mine.pop(bisect.bisect_left(mine, s))
        for c, steps in lost.items():
            self.readers[c] = [r for r in self.readers[c] if r not in steps]
        if self.readers[k]:
            for r in self.readers[k]:
                self.inputs[r] = [j if c == k else c for c in self.inputs[r]]
            self.readers[j] = sorted(self.readers[j] + self.readers[k])
            self.readers[k] = []
        for c, e in ends.items():
            self.end[c] = e


def _weighs_any(problem: PlanningProblem, order: Sequence[int]) -> bool:
    """Whether :func:`polish`'s pass over ``order`` has a recompute to weigh: a compute that is
    not its node's first, nor a pinned node's last (kept to the end)."""
    counts = np.bincount(np.asarray(order, dtype=np.int64), minlength=problem.n)
    pinned = np.asarray(problem.pinned, dtype=bool)
    return bool(np.any(counts - 1 - (pinned & (counts > 1)) > 0))


def polish(problem: PlanningProblem, computes: Sequence[int], budget: int, deadline: float = math.inf,
           keep_firsts: bool = False) -> list[int]:
    """``computes`` (a valid recompute plan's computes, in schedule order, within ``budget`` as
    :func:`planner.pebble.plan_of` frees them) with recomputes removed where memory allows,
    dearest first, pass after pass until one removes none or ``deadline`` passes. With
    ``keep_firsts`` each node's first compute stays (the nodes are first computed in the same
    order), though nobody reads it any more."""
    cost = [float(x) for x in problem.cost]
    order = list(computes)
    for _ in range(PASSES):
        if clock.now() > deadline:
            # what the pass would do, without building its copies (seconds on large plans: the
            # coarse zoo:gpt?layers=64's chen plan, 30 thousand computes): charge its first
            # weighing, if it has a recompute to weigh, and stop with the order as it is
            if _weighs_any(problem, order):
                clock.charge(256 * WEIGH_SECONDS)
            return order
        plan = _Copies(problem, order, keep_firsts)
        removed = 0
        firsts = {cs[0] for cs in plan.copies if cs}
        weigh = sorted((k for k in range(len(order)) if k not in firsts and k not in plan.kept),
                       key=lambda k: (-cost[order[k]], k))
        for i, k in enumerate(weigh):
            if i & 255 == 0:
                clock.charge(256 * WEIGH_SECONDS)
                if clock.now() > deadline:
                    return [t for s, t in enumerate(order) if plan.alive[s]]
            if not plan.alive[k]:
                continue
            mine = plan.copies[order[k]]
            at = bisect.bisect_left(mine, k)
            if at == 0:
                continue  # the copies before k were dropped: k is its node's first now
            j = mine[at - 1]
            change = plan.removal(k, j)
            delta, _, gone, _ = change
            if not plan.fits(delta, gone, budget):
                continue
            plan.remove(k, j, *change)
            removed += 1
        order = [t for s, t in enumerate(order) if plan.alive[s]]
        if not removed:
            break
    return order


def polished(problem: PlanningProblem, plan: Plan, sim: Simulation, budget: int,
             deadline: float = math.inf, keep_firsts: bool = False) -> tuple[Plan, Simulation]:
    """``plan`` (simulated as ``sim``) polished (:func:`polish`), where that makes it cheaper, the
    problem's accounting is the runtime's and the plan only computes and frees. Else ``(plan, sim)``."""
    if not problem.runtime_exact or sim.recomputes == 0 or any(e.op not in ("compute", "free") for e in plan.events):
        return plan, sim
    computes = [e.node for e in plan.events if e.op == "compute"]
    order = polish(problem, computes, budget, deadline, keep_firsts)
    if order == computes and problem.glued(order) == order:
        # nothing removed (its window passed first): the same computes in the same order take the
        # same time, so the plan below could not be cheaper; building and simulating it took
        # longer than the window on large plans (zoo:gpt?layers=64 at 70%, --time-limit 2: 0.4 s
        # of a 0.1 s window)
        return plan, sim
    better = plan_of(problem, order, plan.strategy)
    out = fitting(problem, better, budget, "polished plan")
    return (better, out) if out is not None and out.added_time < sim.added_time else (plan, sim)
