"""Lower bounds on the added time of every recompute plan that keeps the problem's node order:
an LP over Checkmate's stages (``fixed_order_bound``, for benchmarks) and the recompute-closure
bound (``closure_bound``, reported with cpsat's phase 2: a plan that reaches it is optimal).

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

import bisect
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np
from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

from planner import clock, interrupt
from planner.problem import PlanningProblem


def fixed_order_bound(problem: PlanningProblem, budget: int, time_limit: float | None = None) -> float | None:
    """Least added time any recompute-only plan in ``problem``'s node order needs under ``budget``
    (module docstring): ``math.inf`` when no plan in that order fits, None when the LP was not
    solved within ``time_limit`` seconds or the problem may swap (a swap-in needs no recompute)."""
    p = problem
    if p.can_swap:
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
        # an input t takes over (PlanningProblem.takes_over) may share t's buffer: not counted
        room = budget - p.base_bytes - int(p.scratch[t]) - size[t] - sum(size[u] for u in inputs) + int(p.credit[t])
        row = lp.Constraint(-inf, float(room))
        for i in range(t):
            if i not in inputs and size[i]:
                row.SetCoefficient(stay[t + 1, i], float(size[i]))
    last = n - 1
    if n and budget < p.base_bytes + int(p.scratch[last]) + size[last] - int(p.credit[last]) + sum(
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


# growing_closure_bound: steps in one run over those in the last (2 measured worse: zoo:gpt at 80%
# in 3 s 4.70% against the exact 4.91% in 2.7 s)
GROWTH = 4
# ... and no run past this many steps x nodes, once one has run (efficientnet?batch=64 at 50%:
# 1024 steps x 1810 nodes took 1.2 GB to build, and its time ran out before it was solved)
MAX_CELLS = 1_000_000
INFEASIBLE = -1  # ClosureBound.value when no plan in the order fits the budget


@dataclass(frozen=True)
class ClosureBound:
    value: int  # least sum of cost[i] over recompute events any fitting plan in the order needs, or INFEASIBLE
    exact: bool  # the bound model was solved to optimality (else its proven bound, still valid)
    # The nodes the bound model's best solution recomputes (empty without one): a guess at where a
    # cheap plan recomputes, for planning.py to search first. Not part of the bound's claim.
    nodes: tuple[int, ...] = ()


def closure_bound(problem: PlanningProblem, budget: int, cost: Sequence[int], time_limit: float,
                  seed: int = 0, steps: Sequence[int] | None = None, below: int | None = None,
                  stronger: bool = False) -> ClosureBound | None:
    """A lower bound on ``sum(cost[i])`` over the recomputes of every recompute-only plan that
    computes nodes first in ``problem``'s order and stays within ``budget`` (integer ``cost``:
    the CP-SAT model's own objective units, so the bound holds for its objective exactly).

    One step at a time (only steps over budget unplanned), for the moment node t runs:
      * a[t, i]: buffer i (i < t) is resident; the inputs of t, t itself and pinned outputs are;
        base + scratch[t] + their bytes + sum size[i] * a[t, i] <= budget;
      * r[t, i]: i is computed again after t and no later than its next read after t (any time
        after t when no original step reads it again);
      * i read after t: a[t, i] or r[t, i] (it must be back by that read);
      * r[t, i] needs every input u of i resident at t or r[t, u]: u must be there when i is
        recomputed; if u is not resident at t, it was computed again after t, and no later than
        its own next read (it is resident at that read too);
      * recompute events of i between two reads of i are distinct from those between two
        others: z[i, k] >= r[t, i] for every t between the k-th and (k+1)-th read of i, and the
        objective is sum cost[i] * z[i, k];
      * the last-input rule, for steps s and s-1 both modelled, added where a solution breaks it
        (:meth:`_Closure.tighten`): of the inputs of s computed again between s-1 and s, the one
        made last is made while every other input of s, its own inputs and each buffer resident
        at s that was not made again in between are resident, all within ``budget`` (the other
        inputs were made before it and stay until s; a buffer resident at s and not made in
        between was resident before). An input with no r var at s-1 (an input of s-1, or s-1)
        is that last one only through an event of its own between s-1 and s. Without the rule,
        RL100 at 60% 4760 units (plan 10205); with it 5629, exact in 4-5 s.
    With ``stronger`` (off by default: not yet wired into planning, see below), also:
      * buffers held past their last read (:meth:`_Closure.add_kept_past`): resident at a
        modelled step after its last read and not made again since, i is resident at every step
        in between, whose memory rows (those not modelled too) count it;
      * the gap rule, for steps s and s-1 both modelled, added where a solution breaks it, after
        the last-input rule (:meth:`_Closure._gap_vars`, :meth:`_Closure._tighten_gap`): the
        nodes made again between s-1 and s, and the memory while each is made (every buffer
        resident at s and not made in that gap is held all through it), and while the last of
        them resident at s is made (every other buffer resident at s is there).
        With these two, RL100 at 60% 5629 -> 6183 units (plan 9954), exact in 23-27 s (55 s beside a
        test run), 5629 after 3 s and 6183 after 17 s on the way (so 6183 in 20 s); 380 small
        graphs (7-12 nodes, seeds 0-149, against planner.least.cheapest_plan) 0.902 -> 0.921 of
        the optimum on average. In the 1-6 s
        planning gives the bound they only slow it: zoo:gpt at 76% (10 s, deterministic) ended
        at a bound of 5.609366e-05 s instead of 5.609473e-05 with them on; RL250 at 70% (given
        order, 20 s) proves 5677 with them, 11611 without.
    Every fitting plan gives values for these, so the optimum (or CP-SAT's bound on it) is at
    most its recompute cost. Memory during recomputes is left out but for the last-input rule,
    and steps are only linked through z, so the bound stays a relaxation. Measured before that
    rule (share of step time, the CP-SAT slot model's bound in brackets, best plan after the
    arrow): RL100 at 60% 9.96% (4.06%) -> 23.68%;
    zoo:gpt at 80% 4.91% (2.68%) -> 5.36%, at 76% 8.49% (4.47%) -> 9.82%; 0.3-5 s each.

    ``steps``: only these of the steps over budget (default: all). Each step only adds
    constraints, so any subset still gives a bound, a weaker one (see growing_closure_bound).

    ``below``: only solutions cheaper than this are searched (a plan's cost: only a cheaper plan
    matters). Where the optimum is below it, the result is the same; where none is, the model
    has no solution, often proven much sooner than a bound this high, and the result is value
    ``below``, not exact. RL250 at 70% (plan 2487 units), the given order's 16 steps: at least
    2487 in 0.8 s, where 6 s without it proved 10772 but not optimal; the memory-aware order's
    20 steps: 2253, exact in 1.4-2 s, where 10 s proved 2133 (below 2700 or 3000: 4.1-4.2 s).

    None when the problem may swap (a swap-in needs no recompute), when it has no step over
    budget unplanned (bound 0 is trivial), or when CP-SAT proves nothing within ``time_limit``;
    value INFEASIBLE (exact) when no plan in the order fits at all.
    """
    p = problem
    if p.can_swap:
        return None
    over = over_budget_steps(p, budget)
    if steps is not None:
        chosen = set(steps)
        over = [t for t in over if t in chosen]
    if not over:
        return None
    deadline = clock.now() + time_limit
    built = _closure_model(p, budget, over, deadline, stronger)
    if built is None:
        return None
    m, events = built.m, built.events
    objective = sum(int(cost[i]) * z for (i, _), z in events.items())
    m.Minimize(objective)
    if below is not None:
        m.Add(objective <= int(below) - 1)
    solver, status, proven, settled = _solve_tightened(built, deadline - clock.now(), seed)
    nodes: tuple[int, ...] = ()
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        nodes = tuple(sorted({i for (i, _), z in events.items() if solver.BooleanValue(z)}))
    if status == cp_model.OPTIMAL:  # exact only when no step breaks the rule: else its time ran out
        return ClosureBound(int(round(solver.ObjectiveValue())), settled, nodes)
    if status == cp_model.INFEASIBLE:  # with ``below``: no solution under it
        return ClosureBound(INFEASIBLE, True) if below is None else ClosureBound(int(below), False)
    bound = solver.BestObjectiveBound()  # valid with or without a solution
    if proven is not None:
        bound = max(bound, proven)
    if below is not None:
        # past ``below`` it proves only that no solution is under it (RL250 at 70%, the given
        # order: 3070 with ``below`` 2487 and no status): the optimum without it is ``below`` or more
        bound = min(bound, below)
    if math.isfinite(bound) and bound > 0:
        return ClosureBound(int(math.ceil(bound - 1e-6)), False, nodes)
    return None


def _solve_relaxation(m: cp_model.CpModel, time_limit: float, seed: int) -> tuple[cp_model.CpSolver, int]:
    """(solver, status) of the closure relaxation ``m`` solved within ``time_limit``. One worker
    with the full linearisation's LP. Measured (zoo:gpt 76/80%, RL100 60/70%, RL250 90%):
    2.0/1.6/0.6/0.3/4.6 s, all exact; two interleaved workers with it 10.6/12.6/5.2/1.5 s and
    RL250 inexact; two without it 2.7/3.3/1.2/0.5 s and no bound at all on RL250."""
    solver = cp_model.CpSolver()
    clock.limit_solver(solver.parameters, time_limit)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = int(seed)
    solver.parameters.linearization_level = 2
    status = interrupt.solve(solver, m)
    clock.charge(solver.ResponseProto().deterministic_time)
    return solver, status


def _solve_tightened(c: "_Closure", time_limit: float, seed: int
                     ) -> tuple[cp_model.CpSolver, int, float | None, bool]:
    """(solver, status, bound proven on the way, whether the last optimum keeps the last-input
    rule everywhere) of ``c``'s model: solved, and while its optimum breaks the rule at some
    step, solved again with the rule there. Each optimum on the way is a bound (its model only
    lacks constraints every plan meets); the last solve's own bound adds to it. RL250 at 70%
    (memory-aware order): no step broken, one solve, as without the rule; RL100 at 60%: 4760 ->
    5629 -> 6183 units (last-input rule, then the gap rule: :meth:`_Closure.tighten`)."""
    deadline = clock.now() + time_limit
    proven: float | None = None
    kept: cp_model.CpSolver | None = None  # the last optimum that keeps the last-input rule everywhere
    while True:
        solver, status = _solve_relaxation(c.m, deadline - clock.now(), seed)
        if status != cp_model.OPTIMAL:
            if kept is not None:  # the gap rule's rounds ran out of time: the last optimum stands,
                return kept, cp_model.OPTIMAL, proven, True  # exact as the bound was before the rule
            return solver, status, proven, False
        if not c.tighten(solver):
            return solver, status, proven, True
        if c.rule_kept:
            kept = solver
        if deadline - clock.now() <= 0.05:  # broken, and no time to solve again
            return (solver, status, proven, False) if kept is None else (kept, status, proven, True)
        proven = solver.ObjectiveValue()


def _closure_model(p: PlanningProblem, budget: int, over: Sequence[int], deadline: float,
                   stronger: bool = False) -> "_Closure | None":
    """:func:`closure_bound`'s constraints over the steps ``over`` and its recompute events
    ((node, reads before) -> bool), objective not set; None when building took past ``deadline``.
    ``stronger``: with the rows for buffers kept past their last read and the gap rule (the same
    events, so the same objective: a bound of one model bounds the other's image of every plan)."""
    c = _Closure(p, budget, cp_model.CpModel(), {}, {}, gap_rule=stronger)
    m, last, succ, event = c.m, p.last_use, p.succ_lists, c.event
    for t in over:
        if clock.now() > deadline:  # building alone took the time (thousands of steps)
            return None
        inputs = set(p.pred_lists[t])
        # buffers read after t, and everything a recompute of them may need (t's inputs and
        # pinned outputs are resident at t whatever the plan: counted in ``fixed``)
        free = [i for i in range(t) if last[i] > t and i not in inputs and not p.pinned[i]]
        seen, stack = set(free), list(free)
        while stack:
            i = stack.pop()
            if p.recomputable[i]:
                for u in p.pred_lists[i]:
                    if u not in seen and u not in inputs and not p.pinned[u]:
                        seen.add(u)
                        stack.append(u)
        a = {i: m.NewBoolVar("") for i in sorted(seen)}
        r = {i: m.NewBoolVar("") for i in a if p.recomputable[i]}
        # a node with parts is resident at t part by part: held[i, k] (c.part_held); a[i] is then
        # "some part is", and its bytes are the parts'
        held = {(i, k): m.NewBoolVar("") for i in a for k in range(len(c.parts[i]))}
        for (i, k), h in held.items():
            m.AddImplication(h, a[i])

        def resident(i: int, parts: Sequence[int] | None = None) -> list:
            """The literals that say i (or those of its parts) is resident at t."""
            if not c.parts[i]:
                return [a[i]]
            return [held[i, k] for k in (range(len(c.parts[i])) if parts is None else parts)]

        for i in a:
            # read after t: resident, or made again
            later = resident(i, c.read_after(i, t)) if c.parts[i] else [a[i]] if last[i] > t else []
            if i not in r:
                for x in later:
                    m.Add(x == 1)
                continue
            for x in later:
                m.AddBoolOr([x, r[i]])
            for u in p.pred_lists[i]:
                if u in a:
                    for x in resident(u, c.reads_of(i, u)):
                        m.AddBoolOr([x, r[u]] if u in r else [x]).OnlyEnforceIf(r[i])
            first = bisect.bisect_right(succ[i], t)
            m.AddBoolOr([event(i, k) for k in range(first, c.made_by(i, t) + 1)]).OnlyEnforceIf(r[i])
        m.Add(sum(int(p.size[i]) * a[i] for i in a if not c.parts[i])
              + sum(c.parts[i][k][0] * h for (i, k), h in held.items()) <= budget - c.fixed(t))
        c.steps[t] = (a, r)
    if stronger:
        c.add_kept_past()
    for s in c.steps:  # the events the last-input rule may name, before any objective sums them
        if s - 1 in c.steps:
            for u in c.others(s):
                event(u, bisect.bisect_right(succ[u], s - 1))
    return c


@dataclass(frozen=True)
class _Gap:
    """The gap rule's vars at one step (:meth:`_Closure._gap_vars`): g, and per buffer resident
    at the step, (bytes, literal) held across the gap and resident at the step (None: always),
    and l."""
    g: dict[int, cp_model.IntVar]
    held: dict[int, tuple[int, object]]
    res: dict[int, tuple[int, object]]
    last: dict[int, cp_model.IntVar]


@dataclass
class _Closure:
    """:func:`closure_bound`'s relaxation: the model, its recompute events, and per step its
    a and r vars (``_closure_model``), with the last-input rule added where a solution breaks it
    (:meth:`tighten`)."""
    p: PlanningProblem
    budget: int
    m: cp_model.CpModel
    events: dict[tuple[int, int], cp_model.IntVar]
    steps: dict[int, tuple[dict[int, cp_model.IntVar], dict[int, cp_model.IntVar]]]
    ruled: set[int] = field(default_factory=set)
    gaps: dict[int, "_Gap"] = field(default_factory=dict)
    gap_rows: set[tuple[int, int, int]] = field(default_factory=set)
    held_vars: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    gap_rule: bool = False  # the gap rule in :meth:`tighten` (_closure_model's ``stronger``)
    rule_kept: bool = False  # the last solution tighten saw keeps the last-input rule everywhere

    def __post_init__(self) -> None:
        self.pinned_before = np.concatenate([[0], np.cumsum(np.where(self.p.pinned, self.p.size, 0))[:-1]])
        # PlanningProblem.parts: each part of a node is freed after its own last reader, so a step
        # holds only those read after it, and a reader only those it reads (else the bound could
        # exceed a plan that fits only with parts freed apart)
        self.parts = self.p.parts or ((),) * self.p.n
        self._reads = {r: dict(ins) for r, ins in self.p.part_inputs.items()}

    def fixed(self, t: int) -> int:
        """Bytes resident while t runs in every plan: base, scratch, t's output, pinned outputs
        made before t and t's inputs (the parts of them t reads), less ``credit``."""
        p = self.p
        return (p.base_bytes + int(p.scratch[t]) + int(p.size[t]) + int(self.pinned_before[t])
                + sum(self.read_bytes(t, u) for u in set(p.pred_lists[t]) if not p.pinned[u]) - int(p.credit[t]))

    def add_kept_past(self) -> None:
        """Buffers resident at a step after their last read: held there since that read.

        If a plan has i resident at a modelled step t after i's last read and does not compute
        i again after that read (no event z[i, K], K its number of reads; i not recomputable:
        never), the copy resident at t is the one that last read used, so i is resident at every
        step s between its last read and t, modelled or not. At a modelled s that is a[s, i]
        (where s models i) or an extra term in s's memory row; at a step s not modelled, s's
        memory row counts, beside the bytes every plan holds at s (:meth:`fixed`), each buffer
        such a t holds past s, and each buffer i read after s unless i is computed again in the
        read interval s lies in (the event z[i, k], which every plan that frees i before that
        read has; i not recomputable: always; no such event in the model: left out, as if freed,
        so the objective's events stay those of the model without these rows, and ClosureCuts,
        which solves that model, may take this bound as a floor). Every fitting plan meets these rows, so the bound
        stays a relaxation. The 8-node case in bench/results/step_indexed_bound_stop72.md:
        node 0, last read at step 3, held at step 5 to compute node 1 again, must fit at step 4.
        """
        p, m, succ, last = self.p, self.m, self.p.succ_lists, self.p.last_use
        past: dict[tuple[int, int], cp_model.IntVar] = {}  # (s, i): i resident at s after its last read
        reach: dict[int, int] = {}  # i -> the last modelled step with i after its last read
        for t, (a, _) in self.steps.items():
            for i in a:
                if not self.parts[i] and not p.pinned[i] and last[i] < t:
                    reach[i] = max(reach.get(i, 0), t)
        for i, top in sorted(reach.items()):
            # resident at s+1 after the last read and not made again after it: resident at s
            again = [self.events[i, len(succ[i])]] if p.recomputable[i] else []
            later = self.steps[top][0][i]
            for s in range(top - 1, int(last[i]), -1):
                if s in self.steps and i in self.steps[s][0]:
                    now = self.steps[s][0][i]
                else:
                    now = past[s, i] = m.NewBoolVar("")
                m.AddBoolOr([now, later.Not()] + again)
                later = now
        for s in sorted({s for s, _ in past}):
            extra = sum(int(p.size[i]) * x for (q, i), x in past.items() if q == s)
            if s in self.steps:
                a_s = self.steps[s][0]
                m.Add(sum(int(p.size[i]) * a_s[i] for i in a_s if not self.parts[i]) + extra
                      <= self.budget - self.fixed(s))
                continue
            inputs = set(p.pred_lists[s])
            held, room = [], self.budget - self.fixed(s)
            for i in range(s):
                if i in inputs or p.pinned[i] or self.parts[i] or last[i] <= s:
                    continue
                if not p.recomputable[i]:
                    room -= int(p.size[i])
                    continue
                k = bisect.bisect_right(succ[i], s)
                if (i, k) in self.events:  # (none: no event shows i freed there, so it may be)
                    held.append(int(p.size[i]) * (1 - self.events[i, k]))
            m.Add(sum(held) + extra <= room)

    def reads_of(self, j: int, u: int) -> tuple[int, ...] | None:
        """The parts of input u that j reads (None: u has none)."""
        return self._reads[j][u] if self.parts[u] else None

    def read_bytes(self, j: int, u: int) -> int:
        """Bytes of input u that j reads: its parts j reads, or all of it."""
        if not self.parts[u]:
            return int(self.p.size[u])
        return sum(self.parts[u][k][0] for k in self._reads[j][u])

    def made_by(self, i: int, t: int) -> int:
        """The last of i's read intervals (succ_lists[i] index) a copy of i made again after t
        may be made in: before i's next read after t, or for a node with parts, before the
        latest of its parts' next reads (a part first read after another reader may be made
        again after that reader: bench/claims_fuzz.py seed 1858 proved 10 where a plan costs 9)."""
        succ = self.p.succ_lists[i]
        first = bisect.bisect_right(succ, t)
        if not self.parts[i]:
            return first
        nxt = [min(x for x in self.parts[i][k][1] if x > t) for k in self.read_after(i, t)]
        return max([first] + [bisect.bisect_left(succ, x) for x in nxt])

    def read_after(self, i: int, t: int) -> tuple[int, ...]:
        """The parts of i (a node with parts) some node after t reads."""
        return tuple(k for k, (_, readers) in enumerate(self.parts[i]) if readers and readers[-1] > t)

    def event(self, i: int, k: int) -> cp_model.IntVar:
        """z[i, k]: i is computed again between its k-th and (k+1)-th read."""
        if (i, k) not in self.events:
            self.events[i, k] = self.m.NewBoolVar("")
        return self.events[i, k]

    def others(self, s: int) -> list[int]:
        """Inputs of s that step s-1's model has no r var for (inputs of s-1, or s-1 itself), yet
        a plan may free after s-1 and compute again before s."""
        p, r_prev = self.p, self.steps[s - 1][1]
        return [u for u in sorted(set(p.pred_lists[s])) if u not in r_prev and p.recomputable[u] and not p.pinned[u]]

    def _held_at(self, s: int) -> list[tuple[int, int, list[int]]]:
        """The buffers resident at s (not its inputs) that a plan may hold across the gap between
        s-1 and s: (size, node, its events that span that gap)."""
        p, succ = self.p, self.p.succ_lists
        held = []
        inputs = set(p.pred_lists[s])
        for j in self.steps[s][0]:
            if j in inputs or p.pinned[j] or self.parts[j]:
                continue  # (a node with parts: its bytes held are not a_s's; left out, the rule only weakens)
            again = [] if not p.recomputable[j] else [
                k for k in range(bisect.bisect_right(succ[j], s - 1), bisect.bisect_right(succ[j], s) + 1)]
            if any((j, k) not in self.events for k in again):
                continue  # a recompute there has no event to show it: j may not be held
            held.append((int(p.size[j]), j, again))
        return held

    def _held_var(self, s: int, j: int, again: list[int]):
        """j resident at s and held across the gap before it (its a var where no event spans it)."""
        a_s = self.steps[s][0]
        if not again:
            return a_s[j]
        if (s, j) not in self.held_vars:
            self.held_vars[s, j] = self.m.NewBoolVar("")
            self.m.Add(self.held_vars[s, j] >= a_s[j] - sum(self.events[j, k] for k in again))
        return self.held_vars[s, j]

    def _rule(self, s: int) -> list[tuple[int, int, list[tuple[int, int, list[int]]], int]]:
        """The last-input rule at step s as data: per input x that may be made last, (x, kind,
        the buffers held as (size, node, its events between s-1 and s), the bytes they may take).
        Kind 0: x made again is r[s-1, x]; kind 1: it is x's event between s-1 and s."""
        p = self.p
        r_prev = self.steps[s - 1][1]
        inputs = set(p.pred_lists[s])
        need = self.p.base_bytes + int(self.pinned_before[s]) + sum(self.read_bytes(s, u) for u in inputs
                                                                     if not p.pinned[u])
        held = self._held_at(s)
        out = []
        for x in [x for x in sorted(inputs) if x in r_prev] + self.others(s):
            own = set(p.pred_lists[x])
            room = (self.budget - need - int(p.scratch[x]) + int(p.credit[x])
                    - sum(self.read_bytes(x, q) for q in own - inputs if not p.pinned[q]))
            out.append((x, 0 if x in r_prev else 1, [h for h in held if h[1] not in own], room))
        return out

    def tighten(self, solver: cp_model.CpSolver) -> int:
        """Add the last-input rule (:func:`closure_bound`) at each step whose rule ``solver``'s
        solution breaks; where it breaks none, the gap rule's rows it breaks (:meth:`_tighten_gap`).
        The number of steps and rows added."""
        added = 0
        for s in self.steps:
            if s - 1 not in self.steps or s in self.ruled:
                continue
            a_s, r_prev = self.steps[s][0], self.steps[s - 1][1]
            if not any(x in r_prev and solver.BooleanValue(r_prev[x]) for x in self.p.pred_lists[s]):
                continue  # no input of s made again between s-1 and s: nothing to check
            rule = self._rule(s)

            def fits(x: int, kind: int, terms, room: int) -> bool:
                if not solver.BooleanValue(r_prev[x] if kind == 0 else
                                           self.events[x, bisect.bisect_right(self.p.succ_lists[x], s - 1)]):
                    return False
                return sum(size for size, j, again in terms if solver.BooleanValue(a_s[j])
                           and not any(solver.BooleanValue(self.events[j, k]) for k in again)) <= room

            if any(fits(*choice) for choice in rule):
                continue
            self._add_rule(s, rule)
            added += 1
        self.rule_kept = not added
        if added or not self.gap_rule:  # the last-input rule first: most steps need only it, and it is cheap
            return added
        for s in self.steps:
            if s - 1 in self.steps:
                added += self._tighten_gap(solver, s)
        return added

    def _gap(self, s: int) -> tuple[list[int], list[tuple[int, int]]]:
        """The gap rule at step s as data: (the nodes a plan may make in the gap between s-1 and
        s that the rule follows, in the order found; the buffers resident at s as (bytes, node):
        s's inputs and s's a vars). See :meth:`_gap_vars`."""
        p = self.p
        a_prev = self.steps[s - 1][0]
        inputs = set(p.pred_lists[s])
        at_s = [(self.read_bytes(s, x), x) for x in sorted(inputs) if not p.pinned[x] and not self.parts[x]]
        at_s += [(int(p.size[x]), x) for x in self.steps[s][0] if x not in inputs and not self.parts[x]]
        made = [x for _, x in at_s if p.recomputable[x]]
        seen = set(made)
        for y in made:  # grows while it is walked
            for u in p.pred_lists[y]:
                if u in a_prev and u not in seen and p.recomputable[u] and not self.parts[u]:
                    seen.add(u)
                    made.append(u)
        return made, at_s

    def _gap_room(self, s: int, y: int) -> int:
        """Bytes left, beside what is held across the gap before s, while y is made in it."""
        p = self.p
        return (self.budget - p.base_bytes - int(self.pinned_before[s]) - int(p.scratch[y]) - int(p.size[y])
                + int(p.credit[y]) - sum(self.read_bytes(y, q) for q in set(p.pred_lists[y]) if not p.pinned[q]))

    def _gap_vars(self, s: int) -> "_Gap":
        """The gap rule's vars at step s and the rows every plan meets whatever the memory
        (:meth:`_add_gap_row` adds the memory rows). With g[x] (x made in the gap between s-1
        and s) for the nodes :meth:`_gap` names, in every plan:
          (1) an input x of s with r[s-1, x] is made in it (after s-1, by its next read, s);
          (2) x resident at s (a[s, x]) and not at s-1 (a[s-1, x]) is made in it;
          (3) g[y] needs each input u of y that s-1's model has a var for resident at s-1 or
              g[u] (u is there when y is made: kept since s-1 or made before y in the gap), and
              g[x] needs x's event over the read interval the gap lies in;
          (4) h[x] >= a[s, x] - g[x] (an input of s: 1 - g[x]): x resident at s and not made
              in the gap was resident all through it;
          (5) of the buffers resident at s and made in the gap, one is made last: l[x] <= g[x],
              l[x] <= a[s, x], sum l <= 1, and sum l >= g[x] + a[s, x] - 1.
        A plan's image (g[x]: the plan makes x in that gap; l: the one of them resident at s it
        makes last) meets them all. Nodes with parts are left out (the rule only weakens)."""
        if s in self.gaps:
            return self.gaps[s]
        m, p, succ = self.m, self.p, self.p.succ_lists
        a_s = self.steps[s][0]
        a_prev, r_prev = self.steps[s - 1]
        inputs = set(p.pred_lists[s])
        made, at_s = self._gap(s)
        g = {y: m.NewBoolVar("") for y in made}
        for y in made:
            if y in inputs and y in r_prev:
                m.AddImplication(r_prev[y], g[y])
            if y in a_s and y in a_prev:
                m.AddBoolOr([g[y], a_s[y].Not(), a_prev[y]])
            k = bisect.bisect_right(succ[y], s - 1)
            if (y, k) in self.events:
                m.AddImplication(g[y], self.events[y, k])
            for u in p.pred_lists[y]:
                if u in a_prev and not self.parts[u]:
                    m.AddBoolOr([a_prev[u]] + ([g[u]] if u in g else []) + [g[y].Not()])
        held, res, last = {}, {}, {}
        for nbytes, x in at_s:
            res[x] = (nbytes, None if x in inputs else a_s[x])
            if x not in g:
                held[x] = res[x]
                continue
            if x in inputs:
                held[x] = (nbytes, g[x].Not())
            else:
                held[x] = (nbytes, m.NewBoolVar(""))
                m.AddBoolOr([held[x][1], a_s[x].Not(), g[x]])
            last[x] = m.NewBoolVar("")
            m.AddImplication(last[x], g[x])
            if x not in inputs:
                m.AddImplication(last[x], a_s[x])
        if last:
            m.Add(sum(last.values()) <= 1)
            for x in last:
                m.Add(sum(last.values()) >= g[x] + (0 if x in inputs else a_s[x] - 1))
        self.gaps[s] = _Gap(g, held, res, last)
        return self.gaps[s]

    def _gap_value(self, solver: cp_model.CpSolver, s: int) -> tuple[set[int], int | None]:
        """The nodes ``solver``'s solution makes in the gap before s and the one of them resident at
        s it makes last (None: none); where the gap has no vars yet, only those it must make
        (rows (1)-(3) of :meth:`_gap_vars`) and, as the last, None."""
        val = solver.BooleanValue
        if s in self.gaps:
            gap = self.gaps[s]
            return ({y for y, v in gap.g.items() if val(v)},
                    next((x for x, v in gap.last.items() if val(v)), None))
        p, a_s = self.p, self.steps[s][0]
        a_prev, r_prev = self.steps[s - 1]
        cand = set(self._gap(s)[0])
        made = {x for x in p.pred_lists[s] if x in r_prev and x in cand and val(r_prev[x])}
        made |= {x for x in a_s if x in cand and x in a_prev and val(a_s[x]) and not val(a_prev[x])}
        stack = list(made)
        while stack:
            y = stack.pop()
            for u in p.pred_lists[y]:
                if u in cand and u in a_prev and u not in made and not val(a_prev[u]):
                    made.add(u)
                    stack.append(u)
        return made, None

    def _tighten_gap(self, solver: cp_model.CpSolver, s: int) -> int:
        """Add the memory rows of the gap rule at s that ``solver``'s solution breaks: while y is
        made in the gap, base, pinned outputs made before s, y's scratch, output and inputs
        and every other buffer held across the gap fit in ``budget`` (row (6)); while the last
        of those resident at s is made, every other buffer resident at s does too (row (7): the
        others were held across the gap or made before it, and stay until s). A plan's image
        meets both, so the bound stays a relaxation. The number of rows added."""
        p = self.p
        val = solver.BooleanValue
        a_s = self.steps[s][0]
        made, last = self._gap_value(solver, s)
        inputs = set(p.pred_lists[s])
        if s in self.gaps:
            held = {x: b * (lit is None or val(lit)) for x, (b, lit) in self.gaps[s].held.items()}
        else:
            held = {x: b for b, x in self._gap(s)[1] if x not in made and (x in inputs or val(a_s[x]))}
        resident = {x: b for b, x in self._gap(s)[1] if x in inputs or val(a_s[x])}
        added = 0
        for y in sorted(made):
            own = set(p.pred_lists[y]) | {y}
            over = sum(b for x, b in held.items() if x not in own) > self._gap_room(s, y)
            if over and (s, y, 6) not in self.gap_rows:
                self._add_gap_row(s, y, 6)
                added += 1
        ends = [last] if last is not None else sorted(x for x in resident if x in made)
        if ends and not any((s, y, 7) in self.gap_rows or sum(
                b for x, b in resident.items() if x not in set(p.pred_lists[y]) | {y}) <= self._gap_room(s, y)
                for y in ends):
            for y in ends:
                self._add_gap_row(s, y, 7)
                added += 1
        if added:  # then all its rows at that step: fewer rounds (RL100 at 60%: 6183 exact in 23 s, not 63)
            gap = self._gap_vars(s)
            for y in gap.g:
                if (s, y, 6) not in self.gap_rows:
                    self._add_gap_row(s, y, 6)
            for y in gap.last:
                if (s, y, 7) not in self.gap_rows:
                    self._add_gap_row(s, y, 7)
        return added

    def _add_gap_row(self, s: int, y: int, kind: int) -> None:
        """Row (6) or (7) of :meth:`_tighten_gap` for y at step s."""
        gap = self._gap_vars(s)
        self.gap_rows.add((s, y, kind))
        own = set(self.p.pred_lists[y]) | {y}
        terms = gap.held if kind == 6 else gap.res
        enforce = gap.g[y] if kind == 6 else gap.last[y]
        self.m.Add(sum(b if lit is None else b * lit for x, (b, lit) in terms.items() if x not in own)
                   <= self._gap_room(s, y)).OnlyEnforceIf(enforce)

    def _add_rule(self, s: int, rule) -> None:
        """The constraints of the last-input rule at step s (:meth:`_rule`)."""
        m, succ = self.m, self.p.succ_lists
        r_prev = self.steps[s - 1][1]
        self.ruled.add(s)
        b = {x: m.NewBoolVar("") for x, _, _, _ in rule}
        for x, kind, _, _ in rule:
            if kind == 0:
                m.AddImplication(b[x], r_prev[x])
                m.Add(sum(b.values()) >= r_prev[x])  # one of them is made last
            else:
                m.AddImplication(b[x], self.events[x, bisect.bisect_right(succ[x], s - 1)])
        m.Add(sum(b.values()) <= 1)
        for x, _, terms, room in rule:
            m.Add(sum(size * self._held_var(s, j, again) for size, j, again in terms) <= room).OnlyEnforceIf(b[x])



def over_budget_steps(problem: PlanningProblem, budget: int) -> list[int]:
    """The steps whose unplanned memory exceeds ``budget``, in order."""
    return np.flatnonzero(problem.unplanned_memory > budget).tolist()


def growing_closure_bound(problem: PlanningProblem, budget: int, cost: Sequence[int], time_limit: float,
                          seed: int = 0, first: int = 16, below: int | None = None) -> ClosureBound | None:
    """:func:`closure_bound` over ``first`` of the over-budget steps (:func:`_spread_peaks`),
    then ``GROWTH`` times as many, and so on up to all of them, while time is left; the largest
    bound found. ``exact`` only when every step was in a model solved to optimality; a run that
    ends without a proof ends the search (what it proved still counts), and no run after the first
    holds more than ``MAX_CELLS`` steps x nodes. ``below``: as in :func:`closure_bound`; a run
    that proves the bound reaches it ends the search.

    Large graphs: the bound over all steps at once may not solve at all (efficientnet?batch=64
    at 80%: 1810 nodes, 1089 steps over budget, nothing in 40 s), while 16 steps prove 0.2945% of
    the step time in 0.5 s and the plan's +0.2944% is optimal. Small ones: in 6 s, RL250 at 70%
    gets 8.58% in the given order and 1.79% in the memory-aware one, where all steps at once
    got 4.59% and 1.70%; zoo:gpt at 80% and RL100 at 60% and 70% reach the same exact bounds, in
    2.8 s instead of 1.9 s and in 0.8 s / 0.5 s instead of 0.6 s / 0.3 s."""
    over = over_budget_steps(problem, budget)
    deadline = clock.now() + time_limit
    best: ClosureBound | None = None
    k = first
    while True:
        left = deadline - clock.now()
        if left <= 0.05 or (best is not None and min(k, len(over)) * problem.n > MAX_CELLS):
            return best
        chosen = None if k >= len(over) else _spread_peaks(problem, over, k)
        found = closure_bound(problem, budget, cost, left, seed, steps=chosen, below=below)
        if found is None:  # nothing proven in time
            return best
        solved = found.exact
        if chosen is not None and found.value != INFEASIBLE:
            # a subset's optimum bounds all steps' from below only; INFEASIBLE stays exact: no
            # plan fits a subset of the steps, so none fits them all
            found = replace(found, exact=False)
        best = larger_bound(best, found)
        if chosen is None or found.value == INFEASIBLE or not solved:
            return best
        k *= GROWTH


def _spread_peaks(problem: PlanningProblem, over: list[int], k: int) -> list[int]:
    """``k`` of the steps ``over``: the most over budget first, each at least len(over) / 2k
    places (in ``over``) from those already taken, so they spread over the order instead of
    crowding around one peak, where neighbouring steps hold the same buffers."""
    apart = max(1, len(over) // (2 * k))
    excess = problem.unplanned_memory[over]
    taken: list[int] = []
    for i in np.argsort(-excess, kind="stable").tolist():
        if all(abs(i - j) >= apart for j in taken):
            taken.append(i)
            if len(taken) == k:
                break
    return sorted(over[i] for i in taken)


def larger_bound(a: ClosureBound | None, b: ClosureBound | None) -> ClosureBound | None:
    """The stronger of two closure bounds on one problem and budget (either may be None)."""
    if a is None or b is None:
        return a or b
    # on a tie, b: growing_closure_bound passes the run over more steps second
    return max(b, a, key=lambda c: (c.value == INFEASIBLE, c.value, c.exact))


class ClosureCuts:
    """:func:`closure_bound`'s relaxation over every step over budget, with cuts that a search of
    the exact model (planning._closure_cuts) proves: "no plan cheaper than the best one
    recomputes only nodes of Y" becomes "a plan cheaper than it recomputes some node outside Y".
    Each proof cuts off the relaxation's solutions within Y, so its optimum rises towards the
    best plan's cost (Benders-like: the relaxation proposes where to recompute, the exact model
    refutes). The image of a plan in the relaxation counts its recomputes of node j outside the
    modelled read intervals in ``other[j]`` (once, at cost[j]), so every cheaper plan's image
    still satisfies every cut, and the relaxation's optimum (or CP-SAT's bound on it) is a lower
    bound on the recompute cost of every plan the cuts' proofs cover. RL250 at 70% (memory-aware
    order, plan 2487 units): 2253 -> 2475 (gap 9.41% -> 0.48%) in 8 rounds of 5 nodes more, which
    a 60 s solve now gives them (about 38 s: the closure bounds before them search only under the
    best plan, they run before the node-set search, and the given order's baselines are not run;
    2384, gap 4.14%, in the 24 s they had before). Rounds of 10 nodes more stall sooner: the
    restricted search proves nothing over 63 nodes within 20 s."""

    def __init__(self, problem: PlanningProblem, budget: int, cost: Sequence[int], below: int, deadline: float):
        over = over_budget_steps(problem, budget)
        # every step at once: as large as growing_closure_bound lets its runs get, no larger
        built = None if len(over) * problem.n > MAX_CELLS else _closure_model(problem, budget, over, deadline)
        self.ready = built is not None
        if built is None:
            return
        self.closure = built
        self.m, self.events = built.m, built.events
        # every node a plan may compute again, those of cost 0 too: a cut is met by any recompute
        # outside its set, and a free one of a node with no event (read only after the steps
        # over budget) had nothing to show it by, so a cut could refute a cheaper plan (layered,
        # 12 nodes at the floor: optimal 0 units, the rounds proved 1; tests/test_closure_cuts.py)
        self.other = {j: self.m.NewBoolVar("") for j in range(problem.n) if problem.recomputable[j]}
        self.objective = (sum(int(cost[i]) * z for (i, _), z in self.events.items())
                          + sum(int(cost[j]) * x for j, x in self.other.items()))
        self.m.Minimize(self.objective)
        self.below(below)
        # the nodes the relaxation may recompute, cheapest first: a cut's set grows with them
        self.candidates = sorted({i for (i, _) in self.events}, key=lambda i: (int(cost[i]), i))

    def below(self, cost: int) -> None:
        """Only plans cheaper than ``cost`` (the best plan's) matter from now on."""
        self.m.Add(self.objective <= cost - 1)

    def cut(self, nodes: Sequence[int]) -> None:
        """No plan the caller cares about recomputes only ``nodes``."""
        inside = set(nodes)
        self.m.AddBoolOr([z for (i, _), z in self.events.items() if i not in inside]
                         + [x for j, x in self.other.items() if j not in inside])

    def solve(self, time_limit: float, seed: int = 0) -> tuple[str, float | None, tuple[int, ...]]:
        """(CP-SAT status name, proven lower bound or None, the nodes its best solution
        recomputes). INFEASIBLE: no plan below the last ``below`` passes the cuts."""
        solver, status, proven, _ = _solve_tightened(self.closure, time_limit, seed)
        name = solver.StatusName(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if proven is not None:  # an earlier solve's optimum still bounds
                self.at_least(int(math.ceil(proven - 1e-6)))
            return name, proven, ()
        nodes = {i for (i, _), z in self.events.items() if solver.BooleanValue(z)}
        nodes |= {j for j, x in self.other.items() if solver.BooleanValue(x)}
        bound = max(solver.BestObjectiveBound(), -math.inf if proven is None else proven)
        if not math.isfinite(bound):
            return name, None, tuple(sorted(nodes))
        self.at_least(int(math.ceil(bound - 1e-6)))
        return name, bound, tuple(sorted(nodes))

    def at_least(self, value: int) -> None:
        """The relaxation's optimum is proven ``value`` or more (a closure bound over some of its
        steps, or an earlier solve: cuts and ``below`` only add constraints). Stated, it spares
        the next solve that proof (RL250 at 70%: 9 rounds' relaxations in 16.9 s, not 26.2 s)."""
        self.m.Add(self.objective >= int(value))
