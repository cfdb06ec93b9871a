"""Upgrade a forward graph to a newer default-domain opset when its gradient needs one.

Some gradients need operators that older opsets lack: MaxPool with overlapping windows and Gather
scatter-add their incoming gradient (ScatterElements / ScatterND with reduction='add', opset 16).
Models exported years ago (the ONNX model zoo's opset 7-12 files) would otherwise be refused.
autodiff catches the rule's :class:`OpsetTooOldError` and calls :func:`upgrade_opset`: the graph
goes out as a ModelProto, through onnx's version converter (each operator's adapter between
versions; names and weights are kept) and back through the importer, with the same initializers
frozen. The training graph and every model memplan writes from it then carry the new opset.
"""
from __future__ import annotations

import logging

from onnx import version_converter

from passes.onnx_export import export_model
from passes.onnx_import import import_model
from planner.errors import ModelImportError, OpsetTooOldError
from planner.graph import Graph, TensorKind

log = logging.getLogger(__name__)


def upgrade_opset(graph: Graph, err: OpsetTooOldError) -> Graph:
    """``graph`` converted to default-domain opset ``err.opset``; a ModelImportError naming
    ``err``'s reason when onnx's converter cannot convert it."""
    have = graph.opsets.get("", graph.opsets.get("ai.onnx", 0))
    if have >= err.opset:  # a rule asked for what the graph has: not an upgrade's job
        raise err
    proto = export_model(graph, inline=False)
    try:
        converted = version_converter.convert_version(proto, err.opset)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors and onnx errors
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelImportError(
            f"{err.reason}; onnx's version converter could not upgrade {graph.name!r} from opset {have} to "
            f"{err.opset} ({detail}): export the model with opset >= {err.opset}"
        ) from None
    frozen = {t.name for t in graph.tensors if t.kind is TensorKind.FROZEN}
    out = import_model(converted, frozen=frozen)
    log.warning("upgraded %r from opset %d to %d with onnx's version converter: %s", graph.name, have,
                err.opset, err.reason)
    return out
