"""Arena height vs lower bound on the zoo training graphs, unplanned and planned.

    python bench/arena_zoo.py [--budget 70%] [--strategy greedy]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import models  # noqa: E402
from passes.autodiff import training_graph  # noqa: E402
from passes.onnx_import import import_model  # noqa: E402
from passes.plan_model import plan_graph  # noqa: E402
from planner.alloc import liveness_buffers, solve  # noqa: E402
from planner.cpsat import PlannerOptions  # noqa: E402
from planner.liveness import analyze  # noqa: E402


def arena(graph):
    lv = analyze(graph)
    t = time.perf_counter()
    r = solve(liveness_buffers(lv), time_limit=30)
    return r, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=0.7, help="fraction of the unplanned training peak")
    ap.add_argument("--strategy", default="greedy")
    ap.add_argument("--size", default="small")
    args = ap.parse_args()
    print(f"{'model':10s} {'kind':9s} {'buffers':>7s} {'LB':>12s} {'height':>12s} {'height/LB':>9s} {'s':>6s}")
    for name in sorted(models.ZOO):
        g = training_graph(import_model(f"zoo:{name}?size={args.size}"))
        budget = math.ceil(analyze(g).peak_bytes * args.budget)
        pm = plan_graph(g, budget, strategy=args.strategy, options=PlannerOptions(time_limit=20))
        for kind, graph in (("unplanned", g), ("planned", pm.planned)):
            if graph is None:
                print(f"{name:10s} {kind:9s} no plan at {args.budget:.0%}")
                continue
            r, dt = arena(graph)
            n = len(liveness_buffers(analyze(graph)))
            print(f"{name:10s} {kind:9s} {n:7d} {r.lower_bound:12d} {r.height:12d} {r.height / r.lower_bound:9.4f} {dt:6.2f}")


if __name__ == "__main__":
    main()
