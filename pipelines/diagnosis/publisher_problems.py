"""Measures of what the broker refused or sent back, and of closes with an error: pure functions from
the frames and messages tables to one row per entity, in the shape every bottleneck measure has
(``pipelines.diagnosis.measures``: held_us, span_us, start_ts, start_packet_number,
packet_numbers, packet_filter, packet_count, and the figures the rules name).

- ``publish_refusals``: per 0-9-1 channel publishing with confirms, the publishes the broker
  ``basic.nack``ed, with the queue they were routed to and its ``x-max-length`` /
  ``x-overflow`` where the capture saw it declared.
- ``unroutable_returns``: per channel, the ``basic.return``s (312 NO_ROUTE for a mandatory publish
  no binding matched), their exchange, routing key and reply code.
- ``closes_with_error``: every ``channel.close`` / ``connection.close`` with a reply code of 300
  or more (AMQP 0-9-1 spec 1.2), and every AMQP 1.0 close carrying an error, naming what the
  peer refused (the reply text, the method it refused).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from amqpscope.pipelines.diagnosis.figures import CONNECTION, us
from amqpscope.pipelines.held import first_packets, held_time, timestamp
from amqpscope.pipelines.messages import settlement_times

_CHANNEL = (*CONNECTION, "channel")

# Wireshark's AMQP dissector: method class and id (0-9-1 spec, "Class and method id summaries").
BASIC_NACK_FILTER = "amqp.method.class == 60 && amqp.method.method == 120"
BASIC_RETURN_FILTER = "amqp.method.class == 60 && amqp.method.method == 50"
# RabbitMQ's overflow behaviours that refuse publishes once a queue is at its limit.
REJECTING_OVERFLOWS = ("reject-publish", "reject-publish-dlx")


def _us(column: str) -> Column:
    return F.unix_micros(F.col(column))


def _packets_on_connection(frames: DataFrame, condition: Column) -> DataFrame:
    """Per connection: the distinct packets holding a frame that meets ``condition`` (how many a
    field filter for those frames matches on the connection's port)."""
    return frames.filter(condition).groupBy(*CONNECTION).agg(F.countDistinct("packet_number").alias("packet_count"))


def publish_refusals(
    frames: DataFrame, messages_091: DataFrame, routes: DataFrame, declarations: DataFrame
) -> DataFrame:
    """Per 0-9-1 channel publishing with confirms and refused at least once: publishes, the broker's
    refusals (``refused``: publishes whose confirm was a basic.nack), their share, the queue, exchange
    and routing key most of the refused ones had and that queue's declared limits (``max_length``, ``max_length_bytes``,
    ``overflow``; null where not declared in the capture), whether it refuses when full
    (``rejects_when_full``), the time from the first refused publish to the last refusal and the
    nack packets."""
    frames, messages = frames, messages_091
    confirmed = messages.filter(
        (F.col("method") == "basic.publish") & F.col("publish_seq").isNotNull() & (F.col("direction") == "c2s")
    )
    nacks = frames.filter((F.col("method") == "basic.nack") & (F.col("direction") == "s2c"))
    per_channel = confirmed.groupBy(*_CHANNEL).agg(
        F.count(F.lit(1)).alias("publishes"),
        F.sum((F.col("settled_by") == "basic.nack").cast("long")).alias("refused"),
        F.min(F.when(F.col("settled_by") == "basic.nack", _us("ts"))).alias("_first_refused_us"),
        F.min(_us("ts")).alias("_low"),
        F.max(_us("ts")).alias("_last_publish_us"),
    )
    nacked = nacks.groupBy(*_CHANNEL).agg(
        F.count(F.lit(1)).alias("nack_frames"),
        F.min("packet_number").alias("start_packet_number"),
        F.max("packet_number").alias("end_packet_number"),
        F.max(_us("ts")).alias("_last_nack_us"),
        first_packets("packet_number").alias("packet_numbers"),
    )
    # Where the refused publishes went: the queue, exchange and routing key most of them had (ties
    # to the greatest names, so that a rerun names the same).
    refused = confirmed.filter(F.col("settled_by") == "basic.nack").select(
        *_CHANNEL,
        "frame_index",
        F.coalesce(F.col("exchange"), F.lit("")).alias("exchange"),
        F.coalesce(F.col("routing_key"), F.lit("")).alias("routing_key"),
    )
    routed = routes.filter(F.col("queue").isNotNull()).select(*_CHANNEL, "frame_index", "queue")
    destination = F.struct("queue", "exchange", "routing_key")
    queues = (
        refused.join(routed, [*_CHANNEL, "frame_index"], "left")
        .groupBy(*_CHANNEL, "queue", "exchange", "routing_key")
        .agg(F.count(F.lit(1)).alias("_n"))
        .groupBy(*_CHANNEL)
        .agg(F.max_by(destination, F.struct("_n", destination)).alias("_to"))
        .select(*_CHANNEL, "_to.*")
    )
    declared = declarations.select("capture_id", "queue", "max_length", "max_length_bytes", "overflow")
    listed = _packets_on_connection(frames, F.col("method") == "basic.nack")
    high = F.greatest(F.col("_last_nack_us"), F.col("_last_publish_us"))
    start = F.coalesce(F.col("_first_refused_us"), F.col("_low"))
    return (
        per_channel.filter(F.col("refused") > 0)
        .join(nacked, list(_CHANNEL))
        .join(queues, list(_CHANNEL), "left")
        .join(declared, ["capture_id", "queue"], "left")
        .join(listed, list(CONNECTION), "left")
        .select(
            *_CHANNEL,
            "queue",
            "exchange",
            "routing_key",
            "publishes",
            "refused",
            (F.col("refused") / F.col("publishes")).alias("refused_share"),
            "max_length",
            "max_length_bytes",
            F.coalesce(F.col("overflow"), F.lit("drop-head")).alias("overflow"),
            F.coalesce(F.col("overflow").isin(*REJECTING_OVERFLOWS), F.lit(False)).alias("rejects_when_full"),
            (F.col("overflow").isNotNull() | F.col("max_length").isNotNull()).alias("limits_declared"),
            (F.greatest(F.col("_last_nack_us") - start, F.lit(0))).alias("held_us"),
            F.greatest(high - F.col("_low"), F.lit(1)).alias("span_us"),
            timestamp(start).alias("start_ts"),
            timestamp(F.col("_last_nack_us")).alias("end_ts"),
            "start_packet_number",
            "end_packet_number",
            "packet_numbers",
            F.lit(BASIC_NACK_FILTER).alias("packet_filter"),
            "packet_count",
        )
    )


def unroutable_returns(frames: DataFrame) -> DataFrame:
    """Per 0-9-1 channel the broker returned messages on (basic.return): the returns, the publishes
    on the channel and those with mandatory set, the share returned, the first return's reply code
    and text, and the exchange and routing key returned most."""
    returns = frames.filter((F.col("method") == "basic.return") & (F.col("direction") == "s2c"))
    publishes = frames.filter((F.col("method") == "basic.publish") & (F.col("direction") == "c2s"))
    published = publishes.groupBy(*_CHANNEL).agg(
        F.count(F.lit(1)).alias("publishes"),
        F.sum(F.coalesce(F.col("mandatory"), F.lit(False)).cast("long")).alias("mandatory_publishes"),
        F.min(_us("ts")).alias("_low"),
        F.max(_us("ts")).alias("_high"),
    )
    destination = F.concat_ws(
        " / ", F.coalesce(F.col("exchange"), F.lit("")), F.coalesce(F.col("routing_key"), F.lit(""))
    )
    most = (
        returns.groupBy(*_CHANNEL, "exchange", "routing_key")
        .agg(F.count(F.lit(1)).alias("_n"))
        .groupBy(*_CHANNEL)
        .agg(
            # Ties to the greatest names, so that a rerun names the same.
            F.max_by(F.struct("exchange", "routing_key"), F.struct("_n", "exchange", "routing_key")).alias("_most"),
            F.count(F.lit(1)).alias("destinations"),
        )
    )
    returned = returns.groupBy(*_CHANNEL).agg(
        F.count(F.lit(1)).alias("returned"),
        F.min_by("reply_code", "packet_number").alias("reply_code"),
        F.min_by("reply_text", "packet_number").alias("reply_text"),
        F.sum((F.col("reply_code") == 312).cast("long")).alias("no_route"),
        F.min(_us("ts")).alias("_first_us"),
        F.max(_us("ts")).alias("_last_us"),
        F.min("packet_number").alias("start_packet_number"),
        F.max("packet_number").alias("end_packet_number"),
        first_packets("packet_number").alias("packet_numbers"),
        F.min(destination).alias("_any"),
    )
    listed = _packets_on_connection(frames, F.col("method") == "basic.return")
    low = F.least(F.col("_low"), F.col("_first_us"))
    high = F.greatest(F.col("_high"), F.col("_last_us"))
    return (
        returned.join(published, list(_CHANNEL), "left")
        .join(most, list(_CHANNEL))
        .join(listed, list(CONNECTION), "left")
        .fillna(0, subset=["publishes", "mandatory_publishes"])
        .select(
            *_CHANNEL,
            F.coalesce(F.col("_most.exchange"), F.lit("")).alias("exchange"),
            F.coalesce(F.col("_most.routing_key"), F.lit("")).alias("routing_key"),
            F.when(F.coalesce(F.col("_most.exchange"), F.lit("")) == "", F.lit("(default)"))
            .otherwise(F.col("_most.exchange"))
            .alias("exchange_name"),
            "destinations",
            "returned",
            "no_route",
            "reply_code",
            "reply_text",
            "publishes",
            "mandatory_publishes",
            (F.col("returned") / F.greatest(F.col("publishes"), F.lit(1))).alias("returned_share"),
            F.lit(None).cast("string").alias("queue"),
            (F.col("_last_us") - F.col("_first_us")).alias("held_us"),
            F.greatest(high - low, F.lit(1)).alias("span_us"),
            timestamp(F.col("_first_us")).alias("start_ts"),
            timestamp(F.col("_last_us")).alias("end_ts"),
            "start_packet_number",
            "end_packet_number",
            "packet_numbers",
            F.lit(BASIC_RETURN_FILTER).alias("packet_filter"),
            "packet_count",
        )
    )


def closes_with_error(frames: DataFrame) -> DataFrame:
    """One row per close with an error: 0-9-1 ``channel.close`` / ``connection.close`` with a reply
    code of 300 or more (either peer may close: ``closed_by`` broker or client), AMQP 1.0 ``close``
    with an error condition. ``scope`` is channel or connection; the reply code and text, and for
    0-9-1 the method the close answers (``refused_method``, from the close's class-id and
    method-id, as RabbitMQ names it); the channel's life up to the close as the span."""
    is_091 = (F.col("protocol") == "amqp-0-9-1") & F.col("method").isin("channel.close", "connection.close")
    is_10 = (F.col("protocol") == "amqp-1.0") & (F.col("method") == "close") & F.col("error_condition").isNotNull()
    closes = frames.filter((is_091 & (F.col("reply_code") >= 300)) | is_10)
    # The method a 0-9-1 close refers to: the latest frame of that class and method on the channel
    # before it, from the other peer.
    class_id = F.col("arguments")["class-id"].cast("int")
    method_id = F.col("arguments")["method-id"].cast("int")
    named = frames.filter(F.col("class_id").isNotNull()).select(
        *CONNECTION,
        "channel",
        F.col("class_id").alias("_rc"),
        F.col("method_id").alias("_rm"),
        F.col("method").alias("_refused"),
        F.col("frame_index").alias("_at"),
        F.col("queue").alias("_queue"),
        F.col("exchange").alias("_exchange"),
    )
    opened = (
        frames.filter(F.col("method").isin("channel.open", "connection.start", "open", "begin"))
        .groupBy(*CONNECTION, "channel")
        .agg(F.min(_us("ts")).alias("_opened_us"))
    )
    base = closes.select(
        *CONNECTION,
        "channel",
        "direction",
        "frame_index",
        "packet_number",
        "ts",
        F.when(F.col("method") == "channel.close", F.lit("channel")).otherwise(F.lit("connection")).alias("scope"),
        F.coalesce(F.col("reply_code").cast("string"), F.col("error_condition")).alias("reply_code"),
        F.coalesce(F.col("reply_text"), F.col("error_description"), F.lit("")).alias("reply_text"),
        class_id.alias("_rc"),
        method_id.alias("_rm"),
    )
    # The latest frame of that class and method on the channel before the close.
    latest = Window.partitionBy(*CONNECTION, "frame_index").orderBy(F.col("_at").desc())
    refused = (
        base.select(*CONNECTION, "channel", "frame_index", "_rc", "_rm")
        .join(named, [*CONNECTION, "channel", "_rc", "_rm"])
        .filter(F.col("_at") < F.col("frame_index"))
        .withColumn("_n", F.row_number().over(latest))
        .filter(F.col("_n") == 1)
        .select(*CONNECTION, "frame_index", "_refused", "_queue", "_exchange")
    )
    scope_opened = F.coalesce(F.col("_opened_us"), _us("ts"))
    return (
        base.join(refused, [*CONNECTION, "frame_index"], "left")
        .join(opened, list(_CHANNEL), "left")
        .select(
            *CONNECTION,
            "channel",
            "scope",
            F.when(F.col("direction") == "s2c", F.lit("broker")).otherwise(F.lit("client")).alias("closed_by"),
            "reply_code",
            "reply_text",
            F.col("_refused").alias("refused_method"),
            F.coalesce(F.concat(F.lit(", refusing "), F.col("_refused")), F.lit("")).alias("refused_clause"),
            F.coalesce(F.col("_queue"), F.col("_exchange")).alias("refused_target"),
            F.col("_queue").alias("queue"),
            F.lit(0).cast("long").alias("held_us"),
            F.greatest(_us("ts") - scope_opened, F.lit(1)).alias("span_us"),
            F.col("ts").alias("start_ts"),
            F.col("ts").alias("end_ts"),
            F.col("packet_number").alias("start_packet_number"),
            F.col("packet_number").alias("end_packet_number"),
            F.array(F.col("packet_number")).alias("packet_numbers"),
        )
    )


def publisher_confirms(
    frames: DataFrame, messages_091: DataFrame, channel_confirms: DataFrame, alarmed: DataFrame, routes: DataFrame
) -> DataFrame:
    """Per 0-9-1 channel publishing with confirms: messages in flight (the most and the median
    outstanding right after a publish), the confirm round trip (median from a publish to its
    confirm), the time it had a publish waiting for its confirm (the union of those waits,
    ``held_us``) within the time from its first publish to its last confirm, and its rate."""
    keys = (*CONNECTION, "channel")
    settle_times = settlement_times(frames, "ts_us", "_confirmed_us")
    # On a connection RabbitMQ blocked, confirms wait for the alarm: that rule says so.
    confirmed = (
        messages_091.filter((F.col("method") == "basic.publish") & F.col("publish_seq").isNotNull())
        .join(alarmed, list(CONNECTION), "left_anti")
        .join(settle_times, [*CONNECTION, "settled_frame_index"], "left")
        .withColumn("_published_us", us("ts"))
    )
    spans = confirmed.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("publishes"),
        F.min("_published_us").alias("_low"),
        F.greatest(F.max("_confirmed_us"), F.max("_published_us")).alias("_high"),
        F.percentile_approx(F.col("_confirmed_us") - F.col("_published_us"), 0.5).alias("confirm_p50_us"),
        F.first(F.coalesce(F.col("exchange"), F.lit(""))).alias("exchange"),
        F.first("routing_key").alias("routing_key"),
    )
    waits = confirmed.filter(F.col("_confirmed_us").isNotNull()).select(
        *keys,
        F.col("_published_us").alias("start_us"),
        F.col("_confirmed_us").alias("end_us"),
        F.lit(None).cast("long").alias("start_packet_number"),
    )
    held = held_time(waits, keys)
    published = channel_confirms.filter(F.col("method") == "basic.publish")
    in_flight = published.groupBy(*keys).agg(
        F.max("outstanding").alias("in_flight_max"),
        F.percentile_approx("outstanding", 0.5).alias("in_flight_p50"),
        first_packets("packet_number").alias("packet_numbers"),
    )
    queues = routes.filter(F.col("queue").isNotNull()).groupBy(*keys).agg(F.min("queue").alias("queue"))
    span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
    return (
        spans.join(held, list(keys))
        .join(in_flight, list(keys))
        .join(queues, list(keys), "left")
        .select(
            *keys,
            "queue",
            "publishes",
            "confirm_p50_us",
            "in_flight_max",
            "in_flight_p50",
            "held_us",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            (F.col("publishes") / (span / F.lit(1e6))).alias("publishes_per_second"),
            timestamp(F.col("_low")).alias("start_ts"),
            timestamp(F.col("_high")).alias("end_ts"),
            F.try_element_at("packet_numbers", F.lit(1)).alias("start_packet_number"),
            F.try_element_at("packet_numbers", F.lit(-1)).alias("end_packet_number"),
            "packet_numbers",
        )
    )
