"""LSTM / GRU / RNN unrolling (passes/rnn.py): forward equal to ORT's fused kernels, gradients
against finite differences, the CLI's training path, and the refusals."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

import cli
from gradcase import check_gradients, node
from passes import gradcheck
from passes.autodiff import TrainOptions, build_training_graph
from passes.onnx_export import export_model
from passes.onnx_import import import_model
from passes.rnn import unroll_recurrent
from planner.errors import ModelImportError

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
SLOTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")


def rnd(*shape, seed=0):
    return np.random.default_rng(seed + 31 * len(shape) + sum(shape)).standard_normal(shape) * 0.7


def operands(op, *, T=3, B=2, I=2, H=3, nd=1, layout=0, bias=True, init_h=False, init_c=False, peep=False,
             seed=0) -> dict[str, np.ndarray]:
    """Random operands of one node, by input name (float64)."""
    g = GATES[op]
    vals = {"X": rnd(*((B, T, I) if layout else (T, B, I)), seed=seed),
            "W": rnd(nd, g * H, I, seed=seed + 1), "R": rnd(nd, g * H, H, seed=seed + 2)}
    state = (B, nd, H) if layout else (nd, B, H)
    if bias:
        vals["B"] = rnd(nd, 2 * g * H, seed=seed + 3)
    if init_h:
        vals["initial_h"] = rnd(*state, seed=seed + 4)
    if init_c:
        vals["initial_c"] = rnd(*state, seed=seed + 5)
    if peep:
        vals["P"] = rnd(nd, 3 * H, seed=seed + 6)
    return vals


def input_names(vals) -> list[str]:
    """The node's input list: present names, '' for skipped optional slots, trailing ones dropped."""
    names = [s if s in vals else "" for s in SLOTS]
    while names[-1] == "":
        names.pop()
    return names


def one_node_model(op, vals, outputs, consts=None, opset=14, **attrs) -> onnx.ModelProto:
    """Every operand a float32 graph input (``consts`` become initializers)."""
    consts = consts or {}
    n = helper.make_node(op, input_names({**vals, **consts}), list(outputs), **attrs)
    ins = [helper.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape) for k, v in vals.items()]
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs if o]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    model = helper.make_model(helper.make_graph([n], "rnn", ins, outs, initializer=inits),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run_both(model, vals, reference=None):
    """(ORT's fused node, the unrolled graph in ORT) outputs for the same float32 feeds.

    ``reference`` (model, feeds -> outputs) replaces running ``model`` itself in ORT."""
    feeds = {k: v.astype(np.float32) for k, v in vals.items()}
    graph = import_model(model)
    unrolled = unroll_recurrent(graph)
    assert not any(n.op_type in GATES for n in unrolled.nodes)
    names = [graph.tensors[t].name for t in graph.outputs]
    want = reference(feeds) if reference else gradcheck.ort_session(model).run(names, feeds)
    got = gradcheck.ort_session(export_model(unrolled)).run(names, feeds)
    return want, got


def layout0_reference(op, outs, consts, attrs):
    """ORT's CPU kernels refuse layout=1: run layout 0 on transposed operands, transpose back."""
    attrs = {k: v for k, v in attrs.items() if k != "layout"}
    batch_major = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
    back = {"Y": (2, 0, 1, 3), "Y_h": (1, 0, 2), "Y_c": (1, 0, 2)}

    def run(feeds):
        feeds = {k: v.transpose(batch_major[k]) if k in batch_major else v for k, v in feeds.items()}
        model = one_node_model(op, feeds, outs, consts, **attrs)
        got = gradcheck.ort_session(model).run([o for o in outs if o], feeds)
        return [v.transpose(back[o]) for o, v in zip([o for o in outs if o], got)]

    return run


FORWARD = {
    # id: (op, operand options, attributes)
    "lstm_forward": ("LSTM", {}, {}),
    "lstm_reverse": ("LSTM", {}, {"direction": "reverse"}),
    "lstm_bidirectional": ("LSTM", {"nd": 2, "init_h": True, "init_c": True, "peep": True},
                           {"direction": "bidirectional"}),
    "lstm_layout1": ("LSTM", {"layout": 1, "init_h": True, "init_c": True, "nd": 2},
                     {"layout": 1, "direction": "bidirectional"}),
    "lstm_peephole_init": ("LSTM", {"init_h": True, "init_c": True, "peep": True}, {}),
    "lstm_no_bias": ("LSTM", {"bias": False}, {}),
    "lstm_clip_input_forget": ("LSTM", {"peep": True}, {"clip": 0.5, "input_forget": 1}),
    "lstm_activations": ("LSTM", {}, {"activations": ["HardSigmoid", "LeakyRelu", "Softsign"],
                                      "activation_alpha": [0.3, 0.05], "activation_beta": [0.4]}),
    "lstm_more_activations": ("LSTM", {}, {"activations": ["Elu", "ScaledTanh", "Affine"],
                                           "activation_alpha": [0.9, 1.2, 0.5], "activation_beta": [0.8, 0.1]}),
    # f = i = 1 lets the cell state grow past clip: ORT (and the spec) clip activation inputs, not C
    "lstm_clip_leaves_cell_state": ("LSTM", {"T": 4}, {"clip": 0.05, "activations": ["Affine", "Tanh", "Tanh"],
                                                       "activation_alpha": [0.0], "activation_beta": [1.0]}),
    "lstm_seq1": ("LSTM", {"T": 1}, {}),
    # opset 9: Split/Clip take attributes, Gemm needs C (the unbiased GRU Gemm becomes a MatMul)
    "lstm_opset9_clip": ("LSTM", {"init_h": True, "init_c": True, "peep": True, "nd": 2},
                         {"clip": 0.6, "direction": "bidirectional", "opset": 9}),
    "gru_opset9_lbr_no_bias": ("GRU", {"bias": False}, {"linear_before_reset": 1, "opset": 9}),
    "gru_forward": ("GRU", {}, {}),
    "gru_lbr": ("GRU", {"init_h": True}, {"linear_before_reset": 1}),
    "gru_lbr_no_bias": ("GRU", {"bias": False}, {"linear_before_reset": 1}),
    "gru_bidirectional_layout1": ("GRU", {"nd": 2, "layout": 1, "init_h": True},
                                  {"direction": "bidirectional", "layout": 1}),
    "gru_reverse_lbr_clip": ("GRU", {"init_h": True}, {"direction": "reverse", "linear_before_reset": 1,
                                                       "clip": 0.4}),
    "rnn_forward": ("RNN", {}, {}),
    "rnn_bidirectional_relu": ("RNN", {"nd": 2, "init_h": True},
                               {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}),
    "rnn_layout1_reverse": ("RNN", {"layout": 1, "init_h": True}, {"layout": 1, "direction": "reverse"}),
    "rnn_thresholded_softplus": ("RNN", {"nd": 2}, {"direction": "bidirectional",
                                                    "activations": ["ThresholdedRelu", "Softplus"],
                                                    "activation_alpha": [0.1]}),
}


@pytest.mark.parametrize("case", sorted(FORWARD))
def test_unrolled_forward_matches_ort(case):
    op, opts, attrs = FORWARD[case]
    vals = operands(op, **opts)
    H = vals["R"].shape[-1]
    outs = ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]
    attrs = {"hidden_size": H, "opset": 14, **attrs}
    reference = layout0_reference(op, outs, None, attrs) if attrs.get("layout") else None
    want, got = run_both(one_node_model(op, vals, outs, **attrs), vals, reference)
    for name, w, g in zip(outs, want, got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=name)


