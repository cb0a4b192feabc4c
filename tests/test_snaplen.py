"""Packets cut short by the snapshot length: the bytes on the wire past the cut are a gap at once.

Real captures are cut the way ``tcpdump -s`` / ``editcap -s`` cut them (each record keeps its wire
length, its data stops at the snapshot length); the payload lengths expected on the wire come from
Scapy's dissection of the uncut packets, not from ``ingest.packets``.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.testing import assertDataFrameEqual
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.packets import parse_tcp
from amqpscope.ingest.pcap import Record, read_records
from amqpscope.ingest.tcp import Data, DirectionStream, Gap
from amqpscope.jobs.stages.decode import decode_tables, resolve_captures
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from tests.test_damaged_captures import assert_accounted, decode, write_pcap
from tests.test_parallel_ingest import as_python

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CAPTURES = [
    SAMPLES / "amqp091-qos-confirms.pcap",
    SAMPLES / "amqp10-credit.pcap",
    SAMPLES / "decoders" / "amqp091-methods.pcap",
    SAMPLES / "decoders" / "amqp10-large.pcap",
]


def cut(records: list[Record], snaplen: int) -> list[Record]:
    """What a capture with this snapshot length holds: each packet's first ``snaplen`` bytes."""
    return [Record(r.number, r.ts_us, r.linktype, r.data[:snaplen], r.wirelen) for r in records]


def lost_payload(records: list[Record], snaplen: int) -> dict[int, int]:
    """Packet number -> TCP payload bytes the cut leaves out, from Scapy's dissection of the whole packet."""
    lost = {}
    for r in records:
        packet = Ether(r.data)
        if TCP not in packet:
            continue
        ip, tcp = packet[IP], packet[TCP]
        # Link header + IP + TCP headers. Offsets from the headers' own fields: the length of what
        # Scapy dissected after them depends on which layers are bound (ingest.scapy_layers binds AMQP).
        header_end = len(packet) - len(packet.payload) + ip.ihl * 4 + tcp.dataofs * 4
        wire = ip.len - ip.ihl * 4 - tcp.dataofs * 4
        captured = max(0, min(snaplen, len(r.data)) - header_end)
        if wire > captured:
            lost[r.number] = wire - captured
    return lost


def gap_ranges(out: dict[str, list[dict]]) -> dict[tuple[str, str], list[tuple[int, int]]]:
    ranges = defaultdict(list)
    for q in out["quarantine"]:
        if q["missing"]:
            start = q["stream_offset"]
            ranges[q["connection_id"], q["direction"]].append((start, start + q["byte_count"]))
    return ranges


def assert_cut_decoded(clean: dict[str, list[dict]], out: dict[str, list[dict]], lost: dict[int, int]) -> None:
    """The gaps are the cut-off bytes at their packets, the surviving frames are the clean ones,
    and every byte on the wire is framed, quarantined or missing."""
    missing = [q for q in out["quarantine"] if q["missing"]]
    assert sorted((q["packet_number"], q["byte_count"]) for q in missing) == sorted(lost.items())
    assert_accounted(out)
    clean_bytes = {(c["connection_id"], d): c[f"{d}_bytes"] for c in clean["connections"] for d in ("c2s", "s2c")}
    for c in out["connections"]:
        for d in ("c2s", "s2c"):
            assert c[f"{d}_bytes"] + c[f"{d}_missing_bytes"] == clean_bytes[c["connection_id"], d]
    # Frames clear of every gap are decoded exactly as without the cut: same packet, same fields
    # (only their index in the connection moves, since fewer frames come before them).
    gaps = gap_ranges(out)

    def intact(f: dict) -> bool:
        end = f["stream_offset"] + f["frame_size"]
        return not any(a < end and f["stream_offset"] < b for a, b in gaps[f["connection_id"], f["direction"]])

    def fields(frames: list[dict]) -> list[dict]:
        return [{k: v for k, v in f.items() if k != "frame_index"} for f in frames]

    surviving = [f for f in clean["frames"] if intact(f)]
    assert fields(out["frames"]) == fields(surviving)
    assert 0 < len(surviving) < len(clean["frames"])


@pytest.fixture(scope="module", params=CAPTURES, ids=lambda p: p.name)
def capture(request) -> tuple[list[Record], dict[str, list[dict]]]:
    records = list(read_records(request.param))
    clean = decode(request.param)
    assert not any(q["missing"] for q in clean["quarantine"])
    return records, clean


@pytest.mark.parametrize("snaplen", [96, 200])
def test_bytes_past_the_snapshot_length_are_gaps_at_their_packets(tmp_path, capture, snaplen):
    records, clean = capture
    lost = lost_payload(records, snaplen)
    assert lost  # the cut does cut payload
    out = decode(write_pcap(tmp_path / "cut.pcap", cut(records, snaplen)))
    assert_cut_decoded(clean, out, lost)


