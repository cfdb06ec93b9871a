"""Cost model: FLOPs/bytes per op type, the roofline, device profiles, ORT profile reading."""
from __future__ import annotations

import json
import math

import pytest

from planner.costs import node_time, op_cost, op_time, read_ort_profile
from planner.devices import PROFILES, cpu_profile, device, transfer_time
from planner.errors import UsageError


@pytest.mark.parametrize("op,ins,outs,attrs,flops", [
    ("MatMul", [(8, 32, 64), (64, 16)], [(8, 32, 16)], {}, 2 * 8 * 32 * 16 * 64),
    ("Gemm", [(64, 32), (16, 64), (16,)], [(32, 16)], {"transA": 1, "transB": 1}, 2 * 32 * 16 * 64 + 32 * 16),
    ("Conv", [(2, 3, 8, 8), (4, 3, 3, 3)], [(2, 4, 6, 6)], {}, 2 * (2 * 4 * 6 * 6) * (3 * 3 * 3)),
    ("Conv", [(1, 4, 5, 5), (4, 2, 1, 1), (4,)], [(1, 4, 5, 5)], {"group": 2}, 2 * 100 * 2 + 100),
    ("ConvTranspose", [(1, 2, 3, 3), (2, 5, 2, 2)], [(1, 5, 6, 6)], {}, 2 * 18 * 20),
    ("Relu", [(10, 10)], [(10, 10)], {}, 100),
    ("Exp", [(10,)], [(10,)], {}, 80),
    ("ReduceMean", [(4, 50)], [(4, 1)], {}, 200),
    ("MaxPool", [(1, 1, 4, 4)], [(1, 1, 2, 2)], {"kernel_shape": [2, 2]}, 16),
    ("BatchNormalization", [(2, 3, 4, 4), (3,), (3,), (3,), (3,)], [(2, 3, 4, 4)], {}, 5 * 96),
    ("LayerNormalization", [(2, 8)], [(2, 8)], {}, 8 * 16),
    ("Softmax", [(4, 10)], [(4, 10)], {}, 200),
    # Q K^T and P V over 2 x 4 heads x 16 queries x 32 keys, head dim 8, and the softmax
    ("Attention", [(2, 4, 16, 8), (2, 4, 32, 8), (2, 4, 32, 8)], [(2, 4, 16, 8)], {},
     2 * 1024 * 32 + 2 * 1024 * 32 + 5 * 128 * 32),
    # the same as [batch, sequence, heads * head dim], 2 key/value heads
    ("Attention", [(2, 16, 32), (2, 32, 16), (2, 32, 16)], [(2, 16, 32)], {"q_num_heads": 4, "kv_num_heads": 2},
     2 * 1024 * 32 + 2 * 1024 * 32 + 5 * 128 * 32),
    # 28 keys and 4 past ones
    ("Attention", [(2, 4, 16, 8), (2, 4, 28, 8), (2, 4, 28, 8), None, (2, 4, 4, 8), (2, 4, 4, 8)],
     [(2, 4, 16, 8), (2, 4, 32, 8), (2, 4, 32, 8)], {}, 2 * 1024 * 32 + 2 * 1024 * 32 + 5 * 128 * 32),
    ("RMSNormalization", [(2, 8), (8,)], [(2, 8)], {}, 6 * 16),
    ("RotaryEmbedding", [(2, 4, 16, 8), (16, 4), (16, 4), (2, 16)], [(2, 4, 16, 8)], {}, 3 * 1024),
])
def test_op_cost_flops_and_bytes(op, ins, outs, attrs, flops):
    f, moved = op_cost(op, ins, outs, attrs)
    assert f == flops
    elems = sum(math.prod(s) for s in ins + outs if s is not None)
    assert moved == 4 * elems


def test_views_are_free_and_moves_cost_only_bytes():
    assert op_cost("Reshape", [(4, 4), (2,)], [(16,)]) == (0.0, 0.0)
    assert op_time("Reshape", [(4, 4), (2,)], [(16,)], {}, PROFILES["H200"]) == 0.0
    assert op_cost("Transpose", [(4, 4)], [(4, 4)], dtype_bytes=2) == (0.0, 64.0)
    assert op_cost("Gemm", [(2, 3), (3, 4), None], [(2, 4)])[0] == 2 * 2 * 3 * 4  # absent bias


def test_roofline_picks_the_slower_of_math_and_memory():
    dev = PROFILES["A100"]
    compute_bound = node_time(1e12, 1e6, dev, matmul=True)
    assert compute_bound == pytest.approx(1e12 / dev.matmul_flops + dev.launch_overhead)
    memory_bound = node_time(1e6, 1e10, dev)
    assert memory_bound == pytest.approx(1e10 / dev.hbm_bandwidth + dev.launch_overhead)
    # the same GEMM is faster on H200 than on T4
    args = ("MatMul", [(4096, 4096), (4096, 4096)], [(4096, 4096)], {})
    assert op_time(*args, PROFILES["H200"]) < op_time(*args, PROFILES["T4"])


