"""Training graphs run on every ORT provider: training-mode BatchNormalization is split (passes/portable.py)."""
from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
import pytest

import models
import passes.autodiff as autodiff
from passes.onnx_export import export_model
from passes.onnx_import import import_model
from passes.portable import is_training_batchnorm, portable_batchnorm
from planner.graph import GraphBuilder
from planner.liveness import analyze


def _run(graph, feeds):
    sess = ort.InferenceSession(export_model(graph).SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _bn_graph(opset: int, running_outputs: bool):
    rng = np.random.default_rng(1)
    b = GraphBuilder("bn", opsets={"": opset})
    x = b.input("x", "float32", (4, 3, 5, 6))
    scale = b.initializer("scale", rng.normal(size=3).astype(np.float32))
    bias = b.initializer("bias", rng.normal(size=3).astype(np.float32))
    mean = b.initializer("mean", rng.normal(size=3).astype(np.float32), trainable=False)
    var = b.initializer("var", rng.uniform(0.5, 2.0, size=3).astype(np.float32), trainable=False)
    outs = [("y", "float32", (4, 3, 5, 6))]
    if running_outputs:
        outs += [("rm", "float32", (3,)), ("rv", "float32", (3,))]
    ids = b.node("BatchNormalization", [x, scale, bias, mean, var], outs, name="bn",
                 attrs={"epsilon": 1e-3, "momentum": 0.8, "training_mode": 1})
    for t in ids:
        b.output(t)
    return b.build()


@pytest.mark.parametrize("opset,running", [(17, True), (18, True), (15, True)])
def test_split_batchnorm_matches_the_fused_op_in_ort(opset, running):
    graph = _bn_graph(opset, running)
    split = portable_batchnorm(graph)
    assert not any(is_training_batchnorm(split, n) for n in split.nodes)
    assert [split.tensors[t].name for t in split.outputs] == [graph.tensors[t].name for t in graph.outputs]
    feeds = {"x": np.random.default_rng(2).normal(3.0, 2.0, size=(4, 3, 5, 6)).astype(np.float32)}
    want, got = _run(graph, feeds), _run(split, feeds)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-5, err_msg=name)


def test_graph_without_training_batchnorm_is_returned_as_is():
    graph = import_model("zoo:gpt")
    assert portable_batchnorm(graph) is graph


def test_training_graph_has_no_training_batchnorm_and_same_numbers_and_peak(monkeypatch):
    forward = import_model("zoo:cnn")
    step = autodiff.build_training_graph(forward)
    assert not any(is_training_batchnorm(step.graph, n) for n in step.graph.nodes)
    assert any(n.op_type == "BatchNormalization" for n in step.graph.nodes)
    # The forward/backward boundary moved with the inserted nodes: every backward node comes after
    # every forward BatchNormalization.
    bn_last = max(n.id for n in step.graph.nodes if n.op_type == "BatchNormalization")
    assert bn_last < step.forward_nodes <= min(n.id for n in step.graph.nodes if "__bw" in n.name)
    monkeypatch.setattr(autodiff, "portable_batchnorm", lambda g: g)
    fused = autodiff.build_training_graph(forward).graph
    assert any(is_training_batchnorm(fused, n) for n in fused.nodes)
    feeds = models.example_feeds(export_model(fused))
    want, got = _run(fused, feeds), _run(step.graph, feeds)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # The full-size temporary (x - mean) dies before y is made: the dynamic peak does not grow
    # (the base gains a few scalar constants).
    split_live, fused_live = analyze(step.graph), analyze(fused)
    assert split_live.dynamic_peak <= fused_live.dynamic_peak
    assert split_live.base_bytes - fused_live.base_bytes < 1024


def _unread(graph):
    """Node outputs no node reads and no graph output is: ORT holds them to the end of the run."""
    read = {t for n in graph.nodes for t in n.inputs} | set(graph.outputs)
    return [graph.tensors[t].name for n in graph.nodes for t in n.outputs if t >= 0 and t not in read]


