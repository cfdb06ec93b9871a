"""Reverse pebbling: plans built from the end of the step back to its start, in any order.

Every other planner here walks the schedule forward: it decides what to keep at a step without
knowing what the later steps will hold. Walked backward, that is known exactly. The *demand set*
D of a point in the schedule is the set of buffers resident there that a later compute reads.
Going back over the compute of node t (t in D, or an output not computed yet) turns D into
(D - {t}) | preds(t), and that compute needs

    bytes(D) + bytes(preds(t) - D) + scratch(t) (+ size(t) when t is not in D) + base

bytes, exactly what :func:`planner.simulate.simulate` counts when each buffer is freed right
after its last read. A schedule in which every compute is needed and every buffer freed after
its last read is such a backward walk from D = {} at the end to D = {} at the start, so the walk
covers every recompute-only plan; a node that comes back into D later in the walk is recomputed.

The search is a beam over these walks, synchronised by the number of steps walked. The key
either puts the time added so far first (recomputes: going back over t while t is still an
ancestor of D or of an output not computed yet) or the bytes of D first (more room later, more
recomputes). The first finds cheap plans where memory allows; the second gets through budgets
where the others end in a state with no move left (RL100 at 55% of its peak: no other planner
here finds a plan), and keeps the cheapest of the states it drops too: on bytes alone it takes
any recompute that saves a byte, and the order of its plan is the one CP-SAT then searches. The
plans recompute a lot at such budgets: the planner asks for one only when its solve ends without
a plan (planner.planning._any_order), not as a rival of the CP-SAT model.

With ``in_order`` a node is gone back over for the last time (its first compute) only when it is
the highest node left, so the first computes come in node order. That walk has no plan that
computes a node unread only to keep its first compute in node order, which
:mod:`planner.least`'s in-order search has (tests/test_pebble.py); the planner walks in any
order, where such a compute is never needed: with a beam that keeps every state, the any-order
walk is the exact any-order search.

The beams keep a few states per step, so they end in dead ends at the tightest budgets. The
depth-first walk (:func:`depth_first_walk`) keeps every state it has been to and backs up out of
dead ends: complete, and asked for when the beams find nothing (RL250 at 60% of its peak, 504
bytes above what its largest step holds by itself: 149 k states, 9 s).

Nodes that may not be recomputed (pinned outputs, random ops) are gone back over only once,
when no other node left in the walk needs them; pinned outputs are in D from the end.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from planner import clock
from planner.plan import Event, Plan
from planner.problem import PlanningProblem
from planner.simulate import InvalidPlanError, Simulation, simulate


@dataclass(frozen=True)
class Walk:
    """One configuration of :func:`reverse_walk`."""

    width: int  # states kept per step
    memory_first: bool  # key: (bytes of D, time added) instead of (time added, bytes of D)
    in_order: bool = True  # first computes in node order (False: in any order)
    # states kept per step beside those ``width`` ones: the least time added among the rest (a
    # walk on bytes alone trades any recompute for a few bytes, and its order is the one CP-SAT
    # then searches: zoo:cnn at 65%, +34.3% in the order of a walk on bytes, +26.9% with one
    # such state kept)
    cheapest: int = 0


#: Tried in this order by :func:`reverse_pebble`: a narrow walk on time added; the walk for room
#: when it finds nothing (RL100 at its floor: 0.3 s, where the wide walk takes 3 s), keeping the
#: cheapest state of the rest too; then a wide walk on time added, which finds cheaper plans where
#: memory allows (RL100 at 70%: +11.5% against +61% for the narrow one). The cheapest plan found
#: wins.
WALKS = (Walk(16, False), Walk(8, True, cheapest=1), Walk(64, False))

#: Steps a walk may take, per node (+ 1000): beyond it the walk is recomputing without end.
STEPS_PER_NODE = 40
#: Moves a walk may weigh in all (a cap on its work that does not depend on the machine).
MOVES = 4_000_000
#: What weighing one move charges the work clock (planner/clock.py), in deterministic seconds:
#: about the wall time of one on the 2-core machine of the figures, so that a deadline means
#: the same on either clock.
MOVE_SECONDS = 2e-6


def reverse_walk(problem: PlanningProblem, budget: int, walk: Walk, deadline: float = math.inf) -> list[int] | None:
    """The computes of a plan within ``budget`` (nodes in schedule order), or None."""
    p = problem
    n = p.n
    size = [int(x) for x in p.size]
    cost = [float(x) for x in p.cost]
    scratch = [int(x) for x in p.scratch]
    redo = [bool(x) for x in p.recomputable]
    preds = p.pred_lists
    limit = budget - p.base_bytes
    anc = _ancestors(preds)
    pred_mask, pinned, owed0, mem0 = _walk_start(p, size)
    if mem0 > limit:
        return None
    history: list[tuple[int, int]] = []  # (parent entry, node)
    beam = [(0.0, mem0, pinned, owed0, -1)]
    best: tuple[float, int] | None = None
    weighed = 0
    for _ in range(STEPS_PER_NODE * n + 1000):
        if not beam or clock.now() > deadline or weighed > MOVES:
            break
        nxt: dict[tuple[int, int], tuple[tuple[float, ...], float, int, int]] = {}
        for added, mem, demand, owed, entry in beam:
            moves, needed = _moves(demand, owed, anc, size)
            weighed += len(moves)
            clock.charge(len(moves) * MOVE_SECONDS)
            # the highest node not computed for the first time yet (walked back to for good)
            top = (needed | demand | owed).bit_length() - 1
            for t, own in moves:
                again = (needed >> t) & 1
                if again and not redo[t]:
                    continue
                if walk.in_order and not again and t != top:
                    continue  # a first compute out of node order
                new = pred_mask[t] & ~demand
                grow = sum(size[u] for u in _bits(new))
                if mem + grow + own + scratch[t] > limit:
                    continue
                d2 = (demand & ~(1 << t)) | pred_mask[t]
                o2 = owed & ~(1 << t)
                a2 = added + (cost[t] if again else 0.0)
                m2 = mem + grow - (0 if own else size[t])
                if not d2 and not o2:
                    if best is None or a2 < best[0]:
                        history.append((entry, t))
                        best = (a2, len(history) - 1)
                    continue
                key = (m2, a2) if walk.memory_first else (a2, m2)
                old = nxt.get((d2, o2))
                if old is None or key < old[0]:
                    nxt[(d2, o2)] = (key, a2, m2, entry, t)
        ranked = sorted(nxt.items(), key=lambda kv: (kv[1][0], kv[0]))
        if walk.cheapest:  # and the cheapest of the states the key drops (time added, then bytes of D)
            ranked = ranked[:walk.width] + sorted(ranked[walk.width:],
                                                  key=lambda kv: (kv[1][1], kv[1][2], kv[0]))[:walk.cheapest]
        else:
            ranked = ranked[:walk.width]
        beam = []
        for (d2, o2), (_, a2, m2, entry, t) in ranked:
            if best is not None and a2 >= best[0]:
                continue
            history.append((entry, t))
            beam.append((a2, m2, d2, o2, len(history) - 1))
    if best is None:
        return None
    order = []
    entry = best[1]
    while entry >= 0:
        entry, t = history[entry]
        order.append(t)
    return order  # the walk's last move is the schedule's first compute


#: Bytes the states :func:`depth_first_walk` remembers may take (one int of a bit per node each,
#: in a set: about 0.13 KB apiece on RL250, so about 8 million states there).
DFS_BYTES = 1 << 30
#: Sets of buffers whose bytes the walk remembers at once (then it starts again).
BYTES_MEMO = 1 << 20


@dataclass(frozen=True)
class DepthFirst:
    """What :func:`depth_first_walk` found: the computes of a plan (schedule order), or none,
    and whether the walk went through every state (then no recompute-only plan in any order
    fits the budget: a proof, where the walk's accounting is the simulator's)."""

    order: list[int] | None
    exhausted: bool
    states: int


@dataclass(frozen=True)
class DepthFirstPlan:
    """:func:`depth_first_plan`'s answer: its plan and simulation, or None; ``exhausted``: the
    walk visited every state without finding one. On a problem that cannot swap and whose
    accounting is the runtime's (``PlanningProblem.runtime_exact``) that proves no plan, in any
    node order and with any recomputes, fits the budget. ``search``: the walk its deadline cut
    short, to go on with (None once it has ended)."""

    found: tuple[Plan, Simulation] | None
    exhausted: bool
    search: "DepthFirstSearch | None" = None


def depth_first_walk(problem: PlanningProblem, budget: int, deadline: float = math.inf,
                     max_states: int | None = None) -> DepthFirst:
    """The backward walk of :func:`reverse_walk` in any order, depth first with every state it
    has been to remembered: complete, where the beams drop states and end in dead ends. Gives up
    at ``deadline`` or past ``max_states`` states (by default, as many as :data:`DFS_BYTES` holds).
    :class:`DepthFirstSearch` is the walk, which a later call may resume.

    *Moves.* From each state, the moves that go back over a node for the last time (its first
    compute: no node left in the state needs it) come first, then the recomputes; within each,
    the highest node first. Whether a move fits the budget is worked out when it is tried. Going
    back over the graph roughly in reverse node order keeps the plans short: RL250 at 60% of its
    peak, 5,953 computes (+2195% added time) from 149 k states in 9.3 s, where trying the moves
    that leave the fewest bytes demanded first (stop 41) made 415,468 computes (+131140%) from
    2.8 million states in 150 s. It asks only for a plan within ``budget``, not a cheap one: the
    planner polishes what it finds (planner/polish.py: that plan, +208%).

    *Subsumption.* A state is skipped when a state already visited demands a subset of its
    buffers and owes a subset of its outputs (checked for the subsets one member short): from
    the smaller state every walk of the larger one can be copied, move by move, skipping the
    moves over what it lacks, and never needs more bytes, so it can only be closer to a plan.
    An exhausted walk still proves that none fits: then every move from a visited state leads to
    a visited state or to a superset of one, and copying any walk from the start to a plan that
    way would end in the empty state, which the walk would have reached. (RL250 at 60%: 205 k of
    354 k new states skipped; ``beams_dead_end`` at 108 bytes exhausted in 4,677 states, not 57,092.)"""
    return DepthFirstSearch(problem, budget, max_states).run(deadline)


class DepthFirstSearch:
    """:func:`depth_first_walk`, run until a deadline; :meth:`run` again goes on where the last
    run stopped, through the same states in the same order as one longer run (the walk before a
    solve and the one after it: RL250 at 60%, ``--time-limit 60 --deterministic``, needs 16.1 of
    the 15 counted seconds each had, and the one after started again from scratch: no plan)."""

    def __init__(self, problem: PlanningProblem, budget: int, max_states: int | None = None):
        p = problem
        n = p.n
        self.problem, self.budget = problem, budget
        self.max_states = DFS_BYTES // (n // 8 + 100) if max_states is None else max_states
        self._n = n
        self._size = [int(x) for x in p.size]
        self._scratch = [int(x) for x in p.scratch]
        self._redo = [bool(x) for x in p.recomputable]
        self._limit = budget - p.base_bytes
        self._anc = _ancestors(p.pred_lists)
        self._pred_mask, pinned, owed0, mem0 = _walk_start(p, self._size)
        self.ended: DepthFirst | None = DepthFirst(None, True, 0) if mem0 > self._limit else None
        self._seen = {pinned | (owed0 << n)}
        self._bytes_of: dict[int, int] = {0: 0}  # bytes of a set of buffers (the same sets come back often)
        # a frame per state on the path: (demand, owed, bytes demanded, its moves, the next to try)
        self._stack = [] if self.ended else [[pinned, owed0, mem0, self._moves(pinned, owed0), 0]]
        self._states = self._tried = 0

    def _moves(self, demand: int, owed: int) -> list[int]:
        """The nodes a walk may go back over from a state: first computes, then recomputes
        (of nodes that may be recomputed), each highest first (an owed output is in no one's
        inputs, so never in ``demand`` too)."""
        members = list(_bits(demand | owed))
        needed = _ancestors_of(members, self._anc)
        first = [t for t in reversed(members) if not (needed >> t) & 1]
        again = [t for t in reversed(members) if (needed >> t) & 1 and self._redo[t]]
        clock.charge(len(members) * MOVE_SECONDS)
        return first + again

    def _subsumed(self, key: int) -> bool:
        """Has a state one member short of ``key`` been visited?"""
        rest = key
        while rest:
            low = rest & -rest
            if (key ^ low) in self._seen:
                return True
            rest ^= low
        return False

    def run(self, deadline: float = math.inf) -> DepthFirst:
        """The walk until it ends or ``deadline`` passes (then :attr:`ended` stays None)."""
        if self.ended is not None:
            return self.ended
        n, size, stack, seen, bytes_of = self._n, self._size, self._stack, self._seen, self._bytes_of
        while stack:
            frame = stack[-1]
            demand, owed, mem, nodes, k = frame
            if k == len(nodes):
                stack.pop()  # a dead end: every move from here fits no budget or leads to a visited state
                continue
            # checked before the move is taken, so that a later run tries it
            if (self._tried + 1) & 4095 == 0 and clock.now() > deadline:
                return DepthFirst(None, False, self._states)
            frame[4] = k + 1
            self._tried += 1
            t = nodes[k]
            missing = self._pred_mask[t] & ~demand  # t's inputs not demanded yet
            grow = bytes_of.get(missing)
            if grow is None:
                if len(bytes_of) > BYTES_MEMO:
                    bytes_of.clear()
                grow = bytes_of[missing] = sum(size[u] for u in _bits(missing))
            own = not (demand >> t) & 1  # an owed output: its bytes come and go with this compute
            if mem + grow + (size[t] if own else 0) + self._scratch[t] > self._limit:
                continue
            d2 = (demand & ~(1 << t)) | self._pred_mask[t]
            o2 = owed & ~(1 << t)
            if not d2 and not o2:  # back at the start: t is the schedule's first compute
                self.ended = DepthFirst([t] + [f[3][f[4] - 1] for f in reversed(stack[:-1])], False, self._states)
                return self.ended
            key = d2 | (o2 << n)
            if key in seen or self._subsumed(key):
                continue
            self._states += 1
            if self._states > self.max_states:
                self.ended = DepthFirst(None, False, self._states)
                return self.ended
            seen.add(key)
            m2 = mem + grow - (0 if own else size[t])
            stack.append([d2, o2, m2, self._moves(d2, o2), 0])
        self.ended = DepthFirst(None, True, self._states)
        return self.ended


def plan_of(problem: PlanningProblem, order: Sequence[int], strategy: str = "reverse") -> Plan:
    """Events for computes in ``order``: each copy freed right after its last read (pinned
    outputs never); a companion computed right after its node's first compute
    (:meth:`PlanningProblem.glued`)."""
    order = problem.glued(order)
    preds = problem.pred_lists
    latest: dict[int, int] = {}  # node -> index of its latest compute so far
    last_read: dict[int, int] = {}  # compute index -> index of the last compute reading it
    for k, t in enumerate(order):
        for u in preds[t]:
            last_read[latest[u]] = k
        latest[t] = k
    free_after: dict[int, list[int]] = {}
    for k, t in enumerate(order):
        if problem.pinned[t] and latest[t] == k:
            continue
        free_after.setdefault(last_read.get(k, k), []).append(t)
    events: list[Event] = []
    for k, t in enumerate(order):
        events.append(Event("compute", t))
        events.extend(Event("free", u) for u in free_after.get(k, ()))
    return Plan(tuple(events), strategy)


def fitting(problem: PlanningProblem, plan: Plan, budget: int, what: str) -> Simulation | None:
    """``plan`` simulated, or None where it peaks over ``budget`` only because
    :meth:`PlanningProblem.glued` moved a companion to its node (any other breach is a bug: the
    walk's accounting is the simulator's)."""
    try:
        sim = simulate(problem, plan)
    except InvalidPlanError as e:
        raise AssertionError(f"{what}: {e}") from e
    if sim.peak_bytes <= budget:
        return sim
    if problem.companion is None:
        raise AssertionError(f"{what}: peaks at {sim.peak_bytes} bytes, over the budget {budget}")
    return None


def reverse_pebble(problem: PlanningProblem, budget: int, deadline: float = math.inf,
                   in_order: bool = True, first: bool = False,
                   depth_first: bool = True) -> tuple[Plan, Simulation] | None:
    """The cheapest plan within ``budget`` of the walks in :data:`WALKS` (first computes in node
    order, or in any order), simulated; in any order, where none of them gets through, the
    depth-first walk's plan (:func:`depth_first_walk`; not with ``depth_first`` False). None
    when none gets through before ``deadline`` (planner.clock.now() seconds). ``first``: the
    first plan found (whether any fits is all the caller asks)."""
    best: tuple[Plan, Simulation] | None = None
    for walk in (replace(w, in_order=in_order) for w in WALKS):
        if clock.now() > deadline or (best is not None and first):
            break
        if best is not None and walk.memory_first:
            continue  # a walk for room, not for time: only when the narrow one found nothing
        order = reverse_walk(problem, budget, walk, deadline)
        if order is None:
            continue
        plan = plan_of(problem, order)
        sim = fitting(problem, plan, budget, f"reverse walk {walk}")
        if sim is None:
            continue
        if best is None or sim.added_time < best[1].added_time:
            best = (plan, sim)
    if best is None and not in_order and depth_first:
        best = depth_first_plan(problem, budget, deadline).found  # every beam ended in a dead end
    return best


def depth_first_plan(problem: PlanningProblem, budget: int, deadline: float = math.inf,
                     search: DepthFirstSearch | None = None) -> DepthFirstPlan:
    """The plan of :func:`depth_first_walk` within ``budget``, simulated (None when the walk
    finds none before ``deadline``), and whether that walk went through every state; ``search``:
    a walk within ``budget`` an earlier call's deadline cut short, gone on with."""
    if search is None or search.problem is not problem or search.budget != budget:
        search = DepthFirstSearch(problem, budget)
    if clock.now() >= deadline:
        return DepthFirstPlan(None, False, search)
    walked = search.run(deadline)
    if walked.order is None:
        return DepthFirstPlan(None, walked.exhausted, search if search.ended is None else None)
    plan = plan_of(problem, walked.order)
    sim = fitting(problem, plan, budget, "depth-first walk")
    return DepthFirstPlan(None if sim is None else (plan, sim), False)


