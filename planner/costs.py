"""Per-node time: FLOPs and bytes moved per op (pure Python, ONNX-free), a roofline on a device
profile, and the reader of a measured ORT profile.

``op_cost(op_type, inputs, outputs, attrs)`` takes shapes as tuples of ints and attributes as
plain Python and returns (flops, bytes_moved). Bytes moved = every input read once + every output
written once; zero-copy views move nothing. ``node_time`` is the roofline: the slower of math
and memory traffic, plus a launch overhead.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from planner.devices import DeviceProfile
from planner.errors import UsageError

Shape = Sequence[int]

VIEW_OPS = frozenset({"Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten"})
ZERO_OPS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape"})
#: Data movement only: no arithmetic, but every byte is read and written.
MOVE_OPS = frozenset({"Transpose", "Concat", "Slice", "Gather", "GatherElements", "Expand", "Pad", "Tile",
                      "Split", "ScatterElements", "ScatterND", "DepthToSpace", "SpaceToDepth", "Cast",
                      "MemcpyToHost", "MemcpyFromHost"})
#: FLOPs per output element of element-wise ops (transcendentals cost several).
ELEMENTWISE = {
    "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Neg": 1, "Abs": 1, "Relu": 1, "Max": 1, "Min": 1,
    "Clip": 2, "LeakyRelu": 2, "Where": 1, "Equal": 1, "Less": 1, "Greater": 1, "Not": 1,
    "And": 1, "Or": 1, "Sign": 1, "Reciprocal": 1, "Sqrt": 4, "Pow": 8, "Exp": 8, "Log": 8,
    "Tanh": 8, "Sigmoid": 8, "Erf": 8, "Gelu": 12, "Softplus": 10, "HardSigmoid": 3,
    "Dropout": 2, "BiasGelu": 13, "FastGelu": 12, "ReluGrad": 1, "SigmoidGrad": 3, "TanhGrad": 3,
    "RotaryEmbedding": 3,
}
REDUCE_OPS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                        "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "GlobalAveragePool",
                        "GlobalMaxPool", "ArgMax", "ArgMin"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
#: FLOPs per input element: mean, variance, normalise, scale and shift.
NORM_OPS = {"BatchNormalization": 5, "LayerNormalization": 8, "InstanceNormalization": 8,
            "GroupNormalization": 8, "SimplifiedLayerNormalization": 6, "RMSNormalization": 6, "LRN": 6}
#: max, subtract, exp, sum, divide (+ gather and log for the losses).
SOFTMAX_OPS = {"Softmax": 5, "LogSoftmax": 6, "SoftmaxCrossEntropyLoss": 7, "NegativeLogLikelihoodLoss": 2}
MATMUL_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "MatMulInteger", "Einsum", "Attention"})


def numel(shape: Shape) -> int:
    return math.prod(int(d) for d in shape)


def op_cost(
    op_type: str,
    inputs: Sequence[Shape | None],
    outputs: Sequence[Shape | None],
    attrs: Mapping[str, Any] | None = None,
    dtype_bytes: int = 4,
) -> tuple[float, float]:
    """(flops, bytes_moved) of one node; ``None`` shapes are absent optional inputs/outputs."""
    attrs = attrs or {}
    ins = [tuple(s) for s in inputs if s is not None]
    outs = [tuple(s) for s in outputs if s is not None]
    moved = float(dtype_bytes * (sum(numel(s) for s in ins) + sum(numel(s) for s in outs)))
    out0 = numel(outs[0]) if outs else 0
    if op_type in VIEW_OPS or op_type in ZERO_OPS:
        return 0.0, 0.0
    if op_type in MOVE_OPS:
        return 0.0, moved
    if op_type == "MatMul" and len(ins) >= 2:
        k = ins[0][-1] if ins[0] else 1
        return 2.0 * out0 * k, moved
    if op_type == "Gemm" and len(ins) >= 2:
        a = ins[0]
        k = a[0] if attrs.get("transA", 0) else a[-1]
        return 2.0 * out0 * k + (out0 if len(ins) > 2 else 0), moved
    if op_type == "Conv" and len(ins) >= 2:
        w = ins[1]  # (C_out, C_in / group, *kernel)
        macs = out0 * numel(w[1:])
        return 2.0 * macs + (out0 if len(ins) > 2 else 0), moved
    if op_type == "ConvTranspose" and len(ins) >= 2:
        x, w = ins[0], ins[1]  # x (N, C_in, *s); w (C_in, C_out / group, *kernel)
        macs = numel(x) * numel(w[1:])
        return 2.0 * macs + (out0 if len(ins) > 2 else 0), moved
    if op_type == "Einsum" and attrs.get("equation") and ins:
        from planner.einsum import einsum_flops

        equation = attrs["equation"]
        return einsum_flops(equation.decode() if isinstance(equation, bytes) else str(equation), ins), moved
    if op_type == "Attention" and len(inputs) >= 3 and None not in inputs[:3] and outs:
        return _attention_flops(inputs, out0, attrs), moved
    if op_type in ELEMENTWISE:
        return float(ELEMENTWISE[op_type] * out0), moved
    if op_type in REDUCE_OPS:
        return float(numel(ins[0]) if ins else out0), moved
    if op_type in POOL_OPS:
        kernel = attrs.get("kernel_shape") or [1]
        return float(out0 * numel(kernel)), moved
    if op_type in NORM_OPS:
        return float(NORM_OPS[op_type] * (numel(ins[0]) if ins else out0)), moved
    if op_type in SOFTMAX_OPS:
        return float(SOFTMAX_OPS[op_type] * (numel(ins[0]) if ins else out0)), moved
    # Unknown op: one FLOP per output element, and its bytes; never zero so it is never free.
    return float(out0), moved


def _attention_flops(inputs: Sequence[Shape | None], out0: int, attrs: Mapping[str, Any]) -> float:
    """Attention (opset 23): Q K^T and P V, each 2 FLOPs per multiply-add over every query, key
    (past keys included) and head dim, and a softmax over the scores. Q is [batch, heads, queries,
    head dim], or [batch, queries, heads * head dim] with the heads in ``q_num_heads``; K's
    second-to-last dim is its length either way."""
    q, k = tuple(inputs[0]), tuple(inputs[1])
    past = inputs[4] if len(inputs) > 4 else None
    keys = int(k[-2]) + (int(past[-2]) if past is not None else 0)
    head = int(q[-1]) // max(1, int(attrs.get("q_num_heads", 1))) if len(q) == 3 else int(q[-1])
    scores = numel(q) // max(1, head) * keys  # batch x heads x queries x keys
    return float(2 * numel(q) * keys + 2 * out0 * keys + SOFTMAX_OPS["Softmax"] * scores)


def node_time(flops: float, bytes_moved: float, device: DeviceProfile, matmul: bool = False,
              dtype: str = "float32") -> float:
    """Roofline seconds: max(math time, memory time) + launch overhead. Matrix math on float16 or
    bfloat16 ``dtype`` runs at the device's tensor-core rate for that type."""
    rate = device.matmul_rate(dtype) if matmul else device.vector_flops
    return max(flops / rate, bytes_moved / device.hbm_bandwidth) + device.launch_overhead


