"""The built-in model zoo: valid ONNX, runs in onnxruntime, seeded, sized as promised, spec syntax."""
from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from models.stats import model_stats
from planner.errors import UsageError

NAMES = sorted(models.ZOO)
MiB = 2**20


def _session(model: onnx.ModelProto, optimize: bool = True) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def _classes(model: onnx.ModelProto) -> int:
    return int(_meta(model)["memplan.int_input_high.labels"])


def _loss(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float:
    return float(_session(model).run(["loss"], feeds)[0])


@pytest.mark.parametrize("name", NAMES)
def test_default_model_is_valid_and_runs_with_loss_near_ln_classes(name):
    model = models.build(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 10
    assert [o.name for o in model.graph.output] == ["loss"]
    assert {i.name for i in model.graph.input} == {"x", "labels"}
    (loss,) = _session(model).run(None, models.example_feeds(model))
    assert loss.shape == () and loss.dtype == np.float32
    assert math.isfinite(float(loss))
    assert abs(float(loss) - math.log(_classes(model))) < 0.5


@pytest.mark.parametrize("spec", ["zoo:gpt?gelu=op", "zoo:unet?upsample=linear", "zoo:resnet?blocks=2&depth=3"])
def test_variants_are_valid_and_run(spec):
    model = models.load_spec(spec)
    onnx.checker.check_model(model, full_check=True)
    assert math.isfinite(_loss(model, models.example_feeds(model)))


def test_gelu_op_needs_opset_20_and_matches_erf_form():
    erf, op = models.build("gpt"), models.build("gpt", gelu="op")
    assert [o.version for o in erf.opset_import] == [17]
    assert [o.version for o in op.opset_import] == [20]
    assert "Gelu" in model_stats(op).op_types and "Erf" in model_stats(erf).op_types
    feeds = models.example_feeds(erf)
    assert _loss(op, feeds) == pytest.approx(_loss(erf, feeds), abs=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_bytes_other_seed_other_weights(name):
    a, b = models.build(name, seed=3), models.build(name, seed=3)
    assert a.SerializeToString() == b.SerializeToString()
    c = models.build(name, seed=4)
    assert [n.op_type for n in c.graph.node] == [n.op_type for n in a.graph.node]
    weights_a = {i.name: numpy_helper.to_array(i) for i in a.graph.initializer}
    weights_c = {i.name: numpy_helper.to_array(i) for i in c.graph.initializer}
    assert weights_a.keys() == weights_c.keys()
    differing = [k for k in weights_a if not np.array_equal(weights_a[k], weights_c[k])]
    assert differing, "a different seed must draw different weights"


@pytest.mark.parametrize("name", NAMES)
def test_loss_depends_on_labels(name):
    model = models.build(name)
    feeds = models.example_feeds(model, seed=1)
    other = dict(feeds, labels=(feeds["labels"] + 1) % _classes(model))
    assert _loss(model, feeds) != pytest.approx(_loss(model, other), abs=1e-6)


@pytest.mark.parametrize("name", ["cnn", "resnet", "unet"])
def test_batchnorm_models_are_stable_under_ort_default_optimizations(name):
    """ORT's ConstantSharing once merged BN running stats with scale/shift; repeated runs drifted."""
    model = models.build(name)
    feeds = models.example_feeds(model)
    reference = _session(model, optimize=False).run(["loss"], feeds)[0]
    optimized = _session(model)
    for _ in range(3):
        assert optimized.run(["loss"], feeds)[0] == pytest.approx(reference, rel=1e-5)


def test_gpt_is_causal():
    model = models.build("gpt", logits=1)
    assert [o.name for o in model.graph.output] == ["loss", "logits"]
    session = _session(model)
    feeds = models.example_feeds(model)
    changed = feeds["x"].copy()
    changed[:, -1] = (changed[:, -1] + 1) % _classes(model)
    _, before = session.run(None, feeds)
    _, after = session.run(None, dict(feeds, x=changed))
    np.testing.assert_allclose(after[:, :-1], before[:, :-1], rtol=0, atol=1e-6)
    assert not np.allclose(after[:, -1], before[:, -1], atol=1e-4)
    # and it depends on earlier tokens: changing the first one moves every position
    first = feeds["x"].copy()
    first[:, 0] = (first[:, 0] + 1) % _classes(model)
    _, moved = session.run(None, dict(feeds, x=first))
    assert all(not np.allclose(moved[:, t], before[:, t], atol=1e-5) for t in range(before.shape[1]))


@pytest.mark.parametrize("name", NAMES)
def test_size_presets_keep_their_activation_promise(name):
    small = model_stats(models.build(name))
    large = model_stats(models.build(name, size="large"))
    assert small.activation_bytes < 8 * MiB
    assert 64 * MiB <= large.activation_bytes <= 400 * MiB


def test_explicit_options_override_the_preset():
    model = models.build("mlp", size="large", hidden=16, batch=3)
    x = next(i for i in model.graph.input if i.name == "x")
    assert [d.dim_value for d in x.type.tensor_type.shape.dim] == [3, 1024]
    assert numpy_helper.to_array(model.graph.initializer[0]).shape == (1024, 16)


def test_numpy_integer_options_build_as_their_ints():
    """models.build from Python with a numpy integer (a batch from np.arange): refused with "must
    be an integer in 1..1048576, got np.int64(4)"; it builds the model its int names."""
    got = models.build("mlp", batch=np.int64(4), seed=np.int32(3))
    want = models.build("mlp", batch=4, seed=3)
    assert got.SerializeToString() == want.SerializeToString()


@pytest.mark.parametrize("name", NAMES)
def test_recorded_spec_rebuilds_the_same_model(name):
    model = models.build(name, seed=2, batch=3)
    spec = _meta(model)["memplan.zoo.spec"]
    assert spec.startswith(f"zoo:{name}?") and "batch=3" in spec and "seed=2" in spec
    assert models.load_spec(spec).SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("zoo:gpt?batch=32&layers=4", ("gpt", {"batch": 32, "layers": 4})),
        ("zoo:mlp", ("mlp", {})),
        ("unet?upsample=linear&size=large", ("unet", {"upsample": "linear", "size": "large"})),
        ("zoo:cnn?seed=0&hw=16", ("cnn", {"seed": 0, "hw": 16})),
    ],
)
def test_parse_spec_round_trips(spec, expected):
    name, options = models.parse_spec(spec)
    assert (name, options) == expected
    assert all(type(v) is type(expected[1][k]) for k, v in options.items())
    assert models.parse_spec(models.format_spec(name, options)) == expected


@pytest.mark.parametrize(
    "spec, words",
    [
        ("zoo:vgg?batch=2", ["'vgg'", "cnn, gpt, mlp, resnet, unet"]),
        ("zoo:gpt?batchsize=2", ["'batchsize'", "batch", "heads", "vocab"]),
        ("zoo:mlp?batch=2.5", ["batch", "integer", "2.5"]),
        ("zoo:mlp?batch=eight", ["batch", "integer", "'eight'"]),
        ("zoo:mlp?batch=0", ["batch", "in 1..1048576", "0"]),
        ("zoo:gpt?batch=99999999999", ["batch", "in 1..1048576"]),  # sizes whose shapes alone fill host memory
        ("zoo:mlp?size=huge", ["size", "'huge'", "small, large"]),
        ("zoo:unet?upsample=cubic", ["upsample", "'cubic'", "nearest, linear"]),
        ("zoo:gpt?logits=2", ["logits", "0..1"]),
        ("zoo:mlp?batch", ["'batch'", "KEY=VALUE"]),
        ("zoo:mlp?batch=2&batch=3", ["'batch'", "twice"]),
    ],
)
def test_bad_specs_raise_one_line_usage_errors(spec, words):
    with pytest.raises(UsageError) as err:
        models.load_spec(spec)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(
    "name, options, words",
    [
        ("gpt", {"dim": 30, "heads": 4}, ["dim=30", "heads=4"]),
        ("cnn", {"hw": 30, "depth": 2}, ["hw=30", "2**depth=4"]),
        ("unet", {"hw": 20, "depth": 3}, ["hw=20", "2**depth=8"]),
        ("transformer", {}, ["'transformer'", "gpt"]),
        ("mlp", {"batch": True}, ["batch", "integer"]),
        ("gpt", {"vocab": 2**20, "dim": 1024}, ["protobuf limit", "vocab"]),  # refused before any weight is drawn
    ],
)
def test_build_rejects_bad_combinations(name, options, words):
    with pytest.raises(UsageError) as err:
        models.build(name, **options)
    for word in words:
        assert word in str(err.value)


def test_example_feeds_give_valid_ids_and_are_seeded():
    model = models.build("gpt", vocab=5)
    feeds = models.example_feeds(model, seed=7)
    assert feeds["x"].dtype == np.int64 and feeds["x"].shape == (2, 16)
    assert feeds["x"].min() >= 0 and feeds["x"].max() < 5 and feeds["labels"].max() < 5
    assert len(np.unique(feeds["x"])) == 5
    again = models.example_feeds(model, seed=7)
    assert all(np.array_equal(feeds[k], again[k]) for k in feeds)
    assert not np.array_equal(models.example_feeds(model, seed=8)["x"], feeds["x"])


def _foreign_model(x_dims, idx_dims) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)],
        "foreign",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims),
         helper.make_tensor_value_info("idx", TensorProto.INT64, idx_dims),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones(2, np.float32), "w")],
    )
    return helper.make_model(graph)


