"""GridSample, Col2Im and CastLike gradients against central finite differences (tests/gradcase.py).

GridSample is piecewise smooth in its grid: bilinear weights kink where a coordinate crosses a
pixel centre, border and reflection where they clamp or mirror it, and nearest jumps half way
between pixels. All of those sit at integer or half-integer pixel coordinates, so ``_grid`` draws
(seeded) values whose coordinates stay clear of them, inside and outside [-1, 1] so the padding
modes matter. Opset 20 runs in float64 through ORT; ORT has GridSample in float32 only before
opset 20 and onnx's reference evaluator does not know the opset 16 names (bilinear), so opset 16
linear cases run in float32 with a wide step (exact for a function linear in each coordinate).
"""
from __future__ import annotations

import gradcase
import numpy as np
import pytest
from gradcase import check_gradients, node

from passes.autodiff import build_training_graph
from passes.gradients.sampling import col2im_index
from passes.onnx_import import import_model
from planner.errors import ModelImportError

F32_FD = {"float64": False, "eps": 1e-2}  # float32 through ORT, wide step
MARGIN = 0.06  # pixel units kept between a sample and the nearest kink; > the largest FD step (0.025)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed + 7 * len(shape) + sum(shape)).standard_normal(shape)


def _grid(x_shape, out_spatial, align, spread=1.4, seed=0):
    """A grid for X of ``x_shape``: values in [-spread, spread] whose pixel coordinates keep MARGIN
    from every integer and half-integer (pixel centres, pixel edges, reflection and clamp points)."""
    rng = np.random.default_rng(seed)
    sizes = x_shape[2:]
    d = len(sizes)
    grid = rng.uniform(-spread, spread, (x_shape[0], *out_spatial, d))
    for j in range(d):
        size = sizes[d - 1 - j]  # the grid lists the last spatial axis first
        while not (align and size == 1):  # (there every value samples the one pixel centre)
            g = grid[..., j]
            coord = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
            bad = np.abs(2 * coord - np.round(2 * coord)) < 2 * MARGIN
            if not bad.any():
                break
            g[bad] = rng.uniform(-spread, spread, int(bad.sum()))
    return grid


def _gs(opset, mode, padding, align, x_shape=(2, 2, 4, 5), out_spatial=(3, 2), spread=1.4, seed=0, **kwargs):
    """A GridSample case with X and grid both trainable (``freeze`` one via kwargs' consts)."""
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    params = {"x": rnd(*x_shape, seed=seed), "g": _grid(x_shape, out_spatial, align, spread, seed)}
    kwargs.setdefault("opset", opset)
    return [node("GridSample", ["x", "g"], ["y"], **attrs)], params, kwargs


def _frozen(case, name):
    """``case`` with parameter ``name`` turned into a frozen constant."""
    nodes, params, kwargs = case
    params = dict(params)
    return nodes, params, {**kwargs, "consts": {name: params.pop(name)}, "freeze": (name,)}


def _col2im(image, block, x_channels, seed=0, **attrs):
    sp = len(image)
    index = col2im_index(image, block, attrs.get("dilations", [1] * sp), attrs.get("pads", [0] * 2 * sp)[:sp],
                         attrs.get("pads", [0] * 2 * sp)[sp:], attrs.get("strides", [1] * sp))
    consts = {"i": np.asarray(image, np.int64), "b": np.asarray(block, np.int64)}
    # ORT has Col2Im in float32 only: finite differences in float64 by onnx's reference evaluator
    return ([node("Col2Im", ["x", "i", "b"], ["y"], **attrs)], {"x": rnd(2, x_channels, index.shape[1], seed=seed)},
            {"consts": consts, "opset": 18})


def _affine(size, align, seed=0):
    r = len(size) - 2
    theta = np.concatenate([np.eye(r), np.zeros((r, 1))], axis=1)[None] + 0.3 * rnd(size[0], r, r + 1, seed=seed)
    return ([node("AffineGrid", ["theta", "s"], ["grid"], align_corners=align),
             node("Mul", ["grid", "w"], ["y"])],
            {"theta": theta, "w": rnd(*size[:1], *size[2:], r, seed=seed + 100)},
            {"consts": {"s": np.asarray(size, np.int64)}, "opset": 20})


