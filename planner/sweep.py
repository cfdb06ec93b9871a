"""Budget sweep: added time of each strategy across budgets, as rows and as a plot (PNG, SVG or PDF)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from planner.cpsat import PlannerOptions
from planner.planning import plan_strategy, solve
from planner.problem import PlanningProblem
from planner.report import save_figure


def sweep(problem: PlanningProblem, fractions: Sequence[float], strategies: Sequence[str],
          options: PlannerOptions) -> list[dict[str, Any]]:
    """One row per (strategy, budget) of a problem (a JSON graph; ONNX models sweep with
    passes.plan_model.sweep_graph): what ``memplan plan --budget P% --strategy S`` reports for it,
    its budget the fraction of the problem's unplanned peak, its status, peak and added time (% of
    compute) when a plan fits (a baseline where the graph fits as it is returns it unplanned:
    planning.plan_strategy)."""
    rows = []
    options = replace(options, least_share=0.0)  # a row only says "infeasible", not how low plans get
    for strategy in strategies:
        for f in fractions:
            budget = problem.budget_for(f)
            r = solve(problem, budget, plan_strategy(problem, budget, strategy), options)
            ok = r.plan is not None
            rows.append({"strategy": strategy, "budget_fraction": f, "budget_bytes": budget, "status": r.status,
                         "peak_bytes": r.peak_bytes if ok else None,
                         "added_time_pct": 100.0 * r.added_time / r.compute_time if ok and r.compute_time else None,
                         "solve_s": round(r.solver.wall_s, 3)})
    return rows


def sweep_plot(rows: Sequence[dict[str, Any]], title: str, fmt: str = "png") -> bytes:
    """Budget (% of the unplanned peak) vs added time (%), one line per strategy, as a ``fmt`` image
    (planner.report.PLOT_FORMATS)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        pts = sorted((100 * r["budget_fraction"], r["added_time_pct"]) for r in rows
                     if r["strategy"] == strategy and r["added_time_pct"] is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=strategy)
    ax.set_xlabel("budget (% of the unplanned peak)")
    ax.set_ylabel("added time (% of one step)")
    ax.set_title(title)
    ax.invert_xaxis()
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    data = save_figure(fig, fmt)
    plt.close(fig)
    return data
