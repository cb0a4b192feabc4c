"""queue_balance: per queue and bucket of the capture's grid, the messages that went in and came
out, what the consumers and the broker did with them, and the backlog that leaves
(``schemas.queues.QUEUE_BALANCE_SCHEMA``).

What counts for a queue:

| column      | from                                                                                  |
|-------------|---------------------------------------------------------------------------------------|
| published   | publishes routed to it (``publishing.publish_routes``: default exchange, captured bindings, 1.0 target addresses) |
| delivered   | ``basic.deliver`` to a consumer of it; 1.0 transfers on a link whose source is it      |
| redelivered | of those, the ones flagged redelivered                                                |
| acked, requeued, discarded | its deliveries' settlements (``basic.ack``; ``basic.nack`` / ``basic.reject`` with and without requeue), at the settlement's time |
| returned    | ``basic.return`` of a message published through the default exchange to its name       |
| confirmed, refused | its publishes in confirm mode that the broker's ``basic.ack`` / ``basic.nack`` settled |
| backlog     | the ready count at the bucket's end (``queue_depth``); where the capture never sees it set, the least it can have held: the changes since the first packet, raised by the smallest start that keeps them at 0 or more (``backlog_from`` says which) |
| settle_p50_ms | AMQP 1.0: the median time the broker took to settle the transfers written to it in the bucket |

The ready count is RabbitMQ's ``messages_ready`` as far as the capture holds every publisher and
consumer of the queue since the count was set (``pipelines.queue_depth``).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.addresses import queue_of_address
from amqpscope.pipelines.columns import lower_median
from amqpscope.pipelines.messages import settlement_times
from amqpscope.pipelines.publishing import publish_routes
from amqpscope.pipelines.queue_depth import consumer_queues, depth_at, depth_events
from amqpscope.pipelines.report.series_grid import bucket_grid
from amqpscope.schemas.queues import QUEUE_BALANCE_SCHEMA

_CONNECTION = ("capture_id", "connection_id")
_QUEUE = ("capture_id", "queue")
COUNTS = (
    "published",
    "delivered",
    "redelivered",
    "acked",
    "requeued",
    "discarded",
    "returned",
    "confirmed",
    "refused",
)


def _event(df: DataFrame, metric: str | Column, ts_us: Column) -> DataFrame:
    metric_column = F.lit(metric) if isinstance(metric, str) else metric
    return df.select(*_QUEUE, ts_us.alias("ts_us"), metric_column.alias("metric"))


def _queue_in_time() -> WindowSpec:
    """One queue's buckets in order: the changes since the first packet, bucket by bucket."""
    return Window.partitionBy(*_QUEUE).orderBy("bucket").rowsBetween(Window.unboundedPreceding, Window.currentRow)


def queue_events(frames: DataFrame, messages_091: DataFrame, link_state: DataFrame, routes: DataFrame) -> DataFrame:
    """capture_id, queue, ts_us, metric (one of ``COUNTS``): every event that counts for a queue."""
    settled_at = settlement_times(frames, "ts_us", "_settled_us")
    published = routes.filter(F.col("queue").isNotNull())
    confirms = (
        published.filter(F.col("protocol") == "amqp-0-9-1")
        .join(
            messages_091.filter((F.col("method") == "basic.publish") & F.col("publish_seq").isNotNull()).select(
                *_CONNECTION, "frame_index", "settled_by", "settled_frame_index"
            ),
            [*_CONNECTION, "frame_index"],
        )
        .join(settled_at, [*_CONNECTION, "settled_frame_index"])
    )
    deliveries = messages_091.filter(F.col("method") == "basic.deliver").join(
        consumer_queues(frames), ["capture_id", "connection_id", "channel", "consumer_tag"]
    )
    settled = deliveries.filter(F.col("settled_by").isNotNull()).join(settled_at, [*_CONNECTION, "settled_frame_index"])
    refused = F.col("settled_by").isin("basic.nack", "basic.reject")
    requeue = F.coalesce(F.col("requeue"), F.lit(True))
    outcome = (
        F.when(F.col("settled_by") == "basic.ack", "acked")
        .when(refused & requeue, "requeued")
        .when(refused, "discarded")
    )
    returned = messages_091.filter(
        (F.col("method") == "basic.return") & (F.coalesce(F.col("exchange"), F.lit("")) == "")
    ).withColumn("queue", F.col("routing_key"))
    sent_10 = link_state.filter(
        (F.col("method") == "transfer") & (F.col("sender_side") == "server") & F.col("is_new_delivery")
    ).withColumn("queue", queue_of_address(F.col("source_address")))
    return reduce(
        DataFrame.unionByName,
        [
            _event(published, "published", F.unix_micros("ts")),
            _event(deliveries, "delivered", F.unix_micros("ts")),
            _event(
                deliveries.filter(F.coalesce(F.col("redelivered"), F.lit(False))), "redelivered", F.unix_micros("ts")
            ),
            _event(settled.filter(outcome.isNotNull()), outcome, F.col("_settled_us")),
            _event(returned.filter(F.col("queue").isNotNull()), "returned", F.unix_micros("ts")),
            _event(
                confirms,
                F.when(F.col("settled_by") == "basic.nack", "refused").otherwise("confirmed"),
                F.col("_settled_us"),
            ),
            _event(sent_10.filter(F.col("queue").isNotNull()), "delivered", F.unix_micros("ts")),
        ],
    )


