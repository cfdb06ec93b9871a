"""verify's step times: run order, rounds, spread, the within-noise verdict and the load note, on given numbers."""
import pytest

from passes import timing
from passes.verify import VerifyReport


def test_rounds_fit_the_time_budget_between_the_bounds():
    assert timing.rounds_for([0.06, 0.07], 7, 31, 2.0) == 15  # int(2.0 / 0.13)
    assert timing.rounds_for([0.5, 0.6], 7, 31, 2.0) == 7  # a slow model still gets the minimum
    assert timing.rounds_for([1e-4, 1e-4], 7, 31, 2.0) == 31  # a fast one no more than the maximum
    assert timing.rounds_for([0.0, 0.0], 7, 31, 2.0) == 31  # a clock that read 0 s


def test_runs_alternate_and_every_other_round_is_reversed():
    assert timing.interleaved_order(2, 4) == [0, 1, 1, 0, 0, 1, 1, 0]
    assert timing.interleaved_order(3, 2) == [0, 1, 2, 2, 1, 0]
    order = timing.interleaved_order(2, 7)
    assert order.count(0) == order.count(1) == 7
    # a model runs twice in a row only where a round turns, never three times
    assert all(order[i:i + 3] not in ([0, 0, 0], [1, 1, 1]) for i in range(len(order) - 2))


def test_spread_is_the_five_numbers():
    s = timing.spread([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (s.low, s.q1, s.median, s.q3, s.high) == (1.0, 2.0, 3.0, 4.0, 5.0)
    assert timing.spread([2.0, 4.0]).median == 3.0
    with pytest.raises(ValueError):
        timing.spread([])


def test_overlapping_interquartile_ranges_are_within_noise():
    ref = [10.0, 11.0, 12.0, 13.0, 14.0]  # IQR 11-13
    touching = timing.compare_times(ref, [12.0, 13.0, 14.0, 15.0, 16.0])  # IQR 13-15
    assert touching.overhead == pytest.approx(14 / 12 - 1)
    assert touching.overhead_low == pytest.approx(0.0) and touching.overhead_high == pytest.approx(15 / 11 - 1)
    assert touching.within_noise
    # a wild run on one side moves the medians, not the verdict: the quartiles still overlap
    assert timing.compare_times(ref, [11.5, 12.5, 13.0, 13.5, 120.0]).within_noise


def test_separate_interquartile_ranges_are_a_real_difference_either_way():
    ref = [10.0, 11.0, 12.0, 13.0, 14.0]
    slower = timing.compare_times(ref, [14.0, 15.0, 16.0, 17.0, 18.0])  # IQR 15-17 above 11-13
    assert not slower.within_noise and slower.overhead_low == pytest.approx(15 / 13 - 1)
    faster = timing.compare_times(ref, [5.0, 6.0, 7.0, 8.0, 9.0])
    assert not faster.within_noise and faster.overhead_high == pytest.approx(8 / 11 - 1)


def test_machine_loaded_counts_verify_itself_out():
    assert timing.machine_loaded(4.6, 2)  # 3.6 others on 2 CPUs
    assert not timing.machine_loaded(1.2, 2)  # verify's own run and a little more
    assert not timing.machine_loaded(1.0, 16)
    assert timing.machine_loaded(9.0, 16) and not timing.machine_loaded(8.5, 16)
    assert timing.machine_loaded(12.0, 8)


def test_report_json_keeps_the_medians_and_adds_the_spread():
    ref, got = (1.0, 1.1, 1.2, 1.3, 9.0), (1.2, 1.3, 1.4, 1.5, 1.6)
    report = VerifyReport((), 0, 0, 8, 16, 16, 16, 16, 16, 1.2, 1.4, reference_times=ref, planned_times=got,
                          load_average=3.0, cpus=2)
    d = report.as_dict()
    assert d["time_overhead"] == pytest.approx(1.4 / 1.2 - 1)  # as before: the medians' ratio
    assert d["reference"]["seconds"] == 1.2 and d["planned"]["seconds"] == 1.4
    assert d["reference"]["seconds_spread"] == pytest.approx({"min": 1.0, "q1": 1.1, "median": 1.2, "q3": 1.3,
                                                              "max": 9.0})
    assert d["time_rounds"] == 5
    assert d["time_overhead_range"] == pytest.approx([1.3 / 1.3 - 1, 1.5 / 1.1 - 1])
    assert d["time_overhead_within_noise"] is True
    assert d["machine_load"] == {"load_average_1min": 3.0, "cpus": 2, "loaded": True}
    # a report made from medians alone (no runs kept) makes no verdict
    bare = VerifyReport((), 0, 0, 8, 16, 16, 16, 16, 16, 1.0, 1.5).as_dict()
    assert bare["time_rounds"] == 0 and bare["time_overhead_within_noise"] is None
    assert bare["time_overhead_range"] is None and bare["machine_load"]["loaded"] is None
