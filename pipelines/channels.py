"""AMQP 0-9-1 connections and channels in one pass: the windows messages_091, the unacked ledger,
channel_confirms and lifecycle_091 share (docs/FLOW_CONTROL.md section 4, spec 4.2 and the channel class).

Those tables follow a connection's frames, a channel number's and a channel incarnation's in
capture order. ``channel_pass`` finds everything they find over those keys once, over every 0-9-1
protocol header, method, content header and body frame of the capture, hash-partitioned by
connection (one sort per key: the connection, the channel number, the incarnation, a request and
its reply, a consumer):

- the incarnation of each frame's channel number (``partitioning.channel_incarnation``);
- whether the channel is in confirm mode and how many publishes it has numbered (publisher
  confirms: ``messages_091`` counts a confirm.select of either direction, ``channel_confirms`` the
  client's);
- each request's reply and each consumer (``pipelines.consumers``);
- the lifecycle state before each frame (``pipelines.lifecycle_091``).

Each table then keeps the rows it needs. Over more rows these columns keep their values on the rows
a table keeps: each is a running count, maximum, first or last value of a condition that only rows
of its own kind meet, or a pairing among rows of its own kind; none is a lag or a lead over every
row.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import with_columns
from amqpscope.pipelines.consumers import consumer_columns
from amqpscope.pipelines.partitioning import (
    CHANNEL,
    CONNECTION,
    by_connection,
    channel_incarnation,
    channel_so_far,
)

AMQP091 = "amqp-0-9-1"
# The frames of the pass: all but heartbeats (which no channel table reads).
FRAME_TYPES = ("protocol-header", "method", "header", "body")
# The frames-table columns the tables drawn from the pass read.
COLUMNS = (
    "capture_id",
    "connection_id",
    "channel",
    "direction",
    "frame_index",
    "ts",
    "packet_number",
    "protocol",
    "frame_type",
    "method",
    "frame_size",
    "exchange",
    "routing_key",
    "consumer_tag",
    "delivery_tag",
    "redelivered",
    "multiple",
    "requeue",
    "no_ack",
    "queue",
    "prefetch_count",
    "global",
    "active",
    "arguments",
    "message_id",
    "correlation_id",
    "content_type",
    "content_encoding",
    "reply_to",
    "priority",
    "delivery_mode",
    "body_size",
)
CHANNEL_CLOSE_METHODS = ("channel.close", "channel.close-ok")
_OTHER = {"c2s": "s2c", "s2c": "c2s"}

# Window specifications are built per call: PySpark needs an active session to build one.


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


def method_frames(frames: DataFrame) -> DataFrame:
    """The frames of the pass, partitioned by connection (``channel_pass`` without its windows)."""
    return by_connection(
        frames.filter((F.col("protocol") == AMQP091) & F.col("frame_type").isin(*FRAME_TYPES)).select(*COLUMNS)
    )


def channel_pass(frames: DataFrame) -> DataFrame:
    """The pass's frames (``method_frames``) with the columns every table drawn from it reads:
    ``incarnation``; ``_confirming`` / ``_in_mode`` (a confirm.select of either direction / the
    client's was seen on the incarnation) and ``_publishes`` / ``_published`` (the client's
    basic.publish frames numbered in that mode so far); ``pipelines.consumers``'s ``_request``,
    ``_consumer`` and ``_no_ack``; and lifecycle_091's state before each frame (``started``,
    ``channel_open`` and the ``_c2s`` / ``_s2c`` closing and flow states, ``client_blocked_capability``,
    ``delivered_before``)."""
    return channel_windows(method_frames(frames))


def channel_windows(rows: DataFrame) -> DataFrame:
    """``channel_pass`` of rows already chosen and partitioned by connection: the connection's windows,
    then the channel number's, then the incarnation's, each key's together (one sort each)."""
    method, direction = F.col("method"), F.col("direction")
    header = (F.col("frame_type") == "protocol-header") & (direction == "c2s")
    start_ok = method == "connection.start-ok"
    capabilities = F.get_json_object(F.col("arguments")["client-properties"], "$.capabilities")
    announced = F.get_json_object(capabilities, "$['connection.blocked']") == "true"
    before = _connection_before()
    state = with_columns(
        rows,
        [
            ("started", F.coalesce(F.max(header.cast("int")).over(before) == 1, F.lit(False))),
            ("_start_ok_seen", F.max(start_ok.cast("int")).over(before) == 1),
            *[
                (
                    f"_{sender}_connection_closing",
                    _state(
                        (direction == sender) & (method == "connection.close"), method == "connection.close-ok", before
                    ),
                )
                for sender in ("c2s", "s2c")
            ],
            ("_start_ok_announced", F.last(F.when(start_ok, F.coalesce(announced, F.lit(False))), True).over(before)),
        ],
    )
    reopened = method == "channel.open"
    close_ok = method == "channel.close-ok"
    number = _channel_number_before()
    state = with_columns(
        state,
        [
            ("_channel_opened", _state(reopened & (direction == "c2s"), close_ok, number)),
            *[
                column
                for sender in ("c2s", "s2c")
                for column in (
                    (
                        f"_{sender}_channel_closing",
                        _state((direction == sender) & (method == "channel.close"), close_ok | reopened, number),
                    ),
                    # This peer confirmed a stop (flow-ok active=false) and the other has not restarted it.
                    (
                        f"_{sender}_flow_stopped",
                        _state(
                            (direction == sender)
                            & (method == "channel.flow-ok")
                            & ~F.coalesce(F.col("active"), F.lit(True)),
                            (
                                (direction == _OTHER[sender])
                                & (method == "channel.flow")
                                & F.coalesce(F.col("active"), F.lit(False))
                            )
                            | reopened,
                            number,
                        ),
                    ),
                )
            ],
            ("incarnation", channel_incarnation()),
        ],
    )
    is_select = method == "confirm.select"
    is_publish = (method == "basic.publish") & (direction == "c2s")
    deliveries = method.isin("basic.deliver", "basic.get-ok")
    so_far = channel_so_far()
    # The consumers' first columns are running values over the incarnation too: they join the
    # publishes' group, one window operator for both.
    return with_columns(
        state,
        [
            ("_confirming", F.max(is_select.cast("int")).over(so_far) == 1),
            ("_in_mode", F.max((is_select & (direction == "c2s")).cast("int")).over(so_far) == 1),
            ("_publishes", F.sum((is_publish & F.col("_confirming")).cast("long")).over(so_far)),
            ("_published", F.sum((is_publish & F.col("_in_mode")).cast("long")).over(so_far)),
            ("_delivered_before", F.max(F.when(deliveries, F.col("delivery_tag"))).over(_incarnation_before())),
            *consumer_columns(),
        ],
    )
