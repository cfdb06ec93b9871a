"""`memplan inspect`: output on a small model, and every bad-input path exits 3 with one line."""
import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests.helpers import memplan, parse_model


MLP = """
<ir_version: 8, opset_import: ["" : 17]>
mlp (float[batch, 64] x) => (float[batch, 16] y) <float[64, 128] W1, float[128, 16] W2>
{
    h = MatMul(x, W1)
    r = Relu(h)
    y = MatMul(r, W2)
}
"""


@pytest.fixture
def mlp_path(tmp_path):
    model = parse_model(MLP)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((64, 128)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal((128, 16)).astype(np.float32), "W2"),
    ])
    path = tmp_path / "mlp.onnx"
    onnx.save_model(model, path)
    return path


def test_inspect_json_and_plot(mlp_path, tmp_path):
    plot = tmp_path / "t.png"
    rc, out, err = memplan("inspect", mlp_path, "--dim", "batch=32", "--json", "--plot", plot)
    assert rc == 0, err
    info = json.loads(out)
    assert info["base_bytes"] == 32 * 64 * 4 + (64 * 128 + 128 * 16) * 4
    # Relu runs in place on h (32x128 floats); the last MatMul reads it while writing y (32x16).
    assert info["dynamic_peak_bytes"] == 32 * 128 * 4 + 32 * 16 * 4
    assert info["live_at_peak"][0]["bytes"] == 32 * 128 * 4
    assert len(info["timeline_bytes"]) == 3
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_table(mlp_path):
    rc, out, _ = memplan("inspect", mlp_path, "--dim", "batch=8")
    assert rc == 0
    assert "peak" in out and "constant" in out and "MatMul" in out


def _one_line_exit3(args, tmp_path):
    plot = tmp_path / "never.png"
    rc, out, err = memplan("inspect", *args, "--plot", plot)
    assert rc == 3, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memplan: error:"), err
    assert "Traceback" not in err
    assert not plot.exists()
    return lines[0]


def test_missing_path(tmp_path):
    assert "no such file" in _one_line_exit3([tmp_path / "nope.onnx"], tmp_path)


def test_not_onnx(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("hello, this is not a model\n" * 20)
    assert "not" in _one_line_exit3([p], tmp_path)


def test_truncated_protobuf(mlp_path, tmp_path):
    data = mlp_path.read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    assert "not a valid ONNX protobuf" in _one_line_exit3([p, "--dim", "batch=2"], tmp_path)


def test_cycle(tmp_path):
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Neg", ["a"], ["b"], name="n2"),
             helper.make_node("Identity", ["b"], ["y"], name="n3")]
    p = tmp_path / "cycle.onnx"
    onnx.save_model(helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                                      opset_imports=[helper.make_opsetid("", 17)]), p)
    assert "cycle" in _one_line_exit3([p], tmp_path)


def test_unbound_dim(mlp_path, tmp_path):
    line = _one_line_exit3([mlp_path], tmp_path)
    assert "'batch'" in line and "--dim batch=N" in line


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd"])
def test_external_data_outside_folder(tmp_path, location):
    model = parse_model(MLP.replace("batch", "2"))
    w1 = numpy_helper.from_array(np.ones((64, 128), np.float32), "W1")
    w1.ClearField("raw_data")
    w1.data_location = onnx.TensorProto.EXTERNAL
    w1.external_data.add(key="location", value=location)
    model.graph.initializer.extend([w1, numpy_helper.from_array(np.ones((128, 16), np.float32), "W2")])
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(b"\0" * 64 * 128 * 4)
    p = folder / "ext.onnx"
    p.write_bytes(model.SerializeToString())
    assert "outside the model's folder" in _one_line_exit3([p], tmp_path)


def test_a_model_in_a_hub_cache_folder_of_symlinks_is_read_planned_and_verified(tmp_path):
    """The HuggingFace hub cache: snapshots/<rev>/model.onnx and model.onnx_data are symbolic links
    to ../../blobs/<sha>. ORT reads the data file beside the link; memplan looked beside the blob
    ("external data file 'model.onnx_data' ... not found beside the model", exit 3)."""
    model = parse_model(MLP.replace("64", "1040").replace("128", "256"))  # W1 over 1 MiB: mapped, W2 read
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((1040, 256)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal((256, 16)).astype(np.float32), "W2")])
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    onnx.save_model(model, blobs / "m.onnx", save_as_external_data=True, location="model.onnx_data",
                    size_threshold=0)
    (blobs / "m.onnx").rename(blobs / "aaa")
    (blobs / "model.onnx_data").rename(blobs / "bbb")
    (snap / "model.onnx").symlink_to("../../blobs/aaa")
    (snap / "model.onnx_data").symlink_to("../../blobs/bbb")
    before = {p.name: p.read_bytes() for p in blobs.iterdir()}
    rc, out, err = memplan("inspect", snap / "model.onnx", "--dim", "batch=2", "--json")
    assert rc == 0, err
    assert json.loads(out)["peak_bytes"] > (1040 * 256 + 256 * 16) * 4
    emitted = snap / "planned.onnx"
    rc, _, err = memplan("plan", snap / "model.onnx", "--dim", "batch=2", "--forward", "--budget", "100%",
                         "--workers", "1", "--time-limit", "2", "--emit", emitted)
    assert rc == 0, err
    assert emitted.is_file() and not emitted.is_symlink()
    assert {p.name: p.read_bytes() for p in blobs.iterdir()} == before  # nothing written into the blobs
    rc, out, err = memplan("verify", snap / "model.onnx", emitted, "--dim", "batch=2", "--json")
    assert rc == 0, err
    assert json.loads(out)["outputs_equal"] is True


