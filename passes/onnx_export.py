"""memplan Graph -> ONNX ModelProto, nodes in the Graph's (planned) order.

Post: every tensor has value_info (so ORT and readers need no shape inference); the IR version is
the least the opsets need (every ORT that knows those opsets reads it); models over 2 GB keep their
weights in an external data file beside the model, written from the Graph's arrays without a
ModelProto of them (``write_model``). Files are written atomically.

ORT runs the file in file order only if it inlines nothing (planner/liveness.py, "run order"): a
node of ``ORT_INLINED_OPS`` is written as its ONNX function body, in place, its nodes named
``<node>/<k>_<op>`` and its intermediate tensors ``<node>/<name>``.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx.inliner
from onnx import helper, numpy_helper, shape_inference

from passes.mem_pattern import mark_mem_pattern_off
from passes.onnx_import import (DTYPE_TO_ONNX, GRAPH_FIELD, INITIALIZER_FIELD, MAPPABLE, ONNX_TO_DTYPE, ORT_ONLY_OPS,
                                RAW_DATA_FIELD, SHAPES_KEY, field_head, is_stub)
from planner.errors import GraphError, ModelImportError, first_line
from planner.fileio import atomic_write, write_mode, write_target
from planner.graph import INTERNAL_ATTR_PREFIX, NO_TENSOR, Graph, Tensor, TensorKind, fresh_name, gc_paused
from planner.units import format_bytes

log = logging.getLogger(__name__)

#: Protobuf's hard limit; above it weights go to external data.
PROTO_LIMIT = 2**31 - 1
#: The most one TensorProto can hold in memory (protobuf's message limit; a 2.2 GB weight raised a
#: DecodeError traceback): the model file is fine with external data, the tensor object is not.
TENSOR_LIMIT = 2**31 - 1 - 2**16
#: Initializers over this many bytes go to the data file when a model does (onnx's own threshold).
EXTERNAL_MIN_BYTES = 1024
#: Their offsets in it are multiples of this (the largest allocation granularity, Windows'): ORT can
#: map such a tensor from the file rather than copy it.
ALIGNMENT = 64 * 1024
#: Dtypes whose bytes in a file are the array's own (little-endian, element after element), as
#: import maps them and ``write_model`` streams them; others (strings, packed 2- and 4-bit types)
#: stay in the model.
STREAMED = frozenset(ONNX_TO_DTYPE[t] for t in MAPPABLE)
#: Bytes written to the data file at a time.
CHUNK_BYTES = 64 << 20
#: Default-domain ops ORT's CPU EP has no kernel for (measured on 1.31 by profiling node names): it
#: inlines their function body at session load and numbers the body's nodes after all others, so
#: PRIORITY_BASED runs the body late, not where the file puts the node. We write the body ourselves.
ORT_INLINED_OPS = frozenset({
    "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "HardSwish", "Mish", "Swish", "CastLike",
    "GroupNormalization",
})


def tensor_value_info(t: Tensor, types: dict[tuple[str, tuple[int, ...]], onnx.TypeProto] | None = None
                      ) -> onnx.ValueInfoProto:
    """The ValueInfoProto of one tensor of a Graph (name, element type, static shape), as
    ``helper.make_tensor_value_info`` makes it. ``types``: (dtype, shape) -> TypeProto made so far,
    shared by the calls of one export (a planned model's 200k tensors have a few hundred types)."""
    if types is None:
        return helper.make_tensor_value_info(t.name, DTYPE_TO_ONNX[t.dtype], list(t.shape))
    key = (t.dtype, tuple(t.shape))
    kind = types.get(key)
    if kind is None:
        kind = types[key] = helper.make_tensor_type_proto(DTYPE_TO_ONNX[t.dtype], list(t.shape))
    info = onnx.ValueInfoProto()
    info.name = t.name
    info.type.CopyFrom(kind)
    return info


#: Inputs (op -> positions) whose values set the op's output shape: where the graph computes one (an
#: ordering edge's ``Size(G) * 0``, passes/ordering.py; a recompute sink's gated starts,
#: passes/rewrite.py), onnx infers the shape only once it is folded.
SHAPE_VALUE_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Slice": (1, 2, 3, 4), "Tile": (1,), "Pad": (1,),
}


