"""memplan command line. Thin: parse, call planner/passes, print a table or one JSON object.

Exit codes: 0 ok, 1 check failed / budget infeasible, 2 usage, 3 bad input model, 4 solver gave no
plan in time. ``--json`` prints exactly one JSON object on stdout; logs go to stderr. Files are
written atomically and never on failure.
"""
from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Any, Callable

import click

from planner.errors import (
    BudgetInfeasibleError,
    ModelImportError,
    PlannerError,
    SolverTimeoutError,
    UsageError,
)

log = logging.getLogger("memplan")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_BAD_MODEL, EXIT_TIMEOUT = 0, 1, 2, 3, 4


def _exit_code(err: PlannerError) -> int:
    if isinstance(err, UsageError):
        return EXIT_USAGE
    if isinstance(err, ModelImportError):
        return EXIT_BAD_MODEL
    if isinstance(err, BudgetInfeasibleError):
        return EXIT_FAILED
    if isinstance(err, SolverTimeoutError):
        return EXIT_TIMEOUT
    return EXIT_FAILED


def handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn memplan errors into one stderr line and the documented exit code (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PlannerError as err:
            click.echo(f"memplan: error: {err}", err=True)
            sys.exit(_exit_code(err))
        except FileNotFoundError as err:
            click.echo(f"memplan: error: {err.filename or err}: no such file", err=True)
            sys.exit(EXIT_USAGE)
        except MemoryError:
            click.echo("memplan: error: out of host memory; try a smaller model size or batch", err=True)
            sys.exit(EXIT_FAILED)

    return wrapper


def emit_json(obj: Any) -> None:
    """Print exactly one JSON object on stdout."""
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=_json_default))


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def parse_dims(dims: tuple[str, ...]) -> dict[str, int]:
    """``--dim batch=32 --dim seq=128`` -> {"batch": 32, "seq": 128}."""
    out: dict[str, int] = {}
    for item in dims:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit() or int(value) <= 0:
            raise UsageError(f"--dim {item!r} must look like NAME=POSITIVE_INT, e.g. --dim batch=32")
        out[name.strip()] = int(value)
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-v info, -vv debug).")
@click.version_option(package_name="memplan")
def main(verbose: int) -> None:
    """memplan: static memory planning for ONNX training graphs."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="memplan: %(message)s")


# ---- commands ------------------------------------------------------------------------------
# Each command lives below; keep them thin.


# ---- plan + bench remat (planner helper) ---------------------------------------------------
def _load_planning_problem(model: str, swap_bandwidth: float | None, swap_overlap: bool):
    """MODEL -> PlanningProblem. JSON graphs here; ONNX models come with the importer."""
    from planner.problem import is_remat_json, load_remat_json

    if not is_remat_json(model):
        raise UsageError(f"MODEL {model!r}: plan reads Checkmate/Moccasin JSON graphs (*.json) so far")
    problem = load_remat_json(model)
    if swap_bandwidth is not None:
        if swap_bandwidth <= 0:
            raise UsageError(f"--swap-bandwidth must be > 0 bytes per cost unit, got {swap_bandwidth}")
        problem = problem.with_swap(problem.size / swap_bandwidth, copy_overlap=swap_overlap)
    return problem


def _resolve_budget(text: str, problem) -> int:
    from planner.units import parse_budget

    b = parse_budget(text)
    return b.bytes if b.bytes is not None else problem.budget_for(b.fraction)


@main.command()
@click.argument("model")
@click.option("--budget", "budget_text", required=True, help="Bytes with a unit (8GiB) or a percentage of the unplanned peak (60%).")
@click.option("--strategy", type=click.Choice(["cpsat", "greedy", "chen", "none"]), default="cpsat", show_default=True)
@click.option("--time-limit", type=click.FloatRange(min=0.1), default=60.0, show_default=True, help="Seconds for the whole solve.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True, help="CP-SAT search workers.")
@click.option("--max-computations", type=click.IntRange(min=1), default=3, show_default=True, help="Computations allowed per node.")
@click.option("--swap-bandwidth", type=float, default=None, help="JSON graphs: host link in bytes per cost unit; enables swap.")
@click.option("--swap-overlap/--no-swap-overlap", default=True, show_default=True, help="Transfers overlap compute (copy streams).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the plan JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as one JSON object.")
@click.option("--explain", is_flag=True, help="Say per tensor what was decided and why.")
@handles_errors
def plan(model, budget_text, strategy, time_limit, seed, workers, max_computations, swap_bandwidth, swap_overlap,
         output, as_json, explain) -> None:
    """Choose keep / recompute / swap for every tensor so the peak fits --budget."""
    from planner.cpsat import PlannerOptions
    from planner.explain import explain as explain_plan, explain_table
    from planner.fileio import atomic_write
    from planner.planning import solve
    from planner.units import format_bytes

    problem = _load_planning_problem(model, swap_bandwidth, swap_overlap)
    budget = _resolve_budget(budget_text, problem)
    options = PlannerOptions(time_limit=time_limit, seed=seed, workers=workers, max_computations=max_computations)
    result = solve(problem, budget, strategy, options)
    extra = {}
    if explain and result.plan is not None:
        extra["explain"] = explain_plan(problem, result.plan, budget)
    obj = result.to_json(problem, extra)
    if as_json:
        emit_json(obj)
    if result.plan is None:
        if result.status == "timeout":
            raise SolverTimeoutError(f"{result.note}; try a longer --time-limit or a larger --budget")
        least = result.least_bytes
        if result.status == "infeasible" and least is not None:
            word = "is" if result.least_exact else "is at least"
            raise BudgetInfeasibleError(
                f"infeasible: the least memory any plan reaches {word} {least} ({format_bytes(least)}); "
                f"budget {budget} ({format_bytes(budget)})", least_bytes=least)
        raise BudgetInfeasibleError(f"{result.note}; budget {budget} ({format_bytes(budget)}); try --strategy cpsat")
    if output:
        atomic_write(output, json.dumps(obj, indent=2) + "\n")
    if not as_json:
        unit = f" {problem.time_unit}" if problem.time_unit else ""
        click.echo(f"{problem.name}: {result.strategy} {result.status}")
        click.echo(f"  budget        {format_bytes(budget)} ({budget} B)")
        click.echo(f"  peak          {format_bytes(result.peak_bytes)} (unplanned {format_bytes(problem.unplanned_peak)})")
        click.echo(f"  added time    {result.added_time:g}{unit} ({obj['added_time_pct']:.2f}% of {problem.total_cost:g})")
        gap = result.solver.gap
        click.echo(f"  solver        {result.solver.wall_s:.2f} s, gap {'-' if gap is None else f'{100 * gap:.2f}%'}"
                   f", {len(obj['recomputed'])} recomputed, {len(obj['swapped'])} swapped")
        if result.note:
            click.echo(f"  note          {result.note}")
        if explain:
            click.echo(explain_table(extra["explain"]))


def _bench_group() -> click.Group:
    """The shared ``bench`` group (other benchmarks add their own subcommands to it)."""
    grp = main.commands.get("bench")
    if grp is None:
        @main.group("bench")
        def grp() -> None:
            """Solver and allocator benchmark tables."""
    return grp


@_bench_group().command("remat")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Folder of the remat JSON graphs (default: ../shared/benchmarks/remat beside the checkout).")
@click.option("--graph", "graphs", multiple=True, help="Graph label (VGG16, ResNet50, RL100, ...); repeatable. Default: all.")
@click.option("--budgets", default="90,80,70,60,50,40", show_default=True, help="Percentages of the no-remat peak.")
@click.option("--strategies", default="cpsat,greedy,chen", show_default=True)
@click.option("--time-limit", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="CP-SAT seconds per solve for graphs up to 400 nodes (doubled above).")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the rows as JSON.")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False), default=None, help="Write the table as Markdown.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
@handles_errors
def bench_remat(directory, graphs, budgets, strategies, time_limit, workers, seed, output, md_path, as_json) -> None:
    """keep/recompute strategies on the Checkmate/Moccasin train graphs at a sweep of budgets."""
    from pathlib import Path

    from planner import remat_bench
    from planner.cpsat import PlannerOptions
    from planner.fileio import atomic_write
    from planner.planning import STRATEGIES

    folder = Path(directory) if directory else Path(__file__).resolve().parent.parent / "shared" / "benchmarks" / "remat"
    if not folder.is_dir():
        raise UsageError(f"--dir {str(folder)!r} is not a folder; point it at shared/benchmarks/remat")
    try:
        fractions = [float(x) / 100 for x in budgets.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--budgets {budgets!r} must be comma-separated percentages, e.g. 90,50") from None
    if not fractions or any(not 0 < f <= 10 for f in fractions):
        raise UsageError(f"--budgets {budgets!r} must be percentages in (0, 1000]")
    strats = [s.strip() for s in strategies.split(",") if s.strip()]
    bad = [s for s in strats if s not in STRATEGIES]
    if bad or not strats:
        raise UsageError(f"--strategies {strategies!r}: unknown {bad}; use any of {', '.join(STRATEGIES)}")
    try:
        found = remat_bench.find_graphs(folder, graphs or None)
    except KeyError as err:
        raise UsageError(f"--graph {err.args[0]!r} is not one of {', '.join(remat_bench.TRAIN_GRAPHS)}") from None
    if not found:
        raise UsageError(f"no remat train graphs found in {folder}")
    options = PlannerOptions(time_limit=time_limit, workers=workers, seed=seed)
    rows = remat_bench.run(found, fractions, strats, options)
    obj = {"schema": "memplan.bench.remat/1", "workers": workers, "seed": seed, "time_limit_s": time_limit, "rows": rows}
    if output:
        atomic_write(output, json.dumps(obj, indent=2) + "\n")
    if md_path:
        atomic_write(md_path, remat_bench.markdown(rows))
    if as_json:
        emit_json(obj)
    else:
        click.echo(remat_bench.table(rows))


if __name__ == "__main__":  # pragma: no cover
    main()
