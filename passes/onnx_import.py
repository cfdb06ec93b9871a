"""ONNX file -> memplan Graph.

Pre: a path to an ONNX model (external data only from the model's own folder), a ModelProto, or a
``zoo:NAME?opt=v`` spec. Symbolic dims are bound with ``dims`` (``--dim NAME=VALUE``). Weights in
a data file are not loaded: the Graph's arrays are read-only views of the file
(``initializer_value``), so a model's size costs import no memory of its own.
Post: a validated Graph with static shapes and exact byte sizes for every tensor, nodes in a
topological order (file order where the file is already sorted); shape-computation subgraphs
(Shape/Size/Gather/Concat/... on static values) and Constant nodes folded into FROZEN initializers;
float initializers TRAINABLE except BatchNormalization running mean/var and, in files written by
torch's dynamo exporter (torch.export metadata), its buffers and constants (``TorchExportRoles``);
there an initializer folded as the transpose of a tied parameter is recomputed from it. Cast
round trips ORT takes out before it runs a model are taken out too (``drop_cast_round_trips``).

Every failure raises ModelImportError with one line naming the file, node or dim and the fix.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Collection, Iterable, Iterator, Mapping, NamedTuple

import numpy as np
import onnx
import onnx.inliner  # a submodule `import onnx` does not load: model-local functions are inlined at import
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper, shape_inference

from planner.errors import ModelImportError, PlannerError, UnknownDimError, first_line
from planner.graph import (
    DTYPE_BITS,
    FLOAT_DTYPES,
    NO_TENSOR,
    PADDING_IDX,
    Graph,
    GraphBuilder,
    TensorKind,
    fresh_name,
)

log = logging.getLogger(__name__)

#: ONNX element type enum -> IR dtype name.
ONNX_TO_DTYPE: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32", onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT64: "uint64", onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT16: "uint16", onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.STRING: "string", onnx.TensorProto.COMPLEX64: "complex64",
    onnx.TensorProto.COMPLEX128: "complex128",
}
for _name, _dtype in (
    ("FLOAT8E4M3FN", "float8e4m3fn"), ("FLOAT8E4M3FNUZ", "float8e4m3fnuz"), ("FLOAT8E5M2", "float8e5m2"),
    ("FLOAT8E5M2FNUZ", "float8e5m2fnuz"), ("INT4", "int4"), ("UINT4", "uint4"), ("FLOAT4E2M1", "float4e2m1"),
    ("FLOAT8E8M0", "float8e8m0"), ("INT2", "int2"), ("UINT2", "uint2"),
):
    if hasattr(onnx.TensorProto, _name):
        ONNX_TO_DTYPE[getattr(onnx.TensorProto, _name)] = _dtype
DTYPE_TO_ONNX: dict[str, int] = {v: k for k, v in ONNX_TO_DTYPE.items()}
assert set(ONNX_TO_DTYPE.values()) <= set(DTYPE_BITS)

#: Ops folded when all their inputs are known constants (shape arithmetic and friends).
FOLDABLE = frozenset({
    "Shape", "Size", "Gather", "GatherElements", "Concat", "Unsqueeze", "Squeeze", "Range", "ConstantOfShape",
    "Equal", "Where", "Cast", "Reshape", "Slice", "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Not", "And",
    "Or", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "ReduceProd", "ReduceSum", "ReduceMax",
    "ReduceMin", "Identity", "Expand", "Tile", "Max", "Min", "Sqrt", "Pow", "Floor", "Ceil", "Transpose",
    "Trilu", "Split", "Flatten", "CastLike", "Constant", "Sign", "Clip", "NonZero", "Erf", "Exp", "Log",
    "Reciprocal", "Relu", "Softmax", "Sigmoid", "Tanh", "OneHot",
})
#: Folded results larger than this stay in the graph: shape arithmetic is small, while a big tensor
#: computed from constants (ConstantOfShape zeros, Expand, Tile) is runtime memory in ORT, which
#: does not fold it with the planned session options (ORT_DISABLE_ALL).
FOLD_MAX_ELEMENTS = 4096
#: Never folded even with constant inputs.
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})
CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


# ---- loading ----------------------------------------------------------------------------------
def load_graph(spec: str | os.PathLike | onnx.ModelProto, dims: Mapping[str, int] | None = None,
               loose_dims: Collection[str] = (), matched_dims: set[str] | None = None,
               dim_names: set[str] | None = None, inputs_read: list[str] | None = None, fold: bool = True) -> Graph:
    """MODEL as users write it (path, ``zoo:NAME?opt=v`` or a ModelProto) -> Graph. A ``--dim``
    that matches nothing in it is a usage error (a typo would plan another size), except those
    named in ``loose_dims`` (dims given for several models at once), which are warned about.
    ``matched_dims`` collects the dims that did match (a zoo option or a symbolic input dim);
    ``dim_names`` every name a dim could match, once the model's inputs are read (also when the
    import fails after that, as on an unbound dim); ``inputs_read`` gets the model's name then, which
    tells a model whose input dims are all fixed (no names) from one never read. ``fold``: as
    :func:`import_model`'s."""
    return import_model(spec, dims, loose_dims=loose_dims, matched_dims=matched_dims, dim_names=dim_names,
                        inputs_read=inputs_read, fold=fold)


def overridable_initializers(spec: str | os.PathLike | onnx.ModelProto) -> tuple[str, ...]:
    """MODEL's initializers that are graph inputs too, in input order: a caller may feed them, and
    the initializer is their default. The Graph holds them as initializers only; a model written
    from it for the graph as it is (plan --forward --emit, rewrite) lists them as inputs again."""
    proto, _, _ = load_proto(spec, weights=False)
    inits = {t.name for t in proto.graph.initializer}
    return tuple(dict.fromkeys(i.name for i in proto.graph.input if i.name in inits))


def load_proto(spec: str | os.PathLike | onnx.ModelProto, weights: bool | str = True
               ) -> tuple[onnx.ModelProto, Path | None, str]:
    """Read a model without converting it: (proto, folder, display name). External data is loaded
    into the proto; ``weights=False`` leaves it where it is (for a look at the graph alone);
    ``weights="mapped"`` checks it and points each external initializer at its file's absolute
    path, for ``initializer_value`` to read in place (import: a model's weights are never copied)."""
    if isinstance(spec, onnx.ModelProto):
        return spec, None, spec.graph.name or "model"
    text = str(spec)
    if text.startswith("zoo:"):
        import models  # late: the zoo imports onnx builders we don't need otherwise

        try:
            return models.load_spec(text), None, text
        except PlannerError as err:
            raise ModelImportError(str(err)) from None
    if not text.strip():  # Path("") is the current folder, which was "is a folder"
        raise ModelImportError("MODEL is empty; give a path to an .onnx file or zoo:NAME")
    path = Path(text)
    if not path.exists():
        raise ModelImportError(f"{text}: no such file; give a path to an .onnx file or zoo:NAME")
    if path.is_dir():
        raise ModelImportError(f"{text}: is a folder; give a path to an .onnx file")
    if not path.is_file():
        # memplan reads MODEL more than once: a pipe (<(...), /dev/stdin) was empty the second time
        # ("not an ONNX model"), and /dev/zero was read until memory ran out
        raise ModelImportError(f"{text}: not a regular file (a device, pipe or socket); save the model to a "
                               "file and give its path")
    try:
        if weights == "mapped" and path.stat().st_size > MAP_INSIDE_BYTES:
            data = _weights_pointed_at(path)  # the weights inside the file are mapped too
        else:
            data = path.read_bytes()
    except OSError as err:
        raise ModelImportError(f"{text}: cannot read ({err.strerror})") from None
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError):
        raise ModelImportError(f"{text}: not a valid ONNX protobuf (truncated or not an ONNX file)") from None
    if not model.opset_import or not model.graph.output:
        raise ModelImportError(f"{text}: not an ONNX model (no opset or no graph outputs)")
    _known_versions(model, text)
    # the folder the user's path names, as ORT reads it: a model that is a symbolic link (the
    # HuggingFace hub cache: snapshots/<rev>/model.onnx -> ../../blobs/<sha>) has its data file
    # beside the link, not beside the file it points at
    folder = path.absolute().parent
    if weights == "mapped":
        _map_external_data(model, folder, text)
    elif weights:
        _load_external_data(model, folder, text)
    return model, folder, text


def _default_opset(model: onnx.ModelProto) -> int | None:
    """The model's opset of the default (ai.onnx) domain, None where it imports none."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _known_versions(model: onnx.ModelProto, text: str) -> None:
    """Refuse a model from an ONNX newer than the installed one: its operators' meaning at that
    opset is unknown here, and ONNX Runtime would refuse it later, after the planning."""
    newest = onnx.defs.onnx_opset_version()
    opset = _default_opset(model)
    if opset is not None and opset > newest:
        raise ModelImportError(f"{text}: uses ONNX opset {opset}; the installed onnx {onnx.__version__} knows opsets up "
                               f"to {newest}: export the model with opset {newest} or lower, or upgrade onnx")
    if model.ir_version > onnx.IR_VERSION:
        raise ModelImportError(f"{text}: has IR version {model.ir_version}; the installed onnx {onnx.__version__} "
                               f"reads up to {onnx.IR_VERSION}: export it with an older IR version, or upgrade onnx")
    if opset is not None and opset > _ORT_FLOOR_OPSET:
        # an opset onnx knows and ONNX Runtime does not yet (onnx 1.23's 27 and 28 on ORT 1.31): the
        # plan came out and its model, in this opset (and the IR version it needs), ORT refused to load
        ir = max(helper.find_min_ir_version_for([helper.make_opsetid("", opset)], ignore_unknown=True), 7)
        refusal = _ort_refusal(opset, ir)
        if refusal is not None:
            import onnxruntime

            raise ModelImportError(f"{text}: uses ONNX opset {opset} (IR version {ir}), which the installed ONNX "
                                   f"Runtime {onnxruntime.__version__} does not load ({refusal}): export the model "
                                   "with an older opset, or upgrade onnxruntime")


def op_schema(op_type: str, opset: int, domain: str = "") -> onnx.defs.OpSchema | None:
    """onnx's schema of ``op_type`` at the model's ``opset`` of ``domain``: the one lookup the checks
    of an op's version share. None where onnx defines none there (no such op, one newer than
    ``opset``, memplan's own MemcpyToHost/FromHost)."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


#: ORT's own ops, written in the default domain, that onnx does not know: memplan's swaps (see
#: DESIGN.md, swap nodes; passes/rewrite.py writes them, a planned file holds them).
ORT_ONLY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})


def _refuse_unknown_ops(model: onnx.ModelProto, display: str) -> None:
    """Refuse a default-domain node whose op onnx defines at no opset, not yet at the model's, or
    only as a deprecated stub there, and a node of another domain (ai.onnx.ml, a custom one) whose
    op the installed ONNX Runtime does not define: ORT refuses the model when it loads it ("No Op
    registered for NotAnOp with domain_version of 17", "my.ops:Foo(-1) is not a registered
    function/op"), where shape inference (strict_mode=False) passed it by, and a declared output
    shape let it be planned. Model-local functions are inlined before this check."""
    opset = _default_opset(model)
    for node in model.graph.node:
        what = f"{display}: node {node.name or '(unnamed)'!r} is {node.op_type}"
        if node.domain not in ("", "ai.onnx"):
            if (node.op_type, node.domain) not in _ort_ops():
                import onnxruntime

                raise ModelImportError(
                    f"{what} of domain {node.domain}, an op ONNX Runtime {onnxruntime.__version__} does not define, so "
                    "it does not load the model (memplan loads no custom op library): replace the node with ONNX ops, "
                    f"or define {node.op_type} in the model as a local function of domain {node.domain}, which "
                    "memplan inlines")
            continue
        if node.op_type in ORT_ONLY_OPS:
            continue
        if not onnx.defs.has(node.op_type, ""):
            raise ModelImportError(
                f"{what}, which is no ONNX operator (onnx {onnx.__version__} knows none of that name at any opset; the "
                f"model's is {opset}) and ONNX Runtime does not load: replace it with ONNX ops, or define it in the "
                "model as a local function of a domain of its own, which memplan inlines")
        if opset is None:
            continue
        schema = op_schema(node.op_type, opset)
        if schema is None:
            first = min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                        if s.name == node.op_type and s.domain == "")
            raise ModelImportError(
                f"{what}, which ONNX defines from opset {first} on; at the model's opset {opset} ONNX Runtime does not "
                f"load it: export the model with opset {first} or newer, or with ops of opset {opset}")
        # ORT 1.31 refuses Upsample-10 and Scatter-11, deprecated stubs, and runs GroupNormalization-18,
        # deprecated with a function body it inlines
        if schema.deprecated and not (schema.has_function or schema.has_context_dependent_function):
            raise ModelImportError(
                f"{what}, deprecated since opset {schema.since_version} (the model's opset is {opset}); ONNX Runtime "
                "does not load it there: export the model again with the op that replaces it (or an older opset)")
        # a declared output shape hid Relu-1 from the shape check below: planned, and ORT refused the file
        _refuse_uninferred_version(node, {"": opset}, display)


