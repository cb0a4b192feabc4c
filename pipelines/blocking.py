"""AMQP 0-9-1 connection.blocked and channel.flow as intervals (docs/FLOW_CONTROL.md section 4).

``connection.blocked(reason)`` / ``connection.unblocked`` are RabbitMQ's resource-alarm notices
(memory, disk); ``channel.flow(active=false)`` / ``channel.flow(active=true)`` stop and restart
the peer's content on a channel. An interval ends with the frame that lifts it; one never lifted
within the capture has no end.

A capture that begins after a connection opened (no connection.start in it) may begin inside an
alarm: its first notice is a connection.unblocked. That block was in force from before the first
packet: its interval starts at the connection's first frame in the capture, with no reason (the
connection.blocked that named it is not in the capture) and ``began_before_capture`` set; the time
it lasted is the time seen, a lower bound.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.intervals import intervals
from amqpscope.schemas.flow import CHANNEL_FLOW_SCHEMA, CONNECTION_BLOCKED_SCHEMA

_CONNECTION = ("capture_id", "connection_id")


def _connection_so_far() -> WindowSpec:
    """A connection's blocking notices in order: counts connection.blocked frames up to each row."""
    return (
        Window.partitionBy(*_CONNECTION)
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _whole_connection() -> WindowSpec:
    """All of a connection's blocking notices: the count for an interval never lifted."""
    return Window.partitionBy(*_CONNECTION)


def connection_blocked_intervals(frames: DataFrame) -> DataFrame:
    """The connection_blocked table (``schemas.flow.CONNECTION_BLOCKED_SCHEMA``) from the frames table."""
    is_blocked = F.col("method") == "connection.blocked"
    notices = (
        frames.filter(
            (F.col("protocol") == "amqp-0-9-1") & F.col("method").isin("connection.blocked", "connection.unblocked")
        )
        .withColumn("_blocked_so_far", F.sum(is_blocked.cast("long")).over(_connection_so_far()))
        .withColumn("_blocked_total", F.sum(is_blocked.cast("long")).over(_whole_connection()))
    )
    found = intervals(
        notices,
        _CONNECTION,
        ["frame_index"],
        is_blocked,
        carry=["reason", "_blocked_so_far", "_blocked_total"],
        carry_end=["_blocked_so_far"],
    )
    notifications = F.coalesce(F.col("end__blocked_so_far"), F.col("_blocked_total")) - F.col("_blocked_so_far") + 1
    seen = found.select(
        "*", notifications.alias("notifications"), F.lit(False).alias("began_before_capture")
    ).unionByName(_blocked_before_capture(frames, notices), allowMissingColumns=True)
    return seen.select(*[F.col(f.name).cast(f.dataType) for f in CONNECTION_BLOCKED_SCHEMA.fields])


def _blocked_before_capture(frames: DataFrame, notices: DataFrame) -> DataFrame:
    """One interval per connection opened before the capture whose first notice is
    connection.unblocked: from its first frame in the capture to that notice."""
    position = F.struct("frame_index", "ts", "packet_number")
    opened = (
        frames.filter(F.col("protocol") == "amqp-0-9-1")
        .groupBy(*_CONNECTION)
        .agg(
            F.min_by(position, F.col("frame_index")).alias("_first"),
            F.max((F.col("method") == "connection.start").cast("int")).alias("_opened"),
        )
        .filter(F.col("_opened") == 0)
    )
    first_notice = notices.groupBy(*_CONNECTION).agg(
        F.min_by(F.struct("method", "frame_index", "ts", "packet_number"), F.col("frame_index")).alias("_notice")
    )
    lifted = first_notice.filter(F.col("_notice.method") == "connection.unblocked").join(opened, list(_CONNECTION))
    return lifted.select(
        *_CONNECTION,
        F.lit(None).cast("string").alias("reason"),
        *[F.col(f"_first.{p}").alias(f"start_{p}") for p in ("frame_index", "ts", "packet_number")],
        *[F.col(f"_notice.{p}").alias(f"end_{p}") for p in ("frame_index", "ts", "packet_number")],
        (F.unix_micros(F.col("_notice.ts")) - F.unix_micros(F.col("_first.ts"))).alias("duration_us"),
        F.lit(0).cast("long").alias("notifications"),
        F.lit(True).alias("began_before_capture"),
    )


def channel_flow_intervals(frames: DataFrame) -> DataFrame:
    """The channel_flow table (``schemas.flow.CHANNEL_FLOW_SCHEMA``) from the frames table."""
    flows = frames.filter((F.col("protocol") == "amqp-0-9-1") & (F.col("method") == "channel.flow"))
    stopped = ~F.coalesce(F.col("active"), F.lit(True))
    found = intervals(flows, [*_CONNECTION, "channel", "direction"], ["frame_index"], stopped)
    return found.select(*[F.col(f.name).cast(f.dataType) for f in CHANNEL_FLOW_SCHEMA.fields])
