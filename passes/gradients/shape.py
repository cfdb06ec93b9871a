"""Gradients of data-movement ops (reshape, transpose, concat/split, slice, gather, pad, resize),
of CumSum and Trilu, and of the Reduce* ops.

Shapes and the constant inputs (shape, axes, starts, pads, scales) are static after import, so the
per-axis maps of Slice with steps, Pad reflect/edge/wrap and Resize are built here as small
constant matrices and their adjoints applied with one MatMul per axis.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from passes.gradients import BackwardContext, register
from passes.gradients._emit import Emitter, axes_input_since, prod
from planner.errors import ModelImportError, OpsetTooOldError
from planner.graph import PADDING_IDX


def _axes(ctx: BackwardContext, slot: int, attr_before: int, rank: int) -> list[int] | None:
    """An ``axes`` list from the input ``slot`` (opset >= attr_before) or the attribute; None if absent."""
    if ctx.opset >= attr_before:
        if not ctx.has_input(slot):
            return None
        values = ctx.require_const(slot, "axes input")
    else:
        values = ctx.attr("axes")
        if values is None:
            return None
    return sorted(int(a) % rank for a in np.asarray(values).reshape(-1))


# ---- pure reshapes ----------------------------------------------------------------------------
@register("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape(ctx: BackwardContext) -> dict[int, int]:
    return {0: ctx.em.reshape(ctx.dy(), ctx.x_shape(0))}


@register("Transpose")
def transpose(ctx: BackwardContext) -> dict[int, int]:
    perm = ctx.attr("perm") or list(reversed(range(len(ctx.x_shape(0)))))
    return {0: ctx.em.transpose(ctx.dy(), np.argsort(perm))}


@register("Expand")
def expand(ctx: BackwardContext) -> dict[int, int]:
    return {0: ctx.em.unbroadcast(ctx.dy(), ctx.x_shape(0))}


@register("Tile")
def tile(ctx: BackwardContext) -> dict[int, int]:
    """Split each axis into (repeat, size) and sum over the repeats."""
    em = ctx.em
    x_shape = ctx.x_shape(0)
    repeats = [int(r) for r in ctx.require_const(1, "repeats input")]
    split = [d for r, n in zip(repeats, x_shape) for d in (r, n)]
    summed = em.reduce_sum(em.reshape(ctx.dy(), split), range(0, 2 * len(x_shape), 2), keepdims=False)
    return {0: em.reshape(summed, x_shape)}


# ---- concat / split ---------------------------------------------------------------------------
@register("Concat", inputs=None)
def concat(ctx: BackwardContext) -> dict[int, int]:
    rank = len(ctx.y_shape())
    axis = int(ctx.attr("axis")) % rank
    out, start = {}, 0
    for i in range(len(ctx.node.inputs)):
        size = ctx.x_shape(i)[axis]
        if ctx.needs(i):
            out[i] = ctx.em.slice(ctx.dy(), [start], [start + size], [axis])
        start += size
    return out


@register("Split", outputs=None)
def split(ctx: BackwardContext) -> dict[int, int]:
    """Concatenate the output gradients, zeros for outputs that receive none."""
    em = ctx.em
    axis = int(ctx.attr("axis", 0)) % len(ctx.x_shape(0))
    dtype = ctx.x_dtype(0)
    parts = [ctx.dy(i) if ctx.dy(i) is not None else em.zeros(ctx.y_shape(i), dtype)
             for i in range(len(ctx.node.outputs))]
    return {0: em.concat(parts, axis)}


# ---- slice / gather / pad ---------------------------------------------------------------------
def _selection_matrix(rows: Sequence[int], size: int) -> np.ndarray:
    """M[j, i] = 1 where output position j reads input position i (an adjoint is g @ M)."""
    m = np.zeros((len(rows), size))
    for j, i in enumerate(rows):
        if i is not None:
            m[j, i] += 1.0
    return m


@register("Slice")
def slice_(ctx: BackwardContext) -> dict[int, int]:
    """Unit steps: zero-pad g back to the input shape. Other steps: one selection matrix per axis."""
    em = ctx.em
    x_shape = ctx.x_shape(0)
    rank = len(x_shape)
    if ctx.opset < 10:
        starts, ends = ctx.attr("starts"), ctx.attr("ends")
        axes = ctx.attr("axes") or list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts = ctx.require_const(1, "starts input").tolist()
        ends = ctx.require_const(2, "ends input").tolist()
        axes = ctx.require_const(3, "axes input").tolist() if ctx.has_input(3) else list(range(len(starts)))
        steps = ctx.require_const(4, "steps input").tolist() if ctx.has_input(4) else [1] * len(starts)
    picked = {int(a) % rank: range(*slice(int(s), int(e), int(st)).indices(x_shape[int(a) % rank]))
              for s, e, a, st in zip(starts, ends, axes, steps)}
    g = ctx.dy()
    if all(r.step == 1 for r in picked.values()):
        begin = [picked[a].start if a in picked else 0 for a in range(rank)]
        end = [x_shape[a] - (picked[a].start + len(picked[a])) if a in picked else 0 for a in range(rank)]
        return {0: em.pad_zeros(g, begin, end)}
    for axis in sorted(picked):
        g = em.axis_matmul(g, axis, _selection_matrix(list(picked[axis]), x_shape[axis]))
    return {0: g}


def _pad_source(j: int, n: int, begin: int, mode: str) -> int | None:
    """Input position that padded position j reads along one axis (None for constant fill)."""
    p = j - begin
    if 0 <= p < n:
        return p
    if mode == "constant":
        return None
    if mode == "edge":
        return min(max(p, 0), n - 1)
    if mode == "wrap":
        return p % n
    period = 2 * (n - 1)  # reflect
    p = abs(p) % period if period else 0
    return period - p if p >= n else p


@register("Pad")
def pad(ctx: BackwardContext) -> dict[int, int]:
    """Constant mode with non-negative pads crops g; other cases apply the adjoint per padded axis."""
    em = ctx.em
    x_shape, y_shape = ctx.x_shape(0), ctx.y_shape()
    rank = len(x_shape)
    mode = ctx.attr("mode", "constant")
    if ctx.opset < 11:
        pads = [int(p) for p in ctx.attr("pads")]
    else:
        pads = [int(p) for p in ctx.require_const(1, "pads input")]
    axes = list(range(rank))
    if ctx.opset >= 18 and ctx.has_input(3):
        axes = [int(a) % rank for a in ctx.require_const(3, "axes input")]
    begin, end = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[k + len(axes)]
    g = ctx.dy()
    if mode == "constant" and min(begin + end) >= 0:
        return {0: em.slice(g, begin, [b + n for b, n in zip(begin, x_shape)], list(range(rank)))}
    for axis in range(rank):
        if begin[axis] or end[axis]:
            rows = [_pad_source(j, x_shape[axis], begin[axis], mode) for j in range(y_shape[axis])]
            g = em.axis_matmul(g, axis, _selection_matrix(rows, x_shape[axis]))
    return {0: g}


def _require_opset16(ctx: BackwardContext, needed: str) -> None:
    if ctx.opset < 16:
        raise OpsetTooOldError(
            f"node {ctx.node.name!r} ({ctx.node.op_type}) needs {needed} with reduction='add' (opset 16) "
            "for its gradient", 16
        )


@register("Gather")
def gather(ctx: BackwardContext) -> dict[int, int]:
    """Scatter-add g back along ``axis`` (ScatterND with reduction='add', opset 16+); a torch
    embedding's padding row (``PADDING_IDX``) gets none, as torch gives it."""
    em, g = ctx.em, ctx.dy()
    x_shape = ctx.x_shape(0)
    rank = len(x_shape)
    axis = int(ctx.attr("axis", 0)) % rank
    _require_opset16(ctx, "ScatterND")
    i_shape = ctx.x_shape(1)
    const_idx = ctx.const_input(1)
    if const_idx is not None:
        idx = em.const(np.where(const_idx < 0, const_idx + x_shape[axis], const_idx).astype(np.int64))
    else:
        raw = ctx.x(1)
        negative = em.binary("Less", raw, em.const(np.asarray(0, dtype=em.dtype(raw))))
        idx = em.cast(em.where(negative, em.add(raw, em.const(np.asarray(x_shape[axis], em.dtype(raw)))), raw),
                      "int64")
    idx = em.reshape(idx, [*i_shape, 1])
    # g is x[:axis] + i_shape + x[axis+1:]; move the index dims first.
    ni = len(i_shape)
    perm = [*range(axis, axis + ni), *range(axis), *range(axis + ni, len(em.shape(g)))]
    moved = em.transpose(g, perm)
    target = [x_shape[axis], *x_shape[:axis], *x_shape[axis + 1:]]
    scattered = em.scatter_add("ScatterND", None, idx, moved, target)
    pad = ctx.attr(PADDING_IDX)
    if pad is not None and axis == 0 and 0 <= int(pad) < x_shape[0]:  # torch's nn.Embedding(padding_idx=pad)
        row = em.const(np.asarray([[int(pad)]], np.int64))
        scattered = em.op("ScatterND", [scattered, row, em.zeros([1, *x_shape[1:]], em.dtype(scattered))],
                          target, em.dtype(scattered))
    back = [*range(1, axis + 1), 0, *range(axis + 1, rank)]
    return {0: em.transpose(scattered, back)}


