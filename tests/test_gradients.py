"""Every gradient rule alone against float64 central finite differences, through ORT (CPU).

Shapes are tiny and random; the cases cover broadcasting and the attribute variants each rule
handles (Conv groups/strides/pads/dilations, pool variants, BN train mode, LayerNorm axes, Softmax
axes, Resize modes, Gather axes, Slice steps, Pad modes, Split/Concat, loss reductions, Reduce* axes
as attribute or input, Einsum equations, DFT forms). Ties (Max/Min, ReduceMax/Min) and the rules
that keep only their output have tests of their own below.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from gradcase import build_model, check_gradients, node
from passes import gradcheck
from passes.autodiff import build_training_graph
from passes.gradients import supported_ops
from passes.onnx_import import import_model
from planner.errors import ModelImportError

I64 = np.int64


def rnd(*shape, seed=0, low=None):
    """Standard normal values; with ``low``, magnitudes shifted away from 0 (for Div/Log/Sqrt)."""
    v = np.random.default_rng(seed + 7 * len(shape) + sum(shape)).standard_normal(shape)
    return v if low is None else np.abs(v) + low


def ints(*values):
    return np.asarray(values, dtype=I64)


# Each case: id -> (nodes, params, extra keyword arguments of check_gradients).
CASES = {
    # ---- arithmetic with broadcasting ----
    "add_broadcast": ([node("Add", ["a", "b"], ["y"])], {"a": rnd(2, 3, 4), "b": rnd(3, 1)}, {}),
    "sub_broadcast": ([node("Sub", ["a", "b"], ["y"])], {"a": rnd(2, 3), "b": rnd(4, 1, 3)}, {}),
    "mul_broadcast": ([node("Mul", ["a", "b"], ["y"])], {"a": rnd(2, 1, 4), "b": rnd(3, 1)}, {}),
    "div_broadcast": ([node("Div", ["a", "b"], ["y"])], {"a": rnd(2, 3), "b": rnd(3, low=0.5)}, {}),
    "pow_both": ([node("Pow", ["a", "b"], ["y"])], {"a": rnd(2, 3, low=0.5), "b": rnd(3)}, {}),
    # a zero base: d/db 0^b = 0 for b > 0 (the rule gave 0 * log(0) = NaN)
    "pow_exponent_at_zero_base": ([node("Pow", ["a", "b"], ["y"])], {"b": rnd(3, low=1.5)},
                                  {"consts": {"a": np.asarray([0.0, 0.5, 2.0])}, "freeze": ["a"]}),
    # OneHot's values (off, on) carry a gradient: before they were a stop-gradient, silently untrained
    "one_hot_values": ([node("OneHot", ["i", "d", "v"], ["h"], axis=1), node("Mul", ["h", "x"], ["y"])],
                       {"v": rnd(2), "x": rnd(2, 4, 2)},
                       {"consts": {"i": np.asarray([[0, 3], [2, -1]], I64), "d": np.asarray(4, I64)}}),
    "pow_const_int": ([node("Pow", ["a", "e"], ["y"])], {"a": rnd(2, 3)}, {"consts": {"e": np.asarray(3, I64)}}),
    "pow_square": ([node("Pow", ["a", "e"], ["y"])], {"a": rnd(2, 3)},
                   {"consts": {"e": np.asarray(2.0)}, "freeze": ["e"]}),
    "sum_variadic": ([node("Sum", ["a", "b", "c"], ["y"])], {"a": rnd(2, 3), "b": rnd(3), "c": rnd(1, 1)}, {}),
    "fan_out_same_tensor": ([node("Mul", ["a", "a"], ["y"])], {"a": rnd(3, 2)}, {}),
    "max_three_broadcast": ([node("Max", ["a", "b", "c"], ["y"])], {"a": rnd(2, 3), "b": rnd(3), "c": rnd(4, 1, 1)},
                            {}),
    "min_two_broadcast": ([node("Min", ["a", "b"], ["y"])], {"a": rnd(3, 1), "b": rnd(2, 1, 4)}, {}),
    "max_single_input": ([node("Max", ["a"], ["y"])], {"a": rnd(2, 3)}, {}),
    # a tie everywhere: each slot gets g / 2, and the two terms add up to max(a, a)' = 1
    "max_tie_same_tensor": ([node("Max", ["a", "a"], ["y"])], {"a": rnd(3, 2)}, {}),
    # ---- unary ----
    "sqrt": ([node("Sqrt", ["a"], ["y"])], {"a": rnd(2, 3, low=0.5)}, {}),
    "neg": ([node("Neg", ["a"], ["y"])], {"a": rnd(4)}, {}),
    "exp": ([node("Exp", ["a"], ["y"])], {"a": rnd(2, 3)}, {}),
    "log": ([node("Log", ["a"], ["y"])], {"a": rnd(2, 3, low=0.5)}, {}),
    "reciprocal": ([node("Reciprocal", ["a"], ["y"])], {"a": rnd(2, 3, low=0.5)}, {}),
    "abs": ([node("Abs", ["a"], ["y"])], {"a": rnd(2, 5)}, {}),
    "sin": ([node("Sin", ["a"], ["y"])], {"a": rnd(2, 5)}, {}),
    "cos": ([node("Cos", ["a"], ["y"])], {"a": rnd(2, 5)}, {}),
    "identity": ([node("Identity", ["a"], ["y"])], {"a": rnd(2, 5)}, {}),
    "cast_roundtrip": ([node("Cast", ["a"], ["h"], to=1), node("Cast", ["h"], ["y"], to=11)], {"a": rnd(3, 2)},
                       {"eps": 1e-3, "tol64": 1e-3}),  # FD through a float32 cast needs a wide step
    # ---- activations ----
    "relu": ([node("Relu", ["a"], ["y"])], {"a": rnd(3, 4)}, {}),
    "leaky_relu": ([node("LeakyRelu", ["a"], ["y"], alpha=0.1)], {"a": rnd(3, 4)}, {}),
    "leaky_relu_negative_alpha": ([node("LeakyRelu", ["a"], ["y"], alpha=-0.5)], {"a": rnd(3, 4)}, {}),
    "sigmoid": ([node("Sigmoid", ["a"], ["y"])], {"a": rnd(3, 4)}, {}),
    "tanh": ([node("Tanh", ["a"], ["y"])], {"a": rnd(3, 4)}, {}),
    # onnx's reference Erf rounds to float32 (and ORT has no float64 Erf): a wider FD step.
    "erf": ([node("Erf", ["a"], ["y"])], {"a": rnd(3, 4)}, {"eps": 1e-3}),
    "gelu_exact": ([node("Gelu", ["a"], ["y"])], {"a": rnd(3, 4)}, {"opset": 20, "eps": 1e-3}),
    "gelu_tanh": ([node("Gelu", ["a"], ["y"], approximate="tanh")], {"a": rnd(3, 4)}, {"opset": 20}),
    "hard_sigmoid": ([node("HardSigmoid", ["a"], ["y"], alpha=0.3, beta=0.4)], {"a": 3 * rnd(4, 5)}, {}),
    "hard_swish": ([node("HardSwish", ["a"], ["y"])], {"a": 3 * rnd(4, 5)}, {}),
    "clip_both": ([node("Clip", ["a", "lo", "hi"], ["y"])], {"a": rnd(4, 5)},
                  {"consts": {"lo": np.asarray(-0.5), "hi": np.asarray(0.7)}}),
    "clip_min_only": ([node("Clip", ["a", "lo"], ["y"])], {"a": rnd(4, 5)}, {"consts": {"lo": np.asarray(-0.2)}}),
    "softplus": ([node("Softplus", ["a"], ["y"])], {"a": rnd(3, 4)}, {}),
    "prelu_channel_slope": ([node("PRelu", ["x", "s"], ["y"])], {"x": rnd(2, 3, 2, 2), "s": rnd(3, 1, 1)}, {}),
    "prelu_shared_slope": ([node("PRelu", ["x", "s"], ["y"])], {"x": rnd(3, 4), "s": rnd(1)}, {}),
    "prelu_frozen_positive_slope": ([node("PRelu", ["x", "s"], ["y"])], {"x": rnd(2, 4)},
                                    {"consts": {"s": rnd(4, low=0.1)}, "freeze": ["s"]}),
    "elu": ([node("Elu", ["a"], ["y"], alpha=0.7)], {"a": rnd(3, 4)}, {}),
    "elu_negative_alpha": ([node("Elu", ["a"], ["y"], alpha=-0.4)], {"a": rnd(3, 4)}, {}),
    "selu_defaults": ([node("Selu", ["a"], ["y"])], {"a": rnd(3, 4)}, {}),
    "selu_attrs": ([node("Selu", ["a"], ["y"], alpha=2.0, gamma=0.5)], {"a": rnd(3, 4)}, {}),
    # ONNX defines Celu for float32 only: the whole check in float32
    "celu": ([node("Celu", ["a"], ["y"], alpha=0.6)], {"a": rnd(3, 4)}, {"float64": False, "eps": 1e-2}),
    "celu_negative_alpha": ([node("Celu", ["a"], ["y"], alpha=-1.5)], {"a": rnd(3, 4)},
                            {"float64": False, "eps": 1e-2}),
    "thresholded_relu": ([node("ThresholdedRelu", ["a"], ["y"], alpha=0.3)], {"a": rnd(4, 5)}, {"opset": 10}),
    "thresholded_relu_negative_alpha": ([node("ThresholdedRelu", ["a"], ["y"], alpha=-0.5)], {"a": rnd(4, 5)}, {}),
    "softsign": ([node("Softsign", ["a"], ["y"])], {"a": 3 * rnd(3, 4)}, {}),
    "mish": ([node("Mish", ["a"], ["y"])], {"a": 2 * rnd(3, 4)}, {"opset": 18}),
    # ---- softmax family ----
    "softmax_axis1": ([node("Softmax", ["a"], ["y"], axis=1)], {"a": rnd(2, 3, 4)}, {}),
    "softmax_last": ([node("Softmax", ["a"], ["y"])], {"a": rnd(2, 3, 4)}, {}),
    "softmax_opset11_coerced": ([node("Softmax", ["a"], ["y"], axis=1)], {"a": rnd(2, 3, 4)}, {"opset": 11}),
    "log_softmax_axis0": ([node("LogSoftmax", ["a"], ["y"], axis=0)], {"a": rnd(3, 4)}, {}),
    # ---- normalization ----
    "layer_norm_last": ([node("LayerNormalization", ["x", "s", "b"], ["y"])],
                        {"x": rnd(2, 3, 4), "s": rnd(4), "b": rnd(4)}, {"tol64": 1e-4}),
    "layer_norm_axis1_no_bias": ([node("LayerNormalization", ["x", "s"], ["y"], axis=1, epsilon=1e-3)],
                                 {"x": rnd(2, 3, 2), "s": rnd(3, 2)}, {"tol64": 1e-4}),
    "batch_norm_train_4d": ([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                                 training_mode=1)],
                            {"x": rnd(3, 2, 2, 3), "s": rnd(2), "b": rnd(2)},
                            {"consts": {"m": rnd(2), "v": rnd(2, low=0.5)}, "opset": 15}),
    "batch_norm_train_3d": ([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                                  training_mode=1, epsilon=1e-2)],
                            {"x": rnd(4, 3, 2), "s": rnd(3), "b": rnd(3)},
                            {"consts": {"m": rnd(3), "v": rnd(3, low=0.5)}, "opset": 15}),
    "batch_norm_inference": ([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])],
                             {"x": rnd(2, 3, 2, 2), "s": rnd(3), "b": rnd(3)},
                             {"consts": {"m": rnd(3), "v": rnd(3, low=0.5)}}),
    "instance_norm": ([node("InstanceNormalization", ["x", "s", "b"], ["y"])],
                      {"x": rnd(2, 3, 4), "s": rnd(3), "b": rnd(3)}, {}),
    # ---- linear algebra ----
    "matmul_batched_2d": ([node("MatMul", ["a", "b"], ["y"])], {"a": rnd(2, 3, 4), "b": rnd(4, 5)}, {}),
    "matmul_broadcast_batch": ([node("MatMul", ["a", "b"], ["y"])], {"a": rnd(2, 1, 3, 4), "b": rnd(3, 4, 2)}, {}),
    "matmul_1d_left": ([node("MatMul", ["a", "b"], ["y"])], {"a": rnd(4), "b": rnd(2, 4, 3)}, {}),
    "matmul_1d_right": ([node("MatMul", ["a", "b"], ["y"])], {"a": rnd(2, 3, 4), "b": rnd(4)}, {}),
    "matmul_1d_both": ([node("MatMul", ["a", "b"], ["y"])], {"a": rnd(4), "b": rnd(4, seed=1)}, {}),
    "gemm_plain_bias_row": ([node("Gemm", ["a", "b", "c"], ["y"])], {"a": rnd(3, 4), "b": rnd(4, 2), "c": rnd(2)}, {}),
    "gemm_transA": ([node("Gemm", ["a", "b", "c"], ["y"], transA=1, alpha=0.5, beta=2.0)],
                    {"a": rnd(4, 3), "b": rnd(4, 2), "c": rnd(3, 1)}, {}),
    "gemm_transB": ([node("Gemm", ["a", "b"], ["y"], transB=1, alpha=1.5)], {"a": rnd(3, 4), "b": rnd(2, 4)}, {}),
    "gemm_transAB": ([node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1)],
                     {"a": rnd(4, 3), "b": rnd(2, 4), "c": rnd(3, 2)}, {}),
    "einsum_batched_matmul": ([node("Einsum", ["a", "b"], ["y"], equation="bij,bjk->bik")],
                              {"a": rnd(2, 3, 4), "b": rnd(2, 4, 5)}, {}),
    "einsum_index_summed_in_one_operand": ([node("Einsum", ["a", "b"], ["y"], equation="ij,jk->k")],
                                           {"a": rnd(3, 4), "b": rnd(4, 2)}, {}),
    "einsum_attention_scores": ([node("Einsum", ["q", "k"], ["y"], equation="bhqd, bhkd -> bhqk")],
                                {"q": rnd(1, 2, 3, 4), "k": rnd(1, 2, 5, 4)}, {}),
    "einsum_outer": ([node("Einsum", ["a", "b"], ["y"], equation="i,j->ji")], {"a": rnd(3), "b": rnd(4)}, {}),
    "einsum_dot": ([node("Einsum", ["a", "b"], ["y"], equation="i,i->")], {"a": rnd(5), "b": rnd(5, seed=1)}, {}),
    "einsum_implicit_output": ([node("Einsum", ["a", "b"], ["y"], equation="kj,ji")], {"a": rnd(2, 3), "b": rnd(3, 4)},
                               {}),
    "einsum_transpose": ([node("Einsum", ["a"], ["y"], equation="ij->ji")], {"a": rnd(2, 3)}, {}),
    "einsum_one_operand_sum": ([node("Einsum", ["a"], ["y"], equation="ijk->ki")], {"a": rnd(2, 3, 4)}, {}),
    "einsum_identity": ([node("Einsum", ["a"], ["y"], equation="ij->ij")], {"a": rnd(2, 3)}, {}),
    "einsum_one_trainable_operand": ([node("Einsum", ["a", "w"], ["y"], equation="ni,oi->no")], {"w": rnd(3, 4)},
                                     {"inputs": {"a": rnd(2, 4)}}),
    # ---- convolution ----
    "conv_pad1_bias": ([node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": rnd(2, 2, 4, 4), "w": rnd(3, 2, 3, 3), "b": rnd(3)}, {}),
    "conv_stride2_asym_pads": ([node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 0, 0, 1])],
                               {"x": rnd(1, 2, 5, 6), "w": rnd(2, 2, 3, 2)}, {}),
    "conv_dilation2": ([node("Conv", ["x", "w"], ["y"], dilations=[2, 2], pads=[2, 2, 2, 2])],
                       {"x": rnd(1, 2, 5, 5), "w": rnd(2, 2, 3, 3)}, {}),
    "conv_groups2_stride2": ([node("Conv", ["x", "w", "b"], ["y"], group=2, strides=[2, 2], pads=[1, 1, 1, 1])],
                             {"x": rnd(2, 4, 5, 5), "w": rnd(4, 2, 3, 3), "b": rnd(4)}, {}),
    "conv_depthwise": ([node("Conv", ["x", "w"], ["y"], group=3, pads=[1, 1, 1, 1])],
                       {"x": rnd(2, 3, 4, 4), "w": rnd(6, 1, 3, 3)}, {}),
    "conv_same_upper_stride2": ([node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
                                {"x": rnd(1, 2, 5, 4), "w": rnd(2, 2, 3, 3)}, {}),
    "conv_1d": ([node("Conv", ["x", "w", "b"], ["y"], strides=[2], pads=[1, 1])],
                {"x": rnd(2, 3, 7), "w": rnd(2, 3, 3), "b": rnd(2)}, {}),
    "conv_transpose_stride2": ([node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                                     output_padding=[1, 1])],
                               {"x": rnd(1, 2, 3, 3), "w": rnd(2, 3, 3, 3), "b": rnd(3)}, {}),
    "conv_transpose_groups": ([node("ConvTranspose", ["x", "w"], ["y"], group=2, strides=[2, 1])],
                              {"x": rnd(2, 4, 3, 3), "w": rnd(4, 1, 2, 2)}, {}),
    # ---- pools ----
    "maxpool_2x2": ([node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], {"x": rnd(2, 2, 4, 4)}, {}),
    "maxpool_overlap_pads": ([node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                             {"x": rnd(1, 2, 4, 5)}, {}),
    "maxpool_ceil_dilation": ([node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1,
                                    dilations=[1, 2])], {"x": rnd(1, 2, 5, 6)}, {}),
    "avgpool_2x2": ([node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], {"x": rnd(2, 2, 4, 4)}, {}),
    "avgpool_pads_exclude": ([node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                   pads=[1, 1, 1, 1])], {"x": rnd(1, 2, 5, 4)}, {}),
    "avgpool_pads_include": ([node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                   pads=[1, 1, 1, 1], count_include_pad=1)], {"x": rnd(1, 2, 5, 4)}, {}),
    "avgpool_ceil": ([node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
                     {"x": rnd(1, 1, 6, 6)}, {}),
    # HF EfficientNet's pooler: AvgPool2d(320, ceil_mode=True) over a 1x1 map (the window far past the
    # input; the ceil_mode tail is not padding, so count_include_pad counts the input tap alone). ORT
    # has no float64 AveragePool and onnx's reference evaluator gives 0 here: float32 differences
    "avgpool_window_past_input": ([node("AveragePool", ["x"], ["y"], kernel_shape=[320, 320], strides=[320, 320],
                                        ceil_mode=1, count_include_pad=1)], {"x": rnd(2, 3, 1, 1)},
                                  {"float64": False, "eps": 1e-2}),
    "avgpool_window_past_input_ceil": ([node("AveragePool", ["x"], ["y"], kernel_shape=[7, 5], strides=[6, 4],
                                             ceil_mode=1, count_include_pad=1, pads=[1, 0, 1, 0])],
                                       {"x": rnd(1, 2, 8, 3)}, {"float64": False, "eps": 1e-2}),
    "global_avgpool": ([node("GlobalAveragePool", ["x"], ["y"])], {"x": rnd(2, 3, 3, 2)}, {}),
    # ---- reductions ----
    "reduce_mean_attr": ([node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)], {"x": rnd(2, 3, 4)}, {}),
    "reduce_mean_input_opset18": ([node("ReduceMean", ["x", "ax"], ["y"])], {"x": rnd(2, 3, 4)},
                                  {"consts": {"ax": ints(0, 2)}, "opset": 18}),
    "reduce_sum_input": ([node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)], {"x": rnd(2, 3, 4)},
                         {"consts": {"ax": ints(-1)}}),
    "reduce_sum_all": ([node("ReduceSum", ["x"], ["y"])], {"x": rnd(2, 3)}, {}),
    "reduce_sum_attr_opset11": ([node("ReduceSum", ["x"], ["y"], axes=[0, 2])], {"x": rnd(2, 3, 2)}, {"opset": 11}),
    "reduce_sum_noop_empty_axes": ([node("ReduceSum", ["x", "ax"], ["y"], noop_with_empty_axes=1)], {"x": rnd(2, 3)},
                                   {"consts": {"ax": ints()}}),
    "reduce_max_attr_opset13": ([node("ReduceMax", ["x"], ["y"], axes=[1])], {"x": rnd(2, 4, 3)}, {"opset": 13}),
    "reduce_max_input_opset18_keepdims0": ([node("ReduceMax", ["x", "ax"], ["y"], keepdims=0)], {"x": rnd(2, 4, 3)},
                                           {"consts": {"ax": ints(-1, 0)}, "opset": 18}),
    "reduce_max_all": ([node("ReduceMax", ["x"], ["y"], keepdims=0)], {"x": rnd(3, 4)}, {"opset": 18}),
    "reduce_min_attr_keepdims0": ([node("ReduceMin", ["x"], ["y"], axes=[0, 2], keepdims=0)], {"x": rnd(3, 2, 4)},
                                  {}),
    "reduce_min_input_opset18": ([node("ReduceMin", ["x", "ax"], ["y"])], {"x": rnd(3, 5)},
                                 {"consts": {"ax": ints(1)}, "opset": 18}),
    "reduce_sum_square_attr": ([node("ReduceSumSquare", ["x"], ["y"], axes=[1], keepdims=0)], {"x": rnd(2, 3, 4)},
                               {}),
    "reduce_sum_square_input_opset18": ([node("ReduceSumSquare", ["x", "ax"], ["y"])], {"x": rnd(2, 3, 4)},
                                        {"consts": {"ax": ints(0, 2)}, "opset": 18}),
    # noop_with_empty_axes: no axis reduced, the op maps each element alone (x^2)
    "reduce_sum_square_noop_opset18": ([node("ReduceSumSquare", ["x", "ax"], ["y"], noop_with_empty_axes=1)],
                                       {"x": rnd(2, 3)}, {"consts": {"ax": ints()}, "opset": 18}),
    "reduce_l1_attr_opset11": ([node("ReduceL1", ["x"], ["y"], axes=[-1])], {"x": rnd(3, 4)}, {"opset": 11}),
    "reduce_l1_input_opset18": ([node("ReduceL1", ["x", "ax"], ["y"], keepdims=0)], {"x": rnd(3, 4)},
                                {"consts": {"ax": ints(0)}, "opset": 18}),
    "reduce_l2_attr": ([node("ReduceL2", ["x"], ["y"], axes=[1])], {"x": rnd(3, 4)}, {}),
    # a zero row: its gradient is 0 (FD agrees: sqrt(eps^2) on both sides), not NaN
    "reduce_l2_zero_row_opset18": ([node("ReduceL2", ["x", "ax"], ["y"], keepdims=0)],
                                   {"x": np.vstack([rnd(2, 4), np.zeros((1, 4))])},
                                   {"consts": {"ax": ints(1)}, "opset": 18}),
    "reduce_log_sum_exp_attr_opset13": ([node("ReduceLogSumExp", ["x"], ["y"], axes=[0], keepdims=0)],
                                        {"x": rnd(3, 4)}, {"opset": 13}),
    "reduce_log_sum_exp_input_opset18": ([node("ReduceLogSumExp", ["x", "ax"], ["y"])], {"x": rnd(2, 3, 4)},
                                         {"consts": {"ax": ints(1, 2)}, "opset": 18}),
    "reduce_log_sum_exp_all": ([node("ReduceLogSumExp", ["x"], ["y"])], {"x": rnd(2, 3)}, {}),
    # ---- shape ops ----
    "reshape": ([node("Reshape", ["x", "s"], ["y"])], {"x": rnd(2, 3, 4)}, {"consts": {"s": ints(4, -1)}}),
    "flatten": ([node("Flatten", ["x"], ["y"], axis=2)], {"x": rnd(2, 3, 2, 2)}, {}),
    "transpose": ([node("Transpose", ["x"], ["y"], perm=[2, 0, 1])], {"x": rnd(2, 3, 4)}, {}),
    "squeeze_unsqueeze": ([node("Unsqueeze", ["x", "a0"], ["u"]), node("Squeeze", ["u", "a1"], ["y"])],
                          {"x": rnd(2, 1, 3)}, {"consts": {"a0": ints(0, 3), "a1": ints(2)}}),
    "concat_with_const": ([node("Concat", ["a", "k", "b"], ["y"], axis=1)], {"a": rnd(2, 1), "b": rnd(2, 3)},
                          {"inputs": {"k": rnd(2, 2)}}),
    "split_input_unused_output": ([node("Split", ["x", "sp"], ["y0", "y1", "y2"], axis=1)], {"x": rnd(2, 6)},
                                  {"consts": {"sp": ints(1, 2, 3)}, "outputs": ["y0", "y2"]}),
    "split_num_outputs_opset18": ([node("Split", ["x"], ["y0", "y1"], axis=0, num_outputs=2)], {"x": rnd(4, 3)},
                                  {"opset": 18, "outputs": ["y0", "y1"]}),
    "slice_unit_negative": ([node("Slice", ["x", "st", "en", "ax"], ["y"])], {"x": rnd(3, 5)},
                            {"consts": {"st": ints(-4), "en": ints(-1), "ax": ints(1)}}),
    "slice_steps": ([node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], {"x": rnd(5, 6)},
                    {"consts": {"st": ints(4, 0), "en": ints(0, 6), "ax": ints(0, 1), "sp": ints(-1, 2)}}),
    "gather_axis0_const_dupes_negative": ([node("Gather", ["x", "i"], ["y"])], {"x": rnd(4, 3)},
                                          {"consts": {"i": ints(0, 2, 0, -1)}}),
    "gather_axis1_runtime_2d": ([node("Gather", ["x", "i"], ["y"], axis=1)], {"x": rnd(2, 4, 3)},
                                {"inputs": {"i": np.asarray([[1, -1], [1, 0]], I64)}}),
    "gather_scalar_index": ([node("Gather", ["x", "i"], ["y"], axis=1)], {"x": rnd(2, 4)},
                            {"consts": {"i": np.asarray(2, I64)}}),
    "gather_elements_axis1_negative_dupes": ([node("GatherElements", ["x", "i"], ["y"], axis=1)], {"x": rnd(3, 4)},
                                             {"consts": {"i": np.asarray([[0, -1, -1], [2, 0, 3], [-4, 1, 1]], I64)}}),
    "gather_elements_axis0_runtime_smaller": ([node("GatherElements", ["x", "i"], ["y"])], {"x": rnd(3, 4, 2)},
                                              {"inputs": {"i": np.asarray([[[2], [0], [-1]], [[2], [2], [1]]], I64)}}),
    "cumsum": ([node("CumSum", ["x", "ax"], ["y"])], {"x": rnd(3, 4)}, {"consts": {"ax": np.asarray(1, I64)}}),
    "cumsum_exclusive_reverse": ([node("CumSum", ["x", "ax"], ["y"], exclusive=1, reverse=1)], {"x": rnd(2, 5, 2)},
                                 {"consts": {"ax": np.asarray(-2, np.int32)}}),
    "cumsum_exclusive": ([node("CumSum", ["x", "ax"], ["y"], exclusive=1)], {"x": rnd(4, 3)},
                         {"consts": {"ax": np.asarray(0, I64)}}),
    "cumsum_reverse": ([node("CumSum", ["x", "ax"], ["y"], reverse=1)], {"x": rnd(4, 3)},
                       {"consts": {"ax": np.asarray(0, I64)}}),
    "trilu_upper": ([node("Trilu", ["x"], ["y"])], {"x": rnd(2, 3, 4)}, {}),
    "trilu_lower_k": ([node("Trilu", ["x", "k"], ["y"], upper=0)], {"x": rnd(4, 3)},
                      {"consts": {"k": np.asarray(-1, I64)}}),
    "expand": ([node("Expand", ["x", "s"], ["y"])], {"x": rnd(3, 1)}, {"consts": {"s": ints(2, 3, 4)}}),
    "tile": ([node("Tile", ["x", "r"], ["y"])], {"x": rnd(2, 3)}, {"consts": {"r": ints(2, 3)}}),
    "where": ([node("Where", ["c", "a", "b"], ["y"])], {"a": rnd(2, 3), "b": rnd(3)},
              {"consts": {"c": np.asarray([[True, False, True], [False, False, True]])}}),
    # 1-D: the per-axis adjoint contracted a vector as a matrix and failed (fuzzed, stop 49)
    "slice_step2_vector": ([node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], {"x": rnd(5)},
                           {"consts": {"st": ints(0), "en": ints(5), "ax": ints(0), "sp": ints(2)}}),
    "pad_reflect_vector": ([node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": rnd(5)},
                           {"consts": {"p": ints(2, 1)}}),
    "pad_constant": ([node("Pad", ["x", "p"], ["y"])], {"x": rnd(2, 3)}, {"consts": {"p": ints(1, 0, 2, 1)}}),
    "pad_negative": ([node("Pad", ["x", "p"], ["y"])], {"x": rnd(3, 4)}, {"consts": {"p": ints(-1, 1, 0, -2)}}),
    "pad_reflect": ([node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": rnd(1, 2, 3, 4)},
                    {"consts": {"p": ints(0, 0, 2, 1, 0, 0, 1, 3)}}),
    "pad_edge": ([node("Pad", ["x", "p"], ["y"], mode="edge")], {"x": rnd(3, 4)}, {"consts": {"p": ints(2, 1, 0, 3)}}),
    "resize_nearest_asymmetric_floor": (
        [node("Resize", ["x", "", "sc"], ["y"], mode="nearest", coordinate_transformation_mode="asymmetric",
              nearest_mode="floor")], {"x": rnd(1, 2, 3, 3)},
        {"consts": {"sc": np.asarray([1, 1, 2, 2], np.float32)}}),
    "resize_nearest_half_pixel_down": (
        [node("Resize", ["x", "", "sc"], ["y"], mode="nearest")], {"x": rnd(1, 1, 6, 5)},
        {"consts": {"sc": np.asarray([1, 1, 0.5, 0.6], np.float32)}}),
    "resize_linear_half_pixel": (
        [node("Resize", ["x", "", "sc"], ["y"], mode="linear")], {"x": rnd(1, 2, 3, 4)},
        {"consts": {"sc": np.asarray([1, 1, 2, 1.5], np.float32)}}),
    "resize_linear_align_corners_sizes": (
        [node("Resize", ["x", "", "", "sz"], ["y"], mode="linear", coordinate_transformation_mode="align_corners")],
        {"x": rnd(1, 1, 3, 4)}, {"consts": {"sz": ints(1, 1, 5, 7)}}),
    # keep_aspect_ratio_policy maps with sizes / input (5/3), not the rounded output (7/4; stop 49)
    "resize_nearest_keep_ratio_not_smaller": (
        [node("Resize", ["x", "", "", "sz"], ["y"], mode="nearest", axes=[2, 3], keep_aspect_ratio_policy="not_smaller")],
        {"x": rnd(1, 1, 3, 4)}, {"consts": {"sz": ints(5, 5)}, "opset": 18}),
    "resize_linear_keep_ratio_not_larger": (
        [node("Resize", ["x", "", "", "sz"], ["y"], mode="linear", axes=[2, 3], keep_aspect_ratio_policy="not_larger")],
        {"x": rnd(1, 1, 3, 5)}, {"consts": {"sz": ints(7, 7)}, "opset": 18}),
    "resize_linear_pytorch_half_pixel": (
        [node("Resize", ["x", "", "sc"], ["y"], mode="linear", coordinate_transformation_mode="pytorch_half_pixel")],
        {"x": rnd(2, 1, 4, 3)}, {"consts": {"sc": np.asarray([1, 1, 1.5, 2], np.float32)}}),
    # cubic (torch's bicubic interpolate; DINOv2 resamples its position embeddings so): taps past
    # the edges read the edge, or weigh nothing with exclude_outside
    "resize_cubic_half_pixel_up": (
        [node("Resize", ["x", "", "sc"], ["y"], mode="cubic")], {"x": rnd(1, 2, 4, 3)},
        {"consts": {"sc": np.asarray([1, 1, 1.75, 2], np.float32)}}),
    "resize_cubic_pytorch_half_pixel_down": (
        [node("Resize", ["x", "", "", "sz"], ["y"], mode="cubic", coordinate_transformation_mode="pytorch_half_pixel")],
        {"x": rnd(1, 1, 7, 6)}, {"consts": {"sz": ints(1, 1, 3, 4)}}),
    "resize_cubic_align_corners_exclude_outside": (
        [node("Resize", ["x", "", "", "sz"], ["y"], mode="cubic", coordinate_transformation_mode="align_corners",
              exclude_outside=1, cubic_coeff_a=-0.5)], {"x": rnd(1, 1, 3, 5)}, {"consts": {"sz": ints(1, 1, 6, 4)}}),
    "resize_cubic_asymmetric_exclude_outside": (
        [node("Resize", ["x", "", "sc"], ["y"], mode="cubic", coordinate_transformation_mode="asymmetric",
              exclude_outside=1)], {"x": rnd(1, 1, 4, 4)}, {"consts": {"sc": np.asarray([1, 1, 1.5, 0.75], np.float32)}}),
    # ---- losses and dropout ----
    "sce_mean": ([node("SoftmaxCrossEntropyLoss", ["s", "t"], ["y"])], {"s": rnd(4, 3)},
                 {"consts": {"t": ints(0, 2, 1, 2)}}),
    "sce_sum_weights_ignore": ([node("SoftmaxCrossEntropyLoss", ["s", "t", "w"], ["y"], reduction="sum",
                                     ignore_index=1)], {"s": rnd(4, 3)},
                               {"consts": {"t": ints(0, 1, 1, 2)}, "inputs": {"w": rnd(3, low=0.2)}}),
    "sce_mean_weights_ignore_spatial": ([node("SoftmaxCrossEntropyLoss", ["s", "t", "w"], ["y"], ignore_index=-100)],
                                        {"s": rnd(2, 3, 2)},
                                        {"consts": {"t": np.asarray([[0, -100], [2, 1]], I64)},
                                         "inputs": {"w": rnd(3, low=0.2)}}),
    "sce_none": ([node("SoftmaxCrossEntropyLoss", ["s", "t"], ["y"], reduction="none")], {"s": rnd(3, 4)},
                 {"consts": {"t": ints(3, 0, 1)}}),
    # log_prob in the loss too (label smoothing), or alone: its gradient was dropped (fuzzed, stop 49)
    "sce_log_prob_too": ([node("SoftmaxCrossEntropyLoss", ["s", "t"], ["y", "lp"])], {"s": rnd(4, 3)},
                         {"consts": {"t": ints(0, 2, 1, 2)}, "outputs": ["y", "lp"]}),
    "sce_log_prob_only_spatial_ignore": ([node("SoftmaxCrossEntropyLoss", ["s", "t"], ["y", "lp"], ignore_index=1)],
                                         {"s": rnd(2, 3, 2)},
                                         {"consts": {"t": np.asarray([[0, 1], [2, 1]], I64)}, "outputs": ["lp"]}),
    "nll_mean_ignore": ([node("NegativeLogLikelihoodLoss", ["s", "t"], ["y"], ignore_index=0)], {"s": rnd(4, 3)},
                        {"consts": {"t": ints(0, 2, 1, 2)}}),
    "dropout_ratio0_training": ([node("Dropout", ["x", "r", "tm"], ["y"])], {"x": rnd(3, 4)},
                                {"consts": {"r": np.asarray(0.0), "tm": np.asarray(True)}}),
    "dropout_inference": ([node("Dropout", ["x"], ["y"])], {"x": rnd(3, 4)}, {}),
    # training_mode fed at run time, false: the identity (the gradient was scaled by 1/0.7; stop 49)
    "dropout_runtime_mode_off": ([node("Dropout", ["x", "r", "tm"], ["y"])], {"x": rnd(3, 4)},
                                 {"consts": {"r": np.asarray(0.3)}, "inputs": {"tm": np.asarray(False)}}),
    # ---- trigonometric and hyperbolic (inputs inside each domain, away from its edges) ----
    "tan": ([node("Tan", ["a"], ["y"])], {"a": 0.5 * rnd(2, 3)}, {}),
    "sinh_cosh": ([node("Sinh", ["a"], ["s"]), node("Cosh", ["s"], ["y"])], {"a": rnd(2, 3)}, {}),
    "asin_acos": ([node("Asin", ["a"], ["s"]), node("Acos", ["b"], ["c"]), node("Add", ["s", "c"], ["y"])],
                  {"a": 0.8 * np.tanh(rnd(2, 3)), "b": 0.8 * np.tanh(rnd(3, seed=1))}, {}),
    "atan": ([node("Atan", ["a"], ["y"])], {"a": 2 * rnd(2, 3)}, {}),
    "asinh_acosh": ([node("Asinh", ["a"], ["s"]), node("Acosh", ["b"], ["c"]), node("Add", ["s", "c"], ["y"])],
                    {"a": 2 * rnd(2, 3), "b": rnd(3, low=1.2)}, {}),
    "atanh": ([node("Atanh", ["a"], ["y"])], {"a": 0.8 * np.tanh(rnd(2, 3))}, {}),
    # ---- selection: top-k, max pooling over the whole map, index tuples, scatters ----
    "topk_axis1": ([node("TopK", ["x", "k"], ["y", "i"], axis=1)], {"x": rnd(2, 5, 3)},
                   {"consts": {"k": ints(2)}}),
    "topk_smallest_last_axis_values_and_indices_used": (
        [node("TopK", ["x", "k"], ["v", "i"], largest=0), node("Cast", ["i"], ["f"], to=11),
         node("Mul", ["v", "f"], ["y"])], {"x": rnd(3, 4)}, {"consts": {"k": ints(3)}}),
    "global_maxpool": ([node("GlobalMaxPool", ["x"], ["y"])], {"x": rnd(2, 3, 3, 2)}, {}),
    "gather_nd_const_dupes_negative": ([node("GatherND", ["x", "i"], ["y"])], {"x": rnd(3, 4, 2)},
                                       {"consts": {"i": np.asarray([[0, 1], [2, -1], [0, 1]], I64)}, "opset": 16}),
    "gather_nd_runtime_slices": ([node("GatherND", ["x", "i"], ["y"])], {"x": rnd(4, 3)},
                                 {"inputs": {"i": np.asarray([[[-1], [1]], [[0], [-1]]], I64)}, "opset": 16}),
    "scatter_elements_none_axis0": ([node("ScatterElements", ["d", "i", "u"], ["y"])],
                                    {"d": rnd(3, 4), "u": rnd(2, 4, seed=1)},
                                    {"consts": {"i": np.asarray([[1, 0, 2, -2], [2, 1, 0, 0]], I64)}}),
    "scatter_elements_add_dupes_axis1": ([node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction="add")],
                                         {"d": rnd(2, 4), "u": rnd(2, 3, seed=1)},
                                         {"consts": {"i": np.asarray([[1, 1, 3], [0, 2, 0]], I64)}, "opset": 16}),
    "scatter_nd_none_rows_negative": ([node("ScatterND", ["d", "i", "u"], ["y"])],
                                      {"d": rnd(4, 3), "u": rnd(2, 3, seed=1)},
                                      {"consts": {"i": np.asarray([[-1], [1]], I64)}}),
    "scatter_nd_add_dupes_runtime": ([node("ScatterND", ["d", "i", "u"], ["y"], reduction="add")],
                                     {"d": rnd(3, 2), "u": rnd(3, seed=1)},
                                     {"inputs": {"i": np.asarray([[0, 1], [2, 0], [0, 1]], I64)}, "opset": 16}),
    "mod_fmod_broadcast": ([node("Mod", ["a", "b"], ["y"], fmod=1)],
                           {"a": 3 * rnd(2, 3), "b": rnd(3, low=0.7)}, {}),
    "lp_normalization_l2_axis1": ([node("LpNormalization", ["x"], ["y"], axis=1)], {"x": rnd(2, 3, 4)}, {}),
    "lp_normalization_l1_last": ([node("LpNormalization", ["x"], ["y"], p=1)], {"x": rnd(3, 4)}, {}),
    # Hardmax is piecewise constant (STOP_GRADIENT): d(a * hardmax(a)) = hardmax(a) away from ties
    "hardmax_stops_gradient": ([node("Hardmax", ["a"], ["h"]), node("Mul", ["a", "h"], ["y"])], {"a": rnd(3, 4)}, {}),
    # ---- DFT: forward/inverse, real/complex, one-sided, dft_length, opset 17 attribute / 20 input ----
    "dft_real": ([node("DFT", ["x"], ["y"])], {"x": rnd(2, 5, 3, 1)}, {}),
    "dft_complex_last_signal_axis": ([node("DFT", ["x"], ["y"], axis=-2)], {"x": rnd(2, 3, 6, 2)}, {}),
    "dft_inverse_complex": ([node("DFT", ["x"], ["y"], inverse=1, axis=2)], {"x": rnd(2, 3, 5, 2)}, {}),
    "dft_inverse_real": ([node("DFT", ["x"], ["y"], inverse=1)], {"x": rnd(2, 4, 1)}, {}),
    "dft_rank2_complex": ([node("DFT", ["x"], ["y"], axis=0)], {"x": rnd(5, 2)}, {}),
    # one-sided (RFFT): the dropped bins get no gradient; even and odd lengths keep n // 2 + 1 bins
    "dft_onesided_even": ([node("DFT", ["x"], ["y"], onesided=1)], {"x": rnd(2, 6, 3, 1)}, {}),
    "dft_onesided_odd_axis0": ([node("DFT", ["x"], ["y"], onesided=1, axis=0)], {"x": rnd(5, 3, 1)}, {}),
    # dft_length below the axis (the tail is unread) and above it (zero padding; 8 takes ORT's radix-2 path)
    "dft_length_shorter": ([node("DFT", ["x", "n"], ["y"])], {"x": rnd(2, 6, 2)},
                           {"consts": {"n": np.asarray(4, I64)}}),
    "dft_length_longer_onesided": ([node("DFT", ["x", "n"], ["y"], onesided=1)], {"x": rnd(3, 5, 1)},
                                   {"consts": {"n": np.asarray(8, np.int32)}}),
    "dft_length_longer_inverse": ([node("DFT", ["x", "n"], ["y"], inverse=1)], {"x": rnd(2, 4, 2)},
                                  {"consts": {"n": np.asarray(7, I64)}}),
    # opset 20: axis an input (default -2 where absent), dft_length omitted or given
    "dft_opset20_default_axis": ([node("DFT", ["x"], ["y"])], {"x": rnd(2, 3, 5, 2)}, {"opset": 20}),
    "dft_opset20_axis_input": ([node("DFT", ["x", "", "ax"], ["y"])], {"x": rnd(2, 5, 3, 2)},
                               {"consts": {"ax": np.asarray(1, I64)}, "opset": 20}),
    "dft_opset20_onesided_length_axis": ([node("DFT", ["x", "n", "ax"], ["y"], onesided=1)], {"x": rnd(4, 3, 1)},
                                         {"consts": {"n": np.asarray(5, I64), "ax": np.asarray(-3, I64)}, "opset": 20}),
    # inverse one-sided (IRFFT): the imaginary parts of bin 0 and of bin n / 2 (even n) are unread
    "dft_irfft_even": ([node("DFT", ["x"], ["y"], inverse=1, onesided=1)], {"x": rnd(2, 4, 3, 2)}, {"opset": 20}),
    "dft_irfft_odd_length": ([node("DFT", ["x", "n"], ["y"], inverse=1, onesided=1, axis=2)], {"x": rnd(2, 3, 4, 2)},
                             {"consts": {"n": np.asarray(7, I64)}}),
    # FNet's Fourier mixing (torch.fft.fftn over two axes, real part): a complex input built from a real one
    "dft_fnet_mixing": ([node("Unsqueeze", ["h", "last"], ["re"]), node("Concat", ["re", "im"], ["c"], axis=-1),
                         node("DFT", ["c"], ["f2"], axis=2), node("DFT", ["f2"], ["f1"], axis=1),
                         node("Gather", ["f1", "zero"], ["y"], axis=3)],
                        {"h": rnd(2, 4, 3)},
                        {"consts": {"last": ints(-1), "im": np.zeros((2, 4, 3, 1)), "zero": np.asarray(0, I64)},
                         "freeze": ["im"]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_finite_differences(case):
    nodes, params, kwargs = CASES[case]
    check_gradients(nodes, params, **kwargs)


def test_every_rule_has_a_case():
    """Each registered op type appears in at least one case above or in tests/test_gradients_more.py
    or tests/test_gradients_sampling.py."""
    from tests.test_gradients_more import CASES as MORE_CASES
    from tests.test_gradients_sampling import CASES as SAMPLING_CASES

    used = {n.op_type for cases in (CASES, MORE_CASES, SAMPLING_CASES) for nodes, _, _ in cases.values() for n in nodes}
    assert set(supported_ops()) <= used, f"untested rules: {sorted(set(supported_ops()) - used)}"


def _training_step(nodes, params, consts=None, opset=17, dtype=np.float64):
    return build_training_graph(import_model(build_model(nodes, params, consts or {}, {}, ["y"], dtype, opset)))


@pytest.mark.parametrize("equation, shapes, problem", [
    ("ii->i", [(3, 3)], "repeated within one operand"),
    ("ij,jj->i", [(2, 3), (3, 3)], "repeated within one operand"),
    ("...ij,jk->...ik", [(2, 3, 4), (4, 5)], "ellipsis"),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], "3 operands"),
])
def test_unsupported_einsum_names_node_and_equation(equation, shapes, problem):
    names = [f"p{k}" for k in range(len(shapes))]
    nodes = [node("Einsum", names, ["y"], equation=equation, name="the_einsum")]
    with pytest.raises(ModelImportError) as err:
        _training_step(nodes, {n: rnd(*s) for n, s in zip(names, shapes)})
    message = str(err.value)
    assert "'the_einsum' (Einsum)" in message and repr(equation) in message and problem in message


@pytest.mark.parametrize("nodes, params, consts, opset", [
    ([node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], name="mp")], {"x": rnd(1, 2, 5, 5)}, {}, 11),
    ([node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], dilations=[2, 2], name="mp")],
     {"x": rnd(1, 2, 5, 5)}, {}, 11),
    ([node("Gather", ["x", "i"], ["y"], axis=0, name="g")], {"x": rnd(5, 3)}, {"i": np.asarray([0, 2, 2, 4], I64)}, 13),
    ([node("GatherElements", ["x", "i"], ["y"], name="ge")], {"x": rnd(2, 3)}, {"i": np.asarray([[1, 0, 1], [1, 1, 0]], I64)}, 15),
    ([node("GatherND", ["x", "i"], ["y"], name="gn")], {"x": rnd(2, 3)}, {"i": np.asarray([[0], [1]], I64)}, 15),
    # a training BatchNormalization of opset 13 (its statistics outputs, the saved ones unread): the
    # converter refused outputs 4-5 and dropped the mode (fuzz_e2e --ops more --opset 13, seed 605)
    ([node("BatchNormalization", ["x", "sc", "b", "m", "v"], ["n", "rm", "rv", "sm", "sv"], epsilon=1e-5, name="bn"),
      node("Gather", ["n", "i"], ["y"], axis=0, name="g")],
     {"x": rnd(4, 2, 3), "sc": rnd(2, seed=1), "b": rnd(2, seed=2)},
     {"m": np.full(2, 1e-3), "v": np.full(2, 1.001), "i": np.asarray([0, 2, 2], I64)}, 13),
], ids=["maxpool_overlap_opset11", "maxpool_dilated_overlap_opset11", "gather_opset13", "gather_elements_opset15",
        "gather_nd_opset15", "train_batchnorm_gather_opset13"])
def test_gradients_that_need_opset16_upgrade_the_model(nodes, params, consts, opset, caplog):
    """Their gradients scatter-add (opset 16): the model is upgraded by onnx's version converter,
    with a warning, and the gradients still match finite differences of the original model."""
    check_gradients(nodes, params, consts=consts, opset=opset)
    assert f"from opset {opset} to 16 with onnx's version converter" in caplog.text
    step = _training_step(nodes, params, consts, opset=opset)
    assert step.graph.opsets[""] == 16


LEGACY_X = rnd(1, 2, 3, 4)
LEGACY_FD = {"float64": False, "eps": 1e-2}  # onnx's reference evaluator runs none of these old forms


@pytest.mark.parametrize("nodes, params, kwargs", [
    ([node("Upsample", ["x"], ["y"], mode="linear", scales=[1.0, 1.0, 2.0, 2.0])], {"x": LEGACY_X},
     {"opset": 7, **LEGACY_FD}),
    ([node("Upsample", ["x", "s"], ["y"], mode="nearest")], {"x": LEGACY_X},
     {"consts": {"s": np.asarray([1, 1, 3, 2.5], np.float32)}, "opset": 9, **LEGACY_FD}),
    ([node("Resize", ["x", "s"], ["y"], mode="linear")], {"x": LEGACY_X},
     {"consts": {"s": np.asarray([1, 1, 2, 3], np.float32)}, "opset": 10, **LEGACY_FD}),
    ([node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)],
     {"x": LEGACY_X}, {"opset": 7}),
    ([node("BatchNormalization", ["x", "sc", "b", "m", "v"], ["y"], spatial=1)],
     {"x": LEGACY_X, "sc": rnd(2, seed=1), "b": rnd(2, seed=2)},
     {"consts": {"m": np.zeros(2), "v": np.ones(2)}, "opset": 7}),
    ([node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])], {"x": LEGACY_X}, {"opset": 8}),
    ([node("Slice", ["x"], ["y"], starts=[1], ends=[3], axes=[3])], {"x": LEGACY_X}, {"opset": 9}),
], ids=["upsample7_linear", "upsample9_nearest_fractional", "resize10_linear", "averagepool7", "batchnorm7",
        "maxpool8_indices", "slice9"])
def test_models_older_than_opset_11_are_upgraded_and_train(nodes, params, kwargs, caplog):
    """Gradients are written in opset-11 ops (Expand, ConstantOfShape, Pad with inputs): older
    models are upgraded first, Upsample and Resize-10 keeping their asymmetric coordinates (onnx's
    adapters drop them: 0.7 off on unit-normal inputs in linear mode)."""
    check_gradients(nodes, params, **kwargs)
    assert f"from opset {kwargs['opset']} to 16 with onnx's version converter: memplan writes gradients" in caplog.text


def test_an_upgrade_that_changes_the_outputs_is_refused(monkeypatch):
    monkeypatch.setattr("passes.opset_upgrade._legacy_resize", lambda model: None)
    nodes = [node("Resize", ["x", "s"], ["y"], mode="linear")]
    with pytest.raises(ModelImportError) as err:
        _training_step(nodes, {"x": LEGACY_X}, {"s": np.asarray([1, 1, 2, 2], np.float32)}, opset=10,
                       dtype=np.float32)
    message = str(err.value)
    assert "\n" not in message and "could not upgrade 'case' from opset 10 to 16 (output 'loss' differs by" in message
    assert message.endswith("export the model with opset >= 11")


def test_a_large_forward_is_not_run_to_check_its_upgrade(monkeypatch, caplog):
    """--max-batch probes large batches: the check would run a forward of GiBs at each."""
    monkeypatch.setattr("passes.opset_upgrade.CHECK_MAX_BYTES", 0)
    monkeypatch.setattr("passes.opset_upgrade._check_same", lambda old, new: pytest.fail("ran the check"))
    nodes = [node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2])]
    step = _training_step(nodes, {"x": LEGACY_X}, opset=9)
    assert step.graph.opsets[""] == 16
    assert "the upgrade of 'case' is not checked in ORT: its forward peaks at" in caplog.text


def test_an_upgrade_sets_large_weights_aside_and_puts_them_back(monkeypatch):
    """onnx's converter serializes the model (protobuf's 2 GB): weights above ASIDE_BYTES never go
    into its proto (the graph keeps them) and the import takes them from the graph by name.
    Lowered here so that x (392 B) goes aside and w (216 B) stays."""
    from passes import opset_upgrade

    monkeypatch.setattr("passes.onnx_import.ASIDE_BYTES", 300)
    monkeypatch.setattr("passes.onnx_export.EXTERNAL_MIN_BYTES", 100)
    seen = []
    convert = opset_upgrade.version_converter.convert_version

    def spy(model, target):
        seen.append({t.name: (len(t.raw_data), t.data_location) for t in model.graph.initializer})
        return convert(model, target)

    monkeypatch.setattr(opset_upgrade.version_converter, "convert_version", spy)
    nodes = [node("Conv", ["x", "w"], ["c"]), node("MaxPool", ["c"], ["y"], kernel_shape=[3, 3], strides=[2, 2])]
    check_gradients(nodes, {"x": rnd(1, 2, 7, 7), "w": rnd(3, 2, 3, 3, seed=1)}, opset=9)
    assert seen and seen[0]["x"] == (0, onnx.TensorProto.EXTERNAL)
    assert seen[0]["w"] == (216, onnx.TensorProto.DEFAULT)


def test_an_upgrade_keeps_frozen_initializers_frozen():
    """A weight folded from a constant (ConstantOfShape, as in the ONNX zoo's light models) gets no
    gradient before the upgrade, so none after it either."""
    nodes = [node("ConstantOfShape", ["shape"], ["c"], value=numpy_helper.from_array(np.asarray([0.5]))),
             node("Mul", ["x", "c"], ["m"]),
             node("MaxPool", ["m"], ["y"], kernel_shape=[3, 3], strides=[2, 2])]
    params, consts = {"x": rnd(1, 2, 5, 5)}, {"shape": np.asarray([1, 2, 5, 5], I64)}
    upgraded = _training_step(nodes, params, consts, opset=11)
    same = _training_step(nodes, params, consts, opset=16)
    assert upgraded.graph.opsets[""] == 16
    assert "x" in upgraded.params and upgraded.params == same.params


def test_an_upgrade_the_converter_cannot_make_is_refused_in_one_line(monkeypatch):
    def fail(model, target):
        raise RuntimeError("/project/onnx/version_converter/BaseConverter.h:66: adapter_lookup: Assertion `false` "
                           "failed: No Adapter For MaxPool\nmore detail")

    monkeypatch.setattr("passes.opset_upgrade.version_converter.convert_version", fail)
    nodes = [node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], name="mp")]
    with pytest.raises(ModelImportError) as err:
        _training_step(nodes, {"x": rnd(1, 2, 5, 5)}, opset=11)
    message = str(err.value)
    assert "\n" not in message
    assert "'mp' (MaxPool) has overlapping windows" in message and "(No Adapter For MaxPool)" in message
    assert "BaseConverter" not in message
    assert "from opset 11 to 16" in message and message.endswith("export the model with opset >= 16")


def test_global_max_pool_splits_ties_evenly():
    """As ReduceMax: each channel's g is shared between its tied maxima (FD cannot check a kink)."""
    x = np.asarray([[[[1.0, 3.0], [3.0, 0.0]], [[2.0, 2.0], [2.0, 2.0]]]], np.float32)  # ORT: float32 only
    nodes = [node("GlobalMaxPool", ["x"], ["m"]), node("ReduceSum", ["m"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "tie", [], [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              initializer=[numpy_helper.from_array(x, "x")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _, grads = gradcheck.run_training_step(build_training_graph(import_model(model)), {})
    np.testing.assert_allclose(grads["x"], [[[[0, 0.5], [0.5, 0]], [[0.25, 0.25], [0.25, 0.25]]]])


def test_celu_with_zero_alpha_is_refused_in_one_line():
    nodes = [node("Celu", ["x"], ["y"], alpha=0.0, name="c0")]
    with pytest.raises(ModelImportError, match=r"'c0' \(Celu\) has alpha = 0"):
        _training_step(nodes, {"x": rnd(2, 3)}, dtype=np.float32)


def test_reduce_max_splits_ties_evenly():
    """ReduceMax: g is shared evenly between tied maxima (FD cannot check a tie: it is a kink)."""
    x = np.asarray([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0], [5.0, 5.0, 5.0]])
    nodes = [node("ReduceMax", ["x"], ["m"], axes=[1], keepdims=0), node("ReduceSum", ["m"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "tie", [], [helper.make_tensor_value_info("loss", onnx.TensorProto.DOUBLE, [])],
                              initializer=[numpy_helper.from_array(x, "x")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    _, grads = gradcheck.run_training_step(build_training_graph(import_model(model)), {})
    np.testing.assert_allclose(grads["x"], [[0, 0.5, 0.5], [0.5, 0, 0.5], [1 / 3, 1 / 3, 1 / 3]])


@pytest.mark.parametrize("op, attrs, saved", [
    ("Softsign", {}, ["y"]),
    ("Celu", {"alpha": 0.5}, ["y"]),
    ("Elu", {"alpha": 0.5}, ["y"]),
    ("Elu", {"alpha": -0.5}, ["x"]),
    ("ThresholdedRelu", {"alpha": 0.5}, ["y"]),
])
def test_activation_keeps_its_output_where_that_suffices(op, attrs, saved):
    dtype = np.float32 if op == "Celu" else np.float64  # ONNX's Celu is float32 only
    step = _training_step([node(op, ["x"], ["y"], name="act", **attrs)], {"x": rnd(2, 3)}, dtype=dtype)
    assert list(step.saved["act"]) == saved


def test_batch_norm_before_opset14_with_statistics_outputs_trains_on_batch_statistics():
    """Opset 7-13 BatchNormalization is in training mode when it has its mean/var outputs (ORT
    runs it on batch statistics). The importer dropped those unread outputs (the exported node had
    empty output names, on which ORT crashed) and the rule used the running statistics."""
    nodes = [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv", "sm", "sv"], epsilon=1e-3)]
    params = {"x": rnd(3, 2, 2, 2), "s": rnd(2), "b": rnd(2)}
    consts = {"m": rnd(2), "v": rnd(2, low=0.5)}
    forward = import_model(build_model(nodes, params, consts, {}, ["y"], np.float64, 12))
    assert -1 not in forward.nodes[0].outputs  # all five outputs kept: they set the mode
    check_gradients(nodes, params, consts=consts, opset=12)


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization_of_a_zero_vector_has_a_finite_gradient(p):
    """A zero vector (ORT's forward maps it to 0) divided g by a zero norm: NaNs, which reach every
    weight before it. It now gets g (n = 0 taken as 1); the other vectors keep the exact gradient."""
    x = np.vstack([rnd(2, 3), np.zeros((1, 3))])
    step = _training_step([node("LpNormalization", ["x"], ["y"], axis=1, p=p)], {"x": x})
    _, grads = gradcheck.run_training_step(step, {})
    weights = gradcheck.initializer_values(step.graph, ["R_0"])["R_0"]
    norm = np.linalg.norm(x[:2], ord=p, axis=1, keepdims=True)
    y = x[:2] / norm
    d = y if p == 2 else np.sign(x[:2])
    want = (weights[:2] - d * np.sum(weights[:2] * y, axis=1, keepdims=True)) / norm
    assert np.all(np.isfinite(grads["x"]))
    np.testing.assert_allclose(grads["x"][:2], want, rtol=1e-9)
    np.testing.assert_allclose(grads["x"][2], weights[2])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_ceil_mode_pool_whose_last_window_starts_past_the_input_has_ort_size(op):
    """ceil_mode=1, size 4, kernel 1, stride 2: onnx's shape inference gives 3 outputs per axis, ORT
    drops the window that would start at 4 (past the input) and gives 2. memplan planned 3 and its
    backward failed in ORT (Reshape of 8 Indices to 18); the pool is now the equivalent
    ceil_mode=0 one, of ORT's size, and its gradient matches finite differences."""
    x = rnd(1, 2, 4, 4).astype(np.float32)
    nodes = [node(op, ["x"], ["p"], kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1),
             node("ReduceSumSquare", ["p"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "ceil", [], [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                              initializer=[numpy_helper.from_array(x, "x")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    forward = import_model(model)
    assert forward.tensor("p").shape == (1, 2, 2, 2)
    loss, grads = gradcheck.run_training_step(build_training_graph(forward), {})
    want = np.zeros_like(x)
    want[:, :, ::2, ::2] = 2 * x[:, :, ::2, ::2]  # d sum(p^2) / dx at the sampled positions
    np.testing.assert_allclose(grads["x"], want, rtol=1e-6)
    assert loss == pytest.approx(float(np.sum(x[:, :, ::2, ::2].astype(np.float64) ** 2)), rel=1e-6)


def test_average_pool_window_past_the_input_spreads_no_more_than_the_input():
    """HF EfficientNet's pooler (AvgPool2d(320, ceil_mode=True) over its 1x1 map): the backward
    spread the gradient over the whole 320x320 window with ConvTranspose and cropped it to the
    input after: 3.91 GiB at batch 32 (the model's unplanned training peak, 99.6% of it)."""
    nodes = [node("AveragePool", ["x"], ["y"], kernel_shape=[320, 320], strides=[320, 320], ceil_mode=1,
                  count_include_pad=1)]
    step = _training_step(nodes, {"x": rnd(2, 3, 1, 1)}, dtype=np.float32)
    biggest = max(t.nbytes for t in step.graph.tensors if t.dtype == "float32")
    assert biggest <= 2 * 3 * 4, f"a backward tensor of {biggest} bytes for a 24-byte input"


def test_same_padded_conv_transpose_with_output_padding_is_refused_in_one_line():
    """ORT makes a SAME ConvTranspose input * stride (3 -> 6); onnx's shape inference adds
    output_padding (7): memplan planned a 7-row output and built its gradient for it."""
    nodes = [node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], auto_pad="SAME_UPPER", output_padding=[1, 0],
                  name="up")]
    with pytest.raises(ModelImportError) as err:
        _training_step(nodes, {"x": rnd(1, 2, 3, 3), "w": rnd(2, 3, 3, 2)}, dtype=np.float32)
    message = str(err.value)
    assert "\n" not in message
    assert "'up' (ConvTranspose, auto_pad=SAME_UPPER)" in message and "[6, 6]" in message and "[7, 6]" in message


@pytest.mark.parametrize("op, w_shape, channels", [("Conv", (4, 2, 1, 1), 4), ("ConvTranspose", (2, 3, 1, 1), 6)])
def test_conv_bias_not_over_output_channels_is_refused_in_one_line(op, w_shape, channels):
    """onnx's shape inference lets any bias through; ORT fails the run ("bias must be a 1D tensor of
    size output_channels"). torch's dynamo exporter with optimize=False wrote a bias-free Conv3d's
    bias as [64, 2]; a bias of the right size imports."""
    group = {"group": 2} if op == "ConvTranspose" else {}
    feeds = {"x": rnd(1, 2, 3, 3), "w": rnd(*w_shape)}
    with pytest.raises(ModelImportError) as err:
        _training_step([node(op, ["x", "w", "b"], ["y"], name="c", **group)], {**feeds, "b": rnd(channels, 2)},
                       dtype=np.float32)
    message = str(err.value)
    assert "\n" not in message
    assert f"'c' ({op}) has a bias of shape [{channels}, 2]" in message and f"its {channels} output channels" in message
    _training_step([node(op, ["x", "w", "b"], ["y"], name="c", **group)], {**feeds, "b": rnd(channels)},
                   dtype=np.float32)


@pytest.mark.parametrize("nodes, consts, inputs, opset, problem", [
    ([node("DFT", ["x", "n"], ["y"], inverse=1, onesided=1, name="d")], {"n": np.asarray(9, I64)}, {}, 17,
     "'d' (DFT) is an inverse one-sided DFT (IRFFT) of 4 bins with dft_length 9"),
    ([node("DFT", ["x", "", "ax"], ["y"], name="d")], {}, {"ax": np.asarray(1, I64)}, 20,
     "'d' (DFT) has a axis input computed at run time"),
], ids=["irfft_length_not_the_bins", "runtime_axis"])
def test_dft_forms_without_a_gradient_are_refused_in_one_line(nodes, consts, inputs, opset, problem):
    model = build_model(nodes, {"x": rnd(2, 4, 3, 2)}, consts, inputs, ["y"], np.float64, opset)
    with pytest.raises(ModelImportError) as err:
        build_training_graph(import_model(model))
    message = str(err.value)
    assert "\n" not in message and problem in message


def test_dft_keeps_nothing_for_its_backward():
    """A DFT is linear: its gradient is a DFT of g alone, so no forward tensor stays alive for it."""
    step = _training_step([node("DFT", ["x"], ["y"], name="d")], {"x": rnd(2, 5, 3, 2)})
    assert list(step.saved["d"]) == []
