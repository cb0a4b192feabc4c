"""benchmarks/floors.py puts an analyze beside its floors in rounds: each run must take every place
in the order as often as the others, and each ratio must be to its own round's yardstick (the bare
session, or tshark), or a drift of the machine reads as a floor."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def floors():
    with benchmark_script("floors") as module:
        yield module


@pytest.mark.parametrize("kinds", ["KINDS", "SAMPLE_KINDS"])
def test_each_run_takes_each_place_once_in_as_many_rounds_as_runs(floors, kinds):
    kinds = getattr(floors, kinds)
    orders = [floors.rotated(i, kinds) for i in range(len(kinds))]
    assert all(sorted(order) == sorted(kinds) for order in orders)
    for place in range(len(kinds)):
        assert sorted(order[place] for order in orders) == sorted(kinds)
    assert floors.rotated(len(kinds), kinds) == floors.rotated(0, kinds)
    assert floors.rotated(1) == floors.rotated(1, floors.KINDS)


def test_ratios_are_to_the_yardstick_of_their_own_round(floors):
    def measured(base, analyze, least, shape):
        seconds = {"yardstick": base, "analyze": analyze, "least_work": least, "same_shape": shape}
        return {"seconds": seconds, "ratios": {k: round(v / base, 2) for k, v in seconds.items() if k != "yardstick"}}

    # A slow round (the yardstick twice as long) has the same ratios as a fast one.
    rounds = [measured(4.0, 28.0, 12.0, 13.0), measured(8.0, 56.0, 24.0, 26.0), measured(5.0, 40.0, 14.0, 15.0)]
    summary = floors.summary(rounds)
    assert summary["analyze"] == {"median": 7.0, "low": 7.0, "high": 8.0}
    assert summary["least_work"] == {"median": 3.0, "low": 2.8, "high": 3.0}
    assert summary["same_shape"] == {"median": 3.25, "low": 3.0, "high": 3.25}
    assert summary["analyze_over_least_work"] == {"median": 2.33, "low": 2.33, "high": 2.86}
    assert "least_answer" not in summary  # a large capture's rounds have none
    for r, answer in zip(rounds, (16.0, 30.0, 21.0)):
        r["ratios"]["least_answer"] = round(answer / r["seconds"]["yardstick"], 2)
    assert floors.summary(rounds)["least_answer"] == {"median": 4.0, "low": 3.75, "high": 4.2}


def test_the_cpu_floor_spreads_both_runs_cpu_over_the_cores(floors):
    # 21 CPU s of least work and 6 of Python work on two cores take at least 13.5 s: 3x a 4.5 s session.
    assert floors.cpu_floor(21.0, 6.0, 4.5, cores=2) == 3.0
    assert floors.cpu_floor(21.0, 6.0, 4.5, cores=1) == 6.0
    rounds = [
        {"seconds": {"analyze": a, "least_work": 1.0}, "ratios": {"analyze": a, "least_work": 1.0, "same_shape": 1.0}}
        for a in (7.0, 8.0)
    ]
    assert "cpu_floor" not in floors.summary(rounds)  # a large capture's rounds have none
    for r, floor in zip(rounds, (2.9, 3.2)):
        r["ratios"]["cpu_floor"] = floor
    assert floors.summary(rounds)["cpu_floor"] == {"median": 3.05, "low": 2.9, "high": 3.2}
