"""TCP-level tables: the segments of every AMQP connection (bronze) and their flow control (silver).

The frames table says nothing about TCP; these carry what the flow-state pipelines need to see
the transport push back (RFC 9293 3.8.6 window management, RFC 7323 2 window scaling):
advertised windows, acknowledgements, retransmitted bytes.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

_SEGMENT_KEY = [
    StructField("capture_id", StringType(), False),
    StructField("connection_id", StringType(), False),
    StructField("direction", StringType(), False),  # "c2s" / "s2c": who sent the segment
    StructField("packet_number", LongType(), False),  # 1-based record number, as tshark's frame.number
    StructField("ts", TimestampType(), False),
    StructField("ts_us", LongType(), False),
]

# One row per TCP segment of a connection carrying AMQP (every segment: data, pure ACKs, SYN, FIN).
TCP_SEGMENTS_SCHEMA = StructType(
    _SEGMENT_KEY
    + [
        # Stream offset (the frames table's stream_offset) of the segment's first sequence
        # number; 0 for a SYN. Null for a segment without payload before the stream's origin is known.
        StructField("seq_offset", LongType(), True),
        # Stream offset, in the other direction's stream, of the next byte the sender expects
        # (the acknowledgement number made relative); null without ACK or before that origin is known.
        StructField("ack_offset", LongType(), True),
        StructField("flags", IntegerType(), False),  # TCP header flag bits: FIN 1, SYN 2, RST 4, PSH 8, ACK 16, URG 32
        StructField("window", LongType(), False),  # the raw 16-bit window field
        # Shift count applied to this segment's window: the sender's SYN option when both SYNs
        # carried one (RFC 7323 2.2), else 0; 0 on a SYN itself; null when the handshake was not captured.
        StructField("window_scale", IntegerType(), True),
        # Receive window the sender advertises, in bytes: window << window_scale (the raw window
        # when the scale is unknown, so a lower bound then).
        StructField("effective_window", LongType(), False),
        # TCP payload bytes on the wire (from the IP header's length): bytes cut by the snapshot
        # length count here, and are the quarantine's missing bytes.
        StructField("payload_length", LongType(), False),
        StructField("retransmitted_bytes", LongType(), False),  # payload bytes already seen in earlier segments
        # Appended: a D-SACK (RFC 2883) this segment carries: the start of the range of the other
        # direction's stream (a stream offset, as ack_offset) that its sender received twice. Null
        # when it reports none (Wireshark: tcp.options.sack.dsack_le).
        StructField("dsack_left_offset", LongType(), True),
        # Appended: the end of that range, exclusive (Wireshark: tcp.options.sack.dsack_re).
        StructField("dsack_right_offset", LongType(), True),
    ]
)

# TCP flow control per connection and direction, one row per segment (pipelines/tcp_flow.py).
TCP_FLOW_SCHEMA = StructType(
    _SEGMENT_KEY
    + [
        StructField("seq_offset", LongType(), True),
        StructField("payload_length", LongType(), False),
        StructField("effective_window", LongType(), False),  # what this segment advertises to the peer
        StructField("is_zero_window", BooleanType(), False),  # advertises a closed window (not a RST)
        StructField("is_window_update", BooleanType(), False),  # reopens a window this direction had closed
        # The window the peer last advertised to this segment's sender, and the sender's bytes
        # sent but not yet acknowledged by the peer, after this segment.
        StructField("peer_window", LongType(), True),
        StructField("bytes_in_flight", LongType(), True),
        # Payload that fills the peer's advertised window (Wireshark's tcp.analysis.window_full);
        # never where the window's shift was not in the handshake (window_scale_source).
        StructField("is_window_full", BooleanType(), False),
        StructField("is_retransmission", BooleanType(), False),  # payload bytes already seen
        StructField("retransmitted_bytes", LongType(), False),
        # The sender sent new payload while the peer's last advertised window was 0 (a zero-window probe).
        StructField("is_zero_window_probe", BooleanType(), False),
        # Appended: a TCP keep-alive (RFC 9293 3.8.4): no new data, seq one below the next byte to
        # send; a keep-alive into a zero window is not a zero-window probe.
        StructField("is_keep_alive", BooleanType(), False),
        # Appended: a retransmission of bytes the receiver already had: acknowledged before it was
        # sent (Wireshark's tcp.analysis.spurious_retransmission), or named by the receiver's next
        # D-SACK (RFC 2883). Not a loss.
        StructField("is_spurious_retransmission", BooleanType(), False),
        # Appended: the acknowledgement this segment carries (tcp_segments.ack_offset).
        StructField("ack_offset", LongType(), True),
        # Appended: the shift applied to this segment's window (effective_window): from the
        # handshake (tcp_segments.window_scale), else the least shift consistent with the bytes the
        # peer had in flight (RFC 7323 2, RFC 9293 3.8.6; pipelines/tcp_flow.py), else 0.
        StructField("window_scale", IntegerType(), True),
        # Appended: how that shift was known: "handshake" (both SYNs captured), "inferred" (a lower
        # bound from the traffic: the window is a lower bound too) or "unknown" (nothing proves a
        # shift: the raw window, a lower bound).
        StructField("window_scale_source", StringType(), True),
    ]
)
