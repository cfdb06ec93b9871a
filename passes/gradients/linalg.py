"""Gradients of MatMul (batched, broadcast, 1-D operands), Gemm and Einsum (one or two operands).

For the common ``[..., n, k] @ [k, m]`` (every linear layer of a transformer) the weight gradient is
one Gemm over the flattened batch and no Transpose is emitted; Reshape is free in ORT.
"""
from __future__ import annotations

from passes.gradients import BackwardContext, register
from passes.gradients._emit import prod
from planner.errors import FREEZE_HINT, ModelImportError


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


# ---- einsum -----------------------------------------------------------------------------------
def _einsum_terms(ctx: BackwardContext) -> tuple[list[str], str]:
    """(input index strings, output index string) of a one- or two-operand Einsum without ellipsis
    or an index repeated within one term; ModelImportError otherwise."""
    equation = str(ctx.attr("equation", "")).replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    terms = lhs.split(",")
    problem = None
    if "." in equation:
        problem = "an ellipsis"
    elif len(terms) > 2:
        problem = f"{len(terms)} operands"
    elif any(len(set(t)) != len(t) for t in terms + [out]):
        problem = "an index repeated within one operand (a diagonal)"
    if problem is not None:
        raise ModelImportError(
            f"no gradient rule for node {ctx.node.name!r} (Einsum) with equation {equation!r}: it has {problem}; "
            "memplan differentiates one- and two-operand Einsums whose indices appear once per operand, "
            f"without '...'; rewrite the equation (or freeze the weights before it {FREEZE_HINT})"
        )
    if not arrow:  # implicit output: the indices that appear once, in alphabetical order
        letters = lhs.replace(",", "")
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    return terms, out


@register("Einsum", inputs=None)
def einsum(ctx: BackwardContext) -> dict[int, int]:
    """Each operand's gradient is an Einsum of g with the other operand onto the operand's indices.
    An index only the operand itself has (summed in the forward) is broadcast back with Expand."""
    em, g = ctx.em, ctx.dy()
    terms, out_term = _einsum_terms(ctx)
    dims = {c: d for i, term in enumerate(terms) for c, d in zip(term, ctx.x_shape(i))}
    grads = {}
    for i in sorted(ctx.need):
        others = [j for j in range(len(terms)) if j != i]
        seen = out_term + "".join(terms[j] for j in others)
        present = "".join(c for c in terms[i] if c in seen)
        equation = ",".join([out_term, *(terms[j] for j in others)]) + "->" + present
        if equation == f"{out_term}->{out_term}":
            partial = g
        else:
            partial = em.op("Einsum", [g, *(ctx.x(j) for j in others)], [dims[c] for c in present], em.dtype(g),
                            equation=equation)
        kept = [dims[c] if c in present else 1 for c in terms[i]]
        grads[i] = em.expand(em.reshape(partial, kept), ctx.x_shape(i))
    return grads
