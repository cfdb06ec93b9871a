"""The zoo and the torch fixtures planned at 80/60/50% and run on a CUDA GPU (issue: emit + verify).

    python bench/gpu_zoo.py prep [--dir .gpu/z] [--budgets 80,60,50] [--only NAME ...]   # here (needs ortools)
    python bench/gpu_zoo.py prep-pinned; python bench/gpu_zoo.py prep-batch             # here, after prep
    python bench/gpu_zoo.py pack [--dir .gpu/z] [--out .gpu/c]                         # what travels
    python bench/gpu_zoo.py run [--dir .gpu/c] [--json OUT.json] [--workers 8]          # on the CUDA machine
    python bench/gpu_zoo.py table OUT.json                                               # the markdown table

``prep`` writes, per model of ``bench/verify_zoo.py``'s list (same batches): the unplanned training
step (``memplan train-graph``), seeded feeds, the outputs of CPU ORT on them, and per budget the plan
(``memplan plan --device H200 --ort-arena same-as-requested --emit``). Where no plan fits the
arena's replay under the budget, the plan without ``--ort-arena`` is emitted instead (marked "plain").
``prep-pinned`` writes each plan again with ``--pin-order``, run under ORT's default session and CUDA
provider options; ``prep-batch`` the max-batch rows (``MAX_BATCH``).
For each file it also records the replay's prediction of the least ``gpu_mem_limit``
(``planner.arena.arena_need``, inputs copied into the arena as the CUDA provider does).

``run`` needs onnxruntime-gpu with the CUDA provider (bench/gpu_run.sh unpacks one) and only onnx
and numpy besides. Per file, in one process: outputs without a limit; whether it runs under
``gpu_mem_limit`` = the plan's budget (the original is expected to fail, the planned model to
pass); the smallest ``gpu_mem_limit`` it runs under (``arena_extend_strategy=kSameAsRequested``,
the planned session options: DESIGN.md's CUDA recipe), bisected with one fresh session per probe.
A sample of the limits is checked again in fresh processes. Then, one process and model at a time,
step times: the original and each planned file alternately, median of 15 runs. ``GPU_ZOO_DRY_RUN=N``
runs the code paths on CPU, a limit of N bytes or more counting as fitting (the fresh-process
checks, gpu_check's, need CUDA and say False there).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_check import _diff, run_once  # noqa: E402  (compared and re-run as gpu_check does)

PLAN_DEVICE = "H200"
DRY_RUN = int(os.environ.get("GPU_ZOO_DRY_RUN", "0"))


# ---------------------------------------------------------------------------------------------- prep
def _memplan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True)


def _arena_need(path: str) -> int:
    from passes.onnx_import import import_as_run
    from planner.arena import SAME_AS_REQUESTED, arena_need
    from planner.liveness import MemoryModel, analyze

    lv = analyze(import_as_run(path), model=MemoryModel(host_copies_resident=True))
    return arena_need(lv, strategy=SAME_AS_REQUESTED, on_cpu=False)


def prep(args) -> None:
    import onnx

    import models
    from bench.verify_zoo import cases
    from passes.verify import planned_session_options

    import onnxruntime as ort

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / f"manifest.{args.tag}.json"  # one per prep process: several may run at once
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name, spec, dims in cases():
        if args.only and name not in args.only:
            continue
        dim_args = [a for k, v in sorted(dims.items()) for a in ("--dim", f"{k}={v}")]
        orig = out / f"{name}.orig.onnx"
        r = _memplan("train-graph", spec, *dim_args, "-o", str(orig))
        if r.returncode:
            print(f"{name}: train-graph failed: {r.stderr.strip()}", file=sys.stderr)
            continue
        feeds = models.example_feeds(onnx.load(str(orig)), seed=0)
        np.savez(out / f"{name}.feeds.npz", **feeds)
        sess = ort.InferenceSession(str(orig), planned_session_options(), providers=["CPUExecutionProvider"])
        np.savez(out / f"{name}.cpu.npz", **dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds))))
        entry = {"spec": spec, "dims": dims, "orig": orig.name, "orig_need": _arena_need(str(orig)), "plans": []}
        for pct in (int(x) for x in args.budgets.split(",")):
            stem = out / f"{name}.p{pct}"
            common = ["plan", spec, *dim_args, "--budget", f"{pct}%", "--device", PLAN_DEVICE,
                      "--time-limit", str(args.time_limit), "--deterministic", "--wall-cap", "120",
                      "--emit", f"{stem}.onnx", "-o", f"{stem}.json"]
            kind = "arena"
            t0 = time.time()
            if args.reuse and Path(f"{stem}.json").exists() and Path(f"{stem}.onnx").exists():
                r = subprocess.CompletedProcess([], 0)  # planned by an earlier, stopped prep
                kind = "arena" if "ort_arena" in json.loads(Path(f"{stem}.json").read_text()) else "plain"
            else:
                r = _memplan(*common, "--ort-arena", "same-as-requested")
            if r.returncode:
                arena_error = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
                kind = "plain"
                r = _memplan(*common)
            if r.returncode:
                print(f"{name} {pct}%: no plan: {r.stderr.strip()[:200]}", file=sys.stderr)
                entry["plans"].append({"pct": pct, "kind": "none", "error": r.stderr.strip()[:300]})
                continue
            plan = json.loads(Path(f"{stem}.json").read_text())
            row = {"pct": pct, "kind": kind, "file": f"{stem.name}.onnx", "budget_bytes": plan["budget_bytes"],
                   "peak_bytes": plan["peak_bytes"], "unplanned_peak_bytes": plan["unplanned_peak_bytes"],
                   "added_time_pct": plan["added_time_pct"], "need": _arena_need(f"{stem}.onnx"),
                   "plan_need": (plan.get("ort_arena") or {}).get("need_bytes")}
            if kind == "plain":
                row["arena_error"] = arena_error
            entry["plans"].append(row)
            print(f"{name} {pct}% {kind}: peak {row['peak_bytes']} budget {row['budget_bytes']} need {row['need']} "
                  f"(+{row['added_time_pct']:.2f}%, {time.time() - t0:.0f} s)", flush=True)
        manifest[name] = entry
        manifest_path.write_text(json.dumps(manifest, indent=1))


MAX_BATCH = {"cnn": ("cnn", 2841096), "resnet": ("resnet", 5987404), "gpt": ("gpt", 2037280)}


def prep_batch(args) -> None:
    """Max batch under a fixed budget (bench/results/max_batch_stop11.md's budgets: each model's
    unplanned peak at batch 16): the original at the largest batch it fits (expected to run under
    gpu_mem_limit = the budget), the original and the plan at the planned largest batch."""
    import onnx

    import models

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / "batch_manifest.json"  # its own: prep may run beside it
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for key, (zoo, budget) in MAX_BATCH.items():
        if args.only and key not in args.only:
            continue
        spec = lambda b: f"zoo:{zoo}{'&' if '?' in zoo else '?'}batch={b}"  # noqa: E731
        t0 = time.time()
        r = _memplan("plan", spec(16), "--budget", str(budget), "--max-batch", "--max-added-time", "30",
                     "--time-limit", str(args.time_limit), "--device", PLAN_DEVICE, "--ort-arena", "same-as-requested",
                     "--deterministic", "--json")
        if r.returncode:
            print(f"{key}: max batch failed: {r.stderr.strip()[:300]}", file=sys.stderr)
            continue
        mb = json.loads(r.stdout)
        bu, bp = mb["unplanned_batch"], mb["planned_batch"]
        name = f"maxbatch-{key}"
        files = {}
        for label, b in (("unplanned", bu), ("orig", bp)):
            f = out / f"{name}.b{b}.orig.onnx"
            if _memplan("train-graph", spec(b), "-o", str(f)).returncode:
                break
            np.savez(out / f"{name}.b{b}.feeds.npz", **models.example_feeds(onnx.load(str(f)), seed=0))
            files[label] = f
        stem = out / f"{name}.b{bp}.plan"
        r = _memplan("plan", spec(bp), "--budget", str(budget), "--device", PLAN_DEVICE, "--ort-arena",
                     "same-as-requested", "--time-limit", str(args.time_limit), "--deterministic",
                     "--emit", f"{stem}.onnx", "-o", f"{stem}.json")
        if r.returncode or len(files) < 2:
            print(f"{key}: planning batch {bp} again failed: {r.stderr.strip()[:300]}", file=sys.stderr)
            continue
        plan = json.loads(Path(f"{stem}.json").read_text())
        manifest[name] = {
            "spec": spec(bp), "dims": {}, "orig": files["orig"].name, "orig_need": _arena_need(str(files["orig"])),
            "feeds": f"{name}.b{bp}.feeds.npz", "max_batch": {"budget_bytes": budget, "unplanned_batch": bu,
                                                             "planned_batch": bp, "ratio": mb["ratio"]},
            "extra": [{"label": f"unplanned at batch {bu}", "file": files["unplanned"].name,
                       "feeds": f"{name}.b{bu}.feeds.npz", "budget_bytes": budget,
                       "need": _arena_need(str(files["unplanned"]))}],
            "plans": [{"pct": f"b{bp}", "kind": "arena", "file": f"{stem.name}.onnx", "budget_bytes": budget,
                       "peak_bytes": plan["peak_bytes"], "unplanned_peak_bytes": plan["unplanned_peak_bytes"],
                       "added_time_pct": plan["added_time_pct"], "need": _arena_need(f"{stem}.onnx"),
                       "plan_need": (plan.get("ort_arena") or {}).get("need_bytes")}]}
        manifest_path.write_text(json.dumps(manifest, indent=1))
        print(f"{key}: budget {budget}: unplanned batch {bu}, planned {bp} ({mb['ratio']:.2f}x, "
              f"+{plan['added_time_pct']:.1f}% at batch {bp}; {time.time() - t0:.0f} s)", flush=True)


def prep_pinned(args) -> None:
    """Each plan of ``prep`` again as a ``--pin-order`` file (``memplan rewrite --pin-order``): run
    under ORT's default session and CUDA provider options."""
    for manifest_path in sorted(Path(args.dir).glob("manifest.*.json")):
        _pin_manifest(Path(args.dir), manifest_path)


