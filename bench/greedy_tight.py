"""The budget greedy before and after the tight-budget eviction greedy (planner/tight_greedy.py).

"old" is the cheapest fitting plan of evict_greedy, split_greedy and checkpoint_greedy (what
planner.baselines.greedy ran before); "new" is planner.baselines.greedy now (those three and
tight_greedy). Budgets are fractions of each graph's unplanned peak; every plan is replayed by the
simulator against its budget. Prints a markdown table (graph, budget, status, added %, seconds).

    python bench/greedy_tight.py [--graph RL100 ...] [--budget 0.9 ...] [--gpt] [--markdown FILE]

--gpt adds the zoo GPT training step at batch 48 under 2037280 bytes (needs onnx).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.baselines import greedy  # noqa: E402
from planner.chain_greedy import checkpoint_greedy  # noqa: E402
from planner.fileio import atomic_write  # noqa: E402
from planner.greedy import evict_greedy, split_greedy  # noqa: E402
from planner.problem import PlanningProblem, load_remat_json  # noqa: E402
from planner.simulate import simulate  # noqa: E402

REMAT = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "remat"
GRAPHS = {
    "RL100": "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json",
    "RL250": "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json",
    "RL500": "random_layered_n500_w0.36_nlv0.75_ed0.2_scd0.14.json",
    "RL1000": "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json",
    "VGG16": "VGG16 (MLSys)_256_(224, 224, 3)_train_nx.json",
    "MobileNet": "MobileNet (MLSys)_512_(224, 224, 3)_train_nx.json",
}
RL_BUDGETS = (0.9, 0.8, 0.7, 0.6, 0.5)
CHECKMATE_BUDGETS = (0.9, 0.85, 0.8, 0.6, 0.5)  # VGG16 cannot go below 83.1% (its memory floor)


def old_greedy(problem: PlanningProblem, budget: int):
    """The cheapest fitting plan of the three greedies baselines.greedy ran before."""
    best = None
    for make in (evict_greedy, split_greedy, checkpoint_greedy):
        plan = make(problem, budget)
        if plan is None:
            continue
        sim = simulate(problem, plan, None)
        if sim.peak_bytes <= budget and (best is None or sim.added_time < best.added_time):
            best = sim
    return best


def new_greedy(problem: PlanningProblem, budget: int):
    cand = greedy(problem, budget)
    if cand is None:
        return None
    simulate(problem, cand.plan, budget)  # raises if the plan breaks the model or the budget
    return cand.sim


def cell(problem: PlanningProblem, budget: int, run) -> tuple[str, str, str]:
    start = time.perf_counter()
    sim = run(problem, budget)
    secs = time.perf_counter() - start
    if sim is None:
        return "over_budget", "-", f"{secs:.1f}"
    return "feasible", f"{100 * sim.added_time / problem.total_cost:.1f}", f"{secs:.1f}"


def gpt_problem() -> PlanningProblem:
    """zoo:gpt?batch=48 as `memplan plan` builds it (training step, H100 device profile)."""
    import cli
    from planner.lowering import lower

    graph, _ = cli._graph_to_plan("zoo:gpt?batch=48", {}, False)
    _, node_time, _, _ = cli._graph_costs(graph, "H100", "device")
    problem, _ = lower(graph, node_time=node_time, time_unit="s")
    return problem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", action="append", choices=sorted(GRAPHS), help="default: all")
    ap.add_argument("--budget", action="append", type=float, help="fraction of the unplanned peak")
    ap.add_argument("--gpt", action="store_true")
    ap.add_argument("--markdown", help="also write the table here")
    args = ap.parse_args()
    cases: list[tuple[str, PlanningProblem, list[tuple[str, int]]]] = []
    for name in args.graph or list(GRAPHS):
        p = load_remat_json(REMAT / GRAPHS[name])
        fracs = args.budget or (RL_BUDGETS if name.startswith("RL") else CHECKMATE_BUDGETS)
        cases.append((name, p, [(f"{round(100 * f)}%", p.budget_for(f)) for f in fracs]))
    if args.gpt:
        cases.append(("gpt b48", gpt_problem(), [("2037280 B", 2037280)]))
    lines = ["| graph | budget | old status | old added % | old s | new status | new added % | new s |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name, p, budgets in cases:
        for label, budget in budgets:
            row = f"| {name} | {label} | " + " | ".join(cell(p, budget, old_greedy) + cell(p, budget, new_greedy)) + " |"
            lines.append(row)
            print(row, flush=True)
    if args.markdown:
        atomic_write(args.markdown, ("\n".join(lines) + "\n").encode())


if __name__ == "__main__":
    main()
