"""Progress of a long run on the terminal: which step, how far its Spark stages are, for how long.

A background thread asks Spark's status tracker (the same counts the Spark UI shows) once a
second which stages are running and how many of their tasks are done. On a terminal one line is
redrawn in place; otherwise (a log file, CI) a line is written when the step changes and at most
every ``log_interval`` seconds in between. Nothing is collected: the tracker reads the driver's own
bookkeeping.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from pyspark.sql import SparkSession

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


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60:d}:{minutes % 60:02d}:{secs:02d}"


class Progress:
    """``with Progress(spark) as p: p.step("ingest") ...``: reports until the block ends."""

    def __init__(
        self, spark: SparkSession, stream: TextIO | None = None, mode: str = "auto",
        poll_interval: float = 1.0, log_interval: float = 10.0,
    ) -> None:  # fmt: skip
        if mode not in PROGRESS_MODES:
            raise ValueError(f"progress must be one of {', '.join(PROGRESS_MODES)}, not {mode!r}")
        self._spark = spark
        self._stream = stream if stream is not None else sys.stderr
        self._enabled = mode == "always" or (mode == "auto" and self._stream.isatty())
        self._redraw = self._stream.isatty()
        self._poll_interval, self._log_interval = poll_interval, log_interval
        self._label, self._detail = _START, ""
        self._started = self._step_started = time.monotonic()
        self._last_line, self._last_written = "", 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Progress":
        if self._enabled:
            self._thread = threading.Thread(target=self._run, name="amqpscope-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._write(f"{self._label}: done", final=True)

    def step(self, label: str) -> None:
        """Name the step that runs from now on; the one before gets its closing line."""
        if self._enabled and self._thread is not None and self._label != _START:
            self._write(f"{self._label}: done in {time.monotonic() - self._step_started:.1f} s", final=True)
        self._label, self._detail, self._step_started = label, "", time.monotonic()

    def detail(self, text: str) -> None:
        """What the current step is doing now (a table being written): shown in its running line."""
        self._detail = text

    def _run(self) -> None:
        while not self._stop.wait(self._poll_interval):
            try:
                counts = running_stages(self._spark)
            except Exception:  # the context is stopping: nothing more to report
                return
            self._write(self._line(counts))

    def _line(self, c: StageCounts) -> str:
        where = f"[{_clock(time.monotonic() - self._started)}] {self._label}" + (f" > {self._detail}" if self._detail else "")
        if not c.stages:
            return f"{where}: driver work"
        share = f"{100 * c.tasks_done // c.tasks_total}%" if c.tasks_total else "-"
        stages = "stage" if c.stages == 1 else f"{c.stages} stages"
        return f"{where}: {stages} {c.tasks_done}/{c.tasks_total} tasks ({share}), {c.tasks_running} running"

    def _write(self, line: str, final: bool = False) -> None:
        now = time.monotonic()
        news = line.split("] ", 1)[-1]  # what the line says, its clock aside
        if self._redraw:
            self._stream.write("\r\x1b[2K" + line + ("\n" if final else ""))
        elif final or (news != self._last_line and now - self._last_written >= self._log_interval):
            self._stream.write(line + "\n")
            self._last_line, self._last_written = news, now
        else:
            return
        self._stream.flush()
