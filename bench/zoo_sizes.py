"""Table of the zoo models: nodes, op types, parameter and activation bytes, initial loss, ORT forward time.

Usage: python bench/zoo_sizes.py [--size small|large|both] [--threads N]
Activation bytes come from ONNX shape inference (models/stats.py); the forward time is the best of
three onnxruntime CPU runs after one warm-up run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import models  # noqa: E402
from models.stats import model_stats  # noqa: E402

MiB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "large", "both"], default="both")
    parser.add_argument("--threads", type=int, default=2, help="ORT intra-op threads")
    args = parser.parse_args()
    sizes = ["small", "large"] if args.size == "both" else [args.size]
    print("| model | size | nodes | params MiB | activations MiB | loss | forward ms | op types |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for size in sizes:
        for name in sorted(models.ZOO):
            model = models.build(name, size=size)
            stats = model_stats(model)
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            feeds = models.example_feeds(model)
            loss = float(session.run(["loss"], feeds)[0])
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                session.run(["loss"], feeds)
                best = min(best, time.perf_counter() - start)
            print(f"| {name} | {size} | {stats.nodes} | {stats.param_bytes / MiB:.2f} | "
                  f"{stats.activation_bytes / MiB:.1f} | {loss:.3f} | {best * 1e3:.1f} | {', '.join(stats.op_types)} |")


if __name__ == "__main__":
    main()