@functools.lru_cache(maxsize=None)
def _ort_ops() -> frozenset[tuple[str, str]]:
    """(op, domain) of every operator the installed ONNX Runtime defines: the ONNX ones and its own
    (com.microsoft's FusedMatMul, the ai.onnx.ml ops it runs)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return frozenset((s.name, s.domain) for s in ort_state.get_all_operator_schema())


#: The oldest ONNX Runtime memplan supports (1.20, pyproject.toml) loads opsets up to 21 (IR version 10);
#: a newer opset is asked of the installed one.
_ORT_FLOOR_OPSET = 21


@functools.lru_cache(maxsize=None)
def _ort_refusal(opset: int, ir_version: int) -> str | None:
    """Why the installed ONNX Runtime does not load a model of this opset and IR version (its own
    words, shortened), or None when it loads one: a one-node model, tried."""
    import onnxruntime

    value = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    probe = helper.make_model(
        helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]),
        opset_imports=[helper.make_opsetid("", opset)])
    probe.ir_version = ir_version
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    try:
        onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - ORT raises its own types; any refusal is the answer
        said = str(err)
        known = re.search(r"(Current official support for domain \S+ is till opset \d+|max supported IR version: \d+)",
                          said)
        return known.group(1) if known else said.rsplit(" : ", 1)[-1].strip()[:200]
    return None


def load_header(spec: str | os.PathLike) -> onnx.ModelProto:
    """MODEL's top-level fields without its graph (opsets, metadata): a file is read field by field,
    its graph skipped unread (a 1 GB model's whole parse took 2.7 s); a zoo spec is built."""
    text = str(spec)
    # not a regular file: load_proto says what it is (opened here, a named pipe nobody writes to
    # blocked check, plan, inspect and train-graph for good)
    if text.startswith("zoo:") or not os.path.isfile(text):
        model, _, _ = load_proto(text, weights=False)
        return model
    import mmap

    try:
        with open(text, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            kept = bytearray()
            for key, start, _, end in _fields(buf, 0, len(buf)):
                if key >> 3 != GRAPH_FIELD:
                    kept += buf[start:end]
        header = onnx.ModelProto()
        header.ParseFromString(bytes(kept))
        return header
    except (OSError, ValueError, IndexError, DecodeError, RuntimeError):
        model, _, _ = load_proto(text, weights=False)  # says what is wrong with the file
        return model


GRAPH_FIELD = onnx.ModelProto.DESCRIPTOR.fields_by_name["graph"].number
INITIALIZER_FIELD = onnx.GraphProto.DESCRIPTOR.fields_by_name["initializer"].number
RAW_DATA_FIELD = onnx.TensorProto.DESCRIPTOR.fields_by_name["raw_data"].number
#: Model files larger than this have the weights inside them mapped as well (``_weights_pointed_at``).
MAP_INSIDE_BYTES = 64 << 20


def _weights_pointed_at(path: Path) -> bytes:
    """The bytes of the model at ``path`` with the raw data of each initializer of a mappable type
    replaced by an external-data entry pointing at the same bytes in the model file itself, for
    ``_map_external_data`` to map: parsing them would copy every weight (a 1.07 GB model held its
    weights twice, the parsed proto and the arrays). Anything the walk does not understand
    returns the file as it is."""
    import mmap

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            out = bytearray()
            for key, start, body, end in _fields(buf, 0, len(buf)):
                if key != (GRAPH_FIELD << 3 | 2):
                    out += buf[start:end]
                    continue
                graph = bytearray()
                for gkey, gstart, gbody, gend in _fields(buf, body, end):
                    if gkey == (INITIALIZER_FIELD << 3 | 2):
                        # the file's own name in the folder _map_external_data looks in (the one the
                        # user's path names, a symlink's)
                        graph += _field_bytes(INITIALIZER_FIELD, _tensor_pointed_at(buf, gbody, gend,
                                                                                    path.name))
                    else:
                        graph += buf[gstart:gend]
                out += _field_bytes(GRAPH_FIELD, graph)
            return bytes(out)
        except (ValueError, IndexError):
            return buf[:]


def _tensor_pointed_at(buf, body: int, end: int, location: str) -> bytes:
    kept, raw = bytearray(), None
    for key, start, value, stop in _fields(buf, body, end):
        if key == (RAW_DATA_FIELD << 3 | 2):
            raw = (value, stop - value)
        else:
            kept += buf[start:stop]
    tensor = onnx.TensorProto()
    tensor.ParseFromString(bytes(kept))
    if raw is None or raw[1] <= ASIDE_BYTES or tensor.data_type not in MAPPABLE:  # as _map_external_data
        return bytes(buf[body:end])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", raw[0]), ("length", raw[1])):
        tensor.external_data.add(key=k, value=str(v))
    return tensor.SerializeToString()


def _fields(buf, pos: int, end: int):
    """(key, field start, value start, field end) of each field of the message in buf[pos:end]."""
    while pos < end:
        start = pos
        key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            _, stop = _varint(buf, pos)
        elif wire == 2:
            length, pos = _varint(buf, pos)
            stop = pos + length
        elif wire in (1, 5):
            stop = pos + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"wire type {wire}")
        if stop > end:
            raise ValueError("truncated")
        yield key, start, pos, stop
        pos = stop


def _field_bytes(number: int, value: bytes | bytearray) -> bytes:
    """A length-delimited field: key, length, value."""
    return field_head(number, len(value)) + bytes(value)


def field_head(number: int, length: int) -> bytes:
    """The key and length of a length-delimited protobuf field whose ``length`` bytes follow."""
    head = bytearray([number << 3 | 2])
    while True:
        byte, length = length & 0x7F, length >> 7
        head.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(head)


def _varint(buf, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _external_file(t: onnx.TensorProto, folder: Path, display: str) -> Path:
    """The data file of external tensor ``t``, refusing any location outside the model's own folder:
    an absolute one, or one with ``..``. The location is what the model file says; a symbolic link
    in the folder is the folder's owner's (the HuggingFace hub cache links each file to a blob
    outside it), and is followed as ORT follows it."""
    loc = {e.key: e.value for e in t.external_data}.get("location", "")
    target = folder / loc
    if not loc or os.path.isabs(loc) or ".." in Path(loc).parts or folder not in target.parents:
        raise ModelImportError(
            f"{display}: initializer {t.name!r} has external data location {loc!r} outside the model's "
            "folder; move the data file beside the model and use a relative name"
        )
    if not target.is_file():
        raise ModelImportError(f"{display}: external data file {loc!r} for {t.name!r} not found beside the model")
    return target


def _load_external_data(model: onnx.ModelProto, folder: Path, display: str) -> None:
    """Load external tensors, refusing any location outside the model's own folder."""
    tensors = list(onnx.external_data_helper._get_all_tensors(model))  # noqa: SLF001 - public in spirit
    external = [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]
    for t in external:
        _external_file(t, folder, display)
    for t in external:
        _load_tensor(t, folder, display)


#: Element types whose bytes in a data file are the numpy array's own (little-endian, one element
#: after another): ``initializer_value`` maps them. Strings and packed 2- and 4-bit types are loaded.
MAPPABLE = frozenset(
    getattr(onnx.TensorProto, n) for n in (
        "FLOAT", "DOUBLE", "FLOAT16", "BFLOAT16", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
        "UINT64", "BOOL", "COMPLEX64", "COMPLEX128", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ") if hasattr(onnx.TensorProto, n))


def _map_external_data(model: onnx.ModelProto, folder: Path, display: str) -> None:
    """Check each external initializer's bytes (the file is in the model's folder and holds them)
    and point it at the file's absolute path; load those ``initializer_value`` cannot map, those up
    to ``ASIDE_BYTES``, and external tensors inside nodes (Constant values), which import reads
    whole anyway."""
    files: dict[Path, int] = {}
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        target = _external_file(t, folder, display)
        nbytes = tensor_bytes(t)
        if t.data_type not in MAPPABLE or nbytes <= ASIDE_BYTES:
            # small ones are read: shape inference's data propagation needs the shape ints
            _load_tensor(t, folder, display)
            continue
        info = {e.key: e.value for e in t.external_data}
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", nbytes))
        except ValueError:
            raise ModelImportError(f"{display}: initializer {t.name!r} has a non-numeric external data offset or "
                                   "length; write the model again with onnx.save_model") from None
        if target not in files:
            files[target] = target.stat().st_size
        if length != nbytes or offset < 0 or offset + nbytes > files[target]:
            raise ModelImportError(
                f"{display}: external data of initializer {t.name!r} does not match its dims ({nbytes} bytes "
                f"expected at offset {offset}, the entry says {length}, {target.name} holds {files[target]}); "
                "write the model again with onnx.save_model")
        del t.external_data[:]
        t.external_data.add(key="location", value=str(target))
        t.external_data.add(key="offset", value=str(offset))
        t.external_data.add(key="length", value=str(nbytes))
    for t in onnx.external_data_helper._get_attribute_tensors(model):  # noqa: SLF001 - public in spirit
        if t.data_location == onnx.TensorProto.EXTERNAL:
            _external_file(t, folder, display)
            _load_tensor(t, folder, display)


def _load_tensor(t: onnx.TensorProto, folder: Path, display: str) -> None:
    """Read external tensor ``t``'s bytes into it. Read here, not by onnx's loader: that one refuses
    a data file that is a symbolic link (the HuggingFace hub cache's are), which ORT reads."""
    target = _external_file(t, folder, display)
    info = {e.key: e.value for e in t.external_data}
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else -1
        with open(target, "rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
    except (OSError, ValueError) as err:
        raise ModelImportError(f"{display}: cannot load external data of {t.name!r} "
                               f"({getattr(err, 'strerror', None) or err})") from None
    if length >= 0 and len(data) != length:
        raise ModelImportError(f"{display}: external data of {t.name!r} ends early ({len(data)} of {length} bytes "
                               f"at offset {offset} in {target.name}); write the model again with onnx.save_model")
    t.raw_data = data
    t.data_location = onnx.TensorProto.DEFAULT
    del t.external_data[:]


def initializer_value(init: onnx.TensorProto) -> np.ndarray:
    """The value of an initializer. One ``load_proto(..., weights="mapped")`` pointed at its data
    file is a read-only view of that file (one mapping per file): the OS pages it in when read and
    may drop it again, so a model's weights cost no memory of their own (a 2.2 GB model was held
    three times over by import alone: the file's proto, its copy, the arrays)."""
    if init.data_location != onnx.TensorProto.EXTERNAL:
        try:
            return numpy_helper.to_array(init)
        except ValueError as err:  # data that does not fill its dims (onnx.checker refuses it too)
            raise ModelImportError(f"initializer {init.name!r} of shape {list(init.dims)} holds values that do not "
                                   f"fill it ({err}); fix the model's initializer (onnx.checker.check_model "
                                   "reports it)") from None
    if is_stub(init) and init.name in _ASIDE_VALUES:  # a stub whose value the caller holds
        return _ASIDE_VALUES[init.name]
    info = {e.key: e.value for e in init.external_data}
    path = info.get("location", "")
    if not os.path.isabs(path):
        raise ModelImportError(f"initializer {init.name!r} keeps its data in {path!r}, and the model was given "
                               "without its folder; give memplan the model's path")
    dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
    shape = tuple(init.dims)
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, dtype)
    buf = _mapping(path)
    return np.frombuffer(buf, dtype=dtype.newbyteorder("<"), count=count, offset=int(info["offset"])).reshape(shape)


def is_stub(t: onnx.TensorProto) -> bool:
    """An initializer whose bytes memplan holds elsewhere: written by ``export_model(...,
    weights=False)`` (no location yet) or set aside at ``ASIDE``."""
    return t.data_location == onnx.TensorProto.EXTERNAL and \
        {e.key: e.value for e in t.external_data}.get("location", "") in ("", ASIDE)


#: The data files mapped during one import, and the values of its set-aside initializers
#: (``import_model`` empties both).
_MAPPINGS: dict[str, Any] = {}
_ASIDE_VALUES: dict[str, np.ndarray] = {}


def _mapping(path: str):
    import mmap

    buf = _MAPPINGS.get(path)
    if buf is None:
        with open(path, "rb") as fh:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        _MAPPINGS[path] = buf
    return buf


# ---- import -----------------------------------------------------------------------------------
def import_model(
    spec: str | os.PathLike | onnx.ModelProto, dims: Mapping[str, int] | None = None,
    frozen: Iterable[str] = (), aside: Mapping[str, np.ndarray] | None = None,
    loose_dims: Collection[str] | None = None, matched_dims: set[str] | None = None,
    dim_names: set[str] | None = None, fold: bool = True, inputs_read: list[str] | None = None,
) -> Graph:
    """Load, bind symbolic dims, infer shapes, fold shape subgraphs and build the Graph; the
    float initializers named in ``frozen`` get no gradient. ``aside``: the values of the
    initializers ``spec`` holds as stubs (``export_model(..., weights=False)``, or set aside at
    ``ASIDE`` for onnx's converter, passes/opset_upgrade.py), by name. ``loose_dims``: the dims
    that may match nothing (a warning); any other that does is a UsageError. None: every one may
    (what memplan imports itself: its own files, benchmarks). ``matched_dims`` collects the dims
    that matched a zoo option or a symbolic input dim, ``dim_names`` every one it has, and
    ``inputs_read`` the model's name once its inputs are read (:func:`load_graph`). ``fold=False``:
    fold only Constant nodes, the file as ORT runs it under the planned session options
    (ORT_DISABLE_ALL folds nothing else): a planned file's ordering edges read their gate through a
    Size, run and held as ORT runs it, which folding took out (memplan verify predicted zoo:gpt at 70%
    960 bytes over the counted peak)."""
    _ASIDE_VALUES.update(aside or {})
    if dims and not isinstance(spec, onnx.ModelProto) and str(spec).startswith("zoo:"):
        import models  # late, as in load_proto

        try:
            models.parse_spec(str(spec))
        except PlannerError as err:  # a bad name is a bad model, as in load_proto
            raise ModelImportError(str(err)) from None
        if dim_names is not None:
            dim_names.update(set(models.ZOO[models.parse_spec(str(spec))[0]].option_names) - {"size"})
        spec, rest = models.with_dims(str(spec), dims)  # a dim the name contradicts: a usage error
        if matched_dims is not None:
            matched_dims.update(set(dims) - set(rest))
        dims = rest
    try:
        model, _, display = load_proto(spec, weights="mapped")
        roles = torch_export_roles(model)
        # a proto read from a file here is ours to change; the caller's is copied first
        model, folded = _prepare(model, dict(dims or {}), display, roles, copy=isinstance(spec, onnx.ModelProto),
                                 loose_dims=loose_dims, matched_dims=matched_dims, dim_names=dim_names, fold=fold,
                                 inputs_read=inputs_read)
        frozen = set(frozen) | folded | (roles.non_parameters(model.graph) if roles else set())
        for lost in (batch_statistics_lost(model, roles), folded_parameter_computations(model, roles)):
            if lost:
                log.warning("%s: %s", display, lost)
        return _to_graph(model, display, frozen, bool(dims))
    finally:
        _MAPPINGS.clear()  # the arrays hold their mapping; a later import maps the file as it is then
        _ASIDE_VALUES.clear()


def import_as_run(spec: str | os.PathLike | onnx.ModelProto, aside: Mapping[str, np.ndarray] | None = None) -> Graph:
    """A model memplan wrote (plan --emit, rewrite, or a planned graph exported) as ORT runs it under
    the planned session options: ``import_model(fold=False)``, its ordering edges' Size nodes kept
    (what verify predicts and an arena replay counts). A pinned file (passes/pin_order.py) records the
    shapes only folding would show (``SHAPES_KEY``); one written before it did is read folded, its
    prediction off by its edges' Size scalars (zoo:resnet at 70% pinned: 128 bytes under)."""
    try:
        return import_model(spec, aside=aside, fold=False)
    except ModelImportError as err:
        graph = import_model(spec, aside=aside)  # a file bad either way raises its own error here
        log.warning("%s; read folded instead (a pinned file from a memplan that did not record its hidden "
                    "shapes), not quite as ORT runs it: plan it again with --emit for an exact prediction",
                    str(err).split(":")[0])
        return graph


# ---- torch.onnx.export(dynamo=True) -------------------------------------------------------------
#: What torch's torch.export-based exporter (the default since torch 2.9) records about each graph
#: input and initializer (value_info metadata), the same as one text block on the graph, and what
#: onnxscript's constant folding records about each folded initializer (the values it came from,
#: transitively).
TORCH_INPUT_KIND = "pkg.torch.export.graph_signature.InputSpec.kind"
TORCH_SIGNATURE = "pkg.torch.export.ExportedProgram.graph_signature"
FOLDED_FROM = "pkg.onnxscript.optimizer.folded_from"
#: node metadata torch's dynamo exporter writes: the FX node an ONNX node was translated from
TORCH_FX_NODE = "pkg.torch.onnx.fx_node"


@dataclass(frozen=True)
class TorchExportRoles:
    """Which initializers of a torch.export-based ONNX file hold torch parameters.

    That exporter writes Python scalars (an attention scale, GELU's coefficients, a mask fill
    value) and buffers (BatchNorm statistics, rotary frequencies, causal masks) as float
    initializers too; only parameters, and initializers folded from a parameter (a transposed
    weight), are trainable."""

    kinds: Mapping[str, str]  # name -> PARAMETER | BUFFER | CONSTANT_TENSOR | ...
    parameters: frozenset[str]
    folded_from: Mapping[str, frozenset[str] | None]  # None: recorded but unreadable
    #: the buffers torch.export saw the forward update (BatchNorm's running statistics in train mode)
    mutated_buffers: frozenset[str] = frozenset()
    #: FX name -> the parameter it is (``p_n2_weight`` -> ``n2.weight``), from the signature: what
    #: each node's FX record (``TORCH_FX_NODE``) calls the parameters it took
    targets: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def derived_from(self, name: str) -> frozenset[str]:
        """The parameters a folded initializer was computed from (empty when none or not folded)."""
        return frozenset((self.folded_from.get(name) or frozenset()) & self.parameters)

    def non_parameters(self, g: onnx.GraphProto) -> set[str]:
        """Float initializers that are not parameters: a buffer or constant by the signature,
        folded from constants only, or an unmarked 0-d scalar (the exporter writes Python scalars
        so; a 0-d parameter is marked PARAMETER). Anything else stays trainable (a rewrite such as
        Conv+BatchNorm fusion writes unmarked tensors that hold parameters)."""
        out = set()
        for init in g.initializer:
            name = init.name
            if not _is_float(init) or name in self.parameters:
                continue
            marked = name in self.kinds
            from_constants = self.folded_from.get(name, None) is not None and not self.derived_from(name)
            literal = name not in self.folded_from and len(init.dims) == 0
            if marked or from_constants or literal:
                out.add(name)
        return out


def symbolic_input_dims(model: onnx.ModelProto) -> list[str]:
    """The named dynamic dims of ``model``'s graph inputs (initializers aside), in file order."""
    init_names = {i.name for i in model.graph.initializer}
    out: list[str] = []
    for inp in model.graph.input:
        if inp.name not in init_names:
            out += [d.dim_param for d in inp.type.tensor_type.shape.dim
                    if not d.HasField("dim_value") and d.dim_param and d.dim_param not in out]
    return out


def input_shapes_text(model: onnx.ModelProto) -> str:
    """``x[1, 3, 224, 224], ids[batch, seq]``: the graph inputs (initializers aside) with their dims."""
    init_names = {i.name for i in model.graph.initializer}
    return ", ".join(
        f"{inp.name}[{', '.join(str(d.dim_value) if d.HasField('dim_value') else d.dim_param or '?' for d in inp.type.tensor_type.shape.dim)}]"
        for inp in model.graph.input if inp.name not in init_names)


def _is_float(init: onnx.TensorProto) -> bool:
    return ONNX_TO_DTYPE.get(init.data_type) in FLOAT_DTYPES


def torch_export_roles(model: onnx.ModelProto) -> TorchExportRoles | None:
    """The roles torch's dynamo exporter recorded in ``model``, or None when it recorded none
    (any other producer, or metadata stripped: then every float initializer is trainable)."""
    g = model.graph
    kinds: dict[str, str] = {}
    folded: dict[str, frozenset[str] | None] = {}
    for vi in list(g.input) + list(g.value_info):
        for prop in vi.metadata_props:
            if prop.key == TORCH_INPUT_KIND:
                kinds[vi.name] = prop.value
            elif prop.key == FOLDED_FROM:
                try:
                    folded[vi.name] = frozenset(str(v) for v in ast.literal_eval(prop.value))
                except (ValueError, SyntaxError, TypeError):
                    folded[vi.name] = None
    signature = [p.value for p in getattr(g, "metadata_props", ()) if p.key == TORCH_SIGNATURE]
    targets = dict(m for text in signature for m in re.findall(r"(\w+): PARAMETER target='([^']*)'", text))
    params = {n for n, k in kinds.items() if k == "PARAMETER"} | set(targets.values())
    if not kinds and not signature:
        return None
    inits = {i.name for i in g.initializer}
    kinds = {n: k for n, k in kinds.items() if n in inits and k != "PARAMETER"}
    updated = {m for t in signature for m in re.findall(r": BUFFER_MUTATION target='([^']*)'", t)}
    return TorchExportRoles(kinds, frozenset(params), folded, frozenset(updated), targets)


def folded_parameter_computations(model: onnx.ModelProto, roles: TorchExportRoles | None) -> str | None:
    """Why ``model`` may not train as torch does, or None: onnxscript's constant folding computed
    some float initializers from parameters and other values (Gemma's ``1 + weight``, a Swin bias
    table gathered by its index, DeBERTa's projected relative embeddings). memplan trains each as a
    parameter of its own; that is torch's training only where it is a reshape or a shift of one
    parameter. A folded copy of one parameter alone (a Linear weight transposed) is not counted:
    it trains as the parameter (``_unfold_tied_copies``, ``_merge_folded_copies``), and neither is
    ``a * P + b`` of a parameter nodes also read, computed from it again there. Nor is one
    that every node reading it took the parameter itself in torch, as their FX records say: the
    ONNX translation's own reshape of an aten op's argument (``aten.group_norm``'s weight
    unsqueezed to [C, 1, 1]), not a computation of the model's. The example named is the one folded
    from the most values, the likeliest to be more than a reshape or a shift: RecurrentGemma's
    ``softplus`` (its ``recurrent_param`` and 10 other values; trained as it is, its gradient is
    torch's divided by sigmoid(param), 26x and 40x off in its two layers), not the first of its
    seven ``1 + weight`` scales (whose gradients are torch's)."""
    if roles is None:
        return None
    fx_name = {t: f for f, t in roles.targets.items()}
    readers = _readers(model.graph)
    found: list[tuple[str, list[str], int]] = []
    for init in model.graph.initializer:
        sources = roles.folded_from.get(init.name)
        params = sorted((sources or frozenset()) & roles.parameters)
        if not (_is_float(init) and params and (len(params) > 1 or len(sources) > 1)):
            continue
        calls = [_fx_call(node) for node in readers.get(init.name, ())]
        if calls and all(call and all(fx_name.get(p) in call.args for p in params) for call in calls):
            continue  # the translation's reshape of an argument torch passed as it is
        found.append((init.name, params, len(sources) - len(params)))
    if not found:
        return None
    name, params, others = max(found, key=lambda f: f[2])
    who = repr(params[0]) if len(params) == 1 else f"{len(params)} parameters ({params[0]!r}, ...)"
    example = f"{name!r} from {who}{f' and {others} other value(s)' if others else ''}"
    return (f"{len(found)} initializer(s) hold what onnxscript's constant folding computed from parameters "
            f"(e.g. {example}); memplan trains each as a parameter of its own, which is torch's training only "
            "where it is a reshape or a shift of one parameter; export with torch.onnx.export(..., "
            "optimize=False) to keep those computations in the graph")


def batch_statistics_lost(model: onnx.ModelProto, roles: TorchExportRoles | None) -> str | None:
    """Why ``model`` does not train as torch did, or None: torch.export traced BatchNorms in train
    mode (the forward updates their running statistics) that the file does not normalize with batch
    statistics. torch's dynamo exporter (2.13) writes them in inference form
    (:func:`_restore_batch_statistics` puts training mode back) and onnxscript's optimizer folds
    those after a Conv into it, beyond repair: the step normalizes with the running statistics, with
    other gradients and other memory than torch's training step."""
    if roles is None or not roles.mutated_buffers:
        return None
    traced = {name for name in roles.mutated_buffers if name.endswith("running_mean")}
    training = {n.input[3] for n in model.graph.node if n.op_type == "BatchNormalization" and len(n.input) > 3
                and any(a.name == "training_mode" and a.i for a in n.attribute)}
    lost = len(traced - training)
    if not lost:
        return None
    return (f"torch traced {len(traced)} BatchNorm layer(s) in train mode, but this file normalizes {lost} of them "
            "with their running statistics (torch's dynamo exporter folds BatchNorm into the Conv before it), "
            "so the step memplan builds is not torch's training step; for batch statistics export with "
            "torch.onnx.export(..., optimize=False), which memplan reads back in training mode, or dynamo=False")


def _unfold_tied_copies(g: onnx.GraphProto, roles: TorchExportRoles, display: str) -> None:
    """Put back ``Transpose(P)`` for an initializer that constant folding computed as the transpose
    of parameter P while nodes still read P itself: a tied weight (GPT-2's embedding and LM head)
    would otherwise train as two independent copies, each with part of the gradient. So for one
    that is ``a * P + b`` (scalars; P maybe reshaped) to the last bit: RWKV's ``1 - time_mix_key``
    beside ``time_mix_key`` itself."""
    inits = {i.name: i for i in g.initializer}
    readers = _readers(g)
    read = set(readers)
    taken = {n.name for n in g.node}
    for name, init in list(inits.items()):
        sources = roles.derived_from(name)
        if not _is_float(init) or len(sources) != 1:
            continue
        (param,) = sources
        if param not in inits or param not in read:
            continue
        source, value = initializer_value(inits[param]), initializer_value(init)
        if _is_transpose(value, source):
            g.initializer.remove(init)
            _compute_as_transpose(g, name, param, source.ndim, taken)
            log.info("%s: initializer %r is %r transposed, which nodes also read (a tied weight); "
                     "computing it with Transpose so both share one gradient", display, name, param)
            continue
        affine = _affine_of(value, source)
        # every reader's FX record names this very value: a reader naming another folded one (RWKV's
        # sub_595, merged into sub_5 for equal values) took 1 - P' of some other parameter P'
        if affine is None or any(name not in call.args for call in map(_fx_call, readers.get(name, ())) if call):
            continue
        g.initializer.remove(init)
        _compute_as_affine(g, name, param, source.shape, value, affine, taken)
        log.info("%s: initializer %r is %s of %r, which nodes also read; computing it from %r so both share "
                 "one gradient", display, name, _affine_text(*affine), param, param)


def _affine_of(value: np.ndarray, source: np.ndarray) -> tuple[float, float] | None:
    """(a, b) where ``value`` is ``a * source + b`` elementwise, source reshaped to value's shape, to
    the last bit as float math in value's type makes it (:func:`_affine_value`); None where not
    (fewer than two distinct source values leave a and b unknown)."""
    if value.size != source.size or value.dtype != source.dtype or value.dtype not in (np.float32, np.float64):
        return None
    x, y = source.reshape(-1).astype(np.float64), value.reshape(-1).astype(np.float64)
    i = int(np.argmin(x))
    j = int(np.argmax(x))
    if x[i] == x[j]:
        return None
    slope = (y[j] - y[i]) / (x[j] - x[i])
    for a in dict.fromkeys((float(round(slope)), float(f"{slope:.6g}"), float(np.float32(slope)), float(slope))):
        if a == 0:
            continue
        offset = y[i] - a * x[i]
        for b in dict.fromkeys((float(round(offset)), float(f"{offset:.6g}"), float(offset))):
            if np.array_equal(_affine_value(source.reshape(value.shape), a, b), value):
                return a, b
    return None


def _affine_value(x: np.ndarray, a: float, b: float) -> np.ndarray:
    """``a * x + b`` as the nodes :func:`_compute_as_affine` writes compute it, in x's type."""
    a_, b_ = x.dtype.type(a), x.dtype.type(b)
    if a == 1:
        return x + b_ if b else x
    if a == -1:
        return b_ - x
    return x * a_ + b_ if b else x * a_


def _affine_text(a: float, b: float) -> str:
    """``1 - P``, ``2 * P + 0.5``, ``a copy`` (for a log line: "X is 1 - P of 'mix'")."""
    if a == 1 and not b:
        return "a copy"
    scaled = "P" if a == 1 else "-P" if a == -1 else f"{a:g} * P"
    if a == -1 and b:
        return f"{b:g} - P"
    return f"{scaled} {'+' if b > 0 else '-'} {abs(b):g}" if b else scaled


def _compute_as_affine(g: onnx.GraphProto, name: str, source: str, source_shape: tuple[int, ...],
                       value: np.ndarray, affine: tuple[float, float], taken: set[str]) -> None:
    """``name`` (no longer an initializer) made first thing as ``a * source + b`` (reshaped to
    ``value``'s shape), in the op order :func:`_affine_value` checked."""
    a, b = affine
    nodes: list[onnx.NodeProto] = []

    def const(label: str, v: np.ndarray) -> str:
        const_name = _fresh(f"{name}_{label}", taken)
        g.initializer.append(numpy_helper.from_array(v, const_name))
        return const_name

    def step(op: str, ins: list[str]) -> str:
        out = _fresh(f"{name}_{op.lower()}", taken)
        nodes.append(helper.make_node(op, ins, [out], name=_fresh(f"{name}_untied", taken)))
        return out

    x = source
    if tuple(value.shape) != tuple(source_shape):
        x = step("Reshape", [x, const("shape", np.asarray(value.shape, np.int64))])
    if a == -1:
        x = step("Sub", [const("b", np.asarray(b, value.dtype)), x])
    else:
        if a != 1:
            x = step("Mul", [x, const("a", np.asarray(a, value.dtype))])
        if b:
            x = step("Add", [x, const("b", np.asarray(b, value.dtype))])
    if not nodes:
        step("Identity", [x])
    nodes[-1].output[0] = name
    for k, node in enumerate(nodes):
        g.node.insert(k, node)


def _is_transpose(value: np.ndarray, source: np.ndarray) -> bool:
    return value.ndim >= 2 and value.shape == source.shape[::-1] and np.array_equal(value, source.T)


def _compute_as_transpose(g: onnx.GraphProto, name: str, source: str, rank: int, taken: set[str]) -> None:
    """``name`` (no longer an initializer) made first thing by a Transpose of ``source``."""
    g.node.insert(0, helper.make_node("Transpose", [source], [name], name=_fresh(f"{name}_untied", taken),
                                      perm=list(range(rank))[::-1]))


def _restore_batch_statistics(g: onnx.GraphProto, roles: TorchExportRoles, display: str) -> None:
    """training_mode=1 on each inference-form BatchNormalization whose running statistics torch.export
    saw the forward update: torch's dynamo exporter (2.13) writes a BatchNorm it traced in train
    mode in inference form, so the file would normalize with the running statistics where torch's
    training step normalizes with the batch's (its optimizer, on by default, folds those after a
    Conv into it; :func:`batch_statistics_lost` warns of those)."""
    restored = 0
    for node in g.node:
        if (node.op_type != "BatchNormalization" or len(node.input) < 5 or node.domain not in ("", "ai.onnx")
                or not {node.input[3], node.input[4]} <= roles.mutated_buffers):
            continue
        if any(a.name == "training_mode" and a.i for a in node.attribute):
            continue
        kept = [a for a in node.attribute if a.name != "training_mode"]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute("training_mode", 1)])
        while len(node.output) < 3:  # onnx infers no shapes for a training node without them
            node.output.append(f"{node.output[0]}_{('running_mean', 'running_var')[len(node.output) - 1]}")
        restored += 1
    if restored:
        log.info("%s: %d BatchNormalization node(s) torch traced in train mode, written in inference form: "
                 "read in training mode (batch statistics), as torch trains them", display, restored)


def _merge_folded_copies(g: onnx.GraphProto, roles: TorchExportRoles, display: str) -> None:
    """One trainable for the copies constant folding made of a parameter the file no longer holds:
    a weight shared by two layers (ALBERT's one encoder layer run twice) whose every read was folded
    into its own transposed copy would otherwise train as independent copies, each with part of the
    gradient. The first copy stays; an equal one is read as it, a transposed one through Transpose."""
    inits = {i.name: i for i in g.initializer}
    groups: dict[str, list[str]] = {}
    for name, init in inits.items():
        sources = roles.derived_from(name)
        if _is_float(init) and len(sources) == 1 and not sources & inits.keys() and len(init.dims) >= 1:
            groups.setdefault(next(iter(sources)), []).append(name)
    taken = {n.name for n in g.node}
    for param, names in sorted(groups.items()):
        if len(names) < 2:
            continue
        keep, kept = names[0], initializer_value(inits[names[0]])
        for other in names[1:]:
            value = initializer_value(inits[other])
            if value.shape == kept.shape and np.array_equal(value, kept):
                _rename_reads(g, other, keep)
                for vi in [v for v in g.value_info if v.name == other]:  # the name is gone
                    g.value_info.remove(vi)
                how = "the same values"
            elif _is_transpose(value, kept):
                _compute_as_transpose(g, other, keep, kept.ndim, taken)
                how = "its transpose"
            else:
                log.warning("%s: initializers %r and %r were both folded from parameter %r but hold different "
                            "values; they train as two parameters", display, keep, other, param)
                continue
            g.initializer.remove(inits[other])
            log.info("%s: initializers %r and %r are both folded from parameter %r (%s); training one",
                     display, keep, other, param, how)


def _split_merged_parameters(model: onnx.ModelProto, roles: TorchExportRoles | None, display: str) -> None:
    """Separate trainables for distinct torch parameters that an exporter merged because their
    values were equal. A freshly initialized model is full of them: every LayerNorm weight is ones
    and every bias zeros. Trained as one, they would get the sum of their gradients and stay equal
    forever, where torch trains each on its own.

    - torch's TorchScript exporter in eval mode (its default) keeps one and makes the others
      ``Identity(kept)`` under their own names. It merges folded copies so too
      (``Identity(onnx::MatMul_12)`` named ``onnx::MatMul_34``), but also the two folded copies
      of the one weight a shared layer reads twice (ALBERT's): those stay as they are, with a
      warning where parameters were merged too (a fresh model, folded: a GroupNorm's weights).
    - onnxscript's optimizer (the dynamo exporter's default) keeps one and points every read of
      the others at it, which only the FX node each ONNX node was translated from still tells:
      ``%p_n2_weight`` read through ``n1.weight``, or through ``val_60``, the folded copy of
      ``n1.weight`` unsqueezed for a GroupNorm (the split copy then holds ``n2.weight`` so shaped).

    A parameter tied in torch (one tensor: GPT-2's embedding and LM head) leaves no such trace and
    stays one."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    outputs = {o.name for o in g.output}
    split: dict[str, str] = {}  # new initializer -> the one it copies
    constants: dict[str, str] = {}  # the same, for a copy read as a constant (frozen)
    if roles is None and model.producer_name == "pytorch":
        folded_merged: list[str] = []
        uniform: list[str] = []  # those holding one value throughout
        for node in list(g.node):
            if (node.op_type == "Identity" and node.domain in ("", "ai.onnx") and len(node.output) == 1
                    and node.input[0] in inits and _is_float(inits[node.input[0]])
                    and node.output[0] not in outputs and node.output[0] not in inits):
                if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", node.output[0]):  # a parameter's name
                    split[node.output[0]] = node.input[0]
                    g.node.remove(node)
                elif node.output[0].startswith("onnx::"):
                    folded_merged.append(node.output[0])
                    if _uniform(initializer_value(inits[node.input[0]])):
                        uniform.append(node.output[0])
        # merged copies holding one value throughout (a fresh norm's ones or zeros) are as likely
        # distinct parameters as one shared weight; a shared weight's copies hold its own values (fresh
        # BiT: its GroupNorms' folded [C, 1, 1] scales trained as one, silently, 3.2 off torch)
        if split:
            said, what = folded_merged, (f"parameters of equal value (a freshly initialized model), and "
                                         f"{len(folded_merged)} constant-folded copies too")
        else:
            said, what = uniform, (f"{len(uniform)} constant-folded copies that hold one value throughout, as a "
                                   "freshly initialized model's norm scales and biases do")
        if said:
            log.warning("%s: the exporter merged %s (e.g. %r), which memplan cannot tell from a shared layer's "
                        "copies of one weight: they train as one; export with torch.onnx.export(..., "
                        "do_constant_folding=False) to keep each parameter", display, what, said[0])
    elif roles is not None:
        target = roles.targets
        fx_name = {t: f for f, t in target.items()}
        folded = {p for name in inits for p in roles.derived_from(name)}  # _merge_folded_copies' business
        missing = {t for t in target.values() if t not in inits and t not in folded}
        values = {o for n in g.node for o in n.output} | {i.name for i in g.input} | set(inits)
        calls = [(node, call) for node in g.node if (call := _fx_call(node)) is not None]
        named = {a for _, call in calls for a in call.args}  # what some call took
        for node, call in calls:
            args = call.args
            merged = list(dict.fromkeys(target[f] for f in args if f in target and target[f] in missing))
            # the parameter each read holds: itself, or the one a folded copy was computed from (a
            # GroupNorm weight unsqueezed); a read is unexplained where the FX node names none of them
            holds = {i: {name} if name in fx_name else roles.derived_from(name)
                     for i, name in enumerate(node.input) if name in inits}
            reads = [i for i, params in holds.items() if len(params) == 1
                     and not any(fx_name.get(p) in args for p in params)]
            if not reads:
                continue
            if not merged:
                # no parameter the call takes is missing, and the one it reads, a node of its own
                # names: this read is of a constant (one value throughout, as zeros_like or an
                # ONNX translation's ones are) that onnxscript merged into that parameter. Fresh
                # VideoMAE's key bias, ``zeros_like(v_bias)``, trained as its q_bias (223 off torch);
                # fresh HuBERT's GroupNorm, written as InstanceNormalization with ones and zeros
                # for scale and bias, trained its feature projection's LayerNorm (3.7)
                for i in reads:
                    param = node.input[i]
                    if param in fx_name and fx_name[param] in named and _uniform(initializer_value(inits[param])):
                        name = _fresh(f"{call.name or node.name}_constant", values)
                        constants[name] = param
                        node.input[i] = name
                continue
            kept = [next(iter(holds[i])) for i in reads]
            pairs = _pair_merged_reads(kept, merged, reads)
            paired = {i for i, _ in pairs}
            pairs += [(i, target[args[i]]) for i in _aligned_reads(node, args, target, inits)
                      if i in reads and i not in paired and target.get(args[i]) in merged]
            for i, param in pairs:
                split.setdefault(param, node.input[i])
                node.input[i] = param
    for name, source in [*split.items(), *constants.items()]:
        copy = g.initializer.add()
        copy.CopyFrom(inits[source])
        copy.name = name
        inits[name] = copy
    if constants:
        roles.kinds.update(dict.fromkeys(constants, "CONSTANT_TENSOR"))  # frozen (non_parameters)
        log.info("%s: %d read(s) of a parameter where torch read a constant of equal value instead are read "
                 "as that constant (e.g. %r for %r)", display, len(constants), *next(iter(constants.items())))
    if split:
        log.info("%s: %d parameter(s) the exporter merged with another of equal value train on their own "
                 "(e.g. %r, merged into %r)", display, len(split), *next(iter(split.items())))
    if roles is not None:
        _split_merged_folded_values(g, inits, roles, calls, display)
        _restore_dropped_biases(g, inits, roles, display)


def _absent_parameters(inits: Mapping[str, onnx.TensorProto], roles: TorchExportRoles) -> dict[str, str]:
    """FX name -> parameter, for the parameters the file holds neither as initializers nor through a
    folded copy (merged into another, dropped, or a weight torch ties to another)."""
    folded = {p for name in inits for p in roles.derived_from(name)}  # read through folded copies
    return {f: t for f, t in roles.targets.items() if t not in inits and t not in folded}


def _fx_op(name: str) -> str:
    """The aten op an FX value's name comes from: ``layer_norm`` of ``layer_norm_1``, ``add`` of
    ``add_21``."""
    return re.sub(r"_\d+$", "", name)


def _uniform(value: np.ndarray) -> bool:
    """Does ``value`` hold one number throughout (a fresh norm's scale of ones, its bias of zeros)?"""
    return value.size > 0 and bool(np.all(value == value.flat[0]))


def _split_merged_folded_values(g: onnx.GraphProto, inits: dict[str, onnx.TensorProto], roles: TorchExportRoles,
                                calls: list[tuple[onnx.NodeProto, FxCall]], display: str) -> None:
    """Separate trainables for values onnxscript's constant folding computed from distinct
    parameters and then merged because they were equal. Fresh RecurrentGemma (dynamo) has seven
    ``1 + weight`` RMSNorm scales, all ones, folded into ``add_1``, which every norm reads, and four
    zero gate biases unsqueezed into ``unsqueeze_7``: trained as one, each got the sum of its group's
    gradients (``unsqueeze_7`` 0.85 off torch's; fresh Nemotron's five ``weight + 1`` scales, 1.15).
    Only the FX records tell: ``Mul(mul_28, add_1)`` from ``aten.mul(%mul_28, %add_21)``, ``%add_21``
    being no value the file holds or computes.

    A read of a folded initializer whose reader's FX record does not name it is paired with an
    argument of that record named like it (``add_21`` for ``add_1``: the op's name), that no ONNX
    node was translated from and no initializer or input holds; reads and such arguments pair in
    order where their counts agree, and each such argument becomes an initializer of its own, a
    copy of the value it was merged into. The parameters it came from are named nowhere but the
    signature, so it trains under its FX name. A value the optimizer merged while every parameter
    is in the file or some FX record (a shared layer's two unsqueezes of one bias) was computed
    from the same parameters, which torch trains as one: split only where parameters are missing
    so, and no more values than parameters are missing; else left merged, with a warning.
    ``calls``: each node with an FX record and that record, in graph order."""
    mentioned = {a for _, call in calls for a in call.args}
    unnamed = sorted(t for f, t in _absent_parameters(inits, roles).items() if f not in mentioned)
    if not unnamed:
        return
    defined = {call.name for _, call in calls} | set(inits) | {i.name for i in g.input} | set(roles.targets)
    op = _fx_op  # add_21 -> add
    split: dict[str, str] = {}  # FX value -> the initializer it was merged into
    moves: list[tuple[onnx.NodeProto, int, str]] = []
    for node, call in calls:
        reads = [i for i, name in enumerate(node.input)
                 if name in inits and roles.derived_from(name) and name not in call.args]
        lost = [a for a in dict.fromkeys(call.args) if a not in defined]
        for kind in dict.fromkeys(op(node.input[i]) for i in reads):
            at = [i for i in reads if op(node.input[i]) == kind]
            took = [a for a in lost if op(a) == kind]
            if len(at) != len(took):
                continue
            for i, value in zip(at, took):
                if split.setdefault(value, node.input[i]) == node.input[i]:
                    moves.append((node, i, value))
    if not split:
        return
    if len(split) > len(unnamed):
        value, kept = next(iter(split.items()))
        log.warning("%s: onnxscript's optimizer merged %d folded value(s) into others of equal value (e.g. %r into "
                    "%r), more than the %d parameter(s) torch trains that are in neither the file nor any FX record "
                    "(e.g. %r), so memplan cannot tell which were computed from the same parameter: they train as "
                    "one; export with torch.onnx.export(..., optimize=False)", display, len(split), value, kept,
                    len(unnamed), unnamed[0])
        return
    for node, i, value in moves:
        node.input[i] = value
    for value, kept in split.items():
        inits[value] = g.initializer.add()
        inits[value].CopyFrom(inits[kept])
        inits[value].name = value
    value, kept = next(iter(split.items()))
    leaves = {param.rpartition(".")[2] for param in roles.derived_from(kept)}
    example = next((param for param in unnamed if param.rpartition(".")[2] in leaves), unnamed[0])
    log.warning("%s: %d value(s) onnxscript's constant folding computed from parameters and merged into another of "
                "equal value train on their own (e.g. %r, merged into %r), as the parameters they were computed "
                "from train in torch; those are named nowhere in the file (e.g. %r), so each trains under its FX "
                "name; export with torch.onnx.export(..., optimize=False) to train them by name", display,
                len(split), value, kept, example)


#: aten ops whose bias argument (its position among the call's tensor arguments) onnxscript's
#: optimizer drops from the ONNX node it writes when the bias is all zeros
_BIAS_ARGUMENT = {"aten.addmm.default": 0, "aten.linear.default": 2, "aten.convolution.default": 2,
                  "aten.conv1d.default": 2, "aten.conv2d.default": 2, "aten.conv3d.default": 2}


class FxCall(NamedTuple):
    """The FX node an ONNX node was translated from, as its ``TORCH_FX_NODE`` record reads:
    ``%layer_norm : [...] = call_function[target=torch.ops.aten.layer_norm.default](args = (...))``."""

    name: str  # ``layer_norm``
    op: str  # ``aten.layer_norm.default``
    args: list[str]  # the FX names of its tensor arguments, in order (``p_n2_weight`` for a parameter)


def _fx_record(node: onnx.NodeProto) -> str | None:
    """The ``TORCH_FX_NODE`` text ``node`` carries, or None."""
    return next((p.value for p in node.metadata_props if p.key == TORCH_FX_NODE), None)


def _fx_call(node: onnx.NodeProto) -> FxCall | None:
    """The FX node ``node`` came from, or None where it records none."""
    fx = _fx_record(node)
    if fx is None:
        return None
    name = re.match(r"%(\w+) :", fx)
    op = re.search(r"target=torch\.ops\.([\w.]+)\]", fx)
    return FxCall(name.group(1) if name else "", op.group(1) if op else "",
                  re.findall(r"%(\w+)", fx.split("](", 1)[-1]))


def _padding_idx(node: onnx.NodeProto) -> int | None:
    """The ``padding_idx`` of the ``nn.Embedding`` a Gather was translated from, where its FX record
    gives one (``aten.embedding(%p_weight, %ids, 1)``; torch passes -1 for none): torch gives that
    row no gradient. A TorchScript export leaves no trace of it."""
    fx = _fx_record(node)
    found = re.search(r"target=torch\.ops\.aten\.embedding\.default\]\(args = \(%\w+, %\w+, (-?\d+)[,)]", fx or "")
    if found is None or int(found.group(1)) < 0 or int(_plain_attrs(node).get("axis", 0)) != 0:
        return None
    return int(found.group(1))


def _restore_dropped_biases(g: onnx.GraphProto, inits: dict[str, onnx.TensorProto], roles: TorchExportRoles,
                            display: str) -> None:
    """Put back, as zeros, the biases onnxscript's optimizer dropped because they were zero (every
    Linear bias of a freshly initialized transformers model): a Gemm or Conv without its bias input,
    a MatMul without the Add after it, whose FX node (``aten.addmm``, ``aten.linear``,
    ``aten.convolution``, ``aten.conv2d``) took a parameter that no node reads. torch trains them.

    A parameter an FX node took that is still missing after this is named in a warning. Two calls
    computed once (:func:`_computed_once`) leave no trace of the second but its parameters in the
    signature: they are computed apart again where those can be told (:func:`_split_computed_once`),
    and warned of where not. A parameter only the signature names, with no such evidence, is a
    weight torch ties to another (an LM head's), and not warned of."""
    target = roles.targets
    read = {n for node in g.node for n in node.input}
    taken = {n.name for n in g.node} | {o for n in g.node for o in n.output} | set(inits)
    restored: list[str] = []
    mentioned: set[str] = set()
    for node in list(g.node):
        call = _fx_call(node)
        if call is None:
            continue
        op, args = call.op, call.args
        mentioned.update(args)
        at = _BIAS_ARGUMENT.get(op)
        if at is None or len(args) <= at or node.op_type not in ("Gemm", "MatMul", "Conv") or len(node.input) < 2:
            continue
        bias = target.get(args[at])
        weight = inits.get(node.input[1])
        has_bias = len(node.input) > 2 and node.input[2]
        if bias is None or bias in inits or bias in read or weight is None or has_bias or len(weight.dims) < 2:
            continue
        dims = list(weight.dims)
        if node.op_type == "Gemm":
            size = dims[0] if any(a.name == "transB" and a.i for a in node.attribute) else dims[1]
        else:
            size = dims[0] if node.op_type == "Conv" else dims[-1]
        dtype = helper.tensor_dtype_to_np_dtype(weight.data_type)
        inits[bias] = numpy_helper.from_array(np.zeros(size, dtype), bias)
        g.initializer.append(inits[bias])
        if node.op_type == "MatMul":  # y = MatMul(x, w) -> y = Add(MatMul(x, w), bias)
            product = _fresh(f"{node.output[0]}_unbiased", taken)
            add = helper.make_node("Add", [product, bias], [node.output[0]], name=_fresh(f"{node.name}_bias", taken))
            node.output[0] = product
            g.node.insert(list(g.node).index(node) + 1, add)
        else:
            del node.input[2:]
            node.input.append(bias)
        read.add(bias)
        restored.append(bias)
    if restored:
        log.info("%s: %d zero bias(es) onnxscript's optimizer dropped train again (e.g. %r)",
                 display, len(restored), restored[0])
    absent = _absent_parameters(inits, roles)
    lost = sorted(t for f, t in absent.items() if f in mentioned)
    if lost:
        log.warning("%s: %d parameter(s) torch trains are not in the file (e.g. %r): onnxscript's optimizer "
                    "merged them into others of equal value or removed them as having no effect at their initial "
                    "values, and memplan cannot train them apart; export with torch.onnx.export(..., "
                    "optimize=False) to keep them", display, len(lost), lost[0])
    unnamed = sorted(t for f, t in absent.items() if f not in mentioned)
    twice = _split_computed_once(g, inits, roles, unnamed, display) if unnamed else []
    unnamed = [t for t in unnamed if t not in inits]
    if twice:
        log.warning("%s: onnxscript's optimizer computed %%%s and %%%s once (node %r reads it as the second), "
                    "their parameters having had equal values (a freshly initialized model), and memplan cannot "
                    "tell which of the %d parameter(s) torch trains that are in neither the file nor any FX record "
                    "(e.g. %r) the second took, so they do not train apart: export with "
                    "torch.onnx.export(..., optimize=False)", display, *twice[0], len(unnamed),
                    unnamed[0] if unnamed else "none left")


def _computed_once(calls: list[tuple[onnx.NodeProto, FxCall]],
                   target: Mapping[str, str]) -> list[tuple[str, str, onnx.NodeProto, int | None]]:
    """Evidence that onnxscript's common-subexpression pass merged two FX calls that took parameters
    (GPT-NeoX's two LayerNorms of one input, once their parameters were equal): a node reads the
    output of the call ``%layer_norm`` where its FX record names ``%layer_norm_1``, a call of the
    same aten op that no ONNX node was translated from. A node whose record names both reads the
    kept output for each where its inputs stand one for one with the record's arguments (DeiT's
    ``Concat(expand, expand, transpose)`` from ``aten.cat([%expand, %expand_1, %transpose])``,
    its zero class and distillation tokens expanded once). Returns (kept call, merged call, reader,
    the reader's input that is the merged call's, or None for every read of the kept output) for
    each such read, in graph order. ``calls``: each node with an FX record and that record, in
    graph order."""
    calls = [(node, call) for node, call in calls if call.name]
    defined = {call.name for _, call in calls}
    # ONNX tensor -> the FX call that made it, where that call took a parameter
    made = {o: call.name for node, call in calls if any(a in target for a in call.args) for o in node.output}
    op = _fx_op  # layer_norm_1 -> layer_norm
    found: list[tuple[str, str, onnx.NodeProto, int | None]] = []
    for node, call in calls:
        for kept in sorted({made[t] for t in node.input if t in made}):
            lost = next((a for a in call.args if a != kept and a not in defined and op(a) == op(kept)), None)
            if lost and kept not in call.args:
                found.append((kept, lost, node, None))
            elif lost and len(node.input) == len(call.args):
                found += [(kept, arg, node, i) for i, (name, arg) in enumerate(zip(node.input, call.args))
                          if made.get(name) == kept and arg != kept and arg not in defined and op(arg) == op(kept)]
    return found


def _split_computed_once(g: onnx.GraphProto, inits: dict[str, onnx.TensorProto], roles: TorchExportRoles,
                         unnamed: list[str], display: str) -> list[tuple[str, str, str]]:
    """Compute apart again the calls onnxscript's optimizer computed once (:func:`_computed_once`),
    so each trains its own parameters as torch does: the kept call's nodes are copied to read the
    merged call's parameters (initializers of the kept ones' values, as the merge says they were)
    and its readers read the copy.

    The merged call's parameters are named nowhere but the signature. They are taken to be those
    of the one module that has a parameter named like each of the kept call's (``weight``, ``bias``),
    none of them in the file or any FX record, and that is a sibling of the kept call's module
    (``layers.0.post_attention_layernorm`` beside ``layers.0.input_layernorm``); where the kept
    call took one parameter, the one other parameter of its module ending in the same word, named
    nowhere either (DeiT's ``distillation_token`` beside its ``cls_token``). Where no module
    anywhere has parameters named so, the two were one computation torch made twice with the same
    parameters (RWKV's ``k + time_first``, twice a step), which torch trains as one too. Where such
    modules are elsewhere or several fit, or the kept call read a parameter through a folded copy,
    it stays computed once. Returns those left so: (kept call, merged call, a reader's name)."""
    target = roles.targets
    calls = [(node, call) for node in g.node if (call := _fx_call(node)) is not None]
    found = _computed_once(calls, target)
    if not found:
        return []
    nodes_of: dict[str, list[onnx.NodeProto]] = {}
    for node, call in calls:
        if call.name:
            nodes_of.setdefault(call.name, []).append(node)
    fx_name = {t: f for f, t in target.items()}
    modules: dict[str, set[str]] = {}  # module -> its parameters' last name parts
    for param in target.values():
        modules.setdefault(param.rpartition(".")[0], set()).add(param.rpartition(".")[2])
    free = {param.rpartition(".")[0] for param in unnamed}
    free = {m for m in free if all(f"{m}.{leaf}" in unnamed for leaf in modules[m])}
    groups: dict[tuple[str, str], list[tuple[onnx.NodeProto, int | None]]] = {}
    for kept, lost, reader, at in found:
        groups.setdefault((kept, lost), []).append((reader, at))
    lone_free = set(unnamed)  # what a lone kept parameter's sibling may be (below)
    taken = {n.name for n in g.node} | {o for n in g.node for o in n.output} | set(inits)
    left: list[tuple[str, str, str]] = []
    apart: list[str] = []
    for (kept, lost), readers in groups.items():
        nodes = nodes_of[kept]
        outputs = {o for n in nodes for o in n.output}
        params = list(dict.fromkeys(i for n in nodes for i in n.input if i in fx_name))
        through_copies = any(roles.derived_from(i) for n in nodes for i in n.input)
        placed = {id(n) for n, at in readers if at is not None}  # readers told apart by position
        both = any(outputs & set(n.input) and {kept, lost} <= set(c.args) and id(n) not in placed for n, c in calls)
        module = {p.rpartition(".")[0] for p in params}
        leaves = {p.rpartition(".")[2] for p in params}
        parent = next(iter(module)).rpartition(".")[0] if len(module) == 1 else None
        alike = [m for m in sorted(free) if modules[m] == leaves]
        fits = [m for m in alike if parent is not None and m.rpartition(".")[0] == parent]
        # one parameter of the kept call, and its module's other parameter ending in the same word
        # named nowhere: DeiT's cls_token and distillation_token, both zero, expanded once
        lone = [u for u in sorted(lone_free) if len(params) == 1 and u.rpartition(".")[0] in module
                and _last_word(u) == _last_word(params[0])] if not alike else []
        if not alike and not lone:  # one computation torch made twice with the same parameters (RWKV's k + time_first)
            continue
        if through_copies or both or (len(fits) != 1 if alike else len(lone) != 1):
            left.append((kept, lost, readers[0][0].name))
            continue
        if alike:
            free.discard(fits[0])
            swap = {p: f"{fits[0]}.{p.rpartition('.')[2]}" for p in params}
        else:
            lone_free.discard(lone[0])
            swap = {params[0]: lone[0]}
        for param, copy in swap.items():
            inits[copy] = g.initializer.add()
            inits[copy].CopyFrom(inits[param])
            inits[copy].name = copy
        renamed = {o: _fresh(f"{o}_{lost}", taken) for o in outputs}
        at = max(list(g.node).index(n) for n in nodes) + 1
        for k, node in enumerate(nodes):
            clone = onnx.NodeProto()
            clone.CopyFrom(node)
            clone.name = _fresh(f"{node.name}_{lost}", taken)
            clone.input[:] = [swap.get(i, renamed.get(i, i)) for i in node.input]
            clone.output[:] = [renamed.get(o, o) for o in node.output]
            for entry in clone.metadata_props:
                if entry.key == TORCH_FX_NODE:  # the merged call's own record, as torch wrote it
                    entry.value = re.sub(rf"^%{kept} ", f"%{lost} ", entry.value)
                    for param, copy in swap.items():
                        entry.value = entry.value.replace(f"%{fx_name[param]}", f"%{fx_name[copy]}")
            g.node.insert(at + k, clone)
        for reader, where in readers:
            if where is None:
                reader.input[:] = [renamed.get(i, i) for i in reader.input]
            else:
                reader.input[where] = renamed.get(reader.input[where], reader.input[where])
        apart.append(f"%{lost} of %{kept}, with {', '.join(swap.values())}")
    if apart:
        log.info("%s: %d call(s) onnxscript's optimizer computed once with another of equal parameters are computed "
                 "apart again (e.g. %s)", display, len(apart), apart[0])
    return left


def _aligned_reads(node: onnx.NodeProto, args: list[str], target: Mapping[str, str],
                   inits: Mapping[str, onnx.TensorProto]) -> list[int]:
    """The input positions of ``node`` that are initializers, where its inputs stand one for one
    with its FX call's tensor arguments: as many, and the initializers at the very positions of
    the parameters (``Add(mul_42, grn.weight)`` from ``aten.add(%mul_42, %p_grn_bias)``, ConvNeXtV2's
    zero GRN bias merged into its zero weight; ``Mul(lambda_1, linear_5)`` from
    ``aten.mul(%p_lambda_2, %clone_5)``, BEiT's layer scales, the optimizer having dropped the
    clone). There, input i holds argument i, whatever the names of the two parameters end in. Empty
    where they do not stand so (``Gemm(x, w, b)`` from ``aten.addmm(%p_b, %x, %t)``)."""
    if len(node.input) != len(args):
        return []
    at = [i for i, name in enumerate(node.input) if name in inits]
    if not at or at != [i for i, arg in enumerate(args) if arg in target]:
        return []
    return at


def _pair_merged_reads(kept: list[str], merged: list[str], positions: list[int]) -> list[tuple[int, str]]:
    """Which read (input position) of a kept parameter was which merged one, for one node. Only a
    read and a parameter whose names end in the same word pair (``n1.weight`` for ``n2.weight``,
    ``attn.q_bias`` for ``dense.bias``: :func:`_last_word`): a kept parameter the FX node reaches
    through a view (``addmm(%p_bias, %x, %t)``, ``%t`` the weight transposed) is not a merged one.
    One merged parameter takes every read ending like it; several take as many reads in order (an
    aten op's arguments come in its ONNX inputs' order); any other count is left alone."""
    pairs: list[tuple[int, str]] = []
    for suffix in dict.fromkeys(map(_last_word, merged)):
        params = [p for p in merged if _last_word(p) == suffix]
        reads = [at for name, at in zip(kept, positions) if _last_word(name) == suffix]
        if len(params) == 1:
            pairs += [(at, params[0]) for at in reads]
        elif len(params) == len(reads):
            pairs += list(zip(reads, params))
    return pairs


def _last_word(name: str) -> str:
    """``bias`` of ``attn.q_bias`` and of ``dense.bias``: how a parameter's name ends, for pairing
    (fresh VideoMAE's output biases were read through its ``q_bias``: 223 off torch)."""
    return re.split(r"[._]", name)[-1]


def _rename_reads(g: onnx.GraphProto, old: str, new: str) -> None:
    """Every read of ``old`` in ``g`` and its subgraphs becomes a read of ``new``."""
    for node in g.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for sub in _subgraphs(node):
            _rename_reads(sub, old, new)
    for out in g.output:
        if out.name == old:  # a graph output that is the copy itself: keep its name, computed
            g.node.append(helper.make_node("Identity", [new], [old], name=f"{old}_copy"))


def _prepare(model: onnx.ModelProto, dims: dict[str, int], display: str,
             roles: TorchExportRoles | None = None, copy: bool = True,
             loose_dims: Collection[str] | None = None,
             matched_dims: set[str] | None = None,
             dim_names: set[str] | None = None, fold: bool = True,
             inputs_read: list[str] | None = None) -> tuple[onnx.ModelProto, set[str]]:
    """Bind dims, then alternate shape inference and folding; returns (model, folded tensor names).
    ``copy=False`` changes ``model`` itself (one read from a file: its weights are not held twice).
    ``fold=False``: fold Constant nodes only (:func:`import_model`)."""
    if copy:
        model_copy = onnx.ModelProto()
        model_copy.CopyFrom(model)
        model = model_copy
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    g = model.graph
    _split_merged_parameters(model, roles, display)
    if roles is not None:
        _unfold_tied_copies(g, roles, display)
        _merge_folded_copies(g, roles, display)
        _restore_batch_statistics(g, roles, display)
    # An input of optional type that no node reads carries nothing into the step (memplan's own
    # memory-pattern marker, passes/mem_pattern.py, is one; ORT runs without a feed for it).
    read = {n for node in g.node for n in node.input}
    markers = [i for i in g.input if i.type.HasField("optional_type") and i.name not in read]
    for inp in markers:
        g.input.remove(inp)
    init_names = {i.name for i in g.initializer}
    used: set[str] = set()
    unbound: dict[str, str] = {}  # symbolic dim -> first input that has it (in file order)
    for inp in g.input:
        if inp.name in init_names:
            continue
        for d in inp.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                # ORT runs -1 as a dynamic dim; read as a size, it gave the input -16 bytes
                raise ModelImportError(f"{display}: input {inp.name!r} has dim {d.dim_value}, an unnamed dynamic dim, "
                                       "which --dim cannot bind; export the model with static or named input dims")
            if d.HasField("dim_value"):
                continue
            name = d.dim_param
            if name in dims:
                d.Clear()
                d.dim_value = dims[name]
                used.add(name)
            elif not name:
                raise ModelImportError(f"{display}: input {inp.name!r} has an unnamed dynamic dim, which --dim "
                                       "cannot bind; export the model with static or named input dims")
            else:
                unbound.setdefault(name, inp.name)
    if matched_dims is not None:
        matched_dims.update(used)
    if dim_names is not None:
        dim_names.update(used | set(unbound))
    if inputs_read is not None:
        inputs_read.append(display)
    unknown = sorted(set(dims) - used)
    # a typo first: with the dim it meant unbound, the model "could not be loaded" (exit 3), where
    # the usage error (exit 2) is what to fix (--dim bacth=3 on a model with dim batch)
    if unknown:  # a typo, or a model whose dims are fixed: say which dims it has
        names = sorted(used | set(unbound))
        has = f"its symbolic input dims: {', '.join(names)}" if names else "its input dims are all fixed"
        if display.startswith("zoo:"):
            import models  # late, as in load_proto

            name = models.parse_spec(display)[0]
            has += f"; {name} takes the options {', '.join(sorted(set(models.ZOO[name].option_names) - {'size'}))} as --dim or in its name"
        said = f"{', '.join(unknown)} matched no symbolic input dim of {display} ({has})"
        if loose_dims is not None and any(d not in loose_dims for d in unknown):
            raise UnknownDimError(unknown, f"{said}; fix the name, or drop it")
        log.warning("--dim %s", said)
    if unbound:  # every one at once: the user fixes the command line once
        what = ", ".join(f"{d!r} (input {i!r})" for d, i in unbound.items())
        flags = " ".join(f"--dim {d}=N" for d in unbound)
        word = "dims" if len(unbound) > 1 else "dim"
        raise ModelImportError(f"{display}: unbound symbolic {word} {what}; bind with {flags}")
    _refuse_unknown_ops(model, display)
    # Shape inference walks nodes in file order: sort first (this also rejects cycles).
    ordered = _topo_order(g, init_names | {i.name for i in g.input}, display)
    del g.node[:]
    g.node.extend(ordered)
    # Symbolic intermediate shapes would fight the bound dims; shape inference recomputes them.
    # Static ones stay: they carry shapes through ops ONNX cannot infer (MemcpyToHost/FromHost).
    static = [vi for vi in g.value_info if _is_static(vi)]
    declared = {vi.name for vi in static} | {out.name for out in g.output if _is_static(out)}
    del g.value_info[:]
    g.value_info.extend(static)
    g.value_info.extend(_recorded_shapes(model, {vi.name for vi in static}, display))
    for out in g.output:
        if out.type.HasField("tensor_type") and not _is_static(out):
            out.type.tensor_type.ClearField("shape")
    # Until nothing more folds: each round folds at least one node, so it ends within the node
    # count. A shape that needs the folded value of another shape takes one round per link: a
    # pinned model (passes/pin_order.py) chains them through its ordering edges, 11 rounds for the
    # moe fixture's, which a fixed 8 left unshaped (0.2 s for all 11).
    folded: set[str] = set()
    # a float arange over the exporter's 0-d scalars (rotary positions) folds like an int64 one
    constant_floats = roles.non_parameters(g) if roles is not None else set()
    for _ in range(len(g.node) + 1):
        model = _infer(model, display)
        split = _split_sequences(model) | _inline_decided_ifs(model.graph)
        if split:
            model = _infer(model, display)
        # what earlier rounds folded is constant too, float or not (a float folded in one round was
        # read as a trainable initializer in the next: timm's TF-same padding, ceil(size / stride)
        # over a Cast of a Shape, stopped after two rounds and its Pad was refused)
        model, new = _fold(model, display, fold, constant_floats | folded)
        if not new and not split:
            break
        folded |= new
    _refuse_declared_misfits(model, declared, display)
    drop_cast_round_trips(model.graph)
    return model, folded


def _inline_decided_ifs(g: onnx.GraphProto) -> bool:
    """Put the branch an If takes in its place where its condition folded to a constant; True if
    one was. TorchScript writes ``x.squeeze(d)`` over a dim it exported dynamic as
    ``If(Shape(x)[d] == 1, Squeeze, Identity)`` (CANINE's downsampling); bound, the shape is known
    and so is the branch. The branch's own values are renamed apart (an If's prefix), its outputs
    become the If's. Branches that hold subgraphs of their own stay (memplan refuses them)."""
    if not any(node.op_type == "If" for node in g.node):
        return False
    values = {i.name: i for i in g.initializer if i.data_type == onnx.TensorProto.BOOL and len(i.dims) <= 1}
    taken = {o for node in g.node for o in node.output} | {i.name for i in g.initializer} | \
        {i.name for i in g.input} | {n.name for n in g.node}
    changed = False
    for at, node in reversed(list(enumerate(g.node))):
        if node.op_type != "If" or node.domain not in ("", "ai.onnx") or node.input[0] not in values:
            continue
        cond = numpy_helper.to_array(values[node.input[0]])
        if cond.size != 1:
            continue
        branch = next(a.g for a in node.attribute if a.name == ("then_branch" if bool(cond.flat[0]) else "else_branch"))
        if any(True for n in branch.node for _ in _subgraphs(n)) or len(branch.output) != len(node.output):
            continue
        made = {o for n in branch.node for o in n.output} | {i.name for i in branch.initializer}
        rename = {name: _fresh(f"{node.name or node.output[0]}/{name}", taken) for name in sorted(made)}
        out_of = {b.name: o for b, o in zip(branch.output, node.output)}
        nodes = []
        for n in branch.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.input[:] = [rename.get(x, x) for x in n.input]
            copy.output[:] = [out_of.get(x, rename.get(x, x)) if x else x for x in n.output]
            copy.name = f"{node.name}/{n.name or n.op_type}"
            nodes.append(copy)
        produced = {o for n in nodes for o in n.output}
        for init in branch.initializer:
            moved = onnx.TensorProto()
            moved.CopyFrom(init)
            moved.name = out_of.get(init.name, rename[init.name])
            g.initializer.append(moved)
            produced.add(moved.name)
        for b, o in zip(branch.output, node.output):  # an output the branch takes from outside
            if o not in produced:
                nodes.append(helper.make_node("Identity", [rename.get(b.name, b.name)], [o], name=f"{node.name}/{o}"))
        del g.node[at]
        for k, n in enumerate(nodes):
            g.node.insert(at + k, n)
        changed = True
    return changed


def _split_sequences(model: onnx.ModelProto) -> bool:
    """Write each SplitToSequence that only SequenceAt nodes read, at constant positions, as a Split
    (and a Squeeze per chunk where keepdims=0 drops the axis); True if one was. torch's dynamo
    exporter with ``optimize=False`` writes ``torch.chunk`` so (torchvision's ShuffleNet), which its
    optimizer, on by default, writes as Split; memplan plans tensors, not sequences."""
    g, opset = model.graph, _default_opset(model) or 0
    if opset < 13 or not any(n.op_type == "SplitToSequence" for n in g.node):
        return False
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
              for vi in list(g.input) + list(g.value_info) if vi.type.tensor_type.HasField("shape")}
    values = {i.name: initializer_value(i) for i in g.initializer if len(i.dims) <= 1}
    readers = _readers(g)
    nested = {x for node in g.node for sub in _subgraphs(node) for x in _names_read(sub)}
    taken = {o for node in g.node for o in node.output} | {i.name for i in g.initializer} | {i.name for i in g.input}
    changed = False
    for node in list(g.node):
        if node.op_type != "SplitToSequence" or node.domain not in ("", "ai.onnx"):
            continue
        seq = node.output[0]
        users = readers.get(seq, [])
        shape = shapes.get(node.input[0])
        attrs = _plain_attrs(node)
        axis, keep = int(attrs.get("axis", 0)), int(attrs.get("keepdims", 1))
        split = values.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        if (not shape or not -len(shape) <= axis < len(shape) or shape[axis] is None or seq in nested
                or seq in {o.name for o in g.output} or (len(node.input) > 1 and node.input[1] and split is None)
                or any(u.op_type != "SequenceAt" or u.input[1] not in values or values[u.input[1]].size != 1
                       for u in users)):
            continue
        n = shape[axis]
        if split is None:
            sizes = [1] * n
        elif split.ndim == 0:
            size = int(split)
            sizes = [size] * (n // size) + ([n % size] if n % size else [])
        else:
            sizes, keep = [int(v) for v in split], 1
        if not sizes or sum(sizes) != n:
            continue
        positions = [int(values[u.input[1]].reshape(())) for u in users]
        positions = [at + len(sizes) if at < 0 else at for at in positions]
        if not all(0 <= at < len(sizes) for at in positions):
            continue
        chunks: list[str | None] = [None] * len(sizes)
        after: list[onnx.NodeProto] = []
        first: dict[int, str] = {}  # position -> its first reader's output
        for user, at in zip(users, positions):
            if at in first:  # read twice: the same tensor
                after.append(helper.make_node("Identity", [first[at]], [user.output[0]], name=f"{user.name}_again"))
                continue
            first[at] = user.output[0]
            if keep:
                chunks[at] = user.output[0]
            else:
                chunks[at] = _fresh(f"{user.output[0]}_unsqueezed", taken)
                after.append(helper.make_node("Squeeze", [chunks[at], _new_int64(g, [axis], taken)],
                                              [user.output[0]], name=f"{user.name}_squeeze"))
        outs = [c or _fresh(f"{seq}_{i}", taken) for i, c in enumerate(chunks)]
        at_index = list(g.node).index(node)
        made = [helper.make_node("Split", [node.input[0], _new_int64(g, sizes, taken)], outs, name=node.name,
                                 axis=axis), *after]
        g.node.remove(node)
        for user in users:
            g.node.remove(user)
        for offset, new in enumerate(made):
            g.node.insert(at_index + offset, new)
        changed = True
    return changed


def _readers(g: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes of ``g`` that read it, in graph order."""
    out: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _new_int64(g: onnx.GraphProto, values: list[int], taken: set[str]) -> str:
    name = _fresh("split_sizes" if len(values) > 1 else "split_axis", taken)
    g.initializer.append(numpy_helper.from_array(np.array(values, dtype=np.int64), name))
    return name


def _names_read(g: onnx.GraphProto) -> set[str]:
    """Every name the nodes of ``g`` and their subgraphs read."""
    out = {x for node in g.node for x in node.input}
    for node in g.node:
        for sub in _subgraphs(node):
            out |= _names_read(sub)
    return out


def _node_reads(node: onnx.NodeProto) -> set[str]:
    """What ``node`` reads, its subgraphs' reads of outer names included (an If's branch reading a
    value no node input names: folding dropped CANINE's MaxPool, whose output only the branch of a
    squeeze's If read)."""
    out = set(node.input)
    for sub in _subgraphs(node):
        out |= _names_read(sub)
    return out


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs ``node``'s attributes hold (an If's branches, a Loop's body)."""
    for attr in node.attribute:
        if attr.HasField("g"):
            yield attr.g
        yield from attr.graphs


def _refuse_declared_misfits(model: onnx.ModelProto, declared: set[str], display: str) -> None:
    """Refuse a default-domain node whose output shape the file declares where the node's own
    shape inference fails on its inputs (a MatMul of [2, 3] by [2, 3]) or gives another shape:
    onnx's inference (strict_mode=False) skips the node and keeps the declared shape, so memplan
    planned a model ORT refuses at session creation ("Incompatible dimensions for matrix
    multiplication"), or sizes ORT does not make (h declared [5, 5] for a [2, 3] by [3, 4] MatMul:
    ORT 1.31 loads it and makes [2, 4]). Checked node by node, only where an output is declared: strict_mode=True on
    the whole model refused models ORT runs (GroupNormalization-18, MeanVarianceNormalization without
    axes: errors inside their function bodies) and memplan's own more precise errors (a Reshape's
    size)."""
    g = model.graph
    opset = _default_opset(model)
    if opset is None or not declared:
        return
    types = {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)}
    for init in g.initializer:
        types.setdefault(init.name, helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    for node in g.node:
        if node.domain not in ("", "ai.onnx") or declared.isdisjoint(node.output) \
                or any(x and x not in types for x in node.input):
            continue
        schema = op_schema(node.op_type, opset)
        if schema is None or not schema.has_type_and_shape_inference_function:
            continue  # None: memplan's own MemcpyToHost/FromHost
        shapes = ", ".join(_shape_text(types[x]) for x in node.input if x)
        what = f"{display}: node {node.name or '(unnamed)'!r} ({node.op_type}, opset {opset}) with inputs of shape {shapes}"
        try:
            inferred = shape_inference.infer_node_outputs(schema, node, {x: types[x] for x in node.input if x},
                                                          opset_imports=list(model.opset_import))
        except (shape_inference.InferenceError, onnx.checker.ValidationError) as err:  # shapes; types
            raise ModelImportError(f"{what}: {first_line(err)}; the file declares its output shape, which hid this "
                                   "from shape inference, and ONNX Runtime refuses the model: fix or re-export it") from None
        for name, out in inferred.items():
            if name not in declared or not out.tensor_type.HasField("shape"):
                continue
            mine = [d.dim_value if d.HasField("dim_value") else None for d in out.tensor_type.shape.dim]
            theirs = [d.dim_value for d in types[name].tensor_type.shape.dim]
            if len(mine) != len(theirs) or any(m is not None and m != t for m, t in zip(mine, theirs)):
                raise ModelImportError(
                    f"{what} makes {name!r} of shape {_shape_text(out)}; the file declares {_shape_text(types[name])}, "
                    "which memplan would plan (ONNX Runtime makes the node's own shape): fix or drop the file's "
                    "value_info for it")


def _shape_text(t: onnx.TypeProto) -> str:
    return str([d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.tensor_type.shape.dim])


#: Metadata key of a file memplan wrote without static shapes (a --pin-order model): name ->
#: [dtype, shape] of the tensors onnx cannot infer there (passes.onnx_export.hidden_shapes).
SHAPES_KEY = "memplan.shapes"


def _recorded_shapes(model: onnx.ModelProto, known: set[str], display: str) -> list[onnx.ValueInfoProto]:
    """Static value_info for the shapes ``model`` records under ``SHAPES_KEY`` (none known yet)."""
    text = next((p.value for p in model.metadata_props if p.key == SHAPES_KEY), None)
    if text is None:
        return []
    try:
        recorded = json.loads(text)
        out = [helper.make_tensor_value_info(name, DTYPE_TO_ONNX[dtype], [int(d) for d in shape])
               for name, (dtype, shape) in recorded.items() if name not in known]
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ModelImportError(f"{display}: metadata {SHAPES_KEY!r} is not memplan's; write the model again "
                               "with memplan (plan --emit or rewrite)") from None
    return out


_T = onnx.TensorProto
#: Element type -> the types that hold every one of its values. ORT drops a Cast to such a type and
#: the Casts back from it (RemoveDuplicateCastTransformer, which runs whatever the optimization
#: level); measured on ORT 1.31 for x -> Cast(T1) -> Cast(back to x's type), nine types each way:
#: float -> float16 -> float stays, float -> double -> float goes, int32 -> float -> int32 stays.
_HOLDS_EVERY_VALUE: Mapping[int, frozenset[int]] = {
    _T.FLOAT: frozenset({_T.FLOAT, _T.DOUBLE}),
    _T.DOUBLE: frozenset({_T.DOUBLE}),
    _T.FLOAT16: frozenset({_T.FLOAT16, _T.FLOAT, _T.DOUBLE}),
    _T.BFLOAT16: frozenset({_T.BFLOAT16, _T.FLOAT, _T.DOUBLE}),
    _T.INT64: frozenset({_T.INT64}),
    _T.INT32: frozenset({_T.INT32, _T.INT64, _T.DOUBLE}),
    _T.INT8: frozenset({_T.INT8, _T.INT32, _T.INT64, _T.FLOAT16, _T.BFLOAT16, _T.FLOAT, _T.DOUBLE}),
    _T.UINT8: frozenset({_T.UINT8, _T.INT32, _T.INT64, _T.FLOAT16, _T.BFLOAT16, _T.FLOAT, _T.DOUBLE}),
    _T.BOOL: frozenset({_T.BOOL, _T.INT8, _T.UINT8, _T.INT32, _T.INT64, _T.FLOAT16, _T.BFLOAT16, _T.FLOAT,
                        _T.DOUBLE}),
}


def drop_cast_round_trips(g: onnx.GraphProto) -> int:
    """Take out the Cast round trips ORT takes out before it runs a model, so that the graph memplan
    plans is the one ORT runs (each took a buffer the run never allocates: 512 KiB a layer in an
    eager-attention Llama's ``softmax(dtype=float32).to(float32)``). Returns the Casts dropped.

    In file order, for each Cast A from type S to a type that holds every value of S: when every
    Cast reading A's output casts back to S and is no graph output, those Casts go and their
    readers read A's input; A goes too when it had readers, all of them went, and it is no graph
    output. ORT also drops some cases this leaves (a Cast to a third type beside the round trip, a
    round trip that is a graph output); leaving those in over-counts, never under-counts, the
    memory of the run.
    """
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in g.node for a in n.attribute):
        return 0  # a subgraph may read a Cast's output by name: not worth following
    elem = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info, *g.output]}
    elem.update({t.name: t.data_type for t in g.initializer})
    outputs = {o.name for o in g.output}
    readers: dict[str, list[tuple[int, int]]] = {}
    for i, node in enumerate(g.node):
        for k, name in enumerate(node.input):
            readers.setdefault(name, []).append((i, k))
    gone: set[int] = set()

    def cast_to(i: int) -> int | None:
        node = g.node[i]
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
            return None
        return next((a.i for a in node.attribute if a.name == "to"), None)

    for i, node in enumerate(g.node):
        if i in gone or cast_to(i) is None or not node.input or not node.output:
            continue
        src, out = elem.get(node.input[0]), node.output[0]
        if cast_to(i) not in _HOLDS_EVERY_VALUE.get(src, ()):
            continue
        edges = [e for e in readers.get(out, []) if e[0] not in gone]
        back = sorted({j for j, _ in edges if cast_to(j) is not None})
        if not back or any(cast_to(j) != src or g.node[j].output[0] in outputs for j in back):
            continue
        for j in back:
            for r, k in readers.pop(g.node[j].output[0], []):
                g.node[r].input[k] = node.input[0]
                readers.setdefault(node.input[0], []).append((r, k))
            gone.add(j)
        if out not in outputs and all(j in gone for j, _ in edges):
            gone.add(i)
    if gone:
        dropped = {o for i in gone for o in g.node[i].output}
        kept = [n for i, n in enumerate(g.node) if i not in gone]
        del g.node[:]
        g.node.extend(kept)
        vis = [vi for vi in g.value_info if vi.name not in dropped]
        del g.value_info[:]
        g.value_info.extend(vis)
    return len(gone)


def _is_static(vi: onnx.ValueInfoProto) -> bool:
    tt = vi.type.tensor_type
    return vi.type.HasField("tensor_type") and tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)


