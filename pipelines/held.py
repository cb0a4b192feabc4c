"""Time held back: the union of the intervals that held an entity back, never counted twice.

A publisher can meet a full window and a zero window over the same span, a consumer can sit at
its prefetch through several intervals that touch: the time it was held back is the length of
the union of those intervals, clipped to the span in which the entity was active, so it is never
more than that span. ``merged_intervals`` merges overlapping intervals per key ("gaps and
islands": an interval starts a new island when it starts after every earlier one ended);
``held_time`` sums the union per key.

Intervals are rows with ``start_us`` and ``end_us`` (microseconds since the epoch) and
``start_packet_number`` (the packet where the entity was first held back in that interval).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

MAX_PACKETS = 20  # packet numbers listed per finding (and in its Wireshark filter)


def first_packets(column: str | Column, limit: int = MAX_PACKETS) -> Column:
    """Up to ``limit`` distinct packet numbers of a group, in order (an aggregate)."""
    return F.slice(F.array_sort(F.collect_set(column)), 1, limit)


def _earlier(keys: Sequence[str]) -> WindowSpec:
    """One key's intervals by start: the latest end of every interval before this one."""
    return Window.partitionBy(*keys).orderBy("start_us", "end_us").rowsBetween(Window.unboundedPreceding, -1)


def _islands(keys: Sequence[str]) -> WindowSpec:
    """One key's intervals by start: the running count of islands started so far."""
    return (
        Window.partitionBy(*keys)
        .orderBy("start_us", "end_us")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def merged_intervals(intervals: DataFrame, keys: Sequence[str]) -> DataFrame:
    """One row per maximal union of overlapping (or touching) intervals per ``keys``: ``start_us``,
    ``end_us``, the first ``start_packet_number`` and how many intervals it merged (``parts``)."""
    valid = intervals.filter(F.col("end_us") >= F.col("start_us"))
    starts_island = F.coalesce(F.col("start_us") > F.max("end_us").over(_earlier(keys)), F.lit(True))
    numbered = valid.withColumn("_new", starts_island.cast("int")).withColumn(
        "_island", F.sum("_new").over(_islands(keys))
    )
    return (
        numbered.groupBy(*keys, "_island")
        .agg(
            F.min("start_us").alias("start_us"),
            F.max("end_us").alias("end_us"),
            F.min("start_packet_number").alias("start_packet_number"),
            F.count(F.lit(1)).alias("parts"),
        )
        .drop("_island")
    )


def clipped(intervals: DataFrame, low: Column, high: Column) -> DataFrame:
    """Intervals cut to [low, high] (columns of the rows); those left empty are dropped."""
    return (
        intervals.withColumn("start_us", F.greatest(F.col("start_us"), low))
        .withColumn("end_us", F.least(F.col("end_us"), high))
        .filter(F.col("end_us") > F.col("start_us"))
    )


def held_time(intervals: DataFrame, keys: Sequence[str]) -> DataFrame:
    """Per ``keys``: ``held_us`` (the length of the union of the intervals), ``held_intervals`` (the
    islands of the union), ``held_start_us`` / ``held_end_us`` (the union's first start and last end),
    ``held_p50_us`` (the median island) and the first packets where it was held back
    (``held_packets``)."""
    islands = merged_intervals(intervals, keys).withColumn("_length", F.col("end_us") - F.col("start_us"))
    return islands.groupBy(*keys).agg(
        F.sum("_length").alias("held_us"),
        F.count(F.lit(1)).alias("held_intervals"),
        F.min("start_us").alias("held_start_us"),
        F.max("end_us").alias("held_end_us"),
        F.percentile_approx("_length", 0.5).alias("held_p50_us"),
        first_packets("start_packet_number").alias("held_packets"),
    )


def timestamp(us: Column) -> Column:
    """Microseconds since the epoch as a timestamp."""
    return F.timestamp_micros(us)
