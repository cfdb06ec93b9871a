"""memplan train: seeds, divergence, float32 hyper-parameters, synthetic data, ORT's log (fuzzed, stop 50)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from planner.errors import UsageError
from tests.helpers import memplan


def _save(tmp_path, name, nodes, inputs, inits, outputs=("loss",)):
    graph = helper.make_graph(
        nodes, name, inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, []) for o in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return str(path)


def _gemm_loss(tmp_path, name, between):
    """x[4,3] -> Gemm(W[3,2]) -> ``between`` ops -> ReduceMean -> loss."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "W"], ["h"])]
    last = "h"
    for i, (op, attrs) in enumerate(between):
        nodes.append(helper.make_node(op, [last], [f"t{i}"], **attrs))
        last = f"t{i}"
    nodes.append(helper.make_node("ReduceMean", [last], ["loss"], keepdims=0))
    return _save(tmp_path, name, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                 {"W": rng.standard_normal((3, 2)).astype(np.float32)})


def test_the_same_seed_gives_the_same_losses_through_dropout(tmp_path):
    """--seed seeded the data only: ORT drew Dropout's masks afresh on each run."""
    path = _gemm_loss(tmp_path, "dropout", [("Dropout", {})])
    model = onnx.load(path)
    ratio = numpy_helper.from_array(np.array(0.5, np.float32), "ratio")
    mode = numpy_helper.from_array(np.array(True), "training")
    model.graph.initializer.extend([ratio, mode])
    model.graph.node[1].input.extend(["ratio", "training"])
    onnx.save(model, path)
    runs = [memplan("train", path, "--steps", "4", "--seed", str(seed), "--json") for seed in (0, 0, 1)]
    assert all(rc == 0 for rc, _, _ in runs), runs
    losses = [json.loads(out)["losses"] for _, out, _ in runs]
    assert losses[0] == losses[1] != losses[2]


def test_a_diverged_loss_is_an_error_not_nan_json(tmp_path):
    """Log of a Gemm's negative outputs: the run printed "last_loss": NaN (not JSON) and exited 0."""
    path = _gemm_loss(tmp_path, "logloss", [("Log", {})])
    rc, out, err = memplan("train", path, "--steps", "3", "--json")
    assert rc == 1 and out == ""
    assert err.strip().startswith("memplan: error: the loss became nan at step 0") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flag,value,as32", [("lr", 1e39, "inf"), ("lr", 1e-50, "0"), ("beta2", 0.9999999999, "1"),
                                              ("weight_decay", 1e39, "inf"), ("momentum", 0.99999999999, "1")])
def test_hyper_parameters_that_float32_cannot_hold_are_refused(flag, value, as32):
    """They passed the float64 range check and became inf, 0 or 1 in the step: NaN or a silent no-op."""
    from passes.optimizer import OptimizerOptions

    with pytest.raises(UsageError, match=f"is {as32} as the float32"):
        OptimizerOptions(kind="adam" if "beta" in flag else "sgd", **{flag: value})
    OptimizerOptions(kind="adam", lr=1e-30, beta2=0.99999, weight_decay=1e30)  # float32 holds these


@pytest.mark.parametrize("command, args", [
    ("train", ["--momentum", "0.9"]),  # ran the default adam, no momentum
    ("train-graph", ["--optimizer", "sgd", "--beta1", "0.5"]),
    ("train-graph", ["--optimizer", "adam", "--momentum", "0.9"]),
    ("train-graph", ["--weight-decay", "0.1"]),  # the default none: no update to decay
])
def test_a_hyper_parameter_of_another_optimizer_is_refused(command, args, tmp_path):
    """They were dropped without a word: `train --momentum 0.9` trained Adam with no momentum."""
    out = tmp_path / "step.onnx"
    rc, stdout, err = memplan(command, "zoo:mlp", *(["-o", out] if command == "train-graph" else ["--steps", "1"]), *args)
    flag = args[-2]
    assert rc == 2 and stdout == "" and not out.exists(), err
    assert err.startswith(f"memplan: error: {flag} is a hyper-parameter of --optimizer") and len(err.splitlines()) == 1


def test_hyper_parameters_given_to_their_optimizer_reach_the_step(tmp_path):
    """The flags' defaults moved from click to the step: given ones must still be the step's."""
    import cli

    options = cli._train_options(optimizer="sgd", lr=None, momentum=0.5, beta1=None, beta2=None, weight_decay=0.25,
                                 freeze=(), loss=None, default_optimizer="none")
    assert (options.optimizer.momentum, options.optimizer.weight_decay, options.optimizer.lr) == (0.5, 0.25, 0.01)
    options = cli._train_options(optimizer=None, lr=None, momentum=None, beta1=0.5, beta2=None, weight_decay=None,
                                 freeze=(), loss=None, default_optimizer="adam")
    assert (options.optimizer.beta1, options.optimizer.beta2, options.optimizer.weight_decay) == (0.5, 0.999, 0.0)


