"""Splitting one capture file into byte ranges that start on record boundaries.

A big capture is decoded by many tasks, each reading its own byte range; a range starts at the
first record (pcap) or block (pcapng) at or after its nominal offset. Record boundaries are not
marked in either format, so a candidate offset is accepted only when it and the next few records
after it all parse as plausible record headers (sizes within the snapshot length, timestamps in
the capture's era, pcapng lengths repeated at both ends of the block). A range's records are read
with the same reader as a whole file (``ingest.pcap.scan``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from amqpscope.ingest.pcap import Container, Record, find_boundary, read_container, scan

# Container and read_container are imported from here by the ingest job.
__all__ = ["Container", "RangeRecord", "find_boundary", "read_container", "read_range", "split"]


# --- cutting a file into ranges (boundaries: ``ingest.pcap.find_boundary``) ----------------------


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
