"""Seeded example inputs for any ONNX model (zoo or not), for running and verifying it.

Float inputs get standard-normal values. Integer inputs get uniform values in [0, high): ``high``
comes from the model's metadata entry ``memplan.int_input_high.<input name>`` (zoo models set it to
the number of classes or the vocabulary size, so labels and token ids are valid) and is 2 for an
integer input the model says nothing about. Bool inputs are fair coin flips.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from models._builder import INT_HIGH_KEY
from planner.errors import UsageError

#: Exclusive upper bound of integer inputs the model's metadata says nothing about.
DEFAULT_INT_HIGH = 2


def _static_shape(model_input: onnx.ValueInfoProto) -> list[int]:
    tensor_type = model_input.type.tensor_type
    if not tensor_type.HasField("shape"):
        raise UsageError(f"input {model_input.name!r} has no declared shape; give the model a static input shape")
    shape = []
    for axis, dim in enumerate(tensor_type.shape.dim):
        if dim.HasField("dim_value") and dim.dim_value > 0:
            shape.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            raise UsageError(
                f"input {model_input.name!r} dim {axis} is symbolic ({dim.dim_param!r}); "
                f"bind it to a size, e.g. --dim {dim.dim_param}=8"
            )
        else:
            raise UsageError(
                f"input {model_input.name!r} dim {axis} has no size; export the model with static input shapes"
            )
    return shape


def _int_high(meta: dict[str, str], name: str) -> int:
    text = meta.get(INT_HIGH_KEY + name, str(DEFAULT_INT_HIGH))
    if not text.isdigit() or int(text) < 1:
        raise UsageError(
            f"metadata {INT_HIGH_KEY + name} = {text!r} must be a positive integer (the number of valid ids)"
        )
    return int(text)


def example_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """One seeded array per graph input that is not an initializer or optional, in graph input order."""
    rng = np.random.default_rng(seed)
    meta = {p.key: p.value for p in model.metadata_props}
    initializers = {init.name for init in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for model_input in model.graph.input:
        if model_input.name in initializers or model_input.type.HasField("optional_type"):
            continue  # an optional input runs without a feed (passes/mem_pattern.py's marker)
        elem_type = model_input.type.tensor_type.elem_type
        if not model_input.type.HasField("tensor_type") or elem_type == onnx.TensorProto.UNDEFINED:
            raise UsageError(f"input {model_input.name!r} is not a tensor; example inputs cover tensors only")
        dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        shape = _static_shape(model_input)
        if np.issubdtype(dtype, np.floating):
            feeds[model_input.name] = rng.standard_normal(shape).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            high = _int_high(meta, model_input.name)
            feeds[model_input.name] = rng.integers(0, high, size=shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[model_input.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            raise UsageError(
                f"input {model_input.name!r} has element type {onnx.TensorProto.DataType.Name(elem_type)}; "
                "example inputs cover float, integer and bool tensors"
            )
    return feeds
