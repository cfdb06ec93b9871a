"""Gradients of Conv, ConvTranspose and the pools (any spatial rank, groups, strides, pads, dilations).

Conv's input gradient is a ConvTranspose with the same weight; its weight gradient is a Conv of the
input (batch and channel axes swapped) with the output gradient as the kernel, strides and
dilations exchanged. ConvTranspose is the adjoint of Conv, so the same two pieces serve it the
other way round. MaxPool scatters through the forward's Indices output; AveragePool spreads each
output gradient over its window with a ones-kernel ConvTranspose, divided by the same count the
forward divided by (computed at build time: shapes are static).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from passes.gradients import BackwardContext, register
from passes.gradients._emit import Emitter, prod
from planner.errors import ModelImportError, OpsetTooOldError


def explicit_pads(
    ctx: BackwardContext, in_sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
    dilations: Sequence[int],
) -> tuple[list[int], list[int]]:
    """(begin, end) pads of a Conv/Pool node, with auto_pad resolved on the static input sizes."""
    sp = len(in_sizes)
    auto = ctx.attr("auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, k, s, d in zip(in_sizes, kernel, strides, dilations):
            out = -(-n // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
        return begin, end
    if auto == "VALID":
        return [0] * sp, [0] * sp
    pads = ctx.int_list("pads", [0] * (2 * sp))
    return pads[:sp], pads[sp:]


def _conv_geometry(ctx: BackwardContext, x_shape: Sequence[int], kernel: Sequence[int]):
    sp = len(x_shape) - 2
    strides = ctx.int_list("strides", [1] * sp)
    dilations = ctx.int_list("dilations", [1] * sp)
    begin, end = explicit_pads(ctx, x_shape[2:], kernel, strides, dilations)
    return strides, dilations, begin, end


def conv_weight_grad(
    em: Emitter, inp: int, gout: int, w_shape: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
    begin: Sequence[int], group: int,
) -> int:
    """dW of ``Conv(inp, W)`` given the output gradient ``gout``; W is [M, C/group, k...].

    Per group, dW[m, c] = sum_n corr(inp[n, c], gout[n, m]): a Conv whose batch is C/group, whose
    channels are (group, N) and whose kernel is gout with axes 0 and 1 swapped.
    """
    x_shape, g_shape = em.shape(inp), em.shape(gout)
    n, c = x_shape[:2]
    sp = len(x_shape) - 2
    cg = c // group
    spatial = list(range(2, 2 + sp))
    if group == 1:
        xt = em.transpose(inp, [1, 0, *spatial])
    else:
        grouped = em.reshape(inp, [n, group, cg, *x_shape[2:]])
        xt = em.reshape(em.transpose(grouped, [2, 1, 0, *range(3, 3 + sp)]), [cg, group * n, *x_shape[2:]])
    gt = em.transpose(gout, [1, 0, *spatial])
    kernel = w_shape[2:]
    end, full = [], []
    for size, o, k, s, d, b in zip(x_shape[2:], g_shape[2:], kernel, strides, dilations, begin):
        end.append(max(0, (k - 1) * d + (o - 1) * s + 1 - size - b))
        full.append((size + b + end[-1] - ((o - 1) * s + 1)) // d + 1)
    dw = em.op("Conv", [xt, gt], [cg, g_shape[1], *full], em.dtype(inp), strides=list(dilations),
               dilations=list(strides), pads=[*begin, *end], group=group)
    if full != list(kernel):
        dw = em.slice(dw, [0] * sp, list(kernel), spatial)
    return em.transpose(dw, [1, 0, *spatial])


@register("Conv", inputs=(0, 1, 2))
def conv(ctx: BackwardContext) -> dict[int, int]:
    em, g = ctx.em, ctx.dy()
    x_shape, w_shape = ctx.x_shape(0), ctx.x_shape(1)
    kernel = w_shape[2:]
    group = int(ctx.attr("group", 1))
    strides, dilations, begin, end = _conv_geometry(ctx, x_shape, kernel)
    out = {}
    if ctx.needs(0):
        extra = [(n + b + e - ((k - 1) * d + 1)) % s
                 for n, b, e, k, d, s in zip(x_shape[2:], begin, end, kernel, dilations, strides)]
        attrs = dict(strides=strides, dilations=dilations, pads=[*begin, *end], group=group)
        if any(extra):
            attrs["output_padding"] = extra
        out[0] = em.op("ConvTranspose", [g, ctx.x(1)], x_shape, em.dtype(g), **attrs)
    if ctx.needs(1):
        out[1] = conv_weight_grad(em, ctx.x(0), g, w_shape, strides, dilations, begin, group)
    if ctx.needs(2):
        out[2] = em.reduce_sum(g, [0, *range(2, len(x_shape))], keepdims=False)
    return out


@register("ConvTranspose", inputs=(0, 1, 2))
def conv_transpose(ctx: BackwardContext) -> dict[int, int]:
    """Y = ConvT(X, W) is the adjoint of Z = Conv(U, W): dX = Conv(g, W), dW = dW_conv(input g, grad X)."""
    em, g = ctx.em, ctx.dy()
    x_shape, w_shape, y_shape = ctx.x_shape(0), ctx.x_shape(1), ctx.y_shape()
    sp = len(x_shape) - 2
    kernel = w_shape[2:]
    group = int(ctx.attr("group", 1))
    strides = ctx.int_list("strides", [1] * sp)
    dilations = ctx.int_list("dilations", [1] * sp)
    out_pad = ctx.int_list("output_padding", [0] * sp)
    auto = ctx.attr("auto_pad", "NOTSET")
    if ctx.attr("output_shape") is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for n, o, k, s, d, op in zip(x_shape[2:], y_shape[2:], kernel, strides, dilations, out_pad):
            total = s * (n - 1) + op + (k - 1) * d + 1 - o
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
    elif auto == "VALID":
        begin, end = [0] * sp, [0] * sp
    else:
        pads = ctx.int_list("pads", [0] * (2 * sp))
        begin, end = pads[:sp], pads[sp:]
    out = {}
    if ctx.needs(0):
        out[0] = em.op("Conv", [g, ctx.x(1)], x_shape, em.dtype(g), strides=strides, dilations=dilations,
                       pads=[*begin, *end], group=group)
    if ctx.needs(1):
        out[1] = conv_weight_grad(em, g, ctx.x(0), w_shape, strides, dilations, begin, group)
    if ctx.needs(2):
        out[2] = em.reduce_sum(g, [0, *range(2, len(y_shape))], keepdims=False)
    return out


# ---- pools ------------------------------------------------------------------------------------
def _indices_output(node, tensor_of, value_of):
    return {1: ("indices", "int64", tensor_of(node.outputs[0]).shape)}


@register("MaxPool", extra_outputs=_indices_output)
def max_pool(ctx: BackwardContext) -> dict[int, int]:
    """Scatter-add g into a flat zero tensor at the forward's argmax Indices (flat over N, C, spatial)."""
    em, g = ctx.em, ctx.dy()
    x_shape = ctx.x_shape(0)
    if int(ctx.attr("storage_order", 0)) != 0:
        raise ModelImportError(
            f"node {ctx.node.name!r} (MaxPool) uses storage_order=1, whose indices memplan cannot "
            "differentiate through; export the model with the default row-major storage_order=0"
        )
    kernel = ctx.int_list("kernel_shape", [])
    strides, dilations, _, _ = _conv_geometry(ctx, x_shape, kernel)
    overlapping = any(s < (k - 1) * d + 1 for s, k, d in zip(strides, kernel, dilations))
    if ctx.opset < 16 and overlapping:
        raise OpsetTooOldError(
            f"node {ctx.node.name!r} (MaxPool) has overlapping windows, whose gradient needs "
            "ScatterElements with reduction='add' (opset 16)", 16
        )
    total = prod(x_shape)
    flat_idx = em.reshape(ctx.y(1), [prod(ctx.y_shape())])
    flat_g = em.reshape(g, [prod(ctx.y_shape())])
    if ctx.opset >= 16:
        dx = em.scatter_add("ScatterElements", None, flat_idx, flat_g, [total], axis=0)
    else:
        dx = em.op("ScatterElements", [em.zeros([total], em.dtype(g)), flat_idx, flat_g], [total], em.dtype(g),
                   axis=0)
    return {0: em.reshape(dx, x_shape)}


