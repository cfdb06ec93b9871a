"""Exact searches over every recompute plan of a small problem (in its node order): the least
peak, with a plan that reaches it (:func:`least_plan`), and the cheapest plan within a budget
(:func:`cheapest_plan`).

The CP-SAT model's proofs hold over its own plans only: each node computed at most a few times
(``PlannerOptions.max_computations``), recomputes in the slots the model lays out. A plan that
recomputes a buffer before each of many far-apart readers is outside it, so the model's least
peak (or its bound) is no bound on what every plan reaches. The sound bound for any problem is
:attr:`PlanningProblem.memory_floor`; on a small problem :func:`least_plan` finds the exact least
by search over every plan.

Search: a plan runs the originals in order and may, between them, free any buffer and compute
again any recomputable node whose inputs are resident. A node's ``parts`` (buffers that die apart)
are buffers of their own there: each may be dropped while the node stays resident, and no later
compute reads it from that copy, as simulate() releases a part after its last reader. A state is (next original, resident set);
its cost is the highest memory on the way there, and the least cost of reaching "every original
run, only graph outputs resident" is the least peak (a bottleneck shortest path: Dijkstra on the
running maximum; a state is ordered by the most any step still to run needs, A*-like). The cheapest
plan is the shortest path on the recomputes' costs through states within the budget. Buffers no
later step can need are freed at once. The resident set only holds nodes (and parts) computed already, so
there are at most about 2^(n+1) states (more with parts); the search gives up past ``max_states``.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import replace

import numpy as np

from planner import clock
from planner.plan import Event, Plan
from planner.problem import PlanningProblem

#: Problems up to this many nodes get the exact search; it stops after MAX_STATES states (about
#: 2.5 s of Python). Random 20-node graphs took up to 0.6 s, 24-node ones up to 1.8 s; from 26
#: nodes on most passed the cap.
MAX_NODES = 20
MAX_STATES = 200_000
#: What settling one state charges the work clock (planner/clock.py), in deterministic seconds:
#: about its wall time (MAX_STATES in about 2.5 s), so that a deadline means the same on either clock.
STATE_SECONDS = 1.25e-5


def least_plan(problem: PlanningProblem, max_nodes: int = MAX_NODES,
               max_states: int = MAX_STATES) -> tuple[int, Plan] | None:
    """(least peak over every recompute-only plan, a plan reaching it), or None when the problem
    has more than ``max_nodes`` nodes, can swap (swap-ins restore buffers without their inputs:
    not searched here), or the search passes ``max_states`` states."""
    found = _search(problem, None, max_nodes, max_states)
    return None if found is None else (int(found[0]), found[1])


def cheapest_plan(problem: PlanningProblem, budget: int, max_nodes: int = MAX_NODES,
                  max_states: int = MAX_STATES) -> tuple[float, Plan] | None:
    """(least added time over every recompute-only plan within ``budget``, such a plan); None
    when no plan fits or the search gives up as :func:`least_plan` does. The same search, on the
    sum of the recomputes' costs, with every state over the budget left out."""
    return _search(problem, budget, max_nodes, max_states)


#: States the search with a node's ``parts`` apart gets before it counts each output as one buffer
#: instead: their bits multiply its states and moves (16-node problems with parts passed MAX_STATES
#: in 4-4.5 s each, four searches a solve: 7-10 s of a 1 s limit, where the one-buffer search took
#: 0.03-0.08 s); bench/claims_fuzz.py's 4-8 node problems need at most 2528 (seeds 0-299). The
#: one-buffer count holds more than simulate() does, so its plans still fit.
PARTS_STATES = 5_000
#: :func:`_search_once` passed its cap, or the problem is not one it searches.
_GAVE_UP = object()


def _search(p: PlanningProblem, budget: int | None, max_nodes: int,
            max_states: int) -> tuple[float, Plan] | None:
    """Least peak (``budget`` None) or least added time within ``budget`` (module docstring):
    with parts apart where that search stays within :data:`PARTS_STATES`, else with each output
    one buffer."""
    if p.parts is not None:
        found = _search_once(p, budget, max_nodes, min(max_states, PARTS_STATES))
        if found is not _GAVE_UP:
            return found
        p = replace(p, parts=None)
    found = _search_once(p, budget, max_nodes, max_states)
    return None if found is _GAVE_UP else found


