"""Tight-budget eviction greedy: on-demand recompute with held (not locked) inputs.

Same executor idea as :func:`planner.greedy.evict_greedy`: walk the fixed order with exact event
accounting; before an allocation that would exceed the budget, free resident buffers by least
(recompute cost from what is resident) / (bytes * steps until next need ** ``power``); a missing
input is recomputed from its inputs, recursively. What changes, so that plans are found where
that greedy deadlocks at tight budgets:

* Held, not locked. evict_greedy locks the inputs of every compute in progress, so a deep
  recompute chain fills memory with locked buffers and the greedy gives up. Here only the
  inputs of the compute about to run are locked (they must be resident together). The inputs
  of computes further up the chain are *held*: freed only when nothing unheld is left, the one
  read furthest up the chain first, and recomputed again if they are missing when their reader
  runs (``rounds`` times, then the run gives up).
* Largest need first. A compute's missing inputs are recomputed in decreasing order of the
  memory their own chain needs (a Sethi-Ullman estimate from what is resident); an input
  fetched that way is held above the inputs that were merely resident.
* Closure mode. Recomputing each missing input of a step on its own repeats the ancestors they
  share (two backward buffers that both need the forward pass again). With ``closure`` the whole
  set of missing ancestors of the step is recomputed once, in id order, their inputs held.
* Shallow mode. With ``shallow`` a buffer is freed before the others only if its inputs are
  resident and no freed buffer needs it to be recomputed (its evicted neighbourhood is empty),
  so recompute chains stay short where memory allows.

:func:`tight_greedy` runs a few of these variants and keeps the cheapest plan that fits. Each run
is capped in events; once a plan is found, later runs stop at its event count (a run with more
events than a fitting plan recomputes more, so it would rarely be cheaper).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from planner import clock
from planner.chain_greedy import missing_closure, needed_later, next_need, over_missing, redoable
from planner.plan import Event, Plan
from planner.problem import PlanningProblem
from planner.simulate import Simulation, simulate


@dataclass(frozen=True)
class Variant:
    """One configuration of :func:`evict_run`."""

    power: float = 1.0  # weight of the distance to the next need in the eviction key
    closure: bool = False
    shallow: bool = False


#: Fetch rounds per compute, events per step so far (+1000) before a run counts as thrashing, and
#: the event cap of one run (per node, + 1000): see :func:`evict_run`.
ROUNDS, PACE, EVENTS_PER_NODE = 3, 8, 20

#: The variants :func:`tight_greedy` tries, in this order. Each finds the only or the cheapest
#: fitting plan on some graph and budget of the remat benchmark (bench/greedy_tight.py); those
#: that get through tight budgets most often come first, since the runs share a work budget.
VARIANTS = (
    Variant(closure=True),
    Variant(shallow=True, closure=True, power=2.0),
    Variant(power=2.0),
    Variant(closure=True, power=2.0),
    Variant(shallow=True),
    Variant(),
)


#: The last resort's run (:func:`long_run`): the variant that gets through the tightest budgets on
#: large graphs, with room for the many recomputes such a plan makes. RL1000 at 55% of its peak:
#: the plan takes 16704 events, 16.7 per node, where the paced runs stop at 8 per step (+ 1000)
#: and share 12 n + 3000 events.
LONG_VARIANT, LONG_PACE, LONG_EVENTS_PER_NODE = Variant(power=2.0), 20, 30
#: What one basic step of a run charges the work clock, in deterministic seconds: about its wall
#: time on the 2-core machine of the figures. A step is an event, a resident buffer weighed for
#: eviction, or a node the walks weighing it (or ordering a compute's inputs) visit. Charged per
#: event and node of the problem instead (0.7 us: RL1000's 16704 events in 12 s), the runs on
#: graphs that hold few buffers at a time were charged several times their work (the lstm fixture,
#: batch 1, seq 8, at 90%: 24 s for 0.26 s). Per step: 1.6-1.8 us on that fixture at 60-90% of
#: its peak, RL100 and RL250 at 60-80%.
STEP_SECONDS = 1.6e-6


def evict_run(problem: PlanningProblem, budget: int, variant: Variant = Variant(), rounds: int = ROUNDS,
              max_events: int | None = None, pace: int = PACE) -> Plan | None:
    """One run of the executor (module docstring); None when it gets stuck, passes
    ``max_events`` events (default 20 n + 1000), or more than ``pace`` events per step so far
    plus 1000: a thrashing run stops early (the plans found on the remat benchmark graphs make
    2 to 11 events per step, 11 only on RL100 where the 1000 covers it; thrashing runs, 20 and
    more). ``rounds``: how often a compute fetches again inputs freed while others were fetched."""
    return _run(problem, budget, variant, rounds, max_events, pace)[0]


def _run(problem: PlanningProblem, budget: int, variant: Variant, rounds: int,
         max_events: int | None, pace: int, deadline: float = math.inf) -> tuple[Plan | None, int]:
    """evict_run, and how many events the run made (its work, also when it failed). With a
    ``deadline`` (planner.clock.now() seconds) the run gives up once past it. It charges the work
    clock STEP_SECONDS per basic step, with no deadline too (later deadlines count it)."""
    p = problem
    n = p.n
    size = [int(x) for x in p.size]  # Python lists: this loop reads them element by element
    cost = [float(x) for x in p.cost]
    scratch = [int(x) for x in p.scratch]
    pinned = [bool(x) for x in p.pinned]
    reads = p.succ_lists
    preds = p.pred_lists
    power = variant.power
    resident = [False] * n
    live: set[int] = set()  # the resident ones
    gone = [False] * n  # computed before, freed since
    lock = [0] * n  # inputs of the compute about to run
    # per buffer, a stack of hold ranks from the computes up the chain that read it (the top one
    # is the deepest: 2 * depth, + 1 once fetched for that compute)
    held: list[list[int]] = [[] for _ in range(n)]
    recomputable = [bool(x) for x in p.recomputable]
    evictable = [bool(x) for x in p.recomputable & ~p.pinned]
    events: list[Event] = []
    mem = p.base_bytes
    cap = max_events if max_events is not None else EVENTS_PER_NODE * n + 1000
    t_now = 0
    charged = 0  # events charged to the work clock so far
    work = 0  # other basic steps (STEP_SECONDS) not charged yet
    # buffers needed_later found with no later need. They stay so as t_now grows, as buffers are
    # recomputed (fewer freed readers to reach through) and as such buffers are freed (see
    # needed_later); only freeing a buffer that may still be needed can revive them, so make_room
    # empties it. Kept for the whole run: emptied per release_dead, every call walked the freed
    # part of the graph again (zoo:gpt?layers=128: 91 of the greedy's 289 s).
    dead: set[int] = set()

    def too_long() -> bool:
        """Past the event cap, the pace, or the deadline."""
        nonlocal charged, work
        clock.charge((len(events) - charged + work) * STEP_SECONDS)  # with no deadline too
        charged, work = len(events), 0
        if len(events) > min(cap, pace * (t_now + 1) + 1000):
            return True
        return deadline != math.inf and clock.now() > deadline

    def redo_cost(v: int, memo: dict[int, float]) -> float:
        """Cost to recompute v from what is resident now (its missing ancestors included)."""
        over_missing(v, preds, resident, memo, lambda x: cost[x] + sum(memo[u] for u in preds[x] if not resident[u]))
        return memo[v]

    def chain_need(v: int, memo: dict[int, int]) -> int:
        """Bytes the recompute of v needs on top of what is resident (Sethi-Ullman estimate:
        the inputs needing most first, each held while the next is made)."""
        def need(x: int) -> int:
            kids = sorted((u for u in preds[x] if not resident[u]), key=lambda u: (-memo[u], u))
            acc, most = 0, 0
            for u in kids:
                most = max(most, acc + memo[u])
                acc += size[u]
            return max(most, acc + size[x] + scratch[x])

        over_missing(v, preds, resident, memo, need)
        return memo[v]

    def free(v: int, known_dead: bool = False) -> None:
        nonlocal mem
        if not known_dead:
            dead.clear()
        events.append(Event("free", v))
        resident[v] = False
        gone[v] = True
        live.discard(v)
        mem -= size[v]

    def deep(v: int) -> bool:
        """v's recompute would reach past its inputs, or a freed buffer needs v recomputed."""
        return any(not resident[u] for u in preds[v]) or any(gone[w] for w in reads[v])

    def make_room(need: int) -> bool:
        """Free buffers, best key first, until ``need`` more bytes fit (keys taken once per call)."""
        nonlocal work
        if mem + need <= budget:
            return True
        costs: dict[int, float] = {}
        needs: dict[int, int | None] = {}
        redo: dict[int, bool] = {}
        keys = []
        for v in live:
            if not evictable[v] or lock[v] or not redoable(v, preds, resident, recomputable, redo):
                continue
            nxt = next_need(v, reads, gone, t_now, needs)
            if held[v]:  # held last, the one read furthest up the chain first
                keys.append((3 + held[v][-1], redo_cost(v, costs) / max(1, size[v]), v))
            elif nxt is None:
                keys.append((0, -1.0, v))  # nobody reads it any more
            else:
                tier = 2 if variant.shallow and deep(v) else 1
                dist = max(1, nxt - t_now + 1)
                keys.append((tier, redo_cost(v, costs) / (max(1, size[v]) * dist ** power), v))
        work += len(live) + len(costs) + len(needs) + len(redo)
        keys.sort()
        for _, _, v in keys:
            free(v)
            if mem + need <= budget:
                return True
        return False

    def release_dead(nodes) -> None:
        for u in nodes:
            if resident[u] and lock[u] == 0 and not held[u] and not pinned[u] \
                    and not needed_later(u, reads, gone, t_now, dead):
                free(u, known_dead=True)

    def fetch(q: int, depth: int) -> bool:
        """ensure() an input of a compute at ``depth``; once there, it is held above the inputs
        that were merely resident (those are cheaper to fetch again than it)."""
        if not ensure(q, depth + 1):
            return False
        held[q][-1] = 2 * depth + 1
        return True

    def ensure(x: int, depth: int) -> bool:
        """Make x resident: fetch its missing inputs (largest need first), then compute it."""
        nonlocal mem, work
        if resident[x]:
            return True
        for q in preds[x]:
            held[q].append(2 * depth)
        ok = False
        for _ in range(rounds):
            if too_long():
                break
            memo: dict[int, int] = {}
            missing = sorted((q for q in preds[x] if not resident[q]), key=lambda q: (-chain_need(q, memo), q))
            work += len(memo)
            if not missing:
                ok = True
                break
            if not all(fetch(q, depth) for q in missing):
                break
        else:
            ok = all(resident[q] for q in preds[x])
        for q in preds[x]:
            held[q].pop()
        if ok:
            for q in preds[x]:
                lock[q] += 1
            ok = make_room(size[x] + scratch[x])
            for q in preds[x]:
                lock[q] -= 1
        if ok:
            events.append(Event("compute", x))
            resident[x] = True
            gone[x] = False
            live.add(x)
            mem += size[x]
        release_dead(preds[x])
        return ok

    def run_closure(t: int) -> bool:
        """Recompute every missing ancestor step t needs once, in id order, their inputs held
        until read; then compute t."""
        chain = missing_closure(t, preds, resident)
        for y in chain:
            for q in preds[y]:
                held[q].append(0)
        ok = True
        for y in chain:
            ok = ok and ensure(y, 1)
            for q in preds[y]:
                held[q].pop()
            release_dead(preds[y])
        return ok and ensure(t, 0)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * n + 100))
    try:
        for t in range(n):
            t_now = t
            if not (run_closure(t) if variant.closure else ensure(t, 0)):
                return None, len(events)
            t_now = t + 1
            release_dead((*preds[t], t))
    finally:
        sys.setrecursionlimit(limit)
    return Plan(tuple(events), "greedy"), len(events)