def test_bad_dim_flag_is_usage_error(mlp_path):
    rc, _, err = memplan("inspect", mlp_path, "--dim", "batch")
    assert rc == 2 and "NAME=POSITIVE_INT" in err


def test_top_limits_the_tensors_listed_and_zero_lists_none(mlp_path):
    for top, listed in ((0, 0), (1, 1)):
        rc, out, err = memplan("inspect", mlp_path, "--dim", "batch=8", "--top", str(top), "--json")
        assert rc == 0, err
        assert len(json.loads(out)["live_at_peak"]) == listed
    rc, out, _ = memplan("inspect", mlp_path, "--dim", "batch=8", "--top", "0")
    assert rc == 0 and "(0 shown)" in out and "MatMul" not in out.split("(0 shown)")[1]


def _chain(tmp_path, w_values):
    import onnx.parser

    path = tmp_path / "chain.onnx"
    onnx.save(onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[256, 4] x) => (float[256, 4] y) <float[4, 4] w = {{{w_values}}}> {{
            h = MatMul(x, w)
            r = Relu(h)
            s = Sigmoid(r)
            y = Add(s, h)
        }}"""), str(path))
    return path


def test_an_in_place_buffer_is_listed_by_the_tensor_it_holds_at_the_peak(tmp_path):
    """Relu and Sigmoid run in place: at the Add, r's buffer holds s. inspect listed it as r (the
    tensor that allocated it), a tensor dead by then, and never named s."""
    rc, out, err = memplan("inspect", _chain(tmp_path, ", ".join(["0.5"] * 16)), "--json")
    assert rc == 0, err
    rows = {r["tensor"]: r for r in json.loads(out)["live_at_peak"]}
    assert "s" in rows and rows["s"]["in_place_of"] == "r" and rows["s"]["op_type"] == "Sigmoid"
    assert "r" not in rows and "in_place_of" not in rows["h"]


def test_an_initializer_whose_values_do_not_fill_its_shape_is_one_line():
    """A float[4, 4] initializer with one value was a numpy traceback."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        rc, _, err = memplan("inspect", _chain(Path(tmp), "0.5"))
    assert rc == 3 and "initializer 'w' of shape [4, 4] holds values that do not fill it" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_dim_that_matches_nothing_is_a_usage_error(mlp_path):
    """`memplan plan zoo:gpt --dim batc=8` planned the default size after a warning; on a command
    for one model a dim that names nothing is a typo: exit 2, naming the dims there are."""
    rc, _, err = memplan("inspect", mlp_path, "--dim", "batch=8", "--dim", "bacth=4")
    assert rc == 2 and "--dim bacth matched no symbolic input dim" in err and "its symbolic input dims: batch" in err
    rc, _, err = memplan("plan", "zoo:gpt", "--budget", "90%", "--dim", "batc=8")
    assert rc == 2 and "gpt takes the options batch," in err and len(err.strip().splitlines()) == 1


