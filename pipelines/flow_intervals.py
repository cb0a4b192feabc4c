"""flow_intervals: every interval in which an entity is starved or blocked, whatever the cause.

Each cause is a condition on one flow-state table, turned into intervals per entity by
``pipelines.intervals`` (a row's state holds until the next row of the same entity):

| cause                 | entity     | table             | starved while                                       |
|-----------------------|------------|-------------------|-----------------------------------------------------|
| link_credit_exhausted | link       | link_state        | link-credit(snd) <= 0 (2.6.7)                       |
| session_window_closed | session    | session_window    | the sender's remote-incoming-window <= 0 (2.5.6)    |
| prefetch_full         | consumer   | consumer_unacked  | unacked >= prefetch (basic.qos global=false)        |
| prefetch_full         | channel    | channel_unacked   | unacked >= prefetch (basic.qos global=true)         |
| confirms_outstanding  | channel    | channel_confirms  | a publish waits for a confirm, nothing published    |
| channel_flow          | channel    | channel_flow      | channel.flow(active=false) until active=true        |
| connection_blocked    | connection | connection_blocked| connection.blocked until connection.unblocked       |
| tcp_zero_window       | tcp        | tcp_flow          | the receiver advertises a zero window               |

``direction`` is always the side that cannot send.
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import other_direction, union_all
from amqpscope.pipelines.intervals import intervals
from amqpscope.pipelines.shape import in_schema
from amqpscope.schemas.flow import FLOW_INTERVALS_SCHEMA


def _shaped(df: DataFrame, entity: str, cause: str, **columns: Column) -> DataFrame:
    """Interval rows in FLOW_INTERVALS_SCHEMA: entity and cause, plus the given key / detail columns."""
    return in_schema(df, FLOW_INTERVALS_SCHEMA, **{"entity": F.lit(entity), "cause": F.lit(cause), **columns})


def link_credit_intervals(link_state: DataFrame) -> DataFrame:
    """Links whose sender has no credit (from the attach until the first grant, and after using it up)."""
    starved = (F.col("link_credit_snd") <= 0) & (F.col("method") != "detach")
    found = intervals(
        link_state,
        ["capture_id", "connection_id", "link_name", "sender_side"],
        ["frame_index"],
        starved,
        carry=["channel", "link_credit_rcv"],
    )
    return _shaped(
        found,
        "link",
        "link_credit_exhausted",
        direction=F.when(F.col("sender_side") == "client", "c2s").otherwise("s2c"),
        detail=F.coalesce(
            F.concat(F.lit("link-credit(rcv) "), F.col("link_credit_rcv").cast("string")),
            F.lit("no flow from the receiver yet"),
        ),
    )


def session_window_intervals(session_window: DataFrame) -> DataFrame:
    """Session endpoints whose remote-incoming-window is closed: they may not send transfer frames."""
    found = []
    for side, peer, direction in (("client", "server", "c2s"), ("server", "client", "s2c")):
        starved = (F.col(f"{side}_remote_incoming_window") <= 0) & (F.col("method") != "end")
        closed = intervals(
            session_window,
            ["capture_id", "connection_id", "session_id"],
            ["frame_index"],
            starved,
            carry=[f"{side}_channel", f"{peer}_incoming_window"],
        )
        found.append(
            _shaped(
                closed,
                "session",
                "session_window_closed",
                channel=F.col(f"{side}_channel"),
                direction=F.lit(direction),
                detail=F.concat(F.lit("peer incoming-window "), F.col(f"{peer}_incoming_window").cast("string")),
            )
        )
    return union_all(found)


def prefetch_intervals(consumer_unacked: DataFrame, channel_unacked: DataFrame) -> DataFrame:
    """Consumers (and channels with a global prefetch) holding as many unacked deliveries as allowed."""
    consumer_full = (
        (F.col("prefetch_count") > 0)
        & (F.col("unacked") >= F.col("prefetch_count"))
        & (F.col("method") != "basic.cancel-ok")
    )
    consumers = intervals(
        consumer_unacked,
        ["capture_id", "connection_id", "channel", "consumer_tag"],
        ["frame_index"],
        consumer_full,
        carry=["prefetch_count"],
    )
    channel_full = (
        F.col("prefetch_global") & (F.col("prefetch_count") > 0) & (F.col("unacked") >= F.col("prefetch_count"))
    )
    channels = intervals(
        channel_unacked,
        ["capture_id", "connection_id", "channel"],
        ["frame_index"],
        channel_full,
        carry=["prefetch_count"],
    )
    detail = F.concat(F.lit("prefetch "), F.col("prefetch_count").cast("string"))
    return _shaped(consumers, "consumer", "prefetch_full", direction=F.lit("s2c"), detail=detail).unionByName(
        _shaped(channels, "channel", "prefetch_full", direction=F.lit("s2c"), detail=detail)
    )


def _channel_in_order() -> WindowSpec:
    """A channel's confirm timeline in order: what follows each publish."""
    return Window.partitionBy("capture_id", "connection_id", "channel").orderBy("frame_index")


