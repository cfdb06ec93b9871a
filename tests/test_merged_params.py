"""Distinct torch parameters that an exporter merged because their values were equal train apart,
as torch trains them (passes/onnx_import.py ``_split_merged_parameters``).

A model fresh from its initializer (about to be trained from scratch, the case a memory planner
sees most) has every LayerNorm scale 1 and every bias 0. torch's TorchScript exporter in eval mode
(its default) keeps one of each group and writes the others as ``Identity(kept)`` under their own
names; onnxscript's optimizer (the dynamo exporter's default) points every read at the kept one,
and only the FX node each ONNX node came from still names the parameter torch read. Trained as
one, the group gets the sum of its gradients. The oracle is the same model written with distinct
initializers; two tests read real exports of a fresh GPT-2 (tests/fixtures/fresh).
"""
from __future__ import annotations

import logging
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
from planner.graph import TensorKind

RNG = np.random.default_rng(5)
W = RNG.standard_normal((4, 4)).astype(np.float32)
FEEDS = {"x": RNG.standard_normal((2, 4)).astype(np.float32)}
FRESH = Path(__file__).resolve().parent / "fixtures" / "fresh"


def _fx(out: str, params: list[str]) -> str:
    """An FX node as torch's exporter records it (``pkg.torch.onnx.fx_node``)."""
    args = ", ".join(["%h", "[4]", *(f"%p_{p.replace('.', '_')}" for p in params), "1e-05"])
    return (f"%{out} : [num_users=1] = call_function[target=torch.ops.aten.layer_norm.default]"
            f"(args = ({args}), kwargs = {{}})")


def _as_exported(model: onnx.ModelProto, calls: dict[str, str], params: tuple[str, ...]) -> None:
    """What torch's dynamo exporter records: each named node's FX node, and the signature's
    parameters (FX name ``p_`` + the name with dots as underscores)."""
    for node in model.graph.node:
        if node.name in calls:
            entry = node.metadata_props.add()
            entry.key, entry.value = TORCH_FX_NODE, calls[node.name]
    sig = model.graph.metadata_props.add()
    sig.key = TORCH_SIGNATURE
    sig.value = "\n# inputs\n" + "".join(f"p_{p.replace('.', '_')}: PARAMETER target='{p}'\n" for p in params) + \
        "x: USER_INPUT\n"


def _norms(form: str, producer: str = "pytorch", copies: tuple[str, str] = ("n2.weight", "n2.bias"),
           trained: bool = False) -> onnx.ModelProto:
    """x -> LayerNorm(n1) -> MatMul(w) -> LayerNorm(n2) -> sum of squares, n2 equal to n1 (ones and
    zeros; ``trained``: values of their own): ``distinct`` initializers, or merged as the
    ``torchscript`` or ``dynamo`` exporter does."""
    merged = form != "distinct"
    second = ("n1.weight", "n1.bias") if form == "dynamo" else copies
    nodes = [helper.make_node("LayerNormalization", ["x", "n1.weight", "n1.bias"], ["h"], name="ln1", axis=-1),
             helper.make_node("MatMul", ["h", "w"], ["m"], name="mm"),
             helper.make_node("LayerNormalization", ["m", *second], ["y"], name="ln2", axis=-1),
             helper.make_node("Mul", ["y", "y"], ["z"], name="sq"),
             helper.make_node("ReduceSum", ["z"], ["loss"], name="sum", keepdims=0)]
    if form == "torchscript":
        nodes[2:2] = [helper.make_node("Identity", [f"n1.{p}"], [copy], name=f"Identity_{i}")
                      for i, (p, copy) in enumerate(zip(("weight", "bias"), copies))]
    scale, shift = (1 + W[0] / 4, W[1] / 4) if trained else (np.ones(4), np.zeros(4))
    values = {"n1.weight": scale, "n1.bias": shift, "w": W}
    if not merged:
        values.update({"n2.weight": scale, "n2.bias": shift})
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name=producer)
    if form == "dynamo":
        _as_exported(model, {"ln1": _fx("ln1", ["n1.weight", "n1.bias"]), "ln2": _fx("ln2", ["n2.weight", "n2.bias"])},
                     ("n1.weight", "n1.bias", "w", "n2.weight", "n2.bias"))
        for name in ("n1.weight", "n1.bias", "w"):
            vi = helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(np.shape(values[name])))
            entry = vi.metadata_props.add()
            entry.key, entry.value = TORCH_INPUT_KIND, "PARAMETER"
            model.graph.value_info.append(vi)
    return model


def _grads(model: onnx.ModelProto) -> tuple[tuple[str, ...], float, dict[str, np.ndarray]]:
    step = build_training_graph(import_model(model))
    loss, grads = gradcheck.run_training_step(step, FEEDS)
    return step.params, loss, grads


def _trains_as(merged: onnx.ModelProto, distinct: onnx.ModelProto, atol: float = 1e-7) -> tuple[list[str], dict]:
    """Assert ``merged`` trains as ``distinct``: the same trainables, loss and gradients. Returns
    (the trainables, sorted; ``distinct``'s gradients)."""
    params, loss, grads = _grads(merged)
    want_params, want_loss, want = _grads(distinct)
    assert sorted(params) == sorted(want_params)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    for name in want:
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-6, atol=atol, err_msg=name)
    return sorted(params), want


