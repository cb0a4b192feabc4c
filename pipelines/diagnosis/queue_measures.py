"""The measures of the queue- and consumer-side rules (expectations/bottlenecks.yml): why a queue
backs up, or would, told from the messages themselves.

Each is a pure function of named inputs (``pipelines.diagnosis.measures``) giving one row per
entity in the measures' shape (held_us, span_us, when, packets) with the figures its rule tests:

| measure             | one row per                       | rule                                        |
|---------------------|-----------------------------------|---------------------------------------------|
| consumer_acks       | 0-9-1 manual-ack consumer          | diagnosis.consumer.never_acks               |
| redeliveries        | message requeued and redelivered  | diagnosis.consumer.redelivery_loop          |
| neighbour_speeds    | consumer sharing its queue        | diagnosis.consumer.hidden_slow              |
| unconsumed_queues   | queue published to                | diagnosis.queue.backlog_without_consumer    |
| transfer_settlement | AMQP 1.0 link a client sends on   | diagnosis.publisher.slow_settlement         |
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.addresses import queue_of_address
from amqpscope.pipelines.diagnosis.consumer_capacity import acknowledgements, capacities
from amqpscope.pipelines.diagnosis.figures import CONNECTION
from amqpscope.pipelines.held import first_packets, held_time, timestamp
from amqpscope.pipelines.queue_depth import depth_at

_CONSUMER = ("capture_id", "connection_id", "channel", "consumer_tag")
_LINK = ("capture_id", "connection_id", "channel", "handle")


def _first_packet(packets: str) -> Column:
    return F.try_element_at(F.col(packets), F.lit(1))


def _last_packet(packets: str) -> Column:
    return F.try_element_at(F.col(packets), F.lit(-1))


def consumer_acks(consumer_unacked: DataFrame, messages_091: DataFrame, lifetimes: DataFrame) -> DataFrame:
    """Per 0-9-1 consumer with manual acknowledgement: what became of its deliveries
    (``consumer_capacity.acknowledgements``), its window as RabbitMQ applies it
    (``consumer_capacity.capacities``), the most it held unacked, and the time from its first
    delivery to its first settlement (to the connection's last frame when it settled nothing:
    ``held_us``) within the time from its first delivery to that last frame (``span_us``)."""
    unacked = consumer_unacked
    delivered = unacked.filter(F.col("method") == "basic.deliver")
    held = unacked.groupBy(*_CONSUMER).agg(
        F.min("queue").alias("queue"),
        F.max("unacked").alias("unacked_max"),
        F.unix_micros(F.min(F.when(F.col("settled") > 0, F.col("ts")))).alias("_first_settled_us"),
    )
    packets = delivered.groupBy(*_CONSUMER).agg(first_packets("packet_number").alias("packet_numbers"))
    end = F.unix_micros(F.col("last_ts"))
    until = F.coalesce(F.col("_first_settled_us"), end)
    return (
        acknowledgements(messages_091)
        .join(held, list(_CONSUMER))
        .join(capacities(unacked), list(_CONSUMER), "left")
        .join(packets, list(_CONSUMER), "left")
        .join(lifetimes, list(CONNECTION))
        .select(
            *_CONSUMER,
            "queue",
            "deliveries",
            "acked",
            "requeued",
            "discarded",
            "never_settled",
            "redeliveries",
            "unacked_max",
            "window",
            "prefetch_scope",
            (F.col("acked") + F.col("requeued") + F.col("discarded")).alias("settlements"),
            (until - F.col("first_delivery_us")).alias("held_us"),
            F.greatest(end - F.col("first_delivery_us"), F.lit(1)).alias("span_us"),
            timestamp(F.col("first_delivery_us")).alias("start_ts"),
            F.when(F.col("_first_settled_us").isNotNull(), timestamp(F.col("_first_settled_us"))).alias("end_ts"),
            _first_packet("packet_numbers").alias("start_packet_number"),
            _last_packet("packet_numbers").alias("end_packet_number"),
            F.coalesce(F.col("packet_numbers"), F.array().cast("array<long>")).alias("packet_numbers"),
        )
    )


def message_identity() -> Column:
    """What tells one 0-9-1 message from another on the wire: its message-id where the publisher
    set one, else a digest of what the broker keeps unchanged across redeliveries (exchange,
    routing key, body size and the content header's properties)."""
    digest = F.sha2(
        F.concat_ws(
            "\u0001",
            F.coalesce(F.col("exchange"), F.lit("")),
            F.coalesce(F.col("routing_key"), F.lit("")),
            F.coalesce(F.col("body_size").cast("string"), F.lit("")),
            F.coalesce(F.col("correlation_id"), F.lit("")),
            F.coalesce(F.to_json(F.col("properties")), F.lit("")),
        ),
        256,
    )
    return F.coalesce(F.concat(F.lit("id:"), F.col("message_id")), digest)


def redeliveries(
    consumer_unacked: DataFrame, messages_091: DataFrame, frames: DataFrame, depth_events: DataFrame
) -> DataFrame:
    """Per message (``message_identity``) delivered from a queue and requeued again after being
    redelivered: ``loops`` (its redeliveries that the consumer nacked or rejected with requeue),
    its deliveries, the queue's deliveries and other messages in the same time, the consumer that
    requeued it most, and the queue's ready count after its last delivery (``ready``: null where
    the capture cannot count it). Held: from its first to its last delivery, within the span of
    the queue's deliveries."""
    queues = consumer_unacked.groupBy(*_CONSUMER).agg(F.min("queue").alias("queue"))
    delivered = (
        messages_091.filter(F.col("method") == "basic.deliver")
        .join(queues, list(_CONSUMER))
        .join(
            frames.select(*CONNECTION, "frame_index", "packet_number"),
            [*CONNECTION, "frame_index"],
        )
        .withColumns(
            {
                "_message": message_identity(),
                "_at_us": F.unix_micros("ts"),
                "_loop": (
                    F.coalesce(F.col("redelivered"), F.lit(False))
                    & F.col("settled_by").isin("basic.nack", "basic.reject")
                    & F.coalesce(F.col("requeue"), F.lit(True))
                ).cast("long"),
            }
        )
    )
    queue_keys = ("capture_id", "queue")
    per_queue = delivered.groupBy(*queue_keys).agg(
        F.count(F.lit(1)).alias("queue_deliveries"),
        F.countDistinct("_message").alias("_messages"),
        F.min("_at_us").alias("_queue_first_us"),
        F.max("_at_us").alias("_queue_last_us"),
    )
    per_message = (
        delivered.groupBy(*queue_keys, "_message")
        .agg(
            F.sum("_loop").alias("loops"),
            F.count(F.lit(1)).alias("message_deliveries"),
            F.min("message_id").alias("message_id"),
            F.max_by(F.struct(*_CONSUMER), F.struct("_loop", *_CONSUMER)).alias("_by"),
            F.min("_at_us").alias("_first_us"),
            F.max("_at_us").alias("_last_us"),
            first_packets("packet_number").alias("packet_numbers"),
        )
        .filter(F.col("loops") > 0)
    )
    with_ready = depth_at(
        per_message.select(*queue_keys, "_message", (F.col("_last_us") + F.lit(1)).alias("ts_us")), depth_events
    ).select(*queue_keys, "_message", "ready")
    span = F.greatest(F.col("_queue_last_us") - F.col("_queue_first_us"), F.lit(1))
    return (
        per_message.join(per_queue, list(queue_keys))
        .join(with_ready, [*queue_keys, "_message"], "left")
        .select(
            "capture_id",
            F.col("_by.connection_id").alias("connection_id"),
            F.col("_by.channel").alias("channel"),
            F.col("_by.consumer_tag").alias("consumer_tag"),
            "queue",
            "message_id",
            "loops",
            "message_deliveries",
            "queue_deliveries",
            (F.col("_messages") - F.lit(1)).alias("other_messages"),
            (F.col("message_deliveries") / F.col("queue_deliveries")).alias("loop_share"),
            "ready",
            (F.col("_last_us") - F.col("_first_us")).alias("held_us"),
            span.alias("span_us"),
            timestamp(F.col("_first_us")).alias("start_ts"),
            timestamp(F.col("_last_us")).alias("end_ts"),
            _first_packet("packet_numbers").alias("start_packet_number"),
            _last_packet("packet_numbers").alias("end_packet_number"),
            "packet_numbers",
        )
    )


def neighbour_speeds(consumer_window: DataFrame) -> DataFrame:
    """Per consumer (``consumer_window``'s rows) of a queue that others consume too: the fastest
    other consumer's median ack wait (``fastest_other_wait_p50_us``), the others' deliveries and
    this consumer's share of the queue's deliveries (``delivery_share``)."""
    windows = consumer_window.filter(F.col("queue").isNotNull())
    other = windows.select(
        "capture_id",
        "queue",
        F.col("connection_id").alias("_connection"),
        F.col("channel").alias("_channel"),
        F.col("consumer").alias("_consumer"),
        F.col("wait_p50_us").alias("_wait"),
        F.col("deliveries").alias("_deliveries"),
    )
    me = windows.select(
        "capture_id",
        "queue",
        F.col("connection_id").alias("_me_connection"),
        F.col("channel").alias("_me_channel"),
        F.col("consumer").alias("_me"),
    )
    itself = (
        (F.col("_me_connection") == F.col("_connection"))
        & F.col("_me_channel").eqNullSafe(F.col("_channel"))
        & (F.col("_me") == F.col("_consumer"))
    )
    others = (
        me.join(other, ["capture_id", "queue"])
        .filter(~itself)
        .groupBy("capture_id", "queue", "_me_connection", "_me_channel", "_me")
        .agg(
            F.min("_wait").alias("fastest_other_wait_p50_us"),
            F.sum("_deliveries").alias("other_deliveries"),
            F.count(F.lit(1)).alias("other_consumers"),
        )
    )
    mine = (
        (F.col("connection_id") == F.col("_me_connection"))
        & F.col("channel").eqNullSafe(F.col("_me_channel"))
        & (F.col("consumer") == F.col("_me"))
    )
    return (
        windows.join(others, ["capture_id", "queue"])
        .filter(mine)
        .drop("_me_connection", "_me_channel", "_me")
        .withColumns(
            {
                "delivery_share": F.col("deliveries") / (F.col("deliveries") + F.col("other_deliveries")),
                "slower_by": F.col("wait_p50_us") / F.greatest(F.col("fastest_other_wait_p50_us"), F.lit(1)),
            }
        )
    )


def unconsumed_queues(
    frames: DataFrame, link_state: DataFrame, routes: DataFrame, depth_events: DataFrame, lifetimes: DataFrame
) -> DataFrame:
    """Per queue the capture's publishes reach: how many, over what time, the consumers the
    capture shows on it (0-9-1 basic.consume or basic.get naming it, AMQP 1.0 links from it), its
    ready count just before the first publish and just after the last (null where the capture
    cannot count it: ``pipelines.queue_depth``) and its growth. Held: from the first publish to the
    last, within the capture's span."""
    queue_keys = ("capture_id", "queue")
    routed = routes.filter(F.col("queue").isNotNull()).join(
        frames.select(*CONNECTION, "frame_index", "packet_number"), [*CONNECTION, "frame_index"]
    )
    published = routed.groupBy(*queue_keys).agg(
        F.count(F.lit(1)).alias("published"),
        F.unix_micros(F.min("ts")).alias("_first_us"),
        F.unix_micros(F.max("ts")).alias("_last_us"),
        first_packets("packet_number").alias("packet_numbers"),
        # The publishers' connection where there is one; none where several publish to the queue, so
        # that the finding's filter names its packets by number, not by one connection's port.
        F.when(F.countDistinct("connection_id") == 1, F.min("connection_id")).alias("connection_id"),
    )
    consumed_091 = frames.filter(
        F.col("method").isin("basic.consume", "basic.get") & (F.col("direction") == "c2s")
    ).select(*queue_keys)
    consumed_10 = link_state.filter(F.col("sender_side") == "server").select(
        "capture_id", queue_of_address(F.col("source_address")).alias("queue")
    )
    consumers = (
        consumed_091.unionByName(consumed_10)
        .filter(F.col("queue").isNotNull())
        .groupBy(*queue_keys)
        .agg(F.count(F.lit(1)).alias("consumers"))
    )
    points = published.select(
        *queue_keys,
        # Just before the first publish: the ready count it found.
        (F.col("_first_us") - F.lit(1)).alias("ts_us"),
        F.lit("start").alias("_at"),
    ).unionByName(
        published.select(*queue_keys, (F.col("_last_us") + F.lit(1)).alias("ts_us"), F.lit("end").alias("_at"))
    )
    ready = (
        depth_at(points, depth_events)
        .groupBy(*queue_keys)
        .agg(
            F.max(F.when(F.col("_at") == "start", F.col("ready"))).alias("ready_start"),
            F.max(F.when(F.col("_at") == "end", F.col("ready"))).alias("ready_end"),
        )
    )
    capture = lifetimes.groupBy("capture_id").agg(
        F.unix_micros(F.min("first_ts")).alias("_capture_first_us"),
        F.unix_micros(F.max("last_ts")).alias("_capture_last_us"),
    )
    span = F.greatest(F.col("_capture_last_us") - F.col("_capture_first_us"), F.lit(1))
    return (
        published.join(consumers, list(queue_keys), "left")
        .join(ready, list(queue_keys), "left")
        .join(capture, "capture_id")
        .fillna(0, subset=["consumers"])
        .select(
            "capture_id",
            "connection_id",
            "queue",
            "published",
            "consumers",
            "ready_start",
            "ready_end",
            (F.col("ready_end") - F.col("ready_start")).alias("backlog_growth"),
            (F.col("_last_us") - F.col("_first_us")).alias("held_us"),
            span.alias("span_us"),
            timestamp(F.col("_first_us")).alias("start_ts"),
            F.lit(None).cast("timestamp").alias("end_ts"),
            _first_packet("packet_numbers").alias("start_packet_number"),
            _last_packet("packet_numbers").alias("end_packet_number"),
            "packet_numbers",
        )
    )


def transfer_settlement(
    frames: DataFrame, link_state: DataFrame, deliveries_10: DataFrame, lifetimes: DataFrame
) -> DataFrame:
    """Per AMQP 1.0 link a client sends unsettled transfers on: how long the broker took to settle
    them (from a delivery's first transfer to the broker's disposition covering it: median, 95th
    percentile), how many it had not settled when the capture ended, and the union of the times a
    delivery waited for its settlement (``held_us``) within the time from the link's first transfer
    to its last settlement (``span_us``)."""
    sent = deliveries_10.filter((F.col("direction") == "c2s") & ~F.col("settled_by_sender"))
    settled_at = frames.select(
        *CONNECTION, F.col("frame_index").alias("disposition_frame_index"), F.col("ts_us").alias("_settled_us")
    )
    links = (
        link_state.filter((F.col("sender_side") == "client") & (F.col("method") == "transfer"))
        .groupBy(*_LINK)
        .agg(
            F.min("link_name").alias("link_name"),
            F.min("target_address").alias("target_address"),
        )
    )
    timed = (
        sent.join(settled_at, [*CONNECTION, "disposition_frame_index"], "left")
        .join(frames.select(*CONNECTION, "frame_index", "packet_number"), [*CONNECTION, "frame_index"])
        .join(lifetimes.select(*CONNECTION, F.col("last_ts").alias("_connection_last_ts")), list(CONNECTION))
        .withColumns(
            {
                "_sent_us": F.unix_micros("ts"),
                "_until_us": F.coalesce(F.col("_settled_us"), F.unix_micros("_connection_last_ts")),
            }
        )
    )
    waits = held_time(
        timed.select(
            *_LINK,
            F.col("_sent_us").alias("start_us"),
            F.col("_until_us").alias("end_us"),
            F.col("packet_number").alias("start_packet_number"),
        ),
        _LINK,
    )
    settle_us = F.col("_settled_us") - F.col("_sent_us")
    per_link = timed.groupBy(*_LINK).agg(
        F.count(F.lit(1)).alias("deliveries"),
        F.count("_settled_us").alias("settled"),
        F.percentile_approx(settle_us, 0.5).alias("settle_p50_us"),
        F.percentile_approx(settle_us, 0.95).alias("settle_p95_us"),
        F.min("_sent_us").alias("_first_us"),
        F.max("_sent_us").alias("_last_sent_us"),
        F.max("_until_us").alias("_last_until_us"),
        first_packets("packet_number").alias("packet_numbers"),
    )
    span = F.greatest(F.col("_last_until_us") - F.col("_first_us"), F.lit(1))
    writing = F.greatest(F.col("_last_sent_us") - F.col("_first_us"), F.lit(1))
    return (
        per_link.join(waits, list(_LINK))
        .join(links, list(_LINK), "left")
        .select(
            *CONNECTION,
            "channel",
            "link_name",
            "target_address",
            queue_of_address(F.col("target_address")).alias("queue"),
            "deliveries",
            "settled",
            (F.col("deliveries") - F.col("settled")).alias("unsettled_at_end"),
            "settle_p50_us",
            "settle_p95_us",
            writing.alias("writing_us"),
            "held_us",
            span.alias("span_us"),
            (F.col("deliveries") / (writing / F.lit(1e6))).alias("written_per_second"),
            (F.col("settled") / (span / F.lit(1e6))).alias("settled_per_second"),
            timestamp(F.col("_first_us")).alias("start_ts"),
            timestamp(F.col("_last_until_us")).alias("end_ts"),
            _first_packet("packet_numbers").alias("start_packet_number"),
            _last_packet("packet_numbers").alias("end_packet_number"),
            "packet_numbers",
        )
    )
