"""Progress of a long run on the terminal: which step, how far it is, for how long, how long left.

A background thread looks once a second at how far the running step is. While captures are
decoded, that is packets: the decode tasks leave their counts (bytes and packets read, packets
decoded) in small files of a local directory (``TaskCounters``), which the thread sums into
packets done of the capture's total, and an estimate of the time left. The total is estimated
from the bytes read until every byte is. Tasks on another host (a cluster) cannot reach that
directory; there, and in the steps after decoding, the line shows the tasks done of the Spark
stages running, from Spark's status tracker (the same counts the Spark UI shows). On a terminal
one line is redrawn in place; otherwise (a log file, CI) a line is written when the step changes
and at most every ``log_interval`` seconds in between.

Each step is also a Spark job group, so the jobs and stages every step ran can be counted
afterwards (``Progress.spark_work``: what benchmarks/end_to_end.py reports per stage).

A Spark Connect session (Databricks' standard access mode, serverless compute) has no status
tracker and no job groups in this process: there the lines name the step and its time only, and
``spark_work`` counts nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pyspark.sql import SparkSession

from amqpscope.jobs.engine.session import is_connect

PROGRESS_MODES = ("auto", "always", "never")
_START = "starting"


@dataclass(frozen=True)
class StageCounts:
    stages: int  # stages running now
    tasks_done: int
    tasks_running: int
    tasks_total: int


def running_stages(spark: SparkSession) -> StageCounts:
    """Task counts of the stages running now, summed."""
    tracker = spark.sparkContext.statusTracker()
    infos = [info for info in map(tracker.getStageInfo, tracker.getActiveStageIds()) if info is not None]
    return StageCounts(
        len(infos),
        sum(i.numCompletedTasks for i in infos),
        sum(i.numActiveTasks for i in infos),
        sum(i.numTasks for i in infos),
    )


@dataclass(frozen=True)
class SparkWork:
    """Spark jobs a step ran, and the stages of those jobs that ran tasks (not skipped)."""

    jobs: int
    stages: int


def _job_group(index: int, label: str) -> str:
    return f"amqpscope-step-{index}: {label}"


class TaskCounters:
    """Counts that tasks leave in a directory on the driver's host, one small JSON file per task.

    A task calls ``TaskCounters.report(directory, name, counts)`` with its running totals (a
    retried task overwrites its own file); the driver sums every file's counts. Files are written
    whole and renamed, so a reader never sees half of one.
    """

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="amqpscope-progress-")

    @staticmethod
    def report(directory: str | None, name: str, counts: Mapping[str, int]) -> None:
        """Called in a task: no directory (progress off) or one on another host is no error."""
        if directory is None or not os.path.isdir(directory):
            return
        partial = os.path.join(directory, f".{name}.{os.getpid()}")
        try:
            with open(partial, "w", encoding="utf-8") as f:
                json.dump(dict(counts), f)
            os.replace(partial, os.path.join(directory, f"{name}.json"))
        except OSError:  # the directory went away: the run is over
            pass

    def totals(self, prefix: str = "") -> dict[str, int]:
        """Every count summed over the files whose name starts with ``prefix``."""
        summed: dict[str, int] = {}
        for path in Path(self.directory).glob(f"{prefix}*.json"):
            try:
                counts = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):  # replaced while read: counted on the next poll
                continue
            for key, value in counts.items():
                summed[key] = summed.get(key, 0) + int(value)
        return summed

    def clear(self) -> None:
        for path in Path(self.directory).glob("*.json"):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def decode_line(totals: Mapping[str, int], capture_bytes: int, elapsed: float) -> str:
    """How far a decode is, from the tasks' counts: packets read and decoded of the capture's
    total (estimated from the bytes read until all are), and the time left at the pace so far."""
    read_bytes, read = totals.get("read_bytes", 0), totals.get("read_packets", 0)
    decoded = totals.get("decoded_packets", 0)
    if not read_bytes or not capture_bytes:
        return "reading the capture"
    all_read = read_bytes >= capture_bytes
    total = read if all_read else int(read * capture_bytes / read_bytes)
    # Reading and decoding each take about half the work of a packet.
    done = 0.5 * min(1.0, read_bytes / capture_bytes) + 0.5 * min(1.0, decoded / max(total, 1))
    left = f", about {_clock(elapsed * (1 - done) / done)} left" if done >= 0.02 else ""
    of_total = f"{total:,}" if all_read else f"~{total:,}"
    return (
        f"{read:,} of {of_total} packets read ({read_bytes / 1e6:,.0f} of {capture_bytes / 1e6:,.0f} MB), "
        f"{decoded:,} decoded ({100 * done:.0f}%){left}"
    )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60:d}:{minutes % 60:02d}:{secs:02d}"


_CLEAR_LINE = "\r\x1b[2K"  # back to the start of the terminal line, and erase it


class Progress:
    """``with Progress(spark) as p: p.step("ingest") ...``: reports until the block ends."""

    def __init__(
        self,
        spark: SparkSession,
        stream: TextIO | None = None,
        mode: str = "auto",
        poll_interval: float = 1.0,
        log_interval: float = 10.0,
    ) -> None:
        if mode not in PROGRESS_MODES:
            raise ValueError(f"progress must be one of {', '.join(PROGRESS_MODES)}, not {mode!r}")
        self._spark = spark
        self._tracked = not is_connect(spark)  # a status tracker and job groups to use
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = mode == "always" or (mode == "auto" and self._stream.isatty())
        self._redraw = self._stream.isatty()
        self._poll_interval, self._log_interval = poll_interval, log_interval
        self._label, self._detail = _START, ""
        self._started = self._step_started = time.monotonic()
        self._last_line, self._last_written = "", 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._groups: list[tuple[str, str]] = []  # (step label, its Spark job group), in order
        self._counters: TaskCounters | None = None
        self._capture_bytes = 0

    def __enter__(self) -> Progress:
        if self._enabled:
            self._counters = TaskCounters()
            self._thread = threading.Thread(target=self._run, name="amqpscope-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._write(f"{self._label}: done", final=True)
        if self._counters is not None:
            self._counters.close()
        try:
            if self._tracked:
                self._spark.sparkContext.clearJobGroup()
        except Exception:  # the session stopped first
            pass

    def step(self, label: str) -> None:
        """Name the step that runs from now on; the one before gets its closing line.

        The step's Spark jobs (started from this thread) are tagged with a job group of its own.
        """
        if self._enabled and self._thread is not None and self._label != _START:
            self._write(f"{self._label}: done in {time.monotonic() - self._step_started:.1f} s", final=True)
        self._label, self._detail, self._step_started = label, "", time.monotonic()
        self._capture_bytes = 0
        if self._counters is not None:
            self._counters.clear()
        group = _job_group(len(self._groups), label)
        self._groups.append((label, group))
        if self._tracked:
            self._spark.sparkContext.setJobGroup(group, label)

    def decoding(self, capture_bytes: int) -> str | None:
        """The step decodes captures of ``capture_bytes`` bytes: the directory its tasks report
        their counts to (``TaskCounters.report``), or None when progress is not shown."""
        self._capture_bytes = capture_bytes
        return self._counters.directory if self._counters is not None else None

    def spark_work(self) -> dict[str, SparkWork]:
        """Jobs and stages run so far per step label (steps of one label summed), in step order;
        nothing on a Spark Connect session."""
        if not self._tracked:
            return {}
        tracker = self._spark.sparkContext.statusTracker()
        work: dict[str, SparkWork] = {}
        for label, group in self._groups:
            jobs = tracker.getJobIdsForGroup(group)
            stages: set[int] = set()
            for job in jobs:
                info = tracker.getJobInfo(job)
                for stage in info.stageIds if info is not None else ():
                    stage_info = tracker.getStageInfo(stage)
                    if stage_info is not None and stage_info.numCompletedTasks > 0:
                        stages.add(stage)
            before = work.get(label, SparkWork(0, 0))
            work[label] = SparkWork(before.jobs + len(jobs), before.stages + len(stages))
        return work

    def announce(self, text: str) -> None:
        """A line that stays, whether progress is shown or not: an answer found while the run goes on."""
        self._stream.write((_CLEAR_LINE if self._enabled and self._redraw else "") + text + "\n")
        self._stream.flush()

    def detail(self, text: str) -> None:
        """What the current step is doing now (a table being written): shown in its running line."""
        self._detail = text

    def _run(self) -> None:
        while not self._stop.wait(self._poll_interval):
            try:
                counts = running_stages(self._spark) if self._tracked else None
            except Exception:  # the context is stopping: nothing more to report
                return
            self._write(self._line(counts))

    def _line(self, c: StageCounts | None) -> str:
        where = f"[{_clock(time.monotonic() - self._started)}] {self._label}" + (
            f" > {self._detail}" if self._detail else ""
        )
        if self._capture_bytes and self._counters is not None:
            totals = self._counters.totals()
            if totals:  # the tasks can write to the directory: packets, not tasks
                return f"{where}: {decode_line(totals, self._capture_bytes, time.monotonic() - self._step_started)}"
        if c is None:
            return f"{where}: running"
        if not c.stages:
            return f"{where}: driver work"
        share = f"{100 * c.tasks_done // c.tasks_total}%" if c.tasks_total else "-"
        stages = "stage" if c.stages == 1 else f"{c.stages} stages"
        return f"{where}: {stages} {c.tasks_done}/{c.tasks_total} tasks ({share}), {c.tasks_running} running"

    def _write(self, line: str, final: bool = False) -> None:
        now = time.monotonic()
        news = line.split("] ", 1)[-1]  # what the line says, its clock aside
        if self._redraw:
            self._stream.write(_CLEAR_LINE + line + ("\n" if final else ""))
        elif final or (news != self._last_line and now - self._last_written >= self._log_interval):
            self._stream.write(line + "\n")
            self._last_line, self._last_written = news, now
        else:
            return
        self._stream.flush()
