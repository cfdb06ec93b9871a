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


def compare(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], loss: float) -> GradReport:
    return GradReport(loss, {k: relative_error(got[k], want[k]) for k in sorted(want)})


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
