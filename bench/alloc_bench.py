"""Benchmark of ``planner.alloc`` on MiniMalloc's challenging suite (A..K).

Every instance is solved at the capacity in its file name (1048576 bytes) and its placement is
validated again here; the lower bound and the best greedy arena are printed next to it, and C is
also minimized (its optimum is its lower bound, 1039360). Run from the repository root:

    python bench/alloc_bench.py                       # the table on stdout
    python bench/alloc_bench.py --json out.json --markdown out.md
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.alloc import AllocResult, solve, validate  # noqa: E402
from planner.alloc_io import read_csv  # noqa: E402
from planner.errors import PlannerError  # noqa: E402

SUITE = ROOT.parent / "shared" / "benchmarks" / "minimalloc" / "challenging"
COLUMNS = ("instance", "buffers", "lower_bound", "greedy/LB", "height", "height/LB", "status", "seconds", "validated")


def run_one(path: Path, capacity: int | None, minimize: bool, time_limit: float) -> dict:
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


def markdown(rows: list[dict], total: float) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    lines.append(f"\nTotal {total:.1f} s for {len(rows)} runs (one process).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=Path, default=SUITE, help="folder of MiniMalloc CSV files")
    ap.add_argument("--only", default="", help="instance letters to run, e.g. ACK (default: all)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per instance")
    ap.add_argument("--no-minimize", action="store_true", help="skip the minimization of C")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--markdown", type=Path, help="also write the table as Markdown")
    args = ap.parse_args(argv)
    files = sorted(p for p in args.suite.glob("*.csv") if not args.only or p.name[0] in args.only)
    if not files:
        print(f"no CSV files in {args.suite}", file=sys.stderr)
        return 2
    rows, t0 = [], time.perf_counter()
    for path in files:
        capacity = int(path.name.split(".")[1])
        rows.append(run_one(path, capacity, False, args.time_limit))
        print(" ".join(f"{c}={rows[-1][c]}" for c in COLUMNS), file=sys.stderr, flush=True)
        if path.name.startswith("C.") and not args.no_minimize:
            rows.append(run_one(path, None, True, args.time_limit))
    total = time.perf_counter() - t0
    table = markdown(rows, total)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({"total_seconds": round(total, 2), "rows": rows}, indent=2) + "\n")
    return 0 if all(r["validated"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