def _infer(model: onnx.ModelProto, display: str) -> onnx.ModelProto:
    # Shapes left symbolic by an earlier round (unk__N) would stick: let inference redo them.
    g = model.graph
    static = [vi for vi in g.value_info if _is_static(vi)]
    del g.value_info[:]
    g.value_info.extend(static)
    for _ in range(len(g.node) + 1):
        try:
            # a model over protobuf's 2 GB cannot go to onnx's C++ whole
            inferred = shape_inference.infer_shapes(without_weights(model), check_type=False, strict_mode=False,
                                                    data_prop=True)
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, RuntimeError) as err:
            first = first_line(err)
            raise ModelImportError(f"{display}: ONNX shape inference failed: {first}") from None
        del g.value_info[:]
        g.value_info.extend(inferred.graph.value_info)
        for out, new in zip(g.output, inferred.graph.output):
            out.CopyFrom(new)
        if _floor_empty_ceil_windows(g, display):
            # shapes downstream of the pool were inferred from its old size: infer them again
            del g.value_info[:]
            for out in g.output:
                if out.type.HasField("tensor_type"):
                    out.type.tensor_type.ClearField("shape")
            continue
        if not _shape_like_input(model):
            return model
    return model


def _plain_attrs(node: onnx.NodeProto) -> dict[str, Any]:
    """``node``'s attributes by name, string ones as str (onnx gives bytes)."""
    return {a.name: v.decode() if isinstance(v := helper.get_attribute_value(a), bytes) else v
            for a in node.attribute}


