"""Measures of connection and channel churn: clients that open a connection (or a channel) for a few
messages and close it again. Pure functions from the frames and connections tables to one row per
entity in the shape of every bottleneck measure (``pipelines.diagnosis.measures``).

- ``connection_churn``: per client address, the connections it opened in the capture, opens per
  second, the median lifetime and messages per connection, and the time some connection of it was
  opening or closing (protocol header to ``connection.open-ok``, ``connection.close`` to its last
  frame), merged, over the time from its first open to its last frame.
- ``channel_churn``: per connection, the channels it opened, messages per channel opened, and the
  time a channel of it was opening or closing (``channel.open`` to ``channel.open-ok``,
  ``channel.close`` to ``channel.close-ok``), merged, over the connection's active time.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.diagnosis.figures import CONNECTION
from amqpscope.pipelines.held import first_packets, held_time, timestamp

CONNECTION_START_FILTER = "amqp.method.class == 10 && amqp.method.method == 10"
CHANNEL_OPEN_FILTER = "amqp.method.class == 20 && amqp.method.method == 10"


def _message() -> Column:
    """A message on the wire: a 0-9-1 content method, or an AMQP 1.0 transfer that ends its delivery."""
    return F.col("method").isin("basic.publish", "basic.deliver", "basic.get-ok") | (
        (F.col("method") == "transfer") & ~F.coalesce(F.col("more"), F.lit(False))
    )


def _us(column: str) -> Column:
    return F.unix_micros(F.col(column))


def _opened() -> Column:
    """A connection opened in the capture: its broker's connection.start (0-9-1) or its client's
    open (1.0) was seen."""
    return ((F.col("method") == "connection.start") & (F.col("direction") == "s2c")) | (
        (F.col("protocol") == "amqp-1.0") & (F.col("method") == "open") & (F.col("direction") == "c2s")
    )


def connection_lives(frames: DataFrame) -> DataFrame:
    """Per connection: its first and last frame (µs), when it was ready (0-9-1 connection.open-ok,
    1.0 the broker's open), when it began to close (0-9-1 connection.close, 1.0 close), whether it
    was opened in the capture, its messages, and its connection.start packet."""
    ready = ((F.col("method") == "connection.open-ok") & (F.col("direction") == "s2c")) | (
        (F.col("protocol") == "amqp-1.0") & (F.col("method") == "open") & (F.col("direction") == "s2c")
    )
    closing = F.col("method").isin("connection.close", "close")
    return frames.groupBy(*CONNECTION).agg(
        F.min(_us("ts")).alias("first_us"),
        F.max(_us("ts")).alias("last_us"),
        F.min(F.when(ready, _us("ts"))).alias("ready_us"),
        F.min(F.when(closing, _us("ts"))).alias("closing_us"),
        F.max(_opened().cast("int")).cast("boolean").alias("opened"),
        F.sum(_message().cast("long")).alias("messages"),
        F.min(F.when(F.col("method") == "connection.start", F.col("packet_number"))).alias("start_packet"),
    )


def connection_churn(frames: DataFrame, connections: DataFrame) -> DataFrame:
    """Per capture and client address with connections opened in the capture: how many
    (``connections``), opens per second over the time from the first open to the last frame,
    the median lifetime and messages per connection, and ``held_us``: the union of the intervals
    in which one of them was opening or closing, within that time (``held_share`` of it)."""
    lives = connection_lives(frames).filter(F.col("opened"))
    hosts = connections.select(*CONNECTION, "client_address")
    lived = lives.join(hosts, list(CONNECTION))
    keys = ("capture_id", "client_address")
    opening = lived.select(
        *keys,
        F.col("first_us").alias("start_us"),
        F.coalesce(F.col("ready_us"), F.col("last_us")).alias("end_us"),
        F.col("start_packet").alias("start_packet_number"),
    )
    closing = lived.filter(F.col("closing_us").isNotNull()).select(
        *keys,
        F.col("closing_us").alias("start_us"),
        F.col("last_us").alias("end_us"),
        F.lit(None).cast("long").alias("start_packet_number"),
    )
    held = held_time(opening.unionByName(closing), keys)
    groups = lived.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("connections"),
        F.min("first_us").alias("_low"),
        F.max("last_us").alias("_high"),
        F.percentile_approx(F.col("last_us") - F.col("first_us"), 0.5).alias("lifetime_p50_us"),
        F.percentile_approx("messages", 0.5).alias("messages_per_connection_p50"),
        F.sum("messages").alias("messages"),
        F.percentile_approx(F.col("ready_us") - F.col("first_us"), 0.5).alias("open_p50_us"),
        F.min("start_packet").alias("start_packet_number"),
        F.max("start_packet").alias("end_packet_number"),
        first_packets("start_packet").alias("packet_numbers"),
    )
    starts = (
        frames.filter(F.col("method") == "connection.start")
        .groupBy("capture_id")
        .agg(F.countDistinct("packet_number").alias("packet_count"))
    )
    span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
    return (
        groups.join(held, list(keys))
        .join(starts, "capture_id", "left")
        .select(
            "capture_id",
            F.lit(None).cast("string").alias("connection_id"),
            F.lit(None).cast("string").alias("queue"),
            F.concat(F.lit("connections from "), F.col("client_address")).alias("entity"),
            "client_address",
            "connections",
            (F.col("connections") / (span / F.lit(1e6))).alias("opens_per_second"),
            "lifetime_p50_us",
            "messages_per_connection_p50",
            "messages",
            "open_p50_us",
            "held_us",
            "held_intervals",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            timestamp(F.col("_low")).alias("start_ts"),
            timestamp(F.col("_high")).alias("end_ts"),
            F.coalesce(F.col("start_packet_number"), F.lit(0)).alias("start_packet_number"),
            "end_packet_number",
            "packet_numbers",
            F.lit(CONNECTION_START_FILTER).alias("packet_filter"),
            "packet_count",
        )
    )


def channel_churn(frames: DataFrame, connection_queues: DataFrame) -> DataFrame:
    """Per 0-9-1 connection that opened channels: channel.opens, messages per channel opened, and
    ``held_us``: the union of the intervals in which one of its channels was opening (channel.open to
    channel.open-ok) or closing (channel.close to channel.close-ok), within the connection's time
    from its first channel.open to its last frame."""
    methods = ("channel.open", "channel.open-ok", "channel.close", "channel.close-ok")
    steps = frames.filter(F.col("method").isin(*methods)).select(
        *CONNECTION, "channel", "method", "frame_index", "packet_number", _us("ts").alias("ts_us")
    )
    begins = steps.filter(F.col("method").isin("channel.open", "channel.close"))
    answers = steps.filter(F.col("method").isin("channel.open-ok", "channel.close-ok")).select(
        *CONNECTION,
        "channel",
        F.regexp_replace("method", "-ok$", "").alias("method"),
        F.col("frame_index").alias("_answer_index"),
        F.col("ts_us").alias("_answer_us"),
    )
    # Each open (close) with the first answer after it on its channel.
    paired = (
        begins.join(answers, [*CONNECTION, "channel", "method"], "left")
        .filter(F.col("_answer_index").isNull() | (F.col("_answer_index") > F.col("frame_index")))
        .groupBy(*CONNECTION, "channel", "method", "frame_index", "packet_number", "ts_us")
        .agg(F.min_by("_answer_us", "_answer_index").alias("_answer_us"))
    )
    intervals = paired.filter(F.col("_answer_us").isNotNull()).select(
        *CONNECTION,
        F.col("ts_us").alias("start_us"),
        F.col("_answer_us").alias("end_us"),
        F.when(F.col("method") == "channel.open", F.col("packet_number")).alias("start_packet_number"),
    )
    held = held_time(intervals, CONNECTION)
    opens = (
        steps.filter(F.col("method") == "channel.open")
        .groupBy(*CONNECTION)
        .agg(
            F.count(F.lit(1)).alias("channel_opens"),
            F.countDistinct("channel").alias("channel_numbers"),
            F.min("ts_us").alias("_low"),
            F.min("packet_number").alias("start_packet_number"),
            F.max("packet_number").alias("end_packet_number"),
            first_packets("packet_number").alias("packet_numbers"),
            F.countDistinct("packet_number").alias("packet_count"),
        )
    )
    lives = connection_lives(frames).select(*CONNECTION, "last_us", "messages")
    span = F.greatest(F.col("last_us") - F.col("_low"), F.lit(1))
    return (
        opens.join(held, list(CONNECTION))
        .join(lives, list(CONNECTION))
        .join(connection_queues, list(CONNECTION), "left")
        .select(
            *CONNECTION,
            "queue",
            "channel_opens",
            "channel_numbers",
            "messages",
            (F.col("messages") / F.col("channel_opens")).alias("messages_per_channel"),
            (F.col("channel_opens") / (span / F.lit(1e6))).alias("opens_per_second"),
            "held_us",
            "held_intervals",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            timestamp(F.col("_low")).alias("start_ts"),
            timestamp(F.col("last_us")).alias("end_ts"),
            "start_packet_number",
            "end_packet_number",
            "packet_numbers",
            F.lit(CHANNEL_OPEN_FILTER).alias("packet_filter"),
            "packet_count",
        )
    )
