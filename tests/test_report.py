"""The static HTML report: its sections computed in Spark (pipelines.report.sections), rendered escaped and self-contained."""

from __future__ import annotations

from datetime import datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from amqpscope.expectations.suite import SuiteResult, VerdictRun
from amqpscope.jobs.report import page as report
from amqpscope.jobs.report.page import write_report
from amqpscope.pipelines.report import sections as report_sections
from amqpscope.pipelines.report.context import (
    connection_summary,
    frame_counts,
    violation_counts,
    violation_examples,
)
from amqpscope.schemas.frames import CAPTURES_SCHEMA, CONNECTIONS_SCHEMA, FRAMES_SCHEMA
from amqpscope.schemas.verdicts import VIOLATIONS_SCHEMA

T0 = datetime(2024, 5, 1, 12, 0, 0)
HOSTILE = "<script>alert('x')</script>"


def frames(spark: SparkSession, rows: list[tuple[str, str, str, str, str | None, int]]) -> DataFrame:
    """Frames from (capture, connection, protocol, frame_type, method, frame_size) tuples."""
    filled = []
    for i, (capture, connection, protocol, frame_type, method, size) in enumerate(rows):
        row = {name: None for name in FRAMES_SCHEMA.fieldNames()}
        row.update(
            capture_id=capture,
            connection_id=connection,
            direction="c2s",
            frame_index=i,
            ts=T0 + timedelta(milliseconds=i),
            ts_us=0,
            packet_number=i + 1,
            stream_offset=0,
            frame_size=size,
            protocol=protocol,
            frame_type=frame_type,
            method=method,
            channel=1,
        )
        filled.append(row)
    return spark.createDataFrame(filled, FRAMES_SCHEMA)


def connections(spark: SparkSession) -> DataFrame:
    """Three connections: two in cap-a (one over IPv6, one with bytes the capture missed), one in cap-b."""
    listed = [
        ("cap-a", "a1", "10.0.0.1", 40000, "10.0.0.9", "amqp-0-9-1", 4, 900, 100, 0),
        ("cap-a", "a2", "::1", 40001, "::1", "amqp-1.0", 1, 20, 10, 64),
        ("cap-b", "b1", "10.0.0.2", 40002, "10.0.0.9", "amqp-0-9-1", 2, 50, 50, 0),
    ]
    rows = []
    for capture, connection, client, port, server, protocol, count, c2s, s2c, missing in listed:
        row = {name: None for name in CONNECTIONS_SCHEMA.fieldNames()}
        row.update(
            capture_id=capture,
            connection_id=connection,
            client_address=client,
            client_port=port,
            server_address=server,
            server_port=5672,
            protocol=protocol,
            protocol_inferred=False,
            first_ts=T0,
            last_ts=T0,
            frames=count,
            c2s_bytes=c2s,
            s2c_bytes=s2c,
            c2s_missing_bytes=missing,
            s2c_missing_bytes=0,
            retransmitted_bytes=0,
        )
        rows.append(row)
    return spark.createDataFrame(rows, CONNECTIONS_SCHEMA)


def violations(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            (
                "cap-a",
                "amqp091.channel.unacked_above_prefetch",
                "error",
                "above prefetch",
                "a1",
                1,
                None,
                7,
                T0 + timedelta(seconds=2),
                {"unacked": "3", "prefetch_count": "2"},
                None,
            ),
            (
                "cap-a",
                "amqp091.channel.unacked_above_prefetch",
                "error",
                "above prefetch",
                "a1",
                1,
                None,
                3,
                T0 + timedelta(seconds=1),
                {"unacked": "3", "prefetch_count": "2"},
                None,
            ),
            ("cap-a", "amqp10.test.warned", "warning", "a heuristic", "a2", 0, 0, 5, T0, {"note": HOSTILE}, 6),
        ],
        VIOLATIONS_SCHEMA,
    )


