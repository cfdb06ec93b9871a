"""Wall time of one `memplan check` call over three models (issue: under 30 s on 2 cores).

    python bench/check_bench.py [--repeat 3] [--time-limit 30] [--train] [MODEL ...]

Default models: zoo:gpt, zoo:resnet, zoo:unet when the zoo is present, else three synthetic ONNX
models written to a temp folder (a deep MLP, a 3x3 CNN, an attention stack). Each model is checked
at two budgets: one it fits as is, and 60% of its unplanned peak (which asks the planner). The
command runs as a subprocess pinned to two cores (taskset, where available); the table gives the
best and median wall time of ``--repeat`` runs and the exit code.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ZOO_MODELS = ("zoo:gpt", "zoo:resnet", "zoo:unet")


def _model(name: str, nodes: list, inputs: list, output: str, inits: dict[str, np.ndarray]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, inputs, [helper.make_tensor_value_info(output, TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v, k) for k, v in sorted(inits.items())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def deep_mlp(layers: int = 64, width: int = 512, batch: int = 256) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], {}, "x"
    for i in range(layers):
        inits[f"W{i}"] = (rng.standard_normal((width, width)) * 0.05).astype(np.float32)
        inits[f"b{i}"] = np.zeros(width, np.float32)
        nodes += [helper.make_node("MatMul", [prev, f"W{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"add{i}"]),
                  helper.make_node("Relu", [f"add{i}"], [f"h{i}"])]
        prev = f"h{i}"
    nodes.append(helper.make_node("ReduceMean", [prev], ["loss"], keepdims=0))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])
    return _model("deep_mlp", nodes, [x], "loss", inits)


def cnn(layers: int = 12, channels: int = 64, size: int = 64, batch: int = 16) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    nodes, inits, prev, c_in = [], {}, "x", 3
    for i in range(layers):
        inits[f"K{i}"] = (rng.standard_normal((channels, c_in, 3, 3)) * 0.05).astype(np.float32)
        nodes += [helper.make_node("Conv", [prev, f"K{i}"], [f"conv{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"conv{i}"], [f"h{i}"])]
        prev, c_in = f"h{i}", channels
    nodes.append(helper.make_node("ReduceMean", [prev], ["loss"], keepdims=0))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, size, size])
    return _model("cnn", nodes, [x], "loss", inits)


def attention(blocks: int = 12, d: int = 256, seq: int = 256, batch: int = 8) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    nodes, inits, prev = [], {"scale": np.array(d**-0.5, np.float32)}, "x"
    for i in range(blocks):
        for w in "QKVO":
            inits[f"{w}{i}"] = (rng.standard_normal((d, d)) * 0.05).astype(np.float32)
        p = f"blk{i}_"
        nodes += [
            helper.make_node("MatMul", [prev, f"Q{i}"], [p + "q"]),
            helper.make_node("MatMul", [prev, f"K{i}"], [p + "k"]),
            helper.make_node("MatMul", [prev, f"V{i}"], [p + "v"]),
            helper.make_node("Transpose", [p + "k"], [p + "kt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", [p + "q", p + "kt"], [p + "s"]),
            helper.make_node("Mul", [p + "s", "scale"], [p + "ss"]),
            helper.make_node("Softmax", [p + "ss"], [p + "a"], axis=-1),
            helper.make_node("MatMul", [p + "a", p + "v"], [p + "ctx"]),
            helper.make_node("MatMul", [p + "ctx", f"O{i}"], [p + "o"]),
            helper.make_node("Add", [p + "o", prev], [p + "out"]),
        ]
        prev = p + "out"
    nodes.append(helper.make_node("ReduceMean", [prev], ["loss"], keepdims=0))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, d])
    return _model("attention", nodes, [x], "loss", inits)


def default_models(folder: Path) -> list[str]:
    """The zoo when this checkout has it, else three synthetic models saved under ``folder``."""
    try:
        import models

        if all(spec.split(":", 1)[1] in models.ZOO for spec in ZOO_MODELS):
            return list(ZOO_MODELS)
    except (ImportError, AttributeError):
        pass
    paths = []
    for build in (deep_mlp, cnn, attention):
        path = folder / f"{build.__name__}.onnx"
        onnx.save_model(build(), path)
        paths.append(str(path))
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="MODEL specs (default: three zoo or synthetic models)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per plan, passed to memplan check")
    ap.add_argument("--train", action="store_true", help="check the training step (needs autodiff)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        specs = args.models or default_models(Path(tmp))
        cmd = [sys.executable, "-m", "cli", "check", *specs, "--budget", "64GiB", "--budget", "60%",
               "--time-limit", str(args.time_limit), "--json"] + (["--train"] if args.train else [])
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", "0,1", *cmd]
        env = {**os.environ, "OMP_NUM_THREADS": "2"}
        times, proc = [], None
        for _ in range(args.repeat):
            start = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            if proc.returncode not in (0, 1):
                sys.exit(f"memplan check failed (exit {proc.returncode}): {proc.stderr.strip()}")
    report = json.loads(proc.stdout)
    print(f"memplan check over {len(specs)} models x 2 budgets, {os.cpu_count()} CPUs visible, pinned to 2 cores")
    print("| model | unplanned peak MiB | 64GiB | 60% |")
    print("|---|---:|---|---|")
    results = report["results"]
    for i in range(0, len(results), 2):
        a, b = results[i], results[i + 1]
        peak = a["unplanned_peak_bytes"]
        name = a["name"] if a["model"].startswith("zoo:") else Path(a["name"]).name
        print(f"| {name} | {peak / 2**20:.1f} | {a['result']} | {b['result']} "
              f"({b['plan']['status'] if b['plan'] else '-'}) |")
    print(f"\nexit code {proc.returncode}; wall time best {min(times):.2f} s, median {statistics.median(times):.2f} s "
          f"over {len(times)} runs (target < 30 s)")


if __name__ == "__main__":
    main()
