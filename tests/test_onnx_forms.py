"""ONNX forms real exporters write that the earlier audits did not cover (the ONNX-forms audit):
model-local functions, zero-size inputs, ... Each runs the CLI in a fresh interpreter, as a user
does, so an import another command happened to load first cannot hide a missing one."""
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import memplan


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def _w(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_inspect_inlines_model_local_functions(tmp_path):
    """A node calling a model-local function (domain my.fn): inspect inlined it with onnx.inliner,
    which `import onnx` does not load; inspect crashed with AttributeError (exit 1, a traceback)
    where plan, which had loaded it through the exporter, worked."""
    square = helper.make_function("my.fn", "Sq", ["a"], ["b"], [helper.make_node("Mul", ["a", "a"], ["b"])],
                                  [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Sq", ["h"], ["y"], domain="my.fn"),
         helper.make_node("ReduceMean", ["y"], ["loss"], keepdims=0)],
        "fn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [numpy_helper.from_array(_w(8, 8), "W")])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.fn", 1)],
                                   ir_version=8, functions=[square]), tmp_path / "localfn.onnx")
    for args in (["inspect", path], ["inspect", path, "--train"]):
        code, out, err = memplan(*args)
        assert code == 0 and "Traceback" not in err, err
        assert "peak" in out


def test_verify_feeds_an_input_with_a_zero_dim(tmp_path):
    """An input of static shape [0, 8] (an empty batch of a side input) imports and plans, but
    verify's seeded inputs took dim_value 0 for a missing size and stopped with a usage error
    (exit 2, "dim 0 has no size")."""
    N = helper.make_node
    graph = helper.make_graph(
        [N("MatMul", ["xz", "W"], ["h"]), N("Relu", ["h"], ["r"]), N("ReduceSum", ["r"], ["s"], keepdims=0),
         N("MatMul", ["x", "W"], ["hx"]), N("ReduceMean", ["hx"], ["m"], keepdims=0), N("Add", ["s", "m"], ["loss"])],
        "zero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                 helper.make_tensor_value_info("xz", TensorProto.FLOAT, [0, 8])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [numpy_helper.from_array(_w(8, 8), "W")])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                 tmp_path / "zero.onnx")
    out_model = tmp_path / "zero.planned.onnx"
    code, _, err = memplan("plan", path, "--budget", "100%", "--time-limit", "2", "--emit", out_model)
    assert code == 0, err
    code, out, err = memplan("verify", path, out_model)
    assert code == 0 and "Traceback" not in err, err
    assert "outputs      equal" in out


def _two_scalar_outputs(tmp_path: Path) -> Path:
    """A model whose first scalar output is a metric (ReduceMax) and whose second is the loss."""
    N = helper.make_node
    graph = helper.make_graph(
        [N("MatMul", ["x", "W"], ["h"]), N("Relu", ["h"], ["r"]), N("ReduceMean", ["r"], ["loss"], keepdims=0),
         N("ReduceMax", ["h"], ["aux"], keepdims=0)],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("aux", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [numpy_helper.from_array(_w(8, 8), "W")])
    return _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                 tmp_path / "two.onnx")


def test_plan_names_the_loss_of_a_model_with_two_scalar_outputs(tmp_path):
    """plan and inspect --train trained the first scalar output, silently, and had no --loss (only
    train-graph had): a model listing a metric before its loss got the metric's gradients. Now a
    warning names the pick and the others, and --loss picks one; verify and the planned model
    follow it."""
    path = _two_scalar_outputs(tmp_path)
    code, _, err = memplan("inspect", path, "--train")
    assert code == 0 and "'aux' as the loss" in err and "'loss'" in err and "--loss" in err, err
    planned = tmp_path / "two.planned.onnx"
    code, _, err = memplan("plan", path, "--budget", "100%", "--time-limit", "2", "--loss", "loss", "--emit", planned)
    assert code == 0 and "as the loss" not in err, err
    assert [o.name for o in onnx.load(planned).graph.output] == ["loss", "W_grad"]
    code, out, err = memplan("verify", path, planned)
    assert code == 0 and "outputs      equal" in out, err
    code, _, err = memplan("inspect", path, "--loss", "nope")
    assert code == 2 and "'nope' is not an output" in err, err
    code, _, err = memplan("plan", path, "--budget", "100%", "--loss", "loss", "--forward")
    assert code == 2 and "--forward" in err, err


def test_data_dependent_shapes_and_optionals_are_named(tmp_path):
    """NonZero, a TopK whose k is an input, a Reshape to a shape computed from data, an Optional:
    each was refused with "a symbolic dim may be unbound (bind it with --dim ...)", which sends the
    user after a --dim that does not exist. The refusal now says what the op is (exit 3, one line)."""
    cases = {
        "nonzero": ("(float[4, 3] x) => (float loss)", "nz = NonZero(h)\n f = Cast<to=1>(nz)\n loss = ReduceSum<keepdims=0>(f)",
                    "data-dependent shape"),
        "topk": ("(float[4, 3] x, int64[1] k) => (float loss)", "v, i = TopK<axis=1>(h, k)\n loss = ReduceMean<keepdims=0>(v)",
                 "data-dependent shape"),
        "reshape": ("(float[4, 3] x, int64[2] s) => (float loss)", "r = Reshape(h, s)\n loss = ReduceMean<keepdims=0>(r)",
                    "data-dependent shape"),
        "optional": ("(float[4, 3] x) => (float loss)", "o = Optional(h)\n e = OptionalGetElement(o)\n loss = ReduceMean<keepdims=0>(e)",
                     "makes an optional"),
    }
    for name, (signature, body, says) in cases.items():
        text = (f'<ir_version: 8, opset_import: ["" : 15]>\ng {signature} <float[3, 3] W = {{1,2,3,4,5,6,7,8,9}}>\n'
                f"{{\n h = MatMul(x, W)\n {body}\n}}")
        path = tmp_path / f"{name}.onnx"
        onnx.save(onnx.parser.parse_model(text), path)
        code, _, err = memplan("inspect", path)
        lines = err.strip().splitlines()
        assert code == 3 and len(lines) == 1 and says in err and "--dim" not in err, (name, err)


def test_control_flow_and_a_taken_gradient_name_say_what_to_do(tmp_path):
    """'node '' is a If' read badly and named no node; "'W_grad' is taken" said nothing to do."""
    branch = lambda v: helper.make_graph(  # noqa: E731
        [helper.make_node("Constant", [], ["o"], value=numpy_helper.from_array(np.full(8, v, np.float32)))],
        f"b{v}", [], [helper.make_tensor_value_info("o", TensorProto.FLOAT, [8])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch(1.0), else_branch=branch(2.0))],
        "cf", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                 tmp_path / "if.onnx")
    code, _, err = memplan("inspect", path)
    assert code == 3 and "node '(unnamed)' is an If; control flow is not supported" in err
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["W_grad"]), helper.make_node("ReduceMean", ["W_grad"], ["loss"],
                                                                              keepdims=0)],
        "taken", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], [numpy_helper.from_array(_w(8, 8), "W")])
    path = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                 tmp_path / "taken.onnx")
    code, _, err = memplan("inspect", path, "--train")
    assert code == 3 and "already has a tensor 'W_grad'" in err and "rename that tensor" in err