def test_output_subsets_and_constant_full_lengths():
    """Only Y_c wanted; a constant sequence_lens equal to the full length is accepted."""
    vals = operands("LSTM", T=4)
    lens = {"sequence_lens": np.full(2, 4, dtype=np.int32)}
    model = one_node_model("LSTM", vals, ["", "", "Y_c"], consts=lens, hidden_size=3)
    want, got = run_both(model, vals)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


# ---- gradients ---------------------------------------------------------------------------------------
GRADIENTS = {
    "lstm_peephole_bidirectional": ("LSTM", {"nd": 2, "peep": True, "init_h": True, "init_c": True, "T": 2},
                                    {"direction": "bidirectional"}, ["Y", "Y_c"]),
    "lstm_reverse_layout1": ("LSTM", {"layout": 1}, {"layout": 1, "direction": "reverse"}, ["Y", "Y_h"]),
    "gru": ("GRU", {"init_h": True}, {}, ["Y"]),
    "gru_lbr_bidirectional": ("GRU", {"nd": 2, "T": 2}, {"linear_before_reset": 1, "direction": "bidirectional"},
                              ["Y", "Y_h"]),
    "rnn": ("RNN", {"init_h": True}, {}, ["Y", "Y_h"]),
}


@pytest.mark.parametrize("case", sorted(GRADIENTS))
def test_gradients_match_finite_differences(case, monkeypatch):
    """W, R, B (P, initial states) trainable; X a graph input. The training graph is built from the
    fused node (through autodiff's hook); ORT has no float64 LSTM/GRU kernel, so the finite differences
    run the unrolled forward in float64 (the tests above pin it to ORT's fused float32 kernels)."""
    evaluate, loads = gradcheck.loss_evaluator, gradcheck.has_float64_kernels
    monkeypatch.setattr(gradcheck, "loss_evaluator",
                        lambda forward, *args, **kw: evaluate(unroll_recurrent(forward), *args, **kw))
    monkeypatch.setattr(gradcheck, "has_float64_kernels", lambda forward: loads(unroll_recurrent(forward)))
    op, opts, attrs, wanted = GRADIENTS[case]
    vals = operands(op, B=2, H=2, **opts)
    outs = [o if o in wanted else "" for o in (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])]
    while not outs[-1]:
        outs.pop()
    x = vals.pop("X")
    nodes = [node(op, ["X", *input_names(vals)[1:]], outs, hidden_size=2, **attrs)]
    check_gradients(nodes, vals, outputs=wanted, inputs={"X": x}, opset=14)


