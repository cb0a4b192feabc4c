"""Live: the rules and events of issue 14 on fresh captures of RabbitMQ 3.10.8 and qpid-proton
(``testbed.rule_scenarios``), against what the client saw and what the spec says the frames must be.

- a drain on a classic queue: the broker ends the session with amqp:internal-error, an event (the
  receiver settles nothing, so that the capture always shows that end);
- a drain on a quorum queue: the broker's answer carries a delivery-count other than the drain's
  (the receiver's delivery-count plus the credit), and it sends transfers after its own flow said
  link-credit 0: flagged by the drain rules, frame by frame;
- a pipelined open (open, two begins and an attach before the broker's open): nothing flagged.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from amqpscope.expectations.catalogue import load_rules, rules_for, violations
from amqpscope.jobs.stages.decode import decode_captures, resolve_captures
from amqpscope.pipelines.events import events_timeline
from amqpscope.pipelines.tables import Build
from testbed import rule_scenarios
from testbed.broker import RABBITMQ_BIN, PrivateBroker
from testbed.capture import capture_scenario, truth_path

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not (RABBITMQ_BIN / "rabbitmq-server").exists(), reason="rabbitmq-server not installed"),
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root"),
]

RULES = {rule.id: rule for rule in load_rules()}
# The tables the AMQP 1.0 rules read, as analyze builds them from the frames.
AMQP10_RULE_TABLES = ("link_credit", "link_state", "session_window", "frame_limits", "lifecycle_10", "idle_gaps")


@pytest.fixture(scope="module")
def broker() -> Iterator[PrivateBroker]:
    with PrivateBroker() as private:
        yield private


@pytest.fixture(scope="module")
def captures(broker: PrivateBroker, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("rule-captures")
    with rule_scenarios.registered():
        return {name: capture_scenario(name, out, broker=broker) for name in sorted(rule_scenarios.RULE_SCENARIOS)}


def truth(capture: Path) -> dict:
    [gt] = json.loads(truth_path(capture).read_text())["ground_truth"].values()
    return gt


def frames_of(spark, capture: Path, broker: PrivateBroker):
    return decode_captures(spark, resolve_captures([str(capture)]), (broker.port,)).frames


def found(frames, tables=AMQP10_RULE_TABLES) -> dict[str, list[int]]:
    """Every rule on ``tables`` that flags something: the packet numbers it flags."""
    result = {}
    for table in tables:
        timeline = Build({"frames": frames}).table(table)
        for rule in rules_for(table):
            packets = sorted(r.packet_number for r in violations(timeline, rule).collect())
            if packets:
                result[rule.id] = packets
    return result


def test_drain_on_a_classic_queue_ends_the_session_with_an_event(spark, captures, broker):
    gt = truth(captures["amqp10_drain_classic"])
    assert gt["session_error"] == "amqp:internal-error"  # what the client was told
    frames = frames_of(spark, captures["amqp10_drain_classic"], broker)
    [end] = frames.filter("method = 'end' AND direction = 's2c'").collect()
    assert end.error_condition == gt["session_error"]
    # The receiver settled nothing (an accept can race the broker's crash: testbed.rule_scenarios).
    accepts = frames.filter("method = 'disposition' AND direction = 'c2s'").count()
    assert (gt["messages_accepted"], accepts) == (0, 0)
    events = events_timeline(frames).collect()
    assert [(e.event_id, e.severity, e.condition, e.packet_number) for e in events] == [
        ("amqp10.session.ended_with_error", "info", gt["session_error"], end.packet_number)
    ]
    assert not {rule for rule in found(frames) if RULES[rule].severity == "error"}


def drain_faults(rows: list) -> tuple[list[int], list[int]]:
    """Worked out frame by frame from the spec (2.6.7): the broker's flows answering the client's
    drain with link-credit 0 but a delivery-count other than the drain's delivery-count + credit,
    and the transfers the broker started after such a flow and before the client's next flow."""
    short_answers, late_transfers = [], []
    target = None
    stopped = False
    for r in rows:
        if r.method == "flow" and r.direction == "c2s" and r.handle is not None:
            target = (r.delivery_count or 0) + r.link_credit if r.drain else None
            stopped = False
        elif r.method == "flow" and r.direction == "s2c" and r.handle is not None and r.link_credit is not None:
            stopped = r.link_credit == 0
            if target is not None and r.link_credit == 0 and r.delivery_count != target % 2**32:
                short_answers.append(r.packet_number)
        elif r.method == "transfer" and r.direction == "s2c" and stopped and r.delivery_id is not None:
            late_transfers.append(r.packet_number)
    return short_answers, late_transfers


def test_drain_on_a_quorum_queue_is_flagged_frame_by_frame(spark, captures, broker):
    gt = truth(captures["amqp10_drain_quorum"])
    frames = frames_of(spark, captures["amqp10_drain_quorum"], broker)
    rows = frames.filter("frame_type = 'amqp'").orderBy("frame_index").collect()
    [drain] = [r for r in rows if r.method == "flow" and r.direction == "c2s" and r.drain]
    assert drain.link_credit == gt["drain_credit"]
    assert sum(r.method == "transfer" and r.direction == "s2c" for r in rows) == gt["messages_received"]
    short_answers, late_transfers = drain_faults(rows)
    assert short_answers and late_transfers  # RabbitMQ 3.10.8's faults are on the wire
    flagged = found(frames)
    assert flagged.get("amqp10.link.drain_not_honoured") == short_answers
    assert flagged.get("amqp10.link.transfer_after_sender_announced_no_credit") == late_transfers


def test_pipelined_open_with_two_sessions_is_not_flagged(spark, captures, broker):
    gt = truth(captures["amqp10_pipelined_sessions"])
    assert (gt["sessions_opened"], gt["messages_accepted"]) == (2, 1)
    frames = frames_of(spark, captures["amqp10_pipelined_sessions"], broker)
    rows = frames.filter("frame_type = 'amqp'").orderBy("frame_index").collect()
    [broker_open] = [r for r in rows if r.method == "open" and r.direction == "s2c"]
    pipelined = [r for r in rows if r.direction == "c2s" and r.frame_index < broker_open.frame_index]
    # The client's begin on channel 1 (and its attach there) went out before the broker's open.
    assert {(r.method, r.channel) for r in pipelined} >= {("open", 0), ("begin", 0), ("begin", 1), ("attach", 1)}
    assert found(frames) == {}
    assert events_timeline(frames).count() == 0
