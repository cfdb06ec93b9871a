"""Test helper: one small ONNX model per gradient rule, checked against float64 finite differences.

A case is ONNX nodes plus float parameters (initializers, so they are trainable), integer or float
constants and inputs. The harness weights every listed output with a fixed random tensor ``R_*``
(frozen) and sums, so the output gradient is random rather than all ones; it then builds the
training graph, runs it in ORT and compares each parameter's gradient with central differences
of the forward in float64 (ORT where it has float64 kernels, else onnx's reference evaluator, with
the training graph then run in float32; for float32-only ops everything in float32).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from passes import gradcheck
from passes.autodiff import TrainOptions, build_training_graph
from passes.onnx_export import export_model
from passes.onnx_import import import_model

def node(op: str, inputs: Sequence[str], outputs: Sequence[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), **attrs)


def _cast(values: Mapping[str, np.ndarray], dtype) -> dict[str, np.ndarray]:
    """float64 values to ``dtype``; other dtypes (float32 Resize scales, ints, bools) unchanged."""
    return {k: (np.asarray(v).astype(dtype) if np.asarray(v).dtype == np.float64 else np.asarray(v))
            for k, v in values.items()}


def build_model(nodes, params, consts, inputs, outputs, dtype, opset) -> onnx.ModelProto:
    """The case as a model whose only output is the weighted-sum loss."""
    params, consts, inputs = _cast(params, dtype), _cast(consts, dtype), _cast(inputs, dtype)
    inits = [numpy_helper.from_array(v, k) for k, v in {**params, **consts}.items()]
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
           for k, v in inputs.items()]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outputs]
    probe = helper.make_model(helper.make_graph(nodes, "case", ins, outs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    probe.ir_version = 8
    inferred = shape_inference.infer_shapes(probe, strict_mode=True)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    rng = np.random.default_rng(1234)
    loss_nodes, terms = [], []
    for k, o in enumerate(outputs):
        r = rng.standard_normal(shapes[o]).astype(dtype)
        inits.append(numpy_helper.from_array(r, f"R_{k}"))
        loss_nodes += [node("Mul", [o, f"R_{k}"], [f"weighted_{k}"]),
                       node("ReduceSum", [f"weighted_{k}"], [f"term_{k}"], keepdims=0)]
        terms.append(f"term_{k}")
    loss_nodes.append(node("Sum", terms, ["loss"]))
    graph = helper.make_graph(list(nodes) + loss_nodes, "case", ins,
                              [helper.make_tensor_value_info("loss", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                             [])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def check_gradients(
    nodes, params: Mapping[str, np.ndarray], *, outputs: Sequence[str] = ("y",), consts=None, inputs=None,
    opset: int = 17, tol64: float = 1e-5, tol32: float = 2e-3, eps: float = 1e-6, freeze: Sequence[str] = (),
    float64: bool = True,
) -> float:
    """Assert the rule's gradients match finite differences; returns the worst relative error.

    ``float64=False`` is for ops ONNX defines for float32 only (Celu): the whole check, finite
    differences included, runs in float32 through ORT, so give it a wide ``eps``."""
    consts, inputs = dict(consts or {}), dict(inputs or {})
    options = TrainOptions(freeze=("R_*", *freeze))
    fwd64 = import_model(build_model(nodes, params, consts, inputs, outputs, np.float64, opset)) if float64 else None
    f64 = float64 and gradcheck.has_float64_kernels(fwd64)
    dtype = np.float64 if f64 else np.float32
    fwd = fwd64 if f64 else import_model(build_model(nodes, params, consts, inputs, outputs, np.float32, opset))
    step = build_training_graph(fwd, options)
    assert sorted(step.params) == sorted(params), f"trainable set {step.params} != {sorted(params)}"
    model = export_model(step.graph)
    onnx.checker.check_model(model, full_check=True)
    # a constant the backward made and no node reads: counted in the base, dropped by ORT (with a warning)
    read = {t for n in step.graph.nodes for t in n.inputs}
    unread = [t.name for t in step.graph.initializers() if t.name.startswith("memplan__const") and t.id not in read]
    assert not unread, f"constants of the backward that no node reads: {unread}"
    feeds = _cast(inputs, dtype)
    loss, got = gradcheck.run_training_step(step, feeds)
    fd_model, fd_dtype = (fwd64, np.float64) if float64 else (fwd, np.float32)
    evaluate = gradcheck.loss_evaluator(fd_model, "loss", list(params), use_reference=float64 and not f64)
    want = gradcheck.finite_differences(evaluate, _cast(inputs, fd_dtype), _cast(params, fd_dtype), eps=eps)
    report = gradcheck.compare(got, want, loss)
    name, worst = report.worst
    tol = tol64 if f64 else tol32
    assert worst < tol, f"gradient of {name} off by {worst:.3g} (relative, {np.dtype(dtype).name}): " \
                        f"got {np.asarray(got[name]).ravel()[:6]}, want {want[name].ravel()[:6]}"
    return worst
