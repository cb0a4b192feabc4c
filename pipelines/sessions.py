"""AMQP 1.0 sessions: which session a frame belongs to, and session flow control (transport spec 2.5.6).

The two endpoints of a session use their own channel numbers; the answering ``begin`` names the
initiator's channel in ``remote-channel`` (2.5.1). A frame belongs to the latest begin its sender
sent on its channel, and a session is identified by the frame_index of the begin that opened it.

Each endpoint's state follows from running aggregates over the session's frames, the unit being a
transfer *frame* (serial arithmetic modulo 2^32 throughout):

    next-outgoing-id(X)        = last next-outgoing-id X announced (begin / flow) + transfers X sent since
    next-incoming-id(X)        = next-outgoing-id(peer)   (set from the peer's begin / flow, +1 per transfer received)
    remote-incoming-window(X)  = next-incoming-id(peer flow) + incoming-window(peer flow) - next-outgoing-id(X)

with X's own begin's next-outgoing-id standing in for a peer flow's missing next-incoming-id (and
for the peer's begin). The window is computed as ``incoming-window - (next-outgoing-id(X) -
next-incoming-id(flow))`` so that a window near 2^32 does not wrap.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import other_direction, with_columns
from amqpscope.pipelines.partitioning import by_connection
from amqpscope.pipelines.serial import serial, serial_diff
from amqpscope.schemas.flow import SESSION_WINDOW_SCHEMA

_SESSION_METHODS = ("begin", "flow", "transfer", "end")
# The frames-table columns session flow control reads.
_COLUMNS = (
    "capture_id",
    "connection_id",
    "channel",
    "frame_index",
    "ts",
    "packet_number",
    "direction",
    "method",
    "protocol",
    "frame_type",
    "remote_channel",
    "next_incoming_id",
    "incoming_window",
    "next_outgoing_id",
    "outgoing_window",
)
_SESSION = ("capture_id", "connection_id", "session_id")
_SIDES = {"client": "c2s", "server": "s2c"}


def _endpoint_channel() -> WindowSpec:
    """One endpoint's frames on one channel, in order: a frame belongs to the latest begin sent there."""
    return (
        Window.partitionBy("capture_id", "connection_id", "direction", "channel")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _session_so_far() -> WindowSpec:
    """One session (both endpoints' frames) in order: each endpoint's running state."""
    return (
        Window.partitionBy(*_SESSION).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def session_map(frames: DataFrame) -> DataFrame:
    """Per AMQP 1.0 begin of ``frames`` (``_begin_index``, its frame_index): the session it opened or
    answered (``session_id``) and that session's ``client_channel`` and ``server_channel``. A few
    rows: ``flow_timelines`` computes them once for the pipelines that bind frames to sessions.

    One pass over the begins, in windows, not joins of the begins with themselves (each join would
    scan the frames for them again): each begin stands once as a begin the peer may answer, keyed by
    its sender and channel, and once as an answer, keyed by the peer and the remote-channel it
    names; an answer's session is that of the latest begin before it under its key."""
    begins = frames.filter(
        (F.col("protocol") == "amqp-1.0")
        & (F.col("frame_type") == "amqp")
        & (F.col("method") == "begin")
        & F.col("channel").isNotNull()
    ).select(
        "capture_id",
        "connection_id",
        "direction",
        "channel",
        "remote_channel",
        F.col("frame_index").alias("_begin_index"),
    )
    peer = other_direction(F.col("direction"))
    roles = F.array(
        F.struct(F.lit(False).alias("answer"), F.col("direction").alias("sender"), F.col("channel").alias("on")),
        F.struct(F.lit(True).alias("answer"), peer.alias("sender"), F.col("remote_channel").alias("on")),
    )
    as_both = begins.withColumn("_role", F.explode(roles)).select("*", "_role.*").drop("_role")
    latest_begin = (
        Window.partitionBy("capture_id", "connection_id", "sender", "on")
        .orderBy("_begin_index")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    opened_by = F.last(F.when(~F.col("answer"), F.col("_begin_index")), True).over(latest_begin)
    endpoints = (
        as_both.withColumn("_opened_by", opened_by)
        .filter(F.col("answer"))
        .withColumn("session_id", F.coalesce(F.col("_opened_by"), F.col("_begin_index")))
    )
    session = Window.partitionBy(*_SESSION)
    return endpoints.select(
        "capture_id",
        "connection_id",
        "direction",
        "_begin_index",
        "session_id",
        F.max(F.when(F.col("direction") == "c2s", F.col("channel"))).over(session).alias("client_channel"),
        F.max(F.when(F.col("direction") == "s2c", F.col("channel"))).over(session).alias("server_channel"),
    )


def bind_sessions(frames: DataFrame, sessions: DataFrame | None = None) -> DataFrame:
    """AMQP 1.0 performatives of ``frames`` with ``session_id``, ``client_channel`` and ``server_channel``.

    ``sessions`` is ``session_map`` of the capture's frames (computed from ``frames`` when not given:
    these must then hold every begin). Frames sent on a channel before any begin there (the capture
    missed it) belong to no session: their session columns are null.
    """
    amqp = frames.filter(
        (F.col("protocol") == "amqp-1.0") & (F.col("frame_type") == "amqp") & F.col("channel").isNotNull()
    )
    bound = amqp.withColumn(
        "_begin_index", F.last(F.when(F.col("method") == "begin", F.col("frame_index")), True).over(_endpoint_channel())
    )
    sessions = session_map(amqp) if sessions is None else sessions
    return bound.join(
        F.broadcast(sessions), on=["capture_id", "connection_id", "direction", "_begin_index"], how="left"
    ).drop("_begin_index")


def _last(col: Column) -> Column:
    return F.last(col, ignorenulls=True).over(_session_so_far())


def session_window_timeline(frames: DataFrame, sessions: DataFrame | None = None) -> DataFrame:
    """The session_window table (``schemas.flow.SESSION_WINDOW_SCHEMA``) from the frames table (and
    its ``session_map``, computed when not given)."""
    performatives = frames.filter((F.col("protocol") == "amqp-1.0") & F.col("method").isin(*_SESSION_METHODS)).select(
        *_COLUMNS
    )
    state = bind_sessions(by_connection(performatives), sessions).filter(F.col("session_id").isNotNull())
    is_transfer = F.col("method") == "transfer"
    announces = F.col("method").isin("begin", "flow")
    restates = announces & F.col("next_outgoing_id").isNotNull()
    # Both endpoints' running values first, in one window operator (none reads another), then those
    # that read them: a projection between two windows of one key keeps them in two operators.
    running: list[tuple[str, Column]] = []
    rebased: list[tuple[str, Column]] = []
    for side, direction in _SIDES.items():
        by_side = F.col("direction") == direction
        running += [
            (f"_{side}_transfers", F.sum((by_side & is_transfer).cast("long")).over(_session_so_far())),
            (f"_{side}_base_id", _last(F.when(by_side & restates, F.col("next_outgoing_id")))),
            (f"_{side}_initial_id", _last(F.when(by_side & (F.col("method") == "begin"), F.col("next_outgoing_id")))),
            # The next-incoming-id of the endpoint's latest begin / flow; -1: that frame had none.
            (
                f"_{side}_flow_incoming_id",
                _last(F.when(by_side & announces, F.coalesce(F.col("next_incoming_id"), F.lit(-1)))),
            ),
            (f"{side}_incoming_window", _last(F.when(by_side & announces, F.col("incoming_window")))),
            (f"{side}_outgoing_window", _last(F.when(by_side & announces, F.col("outgoing_window")))),
        ]
        rebased.append((f"_{side}_base_transfers", _last(F.when(by_side & restates, F.col(f"_{side}_transfers")))))
    next_ids = [
        (
            f"{side}_next_outgoing_id",
            serial(F.col(f"_{side}_base_id") + F.col(f"_{side}_transfers") - F.col(f"_{side}_base_transfers")),
        )
        for side in _SIDES
    ]
    peers: list[tuple[str, Column]] = []
    for side, peer in (("client", "server"), ("server", "client")):
        granted_from = F.when(F.col(f"_{peer}_flow_incoming_id") >= 0, F.col(f"_{peer}_flow_incoming_id")).otherwise(
            F.col(f"_{side}_initial_id")
        )
        peers += [
            (f"{side}_next_incoming_id", F.col(f"{peer}_next_outgoing_id")),
            (
                f"{side}_remote_incoming_window",
                F.col(f"{peer}_incoming_window") - serial_diff(F.col(f"{side}_next_outgoing_id"), granted_from),
            ),
        ]
    state = with_columns(state, [*running, *rebased, *next_ids, *peers])
    sender_window = F.when(F.col("direction") == "c2s", F.col("client_remote_incoming_window")).otherwise(
        F.col("server_remote_incoming_window")
    )
    # The transfer used one of the window: what the sender had before it is one more.
    state = state.withColumn("remote_incoming_window", F.when(is_transfer, sender_window + 1))
    return state.select(*[F.col(f.name).cast(f.dataType) for f in SESSION_WINDOW_SCHEMA.fields])
