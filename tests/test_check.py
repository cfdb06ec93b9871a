"""`memplan check`: every exit code, the JUnit/JSON/Markdown reports, config discovery, bad input.

Models are small inline ONNX files whose peaks are known by hand. "Fits with a plan" is exercised
with a fake planner injected as ``cli.check_plan_fn`` (it reaches 70% of the unplanned peak at
+20% time); without it the default honestly reports that no planner is available.
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

import cli
from planner.errors import BudgetInfeasibleError, GraphError, ModelImportError, SolverTimeoutError, UsageError
from planner.gate import CheckItem, PlanOutcome, Verdict, exit_code, make_item, run_checks
from planner.gate_report import HEADER, to_json
from planner.units import share_of
from planner.graph import GraphBuilder
from planner.liveness import analyze
from tests.helpers import parse_model
from tests.test_cli_inspect import MLP  # x[batch,64] -> MatMul 128 -> Relu -> MatMul 16

ROOT = Path(__file__).resolve().parents[1]
KiB = 1024

# batch 32: constant base = x (8 KiB) + W1 (32 KiB) + W2 (8 KiB) = 48 KiB; Relu runs in place on h
# (16 KiB), which the last MatMul reads while writing y (2 KiB) -> unplanned peak 66 KiB.
MLP_PEAK = 66 * KiB

WIDE = """
<ir_version: 8, opset_import: ["" : 17]>
wide (float[32, 64] x) => (float[32, 64] y) <float[64, 256] W1, float[256, 64] W2>
{
    h = MatMul(x, W1)
    t = Tanh(h)
    y = MatMul(t, W2)
}
"""
# base = x 8 KiB + W1 64 KiB + W2 64 KiB = 136 KiB; Tanh in place on h (32 KiB), y 8 KiB -> peak 176 KiB.
WIDE_PEAK = 176 * KiB


def _save(text: str, shapes: dict[str, tuple[int, ...]], path: Path) -> Path:
    model = parse_model(text)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend(
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in sorted(shapes.items())
    )
    onnx.save_model(model, path)
    return path


@pytest.fixture
def mlp(tmp_path):
    return _save(MLP, {"W1": (64, 128), "W2": (128, 16)}, tmp_path / "mlp.onnx")


@pytest.fixture
def wide(tmp_path):
    return _save(WIDE, {"W1": (64, 256), "W2": (256, 64)}, tmp_path / "wide.onnx")


class FakePlanner:
    """Reaches 70% of the unplanned peak at +20% time; counts its calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, graph, budget_bytes, device, time_limit, **kw):
        self.calls.append((budget_bytes, device, time_limit, *kw.values()))
        best = int(analyze(graph).peak_bytes * 0.7)
        if budget_bytes < best:
            raise BudgetInfeasibleError("cannot reach the budget", least_bytes=best, best_bytes=best + 1000)
        return PlanOutcome(fits=True, peak_bytes=best, added_time_fraction=0.2, status="optimal")


