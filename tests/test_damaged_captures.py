"""Real captures damaged by the tests: the frames are those of the undamaged decode wherever the
bytes survived, and every byte is accounted for (framed, quarantined, or missing)."""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

import pytest

from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.packets import parse_tcp
from amqpscope.ingest.pcap import Record, read_records

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SAMPLE = SAMPLES / "amqp091-qos-confirms.pcap"
SAMPLE_10 = SAMPLES / "amqp10-credit.pcap"


def write_pcap(path: Path, records: list[Record], linktype: int = 1) -> Path:
    """A little-endian microsecond pcap with exactly these records."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype))
        for r in records:
            f.write(struct.pack("<IIII", r.ts_us // 1_000_000, r.ts_us % 1_000_000, len(r.data), r.wirelen))
            f.write(r.data)
    return path


def decode(path: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for kind, row in decode_capture(path, "c"):
        out[kind].append(row)
    return out


def essence(frames: list[dict]) -> set[tuple]:
    """What a frame is, independent of which packet carried it."""
    return {
        (
            f["connection_id"],
            f["direction"],
            f["stream_offset"],
            f["frame_size"],
            f.get("method"),
            f["frame_type"],
            f.get("delivery_tag"),
            f.get("delivery_id"),
            f.get("link_credit"),
        )
        for f in frames
    }


def assert_accounted(out: dict[str, list[dict]]) -> None:
    framed: dict[tuple, int] = defaultdict(int)
    quarantined: dict[tuple, int] = defaultdict(int)
    gaps: dict[tuple, int] = defaultdict(int)
    for f in out["frames"]:
        framed[f["connection_id"], f["direction"]] += f["frame_size"]
    for q in out["quarantine"]:
        (gaps if q["missing"] else quarantined)[q["connection_id"], q["direction"]] += q["byte_count"]
    for c in out["connections"]:
        for d in ("c2s", "s2c"):
            key = (c["connection_id"], d)
            assert c[f"{d}_bytes"] == framed[key] + quarantined[key], key
            assert c[f"{d}_missing_bytes"] == gaps[key], key


@pytest.fixture(scope="module", params=[SAMPLE, SAMPLE_10], ids=lambda p: p.name)
def sample(request) -> tuple[Path, list[Record], dict]:
    records = list(read_records(request.param))
    clean = decode(request.param)
    assert clean["quarantine"] == [] and len(clean["frames"]) > 100
    return request.param, records, clean


def payload_records(records: list[Record]) -> list[int]:
    """Indexes of records that carry TCP payload."""
    return [i for i, r in enumerate(records) if (s := parse_tcp(r.linktype, r.data, r.wirelen)) and s.payload]


def test_duplicated_packets(tmp_path, sample):
    _path, records, clean = sample
    damaged = [r for i, r in enumerate(records) for _ in range(2 if i % 4 == 0 else 1)]
    out = decode(write_pcap(tmp_path / "dup.pcap", damaged))
    assert essence(out["frames"]) == essence(clean["frames"])
    assert out["quarantine"] == []
    assert_accounted(out)
    assert sum(c["retransmitted_bytes"] for c in out["connections"]) > 0


def test_reordered_packets(tmp_path, sample):
    _path, records, clean = sample
    damaged = list(records)
    for i in range(3, len(damaged) - 1, 5):
        damaged[i], damaged[i + 1] = damaged[i + 1], damaged[i]
    out = decode(write_pcap(tmp_path / "reorder.pcap", damaged))
    assert essence(out["frames"]) == essence(clean["frames"])
    assert_accounted(out)


def test_dropped_packet_becomes_a_gap(tmp_path, sample):
    _path, records, clean = sample
    victim = payload_records(records)[len(payload_records(records)) // 2]
    lost = parse_tcp(records[victim].linktype, records[victim].data, records[victim].wirelen)
    out = decode(write_pcap(tmp_path / "drop.pcap", records[:victim] + records[victim + 1 :]))
    [gap] = [q for q in out["quarantine"] if q["missing"]]
    assert gap["byte_count"] == len(lost.payload)
    # Every frame that did not touch the lost bytes is decoded as before.
    lost_range = (gap["stream_offset"], gap["stream_offset"] + gap["byte_count"])
    untouched = {
        f
        for f in essence(clean["frames"])
        if not (f[1] == gap["direction"] and f[2] < lost_range[1] and f[2] + f[3] > lost_range[0])
    }
    assert untouched <= essence(out["frames"])
    assert len(untouched) >= len(clean["frames"]) - 30
    assert_accounted(out)


def test_capture_started_mid_connection(tmp_path, sample):
    _path, records, clean = sample
    start = payload_records(records)[12]
    out = decode(write_pcap(tmp_path / "late.pcap", records[start:]))
    [conn] = out["connections"]
    assert conn["protocol_inferred"] is True
    assert conn["protocol"] == clean["connections"][0]["protocol"]

    # Offsets restart at the first byte seen: compare frames by what they are and carry.
    def shape(frames):
        return [
            (f["direction"], f["frame_size"], f.get("method"), f.get("delivery_tag"), f.get("delivery_id"))
            for f in frames
        ]

    late, full = shape(out["frames"]), shape(clean["frames"])
    # After resynchronising, every later frame of the conversation is decoded, in order.
    assert late == full[-len(late) :]
    assert len(late) > len(full) // 2
    assert_accounted(out)


def test_truncated_file_keeps_everything_before_the_cut(tmp_path, sample):
    path, _records, clean = sample
    data = path.read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[: len(data) * 2 // 3])
    out = decode(cut)
    kept = essence(out["frames"])
    assert kept <= essence(clean["frames"])
    assert len(kept) > len(clean["frames"]) // 3
    assert_accounted(out)
    # The unread tail, from the record the cut falls in to the end of the file, is quarantined and
    # the capture says where reading stopped, as the Spark ingest reports it.
    [damage] = [q for q in out["quarantine"] if q["connection_id"] is None]
    assert damage["stream_offset"] + damage["byte_count"] == len(data) * 2 // 3
    assert 0 < damage["byte_count"] < 70_000 and damage["missing"] is False
    assert damage["reason"].startswith(f"capture file damaged: record at byte {damage['stream_offset']}: file ends")
    [capture] = out["captures"]
    assert capture["status"] == damage["reason"].replace("capture file damaged: ", "damaged: ")


def test_any_interface_capture_in_linux_sll(tmp_path, sample):
    """``tcpdump -i any`` writes Linux cooked headers (16 bytes) instead of Ethernet (14)."""
    _path, records, clean = sample
    sll_header = struct.pack(">HHH8sH", 0, 772, 6, b"\x00" * 8, 0x0800)
    cooked = [Record(r.number, r.ts_us, 113, sll_header + r.data[14:], r.wirelen + 2) for r in records]
    out = decode(write_pcap(tmp_path / "any.pcap", cooked, linktype=113))
    assert essence(out["frames"]) == essence(clean["frames"])
    assert_accounted(out)
