"""Gradients of Softmax/LogSoftmax, the normalizations and the classification losses.

Softmax keeps only its output. LayerNormalization keeps its input and the Mean/InvStdDev outputs
the rule adds to the forward node. BatchNormalization in training mode recomputes the batch mean
and inverse std from its input in standard ops: the forward's optional outputs are the *running*
statistics, not the batch ones. SoftmaxCrossEntropyLoss differentiates through its log_prob output.
"""
from __future__ import annotations

import numpy as np

from passes.gradients import BackwardContext, register
from passes.gradients._emit import Emitter, prod
from planner.errors import ModelImportError
from planner.graph import NO_TENSOR


def _softmax_axes(ctx: BackwardContext) -> list[int]:
    """Opset 13+ normalizes one axis (default -1); before, everything from ``axis`` (default 1) on."""
    rank = len(ctx.x_shape(0))
    if ctx.opset >= 13:
        return [int(ctx.attr("axis", -1)) % rank]
    return list(range(int(ctx.attr("axis", 1)) % rank, rank))


@register("Softmax")
def softmax(ctx: BackwardContext) -> dict[int, int]:
    """dx = y * (g - sum(g * y))."""
    em, y, g = ctx.em, ctx.y(), ctx.dy()
    return {0: em.mul(y, em.sub(g, em.reduce_sum(em.mul(g, y), _softmax_axes(ctx))))}


@register("LogSoftmax")
def log_softmax(ctx: BackwardContext) -> dict[int, int]:
    """dx = g - exp(y) * sum(g)."""
    em, y, g = ctx.em, ctx.y(), ctx.dy()
    return {0: em.sub(g, em.mul(em.unary("Exp", y), em.reduce_sum(g, _softmax_axes(ctx))))}


# ---- normalizations ---------------------------------------------------------------------------
def _layer_norm_stats(node, tensor_of, value_of):
    x_shape = tensor_of(node.inputs[0]).shape
    axis = int(node.attrs.get("axis", -1)) % len(x_shape)
    stat_shape = tuple(x_shape[:axis]) + (1,) * (len(x_shape) - axis)
    return {1: ("mean", "float32", stat_shape), 2: ("inv_std", "float32", stat_shape)}


@register("LayerNormalization", inputs=(0, 1, 2), extra_outputs=_layer_norm_stats, left_out_from=(0,))
def layer_norm(ctx: BackwardContext) -> dict[int, int]:
    """xhat = (x - mean) * inv; dx = inv * (gs - mean(gs) - xhat * mean(gs * xhat)), gs = g * scale."""
    em, g = ctx.em, ctx.dy()
    rank = len(ctx.x_shape(0))
    axes = list(range(int(ctx.attr("axis", -1)) % rank, rank))
    dtype = em.dtype(g)
    inv = em.cast(ctx.y(2), dtype)
    xhat = em.mul(em.sub(ctx.x(0), em.cast(ctx.y(1), dtype)), inv)
    out = {}
    if ctx.needs(2):
        out[2] = em.unbroadcast(g, ctx.x_shape(2))
    if ctx.needs(1):
        out[1] = em.unbroadcast(em.mul(g, xhat), ctx.x_shape(1))
    if ctx.needs(0):
        out[0] = _standardized_grad(em, em.mul(g, ctx.x(1)), xhat, inv, axes)
    return out


def _standardize(em: Emitter, x: int, axes: list[int], eps: float) -> tuple[int, int]:
    """(xhat, inv): x standardized over ``axes`` with its biased variance, and 1 / sqrt(var + eps)."""
    xc = em.sub(x, em.reduce_mean(x, axes))
    inv = em.unary("Reciprocal", em.unary("Sqrt", em.add(em.reduce_mean(em.mul(xc, xc), axes), em.scalar(eps, x))))
    return em.mul(xc, inv), inv


