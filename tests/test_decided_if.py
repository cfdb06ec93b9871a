"""An If whose condition is known once the dims are bound is read as the branch it takes.

TorchScript writes ``x.squeeze(d)`` over a dim exported dynamic as ``If(Shape(x)[d] == 1, Squeeze,
Identity)`` (HF CANINE's downsampling, ``squeeze(-1)`` after a MaxPool); memplan refused every If.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from passes import gradcheck
from passes.autodiff import build_training_graph
from passes.onnx_import import ModelImportError, import_model


def _squeeze_if(dim_value=None, *, branch_init=False, outer_output=False, cond_from_input=False):
    """loss = sum(W * squeeze_last(MatMul(x, V))) where the squeeze is TorchScript's If; x is
    [batch, 3, k] with k symbolic ("k") unless ``dim_value``. ``branch_init``: the then-branch
    takes its axes from an initializer of its own (opset 13's input form); ``outer_output``: the
    else-branch returns the outer value itself (no Identity of its own)."""
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    then_nodes = [helper.make_node("Squeeze", ["h", "axes"], ["sq"])]
    then_inits = [axes] if branch_init else []
    if not branch_init:
        then_nodes.insert(0, helper.make_node("Constant", [], ["axes"], value=axes))
    then_branch = helper.make_graph(then_nodes, "then", [], [helper.make_tensor_value_info("sq", TensorProto.FLOAT,
                                                                                          None)], then_inits)
    else_nodes = [] if outer_output else [helper.make_node("Identity", ["h"], ["same"])]
    else_branch = helper.make_graph(else_nodes, "else", [], [helper.make_tensor_value_info(
        "h" if outer_output else "same", TensorProto.FLOAT, None)])
    k = dim_value if dim_value is not None else "k"
    nodes = [helper.make_node("MatMul", ["x", "V"], ["h"])]
    if cond_from_input:
        cond = "flag"
    else:
        nodes += [helper.make_node("Shape", ["h"], ["shape"]),
                  helper.make_node("Gather", ["shape", "last"], ["size"], axis=0),
                  helper.make_node("Equal", ["size", "one"], ["cond"])]
        cond = "cond"
    nodes += [helper.make_node("If", [cond], ["y"], then_branch=then_branch, else_branch=else_branch, name="sq_if"),
              helper.make_node("Mul", ["y", "W"], ["p"]),
              helper.make_node("ReduceSum", ["p"], ["loss"], keepdims=0)]
    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])]
    if cond_from_input:
        inputs.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    inits = [numpy_helper.from_array(rng.standard_normal((4, k if isinstance(k, int) else 1)).astype(np.float32), "V"),
             numpy_helper.from_array(rng.standard_normal((3,)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array(2, np.int64), "last"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    graph = helper.make_graph(nodes, "squeeze_if", inputs, [helper.make_tensor_value_info("loss", TensorProto.FLOAT,
                                                                                          [])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("branch_init", [False, True])
def test_a_squeeze_if_reads_as_the_squeeze_and_trains_as_torch(branch_init):
    """V is [4, 1]: h is [batch, 3, 1], the condition folds to true and the If is the Squeeze."""
    graph = import_model(_squeeze_if(branch_init=branch_init), {"batch": 2})
    assert not [n for n in graph.nodes if n.op_type == "If"]
    assert graph.tensor("y").shape == (2, 3)
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    _, grads = gradcheck.run_training_step(build_training_graph(graph), {"x": x})
    model = _squeeze_if(branch_init=branch_init)
    v = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    w = numpy_helper.to_array(model.graph.initializer[1]).astype(np.float64)
    h = x.astype(np.float64) @ v  # [2, 3, 1]
    np.testing.assert_allclose(grads["W"], h[..., 0].sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(grads["V"], np.einsum("bij,i->j", x.astype(np.float64), w)[:, None], rtol=1e-5)


@pytest.mark.parametrize("outer_output", [False, True])
def test_the_else_branch_is_taken_where_the_dim_is_not_one(outer_output):
    """V is [4, 3]: h is [batch, 3, 3], squeeze(-1) leaves it as it is (torch's no-op squeeze),
    whether the branch copies h or returns the outer value itself."""
    model = _squeeze_if(3, outer_output=outer_output)
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    model.graph.node[-2].input[1] = "W3"
    model.graph.initializer.append(numpy_helper.from_array(np.arange(9, dtype=np.float32).reshape(3, 3), "W3"))
    graph = import_model(model, {"batch": 2})
    assert not [n for n in graph.nodes if n.op_type == "If"]
    assert graph.tensor("y").shape == (2, 3, 3)
    x = np.ones((2, 3, 4), np.float32)
    loss, grads = gradcheck.run_training_step(build_training_graph(graph), {"x": x})
    v = numpy_helper.to_array(model.graph.initializer[0])
    assert loss == pytest.approx(float(np.sum((x @ v) * np.arange(9).reshape(3, 3))), rel=1e-5)
    np.testing.assert_allclose(grads["V"], np.einsum("bij,ik->jk", x, np.arange(9).reshape(3, 3)), rtol=1e-5)


def test_an_if_on_a_value_the_run_decides_is_still_refused():
    with pytest.raises(ModelImportError, match="'sq_if' is an If; control flow is not supported"):
        import_model(_squeeze_if(cond_from_input=True), {"batch": 2})


def test_the_outer_value_only_a_branch_reads_survives_folding():
    """Folding dropped CANINE's MaxPool: its output was read by the If's branch alone (no node
    input names it), so the inlined Squeeze read a value nothing made."""
    model = _squeeze_if()
    onnx.checker.check_model(model)
    graph = import_model(model, {"batch": 2})
    made = {t.name for n in graph.nodes for t in (graph.tensors[i] for i in n.outputs)}
    assert "h" in made


@pytest.mark.parametrize("opset", [11, 17])
def test_a_squeeze_of_a_dim_that_is_not_one_is_refused_naming_the_export(opset):
    """torch's dynamo exporter wrote HF CANINE's and Mamba-2's ``squeeze(-1)`` over a dim of 4 (16)
    as a Squeeze, which ONNX and ONNX Runtime refuse (torch leaves such a dim): memplan said a
    symbolic dim might be unbound. It now names the Squeeze, the axis and its size."""
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    squeeze = (helper.make_node("Squeeze", ["h", "axes"], ["y"], name="node_squeeze") if opset >= 13
               else helper.make_node("Squeeze", ["h"], ["y"], name="node_squeeze", axes=[-1]))
    nodes = [helper.make_node("MatMul", ["x", "V"], ["h"]), squeeze, helper.make_node("ReduceSum", ["y"], ["loss"],
                                                                                       keepdims=0)]
    graph = helper.make_graph(nodes, "sq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              [numpy_helper.from_array(np.ones((4, 4), np.float32), "V")]
                              + ([axes] if opset >= 13 else []))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    with pytest.raises(ModelImportError) as err:
        import_model(model, {"batch": 2})
    message = str(err.value)
    assert "node 'node_squeeze' (Squeeze) squeezes axis -1 of [2, 3, 4], whose size is 4, not 1" in message
    assert "\n" not in message
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((4, 1), np.float32), "V"))
    assert import_model(model, {"batch": 2}).tensor("y").shape == (2, 3)