def run(args, monkeypatch=None, planner=None):
    """In-process CLI run; returns (exit code, stdout, stderr)."""
    if planner is not None:
        monkeypatch.setattr(cli, "check_plan_fn", planner)
    result = CliRunner().invoke(cli.main, ["check", *map(str, args)])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def memplan(*args, cwd=ROOT):
    """Subprocess run (real exit status and stderr), from any folder."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "cli", "check", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memplan: error:"), err
    assert "Traceback" not in err
    return lines[0]


# ---- exit 0 and 1 -----------------------------------------------------------------------------
JSON_KEYS = {"schema", "status", "ok", "exit_code", "checked", "passed", "failed", "errors", "results"}
RESULT_KEYS = {"model", "name", "budget", "budget_bytes", "train", "dims", "device", "ort_arena",
               "unplanned_peak_bytes", "unplanned_arena_bytes", "fits_as_is", "fits_with_plan", "plan", "peak_bytes", "least_bytes",
               "headroom_bytes", "result", "error", "wall_s"}


def test_fits_as_is_exit_0_and_json_keys(mlp):
    rc, out, _ = run([mlp, "--budget", "100KiB", "--dim", "batch=32", "--json"])
    assert rc == 0
    info = json.loads(out)
    assert set(info) == JSON_KEYS and info["schema"] == "memplan.check/1"
    assert info["ok"] is True and info["exit_code"] == 0 and info["checked"] == info["passed"] == 1
    assert info["status"] == "ok"
    (r,) = info["results"]
    assert set(r) == RESULT_KEYS
    assert r["unplanned_peak_bytes"] == MLP_PEAK and r["budget_bytes"] == 100 * KiB
    assert r["fits_as_is"] is True and r["plan"] is None and r["fits_with_plan"] is None
    assert r["headroom_bytes"] == 34 * KiB and r["result"] == "pass" and r["dims"] == {"batch": 32}


def test_fits_with_plan_exit_0(mlp, monkeypatch):
    fake = FakePlanner()
    rc, out, err = run([mlp, "--budget", "64KiB", "--dim", "batch=32", "--device", "a100", "--time-limit", "5",
                        "--json"], monkeypatch, fake)
    assert rc == 0
    assert fake.calls == [(64 * KiB, "A100", 5.0)]
    (r,) = json.loads(out)["results"]
    assert r["fits_as_is"] is False and r["fits_with_plan"] is True
    assert r["plan"] == {"status": "optimal", "fits": True, "peak_bytes": int(MLP_PEAK * 0.7),
                         "arena_bytes": None, "added_time_fraction": 0.2, "note": None}
    # headroom counts against the planned peak, not the unplanned one
    assert r["headroom_bytes"] == 64 * KiB - int(MLP_PEAK * 0.7)
    assert "planning for 64.00 KiB" in err  # the progress line


def test_device_is_named_as_plan_names_it(mlp):
    # check --json said "h100" (its default) or the device as typed ("t4") where plan and train say
    # "H100" and "T4": a job comparing the reports' device fields saw two devices
    for given in (None, "t4", "H200", "cpu"):
        device = ["--device", given] if given else []
        rc, out, _ = run([mlp, "--budget", "100KiB", "--dim", "batch=32", "--json", *device])
        assert rc == 0
        result = CliRunner().invoke(cli.main, ["plan", str(mlp), "--forward", "--dim", "batch=32", "--budget", "100%",
                                               "--strategy", "none", "--json", *device])
        assert result.exit_code == 0, result.stderr
        named = json.loads(result.stdout)["device"]
        assert named == {None: "H100", "t4": "T4", "H200": "H200", "cpu": "cpu"}[given]
        assert json.loads(out)["results"][0]["device"] == named, given


def test_real_planner_infeasible_is_reported_exit_1(mlp):
    rc, out, _ = run([mlp, "--budget", "64KiB", "--dim", "batch=32", "--json", "--time-limit", "5"])
    assert rc == 1
    assert json.loads(out)["status"] == "over_budget"  # why it failed, in words, as plan's status
    (r,) = json.loads(out)["results"]
    assert r["plan"]["status"] == "infeasible" and r["fits_with_plan"] is False and r["result"] == "fail"


def test_real_planner_never_reports_a_least_above_the_unplanned_peak():
    # zoo:mlp's peak is a Relu step ORT runs in place; the lowering counts it apart, so the
    # solver's least exceeds the real unplanned peak: the gate reports the unplanned peak instead.
    rc, out, _ = run(["zoo:mlp", "--budget", "90%", "--train", "--json", "--time-limit", "5"])
    assert rc == 1
    (r,) = json.loads(out)["results"]
    assert r["plan"]["status"] == "infeasible"
    assert r["budget_bytes"] < r["least_bytes"] == r["peak_bytes"] <= r["unplanned_peak_bytes"]


def test_real_planner_fits_zoo_training_step_exit_0():
    rc, out, err = run(["zoo:gpt", "--budget", "80%", "--train", "--json", "--time-limit", "10"])
    assert rc == 0, err
    (r,) = json.loads(out)["results"]
    assert r["fits_as_is"] is False and r["fits_with_plan"] is True and r["least_bytes"] is None
    assert r["plan"]["peak_bytes"] <= r["budget_bytes"] < r["unplanned_peak_bytes"]
    assert r["plan"]["added_time_fraction"] > 0


def test_plan_infeasible_and_no_plan_exit_1(mlp, monkeypatch):
    fake = FakePlanner()
    rc, out, _ = run([mlp, "--budget", "60%", "--dim", "batch=32", "--json"], monkeypatch, fake)
    assert rc == 1
    (r,) = json.loads(out)["results"]
    assert r["budget_bytes"] == share_of(MLP_PEAK, 0.6)
    # the plan's peak is the lowest plan found; the least any plan reaches is named as a bound
    assert r["plan"]["status"] == "infeasible" and r["plan"]["peak_bytes"] == int(MLP_PEAK * 0.7) + 1000
    assert r["headroom_bytes"] == share_of(MLP_PEAK, 0.6) - int(MLP_PEAK * 0.7) < 0
    assert r["least_bytes"] == int(MLP_PEAK * 0.7)  # a lower bound, named as one

    rc, out, _ = run([mlp, "--budget", "64KiB", "--dim", "batch=32", "--no-plan", "--json"], monkeypatch, fake)
    assert rc == 1 and len(fake.calls) == 1  # --no-plan never asks the planner
    (r,) = json.loads(out)["results"]
    assert r["plan"] is None and r["headroom_bytes"] == 64 * KiB - MLP_PEAK


def test_one_testcase_per_model_and_budget_junit(mlp, wide, tmp_path, monkeypatch):
    junit = tmp_path / "out" / "check.xml"
    junit.parent.mkdir()
    rc, _, _ = run([mlp, wide, "--dim", "batch=32", "--budget", "100KiB", "--budget", "150KiB", "--junit", junit],
                   monkeypatch, FakePlanner())
    # mlp fits both; wide (176 KiB, plans down to 123 KiB) fails 100 KiB, fits 150 KiB with a plan
    assert rc == 1
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites" and root.get("tests") == "4" and root.get("failures") == "1"
    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == [
        f"{mlp} [batch=32] @ 100KiB", f"{mlp} [batch=32] @ 150KiB",
        f"{wide} [batch=32] @ 100KiB", f"{wide} [batch=32] @ 150KiB",
    ]
    failed = [c for c in cases if c.find("failure") is not None]
    assert failed == [cases[2]]
    failure = cases[2].find("failure")
    for number in (str(WIDE_PEAK), str(100 * KiB), str(int(WIDE_PEAK * 0.7)), str(100 * KiB - int(WIDE_PEAK * 0.7))):
        assert number in failure.text
    assert "100KiB" in failure.get("message") and str(int(WIDE_PEAK * 0.7)) in failure.get("message")
    # the planner's infeasible figure is the least any plan reaches, not a plan's peak
    assert "needs >= " in failure.text and "least any plan reaches" in failure.text
    assert "plan peak" not in failure.text and "best" not in failure.text


def test_markdown_table(mlp, wide, tmp_path, monkeypatch):
    md = tmp_path / "summary.md"
    rc, _, _ = run([mlp, wide, "--dim", "batch=32", "--budget", "150KiB", "--markdown", md],
                   monkeypatch, FakePlanner())
    assert rc == 0
    lines = md.read_text().splitlines()
    assert lines[0] == "### memplan check: 2 of 2 passed, 0 failed, 0 errors"
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == "| " + " | ".join(HEADER) + " |" and set(table[1]) <= set("|-")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    assert rows == [
        [f"`{mlp} [batch=32]`", "150KiB", "66.00 KiB", "yes", "not needed", "84.00 KiB", "✅ pass"],
        [f"`{wide} [batch=32]`", "150KiB", "176.00 KiB", "no", "yes, +20.0% time (optimal)", "26.80 KiB", "✅ pass"],
    ]
    rc, out, _ = run([mlp, "--dim", "batch=32", "--budget", "1KiB", "--markdown", "-"])
    assert rc == 1 and out.startswith("### memplan check: 0 of 1 passed") and "❌ fail" in out


def test_markdown_on_a_stdout_that_cannot_encode_its_marks_is_escaped_not_a_traceback(mlp):
    """--markdown - under a latin-1 or cp1252 stdout (PYTHONIOENCODING, a Windows runner): "✅ pass"
    raised UnicodeEncodeError, a traceback and exit 1 with nothing printed; a model path the
    encoding lacks did the same to the table. Now escaped as Python escapes stderr."""
    odd = mlp.with_name("mlp\u00e9\u0436.onnx")
    odd.write_bytes(mlp.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "latin-1"}
    for args, said in ((["--markdown", "-"], "| \\u2705 pass |"), ([], "mlp\xe9\\u0436.onnx [batch=32]")):
        proc = subprocess.run([sys.executable, "-m", "cli", "check", str(odd), "--dim", "batch=32", "--budget", "1GiB",
                               *args], cwd=ROOT, env=env, capture_output=True)
        assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
        assert said.encode("latin-1") in proc.stdout, proc.stdout


def test_markdown_code_spans_keep_backslashes_pipes_and_backticks():
    # a code span shows backslashes as they are: doubled, C:\nets\mlp.onnx read C:\\nets\\mlp.onnx
    from planner.gate_report import to_markdown

    fits = make_item("m.onnx", ["1MiB"], label="C:\\nets\\mlp.onnx")
    odd = make_item("m.onnx", ["1MiB"], label="a|b`c")
    bad = make_item("m.onnx", ["1MiB"], label="D:\\x.onnx")
    quoted = make_item("q.onnx", ["1MiB"], label="`e|f`")  # a backtick at an end needs a space inside the fence
    md = to_markdown([Verdict(fits, "1MiB", 1 << 20, 1000, None), Verdict(odd, "1MiB", 1 << 20, 1000, None),
                      Verdict(bad, "1MiB", None, None, None, error="D:\\x.onnx: no such file"),
                      Verdict(quoted, "1MiB", None, None, None, error="gone")])
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| `C:\\nets\\mlp.onnx` | 1MiB |")
    assert rows[2].startswith("| ``a\\|b`c`` | 1MiB |")  # GitHub reads \| in a table's code span as |
    assert "- `D:\\x.onnx`: D:\\\\x.onnx: no such file" in md.splitlines()  # outside a span, \\ shows \
    # outside a table a pipe in a span is not escaped (it would show as \|)
    assert "- `` `e|f` ``: gone" in md.splitlines()


def test_training_step_uses_the_autodiff_hook(mlp, monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "_training_available", lambda: True)
    monkeypatch.setattr(cli, "training_graph", lambda g: seen.append(g.name) or g)
    rc, out, _ = run([mlp, "--train", "--dim", "batch=32", "--budget", "1MiB", "--json"])
    assert rc == 0 and len(seen) == 1
    assert json.loads(out)["results"][0]["name"] == f"{mlp} [train, batch=32]"


# ---- exit 2: usage errors, before any model is loaded ----------------------------------------
@pytest.mark.parametrize("args, says", [
    (["--budget", "2XB"], "unknown unit 'XB'"),
    ([], "no budget"),
    (["--budget", "60%", "--no-plan"], "only means something with a plan"),
    (["--budget", "1GiB", "--json", "--markdown", "-"], "both want stdout"),
    (["--budget", "1GiB", "--dim", "batch"], "NAME=POSITIVE_INT"),
])
def test_usage_errors_exit_2(args, says, mlp):
    rc, out, err = run([mlp, *args])
    assert rc == 2 and out == ""
    assert says in one_error_line(err)


def test_usage_errors_are_found_before_loading(tmp_path):
    # the model does not exist, yet the bad unit wins: usage is checked first (2 before 3)
    rc, _, err = memplan(tmp_path / "missing.onnx", "--budget", "2XB", cwd=tmp_path)
    assert rc == 2 and "unknown unit" in one_error_line(err)


def test_train_without_autodiff_exit_2(mlp, monkeypatch):
    monkeypatch.setattr(cli, "_training_available", lambda: False)
    rc, _, err = run([mlp, "--train", "--budget", "1GiB"])
    assert rc == 2 and "needs autodiff" in one_error_line(err)


def test_report_paths_checked_before_running(mlp, tmp_path):
    rc, _, err = run([mlp, "--budget", "1GiB", "--junit", tmp_path / "no" / "such" / "x.xml"])
    assert rc == 2 and "does not exist" in one_error_line(err)
    before = mlp.read_bytes()
    rc, _, err = run([mlp, "--budget", "1GiB", "--dim", "batch=2", "--markdown", mlp])
    assert rc == 2 and "is an input" in one_error_line(err)
    assert mlp.read_bytes() == before


@pytest.mark.parametrize("option, path", [("--junit", "/dev/stdout"), ("--markdown", "/proc/self/fd/1"),
                                          ("--junit", "/proc/thread-self/fd/1")])
def test_a_report_to_a_descriptor_is_refused_not_renamed_over_the_log(mlp, tmp_path, option, path):
    # `--junit /dev/stdout >> ci.log` renamed the report over ci.log: its earlier lines gone, exit 0
    log = tmp_path / "ci.log"
    log.write_text("earlier step\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "a") as out:
        proc = subprocess.run([sys.executable, "-m", "cli", "check", mlp, "--dim", "batch=32", "--budget", "1MiB",
                               option, path], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.PIPE, text=True,
                              check=False)
    assert proc.returncode == 2 and "names an open file descriptor" in one_error_line(proc.stderr)
    assert log.read_text() == "earlier step\n"


def test_no_models_and_no_config_exit_2(tmp_path):
    (tmp_path / ".git").mkdir()  # the search for a config stops at the repository root
    rc, out, err = memplan(cwd=tmp_path)
    assert rc == 2 and out == ""
    assert "no MODEL given" in one_error_line(err)


def test_unreadable_config_exit_2(tmp_path):
    bad = tmp_path / "memplan.toml"
    bad.write_text('[[check]]\nmodel = "zoo:mlp"\nbudget = "1GiB\n')
    junit = tmp_path / "j.xml"
    rc, _, err = memplan("--config", bad, "--junit", junit, cwd=tmp_path)
    assert rc == 2 and "not valid TOML" in one_error_line(err) and not junit.exists()
    rc, _, err = memplan("--config", tmp_path / "absent.toml", cwd=tmp_path)
    assert rc == 2 and "config file not found" in one_error_line(err)


@pytest.mark.parametrize("body, says", [
    ('[[check]]\nmodel = "m.onnx"\nbudget = "1GiB"\nbatch = 3\n', "unknown key 'batch'"),
    ('[[check]]\nmodel = "m.onnx"\nbudget = "4 parsecs"\n', "budget '4 parsecs'"),
    ('[[check]]\nmodel = "m.onnx"\nbudget = "1GiB"\ntrain = "yes"\n', "train must be true or false"),
    ('deterministic = 1\n[[check]]\nmodel = "m.onnx"\nbudget = "1GiB"\n', "deterministic must be true or false"),
    ('[[check]]\nmodel = "m.onnx"\nbudget = "1GiB"\ndims = { batch = 0 }\n', "dims must be a table"),
    # as --dim's bound: 2**40 + 1 was planned at EiB, 10**20 overflowed onnx's int64 dim (a traceback)
    ('[[check]]\nmodel = "m.onnx"\nbudget = "1GiB"\ndims = { batch = 1099511627777 }\n', "each at most 1099511627776"),
    ('dims = { batch = 100000000000000000000 }\n[[check]]\nmodel = "m.onnx"\nbudget = "1GiB"\n', "each at most"),
    ('time_limit = inf\n[[check]]\nmodel = "m.onnx"\nbudget = "1GiB"\n', "time_limit must be a positive, finite"),
    ('[[check]]\nbudget = "1GiB"\n', "missing key 'model'"),
    ('[[check]]\nmodel = "m.onnx"\n', "no budget"),
    ('device = "h100"\n', "needs at least one [[check]]"),
])
def test_invalid_config_exit_2(body, says, tmp_path):
    (tmp_path / "memplan.toml").write_text(body)
    rc, _, err = run(["--config", tmp_path / "memplan.toml"])
    assert rc == 2 and says in one_error_line(err)


# ---- exit 3: bad models, the others still reported ------------------------------------------
def test_missing_model_path_exit_3(tmp_path):
    rc, out, err = memplan(tmp_path / "nope.onnx", "--budget", "1GiB", cwd=tmp_path)
    assert rc == 3
    assert "nope.onnx: no such file" in one_error_line(err)
    assert "ERROR" in out


def test_bad_model_among_good_ones_exit_3(mlp, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"definitely not a protobuf")
    junit = tmp_path / "j.xml"
    rc, out, err = memplan(mlp, junk, "--dim", "batch=32", "--budget", "1KiB", "--budget", "1MiB",
                           "--junit", junit, "--json", cwd=tmp_path)
    assert rc == 3  # a model that cannot be read outranks a budget miss (exit 1)
    errors = [line for line in err.splitlines() if not line.startswith("memplan: [")]  # minus progress lines
    assert "junk.onnx: not a valid ONNX" in one_error_line("\n".join(errors))
    info = json.loads(out)
    assert [r["result"] for r in info["results"]] == ["fail", "pass", "error", "error"]
    assert info["exit_code"] == 3 and info["errors"] == 2 and info["status"] == "model_error"
    cases = ET.parse(junit).getroot().findall("./testsuite/testcase")
    assert [c.find("error") is not None for c in cases] == [False, False, True, True]
    assert "not a valid ONNX" in cases[2].find("error").get("message")


def test_a_json_graph_is_refused_in_one_line_before_any_work(mlp, tmp_path):
    # read as ONNX it was "not a valid ONNX protobuf", exit 3, with a report written
    graph = tmp_path / "net_nx.json"
    graph.write_text('{"directed": true, "multigraph": false, "graph": {}, "nodes": [], "links": []}')
    junit = tmp_path / "j.xml"
    rc, out, err = run([mlp, graph, "--dim", "batch=32", "--budget", "1MiB", "--junit", junit])
    assert rc == 2 and out == "" and not junit.exists()
    line = one_error_line(err)
    assert "net_nx.json is a Checkmate/Moccasin JSON graph" in line and "memplan plan" in line
    (tmp_path / "memplan.toml").write_text('[[check]]\nmodel = "net_nx.json"\nbudget = "1MiB"\n')
    rc, _, err = run(["--config", tmp_path / "memplan.toml"])
    assert rc == 2 and one_error_line(err).startswith("memplan: error: net_nx.json is a Checkmate")


# ---- config discovery ------------------------------------------------------------------------
PYPROJECT = """
[project]
name = "user-project"

