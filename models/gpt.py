"""gpt: a decoder-only transformer language model (GPT-2 layout, pre-norm).

    x [batch, seq] int64 token ids
      h = Gather(wte [vocab, dim], x) + wpe [seq, dim]
      layers x:
          a = LayerNorm(h) -> MatMul+Add [.., 3*dim] -> Split q, k, v
              q, v: Reshape [batch, seq, heads, dim/heads] -> Transpose [batch, heads, seq, hd]
              k:    Reshape -> Transpose [batch, heads, hd, seq]
              scores = MatMul(q, k) * 1/sqrt(hd) + causal mask (0 on/below the diagonal, -1e9 above)
              y = MatMul(Softmax(scores), v) -> Transpose -> Reshape [batch, seq, dim] -> MatMul+Add
          h = h + y
          m = LayerNorm(h) -> MatMul+Add [.., 4*dim] -> GELU -> MatMul+Add [.., dim]
          h = h + m
      logits = MatMul(LayerNorm(h), Transpose(wte))          (output head tied to the embedding)
      loss = SoftmaxCrossEntropyLoss(Reshape(logits, [batch*seq, vocab]), Reshape(labels, [batch*seq]))

``labels`` [batch, seq] are the next-token ids (the caller shifts the sequence). ``gelu=erf`` writes
GELU as 0.5 * x * (1 + Erf(x / sqrt 2)) at opset 17; ``gelu=op`` uses the Gelu op (opset 20).
``logits=1`` (for tests) adds the logits [batch, seq, vocab] as a second output.
Init as GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2 * layers), zero biases.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import onnx

from models._builder import FLOAT, INT64, OnnxBuilder
from models._registry import OptionValue, ZooModel, require

PRESETS = {
    "small": {"batch": 2, "seed": 0, "vocab": 64, "seq": 16, "dim": 32, "heads": 2, "layers": 2,
              "gelu": "erf", "logits": 0},
    "large": {"batch": 4, "seed": 0, "vocab": 8192, "seq": 256, "dim": 256, "heads": 8, "layers": 3,
              "gelu": "erf", "logits": 0},
}

STD = 0.02


def _layernorm(b: OnnxBuilder, x: str, dim: int, name: str) -> str:
    scale = b.full(f"{name}.scale", (dim,), 1.0)
    shift = b.full(f"{name}.shift", (dim,), 0.0)
    return b.op("LayerNormalization", [x, scale, shift], name, axis=-1, epsilon=1e-5)


def _gelu(b: OnnxBuilder, x: str, name: str, form: str) -> str:
    if form == "op":
        return b.op("Gelu", [x], name)
    inv_sqrt2 = b.const(f"{name}.inv_sqrt2", np.array(1.0 / math.sqrt(2.0), dtype=np.float32))
    one = b.const(f"{name}.one", np.array(1.0, dtype=np.float32))
    half = b.const(f"{name}.half", np.array(0.5, dtype=np.float32))
    erf = b.op("Erf", [b.op("Mul", [x, inv_sqrt2], f"{name}.scaled")], f"{name}.erf")
    gate = b.op("Mul", [b.op("Add", [erf, one], f"{name}.erf1"), half], f"{name}.gate")
    return b.op("Mul", [x, gate], name)


def _attention(b: OnnxBuilder, x: str, o: Mapping[str, OptionValue], mask: str, name: str) -> str:
    n, t, d, heads = o["batch"], o["seq"], o["dim"], o["heads"]
    hd = d // heads
    qkv = b.linear(x, d, 3 * d, f"{name}.qkv", STD)
    q, k, v = b.ops("Split", [qkv, b.shape(f"{name}.split", [d, d, d])],
                    [f"{name}.q", f"{name}.k", f"{name}.v"], axis=-1)
    heads_shape = b.shape(f"{name}.heads_shape", [n, t, heads, hd])

    def split_heads(z: str, perm: list[int]) -> str:
        return b.op("Transpose", [b.op("Reshape", [z, heads_shape], f"{z}.heads")], f"{z}.t", perm=perm)

    scores = b.op("MatMul", [split_heads(q, [0, 2, 1, 3]), split_heads(k, [0, 2, 3, 1])], f"{name}.scores")
    scale = b.const(f"{name}.scale", np.array(1.0 / math.sqrt(hd), dtype=np.float32))
    scaled = b.op("Mul", [scores, scale], f"{name}.scaled")
    probs = b.op("Softmax", [b.op("Add", [scaled, mask], f"{name}.masked")], f"{name}.probs", axis=-1)
    y = b.op("MatMul", [probs, split_heads(v, [0, 2, 1, 3])], f"{name}.context")
    y = b.op("Transpose", [y], f"{name}.merge", perm=[0, 2, 1, 3])
    y = b.op("Reshape", [y, b.shape(f"{name}.merge_shape", [n, t, d])], f"{name}.merged")
    return b.linear(y, d, d, f"{name}.proj", STD / math.sqrt(2 * o["layers"]))


def make(o: Mapping[str, OptionValue]) -> onnx.ModelProto:
    n, t, d, vocab = o["batch"], o["seq"], o["dim"], o["vocab"]
    require(d % o["heads"] == 0, "gpt", f"dim={d} must be divisible by heads={o['heads']}")
    b = OnnxBuilder("gpt", np.random.default_rng(o["seed"]))
    tokens = b.input("x", INT64, [n, t], int_high=vocab)
    labels = b.input("labels", INT64, [n, t], int_high=vocab)
    wte = b.normal("wte", (vocab, d), STD)
    wpe = b.normal("wpe", (t, d), STD / 2)
    causal = np.triu(np.full(b.reserve((t, t)), -1e9, dtype=np.float32), k=1)
    mask = b.const("causal_mask", causal)
    h = b.op("Add", [b.op("Gather", [wte, tokens], "embed", axis=0), wpe], "embed.pos")
    for i in range(o["layers"]):
        name = f"layer{i}"
        a = _attention(b, _layernorm(b, h, d, f"{name}.ln1"), o, mask, f"{name}.attn")
        h = b.op("Add", [h, a], f"{name}.res1")
        m = b.linear(_layernorm(b, h, d, f"{name}.ln2"), d, 4 * d, f"{name}.fc", STD)
        m = b.linear(_gelu(b, m, f"{name}.gelu", o["gelu"]), 4 * d, d, f"{name}.fc_out",
                     STD / math.sqrt(2 * o["layers"]))
        h = b.op("Add", [h, m], f"{name}.res2")
    h = _layernorm(b, h, d, "ln_f")
    logits = b.op("MatMul", [h, b.op("Transpose", [wte], "wte.t", perm=[1, 0])], "logits")
    flat = b.op("Reshape", [logits, b.shape("logits.flat_shape", [n * t, vocab])], "logits.flat")
    flat_labels = b.op("Reshape", [labels, b.shape("labels.flat_shape", [n * t])], "labels.flat")
    b.output(b.cross_entropy(flat, flat_labels), FLOAT, [])
    if o["logits"]:
        b.output(logits, FLOAT, [n, t, vocab])
    return b.model(__doc__, opset=20 if o["gelu"] == "op" else 17)


MODEL = ZooModel("gpt", "decoder-only transformer with causal attention and a tied head", PRESETS, make,
                 choices={"gelu": ("erf", "op")}, minimum={"seed": 0, "logits": 0},
                 maximum={"logits": 1}, steps={"dim": lambda o: o["heads"]},
                 bounded={"heads": lambda o: f"divisors of dim={o['dim']}: "
                                             + ", ".join(str(h) for h in range(1, o["dim"] + 1) if o["dim"] % h == 0)})
