"""Split greedy: free a buffer between two of its reads and recompute it just before the next.

State: each buffer's residency is a list of segments [s, e] over fixed-order steps (inclusive),
starting as [v, last_use(v)]; ``reads[v]`` are the steps that need it (its readers, plus steps
where a split reader of it is recomputed). Memory at step t = sizes of segments covering t +
the largest workspace used there (scratch[t], or a recompute's before it) (+ base): the step
accounting the unplanned peak uses, and never less than the replay of the plan counts.

Move: at the peak step t*, take a buffer v resident there but not read by t*, and the read gap
(a, b) around t*. Split v's segment into [.., a] and [b, ..], recompute v before step b, and
extend each input of v that is not resident at b up to b. Benefit at t* = size_v minus the
inputs whose extension crosses t*; the move with least cost per byte of benefit wins. Repeat
until the peak fits or no move helps. The schedule recomputes, before each step, the buffers
whose segment starts there (ascending id) and frees a buffer after the step its segment ends.
"""
from __future__ import annotations

import bisect
import heapq
import math
import sys
from collections.abc import Sequence

import numpy as np

from planner import clock
from planner.chain_greedy import earliest_need, needed_later
from planner.plan import Event, Plan
from planner.problem import PlanningProblem
from planner.simulate import Simulation, simulate

#: What one basic step of the greedies here charges the work clock (planner/clock.py), in
#: deterministic seconds: an event, a buffer weighed for eviction or a node the walks weighing it visit (:func:`evict_greedy`), a
#: buffer weighed or a move resolved at the peak (:func:`split_greedy_simulated`). About its time on
#: the 2-core machine of the figures (1.1-3.3 us, and 5 us for the split greedy on RL250: the lstm
#: fixture at batch 1, seq 8, at 60-90% of its peak, RL100 and RL250 at 60-80%), so that a
#: deadline means the same on either clock.
STEP_SECONDS = 2e-6

#: Buffers the eviction greedy weighs within one step before it charges them and asks its
#: deadline (0.2 s at :data:`STEP_SECONDS`).
WEIGHED_PER_CHECK = 100_000


def split_greedy(problem: PlanningProblem, budget: int, max_moves: int | None = None, chain_depth: int = 8) -> Plan | None:
    """A plan whose step-accounted peak is within ``budget``, or None if the greedy gets stuck."""
    found = split_greedy_simulated(problem, budget, max_moves, chain_depth)
    return None if found is None else found[0]