def _pin_manifest(out: Path, manifest_path: Path) -> None:
    manifest = json.loads(manifest_path.read_text())
    for name, e in manifest.items():
        for p in e["plans"]:  # the plan file names the dims it was made with
            if p["kind"] == "none":
                continue
            pinned = p["file"].replace(".onnx", ".pinned.onnx")
            r = _memplan("rewrite", e["spec"], str(out / p["file"].replace(".onnx", ".json")),
                         "-o", str(out / pinned), "--pin-order")
            if r.returncode:
                print(f"{name} {p['pct']}%: rewrite --pin-order failed: {r.stderr.strip()[:200]}", file=sys.stderr)
                continue
            p["pinned"] = pinned
        manifest_path.write_text(json.dumps(manifest, indent=1))


def pack(args) -> None:
    """What travels to the device (64 MiB with the repo and .gpu/ort): hard links to the files the
    manifests name, without the plan JSONs, and the pinned file of each model's lowest budget only."""
    src, dst = Path(args.dir), Path(args.out)
    if dst.exists():
        sys.exit(f"gpu_zoo: error: {dst} exists; remove it first")
    dst.mkdir(parents=True)
    for part in sorted(src.glob("manifest.*.json")) + [src / "batch_manifest.json"]:
        if not part.exists():
            continue
        manifest = json.loads(part.read_text())
        for name, e in manifest.items():
            files = [e["orig"], e.get("feeds", f"{name}.feeds.npz")]
            files += [f"{name}.cpu.npz"] if (src / f"{name}.cpu.npz").exists() else []
            files += [x[k] for x in e.get("extra", []) for k in ("file", "feeds")]
            planned = [p for p in e["plans"] if p["kind"] != "none"]
            lowest = min((p["pct"] for p in planned if isinstance(p["pct"], int)), default=None)
            for p in planned:
                files.append(p["file"])
                if p.get("pinned") and p["pct"] != lowest:
                    del p["pinned"]
                elif p.get("pinned"):
                    files.append(p["pinned"])
            for f in files:
                os.link(src / f, dst / f)
        (dst / part.name).write_text(json.dumps(manifest, indent=1))
    total = sum(f.stat().st_size for f in dst.iterdir())
    print(f"wrote {dst} ({total / 2**20:.1f} MiB)")


