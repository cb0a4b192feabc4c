"""Every read of a Delta table through delta-rs, made so that it cannot abort the process at exit.

deltalake's ``to_pyarrow_table`` / ``to_pyarrow_dataset`` scan the Parquet files through a
filesystem written in Python (``pyarrow.fs.PyFileSystem`` over deltalake's ``DeltaStorageHandler``).
Arrow finishes such a scan on its own thread pool, and a pool thread may drop the scan's last
reference to a file after the call has returned: the file's destructor (``PyReadableFile``) then
takes the GIL. When that happens while Python is finalizing, CPython (3.11 to 3.13) ends the thread
with ``pthread_exit``; the forced unwind meets a ``noexcept`` C++ destructor and libstdc++ calls
``std::terminate``: "terminate called without an active exception", exit status 134, and whatever
was not yet flushed to stdout is lost (a gdb backtrace of the abort shows exactly that chain). It
happened in about one run in ten of a process that read a table and exited (deltalake 1.6.6,
pyarrow 26); reading on the calling thread only (``use_threads=False``, the first fix, in
``diagnose``) made it rarer, not impossible.

Here the files are read through Arrow's native local filesystem instead: no Arrow thread ever
calls into Python, so none can be caught by the interpreter's exit. The delta-rs backend's lakes
are local paths (``jobs.lake.lake``), so nothing else is needed. The table's log (file list, partition
values, statistics, schema) still comes from delta-rs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable
from pyarrow import fs

CAPTURE_ID = "capture_id"


def is_delta_table(path: str | Path) -> bool:
    """True when ``path`` holds a Delta table (it has a commit)."""
    return DeltaTable.is_deltatable(str(path))


def open_table(path: str | Path, version: int | None = None) -> DeltaTable:
    """The snapshot of the Delta table at ``path`` at ``version`` (default: the current one); its
    log only, no data file is read."""
    return DeltaTable(str(path)) if version is None else DeltaTable(str(path), version=version)


def read_table(path: str | Path, capture_ids: Sequence[str] | None = None, table: DeltaTable | None = None) -> pa.Table:
    """The rows of the Delta table at ``path`` (of ``capture_ids`` only, when given: the other
    partitions' files are not opened), read through Arrow's native filesystem."""
    table = table if table is not None else open_table(path)
    root = os.path.abspath(str(path))
    dataset = table.to_pyarrow_dataset(filesystem=fs.SubTreeFileSystem(root, fs.LocalFileSystem()))
    if capture_ids is None:
        return dataset.to_table()
    return dataset.to_table(filter=ds.field(CAPTURE_ID).isin(sorted(set(capture_ids))))


def read_rows(path: str | Path, capture_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """``read_table`` as Python rows (nested structs as dicts); no rows when ``path`` holds no table."""
    if not is_delta_table(path):
        return []
    return read_table(path, capture_ids).to_pylist()


def add_actions(path: str | Path, table: DeltaTable | None = None) -> dict[str, list[Any]]:
    """The add actions of the table's current snapshot, column by column (``path``, ``size_bytes``,
    ``num_records``, ``partition.<column>``, ...): the log only, no data file is read."""
    table = table if table is not None else open_table(path)
    return pa.table(table.get_add_actions(flatten=True)).to_pydict()


def python_values(value: Any, timestamp: Callable[[datetime], Any]) -> Any:
    """A value of ``read_rows`` with its map columns as dicts (pyarrow gives a map as a list of
    key-value pairs) and each timestamp passed through ``timestamp``, in nested values too."""
    if isinstance(value, datetime):
        return timestamp(value)
    if isinstance(value, dict):
        return {k: python_values(v, timestamp) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {k: python_values(v, timestamp) for k, v in value}
        return [python_values(v, timestamp) for v in value]
    return value
