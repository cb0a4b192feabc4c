"""The runs bookkeeping's verdict on a capture (complete or why not) and the derive backlog, on
hand-written runs rows; and the command line's checks that run before Spark starts."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from amqpscope.ingest.pcap import CaptureError
from amqpscope.jobs.cli.cli import main as cli_main
from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.files import staging_is_stale as _staging_is_stale
from amqpscope.jobs.lake.runs import StageRun, completeness
from amqpscope.jobs.stages.preflight import check_capture_arguments, check_lake_writable

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def row(stage: str, run_id: str, outcome: str = "ok", source: str | None = None) -> StageRun:
    return StageRun("cap", stage, run_id, T0, None if outcome == "running" else T0, outcome, source)


def state(*rows: StageRun) -> dict:
    return {(r.capture_id, r.stage): r for r in rows}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ((row("ingest", "r1"), row("derive", "r1", source="r1")), "complete"),
        ((row("ingest", "r1"),), "not derived"),
        ((row("ingest", "r1", "running"),), "ingest running"),
        # Killed during derive: bronze committed, derive still marked running.
        ((row("ingest", "r1"), row("derive", "r1", "running", source="r1")), "derive running"),
        (
            (row("ingest", "r1"), row("derive", "r1", "failed: ValueError: x", source="r1")),
            "derive failed: ValueError: x",
        ),
        # Ingested again (r2) after the derive of r1: the derived rows are older than the bronze ones.
        ((row("ingest", "r2"), row("derive", "r1", source="r1")), "derived from an earlier ingest"),
        # A re-ingest that did not finish makes a derived capture incomplete again.
        ((row("ingest", "r2", "running"), row("derive", "r1", source="r1")), "ingest running"),
        # Lakes written before the runs table: bronze rows without an ingest row count as ingested.
        ((row("derive", "r1", source=None),), "complete"),
    ],
)
def test_completeness(rows, expected):
    assert completeness(state(*rows), "cap") == expected


def test_mark_refuses_unknown_stages_and_outcomes():
    with pytest.raises(ValueError, match="stage must be one of ingest, derive, report"):
        runs.mark(None, "r", "analyze", ["cap"], "ok")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outcome must be"):
        runs.mark(None, "r", "derive", ["cap"], "done")  # type: ignore[arg-type]


def test_run_ids_sort_by_start_and_differ():
    first, second = runs.new_run_id(), runs.new_run_id()
    assert first != second
    assert len(first) == len("20260102T030405Z-0123abcd") and first[8] == "T" and first[15] == "Z"


def test_failed_outcome_is_one_line():
    assert runs.failed_outcome(ValueError("bad\nsecond line")) == "failed: ValueError: bad"


def test_staging_of_a_dead_process_on_this_host_is_stale(tmp_path):
    import socket

    host = socket.gethostname()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a process id that existed and is gone
    assert _staging_is_stale(f"{host}-{child.pid}-abc", modified=0.0, now=1.0)
    assert not _staging_is_stale(f"{host}-{os.getpid()}-abc", modified=0.0, now=1e9)
    # Another host's folder: its processes are not visible, so only age tells.
    assert not _staging_is_stale("other-host-123-abc", modified=1000.0, now=1000.0 + 3600)
    assert _staging_is_stale("other-host-123-abc", modified=1000.0, now=1000.0 + 2 * 86400)


def test_capture_arguments_checked_before_spark(tmp_path):
    with pytest.raises(CaptureError, match="is a directory: use `amqpscope ingest`"):
        check_capture_arguments([SAMPLES])
    with pytest.raises(CaptureError, match="no such capture file"):
        check_capture_arguments([tmp_path / "missing.pcap"])
    check_capture_arguments([SAMPLES / "amqp10-credit.pcap"])


def test_lake_must_be_writable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match="is not writable"):
        check_lake_writable(blocker / "lake")  # a lake under a regular file cannot be made
    check_lake_writable(tmp_path / "new" / "lake")
    assert (tmp_path / "new" / "lake").is_dir() and list((tmp_path / "new" / "lake").iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["analyze", str(SAMPLES), "--lake", "L"], "is a directory: use `amqpscope ingest`"),
        (["analyze", "missing.pcap", "--lake", "L"], "missing.pcap: argument: no such capture file"),
        (["analyze", str(Path(__file__)), "--lake", "L"], "not a pcap or pcapng file"),
    ],
)
def test_cli_fails_fast_with_one_line(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "L").exists()  # nothing written


def test_version_and_python_m(tmp_path):
    import importlib.metadata

    expected = f"amqpscope {importlib.metadata.version('amqpscope')}\n"
    out = subprocess.run(
        [sys.executable, "-m", "amqpscope", "--version"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert out.returncode == 0 and out.stdout == expected
    helped = subprocess.run(
        [sys.executable, "-m", "amqpscope", "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    for command in ("analyze", "ingest", "derive", "report", "watch", "maintain", "diagnose"):
        assert command in helped.stdout


def test_spark_is_an_extra_not_a_requirement():
    import importlib.metadata

    requires = importlib.metadata.requires("amqpscope") or []
    spark = [r for r in requires if r.split(">")[0].split("<")[0].strip() in ("pyspark", "delta-spark")]
    assert spark and all('extra == "spark"' in r for r in spark), spark


def test_license_is_apache_2():
    text = (Path(__file__).resolve().parent.parent / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


class _JavaException:
    """Stands in for py4j's JavaObject of a Throwable (what Py4JJavaError.java_exception is)."""

    def getMessage(self) -> str:
        return "[DELTA_FAILED] Cannot write to table frames\n\tat org.apache.spark.Foo(Foo.scala:1)"

    def toString(self) -> str:
        return "org.apache.spark.SparkException: " + self.getMessage()


class _JvmError(Exception):
    java_exception = _JavaException()

    def __str__(self) -> str:  # Py4J's text: the whole trace
        return "An error occurred while calling o123.save.\n: org.apache.spark.SparkException: ...\n\tat ..."


def test_stage_failure_is_one_line_naming_stage_and_table():
    from amqpscope.jobs.stages.stages import StageClock, StageFailed

    clock = StageClock()
    with pytest.raises(StageFailed) as caught:
        with clock.stage("flow_state"):
            clock.writing("link_credit")
            raise _JvmError()
    assert (
        str(caught.value)
        == "stage flow_state, table link_credit: _JvmError: [DELTA_FAILED] Cannot write to table frames"
    )
    assert isinstance(caught.value.__cause__, _JvmError)  # the trace stays for -v
    assert "flow_state" not in clock.seconds


def test_cli_prints_a_stage_failure_on_one_line(monkeypatch, capsys):
    from amqpscope.jobs.cli import commands
    from amqpscope.jobs.stages.stages import StageFailed

    def failing(config, capture_ids, progress):
        raise StageFailed("stage verdicts, table violations", _JvmError())

    monkeypatch.setattr(commands, "derive", failing)
    assert cli_main(["derive", "--lake", "unused"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "amqpscope derive: error: stage verdicts, table violations: _JvmError: [DELTA_FAILED] Cannot "
        "write to table frames (run with -v for the full trace)\n"
    )
    assert cli_main(["-v", "derive", "--lake", "unused"]) == 1
    assert "Traceback" in capsys.readouterr().err
