"""Gradients of elementwise ops: arithmetic with broadcasting, and activations.

Binary ops compute in the broadcast shape and unbroadcast (ReduceSum + Reshape) back to each input.
Activations read their output where that suffices (Relu, Sigmoid, Tanh, Exp, Sqrt), so the input
can die after the forward.
"""
from __future__ import annotations

import math

import numpy as np

from passes.gradients import BackwardContext, register
from planner.errors import ModelImportError


# ---- arithmetic -------------------------------------------------------------------------------
@register("Add", "Sub", inputs=(0, 1))
def add_sub(ctx: BackwardContext) -> dict[int, int]:
    em, g = ctx.em, ctx.dy()
    out = {}
    if ctx.needs(0):
        out[0] = em.unbroadcast(g, ctx.x_shape(0))
    if ctx.needs(1):
        gb = em.unbroadcast(g, ctx.x_shape(1))
        out[1] = em.neg(gb) if ctx.node.op_type == "Sub" else gb
    return out


@register("Sum", "Mean", inputs=None)
def sum_mean(ctx: BackwardContext) -> dict[int, int]:
    """Each input gets g (divided by the input count for Mean), summed over its broadcast axes."""
    g = ctx.dy()
    if ctx.node.op_type == "Mean":
        g = ctx.em.scale(g, 1.0 / len(ctx.node.inputs))
    return {i: ctx.em.unbroadcast(g, ctx.x_shape(i)) for i in sorted(ctx.need)}


@register("Mul", inputs=(0, 1))
def mul(ctx: BackwardContext) -> dict[int, int]:
    em, g = ctx.em, ctx.dy()
    out = {}
    if ctx.needs(0):
        out[0] = em.unbroadcast(em.mul(g, ctx.x(1)), ctx.x_shape(0))
    if ctx.needs(1):
        out[1] = em.unbroadcast(em.mul(g, ctx.x(0)), ctx.x_shape(1))
    return out


@register("Div", inputs=(0, 1))
def div(ctx: BackwardContext) -> dict[int, int]:
    """y = a / b: da = g / b, db = -(g / b) * y (reads b and y, not a)."""
    em, g = ctx.em, ctx.dy()
    g_over_b = em.div(g, ctx.x(1))
    out = {}
    if ctx.needs(0):
        out[0] = em.unbroadcast(g_over_b, ctx.x_shape(0))
    if ctx.needs(1):
        out[1] = em.neg(em.unbroadcast(em.mul(g_over_b, ctx.y()), ctx.x_shape(1)))
    return out


@register("Pow", inputs=(0, 1))
def pow_(ctx: BackwardContext) -> dict[int, int]:
    """y = a ** b: da = g * b * a ** (b - 1), db = g * y * log(a), taken as 0 where a = 0 (y is 0
    there for b > 0, and 0 * log(0) would be NaN; PyTorch's convention too)."""
    em, g = ctx.em, ctx.dy()
    out = {}
    if ctx.needs(0):
        a = ctx.x(0)
        b_const = ctx.const_input(1)
        if b_const is not None:
            b = em.const(b_const.astype(em.dtype(a)))
            b_minus_1 = em.const((b_const - 1).astype(em.dtype(a)))
        else:
            b = em.cast(ctx.x(1), em.dtype(a))
            b_minus_1 = em.sub(b, em.scalar(1.0, a))
        if b_const is not None and b_const.size == 1 and float(b_const.reshape(())) == 2.0:
            da = em.mul(em.mul(g, a), em.scalar(2.0, a))
        else:
            da = em.mul(em.mul(g, b), em.binary("Pow", a, b_minus_1))
        out[0] = em.unbroadcast(da, ctx.x_shape(0))
    if ctx.needs(1):
        _, a_safe = em.zeros_to_one(ctx.x(0))
        db = em.mul(em.mul(g, ctx.y()), em.unary("Log", a_safe))
        out[1] = em.unbroadcast(db, ctx.x_shape(1))
    return out


