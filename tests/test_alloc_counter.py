"""The allocation counter behind verify's peaks (passes/alloc_counter.py): exact, or absent and said."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from passes import alloc_counter
from passes.onnx_export import export_model
from passes.verify import ALLOCATOR, RSS, measure_peak
from planner.liveness import MemoryModel, analyze
from tests.test_rewrite import long_skip  # a read at the start and at the end: 4 n-float buffers at C3

needs_counter = pytest.mark.skipif(alloc_counter.library() is None, reason="no C compiler to build the counter")

#: Random aligned allocations and frees through the preloaded library; after every step the
#: counter's bytes in use must equal the sum kept here (the table's deletions move entries around).
STRESS = r"""
import ctypes, json, random, sys
lib = ctypes.CDLL(None)
for n in ("in_use", "high", "lost", "reset"):
    getattr(lib, "memcount_" + n).restype = ctypes.c_longlong
lib.aligned_alloc.restype = ctypes.c_void_p
lib.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
lib.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
lib.free.argtypes = [ctypes.c_void_p]
lib.realloc.restype = ctypes.c_void_p
lib.realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
rng = random.Random(0)
base = lib.memcount_reset()
ptrs, sizes, total, high, bad = [], [], 0, 0, []
for step in range(60000):
    if ptrs and rng.random() < (0.4 if step < 30000 else 0.6):
        i = rng.randrange(len(ptrs))
        ptrs[i], ptrs[-1] = ptrs[-1], ptrs[i]
        sizes[i], sizes[-1] = sizes[-1], sizes[i]
        p, n = ptrs.pop(), sizes.pop()
        total -= n
        if rng.random() < 0.1:  # realloc of an aligned block: no longer counted
            lib.free(lib.realloc(p, n + 100))
        else:
            lib.free(p)
    else:
        n = rng.choice([64, 4096, rng.randrange(1, 9000)])
        if rng.random() < 0.5:
            p = lib.aligned_alloc(64, n)
        else:
            out = ctypes.c_void_p()
            assert lib.posix_memalign(ctypes.byref(out), 64, n) == 0
            p = out.value
        ptrs.append(p); sizes.append(n); total += n
    high = max(high, total)
    if lib.memcount_in_use() - base != total:
        bad.append(step)
print(json.dumps({"bad": bad[:5], "high": lib.memcount_high() - base, "want_high": high,
                  "lost": lib.memcount_lost(), "live": len(ptrs)}))
