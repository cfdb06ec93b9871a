"""Say, per buffer, what a plan decided and why: kept, recomputed k times, or swapped.

Each entry gives the buffer's size and cost, its unplanned live interval (producer step to last
reader), the steps where the plan holds it, and a one-line reason. Reasons come from the problem
(cannot be dropped) or from the plan and the unplanned memory profile (what dropping it saved).
Steps are the plan's own node order's; a step "over budget unplanned" is one where that order, run
with nothing recomputed or swapped, holds more than the budget (the plan itself may hold less
everywhere: those are the steps it had to relieve).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from planner.plan import Plan
from planner.problem import PlanningProblem
from planner.simulate import part_spans
from planner.units import format_bytes


def residency(problem: PlanningProblem, plan: Plan) -> list[list[list[int]]]:
    """Per node: [first step, last step] segments where the plan holds its output.

    A step is a node's first computation; a recompute or swap-in belongs to the next step.
    """
    n = problem.n
    segs: list[list[list[int]]] = [[] for _ in range(n)]
    seen = np.zeros(n, dtype=bool)
    cur = -1
    for ev in plan.events:
        v = ev.node
        if ev.op == "compute" and not seen[v]:
            seen[v] = True
            cur = v
            segs[v].append([v, v])
        elif ev.op in ("compute", "swap_in"):
            segs[v].append([cur + 1, cur + 1])
        elif segs[v]:
            segs[v][-1][1] = max(segs[v][-1][0], cur)
    for v in range(n):
        if problem.pinned[v] and segs[v]:
            segs[v][-1][1] = n - 1
    return segs


def recompute_readers(problem: PlanningProblem, plan: Plan) -> list[list[tuple[set[int], set[int]]]]:
    """Per node, one entry per recomputed copy of its output: (nodes whose first computation read
    that copy, nodes whose recompute read it). A copy only recomputes read was made to feed their
    recompute chain, not for a later read of the step's own."""
    seen = np.zeros(problem.n, dtype=bool)
    copies: list[list[tuple[set[int], set[int]]]] = [[] for _ in range(problem.n)]
    current: list[tuple[set[int], set[int]] | None] = [None] * problem.n  # the live recompute copy
    for ev in plan.events:
        v = ev.node
        if ev.op != "compute":
            if ev.op == "swap_in":
                current[v] = None
            continue
        first = not seen[v]
        for u in problem.pred_lists[v]:
            if current[u] is not None:
                current[u][0 if first else 1].add(v)
        if not first:
            current[v] = (set(), set())
            copies[v].append(current[v])
        seen[v] = True
    return copies


def freed_unread(problem: PlanningProblem, plan: Plan) -> np.ndarray:
    """Per node: whether its first copy was freed before any computation read it (computed at its
    step, then dropped and recomputed for its readers: zoo:gpt?batch=64 --swap at 35%, a 128 KiB
    gradient freed while the next step's recomputes run, and zoo:cnn's 0-byte Reshapes)."""
    state = np.zeros(problem.n, dtype=np.int8)  # 0: not computed yet, 1: first copy unread so far, 2: past that
    unread = np.zeros(problem.n, dtype=bool)
    for ev in plan.events:
        v = ev.node
        if ev.op == "compute":
            for u in problem.pred_lists[v]:
                if state[u] == 1:
                    state[u] = 2
            if state[v] == 0:
                state[v] = 1
        elif state[v] == 1:  # a free or swap-out ends the first copy
            unread[v] = ev.op == "free"
            state[v] = 2
    return unread


def _names(problem: PlanningProblem, nodes: set[int], most: int = 3) -> str:
    shown = [problem.names[w] for w in sorted(nodes)[:most]]
    more = len(nodes) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


#: what a step "over budget unplanned" is, once beneath the table (the reasons say it in short)
OVER_NOTE = ("over budget unplanned: a step where the plan's node order, run with nothing recomputed "
             "or swapped, holds more than the budget")


def _steps(k: int) -> str:
    return f"{k} step(s) over budget unplanned"


