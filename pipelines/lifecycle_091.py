"""AMQP 0-9-1 lifecycle state per method frame: the lifecycle_091 table
(``schemas.lifecycle.LIFECYCLE_091_SCHEMA``).

- A channel is open from the client's channel.open to the channel.close-ok of either peer
  (spec, channel class grammar); "the client MUST NOT use [channel.open] on an already-opened
  channel".
- After a peer sends channel.close (connection.close), the only methods it should send on that
  channel (connection) are close and close-ok until the close-ok (spec channel.close: "any received
  methods except Close and Close-OK MUST be discarded").
- channel.flow(active=false): "the peer that receives a request to stop sending content MUST
  finish sending the current content, if any, and then wait until flow is reactivated"; the
  capture sees it confirmed by the peer's channel.flow-ok(active=false), after which content
  methods from that peer break it until channel.flow(active=true).
- The broker numbers deliveries 1, 2, 3 ... on a channel incarnation (a tag "multiple" settles
  every tag up to it, so tags only grow).
- RabbitMQ sends connection.blocked only to clients whose connection.start-ok client-properties
  carry the capability ``connection.blocked`` (RabbitMQ's "Blocked Connection Notifications").

State follows frames in capture order; null where the capture began after the connection (the
client's protocol header not captured). One row per lifecycle method and per method sent outside
its channel's or connection's lifecycle, or with a delivery tag not above the last. The windows
that find the state are the 0-9-1 channel pass's (``pipelines.channels``), shared with the other
channel tables.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.channels import CHANNEL_CLOSE_METHODS, channel_pass
from amqpscope.schemas.lifecycle import LIFECYCLE_091_SCHEMA

_LIFECYCLE_METHODS = (
    "connection.start-ok",
    "connection.close",
    "connection.close-ok",
    "connection.blocked",
    "channel.open",
    "channel.close",
    "channel.close-ok",
    "channel.flow",
    "channel.flow-ok",
)
_CONTENT_METHODS = ("basic.publish", "basic.deliver", "basic.get-ok", "basic.return")
_DELIVERIES = ("basic.deliver", "basic.get-ok")


def lifecycle_091_timeline(frames: DataFrame, channels: DataFrame | None = None) -> DataFrame:
    """The lifecycle_091 table from the frames table (and its ``channels.channel_pass``, which holds
    the state before each frame; computed when not given)."""
    method, direction = F.col("method"), F.col("direction")
    known = F.col("started")
    own = {
        name: F.when(direction == "c2s", F.col(f"_c2s_{name}")).otherwise(F.col(f"_s2c_{name}"))
        for name in ("channel_closing", "connection_closing", "flow_stopped")
    }
    tagged = (
        (channel_pass(frames) if channels is None else channels)
        .filter(F.col("frame_type") == "method")
        .withColumn(
            "client_blocked_capability",
            F.when(
                (method == "connection.blocked") & F.col("_start_ok_seen"),
                F.coalesce(F.col("_start_ok_announced"), F.lit(False)),
            ),
        )
        .withColumn("channel_open", F.when(known, F.col("_channel_opened")))
        .withColumn("channel_closing", F.when(known, own["channel_closing"]))
        .withColumn("connection_closing", F.when(known, own["connection_closing"]))
        .withColumn("flow_stopped", F.when(known, own["flow_stopped"]))
        .withColumn(
            "delivered_before",
            F.when(known & method.isin(*_DELIVERIES), F.coalesce(F.col("_delivered_before"), F.lit(0))),
        )
    )
    on_channel = F.col("channel") != 0
    outside = (
        (F.coalesce(F.col("channel_closing"), F.lit(False)) & on_channel & ~method.isin(*CHANNEL_CLOSE_METHODS))
        | (
            F.coalesce(F.col("connection_closing"), F.lit(False))
            & ~method.isin("connection.close", "connection.close-ok", *CHANNEL_CLOSE_METHODS)
        )
        | (F.coalesce(F.col("flow_stopped"), F.lit(False)) & method.isin(*_CONTENT_METHODS))
        | (method.isin(*_DELIVERIES) & (F.col("delivery_tag") <= F.col("delivered_before")))
    )
    kept = tagged.filter(method.isin(*_LIFECYCLE_METHODS) | outside)
    return kept.select(*[F.col(f.name).cast(f.dataType) for f in LIFECYCLE_091_SCHEMA.fields])
