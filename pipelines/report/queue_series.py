"""Per queue what RabbitMQ's management UI and its Grafana dashboards chart, computed from the wire,
and the consumers' utilisation.

A queue is named by its canonical address, ``/queues/<name>``, whichever protocol used it
(``pipelines.addresses``, through ``throughput.message_events``). Per bucket of the capture's grid:

- **publish**: messages published to the queue: 0-9-1 ``basic.publish`` through the default
  exchange with the queue's name as routing key, 1.0 deliveries to a queue address. A message
  routed by another exchange reaches queues the wire does not name (the bindings are the broker's),
  so it is not counted for any queue.
- **deliver**: ``basic.deliver`` and ``basic.get-ok`` from the queue, 1.0 deliveries from a queue
  address; **redeliver**: those the broker flagged redelivered (0-9-1).
- **ack**: deliveries of the queue's 0-9-1 consumers settled by their ``basic.ack``.

A queue's depth (ready messages) is the queue_balance table's backlog
(``pipelines.queue_accounting``), which knows where the capture sets the count.

**Consumer utilisation** is RabbitMQ's figure, "the proportion of time that a queue's consumers
could take new messages" (RabbitMQ blog, "Finding bottlenecks with RabbitMQ 3.3", 2014; the
management API's ``consumer_utilisation``: "fraction of the time (between 0.0 and 1.0) that the
queue is able to immediately deliver messages to consumers ... less than 1.0 if consumers are
limited by network congestion or prefetch count"). From the wire, per consumer and bucket: the
share of the consumer's time in the bucket when it could take a delivery, that is when it was
not held at its prefetch (0-9-1 ``prefetch_full`` intervals) or out of link credit (1.0
``link_credit_exhausted``, links the broker sends on). A consumer lives from its consume-ok (its
first link frame) to its cancel-ok (detach), else to the capture's end. ``utilisation_overall``
is the same share over the consumer's whole life.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.addresses import queue_address
from amqpscope.pipelines.report.series_grid import KEYS, CountChart, busiest, exact_sum, keyed, since_start
from amqpscope.pipelines.shape import in_schema
from amqpscope.schemas.report import CHART_SERIES_SCHEMA

QUEUE_METRICS = ("publish", "deliver", "redeliver", "ack")
_QUEUE = "/queues/"


def queue_events(messages: DataFrame, consumer_unacked: DataFrame) -> DataFrame:
    """capture_id, KEYS (name: the queue's address), metric, ts, n: every publish, delivery,
    redelivery and ack of a queue (``messages``: ``throughput.message_events``)."""
    to_queue = messages.where(F.col("address").startswith(_QUEUE) & (F.col("messages") > 0))
    kind = F.when(F.col("direction") == "c2s", F.lit("publish")).otherwise(F.lit("deliver"))
    moved = to_queue.select(
        "capture_id",
        F.col("address").alias("_queue"),
        "ts",
        kind.alias("metric"),
        F.col("messages").cast("long").alias("n"),
        "redelivered",
    )
    redelivered = moved.where(
        (F.col("metric") == "deliver") & F.coalesce(F.col("redelivered"), F.lit(False))
    ).withColumn("metric", F.lit("redeliver"))
    acked = consumer_unacked.where(
        (F.col("method") == "basic.ack") & F.col("queue").isNotNull() & (F.col("settled") > 0)
    ).select(
        "capture_id",
        queue_address(F.col("queue")).alias("_queue"),
        "ts",
        F.lit("ack").alias("metric"),
        F.col("settled").cast("long").alias("n"),
    )
    events = moved.drop("redelivered").unionByName(redelivered.drop("redelivered")).unionByName(acked)
    return keyed(events, name="_queue")


def queue_rates_chart(events: DataFrame) -> CountChart:
    """The queue_rates chart (publish, deliver, redeliver and ack a bucket per queue), from
    ``queue_events``."""
    return CountChart("queue_rates", events, QUEUE_METRICS)


def _pieces(spans: DataFrame, column: str) -> DataFrame:
    """Each span (``_from``, ``_to``: seconds since the start) cut at the buckets it crosses: per
    bucket the seconds of it there, in ``column``."""
    first = F.floor(F.col("_from") / F.col("bucket_s")).cast("int")
    last = F.least(F.floor(F.col("_to") / F.col("bucket_s")).cast("int"), F.col("_buckets") - 1)
    cut = spans.withColumn("_bucket", F.explode(F.sequence(first, F.greatest(first, last))))
    seconds = F.least(F.col("_to"), (F.col("_bucket") + 1) * F.col("bucket_s")) - F.greatest(
        F.col("_from"), F.col("_bucket") * F.col("bucket_s")
    )
    return cut.select("capture_id", *KEYS, "_bucket", "bucket_s", F.greatest(seconds, F.lit(0.0)).alias(column))


def consumer_utilisation_chart(
    consumer_unacked: DataFrame, link_state: DataFrame, flow_intervals: DataFrame, grid: DataFrame
) -> DataFrame:
    """Utilisation per consumer and bucket (0-9-1 consumers, 1.0 links the broker sends on), and
    ``utilisation_overall`` per consumer (at x = 0)."""
    on_grid = F.broadcast(grid)
    consumers_091 = keyed(
        consumer_unacked.groupBy("capture_id", "connection_id", "channel", "consumer_tag").agg(
            F.min("ts").alias("_born"), F.max(F.when(F.col("method") == "basic.cancel-ok", F.col("ts"))).alias("_gone")
        ),
        connection_id="connection_id",
        channel="channel",
        name="consumer_tag",
    )
    consumers_10 = keyed(
        link_state.where(F.col("sender_side") == "server")
        .groupBy("capture_id", "connection_id", "link_name")
        .agg(F.min("ts").alias("_born"), F.max(F.when(F.col("method") == "detach", F.col("ts"))).alias("_gone")),
        connection_id="connection_id",
        name="link_name",
        direction=F.lit("s2c"),
    )
    lives = (
        consumers_091.select("capture_id", *KEYS, "_born", "_gone")
        .unionByName(consumers_10.select("capture_id", *KEYS, "_born", "_gone"))
        .join(on_grid, "capture_id")
        .select(
            "*", since_start("_born").alias("_from"), F.coalesce(since_start("_gone"), F.col("_span_s")).alias("_to")
        )
    )
    held = flow_intervals.where(
        ((F.col("entity") == "consumer") & (F.col("cause") == "prefetch_full"))
        | ((F.col("entity") == "link") & (F.col("cause") == "link_credit_exhausted") & (F.col("direction") == "s2c"))
    )
    held = (
        keyed(
            held,
            connection_id="connection_id",
            channel=F.when(F.col("entity") == "consumer", F.col("channel")),
            name=F.coalesce(F.col("consumer_tag"), F.col("link_name")),
            direction=F.when(F.col("entity") == "link", F.lit("s2c")),
        )
        .join(on_grid, "capture_id")
        .select(
            "*",
            since_start("start_ts").alias("_from"),
            F.coalesce(since_start("end_ts"), F.col("_span_s")).alias("_to"),
        )
    )
    pieces = (
        _pieces(lives, "_life")
        .withColumn("_held", F.lit(0.0))
        .unionByName(_pieces(held, "_held").withColumn("_life", F.lit(0.0)))
        .groupBy("capture_id", *KEYS, "_bucket", "bucket_s")
        .agg(exact_sum(F.col("_life")).alias("_life"), exact_sum(F.col("_held")).alias("_held"))
        .where(F.col("_life") > 0)
    )
    # Most held back first, then the longest lived (weighed as decimals: summed exactly).
    ranked = busiest(pieces, (F.col("_held") * F.lit(1e6) + F.col("_life")).cast("decimal(38,12)"))
    share = 1 - F.least(F.col("_held"), F.col("_life")) / F.col("_life")
    per_bucket = in_schema(
        ranked,
        CHART_SERIES_SCHEMA,
        chart=F.lit("consumer_utilisation"),
        metric=F.lit("utilisation"),
        x=F.col("_bucket") * F.col("bucket_s"),
        value=share,
    )
    overall = ranked.groupBy("capture_id", *KEYS, "series_rank", "series_total", "bucket_s").agg(
        (1 - exact_sum(F.least(F.col("_held"), F.col("_life"))) / exact_sum(F.col("_life"))).alias("value")
    )
    return per_bucket.unionByName(
        in_schema(
            overall,
            CHART_SERIES_SCHEMA,
            chart=F.lit("consumer_utilisation"),
            metric=F.lit("utilisation_overall"),
            x=F.lit(0.0),
        )
    )