@pytest.mark.parametrize("form", ["torchscript", "dynamo"])
def test_parameters_merged_for_equal_values_train_apart(form, caplog):
    caplog.set_level(logging.INFO, logger="passes.onnx_import")
    params, want = _trains_as(_norms(form), _norms("distinct"))
    assert params == ["n1.bias", "n1.weight", "n2.bias", "n2.weight", "w"]
    # what training them as one would have given: the sum, the same for both
    assert not np.allclose(want["n1.weight"], want["n1.weight"] + want["n2.weight"], rtol=1e-2)
    assert "2 parameter(s) the exporter merged with another of equal value train on their own" in caplog.text


def test_merged_folded_constants_stay_merged(caplog):
    """TorchScript's constant folding stores a weight reshaped for its use as ``onnx::MatMul_NNN``,
    and merges equal ones with Identity under such names too. So it does the two folded copies of
    the one weight a shared layer reads twice (ALBERT), which torch trains as one; fresh equal
    parameters folded so cannot be told from those, and stay merged (the sum of the gradients).
    Copies of values of their own are taken for a shared layer's; copies holding one value
    throughout (a fresh norm's ones or zeros: fresh BiT's GroupNorm scales, 3.2 off torch and
    nothing said), or beside parameters merged under their own names (a fresh model), are warned
    of, naming do_constant_folding=False."""
    for trained in (True, False):
        caplog.clear()
        params, _, grads = _grads(_norms("torchscript", copies=("onnx::Mul_12", "onnx::Add_13"), trained=trained))
        _, _, want = _grads(_norms("distinct", trained=trained))
        assert sorted(params) == ["n1.bias", "n1.weight", "w"]
        np.testing.assert_allclose(grads["n1.weight"], want["n1.weight"] + want["n2.weight"], rtol=1e-5, atol=1e-6)
        if trained:
            assert not caplog.text
        else:
            assert ("merged 2 constant-folded copies that hold one value throughout, as a freshly initialized "
                    "model's norm scales and biases do (e.g. 'onnx::Mul_12')") in caplog.text
            assert "do_constant_folding=False" in caplog.text
    caplog.clear()
    params, _, _ = _grads(_norms("torchscript", copies=("n2.weight", "onnx::Add_13")))
    assert sorted(params) == ["n1.bias", "n1.weight", "n2.weight", "w"]
    assert "and 1 constant-folded copies too (e.g. 'onnx::Add_13')" in caplog.text
    assert "do_constant_folding=False" in caplog.text


def _folded_norms() -> onnx.ModelProto:
    """The dynamo form with n1's parameters folded into ``val_5``/``val_6`` (``folded_from`` the
    parameter and a constant, as a reshape for its use is), which both norms read."""
    model = _norms("dynamo")
    g = model.graph
    rename = {"n1.weight": "val_5", "n1.bias": "val_6"}
    for init in g.initializer:
        init.name = rename.get(init.name, init.name)
    for node in g.node:
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
    for vi in [v for v in g.value_info if v.name in rename]:
        g.value_info.remove(vi)
    for source, name in rename.items():
        vi = helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [4])
        entry = vi.metadata_props.add()
        entry.key, entry.value = FOLDED_FROM, repr([source, "val_1"])
        g.value_info.append(vi)
    return model


@pytest.mark.parametrize("direct, warned", [(True, False), (False, True)])
def test_a_folded_reshape_of_an_aten_argument_is_not_warned_of(direct, warned, caplog):
    """aten.group_norm takes its weight as it is; the ONNX translation unsqueezes it and onnxscript
    folds that into an initializer (``folded_from`` the weight and the axes). Where every reader's
    FX record names the parameter itself, training the folded copy is training the parameter;
    where a reader took a computation of it (Gemma's ``1 + weight``), memplan warns."""
    model = _folded_norms()
    ln1 = next(n for n in model.graph.node if n.name == "ln1")
    if not direct:
        ln1.metadata_props[0].value = ln1.metadata_props[0].value.replace("%p_n1_weight", "%add_1")
    import_model(model)  # the second norm's reads are split first: only ln1 reads val_5 and val_6
    assert ("'val_5' from 'n1.weight' and 1 other value(s)" in caplog.text) is warned


def test_merged_folded_copies_train_apart():
    """onnxscript folds a parameter reshaped for its use (a GroupNorm's weight as [C, 1, 1]) into
    an initializer of its own (``folded_from`` names the parameter) and merges equal ones: the
    second norm's reads of the first's folded copies are split back, under its parameters' names."""
    params, _, grads = _grads(_folded_norms())
    _, _, want = _grads(_norms("distinct"))
    assert sorted(params) == ["n2.bias", "n2.weight", "val_5", "val_6", "w"]
    for mine, theirs in (("val_5", "n1.weight"), ("val_6", "n1.bias"), ("n2.weight", "n2.weight"), ("w", "w")):
        np.testing.assert_allclose(grads[mine], want[theirs], rtol=1e-6, atol=1e-7, err_msg=mine)


