"""Phase 1 at tight budgets: the planner as it was (no phase-1 options) against now, per case.

Cases are those where phase 1 found no plan (bench/results/remat_sweep_rl_stop10.md): RL250 at
70/60%, RL500 at 60/50/40%, RL1000 at 50% of the unplanned peak, and zoo gpt at batch 48 under
2037280 bytes. Runs are sequential, 2 workers (gpt: 1, as its CLI report), 60 s (RL250, gpt)
or 120 s (RL500, RL1000). Seconds are wall time on a shared machine: noisy. Peak/budget is the
plan's, or for a timeout the best plan phase 1 found (how close it came).

    python3 bench/phase1_tight.py [--only RL250] [--out bench/results/phase1_tight.md]
"""
from __future__ import annotations

import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.cpsat import PlannerOptions  # noqa: E402
from planner.fileio import atomic_write  # noqa: E402
from planner.problem import load_remat_json  # noqa: E402

REMAT = ROOT.parent / "shared" / "benchmarks" / "remat"
GRAPHS = {
    "RL250": "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json",
    "RL500": "random_layered_n500_w0.36_nlv0.75_ed0.2_scd0.14.json",
    "RL1000": "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json",
}
# (label, graph, budget: fraction of the unplanned peak or bytes, seconds, workers)
CASES = [
    ("RL250", "RL250", 0.70, 60, 2), ("RL250", "RL250", 0.60, 60, 2),
    ("RL500", "RL500", 0.60, 120, 2), ("RL500", "RL500", 0.50, 120, 2), ("RL500", "RL500", 0.40, 120, 2),
    ("RL1000", "RL1000", 0.50, 120, 2),
    ("gpt48", "zoo:gpt?batch=48", 2037280, 60, 1),
]
# the options before this change: phase 1 with every subsolver, and no LNS on one worker
OLD = {"phase1_lns": False, "phase1_ignore_subsolvers": ()}


def run_case(graph: str, budget, seconds: int, workers: int, old: bool) -> dict:
    """Plan one case; returns status, added %, peak / budget and wall seconds."""
    from planner.planning import solve
    from planner.simulate import simulate

    opt = PlannerOptions(time_limit=seconds, workers=workers)
    if old:
        opt = replace(opt, **OLD)
    t0 = time.perf_counter()
    if graph.startswith("zoo:"):
        import cli
        from planner.units import parse_budget

        problem, res, _obj, _planned, b = cli._plan_onnx(graph, parse_budget(str(budget)), "cpsat", opt, "H100",
                                                          False, {}, False, {"optimizer": "none", "lr": 0.01})
    else:
        problem = load_remat_json(REMAT / GRAPHS[graph])
        b = int(budget * problem.unplanned_peak)
        res = solve(problem, b, "cpsat", opt)
    wall = time.perf_counter() - t0
    row = {"status": res.status, "added": None, "peak": None, "s": wall}
    if res.plan is not None:
        sim = simulate(problem, res.plan, b)  # raises if the plan does not fit
        row.update(added=100 * sim.added_time / problem.total_cost, peak=sim.peak_bytes / b)
    else:
        found = re.search(r"best plan found peaks at (\d+) bytes", res.note)
        row["peak"] = int(found.group(1)) / b if found else None
    return row


def fmt(row: dict) -> str:
    added = "-" if row["added"] is None else f"{row['added']:.2f}"
    peak = "-" if row["peak"] is None else f"{row['peak']:.3f}"
    return f"{row['status']} | {added} | {peak} | {row['s']:.1f}"


@click.command()
@click.option("--only", default=None, help="Run only the cases of this label (RL250, RL500, RL1000, gpt48).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the table here.")
def main(only, out) -> None:
    # peak/budget: of the plan, or without one of the best plan phase 1 found
    lines = ["| case | budget | old status | old added % | old peak/budget | old s "
             "| new status | new added % | new peak/budget | new s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    click.echo("\n".join(lines))
    for label, graph, budget, seconds, workers in CASES:
        if only and label != only:
            continue
        shown = f"{budget:.0%}" if isinstance(budget, float) else f"{budget} B"
        old = run_case(graph, budget, seconds, workers, old=True)
        new = run_case(graph, budget, seconds, workers, old=False)
        lines.append(f"| {label} | {shown} | {fmt(old)} | {fmt(new)} |")
        click.echo(lines[-1])
    if out:
        atomic_write(out, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
