"""Measures of RabbitMQ's resource alarms on the wire: 0-9-1 connections it blocked
(connection.blocked ... connection.unblocked) and AMQP 1.0 publishing sessions whose incoming
window it held at 0. Pure functions of named inputs (``pipelines.diagnosis.measures``)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.diagnosis.figures import CONNECTION, listed, us
from amqpscope.pipelines.held import first_packets, held_time, timestamp


def resource_alarms(
    connection_blocked: DataFrame, frames: DataFrame, lifetimes: DataFrame, connection_queues: DataFrame
) -> DataFrame:
    """Per connection that RabbitMQ blocked (connection.blocked ... connection.unblocked): the
    union of its blocked intervals over its lifetime, the reason, the notifications."""
    blocked = connection_blocked.join(lifetimes, list(CONNECTION))
    intervals = blocked.select(
        *CONNECTION,
        us("start_ts").alias("start_us"),
        us(F.coalesce(F.col("end_ts"), F.col("last_ts"))).alias("end_us"),
        "start_packet_number",
    )
    held = held_time(intervals, CONNECTION)
    notices = frames.filter(F.col("method").isin("connection.blocked", "connection.unblocked"))
    packets = notices.groupBy(*CONNECTION).agg(
        first_packets("packet_number").alias("packet_numbers"),
        F.countDistinct("packet_number").alias("packet_count"),
    )
    described = blocked.groupBy(*CONNECTION).agg(
        # A block in force when the capture began has no connection.blocked, so no reason.
        F.coalesce(
            F.min_by("reason", F.when(F.col("reason").isNotNull(), F.col("start_ts"))),
            F.lit("not in the capture: blocked before it began"),
        ).alias("reason"),
        F.sum("notifications").alias("notifications"),
        F.max(F.col("end_ts").isNull().cast("int")).alias("_open"),
        F.max(F.coalesce("end_packet_number", "start_packet_number")).alias("end_packet_number"),
        F.max("end_ts").alias("_last_end"),
        F.first("first_ts").alias("first_ts"),
        F.first("last_ts").alias("last_ts"),
    )
    return (
        held.join(described, list(CONNECTION))
        .join(packets, list(CONNECTION), "left")
        .join(connection_queues, list(CONNECTION), "left")
        .select(
            *CONNECTION,
            "queue",
            "reason",
            "notifications",
            "held_us",
            "held_intervals",
            (us("last_ts") - us("first_ts")).alias("span_us"),
            timestamp(F.col("held_start_us")).alias("start_ts"),
            F.when(F.col("_open") == 0, F.col("_last_end")).alias("end_ts"),
            F.try_element_at(F.col("held_packets"), F.lit(1)).alias("start_packet_number"),
            "end_packet_number",
            "packet_numbers",
            "packet_count",
            (F.col("_open") == 0).alias("unblocked"),
            F.lit("amqp.method.class == 10 && amqp.method.method in {60,61}").alias("packet_filter"),
        )
    )


def publishing_sessions_closed(
    frames: DataFrame, flow_intervals: DataFrame, lifetimes: DataFrame, connection_queues: DataFrame
) -> DataFrame:
    """AMQP 1.0: per session that publishes (sends transfers), the union of the intervals in
    which the broker held its incoming-window at 0 (how RabbitMQ stops 1.0 publishers in an
    alarm, docs/FLOW_CONTROL.md section 3)."""
    publishing_ = (
        frames.filter(
            (F.col("protocol") == "amqp-1.0") & (F.col("method") == "transfer") & (F.col("direction") == "c2s")
        )
        .select(*CONNECTION, "channel")
        .distinct()
    )
    keys = (*CONNECTION, "channel")
    closed = (
        flow_intervals.filter((F.col("cause") == "session_window_closed") & (F.col("direction") == "c2s"))
        .join(publishing_, list(keys), "left_semi")
        .join(lifetimes, list(CONNECTION))
    )
    intervals = closed.select(
        *keys,
        us("start_ts").alias("start_us"),
        us(F.coalesce(F.col("end_ts"), F.col("last_ts"))).alias("end_us"),
        "start_packet_number",
        "end_packet_number",
    )
    held = held_time(intervals, keys)
    ends = intervals.groupBy(*keys).agg(
        F.max("end_packet_number").alias("end_packet_number"),
        first_packets(F.col("start_packet_number")).alias("_starts"),
        F.collect_set("end_packet_number").alias("_ends"),
    )
    return (
        held.join(ends, list(keys))
        .join(lifetimes, list(CONNECTION))
        .join(connection_queues, list(CONNECTION), "left")
        .select(
            *keys,
            "queue",
            "held_us",
            "held_intervals",
            (us("last_ts") - us("first_ts")).alias("span_us"),
            timestamp(F.col("held_start_us")).alias("start_ts"),
            timestamp(F.col("held_end_us")).alias("end_ts"),
            F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
            "end_packet_number",
            listed(F.concat("_starts", "_ends")).alias("packet_numbers"),
        )
    )
