"""Byte ranges on record boundaries: the union of the ranges' records is the whole capture."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import PcapNgWriter, PcapWriter

from amqpscope.ingest.pcap import CaptureError, read_records
from amqpscope.ingest.ranges import read_container, read_range, split

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
ETHER = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def synthetic(path: Path, writer, n: int = 400, nano: bool = False) -> Path:
    rng = random.Random(7)
    kwargs = {"nano": nano} if writer is PcapWriter else {}
    with writer(str(path), **kwargs) as w:
        for i in range(n):
            # Payloads that look like record headers are the hard case for boundary finding.
            payload = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 1400))) if i % 3 else b"\x00" * 64
            p = ETHER / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1234, dport=5672, seq=i) / payload
            p.time = Decimal(1_700_000_000) + Decimal(i) / 1000
            w.write(p)
    return path


def all_records(path: Path, target: int):
    c = read_container(path)
    ranges = split(path, target)
    records = [r for start, end in ranges for r in read_range(path, c, start, end)]
    return ranges, records


def expected(path: Path):
    return [(r.ts_us, r.linktype, r.data, r.wirelen) for r in read_records(path)]


@pytest.mark.parametrize("kind", ["pcap", "pcap-ns", "pcapng"])
@pytest.mark.parametrize("target", [3000, 50_000, 10**9])
def test_ranges_cover_every_record_once(tmp_path, kind, target):
    writer = PcapNgWriter if kind == "pcapng" else PcapWriter
    path = synthetic(tmp_path / f"t.{kind}", writer, nano=kind == "pcap-ns")
    ranges, records = all_records(path, target)
    assert [(r.record.ts_us, r.record.linktype, r.record.data, r.record.wirelen) for r in records] == expected(path)
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    # Ranges are contiguous and, below the file size, several.
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert (len(ranges) > 10) == (target == 3000)


@pytest.mark.parametrize("name", ["amqp091-qos-confirms.pcap", "mixed.pcapng"])
def test_real_samples_split_alike(name):
    path = SAMPLES / name
    _ranges, records = all_records(path, 20_000)
    assert [(r.record.ts_us, r.record.data) for r in records] == [(ts, data) for ts, _lt, data, _wl in expected(path)]


def test_truncated_file_names_the_byte(tmp_path):
    path = synthetic(tmp_path / "t.pcap", PcapWriter, n=50)
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    c = read_container(path)
    with pytest.raises(CaptureError) as err:
        list(read_range(path, c, c.data_start, len(data) - 10))
    assert "t.pcap" in str(err.value) and "record at byte" in str(err.value)


@pytest.mark.parametrize("writer", [PcapWriter, PcapNgWriter])
def test_a_cut_inside_the_last_record_ends_the_last_range(tmp_path, writer):
    """A file whose last record is longer than a range (a 64 KiB segment on loopback, as tcpdump -C
    leaves at the end of a part): a nominal cut inside it has no record after it, so the range
    before runs to the end of the file."""
    path = tmp_path / "big-last.pcap"
    with writer(str(path)) as w:
        for i, size in enumerate([100, 200, 65_000]):
            p = ETHER / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1234, dport=5672, seq=i) / (b"\x5a" * size)
            p.time = Decimal(1_700_000_000) + Decimal(i) / 1000
            w.write(p)
    ranges, records = all_records(path, 16_384)
    assert ranges[-1][1] == path.stat().st_size
    assert [(r.record.ts_us, r.record.data) for r in records] == [(ts, data) for ts, _lt, data, _wl in expected(path)]