[tool.memplan]
time_limit = 7
budget = "1MiB"
dims = { batch = 32 }

[[tool.memplan.check]]
model = "nets/mlp.onnx"

[[tool.memplan.check]]
model = "nets/wide.onnx"
name = "wide net"
budget = ["150KiB", "90%"]
device = "t4"
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "nets").mkdir()
    _save(MLP, {"W1": (64, 128), "W2": (128, 16)}, tmp_path / "nets" / "mlp.onnx")
    _save(WIDE, {"W1": (64, 256), "W2": (256, 64)}, tmp_path / "nets" / "wide.onnx")
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    sub = tmp_path / "src" / "deep"
    sub.mkdir(parents=True)
    return tmp_path, sub


def test_config_found_upward_from_a_subfolder(project, monkeypatch):
    root, sub = project
    monkeypatch.chdir(sub)
    fake = FakePlanner()
    rc, out, _ = run(["--json"], monkeypatch, fake)
    assert rc == 0
    results = json.loads(out)["results"]
    assert [(r["name"], r["budget"]) for r in results] == [
        ("nets/mlp.onnx [batch=32]", "1MiB"), ("wide net [batch=32]", "150KiB"), ("wide net [batch=32]", "90%"),
    ]
    assert [r["device"] for r in results] == ["H100", "T4", "T4"]  # as plan and train name them
    assert results[0]["unplanned_peak_bytes"] == MLP_PEAK and results[1]["unplanned_peak_bytes"] == WIDE_PEAK
    assert fake.calls == [(150 * KiB, "T4", 7), (share_of(WIDE_PEAK, 0.9), "T4", 7)]


class ClockedPlanner(FakePlanner):
    """FakePlanner that also records whether the gate asked for the work clock."""

    def __call__(self, graph, budget_bytes, device, time_limit, deterministic=False):
        self.calls.append(deterministic)
        return super().__call__(graph, budget_bytes, device, time_limit)