def test_a_classifier_input_without_the_batch_dim_gets_random_data(tmp_path):
    """A float input of another shape than the samples (a [2] scale) broke the prototypes: traceback."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Gemm", ["x", "W"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["z"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["z", "y"], ["loss"])]
    path = _save(tmp_path, "ce_extra", nodes,
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3]),
                  helper.make_tensor_value_info("scale", TensorProto.FLOAT, [2]),
                  helper.make_tensor_value_info("y", TensorProto.INT64, [4])],
                 {"W": rng.standard_normal((3, 2)).astype(np.float32)})
    rc, out, err = memplan("train", path, "--steps", "3", "--json")
    assert rc == 0, err
    assert json.loads(out)["task"] == "prototypes"


def test_seed_and_dims_out_of_range_are_one_line_errors():
    for args in (["train", "zoo:mlp?batch=8", "--steps", "2", "--seed", "-3"],
                 ["inspect", "zoo:mlp", "--dim", "batch=4611686018427387904"]):
        rc, _, err = memplan(*args)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_train_on_cuda_without_a_gpu_says_one_line():
    """ORT's own error and warning lines came first (3 of them) without -v."""
    rc, _, err = memplan("train", "zoo:mlp?batch=4", "--steps", "2", "--provider", "cuda")
    if rc == 0:
        pytest.skip("a CUDA GPU is here")  # the check is for machines without one
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("memplan: error: --provider cuda")


def test_train_on_cuda_without_a_gpu_says_so_before_planning():
    """With --budget the step was planned first (12 s for zoo:gpt?batch=8 at --time-limit 10) and only then
    --provider cuda refused; a budget no plan reaches showed it: exit 1, infeasible, instead of exit 2."""
    rc, _, _ = memplan("train", "zoo:mlp?batch=4", "--steps", "1", "--provider", "cuda")
    if rc == 0:
        pytest.skip("a CUDA GPU is here")  # the check is for machines without one
    rc, out, err = memplan("train", "zoo:mlp?batch=4", "--steps", "1", "--provider", "cuda", "--budget", "1B")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("memplan: error: --provider cuda"), err


def test_the_first_scalar_output_untrainable_suggests_loss(tmp_path):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("ReduceMean", ["x"], ["xm"], keepdims=0), helper.make_node("Gemm", ["x", "W"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["loss"], keepdims=0)]
    path = _save(tmp_path, "two", nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                 {"W": rng.standard_normal((3, 2)).astype(np.float32)}, outputs=("xm", "loss"))
    rc, _, err = memplan("train", path, "--steps", "2")
    assert rc != 0 and "with --loss" in err
    assert memplan("train", path, "--steps", "2", "--loss", "loss")[0] == 0