"""


@needs_counter
def test_the_table_counts_exactly_through_random_frees():
    env = dict(os.environ, LD_PRELOAD=alloc_counter.library())
    proc = subprocess.run([sys.executable, "-c", STRESS], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["bad"] == [] and got["lost"] == 0
    assert got["high"] == got["want_high"] and got["live"] > 0


@needs_counter
@pytest.mark.parametrize("n", [1024, 50_000])  # 16 KB and 800 KB: under and over glibc's mmap threshold
def test_orts_tensor_bytes_are_counted_to_the_byte(n):
    g = long_skip(n)
    predicted = analyze(g).dynamic_peak
    assert predicted == 4 * 4 * n
    m = measure_peak(export_model(g), {"x": np.ones(n, np.float32)}, repeats=1)
    assert m.method == ALLOCATOR
    assert m.peak_bytes == predicted  # not within a tolerance: every byte ORT's allocator holds
    assert m.cold_peak_bytes == predicted  # arena and memory pattern off: the warm-up holds no more


@needs_counter
def test_ort_asks_for_whole_64_byte_lines():
    # 1001 floats take 4004 bytes; ORT's allocator is asked for 4032 per tensor, and so is the model
    n = 1001
    m = measure_peak(export_model(long_skip(n)), {"x": np.ones(n, np.float32)}, repeats=1)
    assert m.peak_bytes == 4 * 4032 and analyze(long_skip(n)).dynamic_peak == 4 * 4032
    assert analyze(long_skip(n), model=MemoryModel(alloc_line=1)).dynamic_peak == 4 * 4004


def test_without_a_compiler_there_is_no_counter_and_peaks_come_from_rss(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(alloc_counter.COMPILER_ENV, str(tmp_path / "no-such-cc"))
    alloc_counter.library.cache_clear()
    try:
        assert alloc_counter.library() is None
        n = 1 << 20
        m = measure_peak(export_model(long_skip(n)), {"x": np.ones(n, np.float32)}, repeats=1)
        assert m.method == RSS and m.peak_bytes == m.rss_peak_bytes
        assert m.peak_bytes == pytest.approx(4 * 4 * n, rel=0.05)  # 16 MiB: within the RSS recipe's reach
    finally:
        alloc_counter.library.cache_clear()


def test_a_compiler_that_fails_leaves_no_library(tmp_path, monkeypatch):
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'cc: error: broken' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("MEMPLAN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(alloc_counter.COMPILER_ENV, str(cc))
    alloc_counter.library.cache_clear()
    try:
        assert alloc_counter.library() is None
        assert not list((tmp_path / "cache").glob("*.so"))
    finally:
        alloc_counter.library.cache_clear()


def test_a_cache_path_ld_preload_cannot_carry_builds_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPLAN_CACHE", str(tmp_path / "with space"))
    alloc_counter.library.cache_clear()
    try:
        assert alloc_counter.library() is None
        assert not (tmp_path / "with space").exists()
    finally:
        alloc_counter.library.cache_clear()


@needs_counter
def test_scatter_index_copies_are_heap_memory_the_count_leaves_out():
    # ScatterElements copies its indices into a std::vector (plain malloc): real memory, which the
    # model keeps (8 bytes an index), and which ORT's allocator never hands out.
    from planner.graph import GraphBuilder
    from planner.liveness import MemoryModel

    n = 1 << 16
    b = GraphBuilder()
    x = b.input("x", "float32", (n,))
    i = b.input("i", "int64", (n,))
    (d,) = b.node("Neg", [x], [("d", "float32", (n,))])
    (y,) = b.node("ScatterElements", [d, i, x], [("y", "float32", (n,))], attrs={"axis": 0})
    b.output(y)
    g = b.build()
    full, allocator = analyze(g).dynamic_peak, analyze(g, model=MemoryModel(scatter_index_bytes=0)).dynamic_peak
    assert full - allocator == 8 * n
    assert analyze(g).allocator_dynamic_peak == allocator  # derived from the one analysis
    m = measure_peak(export_model(g), {"x": np.ones(n, np.float32), "i": np.arange(n, dtype=np.int64)}, repeats=1)
    assert m.method == ALLOCATOR and m.peak_bytes == allocator


def _one_node(op, inputs, out_shape, **attrs):
    from onnx import TensorProto as T
    from onnx import helper as h

    from tests.test_function_ops import _model, _vi

    elem = {np.float32: T.FLOAT, np.bool_: T.BOOL}
    return _model(h.make_node(op, list(inputs), ["y"], **attrs),
                  [_vi(k, elem[v.dtype.type], v.shape) for k, v in inputs.items()], [_vi("y", T.FLOAT, out_shape)],
                  opset=17)


_F = np.float32
#: Kernels whose working buffers come from ORT's allocator in 64-byte lines, at sizes that are not
#: whole lines (Where: two branches of 4004 bytes; ConvTranspose: 1800 bytes of columns; LRN: 300 +
#: 500; Conv's whole im2col: 96), and Dropout's mask, which does not come from it at all.
_WORKING = {
    "where": ("Where", {"c": np.ones(1001, bool), "a": np.ones(1001, _F), "b": np.ones(1001, _F)}, [1001], {}),
    "conv_transpose": ("ConvTranspose", {"x": np.ones((1, 3, 5, 5), _F), "w": np.ones((3, 2, 3, 3), _F)},
                       [1, 2, 7, 7], {}),
    "lrn": ("LRN", {"x": np.ones((1, 3, 5, 5), _F)}, [1, 3, 5, 5], {"size": 3}),
    "conv_whole_im2col": ("Conv", {"x": np.ones((1, 1, 3, 4), _F), "w": np.ones((16, 1, 2, 2), _F)},
                          [1, 16, 2, 3], {}),
    "dropout_no_mask": ("Dropout", {"x": np.ones(1001, _F), "r": np.array(0.5, _F), "t": np.array(True)},
                        [1001], {}),
}


@needs_counter
@pytest.mark.parametrize("case", sorted(_WORKING))
def test_working_buffers_are_counted_as_ort_allocates_them(case):
    from passes.onnx_import import import_model

    op, feeds, out_shape, attrs = _WORKING[case]
    model = _one_node(op, feeds, out_shape, **attrs)
    lv = analyze(import_model(model))
    assert measure_peak(model, feeds, repeats=1).peak_bytes == lv.allocator_dynamic_peak
    exact = analyze(import_model(model), model=MemoryModel(alloc_line=1))
    if case != "dropout_no_mask":
        assert lv.scratch[0] > exact.scratch[0]  # rounded up: the sizes above are not whole lines
    else:
        assert lv.dynamic_peak - lv.allocator_dynamic_peak == 1001  # the mask: real memory, not ORT's allocator


@needs_counter
@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_cached_library_is_built_again(tmp_path, monkeypatch, damage):
    # a truncated library in the cache made every measuring child die of SIGBUS at preload:
    # verify failed with "measuring the model in onnxruntime failed: (no output)"
    good = Path(alloc_counter.library()).read_bytes()
    monkeypatch.setenv("MEMPLAN_CACHE", str(tmp_path / "cache"))
    alloc_counter.library.cache_clear()
    try:
        digest = hashlib.sha256(alloc_counter.SOURCE.encode()).hexdigest()[:16]
        cached = tmp_path / "cache" / f"alloc_counter-{digest}.so"
        cached.parent.mkdir()
        damaged = {"truncated": good[:3000], "garbage": b"not a library"}[damage]
        cached.write_bytes(damaged)
        assert alloc_counter.library() == str(cached)
        assert cached.read_bytes() != damaged and len(cached.read_bytes()) > len(good) // 2
        n = 1001
        m = measure_peak(export_model(long_skip(n)), {"x": np.ones(n, np.float32)}, repeats=1)
        assert m.method == ALLOCATOR and m.peak_bytes == 4 * 4032
    finally:
        alloc_counter.library.cache_clear()


def test_no_home_folder_means_no_counter_not_a_crash(monkeypatch):
    # a container's arbitrary uid: no $HOME, no passwd entry; Path.home() raised RuntimeError and
    # memplan verify died with a traceback
    import pwd

    for name in ("MEMPLAN_CACHE", "XDG_CACHE_HOME", "HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    alloc_counter.library.cache_clear()
    try:
        assert alloc_counter.library() is None
    finally:
        alloc_counter.library.cache_clear()


@needs_counter
def test_a_relative_cache_folder_still_preloads(tmp_path, monkeypatch):
    # MEMPLAN_CACHE=. built ./alloc_counter-*.so but preloaded it as 'alloc_counter-*.so', a name
    # ld.so looks up on the library path: not found, so verify measured RSS, and -v said nothing
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMPLAN_CACHE", ".")
    alloc_counter.library.cache_clear()
    try:
        lib = alloc_counter.library()
        assert lib is not None and os.path.isabs(lib) and Path(lib).parent == tmp_path
        n = 1001
        m = measure_peak(export_model(long_skip(n)), {"x": np.ones(n, np.float32)}, repeats=1)
        assert m.method == ALLOCATOR and m.peak_bytes == 4 * 4032
    finally:
        alloc_counter.library.cache_clear()


@needs_counter
def test_qlinear_matmul_int32_product_is_counted():
    """ORT's QLinearMatMul multiplies into an int32 buffer of the output's element count before it
    requantizes: a forward plan of a quantized model measured 1.33x its prediction (over budget)."""
    import onnx.parser

    from passes.onnx_import import import_model

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    q (float[3,5,40] x) => (float[3,5,24] y)
    <int8[40,24] wq = {7}, float ws = {0.05}, int8 wz = {0}, float xs = {0.1}, uint8 xz = {0},
     float ys = {0.2}, uint8 yz = {0}>
    {
      xq = QuantizeLinear(x, xs, xz)
      yq = QLinearMatMul(xq, xs, xz, wq, ws, wz, ys, yz)
      y = DequantizeLinear(yq, ys, yz)
    }
    """)
    wq = model.graph.initializer[0]
    wq.ClearField("int32_data")
    wq.int32_data.extend([7] * (40 * 24))
    lv = analyze(import_model(model))
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 5, 40)).astype(np.float32)}
    assert lv.scratch[1] == 4 * 3 * 5 * 24 + 32  # 1440 bytes of int32 in whole 64-byte lines
    assert measure_peak(model, feeds, repeats=1).peak_bytes == lv.allocator_dynamic_peak