#: Pools whose ceil_mode output size ORT (and the ONNX spec since opset 19's note) cuts back where
#: the last window would start past the input and its begin pad.
_CEIL_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})


def _floor_empty_ceil_windows(g: onnx.GraphProto, display: str) -> bool:
    """Set ceil_mode=0 on pools whose ceil_mode=1 output onnx's shape inference sizes with a last
    window that starts past the input and its begin pad: ORT drops that window, so its output is
    one smaller there, which is the floor size; memplan planned (and differentiated) the larger
    one, and the training graph failed in ORT. Whether any node changed (then inference runs
    again). A node where the floor size is not ORT's on every axis is refused in one line."""
    known = {vi.name: [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
             for vi in list(g.input) + list(g.value_info) + list(g.output)
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
    for init in g.initializer:
        known.setdefault(init.name, list(init.dims))
    changed = False
    for node in g.node:
        if node.op_type not in _CEIL_POOLS or node.domain not in ("", "ai.onnx") or not node.input:
            continue
        attrs = _plain_attrs(node)
        if not int(attrs.get("ceil_mode", 0)) or attrs.get("auto_pad", "NOTSET") != "NOTSET":
            continue
        x, y = known.get(node.input[0]), known.get(node.output[0])
        if not x or not y or len(x) != len(y) or None in x[2:] or None in y[2:]:
            continue
        sp = len(x) - 2
        kernel = [int(k) for k in attrs.get("kernel_shape", [])]
        strides = [int(v) for v in attrs.get("strides", [])] or [1] * sp
        dilations = [int(v) for v in attrs.get("dilations", [])] or [1] * sp
        pads = [int(v) for v in attrs.get("pads", [])] or [0] * (2 * sp)
        if len(kernel) != sp:
            continue
        ort_sizes, floor_sizes = [], []
        for i in range(sp):
            n, out, s = x[2 + i], y[2 + i], strides[i]
            ort_sizes.append(out - 1 if out > 1 and (out - 1) * s >= n + pads[i] else out)
            span = n + pads[i] + pads[sp + i] - (dilations[i] * (kernel[i] - 1) + 1)
            floor_sizes.append(span // s + 1)
        if ort_sizes == y[2:]:
            continue
        if ort_sizes != floor_sizes:
            raise ModelImportError(
                f"{display}: node {node.name!r} ({node.op_type}, ceil_mode=1) has windows that start past its "
                f"input and pads; ONNX Runtime's output is spatially {ort_sizes}, onnx's shape inference gives "
                f"{y[2:]}: export it with ceil_mode=0 or with pads that end inside the window"
            )
        for a in node.attribute:
            if a.name == "ceil_mode":
                a.i = 0
        changed = True
    return changed


#: Initializers with more raw bytes than this are set aside while onnx infers shapes.
ASIDE_BYTES = 1 << 20
#: The external-data location that marks a set-aside initializer.
ASIDE = "memplan-weights-set-aside"


def without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose large initializers hold no bytes (marked as external data at
    ``ASIDE``, which shape inference and the version converter do not read; their dims stay), or
    ``model`` itself when it has none. Both serialize the model, which protobuf refuses above 2 GB
    (a 2.2 GB model raised a ValueError traceback); the shapes they need from initializers are in
    their dims, and the small int tensors data propagation reads stay. A copy, not the model with
    its bytes cleared and put back: protobuf's arena keeps a cleared field's bytes until the
    message goes, so each round held the weights once more (+4.3 GB on that model)."""
    big = [t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL
           and tensor_bytes(t) > ASIDE_BYTES]
    if not big:
        return model
    names = {t.name for t in big}
    g = model.graph
    light = onnx.GraphProto(name=g.name, doc_string=g.doc_string)
    for field in ("node", "input", "output", "value_info", "sparse_initializer", "quantization_annotation"):
        getattr(light, field).extend(getattr(g, field))
    for t in g.initializer:
        if t.name not in names:
            light.initializer.append(t)
            continue
        stub = light.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims,
                                     data_location=onnx.TensorProto.EXTERNAL)
        stub.external_data.add(key="location", value=ASIDE)
    out = onnx.ModelProto(ir_version=model.ir_version, producer_name=model.producer_name, domain=model.domain,
                          model_version=model.model_version)
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.graph.CopyFrom(light)
    return out


def tensor_bytes(t: onnx.TensorProto) -> int:
    """Bytes of a tensor's data, from its dims (upb's ByteSize serializes it: 4.5 s for 512 MiB)."""
    if t.data_type not in MAPPABLE:
        return t.ByteSize()
    return int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


#: Ops whose output has their first input's shape and type, for which onnx infers no shape (function
#: ops without an inference function: GroupNormalization in onnx 1.23, MeanVarianceNormalization
#: without its axes attribute).
SHAPE_OF_INPUT = frozenset({"GroupNormalization", "MeanVarianceNormalization"})


def _shape_like_input(model: onnx.ModelProto) -> bool:
    """Give an unshaped output of a SHAPE_OF_INPUT op its input's shape as value_info, and an
    unshaped statistics output of a BatchNormalization of opset 7-13 its per-channel shape (onnx
    infers only Y there; a reader of one, such as a pinned model's sink, got no shape: ``memplan
    verify`` refused memplan's own --pin-order file); whether any was given (then inference runs
    again, for what reads it)."""
    g = model.graph
    known = {vi.name: vi for vi in list(g.input) + list(g.value_info) + list(g.output) if _is_static(vi)}
    for init in g.initializer:  # an op fed by a weight itself (fuzzed, stop 49)
        known.setdefault(init.name, helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    opsets = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    added = False
    for node in g.node:
        x = known.get(node.input[0]) if node.input else None
        if x is not None and node.op_type == "BatchNormalization" and len(x.type.tensor_type.shape.dim) >= 2:
            for k, name in enumerate(node.output):
                if name and name not in known and _batchnorm_statistics_output(node, k, opsets):
                    channels = x.type.tensor_type.shape.dim[1].dim_value
                    vi = helper.make_tensor_value_info(name, x.type.tensor_type.elem_type, [channels])
                    g.value_info.append(vi)
                    known[name] = vi
                    added = True
        if node.op_type in SHAPE_OF_INPUT and node.input and node.input[0] in known and node.output \
                and node.output[0] and node.output[0] not in known:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(known[node.input[0]])
            vi.name = node.output[0]
            vi.doc_string = ""
            g.value_info.append(vi)
            known[vi.name] = vi
            added = True
    return added


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[tuple[int, ...], int]]:
    out: dict[str, tuple[tuple[int, ...], int]] = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        if all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = (tuple(d.dim_value for d in tt.shape.dim), tt.elem_type)
    for init in g.initializer:
        out[init.name] = (tuple(init.dims), init.data_type)
    return out


def _fold(model: onnx.ModelProto, display: str, computed: bool = True,
          constant_floats: Collection[str] = ()) -> tuple[onnx.ModelProto, set[str]]:
    """Replace nodes computable from constants by initializers (``computed=False``: Constant nodes
    only, as ORT_DISABLE_ALL does). Float initializers count as trainable, so never constant, but
    ``constant_floats`` (torch.export's buffers and Python scalars: TorchExportRoles). Returns
    (model, folded names)."""
    g = model.graph
    trainable_like = {
        i.name for i in g.initializer if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                                                          onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    } - set(constant_floats)
    consts: dict[str, np.ndarray] = {
        i.name: initializer_value(i) for i in g.initializer if i.name not in trainable_like
    }
    shapes = _static_shapes(model)
    graph_outputs = {o.name for o in g.output}
    read_before = {n for node in g.node for n in _node_reads(node)} | graph_outputs
    keep: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    for node in g.node:
        if node.op_type in CONTROL_FLOW or node.op_type in RANDOM_OPS or node.domain not in ("", "ai.onnx") or (
                not computed and node.op_type != "Constant"):
            keep.append(node)
            continue
        if node.op_type in ("Shape", "Size") and not any(o in read_before for o in node.output if o):
            # nothing reads it, but ORT runs it, and so frees its input once read (the reader kept
            # below for an output whose only readers were folded)
            keep.append(node)
            continue
        value = None
        if node.op_type == "Constant":
            value = [numpy_helper.to_array(_constant_value(node, display))]
        elif node.op_type == "Shape" and node.input[0] in shapes:
            value = [_shape_of(node, shapes[node.input[0]][0])]
        elif node.op_type == "Size" and node.input[0] in shapes:
            value = [np.array(int(np.prod(shapes[node.input[0]][0])), dtype=np.int64)]
        elif node.op_type in FOLDABLE and all(not n or n in consts for n in node.input):
            value = _evaluate(node, [consts[n] if n else None for n in node.input], model.opset_import)
        too_big = node.op_type != "Constant" and any(v is not None and v.size > FOLD_MAX_ELEMENTS for v in value or [])
        if value is None or too_big or any(v is None for v in value) or any(
            o in graph_outputs for o in node.output
        ):
            keep.append(node)
            continue
        for name, v in zip(node.output, value):
            if name:
                consts[name] = v
                new_inits.append(numpy_helper.from_array(np.asarray(v), name))
    if not new_inits:
        return model, set()
    # Drop nodes only folded readers read: a Mul whose output only a Size read was left unread, and
    # ORT holds an unread output to the end (the written model peaked 1.5x the source file, where
    # ORT runs the Size first and frees it). Then the chain behind them; a node that was unread in
    # the file stays, as ORT runs it.
    while True:
        read_now = {n for node in keep for n in _node_reads(node)} | graph_outputs
        dead = [node for node in keep if any(o in read_before for o in node.output if o)
                and not any(o in read_now for o in node.output if o)
                and node.op_type not in CONTROL_FLOW and node.op_type not in RANDOM_OPS
                and node.domain in ("", "ai.onnx")]
        if not dead:
            break
        gone = {id(d) for d in dead}
        keep = [node for node in keep if id(node) not in gone]
    # A node that stays (another output is read) with an output only folded or dropped nodes read:
    # ORT would hold that output to the end where the file freed it after its reader (a Split half
    # only a Shape read: the written model peaked 1.33x the source file). A Shape reads it right
    # after, as the source's reader did, and ORT frees it there.
    read_now = {n for node in keep for n in _node_reads(node)} | graph_outputs
    names = read_before | {o for node in g.node for o in node.output} | {i.name for i in g.initializer} \
        | {i.name for i in g.input} | {n.name for n in g.node}
    readers: list[onnx.NodeProto] = []
    for node in keep:
        readers.append(node)
        for o in node.output:
            if o and o in read_before and o not in read_now:
                name = fresh_name(f"{o}__read", names)
                readers.append(helper.make_node("Shape", [o], [name], name=name))
    keep = readers
    # Drop folded initializers nothing reads any more (e.g. a Shape's input chain).
    del g.node[:]
    g.node.extend(keep)
    g.initializer.extend(new_inits)
    used = {n for node in g.node for n in node.input} | {o.name for o in g.output}
    kept_inits = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    return model, {i.name for i in new_inits}


def _constant_value(node: onnx.NodeProto, display: str) -> onnx.TensorProto:
    attr = node.attribute[0] if node.attribute else None
    if attr is None:
        raise ModelImportError(f"{display}: Constant node {node.name!r} has no value")
    if attr.name == "value":
        return attr.t
    v = helper.get_attribute_value(attr)
    if attr.name in ("value_float", "value_int"):
        arr = np.array(v, dtype=np.float32 if attr.name == "value_float" else np.int64)
    elif attr.name in ("value_floats", "value_ints"):
        arr = np.array(list(v), dtype=np.float32 if attr.name == "value_floats" else np.int64)
    else:
        raise ModelImportError(f"{display}: Constant node {node.name!r} uses unsupported attribute {attr.name!r}")
    return numpy_helper.from_array(arr)


def _shape_of(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    rank = len(shape)
    start = attrs.get("start", 0)
    end = attrs.get("end", rank)
    start = max(0, min(rank, start + rank if start < 0 else start))
    end = max(0, min(rank, end + rank if end < 0 else end))
    return np.array(shape[start:end], dtype=np.int64)


def _evaluate(node: onnx.NodeProto, inputs: list[np.ndarray | None], opsets: Any) -> list[np.ndarray] | None:
    """Run one node on constant inputs with ONNX's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" if v is not None else "" for k, v in enumerate(inputs)]
    n = helper.make_node(node.op_type, names, [f"o{k}" if o else "" for k, o in enumerate(node.output)],
                         domain=node.domain)
    n.attribute.extend(node.attribute)
    g = helper.make_graph(
        [n], "fold",
        [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for nm, v in zip(names, inputs) if v is not None],
        [helper.make_tensor_value_info(f"o{k}", onnx.TensorProto.UNDEFINED, None)
         for k, o in enumerate(node.output) if o],
    )
    m = helper.make_model(g, opset_imports=list(opsets))
    try:
        # inf and nan are values like any other here (T5's position buckets take log(0) and mask it
        # out later): numpy's warnings about them would only be noise on the user's terminal
        with np.errstate(all="ignore"):
            result = ReferenceEvaluator(m).run(None, {nm: v for nm, v in zip(names, inputs) if v is not None})
    except Exception as err:  # noqa: BLE001 - folding is an optimisation; the node then stays
        log.debug("not folding %s (%s): %s", node.name, node.op_type, err)
        return None
    out = iter(np.asarray(r) for r in result)
    return [next(out) if o else None for o in node.output]


def _topo_order(g: onnx.GraphProto, available: set[str], display: str) -> list[onnx.NodeProto]:
    """Stable topological order (file order where possible); raises on cycles and unknown inputs."""
    producers: dict[str, int] = {}
    for i, node in enumerate(g.node):
        for o in node.output:
            if o:
                if o in producers or o in available:
                    raise ModelImportError(f"{display}: tensor {o!r} is produced twice (node {node.name!r})")
                producers[o] = i
    deps: list[set[int]] = []
    for node in g.node:
        d = set()
        for name in node.input:
            if not name or name in available:
                continue
            if name not in producers:
                raise ModelImportError(
                    f"{display}: node {node.name!r} ({node.op_type}) reads {name!r}, which no node, input or "
                    "initializer provides"
                )
            d.add(producers[name])
        deps.append(d)
    users: list[list[int]] = [[] for _ in g.node]
    indeg = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    import heapq

    ready = [i for i, k in enumerate(indeg) if k == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indeg[u] -= 1
            if indeg[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(g.node):
        stuck = next(i for i, k in enumerate(indeg) if k > 0)
        node = g.node[stuck]
        raise ModelImportError(
            f"{display}: the graph has a cycle through node {node.name or stuck!r} ({node.op_type}); "
            "ONNX graphs must be acyclic"
        )
    return [g.node[i] for i in order]


def _attr_value(attr: onnx.AttributeProto, node: onnx.NodeProto, display: str) -> Any:
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise ModelImportError(
            f"{display}: node {node.name!r} ({node.op_type}) has a subgraph attribute {attr.name!r}; "
            "control flow is not supported"
        )
    v = helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(v)
    if attr.type == onnx.AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in v]
    if isinstance(v, bytes) and attr.type == onnx.AttributeProto.STRING:
        return v.decode("utf-8", errors="replace")
    if attr.type == onnx.AttributeProto.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in v]
    if isinstance(v, list):
        return list(v)
    return v


def _to_graph(model: onnx.ModelProto, display: str, folded: set[str], dims_bound: bool = False) -> Graph:
    g = model.graph
    shapes = _static_shapes(model)
    opsets = {o.domain if o.domain != "ai.onnx" else "": o.version for o in model.opset_import}
    b = GraphBuilder(name=g.name or Path(display).stem, opsets=opsets)
    bn_stats = {n.input[k] for n in g.node if n.op_type == "BatchNormalization" for k in (3, 4) if len(n.input) > k}
    init_names = {i.name for i in g.initializer}
    read = {name for node in g.node for name in node.input} | {out.name for out in g.output}
    for inp in g.input:
        if inp.name in init_names:
            continue
        kind = inp.type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            # a sequence, optional, map or sparse input has no tensor shape: saying a dim may be
            # unbound sent users to --dim, which cannot help
            what = {"sequence_type": "a sequence", "optional_type": "an optional", "map_type": "a map",
                    "sparse_tensor_type": "a sparse tensor"}.get(kind, kind)
            raise ModelImportError(
                f"{display}: graph input {inp.name!r} is {what}; memplan plans dense tensors only: export the "
                "model with tensor inputs (a fixed number of them)"
            )
        shape, et = _require_shape(inp.name, shapes, display, "graph input")
        b.input(inp.name, _dtype(et, inp.name, display), shape)
    overridable = {inp.name for inp in g.input}
    for init in g.initializer:
        if init.name not in read and init.name not in overridable:
            # ORT drops an initializer nothing reads when it loads the model: no part of the base
            # (a 64 MiB unused weight made inspect say 66 MiB for a run that holds 2 MiB)
            continue
        value = initializer_value(init)
        dtype = ONNX_TO_DTYPE.get(init.data_type)
        if dtype is None:
            raise ModelImportError(f"{display}: initializer {init.name!r} has unsupported element type")
        trainable = dtype in FLOAT_DTYPES and init.name not in bn_stats \
            and init.name not in folded
        b.initializer(init.name, value, trainable=trainable)
    for node in _topo_order(g, set(b._by_name), display):  # noqa: SLF001 - builder is ours
        if node.op_type in CONTROL_FLOW:
            raise ModelImportError(
                f"{display}: node {node.name or '(unnamed)'!r} is {'an' if node.op_type[0] in 'AEIOU' else 'a'} "
                f"{node.op_type}; control flow is not supported "
                "(export the model with static control flow)"
            )
        ins = []
        for name in node.input:
            ins.append(b.id(name) if name else NO_TENSOR)
        if node.op_type in BROADCASTING and node.domain in ("", "ai.onnx"):
            _check_broadcast(node, [b.tensor(t).shape for t in ins if t != NO_TENSOR], display, dims_bound)
        if node.op_type == "Einsum" and node.domain in ("", "ai.onnx"):
            _check_einsum_letters(node, [b.tensor(t).shape for t in ins], display)
        if node.op_type in ("Conv", "ConvTranspose") and node.domain in ("", "ai.onnx") and len(ins) > 2 \
                and ins[2] != NO_TENSOR:
            _check_conv_bias(node, b.tensor(ins[1]).shape, b.tensor(ins[2]).shape, display)
        if node.op_type in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss") \
                and node.domain in ("", "ai.onnx") and len(ins) > 1:
            _check_loss_labels(node, b.tensor(ins[0]).shape, b.tensor(ins[1]).shape, display, dims_bound)
        if node.op_type == "ConvTranspose" and node.domain in ("", "ai.onnx") and node.output \
                and node.output[0] in shapes:
            _check_same_conv_transpose(node, b.tensor(ins[0]).shape, shapes[node.output[0]][0], display)
        if node.op_type == "Reshape" and node.domain in ("", "ai.onnx") and node.output and node.output[0] in shapes:
            # onnx's shape inference takes a constant shape as it is, whatever the input's size: the
            # planner then counted a tensor that cannot exist (ORT fails the run at this node)
            (before, n_before), (after, n_after) = ((shape, int(np.prod(shape, dtype=np.int64))) for shape in
                                                    (b.tensor(ins[0]).shape, shapes[node.output[0]][0]))
            if n_before != n_after:
                raise ModelImportError(
                    f"{display}: node {node.name or '(unnamed)'!r} (Reshape) reshapes {node.input[0]!r}, "
                    f"{'x'.join(map(str, before)) or 'a scalar'} ({n_before} elements), "
                    f"to {'x'.join(map(str, after)) or 'a scalar'} ({n_after} elements)"
                )
        outs = []
        for k, name in enumerate(node.output):
            if name and name not in shapes and _batchnorm_statistics_output(node, k, opsets):
                # BatchNormalization before opset 14 runs in training mode (batch statistics) when it
                # has these outputs; dropping them would make it an inference-mode node (and ORT crashes
                # on the emptied names), so they stay, per channel
                outs.append((name, b.tensor(ins[0]).dtype, (b.tensor(ins[0]).shape[1],)))
                continue
            if not name or (name not in shapes and name not in read and _optional_output(node, k, opsets)):
                # an optional output nothing reads and shape inference leaves unknown (Dropout-7's
                # mask): the node runs without it
                outs.append(None)
                continue
            if name not in shapes:
                _refuse_uninferred_version(node, opsets, display)
            if name not in shapes and node.op_type == "Reshape":
                _explain_reshape(node, shapes, g, display)
            if name not in shapes and node.op_type == "Squeeze":
                _explain_squeeze(node, shapes, g, display)
            if name not in shapes and node.domain not in ("", "ai.onnx"):
                hint = (" (ONNX Runtime's graph optimizations write fused com.microsoft ops: use the model from "
                        "before them)" if node.domain.startswith("com.microsoft") else "")
                raise ModelImportError(
                    f"{display}: onnx infers no shape for tensor {name!r}, output of node {node.name!r} "
                    f"({node.op_type}, domain {node.domain}), an op its shape inference does not know; give memplan "
                    f"the model in standard ONNX ops{hint}"
                )
            if name not in shapes and node.op_type in SEQUENCE_OPS:
                raise ModelImportError(
                    f"{display}: node {node.name!r} ({node.op_type}) makes a sequence, {name!r}; memplan plans "
                    "tensors only: export the model without sequence ops (a fixed number of tensors)"
                )
            if name not in shapes and node.op_type in OPTIONAL_OPS and node.domain in ("", "ai.onnx"):
                raise ModelImportError(
                    f"{display}: node {node.name!r} ({node.op_type}) makes an optional, {name!r}; memplan plans "
                    "tensors only: export the model without Optional ops"
                )
            if name not in shapes and node.op_type in DATA_SHAPED_OPS and node.domain in ("", "ai.onnx") \
                    and (node.op_type in VALUE_SHAPED_OPS or any(
                        b.tensor(t).kind in (TensorKind.INPUT, TensorKind.ACTIVATION) for t in ins[1:] if t != NO_TENSOR)):
                raise ModelImportError(
                    f"{display}: the shape of {name!r}, output of node {node.name!r} ({node.op_type}), depends on "
                    "the values of its inputs, not only their shapes (a data-dependent shape); memplan plans static "
                    "shapes: make the shape, count or size a constant in the model (e.g. an initializer) or "
                    "export without this op"
                )
            given = ", ".join(str(list(b.tensor(t).shape)) for t in ins if t != NO_TENSOR)
            shape, et = _require_shape(name, shapes, display, f"output of node {node.name!r} ({node.op_type}) "
                                       f"with inputs of shape {given or 'none'}")
            outs.append((name, _dtype(et, name, display), shape))
        attrs = {a.name: _attr_value(a, node, display) for a in node.attribute}
        if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and (pad := _padding_idx(node)) is not None:
            attrs[PADDING_IDX] = pad
        if node.op_type == "MeanVarianceNormalization" and node.domain in ("", "ai.onnx") and "axes" not in attrs:
            # its default written out: onnx's checker cannot expand the function body without it
            attrs["axes"] = [0, 2, 3]
        name = node.name or None  # the builder makes every name unique
        b.node(node.op_type, ins, outs, name=name, domain=node.domain if node.domain != "ai.onnx" else "",
               attrs=attrs)
    for out in g.output:
        if not b.has(out.name):
            raise ModelImportError(f"{display}: graph output {out.name!r} is never produced")
        b.output(b.id(out.name))
    try:
        return b.build()
    except PlannerError as err:
        raise ModelImportError(f"{display}: {err}") from None


def _batchnorm_statistics_output(node: onnx.NodeProto, k: int, opsets: Mapping[str, int]) -> bool:
    """Output ``k`` is one of the statistics of a BatchNormalization of opset 7-13, whose mode its
    output count sets (training with mean, var, saved mean, saved var; inference with Y alone)."""
    return (node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx") and 1 <= k <= 4
            and 7 <= opsets.get("", 1) < 14)


def _optional_output(node: onnx.NodeProto, k: int, opsets: Mapping[str, int]) -> bool:
    """Output ``k`` of ``node`` is optional in its operator's schema at the model's opset."""
    domain = node.domain if node.domain != "ai.onnx" else ""
    schema = op_schema(node.op_type, opsets.get(domain, 1), domain)
    if schema is None:
        return False
    outputs = schema.outputs
    return k < len(outputs) and outputs[k].option == onnx.defs.OpSchema.FormalParameterOption.Optional


def _explain_reshape(node: onnx.NodeProto, shapes: Mapping[str, tuple[tuple[int, ...], int]],
                     g: onnx.GraphProto, display: str) -> None:
    """Raise the reason a Reshape got no shape when its target is a constant that cannot hold
    its input: typically a size the exporter baked in at the example input's dims (torch's dynamo
    exporter does so around LSTM/GRU), which other --dim values then contradict."""
    if len(node.input) < 2 or node.input[0] not in shapes:
        return
    target = next((i for i in g.initializer if i.name == node.input[1]), None)
    if target is None:
        return
    src = shapes[node.input[0]][0]
    want = [int(v) for v in initializer_value(target).reshape(-1)]
    allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
    dims = [src[k] if v == 0 and not allowzero and k < len(src) else v for k, v in enumerate(want)]
    known = int(np.prod([d for d in dims if d != -1])) if dims else 1
    total = int(np.prod(src)) if src else 1
    fits = total % known == 0 if (-1 in dims and known) else known == total
    if fits:
        return
    raise ModelImportError(
        f"{display}: node {node.name!r} (Reshape) cannot reshape {list(src)} ({total} elements) to the fixed "
        f"shape {want} stored in the file; the exporter baked in the sizes of its example input, so bind "
        "--dim to those sizes or re-export with these dims"
    )


def _explain_squeeze(node: onnx.NodeProto, shapes: Mapping[str, tuple[tuple[int, ...], int]],
                     g: onnx.GraphProto, display: str) -> None:
    """Raise the reason a Squeeze got no shape when a constant axis it squeezes is not of size 1:
    ONNX (and ONNX Runtime) refuse that, where torch's ``squeeze(d)`` leaves such a dim as it is.
    torch's dynamo exporter wrote HF CANINE's and Mamba-2's so; TorchScript writes an If on the size
    (which memplan reads once the dims are bound)."""
    if node.domain not in ("", "ai.onnx") or not node.input or node.input[0] not in shapes:
        return
    src = shapes[node.input[0]][0]
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), [])  # before opset 13
    if len(node.input) > 1:  # since: an input, a constant by now or not known
        given = next((i for i in g.initializer if i.name == node.input[1]), None)
        axes = [] if given is None else [int(v) for v in initializer_value(given).reshape(-1)]
    wrong = [a for a in axes if -len(src) <= a < len(src) and src[a] != 1]
    if not wrong:
        return
    raise ModelImportError(
        f"{display}: node {node.name!r} (Squeeze) squeezes axis {wrong[0]} of {list(src)}, whose size is "
        f"{src[wrong[0]]}, not 1, which ONNX (and ONNX Runtime) refuse; torch's squeeze(dim) leaves such a dim as it "
        "is, so the exporter wrote what the model does not do: export it again (TorchScript writes it as an If on "
        "the size, which memplan reads)"
    )


#: Ops whose output shape follows the values (not just the shapes) of their inputs: without a
#: constant there, onnx infers no static shape for it.
DATA_SHAPED_OPS = frozenset({"NonZero", "Unique", "TopK", "Reshape", "Expand", "Tile", "ConstantOfShape", "Range",
                             "Slice", "Pad", "OneHot", "Resize", "Upsample", "Compress", "NonMaxSuppression",
                             "StringSplit", "CenterCropPad"})
#: Of those, the ones whose output shape follows the values of their data input itself.
VALUE_SHAPED_OPS = frozenset({"NonZero", "Unique", "Compress", "NonMaxSuppression", "StringSplit"})
#: Ops that make or read ONNX optionals (not tensors), which memplan does not plan.
OPTIONAL_OPS = frozenset({"Optional", "OptionalGetElement", "OptionalHasElement"})

#: Ops that make ONNX sequences (not tensors), which memplan does not plan.
SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SplitToSequence",
                          "SequenceMap"})