# ----------------------------------------------------------------------------------------------- run
def _session(path: str, limit: int, session: str = "planned"):
    """A CUDA session of ``path`` under ``gpu_mem_limit`` = ``limit`` (0: none): the planned session
    options and kSameAsRequested ("planned"), or ORT's default session and CUDA provider options
    ("default")."""
    import onnxruntime as ort

    from passes.verify import planned_session_options

    cuda = {"device_id": 0}
    if session == "planned":
        cuda.update(arena_extend_strategy="kSameAsRequested", cudnn_conv_algo_search="HEURISTIC",
                    cudnn_conv_use_max_workspace="0")
    options = planned_session_options() if session == "planned" else ort.SessionOptions()
    if limit > 0:
        cuda["gpu_mem_limit"] = limit
    if DRY_RUN:  # the code paths on a machine without CUDA: CPU runs, "fits" when limit >= DRY_RUN bytes
        if 0 < limit < DRY_RUN:
            raise RuntimeError(f"dry run: limit {limit} < {DRY_RUN}")
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    sess = ort.InferenceSession(path, options, providers=[("CUDAExecutionProvider", cuda)])
    if "CUDAExecutionProvider" not in sess.get_providers():
        raise RuntimeError("no CUDA provider in the session")
    return sess


def _runs(path: str, feeds: dict, limit: int, session: str = "planned") -> tuple[bool, str]:
    try:
        sess = _session(path, limit, session)
        sess.run(None, feeds)
        return True, ""
    except Exception as err:  # an arena over its limit surfaces as a RuntimeException
        return False, str(err).splitlines()[0][:240] if str(err) else type(err).__name__