def split_greedy_simulated(problem: PlanningProblem, budget: int, max_moves: int | None = None,
                           chain_depth: int = 8, deadline: float = math.inf) -> tuple[Plan, Simulation] | None:
    """:func:`split_greedy`'s plan with its replay (which it checks against ``budget``), so that a
    caller need not replay it again. None too when a move is still to make at ``deadline``
    (planner.clock.now() seconds): the lstm fixture (batch 8, seq 128) at 80% took minutes of a
    ``--strategy greedy --time-limit 1`` plan in it."""
    p = problem
    n = p.n
    if n == 0:
        plan = Plan((), "greedy")
        return plan, simulate(p, plan)
    size = p.size.astype(np.int64)
    segs: list[list[list[int]]] = [[[v, int(p.last_use[v])]] for v in range(n)]
    reads: list[list[int]] = [sorted(set(s)) for s in p.succ_lists]
    mem = p.step_memory.astype(np.int64).copy()  # a taken-over input counted apart (may outlive its reader)
    # the workspace counted at each step: its own, or a larger one of a recompute before it
    step_scratch = p.scratch.astype(np.int64).copy()
    preds = p.pred_lists
    droppable = p.recomputable & ~p.pinned & (size > 0)
    limit = max_moves if max_moves is not None else 20 * n + 100
    # plain lists for the inner loops (numpy scalars are slow to index one by one)
    sizes, costs = size.tolist(), p.cost.astype(float).tolist()
    redo = (p.recomputable & ~p.pinned).tolist()

    def covering(v: int, t: int) -> int:
        for k, (s, e) in enumerate(segs[v]):
            if s <= t <= e:
                return k
        return -1

    def resolve(v: int, b: int, t: int, plan: dict, depth: int) -> tuple[float, int]:
        """Make v's inputs resident at b for a recompute of v there; fills ``plan`` with
        u -> ("extend", lo) or ("recompute",). Returns (added cost, bytes lost at step t)."""
        cost, loss = 0.0, 0
        for u in preds[v]:
            if u in plan:
                continue
            lo = 0  # one past the end of u's last segment before b (none covers b)
            for s, e in segs[u]:
                if s <= b <= e:
                    lo = -1
                    break
                if lo <= e < b:
                    lo = e + 1
            if lo < 0:
                continue
            crosses = lo <= t
            if crosses and depth > 0 and redo[u]:
                plan[u] = ("recompute",)
                c, l = resolve(u, b, t, plan, depth - 1)
                cost += costs[u] + c
                loss += l
            else:
                plan[u] = ("extend", lo)
                if crosses:
                    loss += sizes[u]
        return cost, loss

    def workspace(v: int, b: int, actions: dict) -> int:
        """Step b's workspace once v (and the inputs ``actions`` recomputes) is recomputed before it."""
        redone = [int(p.scratch[u]) for u, act in actions.items() if act[0] == "recompute"]
        return max(int(step_scratch[b]), int(p.scratch[v]), *redone)

    for _ in range(limit):
        t = int(np.argmax(mem))
        peak = int(mem[t])
        if peak <= budget:
            break
        if clock.now() > deadline:
            return None
        clock.charge(t * STEP_SECONDS)  # the buffers weighed below (the chains resolved: as they pop)
        busy = set(preds[t])
        # Moves by (score, -benefit, v), cheapest first. A move's score is at least
        # cost[v] / size[v] (its chain adds cost, its extensions take benefit away), so moves sit
        # in a heap under that key until popped, and only then is their chain resolved: the
        # first move that fits is the one a full sort would find, with fewer chains resolved
        # (with the single scan of segments in resolve: the lstm fixture, seq 32, at 60%: 10.5 s
        # -> 3.3 s, the same plan).
        heap = []
        for v in range(t):
            if not droppable[v] or v in busy:
                continue
            k = covering(v, t)
            if k < 0:
                continue
            s, e = segs[v][k]
            rs = reads[v]
            j = bisect.bisect_left(rs, t)  # first read >= t
            if j == len(rs) or rs[j] > e or rs[j] == t:  # read at t (by a recompute there)
                continue
            b = rs[j]
            a = rs[j - 1] if j > 0 and rs[j - 1] >= s else s
            heap.append(((costs[v] + 1e-12) / sizes[v], -math.inf, v, k, a, b, None))
        heapq.heapify(heap)
        best = None
        while heap:
            score, rank, v, k, a, b, actions = heapq.heappop(heap)
            clock.charge(STEP_SECONDS)
            if actions is None:  # resolve its chain, back in the heap under its own key
                actions = {}
                extra, loss = resolve(v, b, t, actions, chain_depth)
                benefit = sizes[v] - loss
                if benefit > 0:
                    heapq.heappush(heap, ((costs[v] + extra + 1e-12) / benefit, -benefit, v, k, a, b, actions))
                continue
            # the cheapest move that leaves every step it touches below the peak
            lo = min([a + 1] + [act[1] for act in actions.values() if act[0] == "extend"])
            window = mem[lo:b + 1].copy()
            window[a + 1 - lo:b - lo] -= size[v]
            for u, act in actions.items():
                if act[0] == "extend":
                    window[act[1] - lo:] += size[u]
                else:
                    window[-1] += size[u]
            window[-1] += workspace(v, b, actions) - step_scratch[b]
            if window.max() < peak:
                best = (v, k, a, b, actions)
                break
        if best is None:
            return None
        v, k, a, b, actions = best
        s, e = segs[v][k]
        segs[v][k:k + 1] = [[s, a], [b, e]]
        mem[a + 1:b] -= size[v]
        largest = workspace(v, b, actions)
        mem[b] += largest - step_scratch[b]
        step_scratch[b] = largest
        for u in sorted(actions):
            if actions[u][0] == "extend":
                lo = actions[u][1]
                mem[lo:b + 1] += size[u]
                kk = max(i for i, (ss, ee) in enumerate(segs[u]) if ee < b)
                segs[u][kk][1] = b
                if kk + 1 < len(segs[u]) and segs[u][kk + 1][0] == b + 1:  # adjacent: merge
                    segs[u][kk][1] = segs[u][kk + 1][1]
                    del segs[u][kk + 1]
            else:
                mem[b] += size[u]
                bisect.insort(segs[u], [b, b])
        for x in (v, *actions):  # the recomputes at b read their inputs there
            for u in preds[x]:
                j = bisect.bisect_left(reads[u], b)
                if j == len(reads[u]) or reads[u][j] != b:
                    reads[u].insert(j, b)
    else:
        return None
    if mem.max() > budget:
        return None
    plan = _schedule(p, segs)
    sim = simulate(p, plan)
    # The step accounting holds at least what the replay counts (a recompute at step b runs
    # with at most the buffers covering b resident, and step b counts the largest workspace
    # used there), so a plan over the budget here is a bug in it.
    assert sim.peak_bytes <= budget, f"split greedy: replay {sim.peak_bytes} over the step accounting"
    return plan, sim


