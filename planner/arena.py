"""ONNX Runtime's BFC arena, replayed: does a run's allocation sequence fit under a memory limit?

A plan's peak is the most bytes live at once. ORT does not hand out bytes but chunks of an arena
(``BFCArena``, the allocator behind the CPU provider's arena and the CUDA provider's device memory,
where ``gpu_mem_limit`` is its limit). The arena rounds each request to 256 bytes, takes the
smallest free chunk that holds it, keeps the whole chunk unless it is at least twice the request,
merges a freed chunk only with its free neighbours in the same region, and when nothing fits adds a
region (the request, or the next size of a doubling ladder), counted against the limit for good.
So a run whose live bytes never pass the limit can still fail under it: zoo:gpt?batch=64 planned
at 70% (5.17 MB peak with its weights) runs only from a CPU arena limit of 5.97 MB
(kSameAsRequested) or 6.24 MB (kNextPowerOfTwo), and it failed on an H200 under ``gpu_mem_limit``
5.45 MB (bench/results/arena_limit.md, bench/results/gpu_check_h200_gpt_batch64.json).

This module replays the rules of ``onnxruntime/core/framework/bfc_arena.cc`` (ORT 1.31; our own
code, written from reading it) on a sequence of allocations and frees:

* ``Arena``: one arena (limit, extend strategy, first region size); ``alloc`` returns a chunk or
  None where ORT would fail; ``free`` returns it.
* ``run_events(liveness)``: the allocation sequence of a Liveness timeline as ORT runs it with the
  planned session options (no memory pattern, no reuse of dead buffers): at each step the step's
  new buffers in output order, then the kernel's scratch (request by request), scratch freed, then
  the buffers read for the last time; an Einsum's temporaries made and freed in turn around its output,
  a Where's two branch selections made before its output.
* ``replay`` / ``least_limit``: does a sequence run under a limit; the least limit it runs under.
* ``arena_need(liveness)``: ``least_limit`` of a run with what the session holds before it: the
  initializers (on the CPU only those under 128 bytes) and MLAS's packed Gemm/MatMul/LSTM/GRU
  weights (one per distinct packing) as reservations (``reserved_bytes``), a ConvTranspose's
  transposed weight from the arena (``session_allocations``), and off the CPU the fed inputs. Each
  was found by matching ORT's log of arena reservations and extensions request by request. Re-measured
  2026-12-06 (bench/results/arena_limit.md section 4): 33 of 36 zoo rows within 4 KiB of the least
  limit ORT runs under; the three misses (kSameAsRequested) were where glibc placed regions (below),
  which the replay then held to one layout.

Where a region lies decides which of two equal free chunks the arena reuses, and so what a run needs.
On the CPU a region is glibc's: from the heap under the mmap threshold, a fresh mapping at or above
it. The replay lays heap regions out upward and mappings downward, but neither holds in every
process: the threshold starts at 128 KiB and rises to the size of each mapped block the process frees,
up to 32 MiB (mallopt(3), M_MMAP_THRESHOLD), and the kernel puts a mapping in the highest gap that
fits, above earlier ones where the process unmapped blocks before the run (probed in ORT's child
before zoo:unet?batch=8's run at 80%: threshold about 256 KiB, and the 256 KiB region mapped above
the 4 MiB primer made before it). So ORT's need can differ from process to process
(zoo:resnet?batch=32 planned at 70%: 0.959 or 1.084 of its budget). ``least_limit`` takes the
least limit the run fits under with its regions laid out as at every threshold that changes the
layout (``mmap_thresholds``): the safe side, not a model of one process. It covers the two layouts
seen (unet?batch=8 at 80%, the primer below the later regions, is the layout at 4 MiB and needs
ORT's figure exactly; resnet's two are those at 1 MiB and 4 MiB) and may ask for more than a given
process needs (zoo:resnet?batch=32 unplanned, kSameAsRequested: 1.577 of its 70% budget where ORT
needed 1.452; bench/results/arena_limit.md section 5).

Pure: no ONNX.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from planner.graph import NO_TENSOR, Graph
from planner.liveness import HEAP_SCRATCH_OPS

#: BFCArena's constants.
MIN_ALLOCATION = 256
NUM_BINS = 21
FIRST_REGION = 1 << 20  # initial_chunk_size_bytes default
MAX_DEAD_BYTES = 128 << 20  # max_dead_bytes_per_chunk default
NEXT_POWER_OF_TWO, SAME_AS_REQUESTED = 0, 1
#: glibc's default M_MMAP_THRESHOLD: a region at least this large is a fresh mapping, placed below
#: the mappings before it; a smaller one comes from the heap, above the regions before it. Where equal
#: free chunks tie, the arena takes the lower address, so this decides which one is reused.
MMAP_THRESHOLD = 128 << 10
#: glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit: freeing a mapped block raises the threshold to the
#: block's size up to this, so a region this large is always a mapping (mallopt(3)).
MMAP_THRESHOLD_MAX = 32 << 20
#: The largest initializer the CPU provider keeps in the arena (a reservation). ORT 1.31 moves every
#: larger one into the graph's own buffers when it loads the model, outside the arena (measured: a
#: 124-byte initializer is reserved, a 128-byte one is not; zoo:gpt's 96 initializers of 4-16384 bytes
#: reserve 700 bytes, the sum of those under 128).
MAX_ARENA_INITIALIZER = 127


def rounded(nbytes: int) -> int:
    return -(-max(nbytes, 1) // MIN_ALLOCATION) * MIN_ALLOCATION


def bin_of(nbytes: int) -> int:
    return min(NUM_BINS - 1, (max(nbytes, MIN_ALLOCATION) >> 8).bit_length() - 1)


@dataclass
class _Chunk:
    addr: int
    size: int
    used: bool = False
    prev: "_Chunk | None" = None
    next: "_Chunk | None" = None


class Arena:
    """A BFC arena of ``limit`` bytes (module docstring). Addresses are virtual and only break ties
    between equal free chunks: a region of at least ``mmap_threshold`` bytes lies below the mapped
    regions before it, a smaller one above the heap regions before it (``MMAP_THRESHOLD``)."""

    def __init__(self, limit: int, strategy: int = NEXT_POWER_OF_TWO, first_region: int = FIRST_REGION,
                 max_dead_bytes: int = MAX_DEAD_BYTES, mmap_threshold: int = MMAP_THRESHOLD):
        self.limit = limit
        self.strategy = strategy
        self.max_dead = max_dead_bytes
        self.grow = rounded(min(limit, first_region))  # curr_region_allocation_bytes_
        self.total = 0  # bytes of regions and reservations, what the limit counts
        self.in_use = 0  # bytes of chunks handed out (whole chunks, as ORT's stats count them)
        self.regions = 0
        self.mmap_threshold = mmap_threshold
        self._top = 1 << 62  # mapped regions go down from here
        self._bottom = 0  # heap regions go up from here
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(NUM_BINS)]  # (size, addr), sorted
        self._free: dict[int, _Chunk] = {}  # addr -> free chunk

    def reserve(self, nbytes: int) -> bool:
        """A reservation outside the regions (ORT reserves initializers this way); counted against the limit."""
        if nbytes <= 0:
            return True
        if self.total + nbytes > self.limit:
            return False
        self.total += nbytes
        self.in_use += nbytes
        return True

    def alloc(self, nbytes: int) -> _Chunk | None:
        """A chunk for ``nbytes`` (None: ORT fails this request under the limit); 0 bytes: no chunk."""
        want = rounded(nbytes)
        chunk = self._find(want)
        if chunk is None:
            if not self._extend(want):
                return None
            chunk = self._find(want)
        assert chunk is not None
        return chunk

    def free(self, chunk: _Chunk) -> None:
        """Return ``chunk``; it merges with a free neighbour on either side (same region only)."""
        chunk.used = False
        self.in_use -= chunk.size
        if chunk.next is not None and not chunk.next.used:
            self._merge(chunk, chunk.next)
        if chunk.prev is not None and not chunk.prev.used:
            chunk = self._merge(chunk.prev, chunk)
        self._bin(chunk)

    # -- BFCArena internals --------------------------------------------------------------------
    def _find(self, want: int) -> _Chunk | None:
        for b in range(bin_of(want), NUM_BINS):
            entries = self._bins[b]
            i = bisect.bisect_left(entries, (want, -1))
            if i < len(entries):
                chunk = self._free[entries[i][1]]
                self._unbin(chunk)
                if chunk.size >= 2 * want or chunk.size - want >= self.max_dead:
                    rest = _Chunk(chunk.addr + want, chunk.size - want, prev=chunk, next=chunk.next)
                    if chunk.next is not None:
                        chunk.next.prev = rest
                    chunk.next = rest
                    chunk.size = want
                    self._bin(rest)
                chunk.used = True
                self.in_use += chunk.size
                return chunk
        return None

    def _extend(self, want: int) -> bool:
        available = (self.limit - self.total) // MIN_ALLOCATION * MIN_ALLOCATION
        if want > available:
            return False
        if self.strategy == NEXT_POWER_OF_TWO:
            increased = False
            while want > self.grow:
                self.grow *= 2
                increased = True
            size = min(self.grow, available)
            if not increased:
                self.grow *= 2
        else:
            size = want
        self.total += size
        if size >= self.mmap_threshold:  # glibc maps it: below the last mapping
            self._top -= size + (1 << 40)
            region = _Chunk(self._top, size)
        else:  # from the heap: above the last heap region
            region = _Chunk(self._bottom, size)
            self._bottom += size + (1 << 40)
        self.regions += 1
        self._bin(region)
        return True

    def _merge(self, low: _Chunk, high: _Chunk) -> _Chunk:
        """``high`` (its right neighbour) folded into ``low``; whichever of them was free leaves its bin."""
        for c in (low, high):
            if c.addr in self._free:
                self._unbin(c)
        low.size += high.size
        low.next = high.next
        if high.next is not None:
            high.next.prev = low
        return low

    def _bin(self, chunk: _Chunk) -> None:
        bisect.insort(self._bins[bin_of(chunk.size)], (chunk.size, chunk.addr))
        self._free[chunk.addr] = chunk

    def _unbin(self, chunk: _Chunk) -> None:
        entries = self._bins[bin_of(chunk.size)]
        i = bisect.bisect_left(entries, (chunk.size, chunk.addr))
        del entries[i]
        del self._free[chunk.addr]


#: One event: (+1, key, bytes) allocates ``bytes`` under ``key``; (-1, key, 0) frees it.
Event = tuple[int, object, int]


def run_events(liveness, *, on_cpu: bool = True) -> list[Event]:
    """The allocation sequence ORT makes for ``liveness`` (a planner.liveness.Liveness) with the
    planned session options: per step, its new buffers in the order their tensors were made, the
    kernel's scratch (allocated and freed inside the kernel), then the buffers last read there.
    On the CPU the scratch of HEAP_SCRATCH_OPS is left out: those kernels take it with malloc, not
    from the arena (measured: a ScatterElements on 256x512 floats runs under a limit of its output
    alone, where its 1 MiB of int64 indices counted asked for 2 MiB)."""
    lv = liveness
    n = len(lv.order)
    made: list[list[int]] = [[] for _ in range(n)]
    gone: list[list[int]] = [[] for _ in range(n)]
    for b in range(len(lv.buffer_size)):
        made[int(lv.alloc_step[b])].append(b)
        gone[int(lv.free_step[b])].append(b)
    events: list[Event] = []
    for s in range(n):
        node = lv.graph.nodes[lv.order[s]]
        sequence = lv.model.scratch_sequence(lv.graph, node)
        if sequence is not None:
            # an Einsum: its temporaries made and freed in turn, its output made midway (even where
            # no temporary outlives the output's size, so liveness counts no scratch); a Where: its
            # selections, then its output
            if not any(sign == 0 for sign, _, _ in sequence):
                sequence = [(0, -1, 0)] + sequence
            for sign, key, nbytes in sequence:
                if sign == 0:
                    events.extend((1, b, int(lv.buffer_size[b])) for b in made[s])
                else:
                    events.append((sign, ("scratch", s, key), nbytes))
            events.extend((-1, b, 0) for b in gone[s])
            continue
        events.extend((1, b, int(lv.buffer_size[b])) for b in made[s])
        if lv.scratch[s] > 0 and not (on_cpu and node.op_type in HEAP_SCRATCH_OPS):
            # each of the kernel's requests on its own (a fused LSTM makes a dozen): one lump of their
            # sum asks the arena for a region they need not share
            parts = lv.model.scratch_parts(lv.graph, node)
            if sum(parts) != int(lv.scratch[s]):
                parts = [int(lv.scratch[s])]
            events.extend((1, ("scratch", s, i), int(b)) for i, b in enumerate(parts))
            events.extend((-1, ("scratch", s, i), 0) for i in reversed(range(len(parts))))
        events.extend((-1, b, 0) for b in gone[s])
    return events


def replay(events: Iterable[Event], limit: int, *, base: int = 0, strategy: int = NEXT_POWER_OF_TWO,
           first_region: int = FIRST_REGION, mmap_threshold: int = MMAP_THRESHOLD) -> tuple[bool, Arena]:
    """Run ``events`` on a fresh arena with ``base`` reserved first, glibc's mmap threshold at
    ``mmap_threshold``: (every request was met, the arena)."""
    arena = Arena(limit, strategy, first_region, mmap_threshold=mmap_threshold)
    if not arena.reserve(base):
        return False, arena
    held: dict[object, _Chunk] = {}
    for sign, key, nbytes in events:
        if sign > 0:
            if nbytes <= 0:
                continue
            chunk = arena.alloc(nbytes)
            if chunk is None:
                return False, arena
            held[key] = chunk
        elif key in held:
            arena.free(held.pop(key))
    return True, arena


def mmap_thresholds(events: Iterable[Event], *, strategy: int = NEXT_POWER_OF_TWO,
                    first_region: int = FIRST_REGION) -> list[int]:
    """The mmap thresholds glibc may hold when the run starts that lay out its regions differently
    (module docstring): 128 KiB, and one just above each size a region can have from 128 KiB up to
    ``MMAP_THRESHOLD_MAX`` (a request, or under ``NEXT_POWER_OF_TWO`` a step of the ladder), so that
    it comes from the heap. A power-of-two region clamped to what the limit leaves is the last one
    the arena makes and takes the place the others' threshold gives it."""
    sizes = {rounded(nbytes) for sign, _, nbytes in events if sign > 0 and nbytes > 0}
    if strategy == NEXT_POWER_OF_TWO:
        step = rounded(first_region)
        while step < MMAP_THRESHOLD_MAX:
            sizes.add(step)
            step *= 2
    return [MMAP_THRESHOLD] + [s + MIN_ALLOCATION for s in sorted(sizes) if MMAP_THRESHOLD <= s < MMAP_THRESHOLD_MAX]