def _search_once(p: PlanningProblem, budget: int | None, max_nodes: int, max_states: int):
    """:func:`_search` in ``p``'s own accounting: the result, None where no plan fits, or
    :data:`_GAVE_UP`."""
    n = p.n
    if n > max_nodes or p.can_swap:
        return _GAVE_UP
    nbytes, reads, own, readers = _buffers(p)
    over = _takeovers(p)
    credit = [nbytes[u] if u >= 0 else 0 for u in over]
    need = [int(p.size[v]) + int(p.scratch[v]) for v in range(n)]
    redo = [float(x) for x in p.cost]
    again = [bool(p.recomputable[v]) for v in range(n)]
    pinned = [bool(x) for x in p.pinned]
    done_mask = sum(1 << v for v in range(n) if pinned[v])
    base = p.base_bytes
    # dead[t]: buffers no step from t on can need (no descendant at t or later): freed at once,
    # since holding them only costs memory; the search then never branches on freeing them. A
    # part is dead once its readers are (one nobody reads: once made)
    last = list(range(n))  # the last node that depends on v (v itself if none does)
    for v in range(n - 1, -1, -1):
        for w in p.succ_lists[v]:
            last[v] = max(last[v], last[int(w)])
    dead = [sum(1 << v | own[v] for v in range(n) if last[v] < t and not pinned[v])
            | sum(1 << b for b, rs in readers.items() if all(last[r] < t for r in rs)) for t in range(n + 1)]
    # every step from t on still runs: no completion peaks below tail[t] (the least-peak search
    # orders states by it, A*-like, the later step first among equals); a step holds its output,
    # scratch, the parts of its inputs it reads and every pinned output made before it
    made = 0
    low = []
    for v in range(n):
        held = reads[v] | made
        low.append(base + need[v] + _bytes_in(nbytes, held) - credit[v])
        made |= (1 << v) if pinned[v] else 0
    tail = [int(x) for x in np.maximum.accumulate(np.asarray(low, dtype=np.int64)[::-1])[::-1]] + [base]
    if budget is not None and tail[0] > budget:
        return None

    def key(cost: float, t: int) -> float:
        return max(cost, tail[t]) if budget is None else cost

    first = base if budget is None else 0.0
    best: dict[tuple[int, int], float] = {(0, 0): first}
    parent: dict[tuple[int, int], tuple[tuple[int, int], tuple[Event, ...]]] = {}
    heap = [(key(first, 0), 0, first, 0, 0)]
    for cost, (t, mask) in _settled(heap, best):
        if t == n and mask == done_mask:
            return cost, Plan(_events(parent, (t, mask)), "exact")
        held = _bytes_in(nbytes, mask)
        # a part dropped while its node stays resident (simulate() releases it after its last
        # reader): no event, and no later compute may read it from this copy
        moves = [((t, mask & ~(1 << b)), cost, ()) for b in readers if mask >> b & 1]
        for v in range(min(t + 1, n)):
            if mask >> v & 1:
                if pinned[v]:
                    continue
                moves.append(((t, mask & ~(1 << v | own[v])), cost, (Event("free", v),)))
            elif (v == t or again[v]) and reads[v] & mask == reads[v]:
                t2 = t + 1 if v == t else t
                new = cost if budget is None else cost + (0.0 if v == t else redo[v])
                # computed with its input's buffer kept, or written into it (``over``)
                for into in (-1, over[v]) if over[v] >= 0 else (-1,):
                    at = base + held + need[v] - (credit[v] if into >= 0 else 0)
                    if budget is not None and (at > budget or tail[t2] > budget):
                        continue
                    after = (mask | 1 << v | own[v]) & ~(1 << into if into >= 0 else 0)
                    gone = after & dead[t2]
                    moves.append(((t2, after & ~gone), max(new, at) if budget is None else new,
                                  (Event("compute", v), *((Event("free", into),) if into >= 0 else ()),
                                   *(Event("free", u) for u in range(n) if gone >> u & 1))))
        for nxt, new, ev in moves:
            if not _reach(best, parent, heap, nxt, new, ((t, mask), ev), (key(new, nxt[0]), -nxt[0]), max_states):
                return _GAVE_UP
    return None  # nothing within the budget (without one, running everything once is a plan)


