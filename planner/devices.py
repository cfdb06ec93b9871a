"""Device profiles: memory, compute and bandwidth figures the cost model and swap planning use.

Figures are vendor datasheet numbers for dense math (no sparsity), SXM parts where there is a
choice; host-link figures are what a pinned-memory copy reaches one way in practice, below the
PCIe theoretical peak (Gen5 x16 ~64 GB/s -> ~50 GB/s; Gen4 ~32 -> ~25; Gen3 ~16 -> ~12).

A profile says nothing about copies overlapping compute: that is the runtime's doing, see
:data:`COPIES_OVERLAP_COMPUTE`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType

from planner.errors import UsageError


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    name: str
    memory_bytes: int  # device memory an allocation can use
    matmul_flops: float  # FLOP/s of MatMul/Gemm/Conv in fp32 training math (TF32 tensor cores where ORT uses them)
    vector_flops: float  # FLOP/s of element-wise math (fp32 CUDA cores / SIMD)
    hbm_bandwidth: float  # device memory bytes/s
    link_bandwidth: float  # host link bytes/s, one way (swap transfer rate)
    launch_overhead: float  # seconds added per kernel launch
    #: FLOP/s of MatMul/Gemm/Conv on float16 and bfloat16 tensors (tensor cores); 0: as matmul_flops
    #: (the CPU, which ORT runs in float32, and a part without such units for that type)
    matmul_flops_fp16: float = 0.0
    matmul_flops_bf16: float = 0.0

    def matmul_rate(self, dtype: str = "float32") -> float:
        """FLOP/s of matrix math on ``dtype`` tensors."""
        half = {"float16": self.matmul_flops_fp16, "bfloat16": self.matmul_flops_bf16}.get(dtype, 0.0)
        return half or self.matmul_flops


#: Whether a swap's copy runs beside compute in the model memplan writes, as ONNX Runtime runs it.
#: It does not: ORT (1.14 on, stream-aware execution) runs the CUDA EP's MemcpyToHost/FromHost
#: kernels on the node's compute stream (``ctx->GetComputeStream()``), and its default stream
#: partitioner (DeviceBasedPartitioner) puts every CUDA node on one stream. A copy therefore starts
#: after the kernels listed before it and holds up the ones after it, whatever copy engines the
#: GPU has. Planning with overlap priced swaps below what the written model costs (the swap
#: greedy's plan of zoo:gpt?batch=64 at 35% on H100: +11.3% beside compute, +43.9% in line, where
#: recomputing adds 23%). A runtime that gives copies a stream of their own is future work.
COPIES_OVERLAP_COMPUTE = False

GB = 1e9
PROFILES = MappingProxyType({
    # H200 SXM: 141 GB HBM3e, 4.8 TB/s; TF32 ~495 TFLOP/s dense, FP32 ~67 TFLOP/s, FP16/BF16 ~989;
    # PCIe Gen5.
    "H200": DeviceProfile("H200", 141 * GB, 494.7e12, 66.9e12, 4.8e12, 50 * GB, 4e-6, 989.4e12, 989.4e12),
    # H100 SXM: 80 GB HBM3, 3.35 TB/s; same SM math as H200; PCIe Gen5.
    "H100": DeviceProfile("H100", 80 * GB, 494.7e12, 66.9e12, 3.35e12, 50 * GB, 4e-6, 989.4e12, 989.4e12),
    # A100 SXM 80GB: HBM2e 2.04 TB/s; TF32 156 TFLOP/s, FP32 19.5, FP16/BF16 312; PCIe Gen4.
    "A100": DeviceProfile("A100", 80 * GB, 156e12, 19.5e12, 2.039e12, 25 * GB, 5e-6, 312e12, 312e12),
    # V100 SXM2 32GB: HBM2 0.9 TB/s; no TF32, FP32 15.7 TFLOP/s, FP16 tensor cores 125, no BF16
    # units; PCIe Gen3.
    "V100": DeviceProfile("V100", 32 * GB, 15.7e12, 15.7e12, 0.9e12, 12 * GB, 6e-6, 125e12),
    # T4: 16 GB GDDR6, 320 GB/s; FP32 8.1 TFLOP/s, FP16 tensor cores 65, no BF16 units; PCIe Gen3 x16.
    "T4": DeviceProfile("T4", 16 * GB, 8.1e12, 8.1e12, 0.32e12, 12 * GB, 6e-6, 65e12),
})


def cpu_profile() -> DeviceProfile:
    """This machine's CPU as a device: its RAM, a few cores of AVX2 math, memcpy as the 'link'.

    Swapping to host on a CPU moves bytes within the same memory.
    """
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        memory = 16 * 2**30
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    # ~50 GFLOP/s per core (AVX2 FMA, fp32, realistic); ~10 GB/s memory per core, 20 GB/s cap.
    return DeviceProfile("cpu", int(memory), 50e9 * cores, 10e9 * cores, min(20e9, 10e9 * cores), 10e9, 2e-6)


def device(name: str) -> DeviceProfile:
    """Profile by name (case-insensitive): H200, H100, A100, V100, T4 or cpu."""
    key = name.strip()
    if key.lower() == "cpu":
        return cpu_profile()
    for k, prof in PROFILES.items():
        if k.lower() == key.lower():
            return prof
    raise UsageError(f"--device {name!r} is not a known profile; use one of {', '.join([*PROFILES, 'cpu'])}")


def transfer_time(nbytes: int | float, dev: DeviceProfile) -> float:
    """Seconds to move ``nbytes`` one way over the host link: each copy is an operation of its own
    (a Memcpy node), launched like a kernel, so it costs ``launch_overhead`` however small it is;
    without it, swapping many small tensors looked as cheap as one big one."""
    if nbytes <= 0:
        return 0.0
    return dev.launch_overhead + float(nbytes) / dev.link_bandwidth