def test_plot_title_says_training_step_wherever_the_step_is_inspected(tmp_path, monkeypatch):
    """--add-loss (or --loss) inspects the training step, as --train does; the plot's title said
    "(training step)" for --train only, so the same training-step curve came out titled as a forward run."""
    from click.testing import CliRunner

    import cli
    import planner.report

    titles = []
    real = planner.report.timeline_plot
    monkeypatch.setattr(planner.report, "timeline_plot",
                        lambda lv, title, fmt: titles.append(title) or real(lv, title, fmt))
    for flags in (["--train"], ["--loss", "loss"]):
        res = CliRunner().invoke(cli.main, ["inspect", "zoo:mlp", *flags, "--plot", str(tmp_path / "t.png"), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["peak_bytes"] > 0
    res = CliRunner().invoke(cli.main, ["inspect", "zoo:mlp", "--plot", str(tmp_path / "f.png")])
    assert res.exit_code == 0, res.output
    assert titles == ["zoo:mlp (training step)", "zoo:mlp (training step)", "zoo:mlp"]


def test_plot_is_written_in_the_format_its_extension_names(mlp_path, tmp_path):
    """--plot t.svg (and t.pdf, t.jpg) wrote PNG bytes under that name; now .png, .svg and .pdf
    (any case) are written as such, a name without an extension as PNG, and any other extension is
    refused before any work, in one line, with nothing written."""
    magic = {"t.png": b"\x89PNG", "t.PNG": b"\x89PNG", "t": b"\x89PNG", "t.svg": b"<?xml", "t.pdf": b"%PDF"}
    for name, head in magic.items():
        plot = tmp_path / name
        rc, _, err = memplan("inspect", mlp_path, "--dim", "batch=2", "--plot", plot)
        assert rc == 0, err
        assert plot.read_bytes().startswith(head), name
    assert b"<svg" in (tmp_path / "t.svg").read_bytes()
    for name in ("t.jpg", "t.xyz"):
        rc, out, err = memplan("inspect", mlp_path, "--dim", "batch=2", "--plot", tmp_path / name)
        assert rc == 2 and out == "", err
        assert err.count("\n") == 1 and f"cannot write a {name[1:]} image" in err and ".svg" in err, err
        assert not (tmp_path / name).exists()


def test_the_same_model_plots_the_same_bytes_in_every_format(mlp_path):
    """An SVG carried its creation date and random element ids, a PDF its creation time: two plots of
    one model differed (determinism: same inputs, same files)."""
    from passes.onnx_import import import_model
    from planner.liveness import analyze
    from planner.report import PLOT_FORMATS, timeline_plot

    lv = analyze(import_model(mlp_path, dims={"batch": 4}))
    for fmt in PLOT_FORMATS:
        assert timeline_plot(lv, "t", fmt) == timeline_plot(lv, "t", fmt), fmt


def test_every_key_of_inspect_json_is_documented_in_the_readme(mlp_path):
    """The README documented plan.json's keys but not inspect's: a CI script reading
    ``inspect --json`` had no stable list to read from. Every key printed (a live_at_peak row's
    too, an in-place one included) is named in the README's table of memplan.inspect/1."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("### Inspecting a model", 1)[1].split("\n###", 1)[0]
    named = set(re.findall(r"`([a-z_]+)`", table))
    rc, out, err = memplan("inspect", mlp_path, "--dim", "batch=4", "--json")
    assert rc == 0, err
    info = json.loads(out)
    row = info["live_at_peak"][0]
    assert "in_place_of" in row
    assert set(info) | set(info["base"]) | set(row) <= named, sorted((set(info) | set(info["base"]) | set(row)) - named)


def test_the_copy_of_an_initializer_that_is_an_output_is_named_at_the_peak(tmp_path):
    """A model returning a weight: ORT copies it into an output buffer held the whole run (1 KiB
    here), which the dynamic peak counted but neither the table nor the JSON said; the table
    showed 512 B of tensors for "1.50 KiB dynamic". Hand count: Add's A (256 B) and Sigmoid's B
    (an output, so not in place: 256 B) at step 1, plus W's 1024-byte copy."""
    model = parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[4, 16] x) => (float[4, 16] b, float[16, 16] w) <float[16, 16] w = {DATA}>
    {
        a = Add(x, x)
        b = Sigmoid(a)
    }
    """.replace("{DATA}", "{" + ", ".join(["1.0"] * 256) + "}"))
    path = tmp_path / "m.onnx"
    onnx.save_model(model, path)
    rc, out, err = memplan("inspect", path, "--json")
    assert rc == 0, err
    info = json.loads(out)
    assert info["output_copy_bytes"] == 1024
    assert info["dynamic_peak_bytes"] == 256 + 256 + 1024 and info["peak_node"] is not None
    assert sum(r["bytes"] for r in info["live_at_peak"]) + info["output_copy_bytes"] == info["dynamic_peak_bytes"]
    rc, out, err = memplan("inspect", path)
    assert rc == 0 and "incl. 1.00 KiB of ORT's copies of the initializers that are outputs" in out, out


def test_a_long_tensor_name_is_listed_in_full(tmp_path):
    """The table cut names at 48 characters: "<long name> (in place of <other>)" lost the tensor it
    takes over, and torch-style names that differ only near the end read the same."""
    a, b = "encoder_layers_0_attention_output_dense_pre_activation", "encoder_layers_0_mlp_activation_fn_out"
    path = tmp_path / "long.onnx"
    onnx.save_model(parse_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[64, 64] x) => (float[64, 64] y)
        {{
            h = Add(x, x)
            {a} = Relu(h)
            {b} = Sigmoid({a})
            y = Add({b}, h)
        }}"""), str(path))
    rc, out, err = memplan("inspect", path)
    assert rc == 0, err
    assert f"  {b} (in place of {a})\n" in out + "\n"


def test_explains_table_lists_names_in_full():
    """--explain's table cut names to their first 28 characters: torch names that differ only near
    the end ("/model/layers.0/self_attn/q_proj/MatMul_output_0", ".../k_proj/...") read the same."""
    from planner.explain import explain_table

    names = ["/model/layers.0/self_attn/q_proj/MatMul_output_0", "/model/layers.0/self_attn/k_proj/MatMul_output_0"]
    rows = [{"node": i, "name": n, "size_bytes": 64, "cost": 1.0, "live": (0, 1), "decision": "keep", "why": "-"}
            for i, n in enumerate(names)]
    table = explain_table(rows)
    assert all(f"  {n}  " in table for n in names)
