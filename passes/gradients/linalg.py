"""Gradients of MatMul (batched, broadcast, 1-D operands) and Gemm.

For the common ``[..., n, k] @ [k, m]`` (every linear layer of a transformer) the weight gradient is
one Gemm over the flattened batch and no Transpose is emitted; Reshape is free in ORT.
"""
from __future__ import annotations

from passes.gradients import BackwardContext, register
from passes.gradients._emit import prod


def _swap_last(rank: int) -> list[int]:
    return list(range(rank - 2)) + [rank - 1, rank - 2]


@register("MatMul", inputs=(0, 1))
def matmul(ctx: BackwardContext) -> dict[int, int]:
    """Y = A @ B: dA = g @ B^T, dB = A^T @ g, each summed over broadcast batch dims."""
    em = ctx.em
    sa, sb, sy = ctx.x_shape(0), ctx.x_shape(1), ctx.y_shape()
    # Promote 1-D operands to matrices (numpy semantics) and the gradient with them.
    a_shape = (1, sa[0]) if len(sa) == 1 else sa
    b_shape = (sb[0], 1) if len(sb) == 1 else sb
    g_shape = (*sy[: len(sy) - (len(sa) > 1) - (len(sb) > 1)], a_shape[-2], b_shape[-1])
    g = em.reshape(ctx.dy(), g_shape)
    out = {}
    if len(b_shape) == 2 and len(a_shape) >= 2:
        # Batch only on A: flatten it and use Gemm for both gradients.
        k, m = b_shape
        g2 = em.reshape(g, (prod(g_shape[:-1]), m))
        if ctx.needs(0):
            da = em.gemm(g2, em.reshape(ctx.x(1), b_shape), trans_b=True)
            out[0] = em.reshape(da, sa)
        if ctx.needs(1):
            a2 = em.reshape(ctx.x(0), (prod(a_shape[:-1]), k))  # A's batch is g's: B has none
            out[1] = em.reshape(em.gemm(a2, g2, trans_a=True), sb)
        return out
    if ctx.needs(0):
        b = em.reshape(ctx.x(1), b_shape)
        da = em.matmul(g, em.transpose(b, _swap_last(len(b_shape))))
        out[0] = em.reshape(em.unbroadcast(da, a_shape), sa)
    if ctx.needs(1):
        a = em.reshape(ctx.x(0), a_shape)
        db = em.matmul(em.transpose(a, _swap_last(len(a_shape))), g)
        out[1] = em.reshape(em.unbroadcast(db, b_shape), sb)
    return out


@register("Gemm", inputs=(0, 1, 2))
def gemm(ctx: BackwardContext) -> dict[int, int]:
    """Y = alpha op(A) op(B) + beta C, op = optional transpose; each case is one Gemm."""
    em, g = ctx.em, ctx.dy()
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    ta, tb = bool(ctx.attr("transA", 0)), bool(ctx.attr("transB", 0))
    out = {}
    if ctx.needs(0):
        b = ctx.x(1)
        # dA = alpha g op(B)^T, transposed again when A was.
        out[0] = em.gemm(b, g, trans_a=tb, trans_b=True, alpha=alpha) if ta else \
            em.gemm(g, b, trans_b=not tb, alpha=alpha)
    if ctx.needs(1):
        a = ctx.x(0)
        # dB = alpha op(A)^T g, transposed again when B was.
        out[1] = em.gemm(g, a, trans_a=True, trans_b=ta, alpha=alpha) if tb else \
            em.gemm(a, g, trans_a=not ta, alpha=alpha)
    if ctx.needs(2):
        out[2] = em.unbroadcast(em.scale(g, beta), ctx.x_shape(2))
    return out
