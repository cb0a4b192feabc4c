"""Capture containers: pcap (micro- and nanosecond) and pcapng, read with ``struct``.

One reader for every path: the whole-file decode (``ingest.capture.decode_capture``) and the Spark
ingest's byte ranges (``ingest.ranges.read_range``) both read records with ``scan``. It reads the
file in large blocks and cuts the records out of them: about 0.25 µs a record, where Scapy's
``RawPcapReader`` takes ~1.7 µs (Scapy still dissects packets for the interactive layers,
``ingest.scapy_layers``). Records are numbered from 1 like tshark's ``frame.number``. A file that
is not a capture, or is damaged, raises ``CaptureError`` naming the file and the place.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final, NamedTuple

from amqpscope.ingest.reasons import (
    CAPTURE_BLOCK_LENGTH_IMPOSSIBLE,
    CAPTURE_BLOCK_LENGTH_NOT_REPEATED,
    CAPTURE_RECORD_LENGTH_IMPOSSIBLE,
    CAPTURE_TRUNCATED,
)

_PCAP_MAGIC: Final = {
    b"\xd4\xc3\xb2\xa1": ("<", False),
    b"\xa1\xb2\xc3\xd4": (">", False),
    b"\x4d\x3c\xb2\xa1": ("<", True),
    b"\xa1\xb2\x3c\x4d": (">", True),
}
# pcapng block types (draft-ietf-opsawg-pcapng, section 11.1).
PCAPNG_SHB: Final = 0x0A0D0D0A
PCAPNG_IDB, PCAPNG_PB, PCAPNG_SPB, PCAPNG_EPB = 1, 2, 3, 6
_MIN_BLOCK: Final = {PCAPNG_EPB: 32, PCAPNG_PB: 32, PCAPNG_SPB: 16}  # header, fixed fields, trailer; 12 for the others
_PCAPNG_BYTE_ORDER: Final = {b"\x4d\x3c\x2b\x1a": "<", b"\x1a\x2b\x3c\x4d": ">"}
MAX_RECORD: Final = 1 << 18  # 256 KiB: larger than any snapshot length in use
# Bytes read from the file at a time; records are cut out of these blocks.
_BLOCK: Final = 1 << 20
# A record claiming more than this is damage, not a packet (and must not size a read).
_MAX_CLAIMED: Final = 1 << 26
_PCAPNG_BLOCK_TYPES: Final = frozenset(
    {PCAPNG_SHB, PCAPNG_IDB, PCAPNG_PB, PCAPNG_SPB, 4, 5, PCAPNG_EPB, 7, 9, 10, 0x0BAD, 0x40000BAD}
)
# How many consecutive plausible records make a boundary certain enough.
_CHAIN: Final = 4
_SCAN_LIMIT: Final = 16 << 20  # give up looking for a boundary this far past a nominal offset
_MAX_CAPTURE_SECONDS: Final = 366 * 86_400


class CaptureError(ValueError):
    """A capture file that cannot be read, naming the file and the place."""

    def __init__(self, path: str | Path, place: str, reason: str, offset: int | None = None) -> None:
        super().__init__(f"{path}: {place}: {reason}")
        self.path = str(path)
        self.place = place
        self.reason = reason
        self.offset = offset  # file offset of the damage, where known


class Damage(NamedTuple):
    """Bytes of a capture file that ``scan`` could not read as records, and went past."""

    offset: int  # file offset of the first byte skipped
    size: int  # bytes skipped: to the next plausible record, or to the end of the file
    place: str  # "record at byte N" / "block at byte N"
    reason: str  # what was wrong there, and how much was skipped
    reason_id: str  # ``ingest.reasons.REASONS``: capture.*
    expected: str | None = None
    found: str | None = None


class Record(NamedTuple):
    """A packet record (a tuple: one is made for every packet read)."""

    number: int  # 1-based, as tshark's frame.number
    ts_us: int
    linktype: int
    data: bytes
    wirelen: int


@dataclass(frozen=True)
class Container:
    """What a record reader needs to know about the file, read once from its start."""

    kind: str  # "pcap" | "pcapng"
    endian: str
    nano: bool = False  # pcap only
    linktype: int = 0  # pcap only
    snaplen: int = MAX_RECORD
    data_start: int = 24  # first record / first packet block
    interfaces: tuple[tuple[int, int], ...] = ()  # pcapng: (linktype, ticks per second) by id
    first_sec: int | None = None  # pcap: the first record's time, anchoring the capture's era
    snaplens: tuple[int, ...] = ()  # pcapng: each interface's snapshot length (0: none), by id


def capture_id(path: str | Path) -> str:
    """Content hash of a capture file: the same bytes are the same capture, whatever the name."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:20]


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
            snaplen = min(snaplen or MAX_RECORD, MAX_RECORD)
            return Container("pcap", endian, nano, linktype & 0xFFFF, snaplen, 24, (), first_sec)
        if len(head) >= 12 and struct.unpack("<I", head[:4])[0] == PCAPNG_SHB:
            return _read_pcapng_header(f, path, head)
    raise CaptureError(path, "file header", "not a pcap or pcapng file")


