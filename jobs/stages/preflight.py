"""Checks made before Spark starts, so that a wrong argument fails in a second, not after 30.

Capture files are checked by ``jobs.stages.decode.resolve_captures`` (exists, a regular file, a pcap or
pcapng header); this module adds the directory hint, the lake's writability, and the captures that
hold no packet at all (answered "no AMQP traffic" without Spark).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from amqpscope.ingest.pcap import CaptureError, Damage, read_container, scan
from amqpscope.ingest.rotation import CapturePart


def check_capture_arguments(paths: Sequence[str | Path]) -> None:
    """Each argument names an existing regular file; a directory gets the command that takes one."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            raise CaptureError(path, "argument", "is a directory: use `amqpscope ingest` for a landing directory")
        if not path.exists():
            raise CaptureError(path, "argument", "no such capture file")
        if not path.is_file():
            raise CaptureError(path, "argument", "not a regular file")
        if not os.access(path, os.R_OK):
            raise CaptureError(path, "argument", "not readable")


def check_lake_writable(lake: str | Path) -> None:
    """The lake's root exists or can be made, and a file can be created in it (local paths only:
    a URI such as dbfs:/ or s3:// is checked by the first write)."""
    text = str(lake)
    if "://" in text or text.startswith("dbfs:"):
        return
    root = Path(text)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".amqpscope-write-check-"):
            pass
    except OSError as exc:
        raise PermissionError(f"lake {root} is not writable: {exc.strerror or exc}") from None


def without_packets(captures: Sequence[Sequence[CapturePart]]) -> list[int]:
    """Indexes of the captures (each its parts, as ``resolve_parts`` read them) none of whose files
    holds a packet: a file header alone, a pcapng of interface blocks only. A file whose first
    record is damaged is read on past the damage, as ingest reads it: damage is not "no packets"."""
    return [i for i, parts in enumerate(captures) if all(_no_packet(p) for p in parts)]


def _no_packet(part: CapturePart) -> bool:
    if part.first_ts_us is not None:
        return False
    container = read_container(part.path)
    damage: list[Damage] = []
    found = next(iter(scan(part.path, container, container.data_start, os.path.getsize(part.path), damage)), None)
    return found is None and not damage
