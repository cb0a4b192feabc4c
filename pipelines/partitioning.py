"""One shuffle per pipeline: every flow-state window is keyed by (capture_id, connection_id, ...).

Spark hash-partitions a window's input by its partition keys, and data already hash-partitioned by
a subset of them needs no new shuffle, only a sort. So a pipeline that repartitions its input by
connection first, and from then on only uses windows keyed by connection plus something (channel,
link, session, consumer) and row-level operations (explode instead of self-joins and unions, which
would compute the chain twice), shuffles its rows exactly once.
"""

from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from amqpscope.pipelines.engine import CHECKPOINT_ON_DISK, does

CONNECTION = ("capture_id", "connection_id")
# A 0-9-1 channel number is reused after channel.close: each channel.open starts a new incarnation.
CHANNEL = (*CONNECTION, "channel", "incarnation")
_ADAPTIVE = "spark.sql.adaptive.enabled"


def checkpointed(rows: DataFrame) -> DataFrame:
    """``rows`` computed now and kept on disk (a local checkpoint, as ingest keeps its intermediates:
    the heap stays the same whatever the capture), still known to be partitioned as they were.

    A checkpoint keeps the partitioning its plan states, and a plan of adaptive execution states
    none: every window over a connection's rows after it would shuffle them again (at 1 M frames,
    ``messages_091`` shuffled the channels' rows four times). So the checkpoint is planned without
    adaptive execution (its windows gain nothing from it), and the session's setting is put back
    after. A session that does not let the setting change (a shared cluster's may not) checkpoints
    as it is set.
    """
    spark = rows.sparkSession
    adaptive = spark.conf.get(_ADAPTIVE, "true")
    changed = False
    if adaptive != "false":
        try:
            spark.conf.set(_ADAPTIVE, "false")
            changed = True
        except Exception:  # not a setting this session lets a job change
            pass
    try:
        if not does(spark, CHECKPOINT_ON_DISK):
            return _as_checkpoint_stores(rows).localCheckpoint()
        return rows.localCheckpoint(storageLevel=StorageLevel.DISK_ONLY)
    finally:
        if changed:
            spark.conf.set(_ADAPTIVE, adaptive)


def kept(rows: DataFrame) -> DataFrame:
    """``rows`` computed now and kept where the engine keeps a local checkpoint by default (Spark:
    memory, then disk), their plan cut there: what a few rows read by several queries need."""
    if not does(rows.sparkSession, CHECKPOINT_ON_DISK):
        return _as_checkpoint_stores(rows).localCheckpoint()
    return rows.localCheckpoint()


def _as_checkpoint_stores(rows: DataFrame) -> DataFrame:
    """``rows``, the same values, in the types an engine's checkpoint storage holds them in when it
    keeps them its own way (Sail): each column cast to the type its plan states (some of Sail's
    functions return another Arrow type than they state: a string layout, an int64 for an int's
    percentile), each struct built again from its fields, every field nullable (the storage takes
    them so). Otherwise Sail refuses the checkpoint: "checkpoint storage schema does not match the
    input schema by position"."""

    def stated(column: Column, data_type: DataType) -> Column:
        if isinstance(data_type, StructType):
            # A when without otherwise: nullable, whatever the field was.
            fields = [
                F.when(column[f.name].isNotNull(), stated(column[f.name], f.dataType)).alias(f.name)
                for f in data_type.fields
            ]
            return F.when(column.isNotNull(), F.struct(*fields))
        return column.cast(data_type)

    return rows.select(*[stated(F.col(f.name), f.dataType).alias(f.name) for f in rows.schema.fields])


def by_connection(df: DataFrame) -> DataFrame:
    """``df`` hash-partitioned by connection: the one shuffle of a flow-state pipeline."""
    return df.repartition(*CONNECTION)


def channel_incarnation() -> Column:
    """A frame's ``incarnation``: how many channel.open its channel number has seen so far."""
    # A channel number's frames in order, across re-opens.
    number_so_far = (
        Window.partitionBy(*CONNECTION, "channel")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return F.sum((F.col("method") == "channel.open").cast("int")).over(number_so_far)


def channel_so_far() -> WindowSpec:
    """One channel incarnation's frames in order: what a channel's running counts are taken over."""
    return Window.partitionBy(*CHANNEL).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, Window.currentRow)


def channel_after_frame() -> WindowSpec:
    """A channel incarnation's rows in frame order, a frame's rows together: every row sees the
    state after its frame (settlement rows share their settling frame's index)."""
    return (
        Window.partitionBy(*CHANNEL).orderBy("frame_index").rangeBetween(Window.unboundedPreceding, Window.currentRow)
    )


def frame_of_channel() -> WindowSpec:
    """A channel incarnation's rows of one frame: what that frame settled."""
    return Window.partitionBy(*CHANNEL, "frame_index")


def next_value(name: str, window: WindowSpec) -> Column:
    """Column ``name``'s value on the nearest later row of ``window`` (a partition in order) where it
    is not null: ``lead(name, 1) IGNORE NULLS``, one pass over the window's sorted rows.

    (Not ``first(name, ignorenulls)`` over a frame from the next row to ``unboundedFollowing``:
    Spark evaluates that frame by aggregating the rest of the partition again for every row, which
    is quadratic in a partition's rows: a TCP direction, a consumer or a link of a long capture.)
    """
    return F.expr(f"lead(`{name}`, 1) IGNORE NULLS").over(window)