@register("Max", "Min", inputs=None)
def max_min(ctx: BackwardContext) -> dict[int, int]:
    """The gradient goes to the inputs equal to the output, split evenly between ties (so the input
    gradients always sum to g, as for ReduceMax). Reads every input and the output."""
    em, g = ctx.em, ctx.dy()
    n = len(ctx.node.inputs)
    if n == 1:
        return {0: g} if ctx.needs(0) else {}
    y = ctx.y()
    hits = [em.cast(em.binary("Equal", ctx.x(i), y), em.dtype(g)) for i in range(n)]
    count = em.op("Sum", hits, em.shape(y), em.dtype(g))
    share = em.div(g, count)
    return {i: em.unbroadcast(em.mul(share, hits[i]), ctx.x_shape(i)) for i in sorted(ctx.need)}


@register("Neg")
def neg(ctx: BackwardContext) -> dict[int, int]:
    return {0: ctx.em.neg(ctx.dy())}


@register("Sqrt")
def sqrt(ctx: BackwardContext) -> dict[int, int]:
    """dx = g / (2 y)."""
    em = ctx.em
    return {0: em.div(em.scale(ctx.dy(), 0.5), ctx.y())}


@register("Exp")
def exp(ctx: BackwardContext) -> dict[int, int]:
    return {0: ctx.em.mul(ctx.dy(), ctx.y())}


@register("Log")
def log(ctx: BackwardContext) -> dict[int, int]:
    return {0: ctx.em.div(ctx.dy(), ctx.x(0))}


@register("Reciprocal")
def reciprocal(ctx: BackwardContext) -> dict[int, int]:
    """y = 1/x: dx = -g * y * y."""
    em, y = ctx.em, ctx.y()
    return {0: em.neg(em.mul(em.mul(ctx.dy(), y), y))}


@register("Abs")
def abs_(ctx: BackwardContext) -> dict[int, int]:
    em = ctx.em
    return {0: em.mul(ctx.dy(), em.unary("Sign", ctx.x(0)))}


@register("Identity")
def identity(ctx: BackwardContext) -> dict[int, int]:
    return {0: ctx.dy()}


@register("Cast")
def cast(ctx: BackwardContext) -> dict[int, int]:
    return {0: ctx.em.cast(ctx.dy(), ctx.x_dtype(0))}


@register("CastLike")
def cast_like(ctx: BackwardContext) -> dict[int, int]:
    """As Cast: g back in input 0's type. target_type (input 1) only lends its type, so it gets none;
    a non-float input 0 gets none either (autodiff asks only for float slots)."""
    return {0: ctx.em.cast(ctx.dy(), ctx.x_dtype(0))}


# ---- activations ------------------------------------------------------------------------------
def _mask(ctx: BackwardContext, cond: int) -> int:
    """g where cond, else 0."""
    em, g = ctx.em, ctx.dy()
    return em.where(cond, g, em.scalar(0.0, g))


@register("Mod", inputs=(0, 1))
def mod(ctx: BackwardContext) -> dict[int, int]:
    """fmod: y = a - trunc(a / b) * b, so da = g and db = -g * trunc(a / b) (PyTorch's fmod
    gradient; the quotient is piecewise constant). Integer Mod carries no gradient."""
    em, g = ctx.em, ctx.dy()
    out = {}
    if ctx.needs(0):
        out[0] = em.unbroadcast(g, ctx.x_shape(0))
    if ctx.needs(1):
        q = em.div(ctx.x(0), ctx.x(1))
        trunc = em.where(em.binary("Less", q, em.scalar(0.0, q)), em.unary("Ceil", q), em.unary("Floor", q))
        out[1] = em.neg(em.unbroadcast(em.mul(g, trunc), ctx.x_shape(1)))
    return out


@register("Relu")
def relu(ctx: BackwardContext) -> dict[int, int]:
    """dx = g * Sign(y): y = relu(x) >= 0, so Sign(y) is exactly the 0/1 mask. One temporary of y's
    size; Greater + Where would hold a bool mask plus Where's 2x scratch (planner/liveness.py). Differs
    from the Where form only where g is inf/NaN and y == 0 (NaN instead of 0)."""
    em = ctx.em
    return {0: em.mul(ctx.dy(), em.unary("Sign", ctx.y()))}


