"""Upgrade a forward graph to a newer default-domain opset when its gradient needs one.

Some gradients need operators that older opsets lack: MaxPool with overlapping windows and Gather
scatter-add their incoming gradient (ScatterElements / ScatterND with reduction='add', opset 16),
--add-loss cross-entropy appends SoftmaxCrossEntropyLoss (opset 12), and gradients are written in
opset-11 operators at the oldest (passes/autodiff.py ``MIN_OPSET``). Models exported years ago (the
ONNX model zoo's opset 7-12 files) would otherwise be refused. autodiff catches the rule's
:class:`OpsetTooOldError` and calls :func:`upgrade_opset`: the graph goes out as a ModelProto,
through onnx's version converter (each operator's adapter between versions; weights and most names
are kept, though an adapter that replaces a node, as Upsample's, renames its output) and back
through the importer, with the same initializers frozen. The training graph and
every model memplan writes from it then carry the new opset.

onnx's adapters into opset 11 turn Upsample and Resize-10 into a Resize-11 with the default
half-pixel coordinates, where the old ops used asymmetric ones (linear mode: up to 0.7 off on
unit-normal inputs); :func:`_legacy_resize` restores them. Since the adapters from before opset 11
rewrite attributes into inputs and modes, such an upgrade is also checked: both models run in ONNX
Runtime on the same seeded inputs and must agree (:func:`_check_same`); a difference is refused.
A forward above ``CHECK_MAX_BYTES`` is not run for it (a warning says so).
"""
from __future__ import annotations

import logging
from typing import Callable, TypeVar

import numpy as np
import onnx
from onnx import helper, numpy_helper, version_converter

from passes.onnx_export import export_model, fill_weights, initializer_values
from passes import onnx_import
from passes.onnx_import import ASIDE, import_model
from planner.errors import ModelImportError, OpsetTooOldError, first_line
from planner.graph import Graph, TensorKind
from planner.liveness import analyze
from planner.units import format_bytes

log = logging.getLogger(__name__)
T = TypeVar("T")

#: The newest opset a gradient asks for: one conversion serves every rule (a model at opset 9 with
#: --add-loss cross-entropy and an overlapping MaxPool needed 11, 12 and 16, three conversions).
TARGET = 16
#: Opset upgrades one build may make (each goes to the newest opset a rule asks for at once, so one
#: does today).
MAX_UPGRADES = 2
#: Upgrades from below this opset are run in ORT against the original (the legacy adapters).
CHECK_BELOW = 11
#: Forward runs that hold more than this (by the liveness model) are not made for the check.
CHECK_MAX_BYTES = 2 * 2**30
#: How close the upgraded model's outputs must be, relative to each output's largest magnitude.
RTOL = 1e-5


def with_upgrades(forward: Graph, build: Callable[[Graph], T]) -> tuple[Graph, T]:
    """(forward, build(forward)), with ``forward`` upgraded first (:func:`upgrade_opset`) each time
    ``build`` raises OpsetTooOldError, up to ``MAX_UPGRADES`` times: the training step's build, and
    `memplan train`'s --add-loss, which needs the upgraded forward itself."""
    for _ in range(MAX_UPGRADES):
        try:
            return forward, build(forward)
        except OpsetTooOldError as err:
            forward = upgrade_opset(forward, err)
    return forward, build(forward)


