"""The tcp_segments rows of the capture decoder: offsets, window scaling, retransmissions, holding.

Synthetic captures built with Scapy (hand-built AMQP bytes, handshakes with and without the
window scale option); no Spark.
"""

from __future__ import annotations

from pathlib import Path

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.packets import parse_tcp
from tests import amqp_bytes as b

CLIENT, SERVER = ("10.0.0.1", 40000), ("10.0.0.2", 5672)
ISN_C, ISN_S = 2**32 - 3, 7000  # the client's sequence numbers wrap right after its SYN
C2S = b.HEADER_091 + b.basic_qos(2)
S2C = b.basic_deliver(1) + b.content_header(5) + b.frame091(3, 1, b"hello")


def c2s(flags: str, seq: int, ack: int = 0, window: int = 100, payload: bytes = b"", options=()):
    return (
        Ether()
        / IP(src=CLIENT[0], dst=SERVER[0])
        / TCP(
            sport=CLIENT[1],
            dport=SERVER[1],
            flags=flags,
            seq=seq % 2**32,
            ack=ack % 2**32,
            window=window,
            options=list(options),
        )
        / payload
    )


def s2c(flags: str, seq: int, ack: int = 0, window: int = 100, payload: bytes = b"", options=()):
    return (
        Ether()
        / IP(src=SERVER[0], dst=CLIENT[0])
        / TCP(
            sport=SERVER[1],
            dport=CLIENT[1],
            flags=flags,
            seq=seq % 2**32,
            ack=ack % 2**32,
            window=window,
            options=list(options),
        )
        / payload
    )


def segment_rows(tmp_path: Path, packets, name: str = "t.pcap") -> list[dict]:
    path = tmp_path / name
    wrpcap(str(path), packets)
    return [row for kind, row in decode_capture(path, "cap", segments=True) if kind == "tcp_segments"]


def conversation(client_scale: int | None = 7, server_scale: int | None = 2) -> list:
    """Handshake (with the given window scale options), data both ways, a zero window, a retransmission."""
    c, s = ISN_C + 1, ISN_S + 1
    opt_c = [("MSS", 1460)] + ([("NOP", None), ("WScale", client_scale)] if client_scale is not None else [])
    opt_s = [("MSS", 1460)] + ([("NOP", None), ("WScale", server_scale)] if server_scale is not None else [])
    return [
        c2s("S", ISN_C, window=64240, options=opt_c),
        s2c("SA", ISN_S, ack=c, window=65160, options=opt_s),
        c2s("A", c, ack=s, window=502),
        c2s("PA", c, ack=s, window=502, payload=C2S[:10]),
        s2c("A", s, ack=c + 10, window=0),  # the server's receive window is closed
        c2s("PA", c, ack=s, window=502, payload=C2S[:10]),  # retransmission of the first 10 bytes
        s2c("PA", s, ack=c + 10, window=300, payload=S2C),  # window update with data
        c2s("PA", c + 6, ack=s + len(S2C), window=502, payload=C2S[6:]),  # overlaps 4 bytes already sent
    ]


def test_segments_carry_offsets_scaled_windows_and_retransmitted_bytes(tmp_path):
    rows = segment_rows(tmp_path, conversation())
    essence = [
        (
            r["direction"],
            r["packet_number"],
            r["seq_offset"],
            r["ack_offset"],
            r["flags"],
            r["window"],
            r["window_scale"],
            r["effective_window"],
            r["payload_length"],
            r["retransmitted_bytes"],
        )
        for r in rows
    ]
    assert essence == [
        ("c2s", 1, 0, None, 0x02, 64240, 0, 64240, 0, 0),  # a SYN's window is never scaled
        ("s2c", 2, 0, 0, 0x12, 65160, 0, 65160, 0, 0),
        ("c2s", 3, 0, 0, 0x10, 502, 7, 502 << 7, 0, 0),
        ("c2s", 4, 0, 0, 0x18, 502, 7, 502 << 7, 10, 0),
        ("s2c", 5, 0, 10, 0x10, 0, 2, 0, 0, 0),
        ("c2s", 6, 0, 0, 0x18, 502, 7, 502 << 7, 10, 10),
        ("s2c", 7, 0, 10, 0x18, 300, 2, 1200, len(S2C), 0),
        ("c2s", 8, 6, len(S2C), 0x18, 502, 7, 502 << 7, len(C2S) - 6, 4),
    ]
    assert {r["connection_id"] for r in rows} == {"10.0.0.1:40000-10.0.0.2:5672"}
    assert [r["ts_us"] for r in rows] == sorted(r["ts_us"] for r in rows)


