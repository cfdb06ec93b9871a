"""Graph forms that torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``, the default
since torch 2.9) writes and the TorchScript exporter did not, as inline ONNX (no torch here).

- torch.export metadata: each initializer's role (PARAMETER, BUFFER, CONSTANT_TENSOR) on its
  value_info, the whole signature on the graph, and onnxscript's ``folded_from`` on folded
  initializers. Python scalars (attention scale, GELU coefficients, mask fill) become unmarked 0-d
  float initializers, which must not be trained.
- A tied weight (GPT-2's wte / lm_head) read directly by one node and, folded into a transposed
  copy, by another.
- Sizes of the example input baked into a Reshape target around LSTM/GRU.

The last tests read a real export, tests/fixtures/gpt2_dynamo (make_fixtures.py), so a change in
the metadata torch writes shows up here: memplan must train exactly torch's parameters, with
torch's gradients, and the tied weight once.
"""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from passes import gradcheck
from passes.autodiff import build_training_graph
from passes.onnx_import import (
    FOLDED_FROM,
    TORCH_FX_NODE,
    TORCH_INPUT_KIND,
    TORCH_SIGNATURE,
    import_model,
)
from planner.errors import ModelImportError
from planner.graph import TensorKind
from tests.helpers import parse_model

RNG = np.random.default_rng(0)

# An attention-like block as the dynamo exporter writes it: ``scale`` is torch's ``/ 4.0`` (an
# unmarked 0-d initializer), ``mask_fill`` a constant folded from constants, ``pos`` a float buffer,
# ``val_7`` the folded transpose of parameter ``proj.weight``.
ROLES = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[batch, 4] x, int64[batch] labels) => (float loss)
  <float[4, 4] w0, float[4] pos, float scale, float mask_fill, float[4, 3] val_7, float[3] fused_bias>
{
    h = MatMul(x, w0)
    hp = Add(h, pos)
    hs = Div(hp, scale)
    hm = Mul(hs, mask_fill)
    logits0 = MatMul(hm, val_7)
    logits = Add(logits0, fused_bias)
    loss = SoftmaxCrossEntropyLoss<reduction = "mean">(logits, labels)
}
"""


def _mark(model: onnx.ModelProto, name: str, key: str, value: str) -> None:
    vi = next((v for v in model.graph.value_info if v.name == name), None)
    if vi is None:
        init = next(i for i in model.graph.initializer if i.name == name)
        vi = helper.make_tensor_value_info(name, init.data_type, list(init.dims))
        model.graph.value_info.append(vi)
    entry = vi.metadata_props.add()
    entry.key, entry.value = key, value


def _roles_model(mark: bool = True) -> onnx.ModelProto:
    model = parse_model(ROLES, ir_version=10)
    proj = RNG.standard_normal((3, 4)).astype(np.float32)  # torch's Linear layout [out, in]
    values = {"w0": RNG.standard_normal((4, 4)), "pos": RNG.standard_normal(4), "scale": np.array(4.0),
              "mask_fill": np.array(0.5), "val_7": proj.T, "fused_bias": RNG.standard_normal(3)}
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in values.items())
    if mark:
        _mark(model, "w0", TORCH_INPUT_KIND, "PARAMETER")
        _mark(model, "pos", TORCH_INPUT_KIND, "BUFFER")
        _mark(model, "mask_fill", FOLDED_FROM, "['val_2', 'val_3']")
        _mark(model, "val_7", FOLDED_FROM, "['proj.weight', 'val_6']")
        sig = model.graph.metadata_props.add()
        sig.key = TORCH_SIGNATURE
        sig.value = ("\n# inputs\np_w0: PARAMETER target='w0'\np_proj_weight: PARAMETER target='proj.weight'\n"
                     "b_pos: BUFFER target='pos' persistent=False\nx: USER_INPUT\nlabels: USER_INPUT\n")
    return model


def test_dynamo_roles_train_parameters_only():
    graph = import_model(_roles_model(), {"batch": 2})
    kinds = {n: graph.tensor(n).kind for n in ("w0", "pos", "scale", "mask_fill", "val_7", "fused_bias")}
    assert kinds == {"w0": TensorKind.TRAINABLE, "pos": TensorKind.FROZEN, "scale": TensorKind.FROZEN,
                     "mask_fill": TensorKind.FROZEN, "val_7": TensorKind.TRAINABLE,
                     # unmarked but not 0-d: what a rewrite (Conv+BatchNorm fusion) writes for a parameter
                     "fused_bias": TensorKind.TRAINABLE}
    step = build_training_graph(graph)
    assert step.params == ("w0", "val_7", "fused_bias")
    feeds = {"x": RNG.standard_normal((2, 4)).astype(np.float32), "labels": np.array([0, 2])}
    loss, grads = gradcheck.run_training_step(step, feeds)
    assert np.isfinite(loss) and set(grads) == {"w0", "val_7", "fused_bias"}


def test_unmarked_model_keeps_every_float_initializer_trainable():
    """Without torch.export metadata (any other producer) the rule is the old one."""
    graph = import_model(_roles_model(mark=False), {"batch": 2})
    assert all(graph.tensor(n).kind is TensorKind.TRAINABLE for n in ("w0", "pos", "scale", "mask_fill", "val_7"))


def test_signature_alone_marks_the_model():
    """A file whose value_info metadata was dropped still has the graph's signature block."""
    model = _roles_model()
    for vi in model.graph.value_info:
        del vi.metadata_props[:]
    graph = import_model(model, {"batch": 2})
    assert graph.tensor("w0").kind is TensorKind.TRAINABLE
    assert graph.tensor("scale").kind is TensorKind.FROZEN  # unmarked 0-d scalar
    assert graph.tensor("pos").kind is TensorKind.TRAINABLE  # its BUFFER mark was on the value_info


