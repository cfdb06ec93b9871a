"""planner/arena.py: the replay of ORT's BFC arena, rule by rule, and plans kept under its limit."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from planner.arena import (
    NEXT_POWER_OF_TWO, SAME_AS_REQUESTED, Arena, arena_need, bin_of, least_limit, mmap_thresholds, replay, reserved_bytes,
    rounded, run_events, session_allocations,
)
from planner.graph import GraphBuilder
from planner.liveness import analyze

KIB, MIB = 1 << 10, 1 << 20


def test_requests_round_to_256_bytes_and_bins_double():
    assert [rounded(n) for n in (1, 256, 257, 1000)] == [256, 256, 512, 1024]
    assert [bin_of(n) for n in (256, 511, 512, 1023, 1024, 1 << 40)] == [0, 0, 1, 1, 2, 20]


def test_the_smallest_free_chunk_that_fits_is_taken():
    arena = Arena(1 << 40, SAME_AS_REQUESTED)
    big, small = arena.alloc(4 * KIB), arena.alloc(1 * KIB)
    arena.free(big)
    arena.free(small)
    got = arena.alloc(900)
    assert got.size == KIB and got.addr == small.addr  # the 1 KiB region, not the 4 KiB one
    assert arena.regions == 2


def test_a_chunk_under_twice_the_request_is_handed_out_whole():
    arena = Arena(1 << 40, SAME_AS_REQUESTED)
    arena.free(arena.alloc(1536))
    whole = arena.alloc(1024)
    assert whole.size == 1536 and arena.in_use == 1536  # 512 bytes ride along, unusable
    arena.free(arena.alloc(2048))  # a new region; freed
    split = arena.alloc(1024)  # 2048 >= 2 x 1024: split, the rest stays free
    assert split.size == 1024 and arena.in_use == 1536 + 1024
    assert arena.alloc(1024).size == 1024 and arena.regions == 2  # the rest of the split


def test_freed_neighbours_merge_within_a_region_only():
    one = Arena(1 << 40, NEXT_POWER_OF_TWO)  # one 1 MiB region
    a, b = one.alloc(256 * KIB), one.alloc(256 * KIB)
    one.free(a)
    one.free(b)
    one.alloc(768 * KIB)
    assert one.regions == 1 and one.total == MIB
    two = Arena(1 << 40, SAME_AS_REQUESTED)  # one region per request
    a, b = two.alloc(256 * KIB), two.alloc(256 * KIB)
    two.free(a)
    two.free(b)
    two.alloc(512 * KIB)  # the two free 256 KiB regions do not merge
    assert two.regions == 3 and two.total == MIB


def test_a_freed_chunk_merges_with_its_free_lower_neighbour():
    # The rest of the region stays in use, so only a merge with the chunk below frees 2 KiB in one piece.
    arena = Arena(4 * KIB, NEXT_POWER_OF_TWO, first_region=4 * KIB)
    a, b, rest = arena.alloc(KIB), arena.alloc(KIB), arena.alloc(2 * KIB)
    assert (a.size, b.size, rest.size, arena.regions) == (KIB, KIB, 2 * KIB, 1)
    arena.free(a)
    arena.free(b)  # b's upper neighbour is in use: it merges downward with a
    got = arena.alloc(2 * KIB)
    assert got is not None and got.addr == a.addr and arena.regions == 1


def test_a_region_clamped_to_the_limit_is_a_whole_number_of_256_byte_units():
    arena = Arena(MIB + 1000, NEXT_POWER_OF_TWO)
    arena.alloc(KIB)
    arena.alloc(MIB - KIB)  # the rest of the first region
    assert arena.alloc(512) is not None  # a region of the 768 bytes left in whole units, not 1000
    assert arena.total == MIB + 768 and arena.regions == 2


def test_regions_follow_the_power_of_two_ladder():
    arena = Arena(1 << 40, NEXT_POWER_OF_TWO)
    arena.alloc(KIB)  # first region: 1 MiB; the next will be 2 MiB
    arena.alloc(1536 * KIB)  # does not fit what is left: 2 MiB region
    arena.alloc(1536 * KIB)  # 4 MiB region (doubled again after a region made without doubling)
    assert arena.regions == 3 and arena.total == 7 * MIB
    arena.alloc(6 * MIB)  # doubles until it holds the request: 8 MiB
    assert arena.total == 15 * MIB


def test_a_region_is_clamped_to_the_limit_and_a_request_past_it_fails():
    arena = Arena(1536 * KIB, NEXT_POWER_OF_TWO)
    assert arena.alloc(KIB) is not None and arena.total == MIB
    assert arena.alloc(700 * KIB) is not None  # in the first region
    assert arena.alloc(400 * KIB) is not None  # new region: 2 MiB clamped to the 512 KiB left
    assert arena.total == 1536 * KIB
    assert arena.alloc(256) is None  # nothing free fits and nothing is left to extend by


def test_least_limit_counts_regions_that_never_merge():
    # one region each (same-as-requested): 1 KiB, 1 KiB, free the first, 2 KiB: 4 KiB in all
    events = [(1, "a", KIB), (1, "b", KIB), (-1, "a", 0), (1, "c", 2 * KIB)]
    assert least_limit(events, strategy=SAME_AS_REQUESTED) == 4 * KIB
    assert least_limit(events, base=1000, strategy=SAME_AS_REQUESTED) == 4 * KIB + 1000
    assert not replay(events, 4 * KIB - 256, strategy=SAME_AS_REQUESTED)[0]
    # power of two under a limit below 1 MiB: one region of the whole limit; a's freed 1 KiB (at its
    # start) and the free tail lie apart, so c needs a 2 KiB tail: 4 KiB, not the 3 KiB live at once
    assert least_limit(events, strategy=NEXT_POWER_OF_TWO) == 4 * KIB
    assert least_limit([(1, "a", KIB), (-1, "a", 0), (1, "c", 2 * KIB)], strategy=NEXT_POWER_OF_TWO) == 2 * KIB


def _matmul_graph(extra_reader: bool):
    b = GraphBuilder()
    x = b.input("x", "float32", (8, 32))
    w = b.initializer("w", np.ones((32, 96), np.float32))
    (y,) = b.node("MatMul", [x, w], [("y", "float32", (8, 96))])
    outs = [y]
    if extra_reader:
        (z,) = b.node("Add", [w, w], [("z", "float32", (32, 96))])
        outs.append(z)
    for t in outs:
        b.output(t)
    return b.build()


def test_the_cpu_provider_reserves_packed_weights_for_gemm_and_matmul():
    only_matmul = _matmul_graph(extra_reader=False)
    # MLAS packs B (K=32, N=96): N rounded up to 16, times K floats; B itself goes once its readers packed it
    assert reserved_bytes(only_matmul, prepack=True) == 96 * 32 * 4
    # B (12288 bytes) is read by an Add too, but the CPU provider holds it outside the arena (over 127 bytes)
    assert reserved_bytes(_matmul_graph(extra_reader=True), prepack=True) == 96 * 32 * 4
    assert reserved_bytes(only_matmul, prepack=False) == 32 * 96 * 4  # CUDA: the weight as it is


def test_readers_of_one_weight_share_a_packed_copy_and_large_initializers_stay_out_of_the_cpu_arena():
    # ORT 1.31 keeps one packed copy per op type and packed content (three MatMuls of w hold one, the Gemm
    # its own), and reserves on the CPU only initializers under 128 bytes: zoo:gpt planned at 70% held
    # 196608 bytes of copies and 700 of initializers where one copy per reader and every initializer
    # were counted (495292), and its least kNextPowerOfTwo limit was predicted 1.8x too high
    b = GraphBuilder()
    x = b.input("x", "float32", (8, 32))
    w = b.initializer("w", np.ones((32, 96), np.float32))
    small, large = b.initializer("small", np.ones(4, np.float32)), b.initializer("large", np.ones(96, np.float32))
    outs = [b.node("MatMul", [x, w], [(f"y{i}", "float32", (8, 96))])[0] for i in range(3)]
    (g_out,) = b.node("Gemm", [x, w], [("g", "float32", (8, 96))])
    (s_out,) = b.node("Add", [x, small], [("s", "float32", (8, 32))])
    (l_out,) = b.node("Add", [g_out, large], [("l", "float32", (8, 96))])
    for t in outs + [s_out, l_out]:
        b.output(t)
    g = b.build()
    assert reserved_bytes(g, prepack=True) == 2 * 96 * 32 * 4 + 16
    assert reserved_bytes(g, prepack=False) == 32 * 96 * 4 + 16 + 96 * 4  # CUDA: every initializer as it is


@pytest.mark.parametrize("op, packed", [("LSTM", 640 + 384), ("GRU", 640 + 384 + 384)])
def test_a_recurrent_nodes_weights_are_held_as_mlas_packed_copies_on_cpu(op, packed):
    # ORT's log for a bidirectional node of hidden size 3, input size 5: W (N = gates x 3 -> 16, K = 5) and
    # R (K = 3) packed per direction, a GRU's R in two parts; W, R and B (over 127 bytes) stay out of the arena
    gates = {"LSTM": 4, "GRU": 3}[op]
    b = GraphBuilder()
    x = b.input("x", "float32", (4, 2, 5))
    w, r, bias = (b.initializer(name, np.ones(shape, np.float32)) for name, shape in
                  (("W", (2, gates * 3, 5)), ("R", (2, gates * 3, 3)), ("B", (2, 2 * gates * 3))))
    (y,) = b.node(op, [x, w, r, bias], [("y", "float32", (4, 2, 2, 3))],
                  attrs={"hidden_size": 3, "direction": "bidirectional"})
    b.output(y)
    assert reserved_bytes(b.build(), prepack=True) == packed


def test_the_least_cpu_arena_limit_of_matmuls_sharing_a_weight_is_predicted_within_3_percent():
    # a plan's recomputed MatMuls read the weight their originals read (zoo:gpt at 70%: 21 readers of a
    # 4 KiB weight); counted with a packed copy each and every initializer reserved, the prediction was
    # 1.8x the least limit ORT runs under. It runs at the prediction and not 3% under it.
    from onnx import helper, numpy_helper

    from passes.onnx_import import import_model
    from passes.verify import runs_under_arena

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("W", (64, 256)), ("C", (16, 256)))]
    nodes = [helper.make_node("MatMul", ["x", "W"], [f"m{i}"]) for i in range(3)]
    nodes += [helper.make_node("Add", ["m0", "m1"], ["a"]), helper.make_node("Add", ["a", "m2"], ["b"]),
              helper.make_node("Add", ["b", "C"], ["y"])]
    graph = helper.make_graph(nodes, "shared", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", 1, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    need = arena_need(analyze(import_model(model)), strategy=NEXT_POWER_OF_TWO)
    assert runs_under_arena(model, {"x": x}, need, NEXT_POWER_OF_TWO) == (True, "")
    assert not runs_under_arena(model, {"x": x}, int(need * 0.97), NEXT_POWER_OF_TWO)[0]


def test_matmuls_on_two_weights_of_equal_values_share_a_packed_copy():
    # ORT keeps one packed copy per op type and packed content: two MatMuls on two initializers of
    # equal values (a weight tied by copying it, zero-initialized adapters) hold one copy. Counted
    # twice, the least kNextPowerOfTwo limit was predicted 262144 bytes where ORT runs under 196608
    # (a copy too many), which an --ort-arena plan paid for. It runs at the prediction and not 3% under it.
    from onnx import helper, numpy_helper

    from passes.onnx_import import import_model
    from passes.verify import runs_under_arena

    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    weights = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(w.copy(), "W2"),
               numpy_helper.from_array(-w, "W3")]  # another value: its own copy
    nodes = [helper.make_node("MatMul", ["x", name], [f"m{i}"]) for i, name in enumerate(("W", "W2", "W3"))]
    nodes += [helper.make_node("Add", ["m0", "m1"], ["a"]), helper.make_node("Add", ["a", "m2"], ["y"])]
    graph = helper.make_graph(nodes, "equal", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", 1, None)], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    g = import_model(model)
    assert reserved_bytes(g, prepack=True) == 2 * 256 * 64 * 4
    need = arena_need(analyze(g), strategy=NEXT_POWER_OF_TWO)
    assert runs_under_arena(model, {"x": x}, need, NEXT_POWER_OF_TWO) == (True, "")
    assert not runs_under_arena(model, {"x": x}, int(need * 0.97), NEXT_POWER_OF_TWO)[0]


def test_weights_equal_as_numbers_but_not_as_bytes_keep_their_own_packed_copies():
    # -0.0 == 0.0, but ORT tells packed copies apart by their bytes
    b = GraphBuilder()
    x = b.input("x", "float32", (8, 32))
    zeros = b.initializer("zeros", np.zeros((32, 96), np.float32))
    negative = b.initializer("negative", -np.zeros((32, 96), np.float32))
    again = b.initializer("again", np.zeros((32, 96), np.float32))
    for i, w in enumerate((zeros, negative, again)):
        b.output(b.node("MatMul", [x, w], [(f"y{i}", "float32", (8, 96))])[0])
    assert reserved_bytes(b.build(), prepack=True) == 2 * 96 * 32 * 4


def test_a_conv_transpose_keeps_its_weight_transposed_in_the_arena_on_cpu():
    b = GraphBuilder()
    x = b.input("x", "float32", (1, 4, 8, 8))
    w = b.initializer("w", np.ones((4, 2, 3, 3), np.float32))
    (y,) = b.node("ConvTranspose", [x, w], [("y", "float32", (1, 2, 10, 10))])
    b.output(y)
    g = b.build()
    (event,) = session_allocations(g)
    assert event[0] == 1 and event[2] == 4 * 2 * 3 * 3 * 4  # from the arena, held from session creation
    assert reserved_bytes(g, prepack=True) == 0  # its only reader packed it: the original goes
    assert reserved_bytes(g, prepack=False) == 4 * 2 * 3 * 3 * 4
    lv = analyze(g)
    assert arena_need(lv, strategy=SAME_AS_REQUESTED) == 512 + rounded(lv.dynamic_peak)  # two regions


def test_arena_need_is_at_least_the_live_peak_and_inputs_count_off_the_cpu():
    g = _matmul_graph(extra_reader=True)
    lv = analyze(g)
    on_cpu = arena_need(lv, strategy=SAME_AS_REQUESTED)
    assert on_cpu >= lv.dynamic_peak
    off_cpu = arena_need(lv, strategy=SAME_AS_REQUESTED, on_cpu=False)
    x_bytes = 8 * 32 * 4
    # off the CPU the weight itself is reserved instead of its packed copy (the same 12288 bytes here),
    # and the fed input is copied in
    assert off_cpu == on_cpu + x_bytes
    events = run_events(lv)
    assert [e[0] for e in events].count(1) == len(lv.buffer_size) + int(np.count_nonzero(lv.scratch))


@pytest.mark.parametrize("strategy", [NEXT_POWER_OF_TWO, SAME_AS_REQUESTED])
def test_least_limit_runs_and_one_step_below_does_not(strategy):
    rng = np.random.default_rng(0)
    events, live = [], []
    for i in range(200):
        if live and rng.random() < 0.45:
            events.append((-1, live.pop(int(rng.integers(len(live)))), 0))
        else:
            events.append((1, i, int(rng.integers(1, 300 * KIB))))
            live.append(i)
    need = least_limit(events, strategy=strategy)
    thresholds = mmap_thresholds(events, strategy=strategy)
    assert all(replay(events, need, strategy=strategy, mmap_threshold=t)[0] for t in thresholds)
    assert not all(replay(events, need - 256, strategy=strategy, mmap_threshold=t)[0] for t in thresholds)


# ---- end to end: memplan plan --ort-arena, ORT's own arena as the oracle --------------------------------
def _memplan(*args):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "cli", *map(str, args)], cwd=root, capture_output=True, text=True)
    return proc.returncode, proc.stdout, proc.stderr


def test_an_ort_arena_plan_runs_under_its_budget_where_a_plain_plan_does_not(tmp_path):
    import json

    import onnx

    import models
    from passes.onnx_import import import_model
    from passes.verify import runs_under_arena

    spec = "zoo:gpt?batch=16"
    common = ["--budget", "70%", "--device", "cpu", "--deterministic", "--time-limit", "1"]
    plain, fitted = tmp_path / "plain.onnx", tmp_path / "fitted.onnx"
    rc, _, err = _memplan("plan", spec, *common, "--emit", plain, "-o", tmp_path / "plain.json")
    assert rc == 0, err
    rc, out, err = _memplan("plan", spec, *common, "--ort-arena", "same-as-requested", "--emit", fitted,
                            "-o", tmp_path / "fitted.json")
    assert rc == 0, err
    assert "ORT arena     runs under a limit of" in out
    made = json.loads((tmp_path / "fitted.json").read_text())
    budget = made["budget_bytes"]
    assert made["ort_arena"]["extend_strategy"] == "kSameAsRequested"
    assert made["peak_bytes"] <= made["ort_arena"]["need_bytes"] <= budget
    assert json.loads((tmp_path / "plain.json").read_text())["peak_bytes"] <= budget
    feeds = models.example_feeds(onnx.load(plain), seed=0)
    # the plain plan's peak fits, its arena does not: the replay says so, and so does ORT
    plain_need = arena_need(analyze(import_model(str(plain))), strategy=SAME_AS_REQUESTED)
    assert plain_need > budget
    ok, error = runs_under_arena(plain, feeds, budget, SAME_AS_REQUESTED)
    assert not ok and "BFCArena" in error
    assert runs_under_arena(fitted, feeds, budget, SAME_AS_REQUESTED) == (True, "")


def test_ort_arena_is_refused_for_json_graphs(benchmarks_dir):
    graph = next((benchmarks_dir / "remat").glob("random_layered_n100_*.json"), None)
    if graph is None:
        pytest.skip("shared remat benchmarks not present")
    rc, out, err = _memplan("plan", graph, "--budget", "80%", "--ort-arena", "same-as-requested")
    assert rc != 0 and not out
    assert err.strip().splitlines()[-1].startswith("memplan: error: --ort-arena applies to ONNX models")
    assert "Traceback" not in err


class _ScaledArena:
    """Stands in for passes.plan_model.OrtArena: the arena needs ``factor`` x the planned peak."""

    label = "scaled"

    def __init__(self, factor: float):
        self.factor = factor
        self.needs: list[int] = []

    def need(self, planned) -> int:
        self.needs.append(int(analyze(planned).peak_bytes * self.factor))
        return self.needs[-1]


def test_plan_graph_tightens_until_the_arena_fits_and_keeps_the_cheapest_fitting_plan():
    import math

    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph
    from passes.plan_model import plan_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    budget = math.ceil(analyze(g).peak_bytes * 0.8)
    arena = _ScaledArena(1.15)
    pm = plan_graph(g, budget, strategy="greedy", ort_arena=arena)
    assert pm.ok and pm.arena_need is not None
    assert pm.arena_need <= budget and pm.peak_bytes <= budget / 1.15
    assert arena.needs[0] > budget  # the first plan fit the budget, not the arena
    fitting = [n for n in arena.needs if n <= budget]
    assert pm.arena_need in fitting
    hopeless = _ScaledArena(10.0)
    failed = plan_graph(g, budget, strategy="greedy", ort_arena=hopeless)
    assert not failed.ok and "not ORT's arena" in failed.result.note
    assert f"the least arena need of the plans found was {min(hopeless.needs)} bytes" in failed.result.note


def test_plan_graph_stops_bisecting_when_a_re_solve_finds_a_dearer_plan_than_the_fitting_one(monkeypatch):
    """Regression (zoo:resnet?batch=32 at 70% --ort-arena same-as-requested --time-limit 10
    --deterministic: six re-solves, the last two after a solve found a plan dearer than the fitting
    one). A re-solve between the fitting target and a failing one gets half the time of the one
    before; one that comes back dearer than the fitting plan (which fits its target too) is out of
    time, and the next has less: plan_graph keeps the fitting plan and stops there."""
    import math
    from dataclasses import replace

    import passes.plan_model as plan_model
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    budget = math.ceil(analyze(g).peak_bytes * 0.8)
    arena, real, calls = _ScaledArena(1.15), plan_model.solve, []

    def solve(problem, target, strategy, options, **kw):
        res = real(problem, target, strategy, options, **kw)
        fitted = any(n <= budget for n in arena.needs)
        calls.append(fitted)
        # once a plan fits the arena, every re-solve stands in for one out of time: a dearer plan
        return replace(res, added_time=res.added_time * 1000 + 1) if fitted and res.plan is not None else res

    monkeypatch.setattr(plan_model, "solve", solve)
    pm = plan_model.plan_graph(g, budget, strategy="greedy", ort_arena=arena)
    assert pm.ok and pm.arena_need is not None and pm.arena_need <= budget
    assert calls.count(True) == 1  # one bisecting re-solve, not one per halving


def test_no_plan_the_arena_runs_is_a_timeout_not_a_proof_of_infeasibility():
    """zoo:gpt at 80% --ort-arena next-power-of-two --time-limit 10 --deterministic: 'the least arena
    any needed was 307860 bytes', exit 1 (over_budget, 'try a larger budget'), though that is only the
    least of the plans found, and the same line said some solves ran out of time. The arena refusing
    the plans found proves nothing of the others: exit 4 (timeout), and the message says it is no bound."""
    import math

    import cli
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph
    from passes.plan_model import plan_graph
    from planner.errors import SolverTimeoutError

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    budget = math.ceil(analyze(g).peak_bytes * 0.8)
    arena = _ScaledArena(10.0)
    failed = plan_graph(g, budget, strategy="greedy", ort_arena=arena)
    assert not failed.ok and failed.result.status == "timeout" and failed.arena_least == min(arena.needs)
    err = cli._no_plan_error(failed.result, False, budget, failed.unplanned_peak, "--swap")
    assert isinstance(err, SolverTimeoutError) and cli._exit_code(err) == cli.EXIT_TIMEOUT
    assert f"the least arena need of the plans found was {min(arena.needs)} bytes (scaled), not a bound on the " \
           "plans not found" in str(err)
    assert "try a longer --time-limit or a larger --budget" in str(err)

    class ByAByte:
        """Refuses every plan, by a byte over the budget: the last solve ends with a plan, refused."""

        label = "by a byte"

        def need(self, planned) -> int:
            return max(analyze(planned).peak_bytes, budget + 1)

    refused = plan_graph(g, budget, strategy="greedy", ort_arena=ByAByte())
    # no added time of a refused plan in the JSON (zoo:gpt at 70% same-as-requested said +16.68%)
    assert refused.result.status == "timeout" and refused.result.added_time is None


def test_check_judges_the_least_arena_need_of_the_plans_found_where_none_fits(monkeypatch):
    """Where the arena refuses every plan found (now a timeout, not over_budget), memplan check still
    judges the least arena need found ('best arena' in its table), not a timeout with no figure."""
    import math

    import cli
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph
    from passes.plan_model import OrtArena

    needs = []

    def need(self, planned):
        needs.append(10 * analyze(planned).peak_bytes)
        return needs[-1]

    monkeypatch.setattr(OrtArena, "need", need)
    g = training_graph(load_graph("zoo:gpt?batch=8"))
    budget = math.ceil(analyze(g).peak_bytes * 0.8)
    out = cli.check_plan_fn(g, budget, "H100", 0.5, ort_arena="next-power-of-two")
    assert not out.fits and out.status == "timeout" and out.arena_bytes == min(needs)


class _ThresholdArena:
    """Stands in for passes.plan_model.OrtArena: a plan peaking at most ``fits`` bytes needs its peak,
    one above needs three times it (the replay's overshoot jumps from plan to plan)."""

    label = "threshold"

    def __init__(self, fits: int):
        self.fits = fits

    def need(self, planned) -> int:
        peak = analyze(planned).peak_bytes
        return peak if peak <= self.fits else 3 * peak


def test_plan_graph_bisects_up_when_the_arena_scaled_target_holds_no_plan():
    """The arena's overshoot scaled the target so far down that no plan fits it (zoo:cnn at 95%
    --ort-arena: 737949 -> 542807 -> 418263 bytes); plan_graph gave up with 'try a larger budget'
    where a smaller budget found a plan the arena runs. It now bisects between that target and the
    one whose plan overshot the arena, and returns a plan that fits."""
    import math

    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph
    from passes.plan_model import plan_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    own = analyze(g).peak_bytes
    budget, fits = math.ceil(own * 0.8), math.ceil(own * 0.6)
    pm = plan_graph(g, budget, strategy="greedy", ort_arena=_ThresholdArena(fits))
    assert pm.ok, pm.result.note
    assert pm.peak_bytes <= fits and pm.arena_need == pm.peak_bytes <= budget
    # where none fits, the plan JSON names no best peak: the last solve's fit the budget, not the arena
    failed = plan_graph(g, budget, strategy="greedy", ort_arena=_ThresholdArena(1))
    assert not failed.ok and failed.result.status == "timeout" and failed.result.best_bytes is None


def test_max_batch_counts_the_arena_for_the_step_as_is_and_never_plans_below_it():
    """--max-batch --ort-arena took a batch as fitting unplanned by its peak alone, found no plan
    the arena ran there, and said planned batch 0 (zoo:resnet under 5.71 MiB: unplanned 15)."""
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph
    from passes.plan_model import max_batch, plan_graph

    def build(b):
        return training_graph(load_graph(f"zoo:gpt?batch={b}"))

    budget = analyze(build(8)).peak_bytes
    peak_only = max_batch(build, budget, lambda g, lim: plan_graph(g, lim, strategy="greedy"))
    assert peak_only.unplanned == 8
    arena = _ScaledArena(1.3)
    counted = max_batch(build, budget, lambda g, lim: plan_graph(g, lim, strategy="greedy", ort_arena=arena),
                        ort_arena=arena)
    assert 0 < counted.unplanned < 8
    assert arena.need(build(counted.unplanned)) <= budget < arena.need(build(counted.unplanned + 1))
    assert counted.planned > counted.unplanned and counted.planned_result.arena_need <= budget
    # where no plan runs in the arena, the step as it is still does: never a planned batch below it
    hopeless = max_batch(build, budget, lambda g, lim: plan_graph(g, lim, strategy="greedy",
                                                                  ort_arena=_ScaledArena(10.0)), ort_arena=arena)
    assert hopeless.planned == hopeless.unplanned == counted.unplanned


def test_a_primed_plan_runs_under_ort_arena_where_its_schedule_unprimed_does_not():
    """kSameAsRequested makes a region of each extension and never merges chunks of two regions:
    plans of convnets needed 1.3-2.1x their peak, and --ort-arena found none at 60% (stop 50). A
    first buffer freed at once (passes.rewrite.prime_arena) gives the arena one region to carve."""
    import math

    import models
    from passes.autodiff import training_graph
    from passes.onnx_export import export_model
    from passes.onnx_import import load_graph
    from passes.plan_model import OrtArena, plan_graph
    from passes.rewrite import MIN_PRIME_BYTES, PRIME, PRIME_READ, apply_schedule
    from passes.verify import runs_under_arena
    from planner.cpsat import PlannerOptions

    g = training_graph(load_graph("zoo:unet?batch=2"))
    budget = math.ceil(analyze(g).peak_bytes * 0.9)
    pm = plan_graph(g, budget, strategy="greedy", ort_arena=OrtArena(SAME_AS_REQUESTED, False),
                    options=PlannerOptions(time_limit=60))
    assert pm.ok and pm.primed_bytes >= MIN_PRIME_BYTES and pm.arena_need <= budget
    assert [n.name for n in pm.planned.nodes[:2]] == [PRIME, PRIME_READ]
    assert pm.peak_bytes == analyze(pm.planned).peak_bytes <= budget  # the primer adds no peak
    primed, unprimed = export_model(pm.planned), export_model(apply_schedule(g, pm.events))
    feeds = models.example_feeds(primed, seed=0)
    assert runs_under_arena(primed, feeds, budget, SAME_AS_REQUESTED) == (True, "")
    ran, error = runs_under_arena(unprimed, feeds, budget, SAME_AS_REQUESTED)
    assert not ran and "Available memory" in error


def test_a_primer_of_six_tenths_of_the_dynamic_peak_is_tried():
    """zoo:gpt at 80% --ort-arena next-power-of-two --time-limit 10 --deterministic --workers 1: every
    plan found overshot the arena (the least, peaking at 253780 bytes, needed 307860 against a
    292855-byte budget, 307884 with the half-peak primer, 318636 with 0.7), and memplan gave up; a
    primer of 0.6 of its dynamic peak runs it under 292524. The fractions tried had none between 0.5 and 0.7."""
    import math

    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph
    from passes.plan_model import _primed

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    peak = analyze(g).peak_bytes
    dynamic, plain = peak - g.base_bytes, sum(t.nbytes for t in g.tensors)
    budget = math.ceil(peak * 1.5)  # any primer keeps the peak within it

    class OnlySixTenths:
        """An arena the graph runs in only with a primer of 55-65% of its dynamic peak."""

        def need(self, primed) -> int:
            share = (sum(t.nbytes for t in primed.tensors) - plain) / dynamic
            return budget if 0.55 < share < 0.65 else budget + 1

    primed, graph, _, need = _primed(g, peak, budget, OnlySixTenths(), budget + 1)
    assert graph is not None and need == budget
    assert 0.55 < primed / dynamic < 0.65


def test_rewrite_writes_the_primed_file_plan_emitted(tmp_path):
    spec, common = "zoo:unet?batch=2", ["--budget", "90%", "--strategy", "greedy", "--device", "cpu",
                                        "--ort-arena", "same-as-requested", "--time-limit", "2"]
    rc, out, err = _memplan("plan", spec, *common, "--emit", tmp_path / "e.onnx", "-o", tmp_path / "p.json")
    assert rc == 0, err
    assert "primes the arena with" in out
    made = json.loads((tmp_path / "p.json").read_text())
    assert made["ort_arena"]["primed_bytes"] > 0
    rc, _, err = _memplan("rewrite", spec, tmp_path / "p.json", "-o", tmp_path / "r.onnx")
    assert rc == 0, err
    assert (tmp_path / "r.onnx").read_bytes() == (tmp_path / "e.onnx").read_bytes()


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_a_fused_recurrent_nodes_buffers_reach_the_arena_one_by_one(op):
    # ORT's LSTM / GRU kernels ask for a dozen working buffers; replayed as one lump of their sum, a
    # bidirectional LSTM's least kNextPowerOfTwo limit was predicted at 802560 bytes, and ORT's arena
    # failed under it (it needs 981 KB). Each request on its own: it runs at the prediction, not 1% under.
    from onnx import helper, numpy_helper

    from passes.onnx_import import import_model
    from passes.verify import runs_under_arena

    gates, hidden = {"LSTM": 4, "GRU": 3}[op], 32
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 16, 8)).astype(np.float32)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.3, name)
               for name, shape in (("W", (2, gates * hidden, 8)), ("R", (2, gates * hidden, hidden)),
                                   ("B", (2, 2 * gates * hidden)))]
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=hidden, direction="bidirectional")],
        "rnn", [helper.make_tensor_value_info("x", 1, x.shape)],
        [helper.make_tensor_value_info(y, 1, None) for y in ("y", "y_h")], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    lv = analyze(import_model(model))
    need = arena_need(lv, strategy=NEXT_POWER_OF_TWO)
    assert runs_under_arena(model, {"x": x}, need, NEXT_POWER_OF_TWO) == (True, "")
    assert not runs_under_arena(model, {"x": x}, int(need * 0.99), NEXT_POWER_OF_TWO)[0]
    requests = [e for e in run_events(lv) if e[0] > 0 and isinstance(e[1], tuple) and e[1][0] == "scratch"]
    assert len(requests) > 10 and sum(e[2] for e in requests) == int(lv.scratch.sum())


