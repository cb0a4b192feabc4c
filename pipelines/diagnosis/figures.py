"""Small column helpers the diagnosis's measures share: the connection key, microseconds of a
timestamp, shares and rates, the packets a finding lists, and a DataFrame under new column
identities for a join with a table it was drawn from."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.held import MAX_PACKETS

CONNECTION = ("capture_id", "connection_id")
LOOPBACK = ("127.", "::1", "::ffff:127.")


def us(ts: Column | str) -> Column:
    return F.unix_micros(F.col(ts) if isinstance(ts, str) else ts)


def share(part: str, whole: str) -> Column:
    return F.col(part) / F.greatest(F.col(whole), F.lit(1))


def per_second(count: str, low: str, high: str) -> Column:
    """``count`` over the seconds from ``low`` to ``high`` (microseconds); null for an empty span."""
    seconds = (F.col(high) - F.col(low)) / F.lit(1e6)
    return F.when(seconds > 0, F.col(count) / seconds)


def apart(rows: DataFrame) -> DataFrame:
    """``rows`` under new column identities: the right side of a join with a table it was derived
    from (the same columns, traced to the same plan) is otherwise a self-join Spark may fail to
    resolve ("Failure when resolving conflicting references in Join")."""
    return rows.select(*[F.col(f"`{name}`").alias(name) for name in rows.columns])


def listed(packets: Column) -> Column:
    return F.slice(F.array_sort(F.array_distinct(packets)), 1, MAX_PACKETS)
