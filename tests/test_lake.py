"""The lake's storage contract, on the delta-rs backend (this JVM has no Delta jars)."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.testing import assertDataFrameEqual

from amqpscope.jobs.engine import session
from amqpscope.jobs.lake import lake as lake_module
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.lake.read import read_table

SCHEMA = "capture_id string, n long, ts timestamp, m map<string,string>, b binary, s struct<x:int,tags:array<string>>"
TS = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
TS2 = datetime(2024, 5, 6, 7, 8, 9, 654321, tzinfo=UTC)


def rows_a() -> list[tuple]:
    return [
        ("cap-a", 1, TS, {"k": "v"}, b"\x00\x01", (7, ["x", "y"])),
        ("cap-a", 2, TS2, None, None, None),
    ]


def rows_b() -> list[tuple]:
    return [("cap-b", 10, TS, {}, b"", (None, []))]


@pytest.fixture()
def lake(spark, tmp_path) -> Lake:
    return Lake(spark, tmp_path / "lake")


def table_rows(lake: Lake, table: str) -> list[dict]:
    """The table as delta-rs reads it, sorted, for comparing with plain Python values."""
    rows = read_table(lake.table_path(table)).to_pylist()
    return sorted(rows, key=lambda r: (r["capture_id"], r["n"]))


def log_files(lake: Lake, table: str) -> list[str]:
    return sorted(DeltaTable(lake.table_path(table)).file_uris())


def test_auto_backend_is_delta_rs_without_delta_jars(spark, tmp_path):
    assert Lake(spark, tmp_path, backend="auto").backend == "delta-rs"
    assert Lake(spark, tmp_path).backend == "delta-rs"


def test_bad_backend_names_the_allowed_ones(spark, tmp_path):
    with pytest.raises(ValueError, match="auto, delta-spark, delta-rs.*'parquet'"):
        Lake(spark, tmp_path, backend="parquet")


def test_delta_spark_backend_needs_delta_jars(spark, tmp_path):
    with pytest.raises(ValueError, match="delta-spark"):
        Lake(spark, tmp_path, backend="delta-spark")


def test_table_path_is_under_the_root(lake, tmp_path):
    assert lake.table_path("frames") == str(tmp_path / "lake" / "frames")
    with pytest.raises(ValueError, match="table names"):
        lake.table_path("../frames")


def test_write_then_read_roundtrip(spark, lake):
    df = spark.createDataFrame(rows_a() + rows_b(), SCHEMA)
    lake.write(df, "frames", replace_capture_ids=["cap-a", "cap-b"])

    assert lake.exists("frames")
    actual = lake.read("frames")
    assertDataFrameEqual(actual, df)
    assert actual.schema.fieldNames() == df.schema.fieldNames()

    dt = DeltaTable(lake.table_path("frames"))
    assert dt.metadata().partition_columns == ["capture_id"]
    arrow_schema = read_table(lake.table_path("frames"), table=dt).schema
    assert arrow_schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert arrow_schema.field("b").type == pa.binary()
    assert table_rows(lake, "frames") == [
        {
            "capture_id": "cap-a",
            "n": 1,
            "ts": TS,
            "m": [("k", "v")],
            "b": b"\x00\x01",
            "s": {"x": 7, "tags": ["x", "y"]},
        },
        {"capture_id": "cap-a", "n": 2, "ts": TS2, "m": None, "b": None, "s": None},
        {"capture_id": "cap-b", "n": 10, "ts": TS, "m": [], "b": b"", "s": {"x": None, "tags": []}},
    ]


def test_rewriting_a_capture_is_idempotent_and_one_commit_each(spark, lake):
    df = spark.createDataFrame(rows_a(), SCHEMA)
    lake.write(df, "frames", replace_capture_ids=["cap-a"])
    first_files = log_files(lake, "frames")
    lake.write(df, "frames", replace_capture_ids=["cap-a"])

    assertDataFrameEqual(lake.read("frames"), df)
    dt = DeltaTable(lake.table_path("frames"))
    assert dt.version() == 1
    assert len(dt.file_uris()) == len(first_files)
    assert set(dt.file_uris()).isdisjoint(first_files)  # the second write's files replaced the first's


def test_writing_capture_b_leaves_capture_a_untouched(spark, lake):
    df_a = spark.createDataFrame(rows_a(), SCHEMA)
    lake.write(df_a, "frames", replace_capture_ids=["cap-a"])
    files_a = log_files(lake, "frames")
    df_b = spark.createDataFrame(rows_b(), SCHEMA)
    lake.write(df_b, "frames", replace_capture_ids=["cap-b"])

    assertDataFrameEqual(lake.read("frames"), df_a.unionByName(df_b))
    assert set(files_a) <= set(log_files(lake, "frames"))


def test_replacing_a_capture_with_fewer_rows_removes_the_old_ones(spark, lake):
    lake.write(spark.createDataFrame(rows_a() + rows_b(), SCHEMA), "frames", replace_capture_ids=["cap-a", "cap-b"])
    fewer = spark.createDataFrame(rows_a()[1:], SCHEMA)
    lake.write(fewer, "frames", replace_capture_ids=["cap-a"])

    expected = spark.createDataFrame(rows_a()[1:] + rows_b(), SCHEMA)
    assertDataFrameEqual(lake.read("frames"), expected)
    assert [(r["capture_id"], r["n"]) for r in table_rows(lake, "frames")] == [("cap-a", 2), ("cap-b", 10)]


def test_empty_write_creates_a_readable_empty_table(spark, lake):
    empty = spark.createDataFrame([], SCHEMA)
    lake.write(empty, "frames", replace_capture_ids=["cap-a"])

    actual = lake.read("frames")
    assert actual.count() == 0
    assert actual.schema == empty.schema
    arrow = read_table(lake.table_path("frames"))
    assert arrow.num_rows == 0
    assert arrow.column_names == empty.schema.fieldNames()


def test_empty_write_removes_the_capture(spark, lake):
    lake.write(spark.createDataFrame(rows_a() + rows_b(), SCHEMA), "frames", replace_capture_ids=["cap-a", "cap-b"])
    lake.write(spark.createDataFrame([], SCHEMA), "frames", replace_capture_ids=["cap-a"])

    assertDataFrameEqual(lake.read("frames"), spark.createDataFrame(rows_b(), SCHEMA))
    assert DeltaTable(lake.table_path("frames")).version() == 1


def test_rows_of_other_captures_are_rejected_and_nothing_is_committed(spark, lake):
    lake.write(spark.createDataFrame(rows_a(), SCHEMA), "frames", replace_capture_ids=["cap-a"])
    table_dir = lake.table_path("frames")
    files_before = sorted(os.path.join(d, f) for d, _, fs in os.walk(table_dir) for f in fs)

    with pytest.raises(ValueError, match="cap-b"):
        lake.write(spark.createDataFrame(rows_a() + rows_b(), SCHEMA), "frames", replace_capture_ids=["cap-a"])

    assert DeltaTable(table_dir).version() == 0
    assert sorted(os.path.join(d, f) for d, _, fs in os.walk(table_dir) for f in fs) == files_before


def test_columns_added_at_the_end_widen_the_table_and_earlier_rows_read_them_as_null(spark, lake):
    lake.write(spark.createDataFrame(rows_a(), SCHEMA), "frames", replace_capture_ids=["cap-a"])
    wider = f"{SCHEMA}, extra string, count long"
    lake.write(spark.createDataFrame([(*rows_b()[0], "x", 3)], wider), "frames", replace_capture_ids=["cap-b"])

    table = DeltaTable(lake.table_path("frames"))
    assert table.version() == 1
    assert [f.name for f in table.schema().fields][-2:] == ["extra", "count"]
    assert [(r["capture_id"], r["n"], r["extra"], r["count"]) for r in table_rows(lake, "frames")] == [
        ("cap-a", 1, None, None),
        ("cap-a", 2, None, None),
        ("cap-b", 10, "x", 3),
    ]
    read = lake.read("frames").select("capture_id", "n", "extra", "count")
    assertDataFrameEqual(
        read,
        spark.createDataFrame(
            [("cap-a", 1, None, None), ("cap-a", 2, None, None), ("cap-b", 10, "x", 3)],
            "capture_id string, n long, extra string, count long",
        ),
    )


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (
            "capture_id string, n int, ts timestamp, m map<string,string>, b binary, s struct<x:int,tags:array<string>>",
            'column \'n\' has type "integer", not "long"',
        ),
        (
            "capture_id string, n long, m map<string,string>, b binary, s struct<x:int,tags:array<string>>",
            "column 'ts' is missing",
        ),
        (
            "capture_id string, ts timestamp, n long, m map<string,string>, b binary, s struct<x:int,tags:array<string>>",
            "column 'n' is not in place 2",
        ),
        (
            "extra string, capture_id string, n long, ts timestamp, m map<string,string>, b binary, "
            "s struct<x:int,tags:array<string>>",
            "column 'capture_id' is not in place 1",
        ),
    ],
    ids=["retyped", "dropped", "moved", "added-first"],
)
def test_other_schema_changes_are_rejected_naming_the_column(spark, lake, schema, message):
    lake.write(spark.createDataFrame(rows_a(), SCHEMA), "frames", replace_capture_ids=["cap-a"])
    files_before = log_files(lake, "frames")
    changed = spark.createDataFrame([], schema)
    with pytest.raises(ValueError, match=f"does not fit table .*frames.*{message}"):
        lake.write(changed, "frames", replace_capture_ids=["cap-a"])
    assert DeltaTable(lake.table_path("frames")).version() == 0
    assert log_files(lake, "frames") == files_before


@pytest.mark.parametrize(
    ("replace_capture_ids", "partition_by", "error"),
    [
        ([], ("capture_id",), ValueError),
        ("cap-a", ("capture_id",), TypeError),
        (["cap-a"], ("n",), ValueError),
        (["cap-a"], ("capture_id", "ts"), ValueError),
    ],
)
def test_bad_write_arguments_are_rejected(spark, lake, replace_capture_ids, partition_by, error):
    with pytest.raises(error):
        lake.write(
            spark.createDataFrame(rows_a(), SCHEMA),
            "frames",
            replace_capture_ids=replace_capture_ids,
            partition_by=partition_by,
        )
    assert not lake.exists("frames")


def test_files_are_in_partition_directories_and_staging_is_cleaned(spark, lake):
    lake.write(spark.createDataFrame(rows_a() + rows_b(), SCHEMA), "frames", replace_capture_ids=["cap-a", "cap-b"])
    table_dir = lake.table_path("frames")
    dirs = sorted({os.path.relpath(os.path.dirname(f), table_dir) for f in log_files(lake, "frames")})
    assert dirs == ["capture_id=cap-a", "capture_id=cap-b"]
    assert sorted(os.listdir(table_dir)) == ["_delta_log", "capture_id=cap-a", "capture_id=cap-b"]


def test_capture_ids_that_need_escaping_roundtrip(spark, lake):
    ids = ["a b", "x:y%z/w", "it's", "ü"]
    df = spark.createDataFrame([(cid, i) for i, cid in enumerate(ids)], "capture_id string, n long")
    lake.write(df, "odd", replace_capture_ids=ids)
    lake.write(df.where("n = 1"), "odd", replace_capture_ids=["x:y%z/w"])

    assertDataFrameEqual(lake.read("odd"), df)
    assert [(r["capture_id"], r["n"]) for r in table_rows(lake, "odd")] == sorted((c, i) for i, c in enumerate(ids))


def test_reads_a_table_whose_directories_spark_cannot_decode(spark, lake):
    # delta-rs escapes non-ASCII directory names as UTF-8 bytes, which Spark's partition
    # discovery would decode as Latin-1; the log's partition values must win.
    path = lake.table_path("foreign")
    write_deltalake(path, pa.table({"capture_id": ["ü", "plain"], "n": [1, 2]}), partition_by=["capture_id"])

    expected = spark.createDataFrame([("ü", 1), ("plain", 2)], "capture_id string, n long")
    assertDataFrameEqual(lake.read("foreign"), expected)


def test_read_with_a_schema_gives_its_columns_in_its_order(spark, lake):
    lake.write(spark.createDataFrame(rows_a(), SCHEMA), "frames", replace_capture_ids=["cap-a"])
    actual = lake.read("frames", schema=spark.createDataFrame([], "n long, capture_id string").schema)
    assertDataFrameEqual(actual, spark.createDataFrame([(1, "cap-a"), (2, "cap-a")], "n long, capture_id string"))


def test_reading_a_missing_table_raises(lake):
    assert not lake.exists("frames")
    with pytest.raises(FileNotFoundError, match="frames"):
        lake.read("frames")


def test_table_columns_are_nullable_like_delta_spark(spark, lake):
    strict = spark.createDataFrame([("cap-a", 1)], "capture_id string not null, n long not null")
    lake.write(strict, "counts", replace_capture_ids=["cap-a"])
    loose = spark.createDataFrame([("cap-a", 2)], "capture_id string, n long")
    lake.write(loose, "counts", replace_capture_ids=["cap-a"])

    actual = lake.read("counts")
    assert [f.nullable for f in actual.schema.fields] == [True, True]
    assertDataFrameEqual(actual, loose)


def test_a_failed_commit_leaves_no_files_behind(spark, lake, monkeypatch):
    lake.write(spark.createDataFrame(rows_a(), SCHEMA), "frames", replace_capture_ids=["cap-a"])
    table_dir = lake.table_path("frames")
    files_before = sorted(os.path.join(d, f) for d, _, fs in os.walk(table_dir) for f in fs)

    def refuse(*args, **kwargs):
        raise RuntimeError("commit refused")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", refuse)
    with pytest.raises(RuntimeError, match="commit refused"):
        lake.write(spark.createDataFrame(rows_a(), SCHEMA), "frames", replace_capture_ids=["cap-a"])

    assert sorted(os.path.join(d, f) for d, _, fs in os.walk(table_dir) for f in fs) == files_before
    assert sorted(os.listdir(table_dir)) == ["_delta_log", "capture_id=cap-a"]


# --- a few rows made on the driver: write_rows / read_rows (the runs table) ---------------------

SMALL = "capture_id string, stage string, started timestamp, ended timestamp, n long"


def small_rows(capture_ids) -> list[dict]:
    return [
        {"capture_id": cid, "stage": stage, "started": TS, "ended": TS2 if stage == "ingest" else None, "n": i}
        for i, cid in enumerate(capture_ids)
        for stage in ("ingest", "derive")
    ]


def executions(spark) -> int:
    # SQL executions the session has run so far (Spark's own SQL status store, kept without a UI).
    return spark._jsparkSession.sharedState().statusStore().executionsCount()


def test_rows_written_on_the_driver_read_as_spark_wrote_them(spark, lake):
    ids = ["cap-a", "a b", "x:y%z/w", "it's", "ü", "q=1?#[]"]
    schema = spark.createDataFrame([], SMALL).schema
    lake.write_rows(small_rows(ids), schema, "small", replace_capture_ids=ids)
    lake.write(spark.createDataFrame(small_rows(ids), schema), "by_spark", replace_capture_ids=ids)

    # Spark reads them (partition values from the directories), with the same rows and schema.
    assertDataFrameEqual(lake.read("small"), lake.read("by_spark"))
    assert lake.read("small").schema == lake.read("by_spark").schema
    # The same directories and Delta schema (columns' comments included) as Spark's write.
    directories = {
        t: sorted(os.path.dirname(f).rsplit("/", 1)[1] for f in log_files(lake, t)) for t in ("small", "by_spark")
    }
    assert directories["small"] == directories["by_spark"]
    assert DeltaTable(lake.table_path("small")).schema() == DeltaTable(lake.table_path("by_spark")).schema()
    # Statistics for file skipping, as for Spark's files.
    small = pa.table(DeltaTable(lake.table_path("small")).get_add_actions(flatten=True)).to_pylist()
    assert {(r["partition.capture_id"], r["num_records"], r["min.started"], r["null_count.ended"]) for r in small} == {
        (cid, 2, TS, 1) for cid in ids
    }


def test_a_small_run_stages_rows_through_the_driver_as_spark_writes_them(spark, lake):
    # jobs.engine.session.sized_for has the lake stage a small run's rows through Arrow (pyarrow writes
    # them), not Spark's Parquet writer: every type and odd partition values read back alike.
    ids = ["cap-a", "a b", "x:y%z/w", "it's", "ü", "q=1?#[]"]
    rows = [(cid, n, TS, {"k": cid}, bytes([n]), (n, [cid])) for n, cid in enumerate(ids)] + rows_a() + rows_b()
    df = spark.createDataFrame(rows, SCHEMA)
    written = ids + ["cap-b"]
    lake.write(df, "by_spark", replace_capture_ids=written)
    with session.sized_for(spark, 1):
        assert spark.conf.get(session.STAGE_ON_DRIVER) == "true"
        lake.write(df, "on_driver", replace_capture_ids=written)
        # A Spark job ran for the rows (toArrow), none wrote Parquet: the files are pyarrow's.
        files = log_files(lake, "on_driver")
    assert all(pq.read_metadata(f.removeprefix("file://")).created_by.startswith("parquet-cpp") for f in files)
    assert spark.conf.get(session.STAGE_ON_DRIVER, "false") == "false"  # put back after the run

    assertDataFrameEqual(lake.read("on_driver"), lake.read("by_spark"))
    assert lake.read("on_driver").schema == lake.read("by_spark").schema
    assert table_rows(lake, "on_driver") == table_rows(lake, "by_spark")
    directories = {
        t: sorted({os.path.dirname(f).rsplit("/", 1)[1] for f in log_files(lake, t)}) for t in ("on_driver", "by_spark")
    }
    assert directories["on_driver"] == directories["by_spark"]
    assert len(files) == len(directories["on_driver"]) == 7  # a file a capture


@pytest.mark.parametrize("small", [False, True], ids=["spark-writer", "staged-on-driver"])
def test_write_and_read_gives_the_rows_as_stored(spark, lake, small):
    # derive reads each table it writes back as stored; a small run keeps the rows it staged
    # instead of scanning its files: the same rows, columns and types as a read of the table.
    lake.write(spark.createDataFrame(rows_b(), SCHEMA), "t", replace_capture_ids=["cap-b"])
    df = spark.createDataFrame(rows_a() + [("cap-c", 3, TS, None, None, None)], SCHEMA)
    with session.sized_for(spark, 1 if small else 1 << 40):
        got = lake.write_and_read(df, "t", replace_capture_ids=["cap-a", "cap-c"], capture_ids=["cap-a"])
        kept = "LocalTableScan" in got._jdf.queryExecution().executedPlan().toString()
        stored = lake.read("t").filter("capture_id = 'cap-a'")
        assert got.schema == stored.schema
        assertDataFrameEqual(got, stored)
        assert sorted(r.n for r in got.collect()) == [1, 2]
    assert kept == small  # rows kept on the driver only where they were staged there
    assert sorted(r["capture_id"] for r in table_rows(lake, "t")) == ["cap-a", "cap-a", "cap-b", "cap-c"]


def test_write_and_read_scans_the_files_of_rows_too_large_to_keep(spark, lake, monkeypatch):
    monkeypatch.setattr(lake_module, "KEPT_UP_TO_BYTES", 0)
    df = spark.createDataFrame(rows_a(), SCHEMA)
    with session.sized_for(spark, 1):
        got = lake.write_and_read(df, "t", replace_capture_ids=["cap-a"], capture_ids=["cap-a"])
        plan = got._jdf.queryExecution().executedPlan().toString()
    assert "LocalTableScan" not in plan and "FileScan parquet" in plan
    assertDataFrameEqual(got, lake.read("t"))


def test_read_rows_gives_the_rows_of_the_chosen_captures(spark, lake):
    schema = spark.createDataFrame([], SMALL).schema
    lake.write_rows(small_rows(["cap-a", "cap-b"]), schema, "small", replace_capture_ids=["cap-a", "cap-b"])

    def key(r):
        return (r["capture_id"], r["stage"])

    written = small_rows(["cap-a", "cap-b"])
    assert sorted(lake.read_rows("small", schema, ["cap-b"]), key=key) == sorted(
        [r for r in written if r["capture_id"] == "cap-b"], key=key
    )
    assert sorted(lake.read_rows("small", schema), key=key) == sorted(written, key=key)
    assert lake.read_rows("small", schema, []) == []


def test_write_rows_replaces_only_its_captures_and_runs_no_spark_job(spark, lake):
    schema = spark.createDataFrame([], SMALL).schema
    lake.write_rows(small_rows(["cap-a", "cap-b"]), schema, "small", replace_capture_ids=["cap-a", "cap-b"])
    before = executions(spark)
    again = [{**r, "n": 9} for r in small_rows(["cap-b"])]
    lake.write_rows(again, schema, "small", replace_capture_ids=["cap-b"])
    lake.write_rows([], schema, "small", replace_capture_ids=["cap-a"])  # cap-a's rows go
    found = lake.read_rows("small", schema)
    assert executions(spark) == before
    assert sorted((r["capture_id"], r["stage"], r["n"]) for r in found) == [
        ("cap-b", "derive", 9),
        ("cap-b", "ingest", 9),
    ]


def test_write_rows_refuses_rows_of_other_captures_and_commits_nothing(spark, lake):
    schema = spark.createDataFrame([], SMALL).schema
    lake.write_rows(small_rows(["cap-a"]), schema, "small", replace_capture_ids=["cap-a"])
    version = DeltaTable(lake.table_path("small")).version()
    with pytest.raises(ValueError, match="cap-b"):
        lake.write_rows(small_rows(["cap-b"]), schema, "small", replace_capture_ids=["cap-a"])
    assert DeltaTable(lake.table_path("small")).version() == version
    assert sorted(os.listdir(lake.table_path("small"))) == ["_delta_log", "capture_id=cap-a"]


def test_read_rows_gives_null_for_a_column_the_table_does_not_have_yet(spark, lake):
    older = spark.createDataFrame([], "capture_id string, stage string").schema
    lake.write_rows([{"capture_id": "cap-a", "stage": "ingest"}], older, "small", replace_capture_ids=["cap-a"])
    newer = spark.createDataFrame([], SMALL).schema
    assert lake.read_rows("small", newer) == [
        {"capture_id": "cap-a", "stage": "ingest", "started": None, "ended": None, "n": None}
    ]
    assert [r.asDict() for r in lake.read("small", newer).collect()] == lake.read_rows("small", newer)