@register("GatherElements")
def gather_elements(ctx: BackwardContext) -> dict[int, int]:
    """Scatter-add g into zeros at the same positions (ScatterElements with reduction='add', opset
    16+; it takes negative indices as GatherElements does)."""
    em, g = ctx.em, ctx.dy()
    _require_opset16(ctx, "ScatterElements")
    x_shape = ctx.x_shape(0)
    axis = int(ctx.attr("axis", 0)) % len(x_shape)
    return {0: em.scatter_add("ScatterElements", None, ctx.x(1), g, x_shape, axis=axis)}


def _topk_indices(node, tensor_of, value_of):
    return {1: ("indices", "int64", tensor_of(node.outputs[0]).shape)}


@register("TopK", extra_outputs=_topk_indices)
def top_k(ctx: BackwardContext) -> dict[int, int]:
    """Scatter g into zeros at the forward's Indices along ``axis``. The k indices of a row are
    distinct, so no reduction is needed (any opset with TopK's k as an input)."""
    em, g = ctx.em, ctx.dy()
    x_shape = ctx.x_shape(0)
    axis = int(ctx.attr("axis", -1)) % len(x_shape)
    zeros = em.zeros(x_shape, em.dtype(g))
    return {0: em.op("ScatterElements", [zeros, ctx.y(1), g], x_shape, em.dtype(g), axis=axis)}


