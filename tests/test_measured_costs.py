"""--costs measured / --costs PROFILE.json: op times from ONNX Runtime's profiler on this machine."""
from __future__ import annotations

import json

import onnxruntime as ort
import pytest
from click.testing import CliRunner

import cli
import models
from passes import measured_costs
from passes.autodiff import training_graph
from passes.onnx_import import import_model
from planner.errors import UsageError

MLP = "zoo:mlp?batch=512&inputs=64&hidden=256&layers=6"


def _train_graph():
    return training_graph(import_model(MLP))


def test_measure_times_every_node_and_ranks_gemms_above_relus():
    graph = _train_graph()
    found = measured_costs.measure(graph, runs=3)
    assert found.timed == found.total == len(graph.nodes)
    ops = {n.name: n.op_type for n in graph.nodes}
    gemm = [s for name, s in found.seconds.items() if ops[name] in ("Gemm", "MatMul")]
    relu = [s for name, s in found.seconds.items() if ops[name] == "Relu"]
    assert gemm and relu
    # a 512x256x256 Gemm does ~33 M multiply-adds, a Relu 131 K elementwise ones
    assert max(gemm) > 5 * max(relu)


def test_untimed_nodes_get_the_estimate_on_the_measured_scale():
    graph = _train_graph()
    first, second = graph.nodes[0], graph.nodes[1]
    costs = measured_costs.MeasuredCosts({n.name: 2.0 for n in graph.nodes[1:]}, "test", len(graph.nodes) - 1,
                                         len(graph.nodes))
    node_time = costs.node_time(graph, lambda g, n: 4.0 if n is first else 1.0)
    assert node_time(graph, second) == 2.0
    assert node_time(graph, first) == pytest.approx(8.0)  # estimate 4 x the median ratio 2/1


def _profile_of_train_graph(tmp_path, model_spec: str) -> str:
    """What a user does: memplan train-graph, then ORT's profiler on that file."""
    onnx_path = tmp_path / "train.onnx"
    r = CliRunner().invoke(cli.main, ["train-graph", model_spec, "-o", str(onnx_path)])
    assert r.exit_code == 0, r.output
    import onnx

    model = onnx.load(str(onnx_path))
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "user")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    feeds = models.example_feeds(model, seed=0)
    for _ in range(3):
        sess.run(None, feeds)
    return sess.end_profiling()


def test_a_profile_file_prices_the_plan_and_gives_the_same_plan_twice(tmp_path):
    profile = _profile_of_train_graph(tmp_path, MLP)
    runner = CliRunner()
    plans = []
    for k in range(2):
        out = tmp_path / f"plan{k}.json"
        r = runner.invoke(cli.main, ["plan", MLP, "--budget", "85%", "--costs", profile, "--time-limit", "5",
                                     "--workers", "1", "-o", str(out)])
        assert r.exit_code == 0, r.output
        assert "op times      profile" in r.output
        plans.append(json.loads(out.read_text()))
    a, b = plans
    assert a["costs"].startswith(f"profile {profile}")
    assert a["schedule"] == b["schedule"] and a["compute_time"] == b["compute_time"]
    # the profile's scale (CPU seconds), not the H100 roofline's
    device = json.loads(_plan_json(runner, tmp_path, ["--costs", "device"]))
    assert a["compute_time"] > 3 * device["compute_time"]


def _plan_json(runner, tmp_path, extra) -> str:
    out = tmp_path / "device.json"
    r = runner.invoke(cli.main, ["plan", MLP, "--budget", "85%", "--time-limit", "5", "--workers", "1",
                                 "-o", str(out), *extra])
    assert r.exit_code == 0, r.output
    return out.read_text()


def test_a_profile_of_another_model_is_refused(tmp_path):
    other = _profile_of_train_graph(tmp_path, "zoo:cnn?batch=2")
    with pytest.raises(UsageError, match=r"times \d+ of the \d+ nodes"):
        measured_costs.read_profile(_train_graph(), other)
    r = CliRunner().invoke(cli.main, ["plan", MLP, "--budget", "85%", "--costs", other, "-o",
                                      str(tmp_path / "p.json")])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "memplan train-graph" in r.output
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--costs", "no-such-profile.json"], "not 'device', 'measured' or an existing ORT profile JSON file"),
    (["--costs", "measured", "--max-batch", "--budget", "1MiB"], "--max-batch"),
])
def test_bad_costs_arguments_get_one_line(args, message):
    argv = ["plan", MLP, *args]
    if "--budget" not in argv:
        argv += ["--budget", "85%"]
    r = CliRunner().invoke(cli.main, argv)
    assert r.exit_code == 2
    assert message in r.output and r.output.count("\n") == 1


def test_costs_on_a_json_graph_is_refused(benchmarks_dir):
    graph = next((benchmarks_dir / "remat").glob("random_layered_n100_*.json"))
    r = CliRunner().invoke(cli.main, ["plan", str(graph), "--budget", "90%", "--costs", "measured"])
    assert r.exit_code == 2 and "JSON graph" in r.output


