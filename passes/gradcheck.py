"""Check a training graph's gradients: run it in ONNX Runtime and compare with central finite
differences of the forward model (float64 where ORT has float64 kernels, else onnx's reference
evaluator in float64), or with stored reference gradients (PyTorch autograd).

Used by the tests and by ``bench/gradcheck_models.py``; nothing here is on the planning path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from passes.autodiff import TrainingStep
from passes.onnx_export import export_model
from passes.onnx_import import DTYPE_TO_ONNX
from planner.graph import Graph


def ort_session(model: onnx.ModelProto, quiet: bool = False):
    """A CPU session with default options (what a user gets); ``quiet`` only silences ORT's warnings."""
    import onnxruntime as ort

    options = None
    if quiet:
        options = ort.SessionOptions()
        options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def params_as_inputs(model: onnx.ModelProto, names: Sequence[str], keep_defaults: bool = False) -> onnx.ModelProto:
    """Turn initializers ``names`` into graph inputs (kept as defaults when ``keep_defaults``), so a
    run can feed them: finite differences perturb them, a training loop feeds updated weights."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    wanted = set(names)
    inits = {i.name: i for i in out.graph.initializer}
    existing = {i.name for i in out.graph.input}
    for name in names:
        if name not in existing:
            init = inits[name]
            out.graph.input.append(helper.make_tensor_value_info(name, init.data_type, list(init.dims)))
    if not keep_defaults:
        kept = [i for i in out.graph.initializer if i.name not in wanted]
        del out.graph.initializer[:]
        out.graph.initializer.extend(kept)
    return out


def run_training_step(step: TrainingStep, feeds: Mapping[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
    """Run the emitted step once in ORT: (loss, {param: gradient})."""
    model = export_model(step.graph)
    sess = ort_session(model)
    wanted = [step.loss] + [step.grads[p] for p in step.params]
    values = sess.run(wanted, {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}})
    return float(np.asarray(values[0]).reshape(())), dict(zip(step.params, values[1:]))


Evaluator = Callable[[Mapping[str, np.ndarray]], float]


def loss_evaluator(forward: Graph, loss: str, params: Sequence[str], use_reference: bool = False) -> Evaluator:
    """feeds (inputs + params) -> loss, by ORT or by onnx's reference evaluator."""
    model = params_as_inputs(export_model(forward), params)
    t = forward.tensor(loss)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info(loss, DTYPE_TO_ONNX[t.dtype], list(t.shape)))
    if use_reference:
        from onnx.reference import ReferenceEvaluator

        ref = ReferenceEvaluator(model, new_ops=[_grouped_conv_transpose()])
        return lambda feeds: float(np.asarray(ref.run([loss], dict(feeds))[0]).reshape(()))
    sess = ort_session(model)
    names = {i.name for i in sess.get_inputs()}
    return lambda feeds: float(np.asarray(sess.run([loss], {k: v for k, v in feeds.items() if k in names})[0])
                               .reshape(()))


def _grouped_conv_transpose():
    """onnx's reference ConvTranspose ignores ``group``; run it once per group instead."""
    from onnx.reference.ops.op_conv_transpose import ConvTranspose as Base

    class ConvTranspose(Base):
        def _run(self, X, W, B=None, group=None, **attrs):  # noqa: N803 - ONNX input names
            group = int(group or 1)
            if group == 1:
                return super()._run(X, W, B, group=1, **attrs)
            xs, ws = np.split(X, group, axis=1), np.split(W, group, axis=0)
            bs = np.split(B, group) if B is not None else [None] * group
            parts = [super(ConvTranspose, self)._run(x, w, b, group=1, **attrs)[0] for x, w, b in zip(xs, ws, bs)]
            return (np.concatenate(parts, axis=1),)

    return ConvTranspose


def finite_differences(
    evaluate: Evaluator, feeds: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray], eps: float = 1e-6,
) -> dict[str, np.ndarray]:
    """Central differences d loss / d param, one element at a time, in the params' precision."""
    current = {**feeds, **{k: np.array(v, copy=True) for k, v in params.items()}}
    grads = {}
    for name, value in params.items():
        g = np.zeros(value.shape, dtype=np.float64)
        arr = current[name]
        for idx in np.ndindex(value.shape):
            keep = arr[idx]
            arr[idx] = keep + eps
            up = evaluate(current)
            arr[idx] = keep - eps
            down = evaluate(current)
            arr[idx] = keep
            g[idx] = (up - down) / (2 * eps)
        grads[name] = g
    return grads


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (absolute when want is all zero)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    diff = float(np.max(np.abs(got - want))) if want.size else 0.0
    return diff / scale if scale > 0 else diff


@dataclass(frozen=True)
class GradReport:
    loss: float
    errors: Mapping[str, float]  # param -> relative error

    @property
    def worst(self) -> tuple[str, float]:
        name = max(self.errors, key=lambda k: self.errors[k])
        return name, self.errors[name]


def compare(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], loss: float,
            floor: float = 0.0) -> GradReport:
    """Relative error per parameter. ``floor`` (a fraction of the largest reference gradient of
    the model) keeps gradients that are zero in theory, float noise in practice (a conv bias before
    a training-mode BatchNorm), from dividing by noise."""
    top = max((float(np.max(np.abs(w))) for w in want.values() if np.size(w)), default=0.0)
    errors = {}
    for k in sorted(want):
        w = np.asarray(want[k], np.float64)
        scale = max(float(np.max(np.abs(w))) if w.size else 0.0, floor * top)
        diff = float(np.max(np.abs(np.asarray(got[k], np.float64) - w))) if w.size else 0.0
        errors[k] = diff / scale if scale > 0 else diff
    return GradReport(loss, errors)


