"""The static HTML report: per capture its connections, frame counts and rule violations.

Every aggregation runs in Spark; only bounded, aggregated rows reach the driver. The page is one
self-contained file (inline CSS, no JavaScript, nothing fetched) and every value in it goes through
``html.escape``: method names, addresses and evidence come from the wire and are hostile input.
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyspark.sql.functions as F
from pyspark.sql import Column, DataFrame, Window

from amqpscope.expectations.catalogue import SEVERITIES

if TYPE_CHECKING:  # the suite module imports Great Expectations, which a report does not need
    from amqpscope.expectations.suite import VerdictRun

TOP_ROWS = 50  # rows per table and capture
MAX_CAPTURES = 50
EXAMPLES_PER_RULE = 3
_TS_FORMAT = "yyyy-MM-dd HH:mm:ss.SSSSSS"


def _endpoint(address: str, port: str) -> Column:
    # IPv6 addresses are bracketed so the port stays readable: [::1]:5672.
    host = F.when(F.col(address).contains(":"), F.concat(F.lit("["), F.col(address), F.lit("]")))
    return F.concat(host.otherwise(F.col(address)), F.lit(":"), F.col(port).cast("string"))


def _ts_text(column: str) -> Column:
    # Formatted in Spark, in the session time zone, so the page does not depend on the driver's.
    return F.date_format(F.col(column), _TS_FORMAT).alias(column)


def connection_summary(connections: DataFrame) -> DataFrame:
    """One row per connection: endpoints, protocol, frames, bytes and bytes the capture missed."""
    return connections.select(
        "capture_id",
        "connection_id",
        _endpoint("client_address", "client_port").alias("client"),
        _endpoint("server_address", "server_port").alias("server"),
        "protocol",
        "frames",
        "c2s_bytes",
        "s2c_bytes",
        (F.col("c2s_missing_bytes") + F.col("s2c_missing_bytes")).alias("missing_bytes"),
        _ts_text("first_ts"),
        _ts_text("last_ts"),
    )


def frame_counts(frames: DataFrame) -> DataFrame:
    """Frames and bytes on the wire per capture, protocol, frame type and method."""
    return frames.groupBy("capture_id", "protocol", "frame_type", "method").agg(
        F.count(F.lit(1)).alias("frames"), F.sum("frame_size").alias("bytes")
    )


def _severity_rank(column: str) -> Column:
    # Errors first, then warnings, then capture problems; anything else last.
    rank = F.lit(len(SEVERITIES))
    for position, severity in enumerate(SEVERITIES):
        rank = F.when(F.col(column) == severity, F.lit(position)).otherwise(rank)
    return rank


def violation_counts(violations: DataFrame) -> DataFrame:
    """Violations per capture, rule and severity, with the rule's description."""
    return violations.groupBy("capture_id", "rule_id", "severity").agg(
        F.count(F.lit(1)).alias("violations"), F.min("description").alias("description")
    )


def violation_examples(violations: DataFrame, per_rule: int = EXAMPLES_PER_RULE) -> DataFrame:
    """The first `per_rule` violations of each rule in each capture, in capture order."""
    # Orders a rule's violations in time within its capture, to show the earliest ones.
    first_seen = Window.partitionBy("capture_id", "rule_id").orderBy(
        "ts", "connection_id", "frame_index"
    )
    return (
        violations.withColumn("example", F.row_number().over(first_seen))
        .where(F.col("example") <= per_rule)
        .select(
            "capture_id", "rule_id", "example", "connection_id", "channel", "handle",
            "frame_index", _ts_text("ts"), "evidence",
        )
    )


@dataclass(frozen=True)
class Section:
    """Rows of one table of one capture, at most TOP_ROWS, and how many there were in all."""

    rows: tuple[Mapping[str, Any], ...]
    total: int


def _top(df: DataFrame, captures: Sequence[str], order: Sequence[Column]) -> dict[str, Section]:
    # Per capture: the first TOP_ROWS rows in `order`, and the count of all of them.
    capture_rows = Window.partitionBy("capture_id")  # unordered: counts a capture's rows
    ranked_in_capture = capture_rows.orderBy(*order)  # the table's own order, busiest first
    ranked = (
        df.where(F.col("capture_id").isin(list(captures)))
        .withColumn("_rank", F.row_number().over(ranked_in_capture))
        .withColumn("_total", F.count(F.lit(1)).over(capture_rows))
        .where(F.col("_rank") <= TOP_ROWS)
        .orderBy("capture_id", "_rank")
    )
    grouped: dict[str, list[dict[str, Any]]] = {}
    totals: dict[str, int] = {}
    for row in ranked.collect():
        record = row.asDict()
        totals[record["capture_id"]] = record.pop("_total")
        record.pop("_rank")
        grouped.setdefault(record["capture_id"], []).append(record)
    return {c: Section(tuple(grouped[c]), totals[c]) for c in grouped}