#: Ops whose inputs broadcast together (numpy rules); ONNX shape inference lets a mismatch through.
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Where", "Equal", "Greater", "GreaterOrEqual",
                          "Less", "LessOrEqual", "And", "Or", "Xor", "Max", "Min", "Sum", "Mean", "BitShift",
                          "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu"})


def _check_same_conv_transpose(node: onnx.NodeProto, x_shape: tuple[int, ...], y_shape: tuple[int, ...],
                               display: str) -> None:
    """Refuse a ConvTranspose with auto_pad SAME_* and output_padding (no output_shape): ONNX
    Runtime makes its output input * stride, as the spec says, while onnx's shape inference adds
    output_padding, so memplan would plan, and build the backward for, a tensor ORT never makes."""
    attrs = _plain_attrs(node)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto not in ("SAME_UPPER", "SAME_LOWER") or "output_shape" in attrs:
        return
    sp = len(x_shape) - 2
    strides = [int(v) for v in attrs.get("strides", [])] or [1] * sp
    want = [n * s for n, s in zip(x_shape[2:], strides)]
    if list(y_shape[2:]) != want:
        raise ModelImportError(
            f"{display}: node {node.name!r} (ConvTranspose, auto_pad={auto}) has output_padding "
            f"{list(attrs.get('output_padding', []))}: ONNX Runtime's output is spatially {want} (input * stride), "
            f"onnx's shape inference gives {list(y_shape[2:])}; give it output_shape or explicit pads instead"
        )


