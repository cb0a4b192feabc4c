"""``amqpscope analyze``: the one-shot run of ingest, derive and report on the given captures.

Every table is partitioned by capture and each write replaces exactly the captures of this run,
so analysing the same capture again leaves the lake as it was. The ``runs`` table records each
stage per capture (``jobs/lake/runs.py``): a run killed half-way leaves its captures marked
incomplete, and the next run repairs them.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.engine.sail import engine_of
from amqpscope.jobs.engine.session import sized_for
from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.commits import committed_row_counts
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.report.page import gold_rows, write_gold_report
from amqpscope.jobs.stages.decode import CaptureFile, resolve_captures, superseded_captures
from amqpscope.jobs.stages.derive import VERDICTS_MODULE, derive
from amqpscope.jobs.stages.landing import ingest_files
from amqpscope.jobs.stages.preflight import check_capture_arguments, check_lake_writable, without_packets
from amqpscope.jobs.stages.progress import Progress
from amqpscope.jobs.stages.stages import StageClock, job_session
from amqpscope.pipelines import tables
from amqpscope.pipelines.diagnosis.verdict import no_packets_diagnosis
from amqpscope.schemas.runs import OUTCOME_OK

log = logging.getLogger("amqpscope.analyze")

__all__ = ["AnalyzeResult", "analyze", "analyze_files", "headline_line", "headlines", "main"]


@dataclass
class AnalyzeResult:
    capture_ids: tuple[str, ...]
    report: Path | None  # None: nothing to report (every capture without a packet)
    data_docs_index: Path | None
    row_counts: dict[str, int]
    stage_seconds: dict[str, float] = field(default_factory=dict)
    suites_passed: bool = True
    run_id: str = ""
    # Per capture: the diagnosis headline (pipelines.diagnosis), the top component and its findings.
    diagnoses: tuple[dict[str, object], ...] = ()
    # The engine the tables were computed on (jobs.engine.sail.engine_of); None: no Spark ran.
    engine: str | None = None


# Called with the captures' diagnoses (``headlines``) as soon as they are stored, before the tables
# the diagnosis does not read (jobs.stages.derive), the verdicts and the report: the answer an operator
# waits for, 29 % (1 M frames) to 38 % (the sample) of the run early (docs/BENCHMARKS.md,
# "What is set": the answer first).
Answered = Callable[[tuple[dict[str, object], ...]], None]


def analyze(
    spark: SparkSession,
    captures: Sequence[str | Path],
    config: AnalyzeConfig,
    timings: dict[str, float] | None = None,
    progress: Progress | None = None,
    answered: Answered | None = None,
) -> AnalyzeResult:
    """Run the whole chain on an existing SparkSession (reporting to ``progress`` when given)."""
    return analyze_files(
        spark, resolve_captures(captures, config.group_rotated), config, timings, progress, answered=answered
    )


def analyze_files(
    spark: SparkSession,
    files: Sequence[CaptureFile],
    config: AnalyzeConfig,
    timings: dict[str, float] | None = None,
    progress: Progress | None = None,
    run_id: str | None = None,
    answered: Answered | None = None,
) -> AnalyzeResult:
    """Ingest, derive and report ``files`` (checked by ``resolve_captures``); ``answered`` gets
    their diagnoses as soon as they are known."""
    run_id = run_id or runs.new_run_id()
    clock = StageClock({} if timings is None else timings, progress)
    lake = Lake.of(spark, config, run_id=run_id)
    lake.remove_stale_staging()
    # Captures stored before under other ids that share a file with these (a rotation analysed
    # part by part): every table drops their rows as it takes these captures' rows.
    superseded = superseded_captures(lake, files)
    log.info(
        "lake %s (storage: %s), run %s, %d capture(s) from %d file(s)%s",
        config.lake,
        lake.backend,
        run_id,
        len(files),
        sum(len(c.parts) for c in files),
        f", replacing {len(superseded)} stored before" if superseded else "",
    )

    with sized_for(spark, sum(c.size for c in files)):
        return _analyze_files(spark, lake, files, superseded, config, run_id, clock, answered)


def _analyze_files(
    spark: SparkSession,
    lake: Lake,
    files: Sequence[CaptureFile],
    superseded: Sequence[str],
    config: AnalyzeConfig,
    run_id: str,
    clock: StageClock,
    answered: Answered | None,
) -> AnalyzeResult:
    ids = [c.capture_id for c in files]
    progress = clock.progress
    answers: list[tuple[dict[str, object], ...]] = []

    def diagnosed() -> None:
        answers.append(headlines(lake, ids))
        if answered is not None:
            answered(answers[0])

    with clock.stage("ingest"):
        bronze = ingest_files(
            spark, lake, files, config.ports, superseded, run_id=run_id, progress=progress, tls_keylog=config.tls_keylog
        )
    try:
        derived = derive(
            lake,
            bronze.tables,
            ids,
            run_id=run_id,
            data_docs_dir=config.data_docs_dir,
            diagnosis_limits=config.diagnosis,
            replace=superseded,
            clock=clock,
            diagnosed=diagnosed,
        )
        with clock.stage("report"), runs.verdicts_failing_derive(lake, run_id, ids, derived.verdicts.validation):
            runs.forget(lake, superseded)
            report = write_gold_report(
                config.report_path_for(run_id),
                # Every row of the page from the gold tables, read through delta-rs: no Spark query.
                **gold_rows(lake, ids),
                verdicts=derived.verdicts,  # GX may still be at work: the report waits for it last
                data_docs_index=None,
                engine=engine_of(spark),
            )
            runs.mark(lake, run_id, "report", ids, OUTCOME_OK, {cid: run_id for cid in ids})
    finally:
        bronze.release()
    counts = committed_row_counts(lake, (*tables.BRONZE, *tables.DERIVED), ids)
    verdicts = derived.verdicts.result()
    return AnalyzeResult(
        tuple(ids),
        report,
        verdicts.data_docs_index,
        counts,
        clock.seconds,
        verdicts.success,
        run_id,
        answers[0],
        engine_of(spark),
    )


def headlines(lake: Lake, capture_ids: Sequence[str]) -> tuple[dict[str, object], ...]:
    """Per capture: its diagnosis row as plain data (what ``analyze`` and ``diagnose`` print), read
    as ``diagnose`` reads it (delta-rs: no Spark job)."""
    rows = lake.read_rows("diagnosis", tables.table("diagnosis").schema, capture_ids)
    return tuple(sorted(rows, key=lambda r: capture_ids.index(str(r["capture_id"]))))


def headline_line(answer: dict[str, object]) -> str:
    """The line a capture's diagnosis is printed as on stderr: its id's first 12 characters and its headline."""
    return f"{str(answer['capture_id'])[:12]}: {answer['headline']}"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(captures: Sequence[str], config: AnalyzeConfig, progress: str = "auto") -> AnalyzeResult:
    """Entry point: check the files and the lake, start Spark, analyze (showing progress per
    ``progress``: auto, always, never), stop Spark. Each capture's diagnosis headline is printed on
    stderr as soon as it is known (``timings["answer"]``: seconds from the start until then)."""
    start = time.perf_counter()
    check_capture_arguments(captures)  # before Spark: a wrong argument fails in a second
    files = resolve_captures(captures, config.group_rotated, say=_say)
    check_lake_writable(config.lake)
    timings: dict[str, float] = {}
    if len(without_packets([c.parts for c in files])) == len(files):
        return _no_packets(files, timings, start)
    with job_session(config, "amqpscope-analyze", preload_modules=(VERDICTS_MODULE,)) as spark:
        timings["spark_start"] = time.perf_counter() - start
        with Progress(spark, mode=progress) as reporter:

            def answered(answers: tuple[dict[str, object], ...]) -> None:
                timings["answer"] = time.perf_counter() - start
                for answer in answers:
                    reporter.announce(headline_line(answer))

            result = analyze_files(spark, files, config, timings, reporter, answered=answered)
    timings["total"] = time.perf_counter() - start
    return result


def _no_packets(files: Sequence[CaptureFile], timings: dict[str, float], start: float) -> AnalyzeResult:
    """The answer for captures that hold no packet, without Spark and without writing to the lake:
    diagnosis ``no_amqp`` (there is nothing to judge), printed on stderr as analyze prints its answers."""
    answers = tuple(no_packets_diagnosis(c.capture_id) for c in files)
    for answer in answers:
        print(headline_line(answer), file=sys.stderr, flush=True)
    timings["answer"] = timings["total"] = time.perf_counter() - start
    return AnalyzeResult(tuple(c.capture_id for c in files), None, None, {}, timings, True, runs.new_run_id(), answers)