def measure_file(path: str, feeds_path: str, budget: int, hint: int, out_npz: str, resolution: int,
                 session: str = "planned") -> dict:
    """Outputs without a limit, the run at ``budget``, the smallest limit (bisected in this process)."""
    feeds = dict(np.load(feeds_path))
    t0 = time.time()
    report: dict = {"file": os.path.basename(path), "session": session}
    try:
        sess = _session(path, 0, session)
        outs = sess.run(None, feeds)
        np.savez(out_npz, **{o.name: v for o, v in zip(sess.get_outputs(), outs)})
        del sess
    except Exception as err:
        report["error"] = str(err).splitlines()[0][:300]
        return report
    report["at_budget"] = dict(zip(("ok", "error"), _runs(path, feeds, budget, session)))
    report.update(_least(lambda limit: _runs(path, feeds, limit, session), hint, resolution))
    report["seconds"] = round(time.time() - t0, 1)
    return report


def _least(probe, hint: int, resolution: int) -> dict:
    """The smallest limit ``probe(limit) -> (ok, error)`` passes at: a bracket grown and shrunk by
    1.25x from ``hint``, then bisection to ``resolution``."""
    hi, probes = max(hint, 1 << 20), 0
    while True:
        ok, _ = probe(hi)
        probes += 1
        if ok:
            break
        hi = int(hi * 1.25)
        if hi > (64 << 30):
            return {"least_limit": None, "probes": probes}
    lo, err = int(hi * 0.8), ""
    while True:
        ok, err = probe(lo)
        probes += 1
        if not ok:
            break
        hi, lo = lo, int(lo * 0.8)
        if lo < (1 << 16):
            lo = 0
            break
    last_error = err
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        ok, err = probe(mid)
        probes += 1
        if ok:
            hi = mid
        else:
            lo, last_error = mid, err
    return {"least_limit": hi, "failed_at": lo, "error_below": last_error, "probes": probes}


