"""passes/rewrite.py's rewriter, made fast (per-event lookups done once, no cyclic GC while it
runs), writes the same graph as before: each graph below is rewritten by it and by the rewriter as
it was (``_Reference``: its event loop, kept here verbatim) under random plans with recomputes,
frees, swaps, computations nobody reads and bad events."""
from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from passes import rewrite
from passes.autodiff import training_graph
from passes.onnx_export import export_model
from passes.onnx_import import import_model
from passes.rewrite import NO_TENSOR, OPTIONAL_OUTPUTS, PlanMismatchError, apply_schedule
from planner.graph import Graph, GraphBuilder, Node, TensorKind


class _Reference(rewrite._Rewriter):
    """The rewriter before it was made fast (main a89b9b4), on the same helpers."""

    def _reads(self, schedule: Sequence[Mapping[str, object]],
               dead: frozenset[int] = frozenset()) -> dict[int, set[int]]:
        """For each emitted compute or swap-in event: the tensors some later emitted event reads
        from it.

        A computation is emitted when a graph output, a swap-out or another emitted computation reads
        it (walking the schedule backwards, as reads only go forwards), or when no graph output
        depends on its node at all. A computation read only by computations that are not emitted
        is not emitted either: ORT would keep its unread outputs to the end of the run. So is a
        swap-in nobody emitted reads (the plan moves a node's outputs as one buffer; a reader may
        need only some of them). ``dead``: swap-out events to take as frees (none of their
        swap-ins is emitted), so that they read nothing.
        """
        live: dict[int, int] = {}  # tensor -> index of the compute or swap-in event whose copy is current
        sources: dict[int, list[tuple[int, int]]] = {}  # compute event -> (producer event, tensor) it reads
        used: dict[int, set[int]] = {}
        outputs = self.g.output_set
        for i, ev in enumerate(schedule):
            op = ev.get("op")
            if op == "compute" and ev.get("node") in self.node_by_name:
                node = self.node_by_name[ev["node"]]  # type: ignore[index]
                sources[i] = [(live[t], t) for t in node.inputs if t in live]
                for t in node.outputs:
                    if t != NO_TENSOR and not (t in outputs and t in live):  # a graph output: its first copy
                        live[t] = i
            elif op in ("free", "swap_out"):
                t = self.g.by_name.get(ev.get("tensor"))  # type: ignore[arg-type]
                if t in live:
                    if op == "swap_out" and i not in dead:
                        used.setdefault(live[t], set()).add(t)
                    del live[t]
            elif op == "swap_in":
                t = self.g.by_name.get(ev.get("tensor"))  # type: ignore[arg-type]
                if t is not None:
                    live[t] = i
        for t in self.g.outputs:
            if t in live:
                used.setdefault(live[t], set()).add(t)
        needed_nodes = self._live_nodes()
        for j in sorted(sources, reverse=True):
            node = self.node_by_name[schedule[j]["node"]]  # type: ignore[index]
            if j in used or node.id not in needed_nodes:
                used.setdefault(j, set())
                for i, t in sources[j]:
                    used.setdefault(i, set()).add(t)
        return used

    def run(self, schedule: Sequence[Mapping[str, object]]) -> Graph:
        self._copy_constants()
        dead = self._dead_swap_outs(schedule, used := self._reads(schedule))
        if dead:
            used = self._reads(schedule, dead)  # the events to emit, and what is read from each
        # outputs some computation's copy is read from: any other copy left unread would dangle
        self.wanted_outputs = {t for outs in used.values() for t in outs} - set(self.g.outputs)
        for k, event in enumerate(schedule):
            op = event.get("op")
            if op == "compute":
                node = self._node(event, k)
                if k not in used:
                    # computed, then dropped before anything emitted read it: ORT would keep
                    # its unread outputs to the end of the run, so this computation is not emitted
                    for t in node.inputs:
                        if t != NO_TENSOR and t not in self.skipped:
                            self._read(t, node)
                    self.computed.setdefault(node.id, 0)
                    for t in node.outputs:
                        if t != NO_TENSOR and not self._bound(t):
                            self.current[t] = None
                            self.skipped.add(t)
                    continue
                self._compute(node, used.get(k, set()))
            elif op == "free":
                self._free(self._tensor(event, k))
            elif op == "swap_out":
                if k in dead:  # nothing reads it back: a free
                    self._free(tid := self._tensor(event, k))
                    self.freed_swaps.add(tid)
                else:
                    self._swap_out(self._tensor(event, k))
            elif op == "swap_in":
                tid = self._tensor(event, k)
                if k in used:
                    self._swap_in(tid)
                elif tid not in self.swapped and tid not in self.freed_swaps:
                    raise PlanMismatchError(f"the plan swaps {self.g.tensors[tid].name!r} in before swapping it out")
                else:  # nobody reads this copy: ORT would keep it to the end of the run
                    self.current[tid] = None
                    self.skipped.add(tid)
            else:
                raise PlanMismatchError(f"schedule event {k} has unknown op {op!r}")
        missing = [n.name for n in self.g.nodes if n.id not in self.computed]
        if missing:
            raise PlanMismatchError(
                f"the plan never computes node {missing[0]!r} ({len(missing)} nodes missing); "
                "it is another model's plan, or an edited one"
            )
        for tid in self.g.outputs:
            self.b.output(self._read(tid, "graph output"))
        return self.b.build()

    def _dead_swap_outs(self, schedule: Sequence[Mapping[str, object]], used: Mapping[int, set[int]]) -> frozenset[int]:
        """Swap-out events none of whose swap-ins (up to the tensor's next swap-out) is read."""
        dead: set[int] = set()
        out_at: dict[int, int] = {}  # tensor -> its last swap-out event whose swap-ins are all unread so far
        for k, ev in enumerate(schedule):
            op = ev.get("op")
            if op not in ("swap_out", "swap_in"):
                continue
            t = self.g.by_name.get(ev.get("tensor"))  # type: ignore[arg-type]
            if op == "swap_out":
                out_at[t] = k
                dead.add(k)
            elif k in used and t in out_at:
                dead.discard(out_at[t])
        return frozenset(dead)

    def _compute(self, node: Node, read: set[int] | frozenset[int] = frozenset()) -> None:
        k = self.computed.get(node.id, 0)
        inputs = [NO_TENSOR if t == NO_TENSOR else self._read(t, node) for t in node.inputs]
        if self.sink_tail is not None:  # as the rewriter since the last sink's output is read on
            inputs = self._read_sink_tail(node, inputs)
        if k == 0:
            name, suffix = node.name, ""
            key = self._cse_key(node.id, inputs)
        else:
            name, suffix = f"{node.name}__rc{k}", f"__rc{k}"
            # as the rewriter since recomputes after one gate got edges CSE could not merge
            inputs, key = self._distinct(node, inputs, f"{name}__order")
        # a copy nobody reads of an output the plan reads elsewhere would stay to the end of the run;
        # so would a recompute's copy of a graph output (_bound)
        again = {t for t in node.outputs if t != NO_TENSOR and self._bound(t)}
        unread = {t for t in node.outputs if t != NO_TENSOR and t not in read and t in self.wanted_outputs} | again
        droppable = OPTIONAL_OUTPUTS.get(node.op_type, ())
        outs = [None if t == NO_TENSOR or (slot in droppable and t in unread) else
                (self.g.tensors[t].name + suffix, self.g.tensors[t].dtype, self.g.tensors[t].shape)
                for slot, t in enumerate(node.outputs)]
        new = self.b.node(node.op_type, inputs, outs, name=name, domain=node.domain, attrs=node.attrs)
        self._origin[self.b.nodes_added - 1] = node.id
        for old, t in zip(node.outputs, new):
            if old != NO_TENSOR and old not in again:
                self.current[old] = t if t != NO_TENSOR else None
                self.skipped.discard(old)
                if t == NO_TENSOR:
                    self.skipped.add(old)
        for slot, (old, t) in enumerate(zip(node.outputs, new)):
            if t != NO_TENSOR and old in unread:
                # a required output nobody reads: hand it to a tiny reader so ORT frees it
                self._sink(t)
        if self.dynamic[node.id] and k == 0:
            self.last_output = next((t for t in new if t != NO_TENSOR), self.last_output)
        self.emitted.add(key)
        self.computed[node.id] = k + 1



