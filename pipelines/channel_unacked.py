"""AMQP 0-9-1 unacknowledged deliveries per channel, after every event (DOMAIN.md section 4).

Delivery tags on a channel run 1, 2, 3 ... over basic.deliver and basic.get-ok, so each delivery's
settlement can be found without replaying the channel one event at a time:

- a single ack / nack / reject settles its own tag;
- a ``multiple`` one settles every tag up to its own (tag 0: every tag delivered so far). The
  highest such tag only grows, so the first multiple-settlement covering tag t is found by
  ordering deliveries and "high-water marks" by tag.

Unacked after an event is then a running sum of +1 per delivery and -1 per settlement.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.schemas.flow import CHANNEL_UNACKED_SCHEMA

_DELIVERIES = ("basic.deliver", "basic.get-ok")
_SETTLEMENTS = ("basic.ack", "basic.nack", "basic.reject")
# Requests and their synchronous replies, paired in order on a channel to learn which deliveries
# need no ack: a consumer or a basic.get with no-ack=true.
_NO_ACK_REQUESTS = {"basic.consume": ("basic.consume-ok",), "basic.get": ("basic.get-ok", "basic.get-empty")}
_EVENTS = (*_DELIVERIES, *_SETTLEMENTS, "basic.qos", "channel.open", *_NO_ACK_REQUESTS,
           *(r for replies in _NO_ACK_REQUESTS.values() for r in replies))

_CHANNEL = ("capture_id", "connection_id", "channel", "incarnation")

# Window specifications are built per call: PySpark needs an active session to build one.


def _channel_so_far() -> WindowSpec:
    """A channel's frames in order: everything here is a running aggregate over it."""
    return Window.partitionBy(*_CHANNEL).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, Window.currentRow)