def test_a_torch_tie_stays_one_parameter():
    """A parameter torch itself shares (one tensor, two modules): torch.export reads it as one
    (``%p_b_weight`` in both nodes, ``a.weight`` named by the signature and unread); the file has
    one initializer, which trains with the sum of both reads' gradients, as in torch."""
    model = _norms("dynamo")
    g = model.graph
    for node in g.node:
        if node.name == "mm":  # a second MatMul reading w, from the module that shares it
            entry = node.metadata_props.add()
            entry.key, entry.value = TORCH_FX_NODE, "%mm : [num_users=1] = call_function[target=torch.ops.aten.mm.default](args = (%h, %p_w), kwargs = {})"
    g.metadata_props[0].value += "p_a_weight: PARAMETER target='a.weight'\n"
    graph = import_model(model)
    trainable = {t.name for t in graph.tensors if t.kind is TensorKind.TRAINABLE}
    assert trainable == {"n1.weight", "n1.bias", "n2.weight", "n2.bias", "w"}


@pytest.mark.parametrize("producer, copies", [("other", ("n2.weight", "n2.bias")),
                                              ("pytorch", ("/model/n2/Identity_output_0", "/model/n2/Identity_1_output_0"))])
def test_identity_of_an_initializer_stays_where_it_is_no_torch_merge(producer, copies):
    """An Identity of a weight from another producer, or under a traced intermediate's name (a
    ``.clone()`` in the forward), reads the weight: one trainable with both reads' gradient."""
    params, _, grads = _grads(_norms("torchscript", producer=producer, copies=copies))
    assert sorted(params) == ["n1.bias", "n1.weight", "w"]
    _, _, want = _grads(_norms("distinct"))
    np.testing.assert_allclose(grads["n1.weight"], want["n1.weight"] + want["n2.weight"], rtol=1e-5, atol=1e-6)


def test_reads_pair_only_with_parameters_named_alike(caplog):
    """A node whose FX node names two merged parameters ending like the one kept parameter it reads:
    which read was which is unknown, so none is split, and the warning names what stays merged."""
    model = _norms("dynamo")
    ln2 = next(n for n in model.graph.node if n.name == "ln2")
    ln2.metadata_props[0].value = _fx("ln2", ["n2.weight", "n3.weight", "n2.bias"])
    model.graph.metadata_props[0].value += "p_n3_weight: PARAMETER target='n3.weight'\n"
    graph = import_model(model)
    trainable = {t.name for t in graph.tensors if t.kind is TensorKind.TRAINABLE}
    assert trainable == {"n1.weight", "n1.bias", "n2.bias", "w"}
    assert "2 parameter(s) torch trains are not in the file (e.g. 'n2.weight')" in caplog.text


