"""Say, per buffer, what a plan decided and why: kept, recomputed k times, or swapped.

Each entry gives the buffer's size and cost, its unplanned live interval (producer step to last
reader), the steps where the plan holds it, and a one-line reason. Reasons come from the problem
(cannot be dropped) or from the plan and the unplanned memory profile (what dropping it saved).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from planner.plan import Plan
from planner.problem import PlanningProblem
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


def _names(problem: PlanningProblem, nodes: set[int], most: int = 3) -> str:
    shown = [problem.names[w] for w in sorted(nodes)[:most]]
    more = len(nodes) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _recompute_reason(problem: PlanningProblem, v: int, copies: list[tuple[set[int], set[int]]],
                      crowded: int) -> str:
    extra = len(copies)
    cost, size = float(problem.cost[v]), int(problem.size[v])
    feeding = [c for c in copies if not c[0]]
    fed = set().union(*(c[1] for c in feeding)) if feeding else set()
    frees = f"frees {format_bytes(size)} across {crowded} over-budget step(s)"
    head = f"freed after its reads and recomputed {extra}x at cost {cost * extra:g}"
    if not feeding:
        return f"{head} for later reads: {frees}"
    if len(feeding) == extra:
        tail = f": {frees}" if crowded else " (its own interval holds no over-budget step)"
        return f"{head} to feed the recompute of {_names(problem, fed)}{tail}"
    return f"{head} ({extra - len(feeding)}x for later reads, {len(feeding)}x to feed the recompute of {_names(problem, fed)}): {frees}"


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
    out = []
    for v in range(problem.n):
        size, cost = int(problem.size[v]), float(problem.cost[v])
        live = [v, int(problem.last_use[v])]
        extra = counts["compute"][v] - 1
        swaps = counts["swap_in"][v]
        crowded = int(over[live[0] : live[1] + 1].sum())
        if swaps:
            decision = "swap" + (f" + recompute x{extra}" if extra > 0 else "")
            why = (f"moved to host and back {swaps}x: frees {format_bytes(size)} across "
                   f"{crowded} over-budget step(s); transfer {problem.transfer[v]:g} each way vs recompute {cost:g}")
            if extra > 0:  # both in one plan: the recomputes cost time too (they were left unsaid)
                why += f"; also recomputed {extra}x at cost {cost * extra:g}"
        elif extra > 0:
            decision = f"recompute x{extra}"
            why = _recompute_reason(problem, v, copies[v], crowded)
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
        return "its live interval never exceeds the budget"
    return (f"kept across {crowded} over-budget step(s): freeing other buffers there was cheaper "
            f"(recompute cost {float(problem.cost[v]):g}, {float(problem.cost[v]) / max(1, int(problem.size[v])):.3g}/byte)")


def explain_table(entries: list[dict[str, Any]], only_changed: bool = False) -> str:
    """Plain-text table of :func:`explain` entries."""
    rows = [("node", "name", "size", "cost", "live", "decision", "why")]
    for e in entries:
        if only_changed and e["decision"] == "keep":
            continue
        rows.append((str(e["node"]), e["name"], format_bytes(e["size_bytes"]), f"{e['cost']:g}",
                     f"{e['live'][0]}-{e['live'][1]}", e["decision"], e["why"]))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(6)) + "  " + r[6] for r in rows]
    return "\n".join(lines)
