"""Captures that begin part of the way through (tcpdump started on a broker whose connections were
already open) are judged as the whole capture is (issue 62): each bundled capture is cut to begin
after a quarter, a third, a half and two thirds of its packets, and each cut's verdict is its full
capture's, or what the cut can still show when the cause lies before it:

- a healthy capture's cuts are healthy ("none");
- a cut that begins after the full capture's top finding ended may say "none" (the problem is not
  in it); one that begins inside it names the same component;
- a resource alarm whose connection.blocked is before the cut is still an alarm, of a reason the
  cut cannot tell ("alarm"), or of the reason the full capture names.

The full matrix analyses 27 captures and their 108 cuts in one run (slow tier); the normal suite
has the healthy samples and three bottleneck captures (two alarms, a slow consumer) at two cuts.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.analyze import analyze
from tests.cuts import CUT_POINTS, Cut, cuts, packet_count
from tests.paths import BOTTLENECK_SCENARIOS, FLOW_SAMPLES, HEALTHY_SAMPLES, SAMPLES

pytestmark = pytest.mark.tshark  # editcap

EVERY_CAPTURE = [*HEALTHY_SAMPLES, *FLOW_SAMPLES, *BOTTLENECK_SCENARIOS]
SOME_CAPTURES = [
    *HEALTHY_SAMPLES,
    SAMPLES / "bottlenecks" / "memory-alarm.pcap",
    SAMPLES / "bottlenecks" / "slow-consumer.pcap",
    SAMPLES / "flow" / "amqp091-memory-alarm.pcap",
]
SOME_POINTS = (Fraction(1, 3), Fraction(2, 3))
ALARMS = ("memory_alarm", "disk_alarm")


def judged(spark, captures: list[Path], points: tuple[Fraction, ...], root: Path) -> tuple[list[Cut], dict]:
    """``captures`` and their cuts at ``points`` analysed in one run; per file name its verdict and
    top finding's packets (``bottleneck``, ``start``, ``end``: null without a finding)."""
    made = cuts(captures, points, root / "cuts")
    lake = root / "lake"
    config = AnalyzeConfig(lake=lake, report=lake / "report.html", data_docs=lake / "data_docs", group_rotated=False)
    analyze(spark, [str(p) for p in (*captures, *(c.path for c in made))], config)
    tables = Lake(spark, lake)
    names = {r.capture_id: r.file_name for r in tables.read("captures").collect()}
    top = {r.capture_id: r for r in tables.read("bottlenecks").filter("rank = 1 and kind = 'bottleneck'").collect()}
    found = {}
    for r in tables.read("diagnosis").collect():
        finding = top.get(r.capture_id)
        found[names[r.capture_id]] = {
            "bottleneck": r.bottleneck,
            "start": finding.start_packet_number if finding else None,
            "end": finding.end_packet_number if finding else None,
            "headline": r.headline,
        }
    return made, found


def allowed(full: dict, first_packet: int) -> set[str]:
    """The verdicts a cut beginning at the full capture's ``first_packet`` may have."""
    verdict = full["bottleneck"]
    if verdict == "none":
        return {"none"}
    ended_before = full["end"] is not None and full["end"] < first_packet
    fits = {verdict, "none"} if ended_before else {verdict}
    if verdict in ALARMS and full["start"] is not None and full["start"] < first_packet:
        fits.add("alarm")  # the connection.blocked naming the reason is before the cut
    return fits


def mismatches(made: list[Cut], found: dict) -> list[tuple]:
    wrong = []
    for c in made:
        full = found[c.capture.name]
        first = int(packet_count(c.capture) * c.point) + 1
        cut_verdict = found[c.path.name]["bottleneck"]
        if cut_verdict not in allowed(full, first):
            wrong.append((c.capture.name, c.label, full["bottleneck"], cut_verdict, found[c.path.name]["headline"]))
    return wrong


def test_the_verdict_of_a_cut_is_the_verdict_of_the_whole(spark, tmp_path):
    made, found = judged(spark, SOME_CAPTURES, SOME_POINTS, tmp_path)
    assert mismatches(made, found) == []


@pytest.mark.slow
def test_every_cut_of_every_sample_is_judged_as_the_whole(spark, tmp_path):
    made, found = judged(spark, EVERY_CAPTURE, CUT_POINTS, tmp_path)
    assert len(made) == 4 * len(EVERY_CAPTURE)
    assert mismatches(made, found) == []


def test_a_cut_may_say_none_only_when_the_problem_ended_before_it():
    full = {"bottleneck": "consumer", "start": 10, "end": 50}
    assert allowed(full, 40) == {"consumer"}
    assert allowed(full, 60) == {"consumer", "none"}
    assert allowed({"bottleneck": "consumer", "start": 10, "end": None}, 60) == {"consumer"}
    assert allowed({"bottleneck": "none", "start": None, "end": None}, 60) == {"none"}
    assert allowed({"bottleneck": "memory_alarm", "start": 10, "end": None}, 60) == {"memory_alarm", "alarm"}
    assert allowed({"bottleneck": "memory_alarm", "start": 10, "end": None}, 5) == {"memory_alarm"}