def _window_counts(n: int, o: int, k: int, s: int, d: int, begin: int, end: int, include_pad: bool) -> np.ndarray:
    """Divisor of each output position along one axis: window taps inside the input (or inside the
    padded input when count_include_pad)."""
    counts = np.zeros(o, dtype=np.int64)
    hi = n + end if include_pad else n
    lo = -begin if include_pad else 0
    for j in range(o):
        taps = j * s - begin + d * np.arange(k)
        counts[j] = int(np.count_nonzero((taps >= lo) & (taps < hi)))
    return counts


@register("AveragePool")
def average_pool(ctx: BackwardContext) -> dict[int, int]:
    em, g = ctx.em, ctx.dy()
    x_shape, y_shape = ctx.x_shape(0), ctx.y_shape()
    kernel = ctx.int_list("kernel_shape", [])
    strides, dilations, begin, end = _conv_geometry(ctx, x_shape, kernel)
    include_pad = bool(ctx.attr("count_include_pad", 0))
    sp = len(kernel)
    divisor = np.ones((), dtype=np.float64)
    for axis in range(sp):
        c = _window_counts(x_shape[2 + axis], y_shape[2 + axis], kernel[axis], strides[axis], dilations[axis],
                           begin[axis], end[axis], include_pad)
        divisor = np.multiply.outer(divisor, c)
    inv = 1.0 / np.maximum(divisor, 1)
    if np.all(inv == inv.flat[0]):
        scaled = em.scale(g, float(inv.flat[0]))
    else:
        scaled = em.mul(g, em.const(inv.astype(em.dtype(g))))
    return {0: _spread_windows(em, scaled, x_shape, kernel, strides, dilations, begin)}


