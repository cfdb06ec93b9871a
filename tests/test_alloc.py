"""Static arena allocation: lower bound, greedy, exact search, validator, CSV, ``memplan alloc``."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as hst

import cli
from planner import alloc
from planner.alloc import AllocStatus, Buffer, PlacementError, greedy, lower_bound, solve, validate
from planner.alloc_cpsat import cpsat_pack
from planner.alloc_io import parse_csv, read_csv, solution_csv
from planner.alloc_search import Restarts, SearchStatus, independent_blocks, reduce_problem
from planner.errors import ModelImportError
from tests.helpers import ROOT

EXAMPLE = [
    Buffer("b1", 0, 3, 4), Buffer("b2", 3, 9, 4), Buffer("b3", 0, 9, 4),
    Buffer("b4", 9, 21, 4), Buffer("b5", 0, 21, 4),
]


def brute_force_height(buffers: list[Buffer]) -> int:
    """Least arena height by trying every aligned offset (tiny instances only)."""
    n = len(buffers)
    live = [[j for j in range(n) if j != i and buffers[i].lower < buffers[j].upper
             and buffers[j].lower < buffers[i].upper] for i in range(n)]

    def fits(cap: int) -> bool:
        off: list[int | None] = [None] * n

        def place(k: int) -> bool:
            if k == n:
                return True
            b = buffers[k]
            for o in range(0, cap - b.size + 1, b.alignment):
                if all(off[j] is None or o + b.size <= off[j] or off[j] + buffers[j].size <= o for j in live[k]):
                    off[k] = o
                    if place(k + 1):
                        return True
                    off[k] = None
            return False

        return place(0)

    cap = lower_bound(buffers)
    while not fits(cap):
        cap += 1
    return cap


@hst.composite
def tiny_problems(draw, max_n: int = 6, aligned: bool = True) -> list[Buffer]:
    n = draw(hst.integers(1, max_n))
    out = []
    for i in range(n):
        lower = draw(hst.integers(0, 5))
        upper = draw(hst.integers(lower + 1, 7))
        alignment = draw(hst.sampled_from([1, 1, 2, 4])) if aligned else 1
        out.append(Buffer(f"b{i}", lower, upper, draw(hst.integers(1, 5)), alignment))
    return out


# -- lower bound, validator ----------------------------------------------------------------------
def test_lower_bound_counts_half_open_lifespans():
    assert lower_bound(EXAMPLE) == 12
    # [0,3) and [3,9) only touch: they never live together
    assert lower_bound([Buffer("a", 0, 3, 5), Buffer("b", 3, 9, 7)]) == 7
    assert lower_bound([Buffer("a", 0, 4, 5), Buffer("b", 3, 9, 7)]) == 12


def test_validate_rejects_overlap_capacity_and_misalignment():
    a, b = Buffer("a", 0, 4, 4), Buffer("b", 2, 6, 4, alignment=4)
    validate([a, b], [0, 4], 8)
    with pytest.raises(PlacementError, match="overlap"):
        validate([a, b], [0, 0], 8)
    with pytest.raises(PlacementError, match="leaves the arena"):
        validate([a, b], [0, 4], 7)
    with pytest.raises(PlacementError, match="alignment"):
        validate([a, b], [0, 6], 16)
    validate([a, Buffer("c", 4, 6, 4)], [0, 0], 4)  # touching lifespans may share bytes


def all_pairs_overlaps(buffers: list[Buffer], offsets: list[int]) -> set[tuple[int, int]]:
    """Every pair (i < j) that shares bytes while both are live: the check validate made before
    its sweep (an O(n^2) loop), kept as the reference."""
    return {
        (i, j) for i, a in enumerate(buffers) for j in range(i + 1, len(buffers))
        if a.lower < buffers[j].upper and buffers[j].lower < a.upper and a.size > 0 and buffers[j].size > 0
        and offsets[i] < offsets[j] + buffers[j].size and offsets[j] < offsets[i] + a.size
    }


@hst.composite
def placements(draw) -> tuple[list[Buffer], list[int]]:
    """Buffers over few times (touching lifespans are common) with sizes from 0, at few offsets."""
    n = draw(hst.integers(1, 12))
    buffers, offsets = [], []
    for i in range(n):
        lower = draw(hst.integers(0, 6))
        buffers.append(Buffer(f"b{i}", lower, draw(hst.integers(lower + 1, 8)), draw(hst.integers(0, 4))))
        offsets.append(draw(hst.integers(0, 10)))
    return buffers, offsets


def check_against_all_pairs(buffers: list[Buffer], offsets: list[int]) -> None:
    clashes = all_pairs_overlaps(buffers, offsets)
    if not clashes:
        validate(buffers, offsets)
        return
    with pytest.raises(PlacementError, match="overlap while both are live") as err:
        validate(buffers, offsets)
    named = {i for i, b in enumerate(buffers) if repr(b.id) in str(err.value)}
    assert tuple(sorted(named)) in clashes  # the pair it names is one that clashes


@settings(max_examples=400, deadline=None)
@given(placements())
def test_validate_sweep_finds_what_the_all_pairs_check_finds(problem):
    check_against_all_pairs(*problem)


@pytest.mark.parametrize("seed", range(6))
def test_validate_sweep_on_larger_placements(seed):
    """Greedy placements of 300 buffers (valid), then one offset moved onto another live buffer,
    or next to it (touching bytes: still valid)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lower = rng.integers(0, 60, 300)
    buffers = [Buffer(f"b{i}", int(lo), int(lo + rng.integers(1, 12)), int(rng.integers(0, 9)))
               for i, lo in enumerate(lower)]
    offsets = list(greedy(buffers).offsets)
    check_against_all_pairs(buffers, offsets)
    for _ in range(20):
        i, j = rng.choice(300, 2, replace=False).tolist()
        moved = list(offsets)
        moved[i] = offsets[j] + int(rng.integers(-2, 3)) * buffers[j].size // 2
        moved[i] = max(moved[i], 0)
        check_against_all_pairs(buffers, moved)


