"""``amqpscope derive``: messages, flow state, diagnosis and verdicts from the bronze tables in the lake.

``derive`` is the one function that turns a set of captures' bronze tables into every derived
table; ``analyze`` calls it on the tables it has just decoded, the ``derive`` job on the tables
read back from the lake for the captures whose bronze rows are newer than their derived rows
(the ``runs`` table says which).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pyspark.sql.functions as F
from pyspark.sql import DataFrame, SparkSession

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs import runs
from amqpscope.jobs.lake import Lake, lake_capture_filter
from amqpscope.jobs.stages import StageClock, stored
from amqpscope.pipelines.accounting import assert_bytes_accounted, byte_accounting
from amqpscope.pipelines.bottlenecks import bottleneck_findings
from amqpscope.pipelines.chart_series import chart_series
from amqpscope.pipelines.diagnosis import diagnosis
from amqpscope.pipelines.dq_summary import dq_summary
from amqpscope.pipelines.flow_state import FLOW_TABLES, INTERVAL_INPUTS, TIMELINE_TABLES, FlowTimelines, derived_tables
from amqpscope.pipelines.messages import deliveries_10, messages_091
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from amqpscope.schemas.runs import OUTCOME_OK, OUTCOME_RUNNING

if TYPE_CHECKING:
    from amqpscope.expectations.suite import PendingVerdicts

# Imports Great Expectations (seconds of Python): a job preloads it while Spark starts (job_session).
VERDICTS_MODULE = "amqpscope.expectations.suite"

log = logging.getLogger("amqpscope.derive")

# Tables derive writes, in order (the flow-state ones are pipelines.flow_state's).
MESSAGE_TABLES = ("messages_091", "deliveries_10")
GOLD_TABLES = ("bottlenecks", "diagnosis")
VERDICT_TABLES = ("violations",)
QUALITY_TABLES = ("dq_summary",)
REPORT_TABLES = ("chart_series",)  # what the report draws, read back with delta-rs (schemas/report.py)
DERIVED_TABLES = (*MESSAGE_TABLES, *FLOW_TABLES, *GOLD_TABLES, *VERDICT_TABLES, *QUALITY_TABLES, *REPORT_TABLES)


@dataclass(frozen=True)
class Derived:
    """The derived tables of a set of captures (as stored) and the verdict suites' run (Great
    Expectations may still be writing Data Docs: ``verdicts.result()`` waits for it)."""

    tables: dict[str, DataFrame]
    verdicts: PendingVerdicts
    accounting: DataFrame  # the bronze tables' byte accounting (pipelines.accounting), as checked


def derive(
    lake: Lake,
    bronze: Mapping[str, DataFrame],
    capture_ids: Sequence[str],
    *,
    run_id: str,
    data_docs_dir: Path,
    diagnosis_limits: DiagnosisThresholds | None = None,
    replace: Sequence[str] = (),
    clock: StageClock | None = None,
    diagnosed: Callable[[], None] | None = None,
) -> Derived:
    """Every derived table of ``capture_ids`` from their ``bronze`` tables, written to ``lake``.

    Each write replaces the rows of ``capture_ids`` and of ``replace`` (captures superseded by
    these). The captures are marked ``running`` in the runs table before the first write and
    ``ok`` after the last, with the ingest run they were derived from. ``diagnosed`` is called as
    soon as the diagnosis table is written, before the verdicts."""
    clock = clock or StageClock()
    ids = list(capture_ids)
    replace = sorted({*ids, *replace})
    sources = {cid: r.run_id for (cid, stage), r in runs.stage_runs(lake, ids).items() if stage == "ingest"}
    runs.mark(lake, run_id, "derive", ids, OUTCOME_RUNNING, sources)
    try:
        frames = bronze["frames"]
        # Every TCP payload byte is in a frame, in the quarantine or missing: checked before any
        # table is derived from the frames. Computed once (a row per connection and direction),
        # it is also what dq_summary sums.
        accounting = byte_accounting(bronze["connections"], frames, bronze["quarantine"]).localCheckpoint()
        assert_bytes_accounted(accounting)
        tables: dict[str, DataFrame] = {}
        # What the diagnosis reads is written first and the diagnosis from it; the other tables
        # follow its answer (each step's seconds are summed over its two parts).
        with clock.stage("messages"):
            tables.update(stored(lake, {"messages_091": messages_091(frames)}, ids, replace, clock))
        timelines = FlowTimelines(frames, bronze["tcp_segments"])
        with clock.stage("flow_state"):
            flow = stored(lake, timelines.build(INTERVAL_INPUTS), ids, replace, clock)
            # Intervals and throughput read the stored timelines back rather than recompute them.
            intervals = derived_tables(frames, flow)
            flow.update(stored(lake, {"flow_intervals": intervals["flow_intervals"]}, ids, replace, clock))
            tables.update(flow)
        with clock.stage("diagnosis"):
            findings = bottleneck_findings(
                frames=frames, connections=bronze["connections"], messages_091=tables["messages_091"],
                flow_intervals=tables["flow_intervals"], consumer_unacked=tables["consumer_unacked"],
                link_state=tables["link_state"], connection_blocked=tables["connection_blocked"],
                channel_confirms=tables["channel_confirms"], tcp_flow=tables["tcp_flow"],
                limits=diagnosis_limits or DiagnosisThresholds())
            tables.update(stored(lake, {"bottlenecks": findings}, ids, replace, clock))
            tables.update(stored(lake, {"diagnosis": diagnosis(tables["bottlenecks"], bronze["captures"],
                                                               bronze["connections"])},
                                 ids, replace, clock))
        if diagnosed is not None:
            diagnosed()
        with clock.stage("messages"):
            tables.update(stored(lake, {"deliveries_10": deliveries_10(frames)}, ids, replace, clock))
        with clock.stage("flow_state"):
            rest = [name for name in TIMELINE_TABLES if name not in INTERVAL_INPUTS]
            tables.update(stored(lake, {**timelines.build(rest), "throughput": intervals["throughput"]},
                                 ids, replace, clock))
        with clock.stage("verdicts"):
            from amqpscope.expectations.suite import start_verdicts

            # Rules are evaluated once: the violations are written as they are counted (expectations.suite).
            clock.writing("violations")
            verdicts = start_verdicts(
                {**tables, "frames": frames}, data_docs_dir, capture_ids=ids,
                store=lambda found: lake.write(found, "violations", replace_capture_ids=replace))
            tables["violations"] = lake.read("violations").filter(lake_capture_filter(ids))
            # One row per capture and run for data-quality dashboards (pipelines.dq_summary), written
            # while GX validates the counts.
            tables.update(stored(lake, {"dq_summary": dq_summary(
                captures=bronze["captures"], connections=bronze["connections"], frames=frames,
                quarantine=bronze["quarantine"], violations=tables["violations"], diagnosis=tables["diagnosis"],
                suite_of_rule=verdicts.suite_of_rule, suites_run=list(verdicts.suites_run),
                run_id=run_id, run_ts=datetime.now(timezone.utc), accounting=accounting,
            )}, ids, replace, clock))
        with clock.stage("charts"):
            # The report's charts as a gold table (pipelines.chart_series): the report reads it
            # with delta-rs, so a capture of any size is drawn with no Spark query.
            tables.update(stored(lake, {"chart_series": chart_series(
                captures=bronze["captures"], frames=frames, link_state=tables["link_state"],
                consumer_unacked=tables["consumer_unacked"], channel_unacked=tables["channel_unacked"],
                channel_confirms=tables["channel_confirms"], tcp_flow=tables["tcp_flow"],
                flow_intervals=tables["flow_intervals"], violations=tables["violations"],
            )}, ids, replace, clock))
    except BaseException as exc:
        if isinstance(exc, Exception):
            _mark_failed(lake, run_id, ids, exc)
        raise
    runs.mark(lake, run_id, "derive", ids, OUTCOME_OK)
    return Derived(tables, verdicts, accounting)


def _mark_failed(lake: Lake, run_id: str, ids: Sequence[str], exc: Exception) -> None:
    try:
        runs.mark(lake, run_id, "derive", ids, runs.failed_outcome(exc))
    except Exception:  # the lake itself may be what failed: the row stays "running", still incomplete
        log.warning("could not record the failed derive of %s", ", ".join(ids), exc_info=True)


def bronze_tables(lake: Lake, capture_ids: Sequence[str]) -> dict[str, DataFrame]:
    """The bronze tables of ``capture_ids`` as stored."""
    return {name: lake.read(name, schema).filter(lake_capture_filter(capture_ids))
            for name, schema in BRONZE_SCHEMAS.items()}


@dataclass(frozen=True)
class DeriveResult:
    derived: tuple[str, ...]  # capture ids derived by this run
    removed: tuple[str, ...]  # captures no longer in the bronze tables whose derived rows went
    up_to_date: tuple[str, ...]  # already derived from their latest ingest
    suites_passed: bool


def derive_lake(spark: SparkSession, config: AnalyzeConfig, capture_ids: Sequence[str] | None = None,
                *, run_id: str | None = None, clock: StageClock | None = None) -> DeriveResult:
    """Derive every capture of the lake whose bronze rows are newer than its derived rows (or the
    given ``capture_ids``, again); remove the derived rows of captures gone from the bronze tables."""
    lake = Lake.of(spark, config)
    run_id = run_id or runs.new_run_id()
    in_bronze = ingested_captures(lake)
    if capture_ids is not None:
        unknown = sorted(set(capture_ids) - set(in_bronze))
        if unknown:
            raise ValueError(f"not in the lake's captures table (or unreadable): {', '.join(unknown)}")
        todo = sorted(set(capture_ids))
    else:
        todo = runs.pending_derive(lake, in_bronze)
    orphans = sorted(_derived_capture_ids(lake) - set(in_bronze) - set(todo))
    suites_passed = True
    if todo or orphans:
        log.info("deriving %d capture(s)%s", len(todo), f", removing {len(orphans)} gone" if orphans else "")
        derived = derive(lake, bronze_tables(lake, todo), todo, run_id=run_id, data_docs_dir=config.data_docs_dir,
                         diagnosis_limits=config.diagnosis, replace=orphans, clock=clock)
        suites_passed = derived.verdicts.result().success
        runs.forget(lake, orphans)
    done = tuple(sorted(set(in_bronze) - set(todo)))
    return DeriveResult(tuple(todo), tuple(orphans), done, suites_passed)


def ingested_captures(lake: Lake) -> list[str]:
    """Captures in the bronze captures table that were readable (status not failed)."""
    if not lake.exists("captures"):
        return []
    df = lake.read("captures").filter(~F.coalesce(F.col("status"), F.lit("")).startswith("failed"))
    return sorted(r.capture_id for r in df.select("capture_id").collect())


def _derived_capture_ids(lake: Lake) -> set[str]:
    return {cid for table in DERIVED_TABLES if lake.exists(table) for cid in lake.capture_ids(table)}
