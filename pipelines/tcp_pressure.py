"""TCP measures of the diagnosis: when a sender was held back by its peer's window, and how much
time retransmissions cost.

**Held back by the window.** A sender in one direction could not send its next segment when the
window its peer advertised had less room left than that segment (RFC 9293 3.8.6: the usable
window is the advertised window less the bytes in flight). From the last segment before such a
gap until the peer's window had room for the next one (its acknowledgement plus its window, the
window's right edge, reached the next segment's end), the sender was held back: a broker's reader
not reading a publisher's socket, or a client not reading its own. Wireshark flags only the
segment that fills the window exactly (``tcp.analysis.window_full``); a sender that stops short of
a nearly full window (Linux avoids sending into a silly window, RFC 9293 3.8.6.2.1) is held back
as much. A zero window (``tcp.analysis.zero_window``) holds the sender back until the window
update; its intervals come from ``flow_intervals`` (cause ``tcp_zero_window``).

The room left in a window is judged only on connections whose handshake was captured
(``tcp_flow.window_scale_source`` ``handshake``): without the SYNs the window's shift is a lower
bound (``pipelines.tcp_flow``), and so is the room, which cannot show that a sender was held
back. Such connections are listed by ``unjudged_windows``; a zero window is zero at any shift and
is judged on every connection.

**Time lost to retransmission.** A retransmission of bytes the receiver already had (spurious:
acknowledged before, or named by a D-SACK after, ``tcp_flow.is_spurious_retransmission``) costs
nothing. A lost segment holds the receiver's stream at the hole from the segment's first
transmission until the acknowledgement that covers its retransmission: those intervals, merged,
are the time lost to recovery.

Both return intervals (``start_us``, ``end_us``, ``start_packet_number``) per connection, for
``pipelines.held`` to merge.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.partitioning import next_value
from amqpscope.pipelines.tcp_flow import SCALE_FROM_HANDSHAKE, SCALE_INFERRED, SCALE_UNKNOWN

_CONNECTION = ("capture_id", "connection_id")


def _flipped(direction: str) -> str:
    return "s2c" if direction == "c2s" else "c2s"


def _new_data_in_order() -> WindowSpec:
    """One direction's new-data segments in capture order: the segment after each one."""
    return Window.partitionBy(*_CONNECTION).orderBy("packet_number")


