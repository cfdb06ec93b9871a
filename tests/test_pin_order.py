"""Pinned planned models keep their order, and so their peak, under ORT's default session options."""
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

import models
from passes.autodiff import training_graph
from passes.onnx_export import export_model
from passes.onnx_import import import_model
from passes.ordering import dynamic_nodes
from passes.pin_order import chain_gaps, ort_default_order, pin_order
from passes.plan_model import lower_graph, pinned_unplanned_peak, plan_graph
from passes.verify import ORT_DEFAULT, PLANNED, measure_peak
from planner.cpsat import PlannerOptions
from planner.graph import GraphBuilder
from planner.liveness import MemoryModel, analyze
from tests.helpers import memplan

ROOT = Path(__file__).resolve().parents[1]
F = "float32"
#: ORT's defaults but the arena (whose chunks no model file can shape): the pinned greedy plan of
#: zoo:gpt?batch=32 at 70% measured 1.22-1.23 x its predicted dynamic peak, unpinned 1.96 (the cpsat
#: plan of zoo:gpt?batch=64: 1.09 and 1.77). Memory pattern, reuse and fusions together add the rest.
DEFAULT_OPTIONS_FACTOR = 1.35


def fan():
    """x -> A, B (independent); C reads B, D reads A: file order A B C D, ORT's DFS runs B C first."""
    b = GraphBuilder()
    x = b.input("x", F, (4,))
    (a,) = b.node("Sigmoid", [x], [("a", F, (4,))], name="A")
    (bb,) = b.node("Neg", [x], [("b", F, (4,))], name="B")
    (c,) = b.node("Exp", [bb], [("c", F, (4,))], name="C")
    (d,) = b.node("Add", [a, c], [("d", F, (4,))], name="D")
    b.output(d)
    return b.build()


def is_topological(graph, order):
    pos = {n: i for i, n in enumerate(order)}
    return sorted(order) == list(range(len(graph.nodes))) and all(
        pos[graph.tensors[t].producer] < pos[node.id]
        for node in graph.nodes for t in node.inputs if t >= 0 and graph.tensors[t].producer >= 0)


def test_default_order_is_the_reverse_dfs_and_pinning_restores_file_order():
    g = fan()
    # D's producers A (0) and C (2): the higher index is explored first, so B, C run before A
    assert [g.nodes[i].name for i in ort_default_order(g)] == ["B", "C", "A", "D"]
    pinned = pin_order(g)
    assert [g.nodes[i].name for i in chain_gaps(g)] == ["B"]  # C reads B, D reads C
    order = [pinned.nodes[i].name for i in ort_default_order(pinned)]
    assert [n for n in order if n in "ABCD"] == ["A", "B", "C", "D"]
    assert is_topological(pinned, ort_default_order(pinned))
    assert analyze(pinned).dynamic_peak == analyze(g).dynamic_peak


def test_a_pinned_plan_that_fails_names_the_pinned_files_unplanned_peak():
    """With --pin-order the unplanned peak is the pinned file's (its edges hold a few bytes more):
    a failed plan named the graph's own instead (fuzzed seed 302, --ops multi: 'no plan below the
    unplanned peak 2912 bytes' where the command said 3008, and ORT counted 3008)."""
    g = fan()
    pinned = pinned_unplanned_peak(g, lower_graph(g))
    assert pinned > analyze(g).peak_bytes
    pm = plan_graph(g, analyze(g).peak_bytes - 1, options=PlannerOptions(workers=1, seed=0, time_limit=2,
                                                                         work_limit=True), pin=True)
    assert not pm.ok and pm.result.status == "infeasible"
    assert pm.unplanned_peak == pm.result.least_bytes == pinned
    assert f"no plan below the unplanned peak {pinned} bytes" in pm.result.note, pm.result.note


