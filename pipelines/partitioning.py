"""One shuffle per pipeline: every flow-state window is keyed by (capture_id, connection_id, ...).

Spark hash-partitions a window's input by its partition keys, and data already hash-partitioned by
a subset of them needs no new shuffle, only a sort. So a pipeline that repartitions its input by
connection first, and from then on only uses windows keyed by connection plus something (channel,
link, session, consumer) and row-level operations (explode instead of self-joins and unions, which
would compute the chain twice), shuffles its rows exactly once.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

CONNECTION = ("capture_id", "connection_id")


def by_connection(df: DataFrame) -> DataFrame:
    """``df`` hash-partitioned by connection: the one shuffle of a flow-state pipeline."""
    return df.repartition(*CONNECTION)
