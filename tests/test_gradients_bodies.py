"""Ops differentiated through their ONNX function bodies (passes/autodiff.py ``_with_bodies``):
Attention, RMSNormalization and RotaryEmbedding of opset 23, Swish of opset 24, ReduceLogSum and
CenterCropPad have no rule of their own; where gradients flow through one, it is written as its
body, whose ops have rules. Each variant against float64 central finite differences
(tests/gradcase.py); RotaryEmbedding has only float32 kernels in ORT, so its check runs in float32
with a wider step.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import gradcase
from gradcase import check_gradients, node
from onnx import TensorProto, helper, numpy_helper

from passes.autodiff import TrainOptions, build_training_graph
from passes.onnx_import import import_model
from planner.errors import ModelImportError

B, H, S, D = 2, 2, 3, 4
POSITIONS = np.asarray([[0, 2, 5], [1, 1, 7]], dtype=np.int64)
ROPE = {"opset": 23, "float64": False, "eps": 1e-2}


def rnd(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape)


def qkv(q_shape, kv_shape):
    return {"q": rnd(*q_shape), "k": rnd(*kv_shape, seed=1), "v": rnd(*kv_shape, seed=2)}


# id -> (nodes, params, keyword arguments of check_gradients)
CASES = {
    "rms_norm_last_axis": ([node("RMSNormalization", ["x", "g"], ["y"], axis=-1)],
                           {"x": rnd(2, 3, 4), "g": rnd(4, seed=1)}, {"opset": 23}),
    "rms_norm_two_axes_epsilon": ([node("RMSNormalization", ["x", "g"], ["y"], axis=1, epsilon=1e-3)],
                                  {"x": rnd(2, 3, 4), "g": rnd(3, 4, seed=1)}, {"opset": 23}),
    "attention_4d_longer_keys": ([node("Attention", ["q", "k", "v"], ["y"])],
                                 qkv((B, H, S, D), (B, H, S + 1, D)), {"opset": 23}),
    "attention_3d_heads_causal": ([node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2, kv_num_heads=2,
                                        is_causal=1)], qkv((B, S, 8), (B, S, 8)), {"opset": 23}),
    "attention_grouped_query_scale": ([node("Attention", ["q", "k", "v"], ["y"], q_num_heads=4, kv_num_heads=2,
                                            scale=0.3)], qkv((B, S, 8), (B, S, 4)), {"opset": 23}),
    "attention_float_mask_softcap": ([node("Attention", ["q", "k", "v", "m"], ["y"], softcap=2.0)],
                                     qkv((B, H, S, D), (B, H, S, D)),
                                     {"opset": 23, "consts": {"m": rnd(S, S, seed=5)}, "freeze": ("m",)}),
    # a boolean mask [B, 1, S, S] (every row keeps key 0, so no row is all masked)
    "attention_bool_mask": ([node("Attention", ["q", "k", "v", "m"], ["y"])], qkv((B, H, S, D), (B, H, S, D)),
                            {"opset": 23, "consts": {"m": np.concatenate(
                                [np.ones((B, 1, S, 1), bool), rnd(B, 1, S, S - 1, seed=9) > -0.5], axis=-1)}}),
    # query row 1 of batch 0 sees no key: its output is 0, and no gradient is NaN (in float32: ORT
    # 1.31's float64 kernel gives that row NaN, where its float32 one and ONNX's body give 0)
    "attention_fully_masked_row": ([node("Attention", ["q", "k", "v", "m"], ["y"])], qkv((B, H, S, D), (B, H, S, D)),
                                   {"opset": 23, "float64": False, "eps": 1e-2,
                                    "consts": {"m": np.ones((B, 1, S, S), bool)
                                                            & (np.arange(B * S).reshape(B, 1, S, 1) != 1)}}),
    # past_key/value after an absent attn_mask (named ""), and the present outputs
    "attention_past_and_present": ([node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "pk_out", "pv_out"])],
                                   {**qkv((B, H, S, D), (B, H, S, D)), "pk": rnd(B, H, 2, D, seed=3),
                                    "pv": rnd(B, H, 2, D, seed=4)},
                                   {"opset": 23, "outputs": ("y", "pk_out", "pv_out")}),
    "attention_opset24_qk_output": ([node("Attention", ["q", "k", "v"], ["y", "", "", "qk"], is_causal=1,
                                          qk_matmul_output_mode=3)],
                                    qkv((B, H, S, D), (B, H, S, D)), {"opset": 24, "outputs": ("y", "qk")}),
    # opset 24's key lengths per batch entry (keys past them masked)
    "attention_opset24_nonpad_kv_seqlen": ([node("Attention", ["q", "k", "v", "", "", "", "n"], ["y"])],
                                           qkv((B, H, S, D), (B, H, S, D)),
                                           {"opset": 24, "consts": {"n": np.asarray([2, 3], dtype=np.int64)}}),
    # the softmax in float64 inside a float32 model (Casts around it; a float32 softmax in a float64
    # model is right too, but float64 differences read its rounding)
    "attention_softmax_precision": ([node("Attention", ["q", "k", "v"], ["y"], softmax_precision=11)],
                                    qkv((B, H, S, D), (B, H, S, D)), {"opset": 23, "float64": False, "eps": 1e-2}),
    "rotary_4d": ([node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"])], {"x": rnd(B, H, S, D)},
                  {**ROPE, "consts": {"c": rnd(8, D // 2, seed=6), "s": rnd(8, D // 2, seed=7), "p": POSITIONS},
                   "freeze": ("c", "s")}),
    "rotary_3d_interleaved_partial": ([node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], interleaved=1,
                                            num_heads=2, rotary_embedding_dim=2)], {"x": rnd(B, S, 8)},
                                      {**ROPE, "consts": {"c": rnd(8, 1, seed=6), "s": rnd(8, 1, seed=7),
                                                          "p": POSITIONS}, "freeze": ("c", "s")}),
    "rotary_trainable_caches": ([node("RotaryEmbedding", ["x", "c", "s", "p"], ["y"])],
                                {"x": rnd(B, H, S, D), "c": rnd(8, D // 2, seed=6), "s": rnd(8, D // 2, seed=7)},
                                {**ROPE, "consts": {"p": POSITIONS}}),
    "swish_opset24": ([node("Swish", ["x"], ["y"], alpha=0.7)], {"x": rnd(2, 3)}, {"opset": 24}),
    "reduce_log_sum_axes_input": ([node("ReduceLogSum", ["x", "ax"], ["y"], keepdims=0)],
                                  {"x": np.abs(rnd(2, 3, 4)) + 0.5},
                                  {"opset": 18, "consts": {"ax": np.asarray([1], dtype=np.int64)}}),
    # cropped on axis 1, padded on axis 2
    "center_crop_pad": ([node("CenterCropPad", ["x", "s"], ["y"], axes=[1, 2])], {"x": rnd(2, 5, 4)},
                        {"opset": 18, "consts": {"s": np.asarray([3, 6], dtype=np.int64)}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_body_gradient_matches_finite_differences(case):
    nodes, params, kwargs = CASES[case]
    check_gradients(nodes, params, **kwargs)


def _block(trainable_attention: bool) -> onnx.ModelProto:
    """RMSNormalization -> q/k/v projections -> causal Attention -> loss; with
    ``trainable_attention`` False, the Attention reads graph inputs only and its output is added
    to a weighted term, so no gradient flows through it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), w) for w in ("Wq", "Wk", "Wv")]
    inits.append(numpy_helper.from_array(np.ones(8, np.float32), "g"))
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])]
    nodes = [node("RMSNormalization", ["x", "g"], ["xn"], axis=-1)]
    if trainable_attention:
        nodes += [node("MatMul", ["xn", f"W{c}"], [c]) for c in "qkv"]
        nodes.append(node("Attention", ["q", "k", "v"], ["a"], q_num_heads=2, kv_num_heads=2, is_causal=1))
    else:
        nodes += [node("Attention", ["x", "x", "x"], ["att"], q_num_heads=2, kv_num_heads=2, is_causal=1),
                  node("MatMul", ["xn", "Wq"], ["q"]), node("Add", ["q", "att"], ["a"])]
        inits = inits[:1] + inits[3:]
    nodes.append(node("ReduceSumSquare", ["a"], ["loss"], keepdims=0))
    graph = helper.make_graph(nodes, "block", ins, [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def test_only_the_nodes_gradients_flow_through_are_written_as_bodies():
    ops = lambda model: {n.op_type for n in build_training_graph(import_model(model)).graph.nodes}  # noqa: E731
    through = ops(_block(True))
    assert "Attention" not in through and "RMSNormalization" not in through
    assert {"Softmax", "ReduceMean", "Sqrt"} <= through
    beside = ops(_block(False))
    assert "Attention" in beside and "RMSNormalization" not in beside


def test_frozen_weights_leave_the_op_as_it_is():
    step = build_training_graph(import_model(_block(True)), TrainOptions(freeze=("g",)))
    assert "RMSNormalization" in {n.op_type for n in step.graph.nodes}
    assert sorted(step.params) == ["Wk", "Wq", "Wv"]


def test_an_op_without_rule_or_body_is_still_refused_in_one_line():
    with pytest.raises(ModelImportError, match=r"no gradient rule for node 'det' \(Det\)") as err:
        check_gradients([node("Det", ["x"], ["y"], name="det")], {"x": rnd(2, 3, 3)}, opset=23)
    assert "\n" not in str(err.value)


def test_a_boolean_body_op_stays_native():
    """GreaterOrEqual has a function body too, but no gradient flows through its boolean output:
    the step keeps the node (a leaky step: Where(x >= 0, x, 0.1 x))."""
    nodes = [node("GreaterOrEqual", ["x", "zero"], ["c"]), node("Mul", ["x", "tenth"], ["t"]),
             node("Where", ["c", "x", "t"], ["y"])]
    consts = {"zero": np.zeros(1), "tenth": np.full(1, 0.1)}
    check_gradients(nodes, {"x": rnd(2, 3)}, opset=18, consts=consts, freeze=("zero", "tenth"))
    model = gradcase.build_model(nodes, {"x": rnd(2, 3)}, consts, {}, ("y",), np.float32, 18)
    step = build_training_graph(import_model(model), TrainOptions(freeze=("R_*", "zero", "tenth")))
    assert "GreaterOrEqual" in {n.op_type for n in step.graph.nodes}


def test_the_guarded_softmax_keeps_one_attention_sized_buffer():
    """Attention's body zeroes fully masked rows after its Softmax (a Where): the step keeps only
    the zeroed probabilities, for the Softmax's gradient and P V's, not the Softmax's own output
    as well (a 12-layer opset-23 decoder's training peak: 531.26 -> 435.26 MiB)."""
    nodes = [node("Attention", ["q", "k", "v"], ["y"], q_num_heads=4, kv_num_heads=2, is_causal=1)]
    model = gradcase.build_model(nodes, qkv((B, S, 8), (B, S, 4)), {}, {}, ("y",), np.float32, 23)
    step = build_training_graph(import_model(model), TrainOptions(freeze=("R_*",)))
    kept = lambda op: [reads for name, reads in step.saved.items() if name.endswith(f"_{op}")]  # noqa: E731
    (softmax,), (where,) = kept("Softmax"), kept("Where")
    assert len(softmax) == 1 and "SoftmaxOutSafe" in softmax[0] and where == ()
    assert any(softmax[0] in reads for reads in kept("MatMul"))  # P V reads the same buffer


def test_a_body_onnx_cannot_build_is_named_in_the_no_rule_error(monkeypatch):
    """Where onnx writes no body (its inliner refused the node), the node stays and the error says
    why it has no gradient, in one line."""
    import passes.function_ops as function_ops

    monkeypatch.setattr(function_ops, "function_body", lambda proto, *args: ([proto], []))
    with pytest.raises(ModelImportError, match=r"\(Attention\) \(onnx built no function body") as err:
        build_training_graph(import_model(_block(True)))
    assert "\n" not in str(err.value)