def op_time(op_type: str, inputs: Sequence[Shape | None], outputs: Sequence[Shape | None],
            attrs: Mapping[str, Any] | None, device: DeviceProfile, dtype_bytes: int = 4,
            dtype: str = "float32") -> float:
    """``node_time`` of ``op_cost``: the per-node time of a device profile (``dtype``: the element
    type of the node's output, which picks the matrix-math rate)."""
    flops, moved = op_cost(op_type, inputs, outputs, attrs, dtype_bytes)
    if flops == 0 and moved == 0:
        return 0.0  # views cost nothing, not even a launch
    return node_time(flops, moved, device, matmul=op_type in MATMUL_OPS, dtype=dtype)


def read_ort_profile(path: str | Path, statistic: str = "mean") -> dict[str, float]:
    """Kernel seconds per node name from an ORT profile (``SessionOptions.enable_profiling``):
    the ``statistic`` ("mean" or "median") over the runs it recorded.

    ORT writes a JSON list of trace events; node kernels are ``"cat": "Node"`` events named
    ``<node>_kernel_time`` with ``dur`` in microseconds, one per run.
    """
    durations: dict[str, list[float]] = defaultdict(list)
    for ev in _kernel_events(path):
        name = str(ev["name"])
        try:
            dur = float(ev.get("dur", 0.0))
        except (TypeError, ValueError):
            raise UsageError(f"{path}: event {name!r} has a non-numeric dur; is it an ORT profile?") from None
        if not (math.isfinite(dur) and dur >= 0):
            raise UsageError(f"{path}: event {name!r} has dur {ev.get('dur')!r}; kernel times are finite and >= 0 "
                             "microseconds: profile the run again")
        durations[name[: -len("_kernel_time")]].append(dur * 1e-6)
    if not durations:
        raise UsageError(f"{path}: no node kernel events; profile a run with SessionOptions.enable_profiling = True")
    reduce = {"mean": statistics.fmean, "median": statistics.median}[statistic]
    return {k: float(reduce(durations[k])) for k in sorted(durations)}


def ort_profile_providers(path: str | Path) -> frozenset[str]:
    """The execution providers that ran the node kernels of an ORT profile (each kernel event's
    ``args.provider``; empty where the profile does not say): ``--swap`` refuses op times the CPU
    provider took, as it refuses ``--costs measured`` on the CPU."""
    return frozenset(str(ev["args"]["provider"]) for ev in _kernel_events(path)
                     if isinstance(ev.get("args"), dict) and ev["args"].get("provider"))


def _kernel_events(path: str | Path) -> list[dict[str, Any]]:
    """The ``"cat": "Node"`` events named ``<node>_kernel_time`` of the ORT profile at ``path``."""
    try:
        events = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such profile file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"{path}: not an ORT profile JSON ({err}); write one with enable_profiling") from None
    return [ev for ev in (events if isinstance(events, list) else [])
            if isinstance(ev, dict) and ev.get("cat") == "Node" and str(ev.get("name", "")).endswith("_kernel_time")]
