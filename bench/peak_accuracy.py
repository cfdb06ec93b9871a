"""Predicted vs measured forward peak on the zoo (and any ONNX files given).

    python bench/peak_accuracy.py [--size large] [--json OUT] [MODEL ...]

For each model: import, predict the run's dynamic peak with planner.liveness, measure it with
passes.verify.measure_peak (fresh subprocess, VmHWM), print both and their ratio.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import models  # noqa: E402
from passes.onnx_export import export_model  # noqa: E402
from passes.autodiff import training_graph  # noqa: E402
from passes.onnx_import import import_model, load_proto  # noqa: E402
from passes.verify import measure_peak  # noqa: E402
from planner.liveness import analyze  # noqa: E402

MiB = 2**20


def row(spec: str, dims: dict[str, int] | None = None, train: bool = False) -> dict:
    graph = import_model(spec, dims)
    if train:
        graph = training_graph(graph)
    lv = analyze(graph)
    model = export_model(graph)  # the file order the prediction assumes
    feeds = models.example_feeds(model, seed=0)
    m = measure_peak(model, feeds)
    # the user's file as it is, file order (forward only: the training step exists only as ours)
    original = measure_peak(load_proto(spec)[0], feeds) if not train else m
    return {"model": spec, "nodes": len(graph.nodes), "activation_bytes": int(lv.buffer_size.sum()),
            "predicted": lv.dynamic_peak, "measured": m.peak_bytes, "ratio": m.peak_bytes / max(1, lv.dynamic_peak),
            "measured_original_file": original.peak_bytes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--size", default="large")
    ap.add_argument("--json")
    ap.add_argument("--train", action="store_true", help="the training step (forward + backward)")
    args = ap.parse_args()
    specs = args.models or [f"zoo:{name}?size={args.size}" for name in sorted(models.ZOO)]
    rows = []
    print(f"{'model':28s} {'nodes':>6s} {'acts MiB':>9s} {'pred MiB':>9s} {'meas MiB':>9s} {'meas/pred':>9s} {'orig file':>9s}" + ("  (training step)" if args.train else ""))
    for spec in specs:
        r = row(spec, train=args.train)
        rows.append(r)
        print(f"{r['model']:28s} {r['nodes']:6d} {r['activation_bytes'] / MiB:9.1f} {r['predicted'] / MiB:9.2f} "
              f"{r['measured'] / MiB:9.2f} {r['ratio']:9.4f} {r['measured_original_file'] / MiB:9.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
