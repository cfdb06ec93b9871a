"""--add-loss: a model that ends in predictions gets the training step of a model with that loss."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import cli
from passes.autodiff import TrainOptions, build_training_graph
from passes.gradcheck import run_training_step
from passes.loss import append_loss
from passes.onnx_import import load_graph
from planner.errors import UsageError
from tests.helpers import parse_model

# A small classifier exported for inference: logits out, no loss.
BODY = """
    h = MatMul(x, W1)
    a = Tanh(h)
    logits = MatMul(a, W2)
"""
WEIGHTS = "<float[6,8] W1 = {%s}, float[8,4] W2 = {%s}>" % (
    ", ".join(f"{v:.3f}" for v in np.linspace(-0.9, 0.9, 48)),
    ", ".join(f"{v:.3f}" for v in np.cos(np.arange(32)) * 0.5))
HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
LOGITS = f"{HEAD}\nclassifier (float[5,6] x) => (float[5,4] logits) {WEIGHTS}\n{{{BODY}}}"
# The same model with each loss written by hand, as --add-loss documents it.
BY_HAND = {
    "cross-entropy": f"""{HEAD}
classifier (float[5,6] x, int64[5] logits_labels) => (float loss) {WEIGHTS}
{{{BODY}    loss = SoftmaxCrossEntropyLoss <reduction = "mean"> (logits, logits_labels)
}}""",
    "mse": f"""{HEAD}
classifier (float[5,6] x, float[5,4] logits_target) => (float loss) {WEIGHTS}
{{{BODY}    e = Sub(logits, logits_target)
    s = Mul(e, e)
    loss = ReduceMean <keepdims = 0> (s)
}}""",
    "mean": f"""{HEAD}