def test_pinned_edges_read_memplans_own_int64_constants():
    """An edge's constant of a value memplan's constants already hold is that constant (one
    initializer per value, as the rewrite's edges do): a pinned plan of fuzzed seed 302 held its
    autodiff's [1] twice, the LayerNormalization backward's Expand target made again by the pin."""
    b = GraphBuilder()
    x = b.input("x", F, (3,))
    one = b.initializer("memplan__const_0", np.array([1], np.int64), trainable=False)
    (s,) = b.node("ReduceSum", [x, one], [("s", F, (1,))], name="S")
    (e,) = b.node("Expand", [s, one], [("e", F, (1,))], name="E")  # its target is gated: [1] + Size(x) * 0
    b.output(e)
    pinned = pin_order(b.build())
    values = [(v.shape, tuple(v.ravel().tolist())) for t in pinned.initializers()
              if t.name.startswith("memplan__") and (v := pinned.values[t.id]).dtype == np.int64]
    assert sorted(values) == sorted(set(values)) and ((1,), (1,)) in values, values
    target = pinned.nodes[next(n.id for n in pinned.nodes if n.name == "E")].inputs[1]
    assert pinned.tensors[target].producer >= 0  # still gated


def reuse_trap(n=256, m=1024):
    """a (1 MiB) dies after T; t, u, v peak; w (a's shape) is made late: ORT's memory reuse hands it
    a's buffer, which then sits idle across the peak, whenever ORT knows both shapes statically."""
    b = GraphBuilder()
    x = b.input("x", F, (n, m))
    (a,) = b.node("Exp", [x], [("a", F, (n, m))], name="A")
    (t,) = b.node("Transpose", [a], [("t", F, (m, n))], name="T")
    (u,) = b.node("Exp", [t], [("u", F, (m, n))], name="U")
    (v,) = b.node("Mul", [t, u], [("v", F, (m, n))], name="V")
    (r,) = b.node("ReduceMean", [v], [("r", F, (1, n))], name="R", attrs={"axes": [0]})
    (rt,) = b.node("Transpose", [r], [("rt", F, (n, 1))], name="RT")
    wide = b.initializer("wide", np.array([n, m], np.int64), trainable=False)
    (w,) = b.node("Expand", [rt, wide], [("w", F, (n, m))], name="W")  # static shape from the constant
    (y,) = b.node("ReduceMean", [w], [("y", F, ())], name="Y", attrs={"keepdims": 0})
    b.output(y)
    return b.build()


def test_pinned_model_hides_static_shapes_from_memory_reuse():
    g = reuse_trap()
    assert chain_gaps(g) == []  # no edges here: only the shape hiding differs
    pinned = pin_order(g)
    w = next(n for n in pinned.nodes if n.name == "W")
    assert pinned.tensors[w.inputs[1]].producer >= 0  # the target shape is computed, not a constant
    assert "wide" not in {t.name for t in pinned.tensors}  # and its unread constant is gone
    predicted = analyze(g).dynamic_peak
    feeds = {"x": np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32) * 0.1}
    reuse = replace(PLANNED, mem_reuse=True)
    plain = measure_peak(export_model(g, value_info=False), feeds, session=reuse, repeats=1, keep_outputs=True)
    assert plain.peak_bytes > 1.2 * predicted  # ORT infers the shapes from x and "wide" and holds a
    hidden = measure_peak(export_model(pinned, value_info=False), feeds, session=reuse, repeats=1, keep_outputs=True)
    assert hidden.peak_bytes <= 1.05 * predicted
    defaults = measure_peak(export_model(pinned, value_info=False), feeds, session=replace(ORT_DEFAULT, arena=False),
                            repeats=1)
    assert defaults.peak_bytes <= 1.10 * predicted
    assert plain.outputs is not None and hidden.outputs is not None
    np.testing.assert_array_equal(hidden.outputs["y"], plain.outputs["y"])


