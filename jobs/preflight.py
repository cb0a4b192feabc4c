"""Checks made before Spark starts, so that a wrong argument fails in a second, not after 30.

Capture files are checked by ``jobs.ingest.resolve_captures`` (exists, a regular file, a pcap or
pcapng header); this module adds the directory hint and the lake's writability.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

from amqpscope.ingest.pcap import CaptureError


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
