"""The remat benchmark: every strategy on the shared Checkmate/Moccasin train graphs at a sweep of
budgets (fractions of the no-remat peak, Moccasin's ceil convention). One row per graph, budget
and strategy; every plan in it has passed simulate() against its budget."""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable

from planner.cpsat import PlannerOptions
from planner.planning import solve
from planner.problem import PlanningProblem, load_remat_json
from planner.report import markdown_table, text_table
from planner.units import format_gap

log = logging.getLogger(__name__)

FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5, 0.4)
STRATEGIES = ("cpsat", "greedy", "chen")
#: The train graphs of the issue, in table order (label -> file-name prefix).
TRAIN_GRAPHS = {
    "VGG16": "VGG16 (MLSys)", "VGG19": "VGG19 (MLSys)", "MobileNet": "MobileNet (MLSys)",
    "ResNet50": "ResNet50 (MLSys)", "vgg_unet": "vgg_unet (MLSys)", "fcn_8_vgg": "fcn_8_vgg (MLSys)",
    "segnet": "segnet (MLSys)", "RL100": "random_layered_n100_", "RL250": "random_layered_n250_",
    "RL500": "random_layered_n500_", "RL1000": "random_layered_n1000_",
}


def find_graphs(directory: str | Path, labels: Iterable[str] | None = None) -> list[tuple[str, Path]]:
    """(label, path) of the train graphs in ``directory``; ``labels`` picks some (default: all)."""
    directory = Path(directory)
    files = sorted(p.name for p in directory.glob("*.json"))
    wanted = list(dict.fromkeys(labels)) if labels else list(TRAIN_GRAPHS)  # a label given twice: once
    out = []
    for label in wanted:
        prefix = TRAIN_GRAPHS.get(label)
        if prefix is None:
            raise KeyError(label)
        hits = [f for f in files if f.startswith(prefix) and ("_train_" in f or f.startswith("random_layered"))]
        if hits:
            out.append((label, directory / hits[0]))
    return out


def time_limit_for(n: int, base: float) -> float:
    """The issue's bars: 60 s for graphs up to 400 nodes, 120 s above (RL500, RL1000)."""
    return base if n <= 400 else 2 * base


def run(
    graphs: list[tuple[str, Path]],
    fractions: Iterable[float] = FRACTIONS,
    strategies: Iterable[str] = STRATEGIES,
    options: PlannerOptions | None = None,
    scale_time: bool = True,
    load: Callable[[Path], PlanningProblem] = load_remat_json,
) -> list[dict[str, Any]]:
    """Solve every (graph, budget, strategy); rows are plain dicts (JSON-ready). ``load`` reads a
    graph file (memplan bench remat --swap-bandwidth gives it a host link)."""
    options = options or PlannerOptions()
    rows: list[dict[str, Any]] = []
    for label, path in graphs:
        problem = load(path)
        opt = replace(options, time_limit=time_limit_for(problem.n, options.time_limit)) if scale_time else options
        for frac in fractions:
            budget = problem.budget_for(frac)
            group = []
            for strategy in strategies:
                res = solve(problem, budget, strategy, opt)
                row = {
                    "graph": label,
                    "n": problem.n,
                    "budget_pct": _percent(frac),
                    "budget_bytes": budget,
                    "strategy": strategy,
                    "status": res.status,
                    "peak_over_budget": None if res.peak_bytes is None else res.peak_bytes / budget,
                    "added_pct": None if res.added_time is None else 100 * res.added_time / problem.total_cost,
                    "solve_s": res.solver.wall_s,
                    "gap": res.solver.gap,
                    "least_bytes": res.least_bytes,
                    "least_pct": None if res.least_bytes is None else 100 * res.least_bytes / problem.unplanned_peak,
                    "least_exact": res.least_exact,
                    "time_limit_s": opt.time_limit if strategy == "cpsat" else None,
                    "note": res.note,
                    "order": res.order,
                    "swap_ins": 0 if res.plan is None else sum(res.plan.counts(problem.n)["swap_in"]),
                }
                group.append(row)
                log.warning("%s %g%% %s: %s", label, row["budget_pct"], strategy, " ".join(_cells(row)[4:]))
            _mark_comparison(group)
            rows.extend(group)
    return rows


def _percent(frac: float) -> int | float:
    """``frac`` as the percentage it was written as: 90 for 0.9, 72.5 for 0.725 (rounding it to
    an integer labelled 72.5% and 72.4% both "72%")."""
    pct = round(100 * frac, 6)
    return int(pct) if pct == int(pct) else pct


def _mark_comparison(group: list[dict[str, Any]]) -> None:
    """cpsat row: is its added time <= every baseline plan that fits the same budget?"""
    fits = [r["added_pct"] for r in group if r["strategy"] != "cpsat" and r["status"] in ("optimal", "feasible")]
    for r in group:
        if r["strategy"] == "cpsat":
            r["not_worse_than_baselines"] = (
                None if r["added_pct"] is None or not fits else bool(r["added_pct"] <= min(fits) + 1e-9)
            )


HEADER = ("graph", "N", "budget", "strategy", "status", "peak/budget", "added %", "solve s", "gap")


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    status = r["status"]
    if status == "infeasible" and r.get("least_pct") is not None:
        bound = "" if r.get("least_exact") else ">="
        # rounded up, as the least's share is a bound: 54.04% must not read as a 54.0% budget's
        status = f"infeasible (least {bound}{math.ceil(round(10 * r['least_pct'], 6)) / 10:.1f}%)"
    if r.get("order", "given") != "given":
        status += ", reordered"
    if r.get("swap_ins"):
        status += f", {r['swap_ins']} swap-ins"
    return (
        r["graph"], str(r["n"]), f"{r['budget_pct']:g}%", r["strategy"], status,
        "-" if r["peak_over_budget"] is None else f"{r['peak_over_budget']:.3f}",
        "-" if r["added_pct"] is None else f"{r['added_pct']:.2f}",
        f"{r['solve_s']:.1f}",
        format_gap(r["gap"]),
    )


def table(rows: list[dict[str, Any]]) -> str:
    return text_table(HEADER, [_cells(r) for r in rows])


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(HEADER, [_cells(r) for r in rows])


def plot(rows: list[dict[str, Any]], fmt: str = "png") -> bytes:
    """Added time (% of compute) vs budget (% of the no-remat peak), one line per strategy, one
    panel per graph, as a ``fmt`` image (planner.report.PLOT_FORMATS). Only plans that fit their
    budget are drawn (an over-budget row's added time is no point on the curve)."""
    from planner.sweep import sweep_panels

    panels: dict[str, list[tuple[str, float, float | None]]] = {}
    for r in rows:
        panels.setdefault(f"{r['graph']} (N={r['n']})", []).append(
            (r["strategy"], r["budget_pct"], r["added_pct"] if r["status"] in ("optimal", "feasible") else None))
    return sweep_panels(panels, fmt)
