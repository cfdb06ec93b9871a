"""A small ONNX graph builder shared by the zoo models, with the layers they have in common.

Conventions every zoo model follows through this builder:
  * trainable parameters (weights, biases, norm scales) are float32 initializers;
  * every other constant (shapes, masks, scalars) is a ``Constant`` node, so that an importer that
    treats float initializers as trainable does not give a causal mask or a GELU coefficient a
    gradient (memplan's importer folds Constant nodes into frozen initializers);
  * BatchNormalization running mean/var are initializers too (frozen by the importer's BN rule);
  * tensor names are the node names (``layer1.attn.scores``), so plans and reports read well;
  * weights come from one ``numpy.random.Generator`` drawn in build order, so a seed fixes every byte.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from planner.errors import UsageError

#: onnxruntime 1.31 loads models up to IR version 10 reliably; onnx 1.23 writes a newer one by default.
IR_VERSION = 10

#: Protobuf cannot serialize a model above 2 GiB; refuse sizes that would get there.
MAX_PARAM_BYTES = 2**31 - 2**24

#: Key prefix of the metadata entries that tell example_feeds the exclusive upper bound of an int input.
INT_HIGH_KEY = "memplan.int_input_high."

#: Metadata key holding the full option set a zoo model was built with (``zoo:NAME?k=v&...``).
SPEC_KEY = "memplan.zoo.spec"


@dataclass
class OnnxBuilder:
    """Accumulates nodes, parameters and graph inputs/outputs; :meth:`model` returns the ModelProto."""

    name: str
    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    param_bytes: int = 0  # float32 initializers and large Constant values, for the protobuf limit
    _names: set[str] = field(default_factory=set, init=False, repr=False)

    # ---- names, inputs, outputs

    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"zoo builder bug: tensor name {name!r} used twice")
        self._names.add(name)
        return name

    def input(self, name: str, elem_type: int, shape: Sequence[int], int_high: int | None = None) -> str:
        """Declare a graph input; ``int_high`` records the exclusive bound of valid integer values."""
        self.inputs.append(helper.make_tensor_value_info(self._claim(name), elem_type, list(shape)))
        if int_high is not None:
            self.metadata[INT_HIGH_KEY + name] = str(int_high)
        return name

    def output(self, name: str, elem_type: int, shape: Sequence[int]) -> None:
        """Mark an existing tensor as a graph output."""
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    # ---- parameters and constants

    def reserve(self, shape: Sequence[int]) -> tuple[int, ...]:
        """Count a float32 constant's bytes before making it, so absurd sizes fail fast and clearly."""
        self.param_bytes += 4 * math.prod(shape)
        if self.param_bytes > MAX_PARAM_BYTES:
            raise UsageError(
                f"zoo:{self.name} constants exceed {MAX_PARAM_BYTES >> 20} MiB (the ONNX protobuf limit); "
                "choose smaller width/dim/hidden/vocab/seq options"
            )
        return tuple(shape)

    def param(self, name: str, value: np.ndarray) -> str:
        """A float32 initializer: trainable, except BatchNorm running stats (frozen by the importer's rule)."""
        self.initializers.append(numpy_helper.from_array(value.astype(np.float32), self._claim(name)))
        return name

    def normal(self, name: str, shape: Sequence[int], std: float) -> str:
        """A parameter drawn from N(0, std^2)."""
        shape = self.reserve(shape)
        return self.param(name, self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    def full(self, name: str, shape: Sequence[int], value: float) -> str:
        """A parameter filled with one value (biases, norm scales and shifts)."""
        return self.param(name, np.full(self.reserve(shape), value, dtype=np.float32))

    def const(self, name: str, value: np.ndarray) -> str:
        """A non-trainable constant, emitted as a Constant node."""
        self.nodes.append(
            helper.make_node("Constant", [], [self._claim(name)], name=name,
                             value=numpy_helper.from_array(np.asarray(value), name))
        )
        return name

    def shape(self, name: str, dims: Sequence[int]) -> str:
        """An int64 shape constant (for Reshape, Split)."""
        return self.const(name, np.asarray(list(dims), dtype=np.int64))

    # ---- nodes

    def op(self, op_type: str, inputs: Sequence[str], name: str, n_out: int = 1, **attrs) -> str:
        """Add a node; its first output is named ``name`` (extra outputs ``name.1``, ...); returns it."""
        outs = [self._claim(name)] + [self._claim(f"{name}.{i}") for i in range(1, n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return name

    def ops(self, op_type: str, inputs: Sequence[str], names: Sequence[str], **attrs) -> list[str]:
        """Add a node with several named outputs (Split)."""
        outs = [self._claim(n) for n in names]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=names[0], **attrs))
        return outs

    # ---- layers shared by the models

    def linear(self, x: str, fan_in: int, fan_out: int, name: str, std: float) -> str:
        """MatMul + Add over the last axis (works on any leading shape)."""
        w = self.normal(f"{name}.weight", (fan_in, fan_out), std)
        b = self.full(f"{name}.bias", (fan_out,), 0.0)
        return self.op("Add", [self.op("MatMul", [x, w], f"{name}.matmul"), b], name)

    def gemm(self, x: str, fan_in: int, fan_out: int, name: str, gain: float) -> str:
        """Gemm on a 2-D input, weight N(0, gain^2/fan_in), zero bias."""
        w = self.normal(f"{name}.weight", (fan_in, fan_out), gain / math.sqrt(fan_in))
        b = self.full(f"{name}.bias", (fan_out,), 0.0)
        return self.op("Gemm", [x, w, b], name)

    def conv(self, x: str, c_in: int, c_out: int, name: str, kernel: int = 3, stride: int = 1,
             bias: bool = False, gain: float = math.sqrt(2.0)) -> str:
        """Square 'same'-padded convolution, He-normal weights (no bias before a BatchNorm)."""
        w = self.normal(f"{name}.weight", (c_out, c_in, kernel, kernel), gain / math.sqrt(c_in * kernel * kernel))
        ins = [x, w] + ([self.full(f"{name}.bias", (c_out,), 0.0)] if bias else [])
        pad = kernel // 2
        return self.op("Conv", ins, name, kernel_shape=[kernel, kernel], strides=[stride, stride],
                       pads=[pad, pad, pad, pad])

    def batchnorm(self, x: str, channels: int, name: str) -> str:
        """BatchNormalization in training mode (batch statistics); returns Y only.

        Training mode makes ONNX require the running mean/var outputs; they are produced and left
        unused. The running-stat initializers get tiny seeded offsets from 0 and 1: onnxruntime's
        ConstantSharing merges equal initializers of up to 8 elements, and its training-mode kernel
        writes the new running stats in place, so a running mean equal to a zero bias (or a running
        variance equal to a unit scale) would corrupt the scale/bias from the second run on.
        Running stats do not affect Y in training mode, so the offsets change no result.
        """
        scale = self.full(f"{name}.scale", (channels,), 1.0)
        shift = self.full(f"{name}.shift", (channels,), 0.0)
        jitter = self.rng.uniform(1e-3, 2e-3, size=self.reserve((2, channels))).astype(np.float32)
        mean = self.param(f"{name}.running_mean", jitter[0])
        var = self.param(f"{name}.running_var", 1.0 + jitter[1])
        return self.op("BatchNormalization", [x, scale, shift, mean, var], name, n_out=3,
                       training_mode=1, epsilon=1e-5, momentum=0.9)

    def conv_bn_relu(self, x: str, c_in: int, c_out: int, name: str, stride: int = 1) -> str:
        """Conv 3x3 -> BatchNorm -> Relu."""
        y = self.batchnorm(self.conv(x, c_in, c_out, f"{name}.conv", stride=stride), c_out, f"{name}.bn")
        return self.op("Relu", [y], f"{name}.relu")

    def cross_entropy(self, logits: str, labels: str) -> str:
        """Mean SoftmaxCrossEntropyLoss; its output ``loss`` is a float32 scalar."""
        return self.op("SoftmaxCrossEntropyLoss", [logits, labels], "loss", reduction="mean")

    # ---- result

    def model(self, doc: str, opset: int) -> onnx.ModelProto:
        """The finished model: IR version onnxruntime reads, metadata in sorted key order."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="memplan.zoo", doc_string=doc)
        model.ir_version = IR_VERSION
        helper.set_model_props(model, dict(sorted(self.metadata.items())))
        return model


FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
