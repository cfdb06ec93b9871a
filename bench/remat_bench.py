"""Remat benchmark: every strategy on the shared Checkmate/Moccasin train graphs at 90..40% of the
no-remat peak (2 CP-SAT workers, 60 s per solve up to 400 nodes, 120 s above).

    python bench/remat_bench.py [--graph ResNet50 ...] [-o rows.json] [--markdown table.md]

Same as ``memplan bench remat``; the logic lives in planner/remat_bench.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cli  # noqa: E402

if __name__ == "__main__":
    cli.main(["bench", "remat", *sys.argv[1:]])