def upgrade_opset(graph: Graph, err: OpsetTooOldError) -> Graph:
    """``graph`` converted to default-domain opset max(``err.opset``, ``TARGET``); a
    ModelImportError naming ``err``'s reason when onnx's converter cannot convert it or changes
    what it computes."""
    have = graph.opsets.get("", 0)  # the importer files ai.onnx under ""
    if have >= err.opset:  # a rule asked for what the graph has: not an upgrade's job
        raise err
    target = max(err.opset, TARGET)
    # the converter serializes the model (protobuf's 2 GB): large weights stay in the graph, the
    # model holds their dims only, and the import reads them from the graph
    proto = export_model(graph, inline=False, weights=False)
    aside = initializer_values(graph)
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            if aside[t.name].nbytes > onnx_import.ASIDE_BYTES:
                t.external_data.add(key="location", value=ASIDE)
            else:  # small tensors stay, for adapters that read them (shapes, scales)
                t.CopyFrom(numpy_helper.from_array(np.asarray(aside[t.name]), t.name))

    def refuse(why: str) -> ModelImportError:
        return ModelImportError(
            f"{err.reason}; onnx's version converter could not upgrade {graph.name!r} from opset {have} to "
            f"{target} ({why}): export the model with opset >= {err.opset}")

    training_bn = _drop_saved_statistics(proto) if have < 14 <= target else set()
    try:
        converted = version_converter.convert_version(proto, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare RuntimeErrors and onnx errors
        first = first_line(exc)
        # "/project/onnx/version_converter/BaseConverter.h:66: adapter_lookup: Assertion `false` failed: No Adapter For X"
        raise refuse(first.rpartition("failed: ")[2] or first) from None
    _set_training_mode(converted, training_bn)
    if have < CHECK_BELOW:
        _legacy_resize(converted)
        peak = analyze(graph).peak_bytes
        if peak > CHECK_MAX_BYTES:  # --max-batch probes large batches: no forward run of GiBs each
            log.warning("the upgrade of %r is not checked in ORT: its forward peaks at %s (over %s); plan it "
                        "at a smaller --dim once to check it", graph.name, format_bytes(peak),
                        format_bytes(CHECK_MAX_BYTES))
        elif differs := _check_same(_with_weights(proto, aside), _with_weights(converted, aside)):
            raise refuse(differs)
    frozen = {t.name for t in graph.tensors if t.kind is TensorKind.FROZEN}
    out = import_model(converted, frozen=frozen, aside=aside)
    log.warning("upgraded %r from opset %d to %d with onnx's version converter: %s", graph.name, have,
                target, err.reason)
    return out


def _with_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` with the weights set aside put back (by name), for ORT to run."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return fill_weights(out, weights)


def _drop_saved_statistics(proto: onnx.ModelProto) -> set[str]:
    """Before opset 14 a BatchNormalization trains (batch statistics) when it has its statistics
    outputs, and onnx's adapter to 14 refuses the saved mean and variance (outputs 4 and 5, gone from
    14) and drops the mode: the outputs 4 and 5 that nothing reads are dropped here (in place), and
    the first outputs of the training nodes returned for :func:`_set_training_mode`. An opset-13
    model with a training BatchNormalization was refused where its gradients needed opset 16
    (fuzz_e2e --ops more --opset 13, seed 605)."""
    read = {i for n in proto.graph.node for i in n.input} | {o.name for o in proto.graph.output}
    training = set()
    for node in proto.graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx") or len(node.output) < 2:
            continue
        training.add(node.output[0])
        while len(node.output) > 3 and node.output[-1] not in read:
            node.output.pop()
    return training


def _set_training_mode(proto: onnx.ModelProto, training: set[str]) -> None:
    """training_mode=1 on the BatchNormalization nodes (by first output) that trained by their outputs."""
    for node in proto.graph.node:
        if node.op_type == "BatchNormalization" and node.output[0] in training:
            kept = [a for a in node.attribute if a.name != "training_mode"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("training_mode", 1)])


def _legacy_resize(new: onnx.ModelProto) -> None:
    """Give each Resize of ``new``, upgraded from below opset 11, the old ops' asymmetric coordinates
    (and, for nearest, their floor of x / scale); in place. Below opset 11 a model can only hold
    Upsample and Resize-10, so every Resize without a coordinate mode came from one of them (the
    converter renames their outputs, so they cannot be matched by name)."""
    for node in new.graph.node:
        if node.op_type != "Resize" or node.domain not in ("", "ai.onnx"):
            continue
        set_attrs = {a.name for a in node.attribute}
        if "coordinate_transformation_mode" not in set_attrs:
            node.attribute.append(helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
            if "nearest_mode" not in set_attrs:
                node.attribute.append(helper.make_attribute("nearest_mode", "floor"))


def _check_same(old: onnx.ModelProto, new: onnx.ModelProto) -> str | None:
    """Why ``new`` computes something else than ``old`` on seeded inputs in ORT (None when they
    agree, or when ORT cannot run ``old`` at all: then there is nothing to compare against). Float
    outputs may differ by ``RTOL`` of their largest magnitude, others not at all."""
    from models.feeds import example_feeds
    from passes.gradcheck import ort_session
    from passes.verify import compare_outputs

    feeds = example_feeds(old)
    try:
        want = ort_session(old, quiet=True).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - ORT's errors have no common base
        log.info("not checked against the original, which ORT cannot run: %s", first_line(exc))
        return None
    try:
        got = ort_session(new, quiet=True).run(None, feeds)
    except Exception as exc:  # noqa: BLE001
        return f"ONNX Runtime cannot run the upgraded model: {first_line(exc)}"
    for out, a, b in zip(old.graph.output, want, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return f"output {out.name!r} changes shape, {list(a.shape)} to {list(b.shape)}"
        floating = a.dtype.kind == "f"
        scale = float(np.abs(a).max()) if floating and a.size else 0.0
        (check,) = compare_outputs({out.name: a}, {out.name: b}, rtol=0.0, atol=RTOL * scale)
        if not check.ok:
            of = f" of {scale:.3g}" if floating else ""
            return f"output {out.name!r} differs by {check.max_abs_diff:.3g}{of} on seeded inputs"
    return None
