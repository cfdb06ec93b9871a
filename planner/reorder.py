"""Memory-aware node orders: run the same graph in another topological order that needs less memory.

Checkmate and Moccasin plan in the order the graph comes in; so do planner/cpsat.py and the
greedies. But a plan is any event list whose computes find their inputs resident
(planner/simulate.py), and an emitted ONNX model runs its nodes in the schedule's order
(passes/rewrite.py), so the order is ours to choose too.

:func:`memory_order` starts from the given order and from a list schedule per rule of
:data:`RULES` (ties by position, so deterministic), improves each with :func:`improve` (a local
search) and returns the lowest, or None when its peak does not beat the given order's by
``min_gain``. Measured unplanned peaks, over the given order's: RL100 0.794, RL250 0.748, RL500
0.925, RL1000 0.925 (0.01-0.2 s); zoo:resnet 0.914, zoo:unet 0.947; the Checkmate graphs, zoo:gpt,
cnn and mlp 1.0 (no better order found).

With a budget the search minimises the bytes over it (summed over positions) before the peak:
the lowest peak is not the easiest order to plan at a tight budget. RL250 at 70%: bytes over the
budget 75 k against 96 k for the lowest-peak order (1496 k given), and the plan +2.08% against
+2.74% (60 s); RL100 at 60% in that order alone: +27.9% in 30 s, +49.3% in 60 s in the lowest-peak
order (the given order's +23.7% still wins there). :func:`permute` builds the problem in that
order; a plan for it maps back with :func:`plan_in_original`.

Where no order is lower, :func:`sinks_late` gives the given order with its weight gradients made
late: the same unplanned peak, but what it holds then is recomputable (zoo:gpt at 70%: +187% ->
+16.7%). Below the given order's floor (the most a step needs, pinned outputs made before it
included), :func:`repaired_order` moves the few weight gradients that put steps over the budget
past them, the rest of the order as given.
"""
from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

from planner.plan import Event, Plan
from planner.problem import PlanningProblem

#: Scores of a ready node (lower runs first), from its output bytes, the bytes its run releases
#: (inputs it reads last), and its inputs' bytes spread over their pending reads.
Rule = Callable[[int, int, float], tuple]
RULES: dict[str, Rule] = {
    # release the most bytes now, then the smallest output
    "release": lambda out, freed, share: (-freed, out),
    # least net growth: output minus what it releases
    "net": lambda out, freed, share: (out - freed,),
    # release first (any amount), otherwise keep the given order
    "release-first": lambda out, freed, share: (0 if freed > 0 else 1, -freed),
    # advance the reads of resident buffers the most per byte added (releases come in steps)
    "progress": lambda out, freed, share: (out - share,),
}


def list_order(problem: PlanningProblem, rule: Rule) -> list[int]:
    """A topological order of ``problem``: repeatedly run the ready node ``rule`` scores lowest
    (ties: lowest position). Pinned outputs are never released."""
    p = problem
    size = [int(x) for x in p.size]
    pinned = [bool(x) for x in p.pinned]
    waiting = [len(ps) for ps in p.pred_lists]  # inputs not computed yet
    reads_left = [len(s) for s in p.succ_lists]
    ready = {v for v in range(p.n) if waiting[v] == 0}
    order: list[int] = []
    while ready:
        best_key, best = None, -1
        for v in ready:
            freed = share = 0.0
            for u in p.pred_lists[v]:
                if not pinned[u]:
                    share += size[u] / reads_left[u]
                    if reads_left[u] == 1:
                        freed += size[u]
            key = (*rule(size[v], int(freed), share), v)
            if best_key is None or key < best_key:
                best_key, best = key, v
        ready.remove(best)
        order.append(best)
        for u in p.pred_lists[best]:
            reads_left[u] -= 1
        for w in p.succ_lists[best]:
            waiting[w] -= 1
            if waiting[w] == 0:
                ready.add(w)
    return order