def test_swap_with_op_times_measured_on_the_cpu_is_refused(monkeypatch):
    """--costs measured on a CPU-only machine with --swap priced the copies at the H100 profile's
    host link against CPU op times (two orders of magnitude longer than the H100's): every swap
    looked free. Refused in one line; without --swap the measured costs still plan."""
    import dataclasses

    real = measured_costs.measure  # on the CPU as CI runs it, wherever this test runs
    monkeypatch.setattr(measured_costs, "measure",
                        lambda g: dataclasses.replace(real(g), source="measured on CPUExecutionProvider"))
    res = CliRunner().invoke(cli.main, ["plan", "zoo:mlp", "--budget", "99%", "--swap", "--costs", "measured",
                                        "--time-limit", "2"])
    assert res.exit_code == 2 and "--costs measured timed the ops on this machine's CPU" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_swap_with_a_profile_the_cpu_provider_made_is_refused(tmp_path):
    """--costs PROFILE.json made on the CPU with --swap was the same mismatch as --costs measured
    there, but planned: zoo:gpt?batch=8 at 45% swapped 23 nodes at an added time of 0 s. Refused in
    one line, nothing written; a profile where a GPU provider ran the kernels still plans."""
    profile = _profile_of_train_graph(tmp_path, MLP)
    out = tmp_path / "plan.json"
    argv = ["plan", MLP, "--budget", "85%", "--swap", "--costs", profile, "--time-limit", "2", "--workers", "1",
            "-o", str(out)]
    res = CliRunner().invoke(cli.main, argv)
    assert res.exit_code == 2 and f"--costs {profile} timed the ops on the CPU (CPUExecutionProvider)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()
    # the same kernels as a CUDA run records them (its shape ops stay on the CPU provider)
    events = json.loads(open(profile).read())
    for k, ev in enumerate(e for e in events if e.get("cat") == "Node" and "provider" in e.get("args", {})):
        ev["args"]["provider"] = "CUDAExecutionProvider" if k % 2 else "CPUExecutionProvider"
    gpu = tmp_path / "gpu_profile.json"
    gpu.write_text(json.dumps(events))
    argv[argv.index(profile)] = str(gpu)
    res = CliRunner().invoke(cli.main, argv)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["costs"].startswith(f"profile {gpu}, run on CPUExecutionProvider, CUDA")


def test_deterministic_with_measured_costs_says_the_plan_can_change(caplog):
    """``--deterministic`` repeats the solve, not a fresh measurement of the op times: ``plan zoo:cnn
    --budget 70% --costs measured --deterministic`` three times gave three plan digests (added 12.94%,
    9.42%, 13.00%) and said nothing. Now it says so, and names the profile file that repeats."""
    argv = ["plan", MLP, "--budget", "85%", "--time-limit", "1", "--workers", "1", "--json"]
    for extra, warned in ((["--costs", "measured", "--deterministic"], True), (["--costs", "measured"], False),
                          (["--deterministic"], False)):
        caplog.clear()
        r = CliRunner().invoke(cli.main, argv + extra)
        assert r.exit_code == 0, r.output
        said = [rec.getMessage() for rec in caplog.records if "--costs measured times the ops afresh" in rec.getMessage()]
        assert len(said) == warned, extra
        assert not warned or "--costs PROFILE.json" in said[0]


def test_a_model_ort_cannot_run_names_the_op_and_the_costs_that_plan_it(tmp_path, monkeypatch):
    """A float64 Softplus (no CPU kernel in ORT) under --costs measured: one line naming the node,
    but its fix said "use a device profile (--device)", and with --device added it failed the same
    way. Now it names --costs device. Nothing is left in the temp folder or beside the model."""
    import tempfile

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)), "W")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["a"]), helper.make_node("Softplus", ["a"], ["b"]),
                           helper.make_node("ReduceSum", ["b"], ["loss"], keepdims=0)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [8, 16])],
                          [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])], [w])
    model = tmp_path / "softplus64.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(model))
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "p.json"
    for extra in ([], ["--device", "A100"]):
        r = CliRunner().invoke(cli.main, ["plan", str(model), "--budget", "95%", "--costs", "measured", "-o", str(out),
                                          *extra])
        assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
        assert "Softplus" in r.output and "--costs device" in r.output, r.output
        assert sorted(p.name for p in tmp_path.iterdir()) == ["softplus64.onnx", "temp"]
        assert list(temp.iterdir()) == []


def test_an_ort_error_with_no_message_is_still_one_line(monkeypatch):
    """The step ORT could not run was reported through str(err).splitlines()[0]: an error with an
    empty message (an exception type ORT's bindings raise bare) gave IndexError, a traceback."""
    import onnxruntime as ort

    from passes.measured_costs import measure
    from passes.onnx_import import import_model
    from planner.errors import UsageError, first_line

    class Bare(RuntimeError):
        pass

    def refuse(*args, **kwargs):
        raise Bare()

    monkeypatch.setattr(ort.InferenceSession, "run", refuse)
    graph = import_model("zoo:mlp", {})
    with pytest.raises(UsageError, match=r"could not run the training step \(Bare\)"):
        measure(graph, runs=1)
    assert first_line(ValueError("\n  \nsecond\nthird")) == "second"
