"""How a run sets its session up for the size of its captures (jobs.engine.session.sized_for)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from amqpscope.jobs.engine.session import INTERPRETED_UP_TO_BYTES, JOINS_UNBROADCAST_UP_TO_BYTES, sized_for

WHOLE_STAGE = "spark.sql.codegen.wholeStage"
FACTORY = "spark.sql.codegen.factoryMode"
PARTITIONS = "spark.sql.shuffle.partitions"
ADAPTIVE = "spark.sql.adaptive.enabled"


def _settings(spark) -> tuple[str, str]:
    return spark.conf.get(WHOLE_STAGE), spark.conf.get(FACTORY)


def _plan_has_generated_code(df) -> bool:
    # Spark prints an operator of a whole-stage code block with "*(n)" before its name.
    return "*(" in df._jdf.queryExecution().executedPlan().toString()


def test_a_small_run_interprets_its_expressions_and_puts_the_settings_back(spark):
    df = spark.range(10).selectExpr("id * 2 AS twice").filter("twice > 4")
    before = _settings(spark)
    with sized_for(spark, INTERPRETED_UP_TO_BYTES) as interpreted:
        assert interpreted and _settings(spark) == ("false", "NO_CODEGEN")
        small = df.select("twice")
        assert [r.twice for r in small.collect()] == [6, 8, 10, 12, 14, 16, 18]
        assert not _plan_has_generated_code(small)
    assert _settings(spark) == before == ("true", "FALLBACK")
    assert _plan_has_generated_code(df.select("twice"))


def test_a_large_run_generates_code(spark):
    with sized_for(spark, INTERPRETED_UP_TO_BYTES + 1) as interpreted:
        assert not interpreted and _settings(spark) == ("true", "FALLBACK")


@pytest.mark.parametrize("key, value", [(WHOLE_STAGE, "false"), (FACTORY, "CODEGEN_ONLY")])
def test_settings_chosen_on_the_session_are_left_alone(spark, key, value):
    spark.conf.set(key, value)
    try:
        chosen = _settings(spark)
        with sized_for(spark, 1) as interpreted:
            assert not interpreted and _settings(spark) == chosen
        assert _settings(spark) == chosen
    finally:
        spark.conf.unset(key)


def test_a_cluster_session_is_left_alone():
    # No settings read or written: a session object with no settings at all goes through.
    cluster = SimpleNamespace(sparkContext=SimpleNamespace(master="spark://10.0.0.1:7077", getConf=None), conf=None)
    with sized_for(cluster, 1) as interpreted:
        assert not interpreted


def test_a_small_run_shuffles_into_a_partition_a_core_the_smallest_into_one_and_puts_the_setting_back(spark):
    before = spark.conf.get(PARTITIONS)
    assert before == "8"  # jobs.engine.session's own setting
    with sized_for(spark, INTERPRETED_UP_TO_BYTES):
        assert spark.conf.get(PARTITIONS) == str(spark.sparkContext.defaultParallelism) == "2"
    assert spark.conf.get(PARTITIONS) == before
    with sized_for(spark, JOINS_UNBROADCAST_UP_TO_BYTES + 1):
        assert spark.conf.get(PARTITIONS) == "2"
    with sized_for(spark, JOINS_UNBROADCAST_UP_TO_BYTES):
        assert spark.conf.get(PARTITIONS) == "1"
        grouped = spark.range(100).selectExpr("id % 3 AS k").groupBy("k").count()
        assert grouped.rdd.getNumPartitions() == 1
        assert sorted(r["count"] for r in grouped.collect()) == [33, 33, 34]
    assert spark.conf.get(PARTITIONS) == before
    with sized_for(spark, INTERPRETED_UP_TO_BYTES + 1):
        assert spark.conf.get(PARTITIONS) == before


def test_shuffle_partitions_chosen_on_the_session_are_left_alone(spark):
    spark.conf.set(PARTITIONS, "5")
    try:
        with sized_for(spark, 1) as small:
            assert small and spark.conf.get(PARTITIONS) == "5"
        assert spark.conf.get(PARTITIONS) == "5"
    finally:
        spark.conf.set(PARTITIONS, "8")


def test_a_small_run_plans_without_adaptive_execution_and_puts_the_setting_back(spark):
    assert spark.conf.get(ADAPTIVE) == "true"  # jobs.engine.session's own setting
    grouped = spark.range(100).selectExpr("id % 3 AS k").groupBy("k").count()
    with sized_for(spark, INTERPRETED_UP_TO_BYTES):
        assert spark.conf.get(ADAPTIVE) == "false"
        plan = grouped.select("k", "count")._jdf.queryExecution().executedPlan().toString()
        assert "AdaptiveSparkPlan" not in plan and "Exchange" in plan
        assert sorted(r["count"] for r in grouped.collect()) == [33, 33, 34]
    assert spark.conf.get(ADAPTIVE) == "true"
    assert "AdaptiveSparkPlan" in grouped.select("k")._jdf.queryExecution().executedPlan().toString()
    with sized_for(spark, INTERPRETED_UP_TO_BYTES + 1):
        assert spark.conf.get(ADAPTIVE) == "true"


def _join_strategy(df) -> str:
    plan = df._jdf.queryExecution().executedPlan().toString()
    return "broadcast" if "BroadcastHashJoin" in plan else "sort-merge" if "SortMergeJoin" in plan else plan


def test_the_smallest_runs_join_without_broadcasts_or_bloom_filters_and_put_the_settings_back(spark):
    from pyspark.sql import functions as F

    # Hints are resolved as a DataFrame is made: the pipelines make theirs within the block.
    def joins() -> tuple[str, str, int, int]:
        left = spark.range(50).selectExpr("id % 5 AS k", "id")
        hinted = left.join(F.broadcast(spark.range(5).withColumnRenamed("id", "k")), "k")
        small_side = left.join(spark.range(5).withColumnRenamed("id", "k"), "k")
        return _join_strategy(hinted), _join_strategy(small_side), hinted.count(), small_side.count()

    assert joins() == ("broadcast", "broadcast", 50, 50)
    with sized_for(spark, JOINS_UNBROADCAST_UP_TO_BYTES) as small:
        assert small and joins() == ("sort-merge", "sort-merge", 50, 50)
        assert spark.conf.get("spark.sql.optimizer.runtime.bloomFilter.enabled") == "false"
    assert joins() == ("broadcast", "broadcast", 50, 50)
    # A larger small run broadcasts as a large one does.
    with sized_for(spark, JOINS_UNBROADCAST_UP_TO_BYTES + 1) as small:
        assert small and joins() == ("broadcast", "broadcast", 50, 50)
        assert spark.conf.get("spark.sql.optimizer.runtime.bloomFilter.enabled") == "true"
    assert spark.conf.get("spark.sql.optimizer.runtime.bloomFilter.enabled") == "true"
    assert spark.conf.get("spark.sql.autoBroadcastJoinThreshold") == "10485760b"
    assert spark.conf.get("spark.sql.optimizer.disableHints") == "false"


def test_a_broadcast_threshold_chosen_on_the_session_is_left_alone(spark):
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "1048576")
    try:
        with sized_for(spark, 1) as small:
            assert small and spark.conf.get("spark.sql.autoBroadcastJoinThreshold") == "1048576"
        assert spark.conf.get("spark.sql.autoBroadcastJoinThreshold") == "1048576"
    finally:
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")
