"""``amqpscope analyze``: captures to bronze tables, flow state, verdicts and a report, in one run.

Every table is partitioned by capture and each write replaces exactly the captures of this run,
so analysing the same capture again leaves the lake as it was.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Sequence

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.expectations.suite import run_verdicts
from amqpscope.jobs.ingest import resolve_captures, superseded_captures, write_bronze
from amqpscope.pipelines.accounting import assert_bytes_accounted, byte_accounting
from amqpscope.pipelines.dq_summary import dq_summary
from amqpscope.pipelines.messages import deliveries_10, messages_091
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from amqpscope.jobs.lake import Lake
from amqpscope.jobs.progress import Progress
from amqpscope.jobs.report import write_report
from amqpscope.jobs.session import build_session
from amqpscope.pipelines.flow_state import FLOW_TABLES, derived_tables, flow_timelines
from amqpscope.pipelines.bottlenecks import bottleneck_findings
from amqpscope.pipelines.diagnosis import diagnosis

log = logging.getLogger("amqpscope.analyze")

# Tables written by analyze after the bronze ones and the flow state (pipelines.flow_state), in order.
MESSAGE_TABLES = ("messages_091", "deliveries_10")
VERDICT_TABLES = ("violations",)
GOLD_TABLES = ("bottlenecks", "diagnosis")
QUALITY_TABLES = ("dq_summary",)


@dataclass
class AnalyzeResult:
    capture_ids: tuple[str, ...]
    report: Path
    data_docs_index: Path | None
    row_counts: dict[str, int]
    stage_seconds: dict[str, float] = field(default_factory=dict)
    suites_passed: bool = True
    # Per capture: the diagnosis headline (pipelines.diagnosis), the top component and its findings.
    diagnoses: tuple[dict[str, object], ...] = ()


@contextmanager
def _stage(timings: dict[str, float], name: str, progress: Progress | None = None) -> Iterator[None]:
    start = time.perf_counter()
    log.info("%s ...", name)
    if progress is not None:
        progress.step(name)
    yield
    timings[name] = time.perf_counter() - start
    log.info("%s done in %.1f s", name, timings[name])


def analyze(spark: SparkSession, captures: Sequence[str | Path], config: AnalyzeConfig,
            timings: dict[str, float] | None = None, progress: Progress | None = None) -> AnalyzeResult:
    """Run the whole chain on an existing SparkSession (reporting to ``progress`` when given)."""
    timings = {} if timings is None else timings
    files = resolve_captures(captures, config.group_rotated)
    ids = [c.capture_id for c in files]
    lake = Lake(spark, config.lake, backend=config.storage)
    # Captures stored before under other ids that share a file with these (a rotation analysed
    # part by part): every table drops their rows as it takes these captures' rows.
    superseded = superseded_captures(lake, files)
    replace = [*ids, *superseded]
    log.info("lake %s (storage: %s), %d capture(s) from %d file(s)%s", config.lake, lake.backend, len(files),
             sum(len(c.parts) for c in files), f", replacing {len(superseded)} stored before" if superseded else "")

    with _stage(timings, "ingest", progress):
        bronze = write_bronze(spark, lake, files, config.ports, superseded, progress)
    try:
        frames = bronze.frames
        # Every TCP payload byte is in a frame, in the quarantine or missing: checked before any
        # table is derived from the frames.
        assert_bytes_accounted(byte_accounting(bronze.connections, frames, bronze.quarantine))
        with _stage(timings, "messages", progress):
            messages = _stored(lake, {"messages_091": messages_091(frames), "deliveries_10": deliveries_10(frames)},
                               ids, replace, progress)
        with _stage(timings, "flow_state", progress):
            flow = _stored(lake, flow_timelines(frames, bronze.tcp_segments), ids, replace, progress)
            # Intervals and throughput read the stored timelines back rather than recompute them.
            flow.update(_stored(lake, derived_tables(frames, flow), ids, replace, progress))
        with _stage(timings, "diagnosis", progress):
            gold = diagnosis_tables(lake, bronze, flow, messages, config, ids, replace, progress)
        with _stage(timings, "verdicts", progress):
            run = run_verdicts({**flow, **messages, "frames": frames, "bottlenecks": gold["bottlenecks"]},
                               config.data_docs_dir)
            lake.write(run.violations, "violations", replace_capture_ids=replace)
        with _stage(timings, "report", progress):
            violations = lake.read("violations").filter(lake_capture_filter(ids))
            quality = _stored(lake, {"dq_summary": dq_summary(
                captures=bronze.captures, connections=bronze.connections, frames=frames,
                quarantine=bronze.quarantine, violations=violations, diagnosis=gold["diagnosis"],
                suite_of_rule={rule: s.suite_name for s in run.suites for rule in s.unexpected_counts},
                suites_run=[s.suite_name for s in run.suites],
                run_id=uuid.uuid4().hex, run_ts=datetime.now(timezone.utc),
            )}, ids, replace, progress)
            report = write_report(
                config.report_path,
                frames=frames,
                connections=bronze.connections,
                violations=violations,
                captures=bronze.captures,
                verdicts=run,
                data_docs_index=run.data_docs_index,
                flow=flow,
                quarantine=bronze.quarantine,
                diagnosis=gold["diagnosis"],
                bottlenecks=gold["bottlenecks"],
                dq_summary=quality["dq_summary"],
            )
    finally:
        bronze.release()
    counts = {name: lake.read(name).filter(lake_capture_filter(ids)).count()
              for name in (*BRONZE_SCHEMAS, *MESSAGE_TABLES, *FLOW_TABLES, *GOLD_TABLES, *VERDICT_TABLES,
                           *QUALITY_TABLES)}
    return AnalyzeResult(tuple(ids), report, run.data_docs_index, counts, timings, run.success,
                         headlines(lake, ids))


def diagnosis_tables(lake: Lake, bronze, flow: dict[str, DataFrame], messages: dict[str, DataFrame],
                     config: AnalyzeConfig, ids: Sequence[str], replace: Sequence[str],
                     progress: Progress | None = None) -> dict[str, DataFrame]:
    """The gold tables bottlenecks and diagnosis, written and read back."""
    findings = bottleneck_findings(
        frames=bronze.frames, connections=bronze.connections, messages_091=messages["messages_091"],
        flow_intervals=flow["flow_intervals"], consumer_unacked=flow["consumer_unacked"],
        link_state=flow["link_state"], connection_blocked=flow["connection_blocked"], tcp_flow=flow["tcp_flow"],
        limits=config.diagnosis)
    stored = _stored(lake, {"bottlenecks": findings}, ids, replace, progress)
    stored.update(_stored(lake, {"diagnosis": diagnosis(stored["bottlenecks"], bronze.captures)}, ids, replace, progress))
    return stored


def headlines(lake: Lake, capture_ids: Sequence[str]) -> tuple[dict[str, object], ...]:
    """Per capture: its diagnosis row as plain data (what ``analyze`` and ``diagnose`` print)."""
    rows = lake.read("diagnosis").filter(lake_capture_filter(capture_ids)).collect()
    return tuple(row.asDict(recursive=True) for row in sorted(rows, key=lambda r: capture_ids.index(r.capture_id)))


def _stored(
    lake: Lake, tables: dict[str, DataFrame], capture_ids: Sequence[str], replace: Sequence[str],
    progress: Progress | None = None,
) -> dict[str, DataFrame]:
    """Write each table (its rows of ``replace`` go), and return it as read back from the lake."""
    for name, df in tables.items():
        if progress is not None:
            progress.detail(f"writing {name}")
        lake.write(df, name, replace_capture_ids=replace)
    return {name: lake.read(name).filter(lake_capture_filter(capture_ids)) for name in tables}


def lake_capture_filter(capture_ids: Sequence[str]) -> Column:
    """Rows of the given captures (tables are partitioned by capture_id, so this prunes files)."""
    return F.col("capture_id").isin(*capture_ids)


def main(captures: Sequence[str], config: AnalyzeConfig, progress: str = "auto") -> AnalyzeResult:
    """Entry point: start Spark, analyze (showing progress per ``progress``: auto, always, never), stop Spark."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    spark = build_session(config.master, "amqpscope-analyze", dict(config.spark_conf))
    timings["spark_start"] = time.perf_counter() - start
    try:
        with Progress(spark, mode=progress) as reporter:
            result = analyze(spark, captures, config, timings, reporter)
    finally:
        spark.stop()
    timings["total"] = time.perf_counter() - start
    return result
