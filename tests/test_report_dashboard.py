"""The report as a dashboard: the answer first, operator context, charts, drill-down, data quality.

Inputs are hand-made rows in the tables' declared schemas (the diagnosis pipeline fills the
bottlenecks / diagnosis tables elsewhere); expected values are worked out here from those rows.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import pyspark.sql.functions as F
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType
from pyspark.testing import assertDataFrameEqual

from amqpscope.ingest.reasons import REASONS
from amqpscope.jobs.report.page import _plotly_js, anchor, write_report
from amqpscope.pipelines.accounting import byte_accounting
from amqpscope.pipelines.dq_summary import dq_summary
from amqpscope.pipelines.report import series_grid as S
from amqpscope.pipelines.report.chart_series import chart_series
from amqpscope.pipelines.report.context import connection_context
from amqpscope.pipelines.throughput import message_events
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA, DIAGNOSIS_SCHEMA
from amqpscope.schemas.flow import (
    CHANNEL_CONFIRMS_SCHEMA,
    CHANNEL_UNACKED_SCHEMA,
    CONSUMER_UNACKED_SCHEMA,
    FLOW_INTERVALS_SCHEMA,
    LINK_STATE_SCHEMA,
)
from amqpscope.schemas.frames import CAPTURES_SCHEMA, CONNECTIONS_SCHEMA, FRAMES_SCHEMA, QUARANTINE_SCHEMA
from amqpscope.schemas.tcp import TCP_FLOW_SCHEMA
from amqpscope.schemas.verdicts import VIOLATIONS_SCHEMA

T0 = datetime(2024, 5, 1, 12, 0, 0)
HOSTILE = "<script>alert('x')</script>"
HOSTILE_IMG = '<img src=x onerror="window.pwned=1">'


def table(spark: SparkSession, schema: StructType, rows: list[dict[str, Any]]) -> DataFrame:
    """Rows given by column name; the columns not given are null."""
    return spark.createDataFrame([{**{n: None for n in schema.fieldNames()}, **r} for r in rows], schema)


def frame(i: int, connection: str, direction: str, method: str | None, **extra: Any) -> dict[str, Any]:
    return dict(
        capture_id="cap",
        connection_id=connection,
        direction=direction,
        frame_index=i,
        ts=T0 + timedelta(milliseconds=10 * i),
        ts_us=0,
        packet_number=i + 1,
        stream_offset=0,
        frame_size=extra.pop("frame_size", 20),
        protocol=extra.pop("protocol", "amqp-0-9-1"),
        frame_type=extra.pop("frame_type", "method"),
        method=method,
        channel=extra.pop("channel", 0),
        **extra,
    )


FRAMES = [
    frame(
        0,
        "c1",
        "s2c",
        "connection.start",
        arguments={"server-properties": '{"product":"RabbitMQ","version":"3.10.8","cluster_name":"rabbit@h"}'},
    ),
    frame(
        1,
        "c1",
        "c2s",
        "connection.start-ok",
        mechanism="PLAIN",
        arguments={
            "client-properties": json.dumps({"product": "pika", "version": "1.3.2", "connection_name": HOSTILE})
        },
    ),
    frame(2, "c1", "c2s", "connection.tune-ok", frame_max=131072, channel_max=2047, heartbeat=60),
    frame(3, "c1", "c2s", "connection.open", arguments={"virtual-host": "/prod"}),
    frame(4, "c1", "s2c", "basic.deliver", channel=1, consumer_tag=HOSTILE, delivery_tag=1),
    frame(5, "c1", "s2c", None, channel=1, frame_type="header", body_size=64),
    frame(
        6,
        "c2",
        "c2s",
        "open",
        protocol="amqp-1.0",
        frame_type="amqp",
        container_id="orders-app",
        hostname="vhost:/",
        max_frame_size=4096,
        channel_max=255,
        idle_time_out=30000,
        arguments={"properties": '{"product":"QpidProton","version":"0.39.0"}'},
    ),
    frame(
        7,
        "c2",
        "s2c",
        "open",
        protocol="amqp-1.0",
        frame_type="amqp",
        container_id="rabbit@h",
        max_frame_size=131072,
        channel_max=65535,
        idle_time_out=60000,
        arguments={"properties": '{"product":"RabbitMQ","version":"3.10.8"}'},
    ),
]

CONNECTIONS = [
    dict(
        capture_id="cap",
        connection_id="c1",
        client_address="10.0.0.1",
        client_port=40000,
        server_address="10.0.0.9",
        server_port=5672,
        protocol="amqp-0-9-1",
        protocol_inferred=False,
        first_ts=T0,
        last_ts=T0 + timedelta(seconds=2),
        frames=6,
        c2s_bytes=60,
        s2c_bytes=60,
        c2s_missing_bytes=0,
        s2c_missing_bytes=0,
        retransmitted_bytes=0,
    ),
    dict(
        capture_id="cap",
        connection_id="c2",
        client_address="10.0.0.2",
        client_port=40001,
        server_address="10.0.0.9",
        server_port=5672,
        protocol="amqp-1.0",
        protocol_inferred=False,
        first_ts=T0,
        last_ts=T0 + timedelta(seconds=1),
        frames=2,
        c2s_bytes=20,
        s2c_bytes=20 + 7,
        c2s_missing_bytes=5,
        s2c_missing_bytes=0,
        retransmitted_bytes=0,
    ),
    dict(
        capture_id="cap",
        connection_id="t1",
        client_address="10.0.0.3",
        client_port=40002,
        server_address="10.0.0.9",
        server_port=5671,
        protocol="tls",
        protocol_inferred=False,
        first_ts=T0,
        last_ts=T0,
        frames=0,
        c2s_bytes=300,
        s2c_bytes=900,
        c2s_missing_bytes=0,
        s2c_missing_bytes=0,
        retransmitted_bytes=0,
    ),
]

QUARANTINE = [
    dict(
        capture_id="cap",
        connection_id="c2",
        direction="s2c",
        stream_offset=20,
        byte_count=7,
        packet_number=8,
        missing=False,
        reason="unframeable bytes: frame size 3 is below the 8-byte minimum",
        reason_id="amqp10.frame.size_below_minimum",
        found="3",
    ),
    dict(
        capture_id="cap",
        connection_id="c2",
        direction="c2s",
        stream_offset=20,
        byte_count=5,
        packet_number=7,
        missing=True,
        reason="capture gap: bytes missing from the capture",
        reason_id="tcp.gap",
    ),
    # One cause, two sentences: the report groups by the reason's id.
    dict(
        capture_id="cap",
        connection_id="t1",
        direction="c2s",
        stream_offset=0,
        byte_count=300,
        packet_number=9,
        missing=False,
        reason="not decoded: TLS handshake",
        reason_id="connection.tls",
    ),
    dict(
        capture_id="cap",
        connection_id="t1",
        direction="s2c",
        stream_offset=0,
        byte_count=900,
        packet_number=9,
        missing=False,
        reason="not decoded: TLS handshake (server hello)",
        reason_id="connection.tls",
    ),
]

VIOLATIONS = [
    dict(
        capture_id="cap",
        rule_id="amqp091.consumer.unacked_above_prefetch",
        severity="error",
        description="above prefetch",
        connection_id="c1",
        channel=1,
        frame_index=4,
        ts=T0 + timedelta(milliseconds=40),
        evidence={"unacked": "3", "note": HOSTILE},
    ),
    dict(
        capture_id="cap",
        rule_id="amqp10.frames.after_close",
        severity="warning",
        description="late",
        connection_id="c2",
        channel=0,
        frame_index=7,
        ts=T0 + timedelta(milliseconds=70),
        evidence={},
    ),
]


def captures(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [("cap", "cap.pcap", 4096, [("cap.pcap", 4096, "cap")], 10, T0, T0 + timedelta(seconds=2), "EN10MB", "ok", 1)],
        CAPTURES_SCHEMA,
    )


def finding(rank: int, **extra: Any) -> dict[str, Any]:
    return {
        **dict(
            capture_id="cap",
            rank=rank,
            finding_id=f"f{rank}",
            rule_id="diagnosis.alarm.blocked",
            connection_id="c1",
            entity_kind="connection",
            entity="10.0.0.1:40000",
            connection_name=None,
            client="10.0.0.1:40000",
            component="memory_alarm",
            effect="blocked",
            severity="warning",
            start_ts=T0 + timedelta(milliseconds=10),
            end_ts=T0 + timedelta(milliseconds=1410),
            start_packet_number=2,
            end_packet_number=3,
            duration_us=1_400_000,
            lifetime_share=0.7,
            confidence=0.95,
            evidence={"reason": "low on memory", "notifications": "1"},
            packet_numbers=[2, 3],
            wireshark_filter="frame.number in {2 3}",
            explanation="The broker blocked publishing on this connection: memory alarm.",
        ),
        **extra,
    }


def diagnosis_row(bottleneck: str, headline: str, findings: list[dict[str, Any]]) -> dict[str, Any]:
    summaries = [
        {
            k: f[k]
            for k in (
                "rank",
                "component",
                "effect",
                "entity_kind",
                "entity",
                "connection_id",
                "start_ts",
                "end_ts",
                "start_packet_number",
                "confidence",
                "explanation",
            )
        }
        for f in findings
    ]
    top = findings[0] if findings else {}
    return dict(
        capture_id="cap",
        bottleneck=bottleneck,
        effect=top.get("effect"),
        entity_kind=top.get("entity_kind"),
        entity=top.get("entity"),
        connection_id=top.get("connection_id"),
        start_packet_number=top.get("start_packet_number"),
        headline=headline,
        findings_count=len(findings),
        findings=summaries,
    )


def flow_tables(spark: SparkSession) -> dict[str, DataFrame]:
    """One consumer (hostile tag), one link (hostile name), one confirming channel, TCP segments, intervals."""
    key = dict(capture_id="cap", connection_id="c1", channel=1, direction="s2c")
    unacked = [
        dict(
            key,
            frame_index=10 + i,
            ts=T0 + timedelta(milliseconds=100 * i),
            method="basic.deliver",
            packet_number=20 + i,
            consumer_tag=HOSTILE,
            queue=HOSTILE,
            delivery_tag=i + 1,
            settled=0,
            unacked=n,
            prefetch_count=2,
            channel_unacked=n,
        )
        for i, n in enumerate([1, 2, 1, 2])
    ]
    link = [
        dict(
            capture_id="cap",
            connection_id="c2",
            channel=0,
            frame_index=20 + i,
            ts=T0 + timedelta(milliseconds=50 * i),
            direction="c2s",
            method="transfer",
            packet_number=30 + i,
            handle=0,
            link_name=HOSTILE_IMG,
            attach_seen=True,
            role="sender",
            sender_side="client",
            target_address=HOSTILE,
            is_new_delivery=True,
            payload_size=10,
            delivery_count_snd=i + 1,
            link_credit_snd=4 - i,
            unsettled=0,
        )
        for i in range(3)
    ]
    confirms = [
        dict(
            key,
            direction="c2s",
            frame_index=30 + i,
            ts=T0 + timedelta(milliseconds=20 * i),
            method="basic.publish",
            packet_number=40 + i,
            publish_seq=i + 1,
            published=i + 1,
            confirmed=0,
            outstanding=i + 1,
        )
        for i in range(3)
    ]
    tcp = [
        dict(
            capture_id="cap",
            connection_id="c1",
            direction="s2c",
            packet_number=50 + i,
            ts=T0 + timedelta(milliseconds=30 * i),
            ts_us=0,
            payload_length=100,
            effective_window=w,
            is_zero_window=w == 0,
            is_window_update=False,
            is_window_full=False,
            is_retransmission=False,
            retransmitted_bytes=0,
            is_zero_window_probe=False,
            is_keep_alive=False,
            is_spurious_retransmission=False,
        )
        for i, w in enumerate([65535, 0, 65535])
    ]
    intervals = [
        dict(
            capture_id="cap",
            connection_id="c1",
            entity="consumer",
            cause="prefetch_full",
            channel=1,
            consumer_tag=HOSTILE,
            direction="s2c",
            start_ts=T0 + timedelta(milliseconds=100),
            end_ts=T0 + timedelta(milliseconds=200),
            duration_us=100_000,
            start_packet_number=21,
            end_packet_number=22,
            detail=HOSTILE,
        ),
        dict(
            capture_id="cap",
            connection_id="c1",
            entity="connection",
            cause="connection_blocked",
            direction="c2s",
            start_ts=T0 + timedelta(milliseconds=10),
            end_ts=None,
            duration_us=None,
            start_packet_number=2,
            detail="low on memory",
        ),
    ]
    return {
        "consumer_unacked": table(spark, CONSUMER_UNACKED_SCHEMA, unacked),
        "link_state": table(spark, LINK_STATE_SCHEMA, link),
        "channel_confirms": table(spark, CHANNEL_CONFIRMS_SCHEMA, confirms),
        "tcp_flow": table(spark, TCP_FLOW_SCHEMA, tcp),
        "flow_intervals": table(spark, FLOW_INTERVALS_SCHEMA, intervals),
    }


class Page(HTMLParser):
    """Element ids, in-page links, script blocks (with their text) and the text of the page in order."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.text: list[str] = []
        self._script: dict[str, str | None] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.append(found["id"] or "")
        if tag == "a":
            self.links.append(found.get("href") or "")
        if tag == "script":
            self._script = found

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self.scripts.append((self._script, data))
        else:
            self.text.append(data)