def _nd_indices(ctx: BackwardContext, slot: int, dims: Sequence[int]) -> int:
    """Input ``slot``'s GatherND/ScatterND index tuples with negative entries made positive
    (entry j counts from the end of ``dims[j]``)."""
    em = ctx.em
    dims_arr = np.asarray(dims[:ctx.x_shape(slot)[-1]], dtype=np.int64)
    const = ctx.const_input(slot)
    if const is not None:
        return em.const(np.where(const < 0, const + dims_arr, const).astype(np.int64))
    raw = ctx.x(slot)
    negative = em.binary("Less", raw, em.const(np.asarray(0, dtype=np.int64)))
    return em.where(negative, em.add(raw, em.const(dims_arr)), raw)


@register("GatherND")
def gather_nd(ctx: BackwardContext) -> dict[int, int]:
    """Scatter-add g back at the gathered index tuples (ScatterND with reduction='add'). With
    batch_dims = b the tuples index each batch entry; prefixing them with the batch coordinates (a
    constant grid, shapes being static) gives the same gather with batch_dims = 0."""
    em, g = ctx.em, ctx.dy()
    _require_opset16(ctx, "ScatterND")
    x_shape = ctx.x_shape(0)
    b = int(ctx.attr("batch_dims", 0))
    idx = _nd_indices(ctx, 1, x_shape[b:])
    if b:
        i_shape = ctx.x_shape(1)
        grid = np.indices(i_shape[:b], dtype=np.int64)  # [b, *batch]
        grid = np.moveaxis(grid, 0, -1).reshape([*i_shape[:b], *[1] * (len(i_shape) - 1 - b), b])
        grid = em.const(np.broadcast_to(grid, [*i_shape[:-1], b]))
        idx = em.concat([grid, idx], len(i_shape) - 1)
    return {0: em.scatter_add("ScatterND", None, idx, g, x_shape)}


