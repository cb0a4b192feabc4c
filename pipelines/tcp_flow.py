"""TCP flow control per connection and direction, one row per segment (RFC 9293 3.8.6, RFC 7323).

Over a connection's segments in capture order (both directions): the window each side last
advertised, what each side has sent (highest stream offset) and what the other side has
acknowledged of it. A sender whose bytes in flight reach the peer's window has filled it; a
receiver advertising a zero window stops its peer, which may only probe until a window update.

A zero-window probe carries new data (the next byte) into a closed window (RFC 9293 3.8.6.1); a
keep-alive carries no new data: its sequence number is one below what the sender has sent, with
0 or 1 garbage byte (RFC 9293 3.8.4), whatever the window. Wireshark tells them apart the same
way (tcp.analysis.keep_alive, tcp.analysis.zero_window_probe).

A retransmission is spurious when the receiver already had its bytes: they were acknowledged
before it was sent (Wireshark's tcp.analysis.spurious_retransmission), or the receiver's next
D-SACK (RFC 2883) names them as received twice. Nothing was lost then.

**The window scale** (RFC 7323 2) is agreed in the SYN and SYN-ACK only. A capture that begins
after them (tcpdump started on a broker whose connections have been open for days) sees raw 16-bit
windows whose shift is unknown. Each side's shift is then inferred from the traffic as a lower
bound: a sender never has more bytes in flight than the window its receiver last advertised
(RFC 9293 3.8.6), so bytes in flight above ``raw << s`` prove the receiver's shift is above ``s``;
the smallest shift consistent with every segment is the one used (``window_scale_source``
``inferred``). Where no segment proves a shift (nothing in flight above the raw window) it stays
``unknown`` and the window is the raw one. Either way the window is a lower bound, so it can show
that a sender was *not* held back by it, never that it was: ``pipelines.tcp_pressure`` judges the
window's room only on connections whose handshake was captured (``handshake``). A zero window is
zero at any scale.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import with_columns
from amqpscope.schemas.tcp import TCP_FLOW_SCHEMA

_RST = 0x04
_SYN_FIN_RST = 0x07
_CONNECTION = ("capture_id", "connection_id")
# RFC 7323 2.3: a shift count above 14 is used as 14.
_MAX_SHIFT = 14
# tcp_flow.window_scale_source: how the shift of a segment's window was known.
SCALE_FROM_HANDSHAKE = "handshake"
SCALE_INFERRED = "inferred"
SCALE_UNKNOWN = "unknown"


def _connection_so_far() -> WindowSpec:
    """A connection's segments in capture order: the latest window and acknowledgement of each side."""
    return (
        Window.partitionBy(*_CONNECTION)
        .orderBy("packet_number")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _direction_before() -> WindowSpec:
    """One direction's segments before this one: the stream offset it had sent up to."""
    return (
        Window.partitionBy(*_CONNECTION, "direction")
        .orderBy("packet_number")
        .rowsBetween(Window.unboundedPreceding, -1)
    )


def _direction_in_order() -> WindowSpec:
    """One direction's segments in capture order: the window this side advertised just before."""
    return Window.partitionBy(*_CONNECTION, "direction").orderBy("packet_number")


def _connection_from_now_on() -> WindowSpec:
    """A connection's segments from the last back to this one: the next D-SACK after a segment
    (a running frame in reverse order, so that Spark keeps one pass over the partition)."""
    return (
        Window.partitionBy(*_CONNECTION)
        .orderBy(F.col("packet_number").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _whole_connection() -> WindowSpec:
    """A connection's segments, all of them: the shift every segment of a direction is consistent with."""
    return Window.partitionBy(*_CONNECTION)


def _from(direction: str, value: Column) -> Column:
    return F.when(F.col("direction") == direction, value)


def _other(direction: str) -> str:
    return "s2c" if direction == "c2s" else "c2s"


def _shift_needed(in_flight: Column, window: Column) -> Column:
    """The least shift ``s`` with ``window << s >= in_flight`` (null where nothing is in flight
    beyond a window that is open): ``ceil(log2(in_flight / window))``, in whole numbers."""
    ratio = F.ceil(in_flight / window)
    # ceil(log2(n)) for a whole n >= 2: the bit length of n - 1.
    bits = F.length(F.bin(ratio - 1))
    return F.when((window > 0) & (in_flight > window), F.least(bits, F.lit(_MAX_SHIFT)))


def _shifted(window: Column, shift: Column) -> Column:
    return F.call_function("shiftleft", window, shift.cast("int"))


def _with_window_scale(state: DataFrame) -> DataFrame:
    """``state`` (each side's running raw window, acknowledgement and data sent, ``_c2s_window`` ...)
    with ``window_scale`` known or inferred (module doc), ``window_scale_source``, and
    ``effective_window`` and each side's running window shifted by it. Where the handshake gave
    the shift, the segments' windows are scaled already and nothing changes."""
    # A segment with payload in one direction proves a shift for the other side's window: the
    # largest shift any segment proves, over the whole connection.
    needed = {
        direction: F.max(
            _from(
                _other(direction),
                F.when(
                    F.col("payload_length") > 0,
                    _shift_needed(
                        F.col(f"_{_other(direction)}_sent") - F.col(f"_{direction}_acked"),
                        F.col(f"_{direction}_window"),
                    ),
                ),
            )
        ).over(_whole_connection())
        for direction in ("c2s", "s2c")
    }
    state = state.withColumns({f"_{direction}_shift": shift for direction, shift in needed.items()})
    known = F.col("window_scale").isNotNull()

    def shift(direction: str) -> Column:
        return F.when(known, F.lit(0)).otherwise(F.coalesce(F.col(f"_{direction}_shift"), F.lit(0)))

    own = F.when(F.col("direction") == "c2s", F.col("_c2s_shift")).otherwise(F.col("_s2c_shift"))
    scale = F.when(known, F.col("window_scale")).otherwise(F.coalesce(own, F.lit(0))).cast("int")
    source = (
        F.when(known, F.lit(SCALE_FROM_HANDSHAKE))
        .when(own.isNotNull(), F.lit(SCALE_INFERRED))
        .otherwise(F.lit(SCALE_UNKNOWN))
    )
    return state.withColumns(
        {
            "window_scale": scale,
            "window_scale_source": source,
            "effective_window": F.when(known, F.col("effective_window")).otherwise(_shifted(F.col("window"), scale)),
            **{
                f"_{direction}_window": _shifted(F.col(f"_{direction}_window"), shift(direction))
                for direction in ("c2s", "s2c")
            },
        }
    )


def tcp_flow_timeline(tcp_segments: DataFrame) -> DataFrame:
    """The tcp_flow table (``schemas.tcp.TCP_FLOW_SCHEMA``) from the tcp_segments table."""
    is_reset = (F.col("flags").bitwiseAND(F.lit(_RST))) != 0
    sent_end = F.col("seq_offset") + F.col("payload_length")
    # A RST's window means nothing (RFC 9293 3.10.7): it neither opens nor closes one. Each side's
    # running values in one window operator (none reads another's), as are the two windows over a
    # direction below.
    so_far = {}
    for direction in ("c2s", "s2c"):
        so_far |= {
            f"_{direction}_window": F.last(_from(direction, F.when(~is_reset, F.col("effective_window"))), True),
            f"_{direction}_acked": F.last(_from(direction, F.col("ack_offset")), True),
            f"_{direction}_sent": F.max(_from(direction, sent_end)),
        }
    state = tcp_segments.withColumns(
        {
            "is_zero_window": (F.col("effective_window") == 0) & ~is_reset,
            **{name: running.over(_connection_so_far()) for name, running in so_far.items()},
        }
    )
    state = _with_window_scale(state)
    peer_window = F.when(F.col("direction") == "c2s", F.col("_s2c_window")).otherwise(F.col("_c2s_window"))
    # Sent by this side and not yet acknowledged by the other.
    in_flight = F.when(F.col("direction") == "c2s", F.col("_c2s_sent") - F.col("_s2c_acked")).otherwise(
        F.col("_s2c_sent") - F.col("_c2s_acked")
    )
    own_before = F.lag(F.when(~is_reset, F.col("effective_window"))).over(_direction_in_order())
    has_payload = F.col("payload_length") > 0
    state = with_columns(
        state,
        [
            ("peer_window", peer_window),
            ("bytes_in_flight", in_flight),
            ("is_window_update", (own_before == 0) & (F.col("effective_window") > 0) & ~is_reset),
            ("is_retransmission", F.col("retransmitted_bytes") > 0),
            # seq one below the next byte to send, at most one byte, no SYN / FIN / RST.
            (
                "is_keep_alive",
                (F.col("payload_length") <= 1)
                & (F.col("flags").bitwiseAND(F.lit(_SYN_FIN_RST)) == 0)
                & (F.col("seq_offset") == F.max(sent_end).over(_direction_before()) - 1),
            ),
            (
                "is_window_full",
                has_payload
                & (F.col("bytes_in_flight") >= F.col("peer_window"))
                & (F.col("peer_window") > 0)
                # A window whose shift is a lower bound is never known to be full.
                & (F.col("window_scale_source") == SCALE_FROM_HANDSHAKE),
            ),
            (
                "is_zero_window_probe",
                has_payload & (F.col("peer_window") == 0) & ~F.coalesce(F.col("is_keep_alive"), F.lit(False)),
            ),
        ],
    )
    # The peer's latest acknowledgement before this segment (a segment does not move its peer's),
    # and the next D-SACK the peer sends after it.
    acked_before = F.when(F.col("direction") == "c2s", F.col("_s2c_acked")).otherwise(F.col("_c2s_acked"))
    dsack = F.when(
        F.col("dsack_left_offset").isNotNull(),
        F.struct(F.col("dsack_left_offset").alias("left"), F.col("dsack_right_offset").alias("right")),
    )
    state = state.withColumns(
        {
            f"_next_{direction}_dsack": F.last(_from(direction, dsack), True).over(_connection_from_now_on())
            for direction in ("c2s", "s2c")
        }
    )
    peer_dsack = F.when(F.col("direction") == "c2s", F.col("_next_s2c_dsack")).otherwise(F.col("_next_c2s_dsack"))
    already_acked = acked_before >= sent_end
    duplicated = (peer_dsack["left"] < sent_end) & (peer_dsack["right"] > F.col("seq_offset"))
    state = state.withColumn(
        "is_spurious_retransmission",
        F.col("is_retransmission") & (F.coalesce(already_acked, F.lit(False)) | F.coalesce(duplicated, F.lit(False))),
    )
    booleans = (
        "is_window_update",
        "is_window_full",
        "is_zero_window_probe",
        "is_keep_alive",
        "is_spurious_retransmission",
    )
    state = state.fillna(False, subset=list(booleans))
    return state.select(*[F.col(f.name).cast(f.dataType) for f in TCP_FLOW_SCHEMA.fields])