@pytest.mark.parametrize("where, flags, expected", [
    ("", [], [False, False]),
    ("", ["--deterministic"], [True, True]),
    ("top", [], [True, True]),  # a default for every entry
    ("wide", [], [True, True]),  # wide net's two plans only: the mlp fits as it is
])
def test_deterministic_from_the_config_or_the_command_line(project, monkeypatch, where, flags, expected):
    root, _ = project
    text = (root / "pyproject.toml").read_text()
    if where == "top":
        text = text.replace("time_limit = 7\n", "time_limit = 7\ndeterministic = true\n")
    elif where == "wide":
        text = text.replace('device = "t4"\n', 'device = "t4"\ndeterministic = true\n')
    (root / "pyproject.toml").write_text(text)
    monkeypatch.chdir(root)
    fake = ClockedPlanner()
    rc, _, err = run(["--json", *flags], monkeypatch, fake)
    assert rc == 0 and [c for c in fake.calls if isinstance(c, bool)] == expected
    assert ("(limit 7 deterministic s)" in err) is expected[0]  # the progress line says which seconds


def test_command_line_overrides_the_config(project, monkeypatch):
    root, _ = project
    monkeypatch.chdir(root)
    rc, out, _ = run(["--budget", "100KiB", "--no-plan", "--json"])
    assert rc == 1
    results = json.loads(out)["results"]
    assert [(r["budget"], r["result"]) for r in results] == [("100KiB", "pass"), ("100KiB", "fail")]


@pytest.mark.parametrize("inner", [
    '[project]\nname = "inner"\n[tool.black]\nline-length = 80\n',
    # a comment naming the table used to stop the search there: "no [tool.memplan] table", exit 2,
    # though the repository's memplan.toml sat one folder up
    '[project]\nname = "inner"\n# memplan reads tool.memplan from ../memplan.toml\n',
])
def test_memplan_toml_wins_and_unrelated_pyproject_is_passed_over(project, monkeypatch, inner):
    root, sub = project
    (root / "memplan.toml").write_text('budget = "1KiB"\n[[check]]\nmodel = "nets/mlp.onnx"\ndims = { batch = 32 }\n')
    (sub / "pyproject.toml").write_text(inner)
    monkeypatch.chdir(sub)
    rc, out, err = run(["--json"])
    assert rc == 1, err
    (r,) = json.loads(out)["results"]
    assert r["model"] == "nets/mlp.onnx" and r["budget"] == "1KiB"


def test_models_and_config_are_alternatives(project, mlp):
    root, _ = project
    rc, _, err = run([mlp, "--budget", "1GiB", "--config", root / "pyproject.toml"])
    assert rc == 2 and "not both" in one_error_line(err)


def test_pyproject_without_table_given_explicitly(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    rc, _, err = run(["--config", tmp_path / "pyproject.toml"])
    assert rc == 2 and "no [tool.memplan] table" in one_error_line(err)


# ---- the gate itself (pure) ------------------------------------------------------------------
def _tiny_graph():
    b = GraphBuilder("tiny")
    x = b.input("x", "float32", (256,))
    (y,) = b.node("Relu", [x], [("y", "float32", (256,))])
    b.output(y)
    return b.build()


def test_each_model_loads_once_for_all_its_budgets():
    loads = []
    item = make_item("m", ["1KiB", "2KiB", "50%"])
    verdicts = run_checks([item], lambda it: loads.append(it.model) or _tiny_graph())
    assert loads == ["m"] and [v.budget_bytes for v in verdicts] == [1024, 2048, 1024]
    assert [v.outcome for v in verdicts] == ["fail", "pass", "fail"]  # peak = 1 KiB x + 1 KiB y


def test_exit_code_precedence_and_json_counts():
    item = make_item("m", ["1KiB"])
    ok = Verdict(item, "1KiB", 1024, 1000, None)
    over = Verdict(item, "1KiB", 1024, 2000, None)
    bad = Verdict(item, "1KiB", None, None, None, error="m: no such file")
    assert exit_code([ok]) == 0 and exit_code([ok, over]) == 1 and exit_code([over, bad]) == 3
    assert over.headroom == -976 and ok.headroom == 24 and bad.headroom is None
    assert {k: to_json([ok, over, bad])[k] for k in ("checked", "passed", "failed", "errors")} == {
        "checked": 3, "passed": 1, "failed": 1, "errors": 1}


def test_planner_answers_and_bugs():
    item = make_item("m", ["1KiB"])

    def timeout(*_):
        raise SolverTimeoutError("no plan in 1 s")

    (v,) = run_checks([item], lambda _: _tiny_graph(), timeout)
    assert v.plan == PlanOutcome(False, 0, None, "timeout", note="no plan in 1 s") and v.outcome == "fail"
    # what the planner said reaches every report: a "timeout" may have ended long before its limit
    # (zoo:mlp --train at 99%: every order searched in 1 s of 5), and the row alone said "timeout"
    from planner.gate_report import to_junit, to_markdown, to_table

    assert "m @ 1KiB: no plan in 1 s" in to_table([v]) and "no plan in 1 s" in to_markdown([v])
    assert to_json([v])["results"][0]["plan"]["note"] == "no plan in 1 s"
    assert "planner: no plan in 1 s" in to_junit([v])
    # a plan object has the same keys whatever the planner said: "note" was there only on a
    # timeout, so a CI script reading results[i]["plan"]["note"] raised KeyError on other rows
    def infeasible(*_):
        raise BudgetInfeasibleError("cannot reach the budget", least_bytes=2048)

    (fit,) = run_checks([item], lambda _: _tiny_graph(), lambda *_: PlanOutcome(True, 1024, 0.1, "optimal"))
    (none,) = run_checks([item], lambda _: _tiny_graph(), infeasible)
    plans = [r["plan"] for r in to_json([v, fit, none])["results"]]
    assert set(plans[0]) == set(plans[1]) == set(plans[2]) and plans[1]["note"] is None is plans[2]["note"]
    (v,) = run_checks([item], lambda _: _tiny_graph(), lambda *_: PlanOutcome(True, 4096, 0.1, "optimal"))
    assert v.outcome == "error" and "planner bug" in v.error and v.plan is None


@pytest.mark.parametrize("where, failure, says", [
    (where, GraphError("tensor 'h' has two producers"), "mlp.onnx: tensor 'h' has two producers")
    for where in ("plan", "load")] + [
    (where, MemoryError(), "mlp.onnx: out of host memory") for where in ("plan", "load")] + [
    ("load", ModelImportError("mlp.onnx: node 'x' is Foo"), "mlp.onnx: node 'x' is Foo"),
])
def test_an_internal_failure_is_an_error_not_over_budget(mlp, wide, monkeypatch, tmp_path, failure, says, where):
    """A GraphError or MemoryError while planning (or loading) a model exited 1, which CI reads as
    "over budget", and --json printed nothing: it is that model's error (exit 3), the JSON object
    still printed and the other model still judged. --junit's error type is the error's kind: it
    said ModelImportError for each."""
    def planner(graph, *args, **kw):
        if where == "plan" and any(n.op_type == "Relu" for n in graph.nodes):  # the MLP (wide's is a Tanh)
            raise failure
        return FakePlanner()(graph, *args, **kw)

    load = cli._load_for_check

    def failing_load(item, *args):
        if where == "load" and item.model == str(mlp):
            raise failure
        return load(item, *args)

    monkeypatch.setattr(cli, "_load_for_check", failing_load)
    junit = tmp_path / "j.xml"
    rc, out, err = run([mlp, wide, "--budget", "1KiB", "--dim", "batch=32", "--json", "--junit", junit],
                       monkeypatch, planner)
    assert rc == 3 and "Traceback" not in err
    info = json.loads(out)
    assert info["status"] == "model_error" and info["exit_code"] == 3 and info["errors"] == 1
    bad, other = info["results"]
    assert bad["result"] == "error" and says in bad["error"] and other["result"] in ("pass", "fail")
    assert any(line.startswith("memplan: error: ") and says in line for line in err.splitlines())
    (error,) = ET.parse(junit).getroot().iter("error")
    assert error.get("type") == type(failure).__name__ and says in error.get("message")


def test_a_timed_out_plan_counts_the_lowest_plan_found_for_headroom(monkeypatch):
    """check zoo:cnn --train --budget 489748B timed out with a note saying the lowest plan found
    peaks at 536020 bytes, and took the headroom from the unplanned peak (-280.31 KiB, not
    -45.19 KiB). The timeout now carries that plan's peak, and headroom counts it."""
    from types import SimpleNamespace

    import passes.plan_model

    item = make_item("m", ["1KiB"])

    def timeout(*_):
        raise SolverTimeoutError("no plan in 1 s; the lowest plan found peaks at 1500 bytes", best_bytes=1500)

    (v,) = run_checks([item], lambda _: _tiny_graph(), timeout)
    assert v.plan.peak_bytes == 1500 and v.headroom == 1024 - 1500 and v.outcome == "fail"
    # the command's planner door passes the solve's lowest plan on
    result = SimpleNamespace(status="timeout", note="no plan; the lowest plan found peaks at 1500 bytes",
                             best_bytes=1500, least_bytes=None)
    monkeypatch.setattr(passes.plan_model, "plan_graph",
                        lambda *a, **k: SimpleNamespace(ok=False, result=result, unplanned_peak=2048, arena_least=None))
    with pytest.raises(SolverTimeoutError) as err:
        cli.check_plan_fn(_tiny_graph(), 1024, "h100", 1.0)
    assert err.value.best_bytes == 1500


def test_the_gates_boundaries_and_a_planless_answer():
    # _tiny_graph's unplanned peak is 2 KiB (1 KiB x + 1 KiB y)
    asked = []

    def exact(graph, budget_bytes, device, time_limit, **kw):
        asked.append(budget_bytes)
        return PlanOutcome(True, budget_bytes, 0.1, "optimal")

    # a budget of exactly the unplanned peak fits as is: the planner is not asked
    (v,) = run_checks([make_item("m", ["2KiB"])], lambda _: _tiny_graph(), exact)
    assert v.plan is None and v.outcome == "pass" and v.headroom == 0 and asked == []
    # a plan that peaks at exactly the budget fits (it is no planner bug)
    (v,) = run_checks([make_item("m", ["1KiB"])], lambda _: _tiny_graph(), exact)
    assert asked == [1024] and v.fits_with_plan and v.outcome == "pass" and v.headroom == 0
    # an answer without any plan (peak 0) leaves the unplanned peak as the one that counts
    (v,) = run_checks([make_item("m", ["1KiB"])], lambda _: _tiny_graph(), lambda *_: PlanOutcome(False, 0, 0.0, "timeout"))
    assert v.peak == 2048 and v.headroom == -1024 and v.outcome == "fail"


def test_after_load_hears_which_models_failed():
    def load(item):
        if item.model == "bad":
            raise ModelImportError("bad: not an ONNX model")
        return _tiny_graph()

    hooks = []
    run_checks([make_item("bad", ["1KiB"]), make_item("good", ["1GiB"])], load, after_load=hooks.append)
    run_checks([make_item("good", ["1GiB"])], load, after_load=hooks.append)
    assert hooks == [[make_item("bad", ["1KiB"])], []]  # once per run, before any plan, told who failed


def test_load_failure_becomes_error_verdicts():
    def broken(item: CheckItem):
        raise ModelImportError(f"{item.model}: not an ONNX model")

    verdicts = run_checks([make_item("a.onnx", ["1KiB", "1MiB"]), make_item("b", ["1GiB"])],
                          lambda it: broken(it) if it.model == "a.onnx" else _tiny_graph())
    assert [v.outcome for v in verdicts] == ["error", "error", "pass"]
    assert verdicts[0].error == "a.onnx: not an ONNX model"


# ---- --ort-arena: ORT's arena need is what counts ----------------------------------------------------
def test_ort_arena_judges_the_arena_need_and_ort_agrees(mlp):
    """At a budget of exactly the liveness peak the MLP fits as is; ORT's BFC arena (kNextPowerOfTwo,
    regions doubling from 1 MiB, clamped to the limit) needs more, so with --ort-arena the same budget
    fails. ORT itself, with its CPU arena capped, is the oracle for both figures."""
    from passes.onnx_import import import_model
    from passes.plan_model import OrtArena
    from passes.verify import runs_under_arena
    from planner.arena import NEXT_POWER_OF_TWO

    base = [mlp, "--budget", f"{MLP_PEAK}B", "--dim", "batch=32", "--device", "cpu", "--no-plan", "--json"]
    rc, out, _ = run(base)
    assert rc == 0 and json.loads(out)["results"][0]["fits_as_is"] is True
    rc, out, _ = run([*base, "--ort-arena", "next-power-of-two"])
    assert rc == 1
    (r,) = json.loads(out)["results"]
    assert r["ort_arena"] == "next-power-of-two" and r["unplanned_peak_bytes"] == MLP_PEAK
    need = r["unplanned_arena_bytes"]
    graph = import_model(str(mlp), {"batch": 32})
    assert need == OrtArena(NEXT_POWER_OF_TWO, device_inputs=False).need(graph) > MLP_PEAK
    assert r["fits_as_is"] is False and r["peak_bytes"] == need and r["headroom_bytes"] == MLP_PEAK - need
    feeds = {"x": np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)}
    fixed = onnx.load(mlp)
    fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 32
    ok, error = runs_under_arena(fixed, feeds, MLP_PEAK, NEXT_POWER_OF_TWO)
    assert not ok and "BFCArena" in error
    assert runs_under_arena(fixed, feeds, need, NEXT_POWER_OF_TWO) == (True, "")


