"""Gold table of queue accounting from the wire (``pipelines/queue_accounting.py``): per queue and
bucket of the capture's time grid, what went in, what came out and what the broker did with it.

A queue is a 0-9-1 queue reached through the default exchange or a binding the capture shows
(``pipelines.publishing.publish_routes``), or the queue an AMQP 1.0 address names. Buckets are the
report's (``pipelines.report.series_grid.bucket_grid``): a few hundred per capture, every one present for
each queue, zero when nothing happened.
"""

from __future__ import annotations

from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

# One row per queue and bucket of the capture's grid.
QUEUE_BALANCE_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("queue", StringType(), False),  # 0-9-1 queue name, or the queue a 1.0 address names
        StructField("bucket", IntegerType(), False),  # 0 = the bucket of the capture's first packet
        StructField("bucket_start_ts", TimestampType(), False),
        StructField("bucket_s", DoubleType(), False),  # the capture's bucket width in seconds
        StructField("published", LongType(), False),  # messages routed to it (0-9-1 publishes, 1.0 transfers)
        StructField("delivered", LongType(), False),  # deliveries from it (0-9-1 basic.deliver, 1.0 transfers)
        StructField("redelivered", LongType(), False),  # of those, flagged redelivered (0-9-1)
        StructField("acked", LongType(), False),  # its deliveries settled by basic.ack (at the ack's time)
        # Its deliveries a consumer basic.nack-ed or basic.reject-ed with requeue: back in the queue.
        StructField("requeued", LongType(), False),
        # Its deliveries nacked or rejected without requeue: dropped, or dead-lettered where configured.
        StructField("discarded", LongType(), False),
        # basic.return of messages published through the default exchange with its name as routing key.
        StructField("returned", LongType(), False),
        StructField("confirmed", LongType(), False),  # publishes to it the broker confirmed (basic.ack)
        StructField("refused", LongType(), False),  # publishes to it the broker refused (basic.nack)
        # Messages ready in it at the end of the bucket: from the broker's queue.declare-ok
        # message-count where the capture has one (backlog_from "declare-ok"; null before it), else
        # the least the queue can have held ("lower bound": what it held at the capture's first
        # packet is unknown; the changes since, raised so that no bucket ends below 0).
        StructField("backlog", LongType(), True),
        StructField("backlog_from", StringType(), False),  # declare-ok | lower bound
        StructField("in_per_second", DoubleType(), False),  # published over the bucket's width
        StructField("out_per_second", DoubleType(), False),  # delivered over the bucket's width
        # AMQP 1.0: the median time from a sender's transfer to the queue, written in this bucket, to
        # the broker's disposition settling it (null: none written, or none settled).
        StructField("settle_p50_ms", DoubleType(), True),
    ]
)
