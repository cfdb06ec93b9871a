"""The swap greedy's plan of a model, planned and priced with copies beside compute and in line.

    python3 bench/swap_pricing.py 'zoo:gpt?batch=64' 0.35 [--device H100]

ONNX Runtime runs a written model's MemcpyToHost/FromHost on the CUDA EP's compute stream
(planner/devices.py COPIES_OVERLAP_COMPUTE): "in line" is what the written file costs there;
"beside" is what memplan said of the same plan before it priced copies so (stop 58). Prints one
markdown row per way of planning: the added time (% of the step's compute) priced each way.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import cli  # noqa: E402
from passes.plan_model import lower_graph  # noqa: E402
from planner.liveness import analyze  # noqa: E402
from planner.simulate import simulate  # noqa: E402
from planner.swap_greedy import swap_greedy  # noqa: E402
from planner.units import share_of  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("fraction", type=float, help="budget as a fraction of the unplanned peak")
    ap.add_argument("--device", default="H100")
    args = ap.parse_args()
    graph, _ = cli._graph_to_plan(args.model, {}, False)
    _, node_time, transfer, _ = cli._graph_costs(graph, args.device, "device", True)
    problem, _ = lower_graph(graph, node_time=node_time, transfer_time=transfer, time_unit="s")
    budget = share_of(analyze(graph).peak_bytes, args.fraction)
    print("| model | budget | planned with copies | swap-ins | added % priced beside | added % priced in line |")
    print("|---|---|---|---|---|---|")
    for planned in (True, False):
        plan = swap_greedy(dataclasses.replace(problem, copy_overlap=planned), budget)
        if plan is None:
            print(f"| {args.model} | {args.fraction:.0%} | {'beside' if planned else 'in line'} | no plan | | |")
            continue
        priced = [simulate(dataclasses.replace(problem, copy_overlap=ov), plan, budget) for ov in (True, False)]
        pct = [f"{100 * s.added_time / problem.total_cost:.2f}" for s in priced]
        print(f"| {args.model} | {args.fraction:.0%} | {'beside' if planned else 'in line'} | {priced[0].swap_ins} "
              f"| {pct[0]} | {pct[1]} |")


if __name__ == "__main__":
    main()