HEADLINE = "Publishing on 10.0.0.1:40000 was blocked by a memory alarm for 1.4 s."


@pytest.fixture(scope="module")
def full(spark, tmp_path_factory) -> tuple[str, Page]:
    """The page with every table: flow state, a diagnosis with two findings (the second one's entity hostile)."""
    findings = [
        finding(1),
        finding(
            2,
            finding_id="f2",
            entity=HOSTILE,
            component="consumer",
            effect="deliveries_wait_for_acks",
            entity_kind="consumer",
            consumer_tag=HOSTILE,
            channel=1,
            packet_numbers=[],
        ),
    ]
    return render(
        spark,
        tmp_path_factory.mktemp("full"),
        flow=flow_tables(spark),
        diagnosis=table(spark, DIAGNOSIS_SCHEMA, [diagnosis_row("memory_alarm", HEADLINE, findings)]),
        bottlenecks=table(spark, BOTTLENECKS_SCHEMA, findings),
    )


def series_rows(spark: SparkSession, flow: dict[str, DataFrame]) -> list[dict[str, Any]]:
    """The chart_series rows derive would store for these tables (pipelines.report.chart_series)."""
    unacked = flow["consumer_unacked"]
    channel = unacked.select(
        *[
            F.col(c) if c in unacked.columns else F.lit(None).cast(f.dataType).alias(c)
            for c, f in ((f.name, f) for f in CHANNEL_UNACKED_SCHEMA.fields)
        ]
    )
    frames = table(spark, FRAMES_SCHEMA, FRAMES)
    rows = chart_series(
        captures=captures(spark),
        frames=frames,
        message_events=message_events(frames, flow["link_state"]),
        link_state=flow["link_state"],
        consumer_unacked=unacked,
        channel_unacked=channel,
        channel_confirms=flow["channel_confirms"],
        tcp_flow=flow["tcp_flow"],
        flow_intervals=flow["flow_intervals"],
        violations=table(spark, VIOLATIONS_SCHEMA, VIOLATIONS),
    ).collect()
    return [r.asDict() for r in rows]