def _grn(form: str, swapped: bool = False) -> onnx.ModelProto:
    """ConvNeXtV2's GRN tail, ``h = x @ w; y = grn.weight * h + grn.bias + h``, both zero in a fresh
    model: ``distinct``, or ``merged`` as onnxscript writes it, the Add reading ``grn.weight`` where
    its FX record names ``%p_grn_bias`` (and ``%mul_0``, not the ``mul_1`` it reads: a clone the
    optimizer dropped). ``swapped``: the record's arguments in the other order (the node's inputs
    then do not stand one for one with the call's)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="node_mm"),
             helper.make_node("Mul", ["grn.weight", "h"], ["mul_1"], name="node_mul_1"),
             helper.make_node("Add", ["mul_1", "grn.weight" if form == "merged" else "grn.bias"], ["add_2"],
                              name="node_add_2"),
             helper.make_node("Add", ["add_2", "h"], ["y"], name="node_add_3"),
             helper.make_node("Mul", ["y", "y"], ["z"], name="node_sq"),
             helper.make_node("ReduceSum", ["z"], ["loss"], name="node_sum", keepdims=0)]
    values = {"w": W, "grn.weight": np.zeros(4)} | ({} if form == "merged" else {"grn.bias": np.zeros(4)})
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    call = "%{} : [num_users=1] = call_function[target=torch.ops.aten.{}.Tensor](args = ({}), kwargs = {{}})"
    _as_exported(model, {"node_mul_1": call.format("mul_1", "mul", "%p_grn_weight, %h"),
                         "node_add_2": call.format("add_2", "add", "%p_grn_bias, %mul_0" if swapped
                                                   else "%mul_0, %p_grn_bias")},
                 ("w", "grn.weight", "grn.bias"))
    return model


def test_a_merged_read_pairs_by_position_where_the_inputs_stand_for_the_arguments(caplog):
    """GRN's zero bias merged into its zero weight: the names end unlike (``weight``, ``bias``), but
    the Add's initializer stands where its FX call has its parameter, so input 1 is argument 1,
    ``grn.bias`` (fresh ConvNeXtV2, dynamo: worst gradient error 33 -> 6.6e-07; BEiT's and DINOv2's
    layer scales merged into a norm's weight: 3.5e-02 and 3.0 -> 3.0e-07 and 6.0e-07). Where they
    do not stand so, the read stays merged and the warning names it."""
    params, want = _trains_as(_grn("merged"), _grn("distinct"))
    assert params == ["grn.bias", "grn.weight", "w"]
    assert not np.allclose(want["grn.weight"], want["grn.bias"], rtol=1e-2)
    assert not caplog.text
    params, _, grads = _grads(_grn("merged", swapped=True))
    assert sorted(params) == ["grn.weight", "w"]
    np.testing.assert_allclose(grads["grn.weight"], want["grn.weight"] + want["grn.bias"], rtol=1e-5, atol=1e-6)
    assert "1 parameter(s) torch trains are not in the file (e.g. 'grn.bias')" in caplog.text


def _dropped_biases(form: str) -> onnx.ModelProto:
    """x -> Linear(l1) as Gemm -> Linear(l2) as MatMul on its transposed weight -> Conv(c1) ->
    sum of squares, every bias zero: ``explicit`` biases, or ``dropped`` as onnxscript's optimizer
    writes a fresh model (Gemm and Conv without the bias input, the MatMul without its Add), each
    node's FX node naming the bias torch read."""
    rng = np.random.default_rng(7)
    values = {"l1.weight": rng.standard_normal((4, 4)), "val_2": rng.standard_normal((4, 6)),
              "c1.weight": rng.standard_normal((3, 2, 1, 1))}
    nodes = [helper.make_node("Gemm", ["x", "l1.weight"], ["h"], name="node_addmm", transB=1),
             helper.make_node("MatMul", ["h", "val_2"], ["m"], name="node_linear"),
             helper.make_node("Reshape", ["m", "shape"], ["img"], name="node_view"),
             helper.make_node("Conv", ["img", "c1.weight"], ["c"], name="node_convolution"),
             helper.make_node("Mul", ["c", "c"], ["z"], name="node_mul"),
             helper.make_node("ReduceSum", ["z"], ["loss"], name="node_sum", keepdims=0)]
    if form == "explicit":
        values.update({"l1.bias": np.zeros(4), "l2.bias": np.zeros(6), "c1.bias": np.zeros(3)})
        nodes[0].input.append("l1.bias")
        nodes[3].input.append("c1.bias")
        nodes[1].output[0] = "m0"
        nodes.insert(2, helper.make_node("Add", ["m0", "l2.bias"], ["m"], name="node_add"))
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in values.items()]
    inits.append(numpy_helper.from_array(np.array([2, 2, 3, 1], np.int64), "shape"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8,
                              producer_name="pytorch")
    calls = {"node_addmm": "aten.addmm.default](args = (%p_l1_bias, %x, %t)",
             "node_linear": "aten.linear.default](args = (%h, %p_l2_weight, %p_l2_bias)",
             "node_convolution": "aten.convolution.default](args = (%view, %p_c1_weight, %p_c1_bias, [1, 1], [0, 0], "
                                 "[1, 1], False, [0, 0], 1)"}
    _as_exported(model, {name: f"%{name[5:]} : [num_users=1] = call_function[target=torch.ops.{call}, kwargs = {{}})"
                         for name, call in calls.items()},
                 ("l1.weight", "l1.bias", "l2.weight", "l2.bias", "c1.weight", "c1.bias"))
    vi = helper.make_tensor_value_info("val_2", onnx.TensorProto.FLOAT, [4, 6])  # l2.weight, folded transposed
    entry = vi.metadata_props.add()
    entry.key, entry.value = FOLDED_FROM, "['l2.weight']"
    model.graph.value_info.append(vi)
    return model


def test_zero_biases_the_optimizer_dropped_train_again(caplog):
    caplog.set_level(logging.INFO, logger="passes.onnx_import")
    params, want = _trains_as(_dropped_biases("dropped"), _dropped_biases("explicit"), atol=1e-6)
    assert {"l1.bias", "l2.bias", "c1.bias"} <= set(params)
    assert np.abs(want["l2.bias"]).max() > 1e-2  # a zero bias still gets a gradient
    assert "3 zero bias(es) onnxscript's optimizer dropped train again" in caplog.text


@pytest.mark.parametrize("name, apart", [("gpt2_fresh", 14), ("gpt2_fresh_dynamo", 16)])
def test_fresh_gpt2_trains_exactly_torch_parameters(name, apart):
    """GPT-2 with torch's initial values. TorchScript (eval mode) merged 14 of its 28 parameters
    into others of equal value (each LayerNorm's ones and zeros, the zero projection biases); the
    dynamo export merged 8 and dropped 8 zero biases from their Gemms. Before, memplan trained 14
    and 12 parameters, with gradient errors up to 22x and 3.5x; now torch's 28, with its gradients."""
    path = FRESH / f"{name}.onnx"
    with np.load(path.with_suffix(".npz")) as record:
        dims = {k[4:]: int(record[k]) for k in record.files if k.startswith("dim:")}
        torch_loss = float(record["loss"])
    in_file = {i.name for i in onnx.load(str(path), load_external_data=False).graph.initializer}
    graph = import_model(path, dims)
    trainable = {t.name for t in graph.tensors if t.kind is TensorKind.TRAINABLE}
    assert len(trainable) == 28 and len(trainable - in_file) == apart
    report = gradcheck.fixture_report(path)  # the trainable set is torch's, or it raises
    assert report.loss == pytest.approx(torch_loss, rel=1e-4)
    param, worst = report.worst
    assert worst < 2e-3, f"{name}: {param} off by {worst:.2e}"


def test_a_parameter_the_optimizer_removed_otherwise_is_named(caplog):
    """A parameter torch read (its FX node says so) that the file lacks and memplan cannot put back:
    one warning naming it and optimize=False."""
    model = _dropped_biases("dropped")
    conv = next(n for n in model.graph.node if n.name == "node_convolution")
    conv.metadata_props[0].value = conv.metadata_props[0].value.replace("aten.convolution", "aten.conv_tbc")
    import_model(model)
    assert "1 parameter(s) torch trains are not in the file (e.g. 'c1.bias')" in caplog.text
    assert "optimize=False" in caplog.text


def _norm_twice(form: str, siblings: tuple[str, ...] = ("b.n2",)) -> onnx.ModelProto:
    """GPT-NeoX's attention and MLP LayerNorms of one input (``b.n1``, ``b.n2``), each read by a
    MatMul: ``distinct``, or fresh with equal parameters as onnxscript writes them, ``merged``
    (computed once: ``mm2`` reads ``%layer_norm``'s output where its FX record names
    ``%layer_norm_1``, and ``b.n2``'s parameters are left only in the signature), or as one norm
    read twice (``shared``, its FX records saying so)."""
    rng = np.random.default_rng(11)
    second = "%layer_norm" if form == "shared" else "%layer_norm_1"
    calls = {"ln1": "%layer_norm : [num_users=2] = call_function[target=torch.ops.aten.layer_norm.default]"
                    "(args = (%x, [4], %p_b_n1_weight, %p_b_n1_bias, 1e-05), kwargs = {})",
             "ln2": "%layer_norm_1 : [num_users=1] = call_function[target=torch.ops.aten.layer_norm.default]"
                    "(args = (%x, [4], %p_b_n2_weight, %p_b_n2_bias, 1e-05), kwargs = {})",
             "mm": "%mm : [num_users=1] = call_function[target=torch.ops.aten.mm.default](args = (%layer_norm, %p_w), "
                   "kwargs = {})",
             "mm2": "%mm_1 : [num_users=1] = call_function[target=torch.ops.aten.mm.default](args = "
                    f"({second}, %p_w2), kwargs = {{}})"}
    apart = form == "distinct"
    nodes = [helper.make_node("LayerNormalization", ["x", "b.n1.weight", "b.n1.bias"], ["h"], name="ln1"),
             helper.make_node("MatMul", ["h", "w"], ["m"], name="mm"),
             helper.make_node("MatMul", ["h2" if apart else "h", "w2"], ["m2"], name="mm2"),
             helper.make_node("Add", ["m", "m2"], ["s"], name="add"),
             helper.make_node("Mul", ["s", "s"], ["q"], name="sq"),
             helper.make_node("ReduceSum", ["q"], ["loss"], name="sum", keepdims=0)]
    values = {"b.n1.weight": np.ones(4), "b.n1.bias": np.zeros(4), "w": rng.standard_normal((4, 4)),
              "w2": rng.standard_normal((4, 4))}
    if apart:
        nodes.insert(1, helper.make_node("LayerNormalization", ["x", "b.n2.weight", "b.n2.bias"], ["h2"], name="ln2"))
        values.update({"b.n2.weight": np.ones(4), "b.n2.bias": np.zeros(4)})
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    params = ("b.n1.weight", "b.n1.bias", *(f"{m}.{leaf}" for m in siblings for leaf in ("weight", "bias")), "w", "w2")
    _as_exported(model, calls, params)
    return model


def test_two_calls_computed_once_are_computed_apart(caplog):
    """GPT-NeoX's two LayerNorms of one input, fresh, have equal parameters, and onnxscript computes
    them once. Trained so, ``b.n1`` would get the sum of both gradients and ``b.n2`` none; memplan
    copies the norm for ``mm2``, reading the one module beside ``b.n1`` whose parameters are named
    only in the signature, and trains both as torch does (dynamo GPT-NeoX, fresh: worst gradient
    error 1.6 -> 5.3e-07)."""
    caplog.set_level(logging.INFO, logger="passes.onnx_import")
    params, want = _trains_as(_norm_twice("merged"), _norm_twice("distinct"))
    assert params == ["b.n1.bias", "b.n1.weight", "b.n2.bias", "b.n2.weight", "w", "w2"]
    assert not np.allclose(want["b.n1.weight"], want["b.n2.weight"], rtol=1e-2)  # the split matters
    assert ("1 call(s) onnxscript's optimizer computed once with another of equal parameters are computed apart "
            "again (e.g. %layer_norm_1 of %layer_norm, with b.n2.weight, b.n2.bias)") in caplog.text
    assert "WARNING" not in caplog.text


@pytest.mark.parametrize("form, siblings", [("merged", ("b.n2", "b.n3")), ("merged", ("n2",)), ("shared", ("b.n2",))])
def test_calls_computed_once_that_cannot_be_told_apart_are_named(form, siblings, caplog):
    """Where two modules beside the kept norm could be the second's (``b.n2``, ``b.n3``), or none
    is beside it (``n2``), the calls stay computed once, and one warning names them and
    optimize=False. A parameter only the signature names, with no evidence of two calls computed
    once (``mm2``'s FX record names ``%layer_norm`` itself), is taken for a tie (an LM head's
    weight), silently, and nothing is copied."""
    params, _, grads = _grads(_norm_twice(form, siblings))
    assert sorted(params) == ["b.n1.bias", "b.n1.weight", "w", "w2"]
    _, _, want = _grads(_norm_twice("distinct"))
    np.testing.assert_allclose(grads["b.n1.weight"], want["b.n1.weight"] + want["b.n2.weight"], rtol=1e-5, atol=1e-6)
    said = ("computed %layer_norm and %layer_norm_1 once (node 'mm2' reads it as the second)" in caplog.text
            and "optimize=False" in caplog.text)
    assert said is (form == "merged")
    assert form == "merged" or not caplog.text


def test_one_computation_torch_made_twice_stays_one_and_is_not_warned_of(caplog):
    """onnxscript also computes once what torch computed twice from the same parameters (RWKV's
    ``k + time_first``, twice a time step): ``mm2``'s record names ``%layer_norm_1``, but no module
    with a LayerNorm's parameters is left unnamed, so it was the same norm, which torch trains as
    one: nothing is copied and nothing warned of."""
    params, _, grads = _grads(_norm_twice("merged", siblings=()))
    assert sorted(params) == ["b.n1.bias", "b.n1.weight", "w", "w2"]
    _, _, want = _grads(_norm_twice("distinct"))
    np.testing.assert_allclose(grads["b.n1.weight"], want["b.n1.weight"] + want["b.n2.weight"], rtol=1e-5, atol=1e-6)
    assert not caplog.text


def _attention_biases(form: str) -> onnx.ModelProto:
    """VideoMAE's attention, fresh: ``q = x @ wq + q_bias``, ``k = x @ wk + zeros_like(v_bias)`` (a
    constant, not a parameter), ``o = (q * k) @ wo + dense.bias``, loss = sum(o^2); every bias zero.
    ``merged`` as onnxscript writes it: every Add reads ``attn.q_bias``, the FX records name what
    torch read (``%zeros_like`` is no ONNX value: folded); ``distinct``: the key bias a graph input
    (so not trained) and ``dense.bias`` an initializer of its own."""
    merged = form == "merged"
    nodes = [helper.make_node("MatMul", ["x", "attn.q_weight"], ["a"], name="mm_q"),
             helper.make_node("Add", ["a", "attn.q_bias"], ["q"], name="add_q"),
             helper.make_node("MatMul", ["x", "attn.k_weight"], ["b"], name="mm_k"),
             helper.make_node("Add", ["b", "attn.q_bias" if merged else "k_bias"], ["k"], name="add_k"),
             helper.make_node("Mul", ["q", "k"], ["s"], name="mul"),
             helper.make_node("MatMul", ["s", "dense.weight"], ["c"], name="mm_o"),
             helper.make_node("Add", ["c", "attn.q_bias" if merged else "dense.bias"], ["o"], name="add_o"),
             helper.make_node("Mul", ["o", "o"], ["z"], name="sq"),
             helper.make_node("ReduceSum", ["z"], ["loss"], name="sum", keepdims=0)]
    values = {"attn.q_weight": W, "attn.k_weight": W.T.copy(), "dense.weight": W * 0.5, "attn.q_bias": np.zeros(4)}
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])]
    if not merged:
        values["dense.bias"] = np.zeros(4)
        inputs.append(helper.make_tensor_value_info("k_bias", onnx.TensorProto.FLOAT, [4]))
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if merged:
        call = ("%{} : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = ({}), "
                "kwargs = {{}})")
        linear = {"q": "%x, %p_attn_q_weight, %p_attn_q_bias", "k": "%x, %p_attn_k_weight, %zeros_like",
                  "o": "%mul, %p_dense_weight, %p_dense_bias"}
        _as_exported(model, {f"{op}_{k}": call.format(f"linear_{k}", args) for k, args in linear.items()
                             for op in ("mm", "add")},
                     ("attn.q_weight", "attn.k_weight", "attn.q_bias", "attn.v_bias", "dense.weight", "dense.bias"))
    return model


