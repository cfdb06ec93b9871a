"""Reference strategies: no remat, Chen et al.'s sqrt(n) checkpointing, and a budget greedy.

No remat and Chen drive one executor, :func:`keep_schedule`: walk the fixed order; before a node
runs, recompute any input that is not resident (with whatever it needs, once per step, in id
order); after it runs, free what the policy says. The policy is a ``keep`` mask plus a window:
  * a buffer nobody reads any more (directly, or through a recompute of a dropped reader) is freed;
  * a kept buffer stays until then;
  * any other buffer is freed as soon as its next read is more than ``window`` steps away.
So a segment recomputed for Chen's backward pass stays while its readers come soon, and whatever
the mask, the executor emits a valid schedule. The budget greedies live in planner/greedy.py and planner/chain_greedy.py.
All of them are comparison rows and hints for the CP-SAT model.
"""
from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass
from functools import partial

import numpy as np

from planner import clock
from planner.chain_greedy import checkpoint_greedy, effective_readers, missing_closure
from planner.greedy import evict_greedy, split_greedy_simulated
from planner.plan import Event, Plan
from planner.problem import PlanningProblem
from planner.simulate import Simulation, simulate
from planner.tight_greedy import tight_greedy_simulated

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """A baseline plan with its simulation (peak may exceed the budget it was asked for)."""

    plan: Plan
    sim: Simulation


def keep_schedule(problem: PlanningProblem, keep: np.ndarray, window: int, strategy: str) -> Plan:
    """Event schedule of the recompute-on-demand executor for a ``keep`` mask (module docstring)."""
    n = problem.n
    preds = problem.pred_lists
    keep_mask = keep | ~problem.recomputable  # made once (a random op): kept until its last reader
    readers = effective_readers(problem, keep_mask, window)
    # Python lists and one Event per (op, node), not numpy scalars and a new Event per event:
    # Chen's schedule of the lstm fixture (batch=8, seq=128) has 650k events and took 2.7 s
    keep = keep_mask.tolist()
    pinned = problem.pinned.tolist()
    resident = [False] * n
    pending = [0] * n  # computes of the current step still to read the buffer
    events: list[Event] = []
    computes = [Event("compute", x) for x in range(n)]
    frees = [Event("free", x) for x in range(n)]

    def should_free(u: int, t: int) -> bool:
        if pinned[u]:
            return False
        rs = readers[u]
        j = bisect.bisect_right(rs, t)
        if j == len(rs):
            return True  # no later reader
        return not keep[u] and rs[j] > t + window

    def free_if_done(u: int, t: int) -> None:
        if resident[u] and pending[u] == 0 and should_free(u, t):
            events.append(frees[u])
            resident[u] = False

    for t in range(n):
        chain = missing_closure(t, preds, resident)  # each recomputed once for this step
        for y in (*chain, t):
            for p in preds[y]:
                pending[p] += 1
        for x in (*chain, t):
            events.append(computes[x])
            resident[x] = True
            for p in preds[x]:
                pending[p] -= 1
                free_if_done(p, t)
        free_if_done(t, t)
    return Plan(tuple(events), strategy)


def no_remat(problem: PlanningProblem) -> Plan:
    """Every node once, each buffer freed after its last reader."""
    return keep_schedule(problem, np.ones(problem.n, dtype=bool), problem.n, "none")


def chen_sqrt(problem: PlanningProblem) -> Plan:
    """Chen et al. (2016): keep every ceil(sqrt(L))-th forward output, recompute the rest.

    Forward nodes are the non-backward ones when the problem marks a backward pass, else all
    nodes. Backward buffers are kept (freed after their last reader). The window is the segment
    length, so a segment recomputed for the backward pass stays until its readers ran.
    """
    n = problem.n
    fwd = np.arange(n) if problem.backward is None else np.nonzero(~problem.backward)[0]
    k = max(1, math.ceil(math.sqrt(len(fwd))))
    keep = np.ones(n, dtype=bool)
    drop = [int(v) for j, v in enumerate(fwd) if (j + 1) % k != 0]
    keep[drop] = False
    return keep_schedule(problem, keep, k, "chen")


def greedy(problem: PlanningProblem, budget: int, deadline: float = math.inf) -> Candidate | None:
    """The budget greedy: the cheapest fitting plan of the eviction and the split greedy
    (planner.greedy), the checkpoint greedy (planner.chain_greedy) and the tight-budget eviction
    greedy (planner.tight_greedy); None when none gets under ``budget``. No greedy starts after
    ``deadline`` (planner.clock.now() seconds), and each stops there: on RL1000 at tight budgets
    each takes 5-20 s and finds nothing, which made a 40 s solve take 120 s."""
    best: Candidate | None = None
    makers = (partial(evict_greedy, deadline=deadline), partial(split_greedy_simulated, deadline=deadline),
              partial(checkpoint_greedy, deadline=deadline),
              partial(tight_greedy_simulated, deadline=deadline))
    for make in makers:
        if clock.now() > deadline:
            break
        made = make(problem, budget)
        if made is None:
            continue
        plan, sim = made if isinstance(made, tuple) else (made, None)
        if (pruned := plan.without_unread(problem)) is not plan or sim is None:
            plan, sim = pruned, simulate(problem, pruned)
        if sim.peak_bytes <= budget and (best is None or sim.added_time < best.sim.added_time):
            best = Candidate(plan, sim)
    return best


def baseline(problem: PlanningProblem, strategy: str, budget: int, deadline: float = math.inf) -> Candidate | None:
    """Run one named baseline ("none", "chen", "greedy"); None when greedy finds no fitting plan
    (or none before ``deadline``)."""
    if strategy == "greedy":
        return greedy(problem, budget, deadline)
    plan = no_remat(problem) if strategy == "none" else chen_sqrt(problem)
    return Candidate(plan, simulate(problem, plan))
