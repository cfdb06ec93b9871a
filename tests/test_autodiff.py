"""End-to-end autodiff: whole small models, the zoo and the torch fixtures, the optimizer step, the
error path and the CLI (train-graph, train, inspect --train)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

import cli
from passes import gradcheck
from passes.autodiff import TrainOptions, build_training_graph
from passes.onnx_export import export_model
from passes.onnx_import import import_model
from planner.errors import ModelImportError, UsageError
from tests.helpers import memplan

FIXTURES = Path(__file__).parent / "fixtures"
F64 = onnx.TensorProto.DOUBLE


def _model(nodes, inits, inputs, opset=17, dtype=np.float64, loss_dtype=F64) -> onnx.ModelProto:
    tensors = [numpy_helper.from_array(np.asarray(v, dtype) if np.asarray(v).dtype.kind == "f" else np.asarray(v), k)
               for k, v in inits.items()]
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), list(np.shape(v)))
           for k, v in inputs.items()]
    graph = helper.make_graph(nodes, "m", ins, [helper.make_tensor_value_info("loss", loss_dtype, [])],
                              initializer=tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _mlp(extra_nodes=(), extra_inits=None) -> tuple[onnx.ModelProto, dict]:
    """Two-layer MLP with a shared weight (fan-out), an int shape subgraph and SCE loss, float64."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [
        n("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        n("Relu", ["h"], ["r"], name="relu"),
        n("Shape", ["r"], ["r_shape"]),  # int path, passes through untouched
        n("Reshape", ["r", "r_shape"], ["r2"]),
        n("MatMul", ["r2", "w2"], ["z"]),
        n("MatMul", ["z", "w2sq"], ["z2"]),
        n("Add", ["z", "z2"], ["z3"]),
        n("Mul", ["z3", "w2scale"], ["logits"]),
        *extra_nodes,
        n("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"]),
    ]
    inits = {"w1": rng.standard_normal((5, 4)), "b1": rng.standard_normal(5), "w2": rng.standard_normal((5, 3)),
             "w2sq": rng.standard_normal((3, 3)), "w2scale": rng.standard_normal(3), **(extra_inits or {})}
    inputs = {"x": rng.standard_normal((6, 4)), "labels": np.asarray([0, 1, 2, 1, 0, 2], np.int64)}
    return _model(nodes, inits, inputs), inputs


def _fd_check(model, feeds, options=None, tol=1e-6):
    forward = import_model(model)
    step = build_training_graph(forward, options)
    loss, got = gradcheck.run_training_step(step, feeds)
    evaluate = gradcheck.loss_evaluator(forward, step.loss, list(step.params))
    want = gradcheck.finite_differences(evaluate, feeds, gradcheck.initializer_values(forward, step.params))
    report = gradcheck.compare(got, want, loss)
    assert report.worst[1] < tol, report.worst
    return step


def test_small_model_gradients_match_finite_differences():
    model, feeds = _mlp()
    step = _fd_check(model, feeds)
    assert step.params == ("w1", "b1", "w2", "w2sq", "w2scale")


def test_outputs_are_loss_then_named_gradients_and_checker_passes():
    model, _ = _mlp()
    step = build_training_graph(import_model(model))
    names = [step.graph.tensors[t].name for t in step.graph.outputs]
    assert names == ["loss"] + [f"{p}_grad" for p in step.params]
    assert {"r__grad", "logits__grad"} <= set(step.graph.by_name)  # intermediate gradients named after tensors
    onnx.checker.check_model(export_model(step.graph), full_check=True)


def test_fan_out_is_summed_into_the_gemm_that_makes_the_last_term():
    # z feeds MatMul and Add: two terms. The MatMul's input gradient is a Gemm made for the sum
    # alone, so it adds the other term as its C (ORT's Add would hold both terms and the sum at once)
    model, feeds = _mlp()
    step = build_training_graph(import_model(model))
    g = step.graph
    made = g.nodes[g.tensor("z__grad").producer]
    assert made.op_type == "Gemm" and len(made.inputs) == 3 and made.attrs["beta"] == 1.0
    assert not any(n.op_type == "Add" and made.outputs[0] in n.inputs for n in g.nodes)
    _fd_check(model, feeds)