# -- solving -------------------------------------------------------------------------------------
def test_example_fits_capacity_12():
    result = solve(EXAMPLE, capacity=12)
    assert result.status is AllocStatus.OPTIMAL and result.height == 12
    validate(EXAMPLE, result.offsets, 12)


def test_capacity_below_lower_bound_is_infeasible_with_the_bound():
    result = solve(EXAMPLE, capacity=11)
    assert result.status is AllocStatus.INFEASIBLE and result.offsets is None
    assert result.lower_bound == 12


#: Every time step is full at 4 bytes, yet no arena of 4 exists: the pairs of 1-byte buffers
#: alive over [2, 5) leave the 2-byte buffers of [4, 7) no contiguous room.
FRAGMENTED = [
    Buffer("a", 0, 3, 2), Buffer("b", 0, 2, 2), Buffer("c", 2, 4, 1), Buffer("d", 2, 5, 1),
    Buffer("e", 3, 4, 1), Buffer("f", 3, 5, 1), Buffer("g", 4, 7, 2), Buffer("h", 5, 7, 2),
]


def test_proven_infeasible_above_the_lower_bound():
    lb, opt = lower_bound(FRAGMENTED), brute_force_height(FRAGMENTED)
    assert (lb, opt) == (4, 5)
    assert solve(FRAGMENTED, capacity=4).status is AllocStatus.INFEASIBLE
    red = reduce_problem(*zip(*[(b.lower, b.upper, b.size, b.alignment) for b in FRAGMENTED]))
    assert Restarts(red, 4).run(10**6, float("inf"))[0] is SearchStatus.INFEASIBLE
    result = solve(FRAGMENTED, minimize=True)
    assert result.status is AllocStatus.OPTIMAL and result.height == 5
    validate(FRAGMENTED, result.offsets)


def test_an_optimal_placement_above_the_lower_bound_has_no_gap(tmp_path):
    """alloc --minimize --json said "optimal" with "gap": 0.1 where proven_bound equalled the height
    (11 over a live lower bound of 10): the gap is now measured against the proven bound."""
    result = solve(FRAGMENTED, minimize=True)
    assert result.status is AllocStatus.OPTIMAL and result.height == 5 > result.lower_bound
    assert result.proven_bound == 5 and result.gap == 0.0
    csv = tmp_path / "p.csv"
    csv.write_text("id,lower,upper,size,alignment\na,0,10,3,4\nb,0,5,5,8\nc,5,10,6,8\nd,2,7,1,1\n")
    out = CliRunner().invoke(cli.main, ["alloc", str(csv), "--minimize", "--json"])
    obj = json.loads(out.output)
    assert out.exit_code == 0 and obj["status"] == "optimal" and obj["height"] == obj["proven_bound"] == 11
    assert obj["lower_bound"] == 10 and obj["gap"] == 0.0