def test_ort_arena_plans_when_the_arena_is_over_and_counts_the_plans_arena(mlp, monkeypatch):
    """A budget the liveness peak meets but the arena does not asks the planner, with the strategy;
    the plan's arena need is the figure that counts, and the table says so."""
    fake = FakePlanner()

    def planner(graph, budget_bytes, device, time_limit, **kw):
        out = fake(graph, budget_bytes, device, time_limit, **kw)
        return PlanOutcome(out.fits, out.peak_bytes, out.added_time_fraction, out.status,
                           arena_bytes=int(out.peak_bytes * 1.25))

    monkeypatch.setattr(cli, "check_arena_fn", lambda graph, item: int(analyze(graph).peak_bytes * 1.5))
    rc, out, _ = run([mlp, "--budget", "70KiB", "--dim", "batch=32", "--ort-arena", "next-power-of-two", "--json"],
                     monkeypatch, planner)
    assert rc == 0
    assert fake.calls == [(70 * KiB, "H100", 30.0, "next-power-of-two")]
    (r,) = json.loads(out)["results"]
    assert r["unplanned_arena_bytes"] == int(MLP_PEAK * 1.5) and r["fits_as_is"] is False
    arena = int(int(MLP_PEAK * 0.7) * 1.25)
    assert r["plan"]["arena_bytes"] == arena and r["peak_bytes"] == arena
    assert r["headroom_bytes"] == 70 * KiB - arena
    rc, out, _ = run([mlp, "--budget", "70KiB", "--dim", "batch=32", "--ort-arena", "next-power-of-two"],
                     monkeypatch, planner)
    assert "66.00 KiB (arena 99.00 KiB)" in out


def test_a_plan_reported_to_fit_over_its_arena_is_a_planner_bug():
    item = make_item("m", ["100B"], ort_arena="same-as-requested")
    g = _tiny_graph()

    def liar(graph, budget, device, time_limit, **kw):
        return PlanOutcome(True, 90, 0.1, "optimal", arena_bytes=120)

    (v,) = run_checks([item], lambda _: g, liar, arena=lambda graph, item: 400)
    assert v.outcome == "error" and "120 bytes of arena, over the budget of 100" in v.error
    with pytest.raises(UsageError, match="arena replay"):
        run_checks([item], lambda _: g, liar)


@pytest.mark.parametrize("value", ["same_as_requested", 1, True])
def test_ort_arena_in_the_config_is_checked(value, tmp_path, mlp):
    cfg = tmp_path / "memplan.toml"
    cfg.write_text(f'ort_arena = {json.dumps(value)}\n[[check]]\nmodel = "{mlp.name}"\nbudget = "1MiB"\n')
    rc, _, err = run(["--config", cfg])
    assert rc == 2
    assert "ort_arena must be \"same-as-requested\" or \"next-power-of-two\"" in one_error_line(err)


def test_ort_arena_from_the_config_and_the_command_line(tmp_path, mlp):
    from planner.gate_config import Overrides, load_config

    cfg = tmp_path / "memplan.toml"
    cfg.write_text(f'ort_arena = "next-power-of-two"\n[[check]]\nmodel = "{mlp.name}"\nbudget = "1MiB"\n'
                   f'[[check]]\nmodel = "{mlp.name}"\nbudget = "1MiB"\nort_arena = "same-as-requested"\n')
    assert [i.ort_arena for i in load_config(cfg)] == ["next-power-of-two", "same-as-requested"]
    forced = load_config(cfg, Overrides(ort_arena="same-as-requested"))
    assert [i.ort_arena for i in forced] == ["same-as-requested"] * 2