def test_a_weight_used_at_every_step_sums_its_terms_in_the_gemms():
    # an unrolled RNN's shape: W at three steps; its gradient's three terms become one running sum
    n = helper.make_node
    rng = np.random.default_rng(1)
    nodes = [n("Gemm", ["x", "w"], ["h1"]), n("Tanh", ["h1"], ["a1"]), n("Gemm", ["a1", "w"], ["h2"]),
             n("Tanh", ["h2"], ["a2"]), n("Gemm", ["a2", "w"], ["h3"]), n("ReduceMean", ["h3"], ["loss"], keepdims=0)]
    feeds = {"x": rng.standard_normal((6, 4))}
    model = _model(nodes, {"w": rng.standard_normal((4, 4)) * 0.5}, feeds)
    step = _fd_check(model, feeds)
    g = step.graph
    made = g.nodes[g.tensor("w_grad").producer]
    assert made.op_type == "Gemm" and len(made.inputs) == 3
    assert [n.op_type for n in g.nodes[step.forward_nodes:]].count("Add") == 0


def test_a_term_shared_by_two_inputs_is_added_not_folded_into_its_gemm():
    # Add(u, v) hands the same fresh Gemm output (z's input gradient) to u and v. u already has a
    # term (from s = z + u): folding it into that Gemm as C would give v the sum too (w3 wrong)
    n = helper.make_node
    rng = np.random.default_rng(2)
    nodes = [n("Gemm", ["x", "w1"], ["u"]), n("Gemm", ["x", "w3"], ["v"]), n("Add", ["u", "v"], ["y"]),
             n("Gemm", ["y", "w2"], ["z"]), n("Add", ["z", "u"], ["s"]), n("Tanh", ["s"], ["t"]),
             n("ReduceSum", ["t"], ["loss"], keepdims=0)]
    feeds = {"x": rng.standard_normal((6, 4))}
    model = _model(nodes, {w: rng.standard_normal((4, 4)) for w in ("w1", "w2", "w3")}, feeds)
    _fd_check(model, feeds)


def test_relu_saves_its_output_not_its_input():
    model, _ = _mlp()
    step = build_training_graph(import_model(model))
    assert step.saved["relu"] == ("r",)


def test_int_subgraph_and_forward_untouched():
    model, _ = _mlp()
    forward = import_model(model)
    step = build_training_graph(forward)
    # the loss (SoftmaxCrossEntropyLoss, the last node) as ORT runs it: its body (passes/function_ops.py)
    *fwd_ops, (loss, op) = [(n.name, n.op_type) for n in forward.nodes]
    assert op == "SoftmaxCrossEntropyLoss"
    assert [(n.name, n.op_type) for n in step.graph.nodes[:len(fwd_ops)]] == fwd_ops
    body = step.graph.nodes[len(fwd_ops):step.forward_nodes]
    assert [n.op_type for n in body][0] == "LogSoftmax" and all(n.name.startswith(f"{loss}/") for n in body)
    assert not any(n.op_type == "Shape" for n in step.graph.nodes[step.forward_nodes:])


def _det_mlp():
    """The MLP with Det (no rule) on the logits' path: logits = Det of each logit as a 1x1 matrix."""
    n = helper.make_node
    model, feeds = _mlp(extra_nodes=[n("Reshape", ["logits0", "shape_6_3_1_1"], ["logits_1x1"]),
                                     n("Det", ["logits_1x1"], ["logits"], name="the_det")],
                        extra_inits={"shape_6_3_1_1": np.asarray([6, 3, 1, 1], np.int64)})
    for node in model.graph.node:
        if node.op_type == "Mul":
            node.output[0] = "logits0"
    return model, feeds


def test_unsupported_op_on_path_names_node_op_and_supported_ops():
    model, _ = _det_mlp()
    with pytest.raises(ModelImportError) as err:
        build_training_graph(import_model(model))
    message = str(err.value)
    assert "'the_det' (Det)" in message and "supported ops: Abs, Acos, Acosh, Add," in message and "\n" not in message


def test_unsupported_op_off_path_and_freeze(tmp_path):
    """Det (no rule) on a frozen weight is fine: nothing trainable flows through it (Det is float32
    only in ORT, hence the casts)."""
    n = helper.make_node
    model, feeds = _mlp(extra_nodes=[n("Cast", ["c"], ["c32"], to=onnx.TensorProto.FLOAT), n("Det", ["c32"], ["d32"]),
                                     n("Cast", ["d32"], ["cc"], to=F64), n("Add", ["logits0", "cc"], ["logits"])],
                        extra_inits={"c": np.ones((3, 1, 1))})
    for node in model.graph.node:
        if node.op_type == "Mul":
            node.output[0] = "logits0"
    with pytest.raises(ModelImportError):
        build_training_graph(import_model(model))
    step = _fd_check(model, feeds, TrainOptions(freeze=("c",)))
    assert "c" not in step.params and "c_grad" not in step.graph.by_name