def test_a_constant_merged_into_a_parameter_is_read_as_the_constant_and_biases_pair_by_last_word(caplog):
    """Fresh VideoMAE (dynamo): its key bias, ``zeros_like(v_bias)``, folded and merged into the
    zero ``q_bias``, trained as q_bias; and the output projection's ``dense.bias``, merged into it
    too, did not pair with a read of ``q_bias`` (names ending unlike): q_bias 223 off torch. The
    key bias is now a constant (no parameter, no gradient) and ``dense.bias`` trains apart."""
    caplog.set_level(logging.INFO, logger="passes.onnx_import")
    step = build_training_graph(import_model(_attention_biases("merged")))
    loss, grads = gradcheck.run_training_step(step, FEEDS)
    want_step = build_training_graph(import_model(_attention_biases("distinct")))
    want_loss, want = gradcheck.run_training_step(want_step, {**FEEDS, "k_bias": np.zeros(4, np.float32)})
    assert sorted(step.params) == sorted(want_step.params) == ["attn.k_weight", "attn.q_bias", "attn.q_weight",
                                                               "dense.bias", "dense.weight"]
    assert loss == pytest.approx(want_loss, rel=1e-6)
    for name in want:
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert "1 read(s) of a parameter where torch read a constant of equal value instead are read as that " \
           "constant (e.g. 'linear_k_constant' for 'attn.q_bias')" in caplog.text


