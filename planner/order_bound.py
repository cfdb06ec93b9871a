"""A lower bound on the added time of every recompute plan that keeps the problem's node order.

Checkmate and Moccasin plan in the order the graph comes in; memplan may change it
(planner/reorder.py). This bound says what the given order costs at best, whatever a solver
does in it, so a plan in another order can be shown to beat every plan in the given one.

Stage relaxation (the stage structure of Checkmate's MILP; our own LP, relaxed further). Stage t
runs from just after node t-1's first computation up to node t's. Over that stage, in [0, 1]:
  * S[t, i]: buffer i (i < t) is resident when stage t starts;
  * R[t, i]: buffer i (i < t) is computed again during stage t.
Every plan that computes nodes first in order 0..n-1 (and never swaps) gives 0/1 values with
  * R[t, i] <= R[t, u] + S[t, u] for every input u of i (an input is resident when i runs: it was
    there when the stage started, or it was made during it), and 1 <= R[t, u] + S[t, u] for the
    inputs u of t itself;
  * S[t+1, i] <= R[t, i] + S[t, i] (resident after t: it was there, or made in stage t);
  * while t runs: base + scratch[t] + size[t] + sum of size[i] * S[t+1, i] <= budget, where
    S[t+1, u] = 1 for every input u of t (resident while t reads it) and for graph outputs
    already made (they stay to the end);
and added time >= sum of cost[i] * R[t, i] (one compute stream; a node made twice in one stage
costs twice, counted once here). Memory during a stage's recomputes is left out: the bound only
gets weaker. The LP optimum is therefore at most the added time of every such plan. Measured
on the remat benchmark it is well below the best plans (RL100 at 60%: 6.06% of the step time,
plan 23.68%): a proof of order, not of optimality.

Size: about n^2 variables and n * edges / 2 rows; RL250 solves in 10-15 s with GLOP.
"""
from __future__ import annotations

import math

from ortools.linear_solver import pywraplp

from planner.problem import PlanningProblem


def fixed_order_bound(problem: PlanningProblem, budget: int, time_limit: float | None = None) -> float | None:
    """Least added time any recompute-only plan in ``problem``'s node order needs under ``budget``
    (module docstring): ``math.inf`` when no plan in that order fits, None when the LP was not
    solved within ``time_limit`` seconds or the problem may swap (a swap-in needs no recompute)."""
    p = problem
    if p.transfer is not None and bool(p.swappable.any()):
        return None
    n = p.n
    size = [int(x) for x in p.size]
    cost = [float(x) for x in p.cost]
    lp = pywraplp.Solver.CreateSolver("GLOP")
    if time_limit is not None:
        lp.SetTimeLimit(max(1, int(1000 * time_limit)))
    inf = lp.infinity()
    stay: dict[tuple[int, int], pywraplp.Variable] = {}  # S[t, i]
    redo: dict[tuple[int, int], pywraplp.Variable] = {}  # R[t, i]
    for t in range(1, n):
        for i in range(t):
            stay[t, i] = lp.NumVar(1.0 if p.pinned[i] else 0.0, 1.0, "")
            if p.recomputable[i] and not p.pinned[i]:
                redo[t, i] = lp.NumVar(0.0, 1.0, "")

    def at_least(lower: float, t: int, u: int, minus: pywraplp.Variable | None = None) -> None:
        """S[t, u] + R[t, u] (- minus) >= lower."""
        row = lp.Constraint(lower, inf)
        row.SetCoefficient(stay[t, u], 1.0)
        if (t, u) in redo:
            row.SetCoefficient(redo[t, u], 1.0)
        if minus is not None:
            row.SetCoefficient(minus, -1.0)

    for t in range(n):
        for i in range(t):
            if (t, i) in redo:
                for u in p.pred_lists[i]:
                    at_least(0.0, t, u, redo[t, i])
        for u in p.pred_lists[t]:
            at_least(1.0, t, u)
        if t + 1 >= n:
            continue
        inputs = set(p.pred_lists[t])
        for i in range(t):
            at_least(0.0, t, i, stay[t + 1, i])
        for u in inputs:
            stay[t + 1, u].SetLb(1.0)
        stay[t + 1, t].SetLb(1.0)  # just made: resident while t runs (size[t] counted below)
        room = budget - p.base_bytes - int(p.scratch[t]) - size[t] - sum(size[u] for u in inputs)
        row = lp.Constraint(-inf, float(room))
        for i in range(t):
            if i not in inputs and size[i]:
                row.SetCoefficient(stay[t + 1, i], float(size[i]))
    last = n - 1
    if n and budget < p.base_bytes + int(p.scratch[last]) + size[last] + sum(
            size[u] for u in set(p.pred_lists[last]) | {i for i in range(last) if p.pinned[i]}):
        return math.inf
    objective = lp.Objective()
    for (_, i), r in redo.items():
        objective.SetCoefficient(r, cost[i])
    objective.SetMinimization()
    status = lp.Solve()
    if status == pywraplp.Solver.INFEASIBLE:
        return math.inf
    if status != pywraplp.Solver.OPTIMAL:
        return None
    return max(0.0, objective.Value())