def permute(problem: PlanningProblem, order: list[int] | tuple[int, ...]) -> PlanningProblem:
    """``problem`` with its nodes in ``order`` (a topological order of it): node k of the result
    is node ``order[k]``; names and ids travel with the nodes."""
    p = problem
    idx = np.asarray(order, dtype=np.int64)
    if sorted(idx.tolist()) != list(range(p.n)):
        raise ValueError("order must list every node exactly once")
    pos = np.empty(p.n, dtype=np.int64)
    pos[idx] = np.arange(p.n)
    preds = [[int(pos[u]) for u in p.pred_lists[v]] for v in idx.tolist()]
    return PlanningProblem.build(
        size=p.size[idx], cost=p.cost[idx], preds=preds, name=p.name,
        names=[p.names[v] for v in idx], node_ids=[p.node_ids[v] for v in idx],
        base_bytes=p.base_bytes, scratch=p.scratch[idx], pinned=p.pinned[idx],
        recomputable=p.recomputable[idx], swappable=p.swappable[idx] if p.transfer is not None else None,
        transfer=None if p.transfer is None else p.transfer[idx], copy_overlap=p.copy_overlap,
        time_unit=p.time_unit, backward=None if p.backward is None else p.backward[idx],
        in_place=None if p.in_place is None else p.in_place[idx], late_base_bytes=p.late_base_bytes,
        kept_bytes=None if p.kept_bytes is None else p.kept_bytes[idx],
        read_bytes=None if p.read_bytes is None else p.read_bytes[idx],
        two_step=None if p.two_step is None else p.two_step[idx],
        companion=None if p.companion is None else _companions(p.companion, idx),
        takes_over=None if p.takes_over is None else
        np.where(p.takes_over[idx] >= 0, pos[np.maximum(p.takes_over[idx], 0)], -1),
        parts=None if p.parts is None else
        [[(b, [int(pos[r]) for r in rs]) for b, rs in p.parts[v]] for v in idx.tolist()],
    )


