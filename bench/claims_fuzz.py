"""Fuzz the planner's claims against the brute-force oracle (tests/oracle.py) on tiny problems
with parts (outputs that die apart), takes_over (in place), pinned outputs, scratch, base and
nodes that may not be recomputed, at budgets from below the least peak to the unplanned peak.

Per problem and budget, ``solve(p, budget, "cpsat")`` (2 s, one worker, seed 0) and:
  * a plan replays within the budget with the peak and added time the result says, and is no
    cheaper than the oracle's optimum in any order;
  * "optimal": the oracle's optimum in the order the plan computes nodes first in; the bound at
    most that;
  * "infeasible" only below the oracle's least peak, least_bytes at most it (equal where exact);
  * "timeout": best_bytes (a plan found) at least the oracle's least; where the oracle has a plan
    within the budget, a miss (counted, not a false claim);
  * at or above the unplanned peak: optimal, no added time.
The model holds a node's parts as one buffer (README: "optimal" and the bound cover the plans it
holds), so an "optimal" or a bound that only a plan freeing parts apart beats is printed as
``scope``, not ``FALSE``. One line per disagreement, then a summary.

    python bench/claims_fuzz.py [--start 0] [--count 100] [--minutes 20]
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.cpsat import PlannerOptions  # noqa: E402
from planner.planning import solve  # noqa: E402
from planner.problem import PlanningProblem  # noqa: E402
from planner.reorder import first_compute_order  # noqa: E402
from planner.simulate import InvalidPlanError, simulate  # noqa: E402
from tests import oracle  # noqa: E402

OPTS = PlannerOptions(time_limit=2, workers=1, seed=0)
EPS = 1e-9


def problem(seed: int) -> PlanningProblem:
    """A random 4-8 node problem, each drawing parts and takes_over where its graph allows."""
    rng = random.Random(seed)
    n = rng.randint(4, 8)
    preds: list[list[int]] = [[]]
    for i in range(1, n):
        preds.append(sorted(set(rng.sample(range(i), min(i, rng.choice([1, 1, 2, 2, 3]))))))
    size = [rng.randint(1, 30) for _ in range(n)]
    succ: list[list[int]] = [[] for _ in range(n)]
    for v, ps in enumerate(preds):
        for u in ps:
            succ[u].append(v)
    pinned = [False] * n
    pinned[-1] = rng.random() < 0.5
    over = [-1] * n
    for v in range(1, n):
        alone = [u for u in preds[v] if succ[u] == [v] and not pinned[u] and over[u] < 0]
        if alone and rng.random() < 0.4:
            over[v] = rng.choice(alone)
            size[v] = size[over[v]]
    parts: list[list[tuple[int, list[int]]]] = [[] for _ in range(n)]
    taken = {u for u in over if u >= 0}
    for u in range(n):
        if pinned[u] or u in taken or over[u] >= 0 or size[u] < 2 or rng.random() < 0.4:
            continue
        readers = succ[u]
        if len(readers) >= 2:
            cut = rng.randint(1, len(readers) - 1)
            shuffled = rng.sample(readers, len(readers))
            groups = [shuffled[:cut], shuffled[cut:]]
        elif rng.random() < 0.5:
            groups = [readers, []]  # an output nobody reads: released once made
        else:
            continue
        first = rng.randint(1, size[u] - 1)
        parts[u] = [(first, groups[0]), (size[u] - first, groups[1])]
    base = rng.choice([0, 0, 5, 17])
    return PlanningProblem.build(
        size=size, cost=[rng.randint(0, 9) for _ in range(n)], preds=preds, base_bytes=base,
        late_base_bytes=rng.choice([0, 0, base // 2]), pinned=pinned,
        scratch=[rng.choice([0, 0, 0, 3, 8]) for _ in range(n)],
        recomputable=[rng.random() > 0.15 for _ in range(n)], takes_over=over, parts=parts)


def check(p: PlanningProblem, budget: int, least: int) -> tuple[list[str], str]:
    """(disagreements, each "FALSE ..." or "scope ..."; the result's status)."""
    res = solve(p, budget, "cpsat", OPTS)
    out: list[str] = []
    if res.plan is None:
        if res.status == "infeasible":
            if budget >= least:
                out.append(f"FALSE infeasible, oracle least {least}")
            if res.least_bytes is None or res.least_bytes > least:
                out.append(f"FALSE least_bytes {res.least_bytes} > oracle least {least}")
            elif res.least_exact and res.least_bytes != least:
                out.append(f"FALSE least_bytes {res.least_bytes} exact, oracle least {least}")
        elif res.status == "timeout":
            if res.best_bytes is not None and res.best_bytes < least:
                out.append(f"FALSE best_bytes {res.best_bytes} < oracle least {least}")
            if budget >= least:
                out.append("miss timeout, oracle has a plan")
        else:
            out.append(f"FALSE status {res.status} without a plan")
        return out, res.status
    try:
        sim = simulate(p, res.plan, budget)
    except InvalidPlanError as e:
        return [f"FALSE plan does not replay: {e}"], res.status
    if sim.peak_bytes != res.peak_bytes or abs(sim.added_time - res.added_time) > EPS:
        out.append(f"FALSE peak/added {res.peak_bytes}/{res.added_time} simulate {sim.peak_bytes}/{sim.added_time}")
    any_order = oracle.cheapest(p, budget)
    if any_order is None or any_order > res.added_time + EPS:
        out.append(f"FALSE plan at +{res.added_time} cheaper than the oracle's {any_order} (the oracle's?)")
    order = first_compute_order(res.plan)
    in_order = oracle.cheapest(p, budget, order)
    one = oracle.cheapest(replace(p, parts=None), budget, order) if p.parts is not None else in_order
    if res.status == "optimal" and in_order is not None and res.added_time > in_order + EPS:
        kind = "scope" if one is not None and res.added_time <= one + EPS else "FALSE"
        out.append(f"{kind} optimal at +{res.added_time}, oracle in order +{in_order} (one buffer: {one})")
    bound = res.solver.bound
    if bound is not None and in_order is not None and bound > in_order + EPS:
        kind = "scope" if one is not None and bound <= one + EPS else "FALSE"
        out.append(f"{kind} bound {bound} > oracle in order +{in_order} (one buffer: {one})")
    if budget >= p.unplanned_peak and (res.status != "optimal" or res.added_time != 0):
        out.append(f"FALSE {res.status} +{res.added_time} at or above the unplanned peak")
    return out, res.status


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--count", type=int, default=100, help="problems")
    ap.add_argument("--minutes", type=float, default=20.0, help="stop after this long")
    args = ap.parse_args()
    stop = time.monotonic() + 60 * args.minutes
    solves = problems = misses = fits = 0
    found: dict[str, int] = {"FALSE": 0, "scope": 0}
    statuses: dict[str, int] = {}
    for seed in range(args.start, args.start + args.count):
        if time.monotonic() > stop:
            break
        p = problem(seed)
        least = oracle.least_peak(p)
        given = oracle.least_peak(p, list(range(p.n)))
        top = p.unplanned_peak
        problems += 1
        for budget in sorted({least - 1, least, given, (least + top) // 2, top - 1, top}):
            lines, status = check(p, budget, least)
            solves += 1
            fits += budget >= least
            statuses[status] = statuses.get(status, 0) + 1
            for line in lines:
                kind = line.split()[0]
                if kind == "miss":
                    misses += 1
                else:
                    found[kind] += 1
                print(f"seed {seed} budget {budget} (least {least}, given {given}, top {top}): {line}", flush=True)
    print(f"{problems} problems, {solves} solves {statuses}: {found['FALSE']} false claims, {found['scope']} "
          f"beyond the model's scope (parts apart), {misses} timeouts of {fits} budgets a plan fits "
          f"({100 * misses / max(fits, 1):.1f}%)")


if __name__ == "__main__":
    main()
