"""The later gradient rules against float64 central finite differences (tests/gradcase.py), one small
case per variant: ReduceProd with zeros in a reduced slice (exact: a product is linear in each
factor, so central differences are exact there too), Shrink, DepthToSpace/SpaceToDepth, Mean,
GroupNormalization (opset 18 per-group and opset 21 per-channel scale), MeanVarianceNormalization,
the mul/max/min scatter reductions with duplicate indices, GatherND with batch_dims, LpPool and LRN.
"""
from __future__ import annotations

import gradcase
import numpy as np
import onnx
import pytest
from gradcase import check_gradients, node
from onnx import helper, numpy_helper

from passes import gradcheck
from passes.autodiff import build_training_graph
from passes.gradients import supported_ops
from passes.onnx_import import import_model
from planner.errors import ModelImportError

I64 = np.int64
NEW_OPS = {"ReduceProd", "Shrink", "DepthToSpace", "SpaceToDepth", "Mean", "GroupNormalization",
           "MeanVarianceNormalization", "ScatterElements", "ScatterND", "GatherND", "LpPool", "GlobalLpPool",
           "LRN"}


def rnd(*shape, seed=0, low=None):
    """Standard normal values; with ``low``, magnitudes shifted away from 0."""
    v = np.random.default_rng(seed + 11 * len(shape) + sum(shape)).standard_normal(shape)
    return v if low is None else np.abs(v) + low


def ints(*values):
    return np.asarray(values, dtype=I64)


def with_zeros(x, *positions):
    x = np.array(x, copy=True)
    for p in positions:
        x[p] = 0.0
    return x


# x[0, 1, 2] is the only zero of the axis-1 slice x[0, :, 2]; x[1, :, 3] holds two zeros.
PROD_X = with_zeros(rnd(2, 3, 4, low=0.3), (0, 1, 2), (1, 0, 3), (1, 2, 3))

SHRINK_FD = {"eps": 1e-2, "tol64": 1e-4}
MVN_FD = {"float64": False, "eps": 1e-2}

