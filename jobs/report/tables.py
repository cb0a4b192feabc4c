"""The report's tables: connections, frame counts and rule violations per capture, top rows only.

Every aggregation runs in Spark; only bounded, aggregated rows reach the driver.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import reduce
from typing import Any

import pyspark.sql.functions as F
from pyspark.sql import Column, DataFrame, Row, Window

from amqpscope.expectations.catalogue import SEVERITIES
from amqpscope.jobs.lake_read import python_values

TOP_ROWS = 50  # rows per table and capture
MAX_CAPTURES = 50
EXAMPLES_PER_RULE = 3
_TS_FORMAT = "yyyy-MM-dd HH:mm:ss.SSSSSS"


def endpoint(address: str, port: str) -> Column:
    # IPv6 addresses are bracketed so the port stays readable: [::1]:5672.
    host = F.when(F.col(address).contains(":"), F.concat(F.lit("["), F.col(address), F.lit("]")))
    return F.concat(host.otherwise(F.col(address)), F.lit(":"), F.col(port).cast("string"))


def ts_text(column: str) -> Column:
    # Formatted in Spark, in the session time zone, so the page does not depend on the driver's.
    return F.date_format(F.col(column), _TS_FORMAT).alias(column)


_TLS_COLUMNS = ("tls_version", "tls_cipher_suite", "tls_sni", "tls_status")


def connection_summary(connections: DataFrame) -> DataFrame:
    """One row per connection: endpoints, protocol, frames, bytes and bytes the capture missed, and
    for a TLS connection its version, cipher suite, server name and whether it was decrypted."""
    return connections.select(
        "capture_id",
        "connection_id",
        endpoint("client_address", "client_port").alias("client"),
        endpoint("server_address", "server_port").alias("server"),
        "protocol",
        "frames",
        "c2s_bytes",
        "s2c_bytes",
        (F.col("c2s_missing_bytes") + F.col("s2c_missing_bytes")).alias("missing_bytes"),
        ts_text("first_ts"),
        ts_text("last_ts"),
        # A lake written before TLS was decoded has no such columns.
        *[(F.col(c) if c in connections.columns else F.lit(None).cast("string")).alias(c) for c in _TLS_COLUMNS],
    )


def frame_counts(frames: DataFrame) -> DataFrame:
    """Frames and bytes on the wire per capture, protocol, frame type and method."""
    return frames.groupBy("capture_id", "protocol", "frame_type", "method").agg(
        F.count(F.lit(1)).alias("frames"), F.sum("frame_size").alias("bytes")
    )


def severity_rank(column: str) -> Column:
    # Errors first, then warnings, then capture problems; anything else last.
    rank = F.lit(len(SEVERITIES))
    for position, severity in enumerate(SEVERITIES):
        rank = F.when(F.col(column) == severity, F.lit(position)).otherwise(rank)
    return rank


def _packet_number(df: DataFrame) -> Column:
    if "packet_number" in df.columns:
        return F.col("packet_number").cast("long").alias("packet_number")
    return F.lit(None).cast("long").alias("packet_number")


def violation_counts(violations: DataFrame) -> DataFrame:
    """Violations per capture, rule and severity, with the rule's description."""
    return violations.groupBy("capture_id", "rule_id", "severity").agg(
        F.count(F.lit(1)).alias("violations"), F.min("description").alias("description")
    )


def violation_examples(violations: DataFrame, per_rule: int = EXAMPLES_PER_RULE) -> DataFrame:
    """The first `per_rule` violations of each rule in each capture, in capture order.

    ``packet_number`` is null where the violations table has no such column (written before it had one).
    """
    # Orders a rule's violations in time within its capture, to show the earliest ones.
    first_seen = Window.partitionBy("capture_id", "rule_id").orderBy("ts", "connection_id", "frame_index")
    return (
        violations.withColumn("example", F.row_number().over(first_seen))
        .where(F.col("example") <= per_rule)
        .select(
            "capture_id",
            "rule_id",
            "example",
            "connection_id",
            "channel",
            "handle",
            "frame_index",
            _packet_number(violations),
            ts_text("ts"),
            "evidence",
        )
    )


@dataclass(frozen=True)
class Section:
    """Rows of one table of one capture, at most TOP_ROWS, and how many there were in all."""

    rows: tuple[Mapping[str, Any], ...]
    total: int


def ranked_rows(df: DataFrame, captures: Sequence[str], order: Sequence[Column]) -> DataFrame:
    """The query of a section: per capture, its first TOP_ROWS rows in ``order`` (``_rank``) and the
    count of all of them (``_total``); ``section_rows`` groups its rows."""
    capture_rows = Window.partitionBy("capture_id")  # unordered: counts a capture's rows
    ranked_in_capture = capture_rows.orderBy(*order)  # the table's own order, busiest first
    return (
        df.where(F.col("capture_id").isin(list(captures)))
        .withColumn("_rank", F.row_number().over(ranked_in_capture))
        .withColumn("_total", F.count(F.lit(1)).over(capture_rows))
        .where(F.col("_rank") <= TOP_ROWS)
    )


