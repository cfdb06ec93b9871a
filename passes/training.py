"""A real training loop over an emitted training step, in stock onnxruntime (the ``memplan train`` demo).

Each step feeds the current weights and optimizer state, runs forward + backward + update in one
ORT call, and feeds ``<param>_new`` and the state outputs into the next. The data is synthetic but
learnable: for a classifier (SoftmaxCrossEntropyLoss over [N, C] scores with float inputs) each
class has a fixed random prototype (a pattern plus, for images, a per-channel offset) and a sample
is its class prototype plus unit noise, fresh every step; for other models (token inputs, per-pixel labels) one fixed seeded batch is memorized.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from passes.autodiff import TrainingStep
from passes.gradcheck import params_as_inputs
from passes.onnx_export import export_model, fill_weights, initializer_values
from passes.ort_errors import missing_kernel
from planner.errors import ModelImportError, PlannerError, UsageError, first_line
from planner.graph import Graph

log = logging.getLogger(__name__)


class TrainingDivergedError(PlannerError):
    """The loss of a ``memplan train`` step was not finite."""


@dataclass(frozen=True)
class TrainResult:
    losses: tuple[float, ...]  # loss of each step, before its update
    task: str  # "prototypes" or "fixed batch"
    seconds: float  # wall time of the loop (session creation excluded)
    provider: str  # ORT execution provider that ran the steps


def _classifier(forward: Graph) -> tuple[str, int] | None:
    """(labels input, number of classes) when the loss is a classification over [N, C] scores."""
    inputs = {forward.tensors[t].name for t in forward.inputs}
    for node in forward.nodes:
        if node.op_type != "SoftmaxCrossEntropyLoss":
            continue
        scores, labels = forward.tensors[node.inputs[0]], forward.tensors[node.inputs[1]]
        if len(scores.shape) == 2 and labels.name in inputs:
            return labels.name, scores.shape[1]
    return None


class SyntheticTask:
    """Batches for the demo (see module docstring); deterministic for a seed."""

    def __init__(self, forward: Graph, seed: int):
        self.rng = np.random.default_rng(seed)
        self.inputs = [forward.tensors[t] for t in forward.inputs]
        cls = _classifier(forward)
        batch = next((t.shape[:1] for t in self.inputs if cls is not None and t.name == cls[0]), ())
        # a float input with the labels' batch as its first dim is a sample; any other (a scale, a
        # mask of another shape) is drawn at random each step (its prototypes broke, fuzzed stop 50)
        floats = [t for t in self.inputs if t.dtype.startswith("float") and batch and t.shape[:1] == batch]
        self.task = "prototypes" if cls is not None and floats else "fixed batch"
        if self.task == "prototypes":
            self.labels, classes = cls
            self.prototypes = {t.name: self._prototypes(classes, t.shape).astype(t.dtype) for t in floats}
            self.classes = classes
        else:
            self.fixed = {t.name: self._random(t) for t in self.inputs}

    def _prototypes(self, classes: int, shape: tuple[int, ...]) -> np.ndarray:
        """A random pattern per class, plus a per-channel offset for images so that models that
        average over space (global pooling) can tell classes apart too."""
        protos = self.rng.standard_normal((classes, *shape[1:]))
        if len(shape) >= 3:
            protos += self.rng.standard_normal((classes, shape[1]) + (1,) * (len(shape) - 2))
        return protos

    def _random(self, t) -> np.ndarray:
        if t.dtype.startswith("float"):
            return self.rng.standard_normal(t.shape).astype(t.dtype)
        if t.dtype == "bool":
            return self.rng.random(t.shape) < 0.5
        return self.rng.integers(0, 2, size=t.shape).astype(t.dtype)

    def batch(self) -> dict[str, np.ndarray]:
        if self.task == "fixed batch":
            return self.fixed
        feeds = {}
        labels_t = next(t for t in self.inputs if t.name == self.labels)
        labels = self.rng.integers(0, self.classes, size=labels_t.shape).astype(labels_t.dtype)
        for t in self.inputs:
            if t.name == self.labels:
                feeds[t.name] = labels
            elif t.name in self.prototypes:
                noise = self.rng.standard_normal(t.shape).astype(t.dtype)
                feeds[t.name] = self.prototypes[t.name][labels] + noise
            else:
                feeds[t.name] = self._random(t)
        return feeds


def train(step: TrainingStep, forward: Graph, steps: int, seed: int = 0, provider: str = "cpu",
          planned: bool = False) -> TrainResult:
    """Run ``steps`` optimizer steps of ``step`` (built with an optimizer) in ORT. ``planned``: the
    step's graph is a planned one (passes/rewrite.py), run with the session options a planned model
    needs (passes.verify.planned_session_options: no optimizer merging its recompute copies back,
    file order, no memory reuse, arena or memory pattern)."""
    import onnxruntime as ort

    if not step.updates:
        raise UsageError("training needs an optimizer step: build the graph with --optimizer sgd or adam")
    if steps < 1:
        raise UsageError(f"--steps must be at least 1, got {steps}")
    providers = _providers(provider)
    # the weights are fed: the session's model holds only the frozen ones (no proto of them all)
    model = fill_weights(params_as_inputs(export_model(step.graph, weights=False), step.params),
                         initializer_values(step.graph))
    severity = _ort_log_severity()
    ort.set_seed(seed)  # Dropout's masks: the same seed, the same losses
    if planned:
        from passes.verify import planned_session_options

        options = planned_session_options()
    else:
        options = ort.SessionOptions()
    options.log_severity_level = severity
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    except Exception as err:  # ORT's own exception types (Fail, InvalidGraph, ...)
        raise _ort_refused(err, "load", provider) from None
    if provider == "cuda" and session.get_providers()[0] != "CUDAExecutionProvider":
        raise _no_cuda()
    weights: dict[str, np.ndarray] = {p: np.asarray(step.graph.values[step.graph.by_name[p]]) for p in step.params}
    state: dict[str, np.ndarray] = {s.input: s.initial for s in step.state}
    outputs = [step.loss] + [step.updates[p] for p in step.params] + [s.output for s in step.state]
    task = SyntheticTask(forward, seed)
    losses = []
    start = time.perf_counter()
    for k in range(steps):
        try:
            values = session.run(outputs, {**task.batch(), **weights, **state})
        except Exception as err:
            raise _ort_refused(err, "run", provider) from None
        losses.append(float(np.asarray(values[0]).reshape(())))
        if not math.isfinite(losses[-1]):
            raise TrainingDivergedError(
                f"the loss became {losses[-1]} at step {k} (step 0: {losses[0]:.6g}); training diverged: lower "
                "--lr, or check the model's ops on the synthetic data (Log, Sqrt, Pow of unit-normal inputs)")
        weights = dict(zip(step.params, values[1:1 + len(step.params)]))
        state = {s.input: v for s, v in zip(step.state, values[1 + len(step.params):])}
        log.info("step %d loss %.5f", k, losses[-1])
    return TrainResult(tuple(losses), task.task, time.perf_counter() - start, session.get_providers()[0])


def _ort_log_severity() -> int:
    """Set ORT's default log severity for memplan's sessions and return it for their options: ORT's own
    lines only with -v (warnings); otherwise none, its errors reach the user as memplan's one line."""
    import onnxruntime as ort

    severity = 2 if log.isEnabledFor(logging.INFO) else 4
    ort.set_default_logger_severity(severity)
    return severity