# Each case: id -> (nodes, params, extra keyword arguments of check_gradients).
CASES = {
    # ---- ReduceProd: axes attribute (< 18) or input (>= 18), keepdims, zeros ----
    "reduce_prod_attr_axis1_zeros": ([node("ReduceProd", ["x"], ["y"], axes=[1])], {"x": PROD_X}, {"opset": 13}),
    "reduce_prod_attr_keepdims0_zeros": ([node("ReduceProd", ["x"], ["y"], axes=[-2], keepdims=0)], {"x": PROD_X},
                                         {"opset": 11}),
    "reduce_prod_input_two_axes_keepdims0": ([node("ReduceProd", ["x", "ax"], ["y"], keepdims=0)], {"x": PROD_X},
                                             {"consts": {"ax": ints(0, 2)}, "opset": 18}),
    "reduce_prod_all_one_zero": ([node("ReduceProd", ["x"], ["y"], keepdims=0)],
                                 {"x": with_zeros(rnd(2, 3, low=0.3), (1, 1))}, {"opset": 18}),
    "reduce_prod_all_two_zeros": ([node("ReduceProd", ["x"], ["y"])],
                                  {"x": with_zeros(rnd(2, 3, low=0.3), (0, 2), (1, 0))}, {}),
    "reduce_prod_no_zeros_negative": ([node("ReduceProd", ["x", "ax"], ["y"])], {"x": rnd(3, 4)},
                                      {"consts": {"ax": ints(-1)}, "opset": 18}),
    "reduce_prod_noop_empty_axes": ([node("ReduceProd", ["x", "ax"], ["y"], noop_with_empty_axes=1)],
                                    {"x": rnd(2, 3)}, {"consts": {"ax": ints()}, "opset": 18}),
    # ---- Shrink: keeps the output when bias < lambd, else the input ----
    # ORT's float64 Shrink rounds through float32: a wide step (exact for a piecewise linear map)
    "shrink_defaults": ([node("Shrink", ["x"], ["y"])], {"x": 2 * rnd(3, 4)}, SHRINK_FD),
    "shrink_bias_below_lambd": ([node("Shrink", ["x"], ["y"], bias=0.3, lambd=0.8)], {"x": 2 * rnd(3, 4)},
                                SHRINK_FD),
    "shrink_bias_above_lambd": ([node("Shrink", ["x"], ["y"], bias=1.5, lambd=0.4)], {"x": 2 * rnd(3, 4)},
                                SHRINK_FD),
    # ---- depth <-> space ----
    "depth_to_space_dcr": ([node("DepthToSpace", ["x"], ["y"], blocksize=2)], {"x": rnd(2, 8, 2, 3)}, {}),
    "depth_to_space_crd": ([node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD")], {"x": rnd(1, 8, 3, 2)},
                           {}),
    "depth_to_space_crd_block3": ([node("DepthToSpace", ["x"], ["y"], blocksize=3, mode="CRD")],
                                  {"x": rnd(1, 18, 2, 1)}, {}),
    "space_to_depth": ([node("SpaceToDepth", ["x"], ["y"], blocksize=2)], {"x": rnd(2, 3, 4, 6)}, {}),
    # ---- Mean ----
    # (onnx's reference Mean, used for float64, needs the first input in the output's shape)
    "mean_three_broadcast": ([node("Mean", ["a", "b", "c"], ["y"])],
                             {"a": rnd(4, 2, 3), "b": rnd(3), "c": rnd(4, 1, 1)}, {}),
    "mean_single": ([node("Mean", ["a"], ["y"])], {"a": rnd(2, 3)}, {}),
    # ---- GroupNormalization (18: per-group scale/bias; 21: per-channel) and MVN ----
    "group_norm_opset18_per_group": ([node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2)],
                                     {"x": rnd(2, 4, 3, 2), "s": rnd(2), "b": rnd(2)}, {"opset": 18, "tol64": 1e-4}),
    "group_norm_opset18_one_group_3d": ([node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=1,
                                              epsilon=1e-2)],
                                        {"x": rnd(2, 3, 4), "s": np.asarray([1.5]), "b": rnd(1)}, {"opset": 18, "tol64": 1e-4}),
    "group_norm_opset21_per_channel": ([node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2,
                                             stash_type=11)],
                                       {"x": rnd(2, 6, 2, 2), "s": rnd(6), "b": rnd(6)}, {"opset": 21, "tol64": 1e-4}),
    "group_norm_opset21_group_per_channel": ([node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3,
                                                   stash_type=11)],
                                             {"x": rnd(2, 3, 5), "s": rnd(3), "b": rnd(3)},
                                             {"opset": 21, "tol64": 1e-4}),
    # MVN's function body adds a float32 epsilon (no float64 form) and ORT runs it in float32 only
    # (the default axes spelled out: onnx 1.23's strict shape inference fails on MVN without them)
    "mvn_axes_0_2_3": ([node("MeanVarianceNormalization", ["x"], ["y"], axes=[0, 2, 3])], {"x": rnd(2, 3, 2, 2)},
                       MVN_FD),
    "mvn_last_axis": ([node("MeanVarianceNormalization", ["x"], ["y"], axes=[-1])], {"x": rnd(3, 4)}, MVN_FD),
    # ---- scatters with reductions (duplicate indices allowed there) ----
    # positions (0, 1) and (1, 0) get two updates each; a zero update at (0, 1), and data zero at (1, 0)
    "scatter_elements_mul_dupes_zeros_axis1": (
        [node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction="mul")],
        {"d": with_zeros(rnd(2, 4), (1, 0)), "u": with_zeros(rnd(2, 3, seed=1), (0, 0))},
        {"consts": {"i": np.asarray([[1, 1, 3], [0, 2, -4]], I64)}, "opset": 16}),
    "scatter_elements_mul_two_zero_updates": (
        [node("ScatterElements", ["d", "i", "u"], ["y"], reduction="mul")],
        {"d": rnd(3, 2), "u": with_zeros(rnd(3, 2, seed=1), (0, 1), (2, 1))},
        {"consts": {"i": np.asarray([[2, 0], [1, 1], [2, 0]], I64)}, "opset": 16}),
    "scatter_elements_max_dupes": ([node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction="max")],
                                   {"d": rnd(2, 4), "u": rnd(2, 3, seed=1)},
                                   {"consts": {"i": np.asarray([[1, 1, 3], [0, 2, 0]], I64)}, "opset": 18}),
    "scatter_elements_min_dupes_runtime": ([node("ScatterElements", ["d", "i", "u"], ["y"], reduction="min")],
                                           {"d": rnd(3, 2), "u": rnd(3, 2, seed=1)},
                                           {"inputs": {"i": np.asarray([[2, 0], [2, 1], [-1, 0]], I64)},
                                            "opset": 18}),
    "scatter_nd_mul_dupes_slices": ([node("ScatterND", ["d", "i", "u"], ["y"], reduction="mul")],
                                    {"d": rnd(4, 3), "u": with_zeros(rnd(3, 3, seed=1), (1, 2))},
                                    {"consts": {"i": np.asarray([[1], [-3], [2]], I64)}, "opset": 16}),
    "scatter_nd_max_dupes": ([node("ScatterND", ["d", "i", "u"], ["y"], reduction="max")],
                             {"d": rnd(3, 2), "u": rnd(3, seed=1)},
                             {"consts": {"i": np.asarray([[0, 1], [2, 0], [0, 1]], I64)}, "opset": 18}),
    "scatter_nd_min_dupes_runtime": ([node("ScatterND", ["d", "i", "u"], ["y"], reduction="min")],
                                     {"d": rnd(3, 2), "u": rnd(3, 2, seed=1)},
                                     {"inputs": {"i": np.asarray([[1], [1], [0]], I64)}, "opset": 18}),
    # ---- GatherND with batch dims ----
    "gather_nd_batch_dims1_dupes": ([node("GatherND", ["x", "i"], ["y"], batch_dims=1)], {"x": rnd(2, 3, 4)},
                                    {"consts": {"i": np.asarray([[[1, 2], [1, 2]], [[0, -1], [2, 0]]], I64)},
                                     "opset": 16}),
    "gather_nd_batch_dims2_runtime_slices": ([node("GatherND", ["x", "i"], ["y"], batch_dims=2)],
                                             {"x": rnd(2, 3, 4, 2)},
                                             {"inputs": {"i": np.asarray([[[[3], [-4]], [[1], [1]], [[0], [2]]],
                                                                          [[[2], [2]], [[3], [0]], [[-1], [1]]]],
                                                                         I64)}, "opset": 16}),
    # ---- LRN: ORT runs it in float32 only, 4-D, odd sizes; size 5 over 3 channels clips both ends ----
    "lrn_size5_clipped": ([node("LRN", ["x"], ["y"], size=5, alpha=0.5, beta=0.75, bias=1.5)],
                          {"x": rnd(1, 3, 2, 5)}, {"float64": False, "eps": 1e-2}),
    "lrn_size3_defaults": ([node("LRN", ["x"], ["y"], size=3)], {"x": rnd(2, 6, 3, 3)},
                           {"float64": False, "eps": 1e-2}),
    # ---- LpPool ----
    "lp_pool_p2_default": ([node("LpPool", ["x"], ["y"], kernel_shape=[2, 2])], {"x": rnd(1, 2, 3, 4)}, {}),
    "lp_pool_p1_stride2": ([node("LpPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], p=1)],
                           {"x": rnd(2, 1, 4, 4)}, {}),
    "lp_pool_p3_overlap_1d": ([node("LpPool", ["x"], ["y"], kernel_shape=[3], p=3)], {"x": rnd(2, 2, 5)}, {}),
    # ORT runs GlobalLpPool in float32 only and onnx's reference evaluator has none: float32 through ORT
    "global_lp_pool_p2": ([node("GlobalLpPool", ["x"], ["y"])], {"x": rnd(2, 3, 3, 4)},
                          {"float64": False, "eps": 1e-2}),
    "global_lp_pool_p1": ([node("GlobalLpPool", ["x"], ["y"], p=1)], {"x": rnd(2, 2, 5)},
                          {"float64": False, "eps": 1e-2}),
    "global_lp_pool_p3": ([node("GlobalLpPool", ["x"], ["y"], p=3)], {"x": rnd(1, 2, 3, 3)},
                          {"float64": False, "eps": 1e-2}),
    # onnx's reference LpPool rescales padded windows (off-spec), so padded cases run in ORT, in float32
    "lp_pool_p2_pads_stride2_ceil": ([node("LpPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 2],
                                           pads=[1, 0, 1, 1], ceil_mode=1)], {"x": rnd(1, 2, 4, 5)},
                                     {"opset": 18, "float64": False, "eps": 1e-2}),
    "lp_pool_p1_same_upper": ([node("LpPool", ["x"], ["y"], kernel_shape=[3, 3], p=1, auto_pad="SAME_UPPER")],
                              {"x": rnd(1, 1, 4, 4)}, {"float64": False, "eps": 1e-2}),
}


def _type_group_norm_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx's shape inference gives GroupNormalization's output no type (onnx 1.23); it has its input's
    type and shape, so state that (value_info, or the graph output's type) as an exporter would."""
    known = {i.name: (i.data_type, list(i.dims)) for i in model.graph.initializer}
    known.update({i.name: (i.type.tensor_type.elem_type, [d.dim_value for d in i.type.tensor_type.shape.dim])
                  for i in model.graph.input})
    for n in model.graph.node:
        if n.op_type == "GroupNormalization":
            typed = helper.make_tensor_value_info(n.output[0], *known[n.input[0]])
            outs = [o for o in model.graph.output if o.name == n.output[0]]
            for o in outs:
                o.CopyFrom(typed)
            if not outs:
                model.graph.value_info.append(typed)
    return model


class _GroupNormAwareInference:
    """Stands in for gradcase's ``shape_inference`` module while a case builds its model."""

    @staticmethod
    def infer_shapes(model, *args, **kwargs):
        return onnx.shape_inference.infer_shapes(_type_group_norm_outputs(model), *args, **kwargs)


def _build(*args):
    return _type_group_norm_outputs(_original_build(*args))


_original_build = gradcase.build_model


@pytest.fixture(autouse=True)
def _group_norm_shapes(monkeypatch):
    monkeypatch.setattr(gradcase, "shape_inference", _GroupNormAwareInference)
    monkeypatch.setattr(gradcase, "build_model", _build)


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_finite_differences(case):
    nodes, params, kwargs = CASES[case]
    check_gradients(nodes, params, **kwargs)


def test_every_new_rule_has_a_case():
    used = {n.op_type for nodes, _, _ in CASES.values() for n in nodes}
    assert NEW_OPS <= set(supported_ops()) and NEW_OPS <= used


def _training_step(nodes, params, consts=None, opset=17):
    return build_training_graph(import_model(gradcase.build_model(nodes, params, consts or {}, {}, ["y"], np.float64, opset)))


def _grads(nodes, inits, opset=18):
    """Gradients of sum(outputs of ``nodes``) w.r.t. the float initializers, run in ORT."""
    graph = helper.make_graph(nodes + [node("ReduceSum", ["y"], ["loss"], keepdims=0)], "case", [],
                              [helper.make_tensor_value_info("loss", onnx.TensorProto.DOUBLE, [])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return gradcheck.run_training_step(build_training_graph(import_model(model)), {})[1]


def test_reduce_prod_gradient_is_exact_with_zeros():
    """One zero in a slice: only the zero gets the product of the others; two zeros: all get 0."""
    x = np.asarray([[2.0, 0.0, 3.0], [0.0, 5.0, 0.0], [2.0, 4.0, 0.5]])
    grads = _grads([node("ReduceProd", ["x", "ax"], ["y"])], {"x": x, "ax": ints(1)})
    np.testing.assert_array_equal(grads["x"], [[0, 6, 0], [0, 0, 0], [2, 1, 8]])


def test_scatter_max_splits_ties_evenly():
    """Data and two updates tie at position 1: each gets g / 3 (FD cannot check a kink)."""
    inits = {"d": np.asarray([1.0, 5.0, 0.0]), "u": np.asarray([5.0, 5.0, 2.0]), "i": ints(1, 1, 0)}
    grads = _grads([node("ScatterElements", ["d", "i", "u"], ["y"], reduction="max")], inits)
    np.testing.assert_allclose(grads["d"], [0, 1 / 3, 1])
    np.testing.assert_allclose(grads["u"], [1 / 3, 1 / 3, 1])


def test_shrink_keeps_its_output_when_bias_is_below_lambd():
    step = _training_step([node("Shrink", ["x"], ["y"], name="s", bias=0.1)], {"x": rnd(2, 3)})
    assert list(step.saved["s"]) == ["y"]


def test_reduce_prod_keeps_only_its_input():
    step = _training_step([node("ReduceProd", ["x"], ["y"], name="p", axes=[0])], {"x": rnd(2, 3)})
    assert list(step.saved["p"]) == ["x"]


def test_group_norm_with_scale_of_the_other_opset_is_refused_in_one_line():
    nodes = [node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2, name="gn")]
    params = {"x": rnd(2, 4, 3), "s": rnd(4), "b": rnd(4)}  # per channel: opset 21's form, not 18's
    with pytest.raises(ModelImportError, match=r"'gn' \(GroupNormalization, opset 18\).*shape \(2,\)") as err:
        _training_step(nodes, params, opset=18)
    assert "\n" not in str(err.value)


def test_lp_pool_with_p0_is_refused_in_one_line():
    with pytest.raises(ModelImportError, match=r"'lp' \(LpPool\) has p=0") as err:
        _training_step([node("LpPool", ["x"], ["y"], kernel_shape=[2], p=0, name="lp")], {"x": rnd(1, 1, 4)})
    assert "\n" not in str(err.value)


HALF_SCATTER_CASES = {
    # an embedding whose token 1 repeats: its rows' gradients add up
    "Gather": ([node("Gather", ["E", "ids"], ["y"])], {"E": rnd(5, 3)}, {"ids": ints(1, 3, 1, 0, 1)}, 17),
    "GatherElements": ([node("GatherElements", ["X", "idx"], ["y"], axis=1)], {"X": rnd(2, 4)},
                       {"idx": np.asarray([[0, 0, 3], [2, 1, 2]], I64)}, 17),
    "GatherND": ([node("GatherND", ["X", "idx"], ["y"])], {"X": rnd(3, 4)},
                 {"idx": np.asarray([[1, 2], [0, 0], [1, 2]], I64)}, 17),
    # overlapping windows: a maximum taken by several windows
    "MaxPool": ([node("MaxPool", ["X"], ["y"], kernel_shape=[3, 3], strides=[1, 1])], {"X": rnd(1, 2, 5, 5)}, {}, 17),
}


@pytest.mark.parametrize("case", sorted(HALF_SCATTER_CASES))
def test_half_precision_scatter_add_gradients_run_in_ort_and_match_float32(case):
    """Gather, GatherElements, GatherND and MaxPool send their gradient back with a scatter-add
    (ScatterND/ScatterElements, reduction='add'), which ONNX Runtime's CPU provider has no float16
    kernel for: a float16 embedding's training step failed at run time ("MLFloat16 data type is not
    supported with ScatterND opset 16 when reduction is 'add'"; train and verify exit 1). The sum
    now accumulates in float32 between Casts, and the float16 gradient is the float32 one, rounded."""
    from passes.autodiff import TrainOptions

    nodes, params, consts, opset = HALF_SCATTER_CASES[case]
    grads = {}
    for dtype in (np.float16, np.float32):
        fwd = import_model(gradcase.build_model(nodes, params, consts, {}, ["y"], dtype, opset))
        step = build_training_graph(fwd, TrainOptions(freeze=("R_*",)))
        grads[dtype] = gradcheck.run_training_step(step, {})[1]
    for name, want in grads[np.float32].items():
        got = grads[np.float16][name]
        assert got.dtype == np.float16 and got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