def render(spark: SparkSession, tmp_path, **extra: Any) -> tuple[str, Page]:
    arguments: dict[str, Any] = dict(
        frames=table(spark, FRAMES_SCHEMA, FRAMES),
        connections=table(spark, CONNECTIONS_SCHEMA, CONNECTIONS),
        violations=table(spark, VIOLATIONS_SCHEMA, VIOLATIONS),
        captures=captures(spark),
        verdicts=None,
        data_docs_index=None,
        quarantine=table(spark, QUARANTINE_SCHEMA, QUARANTINE),
    )
    arguments.update(extra)
    if "flow" in extra and "chart_series" not in extra:
        arguments["chart_series"] = series_rows(spark, extra["flow"])
    page = write_report(tmp_path / "report.html", **arguments).read_text(encoding="utf-8")
    parsed = Page()
    parsed.feed(page)
    return page, parsed


def words(parsed: Page) -> str:
    return " ".join(" ".join(parsed.text).split())


# --- the answer first --------------------------------------------------------------------------


def test_the_diagnosis_comes_first_with_findings_filters_and_drill_down(full):
    _, parsed = full
    text = words(parsed)
    assert f"Bottleneck: memory_alarm {HEADLINE}" in text
    # The answer, then the violations, then the context.
    assert text.index(HEADLINE) < text.index("Rule violations") < text.index("Operator context")
    assert "frame.number in {2 3}" in text
    assert "notifications 1 reason low on memory" in text  # the evidence map, as a definition list
    # The frames the finding points at: packets 2 and 3 are c1's start-ok and tune-ok (FRAMES).
    assert "2 2024-05-01 12:00:00.010000 c2s 0 method connection.start-ok 20" in text
    assert "3 2024-05-01 12:00:00.020000 c2s 0 method connection.tune-ok 20" in text
    connection = anchor("cap", "connection", "c1")
    assert f"#{connection}" in parsed.links  # the first finding links to its connection ...
    assert connection in parsed.ids  # ... whose section is in the page
    consumer = anchor("cap", "consumer", "c1", 1, HOSTILE)
    assert f"#{consumer}" in parsed.links and consumer in parsed.ids  # the second, to its consumer
    finding_anchor = next(i for i in parsed.ids if i.endswith("-finding-1"))
    assert f"#{finding_anchor}" in parsed.links  # and the connection's section links back