def test_running_statistics_nobody_reads_get_no_update_nodes():
    graph = _bn_graph(17, running_outputs=True)
    # the same node with its running outputs unread: only y is a graph output
    graph = dataclasses.replace(graph, outputs=graph.outputs[:1])
    split = portable_batchnorm(graph)
    assert _unread(split) == []
    assert not any(n.name.endswith((".keep", ".blend", ".running")) for n in split.nodes)
    # the running statistics' initializers, which no node reads any more, are no initializers
    # (ORT drops an unread initializer: counted in the base, they put the prediction above ORT's)
    assert {"mean", "var"}.isdisjoint(t.name for t in split.initializers())
    assert {"mean", "var"}.isdisjoint(i.name for i in export_model(split).graph.initializer)
    feeds = {"x": np.random.default_rng(2).normal(3.0, 2.0, size=(4, 3, 5, 6)).astype(np.float32)}
    np.testing.assert_allclose(_run(split, feeds)["y"], _run(graph, feeds)["y"], rtol=2e-5, atol=2e-5)
    # the training step of a convnet: the running statistics are no output of it
    step = autodiff.build_training_graph(import_model("zoo:cnn"))
    assert _unread(step.graph) == []


def _split_half_model(out: int = 64):
    """MatMul -> Split; the loss reads one half, through a Dropout of ratio 0 (its mask unread)
    and a MatMul to ``out`` columns."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=s).astype(np.float32), n) for n, s in
             (("W", (64, 512)), ("W2", (256, out)))]
    inits += [numpy_helper.from_array(np.array([256, 256], np.int64), "split"),
              numpy_helper.from_array(np.array(0.0, np.float32), "ratio"),
              numpy_helper.from_array(np.array(True), "training")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
             helper.make_node("Split", ["h", "split"], ["a", "b"], name="sp", axis=1),
             helper.make_node("Dropout", ["a", "ratio", "training"], ["d", "mask"], name="drop"),
             helper.make_node("MatMul", ["d", "W2"], ["z"], name="mm2"),
             helper.make_node("Tanh", ["z"], ["t"], name="tanh"),
             helper.make_node("ReduceMean", ["t"], ["loss"], name="mean", keepdims=0)]
    g = helper.make_graph(nodes, "split_half", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256, 64])],
                          [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], initializer=inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_training_step_releases_outputs_nobody_reads(monkeypatch):
    from passes import alloc_counter
    from passes.verify import measure_peak

    forward = import_model(_split_half_model())
    graph = autodiff.build_training_graph(forward).graph
    # the unused Split half gets a 1-element reader right after the Split; the mask is not written
    assert [n for n in _unread(graph) if not n.endswith("__sink")] == []
    names = [n.name for n in graph.nodes]
    assert names.index("b__sink") == names.index("sp") + 1
    drop = next(n for n in graph.nodes if n.op_type == "Dropout")
    assert drop.outputs[1] == -1
    monkeypatch.setattr(autodiff, "release_unread_outputs", lambda g: (g, list(range(len(g.nodes)))))
    kept = autodiff.build_training_graph(forward).graph
    assert set(_unread(kept)) == {"b", "mask"}
    half = 256 * 256 * 4
    assert analyze(graph).dynamic_peak <= analyze(kept).dynamic_peak - half
    feeds = {"x": np.random.default_rng(1).normal(size=(256, 64)).astype(np.float32)}
    want, got = _run(kept, feeds), _run(graph, feeds)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    if alloc_counter.library() is not None:  # ORT's counted bytes: the prediction holds, the half is freed
        counted = measure_peak(export_model(graph), feeds, repeats=1).peak_bytes
        assert counted == analyze(graph).allocator_dynamic_peak
        assert counted <= measure_peak(export_model(kept), feeds, repeats=1).peak_bytes - half


def test_recurrent_final_states_nobody_reads_are_not_written(monkeypatch):
    """A fused LSTM / GRU the loss does not differentiate (its weights frozen) stays one node; its
    final states nobody reads (Y_h, Y_c) are optional outputs: left out, not given a reader, and
    the kernel's temporaries for them (MemoryModel) are what ORT then allocates."""
    from passes import alloc_counter
    from passes.verify import measure_peak

    forward = import_model("tests/fixtures/lstm.onnx", {"batch": 2, "seq": 8}, loose_dims=())
    options = autodiff.TrainOptions.from_kwargs(freeze=("onnx::LSTM*", "onnx::GRU*"))
    graph = autodiff.build_training_graph(forward, options).graph
    recurrent = [n for n in graph.nodes if n.op_type in ("LSTM", "GRU")]
    assert len(recurrent) == 3
    for n in recurrent:
        assert n.outputs[0] >= 0 and all(t == -1 for t in n.outputs[1:]), n.name
    assert _unread(graph) == [] and not any(n.name.endswith("__sink") for n in graph.nodes)
    monkeypatch.setattr(autodiff, "release_unread_outputs", lambda g: (g, list(range(len(g.nodes)))))
    kept = autodiff.build_training_graph(forward, options).graph
    assert len(_unread(kept)) == 5  # Y_h and Y_c of both LSTMs, the GRU's Y_h
    feeds = models.example_feeds(export_model(forward, weights=False), seed=0)
    want, got = _run(kept, feeds), _run(graph, feeds)
    assert set(want) == set(got)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    if alloc_counter.library() is not None:  # ORT's counted bytes: the kernel temporaries are predicted
        counted = measure_peak(export_model(graph), feeds, repeats=1).peak_bytes
        assert counted == analyze(graph).allocator_dynamic_peak