def test_freezing_every_weight_is_the_users_flag_not_a_bad_model():
    """--freeze '*' left nothing to train and was reported as a bad model (exit 3); the model is
    fine, the patterns took every weight: a usage error naming them. A model with no weight on the
    loss's path stays a bad model."""
    model, _ = _mlp()
    with pytest.raises(UsageError, match=r"--freeze \* freezes every weight the loss") as err:
        build_training_graph(import_model(model), TrainOptions(freeze=("*",)))
    assert not isinstance(err.value, ModelImportError)
    rc, _, stderr = memplan("train", "zoo:mlp", "--freeze", "*", "--steps", "2")
    assert rc == 2 and "narrow the patterns" in stderr


def test_a_model_with_nothing_to_train_says_what_to_do_instead(tmp_path):
    """A model with no weight on its loss's path (exit 3, a bad model for training, in train-graph,
    plan, check --train and train alike) was told to "name another scalar output as the loss with
    --loss" though it had none; it is now told to plan its forward run, and --loss is offered only
    with the scalar outputs it could name."""
    n = helper.make_node
    model = _model([n("Relu", ["x"], ["r"]), n("ReduceMean", ["r"], ["loss"], keepdims=0)], {}, {"x": np.ones((4, 3))})
    path = tmp_path / "noweights.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelImportError, match="there is nothing to train") as err:
        build_training_graph(import_model(model))
    assert "--loss" not in str(err.value) and "plan --forward" in str(err.value)
    for args in (["train-graph", path, "-o", tmp_path / "step.onnx"], ["plan", path, "--budget", "50%"],
                 ["check", path, "--train", "--budget", "50%"], ["train", path, "--optimizer", "sgd", "--steps", "1"]):
        rc, out, err = memplan(*args)
        errors = [line for line in err.splitlines() if line.startswith("memplan: error:")]
        assert rc == 3 and len(errors) == 1 and "plan --forward" in errors[0] and "Traceback" not in err, (args, err)
    assert not (tmp_path / "step.onnx").exists()
    rc, _, err = memplan("plan", path, "--budget", "100%", "--forward")
    assert rc == 0, err
    # with a second scalar output that does depend on a weight, --loss names it
    model.graph.node.extend([n("Mul", ["loss", "w"], ["weighted"])])
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(2.0), "w"))
    model.graph.output.append(helper.make_tensor_value_info("weighted", F64, []))
    with pytest.raises(ModelImportError, match=r"with --loss: 'weighted'\)"):
        build_training_graph(import_model(model), TrainOptions(loss=None))


def test_a_loss_through_an_output_without_a_gradient_is_refused_not_dropped():
    """LayerNormalization's rule builds the gradient through Y only: a loss reading its Mean would
    have got no gradient from it without a word (fuzzed, stop 49). It is refused, naming the node
    and the output."""
    rng = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "s", "b"], ["y", "mu", "isd"], axis=-1, name="ln"),
             n("ReduceSum", ["y"], ["t"], keepdims=0), n("ReduceSum", ["mu"], ["u"], keepdims=0),
             n("Cast", ["u"], ["u64"], to=F64),  # Mean is float32 (stash_type): ORT refuses double + float
             n("Add", ["t", "u64"], ["loss"])]
    model = _model(nodes, {"x": rng.standard_normal((2, 3)), "s": np.ones(3), "b": np.zeros(3)}, {})
    with pytest.raises(ModelImportError) as err:
        build_training_graph(import_model(model))
    assert "output 1 ('mu') of node 'ln' (LayerNormalization)" in str(err.value)
    assert "through output 0 only" in str(err.value)