@pytest.fixture(scope="module")
def gpt_plan():
    graph = training_graph(import_model("zoo:gpt?batch=32"))
    budget = math.ceil(analyze(graph).peak_bytes * 0.7)
    pm = plan_graph(graph, budget, strategy="greedy", options=PlannerOptions(workers=1, seed=0), pin=True)
    assert pm.ok, pm.result.note
    return graph, pm, plan_graph(graph, budget, strategy="greedy", options=PlannerOptions(workers=1, seed=0))


def test_pinned_plan_runs_in_file_order_under_the_default_order(gpt_plan):
    graph, pinned, plain = gpt_plan
    g = pinned.planned
    assert pinned.peak_bytes <= pinned.budget_bytes
    dyn = dynamic_nodes(g)
    originals = {n.name for n in plain.planned.nodes}
    ran = [g.nodes[i].name for i in ort_default_order(g) if dyn[i] and g.nodes[i].name in originals]
    assert ran == [n.name for n in g.nodes if dyn[n.id] and n.name in originals]
    assert analyze(g, order=ort_default_order(g)).dynamic_peak <= analyze(g).dynamic_peak * 1.01
    # the unpinned plan is what the default order breaks
    p = plain.planned
    assert analyze(p, order=ort_default_order(p)).dynamic_peak > analyze(p).dynamic_peak * 1.3


def test_pinned_model_keeps_its_peak_and_outputs_under_default_options(gpt_plan):
    graph, pinned, plain = gpt_plan
    reference = export_model(graph)
    feeds = models.example_feeds(reference, seed=0)
    model = export_model(pinned.planned, value_info=False)
    # no static shapes (no swaps here): only the in-place ops' symbolic ones
    assert all(d.dim_param for v in model.graph.value_info for d in v.type.tensor_type.shape.dim)
    predicted = analyze(pinned.planned, model=MemoryModel(host_copies_resident=True)).dynamic_peak
    defaults = replace(ORT_DEFAULT, arena=False)
    got = measure_peak(model, feeds, session=defaults, repeats=1, keep_outputs=True)
    assert got.peak_bytes <= predicted * DEFAULT_OPTIONS_FACTOR
    unpinned = measure_peak(export_model(plain.planned), feeds, session=defaults, repeats=1)
    assert unpinned.peak_bytes > predicted * DEFAULT_OPTIONS_FACTOR  # the test can fail without pinning
    ref = measure_peak(reference, feeds, session=PLANNED, repeats=1, keep_outputs=True)
    same = measure_peak(model, feeds, session=PLANNED, repeats=1, keep_outputs=True)
    assert same.outputs is not None and ref.outputs is not None and got.outputs is not None
    for name, want in ref.outputs.items():
        np.testing.assert_array_equal(same.outputs[name], want, err_msg=name)  # planned options: bit-equal
        np.testing.assert_allclose(got.outputs[name], want, rtol=1e-4, atol=1e-6, err_msg=name)  # fused kernels


def test_cli_pin_order_on_plan_and_rewrite(tmp_path):
    spec, plan_json = "zoo:cnn?batch=8", tmp_path / "p.json"
    emitted, plain, rewritten = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
    rc, out, err = memplan("plan", spec, "--budget", "80%", "--strategy", "greedy", "--workers", "1",
                           "-o", plan_json, "--emit", emitted, "--pin-order")
    assert rc == 0, err
    assert "default session options" in out
    assert json.loads(plan_json.read_text())["pin_order"] is True
    # rewrite pins as the plan was made (the same file as --emit; it wrote an unpinned model
    # unless given --pin-order again), and --no-pin-order leaves the edges out
    rc, _, err = memplan("rewrite", spec, plan_json, "-o", rewritten)
    assert rc == 0, err
    assert rewritten.read_bytes() == emitted.read_bytes()
    rc, _, err = memplan("rewrite", spec, plan_json, "-o", plain, "--no-pin-order")
    assert rc == 0, err
    a, b, c = (onnx.load(p) for p in (emitted, plain, rewritten))
    assert [n.name for n in a.graph.node] == [n.name for n in c.graph.node]  # same plan, same edges
    assert len(a.graph.node) > len(b.graph.node)
    assert {n.name for n in b.graph.node} <= {n.name for n in a.graph.node}
    # shapes hidden: only symbolic ones, that tell ORT which ops may run in place
    # (passes.onnx_export.in_place_shapes), the scatters' data among them
    assert 0 < len(a.graph.value_info) < len(b.graph.value_info)
    assert all(d.dim_param and not d.dim_value for v in a.graph.value_info for d in v.type.tensor_type.shape.dim)
    assert {n.input[0] for n in a.graph.node if n.op_type == "ScatterElements"} <= {v.name for v in a.graph.value_info}
    meta = json.loads({p.key: p.value for p in a.metadata_props}["memplan.plan"])
    assert meta["pin_order"] is True


