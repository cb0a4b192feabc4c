"""jobs.report.batch: several queries collected by one Spark query, each with its own rows and types."""

from __future__ import annotations

from datetime import datetime, timezone

import pyspark.sql.functions as F
from pyspark.sql import Window

from amqpscope.jobs.report.batch import collect_together


def executions(spark) -> int:
    # SQL executions the session has run so far (Spark's own SQL status store, kept without a UI).
    return spark._jsparkSession.sharedState().statusStore().executionsCount()


def as_set(rows) -> set[str]:
    return {repr(sorted(r.asDict(recursive=True).items())) for r in rows}


def queries(spark):
    ts = datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=timezone.utc)
    events = spark.createDataFrame(
        [("a", 1, ts, [1, 2], {"k": "v"}), ("a", 2, None, None, None), ("b", 3, ts, [], {})],
        "capture_id string, `n.dotted` long, ts timestamp, numbers array<long>, evidence map<string,string>",
    )
    ranked = events.withColumn("rank", F.row_number().over(Window.partitionBy("capture_id").orderBy("`n.dotted`")))
    return {
        "ranked": ranked,  # a window: a shuffle of its own
        "counts": events.groupBy("capture_id").agg(F.count(F.lit(1)).alias("rows"), F.max("ts").alias("last")),
        "first": events.orderBy(F.col("`n.dotted`").desc()).limit(1),
        "nothing": events.where(F.lit(False)).select("capture_id", F.struct("ts", "numbers").alias("nested")),
    }


def test_each_query_gets_its_own_rows_with_their_types(spark):
    asked = queries(spark)
    expected = {name: df.collect() for name, df in asked.items()}
    found = collect_together(asked)
    assert set(found) == set(asked)
    for name, rows in found.items():
        assert as_set(rows) == as_set(expected[name]), name
        assert len(rows) == len(expected[name]), name
    [first] = found["first"]
    assert first["n.dotted"] == 3 and first["ts"] == expected["first"][0]["ts"]


def test_the_queries_run_as_one_spark_query(spark):
    asked = queries(spark)
    before = executions(spark)
    collect_together(asked)
    assert executions(spark) - before == 1
    before = executions(spark)
    for df in asked.values():
        df.collect()
    assert executions(spark) - before == len(asked)


def test_no_query_asks_nothing_of_spark(spark):
    before = executions(spark)
    assert collect_together({}) == {}
    assert executions(spark) == before
