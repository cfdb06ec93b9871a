"""Size figures of an ONNX model from ONNX shape inference: nodes, op types, parameter and activation bytes.

Activation bytes are the sum over every output of every non-Constant node (what one forward pass
writes if nothing is freed); Constant outputs count as constants, like initializers. Used by the
zoo tests (to hold the ``size`` presets to their promise) and by ``bench/zoo_sizes.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from planner.errors import UsageError


@dataclass(frozen=True, slots=True)
class ModelStats:
    nodes: int  # number of nodes, Constant nodes included
    op_types: tuple[str, ...]  # distinct op types, sorted
    param_bytes: int  # initializers plus Constant node values
    activation_bytes: int  # all non-Constant node outputs together


def _nbytes(value_info: onnx.ValueInfoProto) -> int:
    tensor_type = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
    if any(d < 0 for d in dims) or not tensor_type.HasField("shape"):
        raise UsageError(f"tensor {value_info.name!r} has no static shape after shape inference")
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).itemsize
    return int(np.prod(dims, dtype=np.int64)) * itemsize


def model_stats(model: onnx.ModelProto) -> ModelStats:
    """Count nodes and bytes of a model whose shapes are all static."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    infos = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    graph = model.graph
    params = sum(numpy_helper.to_array(i).nbytes for i in graph.initializer)
    activations = 0
    for node in graph.node:
        if node.op_type == "Constant":
            params += numpy_helper.to_array(node.attribute[0].t).nbytes
            continue
        activations += sum(_nbytes(infos[name]) for name in node.output if name)
    return ModelStats(
        nodes=len(graph.node),
        op_types=tuple(sorted({node.op_type for node in graph.node})),
        param_bytes=params,
        activation_bytes=activations,
    )
