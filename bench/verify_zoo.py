"""Plan, emit and verify every zoo model and torch fixture at 80/60/50% of the unplanned training peak.

    python bench/verify_zoo.py [--strategy cpsat|greedy] [--time-limit 20] [--budgets 80,60,50]
                               [--device cpu] [--only NAME ...] [--json OUT] [--deterministic]

Per row (passes.verify.verify_models, what `memplan verify` prints): whether a plan exists, the
planned peak (liveness of the rewritten graph, constants included), the measured peak (CPU ORT,
planned session options: ORT's allocator bytes counted, passes/alloc_counter.py; "rss/pred" is the
same run's VmHWM recipe), measured/predicted dynamic peak, measured/budget, whether
loss and every gradient equal the unplanned graph's (bit-identical), the planned model's dynamic
peak under ORT's default session options over the prediction (arena chunks kept included / arena
off), and step-time overhead predicted (the plan's added time on --device's cost profile) vs
measured (median of 7 alternating runs of both models in one process, 1 thread).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from passes.autodiff import training_graph  # noqa: E402
from passes.onnx_export import export_model  # noqa: E402
from passes.onnx_import import import_model  # noqa: E402
from passes.zoo_bench import verify_row  # noqa: E402
from planner.cpsat import PlannerOptions  # noqa: E402
from cli import _device_costs  # noqa: E402

ZOO = {name: f"zoo:{name}?batch={b}" for name, b in
       (("mlp", 2048), ("cnn", 64), ("resnet", 64), ("unet", 32), ("gpt", 64))}
FIXTURES = ROOT / "tests" / "fixtures"


def cases(fixture_scale: int = 16, seq_scale: int = 1):
    for name, spec in ZOO.items():
        yield name, spec, {}
    for path in sorted(FIXTURES.glob("*.onnx")):
        z = np.load(path.with_suffix(".npz"))
        dims = {k[4:]: int(z[k]) * fixture_scale for k in z.files if k.startswith("dim:") and k != "dim:seq"}
        dims.update({k[4:]: int(z[k]) * seq_scale for k in z.files if k == "dim:seq"})
        yield path.stem, str(path), dims


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="cpsat")
    ap.add_argument("--time-limit", type=float, default=20)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--deterministic", action="store_true",
                    help="count --time-limit in CP-SAT's deterministic seconds (plan --deterministic): same plans on every run")
    ap.add_argument("--device", default="cpu", help="cost profile of the predicted time (cpu: compare with CPU ORT)")
    ap.add_argument("--budgets", default="80,60,50")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--json")
    ap.add_argument("--fixture-scale", type=int, default=16,
                    help="fixtures' batch = their saved batch (2) times this; larger peaks measure more exactly")
    ap.add_argument("--seq-scale", type=int, default=1,
                    help="fixtures' seq = their saved seq times this (gpt2 and bert allow 32 positions: at most 2)")
    args = ap.parse_args()
    if args.workers < 1:  # PlannerOptions refuses it (a traceback here before)
        ap.error(f"--workers must be a whole number >= 1 (CP-SAT search workers), got {args.workers}")
    _, node_time, _ = _device_costs(args.device)
    rows = []
    hdr = f"{'model':12s} {'budget':>6s} {'plan':>8s} {'pred MiB':>9s} {'meas MiB':>9s} {'meas/pred':>9s} " \
          f"{'rss/pred':>8s} {'meas/budget':>11s} {'equal':>5s} {'dflt/pred':>9s} {'noarena/pred':>12s} {'pred +t%':>8s} {'meas +t%':>8s}"
    print(hdr)
    for name, spec, dims in cases(args.fixture_scale, args.seq_scale):
        if args.only and name not in args.only:
            continue
        graph = training_graph(import_model(spec, dims))
        ref = export_model(graph)
        feeds = models.example_feeds(ref, seed=0)
        for pct in (int(x) for x in args.budgets.split(",")):
            row = verify_row(name, graph, ref, feeds, pct, args.strategy, node_time,
                             PlannerOptions(time_limit=args.time_limit, workers=args.workers, seed=0,
                                            work_limit=args.deterministic))
            if "equal" in row:
                print(f"{name:12s} {pct:5d}% {row['status']:>8s} {row['predicted'] / 2**20:9.2f} "
                      f"{row['measured'] / 2**20:9.2f} {row['ratio']:9.3f} {row['rss_ratio']:8.3f} {row['over_budget']:11.3f} "
                      f"{str(row['equal']):>5s} {row['default_ratio']:9.2f} {row['no_arena_ratio']:12.2f} "
                      f"{100 * row['pred_time']:8.1f} {100 * row['meas_time']:8.1f}", flush=True)
            else:
                print(f"{name:12s} {pct:5d}% {row['status']:>8s}  (least: {row['least_bytes']})", flush=True)
            rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