def test_a_cut_inside_the_tcp_options_loses_the_whole_payload(tmp_path):
    # 14 + 20 + 20 bytes: the loopback segments' timestamp option and every payload byte are cut.
    records = list(read_records(CAPTURES[0]))
    clean = decode(CAPTURES[0])
    out = decode(write_pcap(tmp_path / "cut.pcap", cut(records, 54)))
    assert out["frames"] == []
    # Without a byte of it, nothing says the connection is AMQP; on the AMQP port, it is accounted.
    [conn] = out["connections"]
    assert (conn["protocol"], conn["c2s_bytes"], conn["s2c_bytes"]) == ("not-amqp", 0, 0)
    [whole] = clean["connections"]
    assert (conn["c2s_missing_bytes"], conn["s2c_missing_bytes"]) == (whole["c2s_bytes"], whole["s2c_bytes"])
    assert sorted((q["direction"], q["byte_count"], q["missing"]) for q in out["quarantine"]) == [
        ("c2s", whole["c2s_bytes"], True),
        ("s2c", whole["s2c_bytes"], True),
    ]


def test_a_cut_before_the_protocol_is_known_is_counted_once(tmp_path):
    """TLS on the AMQP port whose first record is cut: classified after the gap, each byte in one run.

    The TLS stage cannot decrypt a record cut by the capture, nor find where the next one starts in
    the 100 bytes after the gap (no plausible record header there): both are its segment_missing."""
    ether = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    ip_c, ip_s = ether / IP(src="10.1.0.1", dst="10.1.0.2"), ether / IP(src="10.1.0.2", dst="10.1.0.1")
    hello = bytes([0x16, 0x03, 0x01, 0x01, 0x27]) + bytes(0x127)
    packets = [
        ip_c / TCP(sport=50000, dport=5672, flags="S", seq=0),
        ip_s / TCP(sport=5672, dport=50000, flags="SA", seq=0, ack=1),
        ip_c / TCP(sport=50000, dport=5672, flags="PA", seq=1) / hello,
        ip_c / TCP(sport=50000, dport=5672, flags="PA", seq=1 + len(hello)) / bytes(100),
    ]
    records = [Record(n, n, 1, bytes(p), len(p)) for n, p in enumerate(packets, 1)]
    records[2] = Record(3, 3, 1, records[2].data[: 54 + 30], records[2].wirelen)  # 30 payload bytes kept
    out = decode(write_pcap(tmp_path / "cut.pcap", records))
    [conn] = out["connections"]
    assert (conn["protocol"], conn["c2s_bytes"], conn["c2s_missing_bytes"]) == ("tls", 130, len(hello) - 30)
    cut = "part of a TLS record missing from the capture: the record cannot be decrypted"
    assert sorted((q["stream_offset"], q["byte_count"], q["missing"], q["reason"]) for q in out["quarantine"]) == [
        (0, 30, False, cut),
        (30, len(hello) - 30, True, "capture gap: bytes missing from the capture"),
        (len(hello), 100, False, cut),
    ]


@pytest.mark.tshark
@pytest.mark.skipif(shutil.which("editcap") is None, reason="editcap (Wireshark) not installed")
def test_editcap_snapshot_length_on_pcapng(tmp_path):
    """The same with Wireshark's own cutter, on the pcapng sample with two connections."""
    whole = SAMPLES / "mixed.pcapng"
    cut_file = tmp_path / "cut.pcapng"
    subprocess.run(["editcap", "-s", "150", str(whole), str(cut_file)], check=True, capture_output=True)
    records = list(read_records(whole))
    assert [r.data[:150] for r in records] == [r.data for r in read_records(cut_file)]
    assert_cut_decoded(decode(whole), decode(cut_file), lost_payload(records, 150))


# --- the reassembler on its own ---------------------------------------------------------------


def test_cut_segment_in_order_is_data_then_gap():
    stream = DirectionStream(isn=1000)
    assert list(stream.segment(1000, b"abc", 7, 70, missing=5)) == [Data(0, b"abc", 7, 70), Gap(3, 5, 7)]
    assert list(stream.segment(1008, b"next", 8, 80)) == [Data(8, b"next", 8, 80)]
    assert stream.next_offset == 12


def test_cut_segment_out_of_order_gaps_once_the_hole_before_it_fills():
    stream = DirectionStream(isn=0)
    assert list(stream.segment(10, b"xyz", 2, 20, missing=4)) == []
    filled = [Data(0, bytes(10), 3, 30), Data(10, b"xyz", 3, 30), Gap(13, 4, 2)]
    assert list(stream.segment(0, bytes(10), 3, 30)) == filled
    assert list(stream.finish(9)) == []


