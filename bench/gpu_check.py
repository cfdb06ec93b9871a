"""CUDA check of planned models: the budget holds on a real GPU (issue: emit + verify).

    python bench/gpu_check.py ORIGINAL.onnx PLANNED.onnx [--plan PLAN.json] [--budget 512MiB]
                              [--feeds FEEDS.npz] [--reference REF.npz] [--bisect] [--json OUT.json]
                              [--session planned|default]

Runs each model on onnxruntime-gpu's CUDA execution provider with ``gpu_mem_limit`` set to the
budget and ``arena_extend_strategy=kSameAsRequested`` (DESIGN.md, "Measuring peak memory") under
the planned-model session options (``--session default``: a plain ``SessionOptions()`` and the CUDA
provider's own arena strategy, only ``gpu_mem_limit`` set: for ``--pin-order`` models, which are
meant to keep their plan there), and reports:

* the outputs of both models without a limit, against each other and against ``--reference``
  (e.g. CPU ORT outputs of the original): max abs and rel difference;
* at ``gpu_mem_limit`` = the budget (``--budget``, else the plan's ``budget_bytes``): whether each
  model runs (the original is expected to fail with out-of-memory, the planned model to pass);
* ``--bisect``: the smallest ``gpu_mem_limit`` at which each model runs, found by a parallel
  k-ary search (``--probes`` fresh processes per round, so one out-of-memory failure cannot poison
  the next, and a round costs one CUDA start-up).

A plan's peak counts live bytes, the arena also wastes some (planner/arena.py): for the planned model
to pass at ``gpu_mem_limit`` = its budget, plan it with ``memplan plan ... --ort-arena
same-as-requested`` (the strategy this check runs the planned session with) and a GPU ``--device``.

Needs a CUDA machine with onnxruntime-gpu; exits 2 with one line where CUDA is unavailable.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
sys.path.insert(0, {root!r})
from passes.verify import planned_session_options
model, feeds_path, limit, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
provider, session = sys.argv[5], sys.argv[6]
cuda = {{"device_id": 0}} if session == "default" else {{"device_id": 0, "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "HEURISTIC", "cudnn_conv_use_max_workspace": "0"}}
if limit > 0:
    cuda["gpu_mem_limit"] = limit
try:
    providers = [("CUDAExecutionProvider", cuda)] if provider == "cuda" else ["CPUExecutionProvider"]
    options = ort.SessionOptions() if session == "default" else planned_session_options()
    sess = ort.InferenceSession(model, options, providers=providers)
except Exception as err:
    print(json.dumps({{"ok": False, "error": "session: " + str(err).splitlines()[0][:300]}})); sys.exit(0)
if provider == "cuda" and "CUDAExecutionProvider" not in sess.get_providers():
    print(json.dumps({{"ok": False, "error": "no CUDA provider"}})); sys.exit(0)
feeds = dict(np.load(feeds_path))
try:
    t0 = time.perf_counter()
    outs = sess.run(None, feeds)
    first = time.perf_counter() - t0
except Exception as err:  # out of memory surfaces as a RuntimeException
    print(json.dumps({{"ok": False, "error": str(err).splitlines()[0][:300]}})); sys.exit(0)
times = []
if out and provider == "cuda":
    for _ in range(5):
        t0 = time.perf_counter(); sess.run(None, feeds); times.append(time.perf_counter() - t0)
if out:
    np.savez(out, **{{o.name: v for o, v in zip(sess.get_outputs(), outs)}})
print(json.dumps({{"ok": True, "first_s": first, "step_s": sorted(times)[len(times) // 2] if times else None}}))
"""


