"""``amqpscope derive``: messages, flow state, diagnosis, verdicts and the report's chart series from the
bronze tables in the lake.

``derive`` is the one function that turns a set of captures' bronze tables into every derived
table; ``analyze`` calls it on the tables it has just decoded, the ``derive`` job on the tables
read back from the lake for the captures whose bronze rows are newer than their derived rows
(the ``runs`` table says which).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING

import pyspark.sql.functions as F
from pyspark.sql import DataFrame, SparkSession

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.quarantine import FAILED
from amqpscope.jobs.engine.session import sized_for
from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.lake import Lake, lake_capture_filter
from amqpscope.jobs.stages.stages import StageClock, one_line
from amqpscope.pipelines import tables
from amqpscope.pipelines.accounting import assert_bytes_accounted
from amqpscope.schemas.runs import OUTCOME_OK, OUTCOME_RUNNING

if TYPE_CHECKING:
    from amqpscope.expectations.suite import PendingVerdicts

# Imports Great Expectations (seconds of Python): a job preloads it while Spark starts (job_session).
VERDICTS_MODULE = "amqpscope.expectations.suite"

log = logging.getLogger("amqpscope.derive")

# What the diagnosis reads, and the diagnosis: written first, so its answer comes before the other
# tables are written (the verdicts read every table, so they come last).
ANSWER = tables.in_order(
    {*tables.upstream("diagnosis"), "diagnosis"} - set(tables.BRONZE) - set(tables.SHARED) - {tables.STORED_FRAMES}
)


@dataclass(frozen=True)
class Derived:
    """The derived tables of a set of captures (as stored) and the verdict suites' run (Great
    Expectations may still be writing Data Docs: ``verdicts.result()`` waits for it)."""

    tables: dict[str, DataFrame]
    verdicts: PendingVerdicts
    accounting: DataFrame  # the bronze tables' byte accounting (pipelines.accounting), as checked


def _stages(build: tables.Build, clock: StageClock, names: Sequence[str]) -> None:
    """Build and write ``names`` in declaration order, each step's tables in one timed stage."""
    for step, group in groupby(tables.in_order(names), key=lambda name: tables.table(name).step):
        with clock.stage(str(step)):
            for name in group:
                build.table(name)


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
    with clock.stage("derive"):  # the captures taken (a failure here names the stage and the runs table)
        runs.mark(lake, run_id, "derive", ids, OUTCOME_RUNNING, sources)
    try:

        def store(table: tables.Table, rows: DataFrame | None) -> DataFrame:
            clock.writing(table.name)
            if rows is None:  # no rows: committed without a Spark job on delta-rs
                lake.write_rows(
                    [], table.schema, table.name, replace_capture_ids=replace, partition_by=table.partition_by
                )
                return tables.no_rows(bronze["frames"], table)
            return lake.write_and_read(
                rows, table.name, replace_capture_ids=replace, capture_ids=ids, partition_by=table.partition_by
            )

        # A capture of one AMQP version has no rows in the other's tables: those are not built (nor
        # the diagnosis's rules that read only another protocol's connections).
        spoken = {c["protocol"] for c in lake.read_rows("connections", tables.table("connections").schema, ids)}
        build = tables.Build(
            bronze,
            {"limits": diagnosis_limits or DiagnosisThresholds(), "run_id": run_id, "spoken": frozenset(spoken)},
            store,
            empty=tables.without_rows(spoken),
        )
        # Every TCP payload byte is in a frame, in the quarantine or missing: checked before any
        # table is derived from the frames (dq_summary sums the same accounting).
        accounting = build.value("accounting")
        assert_bytes_accounted(accounting)
        _stages(build, clock, ANSWER)
        if diagnosed is not None:
            diagnosed()
        # Then what the verdicts read, the verdicts, and what reads them (dq_summary, chart_series).
        built = tables.names(built=True)
        _stages(
            build, clock, [name for name in built if name not in ANSWER and "violations" not in tables.upstream(name)]
        )
        with clock.stage("verdicts"):
            from amqpscope.expectations.suite import start_verdicts

            # Rules are evaluated once: the violations are written as they are counted (expectations.suite).
            clock.writing("violations")
            stored: list[DataFrame] = []

            def store_violations(found: DataFrame) -> DataFrame:
                stored.append(lake.write_and_read(found, "violations", replace_capture_ids=replace, capture_ids=ids))
                return stored[0]

            # The rules test each frame alone: they read the frames as stored (pipelines.tables.STORED_FRAMES).
            verdicts = start_verdicts(
                {**build.tables, "frames": build.stored_frames()},
                data_docs_dir,
                capture_ids=ids,
                store=store_violations,
            )
            build.tables["violations"] = stored[0]
        # dq_summary: one row per capture and run for data-quality dashboards, written while GX
        # validates the counts.
        build.settings.update(
            suite_of_rule=verdicts.suite_of_rule, suites_run=list(verdicts.suites_run), run_ts=datetime.now(UTC)
        )
        _stages(build, clock, [name for name in built if "violations" in tables.upstream(name)])
    except BaseException as exc:
        if isinstance(exc, Exception):
            _mark_failed(lake, run_id, ids, exc)
        raise
    runs.mark(lake, run_id, "derive", ids, OUTCOME_OK)
    return Derived({name: build.tables[name] for name in tables.DERIVED}, verdicts, accounting)


