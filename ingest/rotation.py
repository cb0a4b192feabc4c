"""Rotated capture files: the consecutive parts of one capture, put back together.

``tcpdump -C`` (rotate by size), ``-G`` (rotate by time) and ``-W`` (a ring of files) write one
capture as several files: ``cap.pcap``, ``cap.pcap1``, ``cap.pcap2`` for ``-C``; a strftime
pattern such as ``cap-%H%M%S.pcap`` for ``-G``; ``cap.pcap0``, ``cap.pcap1`` ... with ``-W``
(tcpdump(8), options -C, -G, -W). Wireshark's ``editcap -c`` / ``-i`` splits into
``out_00000_20261121221900.pcap`` and so on. A TCP connection runs on from one part into the next,
so the parts decode as one capture: one capture id, packet numbers running on across the parts,
every connection reassembled across them.

Files are taken as parts of one capture when all of these hold:

- they lie in one directory and their names are equal once every run of digits is read as one
  placeholder and a trailing run is dropped (so ``cap.pcap`` goes with ``cap.pcap1``);
- they have the same container format and the same link layer;
- ordered by their first packet's time, no part starts before the one before it ends.

A capture's id is its first part's content hash, so a capture that grows by a new part keeps its
id; each part's own hash is kept in the ``captures`` table to tell a grown capture from a known one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from amqpscope.ingest.pcap import CaptureError, capture_id
from amqpscope.ingest.ranges import Container, find_boundary, read_container, read_range

_DIGITS = re.compile(r"\d+")
# How far before the end of a part its last packet is looked for.
_TAIL_BYTES = 1 << 20


@dataclass(frozen=True)
class CapturePart:
    """One file of a capture: where it is, its content hash, and the times of its packets."""

    path: str
    content_hash: str
    size: int
    first_ts_us: int | None  # None: the file holds no packet
    last_ts_us: int | None
    layout: tuple[str, tuple[int, ...]]  # container format and link types: equal across parts


def rotation_key(path: str | Path) -> tuple[str, str]:
    """Directory and name with digit runs as ``#`` and a trailing run dropped: equal for the parts of a rotation."""
    p = Path(path)
    return str(p.parent), _DIGITS.sub("#", p.name).removesuffix("#")


def describe_part(path: str | Path, content_hash: str | None = None) -> CapturePart:
    """Read the container header and the first and last packet times of one capture file."""
    path = Path(path).resolve()
    container = read_container(path)
    size = path.stat().st_size
    first, last = _first_and_last_ts(path, container, size)
    linktypes = (container.linktype,) if container.kind == "pcap" else tuple(lt for lt, _ in container.interfaces)
    return CapturePart(
        str(path), content_hash or capture_id(path), size, first, last, (container.kind, linktypes)
    )


def _first_and_last_ts(path: Path, c: Container, size: int) -> tuple[int | None, int | None]:
    first = _last = None
    try:
        for item in read_range(path, c, c.data_start, size):
            first = item.record.ts_us
            break
        if first is None:
            return None, None
        tail = find_boundary(path, c, max(c.data_start, size - _TAIL_BYTES), size)
        for item in read_range(path, c, tail, size):
            _last = item.record.ts_us
    except CaptureError:
        pass  # a part cut short (still being written, or damaged): the times read so far stand
    return first, _last if _last is not None else first


def group_parts(parts: Iterable[CapturePart], group_rotated: bool = True) -> list[tuple[CapturePart, ...]]:
    """Captures as tuples of parts in time order; a file that is no rotation's part (or every
    file, when not ``group_rotated``) is a capture alone."""
    if not group_rotated:
        return [(part,) for part in parts]
    by_key: dict[tuple[str, str], list[CapturePart]] = {}
    for part in parts:
        by_key.setdefault(rotation_key(part.path), []).append(part)
    captures: list[tuple[CapturePart, ...]] = []
    for candidates in by_key.values():
        if len(candidates) > 1 and _is_rotation(candidates):
            captures.append(tuple(sorted(candidates, key=_time_order)))
        else:
            captures.extend((part,) for part in candidates)
    return sorted(captures, key=lambda c: c[0].path)


def _time_order(part: CapturePart) -> tuple[int, str]:
    return (part.first_ts_us if part.first_ts_us is not None else -1, part.path)


def _is_rotation(parts: Sequence[CapturePart]) -> bool:
    if len({p.layout for p in parts}) != 1 or any(p.first_ts_us is None for p in parts):
        return False
    ordered = sorted(parts, key=_time_order)
    return all(later.first_ts_us >= earlier.last_ts_us for earlier, later in zip(ordered, ordered[1:]))


def resolve_parts(paths: Sequence[str | Path], group_rotated: bool = True) -> list[tuple[CapturePart, ...]]:
    """Check every file's container before any work starts; files with the same bytes count once
    (the first in name order stands for them); rotated parts are grouped unless told not to."""
    seen: dict[str, CapturePart] = {}
    for raw in sorted(Path(p).resolve() for p in paths):
        if not raw.is_file():
            raise CaptureError(raw, "file", "no such capture file")
        part = describe_part(raw)
        seen.setdefault(part.content_hash, part)
    return group_parts(seen.values(), group_rotated)