def _spatial_transformer():
    """theta -> AffineGrid -> GridSample(x): both theta and x trained (opset 20, linear, border)."""
    theta = np.array([[[0.9, 0.1, 0.05], [-0.1, 0.8, -0.03]]]) + 0.05 * rnd(2, 2, 3, seed=30)
    return ([node("AffineGrid", ["theta", "s"], ["grid"], align_corners=0),
             node("GridSample", ["x", "grid"], ["y"], mode="linear", padding_mode="border", align_corners=0)],
            {"theta": theta, "x": rnd(2, 2, 4, 5, seed=31)},
            {"consts": {"s": np.asarray([2, 2, 3, 4], np.int64)}, "opset": 20})


# Each case: id -> (nodes, params, extra keyword arguments of check_gradients).
CASES = {
    # ---- GridSample, opset 20 names, float64 through ORT ----
    **{f"grid_sample20_linear_{pad}_align{a}": _gs(20, "linear", pad, a, spread=3.2 if pad == "reflection" else 1.4,
                                                   seed=a)
       for pad in ("zeros", "border", "reflection") for a in (0, 1)},
    "grid_sample20_nearest_zeros_align0": _gs(20, "nearest", "zeros", 0),
    "grid_sample20_nearest_border_align1": _gs(20, "nearest", "border", 1, seed=1),
    "grid_sample20_nearest_reflection_align0": _gs(20, "nearest", "reflection", 0, spread=3.2, seed=2),
    "grid_sample20_linear_3d_zeros_align0": _gs(20, "linear", "zeros", 0, x_shape=(1, 2, 3, 4, 5),
                                                out_spatial=(2, 2, 3)),
    "grid_sample20_linear_3d_reflection_align1": _gs(20, "linear", "reflection", 1, x_shape=(2, 2, 3, 2, 4),
                                                     out_spatial=(1, 3, 2), spread=3.2, seed=3),
    "grid_sample20_linear_3d_border_align0": _gs(20, "linear", "border", 0, x_shape=(1, 2, 4, 3, 3),
                                                 out_spatial=(2, 3, 2), seed=4),
    "grid_sample20_linear_one_pixel_reflection_align1": _gs(20, "linear", "reflection", 1, x_shape=(1, 2, 1, 4),
                                                            out_spatial=(2, 3), spread=2.5, seed=5),
    "grid_sample20_linear_x_only": _frozen(_gs(20, "linear", "border", 0, seed=6), "g"),
    "grid_sample20_linear_grid_only": _frozen(_gs(20, "linear", "zeros", 1, seed=7), "x"),
    "grid_sample20_nearest_grid_only": _frozen(_gs(20, "nearest", "zeros", 1, seed=8), "x"),
    # ---- GridSample, opset 16 names (float32 through ORT; nearest: float64 reference differences) ----
    "grid_sample16_bilinear_zeros_align0": _gs(16, "bilinear", "zeros", 0, seed=9, **F32_FD),
    "grid_sample16_bilinear_border_align1": _gs(16, "bilinear", "border", 1, seed=10, **F32_FD),
    "grid_sample16_bilinear_reflection_align0": _gs(16, "bilinear", "reflection", 0, spread=3.2, seed=11, **F32_FD),
    "grid_sample16_nearest_reflection_align1": _gs(16, "nearest", "reflection", 1, spread=3.2, seed=12),
    # ---- AffineGrid (float64 through ORT), alone and feeding GridSample (a spatial transformer) ----
    **{f"affine_grid_2d_align{a}": _affine((2, 3, 4, 5), a, seed=20 + a) for a in (0, 1)},
    "affine_grid_3d_align0": _affine((2, 1, 3, 2, 4), 0, seed=22),
    "affine_grid_3d_align0_unit_axis": _affine((1, 2, 1, 3, 2), 0, seed=23),
    "spatial_transformer": _spatial_transformer(),
    # ---- Col2Im ----
    "col2im_defaults": _col2im([4, 5], [2, 2], 2 * 4),
    "col2im_dilations_pads_strides": _col2im([5, 6], [2, 3], 3 * 6, seed=1, dilations=[2, 1], pads=[1, 0, 2, 1],
                                             strides=[2, 2]),
    "col2im_stride_gaps_3x1": _col2im([7, 3], [3, 1], 1 * 3, seed=2, strides=[3, 2], pads=[0, 1, 1, 0]),
    # ---- CastLike: there and back again (through float32: a wide step), and an int input 0 ----
    "cast_like_round_trip": ([node("CastLike", ["x", "t"], ["x32"]), node("CastLike", ["x32", "x"], ["y"])],
                             {"x": rnd(3, 4)}, {"consts": {"t": np.zeros(1, np.float32)}, "opset": 15,
                                                "eps": 1e-2, "tol64": 1e-4}),
    "cast_like_int_input": ([node("CastLike", ["k", "x"], ["kf"]), node("Mul", ["x", "kf"], ["y"])],
                            {"x": rnd(2, 3)}, {"consts": {"k": np.arange(6, dtype=np.int64).reshape(2, 3)},
                                               "opset": 19}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_matches_finite_differences(case):
    nodes, params, kwargs = CASES[case]
    check_gradients(nodes, params, **kwargs)


def test_grids_keep_clear_of_kinks_and_reach_outside():
    """The helper's promise, and that padding modes get exercised."""
    for align in (0, 1):
        grid = _grid((2, 2, 4, 5), (3, 2), align, spread=3.2, seed=align)
        assert (np.abs(grid) > 1).any() and (np.abs(grid) < 1).any()
        coord = (grid[..., 0] + 1) / 2 * 4 if align else ((grid[..., 0] + 1) * 5 - 1) / 2
        assert np.abs(2 * coord - np.round(2 * coord)).min() >= 2 * MARGIN


def test_col2im_index_matches_the_reference():
    """Scattering block values through the index map is Col2Im (onnx's reference evaluator)."""
    from onnx.reference.ops.op_col2im import Col2Im

    image, block, attrs = [5, 6], [2, 3], {"dilations": [2, 1], "pads": [1, 0, 2, 1], "strides": [2, 2]}
    index = col2im_index(image, block, attrs["dilations"], attrs["pads"][:2], attrs["pads"][2:], attrs["strides"])
    x = rnd(1, 6, index.shape[1])
    padded = np.zeros(8 * 7)
    np.add.at(padded, index.ravel(), x[0].ravel())
    want = Col2Im.eval(x, np.asarray(image), np.asarray(block), **attrs)
    np.testing.assert_allclose(padded.reshape(8, 7)[1:6, 0:6], want[0, 0])


def _training_step(nodes, params, consts=None, opset=20, freeze=()):
    from passes.autodiff import TrainOptions

    model = gradcase.build_model(nodes, params, consts or {}, {}, ["y"], np.float64, opset)
    return build_training_graph(import_model(model), TrainOptions(freeze=("R_*", *freeze)))


@pytest.mark.parametrize("opset, mode", [(16, "bicubic"), (20, "cubic")])
def test_grid_sample_cubic_is_refused_in_one_line(opset, mode):
    nodes, params, _ = _gs(opset, mode, "zeros", 0)
    nodes[0].name = "gs"
    with pytest.raises(ModelImportError, match=rf"'gs' \(GridSample\) uses mode='{mode}'") as err:
        _training_step(nodes, params, opset=opset)
    assert "\n" not in str(err.value)


def test_grid_sample_keeps_x_only_for_the_grid_gradient():
    """dX needs only the grid: X can die after the forward when the grid is frozen."""
    nodes, params, _ = _gs(20, "linear", "zeros", 0)
    nodes[0].name = "gs"
    assert sorted(_training_step(nodes, params).saved["gs"]) == ["g", "x"]
    grid = params.pop("g")
    assert list(_training_step(nodes, params, consts={"g": grid}, freeze=("g",)).saved["gs"]) == ["g"]


def test_affine_grid_refuses_a_unit_axis_with_aligned_corners():
    """There ONNX's reference puts the coordinate at -1 and ONNX Runtime at +1: no gradient is
    right for both, so the node is named instead."""
    nodes, params, kwargs = _affine((1, 2, 1, 3, 2), 1)
    model = gradcase.build_model(nodes, params, kwargs["consts"], {}, ["y"], np.float64, 20)
    with pytest.raises(ModelImportError, match=r"align_corners=1 and a spatial size of 1") as err:
        build_training_graph(import_model(model))
    assert "\n" not in str(err.value)