def test_no_bottleneck_is_said_plainly(spark, tmp_path):
    headline = "No bottleneck: every entity kept up with its traffic."
    page, parsed = render(
        spark,
        tmp_path,
        diagnosis=table(spark, DIAGNOSIS_SCHEMA, [diagnosis_row("none", headline, [])]),
        bottlenecks=table(spark, BOTTLENECKS_SCHEMA, []),
    )
    assert f"No bottleneck found. {headline}" in words(parsed)
    assert "Bottleneck:" not in words(parsed)
    assert 'class="findings"' not in page  # no findings table


# --- operator context and data quality ----------------------------------------------------------


def test_connection_context_reads_products_names_and_limits(spark):
    context = connection_context(table(spark, FRAMES_SCHEMA, FRAMES), table(spark, CONNECTIONS_SCHEMA, CONNECTIONS))
    assertDataFrameEqual(
        context.select(
            "connection_id",
            "broker_product",
            "broker_version",
            "client_product",
            "client_version",
            "connection_name",
            "vhost",
            "sasl_mechanism",
            "frame_max",
            "channel_max",
            "heartbeat_s",
        ),
        [
            ("c1", "RabbitMQ", "3.10.8", "pika", "1.3.2", HOSTILE, "/prod", "PLAIN", 131072, 2047, 60),
            ("c2", "RabbitMQ", "3.10.8", "QpidProton", "0.39.0", "orders-app", "vhost:/", None, None, None, None),
            ("t1", None, None, None, None, None, None, None, None, None, None),
        ],
    )
    assertDataFrameEqual(
        context.where("connection_id = 'c2'").select(
            "client_max_frame_size",
            "broker_max_frame_size",
            "client_channel_max",
            "broker_channel_max",
            "client_idle_time_out_ms",
            "broker_idle_time_out_ms",
        ),
        [(4096, 131072, 255, 65535, 30000, 60000)],
    )