def hidden_shapes(graph: Graph, io: set[int]) -> dict[str, list]:
    """Name -> [dtype, shape] of each output that a file without static shapes leaves out and onnx
    cannot infer: those of an op outside the ONNX domain but ORT's own (a com.microsoft FusedMatMul),
    and those of an op that reads a computed tensor at a ``SHAPE_VALUE_INPUTS`` position, known
    only by folding it, which ORT does not do under the planned session options. Without them memplan
    could not read its own pinned file as ORT runs it (``memplan verify``, import_model(fold=False));
    a static value_info would show ORT the size (passes/pin_order.py), the metadata does not
    (onnx_import reads it)."""
    def unknown(node) -> bool:
        if node.domain not in ("", "ai.onnx"):
            return node.op_type not in ORT_ONLY_OPS
        return any(pos < len(node.inputs) and node.inputs[pos] != NO_TENSOR and node.inputs[pos] not in graph.values
                   for pos in SHAPE_VALUE_INPUTS.get(node.op_type, ()))
    return {t.name: [t.dtype, list(t.shape)] for node in graph.nodes if unknown(node)
            for t in (graph.tensors[o] for o in node.outputs if o != NO_TENSOR and o not in io)}


def attribute_proto(name: str, value):
    """An AttributeProto from a Node's attribute value (numpy scalars and tensors included)."""
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, np.generic):
        value = value.item()
    return helper.make_attribute(name, value)


def in_place_shapes(graph: Graph) -> list[onnx.ValueInfoProto]:
    """Symbolic value_info for a file written without static shapes: each in-place op's input and
    output (planner.liveness.IN_PLACE_OPS, chains joined) get one fresh set of named dims.

    ORT runs an op in place only where it knows input and output have the same size, as
    planner/liveness.py counts it; hidden shapes stopped that (ScatterElements copied its data:
    zoo:cnn?batch=32 pinned, 1.11x the plan; Sigmoid and Tanh: a pinned MLP 1.31x, zoo:mlp 1.27x,
    under the planned session options; fuzzed, stop 49). Equal names say "same size"; being
    fresh, they match no other tensor, so ORT's memory reuse still has no size to pair unrelated
    buffers by (a static shape on ScatterElements' data let ORT hand one scatter's freed buffer to a
    later one and hold it idle: 1.18x)."""
    from planner.liveness import IN_PLACE_OPS

    io = set(graph.inputs) | set(graph.outputs)
    group: dict[int, int] = {}  # tensor -> representative

    def find(t: int) -> int:
        while group.get(t, t) != t:
            t = group[t]
        return t

    for node in graph.nodes:
        pos = IN_PLACE_OPS.get(node.op_type)
        if pos is None or node.domain not in ("", "ai.onnx") or pos >= len(node.inputs) or not node.outputs:
            continue
        a, b = node.inputs[pos], node.outputs[0]
        if NO_TENSOR in (a, b) or a in io or b in io or graph.tensors[a].producer == NO_TENSOR \
                or graph.tensors[a].shape != graph.tensors[b].shape:
            continue
        group.setdefault(a, a)
        group.setdefault(b, b)
        group[find(b)] = find(a)
    names: dict[int, str] = {}
    out = []
    for t in sorted(group):
        root = find(t)
        stem = names.setdefault(root, f"memplan_s{len(names)}")
        x = graph.tensors[t]
        out.append(helper.make_tensor_value_info(x.name, DTYPE_TO_ONNX[x.dtype],
                                                 [f"{stem}_{k}" for k in range(len(x.shape))]))
    return out


def export_model(graph: Graph, producer: str = "memplan", metadata: dict[str, str] | None = None,
                 value_info: bool = True, mem_pattern: bool = True, inline: bool = True,
                 weights: bool = True, overridable: Sequence[str] = ()) -> onnx.ModelProto:
    """Build a ModelProto from a Graph (no checker run; see ``check_model``).

    ``metadata`` becomes the model's metadata_props (memplan records how a planned model was made).
    ``value_info=False`` writes shapes only for graph inputs, outputs and ORT's own ops, so ORT infers
    the rest; behind an ordering edge (passes/pin_order.py) it cannot, and then its memory reuse (on
    by default) has no static size to match: that reuse keeps a freed buffer until a later tensor of
    the same size takes it, +20% peak on zoo:gpt?batch=64 at 70%.
    Even then each in-place op's input and output get one symbolic shape (``in_place_shapes``).
    ``mem_pattern=False`` adds passes/mem_pattern.py's marker input, which switches ORT's memory
    pattern off in every session (under ORT's defaults its block lands beside the arena's first-run
    chunks: 2.2x the plan on zoo:gpt?batch=64 at 70%, 0.97x without it).
    ``inline=False`` writes the ops of ``ORT_INLINED_OPS`` as they are, not as their function bodies
    (for a model memplan reads back, not one ORT runs).
    ``weights=False`` leaves the bytes of every initializer over ``EXTERNAL_MIN_BYTES`` out: such a
    tensor is marked external with no location yet (``write_model`` writes them).
    ``overridable``: names of initializers that are graph inputs too (``onnx_import.overridable_initializers``
    of the source model), written after the graph's own inputs; names the graph has no initializer of
    are skipped.
    """
    with gc_paused():  # a few protos per node, no cycles: planner.graph.gc_paused
        return _export_model(graph, producer, metadata, value_info, mem_pattern, inline, weights, overridable)


