"""AMQP 0-9-1 unacknowledged deliveries per channel and per consumer, after every event (docs/FLOW_CONTROL.md section 4).

Delivery tags on a channel run 1, 2, 3 ... over basic.deliver and basic.get-ok, so each delivery's
settlement is found without replaying the channel one event at a time, by the one settlement rule
(``pipelines.settlement``): an ack / nack / reject settles its own tag, a ``multiple`` one every
outstanding tag up to its own (tag 0: all), and one naming a tag that is not outstanding settles
nothing. A basic.recover settles every outstanding delivery (RabbitMQ requeues them and redelivers
them under new tags). Unacked after an event is then a running sum of +1 per delivery and -1 per settlement,
over the channel or over one consumer's deliveries.
``delivered`` (the highest tag sent so far) and ``settled`` (what a settlement settled: 0 when
the tag it names is not outstanding) are what the rules on unknown and twice-settled tags read.

Prefetch as RabbitMQ scopes it: basic.qos(global=false) sets the limit of each consumer created
after it on the channel, basic.qos(global=true) a limit shared by all the channel's consumers.
Which consumer a delivery is for, its prefetch, and which deliveries need no ack come from
``pipelines.consumers``.

Every window is keyed by channel (plus consumer, or request number): one shuffle in all
(``pipelines.partitioning``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.channels import channel_pass
from amqpscope.pipelines.columns import with_columns
from amqpscope.pipelines.consumers import method_sent
from amqpscope.pipelines.partitioning import CHANNEL, channel_after_frame, frame_of_channel
from amqpscope.pipelines.settlement import settle, with_settlement_rows
from amqpscope.schemas.flow import CHANNEL_UNACKED_SCHEMA, CONSUMER_UNACKED_SCHEMA

_DELIVERIES = ("basic.deliver", "basic.get-ok")
_SETTLEMENTS = ("basic.ack", "basic.nack", "basic.reject")
# basic.recover: RabbitMQ requeues every unacknowledged delivery of the channel (redelivered with
# new tags), so it settles them all, as an ack of tag 0 with multiple would.
_RECOVERS = ("basic.recover", "basic.recover-async")
_EVENTS = (
    *_DELIVERIES,
    *_SETTLEMENTS,
    *_RECOVERS,
    "basic.qos",
    "channel.open",
    "basic.consume",
    "basic.consume-ok",
    "basic.cancel-ok",
    "basic.get",
    "basic.get-empty",
)
_COLUMNS = (
    "capture_id",
    "connection_id",
    "channel",
    "frame_index",
    "ts",
    "packet_number",
    "direction",
    "method",
    "consumer_tag",
    "delivery_tag",
    "multiple",
    "prefetch_count",
    "global",
    "no_ack",
    "queue",
)


# Window specifications are built per call: PySpark needs an active session to build one.


def _consumer_after_frame() -> WindowSpec:
    """One consumer's rows in frame order, a frame's rows together: its unacked count after each frame."""
    return (
        Window.partitionBy(*CHANNEL, "consumer_tag")
        .orderBy("frame_index")
        .rangeBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _frame_of_consumer() -> WindowSpec:
    """One consumer's rows of one frame: how many of its deliveries the frame settled."""
    return Window.partitionBy(*CHANNEL, "consumer_tag", "frame_index")


def _consumer_rows_in_order() -> WindowSpec:
    """One consumer's rows in frame order: keeps one row per settling frame."""
    return Window.partitionBy(*CHANNEL, "consumer_tag").orderBy("frame_index", "delivery_tag")


