"""Node-set neighbourhood search on phase 2's model (planner.cpsat.RematModel).

CP-SAT's own LNS frees variables of the whole model; at tight budgets on the random layered graphs
phase 2 stays on its first plans for minutes (RL100 at 60%: +23.68% in 60 s, +21.36% in 300 s).
This search moves in a coarser space: which nodes may be recomputed at all. Each step solves phase
2's model restricted to the nodes the best plan recomputes plus a few others drawn at random, with
the objective below the best plan's (``RematModel.restricted``). A step either finds a cheaper plan
(it becomes the best and the hint), proves that the neighbourhood holds none (then the next draws
take more nodes), or runs out of its time (then they take fewer). When a neighbourhood holds every
node and none is cheaper, the best plan is optimal over the model's plans. After a few steps in a
row without a cheaper plan the search hands back to phase 2.

Measured on RL100 at 60% (given order, from phase 2's +26.34% plan of a 60 s solve): +20.84% after
1-6 steps of 2-3 s, with 8, 15 or 30 extra nodes per step. In the planner (planning._solve_cpsat,
10 deterministic s, bench/results/node_lns_stop21.md): RL100 at 60% +26.20% -> +22.61%,
ResNet50 at 40% +2.325% -> +2.24% (gap 5.67% -> 2.09%); RL100 at 65/68% and RL250 at 70%
unchanged; RL500 at 70% +9.45% -> +10.20% (gap 86.6% -> 61.8%). Drawing the nodes whose buffers
are live over the budget four times as often did not help (RL100 at 60%: +23.85%).

The draws come from a generator seeded with the solve's seed, and every step is limited in
deterministic seconds on either clock (planner/clock.py), so the search is repeatable wherever the
time limit does not cut it short.
"""
from __future__ import annotations

import logging
import time
from dataclasses import replace

import numpy as np

from planner import clock
from planner.cpsat import PhaseResult, RematModel

log = logging.getLogger(__name__)

# Fewest seconds worth starting a step with.
MIN_STEP_S = 0.1


def node_lns(m2: RematModel, best: PhaseResult, time_limit: float, step_work: float, size: int,
             seed: int, patience: int = 6) -> PhaseResult | None:
    """Search from ``best`` (a plan of ``m2`` with its objective) for at most ``time_limit``
    seconds on the planner's clock, ``step_work`` deterministic seconds at most per step,
    starting with ``size`` extra nodes per neighbourhood; it stops after ``patience`` steps in a
    row without a cheaper plan. Returns the best plan found with status "FEASIBLE", or
    "OPTIMAL" (and its objective as the bound) when a neighbourhood of every node proved that
    none is cheaper; else ``best`` itself with the status of the last step. None when there is
    nothing to search from or no time for a step."""
    if best.plan is None or best.objective is None or time_limit < MIN_STEP_S:
        return None
    n = m2.p.n
    rng = np.random.default_rng(seed)
    start, wall0 = clock.now(), time.perf_counter()
    status, improved, idle = "UNKNOWN", False, 0
    size = max(1, size)
    while idle < patience:
        left = time_limit - (clock.now() - start)
        if left < MIN_STEP_S:
            break
        recomputed = best.plan.recomputed(n)
        others = np.setdiff1d(np.arange(n), recomputed)
        drawn = rng.choice(others, size=min(size, len(others)), replace=False)
        whole = len(drawn) == len(others)
        nodes = sorted(set(recomputed) | set(drawn.tolist()))
        r = m2.solve("node-lns", left, model=m2.restricted(nodes, int(round(best.objective))), work=step_work)
        idle += 1
        status = r.status
        log.debug("node-lns: %d nodes, %s in %.2f s, objective %s (best %s)", len(nodes), r.status, r.wall_s,
                  r.objective, best.objective)
        if r.plan is not None and r.objective is not None and r.objective < best.objective:
            best, improved, idle = r, True, 0
            m2.apply_hint(r.values)
        elif r.status == "INFEASIBLE":  # nothing cheaper here
            if whole:  # ... nor anywhere in the model
                status = "OPTIMAL"
                break
            size = min(len(others), -(-size * 3 // 2))
        else:  # ran out of time: a smaller neighbourhood
            size = max(1, size * 2 // 3)
    wall = time.perf_counter() - wall0
    if status == "OPTIMAL":
        return replace(best, name="node-lns", status=status, wall_s=wall, bound=best.objective)
    return replace(best, name="node-lns", status="FEASIBLE" if improved else status, wall_s=wall, bound=None)
