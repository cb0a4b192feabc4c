"""AMQP 1.0 link state per link, after every attach, flow, transfer and detach (transport spec 2.6.7).

Endpoints name a link by their own channel and handle, so frames are first mapped to the link
name their sender attached with that (channel, handle); the two halves of a link meet on the name.
The sender's state then follows from running aggregates over the link's frames (capture order,
only frames seen so far):

    delivery-count(snd)   = last delivery-count the sender announced (attach: initial-delivery-count,
                            or a flow of its own) + new deliveries since
    delivery-count(rcv)   = delivery-count of the receiver's last flow (initial-delivery-count if unset)
    deliveries in flight  = delivery-count(snd) - delivery-count(rcv)
    link-credit(snd)      = delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)
                          = link-credit(rcv) - deliveries in flight

serial arithmetic throughout (the second form keeps a credit near 2^32 from wrapping).

Unsettled deliveries (link_state only) need delivery-ids, which are numbered per session and
direction: a delivery is settled by a settled transfer frame of its own or by the first settled
disposition of either endpoint whose [first, last] range names it (2.6.12, 2.7.6). A disposition
has no handle: it gets a row of its own on every link whose deliveries it settled, carrying the
link's state as of that frame, so the last row of a link counts every settlement seen before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import other_direction, with_columns
from amqpscope.pipelines.partitioning import by_connection
from amqpscope.pipelines.serial import serial, serial_diff
from amqpscope.pipelines.sessions import bind_sessions
from amqpscope.schemas.flow import LINK_CREDIT_SCHEMA, LINK_STATE_SCHEMA

_CREDIT_METHODS = ("attach", "flow", "transfer")
_LINK_METHODS = (*_CREDIT_METHODS, "detach")

_LINK = ("capture_id", "connection_id", "link_name", "sender_direction")
# Delivery-ids are allocated per session by the sending endpoint (2.7.5).
_DELIVERY_IDS = ("capture_id", "connection_id", "session_id", "_id_direction")
# The frames-table columns link state reads.
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
    "handle",
    "name",
    "role",
    "initial_delivery_count",
    "target_address",
    "source_address",
    "delivery_count",
    "link_credit",
    "available",
    "drain",
    "echo",
    "delivery_id",
    "more",
    "aborted",
    "settled",
    "payload_size",
)
# What a settling frame passes to the deliveries it settles (frame_index first: structs order by it).
_SETTLING_FIELDS = ("frame_index", "ts", "packet_number", "direction", "channel", "method", "role")
# The link-state columns a disposition row takes over from the link's previous row.
_CARRIED = (
    "delivery_count_snd",
    "link_credit_snd",
    "delivery_count_rcv",
    "link_credit_rcv",
    "available",
    "drain",
    "deliveries_in_flight",
    "sender_announced_no_credit",
)

# Window specifications are built per call: PySpark needs an active session to build one.


def _endpoint_handle() -> WindowSpec:
    """One endpoint's handle on one channel, in frame order: resolves a frame to the latest attach
    that bound the handle (handles are reused after detach)."""
    return (
        Window.partitionBy("capture_id", "connection_id", "direction", "channel", "handle")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _link_so_far() -> WindowSpec:
    """One link (both endpoints' frames) in frame order: the running sender/receiver state."""
    return Window.partitionBy(*_LINK).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, Window.currentRow)


def _link_before() -> WindowSpec:
    """The same, excluding the current frame: the state a transfer finds when it arrives."""
    return Window.partitionBy(*_LINK).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, -1)


def _link_in_order() -> WindowSpec:
    """A link's frames in order, for the previous frame's state."""
    return Window.partitionBy(*_LINK).orderBy("frame_index")


def _link_after_frame() -> WindowSpec:
    """A link's rows in frame order, a frame's rows together: each row sees the count after its frame."""
    return Window.partitionBy(*_LINK).orderBy("frame_index").rangeBetween(Window.unboundedPreceding, Window.currentRow)