def settlement_waits(frames: DataFrame, link_state: DataFrame, deliveries_10: DataFrame) -> DataFrame:
    """capture_id, queue, ts_us (the transfer written), settle_us (to the broker's disposition; null
    when the capture ends first): every unsettled AMQP 1.0 transfer a client sent to a queue."""
    links = (
        link_state.filter((F.col("sender_side") == "client") & (F.col("method") == "transfer"))
        .groupBy(*_CONNECTION, "channel", "handle")
        .agg(queue_of_address(F.min("target_address")).alias("queue"))
    )
    settled_at = frames.select(
        *_CONNECTION, F.col("frame_index").alias("disposition_frame_index"), F.col("ts_us").alias("_settled_us")
    )
    sent = deliveries_10.filter((F.col("direction") == "c2s") & ~F.col("settled_by_sender"))
    return (
        sent.join(links, [*_CONNECTION, "channel", "handle"])
        .join(settled_at, [*_CONNECTION, "disposition_frame_index"], "left")
        .filter(F.col("queue").isNotNull())
        .select(
            *_QUEUE,
            F.unix_micros("ts").alias("ts_us"),
            (F.col("_settled_us") - F.unix_micros("ts")).alias("settle_us"),
        )
    )


def queue_balance(
    captures: DataFrame,
    frames: DataFrame,
    messages_091: DataFrame,
    link_state: DataFrame,
    deliveries_10: DataFrame,
) -> DataFrame:
    """The queue_balance table (``schemas.queues.QUEUE_BALANCE_SCHEMA``): every queue the capture's
    traffic names, every bucket of its capture's grid."""
    routes = publish_routes(messages_091, link_state, frames)
    events = queue_events(frames, messages_091, link_state, routes)
    grid = bucket_grid(captures).withColumn("_bucket_us", F.round(F.col("bucket_s") * F.lit(1e6)).cast("long"))
    bucket_of = F.floor((F.col("ts_us") - F.col("_start_us")) / F.col("_bucket_us")).cast("int")
    counted = (
        events.join(grid, "capture_id")
        .withColumn("bucket", F.least(F.greatest(bucket_of, F.lit(0)), F.col("_buckets") - 1))
        .groupBy(*_QUEUE, "bucket")
        .agg(*[F.sum((F.col("metric") == m).cast("long")).alias(m) for m in COUNTS])
    )
    waits = (
        settlement_waits(frames, link_state, deliveries_10)
        .join(grid, "capture_id")
        .withColumn("bucket", F.least(F.greatest(bucket_of, F.lit(0)), F.col("_buckets") - 1))
        .groupBy(*_QUEUE, "bucket")
        .agg((lower_median(F.col("settle_us")) / F.lit(1e3)).alias("settle_p50_ms"))
    )
    queues = events.select(*_QUEUE).distinct()
    every_bucket = queues.join(grid, "capture_id").withColumn(
        "bucket", F.explode(F.sequence(F.lit(0), F.col("_buckets") - 1))
    )
    bucket_end_us = F.col("_start_us") + (F.col("bucket") + 1) * F.col("_bucket_us")
    ends = every_bucket.select(*_QUEUE, "bucket", bucket_end_us.alias("ts_us"))
    # The ready count just before the next bucket starts: after every event of this one.
    ready = depth_at(ends, depth_events(frames, messages_091, link_state, routes)).select(*_QUEUE, "bucket", "ready")
    rows = (
        every_bucket.join(counted, [*_QUEUE, "bucket"], "left")
        .join(waits, [*_QUEUE, "bucket"], "left")
        .join(ready, [*_QUEUE, "bucket"], "left")
        .fillna(0, subset=list(COUNTS))
    )
    # A returned message never entered the queue its routing key names.
    change = F.col("published") - F.col("returned") - F.col("delivered") + F.col("requeued")
    whole_queue = Window.partitionBy(*_QUEUE)
    known = F.max(F.col("ready").isNotNull().cast("int")).over(whole_queue) > 0
    # Without a count set, what the queue held at the first packet is unknown, and a queue never
    # holds fewer than 0 messages: the smallest start that keeps every bucket's end at 0 or more
    # gives the backlog at least held (0 when the changes never go below the start).
    since_start = rows.withColumn("_changes", F.sum(change).over(_queue_in_time()))
    at_least = F.col("_changes") - F.least(F.min("_changes").over(whole_queue), F.lit(0))
    width = F.col("bucket_s")
    return since_start.select(
        *_QUEUE,
        "bucket",
        F.timestamp_micros(F.col("_start_us") + F.col("bucket") * F.col("_bucket_us")).alias("bucket_start_ts"),
        "bucket_s",
        *COUNTS,
        F.when(known, F.col("ready")).otherwise(at_least).alias("backlog"),
        F.when(known, F.lit("declare-ok")).otherwise(F.lit("lower bound")).alias("backlog_from"),
        (F.col("published") / width).alias("in_per_second"),
        (F.col("delivered") / width).alias("out_per_second"),
        "settle_p50_ms",
    ).select(*[F.col(f.name).cast(f.dataType) for f in QUEUE_BALANCE_SCHEMA.fields])