def run_once(model: str, feeds: str, limit: int, out: str = "", provider: str = "cuda",
             session: str = "planned") -> dict:
    """Run ``model`` once in a fresh process under ``gpu_mem_limit`` = ``limit`` (0: none), with the
    planned session options or ORT's defaults (``session``)."""
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=str(ROOT)), model, feeds, str(limit), out,
                           provider, session],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not proc.stdout.strip():
        return {"ok": False, "error": (proc.stderr.strip().splitlines() or ["crashed"])[-1][:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bisect_limit(model: str, feeds: str, hi: int, probes: int = 15, resolution: int = 1 << 18,
                 session: str = "planned") -> dict:
    """Smallest gpu_mem_limit (within ``resolution``) at which ``model`` runs, k-ary and parallel.

    Each round runs ``probes`` limits evenly inside (lo, hi] at once; the answer is monotone in the
    limit, so the bracket shrinks to the gap around the smallest passing probe.
    """
    first = run_once(model, feeds, hi, session=session)
    if not first["ok"]:
        return {"limit": None, "error": first["error"], "rounds": 0}
    lo, rounds, last_error = 0, 0, ""
    with ThreadPoolExecutor(max_workers=probes) as pool:
        while hi - lo > resolution:
            step = max(1, (hi - lo) // (probes + 1))
            limits = sorted({lo + step * (i + 1) for i in range(probes) if lo + step * (i + 1) < hi})
            if not limits:
                break
            results = list(pool.map(lambda lim: run_once(model, feeds, lim, session=session), limits))
            rounds += 1
            passing = [lim for lim, r in zip(limits, results) if r["ok"]]
            failing = [(lim, r) for lim, r in zip(limits, results) if not r["ok"]]
            if failing:
                last_error = failing[-1][1]["error"]
            new_hi = min(passing) if passing else hi
            below = [lim for lim, _ in failing if lim < new_hi]
            lo = max(below) if below else lo
            hi = new_hi
    return {"limit": hi, "lower": lo, "rounds": rounds, "error_below": last_error}


def _diff(a: dict, b: dict) -> dict:
    """Worst absolute and relative difference over the outputs both have."""
    worst_abs, worst_rel = 0.0, 0.0
    for name in sorted(set(a) & set(b)):
        x, y = np.asarray(a[name], dtype=np.float64), np.asarray(b[name], dtype=np.float64)
        if x.shape != y.shape:
            return {"max_abs": float("inf"), "max_rel": float("inf"), "note": f"shape differs for {name}"}
        if x.size == 0:
            continue
        d = np.abs(x - y)
        worst_abs = max(worst_abs, float(d.max()))
        worst_rel = max(worst_rel, float((d / np.maximum(np.abs(y), 1e-6)).max()))
    return {"max_abs": worst_abs, "max_rel": worst_rel, "bit_identical": worst_abs == 0.0}


def check(original: str, planned: str, feeds: str, budget: int | None, reference: str | None,
          bisect: bool, probes: int, hi: int | None, session: str = "planned") -> dict:
    report: dict = {"original": original, "planned": planned, "session": session}
    with tempfile.TemporaryDirectory() as tmp:
        pre_o = run_once(original, feeds, 0, f"{tmp}/o.npz", session=session)
        pre_p = run_once(planned, feeds, 0, f"{tmp}/p.npz", session=session)
        report["unlimited"] = {"original": pre_o, "planned": pre_p}
        if pre_o["ok"] and pre_p["ok"]:
            o, p = dict(np.load(f"{tmp}/o.npz")), dict(np.load(f"{tmp}/p.npz"))
            report["planned_vs_original"] = _diff(p, o)
            if reference == "cpu":
                cpu = run_once(original, feeds, 0, f"{tmp}/c.npz", provider="cpu")
                reference = f"{tmp}/c.npz" if cpu["ok"] else None
                report["cpu_reference"] = cpu
            if reference:
                ref = dict(np.load(reference))
                report["original_vs_reference"] = _diff(o, ref)
                report["planned_vs_reference"] = _diff(p, ref)
        if budget:
            report["budget"] = {"gpu_mem_limit": budget, "original": run_once(original, feeds, budget, session=session),
                                "planned": run_once(planned, feeds, budget, session=session)}
        if bisect and pre_o["ok"] and pre_p["ok"]:
            top = hi or (4 << 30)
            report["bisect"] = {"original": bisect_limit(original, feeds, top, probes, session=session),
                                "planned": bisect_limit(planned, feeds, top, probes, session=session)}
    return report


def main() -> None:
    from planner.units import format_bytes, parse_bytes

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("original")
    ap.add_argument("planned")
    ap.add_argument("--plan", help="the plan JSON (memplan plan -o): budget and predicted peak")
    ap.add_argument("--budget", help="gpu_mem_limit for the pass/fail check (default: the plan's budget)")
    ap.add_argument("--feeds", help=".npz of inputs (default: memplan's seeded example inputs)")
    ap.add_argument("--reference", help=".npz of reference outputs of the original, or 'cpu': run the original "
                    "on ORT's CPU provider here")
    ap.add_argument("--bisect", action="store_true", help="find each model's smallest working gpu_mem_limit")
    ap.add_argument("--probes", type=int, default=15, help="parallel processes per bisection round")
    ap.add_argument("--hi", help="upper end of the bisection bracket (default 4GiB)")
    ap.add_argument("--json", help="write the report here")
    ap.add_argument("--session", choices=["planned", "default"], default="planned",
                    help="CUDA session options: memplan's planned ones, or ORT's defaults (for --pin-order models)")
    args = ap.parse_args()
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print("gpu_check: error: onnxruntime has no CUDAExecutionProvider here; install onnxruntime-gpu on a "
              "CUDA machine", file=sys.stderr)
        sys.exit(2)
    plan = json.loads(Path(args.plan).read_text()) if args.plan else {}
    budget = parse_bytes(args.budget, "--budget") if args.budget else plan.get("budget_bytes")
    with tempfile.TemporaryDirectory() as tmp:
        feeds = args.feeds
        if feeds is None:
            import onnx

            import models

            feeds = os.path.join(tmp, "feeds.npz")
            np.savez(feeds, **models.example_feeds(onnx.load(args.original, load_external_data=False)))
        report = check(args.original, args.planned, feeds, budget, args.reference, args.bisect, args.probes,
                       parse_bytes(args.hi, "--hi") if args.hi else None, args.session)
    if plan:
        report["plan"] = {k: plan.get(k) for k in ("model", "budget_bytes", "peak_bytes", "unplanned_peak_bytes",
                                                  "base_bytes", "added_time_pct")}
    print(f"{Path(args.planned).name}: unlimited run original {report['unlimited']['original']}, "
          f"planned {report['unlimited']['planned']}")
    for key in ("planned_vs_original", "original_vs_reference", "planned_vs_reference"):
        if key in report:
            print(f"  {key}: {report[key]}")
    if "budget" in report:
        b = report["budget"]
        print(f"  gpu_mem_limit {format_bytes(b['gpu_mem_limit'])}: original "
              f"{'runs' if b['original']['ok'] else 'FAILS (' + b['original']['error'][:80] + ')'}, planned "
              f"{'runs' if b['planned']['ok'] else 'FAILS (' + b['planned']['error'][:80] + ')'}")
    if "bisect" in report:
        lo_o, lo_p = report["bisect"]["original"]["limit"], report["bisect"]["planned"]["limit"]
        print(f"  smallest gpu_mem_limit: original {lo_o and format_bytes(lo_o)}, planned {lo_p and format_bytes(lo_p)}"
              + (f", planned/original {lo_p / lo_o:.3f}" if lo_o and lo_p else ""))
        if plan and lo_p:
            print(f"  planned: smallest limit / predicted peak {lo_p / plan['peak_bytes']:.3f}")
        if plan and lo_o:
            print(f"  original: smallest limit / predicted peak {lo_o / plan['unplanned_peak_bytes']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    planned_ok = report.get("budget", {}).get("planned", {}).get("ok", True)
    sys.exit(0 if planned_ok else 1)


if __name__ == "__main__":
    main()
