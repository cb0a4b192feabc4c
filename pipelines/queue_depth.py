"""How many messages were ready in a queue at a given moment, as far as the capture can count them.

A queue's ready count is set by what the broker said (``queue.declare-ok``'s message-count) or
did (``queue.purge`` empties it), then rises with every publish routed to it
(``pipelines.publishing.publish_routes``), falls with every delivery from it (``basic.deliver`` to
a consumer of the queue, ``transfer`` on an AMQP 1.0 link whose source is the queue) and rises
again with every delivery requeued (``basic.nack`` / ``basic.reject`` with requeue). That is
RabbitMQ's ``messages_ready``, provided the capture holds every publisher and consumer of the
queue since the count was set.

It is not known (null) for a queue whose count the capture never saw set, and for a queue whose
count would go below zero at some point (a publisher the capture does not hold): a guess would
be worse than none.

``depth_at(points, events)`` answers, for rows naming a queue and a time, the ready count just
before that time.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.addresses import queue_of_address
from amqpscope.pipelines.messages import settlement_times

_QUEUE = ("capture_id", "queue")
# At the same microsecond: a count set first, then the changes, then the questions.
_SET, _CHANGE, _QUESTION = 0, 1, 2


def consumer_queues(frames: DataFrame) -> DataFrame:
    """Per consumer (capture, connection, channel, tag): the queue of the basic.consume its
    consume-ok answered (the latest basic.consume on the channel before it)."""
    in_channel = Window.partitionBy("capture_id", "connection_id", "channel").orderBy("frame_index")
    rows = frames.filter(F.col("method").isin("basic.consume", "basic.consume-ok")).select(
        "capture_id",
        "connection_id",
        "channel",
        "method",
        "consumer_tag",
        F.last(F.when(F.col("method") == "basic.consume", F.col("queue")), True).over(in_channel).alias("queue"),
    )
    return (
        rows.filter(F.col("method") == "basic.consume-ok")
        .select("capture_id", "connection_id", "channel", "consumer_tag", "queue")
        .distinct()
    )


def depth_events(frames: DataFrame, messages_091: DataFrame, link_state: DataFrame, routes: DataFrame) -> DataFrame:
    """Every event that sets or changes a queue's ready count: capture_id, queue, ts_us, kind
    (0 set, 1 change) and value (the count set, or +1 / -1)."""
    declared = frames.filter(
        (F.col("method") == "queue.declare-ok") & F.col("queue").isNotNull() & F.col("message_count").isNotNull()
    ).select(*_QUEUE, "ts_us", F.lit(_SET).alias("kind"), F.col("message_count").alias("value"))
    purged = frames.filter((F.col("method") == "queue.purge") & (F.col("direction") == "c2s")).select(
        *_QUEUE, "ts_us", F.lit(_SET).alias("kind"), F.lit(0).cast("long").alias("value")
    )
    published = routes.filter(F.col("queue").isNotNull()).select(
        *_QUEUE, F.unix_micros("ts").alias("ts_us"), F.lit(_CHANGE).alias("kind"), F.lit(1).cast("long").alias("value")
    )
    deliveries = messages_091.filter(F.col("method") == "basic.deliver").join(
        consumer_queues(frames), ["capture_id", "connection_id", "channel", "consumer_tag"]
    )
    delivered = deliveries.select(
        *_QUEUE, F.unix_micros("ts").alias("ts_us"), F.lit(_CHANGE).alias("kind"), F.lit(-1).cast("long").alias("value")
    )
    settle_times = settlement_times(frames, "ts_us", "_settled_us")
    requeued = (
        deliveries.filter(
            F.col("settled_by").isin("basic.nack", "basic.reject") & F.coalesce(F.col("requeue"), F.lit(False))
        )
        .join(settle_times, ["capture_id", "connection_id", "settled_frame_index"])
        .select(
            *_QUEUE,
            F.col("_settled_us").alias("ts_us"),
            F.lit(_CHANGE).alias("kind"),
            F.lit(1).cast("long").alias("value"),
        )
    )
    sent_10 = link_state.filter(
        (F.col("method") == "transfer") & (F.col("sender_side") == "server") & F.col("is_new_delivery")
    )
    delivered_10 = sent_10.select(
        "capture_id",
        queue_of_address(F.col("source_address")).alias("queue"),
        F.unix_micros("ts").alias("ts_us"),
        F.lit(_CHANGE).alias("kind"),
        F.lit(-1).cast("long").alias("value"),
    ).filter(F.col("queue").isNotNull())
    return (
        declared.unionByName(purged)
        .unionByName(published)
        .unionByName(delivered)
        .unionByName(requeued)
        .unionByName(delivered_10)
    )


def _in_time() -> WindowSpec:
    """One queue's events in time order: the count since the latest set, in one running pass."""
    return (
        Window.partitionBy(*_QUEUE).orderBy("ts_us", "kind").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _whole_queue() -> WindowSpec:
    return Window.partitionBy(*_QUEUE)


def depth_at(points: DataFrame, events: DataFrame) -> DataFrame:
    """``points`` (rows with capture_id, queue and ts_us) with ``ready``: the queue's ready count
    just before ``ts_us``, null where the capture cannot count it. Each point is a question in its
    queue's timeline and keeps its columns there: no key joins the answers back."""
    questions = points.withColumns({"kind": F.lit(_QUESTION), "value": F.lit(0).cast("long")})
    timeline = events.unionByName(questions, allowMissingColumns=True)
    window = _in_time()
    # The changes since the latest set: all changes so far less those up to that set, so that one
    # ordering of the queue's timeline answers everything.
    changes = F.sum(F.when(F.col("kind") == _CHANGE, F.col("value")).otherwise(0)).over(window)
    # The three running values read nothing of one another: one window operator computes them, so
    # that a queue's timeline (the largest partition of a run) is buffered once for them, not three
    # times in a row.
    counted = (
        timeline.withColumns(
            {
                "_since": F.sum((F.col("kind") == _SET).cast("long")).over(window),
                "_base": F.last(F.when(F.col("kind") == _SET, F.col("value")), True).over(window),
                "_changes": changes,
            }
        )
        .withColumn("_changes_at_set", F.last(F.when(F.col("kind") == _SET, F.col("_changes")), True).over(window))
        .withColumn(
            "_ready", F.when(F.col("_since") > 0, F.col("_base") + F.col("_changes") - F.col("_changes_at_set"))
        )
        .withColumn("_trusted", F.min(F.coalesce(F.col("_ready"), F.lit(0))).over(_whole_queue()) >= 0)
    )
    return counted.filter(F.col("kind") == _QUESTION).select(
        *points.columns, F.when(F.col("_trusted"), F.col("_ready")).alias("ready")
    )
