"""The allocator benchmark: ``planner.alloc`` on MiniMalloc's challenging suite (A..K).

Every instance is solved at the capacity in its file name (``A.1048576.csv``: 1048576 bytes) and its
placement validated again here; the lower bound and the best greedy arena stand beside it, and C is
also minimized (its optimum is its lower bound, 1039360). One row per run (JSON-ready dicts), as
``memplan bench alloc`` and ``python bench/alloc_bench.py`` print them."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterable

from planner.alloc import AllocResult, solve, validate
from planner.alloc_io import read_csv
from planner.errors import PlannerError
from planner.report import markdown_table, save_figure, text_table

log = logging.getLogger(__name__)

COLUMNS = ("instance", "buffers", "lower_bound", "greedy/LB", "height", "height/LB", "status", "seconds", "validated")
#: The instance minimized as well as fitted (its optimum is known: its lower bound).
MINIMIZED = "C"


def find_instances(directory: str | Path, names: Iterable[str] | None = None) -> list[Path]:
    """The suite's ``NAME.CAPACITY.csv`` files in ``directory``, by name; ``names`` picks some
    (default: all). A name not in the folder raises KeyError."""
    files = {p.name.split(".")[0]: p for p in sorted(Path(directory).glob("*.*.csv"))
             if p.name.split(".")[1].isdigit()}
    if not names:
        return list(files.values())
    out = []
    for name in dict.fromkeys(names):
        if name not in files:
            raise KeyError(name)
        out.append(files[name])
    return out


def run_one(path: Path, capacity: int | None, minimize: bool, time_limit: float) -> dict[str, Any]:
    """Solve one instance (at ``capacity``, or its least height with ``minimize``) and validate it."""
    buffers, _ = read_csv(path)
    t0 = time.perf_counter()
    result: AllocResult = solve(buffers, capacity=capacity, minimize=minimize, time_limit=time_limit)
    seconds = time.perf_counter() - t0
    try:
        validate(buffers, result.offsets, capacity)
        validated = True
    except PlannerError:
        validated = False
    lb = result.lower_bound
    return {
        "instance": path.name.split(".")[0] + (" (minimize)" if minimize else ""),
        "buffers": len(buffers), "lower_bound": lb, "capacity": capacity,
        "greedy/LB": round(result.greedy_height / lb, 3),
        "height": result.height, "height/LB": None if result.height is None else round(result.height / lb, 4),
        "status": result.status.value, "seconds": round(seconds, 2), "validated": validated,
        "stats": result.stats,
    }


def run(files: Iterable[Path], time_limit: float, minimize: bool = True) -> list[dict[str, Any]]:
    """Every instance at the capacity its name gives; with ``minimize`` C's least height too."""
    rows = []
    for path in files:
        rows.append(run_one(path, int(path.name.split(".")[1]), False, time_limit))
        log.warning("%s", " ".join(f"{c}={rows[-1][c]}" for c in COLUMNS))
        if minimize and path.name.split(".")[0] == MINIMIZED:
            rows.append(run_one(path, None, True, time_limit))
            log.warning("%s", " ".join(f"{c}={rows[-1][c]}" for c in COLUMNS))
    return rows


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    return tuple(str(r[c]) for c in COLUMNS)


def table(rows: list[dict[str, Any]]) -> str:
    return text_table(COLUMNS, [_cells(r) for r in rows])


def markdown(rows: list[dict[str, Any]], total: float) -> str:
    return markdown_table(COLUMNS, [_cells(r) for r in rows]) + f"\nTotal {total:.1f} s for {len(rows)} runs (one process).\n"


def plot(rows: list[dict[str, Any]], fmt: str = "png") -> bytes:
    """Greedy's and the search's height over the lower bound, per instance, as a ``fmt`` image
    (planner.report.PLOT_FORMATS)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(rows) + 2), 4), dpi=110)
    xs = list(range(len(rows)))
    for shift, key, label in ((-0.2, "greedy/LB", "greedy"), (0.2, "height/LB", "search")):
        ax.bar([x + shift for x in xs], [r[key] or 0 for r in rows], width=0.4, label=label)
    ax.set_xticks(xs)
    ax.set_xticklabels([r["instance"].replace(" (minimize)", "\n(min)") for r in rows])
    ax.set_ylabel("height / lower bound")
    ax.set_ylim(bottom=min([1.0] + [r[k] for r in rows for k in ("greedy/LB", "height/LB") if r[k]]) - 0.02)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_title("MiniMalloc challenging suite")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    data = save_figure(fig, fmt)
    plt.close(fig)
    return data