def _export_model(graph: Graph, producer: str, metadata: dict[str, str] | None, value_info: bool,
                  mem_pattern: bool, inline: bool, weights: bool, overridable: Sequence[str]) -> onnx.ModelProto:
    name = lambda tid: "" if tid == NO_TENSOR else graph.tensors[tid].name  # noqa: E731
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(graph.opsets.items())]
    taken = graph.names()
    types: dict[tuple[str, tuple[int, ...]], onnx.TypeProto] = {}
    nodes, body_info = [], []
    for node in graph.nodes:
        n = helper.make_node(
            node.op_type,
            [name(t) for t in node.inputs],
            [name(t) for t in node.outputs],
            name=node.name,
            domain=node.domain or None,
        )
        n.attribute.extend(attribute_proto(k, v) for k, v in sorted(node.attrs.items())
                           if not k.startswith(INTERNAL_ATTR_PREFIX))
        if inline and node.op_type in ORT_INLINED_OPS and node.domain in ("", "ai.onnx"):
            io_info = [tensor_value_info(graph.tensors[t], types) for t in (*node.inputs, *node.outputs) if t != NO_TENSOR]
            body, info = function_body(n, io_info, opsets, taken)
            nodes.extend(body)
            body_info.extend(info)
        else:
            nodes.append(n)
    too_big = next((t for t in graph.initializers() if t.nbytes > TENSOR_LIMIT), None)
    if weights and too_big is not None:
        raise ModelImportError(
            f"initializer {too_big.name!r} holds {format_bytes(too_big.nbytes)}, over the {format_bytes(TENSOR_LIMIT)} "
            "one ONNX tensor can hold in memory (protobuf); memplan writes such a model (--emit) with its weights "
            "in a data file beside it, but cannot hold it whole")
    io = set(graph.inputs) | set(graph.outputs)
    shapes = [tensor_value_info(t, types) for t in graph.tensors if t.producer != NO_TENSOR and t.id not in io and (
        value_info or graph.nodes[t.producer].op_type in ORT_ONLY_OPS)]
    if value_info:
        shapes += body_info
    else:
        static = {v.name for v in shapes}
        shapes += [vi for vi in in_place_shapes(graph) if vi.name not in static]
    g = helper.make_graph(
        nodes,
        graph.name,
        [tensor_value_info(graph.tensors[t], types) for t in graph.inputs] + [
            tensor_value_info(graph.tensors[graph.by_name[x]], types) for x in dict.fromkeys(overridable)
            if x in graph.by_name and graph.tensors[graph.by_name[x]].kind in (TensorKind.TRAINABLE, TensorKind.FROZEN)],
        [tensor_value_info(graph.tensors[t], types) for t in graph.outputs],
        value_info=shapes,
    )
    model = helper.make_model(g, opset_imports=opsets, producer_name=producer)
    # weights straight into the model, one at a time: a list of them, make_graph's copy and
    # make_model's copy would each hold all of them at once
    for t in graph.initializers():
        if not weights and t.nbytes > EXTERNAL_MIN_BYTES and t.dtype in STREAMED:
            model.graph.initializer.add(name=t.name, data_type=DTYPE_TO_ONNX[t.dtype], dims=t.shape,
                                        data_location=onnx.TensorProto.EXTERNAL)
        else:
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(graph.values[t.id]), t.name))
    model.ir_version = ir_version_for(opsets)
    metadata = dict(metadata or {})
    if not value_info and (hidden := hidden_shapes(graph, io)):
        metadata[SHAPES_KEY] = json.dumps(hidden, sort_keys=True)
    for key, value in sorted(metadata.items()):
        model.metadata_props.add(key=key, value=value)
    if not mem_pattern:
        mark_mem_pattern_off(model)  # the model is ours: no copy of its weights
    return model


