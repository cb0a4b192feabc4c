"""Live testbed: a private RabbitMQ, tcpdump on lo and real clients; tshark checks the captures.

One broker serves the whole module (it takes a few seconds to boot); each scenario is captured
once into a temporary directory and the tests read those captures.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.broker import RABBITMQ_BIN, PrivateBroker
from testbed.capture import capture_scenario, truth_path
from testbed.processes import descendants
from testbed.scenarios import SCENARIOS
from testbed.tshark import DecodedFrame, capture_gaps, decoded_frames, frame_counts

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not (RABBITMQ_BIN / "rabbitmq-server").exists(), reason="rabbitmq-server not installed"),
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root"),
]

AMQP091_MESSAGES = 200
AMQP10_MESSAGES = 100


@pytest.fixture(scope="module")
def broker() -> Iterator[PrivateBroker]:
    private = PrivateBroker()
    with private:
        yield private
    still_running = [ref for ref in private.started_processes if ref.is_running()]
    assert still_running == [], f"broker processes left running: {still_running}"


@pytest.fixture(scope="module")
def captures(broker: PrivateBroker, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out_dir = tmp_path_factory.mktemp("captures")
    return {name: capture_scenario(name, out_dir, broker=broker) for name in SCENARIOS}


@pytest.fixture(scope="module")
def frames(captures: dict[str, Path], broker: PrivateBroker) -> dict[str, list[DecodedFrame]]:
    return {name: decoded_frames(path, broker.port) for name, path in captures.items()}


def truth_of(capture: Path) -> dict:
    return json.loads(truth_path(capture).read_text())


# -- files and ground truth -------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_capture_and_truth_files(scenario: str, captures: dict[str, Path], broker: PrivateBroker) -> None:
    capture = captures[scenario]
    assert capture.name == scenario.replace("_", "-") + ".pcap"
    assert capture.stat().st_size > 24  # more than the pcap global header
    assert capture.read_bytes()[:4] == bytes.fromhex("d4c3b2a1")  # little-endian pcap, µs
    record = truth_of(capture)
    assert record["scenario"] == scenario
    assert sorted(record["ground_truth"]) == sorted(SCENARIOS[scenario])
    assert record["broker"]["port"] == broker.port
    assert record["broker"]["version"] == broker.version()
    assert record["capture"]["packets_dropped_by_kernel"] == 0
    assert record["capture"]["packets_captured"] > 0
    assert set(record["clients"]) >= {"pika", "python-qpid-proton"}


def test_amqp091_ground_truth(captures: dict[str, Path]) -> None:
    truth = truth_of(captures["amqp091_qos_confirms"])["ground_truth"]["amqp091_qos_confirms"]
    assert truth["messages_published"] == AMQP091_MESSAGES
    assert truth["confirms_expected"] == truth["confirms_acked"] == AMQP091_MESSAGES
    assert (truth["prefetch_count"], truth["prefetch_global"]) == (10, False)
    assert truth["distinct_messages_received"] == AMQP091_MESSAGES
    assert truth["deliveries_received"] == AMQP091_MESSAGES + 1  # one nack with requeue
    assert (truth["nacks_sent"], truth["redeliveries_received"]) == (1, 1)
    assert truth["acks_sent"] == truth["acks_single"] + truth["acks_multiple"]
    assert truth["acks_multiple"] > 0
    # Every delivery but the nacked one is settled by exactly one ack.
    assert truth["acks_single"] + truth["deliveries_settled_by_multiple_acks"] == AMQP091_MESSAGES
    assert truth["channels_opened"] == 2


def test_amqp10_ground_truth(captures: dict[str, Path]) -> None:
    truth = truth_of(captures["amqp10_credit"])["ground_truth"]["amqp10_credit"]
    assert truth["messages_sent"] == truth["sender_outcomes_accepted"] == AMQP10_MESSAGES
    assert truth["messages_received"] == truth["messages_accepted"] == AMQP10_MESSAGES
    assert truth["credit_window"] == 5
    assert truth["credit_grants"] == AMQP10_MESSAGES // 5
    assert truth["sasl_mechanism"] == "PLAIN"


# -- what tshark decodes -----------------------------------------------------------------------


def settled_by_acks(frames: list[DecodedFrame], sender: str, channel: str) -> set[int]:
    """Delivery tags / sequence numbers settled by ``basic.ack`` frames (multiple included)."""
    settled: set[int] = set()
    for frame in frames:
        if frame.sender == sender and frame.name == "basic.ack":
            if frame.fields["amqp.channel"] != channel:
                continue
            tag = int(frame.fields["amqp.method.arguments.delivery_tag"])
            if frame.fields["amqp.method.arguments.multiple"] == "1":
                settled.update(range(1, tag + 1))
            else:
                settled.add(tag)
    return settled


def settled_by_dispositions(frames: list[DecodedFrame], sender: str) -> set[int]:
    """Delivery ids covered by ``disposition`` frames of ``sender`` (first..last, spec 2.7.6)."""
    settled: set[int] = set()
    for frame in frames:
        if frame.sender == sender and frame.name == "disposition":
            first = int(frame.fields["amqp.performative.arguments.first"])
            last = int(frame.fields.get("amqp.performative.arguments.last", first))
            settled.update(range(first, last + 1))
    return settled


def check_amqp091(frames: list[DecodedFrame], truth: dict) -> None:
    counts = frame_counts(frames)
    assert counts["client", "basic.publish"] == truth["messages_published"]
    assert counts["client", "header"] == counts["client", "body"] == truth["messages_published"]
    assert counts["client", "confirm.select"] == 1
    confirmed = settled_by_acks(frames, "broker", str(truth["publish_channel"]))
    assert confirmed == set(range(1, truth["confirms_expected"] + 1))
    assert counts["broker", "basic.deliver"] == truth["deliveries_received"]
    assert counts["client", "basic.ack"] == truth["acks_sent"]
    multiple = [
        frame
        for frame in frames
        if (frame.sender, frame.name) == ("client", "basic.ack")
        and frame.fields["amqp.method.arguments.multiple"] == "1"
    ]
    assert len(multiple) == truth["acks_multiple"]
    assert counts["client", "basic.nack"] == truth["nacks_sent"]
    qos = [frame for frame in frames if frame.name == "basic.qos"]
    assert [q.fields["amqp.method.arguments.prefetch_count"] for q in qos] == [str(truth["prefetch_count"])]
    assert counts["client", "channel.open"] == truth["channels_opened"]
    assert counts["client", "connection.close"] == counts["broker", "connection.close-ok"] == 1


def check_amqp10(frames: list[DecodedFrame], truth: dict) -> None:
    counts = frame_counts(frames)
    assert counts["client", "sasl-init"] == 1
    assert counts["client", "transfer"] == truth["messages_sent"]
    assert counts["broker", "transfer"] == truth["messages_received"]
    assert settled_by_dispositions(frames, "broker") == set(range(truth["messages_sent"]))
    assert settled_by_dispositions(frames, "client") == set(range(truth["messages_accepted"]))
    grants = [
        frame
        for frame in frames
        if (frame.sender, frame.name) == ("client", "flow") and "amqp.performative.arguments.linkCredit" in frame.fields
    ]
    assert len(grants) == truth["credit_grants"]
    assert {g.fields["amqp.performative.arguments.linkCredit"] for g in grants} == {str(truth["credit_window"])}
    assert counts["client", "close"] == counts["broker", "close"] == 1


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_tshark_decodes_what_the_clients_did(
    scenario: str, frames: dict[str, list[DecodedFrame]], captures: dict[str, Path]
) -> None:
    assert capture_gaps(captures[scenario]) == 0
    ground_truth = truth_of(captures[scenario])["ground_truth"]
    for part, truth in ground_truth.items():
        protocol = truth["protocol"]
        part_frames = [frame for frame in frames[scenario] if frame.protocol == protocol]
        {"amqp091_qos_confirms": check_amqp091, "amqp10_credit": check_amqp10}[part](part_frames, truth)


# -- processes -------------------------------------------------------------------------------


def test_captures_leave_no_process_behind(captures: dict[str, Path], broker: PrivateBroker) -> None:
    # Only the broker's own processes may still run (tcpdump, editcap, clients are gone). Other
    # fixtures of the same pytest run (Spark's JVM and Python workers) are not the testbed's.
    leftovers = {
        ref for ref in descendants(os.getpid()) - broker.started_processes if _command(ref.pid) in TESTBED_COMMANDS
    }
    assert leftovers == set()


# Every program the testbed starts, by kernel command name (/proc/PID/comm).
TESTBED_COMMANDS = frozenset(
    {"tcpdump", "editcap", "beam.smp", "epmd", "erl_child_setup", "inet_gethost", "rabbitmq-server"}
)


def _command(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def test_private_broker_config_control_and_stop() -> None:
    broker = PrivateBroker(config={"vm_memory_high_watermark.relative": "0.0001"})
    with broker:
        alarms = broker.ctl("eval", "rabbit_alarm:get_alarms().")
        assert "{resource_limit,memory," in alarms
        broker.set_vm_memory_high_watermark(0.4)
        started = broker.started_processes
        assert len(started) >= 3  # epmd, the rabbitmq-server script, beam.smp (+ helpers)
        base_dir = broker.base_dir
        port = broker.port
    assert [ref for ref in started if ref.is_running()] == []
    assert base_dir is not None and not base_dir.exists()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


# -- amqpscope on what was just captured -------------------------------------------------------


def test_analyze_live_captures(spark, captures: dict[str, Path], broker: PrivateBroker, tmp_path: Path) -> None:
    """The captures of this run go through the whole chain; the tables hold the ground truth."""
    from pyspark.sql import functions as F

    from amqpscope.conf.settings import AnalyzeConfig
    from amqpscope.jobs.lake.lake import Lake
    from amqpscope.jobs.stages.analyze import analyze

    config = AnalyzeConfig(lake=tmp_path / "lake", ports=(broker.port,))
    result = analyze(spark, [str(p) for p in captures.values()], config)
    assert result.suites_passed
    assert result.row_counts["quarantine"] == 0 and result.row_counts["violations"] == 0
    frames = Lake(spark, config.lake).read("frames")
    counts = {(r.direction, r.method): r["count"] for r in frames.groupBy("direction", "method").count().collect()}
    runs = {name: truth_of(path)["ground_truth"] for name, path in captures.items()}
    published = sum(t["messages_published"] for gt in runs.values() for t in gt.values() if "messages_published" in t)
    delivered = sum(t["deliveries_received"] for gt in runs.values() for t in gt.values() if "deliveries_received" in t)
    sent = sum(t["messages_sent"] for gt in runs.values() for t in gt.values() if "messages_sent" in t)
    received = sum(t["messages_received"] for gt in runs.values() for t in gt.values() if "messages_received" in t)
    assert counts[("c2s", "basic.publish")] == published
    assert counts[("s2c", "basic.deliver")] == delivered
    assert counts[("c2s", "transfer")] == sent
    assert counts[("s2c", "transfer")] == received
    connections = Lake(spark, config.lake).read("connections")
    assert connections.filter(F.col("server_port") != broker.port).count() == 0
    assert connections.agg(F.sum("c2s_missing_bytes") + F.sum("s2c_missing_bytes")).first()[0] == 0
