"""planner.fileio: atomic writes leave the permissions a plain write would; indented_json
writes what json.dumps(obj, indent=2) writes."""
import json
import os
import stat

from hypothesis import given, settings, strategies as st

from planner.fileio import atomic_write, indented_json


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_file_gets_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "a.json", "{}\n")
        os.umask(0o077)
        atomic_write(tmp_path / "b.json", b"{}\n")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a.json") == 0o644
    assert _mode(tmp_path / "b.json") == 0o600
    assert (tmp_path / "a.json").read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # no temp file left


def test_replaced_file_keeps_its_mode(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    atomic_write(path, "new")
    assert path.read_text() == "new"
    assert _mode(path) == 0o640


def test_a_model_with_external_data_keeps_the_modes_it_replaces(tmp_path, monkeypatch):
    # the >2 GB path (weights in <file>.data), taken here by lowering the limit for a small model
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import passes.onnx_export as onnx_export

    w = numpy_helper.from_array(np.arange(1024, dtype=np.float32).reshape(32, 32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [w])
    monkeypatch.setattr(onnx_export, "PROTO_LIMIT", 1)
    path, data = tmp_path / "m.onnx", tmp_path / "m.onnx.data"
    old = os.umask(0o022)
    try:
        onnx_export.save_model(helper.make_model(graph), path)  # new files: what open() gives
        assert (_mode(path), _mode(data)) == (0o644, 0o644)
        os.chmod(path, 0o640)
        os.chmod(data, 0o600)
        onnx_export.save_model(helper.make_model(graph), path)  # replaced: their modes kept
    finally:
        os.umask(old)
    assert (_mode(path), _mode(data)) == (0o640, 0o600)
    assert onnx.load(str(path), load_external_data=False).graph.initializer[0].data_location == TensorProto.EXTERNAL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]  # no temp folder left


def test_measuring_a_model_over_the_proto_limit_stages_its_weights_beside_it(monkeypatch):
    """verify's child reads the model from a file: over 2 GB one file does not parse (a 2.2 GB
    model failed 'Protobuf parsing failed'). Taken here by lowering the limit: the weights go to
    a data file beside it, the run sees them, and the caller's proto keeps them."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import passes.verify as verify

    monkeypatch.setattr("passes.onnx_export.PROTO_LIMIT", 1000)
    w = np.arange(1024, dtype=np.float32).reshape(32, 32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.ones((1, 32), np.float32)
    out = verify.measure_peak(model, {"x": x}, repeats=1, keep_outputs=True).outputs
    np.testing.assert_array_equal(out["y"], x @ w)
    kept = model.graph.initializer[0]
    assert kept.data_location == TensorProto.DEFAULT and not kept.external_data
    np.testing.assert_array_equal(numpy_helper.to_array(kept), w)


def test_a_model_its_check_refuses_is_not_written(tmp_path, monkeypatch):
    """write_model runs the check on the file it wrote, before the file takes its name: a refused
    model leaves nothing behind, its data file included (the streamed path, limits lowered)."""
    import numpy as np
    import pytest
    from onnx import TensorProto, helper, numpy_helper

    from passes import onnx_export
    from passes.onnx_import import import_model

    w = numpy_helper.from_array(np.arange(1024, dtype=np.float32).reshape(32, 32), "w")
    graph = import_model(helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [w]),
        opset_imports=[helper.make_opsetid("", 17)]))
    monkeypatch.setattr(onnx_export, "PROTO_LIMIT", 1000)
    seen = []

    def refuse(path):
        seen.append(sorted(p.name for p in Path(path).parent.iterdir()))
        raise ValueError("refused")

    from pathlib import Path
    with pytest.raises(ValueError, match="refused"):
        onnx_export.write_model(graph, tmp_path / "m.onnx", check=refuse)
    assert seen == [["m.onnx", "m.onnx.data"]]  # it saw the whole model, weights beside it
    assert list(tmp_path.iterdir()) == []
    onnx_export.write_model(graph, tmp_path / "m.onnx", check=lambda path: onnx_export.check_model(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]


def test_a_symlink_is_written_through_not_replaced(tmp_path):
    # renaming over the link replaced it with a regular file: `-o /dev/stdout` (a link in /dev)
    # turned /dev/stdout into the plan for every process after it
    target, link = tmp_path / "run42.json", tmp_path / "latest.json"
    target.write_text("old")
    link.symlink_to(target.name)
    atomic_write(link, "new")
    assert link.is_symlink() and os.readlink(link) == target.name
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "run42.json"]


def test_a_pipe_or_device_is_refused_not_replaced(tmp_path):
    # renamed over, as root, /dev/null became a regular file holding the plan
    import pytest

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        atomic_write(fifo, "plan")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]


def test_write_model_writes_through_a_symlink(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    from passes.onnx_export import save_model

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    target, link = tmp_path / "m.onnx", tmp_path / "latest.onnx"
    target.write_bytes(b"old")
    link.symlink_to(target.name)
    save_model(helper.make_model(graph), link)
    assert link.is_symlink()
    assert onnx.load(target).graph.node[0].op_type == "Relu"


_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
                     st.sampled_from(["},\n      {", "{", "}", '"', "\x00memplan-bulk-0\x00", "%s"]))
_flat_events = st.lists(st.dictionaries(st.text(max_size=6) | st.sampled_from(["op", "node", "tensor"]), _scalars,
                                        max_size=4), max_size=8)
_plans = st.dictionaries(st.text(max_size=8) | st.sampled_from(["schedule", "recomputed"]),
                         _scalars | _flat_events | st.lists(_scalars, max_size=3)
                         | st.dictionaries(st.text(max_size=4), _flat_events, max_size=2), max_size=6)


@settings(max_examples=300, deadline=None)
@given(_plans | _flat_events | _scalars)
def test_indented_json_is_json_dumps_with_indent_2(obj):
    assert indented_json(obj) == json.dumps(obj, indent=2)
