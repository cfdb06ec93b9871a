"""resnet: a small ResNet with basic blocks.

    x [batch, channels, hw, hw] -> stem Conv 3x3 -> BN -> Relu (width channels)
      -> depth stages of ``blocks`` basic blocks; stage s has width * 2**s channels and its first
         block strides by 2 (s > 0). A basic block is
             y = Relu(BN(Conv3x3(Relu(BN(Conv3x3(x))))) + shortcut(x))
         with shortcut = identity, or Conv 1x1 (stride) -> BN where the shape changes
      -> GlobalAveragePool -> Flatten -> Gemm [batch, classes]
      -> SoftmaxCrossEntropyLoss(labels [batch]) -> loss

BatchNormalization runs in training mode (batch statistics). Opset 17.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx

from models._builder import FLOAT, INT64, OnnxBuilder
from models._registry import OptionValue, ZooModel

PRESETS = {
    "small": {"batch": 4, "seed": 0, "channels": 3, "hw": 32, "width": 8, "depth": 2, "blocks": 1, "classes": 10},
    "large": {"batch": 16, "seed": 0, "channels": 3, "hw": 64, "width": 32, "depth": 3, "blocks": 2,
              "classes": 100},
}


def _basic_block(b: OnnxBuilder, x: str, c_in: int, c_out: int, stride: int, name: str) -> str:
    h = b.conv_bn_relu(x, c_in, c_out, f"{name}.a", stride=stride)
    h = b.batchnorm(b.conv(h, c_out, c_out, f"{name}.b.conv"), c_out, f"{name}.b.bn")
    if stride != 1 or c_in != c_out:
        proj = b.conv(x, c_in, c_out, f"{name}.proj.conv", kernel=1, stride=stride)
        x = b.batchnorm(proj, c_out, f"{name}.proj.bn")
    return b.op("Relu", [b.op("Add", [h, x], f"{name}.add")], f"{name}.relu")


def make(o: Mapping[str, OptionValue]) -> onnx.ModelProto:
    b = OnnxBuilder("resnet", np.random.default_rng(o["seed"]))
    h = b.input("x", FLOAT, [o["batch"], o["channels"], o["hw"], o["hw"]])
    labels = b.input("labels", INT64, [o["batch"]], int_high=o["classes"])
    c_in = o["width"]
    h = b.conv_bn_relu(h, o["channels"], c_in, "stem")
    for s in range(o["depth"]):
        c_out = o["width"] * 2**s
        for k in range(o["blocks"]):
            stride = 2 if s > 0 and k == 0 else 1
            h = _basic_block(b, h, c_in, c_out, stride, f"stage{s}.block{k}")
            c_in = c_out
    pooled = b.op("Flatten", [b.op("GlobalAveragePool", [h], "pool")], "flatten", axis=1)
    logits = b.gemm(pooled, c_in, o["classes"], "head", gain=0.5)
    b.output(b.cross_entropy(logits, labels), FLOAT, [])
    return b.model(__doc__, opset=17)


MODEL = ZooModel("resnet", "basic residual blocks -> global pool -> Gemm -> softmax cross-entropy", PRESETS,
                 make)