def test_a_model_error_about_its_graph_names_the_file(wide, tmp_path):
    """--train of a model without a scalar output: the error named only its graph ("'wide' has no
    scalar float output"), which torch exports all name alike, so with several models CI's log
    did not say which file to fix. It is a usage error (exit 2: --add-loss, add_loss in the config,
    or no --train fixes it; it was exit 3, a bad model), named after the first such model."""
    other = tmp_path / "other.onnx"
    other.write_bytes(wide.read_bytes())
    junit = tmp_path / "j.xml"
    rc, out, err = run([wide, other, "--train", "--budget", "1GiB", "--json", "--junit", junit])
    assert rc == 2 and out == "" and not junit.exists()
    line = one_error_line(err)
    assert line.startswith(f"memplan: error: {wide}: 'wide' has no scalar float output")
    assert "--add-loss" in line and "without --train" in line


def test_a_usage_error_only_a_model_reveals_stops_the_gate_before_any_plan(mlp, tmp_path, monkeypatch):
    # entry 1 needs a plan; entry 2 asks for a loss on an output its model lacks. The usage error
    # must come before entry 1 is planned (not after minutes of solving), name the model the
    # message is about (torch exports all call their graph 'main_graph'), and write no report.
    other = tmp_path / "other.onnx"
    other.write_bytes(mlp.read_bytes())
    config = tmp_path / "memplan.toml"
    config.write_text('dims = { batch = 32 }\n'
                      '[[check]]\nmodel = "mlp.onnx"\nbudget = "50KiB"\n'
                      '[[check]]\nmodel = "other.onnx"\nbudget = "1GiB"\nadd_loss = "mse:nope"\n')
    junit = tmp_path / "j.xml"
    fake = FakePlanner()
    rc, out, err = run(["--config", config, "--junit", junit], monkeypatch, fake)
    assert rc == 2 and out == ""
    line = one_error_line(err)
    assert "other.onnx" in line and "'nope' is not an output" in line
    assert fake.calls == [] and not junit.exists()


def test_junit_stays_valid_xml_when_a_name_holds_a_control_character(mlp, tmp_path):
    # a config name (or an error quoting a tensor name) with ESC in it: XML 1.0 cannot carry it,
    # even as &#27;, so the JUnit file would be rejected by every CI test-report reader
    config = tmp_path / "memplan.toml"
    config.write_text('[[check]]\nmodel = "mlp.onnx"\nname = "mlp\\u001b[31m"\nbudget = ["1KiB", "1GiB"]\n'
                      'dims = { batch = 32 }\nplan = false\n')
    junit = tmp_path / "j.xml"
    rc, _, _ = run(["--config", config, "--junit", junit])
    assert rc == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    names = [case.get("name") for case in suite.iter("testcase")]
    assert names == ["mlp\\x1b[31m [batch=32] @ 1KiB", "mlp\\x1b[31m [batch=32] @ 1GiB"]
    assert "mlp\\x1b[31m" in suite.find("testcase/failure").text


def test_a_dim_typo_fails_the_gate_unless_the_dim_is_for_several_models(tmp_path, mlp, wide):
    """`check M --dim batc=8` checked M at its own size with a warning only, and the report named
    it [batc=8]: a typo passed the gate. A dim given for one model that matches nothing in it is a
    usage error now; one given for several (the config's top level, --dim with several models)
    may not fit each, and is still a warning."""
    rc, _, err = run([mlp, "--budget", "1MiB", "--no-plan", "--dim", "batch=32", "--dim", "bacth=4"])
    assert rc == 2 and "--dim bacth matched no symbolic input dim" in one_error_line(err)
    assert "its symbolic input dims: batch" in err
    rc, out, _ = run([mlp, wide, "--budget", "1MiB", "--no-plan", "--dim", "batch=32"])  # wide's dims are fixed
    assert rc == 0 and "2 of 2 passed" in out
    cfg = tmp_path / "memplan.toml"
    cfg.write_text('dims = { batch = 32 }\n[[check]]\nmodel = "mlp.onnx"\nbudget = "1MiB"\nplan = false\n'
                   '[[check]]\nmodel = "wide.onnx"\nbudget = "1MiB"\nplan = false\n')
    assert run(["--config", cfg])[0] == 0
    cfg.write_text('[[check]]\nmodel = "mlp.onnx"\nbudget = "1MiB"\nplan = false\ndims = { batch = 32, bacth = 4 }\n')
    rc, _, err = run(["--config", cfg])
    assert rc == 2 and "bacth matched no symbolic input dim" in one_error_line(err)


def test_a_shared_dim_that_matches_no_model_fails_the_gate(tmp_path, mlp, wide):
    """A dim given for several models at once may miss some of them (a warning), but one that
    matches none of them (`check a.onnx b.onnx --dim bacth=4`, or a config's top-level dims) was a
    warning too, and every model was checked at its default size: a typo passed the gate."""
    rc, _, err = run([mlp, wide, "--budget", "1MiB", "--no-plan", "--dim", "batch=32", "--dim", "bacth=4"])
    last = err.strip().splitlines()[-1]  # after each model's own warning (on the command line)
    assert rc == 2 and last == ("memplan: error: dim bacth matched no model's symbolic input dims or zoo options "
                                "(their dims and options: batch); fix the name, or drop it")
    assert "Traceback" not in err
    rc, out, _ = run(["zoo:mlp", wide, "--budget", "1MiB", "--no-plan", "--dim", "batch=4"])  # a zoo option
    assert rc == 0 and "2 of 2 passed" in out
    cfg = tmp_path / "memplan.toml"
    cfg.write_text('dims = { batch = 32, seq = 8 }\n[[check]]\nmodel = "mlp.onnx"\nbudget = "1MiB"\nplan = false\n'
                   '[[check]]\nmodel = "wide.onnx"\nbudget = "1MiB"\nplan = false\n')
    rc, _, err = run(["--config", cfg])
    assert rc == 2 and "error: dim seq matched no model's" in err.strip().splitlines()[-1]


def test_no_plan_that_fits_reports_no_added_time(mlp, monkeypatch):
    # infeasible and timed-out budgets have no plan whose cost could be stated: JSON said
    # "added_time_fraction": 0.0 (free) and JUnit "added time 0.0%" for the lowest plan found
    def timeout(graph, budget_bytes, device, time_limit, **kw):
        raise SolverTimeoutError("no plan in 5 s", best_bytes=MLP_PEAK - 64)

    for planner, status in ((FakePlanner(), "infeasible"), (timeout, "timeout")):
        rc, out, _ = run([mlp, "--budget", "10KiB", "--dim", "batch=32", "--json"], monkeypatch, planner)
        (r,) = json.loads(out)["results"]
        assert rc == 1 and r["plan"]["status"] == status and r["plan"]["peak_bytes"] > 0
        assert r["plan"]["added_time_fraction"] is None
        (v,) = run_checks([make_item(mlp, ["10KiB"], dims={"batch": 32})],
                          lambda item: cli._load_for_check(item), planner)
        assert v.plan.added_time_fraction is None  # the gate's own answer, not only what the reports print
        from planner.gate_report import to_junit, to_markdown, to_table

        for text in (to_junit([v]), to_markdown([v]), to_table([v])):
            assert "added time" not in text and "% time" not in text, text


def test_reports_state_no_added_time_for_a_plan_over_the_budget(mlp, monkeypatch):
    # a planner may price a plan it found over the budget: the reports still state no cost for it
    # (JSON null, no "added time" in JUnit), as for an infeasible or timed-out budget
    from planner.gate_report import to_junit

    def over(graph, budget_bytes, device, time_limit, **kw):
        return PlanOutcome(fits=False, peak_bytes=budget_bytes + 64, added_time_fraction=0.25, status="feasible")

    rc, out, _ = run([mlp, "--budget", "10KiB", "--dim", "batch=32", "--json"], monkeypatch, over)
    (r,) = json.loads(out)["results"]
    assert rc == 1 and r["plan"]["status"] == "feasible" and r["plan"]["added_time_fraction"] is None
    (v,) = run_checks([make_item(mlp, ["10KiB"], dims={"batch": 32})], lambda item: cli._load_for_check(item), over)
    junit = to_junit([v])
    assert "plan peak: " in junit and "added time" not in junit, junit


