"""Import + liveness speed on a large synthetic graph (issue: 20,000 nodes in under 5 s).

    python bench/import_bench.py [--nodes 20000]

Builds a transformer-like op soup (MatMul, Add, Relu, Reshape with a Shape subgraph every block,
residual fan-out) in ONNX, saves it, then times load+import and liveness separately.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from passes.onnx_import import import_model  # noqa: E402
from planner.liveness import analyze  # noqa: E402


def build(nodes: int, width: int = 16) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    out: list[onnx.NodeProto] = []
    prev, resid, k = "x", "x", 0
    while len(out) < nodes - 8:
        p = f"b{k}_"
        out += [
            helper.make_node("MatMul", [prev, "W"], [p + "mm"]),
            helper.make_node("Add", [p + "mm", resid], [p + "add"]),
            helper.make_node("Relu", [p + "add"], [p + "relu"]),
            helper.make_node("Shape", [p + "relu"], [p + "shape"]),
            helper.make_node("Gather", [p + "shape", "zero"], [p + "b"], axis=0),
            helper.make_node("Concat", [p + "b", "minus1"], [p + "target"], axis=0),
            helper.make_node("Reshape", [p + "relu", p + "target"], [p + "out"]),
        ]
        resid = p + "add" if k % 2 else resid
        prev, k = p + "out", k + 1
    out.append(helper.make_node("ReduceSum", [prev], ["loss"], keepdims=0))
    g = helper.make_graph(out, "big", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", width])],
                          [helper.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=20000)
    args = ap.parse_args()
    model = build(args.nodes)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.onnx")
        onnx.save_model(model, path)
        t0 = time.perf_counter()
        graph = import_model(path, {"batch": 64})
        t1 = time.perf_counter()
        lv = analyze(graph)
        t2 = time.perf_counter()
    print(f"file nodes {len(model.graph.node)}, imported nodes {len(graph.nodes)} (shape subgraphs folded), "
          f"tensors {len(graph.tensors)}")
    print(f"import {t1 - t0:.2f} s, liveness {t2 - t1:.2f} s, total {t2 - t0:.2f} s; peak {lv.peak_bytes} B")


if __name__ == "__main__":
    main()