def test_a_pinned_model_keeps_the_shape_ort_needs_to_scatter_in_place():
    # zoo:cnn's max-pool backward scatters into a buffer read through an ordering view; exported
    # with no intermediate shapes, ORT copied it instead of writing in place (1.11x the predicted
    # peak under the planned options); the view's shape is kept, the rest stays hidden
    g = training_graph(import_model("zoo:cnn?batch=32"))
    # 1% over the model's own peak: the ordering edges' small tensors take 64-byte lines
    pm = plan_graph(g, int(analyze(g).peak_bytes * 1.01), strategy="none",
                    options=PlannerOptions(time_limit=5, workers=1), pin=True)
    model = export_model(pm.planned, value_info=False, mem_pattern=False)
    data = {n.input[0] for n in model.graph.node if n.op_type == "ScatterElements"}
    shaped = {v.name for v in model.graph.value_info}
    assert data and data <= shaped and len(shaped) < len(pm.planned.tensors) // 4  # the rest stays hidden
    assert all(d.dim_param for v in model.graph.value_info for d in v.type.tensor_type.shape.dim)
    predicted = analyze(pm.planned, model=MemoryModel(host_copies_resident=True)).dynamic_peak
    got = measure_peak(model, models.example_feeds(export_model(g), seed=0), repeats=1)
    # a copy of the scattered buffer shows as 1.11x; below the plan, the measurement's own
    # resolution (0.95-0.99x here since the Conv weights are read through views, 0.97-1.00x before)
    assert 0.9 * predicted <= got.peak_bytes <= 1.05 * predicted


def nchwc_nodes(model, tmp_path, name):
    """Nodes ORT_ENABLE_ALL's NCHWc layout transformer put into ``model`` (ORT's optimised file)."""
    import onnxruntime as ort
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}.opt.onnx"
    onnx.save(model, src)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3  # ORT warns that the saved file is for this CPU only
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return sum(n.domain == "com.microsoft.nchwc" for n in onnx.load(out).graph.node)


def test_pinned_conv_weights_keep_ort_from_the_nchwc_layout(tmp_path):
    # zoo:cnn's convolutions suit ORT's blocked layout; with constant weights ORT_ENABLE_ALL
    # rewrites them and adds reordered activation copies (1.32x the plan, arena off); pinning
    # reads the weights through views, so the plan's tensors are the ones that run
    g = training_graph(import_model("zoo:cnn?batch=32"))
    pm = plan_graph(g, math.ceil(analyze(g).peak_bytes * 0.8), strategy="greedy",
                    options=PlannerOptions(workers=1, seed=0), pin=True)
    assert pm.ok, pm.result.note
    if nchwc_nodes(export_model(g), tmp_path, "plain") == 0:
        pytest.skip("this CPU's ORT build has no NCHWc kernels")
    model = export_model(pm.planned, value_info=False, mem_pattern=False)
    assert nchwc_nodes(model, tmp_path, "pinned") == 0
    predicted = analyze(pm.planned, model=MemoryModel(host_copies_resident=True)).dynamic_peak
    feeds = models.example_feeds(export_model(g), seed=0)
    got = measure_peak(model, feeds, session=replace(ORT_DEFAULT, arena=False), repeats=1)
    assert got.peak_bytes <= predicted * 1.10