def _spread_windows(
    em: Emitter, g: int, x_shape: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
    dilations: Sequence[int], begin: Sequence[int],
) -> int:
    """Adjoint of summing each pooling window: each input position gets the sum of ``g`` over the
    windows that cover it (a ones-kernel ConvTranspose per channel, cropped to the input)."""
    y_shape = em.shape(g)
    sp = len(kernel)
    nc = x_shape[0] * x_shape[1]
    col = em.reshape(g, [nc, 1, *y_shape[2:]])
    # taps t * d >= begin + n land past the input from every window: drop them (HF EfficientNet's
    # pooler, a 320x320 window over a 1x1 map, spread a 102,400-fold copy of the gradient otherwise)
    kernel = [min(k, -(-(b + n) // d)) for k, b, n, d in zip(kernel, begin, x_shape[2:], dilations)]
    full = [s * (o - 1) + (k - 1) * d + 1 for s, o, k, d in zip(strides, y_shape[2:], kernel, dilations)]
    ones = em.const(np.ones([1, 1, *kernel], dtype=em.dtype(g)))
    spread = em.op("ConvTranspose", [col, ones], [nc, 1, *full], em.dtype(g), strides=strides, dilations=dilations)
    # Full coordinate p + begin is input position p: pad the tail if short, then crop.
    short = [max(0, b + n - f) for b, n, f in zip(begin, x_shape[2:], full)]
    spread = em.pad_zeros(spread, [0] * (2 + sp), [0, 0, *short])
    spatial = list(range(2, 2 + sp))
    cropped = em.slice(spread, begin, [b + n for b, n in zip(begin, x_shape[2:])], spatial)
    return em.reshape(cropped, x_shape)


@register("LpPool")
def lp_pool(ctx: BackwardContext) -> dict[int, int]:
    """y = (sum over the window of |x|^p)^(1/p) (zero pads add nothing): each window passes
    g * y^(1-p) back to its taps, times |x|^(p-1) sign(x). p = 1: sign(x) * spread(g); p = 2:
    x * spread(g / y). A window with y = 0 has only zero taps (where the factor is 0; for p = 1 the
    subgradient sign(0) = 0), so y = 0 is replaced by 1 rather than dividing by it."""
    x_shape = ctx.x_shape(0)
    kernel = ctx.int_list("kernel_shape", [])
    strides, dilations, begin, _ = _conv_geometry(ctx, x_shape, kernel)
    return _lp_pool_grad(ctx, lambda t: _spread_windows(ctx.em, t, x_shape, kernel, strides, dilations, begin))


@register("GlobalLpPool")
def global_lp_pool(ctx: BackwardContext) -> dict[int, int]:
    """LpPool with one window over all spatial dims: the per-window factor broadcasts to every tap."""
    return _lp_pool_grad(ctx, lambda t: ctx.em.expand(t, ctx.x_shape(0)))


def _lp_pool_grad(ctx: BackwardContext, spread: Callable[[int], int]) -> dict[int, int]:
    """LpPool's and GlobalLpPool's rule; ``spread`` sums a per-window tensor back onto the taps."""
    em, g = ctx.em, ctx.dy()
    p = int(ctx.attr("p", 2))
    if p < 1:
        raise ModelImportError(f"node {ctx.node.name!r} ({ctx.node.op_type}) has p={p}; memplan "
                               f"differentiates {ctx.node.op_type} for p >= 1")
    x = ctx.x(0)
    if p == 1:
        return {0: em.mul(em.unary("Sign", x), spread(g))}
    y = ctx.y()
    _, safe_y = em.zeros_to_one(y)
    per_window = em.div(g, safe_y if p == 2 else em.binary("Pow", safe_y, em.scalar(p - 1.0, y)))
    taps = x if p == 2 else em.mul(x, em.binary("Pow", em.unary("Abs", x), em.scalar(p - 2.0, x)))
    return {0: em.mul(taps, spread(per_window))}


@register("GlobalAveragePool")
def global_average_pool(ctx: BackwardContext) -> dict[int, int]:
    em = ctx.em
    x_shape = ctx.x_shape(0)
    return {0: em.expand(em.scale(ctx.dy(), 1.0 / prod(x_shape[2:])), x_shape)}


@register("GlobalMaxPool")
def global_max_pool(ctx: BackwardContext) -> dict[int, int]:
    """g goes to the positions equal to each channel's maximum, split evenly between ties (as
    ReduceMax's rule; the gradient of each channel sums to g)."""
    em = ctx.em
    x_shape = ctx.x_shape(0)
    hit = em.cast(em.binary("Equal", ctx.x(0), ctx.y()), em.dtype(ctx.dy()))
    spatial = list(range(2, len(x_shape)))
    return {0: em.mul(hit, em.div(ctx.dy(), em.reduce_sum(hit, spatial)))}