def test_statistics_of_an_input_without_weights_may_reach_the_loss():
    """LayerNormalization's Mean/InvStdDev and BatchNormalization's running statistics are computed
    from X alone: where X depends on no weight they have no gradient to leave out, and a loss reading
    them trains Scale and B through Y. memplan refused it (fuzz_e2e --ops multi seed 4); the gradients
    now match finite differences."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "s", "b"], ["y", "mu", "isd"], axis=-1, name="ln"),
             n("Cast", ["mu"], ["mu64"], to=F64), n("Cast", ["isd"], ["isd64"], to=F64),
             n("Mul", ["y", "mu64"], ["ym"]), n("Mul", ["ym", "isd64"], ["z"]),
             n("ReduceSum", ["z"], ["t"], keepdims=0), n("Mul", ["t", "t"], ["loss"])]
    x = rng.standard_normal((2, 3))
    _fd_check(_model(nodes, {"s": rng.standard_normal(3), "b": rng.standard_normal(3)}, {"x": x}), {"x": x})
    nodes = [n("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1, name="bn"),
             n("Add", ["y", "rm"], ["z"]), n("Mul", ["z", "rv"], ["zv"]),
             n("ReduceSum", ["zv"], ["t"], keepdims=0), n("Mul", ["t", "t"], ["loss"])]
    inits = {"s": rng.standard_normal(2), "b": rng.standard_normal(2), "m": np.full(2, 0.1), "v": np.full(2, 1.2)}
    x = rng.standard_normal((3, 2, 2))
    model = _model(nodes, inits, {"x": x}, opset=15)
    step = build_training_graph(import_model(model))
    assert step.params == ("s", "b")
    _, got = gradcheck.run_training_step(step, {"x": x})
    # ORT's kernel writes the running statistics in place, so finite differences run on the same
    # model with them read as the constants one run gives (they do not depend on s and b)
    probe = model.graph.__deepcopy__()
    probe.output.extend([helper.make_tensor_value_info(t, F64, [2]) for t in ("rm", "rv")])
    rm, rv = gradcheck.ort_session(helper.make_model(probe, opset_imports=model.opset_import,
                                                     ir_version=8)).run(["rm", "rv"], {"x": x})
    nodes[0] = n("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm_unread", "rv_unread"], training_mode=1,
                 name="bn")
    nodes[1:1] = [n("Constant", [], ["rm"], value=numpy_helper.from_array(rm)),
                  n("Constant", [], ["rv"], value=numpy_helper.from_array(rv))]
    frozen = _fd_check(_model(nodes, inits, {"x": x}, opset=15), {"x": x})
    _, want = gradcheck.run_training_step(frozen, {"x": x})
    for p in ("s", "b"):
        np.testing.assert_allclose(got[p], want[p], rtol=1e-6)


def test_trainable_initializers_read_only_where_no_gradient_flows_are_named():
    """Clip's bounds get no gradient: a loss that reads trainable initializers only there names
    them, not "depends on no trainable initializer" (fuzzed, stop 49)."""
    n = helper.make_node
    model = _model([n("Clip", ["x", "lo", "hi"], ["y"]), n("ReduceSum", ["y"], ["loss"], keepdims=0)],
                   {"lo": np.asarray(-0.5), "hi": np.asarray(0.5)}, {"x": np.ones((2, 3))})
    with pytest.raises(ModelImportError) as err:
        build_training_graph(import_model(model))
    assert "the trainable initializers 'lo', 'hi' only through inputs memplan builds no gradient for" \
        in str(err.value)


def test_weight_standardization_through_inference_batchnorm_mean_and_variance():
    """torch's dynamo exporter (optimize=False) writes F.batch_norm(w, None, None, training=True), the
    weight standardization of NFNet and BiT, as an inference-mode BatchNormalization whose mean and
    variance are ReduceMeans of the weight itself: their gradients flow back into the weight (they
    were dropped: timm nf_regnet_b0 trained 1.7 off torch)."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [
        n("Reshape", ["w", "flat"], ["wv"]),  # [1, C, K]
        n("ReduceMean", ["wv", "axes"], ["mean"], keepdims=0),
        n("ReduceMean", ["wv", "axes"], ["mean_k"], keepdims=1),
        n("Sub", ["wv", "mean_k"], ["centered"]),
        n("Mul", ["centered", "centered"], ["sq"]),
        n("ReduceMean", ["sq", "axes"], ["var"], keepdims=0),
        n("BatchNormalization", ["wv", "gain", "zero", "mean", "var"], ["ws"], epsilon=1e-4, name="std"),
        n("Reshape", ["ws", "wshape"], ["w_std"]),
        n("MatMul", ["w_std", "x"], ["y"]),  # ORT has no float64 Conv
        n("Mul", ["y", "y"], ["y2"]),
        n("ReduceSum", ["y2"], ["loss"], keepdims=0),
    ]
    inits = {"w": rng.standard_normal((3, 4)), "gain": rng.uniform(0.5, 1.5, 3), "zero": np.zeros(3),
             "flat": np.asarray([1, 3, -1], np.int64), "axes": np.asarray([0, 2], np.int64),
             "wshape": np.asarray([3, 4], np.int64)}
    feeds = {"x": rng.standard_normal((4, 5))}
    step = _fd_check(_model(nodes, inits, feeds, opset=18), feeds)
    assert set(step.params) == {"w", "gain", "zero"}


