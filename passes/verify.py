"""Run models in ONNX Runtime: session options for planned models, peak memory measurement.

``measure_peak`` follows the CPU recipe of DESIGN.md: a fresh subprocess with glibc told to mmap
every block >= 64 KiB and never trim lazily, ORT's arena, memory pattern and memory reuse off,
PRIORITY_BASED execution order (file order), one warm-up run, then ``clear_refs`` and VmHWM around a
second run. The figure is the run's dynamic memory (activations, outputs, kernel scratch): inputs and
initializers were resident before the measurement started.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx

from planner.errors import PlannerError


def planned_session_options(mem_reuse: bool = False):
    """SessionOptions a memplan-planned model must run with (README: "Running a planned model").

    ORT_DISABLE_ALL keeps CSE from merging recompute copies back; PRIORITY_BASED runs a sorted file
    in file order (ORT's default DFS order can double the peak); arena and memory pattern off so
    freed buffers go back at once.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.enable_cpu_mem_arena = False
    so.enable_mem_pattern = False
    so.enable_mem_reuse = mem_reuse
    so.log_severity_level = 3
    return so


@dataclass(frozen=True)
class PeakMeasurement:
    peak_bytes: int  # VmHWM - VmRSS before the measured run (dynamic memory of one run)
    seconds: float  # wall time of the measured run
    outputs: dict[str, np.ndarray] | None = None


_CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
sys.path.insert(0, {root!r})
from passes.verify import planned_session_options
args = json.loads(sys.argv[1])
so = planned_session_options() if args["planned"] else ort.SessionOptions()
if not args["planned"]:
    so.log_severity_level = 3
so.intra_op_num_threads = args["threads"]
so.inter_op_num_threads = 1
sess = ort.InferenceSession(args["model"], so, providers=["CPUExecutionProvider"])
feeds = dict(np.load(args["feeds"]))
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
sess.run(None, feeds)  # warm-up: lazy kernel state, thread pools
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
t0 = time.perf_counter()
outs = sess.run(None, feeds)
dt = time.perf_counter() - t0
hwm = status("VmHWM")
times = [dt]
for _ in range(args["repeats"] - 1):
    t0 = time.perf_counter()
    sess.run(None, feeds)
    times.append(time.perf_counter() - t0)
dt = sorted(times)[len(times) // 2]
if args["outputs"]:
    np.savez(args["outputs"], **{{o.name: v for o, v in zip(sess.get_outputs(), outs)}})
print(json.dumps({{"peak": hwm - before, "seconds": dt}}))
"""


def measure_peak(
    model: onnx.ModelProto | str | os.PathLike,
    feeds: Mapping[str, np.ndarray],
    *,
    planned_options: bool = True,
    threads: int = 1,
    keep_outputs: bool = False,
    repeats: int = 3,
    timeout: float = 600.0,
) -> PeakMeasurement:
    """Measure one run's dynamic peak memory on CPU ORT in a fresh subprocess (Linux only).

    ``seconds`` is the median of ``repeats`` timed runs (the first is the measured one).
    """
    if not Path("/proc/self/clear_refs").exists():
        raise PlannerError("peak measurement needs Linux /proc (clear_refs, VmHWM)")
    root = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory(prefix="memplan-measure-") as tmp:
        if isinstance(model, onnx.ModelProto):
            path = os.path.join(tmp, "model.onnx")
            onnx.save_model(model, path)
        else:
            path = str(model)
        feeds_path = os.path.join(tmp, "feeds.npz")
        np.savez(feeds_path, **{k: np.asarray(v) for k, v in feeds.items()})
        out_path = os.path.join(tmp, "outputs.npz") if keep_outputs else ""
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0",
                   OMP_NUM_THREADS=str(threads))
        args = json.dumps({"model": path, "feeds": feeds_path, "planned": planned_options, "threads": threads,
                           "outputs": out_path, "repeats": max(1, repeats)})
        proc = subprocess.run([sys.executable, "-c", _CHILD.format(root=root), args], env=env,
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise PlannerError(f"measuring the model in onnxruntime failed: {tail}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        outputs = None
        if keep_outputs:
            with np.load(out_path) as z:
                outputs = {k: z[k] for k in z.files}
    return PeakMeasurement(int(result["peak"]), float(result["seconds"]), outputs)


# ---- verify: planned model against its reference -------------------------------------------------
@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_abs_diff: float
    max_rel_diff: float
    ok: bool


@dataclass(frozen=True)
class VerifyReport:
    outputs: tuple[OutputCheck, ...]
    rtol: float
    atol: float
    base_bytes: int  # inputs + initializers of the planned model (resident before the run)
    reference_peak: int  # measured dynamic peak of the reference (planned session options)
    planned_peak: int  # measured dynamic peak of the planned model (planned session options)
    planned_default_peak: int  # measured with ORT's default session options
    predicted_planned_peak: int  # liveness model's dynamic peak of the planned model
    reference_seconds: float
    planned_seconds: float

    @property
    def outputs_equal(self) -> bool:
        return all(o.ok for o in self.outputs)

    def as_dict(self) -> dict:
        return {
            "schema": "memplan.verify/1",
            "outputs_equal": self.outputs_equal,
            "tolerance": {"rtol": self.rtol, "atol": self.atol},
            "outputs": [o.__dict__ for o in self.outputs],
            "base_bytes": self.base_bytes,
            "reference": {"peak_bytes": self.base_bytes + self.reference_peak,
                          "dynamic_peak_bytes": self.reference_peak, "seconds": self.reference_seconds},
            "planned": {"peak_bytes": self.base_bytes + self.planned_peak, "dynamic_peak_bytes": self.planned_peak,
                        "predicted_dynamic_peak_bytes": self.predicted_planned_peak,
                        "measured_over_predicted": self.planned_peak / max(1, self.predicted_planned_peak),
                        "default_options_dynamic_peak_bytes": self.planned_default_peak,
                        "seconds": self.planned_seconds},
            "time_overhead": self.planned_seconds / max(1e-12, self.reference_seconds) - 1.0,
        }


def compare_outputs(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], rtol: float, atol: float):
    checks = []
    for name in sorted(ref):
        a, b = np.asarray(ref[name]), np.asarray(got[name])
        if a.shape != b.shape:
            checks.append(OutputCheck(name, float("inf"), float("inf"), False))
            continue
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        scale = np.abs(a.astype(np.float64))
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(scale, 1e-30)).max()) if diff.size else 0.0
        ok = bool(np.all(diff <= atol + rtol * scale)) and bool(np.isfinite(b).all() == np.isfinite(a).all())
        checks.append(OutputCheck(name, max_abs, max_rel, ok))
    return tuple(checks)


def verify_models(
    reference: onnx.ModelProto,
    planned: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    *,
    predicted_planned_peak: int,
    base_bytes: int,
    rtol: float = 0.0,
    atol: float = 0.0,
) -> VerifyReport:
    """Run both models on the same feeds; compare outputs; measure peaks and step times."""
    ref_names = {o.name for o in reference.graph.output}
    missing = [o.name for o in planned.graph.output if o.name not in ref_names]
    if missing:
        raise PlannerError(f"the planned model has output {missing[0]!r} that the reference lacks; "
                           "was it made from this MODEL?")
    ref = measure_peak(reference, feeds, keep_outputs=True)
    got = measure_peak(planned, feeds, keep_outputs=True)
    default = measure_peak(planned, feeds, planned_options=False)
    assert ref.outputs is not None and got.outputs is not None
    checks = compare_outputs({k: ref.outputs[k] for k in got.outputs}, got.outputs, rtol, atol)
    return VerifyReport(checks, rtol, atol, base_bytes, ref.peak_bytes, got.peak_bytes, default.peak_bytes,
                        predicted_planned_peak, ref.seconds, got.seconds)