def unacked_ledger(frames: DataFrame, channels: DataFrame | None = None) -> DataFrame:
    """Every channel event, and a row per settlement of each delivery (``_is_event`` false), with
    the channel's running state after each frame: what channel_unacked and consumer_unacked are
    drawn from (derive computes it once for both: ``pipelines.tables``). Channel incarnations and
    consumers come from ``channels`` (``channels.channel_pass``, computed when not given)."""
    is_qos = method_sent("basic.qos", "c2s")
    is_global = F.coalesce(F.col("global"), F.lit(False))
    any_delivery = F.col("method").isin(*_DELIVERIES) & (F.col("direction") == "s2c")
    events = (
        (channel_pass(frames) if channels is None else channels)
        .filter(F.col("method").isin(*_EVENTS))
        .select(*_COLUMNS, "incarnation", "_consumer", "_no_ack")
    )
    events = events.withColumn(
        "_is_delivery", any_delivery & ~F.coalesce("_no_ack", F.lit(False))
    )  # no-ack: a tag, never an ack

    recover = F.col("method").isin(*_RECOVERS) & (F.col("direction") == "c2s")
    events = events.withColumn(
        "delivery_tag", F.when(recover, F.lit(0).cast("long")).otherwise(F.col("delivery_tag"))
    ).withColumn("multiple", F.when(recover, F.lit(True)).otherwise(F.col("multiple")))
    # Consumer acks travel client to server; broker acks on the same channel are publisher confirms.
    settlement = F.col("method").isin(*_SETTLEMENTS, *_RECOVERS) & (F.col("direction") == "c2s")
    settled = settle(
        events,
        CHANNEL,
        sent=F.when(any_delivery, F.col("delivery_tag")),
        item=F.when(F.col("_is_delivery"), F.col("delivery_tag")),
        settling=settlement,
    )
    event_qos = is_qos & F.col("_is_event")
    highest_tag = F.max(F.when(any_delivery & F.col("_is_event"), F.col("delivery_tag"))).over(channel_after_frame())
    # Every column over the channel's rows after each frame in one window operator, and the
    # frame's own count beside it (the same sort serves both).
    return with_columns(
        with_settlement_rows(settled),
        [
            ("unacked", F.sum("_delta").over(channel_after_frame())),
            # Incarnation 0: the channel was open before the capture began, its earlier tags unknown.
            ("delivered", F.when(F.col("incarnation") > 0, F.coalesce(highest_tag, F.lit(0)))),
            (
                "settled",
                F.when(
                    settlement & ~recover & F.col("_is_event"),
                    F.sum((~F.col("_is_event")).cast("long")).over(frame_of_channel()),
                ),
            ),
            ("_last_prefetch", F.last(F.when(event_qos, F.col("prefetch_count")), True).over(channel_after_frame())),
            ("_last_global", F.last(F.when(event_qos, F.col("global")), True).over(channel_after_frame())),
            (
                "_channel_prefetch",
                F.last(F.when(event_qos & is_global, F.col("prefetch_count")), True).over(channel_after_frame()),
            ),
        ],
    )


def _or_computed(ledger: DataFrame | None, frames: DataFrame) -> DataFrame:
    return unacked_ledger(frames) if ledger is None else ledger


def channel_unacked_timeline(frames: DataFrame, ledger: DataFrame | None = None) -> DataFrame:
    """The channel_unacked table (``schemas.flow.CHANNEL_UNACKED_SCHEMA``) from the frames table
    (and its ``unacked_ledger``, computed when not given)."""
    shown = (F.col("method").isin(*_DELIVERIES) & (F.col("direction") == "s2c")) | (
        F.col("method").isin(*_SETTLEMENTS, "basic.qos") & (F.col("direction") == "c2s")
    )
    timeline = (
        _or_computed(ledger, frames)
        .filter(F.col("_is_event") & shown)
        .withColumn("prefetch_count", F.col("_last_prefetch"))
        .withColumn("prefetch_global", F.col("_last_global"))
    )
    return timeline.select(*[F.col(f.name).cast(f.dataType) for f in CHANNEL_UNACKED_SCHEMA.fields])


def consumer_unacked_timeline(frames: DataFrame, ledger: DataFrame | None = None) -> DataFrame:
    """The consumer_unacked table (``schemas.flow.CONSUMER_UNACKED_SCHEMA``) from the frames table
    (and its ``unacked_ledger``, computed when not given)."""
    acknowledging = F.col("_consumer").isNotNull() & ~F.col("_consumer.no_ack")
    delivery = F.col("_is_event") & F.col("_is_delivery") & (F.col("method") == "basic.deliver")
    # A consumer's first and last moments: consume-ok and cancel-ok (server to client).
    lifecycle = (
        F.col("_is_event") & F.col("method").isin("basic.consume-ok", "basic.cancel-ok") & (F.col("direction") == "s2c")
    )
    settling = ~F.col("_is_event")
    rows = (
        _or_computed(ledger, frames)
        .filter(F.col("consumer_tag").isNotNull() & (delivery | settling | (lifecycle & acknowledging)))
        # One row per settling frame and consumer (a multiple ack settles several of its deliveries).
        # This window first: its order (frame_index, delivery_tag) serves the two after it as well.
        .withColumn("_previous", F.lag("frame_index").over(_consumer_rows_in_order()))
        .withColumn("channel_unacked", F.col("unacked"))
        .withColumn("unacked", F.sum("_delta").over(_consumer_after_frame()))
        .withColumn("settled", F.sum(settling.cast("long")).over(_frame_of_consumer()))
        .filter(~settling | F.col("_previous").isNull() | (F.col("_previous") != F.col("frame_index")))
        .withColumn("queue", F.col("_consumer.queue"))
        .withColumn("prefetch_count", F.col("_consumer.prefetch_count"))
        .withColumn("channel_prefetch_count", F.col("_channel_prefetch"))
        # Incarnation 0: the channel was open when the capture began.
        .withColumn("began_before_capture", F.col("_consumer").isNull() | (F.col("incarnation") == 0))
    )
    return rows.select(*[F.col(f.name).cast(f.dataType) for f in CONSUMER_UNACKED_SCHEMA.fields])