def least_limit(events: Sequence[Event], *, base: int = 0, strategy: int = NEXT_POWER_OF_TWO,
                first_region: int = FIRST_REGION, resolution: int = 1,
                thresholds: Sequence[int] | None = None) -> int:
    """The least limit (to ``resolution`` bytes) under which ``events`` run whatever glibc's mmap
    threshold (each of ``thresholds``; default ``mmap_thresholds(events)``), by bisection between
    the live-bytes peak (nothing runs below it) and what an unlimited arena takes.

    Whether a sequence fits is not monotone in the limit in every case (a limit changes the size of
    the region that reaches it); the result is a limit that fits, with one ``resolution`` below it
    that does not under one of the thresholds."""
    if thresholds is None:
        thresholds = mmap_thresholds(events, strategy=strategy, first_region=first_region)
    order = list(thresholds)

    def fits(limit: int) -> bool:
        for i, t in enumerate(order):
            if not replay(events, limit, base=base, strategy=strategy, first_region=first_region,
                          mmap_threshold=t)[0]:
                order.insert(0, order.pop(i))  # the threshold that failed is tried first next time
                return False
        return True

    hi = 0
    for t in order:
        ok, free_arena = replay(events, 1 << 62, base=base, strategy=strategy, first_region=first_region,
                                mmap_threshold=t)
        assert ok
        hi = max(hi, free_arena.total)
    lo = base + _live_peak(events) - 1
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _live_peak(events: Iterable[Event]) -> int:
    live, peak, sizes = 0, 0, {}
    for sign, key, nbytes in events:
        if sign > 0:
            sizes[key] = rounded(nbytes) if nbytes > 0 else 0
            live += sizes[key]
            peak = max(peak, live)
        else:
            live -= sizes.pop(key, 0)
    return peak