# ---- through the training path -----------------------------------------------------------------------
def lstm_loss_model(seq_lens_input: bool = False, T=4, B=2, I=3, H=3) -> onnx.ModelProto:
    """X -> LSTM -> MatMul head -> mean squared value: a scalar loss."""
    vals = operands("LSTM", T=T, B=B, I=I, H=H)
    x = vals.pop("X")
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in vals.items()]
    inits.append(numpy_helper.from_array(rnd(H, 1).astype(np.float32), "head"))
    ins = [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, x.shape)]
    lstm_inputs = ["X", "W", "R", "B"]
    if seq_lens_input:
        ins.append(helper.make_tensor_value_info("lens", onnx.TensorProto.INT32, [B]))
        lstm_inputs.append("lens")
    nodes = [
        helper.make_node("LSTM", lstm_inputs, ["Y", "Y_h"], name="lstm", hidden_size=H),
        helper.make_node("MatMul", ["Y_h", "head"], ["score"]),
        helper.make_node("Mul", ["score", "score"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0),
    ]
    out = [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])]
    model = helper.make_model(helper.make_graph(nodes, "lstm_loss", ins, out, initializer=inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_training_step_unrolls_lstm_and_keeps_loss():
    graph = import_model(lstm_loss_model())
    step = build_training_graph(graph)
    assert sorted(step.params) == ["B", "R", "W", "head"]
    assert not any(n.op_type == "LSTM" for n in step.graph.nodes)
    x = rnd(4, 2, 3).astype(np.float32)
    loss, grads = gradcheck.run_training_step(step, {"X": x})
    (want,) = gradcheck.ort_session(lstm_loss_model()).run(["loss"], {"X": x})
    assert loss == pytest.approx(float(want), rel=1e-5)
    assert all(np.all(np.isfinite(g)) and np.any(g != 0) for g in grads.values())


def test_frozen_lstm_is_left_fused():
    """No gradient flows through a frozen LSTM: it stays one node (ORT runs it), so even a form the
    unrolling refuses (run-time sequence_lens) trains the layers after it."""
    step = build_training_graph(import_model(lstm_loss_model(seq_lens_input=True)),
                                TrainOptions(freeze=("W", "R", "B")))
    assert step.params == ("head",)
    assert [n.op_type for n in step.graph.nodes].count("LSTM") == 1


def test_cli_plans_lstm_training_step(tmp_path):
    """`memplan plan` plans the unrolled step below its unplanned peak; `memplan verify` runs it. (Batch 32: at batch 2 the
    weights and their gradients are most of the peak and no plan reaches 80%.)"""
    path = tmp_path / "lstm.onnx"
    onnx.save(lstm_loss_model(B=32), path)
    planned = tmp_path / "lstm.planned.onnx"
    result = CliRunner().invoke(cli.main, ["plan", str(path), "--budget", "80%", "--json", "--workers", "1",
                                           "--time-limit", "2", "--emit", str(planned)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["status"] in ("optimal", "feasible")
    assert plan["peak_bytes"] <= plan["budget_bytes"] < plan["unplanned_peak_bytes"]
    # the planned step (recomputes included) gives the unplanned step's loss and gradients, bit for bit
    result = CliRunner().invoke(cli.main, ["verify", str(path), str(planned), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["outputs_equal"] is True
    assert sorted(o["name"] for o in report["outputs"] if o["ok"]) == ["B_grad", "R_grad", "W_grad", "head_grad", "loss"]


def test_cli_refuses_runtime_sequence_lens(tmp_path):
    path = tmp_path / "lstm_lens.onnx"
    onnx.save(lstm_loss_model(seq_lens_input=True), path)
    result = CliRunner().invoke(cli.main, ["plan", str(path), "--budget", "80%"])
    assert result.exit_code == 3
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memplan: error: node 'lstm' (LSTM): sequence_lens")
    assert "computed at run time" in lines[0]


# ---- refusals ---------------------------------------------------------------------------------------
REFUSED = {
    "short_lengths": ({"consts": {"sequence_lens": np.array([3, 2], np.int32)}}, {}, "not the full length"),
    "unknown_activation": ({}, {"activations": ["Sigmoid", "Gelu", "Tanh"]}, "activation 'Gelu' is unknown"),
    "activation_count": ({}, {"activations": ["Sigmoid", "Tanh"]}, "give 3 per direction"),
    "defaulted_alpha": ({}, {"activations": ["Sigmoid", "Affine", "Tanh"]}, "activation_alpha"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals_name_the_node(case):
    extra, attrs, message = REFUSED[case]
    vals = operands("LSTM")
    model = one_node_model("LSTM", vals, ["Y"], hidden_size=3, **extra, **attrs)
    model.graph.node[0].name = "enc"
    with pytest.raises(ModelImportError, match=message) as err:
        unroll_recurrent(import_model(model))
    assert str(err.value).startswith("node 'enc' (LSTM): ")