def _schedule(p: PlanningProblem, segs: list[list[list[int]]]) -> Plan:
    n = p.n
    starts: list[list[int]] = [[] for _ in range(n)]
    ends: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        for k, (s, e) in enumerate(segs[v]):
            if k > 0:
                starts[s].append(v)
            if not p.pinned[v]:
                ends[e].append(v)
    events: list[Event] = []
    for t in range(n):
        for v in sorted(starts[t]):
            events.append(Event("compute", v))
        events.append(Event("compute", t))
        for v in sorted(ends[t]):
            events.append(Event("free", v))
    return Plan(tuple(events), "greedy")


#: How deep :func:`evict_greedy`'s recompute cost looks through missing inputs: one at that depth
#: counts its own cost only (chains through a long freed recurrence stay a bounded walk).
REDO_DEPTH = 50


def _pick_victim(candidates: list[int], t_now: int, resident: list[bool], gone: list[bool],
                 reads: Sequence[Sequence[int]], preds: Sequence[Sequence[int]], recomputable: list[bool],
                 cost: list[float], size: list[int]) -> tuple[int, int]:
    """:func:`evict_greedy`'s next victim among ``candidates`` (ascending: its resident, evictable,
    unlocked buffers), or -1, and how many nodes the walks weighing them visit: for every candidate,
    its missing ancestors (redoable), for the redoable ones their freed readers through freed
    readers (next_need), and for those with a next need their missing ancestors again (the
    recompute cost), each walk's nodes counted once for all candidates (the work clock's charge).

    Every node of those walks is settled once, in one pass over their union in id order (inputs
    before readers), not in a walk per candidate: on the lstm fixture (batch 8, seq 32) at 60%
    each of 463 evictions weighed 693 candidates with 919 missing ancestors, and the walks (a
    post_order call per candidate and walk) took 4.9 CPU s of the greedy's 5 (2.5 s this way).
    Same victims as those walks (tests/test_evict_greedy.py keeps them to compare) and the same
    recompute costs, summed in the same order; where a chain of missing inputs is deeper than
    :data:`REDO_DEPTH` (the bound cuts the walk, then the order it visits nodes in counts) the
    costs are the depth-bounded walk's (:func:`_redo_cost`).
    """
    # missing ancestors of the candidates, with the missing inputs of each node walked
    gaps = {v: [u for u in preds[v] if not resident[u]] for v in candidates}
    stack = [u for v in candidates for u in gaps[v]]
    miss: set[int] = set()
    while stack:
        x = stack.pop()
        if x not in miss:
            miss.add(x)
            gaps[x] = gap = [u for u in preds[x] if not resident[u]]
            stack.extend(gap)
    bad: dict[int, bool] = {}  # may not be recomputed from what is resident
    redo: dict[int, float] = {}  # cost to recompute it from what is resident
    height: dict[int, int] = {}  # longest chain of missing inputs above it
    for x in sorted(miss):
        gap, no, h = gaps[x], not recomputable[x], 0
        for u in gap:
            no = no or bad[u]
            if height[u] >= h:
                h = height[u] + 1
        bad[x] = no
        redo[x] = cost[x] + sum([redo[u] for u in gap])  # summed as _redo_cost sums (3.12's sum() compensates)
        height[x] = h
    ok = [v for v in candidates if recomputable[v] and not any(bad[u] for u in gaps[v])]
    # freed readers of the redoable candidates, through freed readers
    freed: set[int] = set()
    stack = [w for v in ok for w in reads[v] if gone[w]]
    while stack:
        x = stack.pop()
        if x not in freed:
            freed.add(x)
            stack.extend([w for w in reads[x] if gone[w] and w not in freed])
    needs: dict[int, int | None] = {}
    for x in sorted(freed, reverse=True):  # readers first
        needs[x] = earliest_need(x, reads, gone, t_now, needs)
    best, victim = None, -1
    dear = []  # (candidate, its next need)
    for v in ok:
        nxt = earliest_need(v, reads, gone, t_now, needs)
        if nxt is None:
            if best is None or (-1.0, v) < best:  # nobody reads it any more: free first
                best, victim = (-1.0, v), v
        else:
            dear.append((v, nxt))
    if any(height[u] >= REDO_DEPTH for v, _ in dear for u in gaps[v]):
        memo: dict[int, float] = {}
        costs = [_redo_cost(v, memo, preds, resident, cost) for v, _ in dear]
        walked = len(memo)
    else:
        costs = [cost[v] + sum([redo[u] for u in gaps[v]]) for v, _ in dear]
        reach = miss  # the missing ancestors of ``dear``: those of every candidate, where it is all of them
        if len(dear) < len(candidates):
            reach = set()
            stack = [u for v, _ in dear for u in gaps[v]]
            while stack:
                x = stack.pop()
                if x not in reach:
                    reach.add(x)
                    stack.extend(gaps[x])
        walked = len(dear) + len(reach)
    for (v, nxt), c in zip(dear, costs):
        key = (c / (max(1, size[v]) * max(1, nxt - t_now + 1)), v)
        if best is None or key < best:
            best, victim = key, v
    return victim, len(candidates) + len(miss) + len(ok) + len(freed) + walked


