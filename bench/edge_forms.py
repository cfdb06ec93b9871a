"""Which ordering-edge form does ORT keep, at what node cost? (passes/ordering.py chose by this.)

    python bench/edge_forms.py [--model zoo:resnet?batch=32] [--budget 70]

Plans MODEL once, then rewrites and pins the same schedule with each edge form. Per form: nodes of
the planned and the pinned graph; per ORT optimisation level, how many edges of the pinned model
ORT dropped (the gate is no longer an ancestor of the gated node's output in the model ORT wrote
after optimising; a gated output that a fusion renamed is counted as "fused", not as dropped);
and the pinned model's warm peak over the plan's prediction under three session configs.
Every form but the first gates a Reshape or Expand through its constant target shape; the first
puts a view in front of it as main did (ORT_ENABLE_BASIC fuses that view into the Reshape: 1 edge
of zoo:resnet?batch=32 and 5 of zoo:gpt?batch=64 lost) and so also hides no target shape from ORT's
memory reuse (passes/pin_order.py).
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
import passes.pin_order as pin_module  # noqa: E402
import passes.rewrite as rewrite_module  # noqa: E402
from passes.autodiff import training_graph  # noqa: E402
from passes.onnx_export import export_model  # noqa: E402
from passes.onnx_import import import_model  # noqa: E402
from passes.ordering import OrderingEdges, constant_shape_input  # noqa: E402
from passes.plan_model import plan_graph  # noqa: E402
from passes.verify import ORT_DEFAULT, PLANNED, measure_peak  # noqa: E402
from planner.cpsat import PlannerOptions  # noqa: E402
from planner.graph import fresh_name  # noqa: E402
from planner.liveness import MemoryModel, analyze  # noqa: E402


class _ScalarZero(OrderingEdges):
    """``shape + Size(G) * 0``: a scalar zero per gate, the target per (gate, shape), a view per edge."""
    per_edge_target = False
    vector_zero = False

    def __init__(self, *args):
        super().__init__(*args)
        self._scalar: dict[int, int] = {}

    def view(self, x, gate, stem):
        t = self.b.tensor(x)
        target = self.gated_shape(gate, t.shape, stem)
        return self._add("Reshape", [x, target], f"{stem}_x", t.dtype, t.shape)

    def gated_shape(self, gate, shape, stem):
        key = (gate, shape)
        if self.per_edge_target or key not in self._shapes:
            self._shapes[key] = self._add("Add", [self._const(shape), self._zero(gate, stem)], f"{stem}_target",
                                          "int64", (len(shape),))
        return self._shapes[key]

    def _zero(self, gate, stem):
        if gate not in self._scalar:
            size = self._add("Size", [gate], f"{stem}_size", "int64", ())
            if self.vector_zero:  # main's rewrite.py: Reshape(Size, [1]) * [0]
                vec = self._add("Reshape", [size, self._const_array(np.array([1]))], f"{stem}_vec", "int64", (1,))
                self._scalar[gate] = self._add("Mul", [vec, self._const_array(np.array([0]))], f"{stem}_zero",
                                               "int64", (1,))
            else:
                self._scalar[gate] = self._add("Mul", [size, self._const_array(np.array(0))], f"{stem}_zero",
                                               "int64", ())
        return self._scalar[gate]

    def _const_array(self, value: np.ndarray) -> int:
        key = ("array", value.shape, tuple(value.ravel().tolist()))
        if key not in self._consts:
            name = fresh_name(f"memplan__bench_const{len(self._consts)}", self.taken)
            self._consts[key] = self.b.initializer(name, value.astype(np.int64), trainable=False)
        return self._consts[key]


class _MainRewrite(_ScalarZero):
    vector_zero = True


class _MainPin(_ScalarZero):
    per_edge_target = True


class _VectorZeros(OrderingEdges):
    """As chosen, but ``s + Size(G) * zeros(len(s))``: the vector of zeros is shared with the views."""

    def gated_shape(self, gate, shape, stem):
        key = (gate, shape)
        if key not in self._shapes:
            self._shapes[key] = self._add("Add", [self._const(shape), self._zeros(gate, (len(shape),), stem)],
                                          f"{stem}_target", "int64", (len(shape),))
        return self._shapes[key]


FORMS = {
    "chosen, view in front of Reshape too": None,  # main's placement: ORT fuses the view away
    "Reshape(Size,[1])*[0]+s (main rewrite)": _MainRewrite,
    "Size*0+s per edge (main pin)": _MainPin,
    "Size*0+s per (gate,s)": _ScalarZero,
    "Size*zeros(r) view, Size*0+s (chosen)": OrderingEdges,
    "Size*zeros(r) view, Size*zeros(r)+s": _VectorZeros,
}
LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL")
CONFIGS = {"+ opt basic": replace(PLANNED, optimization="basic"), "+ opt all": replace(PLANNED, optimization="all"),
           "default, arena off": replace(ORT_DEFAULT, arena=False)}


def edges_of(model: onnx.ModelProto) -> list[tuple[str, str, list[str]]]:
    """(gate tensor, tensor the gated node reads, its outputs) for every ordering edge of a model."""
    readers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    found = []
    for n in model.graph.node:
        if n.op_type != "Size" or not ("__order" in n.name or "__pin" in n.name):
            continue
        # walk Size -> (Reshape) -> Mul -> (Add) -> the Reshape/Expand/view that carries the edge -> its reader
        frontier, seen = [n.output[0]], set()
        while frontier:
            t = frontier.pop()
            for r in readers.get(t, []):
                if r.name in seen:
                    continue
                seen.add(r.name)
                if "__order" in r.name or "__pin" in r.name:
                    frontier.extend(r.output)
                else:
                    found.append((n.input[0], t, [o for o in r.output if o]))
    return found


def dropped(model: onnx.ModelProto, level: str) -> tuple[int, int, int]:
    """(edges, dropped by ORT at ``level``, fused: neither the edge tensor nor a gated output is left).

    An edge is kept when the node that now reads the edge tensor, or else the gated node's output,
    still depends on the gate."""
    import onnxruntime as ort

    edges = edges_of(model)
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        so.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        opt = onnx.load(so.optimized_model_filepath)
    producer = {o: n for n in opt.graph.node for o in n.output}

    def ancestors(t: str) -> set[str]:
        seen, stack = set(), [t]
        while stack:
            u = stack.pop()
            if u in seen or u not in producer:
                continue
            seen.add(u)
            stack.extend(i for i in producer[u].input if i)
        return seen

    read = {i for n in opt.graph.node for i in n.input}
    lost = fused = 0
    for gate, edge, outs in edges:
        live = [o for o in outs if o in producer]
        if edge in read and edge in producer:
            lost += gate not in ancestors(edge)
        elif not live:
            fused += 1
        elif gate not in ancestors(live[0]):
            lost += 1
    return len(edges), lost, fused


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="zoo:resnet?batch=32")
    ap.add_argument("--budget", type=float, default=70)
    ap.add_argument("--time-limit", type=float, default=30)
    args = ap.parse_args()
    graph = training_graph(import_model(args.model))
    budget = math.ceil(analyze(graph).peak_bytes * args.budget / 100)
    pm = plan_graph(graph, budget, options=PlannerOptions(time_limit=args.time_limit, workers=1, seed=0))
    if not pm.ok:
        sys.exit(f"no plan: {pm.result.note}")
    feeds = models.example_feeds(export_model(graph), seed=0)
    print(f"{args.model} at {args.budget:g}%")
    print(f"{'form':40s} {'planned':>7s} {'pinned':>6s}  dropped/fused of edges per level "
          f"(disable basic extended all)  peak/pred: " + ", ".join(CONFIGS))
    for label, cls in FORMS.items():
        rewrite_module.OrderingEdges = pin_module.OrderingEdges = cls or OrderingEdges
        if cls is None:  # no gating through target shapes (and so no shape hiding either)
            rewrite_module.constant_shape_input = pin_module.constant_shape_input = lambda graph, node: None
        try:
            planned = rewrite_module.apply_schedule(graph, pm.events)
            pinned = pin_module.pin_order(planned)
        finally:
            rewrite_module.OrderingEdges = pin_module.OrderingEdges = OrderingEdges
            rewrite_module.constant_shape_input = pin_module.constant_shape_input = constant_shape_input
        model = export_model(pinned, value_info=False)
        counts = [dropped(model, level) for level in LEVELS]
        predicted = analyze(planned, model=MemoryModel(host_copies_resident=True)).dynamic_peak
        peaks = [measure_peak(model, feeds, session=cfg, repeats=1).peak_bytes / predicted for cfg in CONFIGS.values()]
        print(f"{label:40s} {len(planned.nodes):7d} {len(pinned.nodes):6d}  edges {counts[0][0]}: "
              + " ".join(f"{lost}/{fused}" for _, lost, fused in counts) + "  "
              + " ".join(f"{p:.3f}" for p in peaks), flush=True)


if __name__ == "__main__":
    main()

