"""What the Delta log already says about a write: row counts per capture, without reading a table.

Every file a commit adds carries its row count in its statistics (``numRecords``: delta-rs and
delta-spark both write it), so the rows of a capture are the sum over the files of its partition
in the table's current snapshot. No Spark job runs; only the log is read.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import functions as F

from amqpscope.jobs.lake import CAPTURE_ID, Lake
from amqpscope.jobs.lake_read import add_actions


def committed_rows(path: str, capture_ids: Sequence[str]) -> int | None:
    """Rows of `capture_ids` in the Delta table at `path`, from the log; None when a file of theirs
    has no row count in its statistics (the caller then counts the rows)."""
    actions = add_actions(path)
    wanted = set(capture_ids)
    counts = [n for n, capture in zip(actions["num_records"], actions[f"partition.{CAPTURE_ID}"]) if capture in wanted]
    if any(n is None for n in counts):
        return None
    return int(sum(counts))


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