# Rotary positions as ``torch.arange(seq, dtype=torch.float32)`` export: a Range over the unmarked
# 0-d scalars ``start`` and ``step`` and the sequence length cast to float.
FLOAT_RANGE = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[batch, seq] x) => (float loss) <float start, float step, float[1] w>
{
    shape = Shape(x)
    one = Constant<value = int64 {1}>()
    length = Gather<axis = 0>(shape, one)
    end = Cast<to = 1>(length)
    pos = Range(start, end, step)
    shifted = Add(x, pos)
    scaled = Mul(shifted, w)
    loss = ReduceSum<keepdims = 0>(scaled)
}
"""


@pytest.mark.parametrize("mark", [True, False])
def test_float_range_over_exporter_scalars_folds(mark):
    """With torch.export metadata the exporter's 0-d scalars are constants, so the positions fold
    as an int64 arange does (make_fixtures.py had to write decoder23's that way); without it
    every float initializer may be trained and the Range stays. Same loss either way."""
    model = parse_model(FLOAT_RANGE, ir_version=10)
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.float32), k)
                                   for k, v in {"start": 0.0, "step": 1.0, "w": [1.5]}.items())
    if mark:
        _mark(model, "w", TORCH_INPUT_KIND, "PARAMETER")
    graph = import_model(model, {"batch": 2, "seq": 5})
    assert ("Range" in {n.op_type for n in graph.nodes}) is not mark
    # folded away with the Range, or an initializer that may be trained
    assert "start" not in graph.by_name if mark else graph.tensor("start").kind is TensorKind.TRAINABLE
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    loss, _ = gradcheck.run_training_step(build_training_graph(graph), {"x": x})
    assert loss == pytest.approx(float(np.sum((x + np.arange(5)) * 1.5)), rel=1e-6)


# GPT-2's tied embedding: Gather reads ``wte`` ([vocab, d]); the LM head's MatMul reads ``val_9``,
# which constant folding computed as Transpose(wte).
TIED = """
<ir_version: 10, opset_import: ["" : 20]>
g (int64[3] ids, int64[3] labels) => (float loss) <float[6, 4] wte, float[4, 6] val_9, float[4] b>
{
    e = Gather<axis = 0>(wte, ids)
    h = Add(e, b)
    logits = MatMul(h, val_9)
    loss = SoftmaxCrossEntropyLoss<reduction = "mean">(logits, labels)
}
"""


def _tied_model(mark: bool = True) -> onnx.ModelProto:
    model = parse_model(TIED, ir_version=10)
    rng = np.random.default_rng(1)  # the same values marked or not
    wte = rng.standard_normal((6, 4)).astype(np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(wte, "wte"), numpy_helper.from_array(wte.T.copy(), "val_9"),
                                    numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")])
    if mark:
        _mark(model, "wte", TORCH_INPUT_KIND, "PARAMETER")
        _mark(model, "b", TORCH_INPUT_KIND, "PARAMETER")
        _mark(model, "val_9", FOLDED_FROM, "['wte']")
    return model


def test_tied_weight_folded_transpose_shares_one_gradient():
    graph = import_model(_tied_model())
    assert graph.tensor("val_9").kind is TensorKind.ACTIVATION
    assert graph.nodes[0].op_type == "Transpose"
    step = build_training_graph(graph)
    assert step.params == ("wte", "b")
    feeds = {"ids": np.array([1, 4, 4]), "labels": np.array([0, 5, 2])}
    _, grads = gradcheck.run_training_step(step, feeds)
    # the same model read as two independent copies: wte's gradient is the sum of both parts
    split = build_training_graph(import_model(_tied_model(mark=False)))
    assert split.params == ("wte", "val_9", "b")
    _, parts = gradcheck.run_training_step(split, feeds)
    np.testing.assert_allclose(grads["wte"], parts["wte"] + parts["val_9"].T, rtol=1e-5, atol=1e-7)


def test_folded_transpose_of_untied_parameter_stays_an_initializer():
    model = _tied_model()
    for node in model.graph.node:  # the embedding reads another table: no tie
        if node.op_type == "Gather":
            node.input[0] = "emb"
    model.graph.initializer.append(numpy_helper.from_array(RNG.standard_normal((6, 4)).astype(np.float32), "emb"))
    graph = import_model(model)
    assert graph.tensor("val_9").kind is TensorKind.TRAINABLE
    assert "Transpose" not in {n.op_type for n in graph.nodes}


# ALBERT runs its one encoder layer twice: every read of the shared ``w`` was folded into a copy
# of its own (``val_a``, ``val_b`` transposed, ``val_c`` as is), and ``w`` itself is gone from the
# file. ``val_d`` says it came from ``w`` too but holds other values.
SHARED = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[2, 4] x, int64[2] labels) => (float loss)
  <float[4, 4] val_a, float[4, 4] val_b, float[4, 4] val_c, float[4, 4] val_d>
{
    h1 = MatMul(x, val_a)
    r1 = Tanh(h1)
    h2 = MatMul(r1, val_b)
    r2 = Tanh(h2)
    h3 = Gemm<transB = 1>(r2, val_c)
    h4 = MatMul(h3, val_d)
    loss = SoftmaxCrossEntropyLoss<reduction = "mean">(h4, labels)
}
"""


def _shared_model(mark: bool = True) -> onnx.ModelProto:
    model = parse_model(SHARED, ir_version=10)
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4)).astype(np.float32)  # torch's [out, in]
    other = rng.standard_normal((4, 4)).astype(np.float32)
    for name, value in (("val_a", w.T), ("val_b", w.T), ("val_c", w), ("val_d", other)):
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        if mark:
            _mark(model, name, FOLDED_FROM, "['w']")
    if mark:
        sig = model.graph.metadata_props.add()
        sig.key, sig.value = TORCH_SIGNATURE, "\n# inputs\np_w: PARAMETER target='w'\nx: USER_INPUT\nlabels: USER_INPUT\n"
    return model