def _scatter_reduction(ctx: BackwardContext) -> str:
    reduction = str(ctx.attr("reduction", "none"))  # the importer decodes string attributes
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ModelImportError(
            f"node {ctx.node.name!r} ({ctx.node.op_type}) scatters with reduction={reduction!r}, whose "
            "gradient memplan does not have; use reduction 'none', 'add', 'mul', 'max' or 'min', or freeze "
            "the weights before it"
        )
    return reduction


def _is_zero(em: Emitter, x: int) -> tuple[int, int]:
    """(1.0 where x == 0 else 0.0, x with its zeros replaced by 1), both of x's type."""
    zero, safe = em.zeros_to_one(x)
    return em.cast(zero, em.dtype(x)), safe


def _product_of_others(em: Emitter, x_safe: int, x_zero: int, nonzero_prod: int, zeros: int) -> int:
    """For each factor x_i of a product: the product of the other factors, exact with zeros.

    ``nonzero_prod`` and ``zeros`` are, broadcast against x, the product of the non-zero factors and the
    number of zero factors of x_i's product; ``x_safe``/``x_zero`` come from ``_is_zero(x)``. Where no
    other factor is zero the result is nonzero_prod / x_safe (nonzero_prod itself when x_i is the zero);
    else it is exactly 0. Unlike y / x or exp(sum log |x|) this never divides by a zero nor gives 0/0:
    one zero factor leaves the product of the others, two or more leave 0."""
    none_other = em.binary("Equal", em.sub(zeros, x_zero), em.scalar(0.0, zeros))
    return em.mul(em.div(nonzero_prod, x_safe), em.cast(none_other, em.dtype(x_safe)))


def _scatter_backward(
    ctx: BackwardContext, reduction: str, scatter: Callable[[int, int, str], int], gather: Callable[[int], int],
) -> dict[int, int]:
    """Gradients of a scatter into data (slot 0) of the updates (slot 2), given ``scatter(base, updates,
    reduction)`` and ``gather(t)`` (the positions the updates land on) of the node's own indices.

    none: data gets g zeroed where written, an update g at its position (duplicates under 'none' leave
    which update lands undefined (ONNX); each then gets g, as PyTorch's scatter backward gives).
    add: data gets g, an update g at its position. mul: y = data * prod(updates at the position), so
    data gets g times the product of its updates, an update g times the product of the others (data
    included, exact with zeros). max/min: g goes to the factors equal to the output, split evenly
    between ties (as ReduceMax)."""
    em, g = ctx.em, ctx.dy()
    d_shape, dtype = ctx.x_shape(0), em.dtype(g)
    out = {}
    if reduction in ("none", "add"):
        if ctx.needs(0):
            out[0] = g if reduction == "add" else scatter(g, em.zeros(ctx.x_shape(2), dtype), "none")
        if ctx.needs(2):
            out[2] = gather(g)
    elif reduction == "mul":
        u = ctx.x(2)
        if ctx.needs(0):
            out[0] = em.mul(g, scatter(em.fill(d_shape, 1.0, dtype), u, "mul"))
        if ctx.needs(2):
            d_zero, d_safe = _is_zero(em, ctx.x(0))
            u_zero, u_safe = _is_zero(em, u)
            nonzero_prod = em.mul(d_safe, scatter(em.fill(d_shape, 1.0, dtype), u_safe, "mul"))
            zeros = em.add(d_zero, scatter(em.zeros(d_shape, dtype), u_zero, "add"))
            others = _product_of_others(em, u_safe, u_zero, gather(nonzero_prod), gather(zeros))
            out[2] = em.mul(gather(g), others)
    else:
        y = ctx.y()
        d_hit = em.cast(em.binary("Equal", ctx.x(0), y), dtype)
        u_hit = em.cast(em.binary("Equal", ctx.x(2), gather(y)), dtype)
        share = em.div(g, em.add(d_hit, scatter(em.zeros(d_shape, dtype), u_hit, "add")))
        if ctx.needs(0):
            out[0] = em.mul(d_hit, share)
        if ctx.needs(2):
            out[2] = em.mul(u_hit, gather(share))
    return out