def tight_greedy(problem: PlanningProblem, budget: int, variants: tuple[Variant, ...] = VARIANTS,
                 work: int | None = None, deadline: float = math.inf) -> Plan | None:
    """The plan of :func:`tight_greedy_simulated`, without its simulation."""
    found = tight_greedy_simulated(problem, budget, variants, work, deadline)
    return found[0] if found is not None else None


def tight_greedy_simulated(problem: PlanningProblem, budget: int, variants: tuple[Variant, ...] = VARIANTS,
                           work: int | None = None, deadline: float = math.inf) -> tuple[Plan, Simulation] | None:
    """The cheapest plan within ``budget`` of :func:`evict_run` over ``variants``, with its
    simulation (the caller need not replay it again); None when no run fits. The runs share
    ``work`` events (default 12 n + 3000: the greedy runs several times per solve, and a
    thrashing run costs about a millisecond per event on large graphs); each run stops at
    20 n + 1000 events, and after the first fitting plan at that plan's count. No run starts, or
    goes on, after ``deadline`` (planner.clock.now() seconds)."""
    n = problem.n
    left = work if work is not None else 12 * n + 3000
    best: tuple[Plan, Simulation] | None = None
    for variant in variants:
        cap = min(EVENTS_PER_NODE * n + 1000 if best is None else len(best[0].events), left)
        if cap <= 0 or clock.now() > deadline:
            break
        plan, used = _run(problem, budget, variant, ROUNDS, cap, PACE, deadline)
        left -= used
        if plan is None:
            continue
        sim = simulate(problem, plan)
        if sim.peak_bytes <= budget and (best is None or sim.added_time < best[1].added_time):
            best = (plan, sim)
    return best


def long_run(problem: PlanningProblem, budget: int, deadline: float = math.inf) -> tuple[Plan, Simulation] | None:
    """The last resort for a solve that ends without a plan: one run of :data:`LONG_VARIANT` with
    :data:`LONG_PACE` events per step (+ 1000) and :data:`LONG_EVENTS_PER_NODE` per node (+ 1000),
    until ``deadline``; its plan and simulation when it fits ``budget``. RL1000 at 55% of its peak:
    a plan (+710% added time) in 12 s, where the solve and the paced greedies find none; at 52.5%
    none (the runs that get furthest, paced at 200, give up after 200 s)."""
    n = problem.n
    plan, _ = _run(problem, budget, LONG_VARIANT, ROUNDS, LONG_EVENTS_PER_NODE * n + 1000, LONG_PACE, deadline)
    if plan is None:
        return None
    sim = simulate(problem, plan)
    return (plan, sim) if sim.peak_bytes <= budget else None