classifier (float[5,6] x) => (float loss) {WEIGHTS}
{{{BODY}    loss = ReduceMean <keepdims = 0> (logits)
}}""",
}
FEEDS = {"x": np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32),
         "logits_labels": np.array([0, 3, 1, 2, 3], np.int64),
         "logits_target": np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)}


# Deeper, with a batch dim to bind: activations outweigh the weights, so a plan can save memory.
DEEP = f"""{HEAD}
deep (float[N,6] x) => (float[N,4] logits) {WEIGHTS}
{{
    h1 = MatMul(x, W1)
    a1 = Tanh(h1)
    h2 = Mul(a1, a1)
    a2 = Sigmoid(h2)
    h3 = Add(a2, a1)
    a3 = Tanh(h3)
    logits = MatMul(a3, W2)
}}"""


@pytest.fixture
def logits_file(tmp_path):
    path = tmp_path / "classifier.onnx"
    onnx.save(parse_model(LOGITS), path)
    return path


@pytest.fixture
def deep_file(tmp_path):
    path = tmp_path / "deep.onnx"
    onnx.save(parse_model(DEEP), path)
    return path


@pytest.mark.parametrize("kind", ["cross-entropy", "mse", "mean"])
def test_the_added_loss_trains_like_the_same_loss_written_in_the_model(kind):
    added = build_training_graph(load_graph(parse_model(LOGITS)), TrainOptions(add_loss=kind))
    by_hand = build_training_graph(load_graph(parse_model(BY_HAND[kind])))
    names = [added.graph.tensors[t].name for t in added.graph.inputs]
    assert names == [t.name for t in (by_hand.graph.tensors[i] for i in by_hand.graph.inputs)]
    assert [added.graph.tensors[t].name for t in added.graph.outputs][0] == "loss"
    loss, grads = run_training_step(added, FEEDS)
    want_loss, want = run_training_step(by_hand, FEEDS)
    assert loss == want_loss and np.isfinite(loss)
    assert sorted(grads) == ["W1", "W2"]
    for name in grads:
        np.testing.assert_array_equal(grads[name], want[name])
        assert np.abs(grads[name]).max() > 0


def test_cross_entropy_on_a_model_older_than_its_op_upgrades_the_model(caplog):
    """SoftmaxCrossEntropyLoss is opset 12: an opset-11 model is upgraded first (onnx's version
    converter), and trains as the same model written at opset 17 does."""
    old = LOGITS.replace('"" : 17', '"" : 11')
    added = build_training_graph(load_graph(parse_model(old)), TrainOptions(add_loss="cross-entropy"))
    assert "upgraded 'classifier' from opset 11 to 16" in caplog.text
    assert added.graph.opsets[""] == 16
    loss, grads = run_training_step(added, FEEDS)
    want_loss, want = run_training_step(build_training_graph(load_graph(parse_model(BY_HAND["cross-entropy"]))), FEEDS)
    assert loss == want_loss
    for name in want:
        np.testing.assert_array_equal(grads[name], want[name])


def test_cross_entropy_last_reads_a_language_models_logits_as_rows_of_classes():
    seq = LOGITS.replace("float[5,6] x", "float[2,3,6] x").replace("float[5,4] logits", "float[2,3,4] logits")
    # the same loss written another way: classes moved to axis 1, where SoftmaxCrossEntropyLoss wants them
    by_hand = seq.replace("(float[2,3,6] x) => (float[2,3,4] logits)",
                          "(float[2,3,6] x, int64[2,3] logits_labels) => (float loss)").replace(
        "logits = MatMul(a, W2)", "logits = MatMul(a, W2)\n    t = Transpose <perm = [0, 2, 1]> (logits)\n"
        '    loss = SoftmaxCrossEntropyLoss <reduction = "mean"> (t, logits_labels)')
    added = build_training_graph(load_graph(parse_model(seq)), TrainOptions(add_loss="cross-entropy-last"))
    assert added.graph.tensor("logits_labels").shape == (2, 3)
    assert [n.op_type for n in added.graph.nodes].count("Transpose") == 0  # rows through a Reshape, no copy
    feeds = {"x": np.random.default_rng(2).standard_normal((2, 3, 6)).astype(np.float32),
             "logits_labels": np.array([[0, 3, 1], [2, 2, 3]], np.int64)}
    loss, grads = run_training_step(added, feeds)
    want_loss, want = run_training_step(build_training_graph(load_graph(parse_model(by_hand))), feeds)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    for name in ("W1", "W2"):
        np.testing.assert_allclose(grads[name], want[name], rtol=1e-5, atol=1e-7)
    with pytest.raises(UsageError, match=r"needs class scores of shape \[N, C, \.\.\.\]"):
        append_loss(load_graph(parse_model(seq.replace("float[2,3,4] logits", "float[2,1,4] logits")
                                           .replace("float[2,3,6] x", "float[2,1,6] x"))), "cross-entropy")


def test_the_loss_is_the_only_output_and_the_logits_die_after_it():
    graph, loss = append_loss(load_graph(parse_model(LOGITS)), "cross-entropy:logits")
    assert loss == "loss" and [graph.tensors[t].name for t in graph.outputs] == ["loss"]
    labels = graph.tensor("logits_labels")
    assert labels.dtype == "int64" and labels.shape == (5,)
    assert graph.tensors[graph.outputs[0]].shape == ()
    # no longer a graph output, the logits are freed once their one reader, the loss, has run
    readers = graph.consumers[graph.tensor("logits").id]
    assert [graph.nodes[r].op_type for r in readers] == ["SoftmaxCrossEntropyLoss"]


@pytest.mark.parametrize("spec, words", [
    ("hinge", "must be one of cross-entropy, cross-entropy-last, mse, mean"),
    ("mse:probs", "'probs' is not an output of 'classifier'; outputs: logits"),
])
def test_bad_specs_are_one_line_usage_errors(spec, words):
    with pytest.raises(UsageError, match=words):
        append_loss(load_graph(parse_model(LOGITS)), spec)


def test_a_model_with_a_loss_or_two_outputs_must_say_which_output():
    with pytest.raises(UsageError, match="already ends in a scalar, 'loss'"):
        append_loss(load_graph(parse_model(BY_HAND["mean"])), "mse")
    two = LOGITS.replace("=> (float[5,4] logits)", "=> (float[5,4] logits, float[5,8] a)")
    with pytest.raises(UsageError, match=r"2 float outputs \(logits\[5, 4\], a\[5, 8\]\); name the one"):
        append_loss(load_graph(parse_model(two)), "mse")
    graph, _ = append_loss(load_graph(parse_model(two)), "mse:a")
    assert graph.tensor("a_target").shape == (5, 8)
    per_row = LOGITS.replace("=> (float[5,4] logits)", "=> (float[5] r)").replace(
        "logits = MatMul(a, W2)", "logits = MatMul(a, W2)\n    axes = Constant <value = int64[1] {1}> ()\n"
        "    r = ReduceSum <keepdims = 0> (logits, axes)")
    graph = load_graph(parse_model(per_row))
    assert graph.tensor("r").shape == (5,)
    with pytest.raises(UsageError, match=r"output 'r' has shape \[5\]; it needs class scores of shape \[N, C, ...\]"):
        append_loss(graph, "cross-entropy")
    assert append_loss(graph, "mse")[0].tensor("r_target").shape == (5,)
    ints = LOGITS.replace("=> (float[5,4] logits)", "=> (int64[5] k)").replace(
        "logits = MatMul(a, W2)", "logits = MatMul(a, W2)\n    k = ArgMax <axis = 1, keepdims = 0> (logits)")
    with pytest.raises(UsageError, match=r"has no float output \(outputs: k \(int64\)\), so there is nothing"):
        append_loss(load_graph(parse_model(ints)), "mean")


def test_plan_emit_and_verify_a_model_without_a_loss(deep_file, tmp_path):
    runner = CliRunner()
    out, plan = tmp_path / "planned.onnx", tmp_path / "plan.json"
    res = runner.invoke(cli.main, ["plan", str(deep_file), "--dim", "N=256", "--budget", "90%", "--add-loss",
                                   "cross-entropy", "--time-limit", "5", "--emit", str(out), "-o", str(plan)])
    assert res.exit_code == 0, res.output
    assert "loss          added: cross-entropy (the step's only output)" in res.output
    obj = json.loads(plan.read_text())
    assert obj["train"] == {"optimizer": "none", "lr": 0.01, "add_loss": "cross-entropy"}
    assert obj["peak_bytes"] <= obj["budget_bytes"] < obj["unplanned_peak_bytes"]
    # verify rebuilds the same step from what the planned file records
    res = runner.invoke(cli.main, ["verify", str(deep_file), str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["outputs_equal"]
    assert sorted(o["name"] for o in report["outputs"]) == ["W1_grad", "W2_grad", "loss"]
    if report["measured_by"] == "allocator":
        # the counted peak is held against the plan's budget: within it, and over an edited one
        assert report["budget"]["within"] and report["budget"]["budget_bytes"] == obj["budget_bytes"]
        model = onnx.load(str(out))
        entry = next(p for p in model.metadata_props if p.key == "memplan.plan")
        made = json.loads(entry.value)
        made["budget_bytes"] = report["planned"]["peak_bytes"] - 64
        entry.value = json.dumps(made)
        tight = tmp_path / "tight.onnx"
        onnx.save(model, str(tight))
        res = runner.invoke(cli.main, ["verify", str(deep_file), str(tight)])
        assert res.exit_code == 1 and "OVER it by 64 B" in res.output, res.output
    # and so does rewrite from the plan JSON
    again = tmp_path / "again.onnx"
    res = runner.invoke(cli.main, ["rewrite", str(deep_file), str(plan), "-o", str(again)])
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("args, words", [
    (["--add-loss", "mse", "--forward"], "--add-loss builds a training step; --forward plans the model as it is"),
    (["--add-loss", "softmax"], "--add-loss 'softmax': the loss must be one of"),
])
def test_plan_refuses_contradictions_before_writing_anything(logits_file, tmp_path, args, words):
    out = tmp_path / "p.onnx"
    res = CliRunner().invoke(cli.main, ["plan", str(logits_file), "--budget", "80%", "--emit", str(out), *args])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_without_a_loss_the_error_points_at_the_flag(logits_file, tmp_path):
    """A usage error (exit 2), as a bad --add-loss is: --add-loss or --forward fixes it (it said
    exit 3, a bad model)."""
    out = tmp_path / "p.onnx"
    res = CliRunner().invoke(cli.main, ["plan", str(logits_file), "--budget", "80%", "--emit", str(out)])
    assert res.exit_code == 2 and "Traceback" not in res.output and not out.exists()
    assert "has no scalar float output to use as the loss" in res.output and "--add-loss cross-entropy" in res.output
    assert "plan --forward" in res.output
    res = CliRunner().invoke(cli.main, ["inspect", str(logits_file), "--train"])
    assert res.exit_code == 2 and "without --train" in res.output


@pytest.mark.parametrize("opset", [17, 11])
def test_train_learns_the_classes_through_the_added_loss(deep_file, opset):
    """At opset 11 the model is upgraded before the loss is appended (train reads the forward too)."""
    if opset != 17:
        model = onnx.load(deep_file)
        model.opset_import[0].version = opset
        onnx.save(model, deep_file)
    res = CliRunner().invoke(cli.main, ["train", str(deep_file), "--dim", "N=64", "--add-loss", "cross-entropy",
                                        "--steps", "100", "--lr", "0.03", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["task"] == "prototypes"  # the labels input of the added loss drives the synthetic task
    assert info["last_mean"] < 0.7 * info["first_mean"]


def test_check_reads_add_loss_from_the_config(deep_file, tmp_path):
    config = tmp_path / "memplan.toml"
    config.write_text(f'[[check]]\nmodel = "{deep_file.name}"\nbudget = "95%"\nadd_loss = "mse"\n'
                      'dims = { N = 256 }\n')
    res = CliRunner().invoke(cli.main, ["check", "--config", str(config), "--json"])
    assert res.exit_code == 0, res.output
    verdict = json.loads(res.stdout)["results"][0]
    assert verdict["name"] == "deep.onnx [train, loss=mse, N=256]" and verdict["fits_with_plan"]
    config.write_text(f'[[check]]\nmodel = "{deep_file.name}"\nbudget = "90%"\nadd_loss = "l1"\n')
    res = CliRunner().invoke(cli.main, ["check", "--config", str(config)])
    assert res.exit_code == 2 and "[[check]] #1: add_loss must be" in res.output