def _by_need_descending() -> WindowSpec:
    """A connection's needs and right edges by value, highest first (an edge before a need of the
    same value, which it reaches): the earliest edge at or above each need, in one running pass."""
    return (
        Window.partitionBy(*_CONNECTION)
        .orderBy(F.col("_value").desc(), F.col("_is_need").asc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _earliest_reaching(needs: DataFrame, edges: DataFrame) -> DataFrame:
    """``needs`` (rows with ``_value``) with ``_reached_us``: the earliest time among ``edges``
    (``_value``, ``_edge_us``) at which an edge's value was at least the need's."""
    both = (
        needs.withColumn("_is_need", F.lit(True))
        .withColumn("_edge_us", F.lit(None).cast("long"))
        .unionByName(edges.withColumn("_is_need", F.lit(False)), allowMissingColumns=True)
    )
    reached = both.withColumn("_reached_us", F.min("_edge_us").over(_by_need_descending()))
    return reached.filter(F.col("_is_need")).drop("_is_need", "_edge_us")


def window_limited_gaps(tcp_flow: DataFrame, direction: str) -> DataFrame:
    """Intervals in which the sender in ``direction`` had its next segment ready in size but no
    room for it in its peer's window: from the segment before the gap until the peer's window's
    right edge reached the next segment's end (or that segment, if earlier). ``start_packet_number``
    is the segment before the gap; ``window_full`` whether Wireshark flags it as filling the window."""
    new_data = tcp_flow.filter(
        (F.col("direction") == direction)
        & (F.col("window_scale_source") == SCALE_FROM_HANDSHAKE)
        & (F.col("payload_length") > 0)
        & ~F.col("is_retransmission")
        & ~F.col("is_keep_alive")
    )
    window = _new_data_in_order()
    usable = F.col("peer_window") - F.col("bytes_in_flight")
    pairs = new_data.select(
        *_CONNECTION,
        "packet_number",
        "ts_us",
        "is_window_full",
        (F.col("seq_offset") + F.col("payload_length")).alias("_sent_end"),
        usable.alias("_usable"),
        F.lead("payload_length").over(window).alias("_next_length"),
        F.lead("ts_us").over(window).alias("_next_us"),
    )
    gaps = pairs.filter(F.col("_next_length").isNotNull() & (F.col("_usable") < F.col("_next_length")))
    needs = gaps.withColumn("_value", F.col("_sent_end") + F.col("_next_length"))
    # The peer's segments carry its acknowledgement and window: their sum is the window's right
    # edge (a RST's zero window only ever lowers it, so it never opens one).
    edges = tcp_flow.filter((F.col("direction") == _flipped(direction)) & F.col("ack_offset").isNotNull()).select(
        *_CONNECTION,
        (F.col("ack_offset") + F.col("effective_window")).alias("_value"),
        F.col("ts_us").alias("_edge_us"),
    )
    opened = _earliest_reaching(needs, edges)
    # An edge reaching the need before the gap began means the window shrank (RFC 9293 3.8.6.2.2
    # says it should not): count nothing rather than guess.
    end = F.least(F.col("_next_us"), F.coalesce(F.greatest(F.col("_reached_us"), F.col("ts_us")), F.col("_next_us")))
    return opened.select(
        *_CONNECTION,
        F.col("ts_us").alias("start_us"),
        end.alias("end_us"),
        F.col("packet_number").alias("start_packet_number"),
        F.col("is_window_full").alias("window_full"),
    )


def unjudged_windows(tcp_flow: DataFrame) -> DataFrame:
    """Per connection that sent payload without its handshake in the capture: ``window_scale_source``
    (``inferred`` when some segment proved a shift, else ``unknown``): the connections on which
    ``window_limited_gaps`` judges nothing."""
    source = F.col("window_scale_source")
    return (
        tcp_flow.groupBy(*_CONNECTION)
        .agg(
            F.max(F.col("payload_length") > 0).alias("_sent"),
            F.max(source != SCALE_FROM_HANDSHAKE).alias("_unjudged"),
            F.max(source == SCALE_INFERRED).alias("_inferred"),
        )
        .filter(F.col("_sent") & F.col("_unjudged"))
        .select(
            *_CONNECTION,
            F.when(F.col("_inferred"), F.lit(SCALE_INFERRED))
            .otherwise(F.lit(SCALE_UNKNOWN))
            .alias("window_scale_source"),
        )
    )


def zero_windows(flow_intervals: DataFrame, lifetimes: DataFrame, direction: str) -> DataFrame:
    """Intervals in which the sender in ``direction`` faced a zero window from its peer (one still
    closed when the capture ends lasts until the connection's last frame)."""
    chosen = flow_intervals.filter(
        (F.col("entity") == "tcp") & (F.col("cause") == "tcp_zero_window") & (F.col("direction") == direction)
    )
    ended = chosen.join(lifetimes, list(_CONNECTION))
    return ended.select(
        *_CONNECTION,
        F.unix_micros("start_ts").alias("start_us"),
        F.unix_micros(F.coalesce(F.col("end_ts"), F.col("last_ts"))).alias("end_us"),
        "start_packet_number",
        F.col("end_packet_number"),
    )


def _advertised_in_order() -> WindowSpec:
    """One direction's segments in capture order: where each run of zero windows it advertised starts."""
    return Window.partitionBy(*_CONNECTION, "direction").orderBy("packet_number")


def zero_windows_advertised(tcp_flow: DataFrame, direction: str) -> DataFrame:
    """Zero windows from the segments alone (for connections whose frames were not decoded, such
    as TLS without a key log): intervals in which the sender in ``direction`` faced a zero window,
    from the peer's first zero-window segment of a run to its next segment with room (or the
    connection's last segment)."""
    window = _advertised_in_order()
    peer = tcp_flow.filter(F.col("direction") == _flipped(direction)).withColumn(
        "_room_us", F.when(~F.col("is_zero_window"), F.col("ts_us"))
    )
    marked = peer.select(
        *_CONNECTION,
        "packet_number",
        "ts_us",
        "is_zero_window",
        (F.col("is_zero_window") & ~F.coalesce(F.lag("is_zero_window").over(window), F.lit(False))).alias("_starts"),
        next_value("_room_us", window).alias("_reopened_us"),
    )
    last_us = tcp_flow.groupBy(*_CONNECTION).agg(F.max("ts_us").alias("_last_us"))
    return (
        marked.filter(F.col("_starts"))
        .join(last_us, list(_CONNECTION))
        .select(
            *_CONNECTION,
            F.col("ts_us").alias("start_us"),
            F.coalesce(F.col("_reopened_us"), F.col("_last_us")).alias("end_us"),
            F.col("packet_number").alias("start_packet_number"),
        )
    )


def _genuine() -> Column:
    return (
        F.col("is_retransmission")
        & ~F.col("is_spurious_retransmission")
        & ~F.col("is_keep_alive")
        & ~F.col("is_zero_window_probe")
    )


def _by_offset() -> WindowSpec:
    """One direction's segments by stream offset, first transmissions before retransmissions of the
    same offset: the first transmission at or before each retransmission's first byte."""
    return (
        Window.partitionBy(*_CONNECTION, "direction")
        .orderBy("seq_offset", "is_retransmission", "packet_number")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def retransmission_recovery(tcp_flow: DataFrame) -> DataFrame:
    """One interval per retransmission that was not spurious: from the first transmission of its
    first byte until the peer's first acknowledgement covering it after the retransmission (the
    end of the connection's segments when none did). ``retransmitted_bytes`` its bytes."""
    # Only the connections with a retransmission that was not spurious (few, mostly none) are
    # searched for first transmissions.
    losing = tcp_flow.filter(_genuine()).select(*_CONNECTION).distinct()
    data = tcp_flow.filter((F.col("payload_length") > 0) & F.col("seq_offset").isNotNull()).join(
        F.broadcast(losing), list(_CONNECTION), "left_semi"
    )
    first_sent = data.withColumn(
        "_first_us", F.last(F.when(~F.col("is_retransmission"), F.col("ts_us")), True).over(_by_offset())
    )
    lost = first_sent.filter(_genuine())
    needs = lost.select(
        *_CONNECTION,
        "direction",
        "packet_number",
        "ts_us",
        "_first_us",
        "retransmitted_bytes",
        (F.col("seq_offset") + F.col("payload_length")).alias("_value"),
    )
    found = []
    for direction in ("c2s", "s2c"):
        acks = tcp_flow.filter((F.col("direction") == _flipped(direction)) & F.col("ack_offset").isNotNull()).select(
            *_CONNECTION, F.col("ack_offset").alias("_value"), F.col("ts_us").alias("_edge_us")
        )
        found.append(_earliest_reaching(needs.filter(F.col("direction") == direction), acks))
    recovered = found[0].unionByName(found[1])
    last_us = tcp_flow.groupBy(*_CONNECTION).agg(F.max("ts_us").alias("_last_us"))
    return recovered.join(last_us, list(_CONNECTION)).select(
        *_CONNECTION,
        "direction",
        F.coalesce(F.col("_first_us"), F.col("ts_us")).alias("start_us"),
        F.coalesce(F.greatest(F.col("_reached_us"), F.col("ts_us")), F.col("_last_us")).alias("end_us"),
        F.col("packet_number").alias("start_packet_number"),
        "retransmitted_bytes",
    )