def test_folded_copies_of_a_parameter_the_file_lacks_train_as_one(caplog):
    graph = import_model(_shared_model())
    assert graph.tensor("val_a").kind is TensorKind.TRAINABLE
    assert graph.tensor("val_c").kind is TensorKind.ACTIVATION  # Transpose(val_a)
    assert "val_b" not in {t.name for t in graph.tensors}  # read as val_a
    assert "'val_a' and 'val_d' were both folded from parameter 'w' but hold different values" in caplog.text
    step = build_training_graph(graph)
    assert step.params == ("val_a", "val_d")
    feeds = {"x": RNG.standard_normal((2, 4)).astype(np.float32), "labels": np.array([1, 3])}
    loss, grads = gradcheck.run_training_step(step, feeds)
    # read unmarked, each copy is a parameter with its part of w's gradient
    split = build_training_graph(import_model(_shared_model(mark=False)))
    assert split.params == ("val_a", "val_b", "val_c", "val_d")
    split_loss, parts = gradcheck.run_training_step(split, feeds)
    assert loss == pytest.approx(split_loss, rel=1e-6)
    np.testing.assert_allclose(grads["val_a"], parts["val_a"] + parts["val_b"] + parts["val_c"].T, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads["val_d"], parts["val_d"], rtol=1e-5, atol=1e-7)


