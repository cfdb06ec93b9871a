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
    points = [(r["strategy"], 100 * r["budget_fraction"], r["added_time_pct"]) for r in rows]
    return sweep_panels({title: points}, fmt, width=7)


def sweep_panels(panels: dict[str, Sequence[tuple[str, float, float | None]]], fmt: str = "png",
                 width: float = 5) -> bytes:
    """One panel per title: (strategy, budget %, added time % or None where no plan fits) points
    drawn as one line per strategy, budgets falling to the right; a ``fmt`` image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(panels)) or 1
    nrows = -(-len(panels) // cols) or 1
    fig, axes = plt.subplots(nrows, cols, figsize=(width * cols, 4 * nrows), dpi=110, squeeze=False)
    # a strategy keeps its colour in every panel, and every panel spans every budget asked for
    strategies = list(dict.fromkeys(s for points in panels.values() for s, _, _ in points))
    budgets = [x for points in panels.values() for _, x, _ in points]
    for ax, (title, points) in zip(axes.flat, panels.items()):
        for strategy in strategies:
            pts = sorted((x, y) for s, x, y in points if s == strategy and y is not None)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=strategy, color=f"C{strategies.index(strategy)}")
        pad = max(1.0, 0.05 * (max(budgets) - min(budgets)))
        ax.set_xlim(max(budgets) + pad, min(budgets) - pad)
        ax.set_xlabel("budget (% of the unplanned peak)")
        ax.set_ylabel("added time (% of one step)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    data = save_figure(fig, fmt)
    plt.close(fig)
    return data