def test_report_shows_context_tls_and_data_quality(full):
    _, parsed = full
    text = words(parsed)
    assert "pika 1.3.2" in text and "RabbitMQ 3.10.8" in text
    assert "client 4,096 / broker 131,072" in text
    assert "client 30,000 ms / broker 60,000 ms" in text
    assert "TLS connections seen, not decoded" in text and "10.0.0.3:40002 10.0.0.9:5671 300 900" in text
    assert "keylog" in text
    # Byte accounting per direction. c2s: payload 60 + 20 + 300; framed: FRAMES' c2s frames 1, 2, 3
    # (c1) and 6 (c2), 20 bytes each; quarantined 300 (t1); missing 5 (c2); every connection balanced.
    assert "c2s 380 80 300 5 0" in text
    # s2c: payload 60 + 27 + 900; framed frames 0, 4, 5 (c1) and 7 (c2) = 80; quarantined 7 + 900.
    assert "s2c 987 80 907 0 0" in text
    assert f"connection.tls: {REASONS['connection.tls']} no 2 1,200 9" in text
    assert f"tcp.gap: {REASONS['tcp.gap']} yes 1 5 7" in text


def test_report_shows_the_accounting_it_is_given(spark, tmp_path):
    # analyze hands over the accounting derive checked: the report sums it instead of its own. One
    # byte more per connection row (three connections) shows which one it summed.
    given = byte_accounting(
        table(spark, CONNECTIONS_SCHEMA, CONNECTIONS),
        table(spark, FRAMES_SCHEMA, FRAMES),
        table(spark, QUARANTINE_SCHEMA, QUARANTINE),
    )
    _, parsed = render(spark, tmp_path, accounting=given.withColumn("payload_bytes", F.col("payload_bytes") + 1))
    text = words(parsed)
    assert "c2s 383 80 300 5 0" in text and "s2c 990 80 907 0 0" in text


@pytest.mark.parametrize("accounting_given", [False, True], ids=["computed", "given"])
def test_dq_summary_one_row_per_capture(spark, accounting_given):
    run_ts = datetime(2024, 5, 2, 8, 0, 0)
    findings = [finding(1)]
    connections = table(spark, CONNECTIONS_SCHEMA, CONNECTIONS)
    frames = table(spark, FRAMES_SCHEMA, FRAMES)
    quarantine = table(spark, QUARANTINE_SCHEMA, QUARANTINE)
    # derive hands over the accounting it checked, computed once and kept (jobs/stages/derive.py).
    accounting = byte_accounting(connections, frames, quarantine).localCheckpoint() if accounting_given else None
    summary = dq_summary(
        captures=captures(spark),
        connections=connections,
        frames=frames,
        quarantine=quarantine,
        accounting=accounting,
        violations=table(spark, VIOLATIONS_SCHEMA, VIOLATIONS),
        diagnosis=table(spark, DIAGNOSIS_SCHEMA, [diagnosis_row("memory_alarm", "h", findings)]),
        suite_of_rule={
            "amqp091.consumer.unacked_above_prefetch": "amqpscope.consumer_unacked",
            "amqp10.frames.after_close": "amqpscope.frames",
        },
        suites_run=["amqpscope.consumer_unacked", "amqpscope.frames", "amqpscope.link_credit"],
        run_id="run-1",
        run_ts=run_ts,
    )
    # c2s/s2c sums as in test_report_shows_context_tls_and_data_quality; c1 balances, c2 and t1 too.
    assert summary.collect()[0].asDict() == dict(
        capture_id="cap",
        run_id="run-1",
        run_ts=run_ts,
        file_name="cap.pcap",
        packets=10,
        amqp_connections=2,
        tls_connections=1,
        other_connections=0,
        frames=8,
        payload_bytes=380 + 987,
        framed_bytes=160,
        quarantined_bytes=1207,
        missing_bytes=5,
        bytes_accounted=True,
        gaps=1,
        violations_error=1,
        violations_warning=1,
        violations_capture=0,
        bottleneck="memory_alarm",
        bottleneck_entity="10.0.0.1:40000",
        findings=1,
        suites_run=3,
        suites_failed=["amqpscope.consumer_unacked", "amqpscope.frames"],
        suites_passed=False,
    )


# --- charts ---------------------------------------------------------------------------------------


