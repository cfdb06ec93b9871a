"""CUDA check of planned models: the budget holds on a real GPU (issue: emit + verify).

    python bench/gpu_check.py ORIGINAL.onnx PLANNED.onnx --budget 512MiB [--feeds FEEDS.npz]
    python bench/gpu_check.py ORIGINAL.onnx PLANNED.onnx --bisect

Runs each model on onnxruntime-gpu's CUDA execution provider with ``gpu_mem_limit`` set to the
budget and ``arena_extend_strategy=kSameAsRequested`` (DESIGN.md, "Measuring peak memory"), and
reports pass/fail: the original is expected to fail (out of memory), the planned model to pass
with the same outputs. ``--bisect`` finds the smallest ``gpu_mem_limit`` at which each model runs.
Every run is a fresh subprocess, so one out-of-memory failure cannot poison the next.
Needs a CUDA machine with onnxruntime-gpu; exits 2 with one line where CUDA is unavailable.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, {root!r})
from passes.verify import planned_session_options
model, feeds_path, limit, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
cuda = {{"device_id": 0, "arena_extend_strategy": "kSameAsRequested", "cudnn_conv_algo_search": "HEURISTIC"}}
if limit > 0:
    cuda["gpu_mem_limit"] = limit
sess = ort.InferenceSession(model, planned_session_options(), providers=[("CUDAExecutionProvider", cuda)])
if "CUDAExecutionProvider" not in sess.get_providers():
    print(json.dumps({{"ok": False, "error": "no CUDA provider"}})); sys.exit(0)
feeds = dict(np.load(feeds_path))
try:
    outs = sess.run(None, feeds)
except Exception as err:  # out of memory surfaces as a RuntimeException
    print(json.dumps({{"ok": False, "error": str(err).splitlines()[0][:300]}})); sys.exit(0)
np.savez(out, **{{o.name: v for o, v in zip(sess.get_outputs(), outs)}})
print(json.dumps({{"ok": True}}))
"""


def run_once(model: str, feeds: str, limit: int, out: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT)), model, feeds, str(limit), out],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"ok": False, "error": (proc.stderr.strip().splitlines() or ["crashed"])[-1][:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bisect_limit(model: str, feeds: str, tmp: str, hi: int = 1 << 36, resolution: int = 1 << 20) -> int | None:
    """Smallest gpu_mem_limit (to ``resolution``) at which the model runs; None if even ``hi`` fails."""
    if not run_once(model, feeds, hi, f"{tmp}/b.npz")["ok"]:
        return None
    lo = 0
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        if run_once(model, feeds, mid, f"{tmp}/b.npz")["ok"]:
            hi = mid
        else:
            lo = mid
    return hi


def main() -> None:
    from planner.units import format_bytes, parse_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("original")
    ap.add_argument("planned")
    ap.add_argument("--budget", help="gpu_mem_limit for the pass/fail check, e.g. 512MiB")
    ap.add_argument("--feeds", help=".npz of inputs (default: memplan's seeded example inputs)")
    ap.add_argument("--bisect", action="store_true", help="find each model's smallest working gpu_mem_limit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print("gpu_check: error: onnxruntime has no CUDAExecutionProvider here; install onnxruntime-gpu on a "
              "CUDA machine", file=sys.stderr)
        sys.exit(2)
    report: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        feeds = args.feeds
        if feeds is None:
            import onnx

            import models

            feeds = f"{tmp}/feeds.npz"
            np.savez(feeds, **models.example_feeds(onnx.load(args.original, load_external_data=False)))
        pre = run_once(args.original, feeds, 0, f"{tmp}/pre.npz")
        if not pre["ok"]:
            print(f"gpu_check: error: the original does not run on CUDA even without a limit: {pre['error']}",
                  file=sys.stderr)
            sys.exit(2)
        if args.budget:
            limit = parse_bytes(args.budget, "--budget")
            orig = run_once(args.original, feeds, limit, f"{tmp}/o.npz")
            plan = run_once(args.planned, feeds, limit, f"{tmp}/p.npz")
            same = None
            if orig["ok"] and plan["ok"]:
                a, b = np.load(f"{tmp}/o.npz"), np.load(f"{tmp}/p.npz")
                same = all(np.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in b.files if k in a.files)
            report["budget"] = {"gpu_mem_limit": limit, "original": orig, "planned": plan, "outputs_close": same}
            print(f"gpu_mem_limit {format_bytes(limit)}: original {'runs' if orig['ok'] else 'FAILS'}, "
                  f"planned {'runs' if plan['ok'] else 'FAILS: ' + plan['error']}, outputs close: {same}")
        if args.bisect:
            lo_o = bisect_limit(args.original, feeds, tmp)
            lo_p = bisect_limit(args.planned, feeds, tmp)
            report["bisect"] = {"original": lo_o, "planned": lo_p}
            print(f"smallest gpu_mem_limit: original {lo_o and format_bytes(lo_o)}, planned {lo_p and format_bytes(lo_p)}")
    if args.json:
        print(json.dumps(report, indent=2))
    planned_ok = report.get("budget", {}).get("planned", {}).get("ok", True)
    sys.exit(0 if planned_ok else 1)


if __name__ == "__main__":
    main()
