"""``amqpscope maintain`` on a delta-rs lake: a capture's small files compacted into one, the files no
version of the retention window needs removed, and the rows the same before and after."""

from __future__ import annotations

from datetime import UTC, datetime

from deltalake import DeltaTable
from pyspark.testing import assertDataFrameEqual

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.maintain import maintain_lake
from amqpscope.schemas.runs import RUNS_SCHEMA

T = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def files(lake: Lake, table: str) -> int:
    return len(DeltaTable(lake.table_path(table)).file_uris())


def test_maintain_compacts_and_vacuums_without_changing_rows(spark, tmp_path):
    config = AnalyzeConfig(lake=tmp_path / "lake", storage="delta-rs")
    lake = Lake.of(spark, config)
    rows = [
        (cid, stage, f"r-{stage}", T, T, "ok", None, None, None)  # no owner, no lease: finished runs
        for cid in ("cap-a", "cap-b")
        for stage in ("ingest", "derive", "report")
    ]
    first = spark.createDataFrame(rows, RUNS_SCHEMA)
    lake.write(first.repartition(3), "runs", replace_capture_ids=["cap-a", "cap-b"])
    # cap-b written again: its files of the first write are referenced by the first version only.
    lake.write(first.filter("capture_id = 'cap-b'").coalesce(1), "runs", replace_capture_ids=["cap-b"])
    before = lake.read("runs")
    expected = before.collect()
    small = files(lake, "runs")
    assert small > 2  # cap-a's rows in several files

    kept = maintain_lake(spark, config)  # the default retention: the replaced files are too young to go
    [runs] = kept.tables
    assert (runs.table, runs.files_before, runs.files_after, runs.files_vacuumed) == ("runs", small, 2, 0)
    assertDataFrameEqual(lake.read("runs"), expected)

    # With a table that keeps removed files for no time, a zero retention removes them.
    DeltaTable(lake.table_path("runs")).alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 0 hours"}
    )
    [runs] = maintain_lake(spark, config, retain_hours=0).tables
    assert (runs.files_before, runs.files_after) == (2, 2)
    assert runs.files_vacuumed > 0
    assertDataFrameEqual(lake.read("runs"), expected)
    on_disk = [p for p in (tmp_path / "lake" / "runs").rglob("*.parquet")]
    assert len(on_disk) == 2  # only the current version's files are left