def test_device_profiles():
    assert set(PROFILES) == {"H200", "H100", "A100", "V100", "T4"}
    assert device("h200") is PROFILES["H200"] and device("CPU").name == "cpu"
    cpu = cpu_profile()
    assert cpu.memory_bytes > 0
    assert all(p.memory_bytes > 0 for p in PROFILES.values())
    h200 = PROFILES["H200"]
    assert transfer_time(50e9, h200) == pytest.approx(1.0 + h200.launch_overhead, rel=1e-12)
    # each copy is launched: 1000 copies of 1 KiB cost 1000 launches, not 1 MiB's bandwidth alone
    assert transfer_time(1024, h200) * 1000 > 100 * transfer_time(1024 * 1000, h200)
    assert transfer_time(0, h200) == 0.0
    with pytest.raises(UsageError, match="not a known profile"):
        device("TPUv9")


def test_read_ort_profile_averages_kernel_time_per_node(tmp_path):
    events = [
        {"cat": "Session", "name": "model_run", "dur": 900},
        {"cat": "Node", "name": "mm_kernel_time", "dur": 100, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "mm_kernel_time", "dur": 300, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "relu_kernel_time", "dur": 10, "args": {"op_name": "Relu"}},
        {"cat": "Node", "name": "relu_fence_before", "dur": 1},
    ]
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(events))
    assert read_ort_profile(path) == pytest.approx({"mm": 200e-6, "relu": 10e-6})
    path.write_text("[]")
    with pytest.raises(UsageError, match="no node kernel events"):
        read_ort_profile(path)


def test_an_einsum_costs_the_matmuls_it_runs():
    """Einsum was an unknown op, one FLOP per output element: 'bchw,bchv->wv' (a weight gradient,
    256 outputs) looked 2000x cheaper than it is, so plans recomputed Einsums as if free."""
    as_matmul, _ = op_cost("MatMul", [(64, 128), (128, 32)], [(64, 32)])
    flops, _ = op_cost("Einsum", [(64, 128), (128, 32)], [(64, 32)], {"equation": "ij,jk->ik"})
    assert flops == as_matmul + 64 * 128  # the MatMul, and one pass over the first operand
    flops, _ = op_cost("Einsum", [(4, 16, 16, 16), (4, 16, 16, 16)], [(16, 16)], {"equation": b"bchw,bchv->wv"})
    assert flops >= 2 * 4 * 16 * 16 * 16 * 16


def test_half_precision_matrix_math_runs_at_the_tensor_core_rate():
    gemm = ("MatMul", [(8192, 8192), (8192, 8192)], [(8192, 8192)], {})  # compute-bound everywhere
    h100, v100 = PROFILES["H100"], PROFILES["V100"]
    fp32, fp16 = op_time(*gemm, h100, 4), op_time(*gemm, h100, 2, "float16")
    assert fp16 == pytest.approx(2 * 8192**3 / 989.4e12 + h100.launch_overhead) and fp16 < fp32 / 1.9
    assert op_time(*gemm, h100, 2, "bfloat16") == pytest.approx(fp16)
    # V100 has float16 tensor cores but no bfloat16 units: bfloat16 runs at its float32 rate
    assert op_time(*gemm, v100, 2, "float16") < op_time(*gemm, v100, 4) / 7
    assert op_time(*gemm, v100, 2, "bfloat16") == pytest.approx(op_time(*gemm, v100, 4))
    # element-wise math and the CPU (ORT runs float16 there in float32) keep their rates
    add = ("Add", [(8192, 8192), (8192, 8192)], [(8192, 8192)], {})
    assert op_time(*add, h100, 4, "float16") == pytest.approx(op_time(*add, h100, 4))
    cpu = cpu_profile()
    assert op_time(*gemm, cpu, 2, "float16") == pytest.approx(op_time(*gemm, cpu, 2))


def test_the_cli_costs_a_float16_matmul_at_the_float16_rate():
    import onnx.parser

    import cli
    from passes.onnx_import import import_model

    def graph(t):
        return import_model(onnx.parser.parse_model(f"""
            <ir_version: 8, opset_import: ["" : 17]>
            g ({t}[4096, 4096] a, {t}[4096, 4096] b) => ({t}[4096, 4096] c) {{ c = MatMul(a, b) }}"""))

    _, node_time, _ = cli._device_costs("H100")
    g16, g32 = graph("float16"), graph("float")
    t16, t32 = node_time(g16, g16.nodes[0]), node_time(g32, g32.nodes[0])
    assert t16 == pytest.approx(2 * 4096**3 / 989.4e12 + PROFILES["H100"].launch_overhead)
    assert t32 == pytest.approx(2 * 4096**3 / 494.7e12 + PROFILES["H100"].launch_overhead)