def test_window_scaling_needs_both_syns(tmp_path):
    rows = segment_rows(tmp_path, conversation(client_scale=7, server_scale=None))
    after_handshake = [r for r in rows if r["packet_number"] > 2]
    assert {(r["window_scale"], r["effective_window"] == r["window"]) for r in after_handshake} == {(0, True)}


def test_without_the_handshake_the_scale_is_unknown_and_offsets_start_at_the_first_byte(tmp_path):
    rows = segment_rows(tmp_path, conversation()[2:])
    assert [r["window_scale"] for r in rows] == [None] * 6
    assert [r["effective_window"] for r in rows] == [r["window"] for r in rows]  # a lower bound, unscaled
    # Each stream's origin is its first payload byte; until then offsets in it are unknown.
    assert [(r["seq_offset"], r["ack_offset"]) for r in rows] == [
        (None, None),
        (0, None),
        (None, 10),
        (0, None),
        (0, 10),
        (6, len(S2C)),
    ]


def test_segments_are_held_until_the_connection_is_amqp_and_dropped_otherwise(tmp_path):
    amqp = conversation()
    other = [  # a TLS-looking stream on the AMQP port: not decoded, so no segments either
        Ether() / IP(src="10.0.0.3", dst=SERVER[0]) / TCP(sport=41000, dport=SERVER[1], flags="S", seq=1),
        Ether()
        / IP(src="10.0.0.3", dst=SERVER[0])
        / TCP(sport=41000, dport=SERVER[1], flags="PA", seq=2)
        / (b"\x16\x03\x01" + bytes(80)),
    ]
    rows = segment_rows(tmp_path, [*amqp[:3], *other, *amqp[3:]])
    assert [r["packet_number"] for r in rows] == [1, 2, 3, 6, 7, 8, 9, 10]  # the first three were held
    assert {r["connection_id"] for r in rows} == {"10.0.0.1:40000-10.0.0.2:5672"}


def test_segment_rows_only_on_request(tmp_path):
    path = tmp_path / "t.pcap"
    wrpcap(str(path), conversation())
    assert "tcp_segments" not in {kind for kind, _row in decode_capture(path, "cap")}


def test_window_scale_option_is_read_from_syns_only():
    syn = bytes(c2s("S", 1, options=[("NOP", None), ("WScale", 20)]))
    data = bytes(c2s("PA", 2, options=[("NOP", None), ("WScale", 5)], payload=b"x"))
    assert parse_tcp(1, syn, len(syn)).window_scale == 14  # RFC 7323 2.3: at most 14
    assert parse_tcp(1, data, len(data)).window_scale is None
    bare = bytes(c2s("S", 1))
    assert parse_tcp(1, bare, len(bare)).window_scale is None


def test_a_dsack_is_read_as_stream_offsets_of_the_range_received_twice(tmp_path):
    """RFC 2883: a SACK block below the cumulative acknowledgement (or inside the second block)
    reports bytes received twice; an ordinary SACK block above it does not."""
    c, s = ISN_C + 1, ISN_S + 1
    packets = [
        c2s("S", ISN_C, window=64240),
        s2c("SA", ISN_S, ack=c, window=65160),
        c2s("A", c, ack=s, window=502),
        c2s("PA", c, ack=s, window=502, payload=C2S[:10]),
        c2s("PA", c, ack=s, window=502, payload=C2S[:10]),  # sent again: the server had it
        s2c(
            "A",
            s,
            ack=c + 10,
            window=300,
            options=[("NOP", None), ("NOP", None), ("SAck", ((c + 0) % 2**32, (c + 10) % 2**32))],
        ),
        s2c(
            "A",
            s,
            ack=c + 10,
            window=300,
            options=[("NOP", None), ("NOP", None), ("SAck", ((c + 20) % 2**32, (c + 30) % 2**32))],
        ),
        # First block inside the second: also a D-SACK.
        s2c(
            "A",
            s,
            ack=c + 10,
            window=300,
            options=[
                ("NOP", None),
                ("NOP", None),
                ("SAck", ((c + 22) % 2**32, (c + 24) % 2**32, (c + 20) % 2**32, (c + 30) % 2**32)),
            ],
        ),
    ]
    rows = segment_rows(tmp_path, packets)
    assert [(r["dsack_left_offset"], r["dsack_right_offset"]) for r in rows if r["direction"] == "s2c"] == [
        (None, None),
        (0, 10),
        (None, None),
        (22, 24),
    ]
    assert {(r["dsack_left_offset"], r["dsack_right_offset"]) for r in rows if r["direction"] == "c2s"} == {
        (None, None)
    }
    raw = bytes(packets[5])
    assert parse_tcp(1, raw, len(raw)).dsack == (c % 2**32, (c + 10) % 2**32)
