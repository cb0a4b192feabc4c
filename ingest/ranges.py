"""Splitting one capture file into byte ranges that start on record boundaries.

A big capture is decoded by many tasks, each reading its own byte range; a range starts at the
first record (pcap) or block (pcapng) at or after its nominal offset. Record boundaries are not
marked in either format, so a candidate offset is accepted only when it and the next few records
after it all parse as plausible record headers (sizes within the snapshot length, timestamps in
the capture's era, pcapng lengths repeated at both ends of the block). A range's records are read
with the same reader as a whole file (``ingest.pcap.scan``).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Iterator, NamedTuple

from amqpscope.ingest.pcap import (
    MAX_RECORD, PCAPNG_EPB, PCAPNG_IDB, PCAPNG_PB, PCAPNG_SHB, PCAPNG_SPB, CaptureError, Container, Record,
    read_container, scan,
)  # fmt: skip

# Container and read_container are imported from here by the ingest job and ``ingest.rotation``.
__all__ = ["Container", "RangeRecord", "find_boundary", "read_container", "read_range", "split"]

_PCAPNG_BLOCK_TYPES = {PCAPNG_SHB, PCAPNG_IDB, PCAPNG_PB, PCAPNG_SPB, 4, 5, PCAPNG_EPB, 7, 9, 10, 0x0BAD, 0x40000BAD}
# How many consecutive plausible records make a boundary certain enough.
_CHAIN = 4
_SCAN_LIMIT = 16 << 20  # give up looking for a boundary this far past a nominal offset
_MAX_CAPTURE_SECONDS = 366 * 86_400


# --- boundary finding -------------------------------------------------------------------------


def _pcap_record_ok(c: Container, buf: bytes, pos: int, previous_sec: int | None) -> int | None:
    """Length of a plausible pcap record at ``pos``, or None."""
    if pos + 16 > len(buf):
        return None
    sec, frac, caplen, wirelen = struct.unpack_from(c.endian + "IIII", buf, pos)
    if frac >= (1_000_000_000 if c.nano else 1_000_000) or caplen > c.snaplen or caplen > wirelen or wirelen > MAX_RECORD:
        return None
    if previous_sec is not None and abs(sec - previous_sec) > 86_400:
        return None
    # Records of one capture lie within its era: after its first record (a day of clock slack).
    if c.first_sec is not None and not c.first_sec - 86_400 <= sec <= c.first_sec + _MAX_CAPTURE_SECONDS:
        return None
    return 16 + caplen


def _pcapng_block_ok(c: Container, buf: bytes, pos: int) -> int | None:
    if pos + 12 > len(buf):
        return None
    block_type, length = struct.unpack_from(c.endian + "II", buf, pos)
    if block_type not in _PCAPNG_BLOCK_TYPES or length < 12 or length % 4 or length > MAX_RECORD + 64:
        return None
    if pos + length > len(buf):
        return None
    (trailer,) = struct.unpack_from(c.endian + "I", buf, pos + length - 4)
    return length if trailer == length else None


def _chain_ok(c: Container, buf: bytes, pos: int) -> bool:
    """``pos`` starts a record and the next ones chain from it (or the data ends cleanly)."""
    previous_sec = None
    for _ in range(_CHAIN):
        if pos == len(buf):
            return True
        if c.kind == "pcap":
            length = _pcap_record_ok(c, buf, pos, previous_sec)
            if length is not None:
                previous_sec = struct.unpack_from(c.endian + "I", buf, pos)[0]
        else:
            length = _pcapng_block_ok(c, buf, pos)
        if length is None:
            return False
        pos += length
    return True


def find_boundary(path: str | Path, c: Container, offset: int, file_size: int) -> int:
    """The first record boundary at or after ``offset`` (``file_size`` if there is none)."""
    if offset <= c.data_start:
        return c.data_start
    window = (_CHAIN + 1) * (MAX_RECORD + 64)
    with open(path, "rb") as f:
        scanned = 0
        while offset < file_size and scanned < _SCAN_LIMIT:
            f.seek(offset)
            buf = f.read(window + (1 << 16))
            for pos in range(0, min(len(buf), 1 << 16)):
                if _chain_ok(c, buf, pos):
                    return offset + pos
            offset += 1 << 16
            scanned += 1 << 16
    raise CaptureError(path, f"byte {offset}", "no record boundary found: the file is damaged here")


def split(path: str | Path, target_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of about ``target_bytes`` each, every one starting on a record boundary."""
    c = read_container(path)
    size = Path(path).stat().st_size
    starts = [c.data_start]
    nominal = c.data_start + target_bytes
    while nominal < size:
        boundary = find_boundary(path, c, nominal, size)
        if boundary >= size:
            break
        if boundary > starts[-1]:
            starts.append(boundary)
        nominal = boundary + target_bytes
    return [(start, end) for start, end in zip(starts, [*starts[1:], size])]


# --- reading one range ------------------------------------------------------------------------


class RangeRecord(NamedTuple):
    offset: int  # file offset of the record: orders records across ranges
    record: Record  # number is the index within the range, from 1


def read_range(path: str | Path, c: Container, start: int, end: int) -> Iterator[RangeRecord]:
    """Every record starting in [start, end); a record cut by the end of the file is reported."""
    for index, (offset, ts_us, linktype, data, wirelen) in enumerate(scan(path, c, start, end), 1):
        yield RangeRecord(offset, Record(index, ts_us, linktype, data, wirelen))
