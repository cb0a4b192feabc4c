"""TCP-level findings on TLS connections that were not decrypted (the ``diagnosis.encrypted.*`` rules
of expectations/bottlenecks.yml), on the
TLS captures of ``samples/tls`` read without their key logs: the slow reader's client is found not
reading from its TCP alone, healthy traffic gives nothing, and decrypted connections are left to
the AMQP rules."""

from __future__ import annotations

import json
from pathlib import Path

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.expectations.bottleneck_rules import load_bottleneck_rules
from amqpscope.ingest.capture import decode_capture
from amqpscope.pipelines.diagnosis.findings import rule_findings
from amqpscope.pipelines.diagnosis.measures import Inputs, Tables
from amqpscope.pipelines.tcp_flow import tcp_flow_timeline
from amqpscope.schemas.frames import CONNECTIONS_SCHEMA
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA
from tests.paths import SAMPLES
from tests.test_parallel_ingest import as_python

TLS = SAMPLES / "tls"


def findings(spark, capture: Path, keys: bool = False) -> list:
    rows: dict[str, list[dict]] = {"connections": [], "tcp_segments": []}
    keylog = [capture.with_suffix(".keylog")] if keys else []
    for kind, row in decode_capture(capture, "c", segments=True, tls_keylog=keylog):
        if kind in rows:
            rows[kind].append(row)
    segments = spark.createDataFrame(
        [as_python(r, TCP_SEGMENTS_SCHEMA) for r in rows["tcp_segments"]], TCP_SEGMENTS_SCHEMA
    )
    connections = spark.createDataFrame(
        [as_python(r, CONNECTIONS_SCHEMA) for r in rows["connections"]], CONNECTIONS_SCHEMA
    )
    # The encrypted rules read the TCP segments and the connections alone.
    unread = {name: None for name in Tables.__dataclass_fields__}
    measures = Inputs(
        Tables(**{**unread, "tcp_flow": tcp_flow_timeline(segments), "connections": connections}), DiagnosisThresholds()
    )
    rules = [r for r in load_bottleneck_rules() if r.id.startswith("diagnosis.encrypted.")]
    assert len(rules) == 2
    return [row for rule in rules for row in rule_findings(rule, measures).collect()]


def test_the_slow_reader_is_found_not_reading_from_tcp_alone(spark):
    capture = TLS / "slow-reader-tls13.pcap"
    truth = json.loads(capture.with_name(f"{capture.stem}.truth.json").read_text())
    (reader,) = [c for c in truth["ground_truth"]["slow_reader_small"]["clients"] if c["role"] == "consumer"]
    found = findings(spark, capture)
    assert [(f.rule_id, f.component, f.effect) for f in found] == [
        ("diagnosis.encrypted.client_not_reading", "client", "client_not_reading")
    ]
    (finding,) = found
    assert finding.connection_id.startswith(f"127.0.0.1:{reader['client_port']}-")
    assert finding.duration_us >= DiagnosisThresholds().min_held_ms * 1000
    # Stalls: the client's zero-window and window-full intervals, overlapping ones counted once.
    assert int(finding.evidence["stalls"]) > 0
    assert "give --tls-keylog" in finding.explanation


def test_healthy_encrypted_traffic_gives_no_finding(spark):
    assert findings(spark, TLS / "amqp091-qos-confirms-tls13-aes256gcm.pcap") == []


def test_decrypted_connections_are_left_to_the_amqp_rules(spark):
    assert findings(spark, TLS / "slow-reader-tls13.pcap", keys=True) == []
