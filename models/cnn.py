"""cnn: a plain convolutional classifier.

    x [batch, channels, hw, hw]
      -> depth x (Conv 3x3 -> BatchNormalization(training) -> Relu -> MaxPool 2x2), channels
         width, 2*width, 4*width, ...
      -> Flatten -> Gemm [batch, classes] -> SoftmaxCrossEntropyLoss(labels [batch]) -> loss

``hw`` must be divisible by 2**depth. Opset 17.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx

from models._builder import FLOAT, INT64, OnnxBuilder
from models._registry import OptionValue, ZooModel, require

PRESETS = {
    "small": {"batch": 4, "seed": 0, "channels": 3, "hw": 32, "width": 8, "depth": 2, "classes": 10},
    "large": {"batch": 32, "seed": 0, "channels": 3, "hw": 128, "width": 16, "depth": 3, "classes": 100},
}


def _depths(hw: int) -> str:
    """The legal depths at ``hw`` (2**depth divides it), for --max-batch's refusal to grow depth."""
    top = (hw & -hw).bit_length() - 1
    return f"1..{top} (hw={hw} divisible by 2**depth)" if top else f"none at hw={hw} (odd)"


def make(o: Mapping[str, OptionValue]) -> onnx.ModelProto:
    hw, depth = o["hw"], o["depth"]
    require(hw % 2**depth == 0, "cnn", f"hw={hw} must be divisible by 2**depth={2**depth}")
    b = OnnxBuilder("cnn", np.random.default_rng(o["seed"]))
    h = b.input("x", FLOAT, [o["batch"], o["channels"], hw, hw])
    labels = b.input("labels", INT64, [o["batch"]], int_high=o["classes"])
    c_in = o["channels"]
    for i in range(depth):
        c_out = o["width"] * 2**i
        h = b.conv_bn_relu(h, c_in, c_out, f"block{i}")
        h = b.op("MaxPool", [h], f"block{i}.pool", kernel_shape=[2, 2], strides=[2, 2])
        c_in, hw = c_out, hw // 2
    flat = b.op("Flatten", [h], "flatten", axis=1)
    logits = b.gemm(flat, c_in * hw * hw, o["classes"], "head", gain=0.5)
    b.output(b.cross_entropy(logits, labels), FLOAT, [])
    return b.model(__doc__, opset=17)


MODEL = ZooModel("cnn", "Conv-BN-Relu-MaxPool blocks -> Gemm -> softmax cross-entropy", PRESETS, make,
                 steps={"hw": lambda o: 2 ** o["depth"]}, bounded={"depth": lambda o: _depths(o["hw"])})
