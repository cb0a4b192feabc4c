"""Row counts taken from the Delta log equal the rows written, capture by capture."""

from __future__ import annotations

from amqpscope.jobs.lake.commits import committed_row_counts, committed_rows
from amqpscope.jobs.lake.lake import Lake


def test_row_counts_come_from_the_log_per_capture(spark, tmp_path):
    lake = Lake(spark, tmp_path / "lake", backend="delta-rs")
    rows = [("a", i) for i in range(5)] + [("b", i) for i in range(3)] + [("c", i) for i in range(7)]
    df = spark.createDataFrame(rows, "capture_id string, n int").repartition(3)
    lake.write(df, "t", replace_capture_ids=["a", "b", "c"])
    assert committed_rows(lake.table_path("t"), ["a"]) == 5
    assert committed_rows(lake.table_path("t"), ["b", "c"]) == 10
    assert committed_rows(lake.table_path("t"), ["z"]) == 0
    # Capture b written again with one row: the log's snapshot drops its three files' rows.
    lake.write(spark.createDataFrame([("b", 9)], "capture_id string, n int"), "t", replace_capture_ids=["b"])
    assert committed_row_counts(lake, ["t"], ["a", "b"]) == {"t": 6}