def fill_weights(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The stubs in ``model`` (``onnx_import.is_stub``) given their bytes from ``values``, by name (in
    place): for a model ORT runs that keeps only some of its weights (``params_as_inputs`` takes
    the rest out), or one the version converter saw without them."""
    for t in model.graph.initializer:
        if is_stub(t):
            t.CopyFrom(numpy_helper.from_array(np.asarray(values[t.name]), t.name))
    return model


def initializer_values(graph: Graph) -> dict[str, np.ndarray]:
    """The graph's initializer values by name (what ``fill_weights`` and ``import_model``'s ``aside`` take)."""
    return {t.name: graph.values[t.id] for t in graph.initializers()}


def function_body(
    node: onnx.NodeProto, io_info: list[onnx.ValueInfoProto], opsets: list[onnx.OperatorSetIdProto], taken: set[str]
) -> tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto]]:
    """``node`` as its ONNX function body (nested functions of ``ORT_INLINED_OPS`` and of
    ``node``'s own op too) and the value_info of the body's intermediate tensors. New names are
    added to ``taken``.

    onnx's inliner binds the attributes and builds context-dependent bodies from the input types;
    a one-node model keeps that cheap whatever the size of the graph.
    """
    known = {vi.name: vi for vi in io_info}
    inputs = [known[x] for x in dict.fromkeys(node.input) if x]
    outputs = [known[y] for y in node.output if y]
    # an optional input left out before a given one (Attention's attn_mask before past_key) is
    # named "": onnx's inliner asks every input for its type, that one too, and its body builder
    # reads it as absent; any type will do
    absent = [helper.make_tensor_value_info("", onnx.TensorProto.FLOAT, [])] if "" in node.input else []
    single = helper.make_model(helper.make_graph([node], "body", inputs, outputs, value_info=absent),
                               opset_imports=opsets)
    single.ir_version = ir_version_for(opsets)
    try:
        inlined = onnx.inliner.inline_selected_functions(
            single, [("", op) for op in sorted(ORT_INLINED_OPS | {node.op_type})], inline_schema_functions=True)
        inferred = shape_inference.infer_shapes(inlined, strict_mode=True)
        onnx.checker.check_model(inferred)
    # RuntimeError: the inliner's own checks (C++ assertions)
    except (onnx.checker.ValidationError, shape_inference.InferenceError, RuntimeError) as err:
        log.warning("node %r (%s) kept as one node (onnx could not write its function body; ORT runs it late): %s",
                    node.name, node.op_type, first_line(err))
        return [node], []
    boundary = set(known) | {""}
    renames: dict[str, str] = {}
    for n in inlined.graph.node:
        for t in n.output:
            if t not in boundary and t not in renames:
                renames[t] = fresh_name(f"{node.name}/{t}", taken)
    body = []
    for k, n in enumerate(inlined.graph.node):
        b = onnx.NodeProto()
        b.CopyFrom(n)
        b.name = fresh_name(f"{node.name}/{k}_{n.op_type}", taken)
        del b.input[:], b.output[:]
        b.input.extend(renames.get(x, x) for x in n.input)
        b.output.extend(renames.get(y, y) for y in n.output)
        body.append(b)
    info = []
    for vi in inferred.graph.value_info:
        if vi.name in renames:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(vi)
            copy.name = renames[vi.name]
            info.append(copy)
    return body, info


def ir_version_for(opsets) -> int:
    """The least IR version these opsets need: readable by every ORT that implements them."""
    try:
        return max(helper.find_min_ir_version_for(list(opsets), ignore_unknown=True), 7)
    except (TypeError, ValueError):
        return 8


def check_model(model: onnx.ModelProto | str, full: bool = True) -> None:
    """onnx.checker, skipping ORT-only ops (MemcpyToHost/FromHost) that it does not know. A file
    (a path) is checked with its external data, which a proto over 2 GB cannot be. A model the
    checker refuses is a GraphError of one line (memplan wrote it: a bug to report)."""
    try:
        _check_model(model, full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        raise GraphError(f"onnx's checker refuses the model memplan built ({first_line(err)}); this is a memplan bug: "
                         "please report it with the input model") from err


def _check_model(model: onnx.ModelProto | str, full: bool) -> None:
    if isinstance(model, str):
        onnx.checker.check_model(model, full_check=full)
        return
    if any(n.op_type in ORT_ONLY_OPS for n in model.graph.node):
        stripped = onnx.ModelProto()
        stripped.CopyFrom(model)
        keep = [n for n in stripped.graph.node if n.op_type not in ORT_ONLY_OPS]
        del stripped.graph.node[:]
        stripped.graph.node.extend(keep)
        onnx.checker.check_model(stripped, full_check=False)
        return
    onnx.checker.check_model(model, full_check=full)


def write_model(graph: Graph, path: str | os.PathLike, check: Callable[[str], None] | None = None,
                **export: Any) -> None:
    """Export ``graph`` (``export_model``'s options) and write it atomically; ``check(file)`` runs on
    the written file before it takes ``path`` (raising leaves nothing behind). A model over
    protobuf's 2 GB keeps its weights in ``<file>.data`` beside it, written straight from the
    graph's arrays (a weight mapped from its source file goes from file to file a chunk at a time):
    no ModelProto ever holds them (a 2.2 GB model took 9.7 GB to write through one), and a single
    tensor over 2 GB, which no TensorProto can hold, is written too."""
    proto = export_model(graph, weights=False, **export)
    stubs = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    values = initializer_values(graph)
    inside = proto.ByteSize() + sum(values[t.name].nbytes + 32 for t in stubs) < PROTO_LIMIT
    path = write_target(path)
    data_name = path.name + ".data"
    with tempfile.TemporaryDirectory(dir=path.parent or ".") as tmp:
        moves = []
        tmp_model = Path(tmp) / path.name
        if inside:
            with open(tmp_model, "wb") as fh:
                _write_inline(fh, proto, values)
        else:
            tmp_data = Path(tmp) / data_name
            with open(tmp_data, "wb") as fh:
                for t in stubs:
                    offset = -(-fh.tell() // ALIGNMENT) * ALIGNMENT
                    fh.write(b"\0" * (offset - fh.tell()))
                    length = _write_array(fh, values[t.name])
                    for key, value in (("location", data_name), ("offset", offset), ("length", length)):
                        t.external_data.add(key=key, value=str(value))
            moves.append((tmp_data, path.parent / data_name))
            tmp_model.write_bytes(proto.SerializeToString())
        del proto
        if check is not None:
            check(str(tmp_model))
        _move_into_place(moves + [(tmp_model, path)])


def _write_inline(fh, proto: onnx.ModelProto, values: dict[str, np.ndarray]) -> None:
    """Write ``proto`` whole into one file, its initializers' bytes streamed from ``values``.

    Protobuf merges a message field that occurs twice and appends to its repeated fields, so the
    model less its initializers, followed by one ``ModelProto{graph{initializer: t}}`` per
    initializer, parses as the model itself (same initializers, same order). A stub's piece is
    framed by hand (lengths are known up front) and its bytes go from the array to the file a
    chunk at a time: no TensorProto holds them (a 1.97 GB embedding took 5.7 GB to write through
    ``numpy_helper.from_array`` and one serialization)."""
    pieces = []
    for t in proto.graph.initializer:
        piece = onnx.TensorProto()
        piece.CopyFrom(t)
        pieces.append(piece)
    del proto.graph.initializer[:]
    fh.write(proto.SerializeToString())
    for t in pieces:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            fh.write(onnx.ModelProto(graph=onnx.GraphProto(initializer=[t])).SerializeToString())
            continue
        t.ClearField("data_location")
        arr = np.asarray(values[t.name])
        head = t.SerializeToString()  # name, dims, data_type
        raw = field_head(RAW_DATA_FIELD, arr.nbytes)
        tensor = field_head(INITIALIZER_FIELD, len(head) + len(raw) + arr.nbytes)
        fh.write(field_head(GRAPH_FIELD, len(tensor) + len(head) + len(raw) + arr.nbytes) + tensor + head + raw)
        _write_array(fh, arr)


def _write_array(fh, value) -> int:
    """Write an array's bytes, little-endian, a chunk at a time (no copy of a contiguous array)."""
    arr = np.asarray(value)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    for start in range(0, flat.size, CHUNK_BYTES):
        fh.write(memoryview(flat[start:start + CHUNK_BYTES]))
    return int(flat.size)


def _move_into_place(moves: list[tuple[Path, Path]]) -> None:
    # as atomic_write: a file replaced keeps its mode, a new one gets what open() would give
    for made, target in moves:
        os.chmod(made, write_mode(target))
        os.replace(made, target)


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write a ModelProto atomically; weights go to ``<file>.data`` beside it when over 2 GB. Then
    onnx converts the ModelProto given in place (its tensors point at the data file): a caller
    that still needs it passes a copy. A Graph is written with ``write_model``, without a proto
    of its weights."""
    path = write_target(path)
    if model.ByteSize() < PROTO_LIMIT:
        atomic_write(path, model.SerializeToString())
        return
    data_name = path.name + ".data"
    with tempfile.TemporaryDirectory(dir=path.parent or ".") as tmp:
        tmp_model = Path(tmp) / path.name
        onnx.save_model(model, str(tmp_model), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=EXTERNAL_MIN_BYTES)
        _move_into_place([(Path(tmp) / data_name, path.parent / data_name), (tmp_model, path)])