def _check_conv_bias(node: onnx.NodeProto, w_shape: tuple[int, ...], b_shape: tuple[int, ...], display: str) -> None:
    """Refuse a Conv or ConvTranspose whose bias is not 1-D over its output channels: onnx's shape
    inference lets it through and ORT fails the run at that node. torch's dynamo exporter (torch
    2.14, ``optimize=False``) gave torchvision r3d_18's bias-free stem Conv3d a [64, 2] bias."""
    if len(w_shape) < 2:
        return
    group = int(_plain_attrs(node).get("group", 1))
    channels = w_shape[0] if node.op_type == "Conv" else w_shape[1] * group
    if tuple(b_shape) != (channels,):
        raise ModelImportError(
            f"{display}: node {node.name!r} ({node.op_type}) has a bias of shape {list(b_shape)}; ONNX takes a 1-D "
            f"bias of its {channels} output channels (ONNX Runtime fails the run there): fix or re-export the model "
            "(torch.onnx.export(..., optimize=False) writes a bias-free Conv3d so; with its optimizer on, the "
            "default, it does not)")


def _check_loss_labels(node: onnx.NodeProto, scores: tuple[int, ...], labels: tuple[int, ...], display: str,
                       dims_bound: bool) -> None:
    """Refuse a loss whose labels are not shaped as its scores less the class axis ([N, C, d...]
    against [N, d...]): onnx's shape inference does not compare them, and ORT fails the run there.
    The TorchScript exporter writes CLIP's ``arange(len(logits))`` labels as a constant of the
    exported batch, which a bound --dim batch then outgrows."""
    want = tuple(scores[:1]) + tuple(scores[2:])
    if len(scores) < 2 or tuple(labels) == want:
        return
    fix = "fix or re-export the model"
    if dims_bound:
        fix = ("a size fixed in the file (labels made for the exported batch) does not fit the bound --dim values: "
               "bind the sizes the model was exported with, or re-export it with labels sized by its input")
    raise ModelImportError(
        f"{display}: node {node.name!r} ({node.op_type}) has labels of shape {list(labels)} for scores of shape "
        f"{list(scores)}; ONNX takes labels shaped {list(want)}: {fix}")