def test_a_pinned_model_whose_shapes_fold_in_many_rounds_imports_again(tmp_path):
    """The moe fixture's pinned plan hides shapes behind chains of ordering edges that take 11
    rounds of shape inference and folding to undo; `memplan verify` re-imports the file, and
    stopped at 8 rounds with "cannot infer a static shape"."""
    fixture = ROOT / "tests" / "fixtures" / "moe.onnx"
    out = tmp_path / "moe.pinned.onnx"
    dims = ["--dim", "batch=32", "--dim", "seq=16"]
    rc, _, err = memplan("plan", fixture, *dims, "--budget", "80%", "--workers", "1", "--deterministic",
                         "--time-limit", "5", "--emit", out, "--pin-order")
    assert rc == 0, err
    graph = import_model(out)
    assert len(graph.nodes) > len(import_model(fixture, {"batch": 32, "seq": 16}).nodes)
    rc, stdout, err = memplan("verify", fixture, out, *dims, "--json")
    assert rc == 0, err
    assert json.loads(stdout)["outputs_equal"] is True


def test_verify_compares_a_pinned_model_with_the_kernels_it_runs(tmp_path):
    """A pinned file reads its Conv weights through views, and ORT then runs those Convs with other
    kernels (mobilenetv2's depthwise ones round differently, by about 5e-6): verify compares the
    plan bit for bit with the model read the same way, and reports the difference from the model's
    own outputs apart. It used to report the outputs as differing and exit 1."""
    fixture, out = ROOT / "tests" / "fixtures" / "mobilenetv2.onnx", tmp_path / "m.onnx"
    rc, _, err = memplan("plan", fixture, "--dim", "batch=4", "--budget", "70%", "--strategy", "greedy",
                         "--workers", "1", "--emit", out, "--pin-order")
    assert rc == 0, err
    rc, stdout, err = memplan("verify", fixture, out, "--json")
    assert rc == 0, err
    rep = json.loads(stdout)
    assert rep["outputs_equal"] is True and rep["tolerance"] == {"rtol": 0.0, "atol": 0.0}
    assert all(o["max_abs_diff"] == 0 for o in rep["outputs"])
    assert "Conv weights read through views" in rep["compared_with"]
    assert 0 <= rep["reference_max_abs_diff"] < 1e-4


def test_a_pinned_model_runs_its_activations_in_place_as_planned():
    """Hidden shapes stopped ORT running Sigmoid, Tanh or Relu in place: a pinned zoo:mlp measured
    1.27x its plan under the planned session options, over its budget (fuzzed, stop 49). The
    in-place ops' inputs and outputs now share symbolic shapes: the count equals the prediction."""
    from passes import alloc_counter

    if alloc_counter.library() is None:
        pytest.skip("no C compiler to build the allocation counter")
    g = training_graph(import_model("zoo:mlp?batch=1024"))
    pm = plan_graph(g, int(analyze(g).peak_bytes * 0.8), options=PlannerOptions(time_limit=10, workers=1,
                                                                                 work_limit=True), pin=True)
    model = export_model(pm.planned, value_info=False, mem_pattern=False)
    predicted = analyze(pm.planned, model=MemoryModel(host_copies_resident=True)).dynamic_peak
    got = measure_peak(model, models.example_feeds(export_model(g), seed=0), repeats=1)
    assert got.peak_bytes == predicted


