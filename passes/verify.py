"""Run models in ONNX Runtime: session options for planned models, peak memory measurement.

``measure_peak`` runs a model in a fresh subprocess with ORT's arena, memory pattern and memory
reuse off and PRIORITY_BASED execution order (file order): one warm-up run, then the measured run.
Its figure is the run's dynamic memory (activations, outputs, kernel scratch): inputs and
initializers were resident before the measurement started. It is counted by
``passes/alloc_counter.py``: the bytes ORT's allocator holds (every tensor and working buffer it
hands out), exactly, through a preloaded library. Where that library cannot be built, it falls back
to the CPU recipe of DESIGN.md: glibc told to mmap every block >= 64 KiB and never trim lazily,
``clear_refs`` and VmHWM around the run (about 150 KiB short after an unmap, page rounding and heap
fragmentation over: bench/results/small_peak_measurement.md). Both figures are reported.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import onnx

from passes import alloc_counter, timing
from passes.onnx_export import save_model
from passes.ort_errors import MissingKernelError, missing_kernel
from planner.errors import PlannerError, UsageError
from planner.graph import HALF_DTYPES


@dataclass(frozen=True)
class SessionConfig:
    """The ORT session options that decide a run's memory (one field per knob, ORT's default in ``ORT_DEFAULT``)."""

    optimization: str = "disable"  # graph_optimization_level: disable | basic | extended | all
    order: str = "priority"  # execution_order: priority (file order for a sorted file) | default (DFS)
    arena: bool = False  # enable_cpu_mem_arena: keeps freed memory for reuse, grows in large chunks
    mem_pattern: bool = False  # enable_mem_pattern: one block per run, planned from the first run
    mem_reuse: bool = False  # enable_mem_reuse: hands dead buffers to new tensors

    def session_options(self):
        import onnxruntime as ort

        levels = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                  "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                  "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                  "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
        orders = {"priority": ort.ExecutionOrder.PRIORITY_BASED, "default": ort.ExecutionOrder.DEFAULT}
        so = ort.SessionOptions()
        so.graph_optimization_level = levels[self.optimization]
        so.execution_order = orders[self.order]
        so.enable_cpu_mem_arena = self.arena
        so.enable_mem_pattern = self.mem_pattern
        so.enable_mem_reuse = self.mem_reuse
        so.log_severity_level = 3
        return so


#: What a planned model must run with (README "Running a planned model").
PLANNED = SessionConfig()
#: A plain ``ort.SessionOptions()``.
ORT_DEFAULT = SessionConfig(optimization="all", order="default", arena=True, mem_pattern=True, mem_reuse=True)

#: Below this predicted dynamic peak the RSS recipe's peaks are noise, not figures: the kernel stores
#: VmHWM from an approximate counter (about 150 KiB short after every munmap) and glibc's and ORT's
#: own allocations move by hundreds of KiB run to run (bench/results/small_peak_measurement.md:
#: efficientnet, 1.15 MiB predicted, measured 0.107-0.251 of it; bert at batch 4, 145 KiB
#: predicted, a dynamic peak of -80 KiB). verify then says so instead of printing a ratio.
RSS_RESOLUTION_BYTES = 2 << 20


def planned_session_options(mem_reuse: bool = False):
    """SessionOptions a memplan-planned model must run with (README: "Running a planned model").

    ORT_DISABLE_ALL keeps CSE from merging recompute copies back; PRIORITY_BASED runs a sorted file
    in file order (ORT's default DFS order can double the peak); arena and memory pattern off so
    freed buffers go back at once.
    """
    return SessionConfig(mem_reuse=mem_reuse).session_options()


#: How a peak was measured: ORT's allocator bytes counted (exact), or the process's resident memory.
ALLOCATOR, RSS = "allocator", "rss"


@dataclass(frozen=True)
class PeakMeasurement:
    # one warm run's dynamic memory: the allocator's high-water mark over the measured (second) run
    # less its bytes in use before it, or (``method`` RSS) VmHWM - VmRSS before that run
    peak_bytes: int
    seconds: float  # median wall time of the timed runs
    outputs: dict[str, np.ndarray] | None = None
    # the same over the warm-up and the measured run, from when the session was made: what was held
    # for activations at any time, including memory an arena or memory pattern kept from the first
    # run (with those off it equals ``peak_bytes`` up to first-run kernel state)
    cold_peak_bytes: int = 0
    method: str = RSS
    rss_peak_bytes: int = 0  # VmHWM - VmRSS before the measured run, whatever ``method`` is
    rss_cold_peak_bytes: int = 0
    # counted: the allocator bytes the session held once made (initializers, prepacked weights, and
    # with the arena on the arena's first region, which ORT takes while it makes the session and
    # ``cold_peak_bytes`` therefore does not see); 0 measured by RSS
    session_bytes: int = 0


def as_rss(m: PeakMeasurement) -> PeakMeasurement:
    """The measurement's RSS figures in place of the counted ones."""
    return replace(m, peak_bytes=m.rss_peak_bytes, cold_peak_bytes=m.rss_cold_peak_bytes, method=RSS, session_bytes=0)


def proc_status(key: str) -> int:
    """A /proc/self/status field (VmRSS, VmHWM) in bytes: what the measuring children read."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise PlannerError(f"/proc/self/status has no {key} field")


_CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
sys.path.insert(0, {root!r})
from passes.verify import SessionConfig, proc_status as status, save_arrays
{helpers}
args = json.loads(sys.argv[1])
# Random ops (Dropout in training mode, RandomNormal) without a seed attribute draw from ORT's
# process-wide seed, the clock unless set: the same seed makes two runs' draws the same
ort.set_seed(args["seed"])
counter = _counter()
so = SessionConfig(**args["session"]).session_options()
so.intra_op_num_threads = args["threads"]
so.inter_op_num_threads = 1
start_count = counter["reset"]() if counter else 0
sess = ort.InferenceSession(args["model"], so, providers=["CPUExecutionProvider"])
feeds = dict(np.load(args["feeds"]))
open("/proc/self/clear_refs", "w").write("5")
made = status("VmRSS")
made_count = counter["reset"]() if counter else 0
sess.run(None, feeds)  # warm-up: lazy kernel state, thread pools, the arena's first chunks
warm_hwm = status("VmHWM")
warm_high = counter["high"]() if counter else 0
# The warm-up's freed buffers stay resident in the C heap; the measured run would reuse them without
# raising the high-water mark (zoo:gpt?batch=64: 0.953 of the prediction, efficientnet 0.962).
# Handing them back first makes the run fault in what it needs (1.009-1.017 on the same four models).
try:
    import ctypes
    ctypes.CDLL("libc.so.6").malloc_trim(0)
except (OSError, AttributeError):
    pass
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
before_count = counter["reset"]() if counter else 0
t0 = time.perf_counter()
outs = sess.run(None, feeds)
dt = time.perf_counter() - t0
hwm = status("VmHWM")
high = counter["high"]() if counter else 0
times = [dt]
for _ in range(args["repeats"] - 1):
    t0 = time.perf_counter()
    sess.run(None, feeds)
    times.append(time.perf_counter() - t0)
dt = sorted(times)[len(times) // 2]
if args["outputs"]:
    save_arrays(args["outputs"], {{o.name: v for o, v in zip(sess.get_outputs(), outs)}})
counted = {{}}
if counter and counter["lost"]() == 0:
    counted = {{"counted_peak": high - before_count, "counted_cold": max(warm_high, high) - made_count,
               "counted_session": made_count - start_count}}
print(json.dumps({{"peak": hwm - before, "cold": max(warm_hwm, hwm) - made, "seconds": dt, **counted}}))
"""


def measure_peak(
    model: onnx.ModelProto | str | os.PathLike,
    feeds: Mapping[str, np.ndarray],
    *,
    session: SessionConfig = PLANNED,
    threads: int = 1,
    keep_outputs: bool = False,
    repeats: int = 3,
    timeout: float = 600.0,
    seed: int = 0,
) -> PeakMeasurement:
    """Measure one run's dynamic peak memory on CPU ORT in a fresh subprocess (Linux only).

    ``seconds`` is the median of ``repeats`` timed runs (the first is the measured one), on
    ``threads`` intra-op threads. ``seed``: ORT's random seed (``onnxruntime.set_seed``), which
    Dropout and the Random* ops without a seed attribute draw from: two runs of models with such
    ops in the same order draw the same values.
    """
    with tempfile.TemporaryDirectory(prefix="memplan-measure-") as tmp:
        (path,), feeds_path = _stage(tmp, [model], feeds)
        out_path = os.path.join(tmp, "outputs.npz") if keep_outputs else ""
        result = _run_child(_CHILD, {"model": path, "feeds": feeds_path, "session": session.__dict__,
                                     "threads": threads, "outputs": out_path, "repeats": max(1, repeats),
                                     "seed": int(seed)},
                            threads, timeout)
        outputs = None
        if keep_outputs:
            with np.load(out_path) as z:
                outputs = {k: z[k] for k in z.files}
    rss, rss_cold = int(result["peak"]), int(result["cold"])
    if "counted_peak" in result:
        return PeakMeasurement(int(result["counted_peak"]), float(result["seconds"]), outputs,
                               int(result["counted_cold"]), ALLOCATOR, rss, rss_cold,
                               int(result["counted_session"]))
    return PeakMeasurement(rss, float(result["seconds"]), outputs, rss_cold, RSS, rss, rss_cold)


def _stage(tmp: str, models: Sequence[onnx.ModelProto | str | os.PathLike], feeds: Mapping[str, np.ndarray]):
    """Write models (those given as protos) and feeds under ``tmp`` for a child process."""
    paths = []
    for i, model in enumerate(models):
        if isinstance(model, onnx.ModelProto):
            paths.append(os.path.join(tmp, f"model{i}.onnx"))
            inside = not _points_outside(model)
            save_model(model, paths[-1])
            # over protobuf's 2 GB (a whole file of it does not parse) the weights went beside it,
            # and the proto now points at them: back into the caller's proto
            if inside and _points_outside(model):
                onnx.external_data_helper.load_external_data_for_model(model, tmp)
        else:
            paths.append(str(model))
    feeds_path = os.path.join(tmp, "feeds.npz")
    save_arrays(feeds_path, feeds)
    return paths, feeds_path


def save_arrays(path: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` as an .npz file that ``np.load`` reads back by name. ``np.savez(path, **arrays)``
    takes its own parameters' names from the keywords: an input or output named ``file`` or
    ``allow_pickle`` was a TypeError."""
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, value in arrays.items():
            value = np.asanyarray(value)
            if value.dtype == object:  # ORT's string tensors: as numpy strings, which need no pickle
                value = value.astype(np.str_)
            with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, value, allow_pickle=False)


def _points_outside(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _run_child(code: str, args: dict, threads: int, timeout: float) -> dict:
    """Run ``code`` in a fresh Python with the measuring environment; its last stdout line is JSON."""
    if not Path("/proc/self/clear_refs").exists():
        raise PlannerError("peak measurement needs Linux /proc (clear_refs, VmHWM)")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", OMP_NUM_THREADS=str(threads))
    counter = alloc_counter.library()
    if counter is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [counter, os.environ.get("LD_PRELOAD", "")]))
    return _child(code, args, env, timeout, "measuring")


def _child(code: str, args: dict, env: Mapping[str, str], timeout: float, doing: str) -> dict:
    """Run ``code`` (formatted with the repository root) in a fresh Python under ``env``; its last
    stdout line is JSON. A crash is one PlannerError line: "<doing> the model in onnxruntime failed"."""
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", code.format(root=root, helpers=alloc_counter.CHILD_HELPERS),
                           json.dumps(args)], env=dict(env),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        missing = missing_kernel(tail, "CPU provider", "verify runs ORT on the CPU, so it cannot check this "
                                 "model here; run the planned file on a device (bench/gpu_check.py)")
        if missing is not None:
            raise missing
        raise PlannerError(f"{doing} the model in onnxruntime failed: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


_TIMING_CHILD = r"""
import json, sys, time
import numpy as np
import onnxruntime as ort
sys.path.insert(0, {root!r})
from passes.verify import PLANNED
from passes.timing import interleaved_order, rounds_for
args = json.loads(sys.argv[1])
so = PLANNED.session_options()
so.intra_op_num_threads = args["threads"]
so.inter_op_num_threads = 1
sessions = [ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]) for m in args["models"]]
feeds = dict(np.load(args["feeds"]))
warm = []
for s in sessions:
    t0 = time.perf_counter()
    s.run(None, feeds)
    warm.append(time.perf_counter() - t0)
rounds = rounds_for(warm, args["min_rounds"], max(args["min_rounds"], args["max_rounds"]))
times = [[] for _ in sessions]
for i in interleaved_order(len(sessions), rounds):
    t0 = time.perf_counter()
    sessions[i].run(None, feeds)
    times[i].append(time.perf_counter() - t0)
print(json.dumps(times))
"""


def time_model_runs(models: Sequence[onnx.ModelProto | str | os.PathLike], feeds: Mapping[str, np.ndarray], *,
                    repeats: int = timing.MIN_ROUNDS, max_repeats: int = timing.MAX_ROUNDS, threads: int = 1,
                    timeout: float = 600.0) -> list[list[float]]:
    """Every timed run's seconds, per model, with the planned session options, in one fresh process.

    After one warm-up run each, the models' runs alternate in rounds (A B B A ...:
    ``timing.interleaved_order``), so a load change on the machine hits all of them alike; between
    ``repeats`` and ``max_repeats`` rounds, as many as ``timing.TIME_BUDGET_S`` holds at the
    warm-up runs' pace.
    """
    with tempfile.TemporaryDirectory(prefix="memplan-time-") as tmp:
        paths, feeds_path = _stage(tmp, models, feeds)
        runs = _run_child(_TIMING_CHILD, {"models": paths, "feeds": feeds_path, "threads": threads,
                                          "min_rounds": max(1, repeats), "max_rounds": max_repeats},
                          threads, timeout)
    return [[float(t) for t in ts] for ts in runs]


def time_models(models: Sequence[onnx.ModelProto | str | os.PathLike], feeds: Mapping[str, np.ndarray], *,
                repeats: int = 7, threads: int = 1, timeout: float = 600.0) -> list[float]:
    """Median step time of each model over ``repeats`` alternating rounds (``time_model_runs``)."""
    runs = time_model_runs(models, feeds, repeats=repeats, max_repeats=repeats, threads=threads, timeout=timeout)
    return [timing.spread(ts).median for ts in runs]


# ---- verify: planned model against its reference -------------------------------------------------
def held_base_bytes(path: str | os.PathLike, graph) -> int:
    """Bytes ORT holds for the run before it starts: the initializers of the file at ``path`` that
    its nodes read or that are graph outputs, and ``graph``'s inputs (the file as imported, dims
    bound). Not the imported graph's own base: import folds the file's constant subgraphs (a gradient's ConstantOfShape
    zeros, the ordering edges' Size(x) * 0) into initializers, which ORT computes during the run and
    the count sees there (the opt fixture's planned step: 26 KB counted twice, 1.006 of its budget)."""
    from passes.onnx_import import tensor_bytes, load_proto

    proto, _, _ = load_proto(path, weights=False)
    # and those that are graph outputs: ORT holds them to copy them out (planner/liveness.py)
    read = {x for node in proto.graph.node for x in node.input} | {o.name for o in proto.graph.output}
    held = sum(tensor_bytes(t) for t in proto.graph.initializer if t.name in read)
    return held + sum(graph.tensors[t].nbytes for t in graph.inputs)


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
    # planned model under ORT's default session options: what ORT holds over two runs (counted: the
    # arena's regions, that made with the session included, less the session's own bytes; else the
    # process's high-water mark) less the one-time kernel state a first run adds (measured with the
    # planned options), so memory the arena and the memory pattern keep from the first run counts
    # (None, with both figures, where ORT cannot run the planned model under its defaults:
    # ``default_options_error`` says why)
    planned_default_peak: int | None
    # the same options with the arena off: a warm run's tensor bytes (ORT's order, fusions, memory
    # reuse and pattern, but no arena chunks)
    planned_default_no_arena_peak: int | None
    predicted_planned_peak: int  # liveness model's dynamic peak of the planned model
    reference_seconds: float  # median step time, runs of both models alternated in one process
    planned_seconds: float
    predicted_time_overhead: float | None = None  # the plan's added time / compute time (device profile)
    predicted_device: str | None = None
    # Where the outputs were compared with a stand-in for the reference that computes as the planned
    # file does (verify_models' ``numerics``): what it is (None: the reference itself). And the
    # largest difference of the planned outputs from the reference's own, either way
    compared_with: str | None = None
    reference_max_abs_diff: float = 0.0
    method: str = RSS  # how every peak above was measured (ALLOCATOR only when all of them were counted)
    reference_rss_peak: int = 0  # the two runs' VmHWM figures, for comparison
    planned_rss_peak: int = 0
    # the prediction without kernel scratch ORT takes outside its allocator (HEAP_SCRATCH_OPS:
    # ScatterElements' index copy, Dropout's mask), which the counter does not see: what a counted
    # peak is compared with
    predicted_allocator_peak: int | None = None
    # every timed run's seconds (``reference_seconds`` and ``planned_seconds`` are their medians; empty
    # where the report was made from medians alone)
    reference_times: tuple[float, ...] = ()
    planned_times: tuple[float, ...] = ()
    # the highest 1-minute load average read around the timed runs, and the machine's CPUs (0: unread)
    load_average: float | None = None
    cpus: int = 0
    # ORT's error where it cannot run the planned model under its default session options
    default_options_error: str | None = None

    @property
    def times(self) -> timing.TimeComparison:
        """The two models' step times compared (from the medians where no runs were kept)."""
        return timing.compare_times(self.reference_times or (self.reference_seconds,),
                                    self.planned_times or (self.planned_seconds,))

    @property
    def machine_loaded(self) -> bool | None:
        """Other work used the CPUs while the runs were timed (None: the load was not read)."""
        return None if self.load_average is None else timing.machine_loaded(self.load_average, self.cpus)

    @property
    def compared_prediction(self) -> int:
        """The prediction the measured peak is held against."""
        if self.method == ALLOCATOR and self.predicted_allocator_peak is not None:
            return self.predicted_allocator_peak
        return self.predicted_planned_peak

    @property
    def outputs_equal(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def peak_resolved(self) -> bool:
        """The measured peaks are figures: counted by the allocator, or (RSS) the planned model's
        predicted dynamic peak is at least :data:`RSS_RESOLUTION_BYTES`, below which they are noise."""
        return self.method == ALLOCATOR or self.predicted_planned_peak >= RSS_RESOLUTION_BYTES

    def as_dict(self) -> dict:
        pred = max(1, self.compared_prediction)
        times = self.times
        return {
            "schema": "memplan.verify/1",
            "outputs_equal": self.outputs_equal,
            "tolerance": {"rtol": self.rtol, "atol": self.atol},
            "outputs": [o.__dict__ for o in self.outputs],
            "compared_with": self.compared_with or "the reference",
            "reference_max_abs_diff": self.reference_max_abs_diff,
            "base_bytes": self.base_bytes,
            "measured_by": self.method,
            "peak_resolved": self.peak_resolved,
            "reference": {"peak_bytes": self.base_bytes + self.reference_peak,
                          "dynamic_peak_bytes": self.reference_peak, "seconds": self.reference_seconds,
                          "rss_dynamic_peak_bytes": self.reference_rss_peak,
                          "seconds_spread": times.reference.as_dict()},
            "planned": {"peak_bytes": self.base_bytes + self.planned_peak, "dynamic_peak_bytes": self.planned_peak,
                        "predicted_dynamic_peak_bytes": self.predicted_planned_peak,
                        "predicted_allocator_peak_bytes": self.compared_prediction,
                        "measured_over_predicted": self.planned_peak / pred,
                        "seconds": self.planned_seconds, "rss_dynamic_peak_bytes": self.planned_rss_peak,
                        "seconds_spread": times.planned.as_dict()},
            "ort_default_options": {
                "dynamic_peak_bytes": self.planned_default_peak,
                "over_predicted": None if self.planned_default_peak is None else self.planned_default_peak / pred,
                "arena_off_dynamic_peak_bytes": self.planned_default_no_arena_peak,
                "arena_off_over_predicted": (None if self.planned_default_no_arena_peak is None
                                             else self.planned_default_no_arena_peak / pred),
                "error": self.default_options_error,
            },
            "time_overhead": self.planned_seconds / max(1e-12, self.reference_seconds) - 1.0,
            "predicted_time_overhead": self.predicted_time_overhead,
            "predicted_time_device": self.predicted_device,
            # how far apart the step times are: the overheads the interquartile ranges allow, and
            # whether they allow none (the two ranges overlap); null where no runs were kept
            "time_rounds": len(self.reference_times),
            "time_overhead_range": [times.overhead_low, times.overhead_high] if self.reference_times else None,
            "time_overhead_within_noise": times.within_noise if self.reference_times else None,
            "machine_load": {"load_average_1min": self.load_average, "cpus": self.cpus,
                             "loaded": self.machine_loaded},
        }


#: Elements compared at a time: the float64 temporaries of a 1 GiB gradient took 12 GiB at once.
COMPARE_CHUNK = 1 << 22


def compare_outputs(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], rtol: float, atol: float):
    checks = []
    for name in sorted(ref):
        a, b = np.asarray(ref[name]), np.asarray(got[name])
        if a.shape != b.shape:
            checks.append(OutputCheck(name, float("inf"), float("inf"), False))
            continue
        a, b = a.reshape(-1), b.reshape(-1)
        if not all(np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_ for x in (a, b)):
            # strings (object arrays from ORT) compare exactly; no float64 to widen them to
            checks.append(OutputCheck(name, 0.0, 0.0, True) if a.dtype == b.dtype and bool(np.all(a == b))
                          else OutputCheck(name, float("inf"), float("inf"), False))
            continue
        # integers (and bools) compare as they are: float64 holds int64 exactly only up to 2**53
        exact = all(x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer) for x in (a, b))
        max_abs = max_rel = 0.0
        ok = True
        for start in range(0, a.size, COMPARE_CHUNK):
            a64 = a[start:start + COMPARE_CHUNK].astype(np.float64)
            b64 = b[start:start + COMPARE_CHUNK].astype(np.float64)
            # NaN where the reference has NaN and infinities of its sign are equal outputs, not differences
            if exact:
                same = a[start:start + COMPARE_CHUNK] == b[start:start + COMPARE_CHUNK]
            else:
                same = (a64 == b64) | (np.isnan(a64) & np.isnan(b64))
            with np.errstate(invalid="ignore"):
                diff = np.where(same, 0.0, np.abs(a64 - b64))  # NaN where only one side is NaN
                if exact:  # integers that differ differ by 1 at least, whatever float64 rounds them to
                    diff = np.where(same, 0.0, np.maximum(diff, 1.0))
                scale = np.where(np.isfinite(a64), np.abs(a64), 0.0)
                # max() of an array holding NaN is NaN: a NaN on one side only shows as one
                max_abs = max(max_abs, float(diff.max()), key=_nan_first)
                max_rel = max(max_rel, float((diff / np.maximum(scale, 1e-30)).max()), key=_nan_first)
                ok = ok and bool(np.all(same | (diff <= atol + rtol * scale)))
        checks.append(OutputCheck(name, max_abs, max_rel, ok))
    return tuple(checks)


def _nan_first(x: float) -> float:
    return math.inf if math.isnan(x) else x


def verify_models(
    reference: onnx.ModelProto | str | os.PathLike,
    planned: onnx.ModelProto | str | os.PathLike,
    feeds: Mapping[str, np.ndarray],
    *,
    predicted_planned_peak: int,
    base_bytes: int,
    predicted_allocator_peak: int | None = None,
    rtol: float = 0.0,
    atol: float = 0.0,
    repeats: int = 7,
    predicted_time_overhead: float | None = None,
    predicted_device: str | None = None,
    numerics: tuple[str, onnx.ModelProto | str | os.PathLike] | None = None,
    seed: int = 0,
) -> VerifyReport:
    """Run both models (protos, or files the runs read as they are) on the same feeds; compare
    outputs; measure peaks and step times.

    ``numerics``: (what it is, a model) computing what ``reference`` computes with the kernels the
    planned file makes ORT use (a pinned file reads Conv weights through views); the outputs are
    compared with its outputs, and the largest difference from ``reference``'s is reported.
    ``seed``: ORT's random seed in every run, so that Dropout's masks (never recomputed) are the
    same in both models' runs. ``repeats``: the least timed rounds (``time_model_runs``); every run's
    time is kept, with the load average read around them."""
    (ref_in, ref_out), (got_in, got_out) = _signature(reference), _signature(planned)
    extra = [name for name in got_out if name not in ref_out]
    if extra:
        raise UsageError(f"the planned model has output {extra[0]!r} that the reference lacks; "
                         "was it made from this MODEL?")
    # every input and output of the reference, with its element type (a pinned file adds an unfed input)
    missing = [f"input {k}" for k, t in ref_in.items() if got_in.get(k) != t]
    missing += [f"output {k}" for k, t in ref_out.items() if got_out.get(k) != t]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise UsageError(f"the planned model does not have the reference's {shown}; was it made from this MODEL "
                         "(with the same --dim)?")
    reference, planned = (_seeded(m, seed) or m for m in (reference, planned))
    if numerics is not None:
        numerics = (numerics[0], _seeded(numerics[1], seed) or numerics[1])
    try:
        ref = measure_peak(reference, feeds, keep_outputs=True, repeats=1, seed=seed)
    except MissingKernelError:
        raise
    except PlannerError as err:
        # ORT's Python API takes and returns no bfloat16 array (numpy has no such type): it read the
        # feed as a string tensor ("Unexpected input data type. Actual: (tensor(string))")
        half = [f"{kind} {k!r}" for kind, sig in (("input", ref_in), ("output", ref_out))
                for k, t in sig.items() if t == onnx.TensorProto.BFLOAT16]
        if not half:
            raise
        raise PlannerError(f"the model's {half[0]} is bfloat16, which ONNX Runtime's Python API can neither feed "
                           f"nor return, so verify cannot run it here ({err})") from err
    got = measure_peak(planned, feeds, keep_outputs=True, repeats=1, seed=seed)
    default, no_arena, default_error = _default_options_runs(planned, feeds)
    runs = [m for m in (ref, got, default, no_arena) if m is not None]
    if len({m.method for m in runs}) > 1:  # the counter gave up on one: all as RSS
        ref, got, default, no_arena = (None if m is None else as_rss(m) for m in (ref, got, default, no_arena))
    first_run_state = max(0, got.cold_peak_bytes - got.peak_bytes)
    default_peak = None if default is None else default_options_peak(default, no_arena, first_run_state)
    load = os.getloadavg()[0]
    ref_times, got_times = time_model_runs([reference, planned], feeds, repeats=repeats)
    load = max(load, os.getloadavg()[0])
    ref_s, got_s = timing.spread(ref_times).median, timing.spread(got_times).median
    assert ref.outputs is not None and got.outputs is not None
    checks = compare_outputs({k: ref.outputs[k] for k in got.outputs}, got.outputs, rtol, atol)
    reference_diff = max((c.max_abs_diff for c in checks), default=0.0)
    compared_with = None
    if numerics is not None:
        compared_with, stand_in = numerics
        same = measure_peak(stand_in, feeds, keep_outputs=True, repeats=1, seed=seed).outputs  # as ref and got ran
        assert same is not None
        checks = compare_outputs({k: same[k] for k in got.outputs}, got.outputs, rtol, atol)
    return VerifyReport(checks, rtol, atol, base_bytes, ref.peak_bytes, got.peak_bytes,
                        default_peak, None if no_arena is None else no_arena.peak_bytes,
                        predicted_planned_peak, ref_s, got_s, predicted_time_overhead, predicted_device,
                        compared_with, reference_diff, got.method, ref.rss_peak_bytes, got.rss_peak_bytes,
                        predicted_allocator_peak, tuple(ref_times), tuple(got_times), load, os.cpu_count() or 1,
                        default_error)


def _default_options_runs(planned, feeds: Mapping[str, np.ndarray]
                          ) -> tuple[PeakMeasurement | None, PeakMeasurement | None, str | None]:
    """The planned model measured under ORT's default session options, with the arena and without;
    (None, None, ORT's error) where ORT cannot run it so. Its graph optimizations can break a model
    that runs with them off: ORT 1.31's PadFusion folds a constant Pad of 2 into a 2x2 pool's pads
    unchecked ("Pad should be smaller than kernel"), where verify failed as a whole though the
    planned options, which the file is verified under, run it."""
    try:
        return (measure_peak(planned, feeds, session=ORT_DEFAULT, repeats=1),
                measure_peak(planned, feeds, session=replace(ORT_DEFAULT, arena=False), repeats=1), None)
    except MissingKernelError:
        raise
    except PlannerError as err:
        return None, None, str(err)


def default_options_peak(default: PeakMeasurement, no_arena: PeakMeasurement, first_run_state: int) -> int:
    """What ORT holds for a run under its default session options (``default``), arena regions and
    the memory pattern's block included, less the one-time kernel state of a first run.

    Counted, ``default.cold_peak_bytes`` starts once the session is made, and where a kernel
    prepacks its weights then (ConvTranspose) ORT takes the CPU arena's first region (1 MiB) while
    making it: a model whose runs fit in that region read 0 B (zoo:cnn?batch=1). The region is counted back in, less what the session itself holds: the
    session's bytes with the same options but the arena off (``no_arena``: initializers, prepacked
    weights, each counted), which the arena session keeps in its direct blocks or in the region."""
    peak = default.cold_peak_bytes
    if default.method == ALLOCATOR and no_arena.method == ALLOCATOR:
        peak += default.session_bytes - no_arena.session_bytes
    return max(0, peak - first_run_state)


def _seeded(model: onnx.ModelProto | str | os.PathLike, seed: int) -> onnx.ModelProto | None:
    """``model`` with a ``seed`` attribute, from ``seed`` and its first output's name, on each random
    op that has none (a copy; None where there is none). Without one ORT draws from one generator
    in run order, so a planned file that runs two Dropouts the other way round (a memory-aware
    order may) drew each other's masks and read DIFFER; seeded per node, each draws its own."""
    import hashlib

    from passes.onnx_import import RANDOM_OPS, load_proto

    def unseeded(n: onnx.NodeProto) -> bool:
        return n.op_type in RANDOM_OPS and n.domain in ("", "ai.onnx") and bool(n.output) \
            and all(a.name != "seed" for a in n.attribute) and (n.op_type != "Dropout" or opset >= 12)

    looked = model if isinstance(model, onnx.ModelProto) else load_proto(model, weights=False)[0]
    # Dropout takes a seed from opset 12 on: a seed on an older one made ORT refuse the model
    # ("Unrecognized attribute: seed for operator Dropout"); ORT runs those as inference-mode Dropouts
    opset = next((o.version for o in looked.opset_import if o.domain in ("", "ai.onnx")), 1)
    if not any(unseeded(n) for n in looked.graph.node):
        return None
    proto = onnx.ModelProto()
    proto.CopyFrom(model if isinstance(model, onnx.ModelProto) else load_proto(model)[0])
    for n in proto.graph.node:
        if unseeded(n):
            # below 2**24: a float attribute holds it exactly; Dropout's seed is an int, the others' a float
            value = int(hashlib.sha256(f"{seed}/{n.output[0]}".encode()).hexdigest()[:6], 16)
            n.attribute.append(onnx.helper.make_attribute("seed", value if n.op_type == "Dropout" else float(value)))
    return proto


def _signature(model: onnx.ModelProto | str | os.PathLike) -> tuple[dict[str, int], dict[str, int]]:
    """Element type by name of ``model``'s inputs, and of its outputs."""
    if not isinstance(model, onnx.ModelProto):  # a file: its weights, inside or beside it, unread
        from passes.onnx_import import load_proto

        model = load_proto(str(model), weights="mapped")[0]

    def typed(values) -> dict[str, int]:
        return {v.name: v.type.tensor_type.elem_type for v in values}

    return typed(model.graph.input), typed(model.graph.output)


_ARENA_CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
sys.path.insert(0, {root!r})
from passes.verify import PLANNED
args = json.loads(sys.argv[1])
cfg = ort.OrtArenaCfg({{"max_mem": args["limit"], "arena_extend_strategy": args["strategy"]}})
info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
ort.create_and_register_allocator(info, cfg)
so = PLANNED.session_options()
so.enable_cpu_mem_arena = True
so.add_session_config_entry("session.use_env_allocators", "1")
so.intra_op_num_threads = 1
try:
    sess = ort.InferenceSession(args["model"], so, providers=["CPUExecutionProvider"])
    sess.run(None, dict(np.load(args["feeds"])))
    print(json.dumps({{"ok": True, "error": ""}}))
except Exception as err:  # the arena's out-of-memory surfaces as a RuntimeException
    print(json.dumps({{"ok": False, "error": str(err).splitlines()[0]}}))
"""


def runs_under_arena(model: onnx.ModelProto | str | os.PathLike, feeds: Mapping[str, np.ndarray], limit: int,
                     strategy: int, timeout: float = 600.0) -> tuple[bool, str]:
    """Does ``model`` run once, with the planned session options, on the CPU provider with its arena
    capped at ``limit`` bytes (``max_mem``; ``strategy``: 0 kNextPowerOfTwo, 1 kSameAsRequested)?
    (ran, ORT's error line). The CPU arena is the BFCArena the CUDA provider puts under
    ``gpu_mem_limit``: this is the CPU check of ``memplan plan --ort-arena`` (planner/arena.py).
    A fresh process with glibc's own malloc settings, which decide where the arena's regions lie."""
    with tempfile.TemporaryDirectory(prefix="memplan-arena-") as tmp:
        (path,), feeds_path = _stage(tmp, [model], feeds)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        args = {"model": path, "feeds": feeds_path, "limit": int(limit), "strategy": int(strategy)}
        got = _child(_ARENA_CHILD, args, env, timeout, "running")
    return bool(got["ok"]), got["error"]


def cpu_float32_fallback_ops(graph) -> int:
    """How many nodes of ``graph`` (a planner Graph) ORT's CPU provider runs in float32 instead of
    float16/bfloat16: its InsertCastTransformer (applied whatever the optimization level) puts Casts
    around the half-precision nodes it has no CPU kernel for, then drops the Cast pairs that meet, the
    model's own AMP Casts included, so whole Cast islands run in float32 (each such node's output is
    renamed to the float32 tensor it now writes). Their tensors are float32 copies the plan never saw:
    a run's measured peak is not the plan's (a float16 MLP's planned step measured 2.4x its
    prediction, and verify said OVER budget). Counting the Casts added missed the AMP models, where
    ORT removes more of the model's Casts than it adds. 0 for a model without such
    tensors or where ORT cannot load it (the runs report that). The model is loaded without its
    weights (large initializers become inputs), so this writes and reads a few KiB."""
    if not any(t.dtype in HALF_DTYPES for t in graph.tensors):
        return 0
    import onnxruntime as ort

    from passes.onnx_export import export_model

    proto = export_model(graph, weights=False)
    g = proto.graph
    kept = []
    for init in g.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:  # bytes left out: fed as an input instead
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            kept.append(init)
    del g.initializer[:]
    g.initializer.extend(kept)
    outputs = {n.name: list(n.output) for n in g.node if n.op_type != "Cast" and n.name}
    with tempfile.TemporaryDirectory(prefix="memplan-fallback-") as tmp:
        so = PLANNED.session_options()
        so.optimized_model_filepath = str(Path(tmp) / "as_run.onnx")
        try:
            ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
            after = onnx.load(so.optimized_model_filepath, load_external_data=False)
        except Exception:  # noqa: BLE001 - ORT refuses the model: the measured runs say why
            return 0
    # at the planned (disabled) optimization level nodes keep their names; one ORT rewired writes a new tensor
    return sum(1 for n in after.graph.node if n.name in outputs and list(n.output) != outputs[n.name])