SAMPLE_FRAMES = [
    ("cap-a", "a1", "amqp-0-9-1", "method", "basic.deliver", 100),
    ("cap-a", "a1", "amqp-0-9-1", "method", "basic.deliver", 100),
    ("cap-a", "a1", "amqp-0-9-1", "method", "basic.deliver", 120),
    ("cap-a", "a1", "amqp-0-9-1", "body", None, 500),
    ("cap-a", "a2", "amqp-1.0", "amqp", HOSTILE, 30),
    ("cap-b", "b1", "amqp-0-9-1", "heartbeat", None, 8),
    ("cap-b", "b1", "amqp-0-9-1", "heartbeat", None, 8),
]


class Tables(HTMLParser):
    """Every <table> of a page as lists of cell texts, and every link target."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.links: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "a":
            self.links.append(dict(attrs)["href"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def parse(page: str) -> Tables:
    parsed = Tables()
    parsed.feed(page)
    return parsed


def rows(parsed: Tables) -> list[list[str]]:
    return [row for table in parsed.tables for row in table]


def outside(links: list[str]) -> list[str]:
    """Links leaving the page (the others are drill-down anchors within it)."""
    return [link for link in links if not link.startswith("#")]


# --- aggregations ---------------------------------------------------------------------------


def test_frame_counts_per_protocol_type_and_method(spark):
    assertDataFrameEqual(
        frame_counts(frames(spark, SAMPLE_FRAMES)),
        spark.createDataFrame(
            [
                ("cap-a", "amqp-0-9-1", "method", "basic.deliver", 3, 320),
                ("cap-a", "amqp-0-9-1", "body", None, 1, 500),
                ("cap-a", "amqp-1.0", "amqp", HOSTILE, 1, 30),
                ("cap-b", "amqp-0-9-1", "heartbeat", None, 2, 16),
            ],
            "capture_id string, protocol string, frame_type string, method string, frames long, bytes long",
        ),
    )


def test_connection_summary_brackets_ipv6_endpoints(spark):
    assertDataFrameEqual(
        connection_summary(connections(spark)).select("connection_id", "client", "server"),
        [
            ("a1", "10.0.0.1:40000", "10.0.0.9:5672"),
            ("a2", "[::1]:40001", "[::1]:5672"),
            ("b1", "10.0.0.2:40002", "10.0.0.9:5672"),
        ],
    )


def test_violation_counts_and_earliest_examples(spark):
    assertDataFrameEqual(
        violation_counts(violations(spark)),
        spark.createDataFrame(
            [
                ("cap-a", "amqp091.channel.unacked_above_prefetch", "error", 2, "above prefetch"),
                ("cap-a", "amqp10.test.warned", "warning", 1, "a heuristic"),
            ],
            "capture_id string, rule_id string, severity string, violations long, description string",
        ),
    )
    assertDataFrameEqual(
        violation_examples(violations(spark), per_rule=1).select("rule_id", "frame_index"),
        [("amqp091.channel.unacked_above_prefetch", 3), ("amqp10.test.warned", 5)],
    )


# --- the page -------------------------------------------------------------------------------


@pytest.fixture()
def verdicts(spark, tmp_path) -> VerdictRun:
    index = tmp_path / "docs" / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    return VerdictRun(
        violations=violations(spark),
        suites=(
            SuiteResult(
                "amqpscope.channel_unacked",
                "channel_unacked",
                False,
                {"amqp091.channel.unacked_above_prefetch": 2},
                0.5,
                index,
            ),
            SuiteResult("amqpscope.link_credit", "link_credit", True, {"amqp10.link.credit_exceeded": 0}, 0.25, index),
        ),
        data_docs_index=index,
        data_docs_seconds=0.1,
    )


def write(spark: SparkSession, tmp_path: Path, **overrides: Any) -> str:
    arguments: dict[str, Any] = dict(
        frames=frames(spark, SAMPLE_FRAMES),
        connections=connections(spark),
        violations=violations(spark),
        captures=None,
        verdicts=None,
        data_docs_index=None,
    )
    arguments.update(overrides)
    written = write_report(tmp_path / "out" / "report.html", **arguments)
    assert written == tmp_path / "out" / "report.html"
    return written.read_text(encoding="utf-8")


def test_report_shows_the_counts_per_capture(spark, tmp_path):
    parsed = parse(write(spark, tmp_path))
    found = rows(parsed)
    assert ["amqp-0-9-1", "method", "basic.deliver", "3", "320"] in found
    assert ["amqp-0-9-1", "heartbeat", "—", "2", "16"] in found
    assert [
        "10.0.0.1:40000",
        "10.0.0.9:5672",
        "amqp-0-9-1",
        "4",
        "900",
        "100",
        "0",
        "2024-05-01 12:00:00.000000",
        "2024-05-01 12:00:00.000000",
    ] in found
    assert [
        "[::1]:40001",
        "[::1]:5672",
        "amqp-1.0",
        "1",
        "20",
        "10",
        "64",
        "2024-05-01 12:00:00.000000",
        "2024-05-01 12:00:00.000000",
    ] in found
    assert ["amqp091.channel.unacked_above_prefetch", "error", "2", "above prefetch"] in found
    # No packet number in these rows: the filter names the connection's client endpoint instead.
    assert [
        "amqp091.channel.unacked_above_prefetch",
        "a1",
        "1",
        "—",
        "3",
        "—",
        "2024-05-01 12:00:01.000000",
        "prefetch_count=2, unacked=3",
        "ip.addr == 10.0.0.1 && tcp.port == 40000",
    ] in found
    assert ["amqp10.test.warned", "warning", "1", "a heuristic"] in found


def test_report_escapes_what_came_off_the_wire(spark, tmp_path):
    page = write(spark, tmp_path)
    assert "<script>alert" not in page and page.count("<script") == 1  # the page's own helper only
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page  # Jinja2's (markupsafe's) escaping
    assert ["amqp-1.0", "amqp", HOSTILE, "1", "30"] in rows(parse(page))  # decoded, it reads as sent


def test_report_is_self_contained(spark, tmp_path, verdicts):
    page = write(spark, tmp_path, verdicts=verdicts)
    for fetches in ("<link", "http://", "https://", "src=", "@import"):
        assert fetches not in page
    assert page.count("<script") == 1 and "<script>" in page  # the sections' helper, inline; no chart, no library


def test_report_lists_suites_and_links_data_docs(spark, tmp_path, verdicts):
    parsed = parse(write(spark, tmp_path, verdicts=verdicts))
    found = rows(parsed)
    assert [
        "amqpscope.channel_unacked",
        "channel_unacked",
        "failed",
        "amqp091.channel.unacked_above_prefetch: 2",
        "0.50",
    ] in found
    assert ["amqpscope.link_credit", "link_credit", "passed", "amqp10.link.credit_exceeded: 0", "0.25"] in found
    assert outside(parsed.links) == ["../docs/gx/uncommitted/data_docs/local_site/index.html"]
    assert (tmp_path / "out" / outside(parsed.links)[0]).resolve() == verdicts.data_docs_index.resolve()


def test_explicit_data_docs_index_wins(spark, tmp_path, verdicts):
    other = tmp_path / "elsewhere" / "index.html"
    parsed = parse(write(spark, tmp_path, verdicts=verdicts, data_docs_index=other))
    assert outside(parsed.links) == ["../elsewhere/index.html"]


def test_report_uses_the_captures_table(spark, tmp_path):
    captures = spark.createDataFrame(
        [("cap-a", "a.pcap", 2048, [("a.pcap", 2048, "cap-a")], 12, T0, T0 + timedelta(seconds=3), "EN10MB", "ok", 1)],
        CAPTURES_SCHEMA,
    )
    page = write(spark, tmp_path, captures=captures)
    assert ["a.pcap", "2,048", "12", "2024-05-01 12:00:00.000000", "2024-05-01 12:00:03.000000", "3.000 s"] in rows(
        parse(page)
    )
    assert "cap-b" not in page  # only the captures listed are reported
    assert "capture cap-a" in page


def test_report_collects_bounded_rows(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(report_sections, "TOP_ROWS", 1)
    page = write(spark, tmp_path)
    assert "Showing 1 of 3 frame kinds." in page  # cap-a: deliver, body, the hostile method
    assert "Showing 1 of 2 connections." in page
    found = rows(parse(page))
    assert ["amqp-0-9-1", "method", "basic.deliver", "3", "320"] in found  # the busiest kind
    assert ["amqp-0-9-1", "body", "—", "1", "500"] not in found


def test_report_without_violations(spark, tmp_path):
    page = write(spark, tmp_path, violations=spark.createDataFrame([], VIOLATIONS_SCHEMA))
    assert page.count("No rule violated.") == 2
    assert "No expectation suites were run." in page


# --- the overview and the captures left out -------------------------------------------------


def overview(page: str) -> list[list[str]]:
    parsed = parse(page)
    return parsed.tables[0][1:]  # the first table of the page, under its header row


def test_overview_puts_the_worst_capture_first(spark, tmp_path):
    from amqpscope.schemas.diagnosis import DIAGNOSIS_SCHEMA

    # cap-a: no bottleneck but two protocol errors (violations); cap-b: a slow consumer, no violation.
    diagnosis = spark.createDataFrame(
        [
            {
                "capture_id": "cap-a",
                "bottleneck": "none",
                "headline": "Every connection kept up.",
                "findings_count": 0,
                "findings": [],
            },
            {
                "capture_id": "cap-b",
                "bottleneck": "consumer",
                "effect": "deliveries_wait_for_acks",
                "entity_kind": "consumer",
                "entity": HOSTILE,
                "headline": f"Bottleneck: a slow consumer, {HOSTILE}.",
                "findings_count": 1,
                "findings": [],
            },
        ],
        DIAGNOSIS_SCHEMA,
    )
    page = write(spark, tmp_path, diagnosis=diagnosis)
    rows = overview(page)
    assert [r[0] for r in rows] == ["cap-b", "cap-a"]  # no captures table: named by id
    assert rows[0][2].split() == [
        "bottleneck",
        "consumer",
        "·",
        "consumer",
        *HOSTILE.split(),
        "Bottleneck:",
        "a",
        "slow",
        "consumer,",
        *f"{HOSTILE}.".split(),
    ]
    assert rows[1][2].split() == ["error", "No", "bottleneck", "found;", "2", "protocol", "errors."]
    assert rows[1][3:] == ["5", "2", "3"]  # cap-a: frames, connections, violations (2 errors, 1 warning)
    assert "<script>alert" not in page  # the entity and headline from the wire stay text
    anchors = [link for link in parse(page).links if link.startswith("#")][:2]
    assert anchors == [f"#{report.anchor('cap-b', 'capture')}", f"#{report.anchor('cap-a', 'capture')}"]
    assert page.count('<details class="capture"') == 2 and '<details class="capture" open' not in page


def test_a_page_without_complete_captures_lists_the_ones_left_out(tmp_path):
    left_out = [{"capture_id": "a" * 64, "file_name": HOSTILE, "why": "derive failed: StageFailed: disk full"}]
    page = report.render_page(
        tmp_path / "r.html",
        captures=[],
        capture_total=0,
        left_out=left_out,
        suites=None,
        data_docs_index=None,
        time_zone="UTC",
    ).read_text(encoding="utf-8")
    assert "No capture is complete in this lake" in page
    assert ["a" * 16, HOSTILE, "derive failed: StageFailed: disk full"] in rows(parse(page))
    assert "<script>alert" not in page and "<details" not in page