def has_float64_kernels(graph: Graph) -> bool:
    """True when ORT's CPU provider loads this graph (in its own dtypes)."""
    try:
        ort_session(export_model(graph), quiet=True)
    except Exception as err:  # noqa: BLE001 - ORT raises its own exception types
        if "NOT_IMPLEMENTED" in str(err) or "Could not find an implementation" in str(err):
            return False
        raise
    return True


def initializer_values(graph: Graph, names: Sequence[str]) -> dict[str, np.ndarray]:
    return {n: np.asarray(graph.values[graph.by_name[n]]) for n in names}


def to_numpy(tensor: onnx.TensorProto) -> np.ndarray:
    return numpy_helper.to_array(tensor)


def graph_as_float64(graph: Graph) -> Graph:
    """The same graph computing in float64 (float32 tensors, values and Cast targets widened), for
    finite differences that float32 rounding would drown. Resize's roi/scales stay float32."""
    import dataclasses

    keep32 = {n.inputs[i] for n in graph.nodes if n.op_type == "Resize" for i in (1, 2) if i < len(n.inputs)}
    wide = lambda t: t.dtype == "float32" and t.id not in keep32  # noqa: E731
    tensors = tuple(dataclasses.replace(t, dtype="float64") if wide(t) else t for t in graph.tensors)
    values = {k: (np.asarray(v, np.float64) if wide(graph.tensors[k]) else v) for k, v in graph.values.items()}
    nodes = []
    for n in graph.nodes:
        attrs = dict(n.attrs)
        if n.op_type == "Cast" and attrs.get("to") == onnx.TensorProto.FLOAT:
            attrs["to"] = onnx.TensorProto.DOUBLE
        for k, v in attrs.items():
            if isinstance(v, np.ndarray) and v.dtype == np.float32:
                attrs[k] = v.astype(np.float64)
        nodes.append(dataclasses.replace(n, attrs=attrs))
    return dataclasses.replace(graph, tensors=tensors, nodes=tuple(nodes), values=values).validate()


def directional_errors(
    forward: Graph, step: TrainingStep, feeds: Mapping[str, np.ndarray],
    steps: Sequence[float] = (1e-6, 1e-4, 1e-3), good_enough: float = 1e-4,
) -> dict[str, float]:
    """Per parameter p: |FD of the loss along d - <grad_p, d>| / |grad_p|, d = grad_p / |grad_p|,
    with the forward in float64 through onnx's reference evaluator. Wrong rules give O(1).

    Several FD steps are tried and the best kept: a small step can straddle a ReLU/MaxPool kink
    less often, a large one beats rounding in the reference's float32-only kernels (Erf)."""
    _, grads = run_training_step(step, feeds)
    fwd64 = graph_as_float64(forward)
    evaluate = loss_evaluator(fwd64, step.loss, list(step.params), use_reference=True)
    base = {k: np.asarray(v, np.float64) if np.asarray(v).dtype == np.float32 else v for k, v in feeds.items()}
    base.update({p: np.asarray(fwd64.values[fwd64.by_name[p]], np.float64) for p in step.params})
    errors = {}
    for p in step.params:
        g = np.asarray(grads[p], np.float64)
        norm = float(np.linalg.norm(g))
        if norm == 0.0:
            errors[p] = 0.0
            continue
        d = g / norm
        best = float("inf")
        for eps in steps:
            up = evaluate({**base, p: base[p] + eps * d})
            down = evaluate({**base, p: base[p] - eps * d})
            best = min(best, abs((up - down) / (2 * eps) - norm) / norm)
            if best < good_enough:
                break
        errors[p] = best
    return errors


# ---- whole models -----------------------------------------------------------------------------
def fixture_step(onnx_path, options=None):
    """A torch-exported fixture (``<name>.onnx`` + ``<name>.npz`` with torch's loss and gradients)
    run as memplan's training step in ORT: (step, loss, {param: gradient}, torch's {param: gradient})."""
    from pathlib import Path

    from passes.autodiff import build_training_graph
    from passes.onnx_import import import_model

    ref = np.load(Path(onnx_path).with_suffix(".npz"))
    dims = {k[4:]: int(ref[k]) for k in ref.files if k.startswith("dim:")}
    step = build_training_graph(import_model(onnx_path, dims), options)
    feeds = {k[6:]: ref[k] for k in ref.files if k.startswith("input:")}
    loss, got = run_training_step(step, feeds)
    return step, loss, got, {k[5:]: ref[k] for k in ref.files if k.startswith("grad:")}


def fixture_report(onnx_path, options=None) -> GradReport:
    """A torch-exported fixture: ORT run of memplan's training graph vs torch autograd, per initializer."""
    _, loss, got, want = fixture_step(onnx_path, options)
    missing = sorted(set(want) ^ set(got))
    if missing:
        raise AssertionError(f"{onnx_path}: trainable set differs from torch's parameters: {missing[:5]}")
    return compare(got, want, loss, floor=1e-3)


def zoo_report(name: str, seed: int = 0, **zoo_options) -> GradReport:
    """A zoo model: ORT (float32) training-graph gradients vs float64 directional differences."""
    import models
    from passes.autodiff import build_training_graph
    from passes.onnx_import import import_model

    model = models.build(name, **zoo_options)
    forward = import_model(model)
    step = build_training_graph(forward)
    feeds = models.example_feeds(model, seed=seed)
    loss, _ = run_training_step(step, feeds)
    return GradReport(loss, directional_errors(forward, step, feeds))