# torch.export traced ``bn`` in train mode (the forward updates its running statistics), but the
# exporter wrote BatchNormalization in inference form; with its optimizer on, folded into the Conv.
BN = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[2, 3, 4, 4] x) => (float loss) <float[3, 3, 1, 1] w, float[3] s, float[3] b, float[3] running_mean, float[3] running_var>
{
    c = Conv(x, w)
    y = BatchNormalization%s(c, s, b, running_mean, running_var)
    z = Mul(y, y)
    loss = ReduceSum<keepdims = 0>(z)
}
"""


def _bn_model(form: str = "inference", traced_in_train_mode: bool = True) -> onnx.ModelProto:
    text = BN % ("<training_mode = 1>" if form == "training" else "")
    if form == "training":  # as the TorchScript exporter writes it: the updated statistics out too
        text = text.replace("y = BatchNormalization", "y, mean_out, var_out = BatchNormalization")
    if form == "fused":  # the Conv's weight and bias hold the BatchNorm now
        text = text.replace("y = BatchNormalization(c, s, b, running_mean, running_var)", "y = Identity(c)")
    model = parse_model(text, ir_version=10)
    rng = np.random.default_rng(5)
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((3, 3, 1, 1)).astype(np.float32), "w"),
        *(numpy_helper.from_array(rng.uniform(0.5, 1.5, 3).astype(np.float32), n) for n in ("s", "b", "running_mean", "running_var"))])
    sig = model.graph.metadata_props.add()
    sig.key = TORCH_SIGNATURE
    sig.value = ("\n# inputs\np_w: PARAMETER target='w'\np_s: PARAMETER target='s'\np_b: PARAMETER target='b'\n"
                 "b_mean: BUFFER target='running_mean' persistent=True\nb_var: BUFFER target='running_var' persistent=True\n"
                 "x: USER_INPUT\n\n# outputs\n")
    if traced_in_train_mode:  # a buffer's target is its module path, as the initializer is named
        sig.value += ("getitem_3: BUFFER_MUTATION target='running_mean'\ngetitem_4: BUFFER_MUTATION target='running_var'\n"
                      "add: BUFFER_MUTATION target='num_batches_tracked'\n")
    sig.value += "loss: USER_OUTPUT\n"
    return model


def _bn_grads(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds = {"x": np.random.default_rng(6).standard_normal((2, 3, 4, 4)).astype(np.float32)}
    return gradcheck.run_training_step(build_training_graph(import_model(model)), feeds)[1]


def test_batch_norm_traced_in_train_mode_trains_on_batch_statistics(caplog):
    graph = import_model(_bn_model("inference"))
    (bn,) = [n for n in graph.nodes if n.op_type == "BatchNormalization"]
    assert int(bn.attr("training_mode", 0)) == 1
    assert "BatchNorm" not in caplog.text  # nothing lost: no warning
    want = _bn_grads(_bn_model("training"))
    got = _bn_grads(_bn_model("inference"))
    frozen = _bn_grads(_bn_model("inference", traced_in_train_mode=False))  # eval-mode export: stays so
    for name in ("w", "s", "b"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6)
    assert not np.allclose(frozen["s"], want["s"], rtol=1e-3)


@pytest.mark.parametrize("form, traced_in_train_mode, warned", [
    ("fused", True, True), ("fused", False, False), ("training", True, False), ("inference", True, False)])
def test_batch_norm_folded_away_from_a_train_mode_trace_warns(form, traced_in_train_mode, warned, caplog):
    import_model(_bn_model(form, traced_in_train_mode))
    said = ("torch traced 1 BatchNorm layer(s) in train mode, but this file normalizes 1 of them with their running "
            "statistics")
    assert (said in caplog.text) is warned
    if warned:
        assert "optimize=False" in caplog.text and "\n" not in caplog.text.strip()


def test_computation_on_parameters_folded_into_an_initializer_warns(caplog):
    model = _tied_model()
    _mark(model, "b", FOLDED_FROM, "['ln.weight', 'val_6']")  # Gemma's 1 + weight, folded
    sig = model.graph.metadata_props.add()
    sig.key, sig.value = TORCH_SIGNATURE, "\n# inputs\np_wte: PARAMETER target='wte'\np_ln: PARAMETER target='ln.weight'\n"
    graph = import_model(model)
    assert graph.tensor("b").kind is TensorKind.TRAINABLE  # trained as a parameter of its own
    assert ("1 initializer(s) hold what onnxscript's constant folding computed from parameters "
            "(e.g. 'b' from 'ln.weight' and 1 other value(s))") in caplog.text
    assert "optimize=False" in caplog.text
    caplog.clear()
    import_model(_tied_model())  # a transposed copy of one parameter alone: it trains as the parameter
    assert "constant folding" not in caplog.text


def test_cli_says_an_import_warning_once(tmp_path):
    path = tmp_path / "bn.onnx"
    onnx.save(_bn_model("fused"), path)
    res = subprocess.run([sys.executable, "-m", "cli", "plan", str(path), "--budget", "100%",
                          "--emit", str(tmp_path / "planned.onnx")],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("torch traced 1 BatchNorm layer(s) in train mode") == 1, res.stderr


# The dynamo exporter's LSTM decomposition reshapes with the example's sequence length (12) baked in.
BAKED = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[seq, batch, 2, 12] h) => (float[12, batch, 24] y) <int64[3] target = {12, -1, 24}>
{
    y = Reshape<allowzero = 1>(h, target)
}
"""