def mean_square():
    """x @ w + shift, Relu, the mean square: an activation-shaped weight, a ReduceMean loss."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["h"]), n("Add", ["h", "shift"], ["s"]), n("Relu", ["s"], ["r"]),
             n("Mul", ["r", "r"], ["q"]), n("ReduceMean", ["q"], ["loss"], keepdims=0)]
    inits = [numpy_helper.from_array((rng.standard_normal((256, 256)) * 0.05).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((64, 256)).astype(np.float32), "shift")]
    graph = helper.make_graph(nodes, "ms", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [64, 256])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_pinned_optimizer_step_shows_ort_no_static_size_and_folds_nothing_big():
    """Under ORT's defaults a pinned step measured up to 2.1x its plan (fuzzed, stop 49) through
    three leaks of static sizes into what ORT's memory reuse pairs, or constants it folds:
    an activation-shaped weight (``shift``) broadcast into an activation, the gradients and moments an
    optimizer step outputs and then reads, and the loss gradient's Expand of a constant, which ORT
    folds into a resident initializer. Each is read through a view, or gated, now; MatMul's weight
    stays direct (MLAS prepacks it)."""
    g = training_graph(import_model(mean_square()), optimizer="adam")
    pinned = pin_order(g)
    by_op = {n.op_type: n for n in pinned.nodes}
    matmul = next(n for n in pinned.nodes if n.name == "MatMul_0" or (n.op_type == "MatMul" and
                                                                       pinned.tensors[n.inputs[1]].name == "w"))
    assert pinned.tensors[matmul.inputs[1]].name == "w"  # direct: prepacked
    add = next(n for n in pinned.nodes if n.op_type == "Add" and any(pinned.tensors[t].name.startswith("shift")
                                                                     for t in n.inputs))
    assert all(pinned.tensors[t].name != "shift" for t in add.inputs)  # through a view
    for t in pinned.outputs:
        # but an edge's gate (Size) and the view itself
        readers = [n for n in pinned.nodes if t in n.inputs and n.op_type != "Size" and not n.name.endswith("__hide_x")]
        assert not readers, f"{pinned.tensors[t].name} is read straight from the graph output by {readers[0].name}"
    expand = by_op["Expand"]
    assert dynamic_nodes(pinned)[expand.id]  # gated: ORT cannot fold it
    model = export_model(pinned, value_info=False, mem_pattern=False)
    predicted = analyze(pinned, model=MemoryModel(host_copies_resident=True)).dynamic_peak
    feeds = models.example_feeds(export_model(g), seed=0)
    got = measure_peak(model, feeds, session=replace(ORT_DEFAULT, arena=False), repeats=1)
    assert got.peak_bytes <= 1.05 * predicted, got.peak_bytes / predicted


def test_a_pinned_plan_at_the_whole_unplanned_peak_needs_no_plan(tmp_path):
    # the lstm fixture as it is peaks at 33996 bytes, pinned at 34092 (its ordering edges' bytes):
    # at 100% --pin-order was refused as over budget ("the plans found overshoot the budget once
    # rewritten"); the percentage is now of the pinned model's unplanned peak, which fits as it is
    emitted, plan_json = tmp_path / "p.onnx", tmp_path / "p.json"
    rc, out, err = memplan("plan", ROOT / "tests/fixtures/lstm.onnx", "--dim", "batch=2", "--dim", "seq=8",
                           "--forward", "--budget", "100%", "--pin-order", "--time-limit", "2", "--deterministic",
                           "-o", plan_json, "--emit", emitted)
    assert rc == 0, err
    obj = json.loads(plan_json.read_text())
    assert obj["recomputed"] == [] and obj["swapped"] == []
    assert obj["peak_bytes"] <= obj["budget_bytes"] == obj["unplanned_peak_bytes"]
    assert emitted.is_file()


@pytest.mark.parametrize("opset", [9, 11])
def test_verify_reads_a_pinned_model_whose_batchnorm_statistics_nothing_reads(tmp_path, opset):
    """A BatchNormalization of opset 7-13 in training mode (five outputs) whose statistics nothing
    reads: the planned file sinks each one with a Slice; pinned, no shape is recorded and onnx
    infers only Y of that op, so `memplan verify` refused memplan's own file ("cannot infer a
    static shape for tensor 'rm__sink'")."""
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.full(4, v, np.float32), n) for n, v in zip("sbmv", (1, 0, 0, 1))]
    bn = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "sv"])
    model = helper.make_model(
        helper.make_graph([bn, helper.make_node("Relu", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4, 3, 3])], inits),
        opset_imports=[helper.make_opsetid("", opset)], ir_version=7)
    src, out = tmp_path / "bn.onnx", tmp_path / "bn.pinned.onnx"
    onnx.save(model, src)
    rc, _, err = memplan("plan", src, "--forward", "--budget", "100%", "--workers", "1", "--time-limit", "2",
                         "--emit", out, "--pin-order")
    assert rc == 0, err
    assert any(n.name == "rm__sink" for n in onnx.load(out).graph.node)
    import_model(out)
    rc, stdout, err = memplan("verify", src, out, "--json")
    assert rc == 0, err
    assert json.loads(stdout)["outputs_equal"] is True


