"""The CP-SAT model: keep, recompute or swap every buffer so the real peak fits a budget.

Formulation (interval model in the spirit of Moccasin; O(N*C + E*C^2) variables, never N^2):
  * node v has up to C_v *compute instances*: its original (always present) and optional
    recomputes, plus, when swapping is modelled, up to ``max_swap_ins`` optional *swap-in
    instances* (each after the one before, the first after the swap-out). Instance i
    starts at S_i, is ready d_i later and keeps its buffer resident on [S_i, E_i);
  * every present compute instance c of node w reads, for each input v, exactly one present
    instance j of v that is ready by S_c and resident until c is done (E_j >= S_c + d_w);
  * memory: one cumulative over the retention intervals (demand = size) and the compute
    intervals (demand = scratch) with capacity = budget - base: the liveness peak at every
    point of the axis, never a sum of saved bytes.

Axes. Recompute only (the default): a *slot* axis. Step t owns a few slots and its original
runs in the last one (a constant); recomputes go in any slot between their node and its last
reader. A slot may hold several computes: they run in node-id order (topological) and their
memory is counted together, which can only over-count, so decoded plans always replay within
budget. The objective is exact: sum of recompute costs. Slots per step come from the hints
(one compute per slot, so a hint maps exactly), and at least ``spare_slots`` plus one per
``fan_in_slots`` inputs of the step. With swapping: a real-time
axis in ticks (``time_resolution`` per unplanned run), one compute stream (no-overlap), a copy
stream each way (or the compute stream where copies cannot overlap), objective = makespan.
Either way the plan's added time is recomputed exactly by simulate().

Cuts that tighten the LP: at every original step t, a buffer live across t that is neither
recomputed nor swapped stays resident through t, so
    sum_{v live across t, not read by t} size_v * (1 - recomputed_v - swapped_v) <= capacity - need_t.

Phases (planner/planning.py): (1) when no baseline fits, minimise the capacity from the
lowest-peak baseline and stop at the first plan within budget; (2) minimise added time from the
best plan so far; when (2) ends without a proof, the recompute-closure bound, then (2) restricted
to the nodes its solution or the best plan recomputes (``RematModel.restricted``), then (2)
restricted to the best plan's nodes plus a few drawn at random, step by step (planner/node_lns.py),
then (2) again from the best plan unless that search proved it optimal. Fixed seed and workers; interleaved (deterministic) parallel search.
Phase 1 leans on LNS: it interleaves even on one worker, and leaves out CP-SAT's scheduling
neighbourhoods, which cost seconds each on this model (PlannerOptions.phase1_*).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np
from ortools.sat.python import cp_model

from planner import clock, cpsat_plans, interrupt
from planner.errors import GraphError, UsageError
from planner.plan import Plan
from planner.problem import PlanningProblem, gcd_of

log = logging.getLogger(__name__)

ORIGINAL, RECOMPUTE, SWAP_IN = 0, 1, 2


@dataclass(frozen=True)
class PlannerOptions:
    """Knobs of the CP-SAT planner; each says why it exists."""

    # Seconds for baselines and every solver phase together: wall seconds, or with ``work_limit``
    # CP-SAT's deterministic seconds (planner/clock.py).
    time_limit: float = 60.0
    # Count ``time_limit`` on the work clock: the same plan on any machine and under any load,
    # where a wall-clock limit may cut the search at another point (planner/clock.py).
    work_limit: bool = False
    # With ``work_limit``: the wall-clock reading (planner.clock.wall_deadline) past which every
    # solve stops anyway and says so, its plan then possibly another machine's than this one's
    # (``memplan --wall-cap``); math.inf: none. CP-SAT's deterministic seconds crawl on large
    # models: the lstm fixture (batch 32) at 80% with --time-limit 5 took 532 s (planner/clock.py).
    wall_deadline: float = math.inf
    # CP-SAT search workers; the product targets 2-core machines.
    workers: int = 2
    # Fixed seed: with the same workers, the same plan (search is interleaved, not racing).
    seed: int = 0
    # Computations allowed per node (original + recomputes). 3 = two extra where needed; a
    # hint that computes a node more often raises that node's count so hints stay representable.
    max_computations: int = 3
    # Swap-ins per swapped-out buffer (swap mode): the model brings a host copy back up to this many
    # times, each a swap-in instance after the one before ends. 1 left out plans that bring a copy
    # back twice (a buffer read before and after two steps that each need its room: +15 against
    # the model's best +60, tests/test_swap_greedy.py).
    max_swap_ins: int = 2
    # When phase 1 proves that no plan of its model fits the budget, it tries again with
    # max_computations doubled, up to this many (a buffer read by 8 far-apart readers, each after
    # a step that needs the memory it holds, is computed 9 times: tests/test_least.py).
    grown_computations: int = 12
    # Per-step knapsack cuts (module docstring): they give the LP a real lower bound.
    knapsack_cuts: bool = True
    # Deterministic parallel search (interleave_search); off races workers (faster, not repeatable).
    deterministic: bool = True
    # Share of the remaining time phase 1 (find any plan within budget) may use.
    feasibility_share: float = 0.95
    # The same when a fitting plan exists already (one too heavy to start phase 1 from, light
    # enough to hint phase 2: heavy_hint_computations): phase 2 then searches from the better of
    # that plan and phase 1's. Whatever the fallback costs: on
    # the resnet fixture (batch 32) at 60% the greedy's +111.9% plan kept phase 1 at its full share
    # without a plan, phase 2 never ran; with this share +105.9%. RL500 at 70%, RL1000 at 70/60%
    # and zoo:resnet at 50% gave the same plans either way (bench/results/phase1_share_stop36.md).
    fallback_feasibility_share: float = 0.3
    # Ticks per unplanned run on the real-time axis (swap mode only); fewer where every cost and
    # transfer is a whole number of a coarser unit (RematModel._set_scales: then one tick is that unit).
    time_resolution: int = 100_000
    # Recompute slots per step beyond what the hints use (slot axis): more freedom, bigger domains.
    spare_slots: int = 0
    # One more recompute slot before a step per this many inputs it reads (0: none). A step
    # reading many buffers may need many of them recomputed just before it, one slot each
    # (measured: RL100 at 60% got a plan in 17 s with 4, none in 60 s with 0 or 2; the
    # Checkmate graphs at 50% stay optimal).
    fan_in_slots: int = 4
    # Grow computation counts and slots so every hint fits the model (never worse than a hint).
    # Off gives a model that does not depend on the budget's hints (same slots at every budget).
    grow_from_hints: bool = True
    # Baseline plans computing some node more often than this are not used as hints (on random
    # DAGs Chen's plan recomputes nodes dozens of times and would blow the model up).
    hint_computations: int = 6
    # Fitting plans computing some node up to this often still hint phase 2 (the eviction
    # greedy's plans at tight budgets: RL1000 at 70% went from 23.1% to 18.9% added, measured).
    heavy_hint_computations: int = 12
    # Share of phase 2's time kept for the recompute-closure bound when phase 2 ends without a
    # proof (planner.order_bound.growing_closure_bound; zoo:gpt at 80%: 4.91% of the step time
    # against phase 2's 2.68%, in 3 s).
    closure_bound_share: float = 0.1
    # Share of phase 2's time its first search gets when the closure bound runs; the bound, the
    # searches guided by it and the node-set search (planner/node_lns.py) follow.
    phase2_share: float = 0.5
    # Share of phase 2's time the closure bound may take first, searched below the cheapest
    # fitting plan's cost: where it gets there, that plan is optimal and phase 2 does not run
    # (planning._fallback_proven).
    early_proof_share: float = 0.05
    # Share of what the bound leaves for searching first among the plans that recompute only
    # nodes the bound's solution or the best plan recomputes (planning._closure_guided; it stops
    # once optimal there: 0.8 s on RL250 at 70%, +2.079% -> +1.981%).
    closure_guided_share: float = 0.5
    # Share of what the guided search leaves for the closure bound's cut rounds
    # (planning._closure_cuts; RL250 at 70%, 60 s: gap 9.41% -> 4.14%, the same plan; 0.48% since
    # the closure bounds search only under the best plan and the rounds come before the node-set
    # search: bench/results/closure_below_stop45.md), and how many of the relaxation's cheapest
    # other nodes each round adds to the nodes it searches (10 stalled sooner:
    # bench/results/closure_cuts_stop44.md).
    closure_cuts_share: float = 1.0
    closure_cut_nodes: int = 5
    # Share of what is left after them for the node-set neighbourhood search (planner/node_lns.py);
    # the deterministic seconds one of its steps may take (on either clock, so that its steps end
    # the same way on any machine); the nodes it adds to the best plan's at first; and how many
    # steps in a row may find nothing cheaper before phase 2 searches on instead.
    node_lns_share: float = 0.7
    node_lns_step: float = 0.5
    node_lns_size: int = 12
    node_lns_patience: int = 6
    # Share of the time limit the min-peak search may take below the floor, where the budget is
    # infeasible at once and the search only lowers the "lowest plan found" figure (RL100 at 50%:
    # 61.4% of the unplanned peak in 15 s, 60.1% in 60 s; the floor, 54.1%, is what it claims).
    # 0: no search; the greedy's lowest plan is the figure (--max-batch only asks "does it fit").
    least_share: float = 0.25
    # Share of time_limit the whole solve gets where the budget is below the least peak any node
    # order may reach (PlanningProblem.order_free_floor): no plan fits, which is proven before any
    # search, and the time only lowers the "lowest plan found" figure. memplan check, a CI gate
    # whose verdict is all it needs, gives 0.1 (the mobilenetv2 fixture's training step at 60%:
    # 22 s of its 30 s limit for the same verdict and bound); plan keeps the whole limit.
    proven_share: float = 1.0
    # Greedy runs (bisection on its budget) for the lowest-peak start of phase 1.
    ladder_steps: int = 4
    # Share of the time left that the baselines' greedies may start in (planner.baselines.greedy:
    # on RL1000 at 40% each call took 20-40 s and found nothing; a 40 s solve then ran 120 s).
    baseline_share: float = 0.3
    # On the work clock (``work_limit``), the least charged seconds the comparison baselines'
    # greedies get whatever the share (planning._baselines): the plan returned is never dearer than
    # a fitting baseline's, and at short limits the share cut them off (zoo:unet at 60% with 0.3 s:
    # the given order's greedy, 0.16 charged s, never ran, and cpsat returned +0.000233 s against
    # its +0.000121 s; RL250 at 70% with 2 s: the memory-aware order's, 1.55 charged s, found no
    # plan, nor did the solve); their charges are taken back (clock.uncharged). The cap that
    # remains bounds graphs whose greedies take minutes (the lstm fixture, batch 8, seq 128, at
    # 80%: over 15 minutes of a ``--time-limit 1`` solve, 98% of it in these greedies, uncapped).
    baseline_work_floor: float = 5.0
    # Phase 1 on one worker: interleave the subsolvers, LNS included, instead of the lone
    # single-thread search (measured: RL100 at 68% gets a plan in 0.5 deterministic s this way,
    # none alone; on RL250 at 70% the search alone improved the start once in 30 s).
    phase1_lns: bool = True
    # LNS subsolvers phase 1 leaves out. The scheduling neighbourhoods of the remat model take
    # 1.5-4 s of wall time per 0.1 deterministic s (RL250, gpt), starving the cheaper graph and
    # random ones: without them RL250 reached 75.0% / 75.8% of the unplanned peak at 60% / 70%
    # budgets in 50 s, against 76.7% / 78.0% with them (noisy: shared 2-core machine).
    phase1_ignore_subsolvers: tuple[str, ...] = (
        "scheduling_intervals_lns", "scheduling_precedences_lns", "scheduling_time_window_lns")
    # Spare slots per step when no baseline fits (phase 1). 0 measured best on the random
    # layered graphs: smaller domains let LNS move faster than extra slots help.
    search_slots: int = 0
    # Full-search subsolvers in the portfolio (empty: CP-SAT's own list). One LP search leaves
    # the other worker's time to LNS, which finds the plans at tight budgets (measured).
    subsolvers: tuple[str, ...] = ("default_lp",)
    # Phase 1's full-search subsolvers on one worker, in place of ``subsolvers``: interleaved
    # there, default_lp's LP chunks took the LNS subsolvers' turns (a fuzzed model's 0.71 s phase 1:
    # 0.70 s in default_lp, each LNS once); no_lp still searches (and proves) but leaves LNS the
    # time. RL100 at 60%, 1 worker, 10 deterministic s: phase 1's plan in 1.52 s instead of 2.09.
    phase1_one_worker_subsolvers: tuple[str, ...] = ("no_lp",)
    # Fuse single-use chains first when the graph has more nodes than this (planner/coarsen.py).
    coarsen_above: int = 2000
    # Also plan in a memory-aware node order (planner/reorder.py) when its unplanned peak is at
    # least ``reorder_min_gain`` below the given order's; that solve gets ``reorder_share`` of the
    # time, the given order the rest (none, when its closure bound rules it out), and the cheaper
    # plan wins. Measured, 60 s, 2 workers: RL250
    # at 70% gets a plan only this way (+2.08%), RL100 at 70% +2.23% proven optimal in that order
    # (given order: +6.01%, gap 69%). A lower peak is not always an easier order: RL100 at 60%
    # stays cheaper in the given order (+23.68%; the other order alone: +49.3%), and with a 0.7
    # share the given order's solve got too little time for it (+29.5%).
    reorder: bool = True
    reorder_min_gain: float = 0.05
    reorder_share: float = 0.5
    # The least time a solve's later search gets, whatever the ones before it left: the given
    # order's after the memory-aware order's (planning._solve_reordered), the swap model's after the
    # recompute-only one's, the least peak of a budget no plan fits (planning._infeasible).
    # passes.plan_model's re-solves halve it with their limit: zoo:gpt at 70% --ort-arena
    # same-as-requested --deterministic, re-solves of 0.62, 0.31 and 0.16 s each gave the given
    # order's phase 1 this whole second, 10-18 wall s apiece (on the loaded 2-core machine).
    least_search_s: float = 1.0
    # Budgets within this share of the way from the least peak any order may reach
    # (PlanningProblem.order_free_floor) to the unplanned peak are searched first by the
    # depth-first walk over every order (planner/pebble.py), then the beams, for up to
    # ``early_walk_share`` of the time; the cheaper plan, polished, stands where the solve after
    # it finds none cheaper (RL100 at 55%: the beams', +64.2%). RL250 at
    # 60% (0.85% of the way): the walk's plan in 9 s, polished to +207.8%, where the model's
    # phase 1 finds none in 600 s; RL100 at 55% (2.0%): the model finds none either. Where the
    # walk goes through every state without a plan, no recompute plan fits: infeasible at once.
    early_walk_within: float = 0.05
    early_walk_share: float = 0.25
    # The early walk's polished plan is then walked for again, in up to this share of the time, over
    # the problem with its nodes numbered in the order that plan completes them (computes each for
    # the last time: reorder.last_compute_order), while that gives a cheaper plan
    # (planning._rewalked): the walks try their moves by node number, so the numbering picks the
    # plan they find. RL250 at 60%: +207.81% -> +108.51% in one more walk of 5.5 s (the next,
    # no cheaper, ends it; numbered by first computes instead: +129.07%, then +118.40%); RL100 at
    # 55% and 56%: the same plan again (one walk, 3 s).
    rewalk_share: float = 0.4
    # Problems of more nodes than this where no baseline fits in the given order, or each that
    # fits adds more than ``resorts_first_added`` of the compute time, run two of the last
    # resorts of a solve without a plan (planning._rescue) first, inside the limit, in
    # ``resorts_first_share`` of it: the kept-set search (where other orders are allowed), then
    # where it finds none the tight greedy's long run; a plan found is the solve's fallback.
    # RL1000 at 50%, ``--time-limit 120``: the plan came after the solve, its rescue's quarter,
    # the search and a polish (163 s wall); RL1000 and RL500 are the benchmark's graphs above 400.
    resorts_first_above: int = 400
    resorts_first_added: float = 0.5
    resorts_first_share: float = 0.25
    # ... and where no baseline fits at all, this share: the solve there rarely finds a plan of
    # its own, and the kept-set search often needs a second start (RL500 at 50%, ``--time-limit
    # 60``, seed 1: no plan in a quarter; +46,974% in half). RL1000 at 50% (120 s): +179.74% in a
    # quarter, +161.08% in half; at 55% +100.53% / +106.78% (wall clock, seed 0).
    resorts_first_unfit_share: float = 0.5
    # Where the kept-set search run first ends before its share does (it stops once its ladder and
    # fresh starts are spent), it starts again with the next seed in what is left, up to this many
    # searches in all, and the cheapest plan stands. RL500 at 50% (``--time-limit 60``, 120 s a
    # row, wall clock): seed 0's search ends after 18 s of its 60 at +422.6%, seed 1's after 22 s
    # at +309.3%.
    resorts_first_starts: int = 4
    # The order search's local moves may evaluate this many node positions per second of the
    # time limit (a count, so the same order on any machine; 40-50 ns each here, so at most a
    # quarter of the limit): uncapped, efficientnet's step (1794 nodes, batch 2) took 16 s of a
    # 10 s limit and left Chen's plan, +190%; now 2.6 s and +3.44%. mobilenetv2's best order
    # (0.719 of the unplanned peak, +0.37% at 70%) needs 4.5e7.
    reorder_work_per_s: float = 6e6
    # With swapping modelled: share of the time limit spent first on the whole recompute-only
    # solve (slot axis, fast; its node orders and bounds: planning._swap_after_recompute); its plan
    # hints the swap model, so enabling swap never costs more than recompute-only given this share
    # (measured: the time-axis model alone rarely beat the greedy in 30 s). A swap problem solved
    # by planning._solve_cpsat directly runs the recompute-only model first in this share of it.
    recompute_first_share: float = 0.4
    # Extra CP-SAT parameters as (name, value) pairs (experiments; empty by default).
    solver_params: tuple[tuple[str, object], ...] = ()
    # Solver log on stderr (debugging).
    log_search: bool = False

    def __post_init__(self) -> None:
        # CP-SAT reads num_workers 0 as "every core": a plan made so would not repeat on another
        # machine, and the plan said workers 0 (the model ran 1; -3 and 1.5 said so too).
        for name, what in (("workers", "CP-SAT search workers; the same seed and count give the same plan"),
                           ("max_swap_ins", "swap-ins per host copy in the swap model")):
            k = getattr(self, name)
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
                raise UsageError(f"{name} must be a whole number >= 1 ({what}), got {k!r}; pass e.g. {name}=2")


@dataclass
class _Instance:
    node: int
    kind: int  # ORIGINAL, RECOMPUTE or SWAP_IN
    start: cp_model.IntVar
    end: cp_model.IntVar  # retention end E
    present: cp_model.IntVar | int  # literal, or 1 for originals
    dur: int  # production time: compute duration, or transfer time for a swap-in


@dataclass(frozen=True)
class PhaseResult:
    name: str
    status: str  # CP-SAT status name
    wall_s: float
    objective: float | None
    bound: float | None
    plan: Plan | None
    values: dict | None  # variable index -> value, to hint the next phase


def objective_costs(cost: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-node compute costs as the integers the CP-SAT objective sums, and the time one unit
    stands for: integer costs divided by their gcd, others scaled to 1e9 units per step."""
    if np.all(cost == np.round(cost)) and cost.sum() < 2**50:
        g = gcd_of([int(c) for c in cost if c])
        return (cost // g).astype(np.int64), float(g)
    scale = 1e9 / max(cost.sum(), 1e-300)
    return np.round(cost * scale).astype(np.int64), 1.0 / scale


def recompute_objective(obj_cost: np.ndarray, counts: np.ndarray) -> int:
    """The added-time objective, in ``objective_costs`` units, of a recompute-only plan computing
    node i ``counts[i]`` times."""
    return int(((np.asarray(counts) - 1).clip(0) * obj_cost).sum())


def common_unit(values: np.ndarray, finest: float, max_denominator: int = 1 << 20) -> float | None:
    """The largest unit g >= ``finest`` that every value is a whole multiple of (within 1e-9
    relative), found over rationals with denominators up to ``max_denominator``; None where
    there is none (float seconds, mostly), or no nonzero value."""
    num, den = 0, 1
    for v in values:
        v = float(v)
        if v == 0.0:
            continue
        if not math.isfinite(v):
            return None
        f = Fraction(v).limit_denominator(max_denominator)
        if abs(float(f) - v) > 1e-9 * abs(v):
            return None
        # gcd of num/den and f.numerator/f.denominator
        d = den * f.denominator // math.gcd(den, f.denominator)
        num = math.gcd(num * (d // den), abs(f.numerator) * (d // f.denominator))
        den = d
        if num / den < finest:
            return None
    if num == 0:
        return None
    return num / den


class OutOfTime(Exception):
    """Building (or hinting) a model ran past its wall deadline (:class:`RematModel`)."""


#: Nodes (or hinted variables) between two looks at the clock while a model is built (or hinted).
CLOCK_EVERY = 256

#: Ticks all swappable transfers may take together on the timed axis (RematModel._set_scales): the
#: horizon stays near 2^41 ticks, the sum of every variable's domain within int64.
MAX_TRANSFER_TICKS = 2**40


class RematModel:
    """Builds the CP-SAT model for one problem; ``budget=None`` leaves the capacity free.
    ``deadline`` (a :func:`clock.now` reading): building stops with :class:`OutOfTime` once the
    wall clock passes it (or a work clock its wall cap), and so does :meth:`apply_hint` with
    its own; the lstm fixture (batch 8, seq 128: 2294 fused nodes) took 13 s to build, 9 s to
    hint and 12 s to load for its 0.05-s search under ``--time-limit 2``. On the work clock,
    uncapped, building charges nothing and never stops."""

    def __init__(self, problem: PlanningProblem, budget: int | None, options: PlannerOptions, hints: Sequence[Plan] = (),
                 deadline: float = math.inf, parts: bool = False):
        self.deadline = deadline
        self.p = problem
        self.budget = budget
        self.opt = options
        self.timed = problem.can_swap
        self.m = cp_model.CpModel()
        self._set_counts(hints)
        # per node, the input whose buffer it takes over (PlanningProblem.takes_over), -1 for none;
        # on ticks too (_add_reads): left out there, --swap could not reach the model's own peak
        # (a forward Split/Tanh model: 655360 bytes at least, against the model's 524352)
        self.takes_over = problem.takes_over if problem.takes_over is not None \
            else np.full(problem.n, -1, dtype=np.int64)
        self.parted = self._parted() if parts else {}
        self._set_scales()
        self._set_axis(hints)
        self.build()

    # ---- sizes of things -------------------------------------------------------------------
    def _set_counts(self, hints: Sequence[Plan]) -> None:
        """C_v: 1 for buffers that cannot or need not be recomputed, else max_computations."""
        p = self.p
        self.until = self._needed_until()
        useful = p.recomputable & (self.until > np.arange(p.n) + 1)
        counts = np.where(useful, self.opt.max_computations, 1)
        for plan in hints if self.opt.grow_from_hints else ():
            c = np.array(plan.counts(p.n)["compute"])
            counts = np.maximum(counts, np.where(p.recomputable, c, 1))
        self.counts = counts.astype(int)
        self.swappable = p.swappable & (self.until > np.arange(p.n) + 1) if self.timed else np.zeros(p.n, bool)
        # swap-in instances per swappable node: no more than the compute instances that may read v
        readers = np.array([int(counts[list(p.succ_lists[v])].sum()) for v in range(p.n)], dtype=int)
        self.swap_ins = np.where(self.swappable, np.minimum(self.opt.max_swap_ins, readers), 0).astype(int)

    def _parted(self) -> dict[int, tuple[int, ...]]:
        """The parts-aware model (``parts=True``): per node whose ``problem.parts`` it holds as
        buffers of their own, their bytes. A node swapped out, or taking over a buffer or taken
        over, stays one buffer (the swap-out moves every part, and a buffer taken over is counted
        once with its taker's): only over-counts. The one-buffer model (the default) over-counts
        such nodes too, and misses plans fitting only as the run frees parts apart (bench/
        claims_fuzz.py: ~30% of its budgets where the oracle fits ended "timeout"); it stays the
        default as the larger model searched slower on zoo:gpt at 70%."""
        p = self.p
        taken = set(int(u) for u in self.takes_over if u >= 0)
        return {v: tuple(int(b) for b, _ in node_parts) for v, node_parts in enumerate(p.parts or ())
                if node_parts and not self.swappable[v] and self.takes_over[v] < 0 and v not in taken}

    def _set_scales(self) -> None:
        p = self.p
        self.mem_unit = gcd_of([s for s in p.size if s] + [s for s in p.scratch if s]
                               + [b for sizes in self.parted.values() for b in sizes if b])
        self.size = (p.size // self.mem_unit).astype(int)
        self.scratch = (p.scratch // self.mem_unit).astype(int)
        cost = p.cost
        self.obj_cost, self.time_per_obj = objective_costs(cost)
        if self.timed:
            # the axis resolves the unplanned run; with all costs 0 there is none to resolve, and
            # its 1e-300 stand-in made one unit transfer 1e305 ticks (int64 overflow building the
            # model): then the swappable transfers span the axis (1.0 where they are 0 too)
            moved = float(p.transfer[self.swappable].sum())
            total = float(cost.sum()) or moved or 1.0
            # time units per tick; coarser where the transfers outlast the run 1e7-fold, so that
            # they span at most MAX_TRANSFER_TICKS (a 1e-12 --swap-bandwidth: CP-SAT refused a model
            # whose domains summed past int64)
            self.tick = max(total / self.opt.time_resolution, moved / MAX_TRANSFER_TICKS)
            # where every cost and transfer is a whole number of some coarser unit (integer costs,
            # bytes over an integer bandwidth), that unit: exact ticks, a coarser axis. A 6-node
            # graph (costs 1..50, 5-unit copies) at 1e5 ticks: swap model alone UNKNOWN after 10 s;
            # on 1-unit ticks OPTIMAL in 0.1 s
            unit = common_unit(np.concatenate([cost, p.transfer[self.swappable]]), self.tick)
            if unit is not None:
                self.tick = unit
            self.dur = np.maximum(1, np.round(cost / self.tick)).astype(int)
            # a whole number of ticks stays that (0.3 / 0.1 is 2.9999999999999996)
            q = p.transfer / self.tick
            q = np.where(np.abs(q - np.round(q)) <= 1e-9 * q, np.round(q), q)
            self.tr = np.maximum(1, np.ceil(q)).astype(int)
        else:
            self.tick = None
            self.dur = np.ones(p.n, dtype=int)
            self.tr = np.zeros(p.n, dtype=int)

    def _set_axis(self, hints: Sequence[Plan]) -> None:
        """Slot axis: step t owns slots [first_t, pos_t]; its original runs in the last one,
        recomputes in any slot. Step t gets as many recompute slots as any hint recomputes
        before it (so hints map one compute per slot), and at least ``spare_slots`` plus one
        per ``fan_in_slots`` inputs it reads."""
        p = self.p
        if self.timed:
            self.horizon = int((self.counts * self.dur).sum() + (self.tr * (self.swappable + self.swap_ins)).sum())
            self.lo = np.concatenate([[0], np.cumsum(self.dur)[:-1]])
            self.hi = self.horizon - np.cumsum(self.dur[::-1])[::-1]
            return
        extra = np.full(p.n, self.opt.spare_slots, dtype=int)
        if self.opt.fan_in_slots:
            extra += np.diff(p.pred_ptr).astype(int) // self.opt.fan_in_slots
        for plan in hints if self.opt.grow_from_hints else ():
            extra = np.maximum(extra, cpsat_plans.recomputes_per_step(plan, p.n))
        self.pos = np.cumsum(extra + 1) - 1  # slot of each original
        self.horizon = int(self.pos[-1]) + 1 if p.n else 0
        self.lo = self.pos
        self.hi = self.pos

    # ---- build ---------------------------------------------------------------------------
    def build(self) -> None:
        self._add_instances()
        self._add_order()
        self._add_swaps()
        self._add_reads()
        self._add_memory()
        # With a free capacity every step gets a dense cut; past a few hundred nodes presolving
        # them costs more than the bound they give (RL1000: 46 s), so phase 1 skips them there.
        if self.opt.knapsack_cuts and (self.budget is not None or self.p.n <= 400):
            self._add_knapsack_cuts()
        self._add_objective()
        self._check_clock(0)  # built past the deadline: nothing left to search it in

    def _check_clock(self, i: int, deadline: float | None = None) -> None:
        """Raise :class:`OutOfTime` where the ``i``-th step of a loop (looked at every
        :data:`CLOCK_EVERY`) finds ``deadline`` (the build's by default) passed."""
        if i % CLOCK_EVERY == 0 and _past(self.deadline if deadline is None else deadline):
            raise OutOfTime

    def _occupy(self, node: int) -> int:
        """Length of a compute on the axis: one slot, or its duration in ticks."""
        return int(self.dur[node])

    def _add_instances(self) -> None:
        """Instances, start domains and retention ends (E >= S + own compute).

        A recompute of v lies after v's original and no later than its last reader's original
        (slots) / ends before it starts (ticks). Originals are constants on the slot axis.
        """
        p, m = self.p, self.m
        self.inst: list[_Instance] = []
        self.of_node: list[list[int]] = [[] for _ in range(p.n)]
        self.part_end: dict[int, list[cp_model.IntVar]] = {}  # parted instance -> its parts' ends
        H = self.horizon
        until = self.until
        for v in range(p.n):
            self._check_clock(v)
            d = self._occupy(v)
            if self.timed:
                s = m.NewIntVar(int(self.lo[v]), int(self.hi[v]), f"S{v}")
            else:
                s = m.NewConstant(int(self.pos[v]))
            lo_s, hi_s = int(self.lo[v]), int(self.hi[v])
            if p.pinned[v]:
                e = m.NewConstant(H)
            elif not p.succ_lists[v]:
                e = m.NewIntVar(lo_s + d, hi_s + d, f"E{v}")
                m.Add(e == s + d)
            else:
                e = m.NewIntVar(lo_s + d, H, f"E{v}")
                m.Add(e >= s + d)
            self._add_part_ends(self._register(_Instance(v, ORIGINAL, s, e, 1, d)), lo_s + d)
            last = int(until[v])
            lo = (lo_s + d) if self.timed else int(self.pos[v]) + 1
            hi = (int(self.hi[last]) - d) if self.timed else int(self.pos[last])
            for k in range(1, int(self.counts[v])):
                lit = m.NewBoolVar(f"r{v}_{k}")
                s = m.NewIntVar(lo, max(lo, hi), f"S{v}_{k}")
                e = m.NewIntVar(lo + d, H, f"E{v}_{k}")
                m.Add(e >= s + d)
                m.Add(s == lo).OnlyEnforceIf(lit.Not())  # absent: pinned, no symmetry
                self._add_part_ends(self._register(_Instance(v, RECOMPUTE, s, e, lit, d)), lo + d)

    def _add_part_ends(self, j: int, lo: int) -> None:
        """E_{j,k} per part k of a parted instance j: S_j + own compute <= E_{j,k} <= E_j, raised
        by the reads of part k only (:meth:`_add_reads`); E_j stays the copy's free."""
        x = self.inst[j]
        if x.node not in self.parted:
            return
        ends = []
        for k in range(len(self.parted[x.node])):
            e = self.m.NewIntVar(lo, self.horizon, f"E{j}p{k}")
            self.m.Add(e >= x.start + x.dur)
            self.m.Add(e <= x.end)
            ends.append(e)
        self.part_end[j] = ends

    def _needed_until(self) -> np.ndarray:
        """Last step that may read v: its last reader, or later where a recomputed reader
        (of a reader...) needs it again."""
        p = self.p
        until = p.last_use.copy()
        for v in range(p.n - 1, -1, -1):
            for w in p.succ_lists[v]:
                if p.recomputable[w]:
                    until[v] = max(until[v], until[w])
        return until

    def _register(self, inst: _Instance) -> int:
        self.inst.append(inst)
        self.of_node[inst.node].append(len(self.inst) - 1)
        return len(self.inst) - 1

    def _add_order(self) -> None:
        """Recomputes of a node come after its original, in index order, present ones first.
        Ticks only: originals keep the fixed order and computes never overlap (one stream).
        Slots may hold several computes; they run in node-id order (a topological order) and
        their memory is counted together, which only over-counts."""
        m = self.m
        self.compute_iv = []
        for v, ids in enumerate(self.of_node):
            prev = self.inst[ids[0]]
            self.compute_iv.append((m.NewFixedSizeIntervalVar(prev.start, prev.dur, f"C{v}"), v))
            for i in ids[1:]:
                x = self.inst[i]
                m.Add(x.start >= prev.start + prev.dur).OnlyEnforceIf(x.present)
                if v in self.parted:
                    # decode merges overlapping copies, holding the first's parts to the second's
                    # reads, which the part ends would not count: copies of a parted node never
                    # overlap (no plan is lost: a compute needs its output not resident)
                    m.Add(x.start >= prev.end).OnlyEnforceIf(x.present)
                if prev.kind == RECOMPUTE:
                    m.AddImplication(x.present, prev.present)
                iv = m.NewOptionalFixedSizeIntervalVar(x.start, x.dur, x.present, f"C{v}_{i}")
                self.compute_iv.append((iv, v))
                prev = x
        self.compute_stream = [iv for iv, _ in self.compute_iv]
        if self.timed:
            orig = [self.inst[ids[0]] for ids in self.of_node]
            for a, b in zip(orig, orig[1:]):
                m.Add(a.start + a.dur <= b.start)
            if self.p.copy_overlap or not self.swappable.any():
                m.AddNoOverlap(self.compute_stream)

    def _add_swaps(self) -> None:
        """Swap-out after the original is produced (the original stays resident until the copy
        ends), swap-in after the swap-out ends; the swap-in instance is resident from its start.
        A node has up to ``swap_ins[v]`` swap-in instances, the k-th present only if the one before
        is and starting once that one's retention ends. ``swap_out[v]``: (literal, swap-out start,
        the swap-in instances in order)."""
        m, p = self.m, self.p
        self.swap_out: dict[int, tuple] = {}
        out_stream, in_stream = [], []
        for v in np.nonzero(self.swappable)[0]:
            v = int(v)
            orig = self.inst[self.of_node[v][0]]
            tr = int(self.tr[v])
            last = int(self.until[v])
            lit = m.NewBoolVar(f"w{v}")
            so = m.NewIntVar(int(self.lo[v]) + orig.dur, self.horizon, f"SO{v}")
            m.Add(so >= orig.start + orig.dur).OnlyEnforceIf(lit)
            m.Add(orig.end >= so + tr).OnlyEnforceIf(lit)
            m.Add(so == int(self.lo[v]) + orig.dur).OnlyEnforceIf(lit.Not())
            out_iv = m.NewOptionalFixedSizeIntervalVar(so, tr, lit, f"O{v}")
            lo_in = int(self.lo[v]) + orig.dur + tr
            hi_in = max(lo_in, int(self.hi[last]) - tr)
            idxs: list[int] = []
            # the first swap-in is present with the swap-out and starts after it; the k-th with the
            # one before, after that one's retention ends
            for k in range(int(self.swap_ins[v])):
                name, lo_k = (f"{v}_{k}" if k else f"{v}"), lo_in + k * tr
                if k:
                    prev = self.inst[idxs[-1]]
                    lit_k, after = m.NewBoolVar(f"w{name}"), prev.end
                else:
                    lit_k, after = lit, so + tr
                si = m.NewIntVar(lo_k, max(lo_k, hi_in), f"SI{name}")
                e = m.NewIntVar(lo_k + tr, self.horizon, f"EI{name}")
                if k:
                    m.AddImplication(lit_k, prev.present)
                m.Add(si >= after).OnlyEnforceIf(lit_k)
                m.Add(si == lo_k).OnlyEnforceIf(lit_k.Not())
                m.Add(e >= si + tr)
                in_stream.append(m.NewOptionalFixedSizeIntervalVar(si, tr, lit_k, f"I{name}"))
                idxs.append(self._register(_Instance(v, SWAP_IN, si, e, lit_k, tr)))
            self.swap_out[v] = (lit, so, tuple(idxs))
            out_stream.append(out_iv)
        if not out_stream:
            return
        if p.copy_overlap:
            m.AddNoOverlap(out_stream)
            m.AddNoOverlap(in_stream)
        else:
            m.AddNoOverlap(self.compute_stream + out_stream + in_stream)

    def _add_reads(self) -> None:
        """Each present compute instance c of w reads exactly one present instance j of every
        input v, ready before c starts and resident until c is done:
            x => S_j + ready_j <= S_c,   x => E_j >= S_c + d_w,
        where ready_j is d_v (ticks; 0 on slots: same slot, lower id first) or the transfer time
        of a swap-in. Where w takes over the buffer of input v (``takes_over``), the second is
        E_j >= S_c: a copy of v that c reads last becomes c's output, so the two are counted once
        (decode frees v right after c, and simulate() counts it so); on ticks not for an original
        that is also swapped out (the copy to host reads it). A recompute or swap-in nobody reads
        is absent."""
        m, p = self.m, self.p
        self.reads: list[tuple[int, int, int, object]] = []  # (consumer, input node, provider, literal)
        used_by: dict[int, list] = {}
        over = self.takes_over
        # the snake-case calls, bound once: the CamelCase ones go through OR-Tools' deprecation
        # wrapper, and this loop makes 1.6 million of them on the lstm fixture (batch 8, seq 128,
        # phase 1: 22.2 s -> 17.4 s here, the same model)
        add, new_bool, implies = m.add, m.new_bool_var, m.add_implication
        reads, inst, of_node, timed, swap_out = self.reads.append, self.inst, self.of_node, self.timed, self.swap_out
        part_end = self.part_end
        for w in range(p.n):
            self._check_clock(w)
            took = int(over[w])
            read_parts = dict(p.part_inputs.get(w, ())) if part_end else {}
            for c in of_node[w]:
                cons = inst[c]
                if cons.kind == SWAP_IN:
                    continue
                original = cons.kind == ORIGINAL
                done = cons.start + cons.dur
                for v in p.pred_lists[w]:
                    # read last by c, a copy of the input w takes over may end where c starts:
                    # c's own retention holds the buffer from there (PlanningProblem.takes_over)
                    need = cons.start if took == v else done
                    ids = of_node[v]
                    if len(ids) == 1:
                        for e in [inst[ids[0]].end] + self._read_ends(ids[0], read_parts.get(v, ())):
                            ct = add(e >= need)
                            if not original:
                                ct.only_enforce_if(cons.present)
                        reads((c, v, ids[0], 1 if original else cons.present))
                        continue
                    lits = []
                    for j in ids:
                        prov = inst[j]
                        x = new_bool(f"x{c}_{j}")
                        lits.append(x)
                        if prov.kind != ORIGINAL:
                            ready = prov.dur if (timed or prov.kind == SWAP_IN) else 0
                            implies(x, prov.present)
                            add(prov.start + ready <= cons.start).only_enforce_if(x)
                            used_by.setdefault(j, []).append(x)
                        for e in [prov.end] + self._read_ends(j, read_parts.get(v, ())):
                            add(e >= need).only_enforce_if(x)
                        if took == v and prov.kind == ORIGINAL and v in swap_out:
                            # an original copied to host is still read by the copy: the op writes
                            # its output elsewhere, and the two are held together (decode swaps it
                            # out after the op)
                            add(prov.end >= done).only_enforce_if([x, swap_out[v][0]])
                        reads((c, v, j, x))
                    if original:
                        m.add_exactly_one(lits)
                    else:
                        add(sum(lits) == cons.present)
        for j, one in enumerate(inst):
            if one.kind != ORIGINAL:
                lits = used_by.get(j, [])
                if lits:
                    m.add_bool_or(lits).only_enforce_if(one.present)
                else:
                    add(one.present == 0)

    def _read_ends(self, j: int, ks: Sequence[int]) -> list:
        """The ends of the parts ``ks`` of instance j, where j is parted (else none)."""
        ends = self.part_end.get(j)
        return [ends[k] for k in ks] if ends else []

    def _add_memory(self) -> None:
        """cumulative(retention intervals: size; compute intervals: scratch) <= capacity."""
        m, p = self.m, self.p
        base = p.base_bytes
        floor = -((-(p.memory_floor - base)) // self.mem_unit)
        top = -((-(p.one_buffer_peak - base)) // self.mem_unit)  # the no-remat plan in this model's terms
        if self.budget is None:
            self.cap = m.NewIntVar(max(0, floor), max(top, floor), "capacity")
        else:
            self.cap = m.NewConstant(max(0, (self.budget - base) // self.mem_unit))
        ivs, demands = [], []
        self.lengths: list[tuple[cp_model.IntVar, cp_model.IntVar, _Instance]] = []  # (length, end, instance)
        for j, x in enumerate(self.inst):
            self._check_clock(j)
            # a parted instance: one interval per part, to the part's end
            spans = [(int(self.size[x.node]), x.end, f"{j}")] if j not in self.part_end else \
                [(b // self.mem_unit, e, f"{j}p{k}") for k, (b, e) in enumerate(zip(self.parted[x.node],
                                                                                   self.part_end[j]))]
            for size, end, name in spans:
                if size == 0:
                    continue
                length = m.NewIntVar(0, self.horizon, f"L{name}")
                m.Add(length == end - x.start)
                self.lengths.append((length, end, x))
                if x.kind == ORIGINAL:
                    iv = m.NewIntervalVar(x.start, length, end, f"R{name}")
                else:
                    iv = m.NewOptionalIntervalVar(x.start, length, end, x.present, f"R{name}")
                ivs.append(iv)
                demands.append(size)
        for iv, v in self.compute_iv:
            if self.scratch[v]:
                ivs.append(iv)
                demands.append(int(self.scratch[v]))
        m.AddCumulative(ivs, demands, self.cap)

    def _droppable_literals(self, v: int) -> list:
        lits = []
        ids = self.of_node[v]
        if len(ids) > 1 and self.inst[ids[1]].kind == RECOMPUTE:
            lits.append(self.inst[ids[1]].present)
        if v in self.swap_out:
            lits.append(self.swap_out[v][0])
        return lits

    def _add_knapsack_cuts(self) -> None:
        """At each original step t: buffers live across t, kept (not recomputed, not swapped),
        plus what t itself needs, fit the capacity (module docstring)."""
        m, p = self.m, self.p
        credit = np.where(self.takes_over >= 0, p.credit, 0)
        need = (p.step_need - credit - p.base_bytes - self._unread_parts()) / self.mem_unit
        last = p.last_use
        self.n_cuts = 0
        live: set[int] = set()
        # sweep t upward: v is live across t when v < t < last_use(v)
        ends: dict[int, list[int]] = {}
        for v in range(p.n):
            ends.setdefault(int(last[v]), []).append(v)
        for t in range(p.n):
            for v in ends.get(t, ()):
                live.discard(v)
            reads = set(p.pred_lists[t])
            # pinned buffers made before t are in need[t] already (step_need): not twice
            across = [v for v in sorted(live) if v not in reads and not p.pinned[v]]
            held = {v: self._held_across(v, t) for v in across}
            const = sum(held.values()) + math.ceil(need[t])
            terms = []
            for v in across:
                for lit in self._droppable_literals(v):
                    terms.append(held[v] * lit)
            if self.budget is not None:
                cap_val = max(0, (self.budget - p.base_bytes) // self.mem_unit)
                if const <= cap_val:
                    pass
                elif terms:
                    m.Add(sum(terms) >= const - cap_val)
                    self.n_cuts += 1
            elif terms:
                m.Add(sum(terms) + self.cap >= const)
                self.n_cuts += 1
            else:
                m.Add(self.cap >= const)
            if last[t] > t:
                live.add(t)

    def _held_across(self, v: int, t: int) -> int:
        """Units of v's original held across step t where kept (v < t < last_use(v)): all of
        it, or where parted, the parts a reader after t reads (the others may be freed by then)."""
        if v not in self.parted:
            return int(self.size[v])
        return sum(b for b, (_, readers) in zip(self.parted[v], self.p.parts[v]) if readers and readers[-1] > t) \
            // self.mem_unit

    def _unread_parts(self) -> np.ndarray:
        """Per step, the bytes of its parted inputs' parts it does not read: ``step_need`` counts
        every input whole, and a copy made for the step alone holds only what it reads; a step
        reading none of an input's parts holds none of it (``part_inputs`` lists it not: counted
        whole, the cut at such a step cut off the no-remat plan, tests/test_cpsat_parts.py)."""
        out = np.zeros(self.p.n, dtype=np.int64)
        inputs = self.p.part_inputs
        for v, sizes in self.parted.items():
            for w in self.p.succ_lists[v]:
                ks = dict(inputs.get(int(w), ())).get(v, ())
                out[w] += sum(b for k, b in enumerate(sizes) if k not in ks)
        return out

    def _add_objective(self) -> None:
        m = self.m
        if self.timed:
            self.makespan = m.NewIntVar(int(self.dur.sum()), self.horizon, "makespan")
            for x in self.inst:
                if x.kind == RECOMPUTE:
                    m.Add(self.makespan >= x.start + x.dur).OnlyEnforceIf(x.present)
            lastx = self.inst[self.of_node[-1][0]]
            m.Add(self.makespan >= lastx.start + lastx.dur)
            self._add_stream_load()
            self.time_expr = self.makespan - int(self.dur.sum())
        else:
            terms = []
            for x in self.inst:
                if x.kind == RECOMPUTE and self.obj_cost[x.node]:
                    terms.append(int(self.obj_cost[x.node]) * x.present)
            self.time_expr = sum(terms) if terms else m.NewConstant(0)

    def _add_stream_load(self) -> None:
        """Ticks only, redundant: every present interval of the compute stream (with copies in
        line, the copies too) lies in [0, makespan] without overlapping another, so
            makespan >= sum_v d_v + sum_{recompute i} d_i * present_i
                    (+ sum_v tr_v * swapped_v + sum_{swap-in i} tr_i * present_i).
        The no-overlap alone leaves the LP's makespan at the unplanned run's, so CP-SAT's bound
        stayed at 0 added time wherever its search did not finish (RL100 at 70%, in line,
        --swap-bandwidth 2: bound 0, gap 100%); with this row and the knapsack cuts it is what
        dropping bytes must cost at least."""
        m = self.m
        terms = [int(x.dur) * x.present for x in self.inst if x.kind == RECOMPUTE]
        if not self.p.copy_overlap:
            terms += [int(self.tr[v]) * lit for v, (lit, _so, _idxs) in self.swap_out.items()]
            terms += [int(x.dur) * x.present for x in self.inst if x.kind == SWAP_IN]
        if terms:
            m.Add(self.makespan >= int(self.dur.sum()) + sum(terms))

    # ---- hints ---------------------------------------------------------------------------
    def hint_from_plan(self, plan: Plan) -> dict[int, int] | None:
        """Variable values reproducing a recompute-only plan (None if the model cannot hold it)."""
        return cpsat_plans.hint_values(self, plan)

    def lower(self, var: cp_model.IntVar) -> int:
        """Lower end of a variable's domain."""
        return int(self.m.Proto().variables[var.Index()].domain[0])

    def upper(self, var: cp_model.IntVar) -> int:
        """Upper end of a variable's domain."""
        dom = self.m.Proto().variables[var.Index()].domain
        return int(dom[len(dom) - 1])  # the proto's repeated field reads [-1] as 0

    def values_by_name(self, values: dict[int, int]) -> dict[str, int]:
        proto = self.m.Proto()
        return {proto.variables[i].name: v for i, v in values.items() if proto.variables[i].name}

    def hint_by_name(self, named: dict[str, int]) -> dict[int, int]:
        proto = self.m.Proto()
        return {i: named[var.name] for i, var in enumerate(proto.variables) if var.name in named}

    def apply_hint(self, values: dict[int, int], deadline: float = math.inf) -> None:
        """Hint ``values`` (by variable index); past ``deadline`` (as the build's), :class:`OutOfTime`."""
        self.m.ClearHints()
        proto = self.m.Proto()
        variables = proto.variables
        hinted: list[int] = []
        hinted_values: list[int] = []
        for i, idx in enumerate(sorted(values)):
            self._check_clock(i, deadline)
            dom = variables[idx].domain
            if len(dom) == 2 and dom[0] == dom[1]:
                continue
            hinted.append(idx)
            hinted_values.append(int(values[idx]))
        self._check_clock(0, deadline)
        # one bulk extend of each field, as AddHint would append them one by one (a variable by
        # its proto index is never negated): AddHint's per-call proto access took 8.7 s of the
        # lstm fixture's (batch=8, seq=128) solve
        hint = proto.solution_hint
        hint.vars.extend(hinted)
        hint.values.extend(hinted_values)

    # ---- solve ---------------------------------------------------------------------------
    def restricted(self, nodes: Sequence[int], below: int) -> cp_model.CpModel:
        """This model with recomputes only of ``nodes`` and an objective below ``below``: a copy
        (same variables, so its solutions decode and hint this model) for ``solve(model=...)``."""
        sub = self.m.Clone()
        # The hint (this model's incumbent) breaks the objective cut below, and CP-SAT 9.15's deterministic
        # parallel search aborts the process on a complete infeasible hint ("Check failed:
        # heuristics.fixed_search != nullptr"; zoo:gpt?batch=64 at 5826738 bytes, --device cpu
        # --deterministic): the copy goes without it.
        sub.ClearHints()
        keep = set(nodes)
        for x in self.inst:
            if x.kind == RECOMPUTE and x.node not in keep:
                sub.Add(x.present == 0)
        sub.Add(self.time_expr <= below - 1)
        return sub

    def solve(self, name: str, time_limit: float, stop_at: int | None = None,
              model: cp_model.CpModel | None = None, work: float | None = None, seed: int | None = None) -> PhaseResult:
        """Run CP-SAT once; ``stop_at`` (min-peak mode) stops at the first capacity <= it.
        ``model``: a copy of this model to solve instead (:meth:`restricted`). ``work``: at most
        this many deterministic seconds as well, on either clock. ``seed``: CP-SAT's random seed
        instead of the options' one."""
        solver = cp_model.CpSolver()
        prm = solver.parameters
        clock.limit_solver(prm, time_limit)
        if work is not None:
            prm.max_deterministic_time = min(prm.max_deterministic_time, max(0.01, float(work)))
        prm.num_workers = max(1, int(self.opt.workers))
        prm.random_seed = int(self.opt.seed if seed is None else seed)
        phase1 = stop_at is not None
        if self.opt.deterministic and (prm.num_workers > 1 or (phase1 and self.opt.phase1_lns)):
            # on one worker, interleaving still runs the LNS subsolvers (one after another)
            prm.interleave_search = True
        one_phase1 = phase1 and prm.num_workers == 1 and prm.interleave_search
        for sub in self.opt.phase1_one_worker_subsolvers if one_phase1 else self.opt.subsolvers:
            prm.subsolvers.append(sub)
        if phase1:
            prm.ignore_subsolvers.extend(self.opt.phase1_ignore_subsolvers)
        prm.log_search_progress = bool(self.opt.log_search)
        if self.p.n > 400 or stop_at is not None or self.timed:
            # Probing a large model took most of the time (RL1000: 40 s); phase 1 looks for a plan,
            # not a proof, and without probing its LNS reached RL100 60% / RL250 80% in 60 s (measured).
            # On ticks (swap) it took 15 of 20 s on zoo:resnet?batch=8 at 60% (memory-aware order)
            # and ended the search before its first solution, the hint's; without it: +0% in 12 s.
            prm.cp_model_probing_level = 0
        for key, value in self.opt.solver_params:
            if isinstance(value, (tuple, list)):  # repeated field, e.g. ignore_subsolvers
                getattr(prm, key).extend(value)
            else:
                setattr(prm, key, value)
        callback = _StopAt(self.cap, stop_at) if stop_at is not None else None
        t0 = time.perf_counter()
        status = interrupt.solve(solver, self.m if model is None else model, callback)
        wall = time.perf_counter() - t0
        det = solver.ResponseProto().deterministic_time
        clock.charge(det)
        sname = solver.StatusName(status)
        log.debug("CP-SAT %s: %s in %.2f s wall, %.3f deterministic s (%d nodes)", name, sname, wall, det, self.p.n)
        if status == cp_model.MODEL_INVALID:
            raise GraphError(f"CP-SAT rejected the remat model: {(model or self.m).Validate()}")
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return PhaseResult(name, sname, wall, None, _bound(solver), None, None)
        values = dict(enumerate(int(x) for x in solver.ResponseProto().solution))
        plan = self.decode(solver, name)
        return PhaseResult(name, sname, wall, solver.ObjectiveValue(), _bound(solver), plan, values)

    # ---- decode --------------------------------------------------------------------------
    def decode(self, solver: cp_model.CpSolver, strategy: str) -> Plan:
        return cpsat_plans.decode(self, solver, strategy)

    def model_size(self) -> dict[str, int]:
        proto = self.m.Proto()
        return {
            "instances": len(self.inst),
            "variables": len(proto.variables),
            "constraints": len(proto.constraints),
            "reads": len(self.reads),
            "cuts": getattr(self, "n_cuts", 0),
        }

    # ---- conversions ---------------------------------------------------------------------
    def time_of_objective(self, obj: float | None) -> float | None:
        """Solver objective (or bound) -> added time in the problem's unit."""
        if obj is None:
            return None
        if self.timed:
            return float(obj) * float(self.tick)
        return float(obj) * self.time_per_obj

    def time_of_bound(self, obj: float | None) -> float | None:
        """A solver bound -> a lower bound on the added time, in the problem's unit, of every plan the
        model holds. On the timed axis each compute lasts ``round(cost / tick)`` ticks (at least 1)
        and each copy ``ceil(transfer / tick)``, so a plan's ticks may exceed its real time: a chain
        with 3-unit copies on a 0.0041 tick, optimum +48, had its bound converted to 48.0192. The
        bound gives back what rounding can add: a plan's tick schedule is longer than its real one by
        at most what each interval it may run (each compute instance, each copy to and from host)
        gained in rounding, and the unplanned run's ticks shorter by at most what each node lost.
        Exact ticks give back nothing; a cost-0 node (one tick) gives back a tick per instance."""
        t = self.time_of_objective(obj)
        if t is None or not self.timed:
            return t
        tick = float(self.tick)
        cost = np.asarray(self.p.cost, dtype=float)

        def off(ticks: np.ndarray, real: np.ndarray) -> np.ndarray:  # ticks' time - real time, 0 where exact
            d = ticks * tick - np.asarray(real, dtype=float)
            return np.where(np.isclose(d, 0.0, rtol=0.0, atol=1e-9 * tick), 0.0, d)

        gained = off(self.dur, cost)
        slack = float((self.counts * gained.clip(0)).sum() + (-gained).clip(0).sum())
        if self.swappable.any():
            moved = off(self.tr, self.p.transfer).clip(0)
            slack += float(((1 + self.swap_ins) * moved)[self.swappable].sum())
        return max(0.0, t - slack)

    def objective_of_counts(self, counts: np.ndarray) -> int:
        """:func:`recompute_objective` in this model's units (recompute-only models)."""
        return recompute_objective(self.obj_cost, counts)

    def bytes_of_capacity(self, cap: float | None) -> int | None:
        if cap is None:
            return None
        return int(math.ceil(cap - 1e-9)) * self.mem_unit + self.p.base_bytes

    def set_objective_time(self) -> None:
        self.m.ClearObjective()
        self.m.Minimize(self.time_expr)

    def set_objective_peak(self) -> None:
        self.m.ClearObjective()
        self.m.Minimize(self.cap)



#: CP-SAT's name for the solution it takes straight from a complete, feasible hint, before any
#: subsolver has run. Stopping the search on it aborts CP-SAT 9.15 with interleaved workers (2 or
#: more): the final response's solution is empty and its postsolve fails "Check failed:
#: solution->size() == postsolve_mapping.size() (0 vs. 9)", killing the process (phase 1 of a
#: 3-node problem whose no-remat hint already reached the target; stop_after_first_solution does
#: the same). One worker, or a search not interleaved, does not abort.
COMPLETE_HINT = "complete_hint"


class _StopAt(cp_model.CpSolverSolutionCallback):
    """Stop the search at the first solution whose capacity is within the target, but never on the
    solution that is the complete hint itself (see COMPLETE_HINT): the search goes on to the next
    one, which is within the target too (the objective only improves), or to its proof or limit."""

    def __init__(self, cap: cp_model.IntVar, target: int):
        super().__init__()
        self.cap, self.target = cap, target

    def on_solution_callback(self) -> None:
        if self.Value(self.cap) <= self.target and self.Response().solution_info != COMPLETE_HINT:
            self.StopSearch()


def _past(deadline: float) -> bool:
    """``deadline`` passed on the wall clock, or the work clock's wall cap passed (on the work
    clock no build time counts, so only the cap stops a build there)."""
    if math.isinf(deadline):
        return False
    if clock.on_work_clock():
        return clock.capped()
    return clock.now() > deadline


def _bound(solver: cp_model.CpSolver) -> float | None:
    b = solver.BestObjectiveBound()
    return float(b) if math.isfinite(b) else None