def test_forward_plans_release_outputs_nobody_reads(tmp_path):
    """memplan plan --forward planned the model as it is: ORT held the unused Split half and the
    Dropout mask to the end of the run (and the plan counted them there). Now the graph it plans,
    emits and verifies against is released as a training step is."""
    import onnx

    import cli
    from passes import alloc_counter
    from passes.verify import measure_peak

    path = tmp_path / "split_half.onnx"
    onnx.save(_split_half_model(out=2048), str(path))  # the peak at the last MatMul, after the Split
    graph, train = cli._graph_to_plan(str(path), {}, forward=True)
    assert train is None
    assert [n for n in _unread(graph) if not n.endswith("__sink")] == []
    names = [n.name for n in graph.nodes]
    assert names.index("b__sink") == names.index("sp") + 1
    assert next(n for n in graph.nodes if n.op_type == "Dropout").outputs[1] == -1
    raw = import_model(str(path))
    assert set(_unread(raw)) == {"b", "mask"}
    half = 256 * 256 * 4
    assert analyze(graph).dynamic_peak <= analyze(raw).dynamic_peak - half
    feeds = {"x": np.random.default_rng(1).normal(size=(256, 64)).astype(np.float32)}
    np.testing.assert_array_equal(_run(graph, feeds)["loss"], _run(raw, feeds)["loss"])
    if alloc_counter.library() is not None:  # ORT's counted bytes: the prediction holds, the half is freed
        counted = measure_peak(export_model(graph), feeds, repeats=1).peak_bytes
        assert counted == analyze(graph).allocator_dynamic_peak
        assert counted <= measure_peak(export_model(raw), feeds, repeats=1).peak_bytes - half


def test_released_outputs_of_an_opset_9_graph_get_a_slice_it_knows(tmp_path):
    """Slice takes its bounds as inputs from opset 10 on: the 1-element reader of an unread output of
    an opset-9 model (a training-mode BatchNormalization's statistics, a Split half) was written
    with inputs, and ORT refused the planned model ("schema(::Slice:1) has input size 3 not in
    range [min=1, max=1]")."""
    import onnx.parser

    import cli

    model = onnx.parser.parse_model("""
<ir_version: 4, opset_import: ["" : 9]>
g (float[4, 8] x) => (float[4, 4] y)
{
    a, b = Split<axis = 1, split = [4, 4]>(x)
    y = Relu(a)
}
""")
    path = tmp_path / "split9.onnx"
    onnx.save(model, str(path))
    graph, _ = cli._graph_to_plan(str(path), {}, forward=True)
    sink = next(n for n in graph.nodes if n.op_type == "Slice")
    assert graph.tensors[sink.inputs[0]].name == "b" and len(sink.inputs) == 1
    assert (sink.attr("starts"), sink.attr("ends")) == ([0, 0], [1, 1])
    feeds = {"x": np.arange(32, dtype=np.float32).reshape(4, 8) - 16}
    assert _run(graph, feeds)["y"].tolist() == np.maximum(feeds["x"][:, :4], 0).tolist()
