"""The evidence an operator checks, checked with tshark 4 on the scenario captures.

- Every finding's Wireshark filter parses in tshark and matches exactly the packets it lists.
- The zero-window time a finding reports is the union of the intervals in which tshark sees the
  receiver advertise a zero window, within the time the finding covers.
- Every retransmission tshark flags is one in tcp_flow, and a retransmission tcp_flow calls
  spurious is one tshark calls spurious (acknowledged before it) or one the receiver D-SACKed.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake.lake import Lake
from testbed.tshark import TSHARK_PREFERENCES, tshark_available
from tests.paths import BOTTLENECK_SCENARIOS

pytestmark = pytest.mark.skipif(not tshark_available(), reason="tshark not installed")

BY_ID = {capture_id(c): c for c in BOTTLENECK_SCENARIOS}


def tshark_fields(capture: Path, display_filter: str, *fields: str) -> list[list[str]]:
    """Rows of ``fields`` of the packets ``display_filter`` matches (tshark's own dissection)."""
    port = json.loads(capture.with_name(capture.stem + ".truth.json").read_text())["broker"]["port"]
    result = subprocess.run(
        [
            "tshark",
            "-r",
            str(capture),
            *TSHARK_PREFERENCES,
            "-d",
            f"tcp.port=={port},amqp",
            "-Y",
            display_filter,
            "-T",
            "fields",
            *(a for f in fields for a in ("-e", f)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"tshark rejected {display_filter!r}: {result.stderr.strip()[-500:]}"
    return [line.split("\t") for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def scenario_findings(bottleneck_lake):
    found = [f for f in bottleneck_lake["bottlenecks"] if f.capture_id in BY_ID]
    assert len(found) > 20
    return found


def test_every_filter_matches_exactly_the_packets_its_finding_lists(scenario_findings):
    for finding in scenario_findings:
        assert finding.packet_numbers, finding.rule_id
        matched = [
            int(row[0]) for row in tshark_fields(BY_ID[finding.capture_id], finding.wireshark_filter, "frame.number")
        ]
        assert matched == sorted(finding.packet_numbers), (finding.rule_id, finding.entity, finding.wireshark_filter)


def test_field_filters_are_used_where_they_name_the_packets(scenario_findings):
    alarms = [f for f in scenario_findings if f.rule_id == "diagnosis.alarm.connection_blocked"]
    assert alarms and all("amqp.method.class == 10" in f.wireshark_filter for f in alarms)
    assert all(
        "frame.number in {" in f.wireshark_filter and " " not in f.wireshark_filter.split("{")[1]
        for f in scenario_findings
        if f not in alarms
    )


def zero_window_us(capture: Path, receiver: str, sender: str, low_us: int, high_us: int) -> int:
    """The union, within [low_us, high_us], of the intervals in which ``receiver`` (ip:port)
    advertised a zero window to ``sender``, as tshark reads the segments: from a zero-window segment
    until the receiver's next segment with a window (the end of the capture if none)."""
    r_ip, r_port = receiver.rsplit(":", 1)
    s_ip, s_port = sender.rsplit(":", 1)
    rows = tshark_fields(
        capture,
        f"ip.src == {r_ip} && tcp.srcport == {r_port} && ip.dst == {s_ip} && tcp.dstport == {s_port}",
        "frame.time_epoch",
        "tcp.window_size_value",
        "tcp.flags.reset",
    )
    last = max(int(round(float(t) * 1e6)) for t, *_ in tshark_fields(capture, "tcp", "frame.time_epoch"))
    total, closed_at = 0, None
    for epoch, window, reset in rows:
        at = int(round(float(epoch) * 1e6))
        if reset in ("1", "True"):
            continue
        if int(window) == 0 and closed_at is None:
            closed_at = at
        elif int(window) > 0 and closed_at is not None:
            total += max(0, min(at, high_us) - max(closed_at, low_us))
            closed_at = None
    if closed_at is not None:
        total += max(0, min(last, high_us) - max(closed_at, low_us))
    return total


def test_zero_window_time_is_what_tshark_shows(scenario_findings):
    """A finding's zero-window seconds: the zero windows within the time it covers, where the
    entity's span is the publishing span (publishers) or the broker's sending span (clients), read
    from tshark's own AMQP packets of the connection."""
    checked = 0
    for finding in scenario_findings:
        reported = finding.evidence.get("zero_window_seconds")
        if reported is None:
            continue
        capture = BY_ID[finding.capture_id]
        client = finding.client
        port = client.rsplit(":", 1)[1]
        broker = (
            f"127.0.0.1:{json.loads(capture.with_name(capture.stem + '.truth.json').read_text())['broker']['port']}"
        )
        if finding.rule_id == "diagnosis.publisher.credit_flow":
            # Publishes: 0-9-1 basic.publish, 1.0 transfers from the client.
            frames = f"tcp.srcport == {port} && (amqp.method.method == 40 && amqp.method.class == 60 || amqp.performative == 20)"
            receiver, sender = broker, client
        else:
            frames = f"tcp.dstport == {port} && amqp"
            receiver, sender = client, broker
        stamps = [int(round(float(t) * 1e6)) for (t,) in tshark_fields(capture, frames, "frame.time_epoch")]
        expected = zero_window_us(capture, receiver, sender, min(stamps), max(stamps))
        assert float(reported) == pytest.approx(expected / 1e6, abs=0.0015), (finding.rule_id, finding.entity)
        checked += 1
    assert checked >= 4


def test_retransmissions_and_spurious_ones_agree_with_tshark(bottleneck_lake, spark):
    flow = (
        Lake(spark, bottleneck_lake["root"])
        .read("tcp_flow")
        .filter(F.col("capture_id").isin(list(BY_ID)) & F.col("is_retransmission") & ~F.col("is_keep_alive"))
        .select("capture_id", "packet_number", "is_spurious_retransmission")
        .collect()
    )
    ours = defaultdict(dict)
    for row in flow:
        ours[row.capture_id][row.packet_number] = row.is_spurious_retransmission
    checked = 0
    for cid, capture in BY_ID.items():
        flagged = {
            int(n): (s == "1" or s == "True")
            for n, s in tshark_fields(
                capture,
                "tcp.analysis.retransmission || tcp.analysis.spurious_retransmission",
                "frame.number",
                "tcp.analysis.spurious_retransmission",
            )
        }
        dsacked = {int(n) for (n,) in tshark_fields(capture, "tcp.options.sack.dsack_le", "frame.number")}
        # Every retransmission tshark sees with payload is one of ours (a keep-alive is neither).
        assert set(flagged) <= set(ours[cid]) | set(tshark_keep_alives(capture)), capture.name
        for packet, spurious in ours[cid].items():
            if spurious:  # acknowledged before it was sent, or D-SACKed after
                assert flagged.get(packet) or any(d > packet for d in dsacked), (capture.name, packet)
            checked += 1
        # tshark's spurious ones (acknowledged before they were sent) are spurious here too.
        assert all(ours[cid].get(p) for p, s in flagged.items() if s), capture.name
    assert checked >= 15


def tshark_keep_alives(capture: Path) -> list[int]:
    return [int(n) for (n,) in tshark_fields(capture, "tcp.analysis.keep_alive", "frame.number")]


def test_a_backlog_without_consumer_is_what_the_broker_deleted_with_the_queue(scenario_findings):
    """The broker's own count of a queue's messages, read by tshark: the scenarios delete their
    queues at the end, and queue.delete-ok carries the number of messages deleted with it. The
    broker held at least the backlog the rule reports from, and never more than the wire counted
    (publishes it had not read yet when the delete came, from publishers it held back, are fewer)."""
    backlogs = [f for f in scenario_findings if f.rule_id == "diagnosis.queue.backlog_without_consumer"]
    assert backlogs
    for finding in backlogs:
        capture = BY_ID[finding.capture_id]
        rows = tshark_fields(
            capture,
            "amqp.method.class == 50 && amqp.method.method in {40,41}",
            "tcp.stream",
            "amqp.method.method",
            "amqp.method.arguments.queue",
            "amqp.method.arguments.message_count",
        )
        deleting: dict[str, str] = {}
        deleted: list[int] = []
        for stream, method, queue, count in rows:
            if method == "40":
                deleting[stream] = queue
            elif deleting.pop(stream, None) == finding.queue:
                deleted.append(int(count))
        (count,) = deleted
        counted = int(finding.evidence["ready_at_end"].replace(",", ""))
        assert DiagnosisThresholds().backlog_min_ready <= count <= counted, capture.name