def confirm_wait_intervals(channel_confirms: DataFrame) -> DataFrame:
    """A publisher waiting on confirms: from a publish that leaves confirms outstanding to the next
    confirm, when nothing is published in between (a synchronous or window-limited publisher)."""
    window = _channel_in_order()
    nxt = {c: F.lead(c).over(window) for c in ("method", "frame_index", "ts", "packet_number")}
    waits = (
        channel_confirms.select("*", *[v.alias(f"end_{c}") for c, v in nxt.items()])
        .filter(
            (F.col("method") == "basic.publish")
            & (F.col("outstanding") > 0)
            & F.col("end_method").isin("basic.ack", "basic.nack")
        )
        .select("*", *[F.col(c).alias(f"start_{c}") for c in ("frame_index", "ts", "packet_number")])
        .withColumn("duration_us", F.unix_micros("end_ts") - F.unix_micros("start_ts"))
    )
    return _shaped(
        waits,
        "channel",
        "confirms_outstanding",
        direction=F.lit("c2s"),
        detail=F.concat(F.lit("outstanding "), F.col("outstanding").cast("string")),
    )


def blocking_intervals(connection_blocked: DataFrame, channel_flow: DataFrame) -> DataFrame:
    """connection.blocked (the publishing client stops) and channel.flow(active=false) intervals."""
    blocked = _shaped(
        connection_blocked, "connection", "connection_blocked", direction=F.lit("c2s"), detail=F.col("reason")
    )
    stopped = _shaped(
        channel_flow,
        "channel",
        "channel_flow",
        direction=other_direction(F.col("direction")),
        detail=F.lit("channel.flow active=false"),
    )
    return blocked.unionByName(stopped)


def tcp_zero_window_intervals(tcp_flow: DataFrame) -> DataFrame:
    """A receiver advertising a zero window, from its first zero-window segment to its window update."""
    found = intervals(
        tcp_flow, ["capture_id", "connection_id", "direction"], ["packet_number"], F.col("is_zero_window")
    )
    return _shaped(
        found,
        "tcp",
        "tcp_zero_window",
        direction=other_direction(F.col("direction")),
        detail=F.concat(F.lit("zero window from "), F.col("direction")),
    )


def flow_intervals(
    *,
    link_state: DataFrame,
    session_window: DataFrame,
    consumer_unacked: DataFrame,
    channel_unacked: DataFrame,
    channel_confirms: DataFrame,
    connection_blocked: DataFrame,
    channel_flow: DataFrame,
    tcp_flow: DataFrame,
) -> DataFrame:
    """The flow_intervals table (``schemas.flow.FLOW_INTERVALS_SCHEMA``) from the flow-state tables."""
    return reduce(
        DataFrame.unionByName,
        [
            link_credit_intervals(link_state),
            session_window_intervals(session_window),
            prefetch_intervals(consumer_unacked, channel_unacked),
            confirm_wait_intervals(channel_confirms),
            blocking_intervals(connection_blocked, channel_flow),
            tcp_zero_window_intervals(tcp_flow),
        ],
    )