def step_times(files: list[str], feeds_path: str, rounds: int = 15) -> list[float]:
    feeds = dict(np.load(feeds_path))
    sessions = [_session(f, 0) for f in files]
    for s in sessions:
        for _ in range(3):
            s.run(None, feeds)
    times: list[list[float]] = [[] for _ in files]
    for _ in range(rounds):
        for i, s in enumerate(sessions):
            t0 = time.perf_counter()
            s.run(None, feeds)
            times[i].append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in times]


def run(args) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers() and not DRY_RUN:
        sys.exit("gpu_zoo: error: onnxruntime has no CUDAExecutionProvider here")
    d = Path(args.dir)
    manifest = {}
    for part in sorted(d.glob("manifest.*.json")) + [d / "batch_manifest.json"]:
        if part.exists():
            manifest.update(json.loads(part.read_text()))
    if args.only:
        manifest = {k: v for k, v in manifest.items() if k in args.only}
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    results: dict = {"onnxruntime": ort.__version__, "models": {}}
    out_json = Path(args.json)

    def save():
        out_json.write_text(json.dumps(results, indent=1))

    jobs = {}
    t_start = time.time()
    feeds_of = {name: str(d / e.get("feeds", f"{name}.feeds.npz")) for name, e in manifest.items()}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for name, e in manifest.items():
            feeds = feeds_of[name]
            plans = [p for p in e["plans"] if p["kind"] != "none"]
            budget0 = min((p["budget_bytes"] for p in plans), default=0)
            jobs[pool.submit(measure_file, str(d / e["orig"]), feeds, budget0, e["orig_need"],
                             str(tmp / f"{name}.orig.npz"), max(4096, e["orig_need"] // 2000))] = (name, "orig", None)
            for p in plans:
                jobs[pool.submit(measure_file, str(d / p["file"]), feeds, p["budget_bytes"], p["need"],
                                 str(tmp / f"{name}.{p['pct']}.npz"), max(4096, p["need"] // 2000))] = (name, "plan", str(p["pct"]))
            for p in plans:
                if p.get("pinned"):
                    jobs[pool.submit(measure_file, str(d / p["pinned"]), feeds, p["budget_bytes"], p["need"],
                                     str(tmp / f"{name}.{p['pct']}.pinned.npz"), max(4096, p["need"] // 500),
                                     "default")] = (name, "pinned", str(p["pct"]))
            for i, x in enumerate(e.get("extra", [])):
                jobs[pool.submit(measure_file, str(d / x["file"]), str(d / x["feeds"]), x["budget_bytes"], x["need"],
                                 str(tmp / f"{name}.extra{i}.npz"), max(4096, x["need"] // 2000))] = (name, "extra", i)
            results["models"][name] = {"spec": e["spec"], "dims": e["dims"], "orig_need": e["orig_need"],
                                       "max_batch": e.get("max_batch"), "extra": [dict(x) for x in e.get("extra", [])],
                                       "plans": {str(p["pct"]): dict(p) for p in e["plans"]}}
        for fut in as_completed(jobs):
            name, what, key = jobs[fut]
            try:
                rep = fut.result()
            except Exception as err:
                rep = {"error": f"{type(err).__name__}: {err}"[:300]}
            m = results["models"][name]
            if what == "orig":
                m["orig_run"] = rep
            elif what == "extra":
                m["extra"][key]["run"] = rep
            elif what == "pinned":
                m["plans"][key]["pinned_run"] = rep
            else:
                m["plans"][key]["run"] = rep
            print(f"[{time.time() - t_start:5.0f} s] {name} {what} {key or ''}: least "
                  f"{rep.get('least_limit')} at budget {rep.get('at_budget')} ({rep.get('probes')} probes, "
                  f"{rep.get('seconds')} s)" + (f" ERROR {rep['error']}" if "error" in rep else ""), flush=True)
            save()
    # the original at each plan's budget (expected to fail), outputs compared
    for name, m in results["models"].items():
        feeds = dict(np.load(feeds_of[name]))
        o_npz = tmp / f"{name}.orig.npz"
        orig = dict(np.load(o_npz)) if o_npz.exists() else None
        if orig is not None and (d / f"{name}.cpu.npz").exists():
            m["orig_vs_cpu"] = _diff(orig, dict(np.load(d / f"{name}.cpu.npz")))
        for pct, p in m["plans"].items():
            if "run" not in p:
                continue
            p["orig_at_budget"] = dict(zip(("ok", "error"), _runs(str(d / manifest[name]["orig"]), feeds,
                                                                    p["budget_bytes"])))
            p_npz = tmp / f"{name}.{pct}.npz"
            if orig is not None and p_npz.exists():
                p["vs_orig"] = _diff(dict(np.load(p_npz)), orig)
            pin_npz = tmp / f"{name}.{pct}.pinned.npz"
            if orig is not None and pin_npz.exists():
                p["pinned_vs_orig"] = _diff(dict(np.load(pin_npz)), orig)
    save()
    # fresh-process cross-check of the in-process bisection: the least limit runs, one 64 KiB below fails
    checked = 0
    for name, m in results["models"].items():
        for pct, p in m["plans"].items():
            least = (p.get("run") or {}).get("least_limit")
            if least and checked < args.cross_checks:
                f = str(d / p["file"])
                p["fresh_process"] = {"at_least": run_once(f, feeds_of[name], least)["ok"],
                                      "below": run_once(f, feeds_of[name], least - (64 << 10))["ok"]}
                checked += 1
    save()
    print(f"[{time.time() - t_start:5.0f} s] limits done; step times", flush=True)
    for name, m in results["models"].items():
        if time.time() - t_start > args.deadline:
            print("deadline reached; step times stop here", flush=True)
            break
        pcts = [pct for pct, p in m["plans"].items() if "run" in p and "error" not in p["run"]]
        files = [str(d / manifest[name]["orig"])] + [str(d / m["plans"][pct]["file"]) for pct in pcts]
        try:
            times = step_times(files, feeds_of[name])
            for x in m["extra"]:
                x["step_s"] = step_times([str(d / x["file"])], str(d / x["feeds"]))[0]
        except Exception as err:
            m["step_error"] = str(err)[:300]
            continue
        m["step_s"] = times[0]
        for pct, t in zip(pcts, times[1:]):
            m["plans"][pct]["step_s"] = t
        save()
    print(f"[{time.time() - t_start:5.0f} s] done", flush=True)
    print(table(results))


# --------------------------------------------------------------------------------------------- table
def table(results: dict) -> str:
    mib = 1 << 20
    lines = [f"onnxruntime-gpu {results.get('onnxruntime')}, CUDA provider, kSameAsRequested, planned session options",
             "",
             "| model | budget | plan | budget MiB | peak MiB | arena need, predicted | least gpu_mem_limit, measured | "
             "measured / predicted | measured / budget | planned runs at budget | original runs at budget | "
             "max rel diff vs original | pred +t% | meas +t% | pinned, ORT defaults: least limit MiB | "
             "/ predicted need |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in results["models"].items():
        if m.get("max_batch"):
            continue
        o = m.get("orig_run", {})
        lines.append(f"| {name} | unplanned | - | - | - | {m['orig_need'] / mib:.2f} | "
                     f"{(o.get('least_limit') or 0) / mib:.2f} | "
                     f"{(o.get('least_limit') or 0) / m['orig_need']:.3f} | - | - | - | "
                     f"{m.get('orig_vs_cpu', {}).get('max_rel', float('nan')):.1e} (vs CPU) | - | - | - | - |")
        for pct, p in m["plans"].items():
            if p["kind"] == "none":
                lines.append(f"| {name} | {pct}% | none | | | | | | | | | | | | | |")
                continue
            r = p.get("run", {})
            least = r.get("least_limit") or 0
            pin = (p.get("pinned_run") or {}).get("least_limit") or 0
            meas_t = (p["step_s"] / m["step_s"] - 1) * 100 if p.get("step_s") and m.get("step_s") else float("nan")
            lines.append(
                f"| {name} | {pct}% | {p['kind']} | {p['budget_bytes'] / mib:.2f} | {p['peak_bytes'] / mib:.2f} | "
                f"{p['need'] / mib:.2f} | {least / mib:.2f} | {least / p['need']:.3f} | "
                f"{least / p['budget_bytes']:.3f} | {(r.get('at_budget') or {}).get('ok')} | "
                f"{(p.get('orig_at_budget') or {}).get('ok')} | {p.get('vs_orig', {}).get('max_rel', float('nan')):.1e} | "
                f"{p['added_time_pct']:.1f} | {meas_t:.1f} | "
                + (f"{pin / mib:.2f} | {pin / p['need']:.3f} |" if pin else "- | - |"))
    mb = [(name, m) for name, m in results["models"].items() if m.get("max_batch")]
    if mb:
        lines += ["", "| model | budget MiB | unplanned batch | runs at budget | planned batch | ratio | planned runs at "
                  "budget | original at planned batch runs at budget | pred +t% | meas +t% (vs original, same batch) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for name, m in mb:
            b, x = m["max_batch"], m["extra"][0]
            p = next(iter(m["plans"].values()))
            meas_t = (p["step_s"] / m["step_s"] - 1) * 100 if p.get("step_s") and m.get("step_s") else float("nan")
            lines.append(f"| {name} | {b['budget_bytes'] / mib:.2f} | {b['unplanned_batch']} | "
                         f"{(x.get('run', {}).get('at_budget') or {}).get('ok')} | {b['planned_batch']} | "
                         f"{b['planned_batch'] / b['unplanned_batch']:.2f}x | "
                         f"{(p.get('run', {}).get('at_budget') or {}).get('ok')} | "
                         f"{(p.get('orig_at_budget') or {}).get('ok')} | {p['added_time_pct']:.1f} | {meas_t:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prep")
    p.add_argument("--dir", default=".gpu/z")
    p.add_argument("--budgets", default="80,60,50")
    p.add_argument("--time-limit", type=float, default=10)
    p.add_argument("--only", nargs="*")
    p.add_argument("--tag", default="zoo", help="the manifest's name: manifest.TAG.json")
    p.add_argument("--reuse", action="store_true", help="keep plans an earlier prep wrote")
    q = sub.add_parser("prep-pinned")
    q.add_argument("--dir", default=".gpu/z")
    k = sub.add_parser("pack")
    k.add_argument("--dir", default=".gpu/z")
    k.add_argument("--out", default=".gpu/c")
    b = sub.add_parser("prep-batch")
    b.add_argument("--dir", default=".gpu/z")
    b.add_argument("--time-limit", type=float, default=10)
    b.add_argument("--only", nargs="*")
    r = sub.add_parser("run")
    r.add_argument("--dir", default=".gpu/c")
    r.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gpu_zoo.json"))
    r.add_argument("--tmp", default="/tmp/gpu_zoo")
    r.add_argument("--workers", type=int, default=8)
    r.add_argument("--cross-checks", type=int, default=6)
    r.add_argument("--deadline", type=float, default=420, help="seconds after which no more step times are taken")
    r.add_argument("--only", nargs="*")
    t = sub.add_parser("table")
    t.add_argument("json")
    args = ap.parse_args()
    if args.cmd == "prep":
        prep(args)
    elif args.cmd == "prep-pinned":
        prep_pinned(args)
    elif args.cmd == "pack":
        pack(args)
    elif args.cmd == "prep-batch":
        prep_batch(args)
    elif args.cmd == "run":
        run(args)
    else:
        print(table(json.loads(Path(args.json).read_text())))


if __name__ == "__main__":
    main()