def _same_id_later() -> WindowSpec:
    """A delivery-id of one session direction, latest frame first: for a delivery, the first
    disposition naming its id after it (a growing frame over the later rows)."""
    return (
        Window.partitionBy(*_DELIVERY_IDS, "_id")
        .orderBy(F.col("frame_index").desc())
        .rowsBetween(Window.unboundedPreceding, -1)
    )


def _same_delivery() -> WindowSpec:
    """The transfer frames of one delivery (from its first frame on): the first one settling it."""
    return Window.partitionBy(*_LINK, "_delivery_start")


def _link_frame_rows() -> WindowSpec:
    """A link's rows of one frame (a disposition settling several of its deliveries has one each)."""
    return Window.partitionBy(*_LINK, "frame_index").orderBy("_delivery_start")


def _session_direction_so_far() -> WindowSpec:
    """Deliveries and dispositions of one session direction in order: how many delivery-ids were sent by then."""
    return (
        Window.partitionBy(*_DELIVERY_IDS)
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _last(col: Column, window: WindowSpec | None = None) -> Column:
    return F.last(col, ignorenulls=True).over(window if window is not None else _link_so_far())


_ENDPOINT = ("capture_id", "connection_id", "direction", "channel", "handle")
_BEFORE_ATTACH = 1 << 62  # a frame index after every frame: the handle of an endpoint never attached
_HALF = ("direction", "channel", "handle")


def _opened_in_capture(frames: DataFrame) -> DataFrame:
    """The AMQP 1.0 connections (capture_id, connection_id) whose open the capture holds: their
    links were all attached in it, so a handle used before its attach is a protocol error
    (``lifecycle_10``), not a link attached before the capture."""
    opens = (F.col("protocol") == "amqp-1.0") & (F.col("method") == "open")
    return frames.filter(opens).select("capture_id", "connection_id").distinct()


def _halves_before_capture(events: DataFrame, opened: DataFrame) -> DataFrame:
    """Per endpoint handle (``_ENDPOINT``) that carries link frames before its first attach in the
    capture, on a connection not ``opened`` in it (a half of a link attached before the capture
    began): ``_first_attach`` (``_BEFORE_ATTACH`` when none) and ``_sends`` (1 when it sent
    transfers before it: the link's sender). One aggregate over the link frames, so the frames' own
    plan is not repeated."""
    link_frame = F.col("method").isin(*_LINK_METHODS) & F.col("handle").isNotNull()
    return (
        events.filter(link_frame)
        .join(F.broadcast(opened), ["capture_id", "connection_id"], "left_anti")
        .groupBy(*_ENDPOINT)
        .agg(
            F.coalesce(F.min(F.when(F.col("method") == "attach", F.col("frame_index"))), F.lit(_BEFORE_ATTACH)).alias(
                "_first_attach"
            ),
            F.min("frame_index").alias("_first_frame"),
            F.min(F.when(F.col("method") == "transfer", F.col("frame_index"))).alias("_first_transfer"),
        )
        .filter(F.col("_first_frame") < F.col("_first_attach"))
        .select(
            *_ENDPOINT,
            "_first_attach",
            F.coalesce((F.col("_first_transfer") < F.col("_first_attach")).cast("int"), F.lit(0)).alias("_sends"),
        )
    )


def _links_before_capture(halves: DataFrame) -> DataFrame:
    """The halves (``_halves_before_capture``) paired into links: each half with ``_name`` and
    ``_role`` of the link its frames before ``_first_attach`` belong to, null where it has none.

    The endpoint that sends transfers on such a handle is the link's sender; the endpoint that only
    sends flows on one in the other direction is its receiver. The two halves are one link when
    they are the only sending and the only receiving half with their channel and handle numbers (a
    broker answering an attach with the handle it was given, as RabbitMQ does), or the only ones of
    their connection. The link is named after its sender's channel and handle. Any other half, one
    that two others could pair with or one without its other half, stays unbound: its credit
    cannot be judged."""

    def pairing(*keys: str) -> tuple[Column, Column]:
        """Whether the partition holds one sending and one receiving half, in opposite directions,
        and the sending half's (direction, channel, handle)."""
        window = Window.partitionBy("capture_id", "connection_id", *keys)
        one_each = (F.sum("_sends").over(window) == 1) & (F.sum(1 - F.col("_sends")).over(window) == 1)
        opposite = F.min("direction").over(window) != F.max("direction").over(window)
        sender = F.max(F.when(F.col("_sends") == 1, F.struct(*_HALF))).over(window)
        return one_each & opposite, sender

    echoed, echoed_sender = pairing("channel", "handle")
    alone, alone_sender = pairing()
    sender = F.when(echoed, echoed_sender).when(alone, alone_sender)
    name = F.format_string(
        "(attached before the capture: %s channel %d handle %d)",
        F.when(sender["direction"] == "c2s", "client").otherwise("server"),
        sender["channel"],
        sender["handle"],
    )
    return halves.select(
        *_ENDPOINT,
        "_first_attach",
        "_sends",
        F.when(sender.isNotNull(), name).alias("_name"),
        F.when(sender.isNotNull(), F.when(F.col("_sends") == 1, "sender").otherwise("receiver")).alias("_role"),
    )


def _bound(events: DataFrame, opened: DataFrame) -> DataFrame:
    """``events`` with each link frame's ``link_name`` and ``role``: those of the latest attach that
    bound its handle, or, before the first attach of its handle, those of a link attached before
    the capture (``_links_before_capture``); and ``attach_seen``, false on the frames of such a link."""
    is_attach = F.col("method") == "attach"
    links = F.broadcast(
        _links_before_capture(_halves_before_capture(events, opened)).filter(F.col("_name").isNotNull())
    )
    before = F.col("method").isin(*_LINK_METHODS) & (F.col("frame_index") < F.col("_first_attach"))
    return (
        with_columns(
            events.join(links, list(_ENDPOINT), "left"),
            [
                ("link_name", _last(F.when(is_attach, F.col("name")), _endpoint_handle())),
                ("role", _last(F.when(is_attach, F.col("role")), _endpoint_handle())),
            ],
        )
        .withColumns(
            {
                "attach_seen": ~F.coalesce(before, F.lit(False)),
                "link_name": F.coalesce(F.col("link_name"), F.when(before, F.col("_name"))),
                "role": F.coalesce(F.col("role"), F.when(before, F.col("_role"))),
            }
        )
        .drop("_first_attach", "_sends", "_name", "_role")
    )


def unbound_senders(frames: DataFrame) -> DataFrame:
    """The AMQP 1.0 sending endpoints (``_ENDPOINT``) whose transfers no link binds: attached before
    the capture and left without their other half (``_links_before_capture``), so their credit is
    not judged."""
    events = frames.filter(F.col("protocol") == "amqp-1.0").select(*_ENDPOINT, "frame_index", "method")
    links = _links_before_capture(_halves_before_capture(events, _opened_in_capture(frames)))
    return links.filter((F.col("_sends") == 1) & F.col("_name").isNull()).select(*_ENDPOINT)


def _credit_state(events: DataFrame, opened: DataFrame, also: Sequence[tuple[str, Column]] = ()) -> DataFrame:
    """Link frames (attach, flow, transfer, detach with a handle) with the sender's and receiver's
    state; other rows pass through with a null ``link_name``. ``also``: more columns, computed with
    the link's first windows (they may read the frame's columns and the link's, nothing else)."""
    bound = _bound(events, opened)
    is_attach = F.col("method") == "attach"
    from_sender = F.col("role") == "sender"
    linked = bound.withColumn(
        "sender_direction", F.when(from_sender, F.col("direction")).otherwise(other_direction(F.col("direction")))
    )

    is_transfer = (F.col("method") == "transfer") & from_sender
    is_flow = F.col("method") == "flow"
    receiver_flow = is_flow & ~from_sender
    sender_count = (is_flow & from_sender & F.col("delivery_count").isNotNull()) | (
        is_attach & from_sender & F.col("initial_delivery_count").isNotNull()
    )
    # An aborted transfer ends its delivery whatever its more flag says (2.7.5).
    continues = F.coalesce(F.col("more"), F.lit(False)) & ~F.coalesce(F.col("aborted"), F.lit(False))

    # In dependency order, so that the link's windows are four operators (none of a group's windows
    # reads another's result): what the frames say, then what reads it.
    return with_columns(
        linked,
        [
            ("target_address", F.first(F.when(is_attach, F.col("target_address")), True).over(_link_so_far())),
            ("source_address", F.first(F.when(is_attach, F.col("source_address")), True).over(_link_so_far())),
            ("_initial_count", _last(F.when(is_attach & from_sender, F.col("initial_delivery_count")))),
            # A delivery starts with a transfer whose predecessor on the link did not say more=true.
            ("_prev_more", _last(F.when(is_transfer, continues), _link_before())),
            # The sender's attach, and its own flows (e.g. after a drain), state its delivery-count.
            (
                "_base_count",
                _last(F.when(sender_count, F.coalesce(F.col("delivery_count"), F.col("initial_delivery_count")))),
            ),
            # A receiver's flow without delivery-count had not seen the sender's attach: the
            # initial-delivery-count applies (2.7.4). -1 marks such a flow.
            ("_rcv_count", _last(F.when(receiver_flow, F.coalesce(F.col("delivery_count"), F.lit(-1))))),
            ("link_credit_rcv", _last(F.when(receiver_flow, F.col("link_credit")))),
            ("drain", _last(F.when(receiver_flow, F.coalesce(F.col("drain"), F.lit(False))))),
            ("available", _last(F.when(is_flow & from_sender, F.col("available")))),
            ("echo", F.when(is_flow, F.coalesce(F.col("echo"), F.lit(False)))),
            ("sender_side", F.when(F.col("sender_direction") == "c2s", "client").otherwise("server")),
            # A link's last flow is the sender's, saying credit 0: until the receiver flows again.
            (
                "sender_announced_no_credit",
                _last(
                    F.when(receiver_flow, F.lit(False)).when(
                        is_flow & from_sender & F.col("link_credit").isNotNull(), F.col("link_credit") == 0
                    )
                ),
            ),
            *also,
            ("is_new_delivery", is_transfer & ~F.coalesce(F.col("_prev_more"), F.lit(False))),
            (
                "delivery_count_rcv",
                F.when(F.col("_rcv_count") >= 0, F.col("_rcv_count")).otherwise(F.col("_initial_count")),
            ),
            ("_deliveries", F.sum(F.col("is_new_delivery").cast("long")).over(_link_so_far())),
            ("_delivery_start", _last(F.when(F.col("is_new_delivery"), F.col("frame_index")))),
            ("delivery_first_id", F.when(is_transfer, _last(F.when(F.col("is_new_delivery"), F.col("delivery_id"))))),
            ("_base_deliveries", _last(F.when(sender_count, F.col("_deliveries")))),
            ("delivery_count_snd", serial(F.col("_base_count") + F.col("_deliveries") - F.col("_base_deliveries"))),
            ("deliveries_in_flight", serial_diff(F.col("delivery_count_snd"), F.col("delivery_count_rcv"))),
            ("delivery_count_snd_before", F.lag("delivery_count_snd").over(_link_in_order())),
            # Until the receiver's first flow the sender has no credit (2.6.7: initially 0); on a link
            # attached before the capture, the credit granted before it is unknown until then.
            (
                "link_credit_snd",
                F.when(F.col("attach_seen"), F.coalesce(F.col("link_credit_rcv"), F.lit(0))).otherwise(
                    F.col("link_credit_rcv")
                )
                - F.col("deliveries_in_flight"),
            ),
            ("link_credit_snd_before", F.when(F.col("is_new_delivery"), F.col("link_credit_snd") + 1)),
        ],
    )


def link_credit_timeline(frames: DataFrame) -> DataFrame:
    """The link_credit table (``schemas.flow.LINK_CREDIT_SCHEMA``) from the frames table: the link
    state's credit rows (``link_credit_of``)."""
    return link_credit_of(link_state_timeline(frames))


def link_credit_of(link_state: DataFrame) -> DataFrame:
    """The link_credit table from the link_state table: its attach, flow and transfer rows (its
    link frames but the detaches; no disposition row), projected onto LINK_CREDIT_SCHEMA. The
    link's credit is computed once, for both tables. Of the other frames link_state follows, the
    detaches meet none of the credit columns' conditions, and the begins, dispositions and a
    session's own flows carry no handle, so they join no link (but that of an attach without a
    handle, which the spec does not allow: then both tables count them alike)."""
    credit = link_state.filter(F.col("method").isin(*_CREDIT_METHODS))
    return credit.select(*[F.col(f.name).cast(f.dataType) for f in LINK_CREDIT_SCHEMA.fields])


def _disposition_target() -> Column:
    """The sending direction of the deliveries a disposition names: those flowing towards a
    receiver-role sender of it, or those a sender-role one sent (2.7.6)."""
    towards_it = other_direction(F.col("direction"))
    return F.when(
        F.col("method") == "disposition", F.when(F.col("role") == "receiver", towards_it).otherwise(F.col("direction"))
    )


def _settled_at(state: DataFrame) -> DataFrame:
    """``state`` (link frames, dispositions, begins) with ``_settled_by`` on each delivery's first
    transfer: the _SETTLING_FIELDS of the first frame that settled it (a settled transfer of its
    own, or a settled disposition naming its delivery-id), or null."""
    # The frame's own role: _credit_state's role is the one its handle was attached with, and a
    # disposition has no handle.
    settling = F.struct(*(F.col(n) for n in _SETTLING_FIELDS if n != "role"), F.col("_frame_role").alias("role"))
    is_new = F.col("is_new_delivery")
    is_disposition = (
        (F.col("method") == "disposition") & F.coalesce(F.col("settled"), F.lit(False)) & F.col("first").isNotNull()
    )
    numbered = state.withColumn(
        "_id_direction", F.when(is_new, F.col("sender_direction")).otherwise(F.col("_disposition_target"))
    ).withColumns(
        {
            "_sent": F.sum(is_new.cast("long")).over(_session_direction_so_far()),
            "_last_sent": F.last(F.when(is_new, F.col("delivery_id")), True).over(_session_direction_so_far()),
        }
    )
    # Only ids sent by then can be settled: that also bounds the explode of a malformed range.
    last = F.coalesce(F.col("last"), F.col("first"))
    span = F.least(
        serial_diff(last, F.col("first")) + 1, serial_diff(F.col("_last_sent"), F.col("first")) + 1, F.col("_sent")
    )
    named = F.when(is_disposition & (span > 0), F.sequence(F.lit(0).cast("long"), span - 1)).otherwise(
        F.array(F.lit(-1).cast("long"))
    )
    by_id = (
        numbered.withColumn("_k", F.explode(named))
        .withColumn(
            "_id", F.when(F.col("_k") >= 0, serial(F.col("first") + F.col("_k"))).when(is_new, F.col("delivery_id"))
        )
        .withColumn("_disposition_at", F.min(F.when(F.col("_k") >= 0, settling)).over(_same_id_later()))
        .filter(F.col("_k") < 0)
    )
    settled_transfer = (
        (F.col("method") == "transfer") & (F.col("role") == "sender") & F.coalesce(F.col("settled"), F.lit(False))
    )
    return by_id.withColumn(
        "_transfer_at", F.min(F.when(settled_transfer, settling)).over(_same_delivery())
    ).withColumn("_settled_by", F.when(is_new, F.least("_transfer_at", "_disposition_at")))


def link_state_timeline(frames: DataFrame, sessions: DataFrame | None = None) -> DataFrame:
    """The link_state table (``schemas.flow.LINK_STATE_SCHEMA``) from the frames table (and its
    ``sessions.session_map``, computed when not given)."""
    performatives = frames.filter(
        (F.col("protocol") == "amqp-1.0") & F.col("method").isin("begin", "disposition", *_LINK_METHODS)
    ).select(*_COLUMNS, "remote_channel", "frame_type", "first", "last")
    bound = (
        bind_sessions(by_connection(performatives), sessions)
        .withColumn("_disposition_target", _disposition_target())
        .withColumn("_frame_role", F.col("role"))
    )
    link_frame = F.col("method").isin(*_LINK_METHODS) & F.col("handle").isNotNull() & F.col("link_name").isNotNull()
    # Each endpoint's handle of the link, for the rows of the dispositions it sends.
    state = _credit_state(
        bound,
        _opened_in_capture(frames),
        also=[
            (f"_{direction}_handle", _last(F.when(F.col("direction") == direction, F.col("handle"))))
            for direction in ("c2s", "s2c")
        ],
    )
    settled = _settled_at(state).withColumn("_link_frame", link_frame)
    # Each settled delivery gets a second row at the frame that settled it, so the running count
    # over the link's frames counts it there ("range": a frame's rows see the count after it).
    doubled = settled.withColumn(
        "_is_event",
        F.explode(
            F.when(F.col("_settled_by").isNotNull(), F.array(F.lit(True), F.lit(False))).otherwise(F.array(F.lit(True)))
        ),
    ).withColumn("_delta", F.when(~F.col("_is_event"), -1).when(F.col("is_new_delivery"), 1).otherwise(0))
    # A disposition's row: the link as of that frame, the link's state carried from its previous row.
    by_disposition = ~F.col("_is_event") & (F.col("method") == "disposition")
    doubled = with_columns(
        doubled,
        [
            (name, F.when(F.col("_is_event"), F.col(name)).otherwise(F.col(f"_settled_by.{name}")))
            for name in _SETTLING_FIELDS
        ],
    )
    # Sorted once for the windows below: by frame for the running state and count, and within a
    # frame by delivery for the first row of each disposition (without this, Spark sorts twice).
    doubled = with_columns(
        doubled.sortWithinPartitions(*_LINK, "frame_index", "_delivery_start"),
        [
            (
                name,
                F.when(F.col("_is_event"), F.col(name)).otherwise(
                    F.last(F.when(F.col("_is_event"), F.col(name)), True).over(_link_so_far())
                ),
            )
            for name in _CARRIED
        ]
        + [("unsettled", F.sum("_delta").over(_link_after_frame()))],
    )
    timeline = (
        doubled.filter((F.col("_is_event") & F.col("_link_frame")) | by_disposition)
        .withColumn("_nth", F.row_number().over(_link_frame_rows()))
        .filter(~by_disposition | (F.col("_nth") == 1))
        .withColumn(
            "handle",
            F.when(
                by_disposition,
                F.when(F.col("direction") == "c2s", F.col("_c2s_handle")).otherwise(F.col("_s2c_handle")),
            ).otherwise(F.col("handle")),
        )
        .withColumn("is_new_delivery", F.col("is_new_delivery") & ~by_disposition)
    )
    timeline = with_columns(
        timeline,
        [
            (name, F.when(~by_disposition, F.col(name)))
            for name in (
                "delivery_id",
                "payload_size",
                "link_credit_snd_before",
                "echo",
                "link_credit",
                "delivery_count",
                "delivery_first_id",
                "delivery_count_snd_before",
            )
        ],
    )
    return timeline.select(*[F.col(f.name).cast(f.dataType) for f in LINK_STATE_SCHEMA.fields])