@needs_counter
def test_default_options_figure_counts_the_arena_region_made_with_the_session():
    # ConvTranspose prepacks its weight while ORT makes the session: under the default options that
    # takes the CPU arena's first region (1 MiB) then, and the runs (a 4 KiB output) fit in it, so
    # counting from the made session read 0 B for "default ORT" (zoo:cnn?batch=1 likewise)
    from onnx import TensorProto, helper, numpy_helper

    from passes.verify import verify_models

    shape = [1, 4, 16, 16]
    graph = helper.make_graph(
        [helper.make_node("ConvTranspose", ["x", "k"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(np.full((4, 4, 3, 3), 0.5, np.float32), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    out_bytes = 4 * 16 * 16 * 4
    report = verify_models(model, model, {"x": np.ones(shape, np.float32)}, predicted_planned_peak=out_bytes,
                           base_bytes=2 * out_bytes, repeats=1)
    assert report.method == ALLOCATOR
    assert report.planned_default_no_arena_peak >= out_bytes
    # the region ORT holds for the runs: 1 MiB, less the prepacked weight it keeps in it
    assert (1 << 20) - 4096 <= report.planned_default_peak <= 1 << 20
    assert report.as_dict()["ort_default_options"]["dynamic_peak_bytes"] == report.planned_default_peak
