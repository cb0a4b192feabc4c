"""``amqpscope report``: the HTML report of chosen captures, read from the lake.

Only captures whose derive finished on their latest ingest (``runs`` table) are reported; the
others, and the captures whose ingest failed, are listed on the page with why, so a half-analysed
capture is never shown as clean. A lake with no complete capture gets a page that says so. Every
row of the page comes from the gold tables (``jobs.report.page.REPORT_GOLD``: the report's sections,
the chart series, the diagnosis, its findings, the data-quality summary), read with delta-rs
(``Lake.read_rows``), without a Spark query; only a capture derived by a version before the
report's sections were a gold table has them computed from its stored tables. The page names no
engine: the lake does not record which one computed its tables (analyze's own page says it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.quarantine import FAILED
from amqpscope.jobs.engine.session import session_time_zone
from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.lake import Lake, lake_capture_filter
from amqpscope.jobs.report.page import gold_rows, render_page, write_gold_report
from amqpscope.jobs.stages.stages import StageClock, job_session
from amqpscope.pipelines import tables
from amqpscope.pipelines.report.sections import report_sections
from amqpscope.schemas.runs import OUTCOME_OK

log = logging.getLogger("amqpscope.report")


@dataclass(frozen=True)
class ReportResult:
    report: Path
    captures: tuple[str, ...]  # reported
    incomplete: tuple[tuple[str, str], ...]  # (capture id, why it is not reported)


def reads_without_spark(config: AnalyzeConfig) -> bool:
    """True when the report job reads ``config``'s lake with delta-rs alone, with no Spark session
    to start: a lake of local directories written by the delta-rs backend (``--storage delta-rs``,
    or ``auto`` where the session would have no Delta jars), and no Spark asked for: no master
    given, not under spark-submit (its JVM already runs), not in a Databricks runtime or beside a
    running session."""
    if config.catalog is not None or config.storage == "delta-spark" or "://" in str(config.lake):
        return False
    if config.master is not None or SparkSession.getActiveSession() is not None:
        return False
    if {"DATABRICKS_RUNTIME_VERSION", "PYSPARK_GATEWAY_PORT"} & os.environ.keys():
        return False
    # "auto" picks delta-spark when the JVM can load Delta: the jars the session would be given.
    jars = " ".join(str(v) for k, v in config.spark_conf.items() if "jars" in k or "extensions" in k)
    return config.storage == "delta-rs" or "delta" not in jars.lower()


def report_lake(
    spark: SparkSession | None,
    config: AnalyzeConfig,
    capture_ids: Sequence[str] | None = None,
    *,
    run_id: str | None = None,
    clock: StageClock | None = None,
) -> ReportResult:
    """Write the report of ``capture_ids`` (default: every capture in the lake) from the stored
    tables. Without ``spark`` the lake is read and marked with delta-rs alone
    (``reads_without_spark``); a Spark session is started only for captures derived before the
    report_sections table existed."""
    run_id = run_id or runs.new_run_id()
    clock = clock or StageClock()
    lake = Lake.of(spark, config, run_id=run_id)
    if not lake.exists("captures"):
        raise ValueError(
            f"lake {config.lake} has no captures table: run `amqpscope ingest` and `amqpscope derive` first"
        )
    stored = {r["capture_id"]: r for r in lake.read_rows("captures", tables.table("captures").schema)}
    if capture_ids:
        unknown = sorted(set(capture_ids) - set(stored))
        if unknown:
            raise ValueError(f"not in the lake's captures table: {', '.join(unknown)}")
        chosen = sorted(set(capture_ids))
    else:
        chosen = sorted(stored)
    state = runs.stage_runs(lake, chosen)
    reasons = {cid: _why_not(stored[cid], state) for cid in chosen}
    complete = [cid for cid in chosen if reasons[cid] == runs.COMPLETE]
    incomplete = tuple((cid, reason) for cid, reason in reasons.items() if reason != runs.COMPLETE)
    for cid, reason in incomplete:
        log.warning("capture %s not reported: %s", cid, reason)
    left_out = [{"capture_id": cid, "file_name": stored[cid]["file_name"], "why": reason} for cid, reason in incomplete]
    path = config.report_path_for(run_id)
    with clock.stage("report"):
        clock.writing("report")
        if not complete:
            report = render_page(
                path,
                captures=[],
                capture_total=0,
                left_out=left_out,
                suites=None,
                data_docs_index=_data_docs_index(config.data_docs_dir),
                time_zone=_time_zone(spark, config),
            )
            return ReportResult(report, (), incomplete)
        gold = gold_rows(lake, complete)
        sections = list(gold["sections"])
        covered = {r["capture_id"] for r in sections if r["section"] == "capture"}
        older = [cid for cid in complete if cid not in covered]
        if older:
            # Derived by a version before the report's sections were a gold table: computed from
            # their stored tables (one Spark action) until derive runs on them again.
            log.info("%d capture(s) derived without report_sections: their sections computed", len(older))
            sections += _sections_computed(spark, config, older)
        report = write_gold_report(
            path,
            **{**gold, "sections": sections},
            verdicts=None,
            data_docs_index=_data_docs_index(config.data_docs_dir),
            left_out=left_out,
        )
        runs.mark(
            lake, run_id, "report", complete, OUTCOME_OK, {cid: state[(cid, "derive")].run_id for cid in complete}
        )
    return ReportResult(report, tuple(complete), incomplete)


def _sections_computed(spark: SparkSession | None, config: AnalyzeConfig, capture_ids: Sequence[str]) -> list[dict]:
    """The report_sections rows of ``capture_ids`` computed from their stored tables, as derive
    computes them (in a session of its own when the report runs without one)."""
    if spark is None:
        with job_session(config, "amqpscope-report") as session:
            return _sections_computed(session, config, capture_ids)
    lake = Lake.of(spark, config)
    keep = lake_capture_filter(capture_ids)
    # Its declared inputs as stored; a shared result (the byte accounting) the pipeline computes.
    stored = {
        name: lake.read(name).filter(keep) if lake.exists(name) else None
        for name in tables.inputs_of("report_sections")
        if name in tables.TABLES
    }
    return [r.asDict() for r in report_sections(**stored).collect()]


def _time_zone(spark: SparkSession | None, config: AnalyzeConfig) -> str:
    # The zone the page's times are written in: the session's (derive's when it wrote them).
    if spark is not None:
        return str(spark.conf.get("spark.sql.session.timeZone"))
    return session_time_zone(config.spark_conf)


def _why_not(capture: dict, state: dict) -> str:
    """``runs.COMPLETE``, or why the capture is left out: its ingest failed (the captures table's
    status), or the runs table's reason (``runs.completeness``)."""
    status = capture.get("status") or ""
    if status.startswith(FAILED):
        return f"ingest {status}"
    return runs.completeness(state, capture["capture_id"])


def _data_docs_index(docs_dir: Path) -> Path | None:
    """The Data Docs site the derive runs built in ``docs_dir``, if any."""
    found = sorted(docs_dir.rglob("index.html"), key=lambda p: len(p.parts)) if docs_dir.is_dir() else []
    return found[0] if found else None
