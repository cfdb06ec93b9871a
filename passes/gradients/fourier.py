"""Gradient of DFT (opset 17: axis an attribute; opset 20: axis an input): real ([..., 1]) or
complex ([..., 2]) input, forward or inverse, full or one-sided output, dft_length padding or
truncating the signal, with a constant axis and dft_length.

A DFT is linear in its input, so its gradient is its adjoint (the conjugate transpose, with complex
numbers as (real, imaginary) pairs), itself one DFT of g:
- the unnormalized forward transform sums x[t] e^{-2 pi i k t / n}: its adjoint sums with e^{+...},
  which is n times the inverse DFT (ONNX's inverse divides by n); the inverse's adjoint is the forward
  DFT divided by n;
- a real input reads the real part of the adjoint (its imaginary channel had no input);
- a one-sided output keeps the first n // 2 + 1 bins: the adjoint of that truncation is zero padding
  back to n (not a doubling: the dropped bins are outputs the loss never read), which the backward
  DFT's own dft_length does;
- dft_length pads the signal with zeros or truncates it to n: the adjoint crops g back to the input's
  length or pads it with zeros;
- the inverse one-sided form (IRFFT) maps the n // 2 + 1 bins of a Hermitian spectrum to n real
  samples: y[t] = (1/n) sum_k c_k Re(X[k] e^{2 pi i k t / n}), c_k = 2 but for the bin 0 and, for an
  even n, the bin n / 2 (c_k = 1, imaginary parts unread). Its adjoint is the one-sided forward DFT of
  g times c_k / n; that DFT of a real g has real bins 0 and n / 2, so the unread parts get 0. This is
  the map where the input has n // 2 + 1 bins (the default dft_length gives that). For other lengths
  ONNX Runtime (1.31) computes another one (3 bins to 8 samples: bin 2 counted once, its imaginary
  part read; numpy's irfft, padding the bins, counts it twice), so those are refused.

The backward reads no forward tensor: nothing is saved for it.
"""
from __future__ import annotations

import numpy as np

from passes.gradients import BackwardContext, register
from passes.gradients._emit import Emitter
from planner.errors import FREEZE_HINT, ModelImportError
from planner.graph import NO_TENSOR


def _axis(ctx: BackwardContext, rank: int) -> int:
    """The transformed axis, non-negative: the attribute before opset 20 (default 1), the input
    since (default -2, the last signal axis)."""
    if ctx.opset < 20:
        axis = int(ctx.attr("axis", 1))
    elif ctx.has_input(2):
        axis = int(np.asarray(ctx.require_const(2, "axis input")).reshape(-1)[0])
    else:
        axis = -2
    return axis % rank


def _emit_dft(em: Emitter, g: int, axis: int, *, inverse: bool, onesided: bool = False,
              length: int | None = None) -> int:
    """A DFT of ``g`` along ``axis`` in the model's opset form; ``length`` is its dft_length input."""
    shape = list(em.shape(g))
    n = shape[axis] if length is None else length
    shape[axis] = n // 2 + 1 if onesided else n
    shape[-1] = 2
    inputs = [g, NO_TENSOR if length is None else em.const(np.asarray(length, dtype=np.int64))]
    attrs = {"inverse": int(inverse), "onesided": int(onesided)}
    if em.opset >= 20:
        inputs.append(em.const(np.asarray(axis, dtype=np.int64)))
    else:
        attrs["axis"] = axis
    while inputs[-1] == NO_TENSOR:
        inputs.pop()
    return em.op("DFT", inputs, shape, em.dtype(g), **attrs)


def _fit(em: Emitter, g: int, axis: int, size: int) -> int:
    """``g`` cropped or zero-padded at the end of ``axis`` to ``size``: the adjoint of dft_length's
    padding or truncation of a signal of that size."""
    have = em.shape(g)[axis]
    if have > size:
        return em.slice(g, [0], [size], [axis])
    end = [0] * em.rank(g)
    end[axis] = size - have
    return em.pad_zeros(g, [0] * em.rank(g), end)


def _irfft_weights(m: int, n: int, axis: int, rank: int, dtype: str) -> np.ndarray:
    """c_k / n for bin k of an IRFFT's input (see the module docstring), shaped to broadcast against
    its [..., m, ..., 2] gradient."""
    w = np.full(m, 2.0 / n)
    w[[0, n // 2] if n % 2 == 0 else [0]] = 1.0 / n
    shape = [1] * rank
    shape[axis] = m
    return w.reshape(shape).astype(dtype)


@register("DFT")
def dft(ctx: BackwardContext) -> dict[int, int]:
    """The adjoint DFT of g (see the module docstring), fitted back to the input's shape."""
    em, g = ctx.em, ctx.dy()
    x_shape = ctx.x_shape(0)
    rank = len(x_shape)
    axis = _axis(ctx, rank)
    size = x_shape[axis]
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    length = None
    if ctx.has_input(1):
        length = int(np.asarray(ctx.require_const(1, "dft_length input")).reshape(-1)[0])
    if inverse and onesided:
        n = 2 * (size - 1) if length is None else length
        if n // 2 + 1 != size:
            raise ModelImportError(
                f"node {ctx.node.name!r} (DFT) is an inverse one-sided DFT (IRFFT) of {size} bins with dft_length "
                f"{n}; memplan differentiates it where dft_length // 2 + 1 is the number of bins: give it dft_length "
                f"{2 * size - 2} or {2 * size - 1} (or none), or freeze the weights before it {FREEZE_HINT}"
            )
        spectrum = _emit_dft(em, g, axis, inverse=False, onesided=True)
        return {0: em.mul(spectrum, em.const(_irfft_weights(size, n, axis, rank, em.dtype(g))))}
    n = size if length is None else length
    back = _emit_dft(em, g, axis, inverse=not inverse, length=n if onesided else None)
    if x_shape[-1] == 1:
        back = em.slice(back, [0], [1], [rank - 1])
    return {0: em.scale(_fit(em, back, axis, size), 1.0 / n if inverse else float(n))}
