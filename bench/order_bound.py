"""What the given node order costs at best: planner/order_bound.py's LP bound and its
recompute-closure bound on every recompute plan that computes nodes first in the graph's own order
(Checkmate's and Moccasin's plan space), next to memplan's cpsat plan from a
`memplan bench remat -o ROWS.json` run.

    python bench/order_bound.py [--graph RL100 ...] [--budgets 90,80,70,60] [--rows ROWS.json]

A cpsat plan below the bound in a memory-aware order beats every plan in the given order, the
optimal ones included. LP sizes grow as n^2: RL250 takes 10-15 s per budget, RL500 minutes.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.order_bound import INFEASIBLE, closure_bound, fixed_order_bound  # noqa: E402
from planner.problem import load_remat_json  # noqa: E402
from planner.remat_bench import find_graphs  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "remat"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", action="append", help="RL100, RL250, ... (default RL100 and RL250)")
    ap.add_argument("--budgets", default="90,80,70,60", help="percent of the unplanned peak")
    ap.add_argument("--rows", help="JSON of `memplan bench remat -o`: adds its cpsat plans")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds per LP")
    ap.add_argument("--closure-time-limit", type=float, default=60.0, help="seconds per closure bound")
    args = ap.parse_args()
    plans = {}
    if args.rows:
        for r in json.loads(Path(args.rows).read_text())["rows"]:
            if r["strategy"] == "cpsat":
                plans[r["graph"], r["budget_pct"]] = r
    print("| graph | budget | LP bound % | LP s | closure bound % | closure s | cpsat added % | cpsat order "
          "| beats every given-order plan |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, path in find_graphs(BENCH, args.graph or ["RL100", "RL250"]):
        p = load_remat_json(str(path))
        for pct in (int(x) for x in args.budgets.split(",")):
            budget = p.budget_for(pct / 100)
            t0 = time.perf_counter()
            bound = fixed_order_bound(p, budget, args.time_limit)
            secs = time.perf_counter() - t0
            shown = "none (LP not solved)" if bound is None else f"{100 * bound / p.total_cost:.2f}"
            t0 = time.perf_counter()
            # the graphs' costs are integers: the closure bound is in their own unit
            cb = closure_bound(p, budget, np.round(p.cost).astype(np.int64), args.closure_time_limit)
            csecs = time.perf_counter() - t0
            if cb is not None and cb.value == INFEASIBLE:
                cshown, cb = "no plan in this order", None
            else:
                cshown = "-" if cb is None else f"{100 * cb.value / p.total_cost:.2f}" + ("" if cb.exact else " (time limit)")
            best = max([b for b in (bound, cb and cb.value) if b is not None], default=None)
            r = plans.get((label, pct))
            added = r["added_pct"] if r and r["added_pct"] is not None else None
            beats = "" if added is None or best is None else ("yes" if added < 100 * best / p.total_cost - 1e-9 else "no")
            print(f"| {label} | {pct}% | {shown} | {secs:.1f} | {cshown} | {csecs:.1f} "
                  f"| {'' if added is None else f'{added:.2f}'} | {r['order'] if r else ''} | {beats} |", flush=True)


if __name__ == "__main__":
    main()
