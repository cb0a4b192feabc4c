"""``amqpscope watch LANDING_DIR``: each capture that lands ingested, derived and reported, in one process.

Every run of ``analyze`` or of a scheduled stage starts a JVM, and more than half of a run on a small
capture, or of derive at 1 M frames, is that JVM's JIT compiling Spark's code and the code Spark
generates (docs/BENCHMARKS.md, "Where the time goes"). ``watch`` keeps one Spark session for its
life. Each round takes the landing directory's new captures as ``amqpscope ingest`` does
(``jobs.stages.landing``: keyed by content, rotated parts grouped, unreadable files recorded), derives
what needs it as ``amqpscope derive`` does, and writes the report of the captures derived. From the
second round on, the JVM's code is compiled (docs/BENCHMARKS.md, "A watch between captures").

- A file is taken once it has not changed for ``settle`` seconds: tcpdump writes its files under
  their final names, so a file still being written is left for a later round.
- A signal (SIGTERM, SIGINT) ends the watch after the round under way. A second one ends it at once;
  the runs table marks what that round left unfinished, and the next run repairs it.
- A round that fails is reported, with the stage and table, and the watch goes on. The runs table
  keeps what it did not finish pending, so a later round does it again.
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.engine.session import is_connect
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.analyze import Answered, headlines
from amqpscope.jobs.stages.derive import DeriveResult, derive_lake
from amqpscope.jobs.stages.landing import LandingResult, ingest_landing
from amqpscope.jobs.stages.progress import Progress
from amqpscope.jobs.stages.report_job import ReportResult, reads_without_spark, report_lake
from amqpscope.jobs.stages.stages import StageClock

log = logging.getLogger("amqpscope.watch")

RELEASE_WAIT_S = 5.0


@dataclass(frozen=True)
class Round:
    """One round of a watch: what it took from the landing directory, derived and reported."""

    number: int
    seconds: float
    ingested: LandingResult | None = None
    derived: DeriveResult | None = None
    report: ReportResult | None = None
    diagnoses: tuple[dict[str, object], ...] = ()  # per capture derived: its diagnosis row
    error: BaseException | None = None  # the failure that ended the round early


def watch_round(
    spark: SparkSession,
    landing: Path,
    config: AnalyzeConfig,
    *,
    settle: float,
    number: int = 1,
    progress: Progress | None = None,
    remembered: dict | None = None,
    answered: Answered | None = None,
) -> Round:
    """Ingest the captures of ``landing`` that settled and are new, derive every capture of the lake
    that needs it, report those derived. A failure ends the round, not the watch: it is returned.
    ``remembered`` is the landing files read before (``jobs.stages.landing.ingest_landing``); ``answered``
    gets the captures' diagnoses as soon as they are written, before the rest of derive."""
    start = time.perf_counter()
    done: dict[str, object] = {}

    def diagnosed(capture_ids: tuple[str, ...]) -> None:
        done["diagnoses"] = headlines(Lake.of(spark, config), capture_ids)
        if answered is not None:
            answered(done["diagnoses"])

    try:
        done["ingested"] = ingest_landing(spark, landing, config, progress, settled_for=settle, remembered=remembered)
        clock = StageClock(progress=progress)
        derived = done["derived"] = derive_lake(spark, config, clock=clock, diagnosed=diagnosed)
        if derived.derived:
            reader = None if reads_without_spark(config) else spark
            done["report"] = report_lake(reader, config, list(derived.derived), clock=StageClock(progress=progress))
    except Exception as exc:  # returned to the caller, which reports it; the runs table keeps the work pending
        done["error"] = exc
    finally:
        release(spark)  # the round's DataFrames are gone by now, but for the last few references
    return Round(number, time.perf_counter() - start, **done)  # type: ignore[arg-type]


def release(spark: SparkSession) -> None:
    """Free what earlier rounds left in the JVM. Their shared results' local checkpoints and persisted
    rows go once the JVM's collector finds them unreferenced (Spark's ContextCleaner), which unasked
    happens at the latest every 30 minutes (``spark.cleaner.periodicGC.interval``). Python's
    references go first: Py4J releases the JVM objects behind them from a queue of its own, waited
    for here (at most RELEASE_WAIT_S)."""
    gc.collect()
    if is_connect(spark):  # a Spark Connect session has no JVM here
        return
    pending = getattr(spark.sparkContext._gateway._gateway_client, "finalizer_deque", None)
    deadline = time.monotonic() + RELEASE_WAIT_S
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
    spark.sparkContext._jvm.System.gc()


@contextmanager
def stop_requests() -> Iterator[threading.Event]:
    """An event set by the first SIGTERM or SIGINT; a second one raises KeyboardInterrupt. The
    handlers are put back after the block (and only the main thread can install them)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        log.warning("%s: stopping after this round (again to stop now)", signal.Signals(signum).name)
        stop.set()

    before = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


def watch(
    spark: SparkSession,
    landing: Path,
    config: AnalyzeConfig,
    *,
    interval: float,
    settle: float,
    rounds: int = 0,
    stop: threading.Event | None = None,
    progress: Progress | None = None,
    each: Callable[[Round], None] = lambda _: None,
    answered: Answered | None = None,
) -> list[Round]:
    """Rounds (``watch_round``) every ``interval`` seconds, from the end of one to the start of the
    next, until ``stop`` is set or after ``rounds`` (0: no limit); ``each`` gets every round as it
    ends, ``answered`` the diagnoses as they are written. Only failed rounds and those that took a
    capture are returned (a watch may last weeks)."""
    stop = stop or threading.Event()
    kept: list[Round] = []
    remembered: dict = {}
    number = 0
    while not stop.is_set():
        number += 1
        if number > 1:
            release(spark)  # what the end of the last round could not: its last references are gone
        done = watch_round(
            spark,
            landing,
            config,
            settle=settle,
            number=number,
            progress=progress,
            remembered=remembered,
            answered=answered,
        )
        each(done)
        if done.error is not None or (done.derived is not None and done.derived.derived):
            kept.append(done)
        if rounds and number >= rounds:
            break
        stop.wait(interval)
    return kept
