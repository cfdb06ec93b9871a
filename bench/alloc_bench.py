"""Benchmark of ``planner.alloc`` on MiniMalloc's challenging suite (A..K).

Every instance is solved at the capacity in its file name (1048576 bytes) and its placement is
validated again; the lower bound and the best greedy arena are printed next to it, and C is
also minimized (its optimum is its lower bound, 1039360). The logic lives in planner/alloc_bench.py
(``memplan bench alloc`` prints the same table). Run from the repository root:

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

from planner import alloc_bench  # noqa: E402

SUITE = ROOT.parent / "shared" / "benchmarks" / "minimalloc" / "challenging"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", type=Path, default=SUITE, help="folder of MiniMalloc CSV files")
    ap.add_argument("--only", default="", help="instance letters to run, e.g. ACK (default: all)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per instance")
    ap.add_argument("--no-minimize", action="store_true", help="skip the minimization of C")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--markdown", type=Path, help="also write the table as Markdown")
    args = ap.parse_args(argv)
    files = [p for p in alloc_bench.find_instances(args.suite) if not args.only or p.name[0] in args.only]
    if not files:
        print(f"no CSV files in {args.suite}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = alloc_bench.run(files, args.time_limit, minimize=not args.no_minimize)
    total = time.perf_counter() - t0
    table = alloc_bench.markdown(rows, total)
    print(table, end="")
    if args.markdown:
        args.markdown.write_text(table)
    if args.json:
        args.json.write_text(json.dumps({"total_seconds": round(total, 2), "rows": rows}, indent=2) + "\n")
    return 0 if all(r["validated"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