def test_empty_buffers_and_problem():
    assert solve([]).height == 0
    result = solve([Buffer("z", 0, 5, 0), Buffer("a", 0, 5, 8)], capacity=8)
    assert result.height == 8
    validate([Buffer("z", 0, 5, 0), Buffer("a", 0, 5, 8)], result.offsets, 8)
    # an empty buffer holds no bytes: inside a live one it overlaps nothing
    validate([Buffer("z", 0, 5, 0), Buffer("a", 0, 5, 8)], (4, 0), 8)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tiny_problems())
def test_minimize_matches_brute_force(buffers):
    result = solve(buffers, minimize=True, time_limit=10)
    validate(buffers, result.offsets)
    assert result.height == brute_force_height(buffers)
    assert result.status is AllocStatus.OPTIMAL


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tiny_problems())
def test_skyline_search_alone_decides_exactly(buffers):
    """The branch and bound by itself (no greedy, no CP-SAT) finds the optimum and proves below it."""
    opt = brute_force_height(buffers)
    red = reduce_problem([b.lower for b in buffers], [b.upper for b in buffers],
                         [b.size for b in buffers], [b.alignment for b in buffers])
    status, units = Restarts(red, opt // red.unit).run(10**7, float("inf"))
    assert status is SearchStatus.FOUND
    validate(buffers, (units * red.unit).tolist(), opt)
    status, _ = Restarts(red, (opt - 1) // red.unit).run(10**7, float("inf"))
    assert status is SearchStatus.INFEASIBLE


@settings(max_examples=40, deadline=None, derandomize=True)
@given(tiny_problems(max_n=8))
def test_greedy_and_capacity_results_validate(buffers):
    lb = lower_bound(buffers)
    g = greedy(buffers)
    validate(buffers, g.offsets)
    assert g.height >= lb
    result = solve(buffers, capacity=g.height + 3)
    validate(buffers, result.offsets, g.height + 3)
    assert lb <= result.height <= g.height + 3


def test_problem_too_large_for_exact_search_keeps_greedy(monkeypatch):
    monkeypatch.setattr(alloc, "EXACT_MAX_PAIRS", 0)
    result = solve(FRAGMENTED, minimize=True)
    validate(FRAGMENTED, result.offsets)
    assert result.method == "greedy" and result.height == greedy(FRAGMENTED).height
    assert solve(FRAGMENTED, capacity=4).status is AllocStatus.TIMEOUT  # unknown, not infeasible
    assert result.stats["too_large_blocks"] == 1 and result.status is AllocStatus.FEASIBLE


def test_cpsat_member_finds_and_refutes():
    red = reduce_problem([0, 1, 0, 2], [2, 3, 3, 3], [2, 2, 2, 3], [1, 1, 1, 1])
    status, off = cpsat_pack(red, 7, det_time=1.0, wall_time=10.0)
    assert status is SearchStatus.FOUND and (off + red.size).max() <= 7
    status, _ = cpsat_pack(red, 6, det_time=1.0, wall_time=10.0)
    assert status is SearchStatus.INFEASIBLE


def test_independent_blocks_split_at_time_cuts():
    red = reduce_problem([0, 1, 5, 6], [2, 3, 7, 8], [1, 1, 1, 1], [1, 1, 1, 1])
    assert [b.tolist() for b in independent_blocks(red)] == [[0, 1], [2, 3]]


def test_same_input_same_offsets():
    buffers = [Buffer(f"b{i}", i % 7, i % 7 + 1 + i % 5, 1 + (i * 37) % 11) for i in range(40)]
    first = solve(buffers, minimize=True, time_limit=30)
    second = solve(buffers, minimize=True, time_limit=30)
    assert first.offsets == second.offsets and first.status is second.status


@pytest.mark.parametrize("name", ["A", "G"])
def test_challenging_instance_at_capacity(benchmarks_dir, name):
    buffers, _ = read_csv(benchmarks_dir / "minimalloc" / "challenging" / f"{name}.1048576.csv")
    result = solve(buffers, capacity=1048576, time_limit=60)
    assert result.status is AllocStatus.OPTIMAL  # LB = capacity: zero slack
    assert result.greedy_height > 1048576  # greedy alone misses it
    validate(buffers, result.offsets, 1048576)


def test_challenging_c_minimizes_to_its_lower_bound(benchmarks_dir):
    buffers, _ = read_csv(benchmarks_dir / "minimalloc" / "challenging" / "C.1048576.csv")
    result = solve(buffers, minimize=True, time_limit=60)
    assert result.height == result.lower_bound == 1039360
    assert result.status is AllocStatus.OPTIMAL
    validate(buffers, result.offsets)


def test_on_the_work_clock_the_placement_is_the_same_however_slow_the_machine(benchmarks_dir, monkeypatch):
    """memplan plan --arena --deterministic: the placement's limit counts search nodes and CP-SAT's
    deterministic seconds (planner/clock.py). On the wall clock a loaded machine's placement of the
    gpt2 fixture went over the budget where an idle one's fit (stop 51's determinism audit)."""
    import itertools

    from planner import clock

    buffers, _ = read_csv(benchmarks_dir / "minimalloc" / "challenging" / "D.1048576.csv")
    with clock.work_clock():
        calm = solve(buffers, minimize=True, time_limit=0.5)
    ticks = itertools.count(0.0, 1000.0)  # every reading of the wall 1000 s after the last
    monkeypatch.setattr(clock, "_wall", lambda: next(ticks))
    monkeypatch.setattr(alloc.time, "monotonic", lambda: next(ticks))
    with clock.work_clock():
        crawled = solve(buffers, minimize=True, time_limit=0.5)
    assert crawled.offsets == calm.offsets and crawled.status is calm.status and calm.stats["search_nodes"] > 0
    validate(buffers, calm.offsets)


def test_greedy_orders_after_the_first_stop_at_a_work_clock_deadline():
    """The greedy's orders each take O(n^2): 20,000 buffers spent 14 s of a --time-limit 3 in all
    four. The first always runs (an answer is needed); the next stops where the clock passes the
    limit, here halfway through the second order on the work clock (no timing involved)."""
    import numpy as np

    from planner import alloc_greedy, clock

    rng = np.random.default_rng(0)
    n = 300
    lower = rng.integers(0, 200, n)
    buffers = [Buffer(f"b{i}", int(lo), int(lo + rng.integers(1, 30)), int(rng.integers(1, 20)))
               for i, lo in enumerate(lower)]
    one_order = n * (alloc_greedy.STEP_SECONDS + n * alloc_greedy.BUFFER_SECONDS)  # what an order charges
    with clock.work_clock():
        full = solve(buffers, minimize=True, time_limit=1000 * one_order)
        assert clock.now() >= len(alloc_greedy.GREEDY_ORDERS) * one_order * 0.999
    with clock.work_clock():
        short = solve(buffers, minimize=True, time_limit=1.5 * one_order)
        spent = clock.now()
    sizes = np.array([b.size for b in buffers])
    red = reduce_problem([b.lower for b in buffers], [b.upper for b in buffers], sizes, np.ones(n, np.int64))
    greedy_heights = [int((alloc_greedy.greedy_offsets(red.first, red.stop, red.size, red.align, o) + red.size).max())
                      for o in alloc_greedy.GREEDY_ORDERS]
    assert short.stats["blocks"] == 1 and min(greedy_heights) < greedy_heights[0]  # a later order wins
    assert full.greedy_height == min(greedy_heights) * red.unit
    assert short.greedy_height == greedy_heights[0] * red.unit  # the second order was cut short
    # the clock stopped it within one reading of the deadline (CLOCK_STEPS placements)
    step = alloc_greedy.STEP_SECONDS + n * alloc_greedy.BUFFER_SECONDS
    assert 1.5 * one_order <= spent <= 1.5 * one_order + alloc_greedy.CLOCK_STEPS * step + 1e-9
    validate(buffers, short.offsets)


# -- CSV -----------------------------------------------------------------------------------------
def test_csv_aliases_inclusive_end_and_round_trip():
    buffers, offsets = parse_csv("buffer,start,end,size,alignment\nx,0,2,4,2\ny,3,3,8,1\n")
    assert offsets is None
    assert buffers == [Buffer("x", 0, 3, 4, 2), Buffer("y", 3, 4, 8, 1)]
    again, offs = parse_csv(solution_csv(buffers, [0, 4]))
    assert again == buffers and offs == [0, 4]


@pytest.mark.parametrize("text, message", [
    ("", "empty file"),
    ("id,lower,size\nx,0,4\n", "missing column"),
    ("id,lower,upper,size\nx,0,3,four\n", "line 2: size 'four' is not an integer"),
    # int() reads these too; the format is plain digits (fuzzed, stop 49)
    ("id,lower,upper,size\nx,0,3,1_000\n", "line 2: size '1_000' is not an integer"),
    ("id,lower,upper,size\nx,0,3,\u0661\u0662\n", "line 2: size '\u0661\u0662' is not an integer"),
    ("id,lower,upper,size\nx,0,3\n", "line 2: 3 fields"),
    ("id,lower,upper,size\nx,0,3,-4\n", "line 2: buffer 'x': size -4 is negative"),
    ("id,lower,upper,size\nx,3,3,4\n", "line 2: buffer 'x': upper 3 <= lower 3"),
    ("id,lower,upper,size\nx,0,3,4\nx,1,2,4\n", "appears twice"),
    ("id,lower,upper,size,gaps\nx,0,3,4,1-2\n", "gaps are not supported"),
    # the first of two columns for one field was taken, the other silently dropped
    ("id,lower,upper,size,size\nx,0,3,4,8\n", "column 'size' appears twice"),
    ("id,lower,start,upper,size\nx,0,5,9,4\n", "columns 'lower' and 'start' both give the lower"),
    ("id,lower,upper,end,size\nx,0,3,9,4\n", "columns 'upper' and 'end' both give the upper"),
])
def test_csv_errors_name_the_problem(text, message):
    with pytest.raises(ModelImportError, match=message):
        parse_csv(text, "p.csv")


def test_sizes_past_64_bit_sums_are_refused():
    """8193 overlapping buffers of 2**50 bytes (each within the per-value limit) wrapped the lower
    bound's int64 sum: alloc exited 1 with 'offset -9223372036854775808 leaves the arena'."""
    text = "id,lower,upper,size\n" + "".join(f"b{i},0,10,{2**50}\n" for i in range(8193))
    with pytest.raises(ModelImportError, match=r"p.csv: the buffers take \d+ bytes in all .* over the 2\*\*60"):
        parse_csv(text, "p.csv")
    with pytest.raises(ModelImportError, match="over the 2"):
        solve([Buffer("a", 0, 10, 2**50), Buffer("b", 0, 10, 2**60)])


# -- CLI -----------------------------------------------------------------------------------------
def _run(args):
    return CliRunner().invoke(cli.main, args)


@pytest.fixture
def example_csv(tmp_path):
    path = tmp_path / "input.12.csv"
    path.write_text("id,lower,upper,size\nb1,0,3,4\nb2,3,9,4\nb3,0,9,4\nb4,9,21,4\nb5,0,21,4\n")
    return path


def test_cli_writes_a_valid_solution(example_csv, tmp_path):
    out = tmp_path / "solution.csv"
    res = _run(["alloc", str(example_csv), "--capacity", "12", "-o", str(out)])
    assert res.exit_code == 0, res.stderr
    buffers, offsets = read_csv(out)
    validate(buffers, offsets, 12)
    assert "optimal" in res.stdout


def test_cli_json_is_one_object(example_csv):
    res = _run(["alloc", str(example_csv), "--json"])
    assert res.exit_code == 0
    obj = json.loads(res.stdout)
    assert obj["height"] == obj["lower_bound"] == 12 and obj["status"] == "optimal"
    validate(EXAMPLE, [obj["offsets"][b.id] for b in EXAMPLE], 12)


@pytest.mark.parametrize("body, code, message", [
    ("id,lower,upper,size\nb1,0,3,x\n", 3, "size 'x' is not an integer"),
    ("id,lower,upper,size\nb1,0,3,-4\n", 3, "size -4 is negative"),
    ("id,lower,upper,size\nb1,5,2,4\n", 3, "upper 2 <= lower 5"),
    ("id,lower,upper,size\nb1,0,3,4\nb2,0,3,8\n", 1, "lower bound is 12 bytes"),
])
def test_cli_failures_are_one_line_and_write_nothing(tmp_path, body, code, message):
    problem, out = tmp_path / "p.csv", tmp_path / "out.csv"
    problem.write_text(body)
    res = _run(["alloc", str(problem), "--capacity", "11", "-o", str(out)])
    assert res.exit_code == code
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "Traceback" not in res.stderr
    assert not out.exists()


def test_cli_deterministic_gives_the_same_file_however_slow_the_machine(benchmarks_dir, tmp_path, monkeypatch):
    """alloc had no --deterministic: its limit ran on the wall clock only, and challenging D at
    --time-limit 4 wrote height 1075200 alone and 1105920 with two more runs beside it."""
    import itertools

    from planner import clock

    problem = benchmarks_dir / "minimalloc" / "challenging" / "D.1048576.csv"
    args = ["alloc", str(problem), "--time-limit", "0.5", "--deterministic", "--json", "-o"]
    calm = _run([*args, str(tmp_path / "calm.csv")])
    ticks = itertools.count(0.0, 1000.0)  # every reading of the wall 1000 s after the last
    monkeypatch.setattr(clock, "_wall", lambda: next(ticks))
    monkeypatch.setattr(alloc.time, "monotonic", lambda: next(ticks))
    crawled = _run([*args, str(tmp_path / "crawled.csv")])
    assert calm.exit_code == crawled.exit_code == 0, calm.stderr + crawled.stderr
    assert (tmp_path / "calm.csv").read_bytes() == (tmp_path / "crawled.csv").read_bytes()
    obj = json.loads(calm.stdout)
    assert obj["deterministic"] is True and obj["search_nodes"] > 0
    buffers, offsets = read_csv(tmp_path / "calm.csv")
    validate(buffers, offsets)


def test_cli_table_says_why_a_feasible_height_is_not_proven(benchmarks_dir):
    """A time-limited --minimize and a --capacity decision both printed just 'feasible': nothing
    said the limit stopped the search, or that --capacity asks for any fit, not the least."""
    problem = str(benchmarks_dir / "minimalloc" / "challenging" / "D.1048576.csv")
    limited = _run(["alloc", problem, "--time-limit", "0"])
    assert limited.exit_code == 0 and "feasible" in limited.stdout
    assert "not ruled out in --time-limit 0 s; raise it" in limited.stdout
    fits = _run(["alloc", problem, "--capacity", "2MiB", "--time-limit", "0"])
    assert fits.exit_code == 0 and "fits --capacity; add --minimize" in fits.stdout


def test_cli_refuses_a_problem_with_offsets(tmp_path):
    """An offset column (MiniMalloc's fixed offsets, or a solution file given back) was read and
    dropped: b1 asked for offset 8 and was placed at 0, exit 0."""
    problem, out = tmp_path / "p.csv", tmp_path / "out.csv"
    problem.write_text("id,lower,upper,size,offset\nb1,0,3,4,8\nb2,0,3,4,0\n")
    res = _run(["alloc", str(problem), "-o", str(out)])
    assert res.exit_code == 3 and "offset column" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()


def test_cli_json_prints_its_object_when_no_placement_fits(tmp_path):
    """--json printed nothing on stdout for an infeasible capacity (exit 1), where plan --json
    prints an infeasible plan's object: a CI job reading stdout got no JSON."""
    problem, out = tmp_path / "p.csv", tmp_path / "out.csv"
    problem.write_text("id,lower,upper,size\nb1,0,3,4\nb2,0,3,8\n")
    res = _run(["alloc", str(problem), "--capacity", "11", "-o", str(out), "--json"])
    assert res.exit_code == 1
    obj = json.loads(res.stdout)
    assert obj["status"] == "infeasible" and obj["lower_bound"] == 12 and obj["capacity"] == 11
    assert obj["offsets"] is None and obj["solution"] is None
    assert "lower bound is 12 bytes" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_refuses_to_overwrite_the_problem(example_csv):
    before = example_csv.read_text()
    res = _run(["alloc", str(example_csv), "-o", str(example_csv)])
    assert res.exit_code == 2 and example_csv.read_text() == before


def test_cli_missing_file_and_bad_capacity(tmp_path, example_csv):
    missing = _run(["alloc", str(tmp_path / "nope.csv")])
    # exit 3 as for a CSV that cannot be read, and as memplan plan exits for a missing model
    assert missing.exit_code == 3 and "nope.csv: no such file" in missing.stderr
    res = _run(["alloc", str(example_csv), "--capacity", "twelve"])
    assert res.exit_code == 2 and "--capacity" in res.stderr


def test_alloc_reads_no_onnx(tmp_path):
    """alloc's input is a CSV: checking its output path imported onnx to look for the data files a
    model keeps its weights in (4 s of a 3 s run on a loaded machine)."""
    import subprocess
    import sys

    problem = tmp_path / "p.csv"
    problem.write_text("id,lower,upper,size\na,0,2,4\nb,1,3,4\n")
    code = ("import sys; from click.testing import CliRunner; import cli; "
            f"r = CliRunner().invoke(cli.main, ['alloc', {str(problem)!r}, '-o', {str(tmp_path / 's.csv')!r}]); "
            "print(r.exit_code, 'onnx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0", "False"], out