def test_weight_computation_read_where_no_gradient_flows_is_refused():
    """A Clip bound computed from a weight: its gradient would be left out silently; refused in one
    line. Bounds that are initializers themselves (ReLU6 as exported) stay constants."""
    n = helper.make_node
    nodes = [n("Mul", ["w", "two"], ["hi"]), n("Mul", ["x", "w"], ["xw"]), n("Clip", ["xw", "lo", "hi"], ["y"]),
             n("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = _model(nodes, {"w": np.asarray(0.5), "two": np.asarray(2.0), "lo": np.asarray(-1.0)},
                   {"x": np.linspace(-3, 3, 6)})
    with pytest.raises(ModelImportError) as err:
        build_training_graph(import_model(model))
    assert "through input 2 ('hi') of node" in str(err.value) and "(Clip)" in str(err.value)
    assert "\n" not in str(err.value)
    six = _model([n("Mul", ["x", "w"], ["xw"]), n("Clip", ["xw", "lo", "hi"], ["y"]),
                  n("ReduceSum", ["y"], ["loss"], keepdims=0)],
                 {"w": np.asarray(0.5), "lo": np.asarray(0.0), "hi": np.asarray(6.0)}, {"x": np.linspace(-3, 3, 6)})
    assert build_training_graph(import_model(six)).params == ("w",)


def test_batchnorm_running_stats_not_trainable():
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [n("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1),
             n("ReduceSum", ["y"], ["t"], keepdims=0), n("Mul", ["t", "t"], ["loss"])]
    model = _model(nodes, {"s": rng.standard_normal(2), "b": rng.standard_normal(2), "m": np.zeros(2),
                           "v": np.ones(2)}, {"x": rng.standard_normal((3, 2, 2))}, opset=15)
    assert build_training_graph(import_model(model)).params == ("s", "b")


def test_sgd_momentum_and_weight_decay_update():
    model, feeds = _mlp()
    forward = import_model(model)
    plain = build_training_graph(forward)
    _, grads = gradcheck.run_training_step(plain, feeds)
    options = TrainOptions.from_kwargs(optimizer="sgd", lr=0.1, momentum=0.9, weight_decay=0.01)
    step = build_training_graph(forward, options)
    onnx.checker.check_model(export_model(step.graph), full_check=True)
    sess = gradcheck.ort_session(export_model(step.graph))
    velocity = {p: np.full(forward.tensor(p).shape, 0.5) for p in step.params}
    state = {s.input: velocity[s.input[: -len("_momentum")]] for s in step.state}
    outs = sess.run([step.updates[p] for p in step.params] + [s.output for s in step.state], {**feeds, **state})
    for k, p in enumerate(step.params):
        w = forward.values[forward.by_name[p]]
        v_new = 0.9 * velocity[p] + grads[p] + 0.01 * w
        np.testing.assert_allclose(outs[k], w - 0.1 * v_new, rtol=1e-10)
        np.testing.assert_allclose(outs[len(step.params) + k], v_new, rtol=1e-10)


def test_adam_two_steps_match_numpy():
    model, feeds = _mlp()
    forward = import_model(model)
    options = TrainOptions.from_kwargs(optimizer="adam", lr=0.01, beta1=0.8, beta2=0.99, weight_decay=0.1)
    step = build_training_graph(forward, options)
    names = [step.graph.tensors[t].name for t in step.graph.outputs]
    assert names[0] == "loss" and "adam_step_new" in names and not any(n.endswith("_grad") for n in names)
    sess = gradcheck.ort_session(gradcheck.params_as_inputs(export_model(step.graph), step.params))
    grad_sess = gradcheck.ort_session(gradcheck.params_as_inputs(export_model(build_training_graph(forward).graph),
                                                                 step.params))
    w = {p: forward.values[forward.by_name[p]] for p in step.params}
    m = {p: np.zeros_like(v) for p, v in w.items()}
    v = {p: np.zeros_like(x) for p, x in w.items()}
    state = {s.input: s.initial for s in step.state}
    for t in (1, 2):
        grads = dict(zip(step.params, grad_sess.run([f"{p}_grad" for p in step.params], {**feeds, **w})))
        outs = sess.run([step.updates[p] for p in step.params] + [s.output for s in step.state], {**feeds, **w, **state})
        state = {s.input: o for s, o in zip(step.state, outs[len(step.params):])}
        for k, p in enumerate(step.params):
            g = grads[p] + 0.1 * w[p]
            m[p] = 0.8 * m[p] + 0.2 * g
            v[p] = 0.99 * v[p] + 0.01 * g * g
            expect = w[p] - 0.01 / (1 - 0.8**t) * m[p] / (np.sqrt(v[p]) / np.sqrt(1 - 0.99**t) + 1e-8)
            np.testing.assert_allclose(outs[k], expect, rtol=1e-5, atol=1e-9)
            w[p] = outs[k]
    assert float(state["adam_step"]) == 2.0


@pytest.mark.parametrize("optimizer, taken", [("sgd", "W_momentum"), ("sgd", "W_new"), ("adam", "W_adam_v_new"),
                                              ("adam", "adam_step")])
def test_an_optimizer_name_the_model_already_has_is_named_with_the_fix(optimizer, taken, tmp_path):
    """A model tensor named as the update names one of its outputs or state (``W_momentum``) stopped
    train-graph with "tensor name 'W_momentum' is used twice", exit 1 (a failed check), no fix named."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    model = _model([n("MatMul", ["x", "W"], ["h"]), n("Add", ["h", "c"], [taken]), n("Mul", [taken, taken], ["sq"]),
                    n("ReduceMean", ["sq"], ["loss"], keepdims=0)],
                   {"W": rng.standard_normal((3, 3)), "c": rng.standard_normal(3)}, {"x": rng.standard_normal((2, 3))})
    options = TrainOptions.from_kwargs(optimizer=optimizer, momentum=0.9)
    with pytest.raises(ModelImportError, match=f"the model already has a tensor '{taken}'.*rename that tensor"):
        build_training_graph(import_model(model), options)
    assert build_training_graph(import_model(model)).params == ("W", "c")  # without an optimizer it trains
    path, out = tmp_path / "taken.onnx", tmp_path / "step.onnx"
    onnx.save(model, path)
    code, _, err = memplan("train-graph", path, "-o", out, "--optimizer", optimizer,
                           *(["--momentum", "0.9"] if optimizer == "sgd" else []))
    assert code == 3 and len(err.strip().splitlines()) == 1 and f"'{taken}'" in err and not out.exists(), err


def test_adam_on_float16_weights_keeps_float32_state_and_matches_numpy():
    """Adam on float16 weights went NaN at step 1: eps (1e-8) was a float16 constant, i.e. 0, and a
    squared gradient under ~2e-4 is 0 in float16, so an update divided 0 by 0 (or m by 0). Its moments
    and update are now float32 (mixed precision's fp32 optimizer state); the weight stays float16."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["h"]), n("Add", ["h", "b"], ["a"]), n("Relu", ["a"], ["r"]),
             n("Mul", ["r", "r"], ["sq"]), n("ReduceMean", ["sq"], ["loss"], keepdims=0)]
    w = (rng.standard_normal((16, 8)) * 0.1).astype(np.float16)
    b = np.zeros(8, np.float16)
    b[:4] = -10  # four dead units: their gradients are exactly 0
    x = rng.standard_normal((32, 16)).astype(np.float16)
    model = _model(nodes, {"w": w, "b": b}, {"x": x}, dtype=np.float16, loss_dtype=onnx.TensorProto.FLOAT16)
    forward = import_model(model)
    step = build_training_graph(forward, TrainOptions.from_kwargs(optimizer="adam", lr=0.01))
    exported = export_model(step.graph)
    onnx.checker.check_model(exported, full_check=True)
    dtypes = {i.name: i.type.tensor_type.elem_type for i in (*exported.graph.input, *exported.graph.output)}
    grad_sess = gradcheck.ort_session(gradcheck.params_as_inputs(export_model(build_training_graph(forward).graph),
                                                                 step.params), quiet=True)
    sess = gradcheck.ort_session(gradcheck.params_as_inputs(exported, step.params), quiet=True)
    params = {"w": w, "b": b}
    state = {s.input: s.initial for s in step.state}
    m = {p: np.zeros(v.shape, np.float32) for p, v in params.items()}
    v = {p: np.zeros(x.shape, np.float32) for p, x in params.items()}
    for t in (1, 2):
        grads = dict(zip(step.params, grad_sess.run([f"{p}_grad" for p in step.params], {"x": x, **params})))
        outs = sess.run([step.updates[p] for p in step.params] + [s.output for s in step.state],
                        {"x": x, **params, **state})
        state = {s.input: o for s, o in zip(step.state, outs[len(step.params):])}
        for k, p in enumerate(step.params):
            g = grads[p].astype(np.float32)
            m[p] = 0.9 * m[p] + 0.1 * g
            v[p] = 0.999 * v[p] + 0.001 * g * g
            expect = params[p].astype(np.float32) - 0.01 / (1 - 0.9**t) * m[p] / (
                np.sqrt(v[p]) / np.sqrt(1 - 0.999**t) + 1e-8)
            assert outs[k].dtype == np.float16 and np.isfinite(outs[k]).all()
            np.testing.assert_allclose(outs[k].astype(np.float32), expect, rtol=2e-3, atol=2e-3)
            params[p] = outs[k]
    assert dtypes["w_adam_m"] == dtypes["w_adam_v_new"] == onnx.TensorProto.FLOAT
    assert dtypes["w_new"] == dtypes["b_new"] == onnx.TensorProto.FLOAT16


@pytest.mark.parametrize("fed", [False, True], ids=["constant_mode", "mode_fed_at_run_time"])
def test_dropout_in_training_uses_the_forward_mask(fed):
    """loss = sum(R * dropout(x)) so grad_x = R * mask / (1 - p) and loss == sum(x * grad_x)."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [n("Dropout", ["x", "ratio", "train"], ["y"], seed=5), n("Mul", ["y", "r"], ["yr"]),
             n("ReduceSum", ["yr"], ["loss"], keepdims=0)]
    mode = {"train": np.asarray(True)}
    model = _model(nodes, {"x": rng.standard_normal((8, 16)), "ratio": np.asarray(0.25), **({} if fed else mode)},
                   {"r": rng.standard_normal((8, 16)), **(mode if fed else {})}, opset=17)
    step = build_training_graph(import_model(model), TrainOptions(freeze=("ratio",)))
    feeds = {"r": rng.standard_normal((8, 16)), **(mode if fed else {})}
    loss, grads = gradcheck.run_training_step(step, feeds)
    x = import_model(model).values[import_model(model).by_name["x"]]
    kept = grads["x"] != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(grads["x"][kept], feeds["r"][kept] / 0.75, rtol=1e-12)
    np.testing.assert_allclose(loss, float(np.sum(x * grads["x"])), rtol=1e-10)


def test_same_input_same_model_bytes():
    model, _ = _mlp()
    a = export_model(build_training_graph(import_model(model), TrainOptions.from_kwargs(optimizer="adam")).graph)
    b = export_model(build_training_graph(import_model(model), TrainOptions.from_kwargs(optimizer="adam")).graph)
    assert a.SerializeToString() == b.SerializeToString()


# ---- zoo and torch fixtures ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mlp", "cnn", "gpt", "resnet", pytest.param("unet", marks=pytest.mark.slow)])
def test_zoo_gradients_match_float64_directional_differences(name):
    report = gradcheck.zoo_report(name, size="small")
    param, worst = report.worst
    assert worst < 1e-3, f"{name}: {param} off by {worst:.2e}"


@pytest.mark.parametrize("name", ["resnet", "mobilenetv2", "efficientnet", "vgg", "vit", "gpt2", "bert", "moe", "lstm",
                                  "llama", "decoder23"])
def test_fixture_gradients_match_torch_autograd(name):
    report = gradcheck.fixture_report(FIXTURES / f"{name}.onnx")
    torch_loss = float(np.load(FIXTURES / f"{name}.npz")["loss"])
    assert report.loss == pytest.approx(torch_loss, rel=1e-4)
    param, worst = report.worst
    assert worst < 2e-3, f"{name}: {param} off by {worst:.2e}"


# ---- CLI ----------------------------------------------------------------------------------------
def test_cli_train_graph_writes_checked_model_that_runs(tmp_path):
    out = tmp_path / "step.onnx"
    result = CliRunner().invoke(cli.main, ["train-graph", "zoo:cnn", "-o", str(out), "--optimizer", "sgd",
                                           "--momentum", "0.9", "--json"])
    assert result.exit_code == 0, result.output
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    outputs = [o.name for o in model.graph.output]
    assert outputs[0] == "loss" and all(o.endswith("_new") for o in outputs[1:])
    import models

    feeds = models.example_feeds(model, seed=0)
    values = gradcheck.ort_session(model).run(None, feeds)
    assert np.isfinite(values[0]).all()


def test_cli_unsupported_op_exits_3_without_output(tmp_path):
    model, _ = _det_mlp()
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    result = CliRunner().invoke(cli.main, ["train-graph", str(src), "-o", str(out)])
    assert result.exit_code == 3
    assert result.output.count("\n") == 1 and "'the_det' (Det)" in result.output
    assert not out.exists()


def test_cli_refuses_to_overwrite_input(tmp_path):
    model, _ = _mlp()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    before = src.read_bytes()
    result = CliRunner().invoke(cli.main, ["train-graph", str(src), "-o", str(src)])
    assert result.exit_code == 2 and src.read_bytes() == before


def test_cli_train_loss_falls():
    result = CliRunner().invoke(cli.main, ["train", "zoo:mlp", "--steps", "40", "--json"])
    assert result.exit_code == 0, result.output
    import json

    info = json.loads(result.output)
    assert len(info["losses"]) == 40 and info["task"] == "prototypes"
    assert info["last_mean"] < 0.5 * info["first_mean"]


def test_cli_train_prints_each_step_once():
    for steps, want in ((3, [0, 1, 2]), (25, [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24])):
        result = CliRunner().invoke(cli.main, ["train", "zoo:mlp", "--steps", str(steps)])
        assert result.exit_code == 0, result.output
        printed = [int(line.split()[1]) for line in result.output.splitlines() if line.startswith("step ")]
        assert printed == want
        assert " in 0.00 s " not in result.output  # a fast run still shows its time


def test_cli_inspect_train_counts_backward():
    fwd = CliRunner().invoke(cli.main, ["inspect", "zoo:mlp", "--json"])
    train = CliRunner().invoke(cli.main, ["inspect", "zoo:mlp", "--train", "--json"])
    assert fwd.exit_code == 0 and train.exit_code == 0, train.output
    import json

    assert json.loads(train.output)["peak_bytes"] > json.loads(fwd.output)["peak_bytes"]


def test_custom_domain_op_is_not_mistaken_for_onnx_op():
    """A com.microsoft Gelu has no rule here even though ONNX's Gelu does."""
    model, _ = _mlp(extra_nodes=[helper.make_node("Gelu", ["logits0"], ["logits"], name="ms_gelu",
                                                  domain="com.microsoft")])
    for node in model.graph.node:
        if node.op_type == "Mul":
            node.output[0] = "logits0"
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    vi = helper.make_tensor_value_info("logits", F64, [6, 3])
    model.graph.value_info.append(vi)
    with pytest.raises(ModelImportError, match=r"no gradient rule for node 'ms_gelu' \(com\.microsoft\.Gelu\)"):
        build_training_graph(import_model(model))


def test_shared_gradient_tensor_gets_both_names():
    """Add passes one tensor back to both inputs; each parameter still gets its own output."""
    n = helper.make_node
    nodes = [n("Add", ["a", "b"], ["s"]), n("Identity", ["c"], ["c2"]), n("Mul", ["s", "c2"], ["p"]),
             n("ReduceSum", ["p"], ["loss"], keepdims=0)]
    model = _model(nodes, {"a": np.arange(3.0), "b": np.ones(3), "c": np.asarray(2.0)}, {})
    step = build_training_graph(import_model(model))
    loss, grads = gradcheck.run_training_step(step, {})
    np.testing.assert_allclose(grads["a"], [2.0, 2.0, 2.0])
    np.testing.assert_allclose(grads["b"], [2.0, 2.0, 2.0])
    np.testing.assert_allclose(grads["c"], 6.0)
    assert [step.graph.tensors[t].name for t in step.graph.outputs] == ["loss", "a_grad", "b_grad", "c_grad"]