def test_inspect_of_a_graph_without_nodes_names_no_step(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    path = tmp_path / "empty.onnx"
    onnx.save(helper.make_model(helper.make_graph([], "g", [x], [x]), opset_imports=[helper.make_opsetid("", 17)]),
              path)
    rc, out, err = memplan("inspect", str(path))
    assert rc == 0, err
    assert "(None, None)" not in out and "no node runs" in out


def test_train_offers_only_optimizers_that_step():
    """train's help listed --optimizer none (train-graph's choice), which train then refused."""
    rc, out, _ = memplan("train", "--help")
    assert rc == 0 and "[sgd|adam]" in out and "none" not in out.split("--optimizer")[1].split("\n")[0]
    rc, _, err = memplan("train", "zoo:cnn", "--optimizer", "none")
    assert rc == 2 and "'none' is not one of 'sgd', 'adam'" in err
    rc, out, _ = memplan("train-graph", "--help")
    assert "[none|sgd|adam]" in out


def test_a_training_step_is_not_differentiated_again(tmp_path):
    """train-graph of a step train-graph wrote differentiated its loss again: zoo:gpt's Adam step
    came back with gradients for its causal mask and GELU constants (37 'trainable' where the model
    has 28), exit 0. train-graph and train now refuse it; inspect --train inspects it as it is, as
    plan plans it."""
    step = tmp_path / "step.onnx"
    rc, _, err = memplan("train-graph", "zoo:gpt?layers=1", "-o", step, "--optimizer", "adam")
    assert rc == 0, err
    again = tmp_path / "again.onnx"
    for args in (["train-graph", step, "-o", again], ["train", step, "--steps", "2"]):
        rc, out, err = memplan(*args)
        assert rc == 2 and "is already a training step (memplan train-graph wrote it)" in err, (out, err)
        assert len(err.strip().splitlines()) == 1
    assert not again.exists()
    rc, out, err = memplan("inspect", step, "--json")
    assert rc == 0, err
    as_is = json.loads(out)
    rc, out, err = memplan("inspect", step, "--train", "--json")
    assert rc == 0, err
    assert json.loads(out)["nodes"] == as_is["nodes"] and json.loads(out)["peak_bytes"] == as_is["peak_bytes"]
    rc, _, err = memplan("inspect", step, "--add-loss", "mean")
    assert rc == 2 and "drop --add-loss" in err


def _peak(*args) -> int:
    rc, out, err = memplan(*args, "--json")
    assert rc == 0, err
    obj = json.loads(out)
    return obj["results"][0]["unplanned_peak_bytes"] if "results" in obj else obj.get("unplanned_peak_bytes",
                                                                                         obj.get("peak_bytes"))


def test_a_planned_training_step_is_not_differentiated_again(tmp_path):
    """A step that plan --emit or rewrite wrote carried memplan.plan, not memplan.train: train-graph
    differentiated it again (zoo:gpt?layers=1 with Adam: 21 trainable initializers where the model
    has 16, exit 0) and plan planned a step of its loss alone (371304 bytes for a file that holds
    387040). check --train differentiated train-graph's own step again too (zoo:mlp with Adam: 672.41
    KiB, its file holds 1.01 MiB). Every such step is now taken as it is, as inspect takes it."""
    step, emitted, plan_json, rewritten = (tmp_path / f for f in ("step.onnx", "emit.onnx", "p.json", "rw.onnx"))
    rc, _, err = memplan("train-graph", "zoo:mlp", "-o", step, "--optimizer", "adam")
    assert rc == 0, err
    rc, _, err = memplan("plan", "zoo:mlp", "--budget", "100%", "--optimizer", "adam", "--emit", emitted,
                         "-o", plan_json)
    assert rc == 0, err
    rc, _, err = memplan("rewrite", "zoo:mlp", plan_json, "-o", rewritten)
    assert rc == 0, err
    held = _peak("inspect", step)
    for path in (step, emitted, rewritten, tmp_path / "legacy.onnx"):
        if path.name == "legacy.onnx":  # as planned files were before they carried memplan.train
            legacy = onnx.load(str(emitted))
            kept = [p for p in legacy.metadata_props if p.key != "memplan.train"]
            assert [p.key for p in kept] == ["memplan.plan"]
            del legacy.metadata_props[:]
            legacy.metadata_props.extend(kept)
            onnx.save(legacy, str(path))
        assert _peak("inspect", path) == held, path
        assert _peak("plan", path, "--budget", "100%") == held, path
        assert _peak("check", path, "--train", "--budget", "100%") == held, path
        again = tmp_path / "again.onnx"
        rc, out, err = memplan("train-graph", path, "-o", again)
        assert rc == 2 and "is already a training step" in err and len(err.strip().splitlines()) == 1, (out, err)
        assert not again.exists()
    rc, _, err = memplan("check", emitted, "--train", "--add-loss", "mean", "--budget", "100%")
    assert rc == 2 and "already a training step" in err and "drop --add-loss" in err, err


def test_train_with_a_budget_runs_the_planned_step_with_the_unplanned_losses():
    """train always ran the unplanned step: there was no way to train under a memory budget. With
    --budget it plans the step with its optimizer and runs the rewritten graph; recompute on CPU is
    bit-exact, so every loss equals the unplanned run's. (At 90% a memory-aware order alone fits now
    that each of a node's outputs is freed after its own last reader: 80% needs recomputes.)"""
    args = ("train", "zoo:cnn", "--steps", "4", "--json")
    rc, out, err = memplan(*args)
    assert rc == 0, err
    unplanned = json.loads(out)
    rc, out, err = memplan(*args, "--budget", "80%", "--time-limit", "2", "--deterministic")
    assert rc == 0, err
    planned = json.loads(out)
    plan = planned["plan"]
    assert len(plan["recomputed"]) >= 1 and plan["status"] in ("optimal", "feasible")
    assert plan["peak_bytes"] <= plan["budget_bytes"] < plan["unplanned_peak_bytes"]
    assert plan["added_time_pct"] > 0
    assert len(planned["losses"]) == 4 and planned["losses"] == unplanned["losses"]
    assert "plan" not in unplanned
    rc, out, err = memplan("train", "zoo:cnn", "--steps", "2", "--budget", "80%", "--time-limit", "2", "--deterministic")
    assert rc == 0, err
    line = out.splitlines()[0]
    assert line.startswith(f"plan: {plan['status']}, peak ") and "(unplanned " in line and "recomputed: " in line


def test_train_json_plan_names_the_recomputed_nodes_as_plan_json_does(tmp_path):
    """train --budget --json's plan object had "recomputed": 15, a count, where plan.json's "recomputed"
    lists the nodes by name: the same key, another type. Now both list the same names for the same plan."""
    budget = ("--budget", "80%", "--time-limit", "2", "--deterministic")
    rc, out, err = memplan("train", "zoo:cnn", "--steps", "1", "--json", *budget)
    assert rc == 0, err
    trained = json.loads(out)["plan"]
    rc, out, err = memplan("plan", "zoo:cnn", "--optimizer", "adam", "--json", *budget)
    assert rc == 0, err
    planned = json.loads(out)
    assert trained["peak_bytes"] == planned["peak_bytes"]
    assert trained["recomputed"] == planned["recomputed"] and planned["recomputed"], (trained, planned["recomputed"])


def test_the_planned_step_is_the_rewritten_graph_run_with_the_planned_options():
    """The losses alone would not tell the planned step from the unplanned one: the graph trained is
    the rewrite's (more nodes: the recompute copies), and its losses still equal the step's own."""
    import cli
    from passes.autodiff import TrainOptions, build_training_graph
    from passes.onnx_import import load_graph
    from passes.training import train
    from planner.cpsat import PlannerOptions
    from planner.units import parse_budget

    forward = load_graph("zoo:cnn")
    step = build_training_graph(forward, TrainOptions.from_kwargs(optimizer="adam", lr=0.003))
    planned, plan = cli._plan_training_step(step, parse_budget("80%"), "H100",
                                            PlannerOptions(time_limit=2, work_limit=True, workers=1))
    assert len(plan["recomputed"]) >= 1 and len(planned.graph.nodes) > len(step.graph.nodes)
    assert planned.params == step.params and planned.updates == step.updates
    ours = train(planned, forward, 3, planned=True).losses
    assert ours == train(step, forward, 3).losses


@pytest.mark.parametrize("args, code, starts", [
    (["--budget", "60x"], 2, "memplan: error: budget '60x' has unknown unit"),
    (["--budget", "0%"], 2, "memplan: error: budget '0%' must be a percentage"),
    (["--deterministic"], 2, "memplan: error: --deterministic applies to planning the step; add --budget"),
    (["--device", "A100"], 2, "memplan: error: --device applies to planning the step; add --budget"),
])
def test_train_budget_usage_errors_are_one_line(args, code, starts):
    rc, out, err = memplan("train", "zoo:cnn", "--steps", "2", *args)
    assert rc == code and out == "" and err.startswith(starts) and len(err.strip().splitlines()) == 1, err


def test_train_at_an_infeasible_budget_fails_as_plan_does_and_trains_nothing():
    rc, out, err = memplan("train", "zoo:cnn", "--steps", "2", "--budget", "10%", "--time-limit", "2")
    assert rc == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("memplan: error: infeasible: the least memory any plan reaches")
    assert (rc, err) == memplan("plan", "zoo:cnn", "--optimizer", "adam", "--budget", "10%", "--time-limit", "2")[::2]


def test_train_json_at_an_infeasible_budget_prints_one_object_as_plan_json_does():
    """train --budget B --json printed nothing when no plan reaches B, where plan --json prints the
    failed plan's object (status, least bytes) and exits 1: a CI job parsing stdout got no document.
    Now train prints one object too, its plan named as plan.json names it, with the same exit and line."""
    rc, out, err = memplan("train", "zoo:mlp", "--steps", "2", "--budget", "1KiB", "--json")
    assert rc == 1 and len(err.strip().splitlines()) == 1, (out, err)
    assert err.startswith("memplan: error: infeasible: the least memory any plan reaches")
    obj = json.loads(out)
    assert obj["status"] == obj["plan"]["status"] == "infeasible" and "losses" not in obj
    plan = obj["plan"]
    assert plan["budget_bytes"] == 1024 < plan["least_bytes"] <= plan["unplanned_peak_bytes"]
    assert plan["peak_bytes"] is None and plan["recomputed"] is None
    # the same keys as the plan object of a run that trained (a failure's lacked none of them but a
    # plan's lacked least_bytes, best_peak_bytes and note; the failure's left out those it had not)
    rc, out, err = memplan("train", "zoo:mlp", "--steps", "1", "--budget", "100%", "--json")
    assert rc == 0, err
    assert set(json.loads(out)["plan"]) == set(plan)
    rc, out, _ = memplan("plan", "zoo:mlp", "--optimizer", "adam", "--budget", "1KiB", "--json")
    assert rc == 1
    planned = json.loads(out)
    assert {k: plan[k] for k in ("status", "budget_bytes", "unplanned_peak_bytes", "least_bytes")} == \
        {k: planned[k] for k in ("status", "budget_bytes", "unplanned_peak_bytes", "least_bytes")}