def _capture_rows(
    captures: DataFrame | None, tables: Iterable[DataFrame]
) -> tuple[list[dict[str, Any]], int]:
    # The captures shown (first MAX_CAPTURES by id) and how many there are.
    if captures is not None:
        listed = captures.select(
            "capture_id", "file_name", "file_size", "packets",
            _ts_text("first_ts"), _ts_text("last_ts"),
        )
    else:
        listed = reduce(DataFrame.unionByName, [t.select("capture_id") for t in tables]).distinct()
    total = listed.count()
    rows = [r.asDict() for r in listed.orderBy("capture_id").limit(MAX_CAPTURES).collect()]
    return rows, total


# --- rendering -------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
h1{font-size:1.6em}h2{border-bottom:2px solid #ccc;padding-top:1em}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0 1em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.error{color:#b00020;font-weight:600}.warning{color:#a05a00;font-weight:600}.capture{color:#555}
.passed{color:#1b7f3b;font-weight:600}.failed{color:#b00020;font-weight:600}
.note{color:#666;font-size:.9em}code{font-size:.9em;word-break:break-all}
"""


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def _cell(value: Any, css: str | None = None) -> str:
    if css is None and isinstance(value, (int, float)) and not isinstance(value, bool):
        css = "num"
    attr = f' class="{html.escape(css)}"' if css else ""
    return f"<td{attr}>{html.escape(_text(value))}</td>"


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    # `rows` are lists of rendered <td> cells.
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(f"<tr>{''.join(cells)}</tr>" for cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _shown(section: Section, what: str) -> str:
    if section.total <= len(section.rows):
        return ""
    shown = f"Showing {len(section.rows)} of {section.total:,} {what}."
    return f'<p class="note">{html.escape(shown)}</p>'


def _severity_css(severity: str) -> str:
    return severity if severity in SEVERITIES else "other"


def _evidence(evidence: Mapping[str, str | None] | None) -> str:
    pairs = ", ".join(f"{k}={_text(v)}" for k, v in (evidence or {}).items())
    return f"<td><code>{html.escape(pairs)}</code></td>"


def _capture_html(
    capture: Mapping[str, Any],
    connections: Section | None,
    frames: Section | None,
    counts: Section | None,
    examples: Sequence[Mapping[str, Any]],
) -> str:
    capture_id = capture["capture_id"]
    parts = [f"<h2>Capture {html.escape(str(capture_id))}</h2>"]
    if "file_name" in capture:
        details = [
            ("file", capture["file_name"]), ("bytes", capture["file_size"]),
            ("packets", capture["packets"]), ("first packet", capture["first_ts"]),
            ("last packet", capture["last_ts"]),
        ]
        parts.append(_table([k for k, _ in details], [[_cell(v) for _, v in details]]))

    parts.append("<h3>Connections</h3>")
    if connections is not None:
        parts.append(_table(
            ["client", "server", "protocol", "frames", "bytes client→server",
             "bytes server→client", "bytes not captured", "first frame", "last frame"],
            ([_cell(r["client"]), _cell(r["server"]), _cell(r["protocol"]), _cell(r["frames"]),
              _cell(r["c2s_bytes"]), _cell(r["s2c_bytes"]), _cell(r["missing_bytes"]),
              _cell(r["first_ts"]), _cell(r["last_ts"])]
             for r in connections.rows),
        ))
        parts.append(_shown(connections, "connections"))
    else:
        parts.append('<p class="note">No AMQP connections.</p>')

    parts.append("<h3>Frames by protocol, type and method</h3>")
    if frames is not None:
        parts.append(_table(
            ["protocol", "frame type", "method", "frames", "bytes"],
            ([_cell(r["protocol"]), _cell(r["frame_type"]), _cell(r["method"]), _cell(r["frames"]),
              _cell(r["bytes"])] for r in frames.rows),
        ))
        parts.append(_shown(frames, "frame kinds"))
    else:
        parts.append('<p class="note">No frames.</p>')

    parts.append("<h3>Rule violations</h3>")
    if counts is not None:
        parts.append(_table(
            ["rule", "severity", "violations", "description"],
            ([_cell(r["rule_id"]), _cell(r["severity"], _severity_css(r["severity"])),
              _cell(r["violations"]), _cell(r["description"])] for r in counts.rows),
        ))
        parts.append(_shown(counts, "rules"))
        parts.append(f"<h3>First violations of each rule (up to {EXAMPLES_PER_RULE})</h3>")
        parts.append(_table(
            ["rule", "connection", "channel", "handle", "frame", "time", "evidence"],
            ([_cell(r["rule_id"]), _cell(r["connection_id"]), _cell(r["channel"]),
              _cell(r["handle"]), _cell(r["frame_index"]), _cell(r["ts"]), _evidence(r["evidence"])]
             for r in examples),
        ))
    else:
        parts.append('<p class="note">No rule violated.</p>')
    return "\n".join(parts)


def _docs_href(index: Path, report: Path) -> str:
    # Relative, so the report and the Data Docs can be moved or served together.
    try:
        target = os.path.relpath(index.resolve(), report.resolve().parent)
    except ValueError:  # another drive on Windows: no relative path exists
        return index.resolve().as_uri()
    return quote(Path(target).as_posix())


def _verdicts_html(verdicts: VerdictRun | None, docs_href: str | None) -> str:
    parts = ["<h2>Great Expectations suites</h2>"]
    if verdicts is None:
        parts.append('<p class="note">No expectation suites were run.</p>')
    else:
        rows = []
        for suite in verdicts.suites:
            outcome = "passed" if suite.success else "failed"
            rules = "; ".join(f"{rule}: {n:,}" for rule, n in suite.unexpected_counts.items())
            rows.append([
                _cell(suite.suite_name), _cell(suite.table), _cell(outcome, outcome),
                _cell(rules), _cell(suite.seconds),
            ])
        headers = ["suite", "table", "result", "unexpected rows per rule", "seconds"]
        parts.append(_table(headers, rows))
    if docs_href is not None:
        href = html.escape(docs_href, quote=True)
        parts.append(f'<p><a href="{href}">Great Expectations Data Docs</a></p>')
    return "\n".join(parts)


def write_report(
    path: Path,
    *,
    frames: DataFrame,
    connections: DataFrame,
    violations: DataFrame,
    captures: DataFrame | None,
    verdicts: VerdictRun | None,
    data_docs_index: Path | None,
) -> Path:
    """Write the HTML summary of the captures to `path` and return it.

    `data_docs_index` defaults to the Data Docs of `verdicts`, when there are verdicts.
    """
    path = Path(path)
    capture_rows, capture_total = _capture_rows(captures, [connections, frames, violations])
    shown = [c["capture_id"] for c in capture_rows]

    connection_sections = _top(
        connection_summary(connections), shown,
        [(F.col("c2s_bytes") + F.col("s2c_bytes")).desc(), F.col("connection_id")],
    )
    frame_sections = _top(
        frame_counts(frames), shown,
        [F.col("frames").desc(), F.col("protocol"), F.col("frame_type"), F.col("method")],
    )
    count_sections = _top(
        violation_counts(violations), shown,
        [_severity_rank("severity"), F.col("violations").desc(), F.col("rule_id")],
    )
    examples: dict[str, list[Mapping[str, Any]]] = {}
    example_rows = (
        violation_examples(violations)
        .where(F.col("capture_id").isin(shown))
        .orderBy("capture_id", "rule_id", "example")
        .limit(MAX_CAPTURES * TOP_ROWS * EXAMPLES_PER_RULE)
        .collect()
    )
    for row in example_rows:
        examples.setdefault(row["capture_id"], []).append(row.asDict())

    time_zone = frames.sparkSession.conf.get("spark.sql.session.timeZone")
    index = data_docs_index or (verdicts.data_docs_index if verdicts is not None else None)
    body = [
        "<h1>amqpscope report</h1>",
        f'<p class="note">Times are in {html.escape(str(time_zone))}. '
        f"{capture_total:,} capture(s)"
        + (f", the first {len(shown)} shown" if capture_total > len(shown) else "")
        + ".</p>",
    ]
    body += [
        _capture_html(
            capture,
            connection_sections.get(capture_id),
            frame_sections.get(capture_id),
            count_sections.get(capture_id),
            examples.get(capture_id, []),
        )
        for capture, capture_id in zip(capture_rows, shown)
    ]
    body.append(_verdicts_html(verdicts, _docs_href(index, path) if index is not None else None))
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>amqpscope report</title>"
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