def _buffers(p: PlanningProblem) -> tuple[list[int], list[int], list[int], dict[int, tuple[int, ...]]]:
    """The buffers :func:`_search` holds, as bits of its resident masks: bit v for node v's
    output, and for a node with ``parts`` one more bit per part, which then carries the bytes (the
    node's own bit none), so that parts die apart as simulate() counts them (bench/claims_fuzz.py:
    81 of 116 budgets without a plan fitted only so). (bytes per bit, per node the bits its
    compute reads, per node the bits of its parts, per part bit its readers)."""
    n = p.n
    nbytes = [0 if p.parts is not None and p.parts[v] else int(p.size[v]) for v in range(n)]
    reads = [sum(1 << int(u) for u in p.pred_lists[v]) for v in range(n)]
    own = [0] * n
    readers: dict[int, tuple[int, ...]] = {}
    for u, node_parts in enumerate(p.parts or ()):
        for b, rs in node_parts:
            bit = len(nbytes)
            nbytes.append(int(b))
            own[u] |= 1 << bit
            readers[bit] = rs
            for r in rs:
                reads[r] |= 1 << bit
    return nbytes, reads, own, readers


def _takeovers(p: PlanningProblem) -> list[int]:
    """Per node v, the input u whose buffer v writes into (``takes_over``), or -1: u is freed with
    v's compute, so its bytes are not counted while v runs, as simulate() counts them (where u is
    not pinned; a node taking over has no parts, nor does its input)."""
    if p.takes_over is None:
        return [-1] * p.n
    return [int(u) if u >= 0 and not p.pinned[u] else -1 for u in p.takes_over]


def _bytes_in(nbytes: list[int], mask: int) -> int:
    """The bytes of the buffers whose bits ``mask`` sets (:func:`_buffers`)."""
    return sum(nbytes[b] for b in range(len(nbytes)) if mask >> b & 1)