def _check_einsum_letters(node: onnx.NodeProto, shapes: list[tuple[int, ...]], display: str) -> None:
    """Refuse an Einsum whose operands give one letter different sizes (one of them 1: ORT and
    numpy broadcast it). onnx's shape inference takes one operand's size, so the output's shape
    would be wrong, and onnx's checker refuses the gradient's Einsums (fuzzed, stop 49)."""
    attr = next((a for a in node.attribute if a.name == "equation"), None)
    if attr is None:
        return
    lhs = attr.s.decode().replace(" ", "").split("->")[0].split(",")
    seen: dict[str, int] = {}
    for term, shape in zip(lhs, shapes):
        if "." in term or len(term) != len(shape):
            continue
        for letter, d in zip(term, shape):
            if seen.setdefault(letter, int(d)) != int(d):
                raise ModelImportError(
                    f"{display}: node {node.name!r} (Einsum) gives index {letter!r} sizes {seen[letter]} and {d} in "
                    f"'{attr.s.decode()}'; onnx's shape inference does not broadcast an Einsum's letters, so "
                    "memplan cannot size its output: Expand the operand to the other's size first"
                )


def _check_broadcast(node: onnx.NodeProto, shapes: list[tuple[int, ...]], display: str, dims_bound: bool) -> None:
    """Refuse a node whose input shapes do not broadcast: a size the file fixes (a causal mask
    of the largest sequence length the model supports) against a bound --dim beyond it, or, with
    no --dim, a model that breaks ONNX's broadcasting (an opset-6 PRelu's per-channel slope)."""
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        fix = ("a size fixed in the file (such as a model's longest sequence) does not fit the bound --dim values: "
               "bind smaller ones" if dims_bound else
               "the model breaks ONNX's broadcasting rules (numpy's, since opset 7) there: fix or re-export it")
        raise ModelImportError(
            f"{display}: node {node.name!r} ({node.op_type}) cannot broadcast its inputs' shapes "
            f"{' and '.join(str(list(s)) for s in shapes)}; {fix}"
        ) from None