def figures(parsed: Page) -> dict[str, dict[str, Any]]:
    """Each chart's figure by its title, from the page's JSON blocks."""
    found = {}
    for attrs, text in parsed.scripts:
        if attrs.get("type") == "application/json":
            figure = json.loads(text)
            found[figure["layout"]["title"]["text"]] = figure
    return found


def nonzero(trace: dict[str, Any]) -> list[tuple[float, float]]:
    """A count trace's buckets that saw something: (bucket start, value drawn)."""
    return [(round(x, 6), y) for x, y in zip(trace["x"], trace["y"]) if y]


def test_every_chart_is_drawn_from_the_flow_tables(full):
    page, parsed = full
    drawn = figures(parsed)
    unacked = drawn["Unacked deliveries and prefetch per consumer"]["data"]
    assert [t["y"] for t in unacked] == [[1, 2, 1, 2], [2, 2, 2, 2]]  # unacked, then prefetch
    assert unacked[0]["x"] == [0.0, 0.1, 0.2, 0.3]
    assert [t["y"] for t in drawn["Unacked deliveries per channel"]["data"]] == [[1, 2, 1, 2], [2, 2, 2, 2]]
    credit = drawn["AMQP 1.0 link credit per link (the sender's view)"]["data"]
    assert [t["y"] for t in credit] == [[4, 3, 2]] and credit[0]["x"] == [0.0, 0.05, 0.1]
    confirms = drawn["Publisher confirms outstanding per channel"]["data"]
    assert confirms[0]["y"] == [1, 2, 3]
    tcp = drawn["TCP receive window advertised, per connection and sender"]["data"]
    assert tcp[0]["y"] == [65535, 0, 65535]
    assert tcp[1]["name"] == "zero window" and tcp[1]["x"] == [0.03]
    # A 2 s capture: 10 ms buckets, every one of the 201 drawn, zero where nothing happened. c1's
    # basic.deliver of frame 4 (64 bytes) at 0.04 s; the link's three 10-byte deliveries at 0,
    # 0.05 and 0.1 s; one message in a 10 ms bucket is 100 msg/s.
    rates = {t["name"]: t for t in drawn["Messages and bytes per second per connection (10 ms buckets)"]["data"]}
    assert all(len(t["x"]) == 201 for t in rates.values())
    deliver = next(t for name, t in rates.items() if name.endswith("broker→client msg/s"))
    assert nonzero(deliver) == [(0.04, 100.0)]
    assert nonzero(next(t for name, t in rates.items() if name.endswith("broker→client bytes/s"))) == [(0.04, 6400.0)]
    assert nonzero(rates["orders-app client→broker msg/s"]) == [(0.0, 100.0), (0.05, 100.0), (0.1, 100.0)]
    assert nonzero(rates["orders-app client→broker bytes/s"]) == [(0.0, 1000.0), (0.05, 1000.0), (0.1, 1000.0)]
    assert nonzero(drawn["AMQP 1.0 deliveries per link"]["data"][0]) == [(0.0, 100.0), (0.05, 100.0), (0.1, 100.0)]
    # The link's target is a bare name: a queue (pipelines.addresses), published to three times.
    queues = {t["name"]: t for t in drawn["Message rates per queue: publish, deliver, redeliver, ack"]["data"]}
    queue = "/queues/&lt;script&gt;alert('x')&lt;/script&gt;"
    assert sorted(queues) == [f"{queue} {m}" for m in ("ack", "deliver", "publish", "redeliver")]
    assert nonzero(queues[f"{queue} publish"]) == [(0.0, 100.0), (0.05, 100.0), (0.1, 100.0)]
    assert nonzero(queues[f"{queue} deliver"]) == []
    # A queue's depth is drawn from queue_balance rows (tests/test_report_balance.py): none given, none drawn.
    assert not any(title.startswith("Ready messages") for title in drawn)
    # The consumer lives from 0 s to the capture's end (2 s), held at its prefetch from 0.1 to 0.2 s.
    utilisation = drawn["Consumer utilisation: the share of time each consumer could take a delivery"]["data"][0]
    assert utilisation["name"].endswith("(95% overall)")
    held = [round(x, 6) for x, y in zip(utilisation["x"], utilisation["y"]) if y < 100]
    assert held == [round(0.1 + 0.01 * i, 6) for i in range(10)]
    churn = {t["name"]: t for t in drawn["Connection and channel churn: opened and closed per second"]["data"]}
    assert nonzero(churn["connections opened"]) == [(0.07, 100.0)]  # the broker's 1.0 open, frame 7
    timeline = drawn["Timeline: entities, the intervals they were held back, findings and violations"]["data"]
    by_name = {t["name"]: t for t in timeline}
    assert by_name["prefetch_full"]["base"] == [0.1] and by_name["prefetch_full"]["x"] == [0.1]
    # Never unblocked: the interval runs to the capture's last packet (2 s).
    assert by_name["connection_blocked"]["base"] == [0.01]
    assert abs(by_name["connection_blocked"]["x"][0] - 1.99) < 1e-9
    assert sorted(by_name["error"]["x"] + by_name["warning"]["x"]) == [0.04, 0.07]
    # The plotting library is inlined once, with the loader; each chart's data block follows its chart.
    assert page.count("<script>") == 2
    assert len(drawn) == 11


