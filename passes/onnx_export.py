"""memplan Graph -> ONNX ModelProto, nodes in the Graph's (planned) order.

Post: every tensor has value_info (so ORT and readers need no shape inference); the IR version is
the least the opsets need (every ORT that knows those opsets reads it); models over 2 GB keep their
weights in an external data file beside the model. Files are written atomically.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from passes.onnx_import import DTYPE_TO_ONNX
from planner.fileio import atomic_write
from planner.graph import NO_TENSOR, Graph, Tensor

#: ORT's own ops that onnx.checker does not know (see DESIGN.md, swap nodes).
ORT_ONLY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})
#: Protobuf's hard limit; above it weights go to external data.
PROTO_LIMIT = 2**31 - 1


def _value_info(t: Tensor) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(t.name, DTYPE_TO_ONNX[t.dtype], list(t.shape))


def _attribute(name: str, value):
    if isinstance(value, np.ndarray):
        return helper.make_attribute(name, numpy_helper.from_array(value))
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(name, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, np.generic):
        value = value.item()
    return helper.make_attribute(name, value)


def export_model(graph: Graph, producer: str = "memplan", metadata: dict[str, str] | None = None) -> onnx.ModelProto:
    """Build a ModelProto from a Graph (no checker run; see ``check_model``).

    ``metadata`` becomes the model's metadata_props (memplan records how a planned model was made).
    """
    name = lambda tid: "" if tid == NO_TENSOR else graph.tensors[tid].name  # noqa: E731
    nodes = []
    for node in graph.nodes:
        n = helper.make_node(
            node.op_type,
            [name(t) for t in node.inputs],
            [name(t) for t in node.outputs],
            name=node.name,
            domain=node.domain or None,
        )
        n.attribute.extend(_attribute(k, v) for k, v in sorted(node.attrs.items()))
        nodes.append(n)
    inits = [numpy_helper.from_array(np.asarray(graph.values[t.id]), t.name) for t in graph.initializers()]
    io = set(graph.inputs) | set(graph.outputs)
    value_info = [_value_info(t) for t in graph.tensors if t.producer != NO_TENSOR and t.id not in io]
    g = helper.make_graph(
        nodes,
        graph.name,
        [_value_info(graph.tensors[t]) for t in graph.inputs],
        [_value_info(graph.tensors[t]) for t in graph.outputs],
        initializer=inits,
        value_info=value_info,
    )
    opsets = [helper.make_opsetid(d, v) for d, v in sorted(graph.opsets.items())]
    model = helper.make_model(g, opset_imports=opsets, producer_name=producer)
    model.ir_version = ir_version_for(opsets)
    for key, value in sorted((metadata or {}).items()):
        model.metadata_props.add(key=key, value=value)
    return model


def ir_version_for(opsets) -> int:
    """The least IR version these opsets need: readable by every ORT that implements them."""
    try:
        return max(helper.find_min_ir_version_for(list(opsets), ignore_unknown=True), 7)
    except (TypeError, ValueError):
        return 8


def check_model(model: onnx.ModelProto, full: bool = True) -> None:
    """onnx.checker, skipping ORT-only ops (MemcpyToHost/FromHost) that it does not know."""
    if any(n.op_type in ORT_ONLY_OPS for n in model.graph.node):
        stripped = onnx.ModelProto()
        stripped.CopyFrom(model)
        keep = [n for n in stripped.graph.node if n.op_type not in ORT_ONLY_OPS]
        del stripped.graph.node[:]
        stripped.graph.node.extend(keep)
        onnx.checker.check_model(stripped, full_check=False)
        return
    onnx.checker.check_model(model, full_check=full)


def save_model(model: Graph | onnx.ModelProto, path: str | os.PathLike) -> None:
    """Write a model atomically; weights go to ``<file>.data`` beside it when over 2 GB."""
    proto = export_model(model) if isinstance(model, Graph) else model
    path = Path(path)
    if proto.ByteSize() < PROTO_LIMIT:
        atomic_write(path, proto.SerializeToString())
        return
    data_name = path.name + ".data"
    with tempfile.TemporaryDirectory(dir=path.parent or ".") as tmp:
        tmp_model = Path(tmp) / path.name
        onnx.save_model(proto, str(tmp_model), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)
        os.replace(Path(tmp) / data_name, path.parent / data_name)
        os.replace(tmp_model, path)