def _channel_number_so_far() -> WindowSpec:
    """A channel number's frames in order, across re-opens: counts channel.open to tell incarnations apart."""
    return (
        Window.partitionBy("capture_id", "connection_id", "channel")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _by_tag_onwards() -> WindowSpec:
    """Deliveries and multiple-settlement marks of a channel by tag, marks after deliveries of the
    same tag: the first mark at or above a delivery's tag is the one that settles it."""
    return Window.partitionBy(*_CHANNEL).orderBy("tag", "is_mark").rowsBetween(Window.currentRow, Window.unboundedFollowing)


def _nth_on_channel() -> WindowSpec:
    """Requests (or replies) of one kind on a channel in order: the n-th reply answers the n-th request."""
    return Window.partitionBy(*_CHANNEL, "_kind").orderBy("frame_index")


def _no_ack_marks(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(no-ack consumer tags, frame indexes of get-ok replies to no-ack gets) per channel."""
    paired = []
    for request, replies in _NO_ACK_REQUESTS.items():
        asked = (
            events.filter((F.col("method") == request) & (F.col("direction") == "c2s"))
            .withColumn("_kind", F.lit(request))
            .withColumn("_n", F.row_number().over(_nth_on_channel()))
            .select(*_CHANNEL, "_n", F.coalesce(F.col("no_ack"), F.lit(False)).alias("_no_ack"))
        )
        answered = (
            events.filter(F.col("method").isin(*replies) & (F.col("direction") == "s2c"))
            .withColumn("_kind", F.lit(request))
            .withColumn("_n", F.row_number().over(_nth_on_channel()))
            .select(*_CHANNEL, "_n", "method", "consumer_tag", "frame_index")
        )
        paired.append(asked.join(answered, on=[*_CHANNEL, "_n"]).filter(F.col("_no_ack")))
    consumers = paired[0].select(*_CHANNEL, "consumer_tag", F.lit(True).alias("_no_ack_consumer"))
    gets = paired[1].filter(F.col("method") == "basic.get-ok").select(*_CHANNEL, "frame_index", F.lit(True).alias("_no_ack_get"))
    return consumers, gets


def channel_unacked_timeline(frames: DataFrame) -> DataFrame:
    """The channel_unacked table (``schemas.flow.CHANNEL_UNACKED_SCHEMA``) from the frames table."""
    is_open = F.col("method") == "channel.open"
    events = (
        frames.filter((F.col("protocol") == "amqp-0-9-1") & F.col("method").isin(*_EVENTS))
        .withColumn("incarnation", F.sum(is_open.cast("int")).over(_channel_number_so_far()))
    )
    consumers, gets = _no_ack_marks(events)
    events = events.join(consumers, on=[*_CHANNEL, "consumer_tag"], how="left").join(gets, on=[*_CHANNEL, "frame_index"], how="left")
    any_delivery = F.col("method").isin(*_DELIVERIES) & (F.col("direction") == "s2c")
    no_ack = F.coalesce(F.col("_no_ack_consumer"), F.col("_no_ack_get"), F.lit(False))
    # Deliveries to no-ack consumers or gets take a tag but are never acknowledged.
    is_delivery = any_delivery & ~no_ack
    # Consumer acks travel client to server; broker acks on the same channel are publisher confirms.
    is_settlement = F.col("method").isin(*_SETTLEMENTS) & (F.col("direction") == "c2s")
    # Highest tag delivered so far: what a multiple settlement with tag 0 reaches.
    events = events.withColumn("_delivered", F.max(F.when(any_delivery, F.col("delivery_tag"))).over(_channel_so_far()))

    deliveries = events.filter(is_delivery).select(*_CHANNEL, F.col("delivery_tag").alias("tag"), F.col("frame_index").alias("delivered_at"))
    settlements = events.filter(is_settlement)
    singles = (
        settlements.filter(~F.coalesce(F.col("multiple"), F.lit(False)))
        .groupBy(*_CHANNEL, F.col("delivery_tag").alias("tag"))
        .agg(F.min("frame_index").alias("single_at"))
    )
    # Multiple settlements as marks: the tag they reach (tag 0 = all delivered so far).
    marks = settlements.filter(F.coalesce(F.col("multiple"), F.lit(False))).select(
        *_CHANNEL,
        F.when(F.col("delivery_tag") == 0, F.col("_delivered")).otherwise(F.col("delivery_tag")).alias("tag"),
        F.col("frame_index").alias("mark_at"),
    )
    by_tag = (
        deliveries.withColumn("is_mark", F.lit(0)).withColumn("mark_at", F.lit(None).cast("long"))
        .unionByName(marks.withColumn("is_mark", F.lit(1)).withColumn("delivered_at", F.lit(None).cast("long")))
        .withColumn("multiple_at", F.min("mark_at").over(_by_tag_onwards()))
        .filter(F.col("is_mark") == 0)
        .join(singles, on=[*_CHANNEL, "tag"], how="left")
    )
    # A settlement only counts after the delivery (a stale tag settles nothing it did not see).
    settled_at = F.least(
        F.when(F.col("single_at") > F.col("delivered_at"), F.col("single_at")),
        F.when(F.col("multiple_at") > F.col("delivered_at"), F.col("multiple_at")),
    )
    changes = by_tag.select(*_CHANNEL, F.col("delivered_at").alias("frame_index"), F.lit(1).alias("delta")).unionByName(
        by_tag.filter(settled_at.isNotNull()).select(*_CHANNEL, settled_at.alias("frame_index"), F.lit(-1).alias("delta"))
    )
    delta_at = changes.groupBy(*_CHANNEL, "frame_index").agg(F.sum("delta").alias("delta"))

    is_qos = (F.col("method") == "basic.qos") & (F.col("direction") == "c2s")
    timeline = (
        events.join(delta_at, on=[*_CHANNEL, "frame_index"], how="left")
        .withColumn("unacked", F.sum(F.coalesce(F.col("delta"), F.lit(0))).over(_channel_so_far()))
        .withColumn("prefetch_count", F.last(F.when(is_qos, F.col("prefetch_count")), True).over(_channel_so_far()))
        .withColumn("prefetch_global", F.last(F.when(is_qos, F.col("global")), True).over(_channel_so_far()))
        .filter(any_delivery | is_settlement | is_qos)
    )
    return timeline.select(*[F.col(f.name).cast(f.dataType) for f in CHANNEL_UNACKED_SCHEMA.fields])
