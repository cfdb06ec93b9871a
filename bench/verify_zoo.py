"""Plan, emit and verify every zoo model and torch fixture at 80/60/50% of the unplanned training peak.

    python bench/verify_zoo.py [--strategy greedy|cpsat] [--time-limit 20] [--budgets 80,60,50] [--json OUT]

Per row: whether a plan exists, the planned peak (liveness of the rewritten graph), the measured
peak (passes.verify.measure_peak, CPU ORT with the planned session options), measured/predicted,
measured/budget, whether loss and every gradient equal the unplanned graph's (bit-identical), and
predicted vs measured step-time overhead.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from passes.autodiff import training_graph  # noqa: E402
from passes.onnx_export import export_model  # noqa: E402
from passes.onnx_import import import_model  # noqa: E402
from passes.plan_model import plan_graph  # noqa: E402
from passes.verify import compare_outputs, measure_peak  # noqa: E402
from planner.cpsat import PlannerOptions  # noqa: E402
from planner.liveness import analyze  # noqa: E402

ZOO = {name: f"zoo:{name}?batch={b}" for name, b in
       (("mlp", 2048), ("cnn", 64), ("resnet", 64), ("unet", 32), ("gpt", 64))}
FIXTURES = ROOT / "tests" / "fixtures"


def cases():
    for name, spec in ZOO.items():
        yield name, spec, {}
    for path in sorted(FIXTURES.glob("*.onnx")):
        z = np.load(path.with_suffix(".npz"))
        dims = {k[4:]: int(z[k]) * 16 for k in z.files if k.startswith("dim:") and k != "dim:seq"}
        dims.update({k[4:]: int(z[k]) for k in z.files if k == "dim:seq"})
        yield path.stem, str(path), dims


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategy", default="greedy")
    ap.add_argument("--time-limit", type=float, default=20)
    ap.add_argument("--budgets", default="80,60,50")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    hdr = f"{'model':12s} {'budget':>6s} {'plan':>8s} {'pred MiB':>9s} {'meas MiB':>9s} {'meas/pred':>9s} " \
          f"{'meas/budget':>11s} {'equal':>5s} {'pred +t%':>8s} {'meas +t%':>8s}"
    print(hdr)
    for name, spec, dims in cases():
        if args.only and name not in args.only:
            continue
        graph = training_graph(import_model(spec, dims))
        ref = export_model(graph)
        feeds = models.example_feeds(ref, seed=0)
        unplanned = analyze(graph).peak_bytes
        r0 = measure_peak(ref, feeds, keep_outputs=True, repeats=5)
        for pct in (int(x) for x in args.budgets.split(",")):
            budget = math.ceil(unplanned * pct / 100)
            pm = plan_graph(graph, budget, strategy=args.strategy,
                            options=PlannerOptions(time_limit=args.time_limit))
            row = {"model": name, "budget_pct": pct, "budget_bytes": budget, "unplanned_bytes": unplanned,
                   "status": pm.result.status}
            if pm.ok:
                model = export_model(pm.planned)
                r1 = measure_peak(model, feeds, keep_outputs=True, repeats=5)
                base = pm.planned.base_bytes
                checks = compare_outputs(r0.outputs, r1.outputs, 0.0, 0.0)
                row.update(predicted=pm.peak_bytes, measured=base + r1.peak_bytes,
                           ratio=(r1.peak_bytes) / max(1, pm.peak_bytes - base),
                           over_budget=(base + r1.peak_bytes) / budget, equal=all(c.ok for c in checks),
                           pred_time=pm.result.added_time / max(pm.result.compute_time, 1e-300),
                           meas_time=r1.seconds / r0.seconds - 1)
                print(f"{name:12s} {pct:5d}% {pm.result.status:>8s} {row['predicted'] / 2**20:9.2f} "
                      f"{row['measured'] / 2**20:9.2f} {row['ratio']:9.3f} {row['over_budget']:11.3f} "
                      f"{str(row['equal']):>5s} {100 * row['pred_time']:8.1f} {100 * row['meas_time']:8.1f}", flush=True)
            else:
                print(f"{name:12s} {pct:5d}% {pm.result.status:>8s}  (least: {pm.result.least_bytes})", flush=True)
            rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
