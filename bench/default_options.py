"""Which ORT session option moves a planned model's peak away from its plan? One knob at a time.

    python bench/default_options.py [--model zoo:gpt?batch=64] [--budget 70] [--strategy cpsat]

Plans MODEL's training step at BUDGET % of its unplanned peak, then measures the planned model
(passes.verify.measure_peak, CPU ORT, 1 thread) under the planned session options with one knob
turned to ORT's default at a time, then all defaults, then all defaults but the arena; "pinned" is
the same plan emitted as ``--pin-order`` writes it (passes/pin_order.py, no intermediate shapes). Columns:
the warm run's dynamic peak (VmHWM - VmRSS before the second run) and the cold peak (VmHWM over
both runs - VmRSS after session creation: what an arena or memory pattern kept from the first run
counts here), each over the plan's predicted dynamic peak.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from passes.autodiff import training_graph  # noqa: E402
from passes.onnx_export import export_model  # noqa: E402
from passes.onnx_import import import_model  # noqa: E402
from passes.pin_order import pin_order  # noqa: E402
from passes.plan_model import plan_graph  # noqa: E402
from passes.verify import ORT_DEFAULT, PLANNED, measure_peak, time_models  # noqa: E402
from planner.cpsat import PlannerOptions  # noqa: E402
from planner.liveness import MemoryModel, analyze  # noqa: E402

CONFIGS = {
    "planned": PLANNED,
    "+ arena": replace(PLANNED, arena=True),
    "+ mem pattern": replace(PLANNED, mem_pattern=True),
    "+ mem reuse": replace(PLANNED, mem_reuse=True),
    "+ opt basic": replace(PLANNED, optimization="basic"),
    "+ opt all": replace(PLANNED, optimization="all"),
    "+ DFS order": replace(PLANNED, order="default"),
    "default, arena off": replace(ORT_DEFAULT, arena=False),
    "default, no pattern": replace(ORT_DEFAULT, mem_pattern=False),
    "ORT default": ORT_DEFAULT,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="zoo:gpt?batch=64")
    ap.add_argument("--budget", type=float, default=70)
    ap.add_argument("--strategy", default="cpsat")
    ap.add_argument("--time-limit", type=float, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    graph = training_graph(import_model(args.model))
    budget = math.ceil(analyze(graph).peak_bytes * args.budget / 100)
    pm = plan_graph(graph, budget, strategy=args.strategy,
                    options=PlannerOptions(time_limit=args.time_limit, workers=1, seed=0))
    if not pm.ok:
        sys.exit(f"no plan: {pm.result.note}")
    model, ref = export_model(pm.planned), export_model(graph)
    pinned = pin_order(pm.planned)
    models_ = {"planned": model, "pinned": export_model(pinned, value_info=False), "unplanned": ref}
    feeds = models.example_feeds(ref, seed=0)
    predicted = analyze(pm.planned, model=MemoryModel(host_copies_resident=True)).dynamic_peak
    unplanned = analyze(graph).dynamic_peak
    print(f"{args.model} at {args.budget:g}%: planned dynamic peak predicted {predicted / 2**20:.2f} MiB "
          f"(unplanned {unplanned / 2**20:.2f} MiB); "
          f"nodes {len(pm.planned.nodes)}, pinned {len(pinned.nodes)}")
    print(f"{'options':20s} {'model':>9s} {'warm MiB':>9s} {'/pred':>6s} {'cold MiB':>9s} {'/pred':>6s}")
    rows = []
    for label, cfg in CONFIGS.items():
        for which, pred in (("planned", predicted), ("pinned", predicted), ("unplanned", unplanned)):
            if which == "unplanned" and label not in ("planned", "ORT default", "default, arena off"):
                continue
            m = models_[which]
            r = measure_peak(m, feeds, session=cfg, repeats=1)
            rows.append({"options": label, "model": which, "warm": r.peak_bytes, "cold": r.cold_peak_bytes,
                         "predicted": pred})
            print(f"{label:20s} {which:>9s} {r.peak_bytes / 2**20:9.2f} {r.peak_bytes / pred:6.3f} "
                  f"{r.cold_peak_bytes / 2**20:9.2f} {r.cold_peak_bytes / pred:6.3f}", flush=True)
    t_planned, t_pinned = time_models([model, models_["pinned"]], feeds, repeats=9)
    print(f"step time (planned options, 1 thread): planned {t_planned * 1e3:.2f} ms, pinned {t_pinned * 1e3:.2f} ms "
          f"({100 * (t_pinned / t_planned - 1):+.1f}%)")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
