"""The memory-pattern marker: ORT runs the model unfed and without a memory pattern; memplan reads it back."""
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models
from passes.autodiff import training_graph
from passes.mem_pattern import MEM_PATTERN_OFF_INPUT, has_mem_pattern_off, without_mem_pattern
from passes.onnx_export import export_model
from passes.onnx_import import import_model
from passes.verify import ORT_DEFAULT, measure_peak, planned_session_options
from planner.errors import ModelImportError
from tests.helpers import memplan, parse_model


SMALL = """
<ir_version: 7, opset_import: ["" : 13]>
g (float[4] x) => (float[4] y) {
    t = Relu(x)
    y = Neg(t)
}
"""


def test_marker_is_one_unfed_optional_input_and_changes_nothing_else():
    model = parse_model(SMALL, ir_version=7)
    marked = without_mem_pattern(model)
    assert not has_mem_pattern_off(model) and has_mem_pattern_off(marked)
    assert [i.name for i in marked.graph.input] == ["x", MEM_PATTERN_OFF_INPUT]
    assert marked.ir_version == 8  # optional types came with IR 8
    assert len(model.graph.input) == 1 and model.ir_version == 7  # the input model is untouched
    assert without_mem_pattern(marked) == marked  # once is enough
    assert marked.graph.node == model.graph.node and marked.graph.output == model.graph.output
    onnx.checker.check_model(marked, full_check=True)
    sess = ort.InferenceSession(marked.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([-1.0, 2.0, -3.0, 4.0], np.float32)
    (y,) = sess.run(None, {"x": x})  # the marker needs no feed
    np.testing.assert_array_equal(y, -np.maximum(x, 0))


def test_import_and_example_feeds_skip_the_marker():
    graph = training_graph(import_model("zoo:mlp?batch=4"))
    plain = export_model(graph)
    marked = export_model(graph, mem_pattern=False)
    assert has_mem_pattern_off(marked) and not has_mem_pattern_off(plain)
    again, base = import_model(marked), import_model(plain)
    assert [t.name for t in again.tensors] == [t.name for t in base.tensors]
    assert [n.name for n in again.nodes] == [n.name for n in base.nodes]
    feeds = models.example_feeds(marked, seed=0)
    assert sorted(feeds) == sorted(models.example_feeds(plain, seed=0))
    # an optional input that a node reads is kept, not skipped: the Gemm then has 4 inputs, which
    # import refuses (its check of declared outputs against the node's own inference; before it,
    # that the input has no tensor shape)
    read = onnx.ModelProto()
    read.CopyFrom(marked)
    read.graph.node[0].input.append(MEM_PATTERN_OFF_INPUT)
    with pytest.raises(ModelImportError, match=r"node 'fc0' \(Gemm.*input size 4"):
        import_model(read)


def test_marker_takes_the_memory_pattern_block_off_ort_default_options():
    """Under ORT's defaults the pattern's block comes on top of the arena's first-run regions."""
    graph = training_graph(import_model("zoo:gpt?batch=64"))
    plain = export_model(graph)
    marked = without_mem_pattern(plain)
    feeds = models.example_feeds(plain, seed=0)
    with_pattern = measure_peak(plain, feeds, session=ORT_DEFAULT, repeats=1, keep_outputs=True)
    with_marker = measure_peak(marked, feeds, session=ORT_DEFAULT, repeats=1, keep_outputs=True)
    pattern_off = measure_peak(plain, feeds, session=replace(ORT_DEFAULT, mem_pattern=False), repeats=1)
    assert with_marker.cold_peak_bytes < 0.75 * with_pattern.cold_peak_bytes  # 2.8x -> 1.5x its prediction
    # the marker does what enable_mem_pattern=False does (VmHWM noise: a few %)
    assert with_marker.cold_peak_bytes == pytest.approx(pattern_off.cold_peak_bytes, rel=0.15)
    assert with_pattern.outputs is not None and with_marker.outputs is not None
    for name, want in with_pattern.outputs.items():
        np.testing.assert_array_equal(with_marker.outputs[name], want, err_msg=name)


def test_cli_pin_order_emits_the_marker_and_verify_reads_it(tmp_path):
    spec, pinned, plain = "zoo:cnn?batch=8", tmp_path / "a.onnx", tmp_path / "b.onnx"
    for path, extra in ((pinned, ["--pin-order"]), (plain, [])):
        rc, _, err = memplan("plan", spec, "--budget", "80%", "--strategy", "greedy", "--workers", "1",
                             "--emit", path, *extra)
        assert rc == 0, err
    assert has_mem_pattern_off(onnx.load(pinned)) and not has_mem_pattern_off(onnx.load(plain))
    rc, out, err = memplan("verify", spec, pinned)
    assert rc == 0, err
    assert "outputs      equal" in out
    sess = ort.InferenceSession(str(pinned), planned_session_options(), providers=["CPUExecutionProvider"])
    assert MEM_PATTERN_OFF_INPUT in [i.name for i in sess.get_inputs()]


def test_verify_gives_a_pinned_model_no_pin_order_advice(tmp_path):
    # the "default ORT" line used to tell the user of a pinned model to emit it with --pin-order
    spec = "zoo:cnn?batch=32"  # a dynamic peak of several MiB: measured, so the line is printed
    outs = {}
    for name, extra in (("pinned", ["--pin-order"]), ("plain", [])):
        path = tmp_path / f"{name}.onnx"
        rc, _, err = memplan("plan", spec, "--budget", "101%", "--strategy", "none", "--emit", path, *extra)
        assert rc == 0, err
        rc, outs[name], err = memplan("verify", spec, path)
        assert rc == 0 and "default ORT" in outs[name], err
    assert "--pin-order" not in outs["pinned"] and "--pin-order" in outs["plain"]


def test_verify_names_the_arenas_first_region_for_a_model_under_it(tmp_path):
    # a pinned zoo:cnn?batch=1 (under 200 KiB dynamic) read 1.00 MiB under ORT's defaults and 1.00 x
    # with the arena off, and verify called the rest "the CPU arena's fragmentation": it is the
    # arena's first 1 MiB region, reserved however little the run needs
    spec, path = "zoo:cnn?batch=1", tmp_path / "p.onnx"
    rc, _, err = memplan("plan", spec, "--budget", "101%", "--strategy", "none", "--emit", path, "--pin-order")
    assert rc == 0, err
    rc, out, err = memplan("verify", spec, path)
    line = next(x for x in out.splitlines() if x.startswith("default ORT"))
    assert rc == 0 and "first region (1 MiB" in line and "fragmentation" not in line, out
