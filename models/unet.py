"""unet: a U-Net for per-pixel classification (segmentation).

    x [batch, channels, hw, hw]
      encoder, level i = 0..depth-1 (channels width * 2**i):
          skip_i = 2 x (Conv 3x3 -> BN -> Relu);  MaxPool 2x2
      bottleneck: 2 x (Conv 3x3 -> BN -> Relu) with width * 2**depth channels
      decoder, level i = depth-1..0:
          Resize x2 (``upsample``: nearest or bilinear) -> Concat(up, skip_i) on channels
          -> 2 x (Conv 3x3 -> BN -> Relu) with width * 2**i channels
      -> Conv 1x1 [batch, classes, hw, hw]
      -> SoftmaxCrossEntropyLoss(labels [batch, hw, hw]) -> loss (mean over pixels)

``hw`` must be divisible by 2**depth. BatchNormalization runs in training mode. Opset 17.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx

from models._builder import FLOAT, INT64, OnnxBuilder
from models._registry import OptionValue, ZooModel, require

PRESETS = {
    "small": {"batch": 2, "seed": 0, "channels": 3, "hw": 32, "width": 8, "depth": 2, "classes": 4,
              "upsample": "nearest"},
    "large": {"batch": 4, "seed": 0, "channels": 3, "hw": 128, "width": 16, "depth": 3, "classes": 8,
              "upsample": "nearest"},
}

#: Resize attributes per ``upsample`` choice: classic nearest-neighbour copy, or bilinear with
#: half-pixel centres (align_corners=False in other frameworks).
RESIZE = {
    "nearest": {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    "linear": {"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
}


def _double_conv(b: OnnxBuilder, x: str, c_in: int, c_out: int, name: str) -> str:
    return b.conv_bn_relu(b.conv_bn_relu(x, c_in, c_out, f"{name}.0"), c_out, c_out, f"{name}.1")


def _depths(hw: int) -> str:
    """The legal depths at ``hw`` (2**depth divides it), for --max-batch's refusal to grow depth."""
    top = (hw & -hw).bit_length() - 1
    return f"1..{top} (hw={hw} divisible by 2**depth)" if top else f"none at hw={hw} (odd)"


def make(o: Mapping[str, OptionValue]) -> onnx.ModelProto:
    hw, depth, width = o["hw"], o["depth"], o["width"]
    require(hw % 2**depth == 0, "unet", f"hw={hw} must be divisible by 2**depth={2**depth}")
    b = OnnxBuilder("unet", np.random.default_rng(o["seed"]))
    h = b.input("x", FLOAT, [o["batch"], o["channels"], hw, hw])
    labels = b.input("labels", INT64, [o["batch"], hw, hw], int_high=o["classes"])
    scales = b.const("up.scales", np.array([1.0, 1.0, 2.0, 2.0], dtype=np.float32))
    skips = []
    c_in = o["channels"]
    for i in range(depth):
        h = _double_conv(b, h, c_in, width * 2**i, f"down{i}")
        skips.append(h)
        h = b.op("MaxPool", [h], f"down{i}.pool", kernel_shape=[2, 2], strides=[2, 2])
        c_in = width * 2**i
    h = _double_conv(b, h, c_in, width * 2**depth, "bottom")
    c_in = width * 2**depth
    for i in reversed(range(depth)):
        up = b.op("Resize", [h, "", scales], f"up{i}.resize", **RESIZE[o["upsample"]])
        h = b.op("Concat", [up, skips[i]], f"up{i}.concat", axis=1)
        h = _double_conv(b, h, c_in + width * 2**i, width * 2**i, f"up{i}")
        c_in = width * 2**i
    logits = b.conv(h, c_in, o["classes"], "head", kernel=1, bias=True, gain=0.5)
    b.output(b.cross_entropy(logits, labels), FLOAT, [])
    return b.model(__doc__, opset=17)


MODEL = ZooModel("unet", "encoder/decoder with skip Concat and Resize -> per-pixel cross-entropy", PRESETS,
                 make, choices={"upsample": tuple(RESIZE)},
                 steps={"hw": lambda o: 2 ** o["depth"]}, bounded={"depth": lambda o: _depths(o["hw"])})
