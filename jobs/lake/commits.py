"""What the Delta log already says about a write: row counts per capture, without reading a table.

Every file a commit adds carries its row count in its statistics (``numRecords``: delta-rs and
delta-spark both write it), so the rows of a capture are the sum over the files of its partition
in the table's current snapshot. No Spark job runs; only the log is read.

The same counts check the lake against a run (``check_stored``): before a stage marks its captures
``ok``, each table it wrote holds, for each capture, as many rows as its commit added. A commit
that a reader does not see (lost, or damaged), or rows of the capture written twice, fail the
stage naming the table, and the capture stays incomplete.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from pyspark.sql import functions as F

from amqpscope.jobs.lake import delta_log
from amqpscope.jobs.lake.errors import StoredRowsMismatch
from amqpscope.jobs.lake.lake import CAPTURE_ID, Lake
from amqpscope.jobs.lake.read import add_actions


def rows_by_capture(path: str, capture_ids: Sequence[str]) -> dict[str, int | None]:
    """Rows of each of `capture_ids` in the Delta table at `path`, from the log (its damage checked
    first); None for a capture a file of which has no row count in its statistics."""
    delta_log.check_log(path, os.path.basename(path))
    actions = add_actions(path)
    counts: dict[str, int | None] = {cid: 0 for cid in capture_ids}
    for n, capture in zip(actions["num_records"], actions[f"partition.{CAPTURE_ID}"]):
        if capture in counts:
            before = counts[capture]
            counts[capture] = None if n is None or before is None else before + int(n)
    return counts


def committed_rows(path: str, capture_ids: Sequence[str]) -> int | None:
    """Rows of `capture_ids` in the Delta table at `path`, from the log; None when a file of theirs
    has no row count in its statistics (the caller then counts the rows)."""
    counts = rows_by_capture(path, sorted(set(capture_ids))).values()
    return None if any(n is None for n in counts) else sum(n for n in counts if n is not None)


def check_stored(lake: Lake, written: Mapping[str, Mapping[str, int]]) -> None:
    """``StoredRowsMismatch`` naming the first table whose current snapshot does not hold, for a
    capture, the rows ``written`` says its commit added (``Lake.take_written``)."""
    for table, by_capture in sorted(written.items()):
        stored = rows_by_capture(lake.table_path(table), sorted(by_capture))
        for cid, rows in sorted(by_capture.items()):
            if stored[cid] is not None and stored[cid] != rows:
                raise StoredRowsMismatch(table, cid, int(stored[cid] or 0), rows)


def committed_row_counts(lake: Lake, tables: Sequence[str], capture_ids: Sequence[str]) -> dict[str, int]:
    """Rows of `capture_ids` per table, from the Delta log of the delta-rs backend's lakes (partitioned
    by capture_id, on this machine's filesystem); counted by Spark otherwise (delta-spark's tables
    are clustered, not partitioned, or in Unity Catalog)."""
    counts = {}
    for table in tables:
        rows = committed_rows(lake.table_path(table), capture_ids) if lake.backend == "delta-rs" else None
        if rows is None:
            rows = lake.read(table).filter(F.col(CAPTURE_ID).isin(*capture_ids)).count()
        counts[table] = rows
    return counts