@register("LeakyRelu")
def leaky_relu(ctx: BackwardContext) -> dict[int, int]:
    """Slope 1 where the input is positive, alpha elsewhere. For alpha > 0 the output has the input's
    sign, so the output is what is kept."""
    em, g = ctx.em, ctx.dy()
    alpha = float(ctx.attr("alpha", 0.01))
    t = ctx.y() if alpha > 0 else ctx.x(0)
    positive = em.binary("Greater", t, em.scalar(0.0, t))
    return {0: em.where(positive, g, em.scale(g, alpha))}


@register("Shrink")
def shrink(ctx: BackwardContext) -> dict[int, int]:
    """y = x - bias (x > lambd), x + bias (x < -lambd), else 0: slope 1 where |x| > lambd. When
    bias < lambd the output is non-zero exactly there (|y| > lambd - bias > 0), so only the output is
    kept and |Sign(y)| is the 0/1 mask (as for Relu); otherwise (or for lambd < 0) the input is kept."""
    em, g = ctx.em, ctx.dy()
    bias, lambd = float(ctx.attr("bias", 0.0)), float(ctx.attr("lambd", 0.5))
    if 0 <= lambd and bias < lambd:
        return {0: em.mul(g, em.unary("Abs", em.unary("Sign", ctx.y())))}
    x = ctx.x(0)
    return {0: _mask(ctx, em.binary("Greater", em.unary("Abs", x), em.scalar(lambd, x)))}


@register("Sigmoid")
def sigmoid(ctx: BackwardContext) -> dict[int, int]:
    """dx = g * y * (1 - y)."""
    em, y = ctx.em, ctx.y()
    return {0: em.mul(em.mul(ctx.dy(), y), em.sub(em.scalar(1.0, y), y))}


@register("Tanh")
def tanh(ctx: BackwardContext) -> dict[int, int]:
    """dx = g * (1 - y^2)."""
    em, y = ctx.em, ctx.y()
    return {0: em.mul(ctx.dy(), em.sub(em.scalar(1.0, y), em.mul(y, y)))}


# ---- trigonometric and hyperbolic -----------------------------------------------------------
@register("Tan")
def tan(ctx: BackwardContext) -> dict[int, int]:
    """dx = g * (1 + y^2) (reads the output)."""
    em, y = ctx.em, ctx.y()
    return {0: em.mul(ctx.dy(), em.add(em.scalar(1.0, y), em.mul(y, y)))}


@register("Sinh", "Cosh")
def sinh_cosh(ctx: BackwardContext) -> dict[int, int]:
    """sinh' = cosh, cosh' = sinh."""
    other = "Cosh" if ctx.node.op_type == "Sinh" else "Sinh"
    return {0: ctx.em.mul(ctx.dy(), ctx.em.unary(other, ctx.x(0)))}


@register("Asin", "Acos", "Atan", "Asinh", "Acosh", "Atanh")
def inverse_trig(ctx: BackwardContext) -> dict[int, int]:
    """asin' = 1/sqrt(1 - x^2), acos' = -asin', atan' = 1/(1 + x^2), asinh' = 1/sqrt(x^2 + 1),
    acosh' = 1/sqrt(x^2 - 1), atanh' = 1/(1 - x^2): infinite at the domain's edge, as in PyTorch."""
    em, x, g, op = ctx.em, ctx.x(0), ctx.dy(), ctx.node.op_type
    x2 = em.mul(x, x)
    one = em.scalar(1.0, x)
    if op in ("Asin", "Acos"):
        d = em.div(g, em.unary("Sqrt", em.sub(one, x2)))
        return {0: em.neg(d) if op == "Acos" else d}
    if op == "Atan":
        return {0: em.div(g, em.add(one, x2))}
    if op == "Atanh":
        return {0: em.div(g, em.sub(one, x2))}
    return {0: em.div(g, em.unary("Sqrt", em.add(x2, one) if op == "Asinh" else em.sub(x2, one)))}


