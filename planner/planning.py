"""One entry point for every strategy: ``solve(problem, budget, strategy, options) -> SolveResult``.

cpsat: baselines first (no remat, Chen, greedy); if no remat fits, done. Otherwise the CP-SAT
model is hinted with the cheapest baseline that fits; if none fits (or only plans computing a
node more than ``hint_computations`` times, kept as fallback and phase-2 hint), phase 1 minimises the peak
from the lowest plan the greedy reaches (its budget bisected) and stops at the first plan within
budget (or proves that its model holds none: then it searches again with more computations per
node allowed, up to ``grown_computations``). Phase 2 minimises added time. The result is never worse than a
fitting baseline, and its plan has passed simulate() against the budget. Problems above
``coarsen_above`` nodes are solved fused first (planner/coarsen.py). Where a memory-aware node
order (planner/reorder.py) lowers the unplanned peak by ``reorder_min_gain``, cpsat solves in
that order first (``reorder_share`` of the time), then in the given order, and keeps the cheaper;
where a baseline fits in the given order and none in that one, only the given order is searched.
Where no order is that much lower, the other order is the given one with its weight gradients
made late (planner.reorder.sinks_late).
Below the given order's floor, a plan in the memory-aware order is compared with the last resort of
a solve without one (:func:`_walked_beside`), which a slightly lower budget takes. Where that
order's floor is over the budget too, the given order with a few weight gradients made later
(planner.reorder.repaired_order) is searched instead, in ``REPAIR_SHARE`` of the time, and the
last resort gets the rest (zoo:cnn at 68%, ``--time-limit 10 --deterministic``: +25.72% in the
walk's order -> +14.71%, proven the least in the repaired order).
Budgets near the least peak any order may reach (``early_walk_within``) get the depth-first walk
over every order and the beams first (planner/pebble.py): their polished plan stands unless the
solve finds a cheaper one, and where the walk visits every state without one the solve is
infeasible at once. A problem that can swap gets the whole recompute-only solve first, in
``recompute_first_share`` of the time, then the swap solve hinted with its plan; the cheaper
plan wins (:func:`_swap_after_recompute`).

Baselines (none, chen, greedy) return their own plan, with status "over_budget" when it does
not fit. Budgets below :attr:`PlanningProblem.memory_floor` (the most one step needs, or the
last-input bound of planner.problem.last_input_bound) are infeasible outright; the least memory
any plan reaches is then computed (exactly on small problems, planner/least.py; else the floor,
with the lowest plan found). The CP-SAT model's proofs cover its own plans only: where it shows
that none of them fits, the solve ends without a plan ("timeout", its note says why), not
"infeasible".
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from planner import clock, cpsat_plans
from planner.baselines import Candidate, baseline
from planner.coarsen import Coarsening, coarsen
from planner.cpsat import OutOfTime, PhaseResult, PlannerOptions, RematModel, objective_costs, recompute_objective
from planner.errors import UsageError
from planner.kept_set import ORDER_EXCESS_SHARE, excess, kept_set_plan
from planner.least import MAX_NODES, MAX_STATES, cheapest_plan, least_plan, least_plan_any_order
from planner.node_lns import node_lns
from planner.order_bound import (INFEASIBLE as CLOSURE_INFEASIBLE, ClosureBound, ClosureCuts, growing_closure_bound,
                                 larger_bound)
from planner.pebble import DepthFirstPlan, DepthFirstSearch, depth_first_plan, fitting, reverse_pebble
from planner.plan import Plan, SolveResult, SolverStats
from planner.polish import polished
from planner.problem import PlanningProblem
from planner.reorder import first_compute_order, last_compute_order, memory_order, permute, plan_in_order, \
    plan_in_original, repaired_order, sinks_late
from planner.simulate import Simulation, simulate
from planner.swap_greedy import swap_greedy
from planner.tight_greedy import long_run
from planner.units import whole_bytes

log = logging.getLogger(__name__)

STRATEGIES = ("cpsat", "greedy", "chen", "none")
BASELINES = ("none", "chen", "greedy")
# How the note of a solve that ran out of time begins.
TIMED_OUT = "no plan within the budget found (time limit"
# Share of the time limit the last resorts' plans get polished in (planner/polish.py), where their
# search leaves less of its window.
POLISH_SHARE = 0.05
# Share of the time limit the kept-set search (planner/kept_set.py) gets where every other last
# resort found no plan and less of their window is left (RL1000 at 50%: found in 7,400-7,700 flips,
# 7-17 wall s on the 2-core machine at load 7).
KEPT_SHARE = 0.25
# Least seconds of search worth building a CP-SAT model for, beyond its build time.
MIN_SEARCH_S = 0.5
# Where the CP-SAT model, grown as far as it goes, holds no plan within the budget, the exact search
# for the cheapest plan in the given order (planner/least.py) runs on problems up to this many
# nodes, past its MAX_NODES, within NO_FIT_EXACT_STATES (about 1.25 s), where the solve has no plan
# otherwise. Fuzzed multi-output seed 18 (38 nodes) at 998 bytes, --time-limit 3: the model
# (each node computed up to 12 times) held none; the search found one at 972 bytes in 30-100 k states.
NO_FIT_EXACT_NODES = 40
#: ... and up to this many states (half the search's own cap): seed 18 reached 81.5 k, and where no
#: plan exists the search runs to its cap after the limit (test_pebble.py's 30-node beams_dead_end
#: at 108 bytes: 200 k states, 6.5 s on a loaded machine).
NO_FIT_EXACT_STATES = 100_000


class _Pace:
    """How long building (and hinting) a CP-SAT model took in this solve, so that no model is
    built when the time left would not cover building it and searching it for a while. Before,
    `--time-limit 20` on RL1000 with a host link took 25 s: four models were built for searches
    of 0.01-0.05 s each. Also whether the last resorts ran before the solve (``resorts_ran``)."""

    def __init__(self) -> None:
        self.model_s = 0.0
        # the last resorts ran before the solve (:func:`_resorts_first`): where the solve still
        # ends without a plan, the rescue after it does not run them again (:func:`_rescue`)
        self.resorts_ran = False

    def built(self, since: float) -> None:
        self.model_s = max(self.model_s, clock.now() - since)

    def room(self, left: float) -> bool:
        return left >= self.model_s + MIN_SEARCH_S


def plan_strategy(problem: PlanningProblem, budget: int, strategy: str) -> str:
    """The strategy ``memplan plan`` (and its --sweep) solves a JSON graph with: "none" for a
    baseline at a budget the graph fits as it is (at or above its unplanned peak), which returns
    the graph unplanned; ``strategy`` otherwise. Chen's checkpoints ignore the budget: at 100% of
    random_layered_n100 its plan peaked at 69089 bytes, over the 46319 the graph peaks at unplanned,
    and at 150% it added 182% of the compute time. passes.plan_model.plan_graph does the same for
    ONNX models. :func:`solve` itself runs the named baseline (``memplan bench remat`` compares them)."""
    return "none" if strategy in ("greedy", "chen") and budget >= problem.unplanned_peak else strategy


def solve(problem: PlanningProblem, budget: int, strategy: str = "cpsat", options: PlannerOptions | None = None,
          start: SolveResult | None = None) -> SolveResult:
    """Plan ``problem`` under ``budget`` bytes (base included) with ``strategy``.

    ``start``: the result of a solve of ``problem`` at a higher target whose plan peaks over
    ``budget`` (passes.plan_model re-solves tighter where a plan's rewrite overshoots): cpsat
    searches the node order that plan computes nodes first in as the memory-aware one, its phase 1
    starting from that plan. Fuzzed seed 63 at 20891 bytes (``--time-limit 3 --deterministic``):
    the re-solve at 20619 bytes found nothing in the orders it searched, and the reverse walk's
    plan, +284.79%, stood, where the plan before it (+36.8%, 245 bytes over) was found in an order
    that holds one at +44.0% within the tighter target."""
    budget = whole_bytes(budget)
    options = options or PlannerOptions()
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if options.proven_share < 1 and budget < problem.order_free_floor:
        # infeasible in every order already: the search would only lower the lowest plan found
        options = replace(options, time_limit=options.proven_share * options.time_limit, proven_share=1.0)
    if options.work_limit and not clock.on_work_clock():
        with clock.work_clock(options.wall_deadline):
            res = solve(problem, budget, strategy, options, start)
            return _wall_capped(res) if clock.capped() else res
    t0 = clock.now()
    if strategy != "cpsat":
        return _baseline_result(problem, budget, strategy, options, t0)
    if _recompute_first(problem, budget, options):
        return _whole_limit_told(_swap_after_recompute(problem, budget, options, t0), options.time_limit)
    return _whole_limit_told(_solve_from(problem, budget, options, t0, start=start), options.time_limit)


def _whole_limit_told(res: SolveResult, seconds: float) -> SolveResult:
    """``res`` with a timeout note naming the solve's whole time limit, ``seconds``: an inner
    search that ran out names its own share of it. bit (BiT) at 72%, ``--time-limit 30``: "no plan
    within the budget found (time limit 1.27 s)", the time its last search, in the parts-aware
    model, had left."""
    if res.status != "timeout" or not res.note.startswith(TIMED_OUT):
        return res
    return replace(res, note=_timeout_note_text(seconds) + res.note.split(")", 1)[1])


def _solve_from(problem: PlanningProblem, budget: int, options: PlannerOptions, t0: float,
                seed: SolveResult | None = None, start: SolveResult | None = None) -> SolveResult:
    """:func:`solve` with strategy cpsat, from the fused solve on. ``seed``: the recompute-only
    pipeline's result for this (swap) problem (:func:`_swap_after_recompute`), whose plan hints
    the swap model in the node order it computes nodes first in; that order is searched as the
    memory-aware one where the recompute-only solve found its plan in one. ``start``: see
    :func:`solve` (its plan starts phase 1 in the order it computes nodes first in)."""
    pace = _Pace()  # the fused problem's model builds count for the unfused one's (it is larger)
    if problem.n > options.coarsen_above and problem.memory_floor <= budget < problem.unplanned_peak:
        c = coarsen(problem)
        # below the fused problem's own floor it has no plan, and proving its least would take
        # the time the unfused problem needs
        if c.coarse.n < problem.n and c.coarse.memory_floor <= budget:
            res = _solve_coarse(c, budget, options, t0, pace)
            if res.plan is not None:
                return _told_kept_set(problem, res)
            # the fused problem over-counts a little; what it cannot fit, the real one may
    early = _early_walk(problem, budget, options) if options.reorder else None
    if early is not None and early.exhausted:  # every state visited: no plan fits
        stats = SolverStats(seed=options.seed, workers=options.workers, clock=_clock_name(options))
        res = _walked_through(problem, _empty(problem, budget, "cpsat", status="timeout", solver=stats),
                              depth_first_plan(problem, budget + 1, clock.now() + _early_window(options)).found)
        return replace(res, solver=replace(res.solver, wall_s=clock.wall_since(t0)))
    found, label = None, None
    hint = seed.plan if seed is not None else None
    if hint is None and start is not None and start.plan is not None and \
            simulate(problem, start.plan).peak_bytes > budget:
        hint = start.plan  # over the budget: a start for phase 1, never a plan returned as it is
    else:
        start = None
    if options.reorder and problem.n <= options.coarsen_above and budget < problem.unplanned_peak:
        work = options.reorder_work_per_s * options.time_limit
        if hint is not None and seed is not None and seed.order.startswith("memory-aware:") and \
                len(first_compute_order(hint)) == problem.n:
            # the order the recompute-only plan was found in (computed again with this solve's
            # share of the time, memory_order's work cap may end elsewhere): the hint maps there
            found = (first_compute_order(hint), seed.order.split(":", 1)[1])
        elif start is not None and len(order := first_compute_order(hint)) == problem.n and \
                order != list(range(problem.n)):
            # the order the plan before this re-solve was found in: it holds a plan just over this
            # budget, where memory_order's and the given one may hold none (seed 63, see solve())
            found, label = (order, "previous-plan"), start.order
        else:
            found = memory_order(problem, options.reorder_min_gain, budget, work)
        if found is None and problem.order_free_floor <= budget < problem.memory_floor:
            # no plan in the given order fits; another order's may, however little lower its peak
            found = memory_order(problem, -math.inf, budget, work)
        if found is None and (late := sinks_late(problem)) is not None:
            # no lower order: the given one with its weight gradients made late (same unplanned
            # peak, but plans may then recompute what the given order held as pinned bytes)
            found = (late, "sinks-late")
    res = _repaired(problem, budget, options, t0, found) if seed is None and start is None else None
    repaired = res is not None
    if res is None:
        res = (_solve_reordered(problem, budget, options, t0, *found, hint=hint, label=label, pace=pace)
               if found is not None
               else _solve_cpsat(problem, budget, options, t0, pace=pace, hint=hint))
    res = _told_kept_set(problem, res)
    walked = Candidate(*early.found) if early is not None and early.found is not None else None
    if walked is not None and (res.plan is None or walked.sim.added_time < res.added_time):
        # what the solve left of its limit (it ends early where it proves its orders hold no plan)
        res = _in_plan_order(problem, _walked_first(problem, res, walked, options), walked, options,
                             t0 + options.time_limit)
    elif not options.reorder:  # its claims cover the given order only, and say so
        if res.plan is None and res.status == "timeout" and \
                (rescued := _rescue(problem, res, options, False, t0 + options.time_limit, pace=pace)):
            res = rescued
        elif res.least_bytes is not None:
            res = replace(res, least_order="given")
    elif res.plan is not None and res.added_time > 0 and not problem.can_swap and \
            problem.order_free_floor <= budget < problem.memory_floor:
        res = _walked_beside(problem, res, options, t0 + options.time_limit if repaired else -math.inf)
    else:
        res = _any_order(problem, res, options, t0 + options.time_limit,
                         early.search if early is not None else None, pace)
    # the whole solve's time, last resorts included
    return replace(res, solver=replace(res.solver, wall_s=clock.wall_since(t0)))


#: The share of the time limit the repaired order (planner.reorder.repaired_order) is searched in,
#: before the reverse walk's path gets the rest.
REPAIR_SHARE = 0.25


def _repaired(problem: PlanningProblem, budget: int, options: PlannerOptions, t0: float,
              found: tuple[list[int], str] | None) -> SolveResult | None:
    """For :func:`_solve_from`: a plan in the given order with the weight gradients that put
    steps over the budget made later (planner.reorder.repaired_order), searched in
    ``REPAIR_SHARE`` of the time, where the budget lies under the given order's floor and over
    the order-free one, and the floor of ``found`` (the other order the solve would search) is
    over it too; None where it does not apply or that search finds no plan (the solve then goes
    on as without it: its claims are those orders'). The caller leaves it out of re-solves after
    an overshoot (:func:`solve`'s ``start``) and of solves from a recompute-only plan: there the
    repaired order's plans, lower than the walk's, narrowed the arena's bisection (zoo:cnn at 85%
    --ort-arena same-as-requested: a +14.71% plan overshot the arena and no plan was returned,
    where the walk's +26.93% fit)."""
    if not options.reorder or problem.n > options.coarsen_above or \
            not problem.order_free_floor <= budget < problem.memory_floor or \
            (found is not None and permute(problem, found[0]).memory_floor <= budget):
        return None
    order = repaired_order(problem, budget)
    if order is None:
        return None
    res = _solve_reordered(problem, budget, replace(options, time_limit=REPAIR_SHARE * options.time_limit), t0,
                           order, "repaired")
    return res if res.plan is not None else None


def _recompute_first(problem: PlanningProblem, budget: int, options: PlannerOptions) -> bool:
    """Does :func:`solve` run the recompute-only pipeline before the swap solve
    (:func:`_swap_after_recompute`)? A problem that can swap, at a budget below its unplanned
    peak and not below its floor (where no plan fits, and the recompute-only solve would spend
    its share proving its least peak)."""
    return problem.can_swap and options.recompute_first_share > 0 and \
        problem.memory_floor <= budget < problem.unplanned_peak


def _swap_after_recompute(problem: PlanningProblem, budget: int, options: PlannerOptions, t0: float) -> SolveResult:
    """The whole recompute-only solve (:func:`solve` on ``problem.without_swap()``: its node
    orders, closure bounds and early proofs) in ``recompute_first_share`` of the time limit, then
    the swap solve in the rest, hinted with that plan in the node order it computes nodes first
    in (that order searched first); the cheaper plan wins. A recompute-only plan is a swap plan
    too, so allowing swaps never returns a dearer plan than ``plan`` without swapping given that
    share of the time. Before, the recompute-only model ran inside each order's swap solve, with
    40% of that order's time and none of the bounds of a recompute-only solve: RL100 at 70%,
    ``--time-limit 5 --deterministic``: +2.227% recompute only, +4.771% with a host link (nothing
    swapped). The swap solves skip their own recompute-only subsolve."""
    moved = swap_greedy(problem, budget)
    if moved is not None:
        sim = simulate(problem, moved)
        if sim.peak_bytes <= budget and sim.added_time <= 0:
            # every copy hidden behind compute (copy_overlap; in line a copy always adds its time):
            # nothing is cheaper, no solve needed (zoo:gpt at 75% when ONNX models were priced so)
            return _adds_nothing(problem, budget, Candidate(moved, sim), options, t0,
                                 "the swap-greedy plan adds no time")
    share = options.recompute_first_share
    rec = solve(problem.without_swap(), budget, "cpsat", replace(options, time_limit=share * options.time_limit))
    seed = None
    if rec.plan is not None:
        sim = simulate(problem, rec.plan)  # no swaps: the same plan on the swap problem
        if sim.peak_bytes <= budget:
            seed = (rec, sim)
        else:  # a bug: the recompute-only solve returns plans within the budget
            log.warning("the recompute-only plan of %s peaks at %d bytes over the swap problem's budget %d; ignored",
                        problem.name, sim.peak_bytes, budget)
    if seed is not None and seed[1].added_time <= 0:  # nothing is cheaper
        return _recompute_won(problem, rec, seed[1], None, t0)
    rest = max(options.least_search_s, options.time_limit - (clock.now() - t0))
    res = _solve_from(problem, budget, replace(options, time_limit=rest, recompute_first_share=0.0), clock.now(),
                      seed[0] if seed is not None else None)
    if seed is None or (res.plan is not None and res.added_time <= seed[1].added_time):
        return replace(res, solver=replace(res.solver, wall_s=clock.wall_since(t0),
                                           phases=rec.solver.phases + res.solver.phases))
    return _recompute_won(problem, rec, seed[1], res, t0)


def _recompute_won(problem: PlanningProblem, rec: SolveResult, sim: Simulation, res: SolveResult | None,
                   t0: float) -> SolveResult:
    """The recompute-only solve's result ``rec`` (its plan simulated on the swap ``problem``:
    ``sim``) as the swap solve's, where the swap solve (``res``; None: it did not run, nothing
    being cheaper than a plan that adds no time) found no cheaper plan."""
    added = sim.added_time
    if res is None:
        return replace(rec, peak_bytes=sim.peak_bytes, added_time=added,
                       solver=replace(rec.solver, wall_s=clock.wall_since(t0)))
    # its optimality is over recompute-only plans; the swap solve's bound, where it is for the same
    # order, holds over that order's swap plans, this one among them
    bound = res.solver.bound if res.plan is not None and res.order == rec.order else None
    if bound is not None and bound > added:
        bound = None
    gap = None if bound is None else (0.0 if added <= 0 else max(0.0, (added - bound) / added))
    how = ("the recompute-only solve's plan, no swaps: the swap solve found "
           + ("none" if res.plan is None else f"a dearer one (+{res.added_time:.6g} added time)"))
    note = f"{rec.note}; {how}" if rec.note else how
    return replace(rec, status="optimal" if gap == 0.0 else "feasible", peak_bytes=sim.peak_bytes, added_time=added,
                   unplanned_peak_bytes=problem.unplanned_peak, note=note,
                   solver=replace(rec.solver, bound=bound, gap=gap, wall_s=clock.wall_since(t0),
                                  phases=rec.solver.phases + res.solver.phases))


def _wall_capped(res: SolveResult) -> SolveResult:
    """``res`` of a solve that its work clock's wall deadline cut short, saying so."""
    said = ("--wall-cap stopped the solve before its --time-limit of deterministic seconds, so another "
            "machine may return another plan (raise --wall-cap, or drop it)")
    log.warning("%s", said)
    return replace(res, note=f"{res.note}; {said}" if res.note else said,
                   solver=replace(res.solver, wall_capped=True))


def _any_order(problem: PlanningProblem, res: SolveResult, options: PlannerOptions, end: float,
               search: DepthFirstSearch | None = None, pace: _Pace | None = None) -> SolveResult:
    """``res`` with an infeasible claim lowered to what plans in every node order may reach
    (:attr:`PlanningProblem.order_free_floor`): the solve searched the given order and perhaps
    one memory-aware order, and its least holds over those orders' plans only. Small problems
    get the exact search over every order instead. Where the lowered claim is within the budget,
    the solve has no plan and no proof: "timeout", with a note that says so. Before that, the
    reverse walk over every order (planner/pebble.py) looks for a plan within the budget; and
    where the claim is that floor, for a plan at it (then the floor is the exact least). ``end``:
    when the solve's own time limit runs out (:func:`_rescue`, which goes on with ``search``, the
    early depth-first walk its window cut short, and ``pace``, the solve's)."""
    low = problem.order_free_floor
    # the last resorts' quarter of the limit past its end, the walk's and the exact search's together
    late = max(end, clock.now() + 0.25 * options.time_limit)
    if res.plan is None and res.status == "timeout" and low <= res.budget_bytes:
        if plan := _rescue(problem, res, options, True, end, search, pace):
            return plan
        # the walk counts each output as one buffer; the exact search over every order's plans
        # frees parts apart as the run does (bench/claims_fuzz.py: 27 of 854 budgets a plan
        # fits, each only so and only in another order, ended here without one)
        exact = least_plan_any_order(problem, deadline=late)
        if exact is not None and exact[0] <= res.budget_bytes:
            least = Candidate(exact[1], simulate(problem, exact[1], res.budget_bytes))
            return _exact_found(problem, res, least, f"the least peak, {exact[0]} bytes", options, end)
    if res.status != "infeasible" or res.least_bytes is None:
        return res
    # below the constant base the floor is said at once (test_planner.py), without any search
    searching = problem.runtime_exact and res.budget_bytes >= problem.base_bytes
    if res.least_bytes <= low:  # the claim is the floor already: exact where a plan reaches it
        if res.least_exact or not searching or _walk(problem, low, options, first=True) is None:
            return res
        return replace(res, least_exact=True, best_bytes=None,
                       note=f"the least memory any plan reaches is {low} bytes (a plan reaches the floor: "
                            f"planner/pebble.py)")
    # not below the constant base, where no plan fits and the claim is said at once; within the
    # solve's limit or a quarter of it after (200 k states took 24 s on a fuzzed 19-node model)
    deadline = max(end, clock.now() + 0.25 * options.time_limit)
    exact = least_plan_any_order(problem, deadline=deadline) if problem.runtime_exact and searching else None
    if not problem.runtime_exact and res.budget_bytes >= problem.base_bytes:
        counted = _runtime_least(problem, res, options, end, deadline)
        if counted is not None:
            return counted
    if exact is None and low <= res.budget_bytes and (plan := _rescue(problem, res, options, True, end, search, pace)):
        return plan  # past the exact search: the walk only (the solver's claim rules the long run out)
    if exact is None and searching and res.budget_bytes < low:
        at_floor = _walk(problem, low, options, first=True)
        if at_floor is not None:  # a plan reaches the floor: nothing lower is possible
            exact = (at_floor.sim.peak_bytes, at_floor.plan)
    if exact is not None and exact[0] <= res.budget_bytes:  # a plan in another order fits
        least = Candidate(exact[1], simulate(problem, exact[1], res.budget_bytes))
        # that plan's peak is least, not its cost
        return _exact_found(problem, res, least, f"the least peak, {exact[0]} bytes", options, end)
    if exact is not None:
        return replace(res, least_bytes=exact[0], least_exact=True, best_bytes=None,
                       note=f"the least memory any plan in any node order reaches is {exact[0]} bytes")
    found = _lowest_found(res)
    if low <= res.budget_bytes:
        # no plan fits in the orders searched, which proves nothing for the others: like a model
        # that holds no fitting plan, the solve ends without one ("timeout"), not "infeasible"
        best = "" if found is None else f"; the lowest plan found peaks at {found} bytes"
        return replace(res, status="timeout", least_bytes=None, least_exact=False, best_bytes=found,
                       note=f"no plan within the budget found: none in the node orders searched (they reach no "
                            f"lower than {res.least_bytes} bytes); the others were not searched (no plan in any "
                            f"order reaches below {low} bytes){best}")
    best = "" if found is None else f" (best plan found: {found} bytes)"
    return replace(res, least_bytes=low, least_exact=False, best_bytes=found,
                   note=f"the least memory any plan reaches is at least {low} bytes{best}; the node orders "
                        f"searched reach no lower than {res.least_bytes} bytes")


def _solve_reordered(problem: PlanningProblem, budget: int, options: PlannerOptions, t0: float,
                     order: list[int], rule: str, hint: Plan | None = None, label: str | None = None,
                     pace: _Pace | None = None) -> SolveResult:
    """Solve in ``order`` with a share of the time, then in the given order with the rest; the
    cheaper plan wins. When the given order's closure bound shows that no plan in it is cheaper
    than the one phase 2 found in ``order``, ``order`` keeps the whole time (RL250 at 70%: the
    same +2.08% plan, gap 41.17% -> 18.31%, where the solve used to return after 37.6 s of 60;
    13.71% with the growing closure bound). Without a plan either way, the given order's result
    stands (its status and least memory are the claims memplan makes about the graph as given).
    Where a baseline fits in the given order and none in ``order``, the given order alone gets
    the time (RL100 at 60%); where ``order``'s plan fits and no baseline does in the given order,
    ``order`` gets the given order's time too, from when its phase 2 first stops (zoo:gpt at 70%);
    below the given order's floor, ``order`` gets it all (the resnet
    fixture at 60%: its bound and the given order's infeasible solve took 14 of the 60 s).
    ``hint``: a recompute-only plan of ``problem`` (:func:`_solve_cpsat`), offered to both solves
    (it hints the one whose order it computes nodes first in). ``label``: where ``order`` is that
    of a plan of an earlier solve (:func:`solve`'s ``start``), the order that solve said it took.
    ``pace``: the caller's (:class:`_Pace`)."""
    q = permute(problem, order)
    q_hint = plan_in_order(hint, order) if hint is not None else None
    # The given order's baselines only where they decide something before its own solve (on
    # RL1000 the greedy alone takes 10-35 s): whether a baseline fits in it where none fits in the
    # memory-aware order (below), or where that order's plan leaves its phase 2 unproven and the
    # closure bound does not rule the given order out (given_unfit). Elsewhere its solve runs them, in its own time, when it is
    # searched at all: RL250 at 70%, where the closure bound rules the given order out, spent 2.5-4.2 s
    # of 60 on its greedy that found nothing.
    def left() -> float:
        """Seconds of the whole limit not spent yet."""
        return max(0.0, options.time_limit - (clock.now() - t0))

    def stamped(res: SolveResult, **changes) -> SolveResult:
        """``res`` as this solve's result: its wall time is the whole solve's."""
        return replace(res, solver=replace(res.solver, wall_s=clock.wall_since(t0)), **changes)

    # Neither below the floor: no baseline fits there, and the solves below say infeasible at once.
    plannable = budget >= problem.memory_floor
    pace = pace or _Pace()
    q_cands = _baselines(q, budget, clock.now() + options.baseline_share * options.reorder_share * left(),
                         options.baseline_work_floor) \
        if plannable else None
    if plannable and not problem.can_swap and not _fits(q_cands, budget):
        spend = options.baseline_share * (1 - options.reorder_share) * options.time_limit
        cands = _resorts_first(problem, budget, options,
                               _baselines(problem, budget, clock.now() + spend, options.baseline_work_floor), pace,
                               order)
        if _fits(cands, budget):
            # A baseline fits in the given order and none in the memory-aware one: that order is
            # the harder one here, and its share of the time only delays the given order's search.
            # RL100 at 60% on a 2-core machine twice slower than the one of the figures above: the
            # memory-aware order found no plan in its 30 s, and the given order's phase 1 found its
            # first plan after 26-29 s of its 30, leaving phase 2 1.6-3 s (+46%, or the greedy's +385%).
            given = _solve_cpsat(problem, budget, replace(options, time_limit=left()), clock.now(), cands, pace)
            where = f"the memory-aware order (from {rule!r})"
            return stamped(given, note=f"{given.note}; {_no_baseline(q_cands, where)}: planned in the given "
                                       f"order only".strip("; "))
    else:
        cands = None  # the given order's solve runs them, if it comes to that
    # below the given order's floor no plan in it fits: the memory-aware order gets the whole time
    share = options.reorder_share * left() if plannable else left()
    cost, _ = objective_costs(problem.cost)  # q's units too: the same costs, permuted

    solved: list[ClosureBound | None] = []

    def given_order_bound(objective: int) -> ClosureBound | None:
        """The given order's closure bound, solved once, when first asked, searching only under
        that first ``objective`` (later ones, of cheaper plans, are no higher)."""
        if not solved:
            solved.append(_given_order_closure(problem, budget, options, cost, objective))
        return solved[0]

    unfit: list[bool] = []  # [True] once the given order's baselines ran and none fits

    def given_unfit() -> bool:
        """Does no baseline fit in the given order? Asked only where ``order`` has a plan: then
        ``order`` is the only one with a fitting plan so far. Its baselines run once, in the share
        they get where no baseline fits in ``order`` (above: on RL1000 the greedy alone takes
        10-35 s), and are kept for the given order's solve. A greedy they cut short counts as one that
        found nothing (the given order has no plan to start from either way); the note says which."""
        nonlocal cands
        if not unfit:
            if cands is None:
                spend = options.baseline_share * (1 - options.reorder_share) * options.time_limit
                cands = _baselines(problem, budget, clock.now() + spend, options.baseline_work_floor)
            unfit.append(not _fits(cands, budget))
        return unfit[0]

    def given_loses(objective: int) -> float | None:
        """When no plan in the given order can be cheaper than one of ``objective`` in ``order``,
        or no baseline fits in the given order (where ``order``'s plan does), the time kept for
        searching the given order goes to ``order``: the whole limit's end. zoo:gpt at 70% (the
        sinks-late order's greedy fits, no plan of the given order does), ``--time-limit 10
        --deterministic --workers 1``: +16.68% before, where the given order's half found
        nothing, +11.41% now (the plan 30 s gave before)."""
        if not plannable:  # ``order`` has the whole limit already
            return None
        if _loses(given_order_bound(objective), objective) or given_unfit():
            return t0 + options.time_limit
        return None

    first = _solve_cpsat(q, budget, replace(options, time_limit=share), clock.now(), q_cands, pace=pace,
                         extend=given_loses, hint=q_hint)
    moved, known = None, None
    if first.plan is not None:
        plan = plan_in_original(first.plan, order)
        sim = simulate(problem, plan, budget)  # over budget here is a bug: it raises
        how = (f"nodes in the order of the plan a solve at a higher target found ({label}; unplanned peak "
               f"{q.unplanned_peak} bytes)" if label is not None
               else f"nodes in a memory-aware order (from {rule!r}; unplanned peak {q.unplanned_peak} bytes)")
        moved = replace(first, plan=plan, peak_bytes=sim.peak_bytes, added_time=sim.added_time,
                        unplanned_peak_bytes=problem.unplanned_peak, order=label or f"memory-aware:{rule}",
                        note=f"{first.note}; {how}; bound and gap are for that order".strip("; "))
        if sim.added_time <= 0:
            return moved
        if not plannable:
            return stamped(moved, note=f"{moved.note}; no plan in the given order fits (its floor is "
                                       f"{problem.memory_floor} bytes)")
        objective = recompute_objective(cost, sim.compute_counts)
        known = given_order_bound(objective)
        if _loses(known, objective):
            return stamped(moved, note=f"{moved.note}; no plan in the given order is cheaper (its recompute-closure "
                                       f"bound)")
        if unfit and unfit[0] and not pace.room(left()):  # ``order`` took the given order's time
            return stamped(moved, note=f"{moved.note}; {_no_baseline(cands, 'the given order')}: its time went "
                                       f"to the memory-aware order")
    rest = left()
    if moved is not None and not pace.room(rest):  # no time left to search the given order
        return stamped(_given_baseline_if_cheaper(problem, budget, moved, cands, options))
    other = first.least_bytes if first.status == "infeasible" and first.least_bytes is not None else q.memory_floor
    if not plannable and moved is None and other < problem.memory_floor:
        # no plan in the given order fits (its floor), and the least said below is ``order``'s,
        # lower: its solve would spend the time it gets (at least a second) proving its own least
        # peak for nothing (fuzzed seed 58 at 90637 bytes, --time-limit 3: 0.5 s of 3)
        given = _infeasible(problem, budget, options, clock.now(), [], least=(problem.memory_floor, None, False))
    else:
        given = _solve_cpsat(problem, budget, replace(options, time_limit=max(rest, options.least_search_s)),
                             clock.now(), cands, pace, known, hint=hint)
    if moved is None or (given.plan is not None and given.added_time <= moved.added_time):
        if given.status == "infeasible" and given.least_bytes is not None:
            given = _least_over_both(given, first, q)
            if given.least_bytes <= budget:
                # ``order`` may hold a plan within the budget (its floor): its search found none in
                # time, which proves nothing. Fuzzed seed 58 at 90637 bytes: "infeasible", least
                # 90104 bytes (that order's floor), and the rescue's note "none in the node orders
                # searched fit (they reach no lower than 90104 bytes)" beside the walk's plan; seed
                # 63 re-solved from the plan before, one worker: "infeasible" at 20619, least 19200
                given = replace(given, status="timeout", least_bytes=None, least_exact=False,
                                note=_timeout_note(problem, options.time_limit, None))
        if given.status == "timeout":  # no plan in either order
            best = min((r.best_bytes for r in (given, first) if r.best_bytes is not None), default=None)
            # the whole time was spent, unless the given order's model proved it holds no plan
            note = _timeout_note(problem, options.time_limit, best) if given.note.startswith(TIMED_OUT) else given.note
            given = replace(given, best_bytes=best, note=note)
        return stamped(given)
    return stamped(moved)


def _given_baseline_if_cheaper(problem: PlanningProblem, budget: int, moved: SolveResult,
                               cands: dict[str, Candidate] | None, options: PlannerOptions) -> SolveResult:
    """``moved`` (the memory-aware order's plan, where no time is left to search the given order)
    or, where cheaper, the cheapest baseline plan in the given order that fits (``cands``: its
    baselines where the caller ran them; else run here, within the share of the limit the
    baselines get). Returned unsearched, the given order's greedy was never compared: zoo:unet at
    60%, ``--time-limit 0.3 --deterministic``: +14.394% in the memory-aware order, where
    ``--strategy greedy`` gives +13.919%."""
    if cands is None:
        cands = _baselines(problem, budget, clock.now() + options.baseline_share * options.time_limit,
                           options.baseline_work_floor)
    fitting = [c for c in cands.values() if c.sim.peak_bytes <= budget]
    best = min(fitting, key=lambda c: (c.sim.added_time, c.plan.strategy), default=None)
    if best is None or best.sim.added_time >= moved.added_time:
        return moved
    sim = simulate(problem, best.plan, budget)  # over budget here is a bug: it raises
    note = (f"no time left to search; kept the {best.plan.strategy} plan in the given order: the plan in the "
            f"{moved.order} order was dearer (+{moved.added_time:.6g} added time)")
    return replace(moved, status="feasible", plan=replace(best.plan, strategy="cpsat"), peak_bytes=sim.peak_bytes,
                   added_time=sim.added_time, order="given", note=note,
                   solver=replace(moved.solver, bound=None, gap=None))


#: Phase 1 searches again from its best solution while it has neither a plan within the budget nor
#: a proof, and this many seconds of its share are left (at most FEASIBILITY_RUNS runs in all).
#: CP-SAT's interleaved search stops before its limit when its next batch would not fit in it:
#: zoo:gpt at 68% with --time-limit 20 ended phase 1 after 9.3 of its 18 s, and the solve after 10.6.
FEASIBILITY_AGAIN_S, FEASIBILITY_RUNS = 1.0, 4


def _feasibility(m1: RematModel, target: int, span: Callable[[], float], phases: list[PhaseResult]) -> PhaseResult:
    """Phase 1 (min peak, stopping at ``target`` capacity units) in ``span()`` seconds, run again
    while time is left and it has found nothing within the target (see
    FEASIBILITY_AGAIN_S). Each run goes into ``phases``; the result is the best run's, with the
    strongest bound of all; each run after the first starts from the best one before it, with
    the next seed."""
    runs: list[PhaseResult] = []
    while True:
        # each run with a seed of its own: a run with nothing to start from would repeat the last
        r = m1.solve("feasibility", span(), stop_at=target, seed=m1.opt.seed + len(runs))
        phases.append(r)
        runs.append(r)
        solved = [x for x in runs if x.objective is not None]  # those have values too
        best = min(solved, key=lambda x: (x.objective, x.status != "OPTIMAL")) if solved else r
        done = r.objective is not None and r.objective <= target
        proven = r.status in ("OPTIMAL", "INFEASIBLE") or (r.bound is not None and r.bound > target)
        if done or proven or len(runs) >= FEASIBILITY_RUNS or span() < FEASIBILITY_AGAIN_S:
            return replace(best, bound=max((x.bound for x in runs if x.bound is not None), default=None))
        if best.values is not None:
            m1.apply_hint(best.values)


def _fits(cands: dict[str, Candidate] | None, budget: int) -> bool:
    """Is one of the baselines' plans ``cands`` within ``budget``?"""
    return cands is not None and any(c.sim.peak_bytes <= budget for c in cands.values())


def _no_baseline(cands: _Found, where: str) -> str:
    """What the baselines ``cands`` of the order ``where``, none of them fitting, show: that none
    fits there, or nothing where the greedy was cut short."""
    if cands.complete:
        return f"no baseline fits in {where}"
    return f"no baseline found a plan in {where} before its share of the time ran out (the greedy was cut short)"


def _loses(bound: ClosureBound | None, objective: int) -> bool:
    """Does ``bound`` (an order's closure bound) show that no plan in its order costs less than
    ``objective`` (in the same units)?"""
    return bound is not None and (bound.value == CLOSURE_INFEASIBLE or bound.value >= objective)


def _closure_applies(problem: PlanningProblem, opt: PlannerOptions) -> bool:
    """Does the recompute-closure bound (planner.order_bound) run for ``problem``? Recompute
    only, a share of the time kept for it."""
    return not problem.can_swap and opt.closure_bound_share > 0


def _given_order_closure(problem: PlanningProblem, budget: int, opt: PlannerOptions,
                         cost: np.ndarray, below: int) -> ClosureBound | None:
    """The closure bound of ``problem``'s own order (in ``cost``, the solver's integer units:
    ``objective_costs``), in ``closure_bound_share`` of the time limit,
    before that order is searched: at or above the memory-aware order's plan (of cost
    ``below``), searching it cannot pay. RL100 at 70%: that plan adds 2.23% and the bound is
    4.39% (0.5 s), where searching the given order took the remaining 57 s of a 60 s solve;
    RL250 at 70%: 2.08% against 8.58%. Only solutions under ``below`` are searched: RL250 at 70%
    proves the bound reaches it in 0.8 s, where the bound itself took all of its 6 s."""
    if not _closure_applies(problem, opt):
        return None
    return growing_closure_bound(problem, budget, cost, opt.closure_bound_share * opt.time_limit, opt.seed,
                                 below=int(below))


def _model_bound_note(problem: PlanningProblem, computations: int, best: int | None) -> str:
    """Why a solve that ended before its time limit has no plan: the min-peak model proved that
    none of its plans fits, and plans outside it were not searched."""
    lowest = "" if best is None else f"; the lowest of those peaks at {best} bytes"
    # an ONNX model's problem gives in-place outputs buffers of their own (planner/lowering.py)
    apart = "" if problem.runtime_exact else ", every output in a buffer of its own"
    return (f"no plan within the budget found: none of the plans the solver's model holds (each node computed "
            f"at most {computations} times{apart}) fits, and plans outside it were not searched "
            f"(--max-computations raises that count){lowest}; the least memory any plan reaches is at least "
            f"{problem.memory_floor} bytes")


def _counted_note(problem: PlanningProblem, counted: int) -> str:
    """Why a small problem has no plan when the exact search (planner/least.py) found its least
    peak over the budget in memplan's accounting, which gives in-place outputs buffers of their
    own: ONNX Runtime may reuse those buffers and go lower, which memplan does not plan for."""
    return (f"no plan within the budget found: the least memory any plan reaches with every output in a "
            f"buffer of its own is {counted} bytes (exact search); ONNX Runtime's in-place reuse may go "
            f"lower, which memplan does not plan for; the least memory any plan reaches is at least "
            f"{problem.memory_floor} bytes")


def _timeout_note_text(seconds: float) -> str:
    return f"{TIMED_OUT} {seconds:.3g} s)"


def _timeout_note(problem: PlanningProblem, seconds: float, best: int | None) -> str:
    note = _timeout_note_text(seconds)
    if best is None:
        return note
    # bytes only: an ONNX model's problem counts in-place outputs apart, so a share of its
    # unplanned peak is not one of the model's (the CLI adds that: cli._share_of_unplanned)
    return f"{note}; the lowest plan found peaks at {best} bytes"


def _found_elsewhere(res: SolveResult, found: Candidate, order: str, note: str) -> SolveResult:
    """``res`` with a plan found outside the solver's searches (another order, or a last resort);
    solve() stamps the wall time."""
    return replace(res, status="feasible", plan=replace(found.plan, strategy="cpsat"),
                   peak_bytes=found.sim.peak_bytes, added_time=found.sim.added_time, least_bytes=None,
                   least_exact=False, best_bytes=None, order=order, note=note)


def _rescue(problem: PlanningProblem, res: SolveResult, options: PlannerOptions, walk: bool,
            end: float = -math.inf, search: DepthFirstSearch | None = None,
            pace: _Pace | None = None) -> SolveResult | None:
    """A plan within ``res``'s budget for a solve that ended without one, or None: the cheaper of
    the reverse walk over every node order, with ``walk`` (planner/pebble.py; the caller checked
    the order-free floor allows one), and the tight greedy's long run in the given order
    (planner.tight_greedy.long_run; only after a timeout: where the solver proved the given order
    holds no plan, it has none either; nor below the memory floor, where no plan in it fits). The
    two get up to a quarter of the time limit on top of the solve's: the walk the first half when
    both run (RL100 at 55%: its plan, +695%, where the long run finds none), the long run the rest
    (RL1000 at 55%: its plan, +710%, where the walk finds none in all the time it gets). Where the
    walk's beams and the long run find none, the depth-first walk (complete, but its plans
    recompute without measure) gets what is left of the quarter (all of it after the beams,
    where the long run does not run); where it visits every state without a plan, the solve is
    infeasible (:func:`_walked_through`). Where it finds none either, the kept-set search
    (planner/kept_set.py) gets what is left of the quarter, or :data:`KEPT_SHARE` of the time
    limit where less is left (RL1000 at 50%: only it finds a plan). The plans found are polished
    (planner/polish.py: the recomputes the budget does not need dropped; RL250 at 60%, the
    depth-first walk's plan: +2195% -> +207.8%) in what is left of the quarter, or
    :data:`POLISH_SHARE` of the time limit where less is left. Where the early walk's window cut it
    short (``search``), the walks' plans are then walked for again, as there, in what is left of the
    quarter or ``PlannerOptions.rewalk_share`` of the time limit, whichever is longer
    (:func:`_rewalked`; RL250 at 60%, ``--time-limit 60 --deterministic``: the first walk for again
    charges 12.8 s, where the quarter leaves 11.5; +189.30% -> +108.51%). A walk's plan then hints
    CP-SAT in its own node order (:func:`_in_plan_order`) until ``end`` (the solve's own limit) or the
    quarter's end, whichever is later; where the walk within a budget halfway down to the least peak any order may reach
    finds a plan in another order (:func:`_tighter_walk`), that order is searched first, in half
    that time, and the cheaper plan wins. Where ``end`` has passed, that search has only what the
    walk leaves of the quarter, so the beams stop at their first plan and no tighter walk runs:
    the wider beams after it took the whole quarter and left CP-SAT none (fuzzed seed 58 at 90637
    bytes, ``--time-limit 3 --deterministic``: the walk's +418.77%; its order's search, given the
    rest, +16.48%; a tighter walk there left it too little too)."""
    budget = res.budget_bytes
    deadline = clock.now() + 0.25 * options.time_limit
    # the long run and the kept-set search not again where they ran before the solve (``pace``,
    # :func:`_resorts_first`): RL500 at 50%, --time-limit 60: 30 s past the limit, 18.7 of it theirs
    again = pace is None or not pace.resorts_ran
    greedy = again and res.status == "timeout" and budget >= problem.memory_floor
    found: list[tuple[Candidate, str, str]] = []
    half = 0.125 * options.time_limit if greedy else 0.0
    first = clock.now() >= end  # the search in the walk's order gets the rest of the quarter only
    if walk and (walked := _walk_until(problem, budget, deadline - half, first, depth_first=False)) is not None:
        found.append((walked, "reverse-walk", "the reverse walk over every node order found a plan (planner/pebble.py"))
        if not first and (tight := _tighter_walk(problem, budget, walked, deadline - half)) is not None:
            found.append(tight)
    if greedy and (long := long_run(problem, budget, deadline)) is not None:
        found.append((Candidate(*long), "given", "the tight greedy's long run found a plan in the given node order "
                                                  "(planner/tight_greedy.py"))
    if walk and not found:
        deep = depth_first_plan(problem, budget, deadline, search)  # on from where the early walk stopped
        if deep.found is not None:
            found.append((Candidate(*deep.found), "reverse-walk", "the depth-first walk over every node order found "
                                                                  "a plan (planner/pebble.py"))
        elif deep.exhausted and problem.runtime_exact and not problem.can_swap:
            # none fits; one byte more may (then that is the least), as the time left allows
            return _walked_through(problem, res, depth_first_plan(problem, budget + 1, deadline).found)
    if walk and again and not found:  # RL1000 at 50%: none of the above finds a plan
        kept = _kept_set(problem, budget, max(deadline, clock.now() + KEPT_SHARE * options.time_limit), options.seed)
        if kept is not None:
            found.append((kept, "kept-set", "the kept-set search found a plan (planner/kept_set.py"))
    if not found:
        return None
    # their plans recompute far more than memory requires: polished, in what is left of the
    # window or in a share of the time limit of their own
    until = max(deadline, clock.now() + POLISH_SHARE * options.time_limit)
    # (the long run's keep their first computes: its plan stays one of the given order's)
    found = [(Candidate(*polished(problem, c.plan, c.sim, budget, until, keep_firsts=order == "given")), order, how)
             for c, order, how in found]
    if search is not None:  # the early walk's, its window cut short: its plan walked for again, as there
        rewalk_end = max(deadline, clock.now() + options.rewalk_share * options.time_limit)
        found = [(Candidate(*_rewalked(problem, budget, (c.plan, c.sim), options, rewalk_end))
                  if order == "reverse-walk" else c, order, how) for c, order, how in found]
    cand, order, how = min(found, key=lambda f: f[0].sim.added_time)
    if res.status == "infeasible" and res.least_bytes is not None:
        # its claim is about the orders it searched: "the least any plan reaches" beside this plan misleads
        after = f", after none in the node orders searched fit (they reach no lower than {res.least_bytes} bytes)"
    else:
        after = f", after the solve ended without one: {res.note}" if res.note else ""
    if order != "reverse-walk":
        return _found_elsewhere(res, cand, order, f"{how}; no bound on its added time){after}")
    # CP-SAT in each walk's node order, the tighter walk's first (found after the other), in equal
    # shares of the time; where a share would be too short to search in, the budget's own walk's only
    walks = [(c, how) for c, o, how in reversed(found) if o == "reverse-walk"]
    until = max(end, deadline)
    if (until - clock.now()) / len(walks) < MIN_SEARCH_S:
        walks = walks[-1:]
    outs = []
    for k, (c, how) in enumerate(walks):
        out = _found_elsewhere(res, c, order, f"{how}; no bound on its added time){after}")
        outs.append(_in_plan_order(problem, out, c, options, clock.now() + (until - clock.now()) / (len(walks) - k)))
    return min(outs, key=lambda r: r.added_time)


def _tighter_walk(problem: PlanningProblem, budget: int, walked: Candidate,
                  deadline: float) -> tuple[Candidate, str, str] | None:
    """For :func:`_rescue`: the reverse walk's plan within the budget halfway from the least peak
    any order may reach to ``budget``, with its note; None where that walk finds none, or one in
    the node order of ``walked`` (the walk's within ``budget``). The walk spends the room a budget
    leaves on fewer recomputes, in an order that may leave CP-SAT less to win back, and that order
    was the only one searched, so a larger budget could cost more: zoo:cnn at 68%
    (``--time-limit 10 --deterministic``), +29.38% in its walk's order (that walk's plan +122.9%),
    where at 66% the walk's order (its plan +301.2%) gave +25.72%; the walk within 508720 bytes,
    halfway down from 68%, finds the latter's plan, and CP-SAT proves +25.72% optimal there."""
    tight = (problem.order_free_floor + budget) // 2
    found = _walk_until(problem, tight, deadline, depth_first=False)
    if found is None or first_compute_order(found.plan) == first_compute_order(walked.plan):
        return None
    return found, "reverse-walk", f"the reverse walk over every node order within {tight} bytes found a plan " \
                                  f"(planner/pebble.py"


def _runtime_least(problem: PlanningProblem, res: SolveResult, options: PlannerOptions, end: float,
                   deadline: float) -> SolveResult | None:
    """For :func:`_any_order`, on a small problem whose accounting is not the runtime's
    (``PlanningProblem.runtime_exact`` false: an ONNX model's in-place outputs and the like): the
    exact search over every order's plans in the runtime's accounting (``least_plan_any_order``
    with ``runtime``), whose least bounds the peak of every plan the runtime runs. Below that
    bound, ``res`` is infeasible (the least exact where the search's plan reaches it in the
    problem's accounting too); at or above it, a plan that fits (that search's, or the search's
    in the problem's own accounting). None where a search gives up, or where neither finds a plan
    within the budget above the bound. ``bench/fuzz_e2e.py``'s seed 5 (17 nodes) at 2789 bytes,
    ``--deterministic --time-limit 8``: no verdict before (its floor, 2768 bytes, is within the
    budget), now infeasible, least 2832 (122 k states; at ``--time-limit 3`` the search's deadline
    ends it first, and the solve still ends without a verdict). ``deadline``: the exact searches'
    (:func:`_any_order`'s)."""
    budget = res.budget_bytes
    found = least_plan_any_order(problem, deadline=deadline, runtime=True)
    if found is None:
        return None
    # both bound the runtime's peak; where kept_bytes and read_bytes differ, the search counts a
    # pinned output's bytes with only those that stay, and the floor may be higher
    bound, plan = max(found[0], problem.order_free_floor), found[1]
    peak = simulate(problem, plan).peak_bytes  # the problem's accounting: at least the bound
    if budget < bound:
        exact = peak == bound
        lowest = min(p for p in (peak, _lowest_found(res)) if p is not None)
        best = "" if exact else f" (best plan found: {lowest} bytes)"
        return replace(res, least_bytes=bound, least_exact=exact, best_bytes=None if exact else lowest,
                       note=f"the least memory any plan in any node order reaches is {'' if exact else 'at least '}"
                            f"{bound} bytes{best}: the exact search over every order's plans, with ONNX Runtime's "
                            f"in-place outputs counted as sharing their input's buffer (planner/least.py)")
    if peak > budget:
        counted = least_plan_any_order(problem, deadline=deadline)
        if counted is None or counted[0] > budget:
            return None
        plan = counted[1]
    least = Candidate(plan, simulate(problem, plan, budget))
    return _exact_found(problem, res, least, f"one at {least.sim.peak_bytes} bytes", options, end)


def _exact_found(problem: PlanningProblem, res: SolveResult, least: Candidate, found: str, options: PlannerOptions,
                 end: float) -> SolveResult:
    """``res`` with ``least``, a plan within its budget that an exact search over every order's plans
    (:func:`_any_order`, :func:`_runtime_least`) found where none in the orders searched fits
    (``found``: the note's words for it), searched on in its node order until ``end``."""
    reach = "" if res.least_bytes is None else f" (they reach {res.least_bytes} bytes at least)"
    out = _found_elsewhere(res, least, "exact-search",
                           f"no plan in the orders searched fits{reach}; the exact search over every order's plans "
                           f"found {found}")
    return _in_plan_order(problem, out, least, options, end)


def _walked_beside(problem: PlanningProblem, res: SolveResult, options: PlannerOptions,
                   end: float = -math.inf) -> SolveResult:
    """``res`` (a plan in the memory-aware order, at a budget below the given order's floor) or,
    where cheaper, the plan the last resort of a solve without one finds (:func:`_rescue`: the
    reverse walk over every node order, then CP-SAT in its plan's order), in the quarter of the
    time limit that last resort gets. A little lower, where the memory-aware order holds no plan,
    that path is taken; skipped here, a larger budget cost more: zoo:cnn with adam,
    ``--time-limit 5 --deterministic``: +6.41% at 70% (the walk's order), +11.81% at 75% (the
    memory-aware order), where the walk's path gives +4.45%. ``end``: the solve's own limit, where
    ``res`` was found in a share of it (the repaired order): the walk's path then searches until
    then, as where that order held no plan (:func:`_any_order`)."""
    # its bound is for the memory-aware order's plans: none is claimed for the walk's
    bare = replace(res, status="timeout", plan=None, note="", solver=replace(res.solver, bound=None, gap=None))
    walked = _rescue(problem, bare, options, True, end)
    if walked is None or walked.plan is None or walked.added_time >= res.added_time:
        return res
    how = f"the plan in the {res.order} order was dearer (+{res.added_time:.6g} added time)"
    return replace(walked, note=f"{walked.note}; {how}")


def _in_plan_order(problem: PlanningProblem, res: SolveResult, walked: Candidate, options: PlannerOptions,
                   until: float) -> SolveResult:
    """``res`` (with ``walked``'s plan: a walk's over every node order, or the exact search's
    least-peak plan) or, where cheaper, the plan CP-SAT finds in the node order that plan
    computes nodes first in, hinted with it, until ``until``; its bound and gap are for plans in
    that order. Those searches pick the order only to fit the budget, and their plans, polished,
    still recompute far more than that order needs: zoo:cnn at 65% (30 s), the walk's +271.45%,
    CP-SAT's in its order +23.52%, proven optimal there in 9.2 s."""
    if until - clock.now() < MIN_SEARCH_S:
        return res
    order = first_compute_order(walked.plan)
    if len(order) != problem.n:
        return res
    q = permute(problem, order)
    hint = plan_in_order(walked.plan, order)
    t0 = clock.now()
    cands = _baselines(q, res.budget_bytes, t0 + options.baseline_share * (until - t0))
    walk = cands["walk"] = Candidate(hint, simulate(q, hint, res.budget_bytes))
    opt = replace(options, time_limit=until - t0)
    if not any(c.sim.peak_bytes <= res.budget_bytes for n, c in cands.items() if n != "walk"):
        # the walk's plan is the only one that fits: too heavy to hint, phase 2 had nothing to
        # start from and the search never began from it (RL250 at 60%: a node computed 13 times)
        opt = replace(opt, heavy_hint_computations=max(opt.heavy_hint_computations, _max_computations(walk)))
    there = _solve_cpsat(q, res.budget_bytes, opt, t0, cands)
    # a dearer plan (or none): the last resort's stands; an as-cheap one replaces it, for the bound
    # and status it comes with
    if there.plan is None or there.added_time > walked.sim.added_time:
        return res
    plan = plan_in_original(there.plan, order)
    sim = simulate(problem, plan, res.budget_bytes)  # over budget here is a bug: it raises
    change = (f"{walked.sim.added_time:.6g} -> {sim.added_time:.6g} added time" if sim.added_time < walked.sim.added_time
              else "none cheaper")
    note = (f"{res.note.replace('; no bound on its added time', '')}; then CP-SAT in that plan's node order, "
            f"hinted with it: {change}; bound and gap are for that order")
    return replace(res, status=there.status, plan=replace(plan, strategy="cpsat"), peak_bytes=sim.peak_bytes,
                   added_time=sim.added_time, solver=replace(res.solver, bound=there.solver.bound,
                                                             gap=there.solver.gap), note=note)


def _early_window(options: PlannerOptions) -> float:
    """Seconds the depth-first walk may take before the solve (:func:`_early_walk`)."""
    return options.early_walk_share * options.time_limit


def _early_walk(problem: PlanningProblem, budget: int, options: PlannerOptions) -> DepthFirstPlan | None:
    """The depth-first walk's plan over every node order (or the beams', where cheaper), polished,
    for a budget near the least peak any order may reach (``PlannerOptions.early_walk_within``),
    before the solve: there the model's plans (each node computed a few times, in one order)
    rarely fit, and the walk finds one in seconds (RL250 at 60%). None where the budget is not
    that near, the problem may swap or is large enough to be fused first, or the walk visited
    every state without a plan where that proves nothing; an exhausted walk proves no plan fits,
    where the problem's accounting is the runtime's. A walk its window cut short gives no plan and
    its ``search``, which the rescue after the solve goes on with (:func:`_rescue`)."""
    peak = problem.unplanned_peak
    if problem.can_swap or problem.n > options.coarsen_above or budget >= peak:
        return None  # (before the floor: most solves stop here)
    low = problem.order_free_floor
    if budget < low or budget - low > options.early_walk_within * (peak - low):
        return None
    deep = _walked_polished(problem, budget, clock.now() + _early_window(options), options)
    if deep.found is None:  # cut short: its search goes on after the solve (:func:`_rescue`)
        return deep if deep.exhausted and problem.runtime_exact or deep.search is not None else None
    rewalk_end = clock.now() + options.rewalk_share * options.time_limit
    return DepthFirstPlan(_rewalked(problem, budget, deep.found, options, rewalk_end), False)


def _walked_polished(problem: PlanningProblem, budget: int, end: float, options: PlannerOptions,
                     until: float = math.inf) -> DepthFirstPlan:
    """For :func:`_early_walk`: the depth-first walk's plan within ``budget`` over every node order or
    the beams', where cheaper, polished by ``until`` (in :data:`POLISH_SHARE` of the time limit at
    most); the walk's answer as it is where it finds none before ``end``."""
    deep = depth_first_plan(problem, budget, end)
    if deep.found is None:
        return deep
    # the beams in what is left of the window: they get through more often than not when the walk
    # does, and their plans polish better (RL100 at 55%: +64.2% against the walk's +77.7%; on
    # RL250 at 60% they end in dead ends in 0.4 s)
    found = [deep.found]
    if (beams := _walk_until(problem, budget, end, depth_first=False)) is not None:
        found.append((beams.plan, beams.sim))
    polish = [polished(problem, *f, budget, min(until, clock.now() + POLISH_SHARE * options.time_limit))
              for f in found]
    return DepthFirstPlan(min(polish, key=lambda f: f[1].added_time), False)


def _rewalked(problem: PlanningProblem, budget: int, found: tuple[Plan, Simulation],
              options: PlannerOptions, end: float) -> tuple[Plan, Simulation]:
    """``found`` (the early walk's polished plan, simulated) or, where cheaper, the plan the same
    walks find with the problem's nodes numbered in the order ``found`` completes them
    (:func:`planner.reorder.last_compute_order`), and so on while that is cheaper, until ``end``
    (``PlannerOptions.rewalk_share`` of the time limit, or in :func:`_rescue`, where the early
    walk's window cut it short, the rest of the rescue's quarter if longer). The walks try their
    moves by node number and stop at the first plan that fits, so the numbering picks the plan.
    At RL250 at 60% one step reads 44 inputs and leaves 904 bytes beside them: the order they are
    completed in decides most recomputes (completed late, an input's ancestors are recomputed in
    what the others leave), and numbered in the order the walk's own plan completes them, the walk
    finds one that completes them better: +207.81% -> +108.51%."""
    walked_in = list(range(problem.n))
    while clock.now() < end:
        order = last_compute_order(problem, found[0])
        if order == walked_in:
            break  # the walks in the same numbering find the same plan
        walked_in = order
        again = _walked_polished(permute(problem, order), budget, end, options, end).found
        if again is None:
            break
        plan = plan_in_original(again[0], order)
        sim = simulate(problem, plan, budget)  # over the budget here is a bug: it raises
        if sim.added_time >= found[1].added_time:
            break
        found = (plan, sim)
    return found


def _walked_first(problem: PlanningProblem, res: SolveResult, walked: Candidate, options: PlannerOptions) -> SolveResult:
    """``res`` with the early walk's plan (:func:`_early_walk`) in its place: the solve found none,
    or a dearer one. The solve's bound holds for its own orders only: none is claimed."""
    near = f"{options.early_walk_within:.0%}"
    how = (f"the reverse walks over every node order found a plan (planner/pebble.py), searched first: the budget "
           f"is within {near} of the way from the least peak any order may reach ({problem.order_free_floor} bytes) "
           f"to the unplanned peak; no bound on its added time")
    if res.plan is None:
        after = f"; the solve after it found none: {res.note}" if res.note else "; the solve after it found none"
    else:
        after = "; the solve after it found a dearer plan"
    out = _found_elsewhere(res, walked, "reverse-walk", how + after)
    return replace(out, solver=replace(out.solver, bound=None, gap=None))


def _walked_through(problem: PlanningProblem, res: SolveResult, above: tuple[Plan, Simulation] | None) -> SolveResult:
    """``res`` (no plan within its budget) made infeasible: the depth-first walk went through every
    state within the budget without a plan, so no recompute plan in any node order fits it (the
    caller checked that the problem's accounting is the runtime's and that it cannot swap). The
    least is then at least one byte more, and exactly that where a plan peaks there (``above``:
    the walk's plan within one byte more, if it found one). Where none does, the exact search over
    every order (planner/least.py) gives the least on problems small enough for it."""
    least, how = res.budget_bytes + 1, ""
    searched = None if above is not None else least_plan_any_order(problem)
    if searched is not None and searched[0] > res.budget_bytes:
        least = found = searched[0]
        how = " (its least: the exact search over every node order's plans, planner/least.py)"
    else:
        found = least if above is not None else _lowest_found(res)
    exact = found == least
    best = "" if exact or found is None else f" (best plan found: {found} bytes)"
    return replace(res, status="infeasible", least_bytes=least, least_exact=exact, best_bytes=None if exact else found,
                   note=f"the least memory any plan reaches is {'' if exact else 'at least '}{least} bytes{best}: the "
                        f"depth-first walk over every node order's recompute plans (planner/pebble.py) went through "
                        f"every state within {res.budget_bytes} bytes without one{how}")


def _walk_until(problem: PlanningProblem, budget: int, deadline: float, first: bool = False,
                depth_first: bool = True) -> Candidate | None:
    """The reverse walk's plan over every node order within ``budget``, searched until ``deadline``
    (``depth_first``: the depth-first walk too, where the beams find none)."""
    found = reverse_pebble(problem, budget, deadline, in_order=False, first=first, depth_first=depth_first)
    return None if found is None else Candidate(*found)


def _walk(problem: PlanningProblem, budget: int, options: PlannerOptions, first: bool = False) -> Candidate | None:
    """The reverse walk's plan over every node order within ``budget`` (planner/pebble.py), given
    up to a quarter of the time limit on top of the solve's; None when it finds none. ``first``:
    any plan that fits will do. Callers ask at or above the order-free floor only."""
    return _walk_until(problem, budget, clock.now() + 0.25 * options.time_limit, first)


def _least_over_both(given: SolveResult, first: SolveResult, q: PlanningProblem) -> SolveResult:
    """An infeasible given order's least memory, lowered to what the other order may reach (its
    own proven least, or else its memory floor): the claim covers plans in either order."""
    if first.status == "infeasible" and first.least_bytes is not None:
        other, other_exact = first.least_bytes, first.least_exact
    else:
        other, other_exact = q.memory_floor, False
    best = min((b for b in map(_lowest_found, (given, first)) if b is not None), default=None)
    if other >= given.least_bytes:  # no lower in the other order
        return given if given.least_exact else replace(given, best_bytes=best)
    word = "is" if other_exact else "is at least"
    return replace(given, least_bytes=other, least_exact=other_exact, best_bytes=None if other_exact else best,
                   note=f"the least memory any plan in the given or the memory-aware node order reaches {word} {other} bytes")


def _lowest_found(res: SolveResult) -> int | None:
    """The peak of the lowest plan an infeasible or plan-less ``res`` knows of: its least, when
    exact (a plan reaches it), else its best plan's."""
    return res.least_bytes if res.least_exact else res.best_bytes


class _Found(dict):
    """The baselines' plans by name (:func:`_baselines`). ``complete``: the greedy ran to its end,
    so that where none of them fits, none fits; False where ``deadline`` may have cut the greedy
    short (RL100 at 60%, ``--time-limit 2``: the memory-aware order's took 0.297 of its 0.296 s),
    and its finding no plan proves nothing."""
    complete: bool = True


def _baselines(problem: PlanningProblem, budget: int, deadline: float = float("inf"),
               floor: float = 0.0) -> _Found:
    """The plans of the baselines that return one, by name (the greedy's only up to ``deadline``).
    These are the plans a cpsat solve may never be dearer than: on the work clock, where the
    greedies charge their counted steps (planner/clock.py), their deadline is at least ``floor``
    charged seconds away (``PlannerOptions.baseline_work_floor``) and what they charge is refunded
    (clock.uncharged), so that a short limit neither stops them nor is spent by them on the graphs
    they finish on in a few seconds, while a graph whose greedies take minutes is stopped there."""
    with clock.uncharged():
        if clock.on_work_clock():
            deadline = max(deadline, clock.now() + floor)
        found = {name: baseline(problem, name, budget, deadline) for name in BASELINES}
        cut = found["greedy"] is None and clock.now() > deadline  # before its charges are refunded
    out = _Found((k, c) for k, c in found.items() if c is not None)
    out.complete = not cut
    return out


#: The names of the last resorts' plans among the baselines (:func:`_resorts_first`).
RESORTS = ("long-run", "kept-set")


def _cheap_fit(problem: PlanningProblem, cands: dict[str, Candidate], budget: int, added: float) -> bool:
    """Does a plan of ``cands`` fit ``budget`` adding at most ``added`` of the compute time?"""
    return any(c.sim.peak_bytes <= budget and c.sim.added_time <= added * problem.total_cost for c in cands.values())


def _resorts_first(problem: PlanningProblem, budget: int, options: PlannerOptions, cands: _Found,
                   pace: _Pace | None = None, order: list[int] | None = None) -> _Found:
    """``cands``, the given order's baselines, with the plan of a last resort where none of them
    fits ``budget``, or each that fits adds more than ``options.resorts_first_added`` of the
    compute time (RL1000 at 60%: the greedy's +225.11%, polished +147.56% -> the kept-set plan's
    +48.43%), on a problem of more than ``options.resorts_first_above`` nodes: the kept-set
    search (planner/kept_set.py; only where other node orders are allowed, its plans' first
    computes leave the given order) in ``resorts_first_share`` of the time limit
    (``resorts_first_unfit_share`` where no baseline fits), and where it
    finds none, the tight greedy's long run (planner.tight_greedy.long_run) in what is left of
    that share, or a quarter of it. They run after a solve without a plan anyway
    (:func:`_rescue`); run first, the plan is the solve's fallback inside its limit, and where it
    is light enough, its hint. ``--time-limit 120``, 2 workers, solver seconds: RL1000 at 50%,
    +12,628% in 163 s before (the rescue's quarter after the solve, then the kept-set search and
    a polish) -> +251.46% in 117 s (+326.27% in another run: the search stops at a wall deadline);
    at 55% +8,733% in 157 s -> +92.24% in 116 s; RL500 at 60% +21,068% in 158 s -> +197.02% in
    115 s. The long run first, in half the share (15 s), found neither RL1000 plan. ``pace``, the
    solve's, is told where they ran (:func:`_rescue`). ``order``: a memory-aware node order the
    kept-set search runs in (:func:`_kept_set`)."""
    if problem.n <= options.resorts_first_above or problem.can_swap or not problem.runtime_exact or \
            budget < problem.memory_floor or _cheap_fit(problem, cands, budget, options.resorts_first_added):
        return cands
    share = (options.resorts_first_share if _fits(cands, budget) else options.resorts_first_unfit_share) \
        * options.time_limit
    end = clock.now() + share
    searched = _kept_set_order(problem, budget, order) if options.reorder else None
    found = _kept_set(problem, budget, end, options.seed, searched) if options.reorder else None
    for k in range(1, options.resorts_first_starts if found is not None else 0):
        # its raw plans' costs say little of their polished ones (RL500 at 50%: +6,925% -> +422.6%,
        # +35,101% -> +309.3%), so each is polished before they are compared
        if clock.now() >= end:
            break
        if k == 1:
            found = Candidate(*polished(problem, found.plan, found.sim, budget, end, keep_firsts=True))
        again = None if clock.now() >= end else _kept_set(problem, budget, end, options.seed + k, searched)
        if again is None:
            break  # out of time before a plan (or none within reach): another start would not do better
        again = Candidate(*polished(problem, again.plan, again.sim, budget, end, keep_firsts=True))
        found = min(found, again, key=lambda c: c.sim.added_time)
    name = "kept-set"
    if found is None:
        long = long_run(problem, budget, max(end, clock.now() + 0.25 * share))
        found, name = None if long is None else Candidate(*long), "long-run"
    if pace is not None:
        pace.resorts_ran = True
    if found is None:
        return cands
    out = _Found(cands)
    out.complete = cands.complete
    out[name] = Candidate(replace(found.plan, strategy=name), found.sim)  # (one of RESORTS)
    return out


def _kept_set_order(problem: PlanningProblem, budget: int,
                    order: list[int] | None) -> tuple[PlanningProblem, list[int]] | None:
    """The node order the kept-set search runs in (:func:`_kept_set`), decided once per
    :func:`_resorts_first` (a seed does not change it): ``order`` (a memory-aware order; its
    kept nodes visited in that order) with ``problem`` permuted to it, where the plan without
    recomputes holds at most ``ORDER_EXCESS_SHARE`` of the given order's bytes over the budget
    there (kept_set.excess); else None, the given order. RL500 in its memory-aware order (0.82 of
    the excess at 50%), 60 s, polished: at 50% +755/+811% -> +423/+309% (seeds 0/1), at 55% +490%
    -> +122%; RL1000's (0.92 at 50%) was dearer on 5 of 6 seeds (bench/results/rl500_cost_stop72.md)."""
    if order is None:
        return None
    q = permute(problem, order)
    return (q, order) if excess(q, budget) <= ORDER_EXCESS_SHARE * excess(problem, budget) else None


def _kept_set(problem: PlanningProblem, budget: int, deadline: float, seed: int,
              searched: tuple[PlanningProblem, list[int]] | None = None) -> Candidate | None:
    """The kept-set search's plan (planner/kept_set.py) within ``budget``, simulated, or None.
    ``searched``: the problem permuted to another node order and that order
    (:func:`_kept_set_order`): the search runs there and its plan is mapped back."""
    if searched is None:
        plan = kept_set_plan(problem, budget, deadline, seed)
    else:
        plan = kept_set_plan(searched[0], budget, deadline, seed)
        plan = None if plan is None else plan_in_original(plan, searched[1])
    sim = None if plan is None else fitting(problem, plan, budget, "kept-set plan")
    return None if sim is None else Candidate(plan, sim)


def _told_kept_set(problem: PlanningProblem, res: SolveResult) -> SolveResult:
    """``res``, saying so where its plan is the kept-set search's (:func:`_resorts_first`): its
    first computes leave the given order, which the solve's order, bound and gap are for."""
    if res.plan is None or res.order != "given" or first_compute_order(res.plan) == list(range(problem.n)):
        return res
    return replace(res, order="kept-set", status="feasible", solver=replace(res.solver, bound=None, gap=None),
                   note=f"{res.note}; the kept-set search's plan (planner/kept_set.py), found before the solve, "
                        f"whose first computes leave the given order: no bound on its added time".lstrip("; "))


def _solve_coarse(c: Coarsening, budget: int, options: PlannerOptions, t0: float, pace: _Pace | None = None) -> SolveResult:
    """Solve the fused problem, expand its plan, replay it on the real one. Phase 1 (finding a
    plan within budget) may use half of the time, so that the unfused problem keeps half when the
    fused one gets none; with a plan, phase 2 refines it until the time limit (measured, 50% of
    the peak, 60 s: zoo:resnet?blocks=16&batch=16 +3.12% in 30 s -> +2.89% in 60 s;
    zoo:gpt?layers=24&batch=16 +6.13% either way, phase 2 ends at 54 s)."""
    half = replace(options, feasibility_share=min(options.feasibility_share, 0.5),
                   fallback_feasibility_share=min(options.fallback_feasibility_share, 0.5))
    res = _solve_cpsat(c.coarse, budget, half, t0, pace=pace)
    if res.plan is None:
        return res
    note = f"solved on {c.coarse.n} fused nodes (from {c.fine.n}); bound and gap are for that model"
    plan = c.expand(res.plan)
    sim = simulate(c.fine, plan, budget)
    return replace(res, plan=plan, peak_bytes=sim.peak_bytes, added_time=sim.added_time,
                   unplanned_peak_bytes=c.fine.unplanned_peak, status="feasible" if res.status == "optimal" else res.status,
                   note=f"{res.note}; {note}".strip("; "))


def _empty(problem: PlanningProblem, budget: int, strategy: str, **kw) -> SolveResult:
    return SolveResult(
        strategy=strategy,
        budget_bytes=budget,
        unplanned_peak_bytes=problem.unplanned_peak,
        # what initializers and graph inputs hold (inspect's constant base): not the unread tiny
        # outputs lowering adds to the problem's base (late_base_bytes, held only once made)
        base_bytes=problem.base_bytes - problem.late_base_bytes,
        compute_time=problem.total_cost,
        **kw,
    )


def _baseline_result(problem: PlanningProblem, budget: int, strategy: str, options: PlannerOptions, t0: float) -> SolveResult:
    """The named baseline's plan; the greedy's searched until the time limit (on the work clock:
    its charged steps), where it used to run on without one (the lstm fixture, batch 8, seq 128,
    at 80%: over 300 s of ``--strategy greedy --time-limit 1``)."""
    deadline = t0 + options.time_limit
    cand = baseline(problem, strategy, budget, deadline)
    stats = SolverStats(wall_s=clock.wall_since(t0), seed=options.seed, workers=1, clock=_clock_name(options))
    if cand is None:
        if strategy == "greedy" and clock.now() > deadline:
            return _empty(problem, budget, strategy, status="timeout", solver=stats,
                          note=_timeout_note(problem, options.time_limit, None))
        return _empty(problem, budget, strategy, status="over_budget", solver=stats,
                      note=f"{strategy} finds no plan within the budget")
    fits = cand.sim.peak_bytes <= budget
    status = ("optimal" if strategy == "none" else "feasible") if fits else "over_budget"
    note = "" if fits else f"{strategy}'s plan peaks at {cand.sim.peak_bytes} bytes, over the budget"
    return _empty(
        problem, budget, strategy, status=status, plan=cand.plan if fits else None,
        peak_bytes=cand.sim.peak_bytes, added_time=cand.sim.added_time, solver=stats, note=note,
    )


def _adds_nothing(problem: PlanningProblem, budget: int, c: Candidate, opt: PlannerOptions, t0: float,
                  note: str) -> SolveResult:
    """``c``, a fitting plan that adds no time, as the solve's optimal result (bound and gap 0)."""
    stats = SolverStats(wall_s=clock.wall_since(t0), bound=0.0, gap=0.0, seed=opt.seed, workers=opt.workers,
                        clock=_clock_name(opt))
    return _empty(problem, budget, "cpsat", status="optimal", plan=replace(c.plan, strategy="cpsat"),
                  peak_bytes=c.sim.peak_bytes, added_time=0.0, solver=stats, note=note)


def _solve_cpsat(problem: PlanningProblem, budget: int, opt: PlannerOptions, t0: float,
                 cands: dict[str, Candidate] | None = None, pace: _Pace | None = None,
                 known: ClosureBound | None = None,
                 extend: Callable[[int], float | None] | None = None, hint: Plan | None = None) -> SolveResult:
    """``cands``: the baselines' candidates, when a caller already has them for this problem.
    ``pace``: model build times seen so far in this solve (shared with the caller's other solves).
    ``known``: this problem's closure bound, when a caller computed it already (solved again only
    when not exact; the larger value stands).
    ``extend``: asked, with phase 2's objective, when phase 2 ends without a proof: a later
    deadline (perf_counter seconds) for searching on from that plan, or None.
    ``hint``: a recompute-only plan of a swap ``problem`` (:func:`_swap_after_recompute`), a
    candidate where it computes nodes first in this problem's order (else it cannot hint this
    model, and is left out); or a plan over ``budget`` (:func:`solve`'s ``start``), phase 1's start
    where it hints the model, in place of the greedy ladder's (:func:`_lowest_greedy`)."""
    deadline = t0 + opt.time_limit
    pace = pace or _Pace()

    def left() -> float:
        return max(0.05, deadline - clock.now())

    if budget < problem.memory_floor:
        return _infeasible(problem, budget, opt, t0, phases=[])
    if cands is None:
        cands = _resorts_first(problem, budget, opt, _baselines(problem, budget, clock.now() + opt.baseline_share * left(),
                                                                 opt.baseline_work_floor), pace)
    if any(name in cands for name in RESORTS):
        # a last resort's plan the fallback (:func:`_resorts_first`): its polish after the search
        # (:func:`_chosen`) within the limit too
        deadline -= POLISH_SHARE * opt.time_limit
    swapping = problem.can_swap
    if hint is not None and first_compute_order(hint) == list(range(problem.n)):
        sim = simulate(problem, hint)
        if sim.peak_bytes > budget:  # never a fallback: it does not fit
            cands = dict(cands)
            cands["previous"] = Candidate(replace(hint, strategy="previous"), sim)
        elif swapping:
            cands = dict(cands)
            cands["recompute-only"] = Candidate(replace(hint, strategy="recompute-only"), sim)
    if swapping and opt.recompute_first_share > 0:
        # The recompute-only model first: its plan is a plan of the swap model too (no swaps).
        # The baselines never swap, so their candidates serve both problems.
        first = _solve_cpsat(problem.without_swap(), budget,
                             replace(opt, time_limit=left() * opt.recompute_first_share),
                             clock.now(), dict(cands), pace)
        if first.plan is not None:
            cands["recompute-only"] = Candidate(first.plan, simulate(problem, first.plan, budget))
    if swapping:  # after the recompute-only solve: its problem cannot replay swaps
        moved = swap_greedy(problem, budget)
        if moved is not None:
            cands["swap-greedy"] = Candidate(moved, simulate(problem, moved))
    # fitting plans too heavy to hint, polished to hint the model and phase 2 (phase 1's share below)
    lightened = {name: _lightened(problem, budget, c, opt) for name, c in cands.items()}
    polished_ones = [c for name, c in lightened.items() if c is not cands[name]]
    cands = lightened
    fitting = sorted(
        (c for c in cands.values() if c.sim.peak_bytes <= budget),
        key=lambda c: (c.sim.added_time, c.plan.strategy),
    )
    if "none" in cands and cands["none"].sim.peak_bytes <= budget:
        return _adds_nothing(problem, budget, cands["none"], opt, t0, "no remat needed")
    if fitting and fitting[0].sim.added_time <= 0:
        # a plan that adds no time (the swap greedy's copies all hidden behind compute, where they
        # overlap it) is optimal: the solver spent the rest of the limit to say it found nothing
        # better (zoo:gpt at 75% with --swap, copies priced beside compute: 9.6 s, "solver gave no
        # better plan in time")
        return _adds_nothing(problem, budget, fitting[0], opt, t0, f"the {fitting[0].plan.strategy} plan adds no time")
    # Hints shape the model (instances, slots): only plans that stay near its size qualify, and
    # only those that swap each node out once and back in at most ``max_swap_ins`` times map onto
    # it (the model's swap-in instances per node: the swap greedy's plans that bring a host copy
    # back more often are fallbacks only).
    def light(c: Candidate) -> bool:
        return swaps_fit(c) and _max_computations(c) <= opt.hint_computations

    def hintable(c: Candidate) -> bool:
        return swaps_fit(c) and _max_computations(c) <= opt.heavy_hint_computations

    def swaps_fit(c: Candidate) -> bool:
        return not c.sim.swap_ins or (swapping and cpsat_plans.swaps_fit(c.plan, problem.n, opt.max_swap_ins))

    usable = [c for c in cands.values() if light(c)]
    # Fitting plans that recompute more (the eviction greedy at tight budgets) hint phase 2 only:
    # started from them, phase 1 would return them as they are.
    heavy = [c for c in fitting if hintable(c) and not light(c)]
    hints = [c.plan for c in usable + heavy]
    phases: list[PhaseResult] = []
    named_hint: dict[str, int] | None = None
    parts_model = False  # phase 2 in the parts-aware model: only there does phase 1's plan fit
    phase1: Candidate | None = None
    fallback: Candidate | None = fitting[0] if fitting else None

    def kept() -> SolveResult:
        """The fallback, where no time is left to search (or to finish building) a model."""
        return _chosen(problem, budget, opt, t0, phases, fallback,
                       f"no time left to search; kept the {fallback.plan.strategy} plan")

    if fallback is None and pace.model_s > 0 and not pace.room(left()):
        # no plan yet, and the time left would not cover building a model as large as one this
        # solve built already and searching it: as phase 1 ending without a plan says (RL1000 at
        # 70% with --time-limit 2: the given order's phase-1 model, built after the memory-aware
        # order's had spent the limit, took the solve from 2 s to 10 s and found nothing). On the
        # work clock building charges nothing, so nothing changes there.
        return _empty(problem, budget, "cpsat", status="timeout", solver=_stats(opt, t0, None, None, []),
                      note=_timeout_note(problem, opt.time_limit, None))
    # Without a light fitting plan the model starts from phase 1 (a heavy one stays the fallback).
    if not any(light(c) for c in fitting) and (fallback is None or pace.room(left())):
        # no light plan fits: the search needs room for recompute chains of its own
        opt = replace(opt, spare_slots=max(opt.spare_slots, opt.search_slots))
        # with a fitting fallback phase 2 can start from, phase 1 (its start included) gets only
        # a share, for phase 2 to improve on either plan; without one, the ladder's greedy runs
        # (seconds each on RL1000) may use half of what is left, and phase 1 most of the rest (a
        # fallback too heavy to hint leaves phase 2 nothing to start from: RL100 at 60%, the
        # greedy's +337% plan computes a node 32 times, and phase 1 cut to the share ended without
        # a plan 1 s short of the one it finds, phase 2 found none and +337% was returned; with
        # the full share +21.36%)
        # (a fallback hintable only once polished, still dear, leaves phase 1 its full share: RL100 at
        # 60%, 2.6 deterministic s, one worker: cut to the share, phase 1 ended without its plan and
        # the polished greedy's +196% stood, where its own plan gives +33%)
        short = fallback is not None and hintable(fallback) and all(fallback is not c for c in polished_ones)
        window = clock.now() + opt.fallback_feasibility_share * left() if short else None
        previous = cands.get("previous")
        if previous is not None and light(previous):
            # a re-solve's start (solve()'s): the solver's own plan in this order, just over this
            # target. The ladder's bisection took half the time for a greedy plan peaking lower,
            # from which one worker's phase 1 found none in the rest: fuzzed seed 63 re-solved at
            # 20619 bytes (--time-limit 3 --deterministic --workers 1), 0.75 of its 1.5 s, then
            # 0.71 s without a plan, and the reverse walk's +284.79% stood; from the start, phase 1
            # has its plan in 0.03 s
            low = previous
        else:
            low = _lowest_greedy(problem, budget, usable, opt.ladder_steps, opt.hint_computations,
                                 window if window is not None else clock.now() + 0.5 * left())
        if _max_computations(low) <= opt.hint_computations and low.plan not in hints:
            hints.append(low.plan)
        since = clock.now()
        try:  # no search is left once building passes the limit: the solve ends as its search would
            m1 = RematModel(problem, None, opt, hints, deadline=deadline)
            m1.set_objective_peak()
            h = m1.hint_from_plan(low.plan)
            if h is not None:
                m1.apply_hint(h, deadline)
        except OutOfTime:
            pace.built(since)
            if fallback is not None:
                return kept()
            return _empty(problem, budget, "cpsat", status="timeout", solver=_stats(opt, t0, None, None, phases),
                          note=_timeout_note(problem, opt.time_limit, None))
        pace.built(since)
        target = (budget - problem.base_bytes) // m1.mem_unit
        # the share is for all of phase 1's runs: counted again before each run, four runs at 30%
        # took 76% of the time (the resnet fixture at 60%: 43 s of 55, phase 2 got 13)
        end = window if window is not None else clock.now() + opt.feasibility_share * left()
        r1 = _feasibility(m1, target, lambda: max(0.0, end - clock.now()), phases)
        found = _within_target(m1, r1, target)
        # the model holds a node's parts (problem.parts) as one buffer: its best plan, over the target
        # there, may fit the budget as the run frees them apart (fuzzed --ops multi seed 1 at 16391
        # bytes: 16636 in the model, 15996 run; the search ended "no plan"); a fallback, not a hint
        apart = None if found or r1.plan is None else Candidate(r1.plan, simulate(problem, r1.plan))
        if not found and problem.parts is not None:
            # the rest of the solve in the parts-aware model, where it holds a part apart (the
            # one-buffer model is searched first: larger, it searched slower on zoo:gpt at 70%)
            parted = None if apart is not None and apart.sim.peak_bytes <= budget else \
                _parts_phase1(problem, budget, opt, hints, [x for x in (r1.plan, low.plan) if x is not None],
                              deadline, phases, pace, clock.now() + opt.feasibility_share * left())
            by_parts = parted is not None and parted[1].plan is not None
            if by_parts:
                m1, r1 = parted
                found = True
                apart = None
            parts_model = by_parts or apart is not None and apart.sim.peak_bytes <= budget
        if found:
            phase1 = Candidate(r1.plan, simulate(problem, r1.plan, budget))
            if fallback is None or phase1.sim.added_time <= fallback.sim.added_time:
                fallback = phase1
            named_hint = m1.values_by_name(r1.values)
        elif apart is not None and apart.sim.peak_bytes <= budget:
            if fallback is None or apart.sim.added_time <= fallback.sim.added_time:
                fallback = apart  # within the budget: checking it against the budget adds nothing
        elif fallback is None:
            best = m1.bytes_of_capacity(r1.objective) if r1.objective is not None else None
            # What the model proves holds over its plans only (module docstring of planner.least):
            # only the exact search of a small problem, or the floor, says what every plan reaches.
            cheapest = _exact_cheapest(problem, budget)
            if cheapest is not None:  # plans the model does not hold fit; the search gives the cheapest
                return _exact_result(problem, budget, cheapest, opt, t0, phases)
            exact = least_plan(problem)  # none fits, or the search gave up on the cheapest
            counted = None  # the least peak in the problem's own accounting, where the runtime's differs
            if exact is not None and exact[0] > budget:
                if problem.runtime_exact:
                    return _infeasible(problem, budget, opt, t0, phases, least=(exact[0], exact[0], True))
                counted, exact = exact[0], None  # the runtime may go lower: not a claim about the model
            if exact is not None:  # the least-peak plan fits: a fallback
                fallback = Candidate(exact[1], simulate(problem, exact[1], budget))
            elif counted is not None:
                # every plan was searched, with more computations than any cap: raising
                # --max-computations cannot help (repro_3 of stop 48's fuzzing)
                return _empty(problem, budget, "cpsat", status="timeout", best_bytes=best,
                              solver=_stats(opt, t0, None, None, phases), note=_counted_note(problem, counted))
            else:
                proven = r1.status == "OPTIMAL" or (r1.bound is not None and r1.bound > target)
                if proven and opt.max_computations < opt.grown_computations and pace.room(left()):
                    # too few plans in the model: again, with each node computed up to twice as often
                    grown = replace(opt, time_limit=left(),
                                    max_computations=min(2 * opt.max_computations, opt.grown_computations))
                    again = _solve_cpsat(problem, budget, grown, clock.now(), cands, pace)
                    before = _stats(opt, t0, None, None, phases).phases
                    return replace(again, solver=replace(again.solver, wall_s=clock.wall_since(t0),
                                                         phases=before + again.solver.phases))
                wider = _exact_cheapest(problem, budget, NO_FIT_EXACT_NODES, NO_FIT_EXACT_STATES) \
                    if problem.n > MAX_NODES else None
                if wider is not None:
                    return _exact_result(problem, budget, wider, opt, t0, phases)
                note = (_model_bound_note(problem, opt.max_computations, best) if proven
                        else _timeout_note(problem, opt.time_limit, best))
                return _empty(problem, budget, "cpsat", status="timeout", best_bytes=best,
                              solver=_stats(opt, t0, None, None, phases), note=note)
    if not pace.room(left()):  # a fallback fits (else phase 1 ran and returned above)
        return kept()
    since = clock.now()
    try:
        m2 = RematModel(problem, budget, opt, hints, deadline=deadline, parts=parts_model)
        m2.set_objective_time()
        source = next((c for c in fitting if hintable(c)), None)
        if named_hint and (source is None or phase1.sim.added_time <= source.sim.added_time):
            hint = m2.hint_by_name(named_hint)  # m1 and m2 share hints, so the same slots
        else:  # the cheapest fitting plan the model holds (a swap plan's timing may not map)
            hint = next((h for c in fitting + ([fallback] if parts_model else []) if hintable(c)
                         and (h := m2.hint_from_plan(c.plan))), None)
        if hint:
            m2.apply_hint(hint, deadline)
    except OutOfTime:
        pace.built(since)
        return kept()
    pace.built(since)
    # The recompute-closure bound (planner.order_bound) often proves more than phase 2 does
    # (zoo:gpt at 80%: 4.91% of the step time against 2.68%). When the closure bound applies,
    # phase 2's first search gets ``phase2_share`` of the time; ending without a proof, the bound
    # runs in its share, then the guided search, the cut rounds and the node-set search, then
    # phase 2 again from the best plan (RL100 at 60%, 10 deterministic s: +26.20% -> +22.61%;
    # bench/results/node_lns_stop21.md).
    # Reported only: as a constraint it changed the search (RL100 at 60%: +31.33% against
    # +23.68%), and a callback stopping phase 2 on reaching it aborts CP-SAT 9.15 with 2
    # interleaved workers (VGG16 at 90%).
    # the closure bound and the exact search count each output as one buffer: not claimed over
    # the parts-aware model's plans (_chosen)
    closing = _closure_applies(problem, opt) and not m2.parted
    span = left()
    if closing and fallback is not None and (proof := _fallback_proven(problem, budget, opt, m2, fallback, known,
                                                                        span)) is not None:
        return _chosen(problem, budget, opt, t0, phases, fallback, "", m2, None, proof)
    r2 = m2.solve("optimize", span * (opt.phase2_share if closing else 1))
    if r2.status == "INFEASIBLE" and problem.parts is not None and not m2.parted and pace.room(left()):
        # the fallback fits only as the run frees parts apart: phase 2 again, in the model holding them so
        try:
            m2p = _parts_model(problem, budget, opt, hints, [fallback.plan], deadline)
        except OutOfTime:
            m2p = None
        if m2p is not None:
            phases.append(r2)
            m2, span, closing = m2p, left(), False
            r2 = m2.solve("optimize", span)
    closure = None
    if closing and r2.status != "OPTIMAL":
        reserve = opt.closure_bound_share * span
        if extend is not None and r2.objective is not None:
            later = extend(int(round(r2.objective)))
            if later is not None and later > deadline:  # the bound gets its share of the extra time too
                reserve += opt.closure_bound_share * (later - deadline)
                deadline = later
        closure = _closure_with(problem, budget, m2, known, min(reserve, left()), opt.seed,
                                None if r2.objective is None else int(round(r2.objective)))
        if closure is not None and closure.value == CLOSURE_INFEASIBLE:  # a plan fits: a bug there
            log.warning("the closure bound calls %s infeasible at %d bytes; ignored", problem.name, budget)
            closure = None
        # The bound often solves in a fraction of its share (zoo:gpt at 80%: 1.6 s of 6): phase 2
        # searches on from its best plan in what is left, unless that plan already meets the bound.
        met = closure is not None and r2.objective is not None and r2.objective <= closure.value
        # a model proven to hold no plan leaves the later searches nothing to start from or find
        if not met and r2.status != "INFEASIBLE" and pace.room(left()):
            phases.append(r2)
            guided = _closure_guided(m2, r2, closure, left() * opt.closure_guided_share)
            if guided is not None:
                phases.append(guided)
                if guided.plan is not None:
                    # optimal among plans recomputing those nodes only: its bound is not m2's
                    r2 = replace(guided, status="FEASIBLE", bound=r2.bound)
            if r2.values is not None:
                m2.apply_hint(r2.values)
            # then the cut rounds, before the node-set search: their restricted searches look
            # for cheaper plans too, and where they stop without a proof the node-set search
            # gets what is left (RL250 at 70%: gap 0.48% twice, where after the node-set search
            # 1.41% in 3 runs of 5; RL1000 at 90%: 82.64% -> 60.35%; bench/results/closure_below_stop45.md)
            if r2.status != "OPTIMAL" and closure is not None:
                cut = _closure_cuts(m2, r2, left() * opt.closure_cuts_share, opt, closure)
                if cut is not None:
                    phases.append(cut)
                    # its plan is the best one: r2's, or a cheaper one a proof found on the way
                    r2 = replace(cut, status="OPTIMAL" if cut.status == "OPTIMAL" else "FEASIBLE",
                                 bound=_larger(r2.bound, cut.bound))
                    if r2.values is not None:
                        m2.apply_hint(r2.values)
            # then among plans recomputing the best plan's nodes and a few drawn at random
            moved = None if r2.status == "OPTIMAL" else node_lns(
                m2, r2, left() * opt.node_lns_share, opt.node_lns_step, opt.node_lns_size, opt.seed,
                opt.node_lns_patience)
            # (it leaves m2 hinted with its best plan, r2's when it found none cheaper)
            if moved is not None and moved.status == "OPTIMAL":  # no plan of the model is cheaper
                r2 = moved
            elif moved is not None:
                phases.append(moved)
                if moved.objective < r2.objective:
                    r2 = replace(moved, bound=r2.bound)
            if r2.status not in ("OPTIMAL", "INFEASIBLE"):  # a proof stands: searching again proves it again
                more = m2.solve("optimize", left())
                # a bound proven before holds over every plan of the model: the larger stands
                bound = _larger(r2.bound, more.bound)
                if more.plan is not None and (r2.objective is None or more.objective <= r2.objective):
                    r2 = replace(more, bound=bound)
                else:  # no better plan: the first one stands
                    r2 = replace(r2, bound=bound, wall_s=more.wall_s)
    phases.append(r2)
    log.info("cpsat %s: model %s, %s", problem.name, m2.model_size(), r2.status)
    return _chosen(problem, budget, opt, t0, phases, fallback, "", m2, r2, closure)


def _parts_phase1(problem: PlanningProblem, budget: int, opt: PlannerOptions, hints: list[Plan], starts: list[Plan],
                  deadline: float, phases: list[PhaseResult], pace: _Pace,
                  end: float) -> tuple[RematModel, PhaseResult] | None:
    """Phase 1 in the parts-aware model (``RematModel(parts=True)``) until ``end``, hinted with
    the first of ``starts`` it holds, where the one-buffer model found no plan within the budget:
    (the model, its result), or None where it holds no part apart or no time is left."""
    if not pace.room(max(0.0, deadline - clock.now())):
        return None
    since = clock.now()
    try:
        m1 = _parts_model(problem, None, opt, hints, starts, deadline)
    except OutOfTime:
        return None
    finally:
        pace.built(since)
    if m1 is None:
        return None
    target = (budget - problem.base_bytes) // m1.mem_unit
    r1 = _feasibility(m1, target, lambda: max(0.0, end - clock.now()), phases)
    return m1, (r1 if _within_target(m1, r1, target) else replace(r1, plan=None))


def _parts_model(problem: PlanningProblem, budget: int | None, opt: PlannerOptions, hints: list[Plan],
                 starts: list[Plan], deadline: float) -> RematModel | None:
    """The parts-aware model (``RematModel(parts=True)``): phase 1's (``budget`` None: the least
    peak) or phase 2's (the least time within ``budget``), hinted with the first of ``starts`` it
    holds; None where it holds no part apart. Raises OutOfTime as the build does."""
    m = RematModel(problem, budget, opt, hints, deadline=deadline, parts=True)
    if not m.parted:
        return None
    if budget is None:
        m.set_objective_peak()
    else:
        m.set_objective_time()
    h = next((h for plan in starts if (h := m.hint_from_plan(plan)) is not None), None)
    if h is not None:
        m.apply_hint(h, deadline)
    return m


def _within_target(m1: RematModel, r1: PhaseResult, target: int) -> bool:
    """Did phase 1's run ``r1`` of ``m1`` find a plan whose capacity is within ``target`` (in the
    model's units)?"""
    return r1.plan is not None and r1.values is not None and r1.values.get(m1.cap.Index(), target + 1) <= target


def _fallback_proven(problem: PlanningProblem, budget: int, opt: PlannerOptions, m2: RematModel,
                     fallback: Candidate, known: ClosureBound | None, span: float) -> ClosureBound | None:
    """The closure bound, where it shows before phase 2 runs that ``fallback`` (the cheapest
    fitting plan so far) is optimal in the order; else None. Searched below that plan's cost, so
    it ends as soon as it gets there, in at most ``early_proof_share`` of ``span``. zoo:gpt?batch=8
    at 70%: its +3.52% plan was proven at 30 s of the default 60, since the bound ran only after
    phase 2's first half."""
    if opt.early_proof_share <= 0:
        return None
    cost = m2.objective_of_counts(fallback.sim.compute_counts)
    proof = _closure_with(problem, budget, m2, known, opt.early_proof_share * span, opt.seed, int(cost))
    if proof is None or proof.value == CLOSURE_INFEASIBLE or proof.value < cost:
        return None
    return proof


def _closure_with(problem: PlanningProblem, budget: int, m2: RematModel, known: ClosureBound | None,
                  time_limit: float, seed: int, below: int | None) -> ClosureBound | None:
    """``known`` where it is exact, else the larger of it and the growing closure bound on
    ``m2``'s objective (in ``time_limit``, searched ``below`` that cost)."""
    if known is not None and known.exact:
        return known
    return larger_bound(known, growing_closure_bound(problem, budget, m2.obj_cost, time_limit, seed, below=below))


def _larger(a: float | None, b: float | None) -> float | None:
    """The larger of two lower bounds on one model's plans (either may be None)."""
    return b if a is None else a if b is None else max(a, b)


def _closure_guided(m2: RematModel, r2: PhaseResult, closure: ClosureBound | None,
                    time_limit: float) -> PhaseResult | None:
    """Phase 2's model searched for a plan cheaper than ``r2``'s that recomputes only nodes that
    ``r2``'s plan or the closure bound's solution recomputes (None when there is no such
    solution or no plan to beat). The relaxation knows which buffers the tight steps can spare,
    where phase 2's search may stay near its first plans; with ``r2``'s own nodes in the set, the
    search starts from a neighbourhood that holds ``r2``'s plan and asks for a cheaper one. Measured: RL250 at 70% (memory-aware order) +2.079% -> +1.981% in
    0.8 s, where phase 2 stayed at +2.079% for 300 s."""
    if closure is None or not closure.nodes or r2.plan is None or r2.objective is None:
        return None
    nodes = set(closure.nodes) | set(r2.plan.recomputed(m2.p.n))
    return m2.solve("closure-guided", time_limit, model=m2.restricted(sorted(nodes), int(round(r2.objective))))


def _closure_cuts(m2: RematModel, r2: PhaseResult, time_limit: float, opt: PlannerOptions,
                  closure: ClosureBound | None = None) -> PhaseResult | None:
    """The closure bound raised by cuts (planner.order_bound.ClosureCuts): the relaxation names
    the nodes a cheaper plan would recompute, with ``closure_cut_nodes`` of its cheapest others
    and the best plan's own; phase 2's model restricted to them (as in :func:`_closure_guided`)
    proves no cheaper plan recomputes only those, or finds one. Rounds go on until the
    relaxation has no solution below the best plan (then that plan is optimal among the model's
    plans), a restricted search ends without a proof, or time runs out. The result's bound holds
    over the model's plans, like phase 2's own; its plan is the cheapest found. None where there
    is nothing to start from. ``closure``: m2's closure bound, proven before; exact, it is the
    first round's relaxation solved (RL250 at 70%: 1.3-1.8 s spared)."""
    if r2.plan is None or r2.objective is None or time_limit <= 0.05:
        return None
    start = clock.now()
    wall0 = time.perf_counter()  # the phase's own wall time (clock.wall_since is the whole solve's on the work clock)
    deadline = start + time_limit
    best, cost = r2, int(round(r2.objective))
    cuts = ClosureCuts(m2.p, m2.budget, m2.obj_cost, cost, deadline)
    if not cuts.ready:
        return None
    bound, status, inside = r2.bound, "FEASIBLE", set(best.plan.recomputed(m2.p.n))
    first = None
    if closure is not None and closure.value > 0:
        cuts.at_least(closure.value)
        if closure.exact and closure.value < cost:  # over every step, optimal: the relaxation's optimum
            first = ("OPTIMAL", float(closure.value), closure.nodes)
    while deadline - clock.now() > 0.05:
        name, low, nodes = first or cuts.solve(deadline - clock.now(), opt.seed)
        first = None
        if name == "INFEASIBLE":  # no plan cheaper than the best one passes the cuts
            bound, status = cost, "OPTIMAL"
            break
        if low is None:
            break
        bound = low if bound is None else max(bound, low)
        inside |= set(nodes)
        inside |= set([i for i in cuts.candidates if i not in inside][:opt.closure_cut_nodes])
        if deadline - clock.now() <= 0.05:
            break
        found = m2.solve("closure-cut", deadline - clock.now(), model=m2.restricted(sorted(inside), cost))
        if found.plan is not None and found.objective is not None and found.objective < cost:
            best, cost = found, int(round(found.objective))
            cuts.below(cost)
            if found.status != "OPTIMAL":  # not proven cheapest there yet: search it again
                continue
        elif found.status != "INFEASIBLE":  # no proof in time
            break
        cuts.cut(sorted(inside))
    return PhaseResult("closure-cuts", status, time.perf_counter() - wall0, cost, bound, best.plan, best.values)


def _chosen(problem: PlanningProblem, budget: int, opt: PlannerOptions, t0: float, phases: list[PhaseResult],
            fallback: Candidate, note: str, m2: RematModel | None = None, r2: PhaseResult | None = None,
            closure: ClosureBound | None = None) -> SolveResult:
    """The cheaper of phase 2's plan (``r2`` from model ``m2``, if it ran) and ``fallback``, with
    the least added time proven: phase 2's bound (over its model's plans) or ``closure`` (over
    every plan in the order, the candidates included). On a problem small enough for the exact
    search (:func:`_exact_cheapest`) its plan replaces a dearer one, and optimal means over every
    plan in the order."""
    chosen = fallback
    if r2 is not None and r2.plan is not None:
        sim = simulate(problem, r2.plan, budget)  # a plan over budget here is a bug: it raises
        if sim.added_time <= fallback.sim.added_time:
            chosen = Candidate(r2.plan, sim)
        else:
            note = f"kept the {fallback.plan.strategy} plan: the solver's plan was not cheaper"
    elif r2 is not None and r2.status == "INFEASIBLE":  # a plan fitting only as run (parts freed apart), or
        # one computing a node more often than the model holds; the parts-aware model holds parts
        # apart but for a swappable or in-place node's (RematModel._parted)
        whole = "a swappable or in-place node's outputs" if m2.parted else "a node's outputs"
        note = (f"the solver's model holds no plan within the budget (it holds {whole} as one buffer "
                f"and each node computed at most {opt.max_computations} times); kept the {fallback.plan.strategy} plan")
    elif r2 is not None:
        note = f"solver gave no better plan in time; kept the {fallback.plan.strategy} plan"
    if not (r2 is not None and r2.status == "OPTIMAL" and chosen.plan is r2.plan):
        # a fallback recomputes more than memory requires where the greedies made it (RL1000 at
        # 60%: +225.11% -> +147.56%); first computes stay in the order the bound is for
        better = Candidate(*polished(problem, chosen.plan, chosen.sim, budget,
                                     clock.now() + POLISH_SHARE * opt.time_limit, keep_firsts=True))
        if better.sim.added_time < chosen.sim.added_time:
            chosen = better
            note = f"{note}; dropped the recomputes the budget does not need (planner/polish.py)".lstrip("; ")
    # The bound holds over the model's plans (fixed order, <= C computations per node); a
    # baseline outside the model can beat it, and then no bound is claimed. The parts-aware
    # model's claims none (bench/claims_fuzz.py seed 10 at 64 bytes: "optimal" at +30, a plan
    # computing a node four times +21); on small problems the exact search, which frees parts
    # apart as simulate() does (within planner.least.PARTS_STATES), backs one in either model
    claims = r2 is not None and not m2.parted
    bound = m2.time_of_bound(r2.bound) if claims else None
    if bound is not None:
        bound = max(0.0, bound)
    added = chosen.sim.added_time
    optimal = claims and r2.status == "OPTIMAL" and chosen.plan is r2.plan
    if closure is not None:
        in_time = m2.time_of_objective(closure.value)
        # compared in the model's units: in time units, rounding may put the bound a hair off
        if m2.objective_of_counts(chosen.sim.compute_counts) <= closure.value:
            optimal = True
        elif bound is None or bound > added or in_time > bound:
            bound = in_time
    exact = _exact_cheapest(problem, budget)
    if exact is not None:  # nothing in this order is cheaper than the exact search's plan
        if exact.sim.added_time < added:
            chosen, added = exact, exact.sim.added_time
            note = "the exact search's cheapest plan (planner/least.py): no plan of the solver's model is this cheap"
        optimal = True
    if optimal:
        bound = added
    elif bound is not None and bound > added:
        bound = None
    gap = None if bound is None else (0.0 if added <= 0 else max(0.0, (added - bound) / added))
    return _empty(
        problem, budget, "cpsat", status="optimal" if optimal or gap == 0.0 else "feasible",
        plan=replace(chosen.plan, strategy="cpsat"), peak_bytes=chosen.sim.peak_bytes, added_time=added,
        solver=_stats(opt, t0, bound, gap, phases), note=note,
    )


def _lightened(problem: PlanningProblem, budget: int, c: Candidate, opt: PlannerOptions) -> Candidate:
    """``c``, a fitting plan too heavy to hint the model (a node computed more often than
    ``heavy_hint_computations``), polished (planner/polish.py) where that makes it light enough or
    cheaper; else ``c``. (The kept-set plan of RL1000 at 50%, still heavy once polished: that
    polish was dropped and the search's end polished the plan again from the start, +16,221%.)"""
    if c.sim.peak_bytes > budget or _max_computations(c) <= opt.heavy_hint_computations:
        return c
    better = Candidate(*polished(problem, c.plan, c.sim, budget, clock.now() + POLISH_SHARE * opt.time_limit,
                                 keep_firsts=True))
    light = _max_computations(better) <= opt.heavy_hint_computations
    return better if light or better.sim.added_time < c.sim.added_time else c


def _exact_cheapest(problem: PlanningProblem, budget: int, max_nodes: int = MAX_NODES,
                    max_states: int = MAX_STATES) -> Candidate | None:
    """The cheapest plan in ``problem``'s order over every recompute plan (planner/least.py), on
    problems of at most ``max_nodes`` nodes whose search stays within ``max_states``; else None.
    The CP-SAT model lays out a few recompute slots per step and counts the computes sharing one
    together, so its "optimal" can miss a plan that recomputes a buffer early, before an unrelated
    step (random 4-16 node DAGs, one worker: 14 of 300 of its optimal plans dearer than this
    search's, by up to 17 cost units)."""
    found = cheapest_plan(problem, budget, max_nodes, max_states)
    return None if found is None else Candidate(found[1], simulate(problem, found[1], budget))


def _exact_result(problem: PlanningProblem, budget: int, cheapest: Candidate, opt: PlannerOptions, t0: float,
                  phases: list[PhaseResult]) -> SolveResult:
    """The solve's result where no plan of the CP-SAT model fits and the exact search found the
    cheapest plan of every one in this order: optimal, over more plans than the model's."""
    sim = cheapest.sim
    return _empty(problem, budget, "cpsat", status="optimal", plan=replace(cheapest.plan, strategy="cpsat"),
                  peak_bytes=sim.peak_bytes, added_time=sim.added_time,
                  solver=_stats(opt, t0, sim.added_time, 0.0, phases),
                  note="no plan of the solver's model fits; the exact search's cheapest plan (planner/least.py)")


def _lowest_greedy(problem: PlanningProblem, budget: int, usable: list[Candidate], steps: int,
                   max_computations: float, deadline: float = float("inf")) -> Candidate:
    """The lowest-peak start for phase 1: bisect the greedy's budget between ``budget`` (where it
    failed) and the unplanned peak, so the search starts from a plan as low as the greedy gets.
    Only plans that hint the model count (none computing a node more than ``max_computations``;
    math.inf: every plan, for least_peak's lowest plan found).
    No greedy run starts after ``deadline`` (perf_counter seconds)."""
    best = min(usable, key=lambda c: (c.sim.peak_bytes, c.plan.strategy))
    lo, hi = budget, best.sim.peak_bytes
    for _ in range(steps):
        mid = (lo + hi) // 2
        if mid <= lo:
            break
        g = baseline(problem, "greedy", mid, deadline)  # starts nothing after the deadline
        if g is not None and g.sim.peak_bytes <= mid and _max_computations(g) <= max_computations:
            hi, best = g.sim.peak_bytes, g
        else:
            lo = mid
    return best


def _max_computations(c: Candidate) -> int:
    return int(c.sim.compute_counts.max()) if len(c.sim.compute_counts) else 0


def _stats(opt: PlannerOptions, t0: float, bound, gap, phases: list[PhaseResult]) -> SolverStats:
    return SolverStats(
        wall_s=clock.wall_since(t0), bound=bound, gap=gap, seed=opt.seed, workers=opt.workers,
        phases=tuple({"name": r.name, "status": r.status, "wall_s": round(r.wall_s, 3)} for r in phases),
        clock=_clock_name(opt),
    )


def _clock_name(opt: PlannerOptions) -> str:
    """What ``opt.time_limit`` counts, for the plan JSON (planner/clock.py)."""
    return "work" if opt.work_limit else "wall"


def least_peak(problem: PlanningProblem, options: PlannerOptions, time_limit: float | None = None) -> tuple[int, int | None, bool]:
    """(lower, upper, exact): the least peak any plan reaches is at least ``lower``; the lowest
    plan found peaks at ``upper``; exact when they meet.

    A small problem gets the exact search (planner.least), unless the runtime may hold less than
    the problem counts (``PlanningProblem.runtime_exact``: in-place outputs and the like).
    Otherwise the floor is the lower bound (the model's bound and optimum hold over its own
    plans only, see planner.least), and the
    upper one is the lowest plan of the baselines at the floor or of CP-SAT minimising the peak
    within ``least_share`` of the time limit (on the wall clock only; on the work clock, or with
    ``least_share`` 0, the baselines' lowest plan).
    """
    floor = problem.memory_floor
    # the exact search counts what the problem counts; where the runtime holds less, it proves nothing
    exact = least_plan(problem) if problem.runtime_exact else None
    if exact is not None:
        return exact[0], exact[0], True
    t0 = clock.now()
    limit = time_limit if time_limit is not None else options.time_limit
    # the greedy within the ladder's window too: without a deadline its tight-budget run took
    # 107 s of the 2 s --time-limit at the floor of zoo:gpt?layers=32 (40%: infeasible after 115 s)
    cands = [c for c in (baseline(problem, s, floor, t0 + 0.5 * limit) for s in BASELINES) if c is not None]
    upper = min(c.sim.peak_bytes for c in cands)
    if upper <= floor:
        return floor, floor, True
    # the greedy's lowest plan, however often it computes a node (the model's hints may not)
    ladder = _lowest_greedy(problem, floor, cands, options.ladder_steps, math.inf, t0 + 0.5 * limit)
    upper = ladder.sim.peak_bytes
    if all(c is not ladder for c in cands):
        cands.append(ladder)
    if options.least_share <= 0 or clock.on_work_clock() or limit - (clock.now() - t0) < MIN_SEARCH_S:
        # Asked for the floor and the greedy's lowest plan only; or on the work clock, where this
        # min-peak model runs 25-400x longer in wall time than the deterministic seconds it is
        # charged (RL250 at 5%: 99 s for 2; RL1000 at 5%: 872 s for 2; zoo:unet?batch=2 adam at
        # 50%: 189 s for 2.5, and its figure only fell from 64.6% to 63.3% of the unplanned peak);
        # or the greedies spent the time: building the model only to search it for MIN_SEARCH_S
        # took seconds past the limit (zoo:gpt?layers=32 at 55%, --time-limit 2: a 5.5 s build and
        # hint, and the same lowest plan as the greedy's).
        return floor, upper, upper <= floor
    light = [c for c in cands if _max_computations(c) <= options.hint_computations]
    low = min(light, key=lambda c: (c.sim.peak_bytes, c.plan.strategy))
    m = RematModel(problem, None, options, [c.plan for c in light])
    m.set_objective_peak()
    h = m.hint_from_plan(low.plan)
    if h is not None:
        m.apply_hint(h)
    r = m.solve("least-peak", max(MIN_SEARCH_S, min(options.least_share * limit, limit - (clock.now() - t0))))
    if r.plan is not None:
        upper = min(upper, simulate(problem, r.plan).peak_bytes)
    return floor, upper, upper <= floor


def _infeasible(problem, budget, opt, t0, phases, least=None) -> SolveResult:
    if least is None and budget < problem.base_bytes:
        # Below what is resident throughout (weights, graph inputs): a unit slip, not a budget to
        # search under. The floor says it at once, where least_peak took the whole time limit
        # (zoo:gpt at 1 KiB: 60 s to report the same "at least" figure).
        least = (problem.memory_floor, None, False)
    if least is None:
        spent = clock.now() - t0
        least = least_peak(problem, opt, max(opt.least_search_s, opt.time_limit - spent))
    lower, upper, exact = least
    if exact:
        note = f"the least memory any plan reaches is {lower} bytes"
    else:
        note = f"the least memory any plan reaches is at least {lower} bytes" + (
            f" (best plan found: {upper} bytes)" if upper is not None else "")
    return _empty(problem, budget, "cpsat", status="infeasible", solver=_stats(opt, t0, None, None, phases),
                  least_bytes=lower, least_exact=exact, best_bytes=None if exact else upper, note=note)