@register("ScatterElements", inputs=(0, 2))
def scatter_elements(ctx: BackwardContext) -> dict[int, int]:
    """The updates' positions are GatherElements of the same indices (see ``_scatter_backward``)."""
    em = ctx.em
    reduction = _scatter_reduction(ctx)
    d_shape, u_shape = ctx.x_shape(0), ctx.x_shape(2)
    axis = int(ctx.attr("axis", 0)) % len(d_shape)

    def scatter(base: int, updates: int, how: str) -> int:
        attrs = {} if how == "none" else {"reduction": how}
        return em.op("ScatterElements", [base, ctx.x(1), updates], d_shape, em.dtype(base), axis=axis, **attrs)

    def gather(t: int) -> int:
        return em.op("GatherElements", [t, ctx.x(1)], u_shape, em.dtype(t), axis=axis)

    return _scatter_backward(ctx, reduction, scatter, gather)


@register("ScatterND", inputs=(0, 2))
def scatter_nd(ctx: BackwardContext) -> dict[int, int]:
    """As ScatterElements, with index tuples: ScatterND/GatherND at the same tuples."""
    em = ctx.em
    reduction = _scatter_reduction(ctx)
    d_shape, u_shape = ctx.x_shape(0), ctx.x_shape(2)
    idx = _nd_indices(ctx, 1, d_shape)

    def scatter(base: int, updates: int, how: str) -> int:
        attrs = {} if how == "none" else {"reduction": how}
        return em.op("ScatterND", [base, idx, updates], d_shape, em.dtype(base), **attrs)

    def gather(t: int) -> int:
        return em.op("GatherND", [t, idx], u_shape, em.dtype(t))

    return _scatter_backward(ctx, reduction, scatter, gather)


# ---- scans and masks --------------------------------------------------------------------------
@register("CumSum")
def cum_sum(ctx: BackwardContext) -> dict[int, int]:
    """Each input element feeds the outputs after it (before it when reverse): the adjoint is the
    cumulative sum of g in the other direction, exclusive when the forward was."""
    em, g = ctx.em, ctx.dy()
    reverse, exclusive = int(ctx.attr("reverse", 0)), int(ctx.attr("exclusive", 0))
    return {0: em.op("CumSum", [g, ctx.x(1)], em.shape(g), em.dtype(g), reverse=1 - reverse, exclusive=exclusive)}


@register("Trilu")
def trilu(ctx: BackwardContext) -> dict[int, int]:
    """A fixed mask: dx is g under the same mask (same upper and k)."""
    em, g = ctx.em, ctx.dy()
    inputs = [g, ctx.x(1)] if ctx.has_input(1) else [g]
    return {0: em.op("Trilu", inputs, em.shape(g), em.dtype(g), upper=int(ctx.attr("upper", 1)))}


