"""A consumer's window, the same idea in both protocols: how many deliveries the broker may have
outstanding to it, and what that did to its deliveries.

In AMQP 0-9-1 the window is the consumer's prefetch (``basic.qos``) as RabbitMQ applies it: its
own (global=false), its channel's shared by the channel's consumers (global=true), or both
(``pipelines.consumer_capacity``): the broker sends no more while the limit is reached, and sends
the next one as an ack frees a slot. In
AMQP 1.0 it is the link credit the receiver grants (``flow``): the broker sends no more while the
credit is used up, and sends again when the receiver grants more (docs/FLOW_CONTROL.md sections 2 and 4).

``consumer_windows_of`` gives one row per 0-9-1 consumer and per AMQP 1.0 link the broker sends on,
in one shape: the window, the time its window was full (the union of the intervals at its limit,
``consumer_capacity.limit_intervals``, or of the ``link_credit_exhausted`` intervals of
``flow_intervals``, within the time it consumed), how long
a window slot stayed taken (the 0-9-1 ack wait; the time a 1.0 link sat at credit 0), and what
happened each time a slot was freed: whether a message was waiting for it (the queue's ready
count, ``pipelines.queue_depth``, where the capture can count it) and whether a delivery followed
within ``refill_ms`` (the broker had one for it).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.pipelines.addresses import queue_of_address
from amqpscope.pipelines.diagnosis.consumer_capacity import at_limit, capacities, limit_intervals
from amqpscope.pipelines.held import clipped, held_time, timestamp
from amqpscope.pipelines.messages import settlement_times
from amqpscope.pipelines.partitioning import next_value
from amqpscope.pipelines.queue_depth import depth_at

_CONSUMER = ("capture_id", "connection_id", "channel", "consumer_tag")
_LINK = ("capture_id", "connection_id", "link_name")


def _us(ts: Column | str) -> Column:
    return F.unix_micros(F.col(ts) if isinstance(ts, str) else ts)


def _consumer_in_order() -> WindowSpec:
    """One consumer's unacked timeline in order: what follows each acknowledgement."""
    return Window.partitionBy(*_CONSUMER).orderBy("frame_index")


def _link_in_order() -> WindowSpec:
    """One link's state timeline in order: what follows each credit grant."""
    return Window.partitionBy(*_LINK).orderBy("frame_index")


# Who freed a slot, in one shape for both protocols: a 0-9-1 consumer (its channel and tag) or an
# AMQP 1.0 link (its name); the other protocol's columns are null.
_SLOT_OWNER = ("protocol", "capture_id", "connection_id", "_consumer_channel", "consumer_tag", "link_name")
_SLOT_OUTCOMES = ("slots_freed", "slots_refilled", "slots_counted", "slots_with_message_waiting", "refill_p50_us")


def _slot_owner(protocol: str, keys: tuple[str, ...]) -> list[Column]:
    """The ``_SLOT_OWNER`` columns of rows of ``protocol`` keyed by ``keys``."""
    return [
        F.lit(protocol).alias("protocol"),
        "capture_id",
        "connection_id",
        (F.col("channel") if "channel" in keys else F.lit(None).cast("int")).alias("_consumer_channel"),
        F.col("consumer_tag") if "consumer_tag" in keys else F.lit(None).cast("string").alias("consumer_tag"),
        F.col("link_name") if "link_name" in keys else F.lit(None).cast("string").alias("link_name"),
    ]


