"""Whole-capture decoding on synthetic pcaps: TCP reassembly, connection tracking, byte accounting.

The packets are built with Scapy from hand-built AMQP bytes, then cut, reordered and duplicated
the way loopback captures really are.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import RawPcapNgReader, RawPcapReader, wrpcap

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.capture import C2S, S2C, decode_capture, direction_payloads
from amqpscope.ingest.framing import FrameSplitter
from amqpscope.ingest.messages import stream_decoder
from amqpscope.ingest.pcap import CaptureError, read_records
from amqpscope.ingest.rows import frame_row
from amqpscope.ingest.tcp import SEQ_MOD, unwrap
from tests import amqp_bytes as b

SAMPLES = Path(__file__).resolve().parent.parent / "samples"

# Explicit addresses: a bare Ether() makes Scapy resolve the destination MAC (ARP, with timeouts).
ETHER = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")

CLIENT, SERVER = ("10.0.0.1", 40000), ("10.0.0.2", 5672)


def segments(stream: bytes, size: int) -> list[tuple[int, bytes]]:
    return [(i, stream[i : i + size]) for i in range(0, len(stream), size)]


def packets(c2s: list[tuple[int, bytes]], s2c: list[tuple[int, bytes]], isn_c=1000, isn_s=5000, syn=True):
    """Ethernet/IPv4/TCP packets: handshake, then c2s and s2c segments interleaved in the given order."""
    ip_c = ETHER / IP(src=CLIENT[0], dst=SERVER[0])
    ip_s = ETHER / IP(src=SERVER[0], dst=CLIENT[0])
    out = []
    if syn:
        out += [
            ip_c / TCP(sport=CLIENT[1], dport=SERVER[1], flags="S", seq=isn_c),
            ip_s / TCP(sport=SERVER[1], dport=CLIENT[1], flags="SA", seq=isn_s, ack=isn_c + 1),
        ]
    for i in range(max(len(c2s), len(s2c))):
        if i < len(c2s):
            off, data = c2s[i]
            out.append(ip_c / TCP(sport=CLIENT[1], dport=SERVER[1], flags="PA", seq=(isn_c + 1 + off) % 2**32) / data)
        if i < len(s2c):
            off, data = s2c[i]
            out.append(ip_s / TCP(sport=SERVER[1], dport=CLIENT[1], flags="PA", seq=(isn_s + 1 + off) % 2**32) / data)
    return out


def decode(tmp_path: Path, pkts) -> dict[str, list[dict]]:
    path = tmp_path / "t.pcap"
    wrpcap(str(path), pkts)
    out: dict[str, list[dict]] = {"frames": [], "connections": [], "quarantine": [], "captures": []}
    for kind, row in decode_capture(path, "cap"):
        out[kind].append(row)
    return out


C2S_091 = b.HEADER_091 + b.basic_qos(2) + b.basic_ack(1) + b.basic_ack(2, multiple=True)
S2C_091 = b.basic_deliver(1) + b.content_header(5) + b.frame091(3, 1, b"hello") + b.basic_deliver(2) + b.HEARTBEAT_091


def test_in_order_stream_decodes_every_frame(tmp_path):
    out = decode(tmp_path, packets(segments(C2S_091, 1000), segments(S2C_091, 1000)))
    methods = [(f["direction"], f["frame_type"], f["method"]) for f in out["frames"]]
    # One packet a direction, client first: frames are ordered by the packet completing them.
    assert methods == [
        ("c2s", "protocol-header", "amqp-0-9-1"),
        ("c2s", "method", "basic.qos"),
        ("c2s", "method", "basic.ack"),
        ("c2s", "method", "basic.ack"),
        ("s2c", "method", "basic.deliver"),
        ("s2c", "header", "basic.header"),
        ("s2c", "body", None),
        ("s2c", "method", "basic.deliver"),
        ("s2c", "heartbeat", None),
    ]
    assert [f["frame_index"] for f in out["frames"]] == list(range(9))
    [conn] = out["connections"]
    assert conn["connection_id"] == "10.0.0.1:40000-10.0.0.2:5672"
    assert (conn["protocol"], conn["protocol_inferred"]) == ("amqp-0-9-1", False)
    assert (conn["c2s_bytes"], conn["s2c_bytes"]) == (len(C2S_091), len(S2C_091))
    assert out["quarantine"] == []
    acks = [f for f in out["frames"] if f["method"] == "basic.ack"]
    assert [(a["delivery_tag"], a["multiple"]) for a in acks] == [(1, False), (2, True)]


def test_reordered_and_duplicated_segments_give_the_same_frames(tmp_path):
    clean = decode(tmp_path, packets(segments(C2S_091, 7), segments(S2C_091, 7)))
    c2s = segments(C2S_091, 7)
    s2c = segments(S2C_091, 7)
    # Swap neighbours, and retransmit every third segment (overlapping by a shifted window too).
    c2s_messy = [seg for i in range(0, len(c2s) - 1, 2) for seg in (c2s[i + 1], c2s[i])] + c2s[len(c2s) // 2 * 2 :]
    c2s_messy += [c2s[i] for i in range(0, len(c2s), 3)]
    s2c_messy = s2c[::-1] + [(o + 3, S2C_091[o + 3 : o + 12]) for o, _ in s2c[:-2]]
    messy = decode(tmp_path, packets(c2s_messy, s2c_messy))

    def essence(rows):
        return sorted((f["direction"], f["stream_offset"], f["frame_size"], f["method"]) for f in rows)

    assert essence(messy["frames"]) == essence(clean["frames"])
    assert messy["quarantine"] == []
    [conn] = messy["connections"]
    assert (conn["c2s_bytes"], conn["s2c_bytes"]) == (len(C2S_091), len(S2C_091))
    assert conn["retransmitted_bytes"] > 0


def test_sequence_numbers_wrap_around(tmp_path):
    clean = decode(tmp_path, packets(segments(C2S_091, 5), segments(S2C_091, 5)))
    wrapped = decode(tmp_path, packets(segments(C2S_091, 5), segments(S2C_091, 5), isn_c=2**32 - 20, isn_s=2**32 - 3))
    assert [(f["stream_offset"], f["method"]) for f in wrapped["frames"]] == [
        (f["stream_offset"], f["method"]) for f in clean["frames"]
    ]


def test_unwrap_picks_the_nearest_offset():
    rng = random.Random(3)
    nears = [0, 1, SEQ_MOD // 2, SEQ_MOD - 1, SEQ_MOD, 3 * SEQ_MOD + 5, *(rng.randrange(1 << 40) for _ in range(300))]
    for near in nears:
        for relative in [
            0,
            1,
            (near + SEQ_MOD // 2) % SEQ_MOD,
            (near - SEQ_MOD // 2) % SEQ_MOD,
            SEQ_MOD - 1,
            *(rng.randrange(SEQ_MOD) for _ in range(20)),
        ]:
            # By definition: of the non-negative offsets with these low 32 bits, the nearest (the lower on a tie).
            base = near - near % SEQ_MOD
            candidates = [c for c in (base + relative - SEQ_MOD, base + relative, base + relative + SEQ_MOD) if c >= 0]
            assert unwrap(relative, near) == min(candidates, key=lambda c: (abs(c - near), c)), (relative, near)


def test_lost_segment_is_a_gap_and_decoding_resumes(tmp_path):
    s2c = segments(S2C_091, 10)
    lost = s2c[3]
    out = decode(tmp_path, packets(segments(C2S_091, 1000), s2c[:3] + s2c[4:]))
    missing = [q for q in out["quarantine"] if q["missing"]]
    assert [(q["stream_offset"], q["byte_count"]) for q in missing] == [(lost[0], len(lost[1]))]
    [conn] = out["connections"]
    s2c_frames = [f for f in out["frames"] if f["direction"] == "s2c"]
    undecoded = sum(q["byte_count"] for q in out["quarantine"] if q["direction"] == "s2c" and not q["missing"])
    # Byte accounting: every byte seen is in a frame or in the quarantine; the rest is the gap.
    assert sum(f["frame_size"] for f in s2c_frames) + undecoded == conn["s2c_bytes"]
    assert conn["s2c_missing_bytes"] == len(lost[1])
    # The frames after the damaged one still decode.
    assert s2c_frames[-1]["frame_type"] == "heartbeat"


def test_amqp10_connection_with_sasl(tmp_path):
    c2s = (
        b.HEADER_10_SASL
        + b.sasl_init("PLAIN", b"\x00guest\x00s3cret")
        + b.HEADER_10
        + b.attach("l", 0, False, "/queue/q", 0)
        + b.transfer(0, 0, b"t", b"x")
    )
    s2c = b.HEADER_10_SASL + b.HEADER_10 + b.flow(0, 0, 5) + b.EMPTY_10
    out = decode(tmp_path, packets(segments(c2s, 16), segments(s2c, 16)))
    kinds = Counter((f["direction"], f["frame_type"], f["method"]) for f in out["frames"])
    assert kinds == Counter(
        {
            ("c2s", "protocol-header", "sasl"): 1,
            ("c2s", "sasl", "sasl-init"): 1,
            ("c2s", "protocol-header", "amqp"): 1,
            ("c2s", "amqp", "attach"): 1,
            ("c2s", "amqp", "transfer"): 1,
            ("s2c", "protocol-header", "sasl"): 1,
            ("s2c", "protocol-header", "amqp"): 1,
            ("s2c", "amqp", "flow"): 1,
            ("s2c", "empty", None): 1,
        }
    )
    assert all("s3cret" not in repr(f) for f in out["frames"])
    [init] = [f for f in out["frames"] if f["method"] == "sasl-init"]
    assert init["mechanism"] == "PLAIN"


def test_mid_stream_pickup_infers_the_protocol(tmp_path):
    # The capture starts after the handshake and the protocol header, inside the stream.
    s2c = b.basic_deliver(1) + b.basic_deliver(2) + b.HEARTBEAT_091
    c2s = b.basic_ack(1) + b.basic_ack(2)
    out = decode(tmp_path, packets(segments(c2s, 1000), segments(s2c, 1000), syn=False))
    [conn] = out["connections"]
    assert (conn["protocol"], conn["protocol_inferred"]) == ("amqp-0-9-1", True)
    assert [f["method"] for f in out["frames"] if f["direction"] == "s2c"] == ["basic.deliver", "basic.deliver", None]


def test_not_a_capture_file_names_the_file(tmp_path):
    bogus = tmp_path / "notes.pcap"
    bogus.write_bytes(b"this is not a capture file at all")
    with pytest.raises(CaptureError) as err:
        list(decode_capture(bogus, "x"))
    assert "notes.pcap" in str(err.value) and "file header" in str(err.value)


def scapy_records(path: Path) -> list[tuple[int, int, bytes, int]]:
    """(ts_us, linktype, data, wirelen) of every record as Scapy's raw readers read them."""
    out = []
    with RawPcapReader(str(path)) as reader:
        for data, meta in reader:
            if isinstance(reader, RawPcapNgReader):
                ts, linktype = ((meta.tshigh << 32) | meta.tslow) * 1_000_000 // meta.tsresol, meta.linktype
            else:
                ts = meta.sec * 1_000_000 + meta.usec // (1000 if reader.nano else 1)
                linktype = reader.linktype
            out.append((ts, linktype, data, meta.wirelen))
    return out