def reserved_bytes(graph: Graph, prepack: bool) -> int:
    """What a session holds reserved in the arena when its first run starts: every initializer (with
    ``prepack``, the CPU provider, only those of at most ``MAX_ARENA_INITIALIZER`` bytes), except that
    with ``prepack`` a constant weight packed for MLAS (``_prepacked``: Gemm/MatMul's B, LSTM's and
    GRU's W and R) is held as its packed copies, and the weight itself goes once every reader packed
    it. Each reader reserves its own copy, and the session keeps one per op type and packed content:
    readers of the same B in the same layout (a recomputed MatMul) share one. Measured on ORT 1.31
    (its log of ``Reserve`` calls and the first region, clamped to what the limit leaves): three
    MatMuls of one B hold one copy, a MatMul and a Gemm two; zoo:gpt planned at 70% reserves 479232
    bytes of copies and holds 196608 when it runs. Two initializers of equal bytes share a copy too
    (``_same_bytes``: two MatMuls on equal weights hold 65536 bytes, not 131072)."""
    packers: dict[int, set[int]] = {}  # weight -> the nodes that pack it
    # (op type, weight (the first of equal ones), part, transposed) -> bytes of the copy the session keeps
    copies: dict[tuple, int] = {}
    if prepack:
        packed = [(node, _prepacked(graph, node)) for node in graph.nodes]
        same = _same_bytes(graph, sorted({w for _, copies_of in packed for w, _, reserved in copies_of if reserved}))
        for node, copies_of in packed:
            for part, (w, nbytes, reserved) in enumerate(copies_of):
                packers.setdefault(w, set()).add(node.id)
                if reserved:
                    transposed = node.op_type == "Gemm" and bool(node.attr("transB"))
                    copies[node.op_type, same.get(w, w), part, transposed] = nbytes
    total = sum(copies.values())
    for t in graph.initializers():
        if prepack and t.nbytes > MAX_ARENA_INITIALIZER:
            continue
        readers = set(graph.consumers[t.id])
        if not readers or readers - packers.get(t.id, set()) or t.id in graph.output_set:
            total += t.nbytes
    return total


