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


# ---- memplan alloc: static arena offsets (planner/alloc.py) ------------------------------------
@main.command("alloc")
@click.argument("problem", type=click.Path(dir_okay=False))
@click.option("--capacity", help="Arena size (bytes or 1MiB style): every offset + size must fit.")
@click.option("--minimize", is_flag=True, help="Least arena height (within --capacity if given). "
              "The default when --capacity is not given.")
@click.option("--time-limit", type=float, default=10.0, show_default=True,
              help="Seconds for the exact search; the best valid placement found is returned.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Write the solution CSV (the problem's columns plus offset).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@handles_errors
def alloc_command(problem: str, capacity: str | None, minimize: bool, time_limit: float,
                  output: str | None, as_json: bool) -> None:
    """Fixed offsets in one arena for buffers in MiniMalloc's CSV (id,lower,upper,size[,alignment])."""
    import os

    from planner.alloc import AllocStatus, solve
    from planner.alloc_io import read_csv, write_solution
    from planner.units import format_bytes, parse_bytes

    if time_limit < 0:
        raise UsageError(f"--time-limit {time_limit} must be >= 0 seconds")
    if output and os.path.exists(output) and os.path.samefile(output, problem):
        raise UsageError(f"-o {output} is the problem file; write the solution to another path")
    cap = parse_bytes(capacity, "--capacity") if capacity else None
    buffers, _ = read_csv(problem)
    result = solve(buffers, capacity=cap, minimize=minimize, time_limit=time_limit)
    lb = result.lower_bound
    if result.status is AllocStatus.INFEASIBLE:
        raise BudgetInfeasibleError(
            f"capacity {cap} bytes is below what any placement needs: the lower bound is {lb} bytes"
            if lb > (cap or 0) else
            f"no placement fits capacity {cap} bytes (proven; lower bound {lb}); raise --capacity",
            least_bytes=lb,
        )
    if result.status is AllocStatus.TIMEOUT:
        why = ("the exact search skips problems this large" if result.stats.get("too_large_blocks")
               else f"nothing found in {time_limit:g} s")
        raise SolverTimeoutError(
            f"no placement within capacity {cap} bytes: {why} (lower bound {lb}, greedy "
            f"{result.greedy_height}); raise --time-limit or --capacity"
        )
    if output:
        write_solution(output, buffers, result.offsets)
    if as_json:
        emit_json({**result.to_json(), "solution": output,
                   "offsets": {b.id: off for b, off in zip(buffers, result.offsets)}})
        return
    rows = [
        ("buffers", f"{len(buffers)}"),
        ("lower bound", f"{lb} ({format_bytes(lb)})"),
        ("greedy", f"{result.greedy_height} (x{result.greedy_height / lb:.3f})" if lb else "0"),
        ("height", f"{result.height} (x{result.height / lb:.3f}) {result.status.value}" if lb else "0"),
        ("time", f"{result.wall_s:.2f} s ({result.method})"),
    ]
    if output:
        rows.append(("solution", output))
    for key, value in rows:
        click.echo(f"{key:<12} {value}")


if __name__ == "__main__":  # pragma: no cover
    main()