@register("Erf")
def erf(ctx: BackwardContext) -> dict[int, int]:
    """dx = g * 2/sqrt(pi) * exp(-x^2)."""
    em, x = ctx.em, ctx.x(0)
    e = em.unary("Exp", em.neg(em.mul(x, x)))
    return {0: em.mul(em.scale(ctx.dy(), 2.0 / math.sqrt(math.pi)), e)}


@register("Gelu")
def gelu(ctx: BackwardContext) -> dict[int, int]:
    """exact: Phi(x) + x phi(x); tanh: 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2), t = tanh(c (x + k x^3))."""
    em, x, g = ctx.em, ctx.x(0), ctx.dy()
    if ctx.attr("approximate", "none") == "tanh":
        c, k = math.sqrt(2.0 / math.pi), 0.044715
        x2 = em.mul(x, x)
        inner = em.scale(em.mul(x, em.add(em.scale(x2, k), em.scalar(1.0, x))), c)
        t = em.unary("Tanh", inner)
        one = em.scalar(1.0, x)
        left = em.scale(em.add(t, one), 0.5)
        dinner = em.scale(em.add(em.scale(x2, 3 * k), one), c)
        right = em.mul(em.scale(em.mul(x, em.sub(one, em.mul(t, t))), 0.5), dinner)
        return {0: em.mul(g, em.add(left, right))}
    cdf = em.scale(em.add(em.unary("Erf", em.scale(x, 1 / math.sqrt(2.0))), em.scalar(1.0, x)), 0.5)
    pdf = em.scale(em.unary("Exp", em.scale(em.mul(x, x), -0.5)), 1 / math.sqrt(2 * math.pi))
    return {0: em.mul(g, em.add(cdf, em.mul(x, pdf)))}


@register("HardSigmoid")
def hard_sigmoid(ctx: BackwardContext) -> dict[int, int]:
    """Slope alpha strictly inside (0, 1), else 0; the output tells where."""
    em, y = ctx.em, ctx.y()
    alpha = float(ctx.attr("alpha", 0.2))
    inside = em.binary("And", em.binary("Greater", y, em.scalar(0.0, y)), em.binary("Less", y, em.scalar(1.0, y)))
    return {0: em.scale(_mask(ctx, inside), alpha)}


@register("HardSwish")
def hard_swish(ctx: BackwardContext) -> dict[int, int]:
    """y = x * hardsigmoid(x) (alpha 1/6, beta 1/2): dx = g * (0 | 1 | x/3 + 1/2) for x < -3 | x > 3 | else."""
    em, x, g = ctx.em, ctx.x(0), ctx.dy()
    slope = em.add(em.scale(x, 1.0 / 3.0), em.scalar(0.5, x))
    slope = em.where(em.binary("Greater", x, em.scalar(3.0, x)), em.scalar(1.0, x), slope)
    slope = em.where(em.binary("Less", x, em.scalar(-3.0, x)), em.scalar(0.0, x), slope)
    return {0: em.mul(g, slope)}


@register("Clip")
def clip(ctx: BackwardContext) -> dict[int, int]:
    """Gradient passes where min <= x <= max (bounds from inputs in opset 11+, attributes before)."""
    em, x = ctx.em, ctx.x(0)
    lo = hi = None
    if ctx.opset >= 11:
        lo = ctx.x(1) if ctx.has_input(1) else None
        hi = ctx.x(2) if ctx.has_input(2) else None
    else:
        if "min" in ctx.node.attrs:
            lo = em.scalar(float(ctx.attr("min")), x)
        if "max" in ctx.node.attrs:
            hi = em.scalar(float(ctx.attr("max")), x)
    cond = None
    if lo is not None:
        cond = em.binary("GreaterOrEqual" if ctx.opset >= 12 else "Greater", x, lo)
    if hi is not None:
        upper = em.binary("LessOrEqual" if ctx.opset >= 12 else "Less", x, hi)
        cond = upper if cond is None else em.binary("And", cond, upper)
    return {0: ctx.dy() if cond is None else _mask(ctx, cond)}


