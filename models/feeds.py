"""Seeded example inputs for any ONNX model (zoo or not), for running and verifying it.

Float inputs get standard-normal values. Integer inputs get uniform values in [0, high): ``high``
comes from the model's metadata entry ``memplan.int_input_high.<input name>`` (zoo models set it to
the number of classes or the vocabulary size, so labels and token ids are valid); else from the
graph, where the input is a loss's class labels or a Gather's indices (:func:`_index_ranges`); else
it is 2. Bool inputs are fair coin flips.
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
        if dim.HasField("dim_value") and dim.dim_value >= 0:  # 0 is a size: an empty tensor
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


#: Ops that keep an int tensor's values within its range (views, slices, casts): labels and token
#: ids reach the op that bounds them through these.
_VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Slice", "Cast")


def _index_ranges(model: onnx.ModelProto) -> dict[str, int]:
    """Int graph inputs the graph itself bounds: the class labels of a SoftmaxCrossEntropyLoss or
    NegativeLogLikelihoodLoss (the scores' axis 1) and the indices of a Gather or GatherElements
    (the data's size along the axis: token ids into an embedding, labels picking log-probabilities),
    reached through views, slices and casts. A model exported by torch says nothing in its
    metadata; token ids and labels then span the vocabulary and the classes, as in a real step,
    not just 0 and 1."""
    g = model.graph
    dims: dict[str, tuple] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            dims[vi.name] = tuple(d.dim_value if d.HasField("dim_value") else None
                                  for d in vi.type.tensor_type.shape.dim)
    for init in g.initializer:
        dims[init.name] = tuple(init.dims)
    source = {n.output[0]: n.input[0] for n in g.node if n.op_type in _VIEWS and n.domain in ("", "ai.onnx")
              and n.input and n.output}
    inputs = {i.name for i in g.input}
    ranges: dict[str, int] = {}

    def bound(name: str, high) -> None:
        while name in source:
            name = source[name]
        if name in inputs and isinstance(high, int) and high > 0:
            ranges[name] = min(high, ranges.get(name, high))

    for n in g.node:
        if n.domain not in ("", "ai.onnx") or len(n.input) < 2:
            continue
        if n.op_type in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"):
            scores = dims.get(n.input[0], ())
            bound(n.input[1], scores[1] if len(scores) > 1 else None)
        elif n.op_type in ("Gather", "GatherElements"):  # memplan writes SoftmaxCrossEntropyLoss this way
            table = dims.get(n.input[0], ())
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            if table and -len(table) <= axis < len(table):
                bound(n.input[1], table[axis])
    return ranges


def example_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """One seeded array per graph input that is not an initializer or optional, in graph input order."""
    rng = np.random.default_rng(seed)
    meta = {p.key: p.value for p in model.metadata_props}
    for name, high in _index_ranges(model).items():
        meta.setdefault(INT_HIGH_KEY + name, str(high))
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
        if np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16":  # ml_dtypes' bfloat16 is not np.floating
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
