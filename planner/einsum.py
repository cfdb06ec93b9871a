"""ONNX Runtime's Einsum kernel: the working memory it takes from its allocator, and its FLOPs.

ORT's CPU (and CUDA) Einsum contracts its operands one pair at a time with MatMul. Read from its
design (einsum_compute_preprocessor, einsum_typed_compute_processor) and checked byte for byte
against passes/alloc_counter.py on single-node models (tests/test_liveness.py), its temporaries are:

  * each operand whose letters are not in the order they first appear in the equation is
    transposed into that order once, up front; those copies live to the end of the node;
  * the letters only operand 0 has (not in the output) are summed out of it first (a ReduceSum);
  * each pair (the running result, the next operand): a letter to be summed that only one side
    has is summed out of that side; each side is transposed to MatMul's layout where its letters
    are out of that layout ([shared, left-only, summed, right-only] and [shared, summed,
    right-only, left-only]); the MatMul's product; before the last pair the product is
    transposed back to the equation's letter order where needed;
  * the last product, transposed to the output's order where needed, is copied into the node's
    output, which is allocated at that moment.

Operands with an ellipsis or a repeated letter (a diagonal) are not modelled: for those the bound
is every input and the output once more, which held on every equation measured.

Its arithmetic is that of the same pairwise contractions: a MatMul over every letter either side
of a pair has, the letters summed before (one operand alone) costing one pass over that operand.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence


def _parse(equation: str) -> tuple[list[str], str]:
    """(operand terms, output term) of an equation, spaces dropped; implicit output: the letters
    seen once, in alphabetical order."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    if not arrow:
        out = "".join(sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1))
    return lhs.split(","), out


def _dims(terms: Sequence[str], shapes: Sequence[Sequence[int]]) -> dict[str, int]:
    """Each letter's size, the largest any operand gives it; an operand's letters name its trailing
    dims (an ellipsis takes the leading ones)."""
    dims: dict[str, int] = {}
    for term, shape in zip(terms, shapes):
        letters = term.replace(".", "")
        for c, d in zip(letters, shape[len(shape) - len(letters):]):
            dims[c] = max(dims.get(c, 1), int(d))
    return dims


def einsum_flops(equation: str, shapes: Sequence[Sequence[int]]) -> float:
    """FLOPs of ORT's pairwise evaluation of ``equation`` (see the module docstring)."""
    terms, out = _parse(equation)
    dims = _dims(terms, shapes)
    last = {c: max(k for k, t in enumerate(terms) if c in t) for c in dims}
    flops = float(math.prod(int(d) for d in shapes[0])) if shapes else 0.0  # the first pass over operand 0
    live = {c for c in terms[0] if c in dims and (c in out or last[c] > 0)}
    for k in range(1, len(terms)):
        both = live | {c for c in terms[k] if c in dims}
        flops += 2.0 * math.prod(dims[c] for c in both)
        live = {c for c in both if c in out or last[c] > k}
    return flops


def einsum_scratch(equation: str, shapes: Sequence[Sequence[int]], out_elements: int, itemsize: float,
                   buffer_bytes: Callable[[int], int]) -> int:
    """Bytes the Einsum ``equation`` on operands of ``shapes`` (making ``out_elements``) holds
    besides its inputs and output, at its worst moment, as liveness counts a step (inputs + output
    + scratch); ``buffer_bytes`` rounds a tensor's bytes to what the allocator hands out."""
    replay, nbytes = _replay(equation, shapes, out_elements, itemsize, buffer_bytes)
    if replay is None:
        return sum(nbytes(math.prod(s)) for s in shapes) + nbytes(out_elements)
    return replay.run()


def einsum_requests(equation: str, shapes: Sequence[Sequence[int]], out_elements: int, itemsize: float,
                    buffer_bytes: Callable[[int], int]) -> list[tuple[int, int, int]] | None:
    """The kernel's requests to its allocator in order, as (+1, key, bytes) for a temporary made,
    (-1, key, 0) for one freed and (0, -1, 0) where the node's output is made; temporaries still
    held at the end are freed as the kernel returns, last made first. None where ``einsum_scratch``
    is only a bound (an ellipsis or a repeated letter). Replayed on planner/arena.py's BFC arena
    this is the least limit ORT runs a single Einsum under (measured to 0.3%, where one lump of
    ``einsum_scratch`` was 1.43x it, or 0.89x and failed)."""
    replay, _ = _replay(equation, shapes, out_elements, itemsize, buffer_bytes)
    if replay is None:
        return None
    replay.run()
    held = [key for sign, key, _ in replay.log if sign > 0 and key in replay.sizes]
    return replay.log + [(-1, key, 0) for key in reversed(held)]


def _replay(equation: str, shapes: Sequence[Sequence[int]], out_elements: int, itemsize: float,
            buffer_bytes: Callable[[int], int]) -> tuple["_Replay | None", Callable[[int], int]]:
    """The kernel's replay for ``equation`` (None where an ellipsis or a repeated letter leaves
    only a bound) and the bytes the allocator hands out for a tensor of so many elements."""
    def nbytes(elements: int) -> int:
        return buffer_bytes(math.ceil(elements * itemsize))

    terms, out = _parse(equation)
    if any("." in t for t in terms) or len(terms) != len(shapes) or any(len(set(t)) != len(t) or len(t) != len(s)
                                                    for t, s in zip(terms, shapes)):
        return None, nbytes
    return _Replay(terms, out, shapes, nbytes, nbytes(out_elements)), nbytes


