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
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import with_columns
from amqpscope.schemas.tcp import TCP_FLOW_SCHEMA

_RST = 0x04
_SYN_FIN_RST = 0x07
_CONNECTION = ("capture_id", "connection_id")


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


def _from(direction: str, value: Column) -> Column:
    return F.when(F.col("direction") == direction, value)


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
                has_payload & (F.col("bytes_in_flight") >= F.col("peer_window")) & (F.col("peer_window") > 0),
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