def _standardized_grad(em: Emitter, gs: int, xhat: int, inv: int, axes: list[int]) -> int:
    """dx of xhat = (x - mean) * inv over ``axes`` given gs = d loss / d xhat:
    inv * (gs - mean(gs) - xhat * mean(gs * xhat))."""
    centered = em.sub(gs, em.reduce_mean(gs, axes))
    return em.mul(inv, em.sub(centered, em.mul(xhat, em.reduce_mean(em.mul(gs, xhat), axes))))


def _normalize_backward(ctx: BackwardContext, stat_axes: list[int], eps: float) -> dict[int, int]:
    """Backward of y = scale[c] * (x - mean) / sqrt(var + eps) + B[c], batch statistics over
    ``stat_axes``, recomputed from x (BatchNormalization training mode, InstanceNormalization)."""
    em, g, x = ctx.em, ctx.dy(), ctx.x(0)
    x_shape = ctx.x_shape(0)
    rank, channels = len(x_shape), x_shape[1]
    param_axes = [0, *range(2, rank)]
    count = prod(x_shape[a] for a in stat_axes)
    xhat, inv = _standardize(em, x, stat_axes, eps)
    sum_g = em.reduce_sum(g, stat_axes)
    sum_gx = em.reduce_sum(em.mul(g, xhat), stat_axes)
    rest = [a for a in param_axes if a not in stat_axes]
    out = {}
    if ctx.needs(2):
        out[2] = em.reshape(em.reduce_sum(sum_g, rest), [channels])
    if ctx.needs(1):
        out[1] = em.reshape(em.reduce_sum(sum_gx, rest), [channels])
    if ctx.needs(0):
        k = em.mul(em.reshape(ctx.x(1), [1, channels] + [1] * (rank - 2)), inv)
        centered = em.sub(g, em.scale(sum_g, 1.0 / count))
        out[0] = em.mul(k, em.sub(centered, em.mul(xhat, em.scale(sum_gx, 1.0 / count))))
    return out


@register("LpNormalization")
def lp_normalization(ctx: BackwardContext) -> dict[int, int]:
    """y = x / n along ``axis``, n the L2 (p=2) or L1 (p=1) norm: dx = (g - d * sum(g * y)) / n with
    d = y for p=2 and sign(x) for p=1 (the norm's own derivative times n). Reads x and y.

    A zero vector (ORT's forward gives 0 there) has no derivative; n = 0 is replaced by 1 there, so
    it gets g (the identity's, y = x there) rather than 0/0 NaNs that would spread to every weight."""
    em, g, x, y = ctx.em, ctx.dy(), ctx.x(0), ctx.y()
    axis = int(ctx.attr("axis", -1)) % len(ctx.x_shape(0))
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ModelImportError(f"node {ctx.node.name!r} (LpNormalization) has p={p}; ONNX allows 1 or 2")
    _, norm = em.zeros_to_one(em.reduce("ReduceL2" if p == 2 else "ReduceL1", x, [axis]))
    d = y if p == 2 else em.unary("Sign", x)
    return {0: em.div(em.sub(g, em.mul(d, em.reduce_sum(em.mul(g, y), [axis]))), norm)}


def _batch_norm_inputs(node) -> list[int]:
    """X, scale and B; in inference mode also the mean and variance it is given, which are not
    always running statistics: torch's dynamo exporter (``optimize=False``) writes
    ``F.batch_norm(w, None, None, training=True)`` (NFNet's and BiT's weight standardization) as an
    inference-mode node whose mean and variance are ReduceMeans of the weight itself. In training
    mode the output reads neither (they only update the running statistics outputs)."""
    training = int(node.attrs.get("training_mode", 0)) == 1 or any(t != NO_TENSOR for t in node.outputs[1:])
    return [i for i in ((0, 1, 2) if training else (0, 1, 2, 3, 4)) if i < len(node.inputs)]


