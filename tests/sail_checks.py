"""The embedded engine (jobs.engine.sail): a Sail server in this process, a Spark Connect session on it.

PySpark holds one kind of session a process (its Column classes follow one process-wide switch), so
these checks run in a pytest process of their own, started by tests/test_sail.py; a test worker
already holds the classic session."""

from __future__ import annotations

import os

import pyspark.sql.functions as F
import pytest

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.expectations.bottleneck_rules import bind
from amqpscope.jobs.engine.sail import CHECKPOINT_PATH, engine_session, is_sail, start_sail
from amqpscope.pipelines import engine
from amqpscope.pipelines.partitioning import checkpointed, kept


def test_a_sail_engine_answers_on_loopback_and_stop_removes_its_checkpoints():
    started = start_sail()
    try:
        host, _port = started.server.listening_address
        assert (host, started.url.startswith(f"sc://{host}:")) == ("127.0.0.1", True)
        assert is_sail(started.session)
        # What Sail does its own way is set on its session; the folder its checkpoints go to is its own.
        assert {k: started.session.conf.get(k) for k in engine.SAIL} == engine.SAIL
        assert CHECKPOINT_PATH not in os.environ
        assert os.path.isdir(started.checkpoints)
    finally:
        started.stop()
    assert not os.path.exists(started.checkpoints)
    assert not is_sail(started.session)


def test_checkpoints_on_sail_keep_rows_whose_stated_types_sail_does_not_return(sail_spark):
    # A struct with a non-null field and a string from a string function: Sail refused to store both
    # as they were ("checkpoint storage schema does not match the input schema by position").
    rows = sail_spark.createDataFrame([(1, "a%2Fb"), (2, None)], "n int, q string").select(
        "n",
        F.struct(F.coalesce(F.col("n") > 1, F.lit(False)).alias("big"), "q").alias("s"),
        F.concat(F.lit("/queues/"), F.url_decode("q")).alias("address"),
    )
    want = [(1, (False, "a%2Fb"), "/queues/a/b"), (2, (True, None), None)]
    for keep in (checkpointed, kept):
        got = sorted((r.n, tuple(r.s), r.address) for r in keep(rows).collect())
        assert got == want


def test_the_engine_hook_opens_a_sail_session_of_its_own_and_refuses_an_unknown_engine(sail_spark):
    with engine_session("sail") as session:
        assert (is_sail(session), session.session_id != sail_spark.session_id) == (True, True)
        assert session.range(3).agg(F.sum("id")).first()[0] == 3
    assert not is_sail(session)
    assert sail_spark.range(2).count() == 2  # the other engine still answers
    with pytest.raises(ValueError, match="not one of spark, sail"):
        with engine_session("duckdb"):
            pass


def test_rule_expressions_are_bound_with_double_literals_and_their_strings_kept():
    # Sail computes least(0.9, <double>) as a decimal of scale 15; written as doubles, every engine
    # computes what Spark computes for the decimal literal beside a double.
    limits = DiagnosisThresholds()
    got = bind("least(0.9, 0.4 + 0.25 * held_share) and name = 'v1.5' and x1.5 > 2 and a.b > 1e-3", limits)
    assert got == "least(0.9D, 0.4D + 0.25D * held_share) and name = 'v1.5' and x1.5 > 2 and a.b > 1e-3"


def test_a_table_of_many_captures_reads_on_sail_in_a_plan_its_client_accepts(sail_spark, tmp_path):
    # On Sail a table is read one scan a capture (jobs.lake.lake); unioned one after another, 300 captures
    # made a plan deeper than the Spark Connect client's protobuf limit ("Exceeded
    # upb_DecodeOptions_MaxDepth") once a measure joined it and kept the result.
    import pyarrow as pa
    from deltalake import write_deltalake

    from amqpscope.jobs.lake.lake import Lake

    captures = [f"capture-{n:03d}" for n in range(300)]
    rows = pa.table({"capture_id": captures, "packets": pa.array(range(300), pa.int64())})
    write_deltalake(str(tmp_path / "captures"), rows, partition_by=["capture_id"])
    table = Lake(sail_spark, tmp_path).read("captures")
    joined = table.join(table.withColumnRenamed("packets", "again"), "capture_id")
    got = kept(joined.filter(F.col("packets") == F.col("again"))).orderBy("capture_id").collect()
    assert [(r.capture_id, r.packets) for r in got] == list(zip(captures, range(300)))
