"""A damaged Delta log is reported, naming the table and the version, never read as a commit of nothing;
and the lake is checked against what a run committed before its captures are called complete.

delta-rs reads an empty commit file as a commit without actions: the rows that commit added vanish
and the next write commits over it (issue 32: 8,422 frames lost, the capture still "complete").
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.errors import DamagedLog, StoredRowsMismatch
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.stages import StageClock, StageFailed, one_line
from tests.racers import SCHEMA


def rows(capture: str, n: int) -> list[dict]:
    return [{"capture_id": capture, "writer": 0, "n": i} for i in range(n)]


def lake_with_commits(tmp_path) -> Lake:
    lake = Lake(None, tmp_path / "lake", backend="delta-rs", run_id="r1")
    lake.write_rows(rows("a", 2), SCHEMA, "t", replace_capture_ids=["a"])
    lake.write_rows(rows("b", 3), SCHEMA, "t", replace_capture_ids=["b"])
    lake.write_rows(rows("c", 4), SCHEMA, "t", replace_capture_ids=["c"])
    return lake


def commit_file(lake: Lake, version: int) -> str:
    return os.path.join(lake.table_path("t"), "_delta_log", f"{version:020d}.json")


def test_an_empty_last_commit_is_reported_not_taken_for_a_commit_of_nothing(tmp_path):
    lake = lake_with_commits(tmp_path)
    open(commit_file(lake, 2), "wb").close()  # cut short: capture c's commit
    expected = (
        r"^table t: Delta log damaged: commit 2 \(_delta_log/00000000000000000002\.json\) is empty "
        r"\(0 bytes\): the commit was cut short \(a crash or a full disk\); a reader would take it as a "
        r"commit of nothing$"
    )
    with pytest.raises(DamagedLog, match=expected) as read:
        lake.read_rows("t", SCHEMA)
    assert (read.value.table, read.value.version) == ("t", 2)
    with pytest.raises(DamagedLog, match=expected):  # nor is the next write committed over it
        lake.write_rows(rows("d", 1), SCHEMA, "t", replace_capture_ids=["d"])
    assert sorted(os.listdir(os.path.dirname(commit_file(lake, 0)))) == [f"{v:020d}.json" for v in range(3)]
    assert not (tmp_path / "lake" / "t" / "capture_id=d").exists()  # the refused write's files went


def test_a_commit_of_bad_bytes_is_named_with_the_bytes_escaped(tmp_path):
    lake = lake_with_commits(tmp_path)
    with open(commit_file(lake, 1), "wb") as damaged:
        damaged.write(b'{"add": \x00\x00\x1b[31m')
    clock = StageClock()
    with pytest.raises(StageFailed) as failed, clock.stage("ingest"):
        lake.write_rows(rows("d", 1), SCHEMA, "t", replace_capture_ids=["d"])
    message = str(failed.value)
    assert message.startswith(
        "stage ingest, table t: DamagedLog: Delta log damaged: commit 1 "
        "(_delta_log/00000000000000000001.json) is not JSON at line 1: "
    )
    assert "\\x00" in message and "\\x1b" in message  # escaped: no raw control byte reaches a terminal
    assert not any(ord(c) < 0x20 for c in message)
    assert "\n" not in message


def test_a_capture_whose_rows_the_lake_does_not_hold_as_written_is_not_marked_ok(tmp_path):
    lake = Lake(None, tmp_path / "lake", backend="delta-rs", run_id="r1")
    runs.mark(lake, "r1", "ingest", ["a"], "running")
    lake.write_rows(rows("a", 5), SCHEMA, "t", replace_capture_ids=["a"])
    # Another writer, blind to the runs table, adds rows of the same capture after this run's commit.
    write_deltalake(
        lake.table_path("t"),
        pa.table({"capture_id": ["a"], "writer": pa.array([9], pa.int32()), "n": pa.array([0], pa.int64())}),
        mode="append",
    )
    with pytest.raises(
        StoredRowsMismatch,
        match=r"^table t: capture a has 6 rows in the lake, but this run "
        r"wrote 5: the lake does not hold what was decoded$",
    ):
        runs.mark(lake, "r1", "ingest", ["a"], "ok")
    row = runs.stage_runs(lake)[("a", "ingest")]
    assert row.outcome == "running"  # still incomplete: the next run decodes it again
    assert runs.completeness(runs.stage_runs(lake), "a") == "ingest running"


def test_the_rows_a_run_wrote_are_checked_once_and_pass(tmp_path):
    lake = Lake(None, tmp_path / "lake", backend="delta-rs", run_id="r1")
    runs.mark(lake, "r1", "ingest", ["a", "b"], "running")
    lake.write_rows(rows("a", 5) + rows("b", 2), SCHEMA, "t", replace_capture_ids=["a", "b"])
    assert lake.written == {"t": {"a": 5, "b": 2}, "runs": {"a": 1, "b": 1}}
    runs.mark(lake, "r1", "ingest", ["a", "b"], "ok")
    assert lake.written["t"] == {}  # taken by the check
    state = runs.stage_runs(lake)
    assert [state[(c, "ingest")].outcome for c in "ab"] == ["ok", "ok"]
    assert state[("a", "ingest")].ended <= datetime.now(UTC)


def test_a_delta_rs_error_is_one_line_with_its_causes():
    # How deltalake 1.6.6 words a commit that a full disk refused: its causes on lines of their own.
    error = OSError(
        "Generic LocalFileSystem error\n          \x1b[31m\u21b3\x1b[0m Unable to copy data to file\n"
        "           \x1b[31m\u21b3\x1b[0m No space left on device (os error 28)\n"
    )
    assert one_line(error) == (
        "OSError: Generic LocalFileSystem error: Unable to copy data to file: No space left on device (os error 28)"
    )


class _Throwable:
    """Stands in for py4j's JavaObject of a Throwable with a cause."""

    def __init__(self, name: str, message: str, cause: _Throwable | None = None) -> None:
        self.name, self.message, self.cause = name, message, cause

    def getMessage(self) -> str:
        return self.message

    def getCause(self) -> _Throwable | None:
        return self.cause

    def equals(self, other: object) -> bool:
        return other is self

    def getClass(self):
        name = self.name

        class _Class:
            def getSimpleName(self) -> str:
                return name

        return _Class()


def test_a_spark_write_a_full_disk_refused_is_named_by_its_root_cause():
    class Py4JJavaError(Exception):
        java_exception = _Throwable(
            "SparkException",
            "[TASK_WRITE_FAILED] Task failed while writing rows to file:/lake/frames/_staging/x.\n\tat ...",
            _Throwable("TaskFailed", "wrapped", _Throwable("IOException", "No space left on device")),
        )

    assert one_line(Py4JJavaError()) == (
        "Py4JJavaError: [TASK_WRITE_FAILED] Task failed while writing rows to "
        "file:/lake/frames/_staging/x. (IOException: No space left on device)"
    )
