"""Measures of TCP windows holding a sender back: publishers the broker's window throttles (and
whether publishers to one queue are throttled together), consumers whose acks wait behind a
throttled publisher on their connection (head of line), clients that do not read, and TLS
connections whose AMQP was not decoded. Pure functions of named inputs
(``pipelines.diagnosis.measures``)."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.expectations.finding_ids import DIAGNOSIS_PUBLISHER_CREDIT_FLOW
from amqpscope.pipelines.diagnosis.figures import CONNECTION, apart, per_second, share, us
from amqpscope.pipelines.held import clipped, held_time, merged_intervals, timestamp
from amqpscope.pipelines.partitioning import next_value
from amqpscope.pipelines.publishing import publishing
from amqpscope.pipelines.tcp_pressure import window_limited_gaps, zero_windows, zero_windows_advertised


def window_held(tcp_flow: DataFrame, flow_intervals: DataFrame, lifetimes: DataFrame, direction: str) -> DataFrame:
    """Intervals in which the sender in ``direction`` was held back by its peer's window: too
    little room for its next segment, or a zero window (``pipelines.tcp_pressure``)."""
    gaps = window_limited_gaps(tcp_flow, direction).select(*CONNECTION, "start_us", "end_us", "start_packet_number")
    closed = zero_windows(flow_intervals, lifetimes, direction).select(
        *CONNECTION, "start_us", "end_us", "start_packet_number"
    )
    return gaps.unionByName(closed)


# The columns of a window-pressure measure after its entity's (``window_pressure``).
PRESSURE_COLUMNS = (
    "held_us",
    "held_intervals",
    "zero_window_us",
    "zero_windows",
    "span_us",
    "held_share",
    "start_ts",
    "end_ts",
    "start_packet_number",
    "end_packet_number",
    "packet_numbers",
)


def window_pressure(held: DataFrame, zero: DataFrame, sending: DataFrame) -> DataFrame:
    """Per connection of ``sending`` (``_low`` to ``_high``: the µs it was sending): the union of the
    ``held`` intervals (a peer's window holding it back) and of the ``zero`` ones (zero windows alone)
    within that time, the span, the share held and the packets (``PRESSURE_COLUMNS``)."""

    def within(intervals: DataFrame) -> DataFrame:
        joined = intervals.join(sending, list(CONNECTION))
        return held_time(clipped(joined, F.col("_low"), F.col("_high")), CONNECTION)

    zero_time = within(zero).select(
        *CONNECTION, F.col("held_us").alias("zero_window_us"), F.col("held_intervals").alias("zero_windows")
    )
    span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
    return (
        within(held)
        .join(sending, list(CONNECTION))
        .join(zero_time, list(CONNECTION), "left")
        .fillna(0, subset=["zero_window_us", "zero_windows"])
        .select(
            *CONNECTION,
            "held_us",
            "held_intervals",
            "zero_window_us",
            "zero_windows",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            timestamp(F.col("held_start_us")).alias("start_ts"),
            timestamp(F.col("held_end_us")).alias("end_ts"),
            F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
            F.try_element_at("held_packets", F.lit(-1)).alias("end_packet_number"),
            F.col("held_packets").alias("packet_numbers"),
        )
    )


def publisher_pressure(
    flow_intervals: DataFrame,
    tcp_flow: DataFrame,
    lifetimes: DataFrame,
    limits: DiagnosisThresholds,
    routes: DataFrame,
    declarations: DataFrame,
    alarmed: DataFrame,
) -> DataFrame:
    """Per publishing connection outside any alarm: what it publishes where (``pipelines.publishing``),
    the time the broker's window held it back within its publishing span (``held_us``, the
    union of window-limited gaps and zero windows), full windows, zero windows (count and
    their own union), and ``together_share``: the share of that time in which another
    publisher to a queue it shares was held back too (a slow queue holds back every publisher
    feeding it; a channel only its own)."""
    published = publishing(routes, declarations)
    spans = published.join(alarmed, list(CONNECTION), "left_anti").select(
        *CONNECTION, us("publish_first_ts").alias("_low"), us("publish_last_ts").alias("_high")
    )
    held_intervals = clipped(
        window_held(tcp_flow, flow_intervals, lifetimes, "c2s").join(spans, list(CONNECTION)),
        F.col("_low"),
        F.col("_high"),
    )
    held = held_time(held_intervals, CONNECTION)
    zero = held_time(
        clipped(
            zero_windows(flow_intervals, lifetimes, "c2s").join(spans, list(CONNECTION)),
            F.col("_low"),
            F.col("_high"),
        ),
        CONNECTION,
    ).select(*CONNECTION, F.col("held_us").alias("zero_window_us"), F.col("held_intervals").alias("zero_windows"))
    full = (
        tcp_flow.filter((F.col("direction") == "c2s") & F.col("is_window_full"))
        .join(spans, list(CONNECTION))
        .filter((F.col("ts_us") >= F.col("_low")) & (F.col("ts_us") <= F.col("_high")))
        .groupBy(*CONNECTION)
        .agg(F.count(F.lit(1)).alias("window_full_segments"))
    )
    together = _held_together(merged_intervals(held_intervals, CONNECTION), published, limits)
    rows = (
        published.join(spans, list(CONNECTION))
        .join(held, list(CONNECTION))
        .join(zero, list(CONNECTION), "left")
        .join(full, list(CONNECTION), "left")
        .join(together, list(CONNECTION), "left")
        .fillna(
            0,
            subset=[
                "zero_window_us",
                "zero_windows",
                "window_full_segments",
                "together_us",
                "co_throttled_publishers",
            ],
        )
    )
    span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
    return rows.select(
        "*",
        span.alias("span_us"),
        (F.col("held_us") / span).alias("held_share"),
        (F.col("held_intervals") / (span / F.lit(1e6))).alias("stalls_per_second"),
        share("together_us", "held_us").alias("together_share"),
        F.try_element_at("queues", F.lit(1)).alias("queue"),
        F.try_element_at("publish_channels", F.lit(1)).alias("channel"),
        timestamp(F.col("held_start_us")).alias("start_ts"),
        timestamp(F.col("held_end_us")).alias("end_ts"),
        F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
        F.try_element_at("held_packets", F.lit(-1)).alias("end_packet_number"),
        F.col("held_packets").alias("packet_numbers"),
        F.array_join(F.col("publish_channels").cast("array<string>"), ",").alias("publish_channel_list"),
        F.array_join(F.slice("queues", 1, 5), ",").alias("queue_list"),
        F.array_join(F.slice("destinations", 1, 5), ",").alias("destination_list"),
        F.array_join(F.col("queue_types"), ",").alias("queue_type_list"),
        F.array_contains(F.col("queue_types"), "quorum").alias("to_quorum"),
        F.array_contains(F.col("queue_types"), "stream").alias("to_stream"),
        (F.size(F.coalesce(F.col("lazy_queues"), F.array().cast("array<string>"))) > 0).alias("to_lazy"),
        F.array_join(F.coalesce(F.col("bounded_queues"), F.array().cast("array<string>")), ",").alias(
            "bounded_queue_list"
        ),
    )


def _held_together(islands: DataFrame, published: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """Per connection: the time (``together_us``) of its held islands during which another
    connection publishing to a queue (or destination) it shares was held back too, and how
    many such connections (``co_throttled_publishers``). Islands are cut into buckets of
    together_bucket_ms so that two publishers' many short stalls of one credit-flow episode
    meet (a blocked reader is let go and blocked again ~80 times a second, docs/FLOW_CONTROL.md section 5)."""
    bucket = int(limits.together_bucket_ms * 1000)
    cut = islands.select(
        *CONNECTION,
        "start_us",
        "end_us",
        F.explode(F.sequence(F.floor(F.col("start_us") / bucket), F.floor((F.col("end_us") - 1) / bucket))).alias(
            "_bucket"
        ),
    )
    per_bucket = cut.select(
        *CONNECTION,
        "_bucket",
        (
            F.least(F.col("end_us"), (F.col("_bucket") + 1) * bucket)
            - F.greatest(F.col("start_us"), F.col("_bucket") * bucket)
        ).alias("_us"),
    )
    mine = per_bucket.groupBy(*CONNECTION, "_bucket").agg(F.sum("_us").alias("_us"))
    shared_with = published.select(*CONNECTION, F.coalesce(F.col("queues"), F.col("destinations")).alias("_to"))
    theirs = mine.select("capture_id", F.col("connection_id").alias("_other"), "_bucket").join(
        shared_with.select("capture_id", F.col("connection_id").alias("_other"), F.col("_to").alias("_their_to")),
        ["capture_id", "_other"],
    )
    met = (
        mine.join(shared_with, list(CONNECTION))
        .join(theirs, ["capture_id", "_bucket"])
        .filter((F.col("_other") != F.col("connection_id")) & F.arrays_overlap("_to", "_their_to"))
    )
    per_mine = met.groupBy(*CONNECTION, "_bucket").agg(
        F.first("_us").alias("_us"), F.collect_set("_other").alias("_others")
    )
    return per_mine.groupBy(*CONNECTION).agg(
        F.sum("_us").alias("together_us"),
        F.size(F.array_distinct(F.flatten(F.collect_list("_others")))).alias("co_throttled_publishers"),
    )


def head_of_line(
    consumer_unacked: DataFrame,
    messages_091: DataFrame,
    found: Callable[[str], DataFrame],
    limits: DiagnosisThresholds,
    consumer_windows: DataFrame,
) -> DataFrame:
    """Consumers (with a prefetch) on another channel of a connection whose publisher
    ``diagnosis.publisher.credit_flow`` found throttled: RabbitMQ stops reading the whole
    socket, so their acks wait behind the publishes and the broker cannot refill their
    prefetch. Held: from each ack that freed a slot of a full prefetch while the publisher was
    held back until the next delivery, where that took longer than refill_ms; the consumer's
    delivery rate before, during and after."""
    publishers = found(DIAGNOSIS_PUBLISHER_CREDIT_FLOW).select(
        *CONNECTION,
        F.col("component").alias("parent_component"),
        F.col("confidence").alias("parent_confidence"),
        F.col("held_start_us").alias("_throttled_from"),
        F.col("held_end_us").alias("_throttled_until"),
        F.col("publish_channels"),
        F.col("publish_channel_list"),
        F.col("held_us").alias("publisher_held_us"),
    )
    windows = consumer_windows.filter(F.col("protocol") == "amqp-0-9-1").select(
        *CONNECTION, "channel", "consumer_tag", "queue", "window", "active_start_us", "active_end_us", "deliveries"
    )
    sharing = windows.join(publishers, list(CONNECTION)).filter(
        ~F.array_contains(F.col("publish_channels"), F.col("channel")) & (F.col("window") > 0)
    )
    unacked = consumer_unacked
    # One consumer's unacked timeline in order: what follows each ack.
    order = Window.partitionBy(*CONNECTION, "channel", "consumer_tag").orderBy("frame_index")
    limit = F.coalesce(F.col("prefetch_count"), F.lit(0))
    slots = unacked.withColumn("_delivery_us", F.when(F.col("method") == "basic.deliver", us("ts"))).select(
        *CONNECTION,
        "channel",
        "consumer_tag",
        "settled",
        "packet_number",
        us("ts").alias("ts_us"),
        ((limit > 0) & (F.lag("unacked").over(order) >= limit)).alias("_was_full"),
        # The next delivery, whatever comes between: the acks the consumer sent while the broker
        # did not read the socket reach the wire together, before the delivery they free.
        next_value("_delivery_us", order).alias("_next_us"),
    )
    keys = (*CONNECTION, "channel", "consumer_tag")
    waits = (
        slots.filter((F.col("settled") > 0) & F.col("_was_full"))
        .join(sharing, list(keys))
        .filter((F.col("ts_us") >= F.col("_throttled_from")) & (F.col("ts_us") <= F.col("_throttled_until")))
        # An ack with no delivery after it is the consumer stopping, not a stall.
        .filter(F.col("_next_us").isNotNull())
        .select(
            *keys,
            F.col("ts_us").alias("start_us"),
            F.col("_next_us").alias("end_us"),
            F.col("packet_number").alias("start_packet_number"),
        )
        .filter(F.col("end_us") - F.col("start_us") > F.lit(int(limits.refill_ms * 1000)))
    )
    bounded = clipped(
        waits.join(apart(sharing.select(*keys, "active_start_us", "active_end_us")), list(keys)),
        F.col("active_start_us"),
        F.col("active_end_us"),
    )
    held = held_time(bounded, keys)
    rows = sharing.join(apart(held), list(keys))
    delivered = messages_091.filter(F.col("method") == "basic.deliver").select(*keys, us("ts").alias("_at"))
    phases = (
        delivered.join(apart(rows.select(*keys, "held_start_us", "held_end_us")), list(keys))
        .groupBy(*keys)
        .agg(
            F.sum((F.col("_at") < F.col("held_start_us")).cast("long")).alias("_before"),
            # The delivery that ends a wait opens "after": during counts what came while it waited.
            F.sum(
                ((F.col("_at") >= F.col("held_start_us")) & (F.col("_at") < F.col("held_end_us"))).cast("long")
            ).alias("_during"),
            F.sum((F.col("_at") >= F.col("held_end_us")).cast("long")).alias("_after"),
        )
    )
    span = F.greatest(F.col("active_end_us") - F.col("active_start_us"), F.lit(1))
    return rows.join(apart(phases), list(keys), "left").select(
        *keys,
        "queue",
        "window",
        "deliveries",
        "parent_component",
        "parent_confidence",
        "publish_channel_list",
        "publisher_held_us",
        "held_us",
        "held_intervals",
        span.alias("span_us"),
        (F.col("held_us") / span).alias("held_share"),
        per_second("_before", "active_start_us", "held_start_us").alias("rate_before"),
        per_second("_during", "held_start_us", "held_end_us").alias("rate_during"),
        per_second("_after", "held_end_us", "active_end_us").alias("rate_after"),
        timestamp(F.col("held_start_us")).alias("start_ts"),
        timestamp(F.col("held_end_us")).alias("end_ts"),
        F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
        F.try_element_at("held_packets", F.lit(-1)).alias("end_packet_number"),
        F.col("held_packets").alias("packet_numbers"),
    )


def client_receive_pressure(
    frames: DataFrame, flow_intervals: DataFrame, tcp_flow: DataFrame, lifetimes: DataFrame, consumer_windows: DataFrame
) -> DataFrame:
    """Per connection the broker sends to: the time its client's window held the broker back
    (window-limited gaps and zero windows in the server-to-client direction, their union)
    within the time the broker was sending, and the consumer it delivers to."""
    sending = (
        frames.filter(F.col("direction") == "s2c")
        .groupBy(*CONNECTION)
        .agg(us(F.min("ts")).alias("_low"), us(F.max("ts")).alias("_high"))
    )
    zero = zero_windows(flow_intervals, lifetimes, "s2c")
    consumers = consumer_windows.groupBy(*CONNECTION).agg(
        F.min_by("consumer_tag", "active_start_us").alias("consumer_tag"),
        F.min_by("link_name", "active_start_us").alias("link_name"),
        F.min_by("queue", "active_start_us").alias("queue"),
        F.min_by("channel", "active_start_us").alias("channel"),
    )
    return (
        window_pressure(window_held(tcp_flow, flow_intervals, lifetimes, "s2c"), zero, sending)
        .join(consumers, list(CONNECTION), "left")
        .select(*CONNECTION, "consumer_tag", "link_name", "queue", "channel", *PRESSURE_COLUMNS)
    )


def encrypted_window_pressure(connections: DataFrame, tcp_flow: DataFrame) -> DataFrame:
    """Per TLS connection whose AMQP was not decoded and per ``sender`` (``c2s`` the client,
    ``s2c`` the broker): the time its peer's window held it back (window-limited gaps and zero
    windows, their union) within the time it was sending, from the TCP segments alone."""
    encrypted = connections.filter(F.col("protocol") == "tls").select(*CONNECTION)
    flow = tcp_flow.join(F.broadcast(encrypted), list(CONNECTION), "left_semi")
    found = []
    for sender in ("c2s", "s2c"):
        sending = (
            flow.filter((F.col("direction") == sender) & (F.col("payload_length") > 0))
            .groupBy(*CONNECTION)
            .agg(F.min("ts_us").alias("_low"), F.max("ts_us").alias("_high"))
        )
        gaps = window_limited_gaps(flow, sender).select(*CONNECTION, "start_us", "end_us", "start_packet_number")
        closed = zero_windows_advertised(flow, sender)
        found.append(
            window_pressure(gaps.unionByName(closed), closed, sending).select(
                *CONNECTION, F.lit(sender).alias("sender"), F.lit(False).alias("decoded"), *PRESSURE_COLUMNS
            )
        )
    return found[0].unionByName(found[1])