def test_verify_reads_a_pinned_model_with_a_com_microsoft_op(tmp_path):
    """A com.microsoft op (FusedMatMul, from an ORT-optimised file) whose output shape the model
    records: a pinned file leaves static shapes out, and onnx infers none for such an op, so
    `memplan verify` refused memplan's own file ("onnx infers no shape for tensor 'h0'"). The shape
    is kept in the file's metadata, where ORT does not see it."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "W")
    nodes = [helper.make_node("FusedMatMul", ["x", "W"], ["h0"], domain="com.microsoft", alpha=1.0, name="fmm"),
             helper.make_node("Relu", ["h0"], ["h1"], name="relu"), helper.make_node("MatMul", ["h1", "W"], ["z"])]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])], [w],
                          value_info=[helper.make_tensor_value_info("h0", TensorProto.FLOAT, [4, 8])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)], ir_version=8)
    src, out = tmp_path / "ms.onnx", tmp_path / "ms.pinned.onnx"
    onnx.save(model, src)
    rc, _, err = memplan("plan", src, "--forward", "--budget", "100%", "--workers", "1", "--time-limit", "2",
                         "--emit", out, "--pin-order")
    assert rc == 0, err
    pinned = onnx.load(out)
    # still no static shape for ORT to pair buffers by
    assert all(d.dim_param for v in pinned.graph.value_info for d in v.type.tensor_type.shape.dim)
    assert import_model(out).tensor("h0").shape == (4, 8)
    bad = onnx.load(out)
    next(p for p in bad.metadata_props if p.key == "memplan.shapes").value = "[1"
    from planner.errors import ModelImportError
    with pytest.raises(ModelImportError, match="memplan.shapes"):
        import_model(bad)
    rc, stdout, err = memplan("verify", src, out, "--json")
    assert rc == 0, err
    assert json.loads(stdout)["outputs_equal"] is True


def test_a_pinned_file_records_the_shapes_it_hides_and_an_older_one_is_read_folded(tmp_path, caplog):
    """A pinned file's ordering edges compute their Reshape and Slice shapes (``Size(G) * 0``): onnx
    infers those only folded, and verify read pinned files folded, the edges' Size scalars left out
    (zoo:resnet at 70%: 128 bytes under ORT's count). The file records them in its metadata, so it
    is read as ORT runs it; one written before it did is still read, folded, with a warning."""
    from passes.onnx_import import SHAPES_KEY, import_as_run

    out = tmp_path / "p.onnx"
    rc, _, err = memplan("plan", "zoo:resnet", "--budget", "70%", "--workers", "1", "--time-limit", "2",
                         "--pin-order", "--emit", out)
    assert rc == 0, err
    as_run = import_as_run(out)
    assert "read folded" not in caplog.text
    assert any(n.op_type == "Size" for n in as_run.nodes)
    older = onnx.load(out)
    kept = [p for p in older.metadata_props if p.key != SHAPES_KEY]
    del older.metadata_props[:]
    older.metadata_props.extend(kept)
    folded = import_as_run(older)
    assert "read folded" in caplog.text
    assert not any(n.op_type == "Size" for n in folded.nodes)
