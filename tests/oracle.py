"""An independent brute-force oracle for the planner's claims on tiny graphs (tests only).

It does not use planner code: it reads the problem's plain arrays (size, cost, preds, scratch,
base, pinned, recomputable, parts, takes_over) and walks every event list simulate() accepts:
  * compute v: every input resident, v not resident, and v either never computed or
    recomputable; while it runs, base + resident + size[v] + scratch[v] bytes are held;
  * free v: v resident and not pinned;
  * at the end every node was computed and exactly the pinned nodes are resident.
A node's ``parts`` (buffers that die apart) may each be dropped while the node stays resident:
after that no compute may read that part of this copy, nor may the copy be swapped out, and its
free releases what is left. simulate() drops each part right after its last reader (as early as
can be), so the least over these walks is the least over simulate()'s plans. Where v takes over
the buffer of input u (``takes_over``), computing v and freeing u right after it is one move
that does not count size[u] while v runs (simulate(): u freed among the frees right after v).
``order`` (a list of node ids) restricts first computes to that order (recomputes anywhere
later; ``range(n)`` is the problem's own order); None lets them come in any topological order. Dijkstra over (computed, resident)
states: the least peak (bottleneck path) and the cheapest plan within a budget (sum of the
recomputes' costs, every compute within the budget). ``swap``: host copies too (states carry which
nodes have one), each copy priced in line with compute in :func:`cheapest`.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class _Graph:
    n: int
    size: list[int]
    scratch: list[int]
    cost: list[float]
    preds: list[int]  # bit masks
    pinned: int
    again: list[bool]
    base: int
    part_bytes: list[int]  # per part (numbered across nodes)
    part_bits: list[int]  # per node, the mask of its parts
    reads: list[int]  # per node, the mask of the parts it reads
    over: list[int]  # per node, the input whose buffer it takes over, -1 for none


def _arrays(p) -> _Graph:
    n = p.n
    preds = [0] * n
    for v in range(n):
        for u in p.pred_idx[p.pred_ptr[v]:p.pred_ptr[v + 1]]:
            preds[v] |= 1 << int(u)
    part_bytes: list[int] = []
    part_bits = [0] * n
    reads = [0] * n
    for u, node_parts in enumerate(p.parts or ()):
        for nbytes, readers in node_parts:
            bit = 1 << len(part_bytes)
            part_bytes.append(int(nbytes))
            part_bits[u] |= bit
            for r in readers:
                reads[r] |= bit
    over = [-1] * n if p.takes_over is None else [int(x) for x in p.takes_over]
    return _Graph(n, [int(x) for x in p.size], [int(x) for x in p.scratch], [float(x) for x in p.cost], preds,
                  sum(1 << v for v in range(n) if p.pinned[v]), [bool(p.recomputable[v]) for v in range(n)],
                  int(p.base_bytes), part_bytes, part_bits, reads, over)


def _gone_bytes(g: _Graph, gone: int) -> int:
    return sum(b for j, b in enumerate(g.part_bytes) if gone >> j & 1)


def _held(g: _Graph, res: int, gone: int) -> int:
    return g.base + sum(g.size[v] for v in range(g.n) if res >> v & 1) - _gone_bytes(g, gone)


def _moves(g: _Graph, order, done, res, gone):
    """(next (done, res, gone), bytes held during the move, a recompute?, node) per move."""
    held = _held(g, res, gone)
    for j, nbytes in enumerate(g.part_bytes):
        if not gone >> j & 1 and any(res >> v & 1 and g.part_bits[v] >> j & 1 for v in range(g.n)):
            yield (done, res, gone | 1 << j), held - nbytes, False, -1
    for v in range(g.n):
        bit = 1 << v
        if res & bit:
            if not g.pinned & bit:
                yield (done, res & ~bit, gone & ~g.part_bits[v]), held - g.size[v] + _gone_bytes(
                    g, gone & g.part_bits[v]), False, v
            continue
        if g.preds[v] & res != g.preds[v] or g.reads[v] & gone:
            continue
        if done & bit:
            if not g.again[v]:
                continue
        elif order is not None and order[bin(done).count("1")] != v:  # first computes in ``order`` only
            continue
        mem = held + g.size[v] + g.scratch[v]
        yield (done | bit, res | bit, gone), mem, bool(done & bit), v
        u = g.over[v]
        if u >= 0 and not g.pinned >> u & 1 and not g.part_bits[u]:  # v written into u's buffer, u freed
            yield (done | bit, (res | bit) & ~(1 << u), gone), mem - g.size[u], bool(done & bit), v


def _swaps(g: _Graph, movable, res, gone, host):
    """(node, next res, next gone, bytes held after, swap_out?) per swap."""
    held = _held(g, res, gone)
    for v in range(g.n):
        if not movable[v]:
            continue
        bit = 1 << v
        if res & bit:
            if not gone & g.part_bits[v]:  # a copy swapped out holds every part until then
                yield v, res & ~bit, gone, held - g.size[v], True
        elif host & bit:
            yield v, res | bit, gone, held + g.size[v], False


def least_peak(p, order=None, swap: bool = False) -> int:
    """Least peak of any plan (``order``: first computes in that node order; None: any).
    ``swap``: swap_out / swap_in of the problem's swappable nodes too (a swap_out leaves a host
    copy; a swap_in needs one and re-allocates the buffer)."""
    g = _arrays(p)
    movable = [swap and bool(p.swappable[v]) for v in range(g.n)]
    goal = ((1 << g.n) - 1, g.pinned)
    best = {(0, 0, 0, 0): g.base}
    heap = [(g.base, 0, 0, 0, 0)]
    while heap:
        peak, done, res, gone, host = heapq.heappop(heap)
        if peak > best[(done, res, gone, host)]:
            continue
        if (done, res) == goal:
            return peak
        steps = [(nxt + (host,), mem) for nxt, mem, _, _ in _moves(g, order, done, res, gone)]
        for v, res2, gone2, mem, out in _swaps(g, movable, res, gone, host):
            steps.append(((done, res2, gone2, host | 1 << v if out else host), mem))
        for nxt, mem in steps:
            val = max(peak, mem)
            if val < best.get(nxt, val + 1):
                best[nxt] = val
                heapq.heappush(heap, (val, *nxt))
    raise AssertionError("no plan at all")


def cheapest(p, budget: int, order=None, swap: bool = False, swap_ins: int | None = None) -> float | None:
    """Least added time (sum of recompute costs) of a plan within ``budget``; None if none fits.
    ``swap``: swap_out / swap_in of the problem's swappable nodes too, each copy priced at its
    transfer time in line with compute (``copy_overlap`` False: every event runs one after another,
    so the added time is the recomputes' costs plus every copy's). ``swap_ins``: each node's host
    copy comes back at most this many times (the CP-SAT model's plans have
    ``PlannerOptions.max_swap_ins`` swap-ins per node); None: any number."""
    g = _arrays(p)
    movable = [swap and bool(p.swappable[v]) for v in range(g.n)]
    transfer = [float(p.transfer[v]) if movable[v] else 0.0 for v in range(g.n)]
    goal = ((1 << g.n) - 1, g.pinned)
    if g.base > budget:
        return None
    none_back = (0,) * g.n  # swap-ins so far per node
    best = {(0, 0, 0, 0, none_back): 0.0}
    heap = [(0.0, 0, 0, 0, 0, none_back)]
    while heap:
        c, done, res, gone, host, back = heapq.heappop(heap)
        if c > best[(done, res, gone, host, back)]:
            continue
        if (done, res) == goal:
            return c
        steps = [(nxt + (host, back), mem, g.cost[v] if redo else 0.0) for nxt, mem, redo, v in
                 _moves(g, order, done, res, gone)]
        for v, res2, gone2, mem, out in _swaps(g, movable, res, gone, host):
            bit = 1 << v
            if out and not host & bit:  # one host copy is enough: a free keeps it
                steps.append(((done, res2, gone2, host | bit, back), mem, transfer[v]))
            elif not out and (swap_ins is None or back[v] < swap_ins):
                more = back if swap_ins is None else back[:v] + (back[v] + 1,) + back[v + 1:]
                steps.append(((done, res2, gone2, host, more), mem, transfer[v]))
        for nxt, mem, extra in steps:
            if mem > budget:
                continue
            val = c + extra
            if val < best.get(nxt, val + 1):
                best[nxt] = val
                heapq.heappush(heap, (val, *nxt))
    return None