def random_plan(g: Graph, rng: random.Random, bad: bool) -> list[dict]:
    """A schedule of ``g``: nodes in file order, each input made resident first (swapped back in or
    its producer recomputed), random frees and swap-outs after each step, some computations nobody
    reads; with ``bad``, one event somewhere is broken (unknown name or op, a free of a weight)."""
    resident = {t.id for t in g.tensors if t.kind is not TensorKind.ACTIVATION}
    host: set[int] = set()
    swapped: set[int] = set()
    events: list[dict] = []

    def ensure(t: int) -> None:
        if t == NO_TENSOR or t in resident:
            return
        if t in host and rng.random() < 0.7:
            events.append({"op": "swap_in", "tensor": g.tensors[t].name})
            resident.add(t)
            return
        compute(g.tensors[t].producer)

    def compute(n: int) -> None:
        for t in g.nodes[n].inputs:
            ensure(t)
        events.append({"op": "compute", "node": g.nodes[n].name})
        resident.update(t for t in g.nodes[n].outputs if t != NO_TENSOR)

    for n in range(len(g.nodes)):
        compute(n)
        if rng.random() < 0.1:  # again, at once: a copy nobody may read
            compute(n)
        for t in sorted(resident):
            if g.tensors[t].kind is TensorKind.ACTIVATION and rng.random() < 0.25:
                swap = t not in swapped and rng.random() < 0.3  # once: the reference refused a second (GraphError)
                swapped.update([t] if swap else [])
                events.append({"op": "swap_out" if swap else "free", "tensor": g.tensors[t].name})
                resident.discard(t)
                (host.add if swap else host.discard)(t)
    for t in g.outputs:
        ensure(t)
    if bad:
        k = rng.randrange(len(events) + 1)
        events.insert(k, rng.choice([{"op": "compute", "node": "nope"}, {"op": "free", "tensor": "nope"},
                                     {"op": "jump"}, {"op": "swap_in", "tensor": "nope"},
                                     {"op": "free", "tensor": g.tensors[g.initializers()[0].id].name},
                                     {"op": "swap_in", "tensor": g.tensors[g.outputs[0]].name}]))
    return events