@register("BatchNormalization", inputs=_batch_norm_inputs, left_out_from=(0, 3, 4))
def batch_norm(ctx: BackwardContext) -> dict[int, int]:
    """Training mode (opset 14+: training_mode=1; opset 7-13: the node has its statistics outputs,
    as ORT runs it): batch statistics. Otherwise y = scale * (x - mean) * inv + B with
    inv = 1 / sqrt(var + eps), an affine map per channel when mean and var are constants; where
    they are computed (see :func:`_batch_norm_inputs`): dmean = -inv * sum(g * scale),
    dvar = -inv^3 / 2 * sum(g * scale * (x - mean))."""
    eps = float(ctx.attr("epsilon", 1e-5))
    rank = len(ctx.x_shape(0))
    if ctx.opset >= 14:
        training = int(ctx.attr("training_mode", 0)) == 1
    else:
        training = ctx.opset >= 7 and any(t != NO_TENSOR for t in ctx.node.outputs[1:])
    if training:
        return _normalize_backward(ctx, [0, *range(2, rank)], eps)
    em, g = ctx.em, ctx.dy()
    channels = ctx.x_shape(0)[1]
    bshape = [1, channels] + [1] * (rank - 2)
    param_axes = [0, *range(2, rank)]
    var = em.reshape(ctx.x(4), bshape)
    inv = em.unary("Reciprocal", em.unary("Sqrt", em.add(var, em.scalar(eps, var))))
    out = {}
    if ctx.needs(2):
        out[2] = em.reduce_sum(g, param_axes, keepdims=False)
    # x - mean: read by the scale's gradient and the variance's; built once for both
    centered = em.sub(ctx.x(0), em.reshape(ctx.x(3), bshape)) if ctx.needs(1) or ctx.needs(4) else None
    if ctx.needs(1):
        out[1] = em.reduce_sum(em.mul(g, em.mul(centered, inv)), param_axes, keepdims=False)
    if ctx.needs(0):
        out[0] = em.mul(g, em.mul(em.reshape(ctx.x(1), bshape), inv))
    if ctx.needs(3) or ctx.needs(4):
        gs = em.mul(g, em.reshape(ctx.x(1), bshape))
        inv_c = em.reshape(inv, [channels])
        if ctx.needs(3):
            out[3] = em.scale(em.mul(em.reduce_sum(gs, param_axes, keepdims=False), inv_c), -1.0)
        if ctx.needs(4):
            cubed = em.mul(inv_c, em.mul(inv_c, inv_c))
            out[4] = em.scale(em.mul(em.reduce_sum(em.mul(gs, centered), param_axes, keepdims=False), cubed), -0.5)
    return out


@register("InstanceNormalization", inputs=(0, 1, 2))
def instance_norm(ctx: BackwardContext) -> dict[int, int]:
    return _normalize_backward(ctx, list(range(2, len(ctx.x_shape(0)))), float(ctx.attr("epsilon", 1e-5)))