def section_rows(rows: Iterable[Row]) -> dict[str, Section]:
    """The rows of a ``ranked_rows`` query as a Section per capture, in their rank's order."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    totals: dict[str, int] = {}
    # At most TOP_ROWS rows a capture: put in order here, which spares Spark a sort's two jobs.
    for row in sorted(rows, key=lambda r: (r["capture_id"], r["_rank"])):
        record = row.asDict()
        totals[record["capture_id"]] = record.pop("_total")
        record.pop("_rank")
        grouped.setdefault(record["capture_id"], []).append(record)
    return {c: Section(tuple(grouped[c]), totals[c]) for c in grouped}


def first_rows(df: DataFrame, captures: Sequence[str], order: Sequence[str], limit: int) -> DataFrame:
    """The query of ``listed_by_capture``: the first ``limit`` rows of ``captures`` in (capture, ``order``)."""
    return df.where(F.col("capture_id").isin(list(captures))).orderBy("capture_id", *order).limit(limit)


def listed_by_capture(rows: Iterable[Row | Mapping[str, Any]], order: Sequence[str]) -> dict[str, list[dict]]:
    """The rows of a ``first_rows`` query (or of ``first_read_rows``) as plain data per capture, in
    ``order`` (ascending, nulls first, as Spark sorted them)."""
    grouped: dict[str, list[dict]] = {}
    for row in _in_order(rows, ("capture_id", *order)):
        grouped.setdefault(row["capture_id"], []).append(
            row.asDict(recursive=True) if isinstance(row, Row) else dict(row)
        )
    return grouped


def _in_order(rows: Iterable[Any], columns: Sequence[str]) -> list[Any]:
    # Ascending on each column, nulls first, as Spark's orderBy sorts.
    return sorted(rows, key=lambda r: tuple((r[c] is not None, r[c]) for c in columns))


def first_read_rows(
    rows: Iterable[Mapping[str, Any]], captures: Sequence[str], order: Sequence[str], limit: int
) -> list[dict[str, Any]]:
    """``first_rows`` of a gold table's rows already read without Spark (``Lake.read_rows``): the
    first ``limit`` rows of ``captures`` in (capture, ``order``), as Spark's collect gives them
    (``as_collected``)."""
    shown = set(captures)
    return _in_order((as_collected(r) for r in rows if r["capture_id"] in shown), ("capture_id", *order))[:limit]


def as_collected(value: Any) -> Any:
    """A value read through delta-rs (pyarrow) as Spark's ``collect`` gives it, so that a page drawn
    from either is the same: a timestamp as a naive datetime in this process's local time (pyarrow:
    an aware one in UTC), a map as a dict (pyarrow: a list of key-value pairs), recursively."""
    return python_values(value, _local_naive)


def _local_naive(value: datetime) -> datetime:
    return value.astimezone().replace(tzinfo=None) if value.tzinfo is not None else value


def collect_each(queries: Mapping[str, DataFrame]) -> dict[str, list[Row]]:
    """Each query's rows. Planned without adaptive execution (a small run: jobs.session.sized_for),
    from one Spark action rather than one each: the queries' union, where a query's rows fill a
    struct column of its own (``_q<i>``) and keep their types. Adaptive execution plans a union
    again after each of its stages, which cost more than the actions saved (docs/BENCHMARKS.md,
    twelfth session): there each query is collected on its own. Either way their order is not
    kept: ``section_rows`` and ``listed_by_capture`` put them in order."""
    names = list(queries)
    if not names:
        return {}
    if next(iter(queries.values())).sparkSession.conf.get("spark.sql.adaptive.enabled") == "true":
        return {name: df.collect() for name, df in queries.items()}
    branches = [
        df.select(F.lit(i).alias("_query"), F.struct(*[df[c] for c in df.columns]).alias(f"_q{i}"))
        for i, df in enumerate(queries.values())
    ]
    union = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), branches)
    found: dict[str, list[Row]] = {name: [] for name in names}
    for row in union.collect():
        index = row["_query"]
        found[names[index]].append(row[f"_q{index}"])
    return found


def capture_rows(captures: DataFrame | None, tables: Iterable[DataFrame]) -> tuple[list[dict[str, Any]], int]:
    # The captures shown (first MAX_CAPTURES by id) and how many there are.
    if captures is not None:
        listed = captures.select(
            "capture_id",
            "file_name",
            "file_size",
            "packets",
            ts_text("first_ts"),
            ts_text("last_ts"),
        )
    else:
        listed = reduce(DataFrame.unionByName, [t.select("capture_id") for t in tables]).distinct()
    # A row per capture is little even for a lake of thousands: one query, ordered here.
    rows = sorted((r.asDict() for r in listed.collect()), key=lambda r: r["capture_id"])
    return rows[:MAX_CAPTURES], len(rows)
