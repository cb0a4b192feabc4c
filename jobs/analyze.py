"""``amqpscope analyze``: captures to bronze tables, flow state, verdicts and a report, in one run.

Every table is partitioned by capture and each write replaces exactly the captures of this run,
so analysing the same capture again leaves the lake as it was.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.expectations.suite import run_verdicts
from amqpscope.jobs.ingest import BRONZE_SCHEMAS, decode_captures, resolve_captures
from amqpscope.jobs.lake import Lake
from amqpscope.jobs.report import write_report
from amqpscope.jobs.session import build_session
from amqpscope.pipelines.channel_unacked import channel_unacked_timeline
from amqpscope.pipelines.link_credit import link_credit_timeline

log = logging.getLogger("amqpscope.analyze")

# Tables written by analyze, in the order they are produced.
FLOW_TABLES = ("link_credit", "channel_unacked")
VERDICT_TABLES = ("violations",)


@dataclass
class AnalyzeResult:
    capture_ids: tuple[str, ...]
    report: Path
    data_docs_index: Path | None
    row_counts: dict[str, int]
    stage_seconds: dict[str, float] = field(default_factory=dict)
    suites_passed: bool = True


@contextmanager
def _stage(timings: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    log.info("%s ...", name)
    yield
    timings[name] = time.perf_counter() - start
    log.info("%s done in %.1f s", name, timings[name])


def analyze(spark: SparkSession, captures: Sequence[str | Path], config: AnalyzeConfig,
            timings: dict[str, float] | None = None) -> AnalyzeResult:
    """Run the whole chain on an existing SparkSession."""
    timings = {} if timings is None else timings
    files = resolve_captures(captures)
    ids = [c.capture_id for c in files]
    lake = Lake(spark, config.lake, backend=config.storage)
    log.info("lake %s (storage: %s), %d capture(s)", config.lake, lake.backend, len(files))

    with _stage(timings, "ingest"):
        bronze = decode_captures(spark, files, config.ports)
        for name in BRONZE_SCHEMAS:
            lake.write(bronze.table(name), name, replace_capture_ids=ids)
    try:
        frames = bronze.frames
        with _stage(timings, "flow_state"):
            flow = {"link_credit": link_credit_timeline(frames), "channel_unacked": channel_unacked_timeline(frames)}
            for name, df in flow.items():
                lake.write(df, name, replace_capture_ids=ids)
            flow = {name: lake.read(name).filter(lake_capture_filter(ids)) for name in flow}
        with _stage(timings, "verdicts"):
            run = run_verdicts({**flow, "frames": frames}, config.data_docs_dir)
            lake.write(run.violations, "violations", replace_capture_ids=ids)
        with _stage(timings, "report"):
            report = write_report(
                config.report_path,
                frames=frames,
                connections=bronze.connections,
                violations=lake.read("violations").filter(lake_capture_filter(ids)),
                captures=bronze.captures,
                verdicts=run,
                data_docs_index=run.data_docs_index,
            )
    finally:
        bronze.release()
    counts = {name: lake.read(name).filter(lake_capture_filter(ids)).count()
              for name in (*BRONZE_SCHEMAS, *FLOW_TABLES, *VERDICT_TABLES)}
    return AnalyzeResult(tuple(ids), report, run.data_docs_index, counts, timings, run.success)


def lake_capture_filter(capture_ids: Sequence[str]) -> Column:
    """Rows of the given captures (tables are partitioned by capture_id, so this prunes files)."""
    return F.col("capture_id").isin(*capture_ids)


def main(captures: Sequence[str], config: AnalyzeConfig) -> AnalyzeResult:
    """Entry point: start Spark, analyze, stop Spark."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    spark = build_session(config.master, "amqpscope-analyze", dict(config.spark_conf))
    timings["spark_start"] = time.perf_counter() - start
    try:
        result = analyze(spark, captures, config, timings)
    finally:
        spark.stop()
    timings["total"] = time.perf_counter() - start
    return result
