"""Budgets and sizes as users write them, and the one-line errors for what they mistype."""
from __future__ import annotations

import pytest

from planner.errors import UsageError
from planner.units import format_bytes, format_gap, parse_budget, parse_bytes


@pytest.mark.parametrize("text, want", [("4096", 4096), ("512MiB", 512 << 20), ("1.5GB", 1_500_000_000),
                                        ("8 gib", 8 << 30), ("2k", 2048), ("1e3", 1000), (" 10B ", 10),
                                        ("101", 101)])
def test_sizes(text, want):
    assert parse_bytes(text) == want
    assert parse_budget(text).bytes == want and parse_budget(text).fraction is None


def test_percentages_resolve_against_the_unplanned_peak():
    b = parse_budget("60%")
    assert b.bytes is None and b.fraction == pytest.approx(0.6) and b.resolve(1000) == 600
    assert parse_budget("150%").resolve(1000) == 1500  # above the peak: a CI gate's headroom
    assert str(parse_budget("60%")) == "60%" and str(parse_budget("2MiB")) == "2.00 MiB"


@pytest.mark.parametrize("text, percent", [("60 percent", "60%"), ("60pct", "60%"), ("2.5 pc", "2.5%"), ("abc", "60%")])
def test_a_budget_of_an_unknown_form_names_the_forms_it_takes(text, percent):
    """A percentage spelled out ("60 percent") was told to use a byte unit, B ... TiB, only."""
    with pytest.raises(UsageError) as err:
        parse_budget(text)
    message = str(err.value)
    assert repr(text) in message and f"percentage of the unplanned peak ({percent})" in message
    assert "512MiB" in message and "GiB" in message and "4096" in message and "\n" not in message
    assert parse_budget("60 %").fraction == 0.6 and parse_budget("1.5 GiB").bytes == 3 << 29


@pytest.mark.parametrize("text, says", [
    ("abc", "is not a byte size"), ("0", "must be at least 1 byte"), ("12XB", "unknown unit 'XB'"),
    ("0.4", "write 40% for that fraction of the unplanned peak (or 0.4% if you meant 0.4 percent)"),
    ("0.75", "write 75% for that fraction"), ("1.5", "write 1.5% for a share of the unplanned peak"), ("0.5B", "must be at least 1 byte"),
    ("70", "has no unit; write 70% for a share of the unplanned peak, or 70B for bytes"), ("100", "or 100B"),
    ("1e400", "more than any machine holds"), ("1e300TiB", "more than any machine holds"),
    ("-5%", "is not a percentage"), ("0%", "(0, 1000]"), ("2000%", "(0, 1000]"), ("%", "is not a percentage"),
])
def test_mistyped_budgets_name_what_is_wrong(text, says):
    with pytest.raises(UsageError) as err:
        parse_budget(text)
    assert says in str(err.value) and repr(text) in str(err.value) and "\n" not in str(err.value)


def test_the_smallest_size_rounds_to_one_byte():
    assert parse_bytes("0.6B") == 1 and parse_bytes("4TiB") == 4 << 40


def test_format_bytes():
    assert [format_bytes(x) for x in (512, 1536, 3 << 20, -(1 << 30))] == ["512 B", "1.50 KiB", "3.00 MiB", "-1.00 GiB"]


def test_a_gap_that_is_not_zero_never_prints_as_zero():
    # the vit fixture at 80% (--dim batch=64) printed "cpsat feasible ... gap 0.00%" for a gap of 0.0042%
    assert format_gap(None) == "-"
    assert format_gap(0.0) == "0.00%"
    assert format_gap(4e-5) == "<0.01%"
    assert format_gap(0.1109) == "11.09%"


def test_a_share_resolves_to_the_same_bytes_in_every_command():
    """check floored 90% of 426171 bytes to 383553, plan rounded it up to 383554 (stop 49): a model
    at the boundary passed one and failed the other. Every command now takes the exact ceiling."""
    from planner.problem import PlanningProblem
    from planner.units import share_of

    assert parse_budget("90%").resolve(426171) == share_of(426171, 0.9) == 383554
    assert share_of(1000, 0.7) == 700 and share_of(1001, 0.7) == 701  # 700.7 -> 701; 0.7 is 7/10 exactly
    p = PlanningProblem.build(size=[426171], cost=[1.0], preds=[[]])
    assert p.budget_for(0.9) == parse_budget("90%").resolve(p.unplanned_peak)


def test_a_decimal_percentage_resolves_to_its_exact_share():
    """10.3% was read as 10.3 / 100 = 0.10300000000000001, whose exact ceiling over a 1000-byte peak
    is 104 bytes: a budget a byte above the share asked for, wherever the product is whole."""
    assert parse_budget("10.3%").resolve(1000) == 103
    assert parse_budget("0.9%").resolve(1000) == 9 and parse_budget("1.1%").resolve(1000) == 11
    assert parse_budget("41.1%").resolve(34701056000) == 14262134016
    assert parse_budget("66.3%").resolve(776788) == 515011  # 515010.444: still the ceiling


def test_a_least_share_is_rounded_up_so_a_budget_of_that_share_reaches_it():
    """zoo:mlp's least, 343488 of 347520 bytes (98.84%), read "98.8%": --budget 98.8% was called
    infeasible with 98.8% as its least. The infeasible message and bench's table round it up."""
    from cli import _infeasible_error
    from planner.plan import SolveResult
    from planner.remat_bench import _cells
    from planner.units import share_up

    assert share_up(343488, 347520) == "98.9%" and share_up(500, 1000) == "50.0%" and share_up(1, 3) == "33.4%"
    res = SolveResult("infeasible", "cpsat", 343350, 347520, 172800, 1.0, least_bytes=343488)
    budget = parse_budget("98.8%").resolve(347520)
    assert budget == 343350 < res.least_bytes
    assert "(335.44 KiB, 98.9% of the unplanned peak)" in str(_infeasible_error(res, budget, 347520))
    row = {"graph": "g", "n": 1, "budget_pct": 54, "strategy": "cpsat", "status": "infeasible", "least_pct": 54.04,
           "least_exact": True, "peak_over_budget": None, "added_pct": None, "solve_s": 0.1, "gap": None}
    assert _cells(row)[4] == "infeasible (least 54.1%)"
    assert _cells({**row, "least_pct": 54.0})[4] == "infeasible (least 54.0%)"