def test_reshape_with_baked_in_size_names_node_and_fix():
    model = parse_model(BAKED, ir_version=10)
    assert import_model(model, {"seq": 12, "batch": 2}).tensor("y").shape == (12, 2, 24)
    with pytest.raises(ModelImportError) as err:
        import_model(model, {"seq": 16, "batch": 2})
    text = str(err.value)
    assert "\n" not in text
    assert "(Reshape) cannot reshape [16, 2, 2, 12]" in text and "[12, -1, 24]" in text and "--dim" in text


# ---- a real export: tests/fixtures/gpt2_dynamo (GPT-2, torch.onnx.export(dynamo=True)) ------------
DYNAMO_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "gpt2_dynamo.onnx"


def _dynamo_fixture():
    with np.load(DYNAMO_FIXTURE.with_suffix(".npz")) as data:
        record = {k: data[k] for k in data.files}
    dims = {k[4:]: int(v) for k, v in record.items() if k.startswith("dim:")}
    feeds = {k[6:]: v for k, v in record.items() if k.startswith("input:")}
    mapped = {k[4:]: str(v) for k, v in record.items() if k.startswith("map:")}
    return record, dims, feeds, mapped


def test_dynamo_fixture_trains_exactly_torch_parameters():
    """memplan's trainable initializers are the ones holding torch parameters: none of the Python
    scalars, mask fill or buffers the file also stores as float initializers, no parameter missed."""
    _, dims, _, mapped = _dynamo_fixture()
    model = onnx.load(str(DYNAMO_FIXTURE))
    floats = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    graph = import_model(DYNAMO_FIXTURE, dims)
    trainable = {t.name for t in graph.tensors if t.kind is TensorKind.TRAINABLE}
    assert trainable == set(mapped)
    assert len(mapped) == 28 and len(set(mapped.values())) == 28  # 27 parameters + the tied wte
    kept = sorted((floats - set(mapped)) & set(graph.by_name))  # the rest feed folded shape code
    assert kept and all(graph.tensor(n).kind is not TensorKind.TRAINABLE for n in kept)
    step = build_training_graph(graph)
    assert set(step.params) == set(mapped)


