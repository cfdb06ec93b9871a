"""Pack onnxruntime-gpu small enough to carry to a device machine (dev tooling, not the product).

    python bench/gpu_pack_ort.py ONNXRUNTIME_GPU.whl OUTDIR [--arch 90]

The onnxruntime-gpu 1.31.1 wheel (CUDA 13) is 255 MB; a device call carries at most 64 MiB. Most of
it is ``libonnxruntime_providers_cuda.so``'s ``.nv_fatbin`` section: cubins for six GPU
architectures, and mostly kernels of contrib ops (flash attention, MoE GEMMs, CUTLASS, LLM ops)
that a plain ONNX training graph never launches. This script zeroes, in place (sizes and offsets
unchanged, so the ELF stays valid):

* every cubin whose architecture is not ``--arch`` (an H200/H100 is sm_90);
* every remaining cubin whose kernels all live outside ``onnxruntime::cuda`` and that names a
  contrib marker (``contrib``, ``flash``, ``moe``, ``cutlass``, ``fmha``, ``llm``, ...).

Zeroed bytes compress to nothing: the provider goes from 284 MB to about 10 MB xz. A model that
needed a zeroed kernel would fail at its launch with a CUDA image error (not silently).

OUTDIR gets ``py.tar.xz`` (the package's Python files), ``cuda.so.xz``, ``pybind.so.xz`` and
``libonnxruntime_providers_shared.so``; bench/gpu_run.sh unpacks them on the device. Needs the
``zstd`` command here (fatbin payloads are zstd-compressed).
"""
from __future__ import annotations

import argparse
import io
import lzma
import re
import struct
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
CONTRIB_MARKERS = (b"contrib", b"flash", b"moe", b"cutlass", b"fmha", b"xqa", b"fp4", b"fp8", b"llm",
                   b"Attention", b"attention", b"quant", b"Quant")
CORE_NAMESPACE = b"11onnxruntime4cuda"  # mangled onnxruntime::cuda


def _section(elf: bytes, wanted: str) -> tuple[int, int]:
    """(file offset, size) of an ELF64 section by name."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    str_off = struct.unpack_from("<Q", elf, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        base = shoff + i * shentsize
        name_off, = struct.unpack_from("<I", elf, base)
        name = elf[str_off + name_off: elf.index(b"\0", str_off + name_off)].decode()
        if name == wanted:
            offset, size = struct.unpack_from("<QQ", elf, base + 0x18)
            return offset, size
    raise SystemExit(f"gpu_pack_ort: error: no {wanted} section; not an onnxruntime CUDA provider?")


def _entries(elf: bytes, start: int, size: int):
    """Yield (payload offset, payload size, sm arch) of every cubin/PTX entry of a fatbin section."""
    p, end = start, start + size
    while p < end:
        magic, _, header, fat = struct.unpack_from("<IHHQ", elf, p)
        if magic != FATBIN_MAGIC:  # alignment padding between blobs
            p += 8
            continue
        q, blob_end = p + header, p + header + fat
        while q < blob_end:
            _, _, entry_header, padded = struct.unpack_from("<HHII", elf, q)
            arch, = struct.unpack_from("<I", elf, q + 28)
            yield q + entry_header, padded, arch
            q += entry_header + padded
        p = blob_end


def _symbols(payload: bytes) -> set[bytes]:
    data = payload
    if payload[:4] == b"\x28\xb5\x2f\xfd":  # zstd frame; the alignment padding after it makes zstd
        # complain at the end, after it has written the whole frame out
        data = subprocess.run(["zstd", "-d", "-c"], input=payload, capture_output=True).stdout
    return set(re.findall(rb"_Z[A-Za-z0-9_]{10,}", data))


def prune(elf: bytearray, arch: int) -> tuple[int, int]:
    """Zero unwanted cubins in place; returns (bytes zeroed, bytes kept)."""
    start, size = _section(bytes(elf), ".nv_fatbin")
    zeroed = kept = 0
    for offset, length, entry_arch in list(_entries(bytes(elf), start, size)):
        drop = entry_arch != arch
        if not drop:
            names = _symbols(bytes(elf[offset:offset + length]))
            core = any(CORE_NAMESPACE in s for s in names)
            drop = not core and any(m in s for s in names for m in CONTRIB_MARKERS)
        if drop:
            elf[offset:offset + length] = bytes(length)
            zeroed += length
        else:
            kept += length
    return zeroed, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel")
    ap.add_argument("outdir")
    ap.add_argument("--arch", type=int, default=90, help="SM architecture to keep (90: H100/H200)")
    args = ap.parse_args()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(args.wheel) as whl:
        names = whl.namelist()
        cuda = next(n for n in names if n.endswith("libonnxruntime_providers_cuda.so"))
        pybind = next(n for n in names if "onnxruntime_pybind11_state" in n)
        shared = next(n for n in names if n.endswith("libonnxruntime_providers_shared.so"))
        elf = bytearray(whl.read(cuda))
        zeroed, kept = prune(elf, args.arch)
        print(f"cuda provider: zeroed {zeroed / 1e6:.1f} MB of cubins, kept {kept / 1e6:.1f} MB", file=sys.stderr)
        (out / "cuda.so.xz").write_bytes(lzma.compress(bytes(elf), preset=9))
        (out / "pybind.so.xz").write_bytes(lzma.compress(whl.read(pybind), preset=9))
        (out / "libonnxruntime_providers_shared.so").write_bytes(whl.read(shared))
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:xz") as tar:
            for n in names:
                if n.startswith("onnxruntime/") and not n.endswith("/") and ".so" not in n:
                    info = tarfile.TarInfo(n)
                    data = whl.read(n)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        (out / "py.tar.xz").write_bytes(buf.getvalue())
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({total / 2**20:.1f} MiB)", file=sys.stderr)


if __name__ == "__main__":
    main()
