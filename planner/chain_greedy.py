"""Checkpoint greedy: recompute-on-demand under a budget, with a growing set of evictable buffers.

Executor (:func:`chain_run`): walk the fixed order with exact event accounting. Before step t,
every ancestor t needs that is not resident is recomputed in id order (a topological order);
a buffer is freed once nothing later reads it, where "reads" include the recomputes of evictable
readers (:func:`effective_readers`), so a recompute chain always stops at protected buffers.
When an allocation would exceed the budget, the evictable resident buffer with the least
(cost to recompute it from what is resident) / (bytes * steps until its next read) is freed;
buffers the chain in progress still reads are held. Protected buffers are never evicted.

Search (:func:`checkpoint_greedy`): start with every buffer protected (no remat). While the run
fails, unprotect on trial a few protected buffers resident where it failed (least cost per
byte first) and keep the trial that gets furthest (a plan, else the latest failing step, then
fewest bytes missing there, then least added time). Random layered graphs need many chained recomputes: evicting freely makes
chains reach back to the source and hold everything, which the eviction greedies of
planner/greedy.py run into; protected checkpoints bound the chains.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from planner import clock
from planner.plan import Event, Plan
from planner.problem import PlanningProblem

#: What one basic step of :func:`chain_run` charges the work clock (planner/clock.py), in
#: deterministic seconds: a step is an event, a node of a step's missing closure, a buffer
#: weighed for eviction, or a node its recompute cost visits. About its time on the 2-core machine
#: of the figures (2.4-3.9 us: the lstm fixture at batch 1, seq 8, at 60-90% of its peak, RL100 and
#: RL250 at 60-80%), so that a deadline means the same on either clock.
STEP_SECONDS = 3e-6


def effective_readers(problem: PlanningProblem, keep: np.ndarray, window: int) -> list[list[int]]:
    """Steps before which each buffer must be resident: its readers, plus the steps where a
    dropped reader of it gets recomputed (that recompute reads it too).

    A dropped buffer v is recomputed before each of its readers that comes more than ``window``
    steps after the previous one (or after v). Readers have larger ids, so one reverse pass
    settles every buffer.
    """
    readers = [list(s) for s in problem.succ_lists]
    for v in range(problem.n - 1, -1, -1):
        rs = sorted(set(readers[v]))
        readers[v] = rs
        if keep[v] or problem.pinned[v]:
            continue
        prev = v
        points = []
        for r in rs:
            if r - prev > window:
                points.append(r)
            prev = r
        for p in problem.pred_lists[v]:
            readers[p].extend(points)
    return readers


def post_order(v: int, children: Callable[[int], Sequence[int]], memo: dict, combine: Callable[[int], Any]) -> None:
    """Set memo[x] = combine(x) for v and every node reachable through ``children`` that is not
    in memo yet, children first (combine reads their memo entries). Iterative: recompute
    chains and deep DAGs must not hit the recursion limit."""
    stack = [v]
    while stack:
        x = stack[-1]
        if x in memo:
            stack.pop()
            continue
        todo = [u for u in children(x) if u not in memo]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        memo[x] = combine(x)


def over_missing(v: int, preds: Sequence[Sequence[int]], resident: Sequence[bool], memo: dict,
                 combine: Callable[[int], Any]) -> None:
    """:func:`post_order` over v and each ancestor of it that is not resident, inputs before
    their readers; combine reads the memo entries of x's missing inputs."""
    post_order(v, lambda x: [u for u in preds[x] if not resident[u]], memo, combine)


def redoable(v: int, preds: Sequence[Sequence[int]], resident: Sequence[bool], recomputable: Sequence[bool],
             memo: dict[int, bool]) -> bool:
    """Can v be computed again from what is resident? Not where it, or a freed ancestor it needs,
    may not be recomputed (a random op, freed once its readers ran): an eviction greedy that
    freed v then would have to make that node twice."""
    over_missing(v, preds, resident, memo,
                 lambda x: bool(recomputable[x]) and all(memo[u] for u in preds[x] if not resident[u]))
    return memo[v]