def test_dynamo_fixture_loss_and_gradients_match_torch():
    """The same check and tolerance as the TorchScript fixtures (test_autodiff)."""
    record, _, _, _ = _dynamo_fixture()
    report = gradcheck.fixture_report(DYNAMO_FIXTURE)
    assert report.loss == pytest.approx(float(record["loss"]), rel=1e-4)
    param, worst = report.worst
    assert worst < 2e-3, f"gpt2_dynamo: {param} off by {worst:.2e}"


def test_dynamo_fixture_tied_weight_has_one_gradient():
    """GPT-2's wte/lm_head: one trainable initializer (the folded transposed copy the LM head read
    is recomputed from it), whose gradient is torch's, the sum of the embedding's and the head's."""
    record, dims, feeds, mapped = _dynamo_fixture()
    (tied,) = [k for k, v in mapped.items() if v == "model.transformer.wte.weight"]
    model = onnx.load(str(DYNAMO_FIXTURE))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    copies = [n for n, v in inits.items() if n != tied and v.shape == inits[tied].T.shape
              and np.array_equal(v, inits[tied].T)]
    assert len(copies) == 1  # what the exporter folded
    graph = import_model(DYNAMO_FIXTURE, dims)
    assert graph.tensor(copies[0]).kind is TensorKind.ACTIVATION
    step = build_training_graph(graph)
    assert tied in step.params and copies[0] not in step.params
    _, grads = gradcheck.run_training_step(step, feeds)
    want = record[f"grad:{tied}"]
    np.testing.assert_allclose(grads[tied], want, rtol=0, atol=2e-3 * float(np.abs(want).max()))


# RWKV's token mix, ``k = x * mix + shifted * (1 - mix)``, as the dynamo exporter writes it:
# onnxscript folds ``1 - mix`` into ``sub_5`` (folded_from mix and the constant 1) while the
# first Mul still reads ``mix`` itself.
MIX = """
<ir_version: 10, opset_import: ["" : 20]>
g (float[2, 3, 4] x, float[2, 3, 4] s) => (float loss)
  <float[1, 1, 4] mix, float[{shape}] sub_5>
{
    a = Mul(x, mix)
    b = Mul(s, sub_5)
    k = Add(a, b)
    k2 = Mul(k, k)
    loss = ReduceSum<keepdims = 0>(k2)
}
"""
MIX_FEEDS = {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32),
             "s": RNG.standard_normal((2, 3, 4)).astype(np.float32)}