def _read_pcapng_header(f: BinaryIO, path: str | Path, head: bytes) -> Container:
    endian = _PCAPNG_BYTE_ORDER.get(head[8:12])
    if endian is None:
        raise CaptureError(path, "section header", "bad byte-order magic")
    interfaces: list[tuple[int, int]] = []
    snaplens: list[int] = []
    offset = 0
    while True:
        f.seek(offset)
        header = f.read(8)
        if len(header) < 8:
            break
        block_type, length = struct.unpack(endian + "II", header)
        if length < 12 or length % 4:
            raise CaptureError(path, f"block at byte {offset}", f"impossible block length {length}")
        if block_type in (PCAPNG_EPB, PCAPNG_SPB, PCAPNG_PB):
            break
        if block_type == PCAPNG_IDB:
            body = f.read(length - 12)
            interfaces.append(_interface(endian, body))
            snaplens.append(struct.unpack(endian + "I", body[4:8])[0] if len(body) >= 8 else 0)
        offset += length
    return Container("pcapng", endian, data_start=offset, interfaces=tuple(interfaces), snaplens=tuple(snaplens))


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
            ticks = 2 ** (value & 0x7F) if value & 0x80 else 10**value
        pos += 4 + size + (-size) % 4
    return linktype, ticks


# A packet record as ``scan`` yields it: (file offset, ts_us, linktype, data, wirelen).
RawRecord = tuple[int, int, int, bytes, int]


def scan(
    path: str | Path, c: Container, start: int, end: int, damage: list[Damage] | None = None
) -> Iterator[RawRecord]:
    """Every packet record starting in [start, end) of the file, as plain tuples (the fast path).

    ``start`` must be a record boundary. Damage (a record cut by the end of the file, an
    impossible length) raises ``CaptureError`` with its file offset, after every record before it;
    given a ``damage`` list, it is appended there instead and, past an impossible record, reading
    goes on from the next plausible record boundary (``find_boundary``).
    """
    return (_pcap_records if c.kind == "pcap" else _pcapng_records)(path, c, start, end, damage)


def _skip_damage(
    path: str | Path,
    c: Container,
    offset: int,
    place: str,
    reason: str,
    damage: list[Damage] | None,
    reason_id: str,
    expected: str | None = None,
    found: str | None = None,
) -> int:
    """Past an impossible record at ``offset``: where reading goes on (the file's size: nowhere).

    Raises ``CaptureError`` when the caller keeps no ``damage`` list.
    """
    if damage is None:
        raise CaptureError(path, place, reason, offset=offset)
    size = Path(path).stat().st_size
    try:
        resume = find_boundary(path, c, offset + 1, size)
    except CaptureError:
        resume = size
    skipped = resume - offset
    if resume < size:
        reason = f"{reason}; {skipped} bytes skipped to the next record"
    else:
        reason = f"{reason}; the {skipped} bytes to the end of the file skipped (no record found in them)"
    damage.append(Damage(offset, skipped, place, reason, reason_id, expected, found))
    return resume


