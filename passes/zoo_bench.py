"""The zoo benchmark: plan a training graph at a budget, emit the planned model and verify it in ORT
against the unplanned one (what ``memplan plan --emit`` then ``memplan verify`` do). One row per
(model, budget), JSON-ready; ``memplan bench zoo`` and ``python bench/verify_zoo.py`` print them."""
from __future__ import annotations

import math
from typing import Any, Callable

import onnx

from passes.onnx_export import export_model
from passes.plan_model import plan_graph
from passes.verify import verify_models
from planner.cpsat import PlannerOptions
from planner.graph import Graph
from planner.liveness import MemoryModel, analyze
from planner.report import markdown_table, text_table

#: The default models of ``memplan bench zoo``: each zoo model at its own (small) default size.
SMALL = ("mlp", "cnn", "resnet", "unet", "gpt")


def verify_row(name: str, graph: Graph, ref: onnx.ModelProto, feeds: dict, pct: float, strategy: str,
               node_time: Callable, options: PlannerOptions) -> dict[str, Any]:
    """Plan ``graph`` (a training graph; ``ref`` its export, ``feeds`` its inputs) at ``pct`` % of its
    unplanned peak; where a plan fits, emit and verify it: the measured peak (ORT's allocator bytes
    counted), whether every output equals the reference's, and predicted vs measured step time."""
    unplanned = analyze(graph).peak_bytes
    budget = math.ceil(unplanned * pct / 100)
    pm = plan_graph(graph, budget, strategy=strategy, node_time=node_time, time_unit="s", options=options)
    row: dict[str, Any] = {"model": name, "budget_pct": pct, "budget_bytes": budget, "unplanned_bytes": unplanned,
                           "status": pm.result.status, "least_bytes": pm.result.least_bytes}
    if not pm.ok:
        return row
    base = pm.planned.base_bytes
    lv = analyze(pm.planned, model=MemoryModel(host_copies_resident=True))
    predicted = lv.dynamic_peak
    rep = verify_models(ref, export_model(pm.planned), feeds, predicted_planned_peak=predicted,
                        predicted_allocator_peak=lv.allocator_dynamic_peak, base_bytes=base,
                        predicted_time_overhead=pm.result.added_time / max(pm.result.compute_time, 1e-300))
    # predicted: the liveness peak (constants included); ratio: measured over the prediction the
    # measurement compares with (compared_bytes: ORT's allocator share of it where the allocator's
    # bytes are counted, as verify's measured/predicted), so measured / predicted is not ratio
    row.update(predicted=base + predicted, measured=base + rep.planned_peak,
               compared_bytes=base + rep.compared_prediction, peak_over_budget=(base + predicted) / budget,
               ratio=rep.planned_peak / max(1, rep.compared_prediction), measured_by=rep.method,
               rss_ratio=rep.planned_rss_peak / max(1, predicted),
               over_budget=(base + rep.planned_peak) / budget, equal=rep.outputs_equal,
               default_ratio=_over(rep.planned_default_peak, predicted),
               no_arena_ratio=_over(rep.planned_default_no_arena_peak, predicted),
               pred_time=rep.predicted_time_overhead,
               meas_time=rep.planned_seconds / rep.reference_seconds - 1,
               seconds=[rep.reference_seconds, rep.planned_seconds])
    return row


def _over(peak: int | None, predicted: int) -> float | None:
    """``peak`` over the prediction; None where verify could not measure it (ORT refused the planned
    model under its default session options: verify's ``default_options_error``)."""
    return None if peak is None else peak / max(1, predicted)


HEADER = ("model", "budget", "status", "peak/budget", "added % pred", "equal", "meas/pred", "meas/budget",
          "added % meas")


def cells(r: dict[str, Any]) -> tuple[str, ...]:
    if "equal" not in r:
        least = "" if r.get("least_bytes") is None else f" (least {100 * r['least_bytes'] / r['unplanned_bytes']:.1f}%)"
        return (r["model"], f"{r['budget_pct']:g}%", r["status"] + least) + ("-",) * (len(HEADER) - 3)
    return (r["model"], f"{r['budget_pct']:g}%", r["status"], f"{r['peak_over_budget']:.3f}",
            f"{100 * r['pred_time']:.1f}", str(r["equal"]), f"{r['ratio']:.3f}", f"{r['over_budget']:.3f}",
            f"{100 * r['meas_time']:.1f}")


def table(rows: list[dict[str, Any]]) -> str:
    return text_table(HEADER, [cells(r) for r in rows])


def markdown(rows: list[dict[str, Any]]) -> str:
    return markdown_table(HEADER, [cells(r) for r in rows])
