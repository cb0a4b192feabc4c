"""AMQP 1.0 lifecycle state per frame: the lifecycle_10 table (``schemas.lifecycle.LIFECYCLE_10_SCHEMA``).

Each endpoint runs its own lifecycle (transport 2.4, 2.5, 2.6): it sends its protocol header, then
open (2.4.1: "each peer MUST send an open frame before sending any other frames"), sessions begun
and ended on its channels, links attached and detached on its handles within a session, and close,
after which it sends nothing (2.4.3). All of that is the sender's own state, so a pipelined open
(2.4.2: open, begin and attach sent before the peer's open arrives) breaks none of it. The one
limit the peer sets here is the begin's handle-max (2.7.2): it is null until the peer's begin of
the session arrived, so a pipelined attach is never judged against it.

State follows frames in capture order and is null when the sender's protocol header was not
captured (a connection picked up mid-stream). One row per open, close, begin, end, attach and detach
frame, and per frame sent outside its sender's open..close, session or attachment.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.ingest.specs import amqp10
from amqpscope.pipelines.partitioning import CONNECTION, by_connection
from amqpscope.pipelines.sessions import bind_sessions
from amqpscope.schemas.lifecycle import LIFECYCLE_10_SCHEMA

AMQP10 = "amqp-1.0"
_LIFECYCLE_METHODS = ("open", "close", "begin", "end", "attach", "detach")
# Performatives that name their sender's link by handle (flow only when it carries one).
_HANDLE_METHODS = ("transfer", "detach", "flow")
# begin handle-max when absent (transport.xml).
DEFAULT_HANDLE_MAX = int(
    next(f.default for f in amqp10().described_by_symbol["amqp:begin:list"].fields if f.name == "handle-max")
)
_COLUMNS = (
    "capture_id",
    "connection_id",
    "frame_index",
    "ts",
    "packet_number",
    "direction",
    "protocol",
    "frame_type",
    "channel",
    "method",
    "handle",
    "remote_channel",
    "handle_max",
)


def _direction_before() -> WindowSpec:
    """One endpoint's frames before this one, in order: what it had sent (header, open, close)."""
    return (
        Window.partitionBy(*CONNECTION, "direction").orderBy("frame_index").rowsBetween(Window.unboundedPreceding, -1)
    )


def _endpoint_channel(until: int) -> WindowSpec:
    """One endpoint's frames on one channel, in order, up to this frame (0) or the one before (-1):
    its sessions there."""
    return (
        Window.partitionBy(*CONNECTION, "direction", "channel")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, until)
    )


def _endpoint_handle_before() -> WindowSpec:
    """One endpoint's frames naming one handle in one session, before this one: whether it is attached."""
    return (
        Window.partitionBy(*CONNECTION, "direction", "channel", "_session", "handle")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, -1)
    )


def _session_before() -> WindowSpec:
    """One session's frames (both endpoints) before this one: the begins each endpoint had sent."""
    return (
        Window.partitionBy(*CONNECTION, "session_id").orderBy("frame_index").rowsBetween(Window.unboundedPreceding, -1)
    )


def _seen(condition: Column, window: WindowSpec) -> Column:
    return F.coalesce(F.max(condition.cast("int")).over(window) == 1, F.lit(False))


def _state(sets: Column, clears: Column, window: WindowSpec) -> Column:
    """True after a frame meeting ``sets``, false after one meeting ``clears`` (the later wins)."""
    return F.coalesce(F.last(F.when(sets, F.lit(True)).when(clears, F.lit(False)), True).over(window), F.lit(False))


def lifecycle_10_timeline(frames: DataFrame, sessions: DataFrame | None = None) -> DataFrame:
    """The lifecycle_10 table from the frames table (and its ``sessions.session_map``, computed when
    not given)."""
    method = F.col("method")
    header = (F.col("frame_type") == "protocol-header") & (method == "amqp")
    amqp = by_connection(
        frames.filter(
            (F.col("protocol") == AMQP10) & F.col("frame_type").isin("protocol-header", "amqp", "empty")
        ).select(*_COLUMNS)
    )
    # Each group of windows below is one window operator: none of a group reads another's result.
    endpoint = (
        amqp.withColumns(
            {
                "started": _seen(header, _direction_before()),
                "_opened": _seen(method == "open", _direction_before()),
                "_closed": _seen(method == "close", _direction_before()),
            }
        )
        .withColumns(
            {
                "opened_before": F.when(F.col("started"), F.col("_opened")),
                "closed_before": F.when(F.col("started"), F.col("_closed")),
            }
        )
        .drop("_opened", "_closed")
        .filter(F.col("frame_type") != "protocol-header")
    )
    performatives = bind_sessions(endpoint.filter(F.col("frame_type") == "amqp"), sessions)
    is_begin = method == "begin"
    sessions = (
        performatives.withColumns(
            {
                "_session": F.sum(is_begin.cast("int")).over(_endpoint_channel(0)),
                "session_begun": F.when(F.col("started"), _state(is_begin, method == "end", _endpoint_channel(-1))),
            }
        )
        .withColumn("_attached", _state(method == "attach", method == "detach", _endpoint_handle_before()))
        .withColumn(
            "handle_attached",
            F.when(
                F.col("handle").isNotNull(),
                F.when(F.col("session_begun"), F.col("_attached")).otherwise(F.col("session_begun")),
            ),
        )
        .withColumns(
            {
                f"_{direction}_handle_max": F.last(
                    F.when(
                        is_begin & (F.col("direction") == direction),
                        F.coalesce(F.col("handle_max"), F.lit(DEFAULT_HANDLE_MAX)),
                    ),
                    True,
                ).over(_session_before())
                for direction in ("c2s", "s2c")
            }
        )
    )
    peer_handle_max = F.when(F.col("direction") == "c2s", F.col("_s2c_handle_max")).otherwise(F.col("_c2s_handle_max"))
    # bind_sessions joins an answering begin to the peer's begin on its remote-channel: unmatched,
    # the session is its own (session_id = its frame_index).
    answered = is_begin & F.col("remote_channel").isNotNull()
    sessions = sessions.withColumn(
        "peer_handle_max", F.when((method == "attach") & F.col("session_begun"), peer_handle_max)
    ).withColumn(
        "remote_channel_begun", F.when(answered & F.col("started"), F.col("session_id") != F.col("frame_index"))
    )
    empties = endpoint.filter(F.col("frame_type") == "empty")
    rows = sessions.unionByName(empties, allowMissingColumns=True)
    outside = (
        ~F.coalesce(F.col("opened_before"), F.lit(True))
        | F.coalesce(F.col("closed_before"), F.lit(False))
        | (method.isin(*_HANDLE_METHODS) & ~F.coalesce(F.col("handle_attached"), F.lit(True)))
    )
    kept = rows.filter(method.isin(*_LIFECYCLE_METHODS) | outside)
    return kept.select(*[F.col(f.name).cast(f.dataType) for f in LIFECYCLE_10_SCHEMA.fields])