def test_captured_bytes_win_over_a_cut_range_they_fall_in():
    stream = DirectionStream(isn=0)
    assert list(stream.segment(5, b"12345", 1, 10)) == []  # held: offsets 0-4 not seen yet
    # A segment of 10 bytes on the wire, 2 captured: bytes 5-9 were captured in the other one.
    events = [Data(0, b"ab", 2, 20), Gap(2, 3, 2), Data(5, b"12345", 2, 20)]
    assert list(stream.segment(0, b"ab", 2, 20, missing=8)) == events
    assert stream.next_offset == 10


def test_nothing_captured_past_the_headers_is_all_gap():
    stream = DirectionStream(isn=0)
    assert list(stream.segment(0, b"", 4, 40, missing=6)) == [Gap(0, 6, 4)]
    # A retransmission cut the same way, and one of bytes already delivered: nothing new.
    assert list(stream.segment(0, b"", 5, 50, missing=6)) == []
    assert list(stream.segment(0, b"abc", 6, 60, missing=3)) == []
    assert stream.retransmitted_bytes == 3


def test_finish_declares_a_cut_range_beyond_a_hole():
    stream = DirectionStream(isn=0)
    assert list(stream.segment(10, b"", 3, 30, missing=5)) == []
    assert list(stream.finish(9)) == [Gap(0, 10, 9), Gap(10, 5, 3)]


def test_parallel_ingest_of_a_cut_capture_equals_one_pass(spark, tmp_path):
    """The Spark ingest (byte ranges, shuffle by connection) finds the same gaps at the same packets."""
    path = write_pcap(tmp_path / "cut.pcap", cut(list(read_records(CAPTURES[0])), 120))
    [capture] = resolve_captures([path])
    one_pass = defaultdict(list)
    for kind, row in decode_capture(path, capture.capture_id, segments=True):
        one_pass[kind].append(row)
    assert any(q["missing"] for q in one_pass["quarantine"])
    tables, persisted = decode_tables(spark, [capture], (5672,), range_bytes=16_384, connection_partitions=3)
    try:
        for kind in ("frames", "connections", "quarantine", "tcp_segments"):
            schema = BRONZE_SCHEMAS[kind]
            expected = spark.createDataFrame([as_python(r, schema) for r in one_pass[kind]], schema)
            assertDataFrameEqual(tables[kind], expected)
    finally:
        for df in persisted:
            df.unpersist()


# --- payload lengths on the wire --------------------------------------------------------------


def test_payload_length_on_the_wire_comes_from_the_ip_header():
    ether = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    v4 = bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=5672, flags="PA") / bytes(range(100)))
    v6 = bytes(ether / IPv6(src="2001:db8::1", dst="2001:db8::2") / TCP(sport=1, dport=5672, flags="PA") / bytes(100))
    for frame in (v4, v6):
        header = len(frame) - 100
        seg = parse_tcp(1, frame[: header + 30], len(frame))  # cut 30 bytes into the payload
        assert (len(seg.payload), seg.missing, seg.truncated) == (30, 70, True)
        seg = parse_tcp(1, frame[:header], len(frame))  # cut at the end of the headers
        assert (seg.payload, seg.missing) == (b"", 100)
    # A short frame is padded to Ethernet's 60 bytes: the padding is not payload, nor missing.
    short = bytes(ether / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=5672, flags="PA") / b"ab")
    padded = short + bytes(60 - len(short))
    assert parse_tcp(1, padded, len(padded))[8:10] == (b"ab", 0)
    # An IP total length beyond what the record says was on the wire: those bytes were never sent.
    bogus = bytearray(v4)
    bogus[16:18] = (len(v4) - 14 + 500).to_bytes(2, "big")
    assert parse_tcp(1, bytes(bogus), len(bogus))[8:10] == (bytes(range(100)), 0)


def test_segments_keep_their_wire_length_when_cut(tmp_path):
    """tcp_segments describe the wire (flow control sees every byte sent), cut or not."""
    records = list(read_records(CAPTURES[0]))

    def segments(path: Path) -> list[tuple]:
        return [
            (r["packet_number"], r["direction"], r["seq_offset"], r["payload_length"], r["retransmitted_bytes"])
            for kind, r in decode_capture(path, "c", segments=True)
            if kind == "tcp_segments"
        ]

    whole = segments(CAPTURES[0])
    assert any(length > 200 for *_, length, _ in whole)
    assert segments(write_pcap(tmp_path / "cut.pcap", cut(records, 96))) == whole