def _pcap_records(
    path: str | Path, c: Container, start: int, end: int, damage: list[Damage] | None
) -> Iterator[RawRecord]:
    unpack = struct.Struct(c.endian + "IIII").unpack_from
    nano, linktype = c.nano, c.linktype
    with open(path, "rb") as f:
        f.seek(start)
        buf, base, pos = f.read(_BLOCK), start, 0  # base: file offset of buf[0]
        while base + pos < end:
            if len(buf) - pos < 16:
                buf, base, pos = buf[pos:] + f.read(_BLOCK), base + pos, 0
                if len(buf) < 16:
                    if damage is None:
                        raise CaptureError(
                            path, f"record at byte {base}", "file ends inside a record header", offset=base
                        )
                    damage.append(
                        Damage(
                            base,
                            len(buf),
                            f"record at byte {base}",
                            "file ends inside a record header",
                            CAPTURE_TRUNCATED,
                            "16",
                            str(len(buf)),
                        )
                    )
                    return
            sec, frac, caplen, wirelen = unpack(buf, pos)
            if caplen > MAX_RECORD:
                # No capture tool writes such a record (Wireshark refuses above 256 KiB): the
                # length is damage, and must not size a read. Go on at the next record boundary.
                place = f"record at byte {base + pos}"
                resume = _skip_damage(
                    path,
                    c,
                    base + pos,
                    place,
                    f"impossible captured length {caplen}",
                    damage,
                    CAPTURE_RECORD_LENGTH_IMPOSSIBLE,
                    f"at most {MAX_RECORD}",
                    str(caplen),
                )
                f.seek(resume)
                buf, base, pos = f.read(_BLOCK), resume, 0
                continue
            stop = pos + 16 + caplen
            if stop > len(buf):
                buf, base, pos = buf[pos:] + f.read(max(_BLOCK, 16 + caplen)), base + pos, 0
                stop = 16 + caplen
                if stop > len(buf):
                    reason = f"file ends {stop - len(buf)} bytes into a packet"
                    if damage is None:
                        raise CaptureError(path, f"record at byte {base}", reason, offset=base)
                    damage.append(
                        Damage(
                            base,
                            len(buf),
                            f"record at byte {base}",
                            reason,
                            CAPTURE_TRUNCATED,
                            str(stop),
                            str(len(buf)),
                        )
                    )
                    return
            ts_us = sec * 1_000_000 + (frac // 1000 if nano else frac)
            yield base + pos, ts_us, linktype, buf[pos + 16 : stop], wirelen
            pos = stop


def _pcapng_records(
    path: str | Path, c: Container, start: int, end: int, damage: list[Damage] | None
) -> Iterator[RawRecord]:
    endian = c.endian
    # Interfaces described after the first packet apply from there on; only a reader that started
    # at or before the first packet has seen every description before them, so only it can number them.
    complete = start <= c.data_start
    interfaces = list(c.interfaces) if start >= c.data_start else []  # before it: read them again
    with open(path, "rb") as f:
        f.seek(start)
        buf, base, pos = f.read(_BLOCK), start, 0
        while base + pos < end:
            if len(buf) - pos < 12:
                buf, base, pos = buf[pos:] + f.read(_BLOCK), base + pos, 0
                if len(buf) < 12:
                    if damage is None:
                        raise CaptureError(
                            path, f"block at byte {base}", "file ends inside a block header", offset=base
                        )
                    damage.append(
                        Damage(
                            base,
                            len(buf),
                            f"block at byte {base}",
                            "file ends inside a block header",
                            CAPTURE_TRUNCATED,
                            "12",
                            str(len(buf)),
                        )
                    )
                    return
            block_type, length = struct.unpack_from(endian + "II", buf, pos)
            if block_type == PCAPNG_SHB:
                # A new section (a concatenated file) may change the byte order; its interfaces restart.
                endian = _PCAPNG_BYTE_ORDER.get(buf[pos + 8 : pos + 12], endian)
                (length,) = struct.unpack_from(endian + "I", buf, pos + 4)
                interfaces = []
            if length < _MIN_BLOCK.get(block_type, 12) or length % 4 or length > _MAX_CLAIMED:
                place = f"block at byte {base + pos}"
                resume = _skip_damage(
                    path,
                    c,
                    base + pos,
                    place,
                    f"impossible block length {length}",
                    damage,
                    CAPTURE_BLOCK_LENGTH_IMPOSSIBLE,
                    found=str(length),
                )
                f.seek(resume)
                buf, base, pos = f.read(_BLOCK), resume, 0
                continue
            stop = pos + length
            if stop > len(buf):
                buf, base, pos = buf[pos:] + f.read(max(_BLOCK, length)), base + pos, 0
                stop = length
                if stop > len(buf):
                    if damage is None:
                        raise CaptureError(path, f"block at byte {base}", "file ends inside a block", offset=base)
                    damage.append(
                        Damage(
                            base,
                            len(buf),
                            f"block at byte {base}",
                            "file ends inside a block",
                            CAPTURE_TRUNCATED,
                            str(length),
                            str(len(buf)),
                        )
                    )
                    return
            (trailer,) = struct.unpack_from(endian + "I", buf, stop - 4)
            if trailer != length:
                # Every block repeats its length at its end (pcapng 3.1): a block without it is damage.
                place = f"block at byte {base + pos}"
                resume = _skip_damage(
                    path,
                    c,
                    base + pos,
                    place,
                    f"block length {length} not repeated at its end",
                    damage,
                    CAPTURE_BLOCK_LENGTH_NOT_REPEATED,
                    str(length),
                    str(trailer),
                )
                f.seek(resume)
                buf, base, pos = f.read(_BLOCK), resume, 0
                continue
            if block_type == PCAPNG_EPB:
                iface, hi, lo, caplen, wirelen = struct.unpack_from(endian + "IIIII", buf, pos + 8)
                linktype, ticks = interfaces[iface] if iface < len(interfaces) else (0, 1_000_000)
                data = buf[pos + 28 : min(pos + 28 + caplen, stop - 4)]
                yield base + pos, ((hi << 32) | lo) * 1_000_000 // ticks, linktype, data, wirelen
            elif block_type == PCAPNG_PB:  # obsolete, still written by old tools
                iface, _drops, hi, lo, caplen, wirelen = struct.unpack_from(endian + "HHIIII", buf, pos + 8)
                linktype, ticks = interfaces[iface] if iface < len(interfaces) else (0, 1_000_000)
                data = buf[pos + 28 : min(pos + 28 + caplen, stop - 4)]
                yield base + pos, ((hi << 32) | lo) * 1_000_000 // ticks, linktype, data, wirelen
            elif block_type == PCAPNG_SPB:
                (wirelen,) = struct.unpack_from(endian + "I", buf, pos + 8)
                linktype = interfaces[0][0] if interfaces else 0
                yield base + pos, 0, linktype, buf[pos + 12 : pos + 12 + min(wirelen, length - 16)], wirelen
            elif block_type == PCAPNG_IDB and complete:
                interfaces.append(_interface(endian, buf[pos + 8 : stop - 4]))
            elif block_type == PCAPNG_SHB:
                complete = True
            pos = stop


# --- record boundaries (where a damaged file or a byte range is read from) -----------------------


def _pcap_record_ok(c: Container, buf: bytes, pos: int, previous_sec: int | None) -> int | None:
    """Length of a plausible pcap record at ``pos``, or None."""
    if pos + 16 > len(buf):
        return None
    sec, frac, caplen, wirelen = struct.unpack_from(c.endian + "IIII", buf, pos)
    if (
        frac >= (1_000_000_000 if c.nano else 1_000_000)
        or caplen > c.snaplen
        or caplen > wirelen
        or wirelen > MAX_RECORD
    ):
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
    previous_sec: int | None = None
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
    """The first record boundary at or after ``offset`` (``file_size`` if there is none).

    Record boundaries are not marked in either format: a candidate offset is accepted only when it
    and the next few records after it all parse as plausible record headers (sizes within the
    snapshot length, timestamps in the capture's era, pcapng lengths repeated at both ends of the
    block). Raises ``CaptureError`` when none is found within 16 MiB.
    """
    if offset <= c.data_start:
        return c.data_start
    window = (_CHAIN + 1) * (MAX_RECORD + 64)
    with open(path, "rb") as f:
        scanned = 0
        while offset < file_size and scanned < _SCAN_LIMIT:
            f.seek(offset)
            buf = f.read(window + (1 << 16))
            for pos in range(min(len(buf), 1 << 16)):
                if _chain_ok(c, buf, pos):
                    return offset + pos
            offset += 1 << 16
            scanned += 1 << 16
    if offset >= file_size:
        return file_size  # ``offset`` lies inside the file's last record: no record starts after it
    raise CaptureError(path, f"byte {offset}", "no record boundary found: the file is damaged here")


def read_records(path: str | Path) -> Iterator[Record]:
    """Every packet record of a pcap or pcapng file, in file order (damage raises ``CaptureError``)."""
    c = read_container(path)
    records = scan(path, c, c.data_start, Path(path).stat().st_size)
    for number, (_offset, ts_us, linktype, data, wirelen) in enumerate(records, 1):
        yield Record(number, ts_us, linktype, data, wirelen)
