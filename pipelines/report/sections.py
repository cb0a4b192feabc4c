"""The report's sections of each capture, ranked, as one gold table (schemas.report.REPORT_SECTIONS_SCHEMA).

derive writes it with the other gold tables, so that the report reads every row it shows through
delta-rs and a capture of any size is reported without a Spark query. A section is one query of
``pipelines.report.context`` kept to its first rows in the section's order (the busiest first),
with the count of all its rows; each row's columns are one JSON object, nulls kept. The orders end
on the columns that tell rows apart, so a section's positions are the same on every run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyspark.sql.functions as F
from pyspark.sql import Column, DataFrame, Window

from amqpscope.pipelines.accounting import byte_accounting
from amqpscope.pipelines.columns import union_all
from amqpscope.pipelines.report.context import (
    accounting_sums,
    connection_context,
    connection_summary,
    consumer_context,
    epoch_micros,
    frame_counts,
    link_context,
    quarantine_reasons,
    queue_context,
    severity_rank,
    ts_text,
    violation_counts,
    violation_examples,
)

TOP_ROWS = 50  # rows of a ranked section (connections, frame kinds, queues ...) per capture
EXAMPLES_PER_RULE = 3  # a rule's first violations shown
RULES_SHOWN = 50  # rules whose examples are kept (the catalogue has fewer)
FINDINGS_SHOWN = 50  # bottleneck findings per capture whose frames are kept
FRAMES_PER_FINDING = 20  # bottlenecks.packet_numbers holds up to 20
FRAMES_PER_PACKET = 10  # AMQP frames of one packet kept for a finding

_JSON = {"ignoreNullFields": "false"}  # a null column stays in the row, as null


def report_sections(
    captures: DataFrame | None,
    frames: DataFrame,
    connections: DataFrame,
    violations: DataFrame,
    quarantine: DataFrame | None = None,
    accounting: DataFrame | None = None,
    throughput: DataFrame | None = None,
    consumer_unacked: DataFrame | None = None,
    link_state: DataFrame | None = None,
    bottlenecks: DataFrame | None = None,
) -> DataFrame:
    """Every section of the report of each capture (schemas.report.REPORT_SECTIONS_SCHEMA). A
    section whose table is not given has no rows; without ``captures`` the captures are those of
    the connections, frames and violations, their span the connections'. ``accounting`` is the
    byte accounting (``pipelines.accounting.byte_accounting``) when the caller has it (derive's
    shared result), else it is computed from the tables given."""
    col = F.col
    if accounting is None and quarantine is not None:
        accounting = byte_accounting(connections, frames, quarantine)
    sections: list[tuple[str, DataFrame, Sequence[Column], int]] = [
        ("capture", _capture_lines(captures, connections, frames, violations), [], 1),
        (
            "connections",
            connection_summary(connections),
            [(col("c2s_bytes") + col("s2c_bytes")).desc(), col("connection_id")],
            TOP_ROWS,
        ),
        (
            "frames",
            frame_counts(frames),
            [col("frames").desc(), col("protocol"), col("frame_type"), col("method")],
            TOP_ROWS,
        ),
        (
            "counts",
            violation_counts(violations),
            [severity_rank("severity"), col("violations").desc(), col("rule_id")],
            TOP_ROWS,
        ),
        (
            "examples",
            violation_examples(violations, EXAMPLES_PER_RULE),
            [col("rule_id"), col("example")],
            RULES_SHOWN * EXAMPLES_PER_RULE,
        ),
        (
            "context",
            connection_context(frames, connections),
            [col("frames").desc(), col("connection_id")],
            TOP_ROWS,
        ),
        (
            "queues",
            queue_context(frames, throughput),
            [F.coalesce(col("messages_in"), F.lit(0)).desc(), col("address")],
            TOP_ROWS,
        ),
    ]
    if consumer_unacked is not None:
        sections.append(
            (
                "consumers",
                consumer_context(consumer_unacked),
                [col("deliveries").desc(), col("consumer_tag"), col("connection_id"), col("channel")],
                TOP_ROWS,
            )
        )
    if link_state is not None:
        sections.append(
            (
                "links",
                link_context(link_state),
                [col("deliveries").desc(), col("link_name"), col("connection_id"), col("sender_side")],
                TOP_ROWS,
            )
        )
    if quarantine is not None:
        sections.append(
            (
                "quarantine",
                quarantine_reasons(quarantine),
                [col("bytes").desc(), col("reason_id"), col("missing")],
                TOP_ROWS,
            )
        )
    if accounting is not None:
        sections.append(("accounting", accounting_sums(accounting), [col("direction")], 2))
    if bottlenecks is not None:
        sections.append(
            (
                "finding_frames",
                finding_frames(frames, bottlenecks),
                [col("packet_number"), col("connection_id"), col("frame_index")],
                FINDINGS_SHOWN * FRAMES_PER_FINDING * FRAMES_PER_PACKET,
            )
        )
    return union_all([_ranked(name, rows, order, keep) for name, rows, order, keep in sections])


def _ranked(section: str, rows: DataFrame, order: Sequence[Column], keep: int) -> DataFrame:
    # A capture's rows, counted; in order, for the section's first `keep`.
    in_capture = Window.partitionBy("capture_id")
    # The section's order within its capture (the busiest first), ending on what tells rows apart.
    ranked_in_capture = in_capture.orderBy(*order) if order else in_capture.orderBy("capture_id")
    return rows.select(
        "capture_id",
        F.lit(section).alias("section"),
        F.row_number().over(ranked_in_capture).alias("position"),
        F.count(F.lit(1)).over(in_capture).alias("total"),
        _json_object(rows).alias("row"),
    ).where(F.col("position") <= keep)


def _json_object(rows: DataFrame) -> Column:
    """A row of ``rows`` as a JSON object, its null columns as null: what ``to_json`` of the row's
    struct writes on Spark, member by member (each value as ``to_json`` writes it in an array), so
    that an engine that leaves out null fields whatever the option (Sail) writes the same text."""

    def member(column: str) -> Column:
        value = F.to_json(F.array(rows[column]), _JSON)  # "[<value>]"
        return F.concat(F.lit(json.dumps(column) + ":"), value.substr(F.lit(2), F.length(value) - 2))

    return F.concat(F.lit("{"), F.concat_ws(",", *[member(c) for c in rows.columns]), F.lit("}"))


def _capture_lines(
    captures: DataFrame | None, connections: DataFrame, frames: DataFrame, violations: DataFrame
) -> DataFrame:
    # A capture's own line: its file, size and packets; first and last packet as text and as the
    # charts' time origin (epoch microseconds); the time zone its times are written in.
    zone = F.current_timezone().alias("time_zone")
    if captures is not None:
        return captures.select(
            "capture_id",
            "file_name",
            "file_size",
            "packets",
            ts_text("first_ts"),
            ts_text("last_ts"),
            epoch_micros("first_ts", "first_us"),
            epoch_micros("last_ts", "last_us"),
            zone,
        )
    spans = connections.groupBy("capture_id").agg(
        F.min("first_ts").alias("first_ts"), F.max("last_ts").alias("last_ts")
    )
    seen = union_all([t.select("capture_id") for t in (connections, frames, violations)]).distinct()
    return seen.join(spans, "capture_id", "left").select(
        "capture_id",
        F.lit(None).cast("string").alias("file_name"),
        F.lit(None).cast("long").alias("file_size"),
        F.lit(None).cast("long").alias("packets"),
        ts_text("first_ts"),
        ts_text("last_ts"),
        epoch_micros("first_ts", "first_us"),
        epoch_micros("last_ts", "last_us"),
        zone,
    )


def finding_frames(frames: DataFrame, bottlenecks: DataFrame) -> DataFrame:
    """The frames of the packets the shown bottleneck findings point at (their first
    FRAMES_PER_FINDING ``packet_numbers``), the first FRAMES_PER_PACKET of each packet, with how many
    the packet carries (``frames_in_packet``): what a reader opens first in Wireshark."""
    wanted = (
        bottlenecks.where(F.col("rank") <= FINDINGS_SHOWN)
        .select("capture_id", F.explode(F.slice("packet_numbers", 1, FRAMES_PER_FINDING)).alias("packet_number"))
        .distinct()
    )
    # A packet's frames in the order they completed on the wire.
    packet = Window.partitionBy("capture_id", "packet_number")  # unordered: counts a packet's frames
    in_packet = packet.orderBy("connection_id", "frame_index")
    return (
        frames.join(F.broadcast(wanted), ["capture_id", "packet_number"])
        .withColumn("_in_packet", F.row_number().over(in_packet))
        .withColumn("frames_in_packet", F.count(F.lit(1)).over(packet))
        .where(F.col("_in_packet") <= FRAMES_PER_PACKET)
        .select(
            "capture_id",
            "packet_number",
            "connection_id",
            "frame_index",
            "direction",
            "channel",
            "frame_type",
            "method",
            "frame_size",
            ts_text("ts"),
            "frames_in_packet",
        )
    )