def test_repeated_budget_is_a_usage_error(mlp, tmp_path):
    # two verdicts of one model and budget got one JUnit testcase name: refused before any work
    junit = tmp_path / "r.xml"
    rc, out, err = run([mlp, "--budget", "1MiB", "--budget", "1024KiB", "--junit", junit])
    assert rc == 2 and out == "" and not junit.exists()
    assert "budget '1024KiB' is given twice" in one_error_line(err)


@pytest.mark.parametrize("top, args, says", [
    ('device = "h300"\n', [], "c.toml: top level: device 'h300' is not a known profile"),
    ('budget = "4 parsecs"\n', [], "c.toml: top level: budget '4 parsecs' has unknown unit"),
    ('budget = ["1MiB", "1024KiB"]\n', [], "c.toml: top level: budget '1024KiB' is given twice"),
    ("", ["--device", "h300"], "error: --device 'h300' is not a known profile"),
    ("", ["--budget", "4 parsecs"], "error: budget '4 parsecs' has unknown unit"),
    ("", ["--budget", "60%", "--no-plan"], "error: budget '60%' is a share"),
])
def test_a_value_for_every_entry_is_named_where_it_was_given(tmp_path, top, args, says):
    # `check --config c.toml --device h300` said "c.toml: [[check]] #1: --device 'h300' is not a known
    # profile", and a top-level device = "h300" or budget = "4 parsecs" was blamed on entry #1 too,
    # which holds no such key: the line names the command line or the top level now
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'{top}[[check]]\nmodel = "zoo:mlp"\n' + ('' if "budget" in top else 'budget = "1MiB"\n'))
    junit = tmp_path / "r.xml"
    rc, out, err = run(["--config", cfg, "--junit", junit, *args])
    line = one_error_line(err)
    assert rc == 2 and out == "" and not junit.exists() and says in line and "#1" not in line, line
    cfg.write_text('[[check]]\nmodel = "zoo:mlp"\nbudget = "1MiB"\ndevice = "h300"\n')  # an entry's own: named so
    rc, _, err = run(["--config", cfg])
    assert rc == 2 and "c.toml: [[check]] #1: device 'h300' is not a known profile" in one_error_line(err)


@pytest.mark.parametrize("top, entry, args, says", [
    ('device = "h300"\n', "", ["--device", "h100"], "c.toml: top level: device 'h300' is not a known profile"),
    ("", 'device = "h300"\n', ["--device", "h100"], "c.toml: [[check]] #1: device 'h300' is not a known profile"),
    ('budget = "4 parsecs"\n', "", ["--budget", "1MiB"], "c.toml: top level: budget '4 parsecs' has unknown unit"),
    ("", 'budget = "4 parsecs"\n', ["--budget", "1MiB"], "c.toml: [[check]] #1: budget '4 parsecs' has unknown"),
    ('budget = ["1MiB", "1024KiB"]\n', "", ["--budget", "2MiB"], "c.toml: top level: budget '1024KiB' is given twice"),
    ("", 'loss = ""\n', ["--loss", "loss"], "c.toml: [[check]] #1: loss must be the name of the scalar output"),
])
def test_a_config_value_the_command_line_overrides_is_still_checked(tmp_path, top, entry, args, says):
    # `check --config c.toml --device h100` passed (exit 0) with a top-level or entry device = "h300":
    # the overridden value was never read, a typo waiting for the CI job that runs without the option
    cfg = tmp_path / "c.toml"
    budget = "" if "budget" in top + entry else 'budget = "1MiB"\n'
    cfg.write_text(f'{top}[[check]]\nmodel = "zoo:mlp"\n{budget}{entry}')
    junit = tmp_path / "r.xml"
    rc, out, err = run(["--config", cfg, "--junit", junit, "--no-plan", *args])
    line = one_error_line(err)
    assert rc == 2 and out == "" and not junit.exists() and says in line, line
    # a good value the command line overrides is no error: the command line wins
    cfg.write_text('device = "t4"\nbudget = "1KiB"\n[[check]]\nmodel = "zoo:mlp"\ndevice = "a100"\n')
    rc, out, err = run(["--config", cfg, "--no-plan", "--device", "h100", "--budget", "1MiB"])
    assert rc == 0 and "1 of 1 passed" in out, err


def test_junit_names_entries_apart_that_differ_only_in_options(mlp, tmp_path):
    # config entries differing only in device, ort_arena or plan were all "mlp.onnx [batch=32] @ 1MiB"
    entry = f'[[check]]\nmodel = "{mlp.name}"\nbudget = "1MiB"\ndims = {{ batch = 32 }}\n'
    cfg = tmp_path / "memplan.toml"
    cfg.write_text(entry + entry + 'device = "t4"\n' + entry + 'ort_arena = "next-power-of-two"\n'
                   + entry + "plan = false\n" + entry + entry.replace("1MiB", "2MiB") + entry + "time_limit = 5\n")
    junit, md = tmp_path / "r.xml", tmp_path / "r.md"
    rc, out, err = run(["--config", cfg, "--junit", junit, "--markdown", md])
    assert rc == 0, err
    names = [case.get("name") for case in ET.parse(junit).iter("testcase")]
    assert len(set(names)) == len(names) == 7, names
    assert "mlp.onnx [batch=32] @ 2MiB" in names  # a name no other row shares is kept as it was
    assert any("device=T4" in n for n in names) and any("ort-arena=next-power-of-two" in n for n in names)
    assert any("no-plan" in n for n in names) and sum("#" in n for n in names) == 2  # entries 1 and 5 alike
    assert any("time-limit=5s" in n for n in names)
    # only what differs is named: all share the clock, so it is not said
    assert not any("wall-clock" in n or "deterministic" in n for n in names), names
    assert len(set(out.splitlines()[1:8])) == 7, out  # the table's rows too
    assert all(f"`{n.rsplit(' @ ', 1)[0]}`" in md.read_text() for n in names)
    # the JSON names its results as JUnit does: entries 1 and 5 were both "mlp.onnx [batch=32]" @ 1MiB
    rc, out, err = run(["--config", cfg, "--json"])
    assert rc == 0 and [f"{r['name']} @ {r['budget']}" for r in json.loads(out)["results"]] == names, err


@pytest.mark.parametrize("models", [["zoo:mlp", "M"], ["M"]])
def test_a_misspelled_dim_is_a_usage_error_though_the_model_it_meant_then_fails(mlp, tmp_path, models):
    # --dim bacth=3 leaves mlp.onnx's batch unbound: it "could not be loaded" (exit 3) and the typo,
    # the thing to fix, went unsaid; usage (2) wins over a bad model (3)
    junit = tmp_path / "r.xml"
    args = [mlp if m == "M" else m for m in models]
    rc, out, err = run([*args, "--dim", "bacth=3", "--budget", "1MiB", "--junit", junit])
    assert rc == 2 and out == "" and not junit.exists()
    (line,) = [line for line in err.splitlines() if line.startswith("memplan: error:")]  # others: warnings
    assert "bacth" in line and "batch" in line and "Traceback" not in err  # the typo, and the names there are
    # spelled right, both load and fit
    rc, out, err = run([*args, "--dim", "batch=3", "--budget", "1MiB"])
    assert rc == 0, err


def test_a_shared_dim_is_not_called_a_typo_when_a_model_it_may_be_for_is_unreadable(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    rc, _, err = run(["zoo:mlp", bad, "--dim", "seq=3", "--budget", "1MiB"])
    assert rc == 3 and "not a valid ONNX" in err


def test_a_dim_one_edit_from_a_read_models_name_is_a_typo_though_another_model_is_unreadable(tmp_path):
    # `check zoo:mlp bad.onnx --dim bacth=3` exited 3: the unreadable model might hold a dim bacth,
    # but bacth is one swap from mlp's batch; the typo (2) is named, and the unreadable file with it
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    junit = tmp_path / "r.xml"
    rc, out, err = run(["zoo:mlp", bad, "--dim", "bacth=3", "--budget", "1MiB", "--junit", junit])
    assert rc == 2 and out == "" and not junit.exists()
    (line,) = [line for line in err.splitlines() if line.startswith("memplan: error:")]
    assert "dim bacth matched no model's" in line and "batch" in line and f"failed to load: {bad}: " in line
    rc, _, err = run(["zoo:mlp", bad, "--dim", "batch=3", "--budget", "1MiB"])  # spelled right: the file
    assert rc == 3 and "not a valid ONNX" in err


def _opset5_relu(path: Path) -> Path:
    """x[2,3] @ W -> Relu at opset 5 (Relu-1, which onnx infers no shapes for): an old operator version."""
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"], name="old")],
        "old", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
                helper.make_tensor_value_info("W", onnx.TensorProto.FLOAT, [3, 3])],  # IR 3: inputs too
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.eye(3, dtype=np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 5)])
    model.ir_version = 3
    onnx.save(model, path)
    return path