@pytest.mark.parametrize("op", ["Where", "LRN", "LogSoftmax"])
def test_a_kernels_two_working_buffers_reach_the_arena_one_by_one(op):
    # Where's two branch selections, LRN's scale and padded squares, a Softmax over an inner axis's
    # two transposed copies: replayed as one lump of their sum, kNextPowerOfTwo's ladder was asked for
    # a region they need not share (Where on 256x512 floats: 2097152 bytes predicted, ORT runs from
    # 1575320). Each request on its own: it runs at the prediction, not 1% under.
    from onnx import TensorProto, helper

    from passes.onnx_import import import_model
    from passes.verify import runs_under_arena

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16, 64, 64) if op == "LRN" else (256, 512)).astype(np.float32)
    feeds, inputs = {"x": x}, [helper.make_tensor_value_info("x", 1, x.shape)]
    if op == "Where":
        feeds["c"], feeds["b"] = rng.random(x.shape) > 0.5, x[::-1].copy()
        inputs += [helper.make_tensor_value_info("c", TensorProto.BOOL, x.shape),
                   helper.make_tensor_value_info("b", 1, x.shape)]
        node = helper.make_node("Where", ["c", "x", "b"], ["y"])
    else:
        node = helper.make_node(op, ["x"], ["y"], **({"size": 5} if op == "LRN" else {"axis": 0}))
    model = helper.make_model(helper.make_graph([node], "one", inputs, [helper.make_tensor_value_info("y", 1, None)]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    lv = analyze(import_model(model))
    need = arena_need(lv, strategy=NEXT_POWER_OF_TWO)
    assert need == arena_need(lv, strategy=SAME_AS_REQUESTED)  # the lump cost kNextPowerOfTwo ~520 KiB more
    assert runs_under_arena(model, feeds, need, NEXT_POWER_OF_TWO) == (True, "")
    assert not runs_under_arena(model, feeds, int(need * 0.99), NEXT_POWER_OF_TWO)[0]
    requests = [e[2] for e in run_events(lv) if e[0] > 0 and isinstance(e[1], tuple) and e[1][0] == "scratch"]
    assert len(requests) == 2 and sum(requests) == int(lv.scratch.sum())


def test_wheres_output_is_made_after_its_two_branch_selections():
    # Where's CPU kernel selects X, then Y, into temporaries, then makes its output, which lies above
    # them in the region: their 512 bytes freed are a hole a larger buffer made next cannot use.
    # Replayed output first, the selections freed merged with the rest of the region: the least limit
    # (kNextPowerOfTwo) was predicted 512 bytes under ORT's, here and on the gpt2 fixture's loss (plan
    # --dim batch=2 --dim seq=16 --budget 100% --strategy none: 521824 predicted, ORT fails at 522080).
    from onnx import TensorProto, helper

    from passes.onnx_import import import_model
    from passes.verify import runs_under_arena

    rng = np.random.default_rng(0)
    feeds = {"c": rng.random(64) > 0.5, "x": rng.standard_normal(64).astype(np.float32),
             "b": rng.standard_normal(64).astype(np.float32),
             "big": rng.standard_normal((256, 64)).astype(np.float32)}
    inputs = [helper.make_tensor_value_info(k, TensorProto.BOOL if k == "c" else 1, v.shape) for k, v in feeds.items()]
    nodes = [helper.make_node("Where", ["c", "x", "b"], ["y"]), helper.make_node("Add", ["big", "y"], ["z"])]
    outputs = [helper.make_tensor_value_info(k, 1, None) for k in ("y", "z")]
    model = helper.make_model(helper.make_graph(nodes, "where", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    lv = analyze(import_model(model))
    need = arena_need(lv, strategy=NEXT_POWER_OF_TWO)
    assert need == 3 * 256 + feeds["big"].nbytes  # the output above both selections, z above it
    assert runs_under_arena(model, feeds, need, NEXT_POWER_OF_TWO) == (True, "")
    assert not runs_under_arena(model, feeds, need - 256, NEXT_POWER_OF_TWO)[0]
    assert arena_need(lv, strategy=SAME_AS_REQUESTED) == need  # a region per request: the order does not matter


@pytest.mark.parametrize("equation, shapes", [("ij,jk,kl->il", [(64, 128), (128, 96), (96, 80)]),
                                              ("ibj,bjk->bki", [(64, 16, 128), (16, 128, 64)])])
def test_an_einsums_temporaries_reach_the_arena_made_and_freed_in_turn(equation, shapes):
    # Einsum frees a pair's temporaries before the next and makes its output midway; replayed as one
    # lump after the output, ij,jk,kl->il was predicted at 120832 bytes and failed there (ORT: 135228),
    # ibj,bjk->bki at 2621440 (ORT: 1836544). In turn, each runs at the prediction, not 1% under.
    from onnx import helper

    from passes.onnx_import import import_model
    from passes.verify import runs_under_arena

    rng = np.random.default_rng(0)
    feeds = {f"x{i}": rng.standard_normal(shape).astype(np.float32) for i, shape in enumerate(shapes)}
    graph = helper.make_graph([helper.make_node("Einsum", list(feeds), ["y"], equation=equation)], "one",
                              [helper.make_tensor_value_info(k, 1, v.shape) for k, v in feeds.items()],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    lv = analyze(import_model(model))
    need = arena_need(lv, strategy=NEXT_POWER_OF_TWO)
    assert runs_under_arena(model, feeds, need, NEXT_POWER_OF_TWO) == (True, "")
    assert not runs_under_arena(model, feeds, int(need * 0.99), NEXT_POWER_OF_TWO)[0]
    events = run_events(lv)
    assert [e[0] for e in events].count(-1) == [e[0] for e in events].count(1)  # every request freed once


def test_scratch_a_kernel_mallocs_is_not_asked_of_the_cpu_arena():
    # ScatterElements copies its indices into a std::vector, not an arena chunk: counted, the least
    # limit was predicted at 1572864 bytes (kSameAsRequested) where ORT runs under its output's 524288.
    from onnx import TensorProto, helper

    from passes.onnx_import import import_model
    from passes.verify import runs_under_arena

    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((256, 512)).astype(np.float32),
             "i": rng.integers(0, 256, (256, 512)).astype(np.int64),
             "u": rng.standard_normal((256, 512)).astype(np.float32)}
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=0)
    graph = helper.make_graph([node], "one", [helper.make_tensor_value_info(k, TensorProto.INT64 if k == "i" else 1,
                                                                              v.shape) for k, v in feeds.items()],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    lv = analyze(import_model(model))
    assert lv.scratch.sum() == 8 * 256 * 512  # still real memory for the peak
    need = arena_need(lv, strategy=SAME_AS_REQUESTED)
    assert need == 256 * 512 * 4
    assert runs_under_arena(model, feeds, need, SAME_AS_REQUESTED) == (True, "")
    assert not runs_under_arena(model, feeds, int(need * 0.99), SAME_AS_REQUESTED)[0]
    assert arena_need(lv, strategy=SAME_AS_REQUESTED, on_cpu=False) > need  # off the CPU: still counted


def test_a_plan_solved_at_a_tighter_target_says_its_status_and_gap_are_for_that_target():
    """With --ort-arena the plan returned may come from a re-solve at a target under the user's
    budget (zoo:cnn at 85%: 492603 of 660270 bytes); its status, gap and --explain's over-budget
    steps are that solve's, and nothing said so. The note now names the target."""
    import math

    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph
    from passes.plan_model import plan_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    budget = math.ceil(analyze(g).peak_bytes * 0.8)
    pm = plan_graph(g, budget, strategy="greedy", ort_arena=_ScaledArena(1.15))
    target = pm.result.budget_bytes
    assert pm.ok and target < budget
    assert f"solved at a target of {target} bytes, under the budget of {budget}" in pm.result.note
    assert "are for that target" in pm.result.note
    assert "--explain's steps over budget unplanned" in pm.result.note  # the table's own words for them


class _OverByOneArena:
    """Stands in for passes.plan_model.OrtArena: a plan peaking at most ``fits`` bytes needs its
    peak; one above needs one byte over the budget (so the overshoot's scale is nil)."""

    label = "over-by-one"

    def __init__(self, fits: int, budget: int):
        self.fits, self.budget = fits, budget

    def need(self, planned) -> int:
        peak = analyze(planned).peak_bytes
        return peak if peak <= self.fits else self.budget + 1


def test_plan_graph_tightens_from_the_plans_peak_where_it_lies_under_the_target(monkeypatch):
    """A plan that fit the budget but not the arena peaked well under its target (zoo:cnn at 95%
    --ort-arena same-as-requested: 535684 bytes at a target of 580494); the next target was 1% under
    that target, so every re-solve returned that same plan and plan_graph failed with 'try a larger
    budget' at any --time-limit with --deterministic. The next target now starts from the plan's
    peak, and a plan the arena runs is found."""
    import math

    import passes.plan_model as pm_mod
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    own = analyze(g).peak_bytes
    budget, fits = math.ceil(own * 0.8), math.ceil(own * 0.6)
    real = pm_mod.solve
    targets = []

    def solve(problem, target, strategy, options, **kw):
        # a solver whose plans land well under the target it is given
        targets.append(target)
        return replace(real(problem, int(target * 0.85), strategy, options, **kw), budget_bytes=target)

    monkeypatch.setattr(pm_mod, "solve", solve)
    got = pm_mod.plan_graph(g, budget, strategy="greedy", ort_arena=_OverByOneArena(fits, budget))
    assert got.ok, (targets, got.result.note)
    assert got.peak_bytes <= fits and got.arena_need <= budget


def test_ort_arena_replays_the_planned_graph_as_ort_runs_it():
    """plan --ort-arena replayed a planned graph read back with its shape subgraphs folded, the
    ordering edges' Size nodes gone, which ORT runs under the planned session options (zoo:gpt at
    70%, kNextPowerOfTwo on the CPU: a need of 687240 bytes, 672188 as ORT runs it): the replay must
    read it as ``memplan verify`` does."""
    import math

    from passes.autodiff import training_graph
    from passes.onnx_export import export_model
    from passes.onnx_import import import_model, load_graph
    from passes.plan_model import OrtArena, plan_graph
    from planner.arena import NEXT_POWER_OF_TWO, arena_need
    from planner.cpsat import PlannerOptions
    from planner.liveness import MemoryModel

    g = training_graph(load_graph("zoo:gpt"))
    pm = plan_graph(g, math.ceil(analyze(g).peak_bytes * 0.7), options=PlannerOptions(time_limit=5, workers=1))
    assert pm.ok and any(n.op_type == "Size" for n in pm.planned.nodes)  # the ordering edges' Size nodes
    as_run = analyze(import_model(export_model(pm.planned), fold=False), model=MemoryModel(host_copies_resident=True))
    assert OrtArena(NEXT_POWER_OF_TWO, device_inputs=False).need(pm.planned) \
        == arena_need(as_run, strategy=NEXT_POWER_OF_TWO, on_cpu=True)


def _equal_free_chunks_in_two_regions():
    """A 768 KiB region keeps a 256 KiB chunk, a 512 KiB region is freed: two free 512 KiB chunks; the
    arena reuses the one at the lower address, and only if that is the 512 KiB region does the first
    region come free whole for the last, 768 KiB request."""
    return [(1, "a", 768 * KIB), (1, "b", 512 * KIB), (-1, "a", 0), (1, "c", 256 * KIB), (-1, "b", 0),
            (1, "d", 512 * KIB), (-1, "c", 0), (1, "e", 768 * KIB)]


def test_where_glibc_places_a_region_decides_which_equal_free_chunk_is_reused():
    events = _equal_free_chunks_in_two_regions()
    # at glibc's first threshold (128 KiB) both regions are mapped, the later one lower: d takes the
    # 512 KiB region and e the first one, freed whole; once the process freed a mapped block of 1 MiB
    # the threshold is 1 MiB and both come from the heap, the first one lower: d splits it, e needs a third
    assert replay(events, 1280 * KIB, strategy=SAME_AS_REQUESTED)[0]
    assert not replay(events, 1280 * KIB, strategy=SAME_AS_REQUESTED, mmap_threshold=MIB)[0]
    assert replay(events, 2048 * KIB, strategy=SAME_AS_REQUESTED, mmap_threshold=MIB)[0]


def test_the_least_limit_holds_whatever_glibcs_mmap_threshold():
    events = _equal_free_chunks_in_two_regions()
    # every threshold that lays the regions out differently: 128 KiB, and just above 256, 512 and 768 KiB
    assert mmap_thresholds(events, strategy=SAME_AS_REQUESTED) == [
        128 * KIB, 256 * KIB + 256, 512 * KIB + 256, 768 * KIB + 256]
    assert least_limit(events, strategy=SAME_AS_REQUESTED) == 2048 * KIB  # 1280 KiB at 128 KiB alone
    assert least_limit(events, strategy=SAME_AS_REQUESTED, thresholds=[128 * KIB]) == 1280 * KIB
    # the ladder's steps count too; a region of 32 MiB or more is mapped whatever was freed before
    big = [(1, "a", 32 * MIB), (1, "b", 200 * KIB)]
    assert mmap_thresholds(big, strategy=NEXT_POWER_OF_TWO) == [128 * KIB, 200 * KIB + 256] + [
        (MIB << k) + 256 for k in range(5)]


def test_plan_graph_bisects_under_a_refused_plans_peak_not_its_target(monkeypatch):
    """A target between a refused plan's peak and the target it was found at admits that plan at its
    cost, and a solve returns it again (zoo:resnet?batch=32 at 70% --ort-arena same-as-requested
    --time-limit 10 --deterministic: the 7368968-byte plan the arena refused, found at 7723767 bytes,
    came back at 7470346 and was replayed again). The bisection now stays under the refused peak."""
    import math

    import passes.plan_model as pm_mod
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    own = analyze(g).peak_bytes
    budget, fits = math.ceil(own * 0.8), math.ceil(own * 0.6)
    real = pm_mod.solve
    solves = []  # (target, the problem's peak of the plan found)

    def solve(problem, target, strategy, options, **kw):
        # a solver whose plans land well under the target it is given
        res = replace(real(problem, int(target * 0.85), strategy, options, **kw), budget_bytes=target)
        solves.append((target, res.peak_bytes if res.plan is not None else None))
        return res

    monkeypatch.setattr(pm_mod, "solve", solve)
    got = pm_mod.plan_graph(g, budget, strategy="greedy", ort_arena=_ThresholdArena(fits))
    assert got.ok and got.arena_need <= budget
    refused = [peak for _, peak in solves if peak is not None and peak > fits]
    assert refused  # the arena refused a plan, so plan_graph bisected
    for i, (target, _) in enumerate(solves):
        before = [peak for _, peak in solves[:i] if peak is not None and peak > fits]
        assert not before or target < min(before), solves


def test_plan_graph_tightens_from_the_rewritten_peak_where_the_problem_says_more(monkeypatch):
    """The problem's peak of a plan can lie well above its rewritten graph's, which the arena replays
    (zoo:resnet?batch=32 at 70% --ort-arena same-as-requested: 8345096 bytes against 7893160); the
    first re-solve's target was scaled from the problem's figure and returned the same graph, whose
    replay needed the same arena. It now starts from the rewritten peak: no graph the arena refused is
    replayed again."""
    import math

    import passes.plan_model as pm_mod
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    own = analyze(g).peak_bytes
    budget, fits = math.ceil(own * 0.8), math.ceil(own * 0.6)
    real = pm_mod.solve

    def solve(problem, target, strategy, options, **kw):
        # plans land well under the target, and the problem says they peak at it
        res = real(problem, int(target * 0.85), strategy, options, **kw)
        return replace(res, budget_bytes=target, peak_bytes=target) if res.plan is not None else res

    class Arena(_OverByOneArena):
        def __init__(self, fits: int):
            super().__init__(fits, budget)
            self.refused: list[str] = []

        def need(self, planned) -> int:
            need = super().need(planned)
            if need > self.budget:
                self.refused.append(pm_mod.fingerprint(planned))
            return need

    monkeypatch.setattr(pm_mod, "solve", solve)
    arena = Arena(fits)
    got = pm_mod.plan_graph(g, budget, strategy="greedy", ort_arena=arena)
    assert got.ok and got.arena_need <= budget
    assert arena.refused and len(set(arena.refused)) == len(arena.refused)


def test_plan_graph_re_solves_halve_the_given_orders_least_time_too(monkeypatch):
    """Each re-solve of plan_graph gets half the time of the one before, but the given node order's
    solve in it got at least a whole second whatever that limit (zoo:gpt at 70% --ort-arena
    same-as-requested --deterministic: re-solves of 0.62, 0.31 and 0.16 s took 10-18 wall s each,
    nearly all of it there). That least is halved with the limit now: the seconds allotted to the
    searches of all the re-solves stay within the first solve's limit and that least."""
    import math

    import passes.plan_model as pm_mod
    import planner.planning as planning
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph
    from planner.cpsat import PlannerOptions

    g = training_graph(load_graph("zoo:gpt?layers=2"))  # the smallest gpt whose re-solves search the given order
    budget = math.ceil(analyze(g).peak_bytes * 0.7)
    allotted: list[list[float]] = []  # per solve, the limits of its searches (planning._solve_cpsat)
    real_solve, real_search = pm_mod.solve, planning._solve_cpsat

    def solve(problem, target, strategy, options, **kw):
        allotted.append([])
        return real_solve(problem, target, strategy, options, **kw)

    def search(problem, budget, opt, *a, **kw):
        allotted[-1].append(opt.time_limit)
        return real_search(problem, budget, opt, *a, **kw)

    monkeypatch.setattr(pm_mod, "solve", solve)
    monkeypatch.setattr(planning, "_solve_cpsat", search)
    options = PlannerOptions(time_limit=0.2, work_limit=True, workers=1)
    got = pm_mod.plan_graph(g, budget, options=options, ort_arena=_OverByOneArena(0, budget))
    assert not got.ok  # the stand-in arena refuses every plan: plan_graph re-solves tighter
    re_solves = allotted[1:]
    assert sum(len(s) > 1 for s in re_solves) >= 2, allotted  # re-solves that searched the given order too
    # halved each time, all the re-solves together get at most what the first one may
    assert sum(map(sum, re_solves)) <= options.time_limit + options.least_search_s, allotted


def test_plan_graph_stops_re_solving_where_even_the_least_peak_plan_would_overshoot_the_arena(monkeypatch):
    """zoo:gpt at 70% --ort-arena same-as-requested --time-limit 10 --deterministic: the plan found
    needed 1.45x its peak of arena, a plan at the least peak any reaches (229428 bytes, the problem's
    floor) could need 1.12x at most, and six re-solves, two under that floor, found no plan. No
    target goes under the floor now, and once a tighter re-solve finds no plan where the floor at
    the least ratio seen overshoots too, plan_graph stops, saying the estimate and the budget to try."""
    import math

    import passes.plan_model as pm_mod
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    budget = math.ceil(analyze(g).peak_bytes * 0.8)
    real, targets = pm_mod.solve, []

    def solve(problem, target, strategy, options, **kw):
        targets.append(target)
        return real(problem, target, strategy, options, **kw)

    monkeypatch.setattr(pm_mod, "solve", solve)
    floor = pm_mod.lower_graph(g)[0].order_free_floor
    arena = _ScaledArena(10.0)
    failed = pm_mod.plan_graph(g, budget, strategy="greedy", ort_arena=arena)
    assert not failed.ok and failed.result.status == "timeout"
    assert min(targets) >= floor, (targets, floor)
    assert f"the plans found fit the budget but not ORT's arena under it: the least arena need of the plans found " \
           f"was {min(arena.needs)} bytes" in failed.result.note
    assert f"at least 10.00x their peak, and no plan peaks under {floor} bytes: at that ratio (an estimate) any " \
           f"needs about {floor * 10} bytes, and a tighter solve found no plan, so memplan stopped re-solving" \
           in failed.result.note
    targets.clear()
    fits = math.ceil(analyze(g).peak_bytes * 0.6)
    assert pm_mod.plan_graph(g, budget, strategy="greedy", ort_arena=_ThresholdArena(fits)).ok
    assert min(targets) >= floor, (targets, floor)


def test_the_arena_estimate_stops_re_solving_only_well_over_the_budget():
    """An estimate a few percent over the budget is within what the arena's ratio varies by from plan
    to plan (zoo:cnn at 95%: 1.30x, 1.60x, 1.43x): re-solving goes on there."""
    from passes.plan_model import OUT_OF_REACH_MARGIN, _out_of_reach

    assert not _out_of_reach(1000, None, 1000)
    assert not _out_of_reach(1000, 1.05, 1000)  # 5% over: goes on
    assert _out_of_reach(1000, 1.0 + 2 * OUT_OF_REACH_MARGIN, 1000)
    assert not _out_of_reach(1000, 1.0 + OUT_OF_REACH_MARGIN / 2, 1000)


def test_a_re_solve_after_the_arena_refused_a_plan_starts_from_that_plan(monkeypatch):
    """zoo:cnn at 95% --ort-arena same-as-requested --time-limit 10 --deterministic: the 68% target's
    +25.72% plan, in a reverse walk's node order, overshot ORT's arena, and the re-solves below it
    (1.25 s and 0.625 s) started from scratch: the walk's own +301.24% plans stood. A re-solve after
    the arena refused a plan now starts from it, in its node order, as one after a rewrite's
    overshoot does (+26.93% there)."""
    import math

    import passes.plan_model as plan_model
    from passes.autodiff import training_graph
    from passes.onnx_import import load_graph

    g = training_graph(load_graph("zoo:gpt?batch=8"))
    own = analyze(g).peak_bytes
    budget, fits = math.ceil(own * 0.8), math.ceil(own * 0.6)
    real, calls = plan_model.solve, []

    def solve(problem, target, strategy, options, start=None):
        res = real(problem, target, strategy, options, start=start)
        calls.append((start, res))
        return res

    monkeypatch.setattr(plan_model, "solve", solve)
    arena = _ThresholdArena(fits)
    pm = plan_model.plan_graph(g, budget, strategy="greedy", ort_arena=arena)
    assert pm.ok, pm.result.note
    refused = [res for _, res in calls if res.plan is not None and res.peak_bytes > fits]
    assert refused  # the first plan fit the budget, not the arena
    for (_, before), (start, _) in zip(calls, calls[1:]):
        if before in refused:
            assert start is not None and start.plan is before.plan  # the re-solve after it started from it
