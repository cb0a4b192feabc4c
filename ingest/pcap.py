"""Capture containers: pcap (micro- and nanosecond) and pcapng, read with Scapy's raw readers."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from scapy.error import Scapy_Exception
from scapy.utils import RawPcapNgReader, RawPcapReader


class CaptureError(ValueError):
    """A capture file that cannot be read, naming the file and the place."""

    def __init__(self, path: str | Path, place: str, reason: str, offset: int | None = None) -> None:
        super().__init__(f"{path}: {place}: {reason}")
        self.path = str(path)
        self.place = place
        self.reason = reason
        self.offset = offset  # file offset of the damage, where known


@dataclass(frozen=True, slots=True)
class Record:
    number: int  # 1-based, as tshark's frame.number
    ts_us: int
    linktype: int
    data: bytes
    wirelen: int


def capture_id(path: str | Path) -> str:
    """Content hash of a capture file: the same bytes are the same capture, whatever the name."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:20]


def read_records(path: str | Path) -> Iterator[Record]:
    """Every packet record of a pcap or pcapng file, in file order."""
    try:
        reader = RawPcapReader(str(path))
    except (Scapy_Exception, OSError) as exc:
        raise CaptureError(path, "file header", str(exc)) from None
    number = 0
    with reader:
        if isinstance(reader, RawPcapNgReader):
            for data, meta in reader:
                number += 1
                ts = (meta.tshigh << 32) | meta.tslow
                yield Record(number, ts * 1_000_000 // meta.tsresol, meta.linktype, data, meta.wirelen)
        else:
            per_second = 1_000_000_000 if reader.nano else 1_000_000
            for data, meta in reader:
                number += 1
                ts = meta.sec * 1_000_000 + meta.usec * 1_000_000 // per_second
                yield Record(number, ts, reader.linktype, data, meta.wirelen)