def _no_cuda() -> UsageError:
    return UsageError("--provider cuda: ONNX Runtime could not start its CUDA provider here (no GPU, or the CUDA and "
                      "cuDNN libraries it needs are missing; -v shows ORT's warning); use --provider cpu")


def _providers(provider: str) -> list[str]:
    """ORT's provider list for ``--provider``; one without a CUDA provider in this onnxruntime is refused."""
    import onnxruntime as ort

    providers = {"cpu": ["CPUExecutionProvider"], "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"]}
    if provider not in providers:
        raise UsageError(f"--provider must be cpu or cuda, got {provider!r}")
    if provider == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise UsageError("--provider cuda: this onnxruntime has no CUDA provider; install onnxruntime-gpu")
    return providers[provider]


def check_provider(provider: str) -> None:
    """Refuse ``--provider`` in one line where ORT cannot run it here, by starting a session of a one-node
    model: ``memplan train --budget B --provider cuda`` planned the step first (12 s for zoo:gpt?batch=8
    at --time-limit 10) and only then said that CUDA does not start on this machine."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    providers = _providers(provider)
    if provider == "cpu":
        return
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    probe = helper.make_model(helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    severity = _ort_log_severity()
    options = ort.SessionOptions()
    options.log_severity_level = severity
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=providers)
    if session.get_providers()[0] != "CUDAExecutionProvider":
        raise _no_cuda()


def _ort_refused(err: Exception, what: str, provider: str = "cpu") -> Exception:
    """ORT's error as memplan's one line; anything else stays what it is (a bug to see)."""
    if not type(err).__module__.startswith("onnxruntime"):
        return err
    first = first_line(err)
    missing = missing_kernel(first, "CUDA provider" if provider == "cuda" else "CPU provider",
                             "train in float32" if provider == "cuda" else
                             "train on a provider that has it (--provider cuda) or in float32")
    if missing is not None:
        return missing
    return ModelImportError(f"ONNX Runtime could not {what} the training step: {first[:300]}")


def summary(result: TrainResult) -> Mapping[str, float]:
    n = len(result.losses)
    window = max(1, n // 10)
    return {"first_loss": result.losses[0], "last_loss": result.losses[-1],
            "first_mean": float(np.mean(result.losses[:window])), "last_mean": float(np.mean(result.losses[-window:]))}