def test_a_parameter_no_call_names_is_not_taken_for_a_merged_constant():
    """Where no FX record names the parameter read (the read may be the parameter through a view
    the translation dropped, ``addmm(%b, %x, %t)`` reading the weight for ``%t``), every read of it
    trains it."""
    model = _attention_biases("merged")
    for node in model.graph.node:
        if node.name in ("mm_q", "add_q"):
            node.metadata_props[0].value = node.metadata_props[0].value.replace("%p_attn_q_bias", "%view_q")
    graph = import_model(model)
    readers = [n.name for n in graph.nodes if any(graph.tensors[i].name == "attn.q_bias" for i in n.inputs)]
    assert "add_k" in readers and "add_q" in readers


def _folded_scales(form: str, params: tuple[str, ...] | None = None, third: bool = False) -> onnx.ModelProto:
    """Gemma's RMSNorm scale ``1 + weight`` twice, around a MatMul: ``x * add_1 @ w * add_3``, each
    ``add_*`` folded by onnxscript from a fresh (zero) weight into ones, ``folded_from`` it and a
    constant. ``distinct`` initializers, or ``merged`` as the optimizer writes equal folded values:
    ``add_1`` only, which both Muls read, the second's FX record naming ``%add_3``. ``params``: the
    signature's (``n1.weight``, ``n2.weight``, ... and ``w``); without ``n2.weight`` the second scale
    was computed from ``n1.weight`` again (a shared norm). ``third``: a third scale, ``add_5``."""
    scales = ["add_1", "add_3"] + (["add_5"] if third else [])
    params = params or (*(f"n{k + 1}.weight" for k in range(len(scales))), "w")
    merged = form == "merged"
    nodes = [helper.make_node("Mul", ["x", "add_1"], ["mul_2"], name="node_mul_2"),
             helper.make_node("MatMul", ["mul_2", "w"], ["mm"], name="node_mm")]
    last = "mm"
    for k, scale in enumerate(scales[1:]):
        nodes.append(helper.make_node("Mul", [last, "add_1" if merged else scale], [f"mul_{k + 5}"],
                                      name=f"node_mul_{k + 5}"))
        last = f"mul_{k + 5}"
    nodes += [helper.make_node("Mul", [last, last], ["sq"], name="node_sq"),
              helper.make_node("ReduceSum", ["sq"], ["loss"], name="node_sum", keepdims=0)]
    values = {"w": W} | {scale: np.ones(4) for scale in (scales[:1] if merged else scales)}
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    call = "%{} : [num_users=1] = call_function[target=torch.ops.aten.{}](args = (%{}, %{}), kwargs = {{}})"
    calls = {"node_mul_2": call.format("mul_2", "mul.Tensor", "x", "add_1"),
             "node_mm": call.format("mm", "mm.default", "mul_2", "p_w")}
    last = "mm"
    for k, scale in enumerate(scales[1:]):
        calls[f"node_mul_{k + 5}"] = call.format(f"mul_{k + 5}", "mul.Tensor", last, scale)
        last = f"mul_{k + 5}"
    _as_exported(model, calls, params)
    for scale in values:
        vi = helper.make_tensor_value_info(scale, onnx.TensorProto.FLOAT, [4] if scale != "w" else [4, 4])
        entry = vi.metadata_props.add()
        if scale == "w":
            entry.key, entry.value = TORCH_INPUT_KIND, "PARAMETER"
        else:
            entry.key, entry.value = FOLDED_FROM, repr([f"n{scales.index(scale) + 1}.weight", "val_0"])
        model.graph.value_info.append(vi)
    return model