@register("GroupNormalization", inputs=(0, 1, 2))
def group_norm(ctx: BackwardContext) -> dict[int, int]:
    """Statistics per sample and group of C / num_groups channels (over those channels and all spatial
    positions), recomputed from x viewed as [N, G, C/G, spatial]. Scale and bias are per group in
    opset 18-20 and per channel from opset 21 (stash_type only sets the forward's precision)."""
    em, g = ctx.em, ctx.dy()
    x_shape = ctx.x_shape(0)
    n, c = x_shape[:2]
    groups = int(ctx.attr("num_groups"))
    per_channel = ctx.opset >= 21
    want = c if per_channel else groups
    if c % groups or any(ctx.x_shape(i) != (want,) for i in (1, 2)):
        raise ModelImportError(
            f"node {ctx.node.name!r} (GroupNormalization, opset {ctx.opset}) has {c} channels, num_groups={groups} "
            f"and scale/bias shapes {ctx.x_shape(1)}/{ctx.x_shape(2)}; opset {ctx.opset} needs num_groups to "
            f"divide C and scale/bias of shape ({want},) ({'per channel' if per_channel else 'per group'})"
        )
    grouped = [n, groups, c // groups, prod(x_shape[2:])]
    param_shape = [1, groups, c // groups if per_channel else 1, 1]
    g4 = em.reshape(g, grouped)
    xhat, inv = _standardize(em, em.reshape(ctx.x(0), grouped), [2, 3], float(ctx.attr("epsilon", 1e-5)))
    out = {}
    if ctx.needs(2):
        out[2] = em.reshape(em.unbroadcast(g4, param_shape), [want])
    if ctx.needs(1):
        out[1] = em.reshape(em.unbroadcast(em.mul(g4, xhat), param_shape), [want])
    if ctx.needs(0):
        gs = em.mul(g4, em.reshape(ctx.x(1), param_shape))
        out[0] = em.reshape(_standardized_grad(em, gs, xhat, inv, [2, 3]), x_shape)
    return out


#: MeanVarianceNormalization's epsilon, fixed in its ONNX function body (added to the std).
_MVN_EPSILON = 1e-9


@register("MeanVarianceNormalization")
def mean_variance_norm(ctx: BackwardContext) -> dict[int, int]:
    """y = (x - m) / d over ``axes`` (default [0, 2, 3]), d = s + 1e-9 with s the biased std (the spec
    adds epsilon to the std, not the variance). dx = (g - mean(g)) / d - y * mean(g * y) / s; where
    s = 0 the slice is constant, y = 0 and the second term is 0. Reads x only."""
    em, g, x = ctx.em, ctx.dy(), ctx.x(0)
    rank = len(ctx.x_shape(0))
    axes = sorted({int(a) % rank for a in ctx.attr("axes", [0, 2, 3])})
    xc = em.sub(x, em.reduce_mean(x, axes))
    std = em.unary("Sqrt", em.reduce_mean(em.mul(xc, xc), axes))
    d = em.add(std, em.scalar(_MVN_EPSILON, x))
    y = em.div(xc, d)
    _, safe_std = em.zeros_to_one(std)
    first = em.div(em.sub(g, em.reduce_mean(g, axes)), d)
    return {0: em.sub(first, em.div(em.mul(y, em.reduce_mean(em.mul(g, y), axes)), safe_std))}


# ---- losses -----------------------------------------------------------------------------------
def _sample_coefficients(ctx: BackwardContext) -> int:
    """d loss / d (per-sample loss), shaped like the labels (or a scalar): the output gradient times
    the class weight, zero at ignore_index, divided by the weight total for reduction='mean'."""
    em, g = ctx.em, ctx.dy()
    labels = ctx.x(1)
    ldtype, lshape = em.dtype(labels), em.shape(labels)
    coef = None
    ignore = ctx.attr("ignore_index")
    keep = None
    if ignore is not None:
        keep = em.unary("Not", em.binary("Equal", labels, em.const(np.asarray(ignore, dtype=ldtype))))
        coef = em.cast(keep, em.dtype(g))
    if ctx.has_input(2):
        safe = labels if keep is None else em.where(keep, labels, em.const(np.asarray(0, dtype=ldtype)))
        weight = em.op("Gather", [ctx.x(2), safe], lshape, em.dtype(g), axis=0)
        coef = weight if coef is None else em.mul(coef, weight)
    if ctx.attr("reduction", "mean") == "mean":
        if coef is None:
            return em.scale(g, 1.0 / prod(lshape))
        coef = em.div(coef, em.reduce_sum(coef, range(len(lshape)), keepdims=False))
    return g if coef is None else em.mul(coef, g)


def _one_hot_minus(ctx: BackwardContext, probs: int | None) -> int:
    """probs - onehot(labels) (or -onehot when probs is None), shaped like the scores."""
    em = ctx.em
    labels = ctx.x(1)
    s_shape = ctx.x_shape(0)
    classes = np.arange(s_shape[1], dtype=em.dtype(labels)).reshape([1, s_shape[1]] + [1] * (len(s_shape) - 2))
    match = em.binary("Equal", em.reshape(labels, [s_shape[0], 1, *s_shape[2:]]), em.const(classes))
    onehot = em.cast(match, ctx.x_dtype(0))
    return em.neg(onehot) if probs is None else em.sub(probs, onehot)


def _times_coefficients(ctx: BackwardContext, per_class: int) -> int:
    em = ctx.em
    coef = _sample_coefficients(ctx)
    s_shape = ctx.x_shape(0)
    # Per sample (reduction 'none', or weights/ignore_index) or one number (a () or (1,) loss).
    coef = em.reshape(coef, [s_shape[0], 1, *s_shape[2:]] if em.shape(coef) == ctx.x_shape(1) else [])
    return em.mul(per_class, coef)


def _log_prob_output(node, tensor_of, value_of):
    scores = tensor_of(node.inputs[0])
    return {1: ("log_prob", scores.dtype, scores.shape)}


@register("SoftmaxCrossEntropyLoss", extra_outputs=_log_prob_output, outputs=(0, 1))
def softmax_cross_entropy(ctx: BackwardContext) -> dict[int, int]:
    """d scores = (softmax - onehot(label)) * coefficient, softmax = exp(log_prob); and where the
    loss reads log_prob too (label smoothing), its gradient g as LogSoftmax's over the class axis:
    g - softmax * sum(g)."""
    em = ctx.em
    probs = em.unary("Exp", ctx.y(1))
    terms = []
    if ctx.dy(0) is not None:
        terms.append(_times_coefficients(ctx, _one_hot_minus(ctx, probs)))
    if (g := ctx.dy(1)) is not None:
        terms.append(em.sub(g, em.mul(probs, em.reduce_sum(g, [1]))))
    return {0: terms[0] if len(terms) == 1 else em.add(*terms)}


@register("NegativeLogLikelihoodLoss")
def negative_log_likelihood(ctx: BackwardContext) -> dict[int, int]:
    """d input = -onehot(label) * coefficient."""
    return {0: _times_coefficients(ctx, _one_hot_minus(ctx, None))}


@register("LRN")
def lrn(ctx: BackwardContext) -> dict[int, int]:
    """y = x * d, d = s^-beta, s = bias + alpha/size * S, S the sum of x^2 over a window of ``size``
    channels (lo = floor((size-1)/2) before each channel, hi = size-1-lo after):
    dx = g * d - (2 * alpha * beta / size) * x * W'(g * x * d / s), W' the window's transpose
    (hi before, lo after). Both window sums are one Conv with a ones kernel over x viewed as
    [N, 1, C, rest]. Reads x only (s is recomputed)."""
    em, g, x = ctx.em, ctx.dy(), ctx.x(0)
    shape = list(ctx.x_shape(0))
    size = int(ctx.attr("size"))
    alpha, beta, bias = (float(ctx.attr(k, v)) for k, v in (("alpha", 1e-4), ("beta", 0.75), ("bias", 1.0)))
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    dtype = em.dtype(x)
    view = [shape[0], 1, shape[1], prod(shape[2:])]
    ones = em.const(np.ones((1, 1, size, 1)), dtype)

    def window_sum(v: int, before: int, after: int) -> int:
        out = em.op("Conv", [em.reshape(v, view), ones], view, dtype, kernel_shape=[size, 1],
                    pads=[before, 0, after, 0])
        return em.reshape(out, shape)

    s = em.add(em.scale(window_sum(em.mul(x, x), lo, hi), alpha / size), em.scalar(bias, x))
    d = em.binary("Pow", s, em.scalar(-beta, x))
    t = em.div(em.mul(em.mul(g, x), d), s)
    back = em.scale(em.mul(x, window_sum(t, hi, lo)), 2.0 * alpha * beta / size)
    return {0: em.sub(em.mul(g, d), back)}