def test_a_dim_typo_beside_an_old_operator_version_names_why_that_model_failed(tmp_path):
    # `check zoo:mlp old.onnx --dim bacth=3` ended "; old.onnx could not be read either": the typo
    # wins (exit 2) and the model's errors are not reported after it, so the one line never said
    # what was wrong with the file (Relu-1: convert_version(model, 13), as plan says)
    old = _opset5_relu(tmp_path / "old.onnx")
    junit = tmp_path / "r.xml"
    rc, out, err = run(["zoo:mlp", old, "--dim", "bacth=3", "--budget", "1MiB", "--junit", junit])
    assert rc == 2 and out == "" and not junit.exists() and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("memplan: error:")]
    assert "dim bacth matched no model's" in line and "either" not in line
    assert f"{old}: node 'old' is Relu version 1" in line and "convert_version(model, 13)" in line
    rc, _, err = run(["zoo:mlp", old, "--dim", "batch=3", "--budget", "1MiB"])  # spelled right: the model
    assert rc == 3 and "convert_version(model, 13)" in err


def test_a_dim_no_model_has_beside_a_fixed_dim_model_that_fails_later_is_a_usage_error(tmp_path):
    # `check zoo:mlp old.onnx --dim foo=3 --no-plan` exited 3 with foo only a warning: old.onnx's
    # inputs were read (all fixed, no dim foo) before its Relu-1 failed, but no dim names read as
    # "never read", so it might have held foo; usage (2) wins over the bad model, as with a good one
    old = _opset5_relu(tmp_path / "old.onnx")
    junit = tmp_path / "r.xml"
    rc, out, err = run(["zoo:mlp", old, "--dim", "foo=3", "--budget", "1MiB", "--no-plan", "--junit", junit])
    assert rc == 2 and out == "" and not junit.exists() and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("memplan: error:")]
    assert "dim foo matched no model's" in line and f"failed to load: {old}: node 'old' is Relu version 1" in line
    rc, _, err = run(["zoo:mlp", old, "--budget", "1MiB", "--no-plan"])  # without the dim: the model
    assert rc == 3 and "convert_version(model, 13)" in err


def test_a_dim_typo_names_its_model_once(tmp_path):
    # `check zoo:mlp --budget 80% --dim bacth=3` said "zoo:mlp: --dim bacth matched no symbolic
    # input dim of zoo:mlp"; plan says the same line without the first name. A config entry's own
    # `dims = { bacth = 3 }` was worded as that --dim too, naming neither the file nor the entry
    cfg = tmp_path / "memplan.toml"  # an entry's own dims are for its model alone: a typo there too
    cfg.write_text('[[check]]\nmodel = "zoo:mlp"\nbudget = "1MiB"\ndims = { bacth = 3 }\n'
                   '[[check]]\nmodel = "zoo:cnn"\nbudget = "1MiB"\n')
    for args, says in ((["zoo:mlp", "--budget", "1MiB", "--dim", "bacth=3"], "error: --dim bacth"),
                       (["--config", cfg], f"error: {cfg}: [[check]] #1: dims: bacth")):
        rc, _, err = run(args)
        line = one_error_line(err)
        assert rc == 2 and f"{says} matched no symbolic input dim of zoo:mlp" in line, line
        assert line.count("zoo:mlp") == 1, line
    # with one entry, --dim is not loose either: the line names --dim for a typo given there
    cfg.write_text('[[check]]\nmodel = "zoo:mlp"\nbudget = "1MiB"\ndims = { batch = 3 }\n')
    rc, _, err = run(["--config", cfg, "--dim", "bacth=3"])
    assert rc == 2 and "error: --dim bacth matched no symbolic input dim of zoo:mlp" in one_error_line(err)
    # and a typo in that entry's own dims, with --dim given too, is the entry's: it was worded as --dim bacth
    cfg.write_text('[[check]]\nmodel = "zoo:mlp"\nbudget = "1MiB"\ndims = { bacth = 3 }\n')
    rc, _, err = run(["--config", cfg, "--dim", "batch=3"])
    assert rc == 2 and f"error: {cfg}: [[check]] #1: dims: bacth matched no symbolic input dim" in one_error_line(err)
    # a message that does not name the model still gets its name in front
    rc, _, err = run(["zoo:mlp", "--budget", "1MiB", "--add-loss", "mean"])
    assert rc == 2 and one_error_line(err).startswith("memplan: error: zoo:mlp: --add-loss 'mean'")


@pytest.mark.parametrize("content", [b"not a model", "truncated"])
def test_one_unreadable_model_with_a_dim_no_model_has_is_the_bad_model_in_plan_and_check(mlp, tmp_path, content):
    # With one model that cannot be read (not ONNX, or cut short) and a --dim no model is known to
    # have, nothing tells a typo from a dim of the unreadable file: plan, inspect and check all
    # report the file (exit 3, one error line naming it), never the dim; with a readable model
    # beside it the dim one edit from that model's batch is the usage error (exit 2, above).
    from tests.helpers import memplan

    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content if isinstance(content, bytes) else Path(mlp).read_bytes()[:200])
    for args in (["plan", bad, "--budget", "50%", "--dim", "bacth=4"], ["inspect", bad, "--dim", "bacth=4"]):
        rc, out, err = memplan(*args)
        assert rc == 3 and out == "", (args, out, err)
        assert "not a valid ONNX protobuf" in one_error_line(err) and "bacth" not in err
    rc, out, err = run([bad, "--budget", "50%", "--dim", "bacth=4"])
    (line,) = [line for line in err.splitlines() if line.startswith("memplan: error:")]
    assert rc == 3 and str(bad) in line and "not a valid ONNX protobuf" in line and "bacth" not in err, err


def test_a_budget_proven_out_of_reach_gets_a_tenth_of_the_limit(monkeypatch):
    # below the least peak any node order may reach no plan fits before any search; check spent its
    # whole limit anyway on the "lowest plan found" figure (the mobilenetv2 fixture's training step
    # at 60%: 23 s for a verdict and bound known at once). plan keeps the whole limit.
    from planner import planning

    seen, floors = [], []
    real = planning._solve_from

    def spy(problem, budget, options, *args, **kw):
        seen.append((budget < problem.order_free_floor, options.time_limit))
        floors.append(problem.order_free_floor)
        return real(problem, budget, options, *args, **kw)

    monkeypatch.setattr(planning, "_solve_from", spy)
    rc, out, err = run(["zoo:mlp", "--train", "--budget", "50%", "--time-limit", "4", "--json"])
    (r,) = json.loads(out)["results"]
    assert rc == 1 and r["plan"]["status"] == "infeasible" and r["least_bytes"] > r["budget_bytes"], err
    assert seen and all(below and limit == pytest.approx(0.4) for below, limit in seen), seen
    # a budget at the floor itself is not proven out of reach: the whole limit (on zoo:cnn: zoo:mlp's
    # floor is its peak, where it fits as it is)
    run(["zoo:cnn", "--train", "--budget", "1%", "--time-limit", "4", "--json"])
    seen.clear()
    rc, out, err = run(["zoo:cnn", "--train", "--budget", f"{floors[-1]}B", "--time-limit", "4", "--json"])
    assert rc in (0, 1) and seen and all(not below and limit == 4 for below, limit in seen), (seen, err)
    seen.clear()
    plan = CliRunner().invoke(cli.main, ["plan", "zoo:mlp", "--budget", "50%", "--time-limit", "4", "--json"])
    assert plan.exit_code == 1 and seen and all(below and limit == 4 for below, limit in seen), seen
    seen.clear()  # a budget a plan may meet keeps the whole limit
    rc, out, err = run(["zoo:gpt", "--train", "--budget", "80%", "--time-limit", "4", "--json"])
    assert rc == 0 and seen and all(not below and limit == 4 for below, limit in seen), (seen, err)