def least_plan_any_order(problem: PlanningProblem, max_nodes: int = MAX_NODES,
                         max_states: int = MAX_STATES, deadline: float = math.inf,
                         runtime: bool = False) -> tuple[int, Plan] | None:
    """:func:`least_plan` over plans in every node order: (least peak, a plan reaching it), its
    nodes first computed in whatever order that plan takes; None where :func:`least_plan` gives
    up. A state is (nodes computed so far, resident set): any node whose inputs are resident may
    run next, a first time or again; a buffer is freed at once when every node that depends on it
    has run. States are ordered by the most any node still to run needs in every order
    (``PlanningProblem.order_free_need``), A*-like; None also past ``deadline`` (planner.clock).
    On far_readers(6) of the tests (20 nodes): 106 k states, about 1 s.

    ``runtime``: count each step as ONNX Runtime may hold it, at most what the problem counts
    (:attr:`PlanningProblem.runtime_need`, per resident set): an output written into the buffer of
    an input (``shared_bytes``), the base bytes made late left out, a resident buffer with the
    bytes its readers read (``read_bytes``), a pinned one with those that stay (``kept_bytes``).
    The least is then a bound on the peak of every plan the runtime runs, also where the problem
    is not :attr:`~PlanningProblem.runtime_exact`; its plan may peak higher in the problem's own
    accounting (simulate() it)."""
    p = problem
    n = p.n
    if n > max_nodes or p.can_swap:
        return None
    # bytes of a resident buffer, and of a step beyond those resident (output, scratch)
    # in the problem's accounting, parts die apart and a taken-over input freed with its taker's
    # compute is not counted while it runs, as in :func:`_search`
    over = [-1] * n
    if runtime:
        read = p.size if p.read_bytes is None else p.read_bytes
        nbytes = [int(p._pinned_kept[v]) if p.pinned[v] else int(read[v]) for v in range(n)]
        reads, own, readers = [sum(1 << int(u) for u in p.pred_lists[v]) for v in range(n)], [0] * n, {}
        need = [int(p.size[v]) + int(p.scratch[v]) - int(p.shared_bytes[v]) for v in range(n)]
        base = p.base_bytes - p.late_base_bytes
    else:
        nbytes, reads, own, readers = _buffers(p)
        need = [int(p.size[v]) + int(p.scratch[v]) for v in range(n)]
        base = p.base_bytes
        over = _takeovers(p)
    again = [bool(p.recomputable[v]) for v in range(n)]
    pinned = sum(1 << v for v in range(n) if p.pinned[v])
    everything = (1 << n) - 1
    later = [0] * n  # the nodes that depend on v
    for v in range(n - 1, -1, -1):
        for w in p.succ_lists[v]:
            later[v] |= later[int(w)] | 1 << int(w)
    lower = [int(x) for x in p.order_free_need]
    # a companion (PlanningProblem.companion: bytes the runtime makes with its node and holds to
    # the end) runs right after its node's first compute, as the runtime makes them, never apart
    companion = [bool(x) for x in p.companion] if p.companion is not None else [False] * n
    glued = p.companion_of

    def still(done: int) -> int:
        """The most a node still to run needs, in every order."""
        return max((lower[v] for v in range(n) if not done >> v & 1), default=base)

    best: dict[tuple[int, int], int] = {(0, 0): base}
    parent: dict[tuple[int, int], tuple[tuple[int, int], tuple[Event, ...]]] = {}
    heap = [(max(base, still(0)), 0, base, 0, 0)]
    for settled, (peak, (done, mask)) in enumerate(_settled(heap, best)):
        if done == everything and mask == pinned:
            return peak, Plan(_events(parent, (done, mask)), "exact")
        if settled % 1024 == 0:
            clock.charge(1024 * STATE_SECONDS)
            if clock.now() > deadline:
                return None
        held = _bytes_in(nbytes, mask)
        # a part dropped while its node stays resident (as in _search): no event
        moves = [((done, mask & ~(1 << b)), peak, ()) for b in readers if mask >> b & 1]
        for v in range(n):
            if mask >> v & 1:
                if pinned >> v & 1:
                    continue
                moves.append(((done, mask & ~(1 << v | own[v])), peak, (Event("free", v),)))
            elif companion[v]:
                continue  # made with its node's first compute below
            elif (not done >> v & 1 or again[v]) and reads[v] & mask == reads[v]:
                ran = done | 1 << v
                after = mask | 1 << v | own[v]
                top = base + held + need[v]
                computes = [v]
                if glued[v] >= 0 and not done >> glued[v] & 1:  # v's first compute: its companion now
                    c = glued[v]
                    top = max(top, base + held + _bytes_in(nbytes, 1 << v | own[v]) + need[c])
                    ran, after = ran | 1 << c, after | 1 << c | own[c]
                    computes.append(c)
                gone = sum(1 << u | own[u] for u in range(n) if after >> u & 1 and not pinned >> u & 1
                           and later[u] & ~ran == 0) | sum(1 << b for b, rs in readers.items() if all(
                               (later[r] | 1 << r) & ~ran == 0 for r in rs))
                # computed with its input's buffer kept, or written into it (``over``)
                for into in (-1, over[v]) if over[v] >= 0 and len(computes) == 1 else (-1,):
                    kept = after & ~(1 << into if into >= 0 else 0)
                    at = top - (_bytes_in(nbytes, 1 << into) if into >= 0 else 0)
                    moves.append(((ran, kept & ~gone), max(peak, at),
                                  (*(Event("compute", u) for u in computes),
                                   *((Event("free", into),) if into >= 0 else ()),
                                   *(Event("free", u) for u in range(n) if (gone & kept) >> u & 1))))
        for nxt, new, ev in moves:
            order = (max(new, still(nxt[0])), -bin(nxt[0]).count("1"))
            if not _reach(best, parent, heap, nxt, new, ((done, mask), ev), order, max_states):
                return None
    return None


def _settled(heap: list, best: dict):
    """The queued states in ``heap`` order, each with its value, less those reached cheaper since
    they were queued (the loop using it may queue more)."""
    while heap:
        *_, value, a, b = heapq.heappop(heap)
        if value <= best[(a, b)]:
            yield value, (a, b)


def _reach(best: dict, parent: dict, heap: list, state: tuple[int, int], value: float,
           step: tuple[tuple[int, int], tuple[Event, ...]], order: tuple, max_states: int) -> bool:
    """Record ``state`` reached at ``value`` by ``step`` (previous state, its events) and queue it
    by ``order``, where no cheaper way there is known; False once past ``max_states`` states."""
    if value >= best.get(state, value + 1):
        return True
    if state not in best and len(best) >= max_states:
        return False
    best[state] = value
    parent[state] = step
    heapq.heappush(heap, (*order, value, *state))
    return True


def _events(parent: dict, state: tuple[int, int]) -> tuple[Event, ...]:
    out: list[Event] = []
    while state in parent:
        state, events = parent[state]
        out.extend(reversed(events))
    return tuple(reversed(out))
