"""Live differential tests: fresh captures of ``testbed.decoder_scenarios`` against tshark and the truth.

One private broker (with a 1 s ``heartbeat`` so that it asks AMQP 1.0 peers for empty frames)
serves the module; each scenario is captured once into a temporary directory. Every typed field
is compared with tshark's (``tests/test_tshark_fields.py``: zero mismatches, tshark's known-wrong
values listed there with their reasons), then the frames are checked against what the clients did.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpscope.expectations.catalogue import load_rules, rules_for, violations
from amqpscope.jobs.stages.decode import decode_captures, resolve_captures
from amqpscope.pipelines.channel_unacked import channel_unacked_timeline
from amqpscope.pipelines.frame_limits import frame_limits_timeline
from amqpscope.pipelines.idle_gaps import idle_gaps_timeline
from amqpscope.pipelines.messages import messages_091
from testbed import decoder_scenarios
from testbed.broker import RABBITMQ_BIN, PrivateBroker
from testbed.capture import capture_scenario, truth_path
from testbed.tshark import tshark_available
from tests.test_tshark_fields import compare_capture, frame_name, stream_rows

pytestmark = [
    pytest.mark.live,
    pytest.mark.tshark,
    pytest.mark.skipif(not (RABBITMQ_BIN / "rabbitmq-server").exists(), reason="rabbitmq-server not installed"),
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed"),
    pytest.mark.skipif(not tshark_available(), reason="tshark not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root"),
]

SCENARIOS = sorted(decoder_scenarios.DECODER_SCENARIOS)


@pytest.fixture(scope="module")
def broker() -> Iterator[PrivateBroker]:
    with PrivateBroker(config=decoder_scenarios.HEARTBEAT_BROKER_CONFIG) as private:
        yield private


@pytest.fixture(scope="module")
def captures(broker: PrivateBroker, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("decoder-captures")
    with decoder_scenarios.registered(), decoder_scenarios.alarm_switch(broker):
        return {name: capture_scenario(name, out, broker=broker) for name in SCENARIOS}


@pytest.fixture(scope="module")
def rows(captures: dict[str, Path], broker: PrivateBroker) -> dict[str, list[dict]]:
    return {name: list(stream_rows(path, broker.port)) for name, path in captures.items()}


def live_frames(spark, capture: Path, broker: PrivateBroker):
    """The frames table of a live capture, decoded by the Spark ingest."""
    return decode_captures(spark, resolve_captures([str(capture)]), (broker.port,)).frames


def assert_closed_by_broker(gt: dict, frames, reply_code: int) -> None:
    """The client saw the broker close the connection with ``reply_code``, and so does the capture."""
    assert gt["closed_by_broker"][0] == reply_code
    [close] = frames.filter("method = 'connection.close'").collect()
    assert (close.direction, close.reply_code) == ("s2c", reply_code)


def truth(capture: Path) -> dict:
    [gt] = json.loads(truth_path(capture).read_text())["ground_truth"].values()
    return gt


def counts(frames: list[dict]) -> Counter[tuple[str, str]]:
    return Counter((r["direction"], frame_name(r)) for r in frames)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_field_matches_tshark(scenario: str, captures: dict[str, Path], broker: PrivateBroker) -> None:
    result = compare_capture(captures[scenario], broker.port)
    assert result.mismatches == []
    assert result.frames > 20 and result.values > 10 * result.frames


def test_amqp091_methods(captures: dict[str, Path], rows: dict[str, list[dict]]) -> None:
    gt, frames = truth(captures["amqp091_methods"]), rows["amqp091_methods"]
    seen = counts(frames)
    for method in (
        "exchange.bind",
        "exchange.unbind",
        "queue.unbind",
        "queue.purge",
        "basic.recover",
        "tx.commit",
        "connection.update-secret",
        "confirm.select",
        "basic.get",
    ):
        assert seen["c2s", method] >= 1, method
    assert seen["s2c", "basic.get-empty"] == gt["gets_empty"]
    assert seen["s2c", "basic.get-ok"] == gt["gets_ok"]
    assert seen["c2s", "basic.reject"] == gt["rejects_sent"] and seen["c2s", "basic.nack"] == gt["nacks_sent"]
    assert seen["s2c", "basic.nack"] == gt["confirms_nacked"] and seen["s2c", "basic.return"] == gt["returned"]
    rejects = [(r["delivery_tag"], r["requeue"]) for r in frames if r["method"] == "basic.reject"]
    assert [requeue for _tag, requeue in rejects] == [True, False]
    [qos] = [r for r in frames if r["method"] == "basic.qos"]
    assert (qos["prefetch_count"], qos["global"]) == (gt["prefetch_count"], gt["prefetch_global"])
    # AMQPLAIN: the mechanism is kept, the response (a table with LOGIN and PASSWORD) is not.
    [start_ok] = [r for r in frames if r["method"] == "connection.start-ok"]
    assert start_ok["mechanism"] == gt["sasl_mechanism"] == "AMQPLAIN"
    assert "response" not in start_ok["arguments"]
    [update] = [r for r in frames if r["method"] == "connection.update-secret"]
    assert "new-secret" not in update["arguments"] and update["reason"] == "amqpscope rotation"
    everything = json.dumps([{k: str(v) for k, v in r.items()} for r in frames])
    assert "PASSWORD" not in everything and "\\u0000guest" not in everything
    # Every basic property, the field table with each value type pika writes.
    header = next(r for r in frames if r["method"] == "basic.header" and r["message_id"] == "msg-1")
    assert (header["content_type"], header["delivery_mode"], header["priority"]) == ("text/plain", 2, 3)
    headers = json.loads(header["arguments"]["headers"])
    assert headers["nested"] == {"inner": "x", "deeper": {"n": 1}} and headers["list"] == [1, "two", [3]]
    assert (headers["decimal"], headers["long"], headers["empty"]) == ("3.14", 2**40, {})
    assert header["arguments"]["timestamp"] == "2023-11-14T22:13:21+00:00"


def test_amqp091_ack_of_a_settled_tag_is_flagged_and_rabbitmq_closes_the_channel(
    spark, captures: dict[str, Path], broker: PrivateBroker
) -> None:
    gt = truth(captures["amqp091_methods"])
    channel, tag = gt["acked_twice_channel"], gt["acked_twice_tag"]
    frames = live_frames(spark, captures["amqp091_methods"], broker)
    on_channel = frames.filter(f"channel = {channel}").orderBy("frame_index").collect()
    acks = [r for r in on_channel if r.method == "basic.ack"]
    assert [(r.direction, r.delivery_tag) for r in acks] == [("c2s", tag), ("c2s", tag)]
    [close] = [r for r in on_channel if r.method == "channel.close"]
    assert (close.direction, close.reply_code) == ("s2c", 406) and "unknown delivery tag" in close.reply_text
    timeline = channel_unacked_timeline(frames)
    rules = {r.id: r for r in load_rules()}
    found = {
        rule: [r.frame_index for r in violations(timeline, rules[rule]).collect()]
        for rule in ("amqp091.ack.already_settled", "amqp091.ack.unknown_delivery_tag")
    }
    assert found == {"amqp091.ack.already_settled": [acks[1].frame_index], "amqp091.ack.unknown_delivery_tag": []}


def test_amqp091_frame_above_frame_max_is_flagged_and_rabbitmq_closes_the_connection(
    spark, captures: dict[str, Path], broker: PrivateBroker
) -> None:
    gt = truth(captures["amqp091_frame_max"])
    frames = live_frames(spark, captures["amqp091_frame_max"], broker)
    assert_closed_by_broker(gt, frames, 501)  # FRAME_ERROR
    [tune_ok] = frames.filter("method = 'connection.tune-ok'").collect()
    assert tune_ok.frame_max == gt["frame_max"] == 4096
    # pika splits bodies into frames of frame-max, but sends the big content header whole.
    bodies = frames.filter("frame_type = 'body'").collect()
    assert len(bodies) > gt["messages_published"] and max(r.frame_size for r in bodies) == 4096
    timeline = frame_limits_timeline(frames)
    found = {
        rule.id: [
            (r.frame_index, r.evidence["method"], int(r.evidence["frame_size_limit"]))
            for r in violations(timeline, rule).collect()
        ]
        for rule in rules_for("frame_limits")
    }
    [header] = frames.filter("frame_type = 'header' AND frame_size > 4096").collect()
    assert found == {rule.id: [] for rule in rules_for("frame_limits")} | {
        "amqp091.frame.larger_than_frame_max": [(header.frame_index, "basic.header", 4096)]
    }


def test_amqp091_content_cut_short_is_flagged_and_rabbitmq_closes_the_connection(
    spark, captures: dict[str, Path], broker: PrivateBroker
) -> None:
    gt = truth(captures["amqp091_content_cut_short"])
    frames = live_frames(spark, captures["amqp091_content_cut_short"], broker)
    assert_closed_by_broker(gt, frames, 505)  # UNEXPECTED_FRAME
    messages = messages_091(frames)
    assert messages.filter("method = 'basic.publish'").count() == gt["messages_published"]
    rules = {rule.id: rule for rule in load_rules()}
    [cut] = violations(messages, rules["amqp091.content.cut_short"]).collect()
    assert (cut.evidence["body_size"], cut.evidence["body_bytes"]) == (str(gt["cut_short_body_size"]), "3")
    [qos] = frames.filter("method = 'basic.qos'").collect()
    assert cut.evidence["next_method_frame_index"] == str(qos.frame_index)
    assert violations(messages, rules["amqp091.content.body_exceeds_body_size"]).count() == 0


def test_amqp091_heartbeats(captures: dict[str, Path], rows: dict[str, list[dict]]) -> None:
    gt, frames = truth(captures["amqp091_heartbeats"]), rows["amqp091_heartbeats"]
    [tune_ok] = [r for r in frames if r["method"] == "connection.tune-ok"]
    assert tune_ok["heartbeat"] == gt["heartbeat"] == 1
    beats = [r for r in frames if r["frame_type"] == "heartbeat"]
    assert {r["direction"] for r in beats} == {"c2s", "s2c"}
    assert len(beats) >= 2 * (int(gt["idle_seconds"]) - 1) and {r["channel"] for r in beats} == {0}


def late_frames(rows: list) -> dict[tuple[str, int], tuple[int, int]]:
    """(connection, frame index) -> (gap, interval) of every frame ending a silence of its direction
    longer than the interval negotiated then, worked out one frame at a time (0-9-1: the tune-ok
    heartbeat for both directions; 1.0: the other peer's open idle-time-out)."""
    interval: dict[tuple[str, str], int | None] = {}
    last: dict[tuple[str, str], int] = {}
    late = {}
    for r in rows:
        side = (r.connection_id, r.direction)
        if r.method == "connection.tune-ok" and r.direction == "c2s":
            for direction in ("c2s", "s2c"):
                interval[(r.connection_id, direction)] = r.heartbeat * 1_000_000 or None
        elif r.protocol == "amqp-1.0" and r.method == "open":
            other = "s2c" if r.direction == "c2s" else "c2s"
            interval[(r.connection_id, other)] = (r.idle_time_out or 0) * 1000 or None
        due = interval.get(side)
        if due and side in last and r.ts_us - last[side] > due:
            late[(r.connection_id, r.frame_index)] = (r.ts_us - last[side], due)
        last[side] = r.ts_us
    return late


@pytest.mark.parametrize("scenario", ["amqp091_heartbeats", "amqp10_drain_idle"])
def test_idle_connections_keep_their_heartbeats(
    spark, captures: dict[str, Path], broker: PrivateBroker, scenario: str
) -> None:
    frames = live_frames(spark, captures[scenario], broker)
    late = late_frames(frames.orderBy("connection_id", "frame_index").collect())
    timeline = idle_gaps_timeline(frames).collect()
    assert {(r.connection_id, r.frame_index): (r.gap_us, r.interval_us) for r in timeline} == late
    assert all(r.allowed_us == 2 * r.interval_us for r in timeline)
    # Client and broker heartbeating as negotiated: no silence reaches two intervals.
    rules = [rule for rule in load_rules() if rule.table == "idle_gaps"]
    assert [violations(idle_gaps_timeline(frames), rule).count() for rule in rules] == [0, 0]


def test_amqp091_blocked(captures: dict[str, Path], rows: dict[str, list[dict]]) -> None:
    gt, frames = truth(captures["amqp091_blocked"]), rows["amqp091_blocked"]
    assert gt["events"] == [f"blocked:{gt['blocked_reason']}", "unblocked"]
    alarms = [
        (r["method"], r.get("reason")) for r in frames if r["method"] in ("connection.blocked", "connection.unblocked")
    ]
    assert alarms == [("connection.blocked", gt["blocked_reason"]), ("connection.unblocked", None)]
    assert counts(frames)["c2s", "basic.publish"] == gt["messages_published"]


def test_amqp10_large_deliveries(captures: dict[str, Path], rows: dict[str, list[dict]]) -> None:
    gt, frames = truth(captures["amqp10_large"]), rows["amqp10_large"]
    completed = [r for r in frames if r["method"] == "transfer" and r.get("message_size") is not None]
    assert len(completed) == gt["messages_sent"] + gt["messages_received"]
    for row in completed:
        # Each message took several frames, and its size is the sum of their payloads.
        assert row["delivery_frames"] > 1
        assert row["message_size"] == sum(row["section_sizes"].values())
        assert max(r["frame_size"] for r in frames) <= gt["client_max_frame_size"]
    by_subject = {(r["direction"], r["subject"]): r for r in completed}
    first = by_subject["c2s", "large data"]
    assert first["message_id"] == str(gt["first_message_id"]) and first["body_kind"] == "data"
    assert first["section_sizes"]["data"] == gt["body_size"] + 8  # descriptor 3, vbin32 5
    assert json.loads(first["arguments"]["application-properties"]) == {"index": 1, "kind": "data", "flag": True}
    assert first["arguments"]["properties.group-id"] == "group-a" and first["priority"] == 6
    kinds = {r["subject"]: r["body_kind"] for r in completed if r["direction"] == "s2c"}
    assert kinds == dict(zip(("large data", "large value", "large sequence"), gt["body_sections"]))


def test_amqp10_drain_and_idle_empty_frames(captures: dict[str, Path], rows: dict[str, list[dict]]) -> None:
    gt, frames = truth(captures["amqp10_drain_idle"]), rows["amqp10_drain_idle"]
    [drain] = [r for r in frames if r["method"] == "flow" and r["direction"] == "c2s" and r["drain"]]
    assert drain["link_credit"] == gt["drain_credit"]
    # The broker answers by spending the credit it could not use: credit 0, delivery-count advanced.
    answers = [
        r
        for r in frames
        if r["method"] == "flow"
        and r["direction"] == "s2c"
        and r["handle"] == drain["handle"]
        and r["frame_index"] > drain["frame_index"]
        and r["link_credit"] == 0
    ]
    assert answers and answers[-1]["delivery_count"] >= gt["messages_received"]
    empty = Counter(r["direction"] for r in frames if r["frame_type"] == "empty")
    assert empty["c2s"] >= gt["idle_seconds"] - 1 and empty["s2c"] >= gt["idle_seconds"] - 1
    [broker_open] = [r for r in frames if r["method"] == "open" and r["direction"] == "s2c"]
    assert broker_open["idle_time_out"] == int(gt["broker_idle_timeout_s"] * 1000)