def test_hostile_names_stay_text_in_charts_and_tooltips(full):
    page, parsed = full
    ours = page.replace(_plotly_js(), "")  # the page without the inlined library
    for hostile in (HOSTILE, HOSTILE_IMG, "<img", "<script>alert", 'onerror="'):
        assert hostile not in ours
    # No script element but the library, the chart loader and the charts' JSON blocks.
    tags = re.findall(r"<script[^>]*>", ours)
    assert tags.count("<script>") == 2
    assert all(t.startswith('<script type="application/json" id="chart-') for t in tags if t != "<script>")
    for attrs, text in parsed.scripts:
        if attrs.get("type") == "application/json":
            assert "<" not in text and ">" not in text
    # Decoded, the names read as sent: Plotly shows entities as the characters they stand for.
    drawn = figures(parsed)
    names = [t["name"] for t in drawn["Unacked deliveries and prefetch per consumer"]["data"]]
    assert names[0].endswith("ch 1 · &lt;script&gt;alert('x')&lt;/script&gt; unacked")
    links = [t["name"] for t in drawn["AMQP 1.0 link credit per link (the sender's view)"]["data"]]
    assert '&lt;img src=x onerror="window.pwned=1"&gt;' in links[0]
    lanes = drawn["Timeline: entities, the intervals they were held back, findings and violations"]["layout"]
    assert any("&lt;script&gt;" in label for label in lanes["yaxis"]["categoryarray"])
    assert HOSTILE in words(parsed)  # the HTML text reads as sent too


# --- downsampling -----------------------------------------------------------------------------------


def grid(spark: SparkSession, seconds: float) -> DataFrame:
    return S.bucket_grid(
        spark.createDataFrame(
            [("cap", T0, T0 + timedelta(seconds=seconds))], "capture_id string, first_ts timestamp, last_ts timestamp"
        )
    )


def test_downsampling_bounds_points_and_keeps_the_extremes(spark):
    # 1,000 rows one millisecond apart; unacked cycles 0..9 with one spike of 99 at row 500.
    rows = [("cap", "c1", T0 + timedelta(milliseconds=i), i, 99 if i == 500 else i % 10) for i in range(1000)]
    short = [("cap", "c2", T0 + timedelta(milliseconds=i), i, i) for i in range(5)]
    df = spark.createDataFrame(
        rows + short, "capture_id string, connection_id string, ts timestamp, _order long, unacked long"
    )
    chart = S.StateChart("test", S.keyed(df, connection_id="connection_id"), {"unacked": ("unacked", "max")})
    points = S.states([chart], grid(spark, 0.999), points=100).collect()
    long = sorted((r.x, r.value) for r in points if r.connection_id == "c1")
    kept = sorted((r.x, r.value) for r in points if r.connection_id == "c2")
    assert len(long) == 200  # 999 ms: the capture's 200 buckets of 5 ms
    assert max(v for _, v in long) == 99 and [v for _, v in long].count(99) == 1
    assert kept == [(0.0, 0.0), (0.001, 1.0), (0.002, 2.0), (0.003, 3.0), (0.004, 4.0)]


def test_counts_fill_every_bucket_and_hold_nothing(spark):
    # Three events in 2 s (10 ms buckets): every bucket is there, zero but in the three.
    events = spark.createDataFrame(
        [("cap", "q", "publish", T0 + timedelta(milliseconds=ms), 1) for ms in (0, 5, 1500)],
        "capture_id string, name string, metric string, ts timestamp, n long",
    )
    rows = S.counts(
        [S.CountChart("test", S.keyed(events, name="name"), ("publish", "ack"))], grid(spark, 2.0)
    ).collect()
    publish = sorted((round(r.x, 6), r.value) for r in rows if r.metric == "publish")
    assert len(publish) == 201 and len([r for r in rows if r.metric == "ack"]) == 201
    assert [(x, v) for x, v in publish if v] == [(0.0, 2.0), (1.5, 1.0)]
    assert {r.bucket_s for r in rows} == {0.01} and not any(r.value for r in rows if r.metric == "ack")


