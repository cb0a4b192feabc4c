"""When each numbered item is settled: deliveries by acks, publishes by confirms (docs/FLOW_CONTROL.md section 4).

Both AMQP 0-9-1 settlement schemes number items 1, 2, 3 ... in the order they are sent on a
channel incarnation (delivery tags, publish sequence numbers) and settle them with basic.ack /
basic.nack / basic.reject naming one number, or with ``multiple`` every number up to it. This
module is the one place that says what a settlement settles; ``messages_091`` and the flow-state
timelines (channel_unacked, consumer_unacked, channel_confirms) all call ``settle``.

The rule (0-9-1 spec, basic.ack field ``multiple``, its rule "exists" with on-failure
``precondition-failed``; basic.nack / basic.reject by RabbitMQ's same code path):

- a settlement naming a non-zero tag settles something only if that tag is *outstanding*: sent on
  this channel incarnation, acknowledgeable, and not settled yet. Then it settles that item, and
  with ``multiple`` every outstanding item numbered below it too ("up to and including");
- with ``multiple`` and tag 0 it settles every outstanding item;
- otherwise it settles nothing. "A message MUST not be acknowledged more than once. The receiving
  peer MUST validate that a non-zero delivery-tag refers to a delivered message, and raise a
  channel exception if this is not the case": RabbitMQ closes the channel with 406
  PRECONDITION_FAILED "unknown delivery tag N" (``rabbit_channel:collect_acks``) and acknowledges
  nothing, so a ``multiple`` ack of a tag not yet delivered, of one already settled, or of a
  no-ack delivery's tag does not settle the outstanding deliveries below it either.

As far as the capture can tell: tags run 1, 2, 3 ... on an incarnation, so a tag at or below the
highest one sent was sent, even where the capture missed that frame; it is already settled if an
earlier settlement named it since it was sent. A tag settled by a higher ``multiple`` before is not
detected as such, and need not be: everything that settlement could still settle was settled then.

Because the numbers only grow, every item's settlement is found with windows over the channel's
own rows, without replaying the channel one event at a time and without a join:

    settled(item) = min(the single settlement right after it among the rows naming its number,
                        the first valid multiple settlement at or above it)

Then each settled item row is doubled (``explode``) into a row at the settling frame, so running
sums over the frames count it there.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

# What a settlement row passes to the items it settles (frame_index first: structs order by it).
SETTLEMENT_FIELDS = ("frame_index", "method", "delivery_tag", "multiple", "ts", "packet_number", "direction")


def _sent_so_far(keys: Sequence[str]) -> WindowSpec:
    """A numbering's rows in frame order: the highest number sent before a settlement."""
    return Window.partitionBy(*keys).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, Window.currentRow)


def _naming_in_order(keys: Sequence[str]) -> WindowSpec:
    """The row sending a number and the settlements naming it, in frame order (every other row alone):
    a settlement is valid if the row before it there is its item's own."""
    return Window.partitionBy(*keys, "_named").orderBy("frame_index")


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


def settle(
    events: DataFrame,
    keys: Sequence[str],
    *,
    sent: Column,
    item: Column,
    settling: Column,
    fields: Sequence[str] = SETTLEMENT_FIELDS,
) -> DataFrame:
    """``events`` with ``_item`` and ``_settled``: on item rows, the ``fields`` of the row that settled
    the item (or null), by the rule of this module.

    ``keys``: one numbering (a channel incarnation, and which scheme); ``sent``: the number a row
    sends (every delivery, acknowledgeable or not; every publish in confirm mode); ``item``: the
    same on rows whose item awaits settlement (null for a no-ack delivery); ``settling``: true on
    the settlements, whose ``delivery_tag`` and ``multiple`` columns say what they name.
    ``fields`` must start with ``frame_index``: the earliest settlement wins.
    """
    if not fields or fields[0] != "frame_index":
        raise ValueError(f"settlement fields must start with frame_index, not {tuple(fields)}")
    info = F.struct(*fields)
    tag = F.col("delivery_tag")
    multiple = F.coalesce(F.col("multiple"), F.lit(False))
    is_settlement = F.col("_settling")
    named = F.when(is_settlement & (tag != 0), tag).otherwise(F.col("_sent"))
    # The previous row naming the same number: its item (valid), nothing (a sent frame the capture
    # missed: valid), a no-ack delivery or an earlier settlement (not outstanding: invalid).
    previous = F.lag(F.col("_item").isNotNull()).over(_naming_in_order(keys))
    outstanding = is_settlement & (tag != 0) & (tag <= F.col("_highest_sent")) & F.coalesce(previous, F.lit(True))
    marked = (
        events.withColumn("_sent", sent)
        .withColumn("_item", item)
        .withColumn("_settling", F.coalesce(settling, F.lit(False)))
        .withColumn("_highest_sent", F.max("_sent").over(_sent_so_far(keys)))
        # Rows naming no number get a key of their own (negative: numbers are positive).
        .withColumn("_named", F.coalesce(named, -1 - F.col("frame_index")))
        .withColumn("_outstanding", outstanding)
        .withColumn("_single", F.when(F.col("_outstanding") & ~multiple, tag))
        .withColumn(
            "_mark",
            F.when(is_settlement & multiple & (tag == 0), F.col("_highest_sent")).when(
                F.col("_outstanding") & multiple, tag
            ),
        )
        .withColumn("_number", F.coalesce(F.col("_mark"), F.col("_item")))
        .withColumn("_is_mark", F.col("_mark").isNotNull())
    )
    by_single = F.lead(F.when(F.col("_single").isNotNull(), info)).over(_naming_in_order(keys))
    by_multiple = F.min(F.when(F.col("_is_mark"), info)).over(_from_the_top(keys))
    return (
        # by_single right after the lag it depends on: the rows are still in that window's order
        # (one sort for both, where evaluating by_multiple between them sorted twice).
        marked.withColumn("_by_single", by_single)
        .withColumn("_settled", F.when(F.col("_item").isNotNull(), F.least(by_multiple, F.col("_by_single"))))
        .withColumn("_settled", F.when(F.col("_settled.frame_index") > F.col("frame_index"), F.col("_settled")))
        .drop(
            "_sent",
            "_settling",
            "_highest_sent",
            "_named",
            "_outstanding",
            "_single",
            "_mark",
            "_number",
            "_is_mark",
            "_by_single",
        )
    )


def with_settlement_rows(settled: DataFrame) -> DataFrame:
    """Each settled item row doubled: the row itself (``_is_event``), and a row at its settling frame
    with that frame's SETTLEMENT_FIELDS. ``_delta``: +1 on an item's own row, -1 on its settlement row."""
    doubled = settled.withColumn(
        "_is_event",
        F.explode(
            F.when(F.col("_settled").isNotNull(), F.array(F.lit(True), F.lit(False))).otherwise(F.array(F.lit(True)))
        ),
    )
    for name in SETTLEMENT_FIELDS:
        doubled = doubled.withColumn(name, F.when(F.col("_is_event"), F.col(name)).otherwise(F.col(f"_settled.{name}")))
    delta = F.when(~F.col("_is_event"), F.lit(-1)).when(F.col("_item").isNotNull(), F.lit(1)).otherwise(F.lit(0))
    return doubled.withColumn("_delta", delta.cast("long"))