@pytest.mark.parametrize("name", ["amqp091-qos-confirms.pcap", "decoders/amqp10-large.pcap", "mixed.pcapng"])
def test_records_read_as_scapy_reads_them(name):
    path = SAMPLES / name
    records = list(read_records(path))
    assert [r.number for r in records] == list(range(1, len(records) + 1))
    assert [(r.ts_us, r.linktype, r.data, r.wirelen) for r in records] == scapy_records(path)


def test_concatenated_pcapng_sections_are_read_through(tmp_path):
    """``cat a.pcapng b.pcapng`` is one file of two sections, each with its own interfaces."""
    joined = tmp_path / "joined.pcapng"
    joined.write_bytes((SAMPLES / "mixed.pcapng").read_bytes() * 2)
    records = [(r.ts_us, r.linktype, r.data, r.wirelen) for r in read_records(joined)]
    assert records == scapy_records(joined)
    assert records[: len(records) // 2] == records[len(records) // 2 :]


# Over TLS a frame's offsets count decrypted bytes, not the TCP stream's this test cuts frames from
# (tests/test_tls.py checks TLS frames against the plain frames they carry).
@pytest.mark.parametrize(
    "sample", sorted(p for p in SAMPLES.rglob("*.pcap*") if p.parent.name != "tls"), ids=lambda p: p.name
)
def test_frames_rows_are_frame_row_of_the_decoded_frames(sample):
    """``CaptureDecoder`` builds rows inline for speed; they must be ``rows.frame_row`` of the decoders' output."""

    rows = [row for kind, row in decode_capture(sample, "c") if kind == "frames"]
    by_direction: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        by_direction.setdefault((row["connection_id"], row["direction"]), []).append(row)
    formats = {amqp091.PROTOCOL: amqp091.Amqp091Format(), amqp10.PROTOCOL: amqp10.Amqp10Format()}
    checked = 0
    for direction_rows in by_direction.values():
        protocol = direction_rows[0]["protocol"]
        # The direction's framed bytes, in order (a sample has no gaps), split and decoded again.
        splitter, decode = FrameSplitter(formats[protocol]), stream_decoder(protocol)
        stream = b"".join(_frame_bytes(sample, row) for row in direction_rows)
        for row, raw in zip(direction_rows, splitter.feed(stream, 0, 0), strict=True):
            if raw.is_protocol_header:
                continue
            key = {
                k: row[k]
                for k in (
                    "capture_id",
                    "connection_id",
                    "direction",
                    "frame_index",
                    "ts",
                    "ts_us",
                    "packet_number",
                    "stream_offset",
                    "frame_size",
                )
            }
            assert frame_row(protocol, decode(raw.data), key) == row
            checked += 1
    assert checked > 0


_STREAMS: dict[Path, dict[tuple[str, str], bytes]] = {}


def _frame_bytes(sample: Path, row: dict) -> bytes:
    """The bytes of a frames row, cut from its direction's reassembled stream."""
    if sample not in _STREAMS:
        chunks = direction_payloads(sample)
        streams = {}
        for (src, sport, dst, dport), parts in chunks.items():
            client_first = dport == 5672
            connection = f"{src}:{sport}-{dst}:{dport}" if client_first else f"{dst}:{dport}-{src}:{sport}"
            streams[connection, C2S if client_first else S2C] = b"".join(parts)
        _STREAMS[sample] = streams
    stream = _STREAMS[sample][row["connection_id"], row["direction"]]
    return stream[row["stream_offset"] : row["stream_offset"] + row["frame_size"]]