def _ancestors(preds) -> list[int]:
    """Each node's strict ancestors, as bit masks."""
    anc = [0] * len(preds)
    for v, inputs in enumerate(preds):
        for u in inputs:
            anc[v] |= anc[u] | (1 << u)
    return anc


def _walk_start(p: PlanningProblem, size: list[int]) -> tuple[list[int], int, int, int]:
    """Where a backward walk starts: each node's inputs as a bit mask; the pinned outputs (demanded
    from the end); the outputs owed (computed once and dropped at once: nodes nobody reads that
    are not pinned); the bytes the pinned outputs hold."""
    pred_mask = [sum(1 << u for u in p.pred_lists[v]) for v in range(p.n)]
    pinned = sum(1 << v for v in range(p.n) if p.pinned[v])
    owed = sum(1 << v for v in range(p.n) if not p.succ_lists[v] and not p.pinned[v])
    return pred_mask, pinned, owed, sum(size[v] for v in _bits(pinned))


def _moves(demand: int, owed: int, anc: list[int], size: list[int]) -> tuple[list[tuple[int, int]], int]:
    """The moves back from a walk's state: (node, the node's own bytes where it is an owed output
    and not demanded), for each node demanded and each output owed, lowest node first; and the
    strict ancestors of the whole state. A node is never its own ancestor, so a move over a node
    among them is a recompute: another node of the state needs it earlier."""
    moves = [(t, 0) for t in _bits(demand)] + [(s, size[s]) for s in _bits(owed)]
    return moves, _ancestors_of(_bits(demand | owed), anc)


def _ancestors_of(nodes, anc: list[int]) -> int:
    """The strict ancestors of ``nodes`` as a bit mask, from each node's (``anc``)."""
    out = 0
    for v in nodes:
        out |= anc[v]
    return out


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