def needed_later(v: int, reads: Sequence[Sequence[int]], gone: Sequence[bool], t_now: int, dead: set[int]) -> bool:
    """Whether :func:`next_need` of v is not None, without its minimum: v, or a freed reader
    reached through freed readers, is read at or after ``t_now``. Stops at the first such read
    (next_need walks every freed reader first, which made the greedies quadratic on long unrolled
    graphs). ``dead`` caches the nodes found to have no later need. They stay dead as ``t_now``
    grows, as freed buffers are computed again (fewer freed readers to reach through) and as one of
    them is freed (what reaches it gains no need); freeing a buffer that may still be needed can
    revive them, so a caller empties the cache then."""
    if v in dead:
        return False
    seen = {v}
    stack = [v]
    while stack:
        x = stack.pop()
        rs = reads[x]
        if rs and rs[-1] >= t_now:  # reads are sorted
            return True
        for w in rs:
            if gone[w] and w not in seen and w not in dead:
                seen.add(w)
                stack.append(w)
    dead.update(seen)
    return False


def next_need(v: int, reads: Sequence[Sequence[int]], gone: Sequence[bool], t_now: int,
              memo: dict[int, int | None]) -> int | None:
    """v's next read at or after ``t_now``, or the next need of a freed reader of it (``gone``:
    computed before, freed since), through freed readers: that reader is recomputed from v then."""
    post_order(v, lambda x: [w for w in reads[x] if gone[w]], memo,
               lambda x: earliest_need(x, reads, gone, t_now, memo))
    return memo[v]


def earliest_need(x: int, reads: Sequence[Sequence[int]], gone: Sequence[bool], t_now: int,
                  memo: dict[int, int | None]) -> int | None:
    """x's next read at or after ``t_now``, or sooner the next need (``memo``) of a freed reader."""
    rs = reads[x]
    j = bisect.bisect_left(rs, t_now)
    best = rs[j] if j < len(rs) else None
    for w in rs:
        if gone[w]:
            e = memo[w]
            if e is not None and (best is None or e < best):
                best = e
    return best


def missing_closure(t: int, preds: Sequence[Sequence[int]], resident: Sequence[bool]) -> list[int]:
    """The ancestors step t needs that are not resident, closed over their inputs, ascending:
    a topological order in which each is recomputed once for the step."""
    todo: set[int] = set()
    stack = [u for u in preds[t] if not resident[u]]
    while stack:
        x = stack.pop()
        if x not in todo:
            todo.add(x)
            stack.extend(u for u in preds[x] if not resident[u] and u not in todo)
    return sorted(todo)


@dataclass(frozen=True)
class ChainRun:
    """Outcome of one executor run: a plan, or where it got stuck."""

    plan: Plan | None
    fail_step: int  # step that could not be made to fit (n when the plan is complete)
    stuck: tuple[int, ...]  # protected buffers resident when it got stuck (unprotect candidates)
    short: int  # bytes missing when it got stuck
    added: float  # recompute cost spent (up to the failure)