def _slot_outcomes(freed: DataFrame, depth_events: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """Per slot owner (``_SLOT_OWNER``): slots freed, how many a delivery followed within
    refill_ms, how many found a message ready in the queue (of those whose queue's ready count is
    known) and the median time from a freed slot to the next delivery. Both protocols' slots are
    answered in one pass over the queues' ready counts."""
    answered = depth_at(freed, depth_events)
    refill_us = F.col("_next_us") - F.col("ts_us")
    refilled = F.coalesce(refill_us <= F.lit(limits.refill_ms * 1000), F.lit(False))
    return answered.groupBy(*_SLOT_OWNER).agg(
        F.count(F.lit(1)).alias("slots_freed"),
        F.sum(refilled.cast("long")).alias("slots_refilled"),
        F.count("ready").alias("slots_counted"),
        F.sum((F.col("ready") > 0).cast("long")).alias("slots_with_message_waiting"),
        F.percentile_approx(refill_us, 0.5).alias("refill_p50_us"),
    )


def _freed_slots(slots: DataFrame, protocol: str, keys: tuple[str, ...]) -> DataFrame:
    """``slots`` (rows of ``keys``, queue, ts_us, _next_us) with their owner: those of an owner
    with a null key are left out, as a join on its key would leave them."""
    known = [F.col(k).isNotNull() for k in keys]
    return slots.filter(reduce(Column.__and__, known)).select(
        *_slot_owner(protocol, keys), "queue", "ts_us", "_next_us"
    )


def _windows_091(
    consumer_unacked: DataFrame,
    messages_091: DataFrame,
    frames: DataFrame,
) -> tuple[DataFrame, DataFrame]:
    """The 0-9-1 consumers' rows but their slot outcomes, and the slots their acks freed."""
    settle_times = settlement_times(frames, "ts", "_settled_ts")
    delivered = messages_091.filter((F.col("method") == "basic.deliver") & ~F.coalesce(F.col("no_ack"), F.lit(False)))
    waits = delivered.join(settle_times, ["capture_id", "connection_id", "settled_frame_index"], "left").withColumn(
        "_wait_us", _us("_settled_ts") - _us("ts")
    )
    activity = waits.groupBy(*_CONSUMER).agg(
        F.count(F.lit(1)).alias("deliveries"),
        F.percentile_approx("_wait_us", 0.5).alias("wait_p50_us"),
        F.percentile_approx("_wait_us", 0.95).alias("wait_p95_us"),
        _us(F.min("ts")).alias("active_start_us"),
        _us(F.max(F.coalesce(F.col("_settled_ts"), F.col("ts")))).alias("active_end_us"),
    )
    window = _consumer_in_order()
    rows = consumer_unacked.select(
        *_CONSUMER,
        "queue",
        "settled",
        "unacked",
        "method",
        "frame_index",
        "packet_number",
        _us("ts").alias("ts_us"),
        # At its limit before this row: its own prefetch or its channel's global one (Celery's).
        F.coalesce(F.lag(at_limit()).over(window), F.lit(False)).alias("_was_full"),
        F.when(F.lead("method").over(window) == "basic.deliver", _us(F.lead("ts").over(window))).alias("_next_us"),
    )
    freed = rows.filter((F.col("settled") > 0) & F.col("_was_full"))
    described = (
        consumer_unacked.groupBy(*_CONSUMER)
        .agg(F.first("queue", ignorenulls=True).alias("queue"))
        .join(capacities(consumer_unacked), list(_CONSUMER))
    )
    held = held_time(_bounded(limit_intervals(consumer_unacked), activity, _CONSUMER), _CONSUMER)
    consumers = (
        activity.join(described, list(_CONSUMER))
        .join(held, list(_CONSUMER), "left")
        .withColumn("protocol", F.lit("amqp-0-9-1"))
        .withColumn("link_name", F.lit(None).cast("string"))
    )
    return consumers, _freed_slots(freed, "amqp-0-9-1", _CONSUMER)


def _bounded(intervals: DataFrame, activity: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """Intervals (open ones until the entity's last activity) clipped to the entity's active span."""
    spans = activity.select(*keys, "active_start_us", "active_end_us")
    timed = intervals.join(spans, list(keys)).select(
        *keys,
        _us("start_ts").alias("start_us"),
        F.coalesce(_us("end_ts"), F.col("active_end_us")).alias("end_us"),
        "start_packet_number",
        "active_start_us",
        "active_end_us",
    )
    return clipped(timed, F.col("active_start_us"), F.col("active_end_us"))


def _windows_10(flow_intervals: DataFrame, link_state: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The AMQP 1.0 receiving links' rows but their slot outcomes, and the slots their credit
    grants freed."""
    # The link's own frames: link_state also has a row per disposition that settled its deliveries.
    receiving = link_state.filter((F.col("sender_side") == "server") & (F.col("method") != "disposition"))
    activity = (
        receiving.groupBy(*_LINK)
        .agg(
            F.sum(F.col("is_new_delivery").cast("long")).alias("deliveries"),
            _us(F.min(F.when((F.col("method") == "flow") & (F.col("role") == "receiver"), F.col("ts")))).alias(
                "active_start_us"
            ),
            _us(F.max(F.when(F.col("method") == "transfer", F.col("ts")))).alias("active_end_us"),
            queue_of_address(F.first("source_address", ignorenulls=True)).alias("queue"),
            F.first("channel", ignorenulls=True).alias("channel"),
            F.percentile_approx(
                F.when((F.col("method") == "flow") & (F.col("role") == "receiver"), F.col("link_credit_rcv")), 0.5
            ).alias("window"),
        )
        .filter(F.col("active_start_us").isNotNull() & F.col("active_end_us").isNotNull())
    )
    window = _link_in_order()
    grants = (
        receiving.withColumn("_delivery_us", F.when(F.col("is_new_delivery"), _us("ts")))
        .withColumns(
            {
                "_credit_before": F.lag("link_credit_snd").over(window),
                # The next delivery, whatever comes between (RabbitMQ answers a flow with a flow of its own).
                "_next_us": next_value("_delivery_us", window),
            }
        )
        .filter(
            (F.col("method") == "flow")
            & (F.col("role") == "receiver")
            & (F.col("_credit_before") <= 0)
            & (F.col("link_credit_snd") > 0)
        )
        .select(*_LINK, queue_of_address(F.col("source_address")).alias("queue"), _us("ts").alias("ts_us"), "_next_us")
    )
    starved = (
        (F.col("entity") == "link")
        & (F.col("cause") == "link_credit_exhausted")
        & (F.col("direction") == "s2c")
        & ~F.coalesce(F.col("detail"), F.lit("")).startswith("no flow")
    )
    held = held_time(_bounded(flow_intervals.filter(starved), activity, _LINK), _LINK)
    links = (
        activity.join(held, list(_LINK), "left")
        .withColumn("protocol", F.lit("amqp-1.0"))
        .withColumn("consumer_tag", F.lit(None).cast("string"))
        # A 1.0 slot stays taken while the link sits at credit 0: the median such time.
        .withColumn("wait_p50_us", F.col("held_p50_us"))
        .withColumn("wait_p95_us", F.lit(None).cast("long"))
    )
    return links, _freed_slots(grants, "amqp-1.0", _LINK)


def consumer_windows_of(
    flow_intervals: DataFrame,
    consumer_unacked: DataFrame,
    link_state: DataFrame,
    messages_091: DataFrame,
    frames: DataFrame,
    depth_events: DataFrame,
    limits: DiagnosisThresholds,
) -> DataFrame:
    """One row per 0-9-1 consumer and AMQP 1.0 link the broker sends on: protocol, consumer_tag /
    link_name, channel, queue, window, deliveries, active_start_us / active_end_us (span_us),
    held_us (window full, union), held_packets, wait_p50_us, slots_freed, slots_refilled,
    slots_counted, slots_with_message_waiting, refill_p50_us, and derived shares: held_share,
    refill_share, waiting_share (messages waiting where counted, else refilled at once),
    deliveries_per_second."""
    consumers, freed_091 = _windows_091(consumer_unacked, messages_091, frames)
    links, freed_10 = _windows_10(flow_intervals, link_state)
    outcomes = _slot_outcomes(freed_091.unionByName(freed_10), depth_events, limits).select(
        *[F.col(k).alias(f"_slot_{k}") for k in _SLOT_OWNER], *_SLOT_OUTCOMES
    )
    entities = consumers.unionByName(links, allowMissingColumns=True).withColumn(
        "_consumer_channel", F.when(F.col("protocol") == "amqp-0-9-1", F.col("channel"))
    )
    # Null-safe: a 0-9-1 consumer has no link name, a 1.0 link no channel or tag of its own.
    owned = [F.col(k).eqNullSafe(F.col(f"_slot_{k}")) for k in _SLOT_OWNER]
    with_outcomes = entities.join(outcomes, reduce(Column.__and__, owned), "left")
    # The columns in the order they had when each protocol's outcomes were joined to its rows.
    own = [c for c in consumers.columns if c not in ("protocol", "link_name")]
    rest = [c for c in links.columns if c not in consumers.columns]
    both = with_outcomes.select(*own, *_SLOT_OUTCOMES, "protocol", "link_name", *rest)
    span = F.greatest(F.col("active_end_us") - F.col("active_start_us"), F.lit(1))
    freed = F.greatest(F.coalesce(F.col("slots_freed"), F.lit(0)), F.lit(1))
    counted = F.coalesce(F.col("slots_counted"), F.lit(0))
    return both.fillna(
        0, subset=["held_us", "slots_freed", "slots_refilled", "slots_counted", "slots_with_message_waiting"]
    ).withColumns(
        {
            "span_us": span,
            "held_share": F.col("held_us") / span,
            "refill_share": F.col("slots_refilled") / freed,
            # The ready count decides where the capture can count it for at least half the freed slots.
            "waiting_share": F.when(
                counted * 2 >= freed, F.col("slots_with_message_waiting") / F.greatest(counted, F.lit(1))
            ).otherwise(F.col("slots_refilled") / freed),
            "deliveries_per_second": F.col("deliveries") / (span / F.lit(1e6)),
        }
    )


def consumer_window(consumer_windows: DataFrame) -> DataFrame:
    """Per 0-9-1 consumer and AMQP 1.0 receiving link: its window and what it did
    (``pipelines.consumer_window``)."""
    return consumer_windows.select(
        "*",
        timestamp(F.coalesce(F.col("held_start_us"), F.col("active_start_us"))).alias("start_ts"),
        timestamp(F.coalesce(F.col("held_end_us"), F.col("active_end_us"))).alias("end_ts"),
        F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
        F.try_element_at("held_packets", F.lit(-1)).alias("end_packet_number"),
        F.coalesce(F.col("held_packets"), F.array().cast("array<long>")).alias("packet_numbers"),
        (F.col("refill_p50_us") + F.col("wait_p50_us")).alias("round_trip_p50_us"),
        F.coalesce(F.col("consumer_tag"), F.col("link_name")).alias("consumer"),
    )