def _mix_model(folded: str = "1 - mix", record: str = "sub_5") -> onnx.ModelProto:
    mix = np.random.default_rng(4).uniform(0.1, 0.9, (1, 1, 4)).astype(np.float32)
    value = {"1 - mix": np.float32(1) - mix, "mix + 1": mix + np.float32(1), "3 * mix": mix * np.float32(3),
             "1 - mix, flat": (np.float32(1) - mix).reshape(4),
             "reshaped": mix.reshape(4)[::-1].reshape(1, 1, 4).copy()}[folded]
    model = parse_model(MIX.replace("{shape}", ", ".join(map(str, value.shape))), ir_version=10)
    model.graph.initializer.extend([numpy_helper.from_array(mix, "mix"), numpy_helper.from_array(value, "sub_5")])
    _mark(model, "mix", TORCH_INPUT_KIND, "PARAMETER")
    _mark(model, "sub_5", FOLDED_FROM, "['mix', 'scalar_tensor_default']")
    sig = model.graph.metadata_props.add()
    sig.key, sig.value = TORCH_SIGNATURE, "\n# inputs\np_mix: PARAMETER target='mix'\nx: USER_INPUT\ns: USER_INPUT\n"
    for node in model.graph.node:
        if node.output[0] == "b":
            entry = node.metadata_props.add()
            entry.key = TORCH_FX_NODE
            entry.value = (f"%mul_1 : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = "
                           f"(%s, %{record}), kwargs = {{}})")
    return model


@pytest.mark.parametrize("folded, a", [("1 - mix", -1.0), ("mix + 1", 1.0), ("3 * mix", 3.0), ("1 - mix, flat", -1.0)])
def test_a_folded_affine_copy_of_a_parameter_read_itself_shares_its_gradient(folded, a, caplog):
    """``sub_5`` is ``a * mix + b`` to the last bit and nodes also read ``mix``: it is computed from
    ``mix`` again, and ``mix`` gets torch's whole gradient (RWKV, dynamo: ``time_mix_value`` 1.1 ->
    4.4e-07). Trained as a parameter of its own, ``mix`` would get only the first Mul's part."""
    caplog.set_level(logging.INFO, logger="passes.onnx_import")
    step = build_training_graph(import_model(_mix_model(folded)))
    assert step.params == ("mix",)
    _, grads = gradcheck.run_training_step(step, MIX_FEEDS)
    x, s = MIX_FEEDS["x"].astype(np.float64), MIX_FEEDS["s"].astype(np.float64)
    mix = np.random.default_rng(4).uniform(0.1, 0.9, (1, 1, 4)).astype(np.float32).astype(np.float64)
    b = {"1 - mix": 1.0, "mix + 1": 1.0, "3 * mix": 0.0, "1 - mix, flat": 1.0}[folded]
    k = x * mix + s * (a * mix + b)
    want = (2 * k * (x + a * s)).sum(axis=(0, 1), keepdims=True)  # d/dmix of sum(k^2), both reads
    np.testing.assert_allclose(grads["mix"], want, rtol=1e-5, atol=1e-6)
    assert "computing it from 'mix' so both share one gradient" in caplog.text
    assert "constant folding computed" not in caplog.text


@pytest.mark.parametrize("folded, record", [("reshaped", "sub_5"), ("1 - mix", "sub_595")])
def test_a_folded_copy_that_is_not_an_affine_copy_read_as_itself_stays_apart(folded, record, caplog):
    """Not ``a * mix + b`` (the values permuted), or a reader whose FX record names another folded
    value (``sub_595``: RWKV's ``1 - mix'`` of an equal parameter, merged into ``sub_5``): ``sub_5``
    trains as a parameter of its own, and the warning says so."""
    graph = import_model(_mix_model(folded, record))
    assert graph.tensor("sub_5").kind is TensorKind.TRAINABLE
    assert "constant folding computed from parameters (e.g. 'sub_5' from 'mix'" in caplog.text
