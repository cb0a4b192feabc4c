"""How many deliveries RabbitMQ may have outstanding to an AMQP 0-9-1 consumer, as RabbitMQ applies
its limits, and what each consumer did with its deliveries.

RabbitMQ reads ``basic.qos`` per channel in its own way
(https://www.rabbitmq.com/docs/consumer-prefetch):

| basic.qos                 | applies to                                     |
|---------------------------|------------------------------------------------|
| global=false (prefetch n) | each consumer created after it on the channel  |
| global=true  (prefetch n) | all the channel's consumers together           |
| both                      | each: a delivery needs room under both limits  |
| none (or prefetch 0)      | nothing: unacked may grow without a bound      |

A consumer with no_ack=true (automatic acknowledgement) has no window at all: its deliveries are
settled as they are sent (spec 1.8.3.3), and it is not in ``consumer_unacked``.

``at_limit`` says, after each row of ``consumer_unacked``, whether the consumer could take no more
deliveries: its own unacked at its own prefetch, or its channel's unacked at the channel's
prefetch (what Celery / kombu set: ``basic.qos(global=true)``). ``limit_intervals`` turns that
into intervals per consumer; ``capacities`` names each consumer's window and its scope.
``acknowledgements`` counts, per consumer, what its deliveries became (acked, nacked or rejected,
requeued or not, never settled) and how many were redeliveries.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.intervals import intervals

_CONSUMER = ("capture_id", "connection_id", "channel", "consumer_tag")


def _positive(column: str) -> Column:
    """The limit in ``column`` where it is one (a prefetch of 0 or null is no limit)."""
    return F.when(F.col(column) > 0, F.col(column))


def at_limit() -> Column:
    """On a ``consumer_unacked`` row: after it, RabbitMQ may send the consumer nothing more (its
    per-consumer prefetch or its channel's global prefetch reached). The channel's unacked is the
    one after this consumer's row: another consumer's deliveries on the channel between two of its
    rows are seen at its next row."""
    own = F.coalesce(F.col("unacked") >= _positive("prefetch_count"), F.lit(False))
    channel = F.coalesce(F.col("channel_unacked") >= _positive("channel_prefetch_count"), F.lit(False))
    return (own | channel) & (F.col("method") != "basic.cancel-ok")


def limit_intervals(consumer_unacked: DataFrame) -> DataFrame:
    """Per consumer, the intervals in which it was at its limit (``at_limit``): capture_id,
    connection_id, channel, consumer_tag, start_ts, end_ts (null: until the capture ends),
    start_packet_number and the rest of ``pipelines.intervals``' columns."""
    return intervals(consumer_unacked, list(_CONSUMER), ["frame_index"], at_limit())


def capacities(consumer_unacked: DataFrame) -> DataFrame:
    """Per consumer: ``consumer_prefetch`` (its own basic.qos global=false), ``channel_prefetch``
    (the channel's global=true, the largest seen), ``window`` (the tighter of the two: what it may
    hold at most; null when neither is set) and ``prefetch_scope``: consumer, channel, both or
    unbounded."""
    described = consumer_unacked.groupBy(*_CONSUMER).agg(
        F.max(_positive("prefetch_count")).alias("consumer_prefetch"),
        F.max(_positive("channel_prefetch_count")).alias("channel_prefetch"),
    )
    own, shared = F.col("consumer_prefetch").isNotNull(), F.col("channel_prefetch").isNotNull()
    return described.select(
        "*",
        F.least("consumer_prefetch", "channel_prefetch").alias("window"),
        F.when(own & shared, "both")
        .when(own, "consumer")
        .when(shared, "channel")
        .otherwise("unbounded")
        .alias("prefetch_scope"),
    )


def acknowledgements(messages_091: DataFrame) -> DataFrame:
    """Per 0-9-1 consumer with manual acknowledgement: ``deliveries``, ``redeliveries`` (the
    redelivered flag set), ``acked``, ``requeued`` (nack / reject with requeue), ``discarded``
    (nack / reject without: dropped or dead-lettered), ``never_settled``, ``first_delivery_us`` and
    ``last_delivery_us``."""
    delivered = messages_091.filter((F.col("method") == "basic.deliver") & ~F.coalesce(F.col("no_ack"), F.lit(False)))
    by = F.col("settled_by")
    refused = F.coalesce(by.isin("basic.nack", "basic.reject"), F.lit(False))
    requeue = F.coalesce(F.col("requeue"), F.lit(True))  # the spec's default for both methods is requeue

    def counted(condition: Column) -> Column:
        return F.sum(F.coalesce(condition, F.lit(False)).cast("long"))

    return delivered.groupBy(*_CONSUMER).agg(
        F.count(F.lit(1)).alias("deliveries"),
        counted(F.col("redelivered")).alias("redeliveries"),
        counted(by == "basic.ack").alias("acked"),
        counted(refused & requeue).alias("requeued"),
        counted(refused & ~requeue).alias("discarded"),
        counted(by.isNull()).alias("never_settled"),
        F.unix_micros(F.min("ts")).alias("first_delivery_us"),
        F.unix_micros(F.max("ts")).alias("last_delivery_us"),
    )
