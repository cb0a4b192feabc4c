"""Splitting one capture file into byte ranges that start on record boundaries.

A big capture is decoded by many tasks, each reading its own byte range; a range starts at the
first record (pcap) or block (pcapng) at or after its nominal offset. Record boundaries are not
marked in either format, so a candidate offset is accepted only when it and the next few records
after it all parse as plausible record headers (sizes within the snapshot length, timestamps in
the capture's era, pcapng lengths repeated at both ends of the block).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from amqpscope.ingest.pcap import CaptureError, Record

_PCAP_MAGIC = {
    b"\xd4\xc3\xb2\xa1": ("<", False), b"\xa1\xb2\xc3\xd4": (">", False),
    b"\x4d\x3c\xb2\xa1": ("<", True), b"\xa1\xb2\x3c\x4d": (">", True),
}  # fmt: skip
_PCAPNG_SHB = 0x0A0D0D0A
_PCAPNG_IDB, _PCAPNG_EPB, _PCAPNG_SPB = 1, 6, 3
_PCAPNG_BLOCK_TYPES = {_PCAPNG_SHB, _PCAPNG_IDB, 2, _PCAPNG_SPB, 4, 5, _PCAPNG_EPB, 7, 9, 10, 0x0BAD, 0x40000BAD}
# How many consecutive plausible records make a boundary certain enough.
_CHAIN = 4
_MAX_RECORD = 1 << 18  # 256 KiB: larger than any snapshot length in use
_SCAN_LIMIT = 16 << 20  # give up looking for a boundary this far past a nominal offset
_MAX_CAPTURE_SECONDS = 366 * 86_400


@dataclass(frozen=True)
class Container:
    """What a range reader needs to know about the file, read once from its start."""

    kind: str  # "pcap" | "pcapng"
    endian: str
    nano: bool = False  # pcap only
    linktype: int = 0  # pcap only
    snaplen: int = _MAX_RECORD
    data_start: int = 24  # first record / first packet block
    interfaces: tuple[tuple[int, int], ...] = ()  # pcapng: (linktype, ticks per second) by id
    first_sec: int | None = None  # pcap: the first record's time, anchoring the capture's era


def read_container(path: str | Path) -> Container:
    """Parse the file header (pcap) or the section header and interface blocks (pcapng)."""
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:4] in _PCAP_MAGIC:
            endian, nano = _PCAP_MAGIC[head[:4]]
            if len(head) < 24:
                raise CaptureError(path, "file header", "pcap header shorter than 24 bytes")
            snaplen, linktype = struct.unpack(endian + "II", head[16:24])
            first = f.read(4)
            first_sec = struct.unpack(endian + "I", first)[0] if len(first) == 4 else None
            return Container("pcap", endian, nano, linktype & 0xFFFF, min(snaplen or _MAX_RECORD, _MAX_RECORD), 24, (), first_sec)
        if len(head) >= 12 and struct.unpack("<I", head[:4])[0] == _PCAPNG_SHB:
            return _read_pcapng_header(f, path, head)
    raise CaptureError(path, "file header", "not a pcap or pcapng file")


def _read_pcapng_header(f: BinaryIO, path: str | Path, head: bytes) -> Container:
    magic = head[8:12]
    endian = "<" if magic == b"\x4d\x3c\x2b\x1a" else ">" if magic == b"\x1a\x2b\x3c\x4d" else None
    if endian is None:
        raise CaptureError(path, "section header", "bad byte-order magic")
    interfaces: list[tuple[int, int]] = []
    offset = 0
    while True:
        f.seek(offset)
        header = f.read(8)
        if len(header) < 8:
            break
        block_type, length = struct.unpack(endian + "II", header)
        if length < 12 or length % 4:
            raise CaptureError(path, f"block at byte {offset}", f"impossible block length {length}")
        if block_type in (_PCAPNG_EPB, _PCAPNG_SPB, 2):
            break
        if block_type == _PCAPNG_IDB:
            body = f.read(length - 12)
            interfaces.append(_interface(endian, body))
        offset += length
    return Container("pcapng", endian, data_start=offset, interfaces=tuple(interfaces))


def _interface(endian: str, body: bytes) -> tuple[int, int]:
    """(link type, timestamp ticks per second) from an Interface Description Block body."""
    linktype = struct.unpack(endian + "H", body[:2])[0]
    ticks = 1_000_000
    pos = 8
    while pos + 4 <= len(body):
        code, size = struct.unpack(endian + "HH", body[pos : pos + 4])
        if code == 0:
            break
        if code == 9 and size >= 1:  # if_tsresol
            value = body[pos + 4]
            ticks = 2 ** (value & 0x7F) if value & 0x80 else 10 ** value
        pos += 4 + size + (-size) % 4
    return linktype, ticks


# --- boundary finding -------------------------------------------------------------------------


def _pcap_record_ok(c: Container, buf: bytes, pos: int, previous_sec: int | None) -> int | None:
    """Length of a plausible pcap record at ``pos``, or None."""
    if pos + 16 > len(buf):
        return None
    sec, frac, caplen, wirelen = struct.unpack_from(c.endian + "IIII", buf, pos)
    if frac >= (1_000_000_000 if c.nano else 1_000_000) or caplen > c.snaplen or caplen > wirelen or wirelen > _MAX_RECORD:
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
    if block_type not in _PCAPNG_BLOCK_TYPES or length < 12 or length % 4 or length > _MAX_RECORD + 64:
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
    window = (_CHAIN + 1) * (_MAX_RECORD + 64)
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


@dataclass(frozen=True, slots=True)
class RangeRecord:
    offset: int  # file offset of the record: orders records across ranges
    record: Record  # number is the index within the range, from 1


def read_range(path: str | Path, c: Container, start: int, end: int) -> Iterator[RangeRecord]:
    """Every record starting in [start, end); a record cut by the end of the file is reported."""
    with open(path, "rb") as f:
        f.seek(start)
        pos, index = start, 0
        while pos < end:
            if c.kind == "pcap":
                header = f.read(16)
                if len(header) < 16:
                    raise CaptureError(path, f"record at byte {pos}", "file ends inside a record header", offset=pos)
                sec, frac, caplen, wirelen = struct.unpack(c.endian + "IIII", header)
                data = f.read(caplen)
                if len(data) < caplen:
                    raise CaptureError(path, f"record at byte {pos}", f"file ends {caplen - len(data)} bytes into a packet", offset=pos)
                ts = sec * 1_000_000 + (frac // 1000 if c.nano else frac)
                index += 1
                yield RangeRecord(pos, Record(index, ts, c.linktype, data, wirelen))
                pos += 16 + caplen
            else:
                header = f.read(8)
                if len(header) < 8:
                    raise CaptureError(path, f"block at byte {pos}", "file ends inside a block header", offset=pos)
                block_type, length = struct.unpack(c.endian + "II", header)
                body = f.read(length - 8)
                if length < 12 or len(body) < length - 8:
                    raise CaptureError(path, f"block at byte {pos}", "file ends inside a block", offset=pos)
                if block_type == _PCAPNG_EPB:
                    iface, hi, lo, caplen, wirelen = struct.unpack_from(c.endian + "IIIII", body, 0)
                    linktype, ticks = c.interfaces[iface] if iface < len(c.interfaces) else (0, 1_000_000)
                    index += 1
                    ts = ((hi << 32) | lo) * 1_000_000 // ticks
                    yield RangeRecord(pos, Record(index, ts, linktype, body[20 : 20 + caplen], wirelen))
                elif block_type == _PCAPNG_SPB:
                    (wirelen,) = struct.unpack_from(c.endian + "I", body, 0)
                    linktype = c.interfaces[0][0] if c.interfaces else 0
                    index += 1
                    yield RangeRecord(pos, Record(index, 0, linktype, body[4 : 4 + min(wirelen, length - 16)], wirelen))
                pos += length
