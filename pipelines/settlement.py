"""When each numbered item is settled: deliveries by acks, publishes by confirms (DOMAIN.md section 4).

Both AMQP 0-9-1 settlement schemes number items 1, 2, 3 ... in the order they are sent on a
channel (delivery tags, publish sequence numbers) and settle them with single acknowledgements
(one number) or ``multiple`` ones (every number up to the given one). Because numbers only grow,
each item's settlement is found with two windows over the channel's own rows, without replaying
the channel one event at a time and without a join:

    settled(item) = min(first single settlement naming it, first multiple settlement at or above it)

Callers clip every settlement to the numbers already sent when it was seen (a settlement cannot
settle the future), so every settlement naming an item comes after it. Then each settled item
row is doubled (``explode``) into a row at the settling frame, so running sums over the frames
count it there.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

# What a settlement row passes to the items it settles (frame_index first: structs order by it).
SETTLEMENT_FIELDS = ("frame_index", "method", "delivery_tag", "multiple", "ts", "packet_number", "direction")


def _from_the_top(keys: Sequence[str]) -> WindowSpec:
    """Items and multiple settlements by number, highest first, settlements before items of the
    same number: the running minimum is the first multiple settlement at or above each item.

    (Descending with a growing frame rather than ascending to ``unboundedFollowing``: Spark
    evaluates the latter by re-aggregating the rest of the partition for every row.)
    """
    return (
        Window.partitionBy(*keys)
        .orderBy(F.col("_number").desc(), F.col("_is_mark").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _same_number(keys: Sequence[str]) -> WindowSpec:
    """An item and the single settlements naming its number (every other row alone)."""
    return Window.partitionBy(*keys, "_single_key")


def settle(events: DataFrame, keys: Sequence[str], item: Column, single: Column, mark: Column) -> DataFrame:
    """``events`` with ``_settled``: on item rows, the settling row's SETTLEMENT_FIELDS (or null).

    ``item``: the number of an item row; ``single``: the number a single settlement names;
    ``mark``: the highest number a multiple settlement reaches. Null on other rows; all clipped.
    """
    info = F.struct(*SETTLEMENT_FIELDS)
    marked = (
        events.withColumn("_item", item).withColumn("_single", single).withColumn("_mark", mark)
        .withColumn("_number", F.coalesce(F.col("_mark"), F.col("_item")))
        .withColumn("_is_mark", F.col("_mark").isNotNull())
        # Other rows get a key of their own (negative: numbers are positive).
        .withColumn("_single_key", F.coalesce(F.col("_single"), F.col("_item"), -1 - F.col("frame_index")))
    )
    by_multiple = F.min(F.when(F.col("_is_mark"), info)).over(_from_the_top(keys))
    by_single = F.min(F.when(F.col("_single").isNotNull(), info)).over(_same_number(keys))
    first = F.least(by_multiple, by_single)
    return (
        marked.withColumn("_settled", F.when(F.col("_item").isNotNull(), first))
        .withColumn("_settled", F.when(F.col("_settled.frame_index") > F.col("frame_index"), F.col("_settled")))
        .drop("_single", "_mark", "_number", "_is_mark", "_single_key")
    )


def with_settlement_rows(settled: DataFrame) -> DataFrame:
    """Each settled item row doubled: the row itself (``_is_event``), and a row at its settling frame
    with that frame's SETTLEMENT_FIELDS. ``_delta``: +1 on an item's own row, -1 on its settlement row."""
    doubled = settled.withColumn(
        "_is_event",
        F.explode(F.when(F.col("_settled").isNotNull(), F.array(F.lit(True), F.lit(False))).otherwise(F.array(F.lit(True)))),
    )
    for name in SETTLEMENT_FIELDS:
        doubled = doubled.withColumn(name, F.when(F.col("_is_event"), F.col(name)).otherwise(F.col(f"_settled.{name}")))
    delta = F.when(~F.col("_is_event"), F.lit(-1)).when(F.col("_item").isNotNull(), F.lit(1)).otherwise(F.lit(0))
    return doubled.withColumn("_delta", delta.cast("long"))
