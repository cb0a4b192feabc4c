"""Round trips: what a client asked and when the answer came, from the frames and messages tables.

- **Request/reply calls** (RabbitMQ's RPC pattern): a request published with ``reply_to`` and
  ``correlation_id``, the broker's delivery of it to the responder, the responder's reply published
  with the same ``correlation_id``, and the broker's delivery of that reply back to the caller. Each
  call splits into the broker's first hop (request published to delivered), the responder's time
  (delivered to reply published), the broker's second hop (reply published to delivered) and the
  caller's time (reply delivered to its next request).
- **Synchronous method pairs**: a 0-9-1 method and the reply the spec pairs with it on the same
  channel (queue.declare and declare-ok, basic.qos and qos-ok, connection.open and open-ok ...),
  and a publish in confirm mode and the broker's confirm.

``round_trips`` is the gold table of both; ``request_reply`` is the diagnosis measure of the calls
(``pipelines.diagnosis.measures``' shape: one row per caller channel).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from amqpscope.pipelines.diagnosis.figures import CONNECTION
from amqpscope.pipelines.held import first_packets, held_time, timestamp
from amqpscope.pipelines.messages import settlement_times
from amqpscope.schemas.diagnosis import ROUND_TRIPS_SCHEMA

# 0-9-1 synchronous requests and their replies (spec 1.4: "synchronous" methods), and who asks.
SYNCHRONOUS = {
    "connection.start": ("connection.start-ok", "s2c"),
    "connection.secure": ("connection.secure-ok", "s2c"),
    "connection.tune": ("connection.tune-ok", "s2c"),
    "connection.open": ("connection.open-ok", "c2s"),
    "connection.close": ("connection.close-ok", None),
    "channel.open": ("channel.open-ok", "c2s"),
    "channel.flow": ("channel.flow-ok", None),
    "channel.close": ("channel.close-ok", None),
    "exchange.declare": ("exchange.declare-ok", "c2s"),
    "exchange.delete": ("exchange.delete-ok", "c2s"),
    "exchange.bind": ("exchange.bind-ok", "c2s"),
    "exchange.unbind": ("exchange.unbind-ok", "c2s"),
    "queue.declare": ("queue.declare-ok", "c2s"),
    "queue.bind": ("queue.bind-ok", "c2s"),
    "queue.purge": ("queue.purge-ok", "c2s"),
    "queue.delete": ("queue.delete-ok", "c2s"),
    "queue.unbind": ("queue.unbind-ok", "c2s"),
    "basic.qos": ("basic.qos-ok", "c2s"),
    "basic.consume": ("basic.consume-ok", "c2s"),
    "basic.cancel": ("basic.cancel-ok", None),
    "basic.recover": ("basic.recover-ok", "c2s"),
    "confirm.select": ("confirm.select-ok", "c2s"),
    "tx.select": ("tx.select-ok", "c2s"),
    "tx.commit": ("tx.commit-ok", "c2s"),
    "tx.rollback": ("tx.rollback-ok", "c2s"),
}


def _us(column: str) -> Column:
    return F.unix_micros(F.col(column))


def _first_after(left: DataFrame, right: DataFrame, keys: list[str], after: str, at: str, take: list[str]) -> DataFrame:
    """``left`` with, per row, the columns ``take`` of the earliest row of ``right`` with the same
    ``keys`` whose ``at`` is not before ``left``'s ``after`` (null when none). A row of ``left`` is
    told apart by all its columns."""
    joined = left.join(right, keys, "left")
    fits = F.col(at) >= F.col(after)
    return joined.groupBy(*left.columns).agg(
        *[F.min_by(F.when(fits, F.col(c)), F.when(fits, F.col(at))).alias(c) for c in take]
    )


def calls(messages_091: DataFrame) -> DataFrame:
    """One row per request/reply call whose request was captured: the caller's connection and
    channel, the correlation id, the request published (``request_us``), delivered to the responder
    (``delivered_us``, on ``responder_connection_id``), the reply published (``reply_us``) and
    delivered to the caller (``replied_us``), each null when not captured, and their packets."""
    content = messages_091.select(
        *CONNECTION,
        "channel",
        "method",
        "direction",
        "correlation_id",
        "reply_to",
        "routing_key",
        _us("ts").alias("ts_us"),
        "frame_index",
    ).filter(F.col("correlation_id").isNotNull())
    requests = content.filter(
        (F.col("method") == "basic.publish") & (F.col("direction") == "c2s") & F.col("reply_to").isNotNull()
    ).select(
        *CONNECTION,
        "channel",
        "correlation_id",
        "reply_to",
        F.col("ts_us").alias("request_us"),
    )
    delivered = content.filter(F.col("method").isin("basic.deliver", "basic.get-ok") & F.col("reply_to").isNotNull())
    to_responder = delivered.select(
        "capture_id",
        "correlation_id",
        F.col("connection_id").alias("responder_connection_id"),
        F.col("ts_us").alias("delivered_us"),
    )
    with_delivery = _first_after(
        requests,
        to_responder,
        ["capture_id", "correlation_id"],
        "request_us",
        "delivered_us",
        ["responder_connection_id", "delivered_us"],
    )
    replies = content.filter(
        (F.col("method") == "basic.publish") & (F.col("direction") == "c2s") & F.col("reply_to").isNull()
    ).select(
        "capture_id",
        "correlation_id",
        F.col("connection_id").alias("responder_connection_id"),
        F.col("ts_us").alias("reply_us"),
    )
    with_reply = _first_after(
        with_delivery,
        replies,
        ["capture_id", "correlation_id", "responder_connection_id"],
        "delivered_us",
        "reply_us",
        ["reply_us"],
    )
    back = content.filter(F.col("method").isin("basic.deliver", "basic.get-ok") & F.col("reply_to").isNull()).select(
        *CONNECTION, "correlation_id", F.col("ts_us").alias("replied_us")
    )
    return _first_after(
        with_reply, back, ["capture_id", "connection_id", "correlation_id"], "reply_us", "replied_us", ["replied_us"]
    )


def _packet_of(frames: DataFrame) -> DataFrame:
    return frames.select(*CONNECTION, F.col("ts_us").alias("_ts"), "packet_number")


def method_round_trips(frames: DataFrame) -> DataFrame:
    """One row per synchronous 0-9-1 method with its reply (the first reply method after it on its
    channel, from the other peer): who asked, the two methods, when and the packets."""
    asked = F.create_map(*[x for k, (reply, _) in SYNCHRONOUS.items() for x in (F.lit(k), F.lit(reply))])
    requests = frames.filter(F.col("method").isin(*SYNCHRONOUS)).select(
        *CONNECTION,
        "channel",
        "direction",
        F.col("method").alias("request"),
        asked[F.col("method")].alias("response"),
        F.col("frame_index").alias("_asked_at"),
        F.col("ts_us").alias("request_us"),
        F.col("packet_number").alias("request_packet_number"),
    )
    replies = frames.filter(F.col("method").isin(*[r for r, _ in SYNCHRONOUS.values()])).select(
        *CONNECTION,
        "channel",
        F.col("direction").alias("_reply_direction"),
        F.col("method").alias("response"),
        F.col("frame_index").alias("_answered_at"),
        F.col("ts_us").alias("response_us"),
        F.col("packet_number").alias("response_packet_number"),
    )
    joined = (
        requests.join(replies, [*CONNECTION, "channel", "response"])
        .filter((F.col("_answered_at") > F.col("_asked_at")) & (F.col("_reply_direction") != F.col("direction")))
        .groupBy(*CONNECTION, "channel", "direction", "request", "response", "_asked_at")
        .agg(
            F.min_by(F.struct("response_us", "response_packet_number"), "_answered_at").alias("_reply"),
            F.min("request_us").alias("request_us"),
            F.min("request_packet_number").alias("request_packet_number"),
        )
    )
    return joined.select(
        *CONNECTION,
        "channel",
        F.lit("method").alias("kind"),
        F.when(F.col("direction") == "c2s", F.lit("client")).otherwise(F.lit("broker")).alias("asked_by"),
        "request",
        "response",
        F.lit(None).cast("string").alias("correlation_id"),
        "request_us",
        F.col("_reply.response_us").alias("response_us"),
        "request_packet_number",
        F.col("_reply.response_packet_number").alias("response_packet_number"),
    )


def confirm_round_trips(frames: DataFrame, messages_091: DataFrame) -> DataFrame:
    """One row per publish in confirm mode that the broker confirmed (basic.ack or basic.nack)."""
    settled = settlement_times(frames, "ts_us", "response_us")
    packets = frames.filter(F.col("method").isin("basic.ack", "basic.nack")).select(
        *CONNECTION, F.col("frame_index").alias("settled_frame_index"), F.col("packet_number").alias("_p")
    )
    published = messages_091.filter((F.col("method") == "basic.publish") & F.col("publish_seq").isNotNull())
    publish_packets = frames.filter(F.col("method") == "basic.publish").select(
        *CONNECTION, "frame_index", F.col("packet_number").alias("request_packet_number")
    )
    return (
        published.join(settled, [*CONNECTION, "settled_frame_index"])
        .join(packets, [*CONNECTION, "settled_frame_index"], "left")
        .join(publish_packets, [*CONNECTION, "frame_index"], "left")
        .select(
            *CONNECTION,
            "channel",
            F.lit("confirm").alias("kind"),
            F.lit("client").alias("asked_by"),
            F.lit("basic.publish").alias("request"),
            F.col("settled_by").alias("response"),
            F.lit(None).cast("string").alias("correlation_id"),
            _us("ts").alias("request_us"),
            "response_us",
            "request_packet_number",
            F.col("_p").alias("response_packet_number"),
        )
    )


def round_trips(frames: DataFrame, messages_091: DataFrame) -> DataFrame:
    """The round_trips table (``schemas.diagnosis.ROUND_TRIPS_SCHEMA``): every request/reply call,
    synchronous method pair and publisher confirm, with its round trip; a call's broker hops,
    responder's and caller's time."""
    call = calls(messages_091)
    next_request = Window.partitionBy(*CONNECTION, "channel").orderBy("request_us")
    call_rows = call.select(
        *CONNECTION,
        "channel",
        F.lit("request_reply").alias("kind"),
        F.lit("client").alias("asked_by"),
        F.lit("basic.publish").alias("request"),
        F.lit("basic.deliver").alias("response"),
        "correlation_id",
        "request_us",
        F.col("replied_us").alias("response_us"),
        F.lit(None).cast("long").alias("request_packet_number"),
        F.lit(None).cast("long").alias("response_packet_number"),
        "responder_connection_id",
        (F.col("delivered_us") - F.col("request_us")).alias("broker_in_us"),
        (F.col("reply_us") - F.col("delivered_us")).alias("responder_us"),
        (F.col("replied_us") - F.col("reply_us")).alias("broker_out_us"),
        (F.lead("request_us").over(next_request) - F.col("replied_us")).alias("caller_us"),
    )
    pairs = method_round_trips(frames).unionByName(confirm_round_trips(frames, messages_091))
    rows = call_rows.unionByName(pairs, allowMissingColumns=True)
    return rows.select(
        "*",
        timestamp(F.col("request_us")).alias("request_ts"),
        timestamp(F.col("response_us")).alias("response_ts"),
        (F.col("response_us") - F.col("request_us")).alias("round_trip_us"),
    ).select(*[F.col(f.name).cast(f.dataType) for f in ROUND_TRIPS_SCHEMA.fields])


def request_reply(messages_091: DataFrame, frames: DataFrame, routes: DataFrame) -> DataFrame:
    """Per caller channel with request/reply calls answered: the calls, the most in flight at once,
    the median call and its parts (broker hops, responder, caller), each part's share of the calls'
    cycles (request to next request), ``held_us``: the union of the calls (request published to
    reply delivered) within the time from the first request to the last reply, and the requests'
    packets."""
    keys = (*CONNECTION, "channel")
    answered = calls(messages_091).filter(F.col("replied_us").isNotNull())
    order = Window.partitionBy(*keys).orderBy("request_us")
    cycles = answered.withColumns(
        {
            "_call": F.col("replied_us") - F.col("request_us"),
            "_broker": F.coalesce(F.col("delivered_us") - F.col("request_us"), F.lit(0))
            + F.coalesce(F.col("replied_us") - F.col("reply_us"), F.lit(0)),
            "_responder": F.coalesce(F.col("reply_us") - F.col("delivered_us"), F.lit(0)),
            "_caller": F.lead("request_us").over(order) - F.col("replied_us"),
        }
    )
    # Calls in flight right after each request: those asked before it and not yet answered.
    in_flight = (
        cycles.alias("a")
        .join(cycles.alias("b"), [*keys])
        .filter((F.col("b.request_us") <= F.col("a.request_us")) & (F.col("b.replied_us") > F.col("a.request_us")))
        .groupBy(*keys, F.col("a.request_us"))
        .agg(F.count(F.lit(1)).alias("_outstanding"))
        .groupBy(*keys)
        .agg(F.max("_outstanding").alias("in_flight_max"))
    )
    intervals = cycles.select(
        *keys,
        F.col("request_us").alias("start_us"),
        F.col("replied_us").alias("end_us"),
        F.lit(None).cast("long").alias("start_packet_number"),
    )
    held = held_time(intervals, keys)
    caller = F.coalesce(F.col("_caller"), F.lit(0))
    per_caller = cycles.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("calls"),
        F.min("request_us").alias("_low"),
        F.max("replied_us").alias("_high"),
        F.percentile_approx("_call", 0.5).alias("call_p50_us"),
        F.percentile_approx("_broker", 0.5).alias("broker_p50_us"),
        F.percentile_approx("_responder", 0.5).alias("responder_p50_us"),
        F.percentile_approx("_caller", 0.5).alias("caller_p50_us"),
        F.sum("_broker").alias("_broker_sum"),
        F.sum("_responder").alias("_responder_sum"),
        F.sum(caller).alias("_caller_sum"),
        F.min("responder_connection_id").alias("responder_connection_id"),
        F.min("reply_to").alias("reply_to"),
    )
    requests = (
        frames.filter((F.col("method") == "basic.publish") & (F.col("direction") == "c2s"))
        .join(answered.select(*keys, F.col("request_us").alias("ts_us")), [*keys, "ts_us"], "left_semi")
        .groupBy(*keys)
        .agg(first_packets("packet_number").alias("packet_numbers"))
    )
    cycle = F.greatest(F.col("_broker_sum") + F.col("_responder_sum") + F.col("_caller_sum"), F.lit(1))
    span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
    routed = routes.filter(F.col("queue").isNotNull()).groupBy(*keys).agg(F.min("queue").alias("queue"))
    return (
        per_caller.join(held, list(keys))
        .join(in_flight, list(keys))
        .join(requests, list(keys), "left")
        .join(routed, list(keys), "left")
        .select(
            *keys,
            "queue",
            "reply_to",
            "responder_connection_id",
            "calls",
            "in_flight_max",
            "call_p50_us",
            "broker_p50_us",
            "responder_p50_us",
            "caller_p50_us",
            (F.col("_broker_sum") / cycle).alias("broker_share"),
            (F.col("_responder_sum") / cycle).alias("responder_share"),
            (F.col("_caller_sum") / cycle).alias("caller_share"),
            (F.col("calls") / (span / F.lit(1e6))).alias("calls_per_second"),
            "held_us",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            timestamp(F.col("_low")).alias("start_ts"),
            timestamp(F.col("_high")).alias("end_ts"),
            F.try_element_at(F.coalesce("packet_numbers", F.array().cast("array<long>")), F.lit(1)).alias(
                "start_packet_number"
            ),
            F.try_element_at(F.coalesce("packet_numbers", F.array().cast("array<long>")), F.lit(-1)).alias(
                "end_packet_number"
            ),
            F.coalesce("packet_numbers", F.array().cast("array<long>")).alias("packet_numbers"),
        )
    )
