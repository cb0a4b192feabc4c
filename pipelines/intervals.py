"""Intervals in which a condition holds over an ordered timeline ("gaps and islands").

A timeline row says what holds *after* it; an interval starts at the first row where the
condition holds and ends at the next row where it no longer does (null if none). Two window
passes: one marks the rows where the condition changes, one pairs each start with its end.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

# Where a row sits, copied to start_* and end_* (frame_index is absent from TCP timelines).
_POSITIONS = ("frame_index", "ts", "packet_number")


def _entity_in_order(keys: Sequence[str], order: Sequence[str]) -> WindowSpec:
    """One entity's rows in capture order: compares each row's condition with the one before."""
    return Window.partitionBy(*keys).orderBy(*order)


def intervals(
    timeline: DataFrame,
    keys: Sequence[str],
    order: Sequence[str],
    condition: Column,
    carry: Sequence[str] = (),
    carry_end: Sequence[str] = (),
) -> DataFrame:
    """One row per interval of ``timeline`` (per ``keys``, in ``order``) in which ``condition`` holds.

    Columns: ``keys``, ``carry`` (from the interval's first row), ``end_<c>`` for ``carry_end``
    (from the row that ended it), ``start_<p>`` / ``end_<p>`` for the positions frame_index, ts and
    packet_number the timeline has, and ``duration_us`` (null while the interval is open).
    """
    positions = [p for p in _POSITIONS if p in timeline.columns]
    window = _entity_in_order(keys, order)
    holds = F.coalesce(condition, F.lit(False))
    changes = (
        timeline.withColumn("_holds", holds)
        .withColumn("_held", F.coalesce(F.lag("_holds").over(window), F.lit(False)))
        .filter(F.col("_holds") != F.col("_held"))
    )
    # Starts and ends alternate: the row after a start is its end.
    paired = changes
    for column in [*positions, *carry_end]:
        paired = paired.withColumn(f"end_{column}", F.lead(column).over(window))
    started = paired.filter(F.col("_holds"))
    duration = F.unix_micros(F.col("end_ts")) - F.unix_micros(F.col("start_ts"))
    return started.select(
        *keys,
        *carry,
        *[F.col(p).alias(f"start_{p}") for p in positions],
        *[F.col(f"end_{p}") for p in positions],
        *[F.col(f"end_{c}") for c in carry_end if c not in positions],
    ).withColumn("duration_us", duration)
