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
client's protocol header not captured). One row per lifecycle method and per method sent
outside its channel's or connection's lifecycle, or with a delivery tag not above the last.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.partitioning import CHANNEL, CONNECTION, by_connection, with_channel_incarnation
from amqpscope.schemas.lifecycle import LIFECYCLE_091_SCHEMA

AMQP091 = "amqp-0-9-1"
_LIFECYCLE_METHODS = ("connection.start-ok", "connection.close", "connection.close-ok", "connection.blocked",
                      "channel.open", "channel.close", "channel.close-ok", "channel.flow", "channel.flow-ok")
_CONTENT_METHODS = ("basic.publish", "basic.deliver", "basic.get-ok", "basic.return")
_DELIVERIES = ("basic.deliver", "basic.get-ok")
_COLUMNS = ("capture_id", "connection_id", "frame_index", "ts", "packet_number", "direction", "protocol", "frame_type",
            "channel", "method", "delivery_tag", "active", "arguments")
_OTHER = {"c2s": "s2c", "s2c": "c2s"}


def _connection_before() -> WindowSpec:
    """A connection's frames before this one, in order: the client's header, start-ok, closes."""
    return Window.partitionBy(*CONNECTION).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, -1)


def _channel_number_before() -> WindowSpec:
    """One channel number's frames (both peers, across re-opens) before this one: open, close, flow."""
    return Window.partitionBy(*CONNECTION, "channel").orderBy("frame_index").rowsBetween(Window.unboundedPreceding, -1)


def _incarnation_before() -> WindowSpec:
    """One channel incarnation's frames before this one: the delivery tags used on it."""
    return Window.partitionBy(*CHANNEL).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, -1)


def _state(sets: Column, clears: Column, window: WindowSpec) -> Column:
    """True after a frame meeting ``sets``, false after one meeting ``clears`` (the later wins)."""
    return F.coalesce(F.last(F.when(sets, F.lit(True)).when(clears, F.lit(False)), True).over(window), F.lit(False))


def lifecycle_091_timeline(frames: DataFrame) -> DataFrame:
    """The lifecycle_091 table from the frames table."""
    method, direction = F.col("method"), F.col("direction")
    header = (F.col("frame_type") == "protocol-header") & (direction == "c2s")
    rows = by_connection(frames.filter((F.col("protocol") == AMQP091) & F.col("frame_type").isin("protocol-header", "method"))
                         .select(*_COLUMNS))
    started = F.coalesce(F.max(header.cast("int")).over(_connection_before()) == 1, F.lit(False))
    known = F.col("started")
    reopened = method == "channel.open"
    close_ok = method == "channel.close-ok"
    capabilities = F.get_json_object(F.col("arguments")["client-properties"], "$.capabilities")
    announced = F.get_json_object(capabilities, "$['connection.blocked']") == "true"
    start_ok = method == "connection.start-ok"
    # The connection's windows first, then the channel number's, then the incarnation's: windows
    # over one key next to each other are evaluated in one pass over one sort of the rows (Spark
    # collapses them), where alternating keys would sort the rows again for every column.
    state = rows.withColumn("started", started).withColumn("_start_ok_seen", F.max(start_ok.cast("int")).over(
        _connection_before()) == 1)
    for sender in ("c2s", "s2c"):
        state = state.withColumn(f"_{sender}_connection_closing", _state(
            (direction == sender) & (method == "connection.close"), method == "connection.close-ok", _connection_before()))
    state = state.withColumn("client_blocked_capability", F.when(
        (method == "connection.blocked") & F.col("_start_ok_seen"),
        F.coalesce(F.last(F.when(start_ok, F.coalesce(announced, F.lit(False))), True).over(_connection_before()),
                   F.lit(False))))
    state = state.withColumn(
        "channel_open", F.when(known, _state(reopened & (direction == "c2s"), close_ok, _channel_number_before())))
    for sender in ("c2s", "s2c"):
        by_sender = direction == sender
        state = (
            state.withColumn(f"_{sender}_channel_closing", _state(by_sender & (method == "channel.close"), close_ok | reopened,
                                                                  _channel_number_before()))
            # This peer confirmed a stop (flow-ok active=false) and the other has not restarted it.
            .withColumn(f"_{sender}_flow_stopped", _state(
                by_sender & (method == "channel.flow-ok") & ~F.coalesce(F.col("active"), F.lit(True)),
                ((direction == _OTHER[sender]) & (method == "channel.flow") & F.coalesce(F.col("active"), F.lit(False)))
                | reopened, _channel_number_before()))
        )
    own = {name: F.when(direction == "c2s", F.col(f"_c2s_{name}")).otherwise(F.col(f"_s2c_{name}"))
           for name in ("channel_closing", "connection_closing", "flow_stopped")}
    tagged = (
        with_channel_incarnation(state)
        .withColumn("channel_closing", F.when(known, own["channel_closing"]))
        .withColumn("connection_closing", F.when(known, own["connection_closing"]))
        .withColumn("flow_stopped", F.when(known, own["flow_stopped"]))
        .withColumn("delivered_before", F.when(known & method.isin(*_DELIVERIES), F.coalesce(
            F.max(F.when(method.isin(*_DELIVERIES), F.col("delivery_tag"))).over(_incarnation_before()), F.lit(0))))
    )
    on_channel = F.col("channel") != 0
    outside = (
        (F.coalesce(F.col("channel_closing"), F.lit(False)) & on_channel & ~method.isin("channel.close", "channel.close-ok"))
        | (F.coalesce(F.col("connection_closing"), F.lit(False))
           & ~method.isin("connection.close", "connection.close-ok", "channel.close", "channel.close-ok"))
        | (F.coalesce(F.col("flow_stopped"), F.lit(False)) & method.isin(*_CONTENT_METHODS))
        | (method.isin(*_DELIVERIES) & (F.col("delivery_tag") <= F.col("delivered_before")))
    )
    kept = tagged.filter(F.col("frame_type") == "method").filter(method.isin(*_LIFECYCLE_METHODS) | outside)
    return kept.select(*[F.col(f.name).cast(f.dataType) for f in LIFECYCLE_091_SCHEMA.fields])
