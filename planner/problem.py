"""PlanningProblem: the numpy struct-of-arrays view of a graph that every planner strategy reads.

Model (the one Moccasin and Checkmate use, generalised with a constant base and kernel scratch):
  * nodes 0..n-1 are in a fixed topological schedule order; node i produces ONE buffer of
    ``size[i]`` bytes, allocated when i starts (its inputs are resident at the same time);
  * a buffer is freed right after the last step that reads it; a buffer nobody reads lives only
    during its own step, unless ``pinned[i]`` (graph outputs) keeps it to the end;
  * ``scratch[i]`` bytes exist only while node i computes; ``base_bytes`` are always resident;
  * memory at a step = base + resident buffers + that step's scratch; the peak is the max over steps.

Builders: :meth:`PlanningProblem.build` (arrays), :func:`load_remat_json` (Checkmate/Moccasin
node-link JSON). The ONNX path adds ``PlanningProblem.from_graph`` on top of ``build``.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from planner.errors import GraphError, ModelImportError
from planner.units import share_of


@dataclass(frozen=True, eq=False)
class PlanningProblem:
    """What the planner decides over; arrays are indexed by schedule position (node id)."""

    name: str
    names: tuple[str, ...]  # display name of each node
    node_ids: tuple[int, ...]  # the caller's id of each node (JSON id); plans are written with these
    size: np.ndarray  # int64 [n]: bytes of node i's output buffer
    cost: np.ndarray  # float64 [n]: compute time of node i (``time_unit``)
    pred_ptr: np.ndarray  # int64 [n+1]: CSR row pointer of the predecessor lists
    pred_idx: np.ndarray  # int64 [E]: predecessors of i are pred_idx[pred_ptr[i]:pred_ptr[i+1]], all < i
    base_bytes: int  # constant memory, resident for the whole run (weights, graph inputs)
    scratch: np.ndarray  # int64 [n]: transient bytes only while node i computes
    pinned: np.ndarray  # bool [n]: output stays resident to the end (graph outputs)
    recomputable: np.ndarray  # bool [n]: may be computed again (False: random ops, pinned outputs)
    swappable: np.ndarray  # bool [n]: may be moved to host and back (needs ``transfer``)
    # One-way host transfer time of node i's output (bytes / link bandwidth), in ``time_unit``;
    # None when no host link is modelled (then nothing is swappable).
    transfer: np.ndarray | None = None
    # Transfers run on their own copy streams and overlap compute (GPU copy engines). False: a
    # transfer blocks compute for its whole duration (e.g. the cpu profile).
    copy_overlap: bool = True
    # Unit of ``cost`` and ``transfer``: "s" when derived from a device profile; "" when unitless
    # (the benchmark graphs' cost_cpu has no stated unit).
    time_unit: str = ""
    # Nodes of the backward pass (when known); Chen's checkpointing only spaces forward nodes.
    backward: np.ndarray | None = None
    # Bytes the runtime need not hold of what ``step_need`` counts for node i: its output written
    # into the buffer of an input it reads last (ONNX Runtime runs Relu, Add, ScatterElements ...
    # in place: planner/liveness.py), and for a ``two_step`` node the inputs of one op that the
    # other does not read. The problem's own accounting
    # holds them all at once (safe for plans); the floor subtracts them, so that what it claims
    # holds for the runtime too. None: nothing of the kind.
    in_place: np.ndarray | None = None
    # Bytes of ``base_bytes`` a runtime holds only from the step that makes them on (an ONNX
    # model's outputs nobody reads, which ORT keeps to the end): the floor leaves them out.
    late_base_bytes: int = 0
    # Bytes of a pinned node's output that stay resident to the end: its graph outputs, when the
    # node also makes buffers that die (an ONNX node with a graph output and another output).
    # The problem keeps the whole node (safe); the floor counts only these. None: all of them.
    kept_bytes: np.ndarray | None = None
    # Bytes of node i's output that each of its readers reads (the least over them): an ONNX node
    # with several outputs may have freed those a reader does not read. The problem moves the
    # node as one buffer (safe); the floor counts an input with these bytes. None: all of them.
    # build() lowers it to what ``parts`` say its readers read.
    read_bytes: np.ndarray | None = None
    # Node i is two ops run one after the other (an ONNX op and the op writing in place into its
    # output): their inputs need not be resident together, so last_input_bound does not expand
    # it. None: no such node.
    two_step: np.ndarray | None = None
    # Node i's output is written into the buffer of its input ``takes_over[i]`` (-1: none) when
    # i reads that input's copy last: an ONNX op that ORT runs in place (Relu, Sigmoid, Cast, ...), the
    # input's node read by i alone, both one buffer of the same bytes. Then while i runs the two
    # are one buffer, and simulate() and the CP-SAT model count them once (``credit``); the
    # greedies and bounds that leave this out only over-count. None: no such node.
    takes_over: np.ndarray | None = None
    # Node i holds bytes of node i - 1 that stay to the end from there (planner/lowering.py: the
    # graph outputs of an ONNX node whose other outputs die, which is then not pinned itself, or
    # outputs nobody reads). Cost 0, it reads only node i - 1; memory_order keeps the two
    # together. None: no such node.
    companion: np.ndarray | None = None
    # Node i's output as buffers that die apart: ``parts[i]`` lists (bytes, readers) per buffer,
    # the bytes summing to size[i], the readers the nodes (of succ_lists[i]) reading that buffer;
    # () where the node's buffers all have the same readers (one buffer, in effect). The runtime
    # frees each buffer after its own last reader (an ONNX node's outputs: a MaxPool's Y and its
    # Indices): simulate() and :attr:`unplanned_memory` count that; the solvers plan each node
    # as one buffer (:attr:`one_buffer_memory`; their plans fit all the same). None: no such node.
    parts: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...] | None = None

    def __post_init__(self) -> None:
        # The cached properties below (unplanned_peak, memory_floor, ...) hold only while the
        # arrays do: a problem built directly or by dataclasses.replace kept the caller's writable
        # arrays, and build() left recomputable and swappable writable, so a write into one went
        # unseen by the values cached from it. A writable array is copied (the caller's stays
        # theirs) and frozen; build()'s arrays come frozen and are kept as they are.
        for f in dataclasses.fields(self):
            a = getattr(self, f.name)
            if isinstance(a, np.ndarray) and a.flags.writeable:
                a = a.copy()
                a.setflags(write=False)
                object.__setattr__(self, f.name, a)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        *,
        size: Sequence[int],
        cost: Sequence[float],
        preds: Sequence[Sequence[int]],
        name: str = "problem",
        names: Sequence[str] | None = None,
        node_ids: Sequence[int] | None = None,
        base_bytes: int = 0,
        scratch: Sequence[int] | None = None,
        pinned: Sequence[bool] | None = None,
        recomputable: Sequence[bool] | None = None,
        swappable: Sequence[bool] | None = None,
        transfer: Sequence[float] | None = None,
        copy_overlap: bool = True,
        time_unit: str = "",
        backward: Sequence[bool] | None = None,
        in_place: Sequence[int] | None = None,
        late_base_bytes: int = 0,
        kept_bytes: Sequence[int] | None = None,
        read_bytes: Sequence[int] | None = None,
        two_step: Sequence[bool] | None = None,
        takes_over: Sequence[int] | None = None,
        companion: Sequence[bool] | None = None,
        parts: Sequence[Sequence[tuple[int, Sequence[int]]]] | None = None,
    ) -> "PlanningProblem":
        """Check the arrays and freeze them; ``preds[i]`` lists the nodes whose output i reads."""
        n = len(size)
        if len(cost) != n or len(preds) != n:
            raise GraphError(f"size, cost and preds must have one entry per node; got {n}, {len(cost)}, {len(preds)}")
        ptr = np.zeros(n + 1, dtype=np.int64)
        flat: list[int] = []
        for i, ps in enumerate(preds):
            uniq = sorted({int(p) for p in ps})
            for p in uniq:
                if not 0 <= p < i:
                    raise GraphError(
                        f"node {i} reads node {p}: predecessors must come earlier in the schedule order"
                    )
            flat.extend(uniq)
            ptr[i + 1] = len(flat)

        def arr(values: Sequence[Any] | None, default: Any, dtype: Any, what: str) -> np.ndarray:
            a = np.full(n, default, dtype=dtype) if values is None else np.asarray(values, dtype=dtype).copy()
            if a.shape != (n,):
                raise GraphError(f"{what} must have {n} entries, got {a.shape}")
            a.setflags(write=False)
            return a

        size_a = arr(size, 0, np.int64, "size")
        cost_a = arr(cost, 0.0, np.float64, "cost")
        scratch_a = arr(scratch, 0, np.int64, "scratch")
        if (size_a < 0).any() or (scratch_a < 0).any():
            raise GraphError("sizes and scratch must be >= 0 bytes")
        shared_a = None if in_place is None else arr(in_place, 0, np.int64, "in_place")
        if shared_a is not None and (shared_a < 0).any():
            raise GraphError("in_place bytes must be >= 0")
        two_a = None if two_step is None else arr(two_step, False, bool, "two_step")
        over_a = None if takes_over is None else arr(takes_over, -1, np.int64, "takes_over")
        comp_a = None if companion is None else arr(companion, False, bool, "companion")
        for i in [] if comp_a is None else np.flatnonzero(comp_a).tolist():
            if list(flat[ptr[i]:ptr[i + 1]]) != [i - 1]:
                raise GraphError(f"companion node {i} must read node {i - 1} alone")
        if over_a is not None:
            for i in np.flatnonzero(over_a >= 0).tolist():
                u = int(over_a[i])
                if u not in flat[ptr[i]:ptr[i + 1]] or size_a[u] != size_a[i]:
                    raise GraphError(f"takes_over: node {i} may only take over an input of its own size, not node {u}")
        kept_a = None if kept_bytes is None else arr(kept_bytes, 0, np.int64, "kept_bytes")
        if kept_a is not None and ((kept_a < 0).any() or (kept_a > size_a).any()):
            raise GraphError("kept_bytes must lie between 0 and the node's size")
        read_a = None if read_bytes is None else arr(read_bytes, 0, np.int64, "read_bytes")
        if read_a is not None and ((read_a < 0).any() or (read_a > size_a).any()):
            raise GraphError("read_bytes must lie between 0 and the node's size")
        if not np.isfinite(cost_a).all() or (cost_a < 0).any():
            raise GraphError("costs must be finite and >= 0")
        if base_bytes < 0:
            raise GraphError(f"base_bytes must be >= 0, got {base_bytes}")
        if not 0 <= late_base_bytes <= base_bytes:
            raise GraphError(f"late_base_bytes must lie between 0 and base_bytes, got {late_base_bytes}")
        pinned_a = arr(pinned, False, bool, "pinned")
        # A pinned output is never dropped, so recomputing it could only add time.
        recomp_a = arr(recomputable, True, bool, "recomputable") & ~pinned_a
        recomp_a.setflags(write=False)
        transfer_a = None if transfer is None else arr(transfer, 0.0, np.float64, "transfer")
        if transfer_a is not None and (not np.isfinite(transfer_a).all() or (transfer_a < 0).any()):
            raise GraphError("transfer times must be finite and >= 0")
        swap_default = transfer_a is not None
        swap_a = arr(swappable, swap_default, bool, "swappable") & ~pinned_a
        if transfer_a is None:
            swap_a = np.zeros(n, dtype=bool)
        swap_a.setflags(write=False)
        idx = np.asarray(flat, dtype=np.int64)
        ptr.setflags(write=False)
        idx.setflags(write=False)
        parts_t = None if parts is None else _checked_parts(parts, size_a, pinned_a, flat, ptr)
        if parts_t is not None and over_a is not None:
            # one buffer on both sides, as lowering makes them: simulate() and unplanned_memory
            # would count a part-wise takeover differently
            for i in np.flatnonzero(over_a >= 0).tolist():
                if parts_t[i] or parts_t[int(over_a[i])]:
                    raise GraphError(f"takes_over: node {i} and node {int(over_a[i])} must each be one buffer, "
                                     "not parts")
        if parts_t is not None:
            read_a = _read_of_parts(parts_t, size_a if read_a is None else read_a, flat, ptr)
        names_t = tuple(str(x) for x in (names if names is not None else range(n)))
        ids_t = tuple(int(x) for x in (node_ids if node_ids is not None else range(n)))
        if len(names_t) != n or len(ids_t) != n:
            raise GraphError("names and node_ids must have one entry per node")
        return cls(
            name=name,
            names=names_t,
            node_ids=ids_t,
            size=size_a,
            cost=cost_a,
            pred_ptr=ptr,
            pred_idx=idx,
            base_bytes=int(base_bytes),
            scratch=scratch_a,
            pinned=pinned_a,
            recomputable=recomp_a,
            swappable=swap_a,
            transfer=transfer_a,
            copy_overlap=copy_overlap,
            time_unit=time_unit,
            backward=None if backward is None else arr(backward, False, bool, "backward"),
            in_place=shared_a if shared_a is not None and shared_a.any() else None,
            late_base_bytes=int(late_base_bytes),
            kept_bytes=None if kept_a is None or (kept_a == size_a).all() else kept_a,
            read_bytes=None if read_a is None or (read_a == size_a).all() else read_a,
            two_step=two_a if two_a is not None and two_a.any() else None,
            takes_over=over_a if over_a is not None and (over_a >= 0).any() else None,
            companion=comp_a if comp_a is not None and comp_a.any() else None,
            parts=parts_t,
        )

    def with_swap(self, transfer: Sequence[float] | np.ndarray, copy_overlap: bool = True) -> "PlanningProblem":
        """Same problem with a host link: ``transfer[i]`` is the one-way time of node i's output."""
        t = np.asarray(transfer, dtype=np.float64).copy()
        if t.shape != (self.n,) or not np.isfinite(t).all() or (t < 0).any():
            raise GraphError(f"transfer must be {self.n} finite times >= 0")
        t.setflags(write=False)
        swap = (~self.pinned).copy()
        swap.setflags(write=False)
        return dataclasses.replace(self, transfer=t, swappable=swap, copy_overlap=copy_overlap)

    @property
    def can_swap(self) -> bool:
        """Has a host link and some buffer that may move over it?"""
        return self.transfer is not None and bool(self.swappable.any())

    def without_swap(self) -> "PlanningProblem":
        off = np.zeros(self.n, dtype=bool)
        off.setflags(write=False)
        return dataclasses.replace(self, transfer=None, swappable=off)

    # ---- structure ----------------------------------------------------------------------
    @property
    def n(self) -> int:
        return len(self.size)

    @property
    def n_edges(self) -> int:
        return len(self.pred_idx)

    def preds(self, i: int) -> np.ndarray:
        return self.pred_idx[self.pred_ptr[i] : self.pred_ptr[i + 1]]

    @cached_property
    def succ_lists(self) -> tuple[tuple[int, ...], ...]:
        """succ_lists[i] = nodes reading i's output, ascending."""
        acc: list[list[int]] = [[] for _ in range(self.n)]
        for i, ps in enumerate(self.pred_lists):  # Python ints: not a numpy scalar per edge
            for p in ps:
                acc[p].append(i)
        return tuple(tuple(s) for s in acc)

    @cached_property
    def pred_lists(self) -> tuple[tuple[int, ...], ...]:
        # sliced from Python lists, not an int() per numpy element (0.9 s on 26 thousand nodes)
        flat, ptr = self.pred_idx.tolist(), self.pred_ptr.tolist()
        return tuple(tuple(flat[ptr[i]:ptr[i + 1]]) for i in range(self.n))

    @cached_property
    def companion_of(self) -> tuple[int, ...]:
        """Each node's companion (the node right after it that ``companion`` marks), or -1."""
        comp = self.companion
        return tuple(v + 1 if comp is not None and v + 1 < self.n and comp[v + 1] else -1 for v in range(self.n))

    def glued(self, order: Sequence[int]) -> list[int]:
        """``order`` (computes, a node perhaps more than once) with each companion computed right
        after its node's first compute and nowhere else: the runtime makes those bytes with the
        node (an unread output) and holds them to the end. Searches that treat a companion as a
        node of their own may make it anywhere after its node, even by recomputing the node for
        it at the end (a rewritten model held those bytes from the node on: 13 KB over a 116 KB
        budget, stop 48)."""
        if self.companion is None:
            return list(order)
        out: list[int] = []
        seen: set[int] = set()
        for t in order:
            if self.companion[t]:
                continue
            out.append(t)
            if t not in seen and self.companion_of[t] >= 0:
                out.append(self.companion_of[t])
            seen.add(t)
        return out

    @cached_property
    def last_use(self) -> np.ndarray:
        """Last step whose node reads i (i itself if nobody does; n-1 if pinned)."""
        last = np.arange(self.n, dtype=np.int64)
        for i, succ in enumerate(self.succ_lists):
            if succ:
                last[i] = succ[-1]
        last[self.pinned] = self.n - 1
        last.setflags(write=False)
        return last

    # ---- the unplanned run ----------------------------------------------------------------
    @cached_property
    def unplanned_memory(self) -> np.ndarray:
        """Bytes resident at each step with no remat (base and scratch included), as simulate()
        counts the no-remat plan: :attr:`one_buffer_memory`, less each of a node's ``parts`` from
        the step after its last reader on (the runtime frees it there)."""
        if self.parts is None:
            return self.one_buffer_memory
        delta = np.zeros(self.n + 1, dtype=np.int64)
        for u, node_parts in enumerate(self.parts):
            for nbytes, readers in node_parts:
                gone = (readers[-1] if readers else u) + 1  # sorted: the last reader
                delta[gone] -= nbytes
                delta[self.last_use[u] + 1] += nbytes
        mem = self.one_buffer_memory + np.cumsum(delta[: self.n])
        mem.setflags(write=False)
        return mem

    @cached_property
    def one_buffer_memory(self) -> np.ndarray:
        """:attr:`unplanned_memory` with each node's output held as one buffer until its last
        reader (``parts`` left out), as the solvers count it: a node that takes over its input's
        buffer (``takes_over``: the input's only reader, so the input dies at it in this run)
        holds the two as one buffer."""
        mem = self.step_memory.copy()
        if self.takes_over is not None:
            at = np.flatnonzero(self.takes_over >= 0)
            u = self.takes_over[at]
            dies = (self.last_use[u] == at) & ~self.pinned[u]
            mem[at[dies]] -= self.size[u[dies]]
        mem.setflags(write=False)
        return mem

    @cached_property
    def part_inputs(self) -> dict[int, tuple[tuple[int, tuple[int, ...]], ...]]:
        """Per node r reading a node with ``parts``: (that node, the indices of its parts r reads)."""
        acc: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for u, node_parts in enumerate(self.parts or ()):
            by_reader: dict[int, list[int]] = {}
            for k, (_, readers) in enumerate(node_parts):
                for r in readers:
                    by_reader.setdefault(r, []).append(k)
            for r in sorted(by_reader):
                acc.setdefault(r, []).append((u, tuple(by_reader[r])))
        return {r: tuple(v) for r, v in acc.items()}

    @cached_property
    def step_memory(self) -> np.ndarray:
        """:attr:`one_buffer_memory` with a taken-over input counted apart from the node that
        takes it over: what a step holds whichever reads come later (split_greedy's accounting,
        which may keep that input past its reader)."""
        delta = np.zeros(self.n + 1, dtype=np.int64)
        np.add.at(delta, np.arange(self.n), self.size)
        np.add.at(delta, self.last_use + 1, -self.size)
        mem = np.cumsum(delta[: self.n]) + self.scratch + self.base_bytes
        mem.setflags(write=False)
        return mem

    @property
    def unplanned_peak(self) -> int:
        return int(self.unplanned_memory.max()) if self.n else self.base_bytes

    @property
    def one_buffer_peak(self) -> int:
        """The unplanned peak as the solvers count it (:attr:`one_buffer_memory`)."""
        return int(self.one_buffer_memory.max()) if self.n else self.base_bytes

    @property
    def total_cost(self) -> float:
        return float(self.cost.sum())

    @cached_property
    def step_need(self) -> np.ndarray:
        """Least bytes resident while node i runs in any plan: base, its inputs, output, scratch,
        and every pinned output produced before it (those can never be dropped)."""
        pinned_before = np.concatenate([[0], np.cumsum(np.where(self.pinned, self.size, 0))[:-1]])
        need = np.empty(self.n, dtype=np.int64)
        for i in range(self.n):
            preds = self.preds(i)
            # a pinned input is already in pinned_before: count it once
            need[i] = self.size[i] + self.scratch[i] + int(self.size[preds][~self.pinned[preds]].sum())
        need += pinned_before + self.base_bytes
        need.setflags(write=False)
        return need

    @cached_property
    def credit(self) -> np.ndarray:
        """Bytes node i's compute may hold less than ``step_need`` counts: the input buffer its
        output takes over (``takes_over``), 0 elsewhere."""
        out = np.zeros(self.n, dtype=np.int64)
        if self.takes_over is not None:
            at = self.takes_over >= 0
            out[at] = self.size[at]
        out.setflags(write=False)
        return out

    @cached_property
    def shared_bytes(self) -> np.ndarray:
        """Per node, the bytes of its output that may lie in an input's buffer: ``in_place``, at
        least the ``credit`` the problem itself counts."""
        out = self.credit if self.in_place is None else np.maximum(self.in_place, self.credit)
        out.setflags(write=False)
        return out

    @property
    def runtime_exact(self) -> bool:
        """The problem's accounting is what the runtime holds (none of ``in_place``,
        ``late_base_bytes``, ``kept_bytes``, ``read_bytes``, ``two_step``, ``parts``): only then
        does a least peak searched over its own accounting (planner/least.py) bound every runtime
        plan."""
        return (self.in_place is None and self.late_base_bytes == 0 and self.kept_bytes is None
                and self.read_bytes is None and self.two_step is None and self.takes_over is None
                and self.parts is None)

    @cached_property
    def runtime_need(self) -> np.ndarray:
        """``step_need`` less what a runtime may hold less than the problem counts: the output
        bytes that may take over an input's buffer (``in_place``), the base bytes that appear
        only when made (``late_base_bytes``), the bytes of pinned nodes that do not stay
        (``kept_bytes``) and the outputs of an input's node that no reader needs (``read_bytes``;
        an input with ``parts``: those this step does not read, :meth:`_read_by`).
        The floor's per-step bound."""
        need = self.step_need - self.late_base_bytes
        if self.in_place is not None or self.takes_over is not None:
            need = need - self.shared_bytes
        if self.kept_bytes is not None:
            gone = np.where(self.pinned, self.size - self.kept_bytes, 0)
            need = need - np.concatenate([[0], np.cumsum(gone)[:-1]])
        if self.read_bytes is not None:
            unread = np.where(self.pinned, 0, self.size - self.read_bytes)  # pinned inputs: in pinned_before
            need = need - np.array([sum(int(unread[u]) if not self.parts or not self.parts[u]
                                        else int(self.size[u]) - self._read_by(t, u) for u in ps)
                                    for t, ps in enumerate(self.pred_lists)], dtype=np.int64)
        need.setflags(write=False)
        return need

    def _read_by(self, t: int, u: int) -> int:
        """Bytes of the ``parts`` of input u (a node with parts) that step t reads: each is a
        buffer resident while t runs, whatever the others do. ``read_bytes`` holds one value per
        node, the least any reader reads: bit's MaxPool (Y 131072 bytes, Indices 262144, the
        backward reading Indices alone) counted its backward step with Y's bytes, and the floor
        said 66.5% of the unplanned peak where that step alone holds 71.8% (a budget of 70% then
        searched the whole limit and ended "timeout")."""
        return sum(nbytes for nbytes, readers in self.parts[u] if t in readers)

    @cached_property
    def memory_floor(self) -> int:
        """A lower bound on the peak of every plan: the most any single step needs, raised where
        the last input of a step to be computed needs more (:func:`last_input_bound`); with what
        a runtime may hold less (:attr:`runtime_need`) left out, so that it bounds the runtime's
        peak too, not only the problem's."""
        if not self.n:
            return self.base_bytes - self.late_base_bytes
        return max(int(self.runtime_need.max()), self._last_input_floor)

    @cached_property
    def _last_input_floor(self) -> int:
        """:func:`last_input_bound`, less the base bytes a runtime holds only once made."""
        return last_input_bound(self) - self.late_base_bytes

    @cached_property
    def order_free_need(self) -> np.ndarray:
        """:attr:`runtime_need` in every node order, not only this one (the planner may also plan
        in a memory-aware order, planner/reorder.py): of the pinned outputs, only those of node
        i's ancestors are made before i in every order, so only theirs are counted."""
        if not self.pinned.any():
            return self.runtime_need
        kept = self._pinned_kept
        cols = np.flatnonzero(self.pinned)
        need = self.runtime_need - self._pinned_before + self._pinned_ancestors.astype(np.int64) @ kept[cols]
        need.setflags(write=False)
        return need

    @cached_property
    def _pinned_ancestors(self) -> np.ndarray:
        """bool [n, pinned nodes]: the pinned nodes (in node order) each node depends on."""
        cols = np.flatnonzero(self.pinned)
        col = np.full(self.n, -1, dtype=np.int64)
        col[cols] = np.arange(cols.size)
        ancestors = np.zeros((self.n, cols.size), dtype=bool)
        for i in range(self.n):
            for u in self.pred_lists[i]:
                ancestors[i] |= ancestors[u]
                if col[u] >= 0:
                    ancestors[i, col[u]] = True
        ancestors.setflags(write=False)
        return ancestors

    @cached_property
    def _last_pinned_floor(self) -> int:
        """A bound on every plan's peak, in every node order, from the pinned outputs: of any set
        S of them, one is made last, and when it is made (a companion: when its node first runs)
        the others of S and its own pinned ancestors are resident besides what its step needs.
        So min over q in S of (q's step less the pinned outputs, + the kept bytes of S and of
        q's pinned ancestors, less q's own, not made yet) bounds the peak. S starts as every
        pinned output and drops, one at a time, the one that gives that least (the loss, whose
        step holds a few bytes, made last); the highest of these bounds. zoo:mlp's training step:
        343488 bytes with every pinned output in S (the loss made last), 347392 once the loss and
        the head's bias gradient are out (before them the ReduceSum of the first layer's bias
        gradient holds its 4 KiB input with every other gradient resident); its peak is 347520.
        At least :func:`last_pinned_bound` too: what was resident when the others and the last
        one's inputs were made."""
        cols = np.flatnonzero(self.pinned)
        kept = self._pinned_kept[cols]
        # the moments each q may be made at: its own step, and for a companion its node's first
        # compute (that node is not pinned itself); own: the step less the pinned outputs
        moments = [(self.runtime_need[cols] - self._pinned_before[cols], self._pinned_ancestors[cols])]
        if self.companion is not None and self.companion[cols].any():
            glued = self.companion[cols]
            at = np.where(glued, cols - 1, cols)
            own = np.where(glued, self.runtime_need[at] - self._pinned_before[at], np.iinfo(np.int64).min // 4)
            moments.append((own, self._pinned_ancestors[at]))
        in_s = np.ones(cols.size, dtype=bool)
        # per moment and q: the kept bytes of S and of q's pinned ancestors
        held = [np.full(cols.size, int(kept.sum()), dtype=np.int64) for _ in moments]
        best = 0
        while in_s.any():
            f = np.max([own + h - kept for (own, _), h in zip(moments, held)], axis=0)
            f = np.where(in_s, f, np.iinfo(np.int64).max)
            q = int(np.argmin(f))
            best = max(best, int(f[q]))
            in_s[q] = False
            for (_, anc), h in zip(moments, held):
                h -= np.where(anc[:, q], 0, kept[q])  # an ancestor of r stays in r's count
        # and what was resident when q's inputs were made; no deeper than the floor needs
        return max(best, last_pinned_bound(self, enough=self.memory_floor))

    @cached_property
    def _pinned_kept(self) -> np.ndarray:
        """Bytes of each pinned node's output that stay to the end (0 for the others)."""
        kept = self.size if self.kept_bytes is None else self.kept_bytes
        return np.where(self.pinned, kept, 0).astype(np.int64)

    @cached_property
    def _pinned_before(self) -> np.ndarray:
        """Per node, the bytes of the pinned outputs made before it in this order that stay (the
        part of :attr:`runtime_need` that depends on the order)."""
        return np.concatenate([[0], np.cumsum(self._pinned_kept)[:-1]])

    def runtime_need_in(self, order: Sequence[int]) -> np.ndarray:
        """:attr:`runtime_need` of each node (indexed as here) were the nodes run in ``order`` (a
        topological order): of a step's need, only the pinned outputs made before it depend on
        the order (planner.reorder.repaired_order moves them)."""
        at = np.asarray(order, dtype=np.int64)
        made = np.empty(self.n, dtype=np.int64)
        made[at] = np.cumsum(self._pinned_kept[at]) - self._pinned_kept[at]
        return self.runtime_need - self._pinned_before + made

    @cached_property
    def order_free_floor(self) -> int:
        """:attr:`memory_floor` over plans in every node order: :attr:`order_free_need`, and the
        moment the last pinned node is made (every other pinned output resident then, whichever
        node that is). At most :attr:`memory_floor`; on zoo:cnn?batch=2 61% of the unplanned
        peak, where this order's floor says 71% and a memory-aware order's plan peaks at 64%."""
        if not self.pinned.any():
            return self.memory_floor
        lower = max(int(self.order_free_need.max()), self._last_pinned_floor, self._last_input_floor)
        return min(lower, self.memory_floor)

    def budget_for(self, fraction: float) -> int:
        """Moccasin's budget convention: ceil(unplanned peak * fraction), exactly in integers."""
        return share_of(self.unplanned_peak, fraction)

    def summary(self) -> str:
        return f"{self.name}: {self.n} nodes, {self.n_edges} edges, unplanned peak {self.unplanned_peak}"


# ---- Checkmate / Moccasin node-link JSON -------------------------------------------------------
def load_remat_json(path: str | Path) -> PlanningProblem:
    """Read a benchmark graph (see shared/benchmarks/remat/README.md) in Moccasin's order.

    Checkmate graphs use networkx's generation-wise Kahn sort; random layered graphs use the
    order stored in the file. base_bytes and scratch are 0 and nothing is pinned (a sink's
    output lives only during its own step), so the unplanned peak is the README's column.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelImportError(f"{path}: not a JSON graph ({err}); expected networkx node-link JSON") from None
    expected = "expected keys graph, nodes[{id, cost_cpu, cost_ram}] or nodes[{out_cost, duration}], links"
    if not isinstance(data, dict):  # [1, 2] or null crashed on data.get (AttributeError, a traceback)
        raise ModelImportError(f"{path}: not a Checkmate/Moccasin node-link graph (its top level is "
                               f"{_JSON_KINDS.get(type(data), 'a number')}, not an object); {expected}")
    nodes, graph = data.get("nodes"), data.get("graph")
    if not isinstance(graph, (dict, type(None))) or (isinstance(nodes, list) and
                                                     not all(isinstance(nd, dict) for nd in nodes)):
        raise ModelImportError(f"{path}: not a Checkmate/Moccasin node-link graph (a node or its graph entry is "
                               f"not an object); {expected}")
    try:
        return _problem_from_node_link(data, path.stem)
    except (KeyError, TypeError, ValueError) as err:
        raise ModelImportError(
            f"{path}: not a Checkmate/Moccasin node-link graph (missing or bad field {err}); {expected}") from None


#: A JSON value's kind, as an error names it.
_JSON_KINDS = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _problem_from_node_link(data: dict[str, Any], stem: str) -> PlanningProblem:
    graph = data.get("graph", {}) or {}
    nodes = data["nodes"]
    layered = "order" in graph
    keys = [int(nd.get("id", i)) for i, nd in enumerate(nodes)]
    if len(set(keys)) != len(keys):
        raise ValueError("'id' (duplicate node ids)")
    cost_key, ram_key = ("duration", "out_cost") if layered else ("cost_cpu", "cost_ram")
    if not nodes:
        raise ValueError("'nodes' (empty: the graph has no nodes)")

    def number(nd: dict[str, Any], key: str, k: int) -> float:
        value = nd[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"'{key}' (node {k}: {value!r} is not a number)")
        return value

    cost = {k: number(nd, cost_key, k) for k, nd in zip(keys, nodes)}
    ram = {k: int(number(nd, ram_key, k)) for k, nd in zip(keys, nodes)}
    src_key, dst_key = ("0", "1") if layered else ("source", "target")
    succ: dict[int, list[int]] = {k: [] for k in keys}
    for link in data["links"]:
        u, v = int(link[src_key]), int(link[dst_key])
        if u not in succ or v not in succ:
            raise ValueError(f"'links' (edge {u}->{v} names an unknown node)")
        succ[u].append(v)
    order = [int(k) for k in graph["order"]] if layered else _kahn_generations(keys, succ)
    if sorted(order) != sorted(keys):
        raise ValueError("'order' (not a permutation of the nodes)")
    pos = {k: i for i, k in enumerate(order)}
    preds: list[list[int]] = [[] for _ in order]
    for u in keys:
        for v in succ[u]:
            if pos[u] >= pos[v]:
                raise ValueError(f"'order' (edge {u}->{v} goes backwards: the order is not topological)")
            preds[pos[v]].append(pos[u])
    by_key = dict(zip(keys, nodes))
    names = [str(by_key[k].get("name", k)) for k in order]
    backward = [bool(by_key[k].get("backward", False)) for k in order] if not layered else None
    for k in order:
        if ram[k] < 0 or cost[k] < 0:
            raise ValueError(f"'{ram_key}/{cost_key}' (negative value at node {k})")
    return PlanningProblem.build(
        size=[ram[k] for k in order],
        cost=[float(cost[k]) for k in order],
        preds=preds,
        name=str(graph.get("name", stem)),
        names=names,
        node_ids=order,
        backward=backward,
    )


def _kahn_generations(keys: list[int], succ: dict[int, list[int]]) -> list[int]:
    """networkx>=2.6 topological_sort: emit whole zero-in-degree generations in insertion order."""
    indeg = {k: 0 for k in keys}
    for u in keys:
        for v in succ[u]:
            indeg[v] += 1
    gen = [k for k in keys if indeg[k] == 0]
    out: list[int] = []
    while gen:
        nxt = []
        for u in gen:
            for v in succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    nxt.append(v)
        out += gen
        gen = nxt
    if len(out) != len(keys):
        raise ValueError("'links' (the graph has a cycle)")
    return out


def is_remat_json(model: str) -> bool:
    """MODEL names a benchmark JSON graph (rather than ONNX or zoo:)."""
    return str(model).lower().endswith(".json")


def _checked_parts(parts: Sequence[Sequence[tuple[int, Sequence[int]]]], size: np.ndarray, pinned: np.ndarray,
                   flat: list[int], ptr: np.ndarray) -> tuple[tuple[tuple[int, tuple[int, ...]], ...], ...] | None:
    """``PlanningProblem.parts`` checked against the other arrays, buffers with the same readers
    merged; None where no node is left with buffers that die apart."""
    n = len(size)
    if len(parts) != n:
        raise GraphError(f"parts must have {n} entries, got {len(parts)}")
    out: list[tuple[tuple[int, tuple[int, ...]], ...]] = []
    for i, node_parts in enumerate(parts):
        merged: dict[tuple[int, ...], int] = {}
        for nbytes, readers in node_parts:
            rs = tuple(sorted({int(r) for r in readers}))
            if int(nbytes) < 0 or any(not 0 <= r < n or i not in flat[ptr[r]:ptr[r + 1]] for r in rs):
                raise GraphError(f"parts of node {i}: bytes must be >= 0 and readers must read node {i}")
            merged[rs] = merged.get(rs, 0) + int(nbytes)
        if node_parts and sum(merged.values()) != int(size[i]):
            raise GraphError(f"parts of node {i} must sum to its size {int(size[i])}, got {sum(merged.values())}")
        if len(merged) > 1 and pinned[i]:
            raise GraphError(f"parts of node {i}: a pinned node's buffers all stay to the end")
        out.append(tuple((b, rs) for rs, b in sorted(merged.items())) if len(merged) > 1 else ())
    return tuple(out) if any(out) else None


def _read_of_parts(parts: tuple[tuple[tuple[int, tuple[int, ...]], ...], ...], read: np.ndarray, flat: list[int],
                   ptr: np.ndarray) -> np.ndarray:
    """``read`` (``PlanningProblem.read_bytes``) at most, per node with ``parts``, the bytes of the
    parts its least-reading reader reads: the floors count an input with read_bytes, and a reader
    holds only the parts it reads (a problem built with parts and no read_bytes claimed a floor of
    93 bytes, 10 over its unplanned peak: bench/claims_fuzz.py seed 3)."""
    out = read.copy()
    for r in range(len(ptr) - 1):
        for u in flat[ptr[r]:ptr[r + 1]]:
            if parts[u]:
                out[u] = min(out[u], sum(nbytes for nbytes, readers in parts[u] if r in readers))
    out.setflags(write=False)
    return out


def gcd_of(values: Sequence[int]) -> int:
    g = 0
    for v in values:
        g = math.gcd(g, int(v))
    return g or 1


def last_input_bound(problem: PlanningProblem, depth: int = 2, max_set: int = 24) -> int:
    """A lower bound on every plan's peak from the last input computed before each step.

    Every input of step t is resident while t runs. Take the one, q, whose copy t reads was
    computed last: when q ran, the other inputs of t were already resident (their copies t reads
    were made earlier and stay until t), and q's own inputs were resident too. So some q in
    N = inputs(t) has base + |N u inputs(q)| + scratch(q) resident at once, and the same holds
    again for the set N - {q} + inputs(q) that had to be resident when q ran. The least over q,
    ``depth`` levels down, is a bound for every schedule, whatever it recomputes. A swap-in
    restores a buffer without its inputs, so a swappable q counts as needing none; an output that
    may take over an input's buffer (``in_place``) counts without those bytes, an input
    with the bytes its readers read (``read_bytes``), and a ``two_step`` node like a swap-in
    (its two ops need not hold their inputs at once). Pinned outputs
    are left out (step_need counts them). Sets above ``max_set`` buffers are not expanded.
    (RL100 of the remat benchmark: 54.1% of the unplanned peak, where the largest step needs
    43.2%: its 50% budget is infeasible.)
    """
    least = _last_made_search(problem, max_set)
    bound = 0
    for t in range(problem.n):  # t's own compute reads its inputs, swappable or not
        need = frozenset(problem.pred_lists[t])
        if need:
            bound = max(bound, least(need, depth))
    return bound + problem.base_bytes


def last_pinned_bound(problem: PlanningProblem, depth: int = 3, max_set: int = 48,
                      max_work: int | None = 20_000, enough: int | None = None) -> int:
    """A lower bound on every plan's peak, in every node order, from the pinned outputs: all of
    them are resident at the end, so the one made last, q, was made with the others resident,
    and with its own inputs; the set of those (the others and q's inputs) was again resident
    when the last of it was made, and so on, ``depth`` levels down: :func:`last_input_bound`'s
    search from the set of every pinned output (each counted with the bytes that stay,
    ``kept_bytes``). A node computed once only (pinned, or not recomputable) is never the last
    made of a set that holds a node depending on it. Counted as the runtime may hold each step
    (in-place outputs sharing their input's buffer, late base bytes left out), so that it bounds
    what ONNX Runtime runs. 0 where more than ``max_set`` outputs are pinned.

    Searched ``depth`` levels down, then one level deeper at a time while a set was left
    unexpanded and the searches so far took at most ``max_work`` set members (zoo:gpt, 29
    outputs: 0.13 s; a search stopped past 4 times that counts for nothing): each level takes
    the higher of a set's bytes and the least below it, so a deeper search never lowers the
    bound, and any depth is a bound. Where cheap outputs (bias gradients from 64-byte inputs)
    are made last level by level, the step that makes the first layer's weight gradient or its
    bias's ReduceSum with their shared input resident comes only levels further down
    (bench/fuzz_e2e.py seed 7: 12328 bytes at 3 levels, 12520, its peak, at 11). ``max_work``
    None: ``depth`` levels only; ``enough``: no deeper once the bound reaches it."""
    pinned = frozenset(int(v) for v in np.flatnonzero(problem.pinned))
    if not pinned or len(pinned) > max_set:
        return 0
    kept = problem._pinned_kept
    read = problem.size if problem.read_bytes is None else problem.read_bytes
    resident = [min(int(read[v]), int(kept[v])) if problem.pinned[v] else int(read[v]) for v in range(problem.n)]
    once = (~problem.recomputable | problem.pinned) & ~(problem.swappable if problem.can_swap else False)
    later = _later_of(problem, once)
    bound, base = 0, problem.base_bytes - problem.late_base_bytes
    stats = _SearchStats(stop=None if max_work is None else 4 * max_work)
    least = _last_made_search(problem, max_set, resident, later, stats)  # its sets kept, depth to depth
    while True:
        stats.cut = False
        try:
            # the end itself is not counted: a searched step counts an output that shares an
            # input's buffer without its shared bytes, also where that input is pinned (least.py)
            bound = max(bound, least(pinned, depth, held=False))
        except _TooManySets:
            break
        if max_work is None or not stats.cut or stats.work > max_work:
            break
        if enough is not None and bound + base >= enough:
            break
        depth += 1
    return bound + base


@dataclass
class _SearchStats:
    """What :func:`_last_made_search` tells :func:`last_pinned_bound` of its work, so that the
    bound knows whether a deeper search may raise it and when to stop searching."""
    stop: int | None  # past this many set members the search raises _TooManySets (None: never)
    work: int = 0  # the members of the sets searched, each set once
    cut: bool = False  # a set was left unexpanded for the depth


class _TooManySets(Exception):
    """:func:`_last_made_search` took more set members than its ``stats.stop``."""


def _later_of(problem: PlanningProblem, nodes: np.ndarray) -> Callable[[int], frozenset]:
    """For a node of ``nodes`` (bool [n]), the nodes that depend on it (empty for the others);
    each found when first asked for."""
    known: dict[int, frozenset] = {}

    def later(v: int) -> frozenset:
        if not nodes[v]:
            return frozenset()
        if v not in known:
            seen: set[int] = set()
            todo = [int(w) for w in problem.succ_lists[v]]
            while todo:
                w = todo.pop()
                if w not in seen:
                    seen.add(w)
                    todo.extend(int(x) for x in problem.succ_lists[w])
            known[v] = frozenset(seen)
        return known[v]

    return later


def _last_made_search(problem: PlanningProblem, max_set: int, resident: Sequence[int] | None = None,
                      later: Callable[[int], frozenset] | None = None,
                      stats: _SearchStats | None = None) -> Callable[..., int]:
    """:func:`last_input_bound`'s search: ``least(need, d)``, the least bytes (base excluded) some
    moment before the set ``need`` is all resident must hold, ``d`` levels down. ``resident``:
    each buffer's bytes while resident (default: what its readers read); ``later``: for the nodes
    computed once only, the nodes that depend on them (such a node is never the last made of a
    set holding one of those); ``stats``: the search's work and cuts counted there, and past its
    ``stop`` the search raises :class:`_TooManySets`."""
    size = [int(x) for x in problem.size]
    swappable = problem.swappable if problem.transfer is not None else np.zeros(problem.n, bool)
    # a swap-in restores q without its inputs or scratch; a two-step node's ops need not hold
    # their inputs together: like a swap-in, not expanded
    atomic = swappable if problem.two_step is None else swappable | problem.two_step
    scratch = [0 if atomic[v] else int(x) for v, x in enumerate(problem.scratch)]
    # q's output may share the buffer of an input read last at q (``PlanningProblem.in_place``)
    shared = [0 if atomic[v] else int(x) for v, x in enumerate(problem.shared_bytes)]
    # an input is resident with at least the bytes its readers read; q, while it runs, with all
    read = size if problem.read_bytes is None else [int(x) for x in problem.read_bytes]
    if resident is not None:
        read = list(resident)
    inputs = [frozenset(ps) for ps in problem.pred_lists]  # already ints
    preds = [frozenset() if atomic[v] else inputs[v] for v in range(problem.n)]
    # q's bytes while it runs beyond the set it reads: its output, scratch, less what it shares
    extra = [size[q] + scratch[q] - shared[q] for q in range(problem.n)]
    memo: dict[tuple[frozenset, int, bool], int] = {}
    cut_in: set[tuple[frozenset, int, bool]] = set()  # of memo's: those that left a set unexpanded

    def least(need: frozenset, d: int, held: bool = True, here: int | None = None) -> int:
        """Least bytes (base excluded) some moment before ``need`` is all resident must hold
        (``held`` false: before; the moment ``need`` is resident is not counted itself).
        ``here``: ``need``'s bytes where the caller has them (expand does; summing each set
        again took a sixth of this search on zoo:resnet)."""
        if here is None:
            here = sum(read[v] for v in need)
        if d <= 0 or not 0 < len(need) <= max_set:
            if stats is not None and d <= 0 and need:
                stats.cut = True
            return here  # not expanded: the set itself
        key = (need, d, held)
        if key in memo:
            if stats is not None and key in cut_in:
                stats.cut = True
            return memo[key]
        if stats is None:
            memo[key] = expand(need, d, held, here)
            return memo[key]
        stats.work += len(need)
        if stats.stop is not None and stats.work > stats.stop:
            raise _TooManySets
        outer, stats.cut = stats.cut, False
        memo[key] = expand(need, d, held, here)
        if stats.cut:
            cut_in.add(key)
        stats.cut = stats.cut or outer
        return memo[key]

    def expand(need: frozenset, d: int, held: bool, here: int) -> int:
        # each q's set when it ran (need, less q, with q's inputs) and its bytes then, by those
        # bytes: the least over q of max(at_q, least(set, d - 1)), where no q whose at_q reaches
        # the least so far can lower it (nor any after it)
        steps = []
        for q in need:
            if later is not None and not later(q).isdisjoint(need):
                continue  # made before a node of the set that depends on it
            new = preds[q] - need
            rest = here + sum(read[v] for v in new) - read[q]  # q is not its own input: a DAG
            steps.append((rest + extra[q], q, rest, new))
        if d == 1:  # the sets below are not expanded: least(set, 0) is its bytes, ``rest``
            if stats is not None and (len(need) > 1 or any(new for *_, new in steps)):
                stats.cut = True
            best = min(max(at_q, rest) for at_q, _, rest, _ in steps)
            return max(here, best) if held else best
        steps.sort(key=lambda s: s[:2])
        best = None
        for at_q, q, rest, new in steps:
            if best is not None and at_q >= best:
                break
            val = max(at_q, least((need - {q}) | new, d - 1, here=rest))
            if best is None or val < best:
                best = val
        return max(here, best) if held else best

    return least