def _redo_cost(v: int, memo: dict[int, float], preds: Sequence[Sequence[int]], resident: list[bool],
               cost: list[float], depth: int = 0) -> float:
    """Cost to recompute v from what is resident now (its missing ancestors included, to
    :data:`REDO_DEPTH`)."""
    if v in memo:
        return memo[v]
    c = cost[v]
    if depth < REDO_DEPTH:
        c += sum(_redo_cost(u, memo, preds, resident, cost, depth + 1) for u in preds[v] if not resident[u])
    memo[v] = c
    return c


def evict_greedy(problem: PlanningProblem, budget: int, max_events: int | None = None,
                 deadline: float = math.inf) -> Plan | None:
    """Run the fixed order under ``budget`` with exact (event) accounting, evicting on demand.

    Before every allocation that would exceed the budget, free the resident buffer with the
    least recompute cost per byte per step until it is next *needed* (the future is known:
    Belady for remat, as in DTR with foresight). A buffer is needed at its next read, or earlier
    where a freed reader of it (through freed readers) is read again: that reader is recomputed
    from it then. Counting only direct reads made the greedy free the ancestors of buffers it
    had just freed, and every recompute then reached back to the source (RL1000 at 50%: ten
    million events by step 486; with needs through freed readers RL100 at 80% and RL1000 at 70%
    get plans, where none did). A missing input is recomputed from its inputs, recursively.
    Inputs of the compute in progress are locked. None when nothing can be freed, or when the
    walk is still going at ``deadline`` (planner.clock.now() seconds). Before each step the walk
    charges the work clock :data:`STEP_SECONDS` per event, per buffer weighed for eviction and
    per node the walks weighing them visited, since the last step, so that on it too the deadline ends the walk.
    """
    p = problem
    n = p.n
    size = p.size
    reads = p.succ_lists
    preds = p.pred_lists
    resident = np.zeros(n, dtype=bool)
    gone = np.zeros(n, dtype=bool)  # computed before, freed since
    lock = np.zeros(n, dtype=np.int64)
    evictable = p.recomputable & ~p.pinned
    events: list[Event] = []
    mem = p.base_bytes
    cap = max_events if max_events is not None else 20 * n + 1000
    t_now = 0
    charged = 0  # events charged so far
    weighed = 0  # buffers weighed for eviction, not charged to the work clock yet
    # buffers needed_later found with no later need, kept for the whole walk: see
    # planner.tight_greedy._run (make_room's evictions empty it)
    dead: set[int] = set()
    # resident and gone again as Python lists, and the inputs of the victim's choice as lists:
    # the walks of make_room read them one node at a time (numpy scalars are slow to index)
    on, off = resident.tolist(), gone.tolist()
    recomputable, costs, sizes = p.recomputable.tolist(), p.cost.astype(float).tolist(), size.tolist()

    def spent() -> bool:
        """Charge the work clock what was done since the last charge; is ``deadline`` past?"""
        nonlocal weighed, charged
        clock.charge((weighed + len(events) - charged) * STEP_SECONDS)
        weighed, charged = 0, len(events)
        return clock.now() > deadline

    def make_room(need: int) -> bool:
        nonlocal mem, weighed
        while mem + need > budget:
            candidates = np.nonzero(resident & evictable & (lock == 0))[0].tolist()
            victim, walked = _pick_victim(candidates, t_now, on, off, reads, preds, recomputable, costs, sizes)
            weighed += len(candidates) + walked
            # one step's recomputes may weigh millions of buffers: the deadline ends it there too
            # (RL1000 at 50% in a memory-aware order: 29 s past a deadline 18 s away)
            if victim < 0 or weighed > WEIGHED_PER_CHECK and spent():
                return False
            dead.clear()  # a buffer that may still be needed: it may revive those found dead
            events.append(Event("free", victim))
            resident[victim] = on[victim] = False
            gone[victim] = off[victim] = True
            mem -= int(size[victim])
        return True

    def release_dead(nodes) -> None:
        nonlocal mem
        for u in nodes:
            if resident[u] and lock[u] == 0 and not p.pinned[u] and not needed_later(u, reads, gone, t_now, dead):
                events.append(Event("free", u))
                resident[u] = on[u] = False
                gone[u] = off[u] = True
                mem -= int(size[u])

    def compute(x: int) -> bool:
        nonlocal mem
        if not make_room(int(size[x]) + int(p.scratch[x])):
            return False
        events.append(Event("compute", x))
        resident[x] = on[x] = True
        gone[x] = off[x] = False
        mem += int(size[x])
        return True

    def ensure(x: int) -> bool:
        """Make x resident, recomputing missing inputs first (its inputs locked meanwhile)."""
        if resident[x]:
            return True
        if len(events) > cap:
            return False
        locked = [q for q in preds[x] if resident[q]]
        for q in locked:
            lock[q] += 1
        ok = True
        for q in preds[x]:
            if not resident[q]:
                ok = ensure(q)
                if not ok:
                    break
                lock[q] += 1
                locked.append(q)
        ok = ok and compute(x)
        for q in locked:
            lock[q] -= 1
        release_dead(preds[x])
        return ok

    depth = sys.getrecursionlimit()
    sys.setrecursionlimit(max(depth, 4 * n + 100))
    try:
        for t in range(n):
            t_now = t
            if spent() or not ensure(t):
                return None
            t_now = t + 1
            release_dead((*preds[t], t))
    finally:
        sys.setrecursionlimit(depth)
    return Plan(tuple(events), "greedy")
