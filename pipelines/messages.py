"""Messages from the frames table: 0-9-1 content assembled and settled, 1.0 deliveries made whole.

``messages_091``: a content method (the spec's methods with content: basic.publish / return /
deliver / get-ok) is followed on its channel, in its direction, by one content header and body
frames (0-9-1 spec 4.2.6); those frames belong to the last content method before them. Publishes
after confirm.select are numbered 1, 2, ... per channel (RabbitMQ's publisher confirms), and each
message is linked to the frame that settled it: the broker's basic.ack / basic.nack for a publish,
the client's basic.ack / nack / reject for a delivery, ``multiple`` included (tag 0: all so far), by
the same rule as the flow-state timelines (``pipelines.settlement``: a settlement naming a tag
that is not outstanding settles nothing). A delivery to a no-ack consumer or for a no-ack get has
``no_ack`` true and is never outstanding (``pipelines.consumers``).

``deliveries_10``: transfers of a link (direction, channel, handle) form one delivery from a
transfer after a completed one to the next with more=false or aborted=true (transport 2.6.14); the
disposition covering its delivery-id (first..last, in the sending session's id space, 2.7.6) is
linked to it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.ingest.specs import amqp091
from amqpscope.pipelines.channels import channel_pass
from amqpscope.pipelines.columns import other_direction
from amqpscope.pipelines.settlement import settle
from amqpscope.schemas.messages import DELIVERIES_10_SCHEMA, MESSAGES_091_SCHEMA

# Derived from the spec: the methods followed by content, and those settling deliveries.
_CONTENT_METHODS = tuple(m.name for m in amqp091().methods.values() if m.content)
_SETTLEMENTS = ("basic.ack", "basic.nack", "basic.reject")
_DELIVERIES = ("basic.deliver", "basic.get-ok")
_PROPERTY_COLUMNS = ("message_id", "correlation_id", "content_type", "content_encoding", "reply_to", "priority")
# The header's properties kept in the map (the typed ones are columns).
_TYPED_PROPERTY_KEYS = (
    "body-size",
    "message-id",
    "correlation-id",
    "content-type",
    "content-encoding",
    "reply-to",
    "priority",
    "delivery-mode",
)
_MAX_DISPOSITION_RANGE = 1 << 20  # a first..last range wider than this is not expanded

_CHANNEL = ("capture_id", "connection_id", "channel")

# Window specifications are built per call: PySpark needs an active session to build one.


def _stream_so_far() -> WindowSpec:
    """A channel's frames in one direction, in order: content frames follow their method there."""
    return (
        Window.partitionBy(*_CHANNEL, "direction")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _stream_after() -> WindowSpec:
    """A channel's frames in one direction after this one, nearest first (growing frames: Spark
    evaluates ``unboundedFollowing`` by re-aggregating the rest of the partition for every row)."""
    return (
        Window.partitionBy(*_CHANNEL, "direction")
        .orderBy(F.col("frame_index").desc())
        .rowsBetween(Window.unboundedPreceding, -1)
    )


def messages_091(frames: DataFrame, channels: DataFrame | None = None) -> DataFrame:
    """The messages_091 table (``schemas.messages.MESSAGES_091_SCHEMA``) from the frames table (and
    its ``channels.channel_pass``, which numbers channel incarnations, publishes in confirm mode and
    consumers; computed when not given)."""
    channel_frames = (channel_pass(frames) if channels is None else channels).filter(F.col("channel") > 0)
    is_content_method = F.col("method").isin(*_CONTENT_METHODS)
    content = channel_frames.withColumn(
        "message_at", F.last(F.when(is_content_method, F.col("frame_index")), True).over(_stream_so_far())
    ).filter(F.col("frame_type").isin("header", "body") & F.col("message_at").isNotNull())
    parts = content.groupBy(*_CHANNEL, "direction", "message_at").agg(
        F.max("frame_index").alias("last_frame_index"),
        F.first(
            F.when(
                F.col("frame_type") == "header", F.struct(*_PROPERTY_COLUMNS, "delivery_mode", "body_size", "arguments")
            ),
            True,
        ).alias("header"),
        F.sum(F.when(F.col("frame_type") == "body", F.col("frame_size") - 8).otherwise(0)).alias("body_bytes"),
        F.sum((F.col("frame_type") == "body").cast("int")).alias("body_frames"),
    )
    # Confirm mode: a channel incarnation from its confirm.select on; publishes numbered in it.
    is_publish = (F.col("method") == "basic.publish") & (F.col("direction") == "c2s")
    methods = channel_frames.withColumn(
        "publish_seq", F.when(is_publish & F.col("_confirming"), F.col("_publishes"))
    ).withColumn(
        "next_method_frame_index",
        F.last(F.when(F.col("frame_type") == "method", F.col("frame_index")), True).over(_stream_after()),
    )
    # Settled on the same rows (one evaluation of the channels' windows, no join back).
    messages = (
        _with_settlement(methods)
        .filter(is_content_method)
        .join(
            parts.withColumnRenamed("message_at", "frame_index"), on=[*_CHANNEL, "direction", "frame_index"], how="left"
        )
        .withColumn("last_frame_index", F.coalesce("last_frame_index", "frame_index"))
        .withColumn("body_bytes", F.coalesce("body_bytes", F.lit(0)))
        .withColumn("body_frames", F.coalesce("body_frames", F.lit(0)))
        .withColumn("complete", F.coalesce(F.col("header.body_size") == F.col("body_bytes"), F.lit(False)))
        .select(
            *_CHANNEL,
            "incarnation",
            "direction",
            "method",
            "frame_index",
            "ts",
            "exchange",
            "routing_key",
            "consumer_tag",
            "delivery_tag",
            "redelivered",
            F.col("_no_ack").alias("no_ack"),
            "publish_seq",
            "last_frame_index",
            "body_bytes",
            "body_frames",
            "complete",
            "next_method_frame_index",
            *[F.col(f"header.{c}").alias(c) for c in (*_PROPERTY_COLUMNS, "delivery_mode", "body_size")],
            F.map_filter(F.col("header.arguments"), lambda k, _v: ~k.isin(*_TYPED_PROPERTY_KEYS)).alias("properties"),
            F.col("_settled.method").alias("settled_by"),
            F.col("_settled.frame_index").alias("settled_frame_index"),
            F.when(F.col("_settled").isNotNull(), F.coalesce(F.col("_settled.multiple"), F.lit(False))).alias(
                "settled_multiple"
            ),
            F.col("_settled.requeue").alias("requeue"),
        )
    )
    return messages.select(*[F.col(f.name).cast(f.dataType) for f in MESSAGES_091_SCHEMA.fields])


def settlement_times(frames: DataFrame, ts: str, name: str) -> DataFrame:
    """What a message joins to its settlement on (capture_id, connection_id, settled_frame_index)
    and the settling frame's ``ts`` column as ``name``. A message's ``settled_frame_index`` names a
    frame of its ``settled_by`` method, so only the frames of those methods are read (at 1 M frames
    of publishers and consumers, a fifth of the frames). Joined by a sort-merge join, never a
    broadcast: read from the stored frames, a few of their compressed columns look small enough to
    broadcast to a planner that cannot tell how few rows the filter keeps, and at 10 M frames those
    were 1.9 M rows, more than a 1 GiB driver holds."""
    return (
        frames.filter(F.col("method").isin(*_SETTLEMENTS))
        .select("capture_id", "connection_id", F.col("frame_index").alias("settled_frame_index"), F.col(ts).alias(name))
        .hint("shuffle_merge")
    )


def _with_settlement(methods: DataFrame) -> DataFrame:
    """``methods`` with ``_settled`` on each publish in confirm mode and each delivery: the frame
    that settled it, by the one settlement rule (``pipelines.settlement``). Publishes and the
    broker's acks / nacks are one numbering of a channel incarnation, deliveries and the client's
    acks / nacks / rejects the other. Only those rows and the content methods are kept: a content
    method in neither (a basic.return, a publish before confirm.select) is in a numbering of its
    own (null), where nothing is numbered or settles anything."""
    to_client, to_server = F.col("direction") == "s2c", F.col("direction") == "c2s"
    is_delivery = F.col("method").isin(*_DELIVERIES) & to_client
    is_confirm = F.col("method").isin("basic.ack", "basic.nack") & to_client
    is_ack = F.col("method").isin(*_SETTLEMENTS) & to_server
    numbering = F.when(F.col("publish_seq").isNotNull() | is_confirm, "confirms").when(
        is_delivery | is_ack, "deliveries"
    )
    number = F.when(is_delivery, F.col("delivery_tag")).otherwise(F.col("publish_seq"))
    # A delivery needing no ack is never outstanding: no ack may settle it (nor a multiple one).
    item = F.when(~(is_delivery & F.coalesce(F.col("_no_ack"), F.lit(False))), number)
    kept = methods.withColumn("_numbering", numbering).filter(
        F.col("_numbering").isNotNull() | F.col("method").isin(*_CONTENT_METHODS)
    )
    return settle(
        kept,
        (*_CHANNEL, "incarnation", "_numbering"),
        sent=number,
        item=item,
        settling=is_confirm | is_ack,
        fields=("frame_index", "method", "multiple", "requeue"),
    )


def _link_so_far() -> WindowSpec:
    """A link's transfers from one endpoint, in order: more=true continues the delivery."""
    return (
        Window.partitionBy("capture_id", "connection_id", "direction", "channel", "handle")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _link_previous() -> WindowSpec:
    return Window.partitionBy("capture_id", "connection_id", "direction", "channel", "handle").orderBy("frame_index")


def deliveries_10(frames: DataFrame, stored_frames: DataFrame | None = None) -> DataFrame:
    """The deliveries_10 table (``schemas.messages.DELIVERIES_10_SCHEMA``) from the frames table, the
    sessions found in ``stored_frames`` when given (the frames as stored: pipelines.tables.STORED_FRAMES)."""
    is_10 = F.col("protocol") == "amqp-1.0"
    amqp = frames.filter(is_10)
    sessions = _session_channels((frames if stored_frames is None else stored_frames).filter(is_10))
    transfers = amqp.filter(F.col("method") == "transfer")
    ends_delivery = F.coalesce(F.col("aborted"), F.lit(False)) | ~F.coalesce(F.col("more"), F.lit(False))
    starts = F.coalesce(F.lag(ends_delivery).over(_link_previous()), F.lit(True))
    numbered = transfers.withColumn("_n", F.sum(starts.cast("long")).over(_link_so_far()))
    last = F.max_by
    deliveries = (
        numbered.groupBy("capture_id", "connection_id", "direction", "channel", "handle", "_n")
        .agg(
            F.min("frame_index").alias("frame_index"),
            F.min("ts").alias("ts"),
            F.max("frame_index").alias("last_frame_index"),
            F.max("ts").alias("last_ts"),
            F.count("*").cast("int").alias("transfers"),
            F.sum("payload_size").alias("payload_bytes"),
            F.min_by("delivery_id", "frame_index").alias("delivery_id"),
            F.hex(F.min_by("delivery_tag_bytes", "frame_index")).alias("delivery_tag_bytes"),
            F.coalesce(last("aborted", "frame_index"), F.lit(False)).alias("aborted"),
            (~F.coalesce(last("more", "frame_index"), F.lit(False))).alias("_ended"),
            F.coalesce(F.max("settled"), F.lit(False)).alias("settled_by_sender"),
            *[
                last(c, "frame_index").alias(c)
                for c in ("message_size", "section_sizes", "body_kind", "subject", "to_address", *_PROPERTY_COLUMNS)
            ],
        )
        .withColumn("complete", F.col("_ended") & ~F.col("aborted"))
    )
    deliveries = _with_session(deliveries, sessions)
    dispositions = _with_session(amqp.filter(F.col("method") == "disposition"), sessions)
    settled = _dispositions_by_id(dispositions)
    result = deliveries.join(
        settled, on=["capture_id", "connection_id", "direction", "session_channel", "delivery_id"], how="left"
    )
    return result.select(*[F.col(f.name).cast(f.dataType) for f in DELIVERIES_10_SCHEMA.fields])


def _session_channels(amqp: DataFrame) -> DataFrame:
    """(connection, broker channel) -> client channel, from begin frames answering the other end's.

    Both directions' begins in one pass over the frames, not a union of two: from the frames as
    ingest hands them over, partitioned by connection, nothing is shuffled to find them (from the
    stored frames, deliveries_10 reads a few columns and shuffles the few begins)."""
    begins = amqp.filter(
        (F.col("method") == "begin") & F.col("remote_channel").isNotNull() & F.col("direction").isin("s2c", "c2s")
    )
    from_broker = F.col("direction") == "s2c"
    return begins.select(
        "capture_id",
        "connection_id",
        F.when(from_broker, F.col("channel")).otherwise(F.col("remote_channel")).alias("s2c_channel"),
        F.when(from_broker, F.col("remote_channel")).otherwise(F.col("channel")).alias("c2s_channel"),
    ).dropDuplicates(["capture_id", "connection_id", "s2c_channel"])


def _with_session(df: DataFrame, sessions: DataFrame) -> DataFrame:
    """Name a session by the client's channel: a broker frame's channel is mapped through its begin."""
    mapped = df.join(
        sessions.withColumnRenamed("s2c_channel", "channel"), on=["capture_id", "connection_id", "channel"], how="left"
    )
    return mapped.withColumn(
        "session_channel",
        F.when(F.col("direction") == "c2s", F.col("channel")).otherwise(F.coalesce("c2s_channel", "channel")),
    ).drop("c2s_channel")


def _dispositions_by_id(dispositions: DataFrame) -> DataFrame:
    """Each delivery-id a disposition covers, keyed by the direction of the deliveries it names.

    A receiver's disposition names deliveries that travelled the other way; a sender's its own.
    """
    first, last = F.col("first"), F.coalesce(F.col("last"), F.col("first"))
    width = F.pmod(last - first, F.lit(1 << 32))  # serial numbers (RFC 1982) may wrap
    flipped = other_direction(F.col("direction"))
    ids = (
        dispositions.filter(width < _MAX_DISPOSITION_RANGE)
        .withColumn("delivery_direction", F.when(F.col("role") == "receiver", flipped).otherwise(F.col("direction")))
        .withColumn("offset", F.explode(F.sequence(F.lit(0).cast("long"), width.cast("long"))))
        .withColumn("delivery_id", F.pmod(first + F.col("offset"), F.lit(1 << 32)))
    )
    covering = F.struct(
        F.col("frame_index").alias("disposition_frame_index"),
        F.col("role").alias("disposition_role"),
        F.coalesce(F.col("settled"), F.lit(False)).alias("disposition_settled"),
        F.col("state"),
    )
    return (
        ids.groupBy(
            "capture_id",
            "connection_id",
            F.col("delivery_direction").alias("direction"),
            "session_channel",
            "delivery_id",
        )
        .agg(F.min(covering).alias("d"))
        .select("capture_id", "connection_id", "direction", "session_channel", "delivery_id", "d.*")
    )