def _companions(companion: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``companion`` in the order ``idx``: still one where a companion still follows its node."""
    moved = companion[idx].copy()
    moved[0] = False
    moved[1:] &= idx[1:] == idx[:-1] + 1
    return moved


def plan_in_original(plan: Plan, order: list[int] | tuple[int, ...]) -> Plan:
    """A plan for ``permute(problem, order)`` as the same events over ``problem``."""
    return Plan(tuple(Event(e.op, int(order[e.node])) for e in plan.events), plan.strategy)


def plan_in_order(plan: Plan, order: list[int] | tuple[int, ...]) -> Plan:
    """A plan for ``problem`` as the same events over ``permute(problem, order)`` (the inverse of
    :func:`plan_in_original`)."""
    pos = np.empty(len(order), dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    return plan_in_original(plan, pos.tolist())


def first_compute_order(plan: Plan) -> list[int]:
    """The nodes in the order ``plan`` computes each for the first time (the order a plan found
    outside the solver's own orders plans in)."""
    return list(dict.fromkeys(e.node for e in plan.events if e.op == "compute"))


def last_compute_order(problem: PlanningProblem, plan: Plan) -> list[int]:
    """The nodes of ``problem`` in a topological order that follows the order ``plan`` computes
    each for the last time (of the nodes whose inputs come before, the one completed first), so
    that a node completed early comes early: the order a bottleneck's inputs are completed in is
    what a tight plan's recomputes hang on (planning._rewalked). Nodes ``plan`` never computes
    come last, by number."""
    last = {e.node: k for k, e in enumerate(plan.events) if e.op == "compute"}
    key = [last.get(v, len(plan.events) + v) for v in range(problem.n)]
    waiting = [len(ps) for ps in problem.pred_lists]
    ready = [(key[v], v) for v in range(problem.n) if waiting[v] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, v = heapq.heappop(ready)
        order.append(v)
        for w in problem.succ_lists[v]:
            waiting[w] -= 1
            if waiting[w] == 0:
                heapq.heappush(ready, (key[w], w))
    return order


class _Profile:
    """Unplanned memory per position of any order of one problem (numpy, O(n + E) per order):
    ``PlanningProblem.one_buffer_memory`` of ``permute(problem, order)``, without building it."""

    def __init__(self, problem: PlanningProblem, budget: int | None = None):
        p = problem
        self.p = p
        self.budget = budget
        counts = np.asarray([len(s) for s in p.succ_lists], dtype=np.int64)
        self.read = np.flatnonzero(counts)  # nodes with readers; their readers sit in segments of dst
        self.seg = (np.cumsum(counts) - counts)[self.read]
        self.dst = np.asarray([w for s in p.succ_lists for w in s], dtype=np.int64)
        self.size = p.size.astype(np.int64)
        self.top = max(1, p.n // 20)
        self.over = None if p.takes_over is None else np.flatnonzero(p.takes_over >= 0)  # PlanningProblem.takes_over

    def __call__(self, order: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(memory at each position, position of each node, position of its last read)."""
        pos = np.empty(self.p.n, dtype=np.int64)
        pos[np.asarray(order, dtype=np.int64)] = np.arange(self.p.n)
        return self.at(pos)

    def at(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`__call__` of the order that puts node v at position ``pos[v]``."""
        n = self.p.n
        last = pos.copy()
        if len(self.dst):  # readers come after their inputs in any topological order
            last[self.read] = np.maximum.reduceat(pos[self.dst], self.seg)
        last[self.p.pinned] = n - 1
        delta = np.zeros(n + 1, dtype=np.int64)
        delta[pos] = self.size  # pos is a permutation: one node per position
        delta -= np.bincount(last + 1, weights=self.size, minlength=n + 1).astype(np.int64)
        mem = np.cumsum(delta[:n])
        mem[pos] += self.p.scratch
        if self.over is not None:  # a node taking over an input that dies at it holds one buffer
            u = self.p.takes_over[self.over]
            dies = (last[u] == pos[self.over]) & ~self.p.pinned[u]
            mem[pos[self.over[dies]]] -= self.size[u[dies]]
        return mem + self.p.base_bytes, pos, last

    def key(self, mem: np.ndarray) -> tuple[int, int, int]:
        """With a budget, the bytes over it summed over positions first (what a plan must
        remove); then the peak, then the sum of the top 5% of positions (moves that lower the
        crowd around the peak open the way for the next one)."""
        over = 0 if self.budget is None else int(np.maximum(mem - self.budget, 0).sum())
        return over, int(mem.max()), int(np.partition(mem, len(mem) - self.top)[-self.top:].sum())


def improve(problem: PlanningProblem, order: list[int], max_moves: int = 200, budget: int | None = None) -> list[int]:
    """Local search on the unplanned peak: at the peak position, try moving a node that is
    resident there later (just before its first reader, when that comes after the peak; to the
    end when nothing reads it, as a graph output held to the end) and the
    last reader of a resident buffer earlier (just after its latest input, when that comes before
    the peak); take the best move that lowers (bytes over ``budget``, peak, crowd), up to
    ``max_moves`` times. Both moves keep the order topological."""
    return _improve(_Profile(problem, budget), order, max_moves)[0]


def _improve(prof: _Profile, order: list[int], max_moves: int = 200,
             max_evals: float = float("inf")) -> tuple[list[int], int]:
    """(:func:`improve` with the problem and budget of ``prof``, built once per problem; the orders
    it evaluated). No move is looked for once ``max_evals`` orders have been evaluated (a count:
    the same on any machine)."""
    p = prof.p
    mem, pos, last = prof(order)
    best = prof.key(mem)
    evals = 1
    for _ in range(max_moves):
        if evals >= max_evals:
            break
        t = int(mem.argmax())
        moves: list[tuple[int, int, bool]] = []  # (node, anchor, before the anchor?)
        for v in np.flatnonzero((pos <= t) & (last >= t)).tolist():
            reads = p.succ_lists[v]
            if not reads:  # a graph output nobody reads: it can come last
                if pos[v] < p.n - 1:
                    moves.append((v, int(pos.argmax()), False))  # after the node that runs last
                continue
            first = min(reads, key=lambda w: pos[w])
            if pos[first] > t:
                moves.append((v, first, True))
            final = max(reads, key=lambda w: pos[w])
            if pos[final] > t:
                anchor = max(p.pred_lists[final], key=lambda u: pos[u])
                if pos[anchor] < t:
                    moves.append((final, anchor, False))
        found = None
        for v, anchor, before in sorted(set(moves)):
            moved = _moved(pos, v, anchor, before)
            key = prof.key(prof.at(moved)[0])
            evals += 1
            if key < best and (found is None or key < found[0]):
                found = (key, moved)
        if found is None:
            break
        best, pos = found
        mem, pos, last = prof.at(pos)
    return np.argsort(pos).tolist(), evals


def sinks_late(problem: PlanningProblem) -> list[int] | None:
    """The given order with each pinned node that no node reads (a weight gradient) moved to just
    before the last read of its inputs, where the inputs that die before that read (the ones the
    move keeps alive longer) weigh no more than its output: the unplanned memory is then no
    higher at any step, and a plan may recompute those inputs where the given order held the
    pinned output, which no plan frees. None when no node moves. Nodes glued to others
    (``companion``, ``takes_over``, ``kept_bytes``) stay. zoo:gpt at 70% (--time-limit 10): no
    plan found in the given order (CP-SAT's lowest peaks at 261492 bytes in 5 s, 256116 in 60 s,
    over the 255608 target), +16.7% in this order, where the fallback walk's plan cost +187%:
    the MLP's weight gradient, made before the GELU backward, held 16 KiB through it."""
    p = problem
    size = [int(x) for x in p.size]
    readers = [list(s) for s in p.succ_lists]
    glued = _glued(p)
    slot = list(range(p.n))  # where each node goes: before the node at that position
    moved = False
    for v in range(p.n):
        if not p.pinned[v] or readers[v] or glued[v]:
            continue
        last = {u: max((x for x in readers[u] if x != v), default=-1) for u in p.pred_lists[v]}
        t = max(last.values(), default=-1)
        if t <= v:
            continue
        held = sum(size[u] for u, at in last.items() if at < t and not p.pinned[u])
        if held <= size[v]:
            slot[v], moved = t, True
    if not moved:
        return None
    return sorted(range(p.n), key=lambda v: (slot[v], slot[v] == v, v))


def _glued(problem: PlanningProblem) -> np.ndarray:
    """bool [n]: the nodes glued to others (``companion``, ``takes_over``, ``kept_bytes``), which
    :func:`sinks_late` and :func:`repaired_order` leave where they are."""
    p = problem
    glued = np.zeros(p.n, dtype=bool)
    if p.companion is not None:
        glued |= p.companion | np.append(p.companion[1:], False)
    if p.takes_over is not None:
        glued |= p.takes_over >= 0
    if p.kept_bytes is not None:
        glued |= p.kept_bytes < p.size
    return glued


def repaired_order(problem: PlanningProblem, budget: int) -> list[int] | None:
    """The given order with a few pinned nodes that no node reads (weight gradients) moved later,
    past the last step whose need (:attr:`PlanningProblem.runtime_need`, in the order so far) is
    over ``budget``, until no step's is; None where no step's is over, or no such moves bring
    them all within it. Each move takes the smallest node that alone brings every step after it
    within the budget, else the largest (the fewer bytes moved, the fewer inputs held or
    recomputed longer), and puts it where the order's unplanned memory (:class:`_Profile`, with
    ``budget``) is least, up to the last reads of its inputs: right after that step, its own step
    may hold a buffer a later step reads (tests/test_reorder.py's weight_gradient_first at 20
    bytes: no plan fits with w right after e2, which dx reads; with w after dx, one peaks at 19).
    A step's need holds every pinned output made before it, so below the given order's floor no
    plan fits it, where this order, the rest of it as given, may hold one. zoo:cnn at 64-68%: the
    head's weight gradient (40 KiB, made before the backward of both blocks) moved after them,
    the floor 535428 -> 494468 bytes."""
    p = problem
    need = p.runtime_need
    order = list(range(p.n))
    size = np.where(p.pinned, p.size if p.kept_bytes is None else p.kept_bytes, 0)
    movable = [v for v in np.flatnonzero(p.pinned & ~_glued(p)).tolist() if not p.succ_lists[v]]
    prof = _Profile(p, budget)
    while (need > budget).any() and movable:
        pos = np.empty(p.n, dtype=np.int64)
        pos[order] = np.arange(p.n)
        over = np.flatnonzero(need > budget)
        last = int(pos[over].max())
        ahead = [v for v in movable if pos[v] < last]
        if not ahead:
            break
        fixing = [v for v in ahead if (need[over[pos[over] > pos[v]]] - size[v] <= budget).all()
                  and (pos[over] > pos[v]).all()]
        v = min(fixing, key=lambda v: (size[v], v)) if fixing else max(ahead, key=lambda v: (size[v], -v))
        movable.remove(v)
        order.remove(v)  # v was ahead of the step at ``last``: that step is now at last - 1
        at = {w: k for k, w in enumerate(order)}
        # past the last reads of v's inputs a later place only holds them longer
        end = max([last] + [at[w] + 1 for u in p.pred_lists[v] for w in p.succ_lists[u] if w != v])
        order = min((order[:k] + [v] + order[k:] for k in range(last, end + 1)), key=lambda o: prof.key(prof(o)[0]))
        need = p.runtime_need_in(order)
    return order if order != list(range(p.n)) and not (need > budget).any() else None


def _glued_order(problem: PlanningProblem, min_gain: float, budget: int | None,
                 max_work: float) -> tuple[list[int], str] | None:
    """:func:`memory_order` with each companion node (``PlanningProblem.companion``) glued to the
    node before it: ordered without them, that node pinned (it holds graph outputs, or outputs
    nobody reads: held to the end either way, here with all its bytes), each companion then put
    right after its node. Apart, the moves that put a graph output last would
    move only the companion, whose node must stay resident until it (zoo:cnn: no order 5% lower
    found, where glued the order is 7.4% lower)."""
    p = problem
    keep = np.flatnonzero(~p.companion)
    new_of = np.full(p.n, -1, dtype=np.int64)
    new_of[keep] = np.arange(len(keep))
    pinned = p.pinned[keep] | p.companion[np.minimum(keep + 1, p.n - 1)] & (keep + 1 < p.n)
    merged = PlanningProblem.build(
        size=p.size[keep], cost=p.cost[keep], preds=[[int(new_of[u]) for u in p.pred_lists[v]] for v in keep],
        name=p.name, base_bytes=p.base_bytes, scratch=p.scratch[keep], pinned=pinned,
        recomputable=p.recomputable[keep])
    found = memory_order(merged, min_gain, budget, max_work)
    if found is None:
        return None
    return p.glued(keep[found[0]].tolist()), found[1]


def _moved(pos: np.ndarray, v: int, anchor: int, before: bool) -> np.ndarray:
    """Positions after taking v out of its place and putting it back just before (or after)
    ``anchor``; the nodes in between shift by one."""
    a, c = int(pos[v]), int(pos[anchor])
    b = (c if c < a else c - 1) + (0 if before else 1)
    out = pos.copy()
    if b < a:
        out[(pos >= b) & (pos < a)] += 1
    elif b > a:
        out[(pos > a) & (pos <= b)] -= 1
    out[v] = b
    return out


#: :func:`least_peak_order` runs on problems up to this many nodes and gives up past
#: EXACT_MAX_STATES sets of computed nodes (about 0.2 s of Python).
EXACT_MAX_NODES = 18
EXACT_MAX_STATES = 20_000


def least_peak_order(problem: PlanningProblem, max_nodes: int = EXACT_MAX_NODES,
                     max_states: int = EXACT_MAX_STATES) -> list[int] | None:
    """The topological order of least unplanned peak (as :class:`_Profile` counts memory), by
    search over the sets of nodes computed so far (each a state; its value the least peak of any
    order reaching it); None past ``max_nodes`` or ``max_states``. The local search may miss that
    order (tests/test_reorder.py: a 10-node graph peaking at 141 B, where the starts and moves
    reached no order within 122 B and one peaks there, so the plan at 122 B recomputed, +1).
    Ties: the lexicographically first order."""
    p = problem
    n = p.n
    if n > max_nodes:
        return None
    size = [int(x) for x in p.size]
    scratch = [int(x) for x in p.scratch]
    held = [bool(p.pinned[v]) or bool(p.succ_lists[v]) for v in range(n)]  # stays after its run
    pred_mask = [sum(1 << u for u in p.pred_lists[v]) for v in range(n)]
    succ_mask = [sum(1 << w for w in p.succ_lists[v]) for v in range(n)]
    base = int(p.base_bytes)
    over = [-1] * n if p.takes_over is None else [int(x) for x in p.takes_over]
    # state (computed set) -> (peak so far, resident bytes, order reaching it); one layer per count
    layer: dict[int, tuple[int, int, tuple[int, ...]]] = {0: (base, 0, ())}
    states = 1
    for _ in range(n):
        nxt: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        for done, (peak, resident, order) in layer.items():
            for v in range(n):
                if done >> v & 1 or pred_mask[v] & ~done:
                    continue
                now = done | 1 << v
                u = over[v]  # an input v takes over and reads last: one buffer with v's output
                shared = size[u] if u >= 0 and not p.pinned[u] and not succ_mask[u] & ~now else 0
                top = max(peak, base + resident + size[v] + scratch[v] - shared)
                after = resident + (size[v] if held[v] else 0)
                for u in p.pred_lists[v]:  # inputs v reads last are freed after it
                    if not p.pinned[u] and not succ_mask[u] & ~now:
                        after -= size[u]
                cand = (top, after, order + (v,))
                old = nxt.get(now)
                if old is None or (cand[0], cand[2]) < (old[0], old[2]):
                    nxt[now] = cand
        states += len(nxt)
        if states > max_states:
            return None
        layer = nxt
    return list(next(iter(layer.values()))[2])


def memory_order(problem: PlanningProblem, min_gain: float = 0.05, budget: int | None = None,
                 max_work: float = float("inf")) -> tuple[list[int], str] | None:
    """(order, name of its start) of the lowest (bytes over ``budget``, unplanned peak) among the
    given order and the rules' list schedules, each improved by :func:`improve`, when its peak is
    at least ``min_gain`` below the given order's, or it runs within ``budget`` unplanned where
    the given order does not; else None. Deterministic. ``max_work`` caps
    the local searches at that many node positions evaluated (about 90 ns each here:
    efficientnet's 1794-node step took 113 k evaluations, 16 s, uncapped), shared by the starts:
    each may take an even share of what the ones before it left."""
    if problem.companion is not None:
        return _glued_order(problem, min_gain, budget, max_work)
    if problem.n < 3:
        return None
    best: tuple[tuple[int, int, int], str, list[int]] | None = None
    starts = {"local-search": list(range(problem.n))}  # the given order, moves only
    starts.update((name, list_order(problem, rule)) for name, rule in RULES.items())
    exact = least_peak_order(problem)
    if exact is not None:
        starts["least-peak"] = exact
    prof = _Profile(problem, budget)
    left = max_work / problem.n  # orders the starts may still evaluate
    for k, (name, start) in enumerate(starts.items()):
        order, evals = _improve(prof, start, max_evals=left / (len(starts) - k))
        left -= evals
        key = prof.key(prof(order)[0])
        if best is None or key < best[0]:
            best = (key, name, order)
    # an order whose unplanned run fits the budget where the given one does not is a plan that
    # adds no time, however little lower its peak: the 4-node graph of tests/test_reorder.py
    # (unplanned peak 51 B, 49 B in another order) got +0 at a 49 B budget but +2 "optimal" at 50 B
    # (the profiles count each node as one buffer, as the solvers do: so does the given order's peak here)
    fits = budget is not None and best[0][0] == 0 and budget < problem.one_buffer_peak
    if best[0][1] > (1.0 - min_gain) * problem.one_buffer_peak and not fits:
        return None
    return best[2], best[1]
