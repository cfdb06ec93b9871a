"""Does one large allocation at the start of a run shrink what ORT's BFC arena needs? (measurement)

    python bench/arena_priming.py PLANNED.onnx[:FRACTION] ... [--strategy 1]

Under ``kSameAsRequested`` every arena extension is a region of exactly the request, and chunks of
different regions never merge: a plan's many differently sized buffers leave the arena far above
the plan's peak (bench/results/gpu_zoo_prep_stop50.md: 1.3-2.1x on plans at 60% of convnets). Priming
puts a ConstantOfShape of FRACTION x (the file's live peak) first, read once by a 1-element Slice so
that ORT frees it at once (``passes.rewrite.prime_arena``): the arena's first region is then that
large, and later buffers are carved out of it and merge back into it when freed.

For each file (default FRACTION 0.9): the least arena limit under which ORT runs it on the CPU
provider (``passes.verify.runs_under_arena``: an env arena with ``max_mem`` = the limit, the same
BFCArena the CUDA provider puts under ``gpu_mem_limit``), bisected to 0.2% of the peak, for the file
as it is and primed, over the file's liveness peak; and ``planner.arena``'s prediction of the first.
Feeds: memplan's seeded example inputs.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402

import models  # noqa: E402
from bench.arena_limit import least_limit as least_measured  # noqa: E402
from passes.onnx_export import write_model  # noqa: E402
from passes.onnx_import import import_as_run  # noqa: E402
from passes.rewrite import prime_arena  # noqa: E402
from planner.arena import least_limit, reserved_bytes, run_events, session_allocations  # noqa: E402
from planner.liveness import MemoryModel, analyze  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="PLANNED.onnx[:FRACTION]")
    ap.add_argument("--strategy", type=int, default=1, help="arena_extend_strategy: 1 kSameAsRequested, 0 kNextPowerOfTwo")
    args = ap.parse_args()
    print("| file | peak | predicted / peak | measured / peak | primed at | primed, measured / peak |")
    print("|---|---|---|---|---|---|")
    for spec in args.files:
        path, _, frac = spec.partition(":")
        fraction = float(frac or 0.9)
        lv = analyze(import_as_run(path), model=MemoryModel(host_copies_resident=True))
        g, peak = lv.graph, lv.peak_bytes
        base = reserved_bytes(g, prepack=True)
        predicted = least_limit(session_allocations(g) + run_events(lv), base=base, strategy=args.strategy,
                                resolution=4096)
        feeds = models.example_feeds(onnx.load(path, load_external_data=False), seed=0)
        resolution = max(4096, peak // 500)
        plain = least_measured(path, feeds, args.strategy, predicted, resolution)
        with tempfile.TemporaryDirectory() as tmp:
            out = str(Path(tmp) / "primed.onnx")
            write_model(prime_arena(g, int((peak - base) * fraction) // 256 * 256), out)
            with_prime = least_measured(out, feeds, args.strategy, plain, resolution)
        print(f"| {Path(path).name} | {peak} | {predicted / peak:.3f} | {plain / peak:.3f} | {fraction:g} | "
              f"{with_prime / peak:.3f} |", flush=True)


if __name__ == "__main__":
    main()