def freed_steps(problem: PlanningProblem, plan: Plan, over: np.ndarray) -> list[list[tuple[int, int, int]]]:
    """Per node, per buffer of its output (one, or each of its ``parts``): (its bytes, the steps of
    its live interval at which some computation or swap-in runs while the plan does not hold it,
    those of them over budget unplanned); steps as :func:`residency` counts them. Only these are
    what dropping it saved: counting the whole interval said a buffer held through it (zoo:cnn's
    block1.conv at 68%, recomputed later to feed others' recomputes) freed 64 KiB across 8 steps,
    and step-wide residency missed one freed only while the next step's recomputes ran
    (zoo:gpt?batch=64 --swap at 35%). A part lives to its own last reader and is released after
    the last read of each copy, as simulate() counts it: zoo:cnn's block1.pool (MaxPool: 16 KiB
    values, 32 KiB indices) at 68% was said to free 48 KiB across 30 steps, where its values
    alone are dropped, across 46."""
    n = problem.n
    parts = problem.parts or ((),) * n
    owner, nbytes, live1 = [], [], []
    first = [0] * (n + 1)  # node v's buffers: first[v] to first[v + 1]
    for v in range(n):
        first[v] = len(owner)
        bufs = [(b, max(rs, default=v)) for b, rs in parts[v]] or [(int(problem.size[v]), int(problem.last_use[v]))]
        owner += [v] * len(bufs)
        nbytes += [b for b, _ in bufs]
        live1 += [end for _, end in bufs]
    first[n] = len(owner)
    live0, live1 = np.array(owner), np.array(live1)
    released: dict[int, list[int]] = {}  # event -> the parts released right after it
    for j, _, v, i in part_spans(problem, [e.op for e in plan.events], [e.node for e in plan.events]):
        released.setdefault(j, []).append(first[v] + i)
    resident = np.zeros(len(owner), dtype=bool)
    seen = np.zeros(len(owner), dtype=bool)
    last = np.full(len(owner), -1)  # the last step counted per buffer (steps only grow along the events)
    gaps = np.zeros(len(owner), dtype=np.int64)
    crowded = np.zeros(len(owner), dtype=np.int64)
    cur = -1
    for k, ev in enumerate(plan.events):
        v = ev.node
        mine = slice(first[v], first[v + 1])
        if ev.op in ("free", "swap_out"):
            resident[mine] = False
            continue
        new = ev.op == "compute" and not seen[first[v]]
        step = v if new else cur + 1
        if step < n:
            gap = seen & ~resident & (live0 <= step) & (step <= live1) & (last != step)
            gap[mine] = False
            gaps += gap
            crowded += gap & bool(over[step])
            last[gap] = step
        if new:
            seen[mine], cur = True, v
        resident[mine] = True
        resident[released.get(k, [])] = False
    return [list(zip(nbytes[first[v]:first[v + 1]], gaps[first[v]:first[v + 1]].tolist(),
                     crowded[first[v]:first[v + 1]].tolist())) for v in range(n)]


def _frees(buffers: list[tuple[int, int, int]]) -> str:
    """What holding the buffers (bytes, gaps, crowded: :func:`freed_steps`) less often bought, as
    the plan's residency shows it."""
    if sum(b for b, _, _ in buffers) == 0:
        return "it holds 0 B, so this frees nothing"
    dropped = [(b, g, c) for b, g, c in buffers if g and b]
    if not dropped:
        return "held whenever a step of its live interval runs, so this frees nothing there"
    crowded = [(b, c) for b, _, c in dropped if c]
    if not crowded:
        return "frees " + " and ".join(f"{format_bytes(b)} for {g}" for b, g, _ in dropped) + \
            " step(s) of its live interval, none over budget unplanned"
    return "frees " + " and ".join(f"{format_bytes(b)} across {c}" for b, c in crowded) + \
        " step(s) over budget unplanned"


def _recompute_reason(problem: PlanningProblem, v: int, copies: list[tuple[set[int], set[int]]],
                      unread: bool, buffers: list[tuple[int, int, int]]) -> str:
    extra = len(copies)
    cost = float(problem.cost[v])
    feeding = [c for c in copies if not c[0]]
    fed = set().union(*(c[1] for c in feeding)) if feeding else set()
    head = f"freed {'unread' if unread else 'after its reads'} and recomputed {extra}x at cost {cost * extra:g}"
    if not feeding:
        why = "for later reads"
    elif len(feeding) == extra:
        why = f"to feed the recompute of {_names(problem, fed)}"
    else:
        why = f"({extra - len(feeding)}x for later reads, {len(feeding)}x to feed the recompute of {_names(problem, fed)})"
    return f"{head} {why}: {_frees(buffers)}"