def test_example_feeds_for_foreign_models():
    feeds = models.example_feeds(_foreign_model([3, 4], [50]))
    assert set(feeds) == {"x", "idx"}  # the initializer-backed input "w" is not fed
    assert feeds["x"].dtype == np.float32 and feeds["x"].shape == (3, 4)
    # idx indexes x's axis 1 (size 4): the graph bounds it, though the model's metadata is silent
    assert set(np.unique(feeds["idx"])) == {0, 1, 2, 3}


def test_example_feeds_bound_labels_and_token_ids_by_the_graph_else_0_1():
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["ids", "flat"], ["ids1"]),
         helper.make_node("Gather", ["emb", "ids1"], ["e"]),  # token ids into a 7-row table
         helper.make_node("Unsqueeze", ["labels", "one"], ["l1"]),
         helper.make_node("GatherElements", ["scores", "l1"], ["picked"], axis=1),  # labels over 5 classes
         helper.make_node("Cast", ["flag"], ["flagf"], to=TensorProto.FLOAT)],
        "tokens",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4, 10]),
         helper.make_tensor_value_info("labels", TensorProto.INT64, [40]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [40, 5]),
         helper.make_tensor_value_info("flag", TensorProto.INT64, [40])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("e", "picked", "flagf")],
        [numpy_helper.from_array(np.ones((7, 3), np.float32), "emb"),
         numpy_helper.from_array(np.array([40], np.int64), "flat"),
         numpy_helper.from_array(np.array([1], np.int64), "one")],
    )
    feeds = models.example_feeds(helper.make_model(graph))
    assert set(np.unique(feeds["ids"])) == set(range(7))
    assert set(np.unique(feeds["labels"])) == set(range(5))
    assert set(np.unique(feeds["flag"])) == {0, 1}  # an integer input nothing bounds: 0..1


def test_example_feeds_reject_symbolic_dims_naming_the_dim():
    with pytest.raises(UsageError, match=r"'x' dim 0 is symbolic \('batch'\).*--dim batch="):
        models.example_feeds(_foreign_model(["batch", 4], [5]))
