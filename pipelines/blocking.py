"""AMQP 0-9-1 connection.blocked and channel.flow as intervals (DOMAIN.md section 4).

``connection.blocked(reason)`` / ``connection.unblocked`` are RabbitMQ's resource-alarm notices
(memory, disk); ``channel.flow(active=false)`` / ``channel.flow(active=true)`` stop and restart
the peer's content on a channel. An interval ends with the frame that lifts it; one never lifted
within the capture has no end.
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
    return found.withColumn("notifications", notifications).select(
        *[F.col(f.name).cast(f.dataType) for f in CONNECTION_BLOCKED_SCHEMA.fields]
    )


def channel_flow_intervals(frames: DataFrame) -> DataFrame:
    """The channel_flow table (``schemas.flow.CHANNEL_FLOW_SCHEMA``) from the frames table."""
    flows = frames.filter((F.col("protocol") == "amqp-0-9-1") & (F.col("method") == "channel.flow"))
    stopped = ~F.coalesce(F.col("active"), F.lit(True))
    found = intervals(flows, [*_CONNECTION, "channel", "direction"], ["frame_index"], stopped)
    return found.select(*[F.col(f.name).cast(f.dataType) for f in CHANNEL_FLOW_SCHEMA.fields])