@register("PRelu", inputs=(0, 1))
def prelu(ctx: BackwardContext) -> dict[int, int]:
    """y = x (x > 0) or slope * x, slope broadcast to x: dx = g or g * slope, dslope = g * x where
    x <= 0, summed over the broadcast axes. A constant positive slope keeps the output's sign, so
    when only dx is needed the output is what is kept."""
    em, g = ctx.em, ctx.dy()
    slope_const = ctx.const_input(1)
    keep_y = not ctx.needs(1) and slope_const is not None and bool(np.all(slope_const > 0))
    t = ctx.y() if keep_y else ctx.x(0)
    positive = em.binary("Greater", t, em.scalar(0.0, t))
    out = {}
    if ctx.needs(0):
        out[0] = em.where(positive, g, em.mul(g, ctx.x(1)))
    if ctx.needs(1):
        out[1] = em.unbroadcast(em.where(positive, em.scalar(0.0, g), em.mul(g, t)), ctx.x_shape(1))
    return out


def _exponential_linear(ctx: BackwardContext, pos: float, neg: float) -> dict[int, int]:
    """y = pos * x (x > 0) or neg * (exp(x) - 1): the slope is pos, or neg * exp(x) = y + neg. When
    pos > 0 and neg >= 0 the output has the input's sign and is all that is kept."""
    em, g = ctx.em, ctx.dy()
    if pos > 0 and neg >= 0:
        y = ctx.y()
        positive = em.binary("Greater", y, em.scalar(0.0, y))
        return {0: em.where(positive, em.scale(g, pos), em.mul(g, em.add(y, em.scalar(neg, y))))}
    x = ctx.x(0)
    positive = em.binary("Greater", x, em.scalar(0.0, x))
    return {0: em.where(positive, em.scale(g, pos), em.mul(em.scale(g, neg), em.unary("Exp", x)))}


@register("Elu")
def elu(ctx: BackwardContext) -> dict[int, int]:
    return _exponential_linear(ctx, 1.0, float(ctx.attr("alpha", 1.0)))


@register("Selu")
def selu(ctx: BackwardContext) -> dict[int, int]:
    """gamma * Elu(x, alpha); the defaults are ONNX's (float32 constants)."""
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    return _exponential_linear(ctx, gamma, gamma * alpha)


@register("Celu")
def celu(ctx: BackwardContext) -> dict[int, int]:
    """y = x (x > 0) or alpha * (exp(x / alpha) - 1): the slope is 1, or exp(x / alpha) = y / alpha + 1.
    For any alpha != 0 the output has the input's sign, so only the output is kept."""
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha == 0:
        raise ModelImportError(f"node {ctx.node.name!r} (Celu) has alpha = 0, where Celu divides by alpha; "
                               "give it a non-zero alpha")
    em, g, y = ctx.em, ctx.dy(), ctx.y()
    positive = em.binary("Greater", y, em.scalar(0.0, y))
    return {0: em.where(positive, g, em.mul(g, em.add(em.scale(y, 1.0 / alpha), em.scalar(1.0, y))))}


@register("ThresholdedRelu")
def thresholded_relu(ctx: BackwardContext) -> dict[int, int]:
    """Gradient passes where x > alpha. For alpha >= 0 that is where y > 0, and Sign(y) is the 0/1
    mask (as for Relu); a negative alpha lets negative values through, so the input is kept."""
    em, g = ctx.em, ctx.dy()
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha >= 0:
        return {0: em.mul(g, em.unary("Sign", ctx.y()))}
    x = ctx.x(0)
    return {0: _mask(ctx, em.binary("Greater", x, em.scalar(alpha, x)))}


@register("Softsign")
def softsign(ctx: BackwardContext) -> dict[int, int]:
    """y = x / (1 + |x|): dx = g / (1 + |x|)^2 = g * (1 - |y|)^2."""
    em, y = ctx.em, ctx.y()
    s = em.sub(em.scalar(1.0, y), em.unary("Abs", y))
    return {0: em.mul(ctx.dy(), em.mul(s, s))}


