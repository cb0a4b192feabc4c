"""Messages and bytes per second per connection, channel, link and queue / address.

A message is a 0-9-1 basic.publish (client to server), basic.deliver or basic.get-ok (server to
client), its bytes the body-size of the content header that follows it on the channel; or a 1.0
delivery, its bytes the payload of all its transfer frames. Addresses are named as RabbitMQ's
AMQP 1.0 addresses: ``/queues/<queue>`` for deliveries from a 0-9-1 consumer or get,
``/exchanges/<exchange>/<routing-key>`` (``/queues/<routing-key>`` through the default exchange)
for 0-9-1 publishes, the link's target (sending) or source (receiving) address for 1.0.

Buckets are one capture second wide (``date_trunc('second', ts)``) and exist only where there is
traffic; a message is counted in the second its first frame was captured.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.addresses import canonical_address, queue_address
from amqpscope.pipelines.columns import union_all
from amqpscope.pipelines.shape import in_schema
from amqpscope.schemas.flow import THROUGHPUT_SCHEMA

_MESSAGES = ("basic.publish", "basic.deliver", "basic.get-ok")
_REQUESTS = {"basic.consume": "basic.consume-ok", "basic.get": "basic.get-ok"}
# Grouping columns per scope; the others are null in that scope's rows.
_SCOPES = {
    "connection": ("connection_id", "protocol", "direction"),
    "channel": ("connection_id", "protocol", "direction", "channel"),
    "link": ("connection_id", "protocol", "direction", "channel", "link_name", "address"),
    "address": ("direction", "address"),
}
_GROUPED = ("connection_id", "protocol", "direction", "channel", "link_name", "address")  # every scope's keys


def _channel_direction_in_order() -> WindowSpec:
    """One channel's frames in one direction, in order: a content method's header is the next frame."""
    return Window.partitionBy("capture_id", "connection_id", "channel", "direction").orderBy("frame_index")


def _nth_of_kind() -> WindowSpec:
    """Requests (or replies) of one kind on a channel in order: the n-th reply answers the n-th request."""
    return Window.partitionBy("capture_id", "connection_id", "channel", "_kind").orderBy("frame_index")


def _queues(frames: DataFrame) -> DataFrame:
    """(capture, connection, channel, consumer_tag or get-ok frame_index, queue) from paired requests."""
    paired = []
    for request, reply in _REQUESTS.items():
        asked = (
            frames.filter((F.col("method") == request) & (F.col("direction") == "c2s"))
            .withColumn("_kind", F.lit(request))
            .withColumn("_n", F.row_number().over(_nth_of_kind()))
            .select("capture_id", "connection_id", "channel", "_kind", "_n", "queue")
        )
        answered = (
            frames.filter((F.col("method") == reply) & (F.col("direction") == "s2c"))
            .withColumn("_kind", F.lit(request))
            .withColumn("_n", F.row_number().over(_nth_of_kind()))
            .select(
                "capture_id",
                "connection_id",
                "channel",
                "_kind",
                "_n",
                "consumer_tag",
                F.col("frame_index").alias("_reply_index"),
            )
        )
        paired.append(asked.join(answered, on=["capture_id", "connection_id", "channel", "_kind", "_n"]))
    return union_all(paired).select(
        "capture_id", "connection_id", "channel", "_kind", "consumer_tag", "_reply_index", "queue"
    )


def _amqp091_messages(frames: DataFrame, lookups: DataFrame) -> DataFrame:
    """The 0-9-1 message rows of ``frames``, their queues found in the requests of ``lookups`` (the
    same frames, as stored)."""
    is_091 = F.col("protocol") == "amqp-0-9-1"
    content = frames.filter(is_091 & (F.col("method").isin(*_MESSAGES) | (F.col("frame_type") == "header")))
    window = _channel_direction_in_order()
    messages = (
        content.withColumn("_next_type", F.lead("frame_type").over(window))
        .withColumn("_next_size", F.lead("body_size").over(window))
        .filter(
            F.col("method").isin(*_MESSAGES)
            & (F.col("direction") == F.when(F.col("method") == "basic.publish", "c2s").otherwise("s2c"))
        )
        .withColumn("bytes", F.when(F.col("_next_type") == "header", F.col("_next_size")).otherwise(F.lit(0)))
    )
    queues = _queues(lookups.filter(is_091 & F.col("method").isin(*_REQUESTS, *_REQUESTS.values())))
    consumers = queues.filter(F.col("_kind") == "basic.consume").select(
        "capture_id", "connection_id", "channel", "consumer_tag", F.col("queue").alias("_consumer_queue")
    )
    gets = queues.filter(F.col("_kind") == "basic.get").select(
        "capture_id",
        "connection_id",
        "channel",
        F.col("_reply_index").alias("frame_index"),
        F.col("queue").alias("_get_queue"),
    )
    published_to = F.when(
        F.coalesce(F.col("exchange"), F.lit("")) == "", queue_address(F.col("routing_key"))
    ).otherwise(
        F.concat(F.lit("/exchanges/"), F.col("exchange"), F.lit("/"), F.coalesce(F.col("routing_key"), F.lit("")))
    )
    delivered_from = queue_address(F.coalesce(F.col("_consumer_queue"), F.col("_get_queue")))
    return (
        messages.join(F.broadcast(consumers), on=["capture_id", "connection_id", "channel", "consumer_tag"], how="left")
        .join(F.broadcast(gets), on=["capture_id", "connection_id", "channel", "frame_index"], how="left")
        .select(
            "capture_id",
            "connection_id",
            "protocol",
            "direction",
            "channel",
            F.lit(None).cast("string").alias("link_name"),
            F.when(F.col("method") == "basic.publish", published_to).otherwise(delivered_from).alias("address"),
            "ts",
            F.lit(1).alias("messages"),
            "bytes",
            "redelivered",
        )
    )


def _amqp10_messages(link_state: DataFrame) -> DataFrame:
    sending = F.col("sender_side") == "client"
    return link_state.filter(F.col("method") == "transfer").select(
        "capture_id",
        "connection_id",
        F.lit("amqp-1.0").alias("protocol"),
        "direction",
        "channel",
        "link_name",
        canonical_address(F.when(sending, F.col("target_address")).otherwise(F.col("source_address"))).alias("address"),
        "ts",
        F.col("is_new_delivery").cast("int").alias("messages"),
        F.coalesce(F.col("payload_size"), F.lit(0)).alias("bytes"),
        F.lit(None).cast("boolean").alias("redelivered"),  # 1.0 says it in the message header, not read here
    )


def message_events(
    frames: DataFrame, link_state: DataFrame | None, stored_frames: DataFrame | None = None
) -> DataFrame:
    """One row per message frame (0-9-1 publish / deliver / get-ok, 1.0 transfer carrying bytes):
    capture_id, connection_id, protocol, direction, channel, link_name, address, ts, messages, bytes,
    redelivered (0-9-1 deliveries: the broker's redelivered flag). The queues consumed from are
    looked up in ``stored_frames`` when given (the frames as stored: pipelines.tables.STORED_FRAMES).

    The rows the throughput table sums per second; the report buckets them at other widths.
    """
    messages = _amqp091_messages(frames, frames if stored_frames is None else stored_frames)
    if link_state is not None:
        messages = messages.unionByName(_amqp10_messages(link_state))
    return messages.filter((F.col("messages") > 0) | (F.col("bytes") > 0))


def throughput(frames: DataFrame, link_state: DataFrame) -> DataFrame:
    """The throughput table (``schemas.flow.THROUGHPUT_SCHEMA``) from the frames and link_state tables."""
    return throughput_of(message_events(frames, link_state))


def throughput_of(message_events: DataFrame) -> DataFrame:
    """The throughput table from ``message_events`` (derive computes those once: the report's
    charts count the same rows in their own buckets)."""
    messages = message_events.withColumn("second", F.date_trunc("second", F.col("ts")))
    # One aggregation per scope, as a union: a column outside a scope's keys is null in its rows (as
    # grouping sets would give them; not every Spark Connect engine plans grouping sets with
    # expressions). The message rows (windows and joins over the frames) are a shared result,
    # computed once (pipelines.tables), so each scope's aggregation reads them as computed.
    sums = union_all((_scope_sums(messages, name, keys) for name, keys in _SCOPES.items()))
    scoped = sums.filter(
        ((F.col("scope") != "link") | F.col("link_name").isNotNull())
        & ((F.col("scope") != "address") | F.col("address").isNotNull())
    )
    return in_schema(scoped, THROUGHPUT_SCHEMA)


def _scope_sums(messages: DataFrame, scope: str, keys: tuple[str, ...]) -> DataFrame:
    """Messages and bytes per second of one scope's ``keys``; the other grouped columns null."""
    sums = messages.groupBy("capture_id", *keys, "second").agg(
        F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes")
    )
    left_out = [F.lit(None).cast(THROUGHPUT_SCHEMA[c].dataType).alias(c) for c in _GROUPED if c not in keys]
    return sums.select("capture_id", *keys, *left_out, "second", "messages", "bytes", F.lit(scope).alias("scope"))