def test_counts_rank_series_with_a_null_key_and_keep_a_count_past_the_last_bucket(spark):
    # q1 publishes 3 times (once half a second after the capture's last packet: past its last
    # bucket), a queue of no name twice, q2 once. The series rank by their publishes, the null name
    # a series of its own; the late count is kept where it fell, not dropped with the grid.
    rows = [("q1", 0), ("q1", 20), ("q1", 2500), (None, 30), (None, 40), ("q2", 50)]
    events = spark.createDataFrame(
        [("cap", name, "publish", T0 + timedelta(milliseconds=ms), 1) for name, ms in rows],
        "capture_id string, name string, metric string, ts timestamp, n long",
    )
    counted = S.counts(
        [S.CountChart("test", S.keyed(events, name="name"), ("publish", "ack"))], grid(spark, 2.0)
    ).collect()
    ranks = {(r.name, r.series_rank, r.series_total) for r in counted}
    assert ranks == {("q1", 1, 3), (None, 2, 3), ("q2", 3, 3)}
    q1 = sorted((round(r.x, 6), r.value) for r in counted if r.name == "q1" and r.metric == "publish")
    assert len(q1) == 202  # the capture's 201 buckets of 10 ms, and the one past them
    assert [(x, v) for x, v in q1 if v] == [(0.0, 1.0), (0.02, 1.0), (2.5, 1.0)]
    assert len([r for r in counted if r.name is None and r.metric == "ack"]) == 201


def test_seconds_are_summed_the_same_in_any_order(spark):
    # Added as doubles left to right, 1e16 + 1 - 1e16 is 0 and 1e16 - 1e16 + 1 is 1: the order a
    # plan adds rows in would show in the sum. exact_sum gives the exact sum (1.5) both ways.
    values = [(0, 1e16), (1, 1.0), (2, -1e16), (3, 0.5)]
    df = spark.createDataFrame(values, "i int, s double")
    sums = {}
    for order in ("i", "s"):  # the rows in index order, then smallest first
        one_task = df.orderBy(order).coalesce(1)
        row = one_task.agg(F.sum("s").alias("double"), S.exact_sum(F.col("s")).alias("exact")).first()
        sums[order] = (row.double, row.exact)
    assert sums["i"][0] != sums["s"][0]  # the plain sum depends on the order
    assert sums["i"][1] == sums["s"][1] == 1.5


def test_busiest_keeps_the_heaviest_series_of_each_capture(spark):
    # Per capture, series weigh: a 5, b 5 (tie: by key), c 9, d 1; capture two has one series.
    rows = [("one", k, w) for k, ws in {"a": (2, 3), "b": (5,), "c": (4, 4, 1), "d": (1,)}.items() for w in ws]
    rows += [("two", "z", 1), ("two", "z", 1)]
    df = spark.createDataFrame(rows, "capture_id string, key string, weight long")
    kept = S.busiest(df, S.F.col("weight"), limit=3, keys=["key"])
    expected = spark.createDataFrame(
        [("one", "c", w, 1, 4) for w in (4, 4, 1)]
        + [("one", "a", w, 2, 4) for w in (2, 3)]
        + [("one", "b", 5, 3, 4), ("two", "z", 1, 1, 1), ("two", "z", 1, 1, 1)],
        "capture_id string, key string, weight long, series_rank int, series_total int",
    )
    assertDataFrameEqual(kept, expected)


def test_a_null_key_is_a_series_of_its_own_and_points_at_one_time_stay_apart(spark):
    # busiest and states join their rankings back on the series' keys: a null key (a chart without
    # that key, or a queue with no connection) matches only a null key. Two points of a short series
    # at the same time but in frame order stay two points.
    rows = [("one", None, 5), ("one", None, 1), ("one", "a", 4), ("one", "b", 1)]
    df = spark.createDataFrame(rows, "capture_id string, key string, weight long")
    kept = S.busiest(df, S.F.col("weight"), limit=2, keys=["key"])
    assertDataFrameEqual(
        kept,
        spark.createDataFrame(
            [("one", None, 5, 1, 3), ("one", None, 1, 1, 3), ("one", "a", 4, 2, 3)],
            "capture_id string, key string, weight long, series_rank int, series_total int",
        ),
    )
    at = T0 + timedelta(milliseconds=3)
    points = spark.createDataFrame(
        [("cap", None, at, 7, 1), ("cap", None, at, 8, 2), ("cap", "c1", at, 7, 5)],
        "capture_id string, connection_id string, ts timestamp, _order long, unacked long",
    )
    chart = S.StateChart("test", S.keyed(points, connection_id="connection_id"), {"unacked": ("unacked", "max")})
    found = sorted((r.connection_id or "", r.x, r.value) for r in S.states([chart], grid(spark, 0.999)).collect())
    assert found == [("", 0.003, 1.0), ("", 0.003, 2.0), ("c1", 0.003, 5.0)]


def test_bucket_width_gives_a_few_hundred_buckets():
    assert S.bucket_width(2.0) == 0.01  # 200 buckets; 5 ms would make 400
    assert S.bucket_width(0.084) == 0.001
    assert S.bucket_width(600.0) == 2.0
    assert S.bucket_width(86_400.0) == 300.0
    assert S.bucket_width(10 * 86_400.0) == 3600.0