# ---- depth <-> space ----------------------------------------------------------------------------
@register("DepthToSpace", "SpaceToDepth")
def depth_space(ctx: BackwardContext) -> dict[int, int]:
    """Both are permutations of the elements, so the adjoint is the inverse permutation. SpaceToDepth
    and DepthToSpace in DCR mode undo each other; CRD mode is undone by reshape, transpose, reshape:
    y[n, c, h*b + i, w*b + j] = x[n, c*b*b + i*b + j, h, w]."""
    em, g = ctx.em, ctx.dy()
    b = int(ctx.attr("blocksize"))
    x_shape, dtype = ctx.x_shape(0), em.dtype(g)
    if ctx.node.op_type == "SpaceToDepth":
        return {0: em.op("DepthToSpace", [g], x_shape, dtype, blocksize=b, mode="DCR")}
    mode = str(ctx.attr("mode", "DCR"))
    if mode == "DCR":
        return {0: em.op("SpaceToDepth", [g], x_shape, dtype, blocksize=b)}
    n, c, h, w = x_shape
    blocks = em.reshape(g, [n, c // (b * b), h, b, w, b])  # (n, c, h, i, w, j)
    return {0: em.reshape(em.transpose(blocks, [0, 1, 3, 5, 2, 4]), x_shape)}


# ---- resize -----------------------------------------------------------------------------------
def _source_coordinate(x: np.ndarray, scale: float, n_in: int, n_out: int, mode: str) -> np.ndarray:
    """ONNX Resize coordinate_transformation_mode: output coordinate -> input coordinate."""
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros_like(x)
    if mode == "align_corners":
        return x * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    if mode == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        offset = n_in / 2 * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    raise ValueError(mode)


def _cubic_weights(coords: np.ndarray, n_in: int, a: float, exclude_outside: bool) -> np.ndarray:
    """M[o, i] for cubic convolution (Keys, coefficient ``a``): the four inputs around each source
    coordinate, unclipped; a tap past an edge reads the edge input, or with ``exclude_outside``
    weighs nothing and the others are scaled to sum to 1 (as ONNX's reference and ORT do)."""
    m = np.zeros((len(coords), n_in))
    rows = np.arange(len(coords))
    base = np.floor(coords)
    for k in (-1, 0, 1, 2):
        d = np.abs(coords - (base + k))
        w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                     np.where(d < 2, ((a * d - 5 * a) * d + 8 * a) * d - 4 * a, 0.0))
        idx = base + k
        if exclude_outside:
            w = np.where((idx >= 0) & (idx <= n_in - 1), w, 0.0)
        np.add.at(m, (rows, np.clip(idx, 0, n_in - 1).astype(np.int64)), w)
    if exclude_outside:
        m /= m.sum(axis=1, keepdims=True)
    return m


def _resize_matrix(n_in: int, n_out: int, scale: float, ctx: BackwardContext) -> np.ndarray:
    """M[o, i]: weight of input i in output o along one axis (nearest, linear or cubic)."""
    mode = ctx.attr("mode", "nearest")
    coords = _source_coordinate(np.arange(n_out, dtype=np.float64), scale, n_in, n_out,
                                ctx.attr("coordinate_transformation_mode", "half_pixel"))
    if mode == "cubic":
        return _cubic_weights(coords, n_in, float(ctx.attr("cubic_coeff_a", -0.75)),
                              bool(int(ctx.attr("exclude_outside", 0))))
    m = np.zeros((n_out, n_in))
    rows = np.arange(n_out)
    if mode == "nearest":
        rounding = ctx.attr("nearest_mode", "round_prefer_floor")
        frac = coords - np.floor(coords)
        if rounding == "floor":
            idx = np.floor(coords)
        elif rounding == "ceil":
            idx = np.ceil(coords)
        elif rounding == "round_prefer_ceil":
            idx = np.where(frac == 0.5, np.ceil(coords), np.round(coords))
        else:
            idx = np.where(frac == 0.5, np.floor(coords), np.round(coords))
        m[rows, np.clip(idx, 0, n_in - 1).astype(np.int64)] = 1.0
        return m
    coords = np.clip(coords, 0, n_in - 1)
    lo = np.floor(coords).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    w = coords - lo
    np.add.at(m, (rows, lo), 1.0 - w)
    np.add.at(m, (rows, hi), w)
    return m


@register("Resize")
def resize(ctx: BackwardContext) -> dict[int, int]:
    """Nearest, (bi/tri)linear and (bi)cubic Resize are separable: the adjoint is one constant
    matrix per axis."""
    em = ctx.em
    x_shape, y_shape = ctx.x_shape(0), ctx.y_shape()
    rank = len(x_shape)
    mode = ctx.attr("mode", "nearest")
    ctm = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in ("nearest", "linear", "cubic") or ctm == "tf_crop_and_resize" or int(ctx.attr("antialias", 0)):
        raise ModelImportError(
            f"node {ctx.node.name!r} (Resize) uses mode={mode!r}, coordinate_transformation_mode={ctm!r}, "
            f"antialias={ctx.attr('antialias', 0)}; memplan differentiates Resize with mode nearest, linear or "
            "cubic, without antialias or tf_crop_and_resize"
        )
    axes = [int(a) % rank for a in ctx.attr("axes", range(rank))]
    scales = [y / x for x, y in zip(x_shape, y_shape)]
    scale_slot = 2 if ctx.opset >= 11 else 1
    given = ctx.const_input(scale_slot)
    if given is not None and given.size:
        for a, s in zip(axes, given.reshape(-1)):
            scales[a] = float(s)
    elif ctx.has_input(3) and ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        # the scale ORT maps with is the asked sizes' over the input's, not the rounded output's
        # (sizes 5x5 of 3x4, not_smaller: 5/3, where the 5x7 output gives 7/4; fuzzed, stop 49)
        pick = min if ctx.attr("keep_aspect_ratio_policy") == "not_larger" else max
        sizes = ctx.require_const(3, "sizes").reshape(-1)
        common = pick(float(sizes[k]) / x_shape[a] for k, a in enumerate(axes))
        for a in axes:
            scales[a] = common
    g = ctx.dy()
    for axis in reversed(range(rank)):
        if x_shape[axis] == y_shape[axis] and scales[axis] == 1.0:
            continue
        g = em.axis_matmul(g, axis, _resize_matrix(x_shape[axis], y_shape[axis], scales[axis], ctx))
    return {0: g}


# ---- reductions -------------------------------------------------------------------------------
def _reduced_axes(ctx: BackwardContext) -> list[int]:
    """The axes a Reduce* node reduces: all when ``axes`` is absent or empty, none when it is empty
    and noop_with_empty_axes is set (the op then maps each element alone: x, x^2, |x|, ...)."""
    rank = len(ctx.x_shape(0))
    axes = _axes(ctx, 1, axes_input_since(ctx.node.op_type), rank)
    if not axes:
        return [] if int(ctx.attr("noop_with_empty_axes", 0)) else list(range(rank))
    return axes


def _kept(ctx: BackwardContext, t: int, axes: list[int]) -> int:
    """A reduction's output (or its gradient) ``t`` with the reduced axes kept as size 1, so it
    broadcasts against the input whatever keepdims was."""
    return ctx.em.reshape(t, [1 if a in axes else d for a, d in enumerate(ctx.x_shape(0))])


@register("ReduceSum", "ReduceMean")
def reduce_sum_mean(ctx: BackwardContext) -> dict[int, int]:
    """Broadcast g back over the reduced axes (divided by their size for the mean)."""
    em, x_shape = ctx.em, ctx.x_shape(0)
    axes = _reduced_axes(ctx)
    g = ctx.dy()
    if ctx.node.op_type == "ReduceMean":
        g = em.scale(g, 1.0 / prod(x_shape[a] for a in axes))
    return {0: em.expand(_kept(ctx, g, axes), x_shape)}


@register("ReduceSumSquare", "ReduceL1")
def reduce_sum_square_l1(ctx: BackwardContext) -> dict[int, int]:
    """sum x^2: dx = 2 x g; sum |x|: dx = Sign(x) g (0 at x = 0)."""
    em, x = ctx.em, ctx.x(0)
    g = _kept(ctx, ctx.dy(), _reduced_axes(ctx))
    if ctx.node.op_type == "ReduceL1":
        return {0: em.mul(g, em.unary("Sign", x))}
    return {0: em.mul(em.scale(g, 2.0), x)}


@register("ReduceL2")
def reduce_l2(ctx: BackwardContext) -> dict[int, int]:
    """y = sqrt(sum x^2): dx = x g / y; 0 where y = 0 (x is all zero there; the subgradient
    PyTorch's norm also picks), so a zero row does not make NaNs."""
    em = ctx.em
    axes = _reduced_axes(ctx)
    y = _kept(ctx, ctx.y(), axes)
    _, safe_y = em.zeros_to_one(y)
    return {0: em.mul(ctx.x(0), em.div(_kept(ctx, ctx.dy(), axes), safe_y))}


@register("ReduceLogSumExp")
def reduce_log_sum_exp(ctx: BackwardContext) -> dict[int, int]:
    """y = log sum exp(x): dx = g exp(x - y), a softmax over the reduced axes."""
    em = ctx.em
    axes = _reduced_axes(ctx)
    weights = em.unary("Exp", em.sub(ctx.x(0), _kept(ctx, ctx.y(), axes)))
    return {0: em.mul(weights, _kept(ctx, ctx.dy(), axes))}


@register("ReduceMax", "ReduceMin")
def reduce_max_min(ctx: BackwardContext) -> dict[int, int]:
    """g goes to the elements equal to the extreme, split evenly between ties (PyTorch's amax/amin
    convention; the input gradient sums to g)."""
    em = ctx.em
    axes = _reduced_axes(ctx)
    g = _kept(ctx, ctx.dy(), axes)
    hit = em.cast(em.binary("Equal", ctx.x(0), _kept(ctx, ctx.y(), axes)), em.dtype(g))
    return {0: em.mul(hit, em.div(g, em.reduce_sum(hit, axes)))}


@register("ReduceProd")
def reduce_prod(ctx: BackwardContext) -> dict[int, int]:
    """dx_i = g * (product of the other elements of x_i's slice), computed exactly with zeros: the
    product of the slice's non-zero elements and the count of its zeros give it (``_product_of_others``;
    one zero in a slice leaves the product of the others at the zero and 0 elsewhere, two leave 0).
    Reads only x: the products are recomputed from it."""
    em = ctx.em
    axes = _reduced_axes(ctx)
    g = _kept(ctx, ctx.dy(), axes)
    if not axes:  # noop_with_empty_axes: y = x
        return {0: g}
    x_zero, x_safe = _is_zero(em, ctx.x(0))
    others = _product_of_others(em, x_safe, x_zero, em.reduce("ReduceProd", x_safe, axes),
                                em.reduce_sum(x_zero, axes))
    return {0: em.mul(g, others)}


@register("OneHot", inputs=(2,))
def one_hot(ctx: BackwardContext) -> dict[int, int]:
    """y = values[1] where the index hits, values[0] elsewhere: d values = [sum(g) - sum(g * m),
    sum(g * m)], m the one-hot mask (the same OneHot with values [0, 1]). Only ``values`` (when
    trainable) carries a gradient; indices and depth are integers."""
    em, g = ctx.em, ctx.dy()
    dtype = em.dtype(g)
    axis = int(ctx.attr("axis", -1))
    mask = em.op("OneHot", [ctx.x(0), ctx.x(1), em.const(np.asarray([0, 1], dtype=dtype))], em.shape(g), dtype,
                 axis=axis)
    every = list(range(len(em.shape(g))))
    hit = em.reduce_sum(em.mul(g, mask), every, keepdims=False)
    miss = em.sub(em.reduce_sum(g, every, keepdims=False), hit)
    return {2: em.concat([em.reshape(miss, [1]), em.reshape(hit, [1])], 0)}
