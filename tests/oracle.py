"""An independent brute-force oracle for the planner's claims on tiny graphs (tests only).

It does not use planner code: it reads the problem's plain arrays (size, cost, preds, scratch,
base, pinned, recomputable) and walks every event list simulate() accepts without swaps:
  * compute v: every input resident, v not resident, and v either never computed or
    recomputable; while it runs, base + resident + size[v] + scratch[v] bytes are held;
  * free v: v resident and not pinned;
  * at the end every node was computed and exactly the pinned nodes are resident.
``order`` (a list of node ids) restricts first computes to that order (recomputes anywhere
later; ``range(n)`` is the problem's own order); None lets them come in any topological order. Dijkstra over (computed, resident)
states: the least peak (bottleneck path) and the cheapest plan within a budget (sum of the
recomputes' costs, every compute within the budget). ``swap``: host copies too (states carry which
nodes have one), each copy priced in line with compute in :func:`cheapest`.
"""
from __future__ import annotations

import heapq


def _arrays(p):
    n = p.n
    size = [int(x) for x in p.size]
    scratch = [int(x) for x in p.scratch]
    cost = [float(x) for x in p.cost]
    preds = [0] * n
    for v in range(n):
        for u in p.pred_idx[p.pred_ptr[v]:p.pred_ptr[v + 1]]:
            preds[v] |= 1 << int(u)
    pinned = sum(1 << v for v in range(n) if p.pinned[v])
    again = [bool(p.recomputable[v]) for v in range(n)]
    return n, size, scratch, cost, preds, pinned, again, int(p.base_bytes)


def _moves(n, size, scratch, preds, pinned, again, base, order, done, res):
    held = base + sum(size[v] for v in range(n) if res >> v & 1)
    for v in range(n):
        bit = 1 << v
        if res & bit:
            if not pinned & bit:
                yield (done, res & ~bit), held - size[v], False, v
            continue
        if preds[v] & res != preds[v]:
            continue
        if done & bit:
            if not again[v]:
                continue
        elif order is not None and order[bin(done).count("1")] != v:  # first computes in ``order`` only
            continue
        yield (done | bit, res | bit), held + size[v] + scratch[v], bool(done & bit), v


def least_peak(p, order=None, swap: bool = False) -> int:
    """Least peak of any plan (``order``: first computes in that node order; None: any).
    ``swap``: swap_out / swap_in of the problem's swappable nodes too (a swap_out leaves a host
    copy; a swap_in needs one and re-allocates the buffer)."""
    n, size, scratch, cost, preds, pinned, again, base = _arrays(p)
    movable = [swap and bool(p.swappable[v]) for v in range(n)]
    goal = ((1 << n) - 1, pinned)
    best = {(0, 0, 0): base}
    heap = [(base, 0, 0, 0)]
    while heap:
        peak, done, res, host = heapq.heappop(heap)
        if peak > best[(done, res, host)]:
            continue
        if (done, res) == goal:
            return peak
        steps = [(nxt + (host,), mem) for nxt, mem, _, _ in
                 _moves(n, size, scratch, preds, pinned, again, base, order, done, res)]
        held = base + sum(size[v] for v in range(n) if res >> v & 1)
        for v in range(n):
            if not movable[v]:
                continue
            bit = 1 << v
            if res & bit:
                steps.append(((done, res & ~bit, host | bit), held - size[v]))
            elif host & bit:
                steps.append(((done, res | bit, host), held + size[v]))
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
    n, size, scratch, cost, preds, pinned, again, base = _arrays(p)
    movable = [swap and bool(p.swappable[v]) for v in range(n)]
    transfer = [float(p.transfer[v]) if movable[v] else 0.0 for v in range(n)]
    goal = ((1 << n) - 1, pinned)
    if base > budget:
        return None
    none_back = (0,) * n  # swap-ins so far per node
    best = {(0, 0, 0, none_back): 0.0}
    heap = [(0.0, 0, 0, 0, none_back)]
    while heap:
        c, done, res, host, back = heapq.heappop(heap)
        if c > best[(done, res, host, back)]:
            continue
        if (done, res) == goal:
            return c
        steps = [(nxt + (host, back), mem, cost[v] if redo else 0.0) for nxt, mem, redo, v in
                 _moves(n, size, scratch, preds, pinned, again, base, order, done, res)]
        held = base + sum(size[v] for v in range(n) if res >> v & 1)
        for v in range(n):
            bit = 1 << v
            if not movable[v]:
                continue
            if res & bit and not host & bit:  # one host copy is enough: a free keeps it
                steps.append(((done, res & ~bit, host | bit, back), held - size[v], transfer[v]))
            elif host & bit and not res & bit and (swap_ins is None or back[v] < swap_ins):
                more = back if swap_ins is None else back[:v] + (back[v] + 1,) + back[v + 1:]
                steps.append(((done, res | bit, host, more), held + size[v], transfer[v]))
        for nxt, mem, extra in steps:
            if mem > budget:
                continue
            val = c + extra
            if val < best.get(nxt, val + 1):
                best[nxt] = val
                heapq.heappush(heap, (val, *nxt))
    return None
