"""Gradients of the sampling ops: GridSample (linear and nearest, every padding mode, any spatial
rank), AffineGrid and Col2Im.

GridSample reads X at coordinates computed from the grid. The backward recomputes those coordinates
from the saved grid with the forward's formulas (unnormalise, then clamp or reflect into the image),
so both gradients are explicit: dX scatter-adds each corner's weight times dY into a flat view of X
(ScatterElements, reduction='add', one corner after another; a corner outside the image has weight 0), and dgrid is, per
spatial axis, the sum over channels and corners of dY * X[corner] * d weight / d coordinate, times
d coordinate / d grid through the unnormalise and the clamp or reflection. Nearest sampling is
piecewise constant in the grid, so its grid gradient is 0.

Col2Im sums image blocks into an image; its adjoint is the im2col of the output gradient: pad it,
then gather each block with an index map computed at build time (shapes and block geometry are
static).
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from passes.gradients import BackwardContext, register
from passes.gradients._emit import Emitter, prod
from planner.errors import ModelImportError
from planner.graph import HALF_DTYPES

_LINEAR = frozenset({"bilinear", "linear"})  # opset 16 / opset 20 spelling
_CUBIC = frozenset({"bicubic", "cubic"})
_PADDING = frozenset({"zeros", "border", "reflection"})


def _grid_sample_attrs(ctx: BackwardContext) -> tuple[str, str, bool]:
    """(mode as 'linear' or 'nearest', padding_mode, align_corners), or a one-line refusal."""
    where = f"node {ctx.node.name!r} (GridSample)"
    mode = str(ctx.attr("mode", "bilinear" if ctx.opset < 20 else "linear"))
    if mode in _CUBIC:
        raise ModelImportError(
            f"{where} uses mode={mode!r}, whose gradient memplan does not have; use linear "
            "(bilinear before opset 20) or nearest sampling, or freeze the weights before it"
        )
    if mode not in _LINEAR and mode != "nearest":
        raise ModelImportError(f"{where} has mode={mode!r}; ONNX allows linear/bilinear, nearest or cubic/bicubic")
    padding = str(ctx.attr("padding_mode", "zeros"))
    if padding not in _PADDING:
        raise ModelImportError(f"{where} has padding_mode={padding!r}; ONNX allows zeros, border or reflection")
    return ("linear" if mode in _LINEAR else "nearest"), padding, bool(int(ctx.attr("align_corners", 0)))


def _as_float(em: Emitter, cond: int, like: int) -> int:
    return em.cast(cond, em.dtype(like))


def _clip(em: Emitter, x: int, lo: float, hi: float) -> tuple[int, int]:
    """(x clamped to [lo, hi], 1.0 where lo < x < hi else 0.0: the clamp's derivative)."""
    clipped = em.op("Clip", [x, em.scalar(lo, x), em.scalar(hi, x)], em.shape(x), em.dtype(x))
    inside = em.binary("And", em.binary("Greater", x, em.scalar(lo, x)), em.binary("Less", x, em.scalar(hi, x)))
    return clipped, _as_float(em, inside, x)


def _reflect(em: Emitter, x: int, lo: float, span: float) -> tuple[int, int]:
    """(x reflected at lo and lo + span until it lies between them, d reflected / dx = +-1).

    With u = |x - lo| and f = floor(u / span) reflections, the result is lo + r for even f and
    lo + span - r for odd f, r = u - f * span; each reflection flips the slope."""
    shifted = em.sub(x, em.scalar(lo, x))
    u = em.unary("Abs", shifted)
    flips = em.unary("Floor", em.scale(u, 1.0 / span))
    rest = em.sub(u, em.scale(flips, span))
    odd = em.sub(flips, em.scale(em.unary("Floor", em.scale(flips, 0.5)), 2.0))  # 0.0 or 1.0
    one = em.scalar(1.0, x)
    slope = em.sub(one, em.scale(odd, 2.0))  # +1 even, -1 odd
    # even: lo + rest; odd: lo + span - rest = lo + rest + (span - 2 rest)
    value = em.add(em.add(rest, em.scalar(lo, x)), em.mul(odd, em.sub(em.scalar(span, x), em.scale(rest, 2.0))))
    return value, em.mul(em.unary("Sign", shifted), slope)


def _source_coordinate(em: Emitter, g: int, size: int, padding: str, align: bool) -> tuple[int, int | None]:
    """(pixel coordinate along one axis, d coordinate / d grid) for the normalised grid values ``g``.

    align_corners=1 maps -1 and 1 to the centres of the end pixels, 0 to their outer edges; border
    clamps the coordinate into [0, size - 1]; reflection mirrors it at the image's ends (pixel
    centres with align_corners=1, edges otherwise, then clamps)."""
    a = (size - 1) / 2.0 if align else size / 2.0
    x = em.add(em.scale(g, a), em.scalar((size - 1) / 2.0, g))
    if padding == "zeros":
        return x, em.scalar(a, g)
    if padding == "border":
        x, inside = _clip(em, x, 0.0, size - 1.0)
        return x, em.scale(inside, a)
    if align and size == 1:  # every coordinate reflects onto the only pixel centre
        return em.mul(x, em.scalar(0.0, x)), None
    x, slope = _reflect(em, x, 0.0, size - 1.0) if align else _reflect(em, x, -0.5, float(size))
    if not align:
        x, inside = _clip(em, x, 0.0, size - 1.0)
        slope = em.mul(slope, inside)
    return x, em.scale(slope, a)


def _corners(em: Emitter, x: int, size: int, mode: str) -> list[tuple[int, int, int | None]]:
    """Per corner along one axis: (clamped int64 index, weight, d weight / d coordinate); weights of
    indices outside [0, size) are 0 (zeros padding reads 0 there)."""
    if mode == "nearest":
        taps = [(em.unary("Round", x), None, None)]
    else:
        i0 = em.unary("Floor", x)
        t = em.sub(x, i0)
        one = em.scalar(1.0, x)
        taps = [(i0, em.sub(one, t), -1.0), (em.add(i0, one), t, 1.0)]
    out = []
    for i, w, sign in taps:
        valid = em.binary("And", em.binary("GreaterOrEqual", i, em.scalar(0.0, i)),
                          em.binary("LessOrEqual", i, em.scalar(size - 1.0, i)))
        valid = _as_float(em, valid, i)
        index = em.cast(_clip(em, i, 0.0, size - 1.0)[0], "int64")
        weight = valid if w is None else em.mul(w, valid)
        out.append((index, weight, None if sign is None else em.scale(valid, sign)))
    return out


#: Per spatial axis: (its corners as _corners returns them, d coordinate / d grid or None for 0).
Axis = tuple[list[tuple[int, int, int | None]], int | None]


@register("GridSample", inputs=(0, 1))
def grid_sample(ctx: BackwardContext) -> dict[int, int]:
    """X [N, C, *S], grid [N, *O, D] (its last axis lists coordinates fastest spatial axis first).
    Works on flat views: X as [N, C, prod(S)], dY as [N, C, P] with P = prod(O)."""
    mode, padding, align = _grid_sample_attrs(ctx)
    em, g = ctx.em, ctx.dy()
    x_shape, grid_shape = ctx.x_shape(0), ctx.x_shape(1)
    n, c, sizes = x_shape[0], x_shape[1], x_shape[2:]
    d, p, flat = len(sizes), prod(grid_shape[1:-1]), prod(sizes)
    gdtype = ctx.x_dtype(1)
    if mode == "nearest" and not ctx.needs(0):
        return {1: em.zeros(grid_shape, gdtype)}
    grid = em.reshape(ctx.x(1), [n, p, d])
    axes: list[Axis] = []
    for k, size in enumerate(sizes):
        gk = em.op("Gather", [grid, em.const(np.asarray(d - 1 - k, np.int64))], [n, p], gdtype, axis=2)
        coord, slope = _source_coordinate(em, gk, size, padding, align)
        axes.append((_corners(em, coord, size, mode), slope))
    strides = [prod(sizes[k + 1:]) for k in range(d)]
    corners = list(itertools.product(*(range(len(taps)) for taps, _ in axes)))
    # per corner: flat X index [N, 1, P] (int64; expanded over C only where it is used, so one
    # corner's [N, C, P] indices are alive at a time), weight [N, P]
    index, weight = {}, {}
    for corner in corners:
        taps = [axes[k][0][j] for k, j in enumerate(corner)]
        idx = em.scale(taps[0][0], strides[0])
        w = taps[0][1]
        for k in range(1, d):
            idx = em.add(idx, em.scale(taps[k][0], strides[k]))
            w = em.mul(w, taps[k][1])
        index[corner] = em.reshape(idx, [n, 1, p])
        weight[corner] = w
    g3 = em.reshape(g, [n, c, p])
    out: dict[int, int] = {}
    if ctx.needs(0):  # one scatter-add per corner: a corner's update and indices at a time
        acc = "float32" if em.dtype(g) in HALF_DTYPES else em.dtype(g)  # as Emitter.scatter_add
        scattered = em.zeros([n, c, flat], acc)
        for k in corners:
            update = em.mul(g3, em.reshape(em.cast(weight[k], em.dtype(g)), [n, 1, p]))
            scattered = em.op("ScatterElements", [scattered, em.expand(index[k], [n, c, p]), em.cast(update, acc)],
                              [n, c, flat], acc, axis=2, reduction="add")
        out[0] = em.reshape(em.cast(scattered, em.dtype(g)), x_shape)
    if ctx.needs(1):
        if mode == "nearest":
            out[1] = em.zeros(grid_shape, gdtype)
        else:
            comps = _linear_grid_grad(em, em.reshape(ctx.x(0), [n, c, flat]), g3, axes, index, gdtype)
            stacked = em.concat([em.reshape(comps[d - 1 - j], [n, p, 1]) for j in range(d)], 2)
            out[1] = em.reshape(stacked, grid_shape)
    return out


def _linear_grid_grad(em: Emitter, x3: int, g3: int, axes: list[Axis], index: dict, dtype: str) -> list[int]:
    """d loss / d grid value of each spatial axis k, [N, P]: with s_c = sum over channels of dY * X at
    corner c, it is sum_c s_c * d w_c / d coordinate_k * d coordinate_k / d grid, where d w_c /
    d coordinate_k is the product of the other axes' weights times +-1 (k's tap below or above)."""
    n, c, p = em.shape(g3)
    dweight = {}
    for corner, idx in index.items():
        values = em.op("GatherElements", [x3, em.expand(idx, [n, c, p])], [n, c, p], em.dtype(x3), axis=2)
        dweight[corner] = em.cast(em.reduce_sum(em.mul(g3, values), [1], keepdims=False), dtype)
    comps = []
    for k, (taps, slope) in enumerate(axes):
        if slope is None:
            comps.append(em.zeros([n, p], dtype))
            continue
        total = None
        for corner, s in dweight.items():
            term = em.mul(s, taps[corner[k]][2])
            for e, (other, _) in enumerate(axes):
                if e != k:
                    term = em.mul(term, other[corner[e]][1])
            total = term if total is None else em.add(total, term)
        comps.append(em.mul(total, slope))
    return comps


def _const_ints(ctx: BackwardContext, slot: int, what: str) -> list[int]:
    return [int(v) for v in np.asarray(ctx.require_const(slot, what)).ravel()]


# ---- AffineGrid ---------------------------------------------------------------------------------
def affine_base_grid(spatial: Sequence[int], align: bool) -> np.ndarray:
    """[prod(spatial), r + 1]: each output point's homogeneous normalised coordinates, fastest
    axis first ([x, y, 1] in 2-D, [x, y, z, 1] in 3-D), points in row-major order of ``spatial``.
    Along an axis of size s: -1 + 2i / (s - 1) with align_corners=1 (s > 1), else the pixel
    centres (2i + 1) / s - 1."""
    axes = []
    for s in spatial:
        i = np.arange(s, dtype=np.float64)
        axes.append(-1.0 + 2.0 * i / (s - 1) if align else (2.0 * i + 1.0) / s - 1.0)
    mesh = np.meshgrid(*axes, indexing="ij")  # mesh[k] varies along spatial axis k
    points = [m.reshape(-1) for m in reversed(mesh)]
    return np.stack([*points, np.ones(int(np.prod(spatial)))], axis=1)


@register("AffineGrid")
def affine_grid(ctx: BackwardContext) -> dict[int, int]:
    """grid[n, p, :] = theta[n] @ base[p] is linear in theta: d theta[n] = dgrid[n]^T @ base
    (size, input 1, must be constant: it fixes the points)."""
    em, g = ctx.em, ctx.dy()
    size = _const_ints(ctx, 1, "size")
    align = bool(int(ctx.attr("align_corners", 0)))
    if align and 1 in size[2:]:
        raise ModelImportError(
            f"node {ctx.node.name!r} (AffineGrid) has align_corners=1 and a spatial size of 1 ({size}), whose "
            "coordinate ONNX's reference (-1) and ONNX Runtime (+1) disagree on; use align_corners=0 there"
        )
    theta_shape = ctx.x_shape(0)  # [N, r, r + 1]
    n, r = theta_shape[0], theta_shape[1]
    base = affine_base_grid(size[2:], align)
    dgrid = em.transpose(em.reshape(g, [n, base.shape[0], r]), [0, 2, 1])  # [N, r, P]
    return {0: em.matmul(dgrid, em.const(base.astype(em.dtype(g))))}


# ---- Col2Im -----------------------------------------------------------------------------------
def col2im_index(image: Sequence[int], block: Sequence[int], dilations: Sequence[int], begin: Sequence[int],
                 end: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """[prod(block), L] flat positions in the padded image of each block element, block position
    by block position (row-major both ways, as Col2Im numbers its input's channels and columns)."""
    padded = [i + b + e for i, b, e in zip(image, begin, end)]
    counts = [(q - d * (k - 1) - 1) // s + 1 for q, k, d, s in zip(padded, block, dilations, strides)]
    offsets = np.stack(np.meshgrid(*[np.arange(k) * d for k, d in zip(block, dilations)], indexing="ij"), -1)
    starts = np.stack(np.meshgrid(*[np.arange(m) * s for m, s in zip(counts, strides)], indexing="ij"), -1)
    pos = offsets.reshape(-1, 1, len(block)) + starts.reshape(1, -1, len(block))
    return np.ravel_multi_index(tuple(np.moveaxis(pos, -1, 0)), padded).astype(np.int64)


@register("Col2Im")
def col2im(ctx: BackwardContext) -> dict[int, int]:
    """d input[n, c * K + k, l] = dY[n, c, position of block element k in block l], 0 in the pads."""
    em, g = ctx.em, ctx.dy()
    image = _const_ints(ctx, 1, "image_shape")
    block = _const_ints(ctx, 2, "block_shape")
    sp = len(image)
    dilations = ctx.int_list("dilations", [1] * sp)
    pads = ctx.int_list("pads", [0] * (2 * sp))
    strides = ctx.int_list("strides", [1] * sp)
    index = col2im_index(image, block, dilations, pads[:sp], pads[sp:], strides)
    x_shape = ctx.x_shape(0)
    if index.shape[1] != x_shape[2]:
        raise ModelImportError(
            f"node {ctx.node.name!r} (Col2Im) has {x_shape[2]} blocks in its input, but image_shape {image}, "
            f"block_shape {block}, pads {pads}, strides {strides} and dilations {dilations} give {index.shape[1]}"
        )
    n, c = x_shape[0], x_shape[1] // prod(block)
    padded = em.pad_zeros(g, [0, 0, *pads[:sp]], [0, 0, *pads[sp:]])
    flat = em.reshape(padded, [n, c, prod(em.shape(padded)[2:])])
    blocks = em.op("Gather", [flat, em.const(index)], [n, c, *index.shape], em.dtype(g), axis=2)
    return {0: em.reshape(blocks, x_shape)}
