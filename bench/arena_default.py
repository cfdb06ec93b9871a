"""Where a planned model's memory goes under ORT's true default session options, and what brings it back.

    python bench/arena_default.py [--model zoo:gpt?batch=64] [--budget 70] [--json out.json]

Plans MODEL's training step at BUDGET % of its unplanned peak with pinned order (passes/pin_order.py,
as ``memplan plan --pin-order`` emits it) and measures it, and the unplanned model, in fresh
processes with the recipe of passes/verify.py (1 thread, glibc mmap threshold 64 KiB). Figures are
over the plan's predicted dynamic peak (the unplanned model's own for the unplanned model):

- warm: VmHWM - VmRSS before the second run; cold: VmHWM over runs 1 and 2 - VmRSS after session
  creation; "cold - first run": cold less the first-run kernel state, i.e. cold - warm of the same
  model under the planned options (how ``memplan verify`` reports the default-options peak).
- held: cold again when the first run's outputs are still alive during the second (a training loop
  keeps the step's outputs until the next step has run).
- arena log: the regions ORT's CPU BFC arena adds (its INFO log: "Extended allocation by") during
  session creation, run 1 and run 2, and the run-2 requests that made it grow.

Tables: 1. ORT defaults (ALL optimizations, DFS order) with arena x memory pattern x memory reuse;
2. the arena log under the true defaults; 3. remedies: session options, an arena configured through
``ort.create_and_register_allocator`` + "session.use_env_allocators", a run option, and the model
with passes/mem_pattern.py's marker input.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from passes.autodiff import training_graph  # noqa: E402
from passes.mem_pattern import without_mem_pattern  # noqa: E402
from passes.onnx_export import export_model  # noqa: E402
from passes.onnx_import import import_model  # noqa: E402
from passes.plan_model import plan_graph  # noqa: E402
from passes.verify import ORT_DEFAULT, PLANNED, SessionConfig, _run_child, _stage  # noqa: E402
from planner.cpsat import PlannerOptions  # noqa: E402
from planner.liveness import MemoryModel, analyze  # noqa: E402

MiB = 2**20

# Formatted by passes.verify._run_child (root=...): literal braces are doubled.
_CHILD = r"""
import json, os, re, sys, time
import numpy as np
import onnxruntime as ort
sys.path.insert(0, {root!r})
from passes.verify import SessionConfig, proc_status as status
args = json.loads(sys.argv[1])
saved_fd = None
if args["log"]:
    saved_fd = os.dup(2)
    log_fd = os.open(args["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log_fd, 2)
    ort.set_default_logger_severity(1)
so = SessionConfig(**args["session"]).session_options()
if args["log"]:
    so.log_severity_level = 1
so.intra_op_num_threads = 1
so.inter_op_num_threads = 1
if args["arena_cfg"] is not None:
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(info, ort.OrtArenaCfg(args["arena_cfg"]))
    so.add_session_config_entry("session.use_env_allocators", "1")
ro = ort.RunOptions()
for key, value in args["run_config"].items():
    ro.add_run_config_entry(key, value)
sess = ort.InferenceSession(args["model"], so, providers=["CPUExecutionProvider"])
feeds = dict(np.load(args["feeds"]))
def mark(phase):
    if args["log"]:
        os.write(2, ("@@" + phase + "\n").encode())
open("/proc/self/clear_refs", "w").write("5")
made = status("VmRSS")
mark("run1")
held = sess.run(None, feeds, ro)
if not args["hold"]:
    held = None
warm_hwm = status("VmHWM")
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
mark("run2")
outs = sess.run(None, feeds, ro)
hwm = status("VmHWM")
mark("timing")
held = outs = None
times = []
for _ in range(args["repeats"]):
    t0 = time.perf_counter()
    sess.run(None, feeds, ro)
    times.append(time.perf_counter() - t0)
extends, requests = {{}}, {{}}
if args["log"]:
    os.dup2(saved_fd, 2)
    phase = "session"
    for line in open(args["log"]):
        if line.startswith("@@"):
            phase = line[2:].strip()
        elif m := re.search(r"Extended allocation by (\d+) bytes", line):
            extends.setdefault(phase, []).append(int(m.group(1)))
        elif m := re.search(r"\(requested\) num_bytes: (\d+)", line):
            requests.setdefault(phase, []).append(int(m.group(1)))
print(json.dumps({{"warm": hwm - before, "cold": max(warm_hwm, hwm) - made, "run1": warm_hwm - made,
                  "seconds": sorted(times)[len(times) // 2], "extends": extends, "requests": requests}}))
"""


@dataclass(frozen=True)
class Setup:
    """One way to run a model: ORT session options plus what they cannot say."""

    session: SessionConfig
    arena_cfg: dict | None = None  # an env CPU arena (OrtArenaCfg keys), used via session.use_env_allocators
    run_config: dict = field(default_factory=dict)  # RunOptions config entries


@dataclass(frozen=True)
class Run:
    warm: int
    cold: int
    run1: int
    seconds: float
    extends: dict
    requests: dict


def run(model_path: str, feeds_path: str, setup: Setup, *, hold: bool = False, log: bool = False,
        repeats: int = 5) -> Run:
    """Measure ``model_path`` once in a fresh process (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="memplan-arena-") as tmp:
        args = {"model": model_path, "feeds": feeds_path, "session": asdict(setup.session),
                "arena_cfg": setup.arena_cfg, "run_config": setup.run_config, "hold": hold,
                "log": str(Path(tmp) / "ort.log") if log else "", "repeats": repeats}
        r = _run_child(_CHILD, args, 1, 600.0)
    return Run(r["warm"], r["cold"], r["run1"], r["seconds"], r["extends"], r["requests"])


def arena_cfg(strategy: int = 0, initial: int = -1, max_dead: int = -1) -> dict:
    """OrtArenaCfg keys; -1 / 0 leave ORT's default (1 MiB first region, kNextPowerOfTwo, 128 MiB dead bytes).

    ``max_dead``: a free chunk is split for a request only when at least twice its size or when the
    rest reaches this many bytes (0 crashes ORT 1.31 on free).
    """
    return {"max_mem": 0, "arena_extend_strategy": strategy, "initial_chunk_size_bytes": initial,
            "max_dead_bytes_per_chunk": max_dead, "initial_growth_chunk_size_bytes": -1}


def mib_list(xs) -> str:
    return "[" + ", ".join(f"{x / MiB:.2f}" for x in xs) + "]" if xs else "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="zoo:gpt?batch=64")
    ap.add_argument("--budget", type=float, default=70)
    ap.add_argument("--time-limit", type=float, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    graph = training_graph(import_model(args.model))
    budget = math.ceil(analyze(graph).peak_bytes * args.budget / 100)
    pm = plan_graph(graph, budget, options=PlannerOptions(time_limit=args.time_limit, workers=1, seed=0), pin=True)
    if not pm.ok:
        sys.exit(f"no plan: {pm.result.note}")
    pinned = export_model(pm.planned, value_info=False)
    unplanned = export_model(graph)
    protos = {"pinned": pinned, "pinned+marker": without_mem_pattern(pinned), "unplanned": unplanned,
              "unplanned+marker": without_mem_pattern(unplanned)}
    planned_peak = analyze(pm.planned, model=MemoryModel(host_copies_resident=True)).dynamic_peak
    unplanned_peak = analyze(graph).dynamic_peak
    predicted = {name: unplanned_peak if name.startswith("unplanned") else planned_peak for name in protos}
    feeds = models.example_feeds(unplanned, seed=0)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="memplan-arena-models-") as tmp:
        names = list(protos)
        paths, feeds_path = _stage(tmp, [protos[n] for n in names], feeds)
        path = dict(zip(names, paths))
        print(f"{args.model} at {args.budget:g}%: predicted dynamic peak planned {predicted['pinned'] / MiB:.2f} MiB, "
              f"unplanned {predicted['unplanned'] / MiB:.2f} MiB ({predicted['pinned'] / predicted['unplanned']:.3f})")

        first_run = {}
        for name in names:
            r = run(path[name], feeds_path, Setup(PLANNED))
            first_run[name] = max(0, r.cold - r.warm)
            rows.append({"table": "planned options", "model": name, **asdict(r)})
            print(f"planned options {name:14s} warm {r.warm / predicted[name]:.3f} cold {r.cold / predicted[name]:.3f} "
                  f"first-run state {first_run[name] / MiB:.2f} MiB, {r.seconds * 1e3:.1f} ms")

        def line(label: str, name: str, r: Run, held: Run | None = None) -> str:
            p = predicted[name]
            text = (f"| {label} | {name} | {r.warm / p:.2f} | {r.cold / p:.2f} | {(r.cold - first_run[name]) / p:.2f} |")
            if held is not None:
                text += f" {held.cold / p:.2f} |"
            return text + f" {r.seconds * 1e3:.1f} |"

        print("\n1. ORT defaults (ALL, DFS order), arena x memory pattern x memory reuse (over predicted)")
        print("| arena | pattern | reuse | model | warm | cold | cold - first run | ms | cold bytes planned/unplanned |")
        print("|---|---|---|---|---|---|---|---|---|")
        for arena, pattern, reuse in itertools.product((True, False), repeat=3):
            cfg = replace(ORT_DEFAULT, arena=arena, mem_pattern=pattern, mem_reuse=reuse)
            got = {}
            for name in ("pinned", "unplanned"):
                got[name] = r = run(path[name], feeds_path, Setup(cfg))
                rows.append({"table": "matrix", "arena": arena, "pattern": pattern, "reuse": reuse, "model": name,
                             **asdict(r)})
                p = predicted[name]
                ratio = "" if name == "pinned" else f"{(got['pinned'].cold - first_run['pinned']) / max(1, r.cold - first_run[name]):.3f}"
                print(f"| {'on' if arena else 'off'} | {'on' if pattern else 'off'} | {'on' if reuse else 'off'} | "
                      f"{name} | {r.warm / p:.2f} | {r.cold / p:.2f} | {(r.cold - first_run[name]) / p:.2f} | "
                      f"{r.seconds * 1e3:.1f} | {ratio} |", flush=True)

        print("\n2. CPU arena regions added (MiB) under ORT's true defaults")
        print("| model | session creation | run 1 | run 2 | run-2 requests that grew it |")
        print("|---|---|---|---|---|")
        for name in ("pinned", "pinned+marker", "unplanned"):
            r = run(path[name], feeds_path, Setup(ORT_DEFAULT), log=True)
            rows.append({"table": "arena log", "model": name, **asdict(r)})
            print(f"| {name} | {mib_list(r.extends.get('session'))} | {mib_list(r.extends.get('run1'))} | "
                  f"{mib_list(r.extends.get('run2'))} | {mib_list(r.requests.get('run2'))} |", flush=True)

        p = predicted["pinned"]
        no_pattern = replace(ORT_DEFAULT, mem_pattern=False)
        remedies = [
            ("planned options (planned_session_options())", "pinned", Setup(PLANNED)),
            ("ORT defaults", "pinned", Setup(ORT_DEFAULT)),
            ("defaults, enable_mem_pattern=False", "pinned", Setup(no_pattern)),
            ("defaults, enable_cpu_mem_arena=False", "pinned", Setup(replace(ORT_DEFAULT, arena=False))),
            ("defaults, pattern and reuse off", "pinned", Setup(replace(no_pattern, mem_reuse=False))),
            ("defaults, env arena kSameAsRequested", "pinned", Setup(ORT_DEFAULT, arena_cfg(strategy=1))),
            ("defaults, env arena first region 2x plan", "pinned", Setup(ORT_DEFAULT, arena_cfg(initial=2 * p))),
            ("defaults, env arena first region 4x plan", "pinned", Setup(ORT_DEFAULT, arena_cfg(initial=4 * p))),
            ("defaults, run option arena shrinkage", "pinned",
             Setup(ORT_DEFAULT, run_config={"memory.enable_memory_arena_shrinkage": "cpu:0"})),
            ("ORT defaults, model with the marker input", "pinned+marker", Setup(ORT_DEFAULT)),
            ("defaults, enable_cpu_mem_arena=False, marker", "pinned+marker", Setup(replace(ORT_DEFAULT, arena=False))),
            ("defaults, env arena max_dead_bytes_per_chunk 4 KiB, marker", "pinned+marker",
             Setup(ORT_DEFAULT, arena_cfg(max_dead=4096))),
            ("planned options, model with the marker input", "pinned+marker", Setup(PLANNED)),
            ("ORT defaults, unplanned model", "unplanned", Setup(ORT_DEFAULT)),
            ("ORT defaults, unplanned model with the marker", "unplanned+marker", Setup(ORT_DEFAULT)),
        ]
        print("\n3. Remedies (over predicted; held: run 1's outputs alive during run 2)")
        print("| setup | model | warm | cold | cold - first run | cold, held | ms |")
        print("|---|---|---|---|---|---|---|")
        for label, name, setup in remedies:
            r = run(path[name], feeds_path, setup)
            held = run(path[name], feeds_path, setup, hold=True, repeats=1)
            rows.append({"table": "remedies", "setup": label, "model": name, **asdict(r), "held_cold": held.cold})
            print(line(label, name, r, held), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "budget_pct": args.budget,
                                               "predicted": predicted, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