def explain(problem: PlanningProblem, plan: Plan, budget: int) -> list[dict[str, Any]]:
    """One entry per node, in the order the plan first computes them: steps, live intervals and
    over-budget steps are the plan's own order's. A plan in another order than the problem's (a
    memory-aware order, the reverse walk's) was explained in the problem's order, with intervals
    and residencies that were true of neither (zoo:cnn at 65%: a buffer held at step 97, 19 steps
    after its last read)."""
    from planner.reorder import first_compute_order, permute, plan_in_order

    order = first_compute_order(plan)
    if order != list(range(problem.n)) and sorted(order) == list(range(problem.n)):
        problem, plan = permute(problem, order), plan_in_order(plan, order)
    counts = plan.counts(problem.n)
    segs = residency(problem, plan)
    copies = recompute_readers(problem, plan)
    over = problem.unplanned_memory > budget
    freed = freed_steps(problem, plan, over)
    unread = freed_unread(problem, plan)
    out = []
    for v in range(problem.n):
        size, cost = int(problem.size[v]), float(problem.cost[v])
        live = [v, int(problem.last_use[v])]
        extra = counts["compute"][v] - 1
        swaps = counts["swap_in"][v]
        crowded = int(over[live[0] : live[1] + 1].sum())
        if swaps:
            decision = "swap" + (f" + recompute x{extra}" if extra > 0 else "")
            why = (f"moved to host and back {swaps}x: {_frees(freed[v])}; "
                   f"transfer {problem.transfer[v]:g} each way vs recompute {cost:g}")
            if extra > 0:  # both in one plan: the recomputes cost time too (they were left unsaid)
                why += f"; also recomputed {extra}x at cost {cost * extra:g}"
        elif extra > 0:
            decision = f"recompute x{extra}"
            why = _recompute_reason(problem, v, copies[v], bool(unread[v]), freed[v])
        else:
            decision = "keep"
            why = _keep_reason(problem, v, crowded)
        out.append({
            "node": problem.node_ids[v],
            "name": problem.names[v],
            "size_bytes": size,
            "cost": cost,
            "live": live,
            "resident": segs[v],
            "decision": decision,
            "why": why,
        })
    return out


def _keep_reason(problem: PlanningProblem, v: int, crowded: int) -> str:
    if problem.pinned[v]:
        return "graph output: stays to the end"
    if not problem.recomputable[v] and not problem.swappable[v]:
        return "may not be recomputed or swapped"
    if int(problem.last_use[v]) == v:  # the last step's output, or one nothing reads
        return "read by no later step: freed as soon as it is made"
    if int(problem.last_use[v]) == v + 1:
        return "read only by the next step: nothing to free in between"
    if crowded == 0:
        return "no step of its live interval is over budget unplanned"
    if int(problem.size[v]) == 0:  # zoo:gpt's labels.flat: "freeing other buffers there was cheaper"
        return "holds 0 B: freeing it would save nothing"
    return (f"held across {_steps(crowded)}: the plan frees other buffers there instead "
            f"(recompute cost {float(problem.cost[v]):g}, {float(problem.cost[v]) / max(1, int(problem.size[v])):.3g}/byte)")


def explain_table(entries: list[dict[str, Any]], only_changed: bool = False) -> str:
    """Plain-text table of :func:`explain` entries, with what "over budget unplanned" means beneath
    it where a reason says it (the plan itself may be under the budget at every step)."""
    rows = [("node", "name", "size", "cost", "live", "decision", "why")]
    for e in entries:
        if only_changed and e["decision"] == "keep":
            continue
        rows.append((str(e["node"]), e["name"], format_bytes(e["size_bytes"]), f"{e['cost']:g}",
                     f"{e['live'][0]}-{e['live'][1]}", e["decision"], e["why"]))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(6)) + "  " + r[6] for r in rows]
    if any("over budget unplanned" in r[6] for r in rows):
        lines.append(f"({OVER_NOTE})")
    return "\n".join(lines)
