"""The CLI's progress lines report the step and the tasks Spark has done, as they happen."""

from __future__ import annotations

import io
import re
import subprocess
import time
from pathlib import Path

import pytest

from amqpscope.jobs.cli.cli import build_parser
from amqpscope.jobs.stages.decode import decode_tables, resolve_captures
from amqpscope.jobs.stages.progress import Progress, SparkWork, TaskCounters, decode_line

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "mixed.pcapng"


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
        tuple(map(int, m.groups()))
        for m in (re.search(r"ingest > writing frames: stage (\d+)/(\d+) tasks", x) for x in lines)
        if m
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


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_announced_line_stays_whether_progress_is_shown_or_not(spark):
    quiet, log, terminal = Log(), Log(), Terminal()
    for stream, mode in ((quiet, "never"), (log, "always"), (terminal, "always")):
        with Progress(spark, stream, mode=mode, poll_interval=30.0) as progress:
            progress.step("diagnosis")
            progress.announce("4f2a09c1b7de: Bottleneck: the memory alarm")
    assert quiet.getvalue() == "4f2a09c1b7de: Bottleneck: the memory alarm\n"
    assert "\n4f2a09c1b7de: Bottleneck: the memory alarm\n" in "\n" + log.getvalue()
    # On a terminal the running line is cleared first, so the answer does not land after it.
    assert "\r\x1b[2K4f2a09c1b7de: Bottleneck: the memory alarm\n" in terminal.getvalue()


def test_cli_offers_progress_on_both_jobs():
    parser = build_parser()
    assert parser.parse_args(["analyze", "x.pcap", "--lake", "l", "--progress", "always"]).progress == "always"
    assert parser.parse_args(["ingest", "dir", "--lake", "l"]).progress == "auto"
    assert parser.parse_args(["ingest", "dir", "--lake", "l", "--no-group-rotated"]).group_rotated is False


def test_each_step_counts_its_own_spark_jobs_and_stages(spark):
    rdd = spark.sparkContext.parallelize(range(8), 2)
    with Progress(spark, Log(), mode="never") as progress:
        progress.step("a")
        rdd.count()  # an RDD action: one job of one stage
        rdd.count()
        progress.step("b")
        rdd.map(lambda x: (x % 2, x)).reduceByKey(lambda a, b: a + b).count()  # one job, a shuffle: two stages
        work = progress.spark_work()
    assert work == {"a": SparkWork(jobs=2, stages=2), "b": SparkWork(jobs=1, stages=2)}


def test_decode_line_counts_packets_of_the_total_and_the_time_left():
    # Half the bytes read, 500 packets in them: the capture holds about 1,000. Reading is half the
    # work and a quarter of those 1,000 are decoded: 37.5 % done in 30 s, 50 s to go at that pace.
    half = {"read_bytes": 50_000_000, "read_packets": 500, "decoded_packets": 250}
    assert decode_line(half, 100_000_000, elapsed=30.0) == (
        "500 of ~1,000 packets read (50 of 100 MB), 250 decoded (38%), about 0:00:50 left"
    )
    # Everything read: the total is known, not estimated.
    read = {"read_bytes": 100_000_000, "read_packets": 1_234, "decoded_packets": 0}
    assert decode_line(read, 100_000_000, elapsed=60.0) == (
        "1,234 of 1,234 packets read (100 of 100 MB), 0 decoded (50%), about 0:01:00 left"
    )
    assert decode_line({}, 100_000_000, elapsed=1.0) == "reading the capture"


def test_task_counters_sum_the_tasks_files(tmp_path):
    counters = TaskCounters()
    try:
        TaskCounters.report(counters.directory, "read-x-0", {"read_packets": 10, "read_bytes": 100})
        TaskCounters.report(counters.directory, "read-x-1", {"read_packets": 5, "read_bytes": 50})
        TaskCounters.report(
            counters.directory, "read-x-1", {"read_packets": 7, "read_bytes": 70}
        )  # the same task, later
        TaskCounters.report(None, "read-x-2", {"read_packets": 1})  # progress off: nothing written
        TaskCounters.report(str(tmp_path / "elsewhere"), "read-x-3", {"read_packets": 1})  # another host's path
        assert counters.totals() == {"read_packets": 17, "read_bytes": 170}
        counters.clear()
        assert counters.totals() == {}
    finally:
        counters.close()
    assert not Path(counters.directory).exists()


def _tshark_packets(capture: Path, display_filter: str) -> int:
    out = subprocess.run(
        ["tshark", "-r", str(capture), "-Y", display_filter, "-T", "fields", "-e", "frame.number"],
        capture_output=True,
        check=True,
    ).stdout
    return len(out.splitlines())


@pytest.mark.tshark
@pytest.mark.parametrize("range_bytes", [16_384, 1 << 26])
def test_decode_tasks_count_every_packet_of_the_capture(spark, range_bytes):
    counters = TaskCounters()
    try:
        tables, persisted = decode_tables(
            spark, resolve_captures([SAMPLE]), (5672,), range_bytes=range_bytes, counters=counters.directory
        )
        tables["frames"].count()
        totals = counters.totals()
        for df in persisted:
            df.unpersist()
    finally:
        counters.close()
    assert totals["read_packets"] == _tshark_packets(SAMPLE, "frame")
    assert totals["decoded_packets"] == _tshark_packets(SAMPLE, "tcp")
    # Every byte of the file but its header blocks (pcapng: section header and interface descriptions).
    assert 0 < SAMPLE.stat().st_size - totals["read_bytes"] < 1024