def _refuse_uninferred_version(node: onnx.NodeProto, opsets: Mapping[str, int], display: str) -> None:
    """A default-domain node whose operator version (at the model's opset) has no shape inference
    in onnx, an old one such as Relu-1 or Reshape-1: its outputs are unshaped, and the error blamed
    dims and shapes (an opset-5 Relu: "cannot infer a static shape ... bind it with --dim")."""
    if node.domain not in ("", "ai.onnx"):
        return
    opset = opsets.get("", 1)
    schema = op_schema(node.op_type, opset)
    if schema is None:
        return  # memplan's own Memcpy ops (_refuse_unknown_ops refused the others onnx does not know)
    if schema.has_type_and_shape_inference_function or schema.has_function or schema.has_context_dependent_function:
        return  # a function op (GreaterOrEqual-12, GroupNormalization-21) is inferred through its body
    if schema.since_version >= 7:
        return  # Compress-9, the one newer version without inference (its size is the data's): ORT runs it
    raise ModelImportError(
        f"{display}: node {node.name or '(unnamed)'!r} is {node.op_type} version {schema.since_version} (the model's "
        f"opset is {opset}), an old operator version that onnx infers no shapes for and ONNX Runtime does not run; "
        "convert the model to a newer opset (onnx.version_converter.convert_version(model, 13)) or export it again "
        "with opset 13 or newer"
    )


def _require_shape(name: str, shapes: Mapping[str, tuple[tuple[int, ...], int]], display: str, what: str):
    if name not in shapes:
        raise ModelImportError(
            f"{display}: cannot infer a static shape for tensor {name!r} ({what}); a symbolic dim may be unbound "
            "(bind it with --dim NAME=VALUE, or export the model with static shapes), or the shapes may not fit the "
            "op (fix or re-export the model)"
        )
    return shapes[name]


def _dtype(elem_type: int, name: str, display: str) -> str:
    try:
        return ONNX_TO_DTYPE[elem_type]
    except KeyError:
        raise ModelImportError(
            f"{display}: tensor {name!r} has element type {onnx.TensorProto.DataType.Name(elem_type)}, "
            "which memplan does not support"
        ) from None
