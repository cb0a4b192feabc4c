"""benchmarks/derive_rounds.py times derive's tables built again and again in one process: what it
builds must be the tables derive wrote, or its first and later rounds say nothing of derive."""

from __future__ import annotations

import pytest

from amqpscope.jobs.lake.lake import Lake
from tests.benchmark_scripts import benchmark_script
from tests.table_digests import sorted_rows


@pytest.fixture(scope="module")
def derive_rounds():
    with benchmark_script("derive_rounds") as module:
        yield module


def test_rounds_build_the_tables_derive_wrote(spark, samples_lake, derive_rounds, tmp_path):
    root, _, _ = samples_lake
    lake = Lake(spark, root)
    # The capture with the most frames.
    by_size = sorted(lake.read("frames").groupBy("capture_id").count().collect(), key=lambda r: -r["count"])
    capture_id = by_size[0]["capture_id"]
    setting = "spark.sql.windowExec.buffer.in.memory.threshold"
    done = derive_rounds.rounds(spark, lake, capture_id, ["messages"], "AB", {setting: "8192"}, tmp_path)

    assert [(r["round"], r["letter"]) for r in done] == [(0, "A"), (1, "B")]
    assert spark.conf.get(setting, None) is None  # a B round's setting is put back
    built = set(done[1]["tables"])
    expected_tables = {"messages_091", "deliveries_10"}
    assert built <= expected_tables and built  # the sample speaks at least one of the two
    # The shared result these read is timed apart: the channels' pass, for messages_091 alone.
    assert set(done[1]["shared"]) == ({"channels"} if "messages_091" in built else set())
    for name in built:
        stored = lake.read(name).filter(f"capture_id = '{capture_id}'")
        written = spark.read.parquet(str(tmp_path / "round-1" / name))
        assert sorted_rows(written, stored.columns) == sorted_rows(stored, stored.columns), name
        assert stored.count() > 0, name
    for r in done:
        assert r["jvm_cpu_s"] > 0 and r["wall_s"] > 0
        assert set(r["threads_cpu_s"]) <= {"c1", "c2", "tasks", "gc", "other", "ended"}


def test_a_later_step_reads_the_earlier_steps_as_stored(spark, samples_lake, derive_rounds, tmp_path):
    root, _, _ = samples_lake
    lake = Lake(spark, root)
    capture_id = sorted(lake.capture_ids("frames"))[0]
    done = derive_rounds.rounds(spark, lake, capture_id, ["diagnosis"], "A", {}, tmp_path)

    assert set(done[0]["tables"]) == {"bottlenecks", "diagnosis"}  # the flow tables were not built again
    stored = lake.read("bottlenecks").filter(f"capture_id = '{capture_id}'")
    written = spark.read.parquet(str(tmp_path / "round-0" / "bottlenecks"))
    assert sorted_rows(written, stored.columns) == sorted_rows(stored, stored.columns)