def test_check_names_the_loss_of_a_model_with_two_scalar_outputs(tmp_path):
    """plan and inspect took --loss; check, the CI gate, had no way to name it and judged the
    training step of the first scalar output (a metric). Now `--loss` and a config entry's `loss`."""
    import json

    path = _two_scalar_outputs(tmp_path)
    code, out, err = memplan("inspect", path, "--loss", "loss", "--json")
    assert code == 0, err
    peak = json.loads(out)["peak_bytes"]
    code, out, err = memplan("check", path, "--loss", "loss", "--budget", "1MiB", "--no-plan", "--json")
    assert code == 0 and "as the loss" not in err, err
    (row,) = json.loads(out)["results"]
    assert row["unplanned_peak_bytes"] == peak and row["train"] and row["name"].endswith("[train, loss=loss]")
    config = tmp_path / "memplan.toml"
    config.write_text(f'[[check]]\nmodel = "{path.name}"\nbudget = "1MiB"\nplan = false\nloss = "loss"\n')
    code, out, err = memplan("check", "--config", config, "--json")
    assert code == 0 and json.loads(out)["results"][0]["unplanned_peak_bytes"] == peak, err
    config.write_text(f'[[check]]\nmodel = "{path.name}"\nbudget = "1MiB"\nloss = "loss"\nadd_loss = "mean"\n')
    code, _, err = memplan("check", "--config", config)
    assert code == 2 and "give only one of them" in err