def chain_run(problem: PlanningProblem, budget: int, protect: np.ndarray, max_events: int | None = None,
              deadline: float = math.inf) -> ChainRun:
    """Run the executor (module docstring) with ``protect`` as the never-evicted set. Each step
    charges the work clock STEP_SECONDS per basic step of it; past ``deadline``
    (planner.clock.now() seconds) the run stops where it is, stuck at that step."""
    p = problem
    n = p.n
    size = p.size
    preds = p.pred_lists
    readers = effective_readers(p, protect | ~p.recomputable, 0)
    evictable = p.recomputable & ~p.pinned & ~protect
    resident = np.zeros(n, dtype=bool)
    pending = np.zeros(n, dtype=np.int64)  # reads still to come from the chain in progress
    done = np.zeros(n, dtype=bool)
    events: list[Event] = []
    mem = p.base_bytes
    added = 0.0
    work = 0  # basic steps not charged to the work clock yet
    cap = max_events if max_events is not None else 60 * n + 1000
    dies: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        dies[readers[v][-1] if readers[v] else v].append(v)

    def next_read(v: int, t: int) -> int | None:
        rs = readers[v]
        j = bisect.bisect_right(rs, t)
        return rs[j] if j < len(rs) else None

    def redo_cost(v: int, memo: dict[int, float]) -> float:
        """Cost to recompute v from what is resident now (missing ancestors included)."""
        over_missing(v, preds, resident, memo,
                     lambda x: float(p.cost[x]) + sum(memo[u] for u in preds[x] if not resident[u]))
        return memo[v]

    def release(u: int) -> None:
        nonlocal mem
        events.append(Event("free", u))
        resident[u] = False
        mem -= int(size[u])

    def make_room(need: int, t: int) -> bool:
        nonlocal work
        memo: dict[int, float] = {}
        while mem + need > budget:
            best, victim = None, -1
            weighed = np.nonzero(resident & evictable & (pending == 0))[0]
            work += len(weighed)
            for v in weighed:
                v = int(v)
                nxt = next_read(v, t)
                key = (-1.0, v) if nxt is None else (redo_cost(v, memo) / (max(1, int(size[v])) * (nxt - t)), v)
                if best is None or key < best:
                    best, victim = key, v
            work += len(memo)  # the nodes redo_cost visited
            if victim < 0:
                return False
            release(victim)
            memo.clear()
        return True

    def settle() -> None:
        """Charge the basic steps since the last charge."""
        nonlocal work
        clock.charge((work + len(events)) * STEP_SECONDS)
        work = -len(events)

    def stuck(t: int, need: int) -> ChainRun:
        settle()
        held = np.nonzero(resident & protect & p.recomputable & ~p.pinned & (pending == 0))[0]
        return ChainRun(None, t, tuple(int(v) for v in held), mem + need - budget, added)

    for t in range(n):
        settle()
        if clock.now() > deadline:
            return stuck(t, 0)
        chain = (*missing_closure(t, preds, resident), t)
        work += len(chain)
        for y in chain:
            for u in preds[y]:
                pending[u] += 1
        for x in chain:
            need = int(size[x]) + int(p.scratch[x])
            if len(events) > cap or not make_room(need, t):
                return stuck(t, need)
            events.append(Event("compute", x))
            if done[x]:
                added += float(p.cost[x])
            done[x] = True
            resident[x] = True
            mem += int(size[x])
            for u in preds[x]:
                pending[u] -= 1
                if pending[u] == 0 and resident[u] and not p.pinned[u] and next_read(u, t) is None:
                    release(u)
        for u in (*dies[t], t):  # past their last read, even one a resident reader never made
            if resident[u] and not p.pinned[u] and next_read(u, t) is None:
                release(u)
    settle()
    return ChainRun(Plan(tuple(events), "greedy"), n, (), 0, added)


def checkpoint_greedy(problem: PlanningProblem, budget: int, tries: int = 3, max_rounds: int = 30,
                      deadline: float = math.inf) -> Plan | None:
    """A plan within ``budget`` from the search of the module docstring, or None if it gets stuck.

    At most ``max_rounds`` rounds of ``tries`` trial runs: the greedy is called several times per
    solve (comparison row, hints, the phase-1 ladder), and on graphs where it does not get
    there (random layered graphs of a few hundred nodes) more rounds only cost time (measured).
    No round starts after ``deadline`` (planner.clock.now() seconds; None then), and a run stops
    there: the coarse zoo:gpt?layers=32 at 70% spent 1.6 s in it of a 2 s --time-limit, its
    deadline long passed. The runs charge the work clock their steps (:data:`STEP_SECONDS`), so on
    it the deadline ends them too: uncharged, the lstm fixture (batch 8, seq 128) at 80% ran the
    ladder's rounds for over 10 minutes of a ``--time-limit 1 --deterministic`` solve.
    """
    p = problem
    protect = np.ones(p.n, dtype=bool)
    run = chain_run(p, budget, protect, deadline=deadline)
    for _ in range(max_rounds):
        if run.plan is not None:
            return run.plan
        if clock.now() > deadline:
            return None
        cands = sorted(run.stuck, key=lambda v: (float(p.cost[v]) / max(1, int(p.size[v])), v))[:tries]
        best = None
        for v in cands:
            trial = protect.copy()
            trial[v] = False
            out = chain_run(p, budget, trial, deadline=deadline)
            key = (out.plan is None, -out.fail_step, out.short, out.added, v)
            if best is None or key < best[0]:
                best = (key, trial, out)
        if best is None:
            return None
        _, protect, run = best
    return run.plan