def test_folded_values_merged_for_equal_values_train_apart(caplog):
    """Fresh RecurrentGemma (dynamo): seven ``1 + weight`` RMSNorm scales folded into ones and merged
    into ``add_1``, four zero gate biases into ``unsqueeze_7``. The second Mul's FX record names
    ``%add_3``, which nothing in the file holds, and ``n2.weight`` is in neither the file nor any
    record: ``add_3`` trains on its own, as ``distinct`` does (fresh RecurrentGemma: worst gradient
    error against torch's traced forward 0.85 -> 4.2e-07). Trained as one, ``add_1`` got the sum."""
    params, want = _trains_as(_folded_scales("merged"), _folded_scales("distinct"))
    assert params == ["add_1", "add_3", "w"]
    assert not np.allclose(want["add_1"], want["add_1"] + want["add_3"], rtol=1e-2)  # the split matters
    assert ("1 value(s) onnxscript's constant folding computed from parameters and merged into another of equal "
            "value train on their own (e.g. 'add_3', merged into 'add_1')") in caplog.text
    assert "(e.g. 'n2.weight'), so each trains under its FX name" in caplog.text


@pytest.mark.parametrize("params, third", [(("n1.weight", "w"), False), (("n1.weight", "n2.weight", "w"), True)])
def test_folded_values_merged_without_as_many_missing_parameters_stay_merged(params, third, caplog):
    """With every parameter in the file or some FX record, the merged values were computed from the
    same parameters (a shared norm), which torch trains as one: nothing is split or warned of
    beyond the folding itself. Two merged values (``add_3``, ``add_5``) and one parameter missing:
    which were computed from one parameter is unknown, so they stay merged, with a warning."""
    got, _, grads = _grads(_folded_scales("merged", params, third))
    assert sorted(got) == ["add_1", "w"]
    _, _, want = _grads(_folded_scales("distinct", third=third))
    total = sum(want[name] for name in want if name.startswith("add_"))
    np.testing.assert_allclose(grads["add_1"], total, rtol=1e-5, atol=1e-6)
    assert "train on their own" not in caplog.text
    said = ("onnxscript's optimizer merged 2 folded value(s) into others of equal value (e.g. 'add_3' into 'add_1'), "
            "more than the 1 parameter(s)") in caplog.text
    assert said is third


