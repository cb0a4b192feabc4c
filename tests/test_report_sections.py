"""The report's sections gold table (pipelines.report.sections): ranked, counted, nulls kept, and
every packet a finding points at with its frames."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructField, StructType

from amqpscope.jobs.report.page import write_report
from amqpscope.pipelines.report import sections
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA
from amqpscope.schemas.frames import CONNECTIONS_SCHEMA, FRAMES_SCHEMA
from amqpscope.schemas.report import REPORT_SECTIONS_SCHEMA
from amqpscope.schemas.verdicts import VIOLATIONS_SCHEMA

T0 = datetime(2024, 5, 1, 12, 0, 0)


def table(spark: SparkSession, schema: StructType, rows: list[dict[str, Any]]) -> DataFrame:
    """Rows given by column name in the table's columns; the columns not given are null."""
    relaxed = StructType([StructField(f.name, f.dataType, True) for f in schema])
    return spark.createDataFrame([{**{n: None for n in schema.fieldNames()}, **r} for r in rows], relaxed)


def frame(i: int, packet: int, method: str, connection: str = "c1") -> dict[str, Any]:
    return dict(
        capture_id="cap",
        connection_id=connection,
        direction="c2s",
        frame_index=i,
        packet_number=packet,
        ts=T0 + timedelta(milliseconds=packet),
        protocol="amqp-0-9-1",
        frame_type="method",
        method=method,
        channel=1,
        frame_size=20 + i,
    )


# Packet 1 carries fifteen publishes (a client batching), packets 2 and 3 one frame each.
FRAMES = [frame(i, 1, "basic.publish") for i in range(15)] + [frame(15, 2, "basic.ack"), frame(16, 3, "basic.ack")]
CONNECTIONS = [
    dict(
        capture_id="cap",
        connection_id=c,
        client_address="10.0.0.1",
        client_port=port,
        server_address="10.0.0.9",
        server_port=5672,
        protocol="amqp-0-9-1",
        frames=frames,
        c2s_bytes=c2s,
        s2c_bytes=0,
        c2s_missing_bytes=0,
        s2c_missing_bytes=0,
        first_ts=T0,
        last_ts=T0,
    )
    for c, port, frames, c2s in (("c1", 40000, 17, 500), ("c2", 40001, 0, 900), ("c3", 40002, 0, 100))
]


def finding(rank: int, packets: list[int], **values: Any) -> dict[str, Any]:
    return dict(capture_id="cap", rank=rank, packet_numbers=packets, **values)


def section_rows(df: DataFrame, name: str) -> list[tuple[int, int, dict]]:
    found = df.where(df.section == name).collect()
    return sorted((r.position, r.total, json.loads(r.row)) for r in found)


def test_every_packet_a_finding_points_at_keeps_its_first_frames(spark):
    frames = table(spark, FRAMES_SCHEMA, FRAMES)
    # Finding 1 points at the batch and at the two acks; finding 2 (beyond those shown) at packet 3 only.
    bottlenecks = table(spark, BOTTLENECKS_SCHEMA, [finding(1, [1, 2]), finding(sections.FINDINGS_SHOWN + 1, [3])])
    got = [
        (r.packet_number, r.frame_index, r.frames_in_packet)
        for r in sections.finding_frames(frames, bottlenecks).collect()
    ]
    # Each packet's first frames in wire order, with how many it carries.
    assert sorted(got) == [(1, i, 15) for i in range(sections.FRAMES_PER_PACKET)] + [(2, 15, 1)]


def test_the_page_says_which_packets_carry_more_frames_than_it_shows(spark, tmp_path):
    shown = finding(
        1,
        [1, 2],
        finding_id="f1",
        rule_id="bottleneck.queue",
        entity_kind="connection",
        entity="c1",
        connection_id="c1",
        component="queue",
        effect="flow",
        severity="bottleneck",
        start_ts=T0,
        start_packet_number=1,
        duration_us=1000,
        lifetime_share=0.5,
        confidence=0.9,
        evidence={"k": "v"},
        wireshark_filter="frame.number in {1, 2}",
        explanation="the batch",
    )
    page = write_report(
        tmp_path / "report.html",
        frames=table(spark, FRAMES_SCHEMA, FRAMES),
        connections=table(spark, CONNECTIONS_SCHEMA, CONNECTIONS),
        violations=table(spark, VIOLATIONS_SCHEMA, []),
        captures=None,
        verdicts=None,
        data_docs_index=None,
        bottlenecks=table(spark, BOTTLENECKS_SCHEMA, [shown]),
    ).read_text(encoding="utf-8")
    kept = sections.FRAMES_PER_PACKET
    assert f"Packet 1: its first {kept} of 15 frames. The Wireshark filter shows them all." in page
    assert "Packet 2:" not in page  # it carries one frame, shown
    [evidence] = re.findall(r"<summary>evidence</summary>(.*?)</details>", page, flags=re.S)
    assert evidence.count("<td>basic.publish</td>") == kept and evidence.count("<td>basic.ack</td>") == 1


def test_sections_are_ranked_counted_and_keep_their_null_columns(spark, monkeypatch):
    monkeypatch.setattr(sections, "TOP_ROWS", 2)
    found = sections.report_sections(
        None,
        table(spark, FRAMES_SCHEMA, FRAMES),
        table(spark, CONNECTIONS_SCHEMA, CONNECTIONS),
        table(spark, VIOLATIONS_SCHEMA, []),
        bottlenecks=table(spark, BOTTLENECKS_SCHEMA, [finding(1, [2])]),
    )
    assert [(f.name, f.dataType) for f in found.schema] == [(f.name, f.dataType) for f in REPORT_SECTIONS_SCHEMA]
    # The busiest two connections of three (by bytes), with the count of all three.
    connections = section_rows(found, "connections")
    assert [(p, t, r["connection_id"], r["missing_bytes"]) for p, t, r in connections] == [
        (1, 3, "c2", 0),
        (2, 3, "c1", 0),
    ]
    # A column without a value is in the row, as null.
    assert connections[0][2]["tls_version"] is None and "tls_version" in connections[0][2]
    # Without a captures table: the captures of the tables given, spanned by their connections.
    [(_, total, line)] = section_rows(found, "capture")
    assert total == 1 and line["capture_id"] == "cap" and line["file_name"] is None
    # A naive datetime is a time in this process's zone (PySpark), as T0.timestamp() reads it.
    assert line["first_us"] == line["last_us"] == int(T0.timestamp()) * 1_000_000
    assert [r["method"] for _, _, r in section_rows(found, "finding_frames")] == ["basic.ack"]
    # The sections with rows: no queue was declared, and no consumers, links, quarantine or
    # accounting were given.
    assert {r.section for r in found.select("section").distinct().collect()} == {
        "capture",
        "connections",
        "frames",
        "context",
        "finding_frames",
    }
