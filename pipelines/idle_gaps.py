"""Silences longer than a connection's heartbeat interval, per direction (docs/FLOW_CONTROL.md section 6).

AMQP 0-9-1 (spec 4.2.7; connection.tune-ok ``heartbeat``, in seconds, 0: off): each peer sends a
frame (a heartbeat if nothing else) at least once an interval, and a peer that receives nothing for
two intervals or longer should close the connection. The interval applies to both directions.

AMQP 1.0 (transport 2.4.5; open ``idle-time-out``, in milliseconds): each peer announces "the
maximum period between activity (frames) on the connection that it desires from its partner", and
"to avoid spurious timeouts, the value in idle-time-out SHOULD be half the peer's actual timeout
threshold" (RabbitMQ announces half of its own). So the interval is the receiving peer's
idle-time-out, and a silence of twice it reaches the receiver's threshold, after which it closes
the connection. Frames sent by one peer are held to the other's idle-time-out.

A gap is the time between two consecutive frames of one direction, in capture order; the row is
the frame that ends it, with the interval and allowed silence in force then. Only gaps longer than
the interval are kept (a late heartbeat); the rules flag those reaching the allowed silence. The
silence after a direction's last frame is not measured (the capture, or the connection, ended).
Windows are keyed by connection: one shuffle (``pipelines.partitioning``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.partitioning import CONNECTION, by_connection
from amqpscope.schemas.flow import IDLE_GAPS_SCHEMA


def _connection_so_far() -> WindowSpec:
    return (
        Window.partitionBy(*CONNECTION).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _direction_in_order() -> WindowSpec:
    return Window.partitionBy(*CONNECTION, "direction").orderBy("frame_index")


def _last(condition: Column, value: str) -> Column:
    """``value`` of the last frame up to this one that met ``condition``."""
    return F.last(F.when(condition, F.col(value)), ignorenulls=True).over(_connection_so_far())


def idle_gaps_timeline(frames: DataFrame) -> DataFrame:
    """The idle_gaps table (``schemas.flow.IDLE_GAPS_SCHEMA``) from the frames table."""
    method, direction = F.col("method"), F.col("direction")
    is_091, is_10 = F.col("protocol") == "amqp-0-9-1", F.col("protocol") == "amqp-1.0"
    heartbeat_s = _last(is_091 & (method == "connection.tune-ok") & (direction == "c2s"), "heartbeat")
    # 1.0: the time-out of the peer receiving this direction's frames.
    receiver_timeout_ms = F.when(
        direction == "c2s", _last(is_10 & (method == "open") & (direction == "s2c"), "idle_time_out")
    ).otherwise(_last(is_10 & (method == "open") & (direction == "c2s"), "idle_time_out"))
    interval_us = F.when(is_091 & (heartbeat_s > 0), heartbeat_s * 1_000_000).when(
        is_10 & (receiver_timeout_ms > 0), receiver_timeout_ms * 1000
    )
    previous = F.lag("ts_us").over(_direction_in_order())
    gaps = (
        by_connection(frames.filter(is_091 | is_10))
        .withColumn("interval_us", interval_us.cast("long"))
        .withColumn("allowed_us", F.col("interval_us") * 2)  # both specs: two intervals of silence
        .withColumn("gap_start_us", previous)
        .withColumn("gap_us", F.col("ts_us") - F.col("gap_start_us"))
        .filter(F.col("gap_us") > F.col("interval_us"))
        .withColumn("gap_start_ts", F.timestamp_micros("gap_start_us"))
    )
    return gaps.select(*[F.col(f.name).cast(f.dataType) for f in IDLE_GAPS_SCHEMA.fields])