def _same_bytes(graph: Graph, weights: Sequence[int]) -> dict[int, int]:
    """weight -> the first of ``weights`` (by id) holding the same dtype, shape and bytes. Weights are
    mapped, not loaded: only those whose first ``_PROBE`` bytes agree too are compared whole (seeded
    random weights differ there; a copied or zero-initialized one reads on)."""
    groups: dict[tuple, list[int]] = {}
    for w in weights:
        t, value = graph.tensors[w], graph.values.get(w)
        if value is None or value.size == 0:
            continue
        flat = np.ravel(value)  # a view where the array is contiguous, as mapped weights are
        probe = flat[: max(1, _PROBE // flat.itemsize)].tobytes()
        groups.setdefault((t.dtype, t.shape, probe), []).append(w)
    same: dict[int, int] = {}
    for members in groups.values():
        firsts: list[tuple[int, np.ndarray]] = []
        for w in members:
            bits = _bits(graph.values[w])
            first = next((f for f, f_bits in firsts if np.array_equal(bits, f_bits)), None)
            if first is None:
                firsts.append((w, bits))
            else:
                same[w] = first
    return same


#: How many leading bytes of two weights must agree before they are compared whole.
_PROBE = 64


def _bits(value: np.ndarray) -> np.ndarray:
    """``value``'s elements as unsigned integers of their width: equal where the bytes are (-0.0 is
    not 0.0, a NaN equals itself)."""
    return value.view(f"u{value.itemsize}") if value.itemsize in (1, 2, 4, 8) else value.view(np.uint8)


def session_allocations(graph: Graph) -> list[Event]:
    """The CPU provider's packed weights that come from the arena itself (not reserved), made at
    session creation in node order and held: a ConvTranspose with a constant weight keeps it
    transposed (measured: zoo:cnn's first arena request, 4608 bytes, comes before the first run)."""
    out: list[Event] = []
    for node in graph.nodes:
        out.extend((1, ("packed", node.id), nbytes) for _, nbytes, reserved in _prepacked(graph, node) if not reserved)
    return out


def _packed_b(n: int, k: int) -> int:
    """MlasGemmPackBSize of a float B of K rows and N columns: N rounded up to 16, 64-byte aligned."""
    return -(-(-(-n // 16) * 16 * k * 4) // 64) * 64


def _prepacked(graph: Graph, node) -> list[tuple[int, int, bool]]:
    """(weight, bytes, reserved) of each copy the CPU provider packs of ``node``'s constant float32
    weights: MLAS's packed B of a Gemm/MatMul (reserved); an LSTM's W and R, and a GRU's W and R (R in
    two parts, update/reset gates and hidden gate), packed per direction (reserved; measured: a
    bidirectional GRU of hidden size 3 and input size 5 reserves 640, 384 and 384 bytes, an LSTM
    640 and 384); a ConvTranspose's transposed filter (the weight's size, from the arena)."""
    if node.domain not in ("", "ai.onnx"):
        return []

    def weight(i: int) -> int | None:
        t = node.inputs[i] if i < len(node.inputs) else NO_TENSOR
        if t == NO_TENSOR or t not in graph.values or graph.tensors[t].dtype != "float32":
            return None
        return t

    op, w = node.op_type, weight(1)
    if op == "ConvTranspose":
        return [] if w is None else [(w, graph.tensors[w].nbytes, False)]
    if op in ("Gemm", "MatMul"):
        if w is None or len(graph.tensors[w].shape) != 2:
            return []
        k, n = graph.tensors[w].shape
        if op == "Gemm" and node.attr("transB"):
            k, n = n, k
        return [(w, _packed_b(n, k), True)]
    if op not in ("LSTM", "GRU"):
        return []
    out = []
    if w is not None and len(graph.tensors[w].shape) == 3:  # (directions, gates x hidden, input)
        dirs, n, k = graph.tensors[w].shape
        out.append((w, dirs * _packed_b(n, k), True))
    r = weight(2)
    if r is not None and len(graph.tensors[r].shape) == 3:  # (directions, gates x hidden, hidden)
        dirs, n, h = graph.tensors[r].shape
        parts = [n] if op == "LSTM" else [2 * h, h]
        out.extend((r, dirs * _packed_b(m, h), True) for m in parts)
    return out


def arena_need(liveness, *, strategy: int = NEXT_POWER_OF_TWO, on_cpu: bool = True) -> int:
    """The least arena limit ``liveness``'s run needs (``least_limit``): the session's reservations
    first (``reserved_bytes``), on the CPU its packed weights from the arena (``session_allocations``),
    off the CPU the fed inputs (the CUDA provider copies them into the arena; the CPU provider reads
    the caller's arrays), then the run. On the CPU the limit holds whatever glibc's mmap threshold
    (``mmap_thresholds``); off it regions are the device allocator's, laid out as at 128 KiB."""
    g = liveness.graph
    events = session_allocations(g) if on_cpu else [(1, ("input", t), g.tensors[t].nbytes) for t in g.inputs]
    events += run_events(liveness, on_cpu=on_cpu)
    return least_limit(events, base=reserved_bytes(g, prepack=on_cpu), strategy=strategy,
                       thresholds=None if on_cpu else [MMAP_THRESHOLD])
