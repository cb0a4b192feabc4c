"""``amqpscope diagnose`` lists the problems found beside the verdict after the bottleneck (text), and
``--json`` carries every finding's kind and severity and the problems apart; problems alone leave the
exit status at 0 (3 is a bottleneck)."""

from __future__ import annotations

import json
from datetime import datetime

from amqpscope.jobs.cli.diagnose import exit_code, render_json, render_text
from amqpscope.jobs.cli.outcomes import ExitCode


def finding(rank: int, kind: str, severity: str, rule_id: str, component: str, effect: str, sentence: str) -> dict:
    return dict(
        capture_id="c" * 16,
        rank=rank,
        finding_id=f"f{rank}",
        rule_id=rule_id,
        kind=kind,
        severity=severity,
        component=component,
        effect=effect,
        entity_kind="channel",
        entity="127.0.0.1:41001 channel 1",
        start_ts=datetime(2026, 1, 1, 12, 0, 0),
        end_ts=None,
        start_packet_number=10,
        end_packet_number=None,
        duration_us=0,
        lifetime_share=0.0,
        confidence=0.95,
        explanation=sentence,
        wireshark_filter="tcp.port == 41001",
        evidence={"returned": "8"},
    )


RETURNED = finding(
    2, "problem", "warning", "diagnosis.publisher.unroutable", "channel", "messages_returned", "Returned 8."
)
CLOSED = finding(3, "problem", "info", "diagnosis.channel.closed_with_error", "channel", "closed_with_error", "Closed.")
REFUSED = finding(1, "bottleneck", "warning", "diagnosis.publisher.refused", "queue", "publishes_refused", "Refused.")


def answer(bottleneck: str, findings: list[dict]) -> dict:
    return dict(
        file="x.pcap",
        capture_id="c" * 16,
        bottleneck=bottleneck,
        headline="the headline",
        findings=findings,
        problems_count=sum(f["kind"] == "problem" for f in findings),
    )


def test_the_text_lists_the_problems_after_the_bottleneck_with_their_severity():
    lines = render_text([answer("queue", [REFUSED, RETURNED, CLOSED])]).splitlines()
    assert lines[2].startswith("  1. queue / publishes_refused: channel 127.0.0.1:41001 channel 1, 12:00:00.000")
    assert lines[5] == "  Problems beside the verdict (1 warning, 1 info):"
    assert lines[6].startswith("  2. [warning] channel / messages_returned: channel ")
    assert lines[7] == "     Returned 8."
    assert lines[9].startswith("  3. [info] channel / closed_with_error: ")


def test_json_carries_kind_and_severity_and_lists_the_problems():
    (capture,) = json.loads(render_json([answer("none", [RETURNED, CLOSED])]))["captures"]
    assert [(f["kind"], f["severity"]) for f in capture["findings"]] == [("problem", "warning"), ("problem", "info")]
    assert capture["problems"] == [
        dict(
            finding_id="f2",
            rank=2,
            severity="warning",
            rule_id="diagnosis.publisher.unroutable",
            component="channel",
            entity="127.0.0.1:41001 channel 1",
            explanation="Returned 8.",
        ),
        dict(
            finding_id="f3",
            rank=3,
            severity="info",
            rule_id="diagnosis.channel.closed_with_error",
            component="channel",
            entity="127.0.0.1:41001 channel 1",
            explanation="Closed.",
        ),
    ]
    # Evidence typed by the rule's units (returned: a count).
    assert capture["findings"][0]["evidence"] == {"returned": 8}


def test_problems_alone_exit_0_and_a_bottleneck_3():
    assert exit_code([answer("none", [RETURNED])]) == ExitCode.OK
    assert exit_code([answer("queue", [REFUSED, RETURNED])]) == ExitCode.BOTTLENECK