def rewritten(cls, g: Graph, events: list[dict]):
    try:
        return export_model(cls(g).run(events)).SerializeToString()
    except PlanMismatchError as err:
        return f"PlanMismatchError: {err}"


def outputs_beside_graph_outputs() -> Graph:
    """Nodes with one output a graph output and another read on: their recomputes' copies of the
    graph outputs are left out (LayerNormalization's optional Mean) or given a sink (Split)."""
    b = GraphBuilder()
    x = b.input("x", "float32", (4, 8))
    w = b.initializer("w", np.ones(8, np.float32))
    y, mean, _ = b.node("LayerNormalization", [x, w], [("y", "float32", (4, 8)), ("mean", "float32", (4, 1)),
                                                       ("inv", "float32", (4, 1))], name="LN")
    h1, h2 = b.node("Split", [y], [("h1", "float32", (2, 8)), ("h2", "float32", (2, 8))], name="S")
    (e,) = b.node("Exp", [h2], [("e", "float32", (2, 8))], name="E")
    (z,) = b.node("Mul", [e, e], [("z", "float32", (2, 8))], name="M")
    for t in (mean, h1, z):
        b.output(t)
    return b.build()


@pytest.mark.parametrize("spec", ["zoo:gpt?layers=1&batch=2", "zoo:cnn?batch=2", "hand"])
def test_fast_rewriter_writes_what_the_reference_wrote(spec):
    g = outputs_beside_graph_outputs() if spec == "hand" else training_graph(import_model(spec))
    rng = random.Random(7)
    emitted = errors = 0
    for trial in range(40 if spec == "hand" else 12):
        events = random_plan(g, rng, bad=trial % 4 == 3)
        new = apply_schedule(g, events) if trial == 0 else None  # the public entry point too
        got, want = rewritten(rewrite._Rewriter, g, events), rewritten(_Reference, g, events)
        assert got == want, (spec, trial)
        if new is not None:
            assert export_model(new).SerializeToString() == want
        emitted += isinstance(want, bytes)
        errors += isinstance(want, str)
    assert emitted >= 6 and errors >= 1


def test_export_writes_value_info_as_onnx_helper_does_with_the_gc_paused(monkeypatch):
    """export_model shares one TypeProto per (dtype, shape) among its value_infos and pauses the
    cyclic GC (0.9 and 0.7 of 3.4 CPU seconds on the lstm fixture's planned model, 185k nodes):
    the bytes are helper.make_tensor_value_info's, and the GC is back on after."""
    import gc

    from passes import onnx_export
    from planner.graph import Tensor

    types: dict = {}
    for dtype, shape in [("float32", ()), ("float32", (3,)), ("int64", (0, 2)), ("float32", (3,)), ("bool", (1, 1))]:
        t = Tensor(0, f"t{len(types)}", dtype, shape, TensorKind.ACTIVATION, 0)
        assert (onnx_export.tensor_value_info(t, types).SerializeToString()
                == onnx_export.tensor_value_info(t).SerializeToString())
    assert len(types) == 4
    g = outputs_beside_graph_outputs()
    want = export_model(g).SerializeToString()
    seen = []
    plain = onnx_export.tensor_value_info
    monkeypatch.setattr(onnx_export, "tensor_value_info",
                        lambda t, types=None: seen.append((gc.isenabled(), types is not None)) or plain(t))
    assert export_model(g).SerializeToString() == want
    assert seen and set(seen) == {(False, True)} and gc.isenabled()
