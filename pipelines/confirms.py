"""AMQP 0-9-1 publisher confirms per channel, after every publish and confirm (docs/FLOW_CONTROL.md section 4).

After confirm.select the n-th basic.publish on the channel has sequence number n (RabbitMQ counts
from the moment it processes the select, and no publish overtakes it on the channel); the broker's
basic.ack / basic.nack settle one number or, with ``multiple``, every number up to the given one,
and nothing if the number they name is not outstanding (never published or already confirmed).
Settlements come from ``pipelines.settlement``; confirmed and outstanding are running counts over
the channel. Every window is keyed by channel: one shuffle (``pipelines.partitioning``).
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.channels import channel_pass
from amqpscope.pipelines.partitioning import CHANNEL, channel_after_frame, frame_of_channel
from amqpscope.pipelines.settlement import settle, with_settlement_rows
from amqpscope.schemas.flow import CHANNEL_CONFIRMS_SCHEMA

_COLUMNS = (
    "capture_id",
    "connection_id",
    "channel",
    "frame_index",
    "ts",
    "packet_number",
    "direction",
    "method",
    "delivery_tag",
    "multiple",
)


def channel_confirms_timeline(frames: DataFrame, channels: DataFrame | None = None) -> DataFrame:
    """The channel_confirms table (``schemas.flow.CHANNEL_CONFIRMS_SCHEMA``) from the frames table (and
    its ``channels.channel_pass``, which says when a channel is in confirm mode and numbers its
    publishes; computed when not given)."""
    is_select = (F.col("method") == "confirm.select") & (F.col("direction") == "c2s")
    is_publish = (F.col("method") == "basic.publish") & (F.col("direction") == "c2s")
    # Broker to client: a client's basic.ack on the same channel acknowledges a delivery instead.
    is_confirm = F.col("method").isin("basic.ack", "basic.nack") & (F.col("direction") == "s2c")
    events = (
        (channel_pass(frames) if channels is None else channels)
        .filter(F.col("_in_mode") & (is_select | is_publish | is_confirm))
        .select(*_COLUMNS, "incarnation", F.col("_published").alias("published"))
        .withColumn("publish_seq", F.when(is_publish, F.col("published")))
    )
    settled = settle(events, CHANNEL, sent=F.col("publish_seq"), item=F.col("publish_seq"), settling=is_confirm)
    settling = ~F.col("_is_event")
    timeline = (
        with_settlement_rows(settled)
        .withColumn("confirmed", F.sum(settling.cast("long")).over(frame_of_channel()))
        .withColumn("outstanding", F.sum("_delta").over(channel_after_frame()))
        .filter(F.col("_is_event"))
        .withColumn("delivery_tag", F.when(is_confirm, F.col("delivery_tag")))
        .withColumn("multiple", F.when(is_confirm, F.col("multiple")))
    )
    return timeline.select(*[F.col(f.name).cast(f.dataType) for f in CHANNEL_CONFIRMS_SCHEMA.fields])