def test_the_folding_warning_names_the_value_folded_from_the_most(caplog):
    """Of the folded values, the warning's example is the one computed from the most values, the
    likeliest to be more than a reshape or a shift: RecurrentGemma's ``softplus`` of its
    ``recurrent_param`` (and 10 other values), not the first of its ``1 + weight`` scales."""
    model = _folded_scales("distinct")
    vi = next(v for v in model.graph.value_info if v.name == "add_3")
    vi.metadata_props[0].value = repr(["n2.weight", "beta", "threshold", "tmp"])
    import_model(model)
    assert "2 initializer(s) hold what onnxscript's constant folding computed from parameters (e.g. 'add_3' " \
           "from 'n2.weight' and 3 other value(s))" in caplog.text


def _tokens(extra: tuple[str, ...] = ()) -> onnx.ModelProto:
    """DeiT's embeddings, fresh: ``cat([cls_token.expand(2, -1, -1), dist_token.expand(2, -1, -1),
    (x @ w)[:, None]], 1)``, both tokens zero, as onnxscript writes it: one Expand of ``cls_token``
    (the second computed once with it, ``dist_token`` named only in the signature), read twice by
    the Concat, whose FX record names ``%expand`` and ``%expand_1``. loss = sum(cat * r). ``extra``:
    more parameters named only in the signature."""
    rec = "%{} : [num_users=1] = call_function[target=torch.ops.aten.{}.default](args = ({}), kwargs = {{}})"
    nodes = [helper.make_node("Expand", ["emb.cls_token", "shape"], ["expand"], name="node_expand"),
             helper.make_node("MatMul", ["x", "w"], ["mm"], name="node_mm"),
             helper.make_node("Unsqueeze", ["mm", "one"], ["unsqueeze"], name="node_unsqueeze"),
             helper.make_node("Concat", ["expand", "expand", "unsqueeze"], ["cat"], name="node_cat", axis=1),
             helper.make_node("Mul", ["cat", "r"], ["weighted"], name="node_mul"),
             helper.make_node("ReduceSum", ["weighted"], ["loss"], name="node_sum", keepdims=0)]
    inits = [numpy_helper.from_array(np.zeros((1, 1, 4), np.float32), "emb.cls_token"),
             numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.array([2, 1, 4], np.int64), "shape"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4]),
                                           helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _as_exported(model, {"node_expand": rec.format("expand", "expand", "%p_emb_cls_token, [2, -1, -1]"),
                         "node_mm": rec.format("mm", "mm", "%x, %p_w"),
                         "node_unsqueeze": rec.format("unsqueeze", "unsqueeze", "%mm, 1"),
                         "node_cat": rec.format("cat", "cat", "[%expand, %expand_1, %unsqueeze], 1")},
                 ("emb.cls_token", "emb.dist_token", "w", *extra))
    return model


def test_a_lone_parameter_expanded_once_with_its_siblings_trains_apart(caplog):
    """Fresh DeiT and AST (dynamo): the class and distillation tokens, both zero, expanded once and
    read twice by the Concat; the class token trained with both positions' gradients (1.0 off
    torch). The Concat's inputs stand one for one with its record's arguments, so its second input
    is ``%expand_1``, computed again from the one parameter of the module named only in the
    signature that ends like ``cls_token``."""
    caplog.set_level(logging.INFO, logger="passes.onnx_import")
    r = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    step = build_training_graph(import_model(_tokens()))
    _, grads = gradcheck.run_training_step(step, {**FEEDS, "r": r})
    assert sorted(step.params) == ["emb.cls_token", "emb.dist_token", "w"]
    np.testing.assert_allclose(grads["emb.cls_token"][0, 0], r[:, 0].sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(grads["emb.dist_token"][0, 0], r[:, 1].sum(axis=0), rtol=1e-6)
    assert "%expand_1 of %expand, with emb.dist_token" in caplog.text


@pytest.mark.parametrize("extra, apart", [(("emb.reg_token",), False), (("emb.mask_embedding",), True)])
def test_a_lone_parameter_stays_computed_once_where_its_sibling_is_unclear(extra, apart, caplog):
    """Two tokens of the module named only in the signature (a register token beside the
    distillation token): which the second expand took is unknown, so the Expand stays one and the
    warning says so. A sibling ending otherwise (``mask_embedding``) is no candidate: the
    distillation token is the one."""
    step = build_training_graph(import_model(_tokens(extra)))
    assert ("emb.dist_token" in step.params) is apart
    assert ("computed %expand and %expand_1 once" in caplog.text) is not apart
