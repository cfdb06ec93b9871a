"""ORT runs an exported model in file order: function ops ORT would inline are written as their bodies.

ORT's CPU EP has no kernel for SoftmaxCrossEntropyLoss & co.; it inlines their ONNX function body and
numbers the body's nodes after all others, so PRIORITY_BASED ran the loss body last (planner/liveness.py).
"""
import heapq

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models
from passes import onnx_export
from passes.autodiff import training_graph
from passes.onnx_export import ORT_INLINED_OPS, export_model
from passes.onnx_import import import_model
from planner.graph import GraphBuilder
from tests.helpers import run_order

F = "float32"


def _priority_order(model: onnx.ModelProto) -> list[str]:
    """ORT's PRIORITY_BASED rule on the file: of the ready nodes, Shape/Size first, then the lowest index.
    Constant nodes are not run (ORT makes them initializers)."""
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    producer = {t: i for i, n in enumerate(nodes) for t in n.output}
    waiting = [len({producer[t] for t in n.input if t in producer}) for n in nodes]
    users: dict[int, set[int]] = {}
    for i, n in enumerate(nodes):
        for t in n.input:
            if t in producer:
                users.setdefault(producer[t], set()).add(i)
    key = lambda i: (nodes[i].op_type not in ("Shape", "Size"), i)  # noqa: E731
    ready = [key(i) for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(nodes[i].name)
        for j in sorted(users.get(i, ())):
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, key(j))
    return order


def _hard_swish_classifier():
    """Gemm -> HardSwish (a function op in the middle of the graph) -> Gemm -> SoftmaxCrossEntropyLoss."""
    rng = np.random.default_rng(0)
    b = GraphBuilder(opsets={"": 17})
    x = b.input("x", F, (8, 6))
    labels = b.input("labels", "int64", (8,))
    (h,) = b.node("Gemm", [x, b.initializer("w0", rng.standard_normal((6, 5)).astype(np.float32))], [("h", F, (8, 5))])
    (a,) = b.node("HardSwish", [h], [("a", F, (8, 5))])
    (z,) = b.node("Gemm", [a, b.initializer("w1", rng.standard_normal((5, 3)).astype(np.float32))], [("z", F, (8, 3))])
    (loss,) = b.node("SoftmaxCrossEntropyLoss", [z, labels], [("loss", F, ())], name="loss")
    b.output(loss)
    return b.build()


@pytest.mark.parametrize("make", [lambda: import_model("zoo:gpt?size=small"), lambda: import_model("zoo:cnn?size=small"),
                                  _hard_swish_classifier], ids=["gpt", "cnn", "hardswish"])
def test_ort_runs_the_exported_training_step_in_file_order(make, tmp_path):
    model = export_model(training_graph(make()))
    assert not any(n.op_type in ORT_INLINED_OPS for n in model.graph.node)
    ran = run_order(model, models.example_feeds(model, seed=0), tmp_path)
    assert ran == _priority_order(model)
    # which is file order, but for Shape/Size (tiny outputs) running as soon as their input exists
    later = [n.name for n in model.graph.node if n.op_type not in ("Constant", "Shape", "Size")]
    assert [name for name in ran if name in set(later)] == later


def _case(op, inputs, outputs, opset=17, **attrs):
    """One-node graph: ``inputs``/``outputs`` are (name, dtype, shape)."""
    b = GraphBuilder(opsets={"": opset})
    ins = [b.input(*spec) for spec in inputs]
    outs = b.node(op, ins, outputs, name="the_node", attrs=attrs)
    for t in outs:
        b.output(t)
    return b.build()


CASES = {
    "sce_mean_log_prob": lambda: _case("SoftmaxCrossEntropyLoss", [("s", F, (6, 5)), ("t", "int64", (6,))],
                                       [("loss", F, ()), ("log_prob", F, (6, 5))]),
    "sce_sum_weights_ignore": lambda: _case("SoftmaxCrossEntropyLoss",
                                            [("s", F, (6, 5)), ("t", "int64", (6,)), ("w", F, (5,))],
                                            [("loss", F, ())], reduction="sum", ignore_index=2),
    "sce_none_spatial": lambda: _case("SoftmaxCrossEntropyLoss", [("s", F, (2, 5, 4)), ("t", "int64", (2, 4))],
                                      [("loss", F, (2, 4))], reduction="none"),
    "nll_mean": lambda: _case("NegativeLogLikelihoodLoss", [("s", F, (6, 5)), ("t", "int64", (6,))],
                              [("loss", F, ())]),
    "hard_swish": lambda: _case("HardSwish", [("s", F, (3, 7))], [("y", F, (3, 7))]),
    "mish": lambda: _case("Mish", [("s", F, (3, 7))], [("y", F, (3, 7))], opset=18),
    "cast_like": lambda: _case("CastLike", [("s", F, (3, 7)), ("d", "float64", (1,))], [("y", "float64", (3, 7))]),
    "group_norm": lambda: _case("GroupNormalization", [("s", F, (2, 4, 3, 3)), ("g", F, (4,)), ("b", F, (4,))],
                                [("y", F, (2, 4, 3, 3))], opset=21, num_groups=2),
}


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[vi.name] = rng.integers(0, 4, shape).astype(np.int64)  # includes ignore_index 2
        else:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("name", sorted(CASES))
def test_function_bodies_compute_what_ort_inlines(name, monkeypatch):
    graph = CASES[name]()
    written = export_model(graph)
    assert not any(n.op_type in ORT_INLINED_OPS for n in written.graph.node)
    onnx.checker.check_model(written, full_check=True)
    names = [n.name for n in written.graph.node]
    assert len(set(names)) == len(names) and all(n.startswith("the_node/") for n in names)
    io = {vi.name for vi in [*written.graph.input, *written.graph.output]}
    produced = {t for n in written.graph.node for t in n.output if t}
    assert produced - io <= {vi.name for vi in written.graph.value_info}
    monkeypatch.setattr(onnx_export, "ORT_INLINED_OPS", frozenset())
    as_node = export_model(graph)  # the op itself: ORT inlines its body
    assert [n.op_type for n in as_node.graph.node] == [graph.nodes[0].op_type]
    feeds = _feeds(as_node)
    run = lambda m: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)  # noqa: E731
    for got, want in zip(run(written), run(as_node), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