def _mark_failed(lake: Lake, run_id: str, ids: Sequence[str], exc: Exception) -> None:
    try:
        runs.mark(lake, run_id, "derive", ids, runs.failed_outcome(exc))
    except Exception as unrecorded:  # the lake itself may be what failed: the row stays "running", still incomplete
        log.warning("could not record the failed derive of %s: %s", ", ".join(ids), one_line(unrecorded))
        log.info("the failure to record it:", exc_info=True)  # the trace with -v


def bronze_tables(lake: Lake, capture_ids: Sequence[str]) -> dict[str, DataFrame]:
    """The bronze tables of ``capture_ids`` as stored."""
    return {
        name: lake.read(name, tables.table(name).schema).filter(lake_capture_filter(capture_ids))
        for name in tables.BRONZE
    }


@dataclass(frozen=True)
class DeriveResult:
    derived: tuple[str, ...]  # capture ids derived by this run
    removed: tuple[str, ...]  # captures no longer in the bronze tables whose derived rows went
    up_to_date: tuple[str, ...]  # already derived from their latest ingest
    suites_passed: bool
    busy: tuple[tuple[str, str], ...] = ()  # (capture id, the live run writing it): left to that run


def derive_lake(
    spark: SparkSession,
    config: AnalyzeConfig,
    capture_ids: Sequence[str] | None = None,
    *,
    run_id: str | None = None,
    clock: StageClock | None = None,
    diagnosed: Callable[[tuple[str, ...]], None] | None = None,
) -> DeriveResult:
    """Derive every capture of the lake whose bronze rows are newer than its derived rows (or the
    given ``capture_ids``, again); remove the derived rows of captures gone from the bronze tables.
    ``diagnosed`` gets the captures as soon as their diagnosis is written (``derive``)."""
    run_id = run_id or runs.new_run_id()
    lake = Lake.of(spark, config, run_id=run_id)
    in_bronze = ingested_captures(lake)
    if capture_ids is not None:
        unknown = sorted(set(capture_ids) - set(in_bronze))
        if unknown:
            raise ValueError(f"not in the lake's captures table (or unreadable): {', '.join(unknown)}")
        todo = sorted(set(capture_ids))
        busy: list[tuple[str, str]] = []
    else:
        todo = runs.pending_derive(lake, in_bronze)
        busy = runs.busy(lake, run_id, todo)  # being written by a live run, which derives them itself
        for cid, holder in busy:
            log.warning("capture %s not derived: %s", cid[:12], holder)
        todo = [cid for cid in todo if cid not in dict(busy)]
    orphans = sorted(_derived_capture_ids(lake) - set(in_bronze) - set(todo))
    suites_passed = True
    if todo or orphans:
        log.info("deriving %d capture(s)%s", len(todo), f", removing {len(orphans)} gone" if orphans else "")
        # Set up for the captures' size as analyze is (jobs.engine.session.sized_for).
        with sized_for(spark, _captures_bytes(lake, todo)):
            derived = derive(
                lake,
                bronze_tables(lake, todo),
                todo,
                run_id=run_id,
                data_docs_dir=config.data_docs_dir,
                diagnosis_limits=config.diagnosis,
                replace=orphans,
                clock=clock,
                diagnosed=None if diagnosed is None else lambda: diagnosed(tuple(todo)),
            )
        with runs.verdicts_failing_derive(lake, run_id, todo, derived.verdicts.validation):
            suites_passed = derived.verdicts.result().success
        runs.forget(lake, orphans)
    done = tuple(sorted(set(in_bronze) - set(todo) - set(dict(busy))))
    return DeriveResult(tuple(todo), tuple(orphans), done, suites_passed, tuple(busy))


def ingested_captures(lake: Lake) -> list[str]:
    """Captures in the bronze captures table that were readable (status not failed)."""
    if not lake.exists("captures"):
        return []
    df = lake.read("captures").filter(~F.coalesce(F.col("status"), F.lit("")).startswith(FAILED))
    return sorted(r.capture_id for r in df.select("capture_id").collect())


def _captures_bytes(lake: Lake, capture_ids: Sequence[str]) -> int:
    """The size of ``capture_ids``' files, all parts (the captures table, read without Spark)."""
    return sum(r["file_size"] or 0 for r in lake.read_rows("captures", tables.table("captures").schema, capture_ids))


def _derived_capture_ids(lake: Lake) -> set[str]:
    return {cid for table in tables.DERIVED if lake.exists(table) for cid in lake.capture_ids(table)}