@register("Mish")
def mish(ctx: BackwardContext) -> dict[int, int]:
    """y = x * t, t = tanh(softplus(x)): dx = g * (t + x * (1 - t^2) * sigmoid(x))."""
    em, x = ctx.em, ctx.x(0)
    t = em.unary("Tanh", em.unary("Softplus", x))
    dt = em.mul(em.sub(em.scalar(1.0, x), em.mul(t, t)), em.unary("Sigmoid", x))
    return {0: em.mul(ctx.dy(), em.add(t, em.mul(x, dt)))}


@register("Sin")
def sin(ctx: BackwardContext) -> dict[int, int]:
    return {0: ctx.em.mul(ctx.dy(), ctx.em.unary("Cos", ctx.x(0)))}


@register("Cos")
def cos(ctx: BackwardContext) -> dict[int, int]:
    em = ctx.em
    return {0: em.neg(em.mul(ctx.dy(), em.unary("Sin", ctx.x(0))))}


@register("Softplus")
def softplus(ctx: BackwardContext) -> dict[int, int]:
    """dx = g * sigmoid(x)."""
    em = ctx.em
    return {0: em.mul(ctx.dy(), em.unary("Sigmoid", ctx.x(0)))}


@register("Where", inputs=(1, 2))
def where(ctx: BackwardContext) -> dict[int, int]:
    em, g = ctx.em, ctx.dy()
    cond, zero = ctx.x(0), em.scalar(0.0, g)
    out = {}
    if ctx.needs(1):
        out[1] = em.unbroadcast(em.where(cond, g, zero), ctx.x_shape(1))
    if ctx.needs(2):
        out[2] = em.unbroadcast(em.where(cond, zero, g), ctx.x_shape(2))
    return out


def _dropout_mask(node, tensor_of, value_of):
    if not _dropout_active(node, value_of):
        return {}
    return {1: ("mask", "bool", tensor_of(node.outputs[0]).shape)}


@register("Dropout", extra_outputs=_dropout_mask)
def dropout(ctx: BackwardContext) -> dict[int, int]:
    """Identity when not training or ratio 0; else g * mask / (1 - ratio) with the forward's mask.
    A training_mode fed at run time scales by 1 / (1 - ratio * training_mode): not training, the
    forward is the identity and its mask all true (fuzzed, stop 49: the gradient was 1/(1-ratio)
    times too large)."""
    em, g = ctx.em, ctx.dy()
    if not _dropout_active(ctx.node, ctx.const_value):
        return {0: g}
    ratio_const = ctx.const_input(1)
    kept = em.where(ctx.y(1), g, em.scalar(0.0, g))
    if ctx.const_input(2) is None:  # training_mode fed at run time
        ratio = em.scalar(0.5 if ratio_const is None else float(ratio_const.reshape(())), g) \
            if ratio_const is not None or not ctx.has_input(1) else em.cast(ctx.x(1), em.dtype(g))
        dropped = em.mul(ratio, em.cast(ctx.x(2), em.dtype(g)))
        return {0: em.div(kept, em.sub(em.scalar(1.0, g), dropped))}
    if ratio_const is not None or not ctx.has_input(1):
        ratio = 0.5 if ratio_const is None else float(ratio_const.reshape(()))
        return {0: em.scale(kept, 1.0 / (1.0 - ratio))}
    ratio = em.cast(ctx.x(1), em.dtype(g))
    return {0: em.div(kept, em.sub(em.scalar(1.0, g), ratio))}


def _dropout_active(node, value_of) -> bool:
    """False when the node is statically an identity: no training_mode input (inference; also the
    pre-opset-12 forms), training_mode a constant false, or ratio a constant 0."""
    if len(node.inputs) < 3 or node.inputs[2] == -1:
        return False
    training = value_of(node.inputs[2])
    if training is not None and not bool(training.reshape(())):
        return False
    ratio = value_of(node.inputs[1]) if node.inputs[1] != -1 else None
    return not (ratio is not None and float(ratio.reshape(())) == 0.0)
