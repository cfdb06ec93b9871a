"""mlp: a multi-layer perceptron classifier.

    x [batch, inputs] -> layers x (Gemm -> Relu) of width ``hidden`` -> Gemm [batch, classes]
      -> SoftmaxCrossEntropyLoss(labels [batch]) -> loss

Hidden weights are He-normal (variance kept through the Relus), the head is scaled down so the
initial loss is close to ln(classes). Opset 17.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import onnx

from models._builder import FLOAT, INT64, OnnxBuilder
from models._registry import OptionValue, ZooModel

PRESETS = {
    "small": {"batch": 8, "seed": 0, "inputs": 64, "hidden": 128, "layers": 3, "classes": 10},
    # 2048 x 2048 activations: 16 MiB per tensor, two per layer (Gemm, Relu).
    "large": {"batch": 2048, "seed": 0, "inputs": 1024, "hidden": 2048, "layers": 4, "classes": 1000},
}


def make(o: Mapping[str, OptionValue]) -> onnx.ModelProto:
    b = OnnxBuilder("mlp", np.random.default_rng(o["seed"]))
    h = b.input("x", FLOAT, [o["batch"], o["inputs"]])
    labels = b.input("labels", INT64, [o["batch"]], int_high=o["classes"])
    width = o["inputs"]
    for i in range(o["layers"]):
        h = b.op("Relu", [b.gemm(h, width, o["hidden"], f"fc{i}", gain=math.sqrt(2.0))], f"fc{i}.relu")
        width = o["hidden"]
    logits = b.gemm(h, width, o["classes"], "head", gain=0.5)
    b.output(b.cross_entropy(logits, labels), FLOAT, [])
    return b.model(__doc__, opset=17)


MODEL = ZooModel("mlp", "Gemm+Relu layers -> softmax cross-entropy", PRESETS, make)