class _Replay:
    """The kernel's allocations in order; ``worst`` is the scratch as liveness counts it."""

    def __init__(self, terms, out, shapes, nbytes, out_bytes):
        self.letters = list(dict.fromkeys("".join(terms)))  # in order of first appearance
        self.out = out
        self.nbytes = nbytes
        self.out_bytes = out_bytes
        self.live = 0  # temporaries held now
        self.sizes: dict[int, int] = {}  # key -> bytes of each temporary held now
        self.log: list[tuple[int, int, int]] = []  # the requests in order (einsum_requests)
        self.worst = 0
        self.output_made = False
        rank = len(self.letters)
        # each operand with every letter of the equation, 1 where it has none (homogenized)
        self.shapes = []
        for term, shape in zip(terms, shapes):
            full = [1] * rank
            for c, d in zip(term, shape):
                full[self.letters.index(c)] = int(d)
            self.shapes.append(full)
        self.terms = terms
        last = {c: max(k for k, t in enumerate(terms) if c in t) for c in self.letters}
        # per operand, the letters summed after it (seen last there, not in the output)
        self.summed = [[self.letters.index(c) for c in self.letters if c not in out and last[c] == k]
                       for k in range(len(terms))]

    def alloc(self, elements: int) -> int:
        """A temporary of ``elements``: its key."""
        size = self.nbytes(elements)
        key = len(self.log)
        self.sizes[key] = size
        self.log.append((1, key, size))
        self.live += size
        self._note()
        return key

    def free(self, key: int) -> None:
        self.live -= self.sizes.pop(key)
        self.log.append((-1, key, 0))

    def _note(self) -> None:
        # liveness counts the output for the whole step: before it is made, the temporaries
        # beyond its size are the scratch; after, all of them
        self.worst = max(self.worst, self.live if self.output_made else self.live - self.out_bytes)

    def run(self) -> int:
        held = []  # the up-front transposed copies, alive to the end
        for term, full in zip(self.terms, self.shapes):
            order = [self.letters.index(c) for c in term]
            if order != sorted(order):
                held.append(self.alloc(math.prod(full)))
        result = None  # the running result's key when it is a temporary
        shape = self.shapes[0]
        if self.summed[0]:
            shape = [1 if i in self.summed[0] else d for i, d in enumerate(shape)]
            result = self.alloc(math.prod(shape))
        if len(self.terms) == 1:
            self._finalize(math.prod(shape), [i for i in range(len(shape)) if i not in self.summed[0]])
            return max(0, self.worst)
        for k in range(1, len(self.terms)):
            result, shape = self._pair(result, shape, self.shapes[k], self.summed[k], k == len(self.terms) - 1)
        return max(0, self.worst)

    def _pair(self, result, left, right, summed, final):
        """One pairwise contraction; returns the new running result (key, or None) and its shape."""
        cur_left = cur_right = None
        lro, lo, ro = [], [], []
        reduced = 1
        left, right = list(left), list(right)
        for i in range(len(left)):
            a, b = left[i] > 1, right[i] > 1
            if i in summed:
                if a and b:
                    reduced *= left[i]
                elif a:  # summed out of the left side alone, first
                    left[i] = 1
                    new = self.alloc(math.prod(left))
                    if cur_left is not None:
                        self.free(cur_left)
                    cur_left = new
                elif b:
                    right[i] = 1
                    new = self.alloc(math.prod(right))
                    if cur_right is not None:
                        self.free(cur_right)
                    cur_right = new
            elif a and b:
                lro.append(i)
            elif a:
                lo.append(i)
            else:
                ro.append(i)
        perm_left = lro + lo + summed + ro
        perm_right = lro + summed + ro + lo
        if perm_left != sorted(perm_left) and not (cur_left is not None and _keeps_order(perm_left, left)):
            new = self.alloc(math.prod(left))
            if cur_left is not None:
                self.free(cur_left)
            cur_left = new
        if perm_right != sorted(perm_right) and not (cur_right is not None and _keeps_order(perm_right, right)):
            new = self.alloc(math.prod(right))
            if cur_right is not None:
                self.free(cur_right)
            cur_right = new
        out_shape = [left[i] for i in lro] + [left[i] for i in lo] + [1] * len(summed) + [right[i] for i in ro]
        product = self.alloc(math.prod(out_shape))
        order = lro + lo + summed + ro
        if not final:
            back = [0] * len(order)
            for pos, i in enumerate(order):
                back[i] = pos
            shape = [1] * len(order)
            for pos, i in enumerate(order):
                shape[i] = out_shape[pos]
            if back != sorted(back) and not _keeps_order(back, out_shape):
                moved = self.alloc(math.prod(out_shape))
                self.free(product)
                product = moved
        else:
            self._finalize(math.prod(out_shape), order)
            shape = None
        for key in (cur_left, cur_right, result):
            if key is not None:
                self.free(key)
        return product, shape

    def _finalize(self, elements: int, order: Sequence[int]) -> None:
        """The node's output is made; the result, its letters in ``order``, is transposed to the
        output's order where that differs, then copied."""
        self.output_made = True
        self.log.append((0, -1, 0))
        self._note()
        target = [self.out.index(self.letters[i]) for i in order if self.letters[i] in self.out]
        if target != sorted(target):
            self.free(self.alloc(elements))


def _keeps_order(perm: Sequence[int], dims: Sequence[int]) -> bool:
    """A transpose that only moves size-1 axes is a reshape (no copy)."""
    last = 0
    for p in perm:
        if dims[p] == 1:
            continue
        if p < last:
            return False
        last = p
    return True
