"""The CLI's progress lines report the step and the tasks Spark has done, as they happen."""

from __future__ import annotations

import io
import re
import time

import pytest

from amqpscope.jobs.cli import build_parser
from amqpscope.jobs.progress import Progress


class Log(io.StringIO):
    """A non-terminal stream (a log file): progress is written as lines, not redrawn."""

    def isatty(self) -> bool:
        return False


def slow_job(spark, tasks: int, seconds: float) -> int:
    def wait(rows):
        time.sleep(seconds)
        yield from rows

    return spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(wait).count()


def test_progress_reports_steps_and_task_counts(spark):
    out = Log()
    with Progress(spark, out, mode="always", poll_interval=0.2, log_interval=0.0) as progress:
        progress.step("ingest")
        progress.detail("writing frames")
        assert slow_job(spark, 6, 0.6) == 6
        progress.step("messages")
    lines = out.getvalue().splitlines()
    counts = [
        tuple(map(int, m.groups())) for m in (re.search(r"ingest > writing frames: stage (\d+)/(\d+) tasks", x) for x in lines) if m
    ]
    assert counts, lines
    assert {total for _, total in counts} == {6}
    assert all(done <= 6 for done, _ in counts)
    assert any(re.fullmatch(r"ingest: done in \d+\.\d s", x) for x in lines)
    assert not any(x.startswith("starting") for x in lines)
    assert lines[-1] == "messages: done"


def test_progress_is_silent_when_not_asked(spark):
    out = Log()
    with Progress(spark, out, mode="auto", poll_interval=0.1) as progress:  # auto: only on a terminal
        progress.step("decoding")
        slow_job(spark, 2, 0.3)
    assert out.getvalue() == ""
    with pytest.raises(ValueError, match="progress must be one of"):
        Progress(spark, out, mode="sometimes")


def test_cli_offers_progress_on_both_jobs():
    parser = build_parser()
    assert parser.parse_args(["analyze", "x.pcap", "--lake", "l", "--progress", "always"]).progress == "always"
    assert parser.parse_args(["ingest", "dir", "--lake", "l"]).progress == "auto"
    assert parser.parse_args(["ingest", "dir", "--lake", "l", "--no-group-rotated"]).group_rotated is False
