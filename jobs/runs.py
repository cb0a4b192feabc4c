"""Bookkeeping of runs per capture and stage (the ``runs`` table, ``schemas/runs.py``).

Every stage that writes a capture's rows marks the capture ``running`` first and ``ok`` after its
last commit. Each mark is one Delta commit of the capture's ``runs`` partition, so a reader sees a
capture either as finished by a stage or not, never in between; a capture whose derive is not
``ok`` for its latest ingest is incomplete, and is neither reported nor taken as clean.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from amqpscope.jobs.lake import Lake
from amqpscope.schemas.runs import OUTCOME_FAILED_PREFIX, OUTCOME_OK, OUTCOME_RUNNING, RUNS_SCHEMA, STAGES

RUNS_TABLE = "runs"
COMPLETE = "complete"


def new_run_id() -> str:
    """A run id that sorts by start time and does not collide between concurrent runs."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class StageRun:
    """One row of the runs table."""

    capture_id: str
    stage: str
    run_id: str
    started: datetime
    ended: datetime | None
    outcome: str
    source_run: str | None

    @property
    def ok(self) -> bool:
        return self.outcome == OUTCOME_OK


def stage_runs(lake: Lake, capture_ids: Sequence[str] | None = None) -> dict[tuple[str, str], StageRun]:
    """The runs rows (of ``capture_ids``, or all) by (capture_id, stage); times in UTC."""
    if not lake.exists(RUNS_TABLE):
        return {}
    rows = [StageRun(**{k: _utc(v) for k, v in r.items()}) for r in lake.read_rows(RUNS_TABLE, RUNS_SCHEMA, capture_ids)]
    return {(r.capture_id, r.stage): r for r in rows}


def _utc(value: object) -> object:
    # Spark collects timestamps as naive local times, pyarrow as aware UTC ones: both as aware UTC.
    return value.astimezone(timezone.utc) if isinstance(value, datetime) else value


def mark(lake: Lake, run_id: str, stage: str, capture_ids: Sequence[str], outcome: str,
         source_runs: Mapping[str, str | None] | None = None) -> None:
    """Record ``outcome`` of ``stage`` for ``capture_ids`` in one commit (their other stages' rows kept).

    ``running`` starts the clock; any other outcome ends it (the start kept when this run marked
    the stage running before)."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, not {stage!r}")
    if outcome not in (OUTCOME_RUNNING, OUTCOME_OK) and not outcome.startswith(OUTCOME_FAILED_PREFIX):
        raise ValueError(f"outcome must be running, ok or 'failed: reason', not {outcome!r}")
    ids = sorted(set(capture_ids))
    if not ids:
        return
    now = datetime.now(timezone.utc)
    existing = stage_runs(lake, ids)
    rows = [r for key, r in existing.items() if key[1] != stage]
    for cid in ids:
        before = existing.get((cid, stage))
        same_run = before is not None and before.run_id == run_id
        started = before.started if same_run and outcome != OUTCOME_RUNNING else now
        source = (source_runs or {}).get(cid, before.source_run if same_run else None)
        ended = None if outcome == OUTCOME_RUNNING else now
        rows.append(StageRun(cid, stage, run_id, started, ended, outcome, source))
    lake.write_rows([r.__dict__ for r in rows], RUNS_SCHEMA, RUNS_TABLE, replace_capture_ids=ids)


def completeness(runs: Mapping[tuple[str, str], StageRun], capture_id: str) -> str:
    """``complete`` when the capture's derive finished on its latest ingest; otherwise why not.

    A capture ingested before the runs table existed has no ingest row: its bronze rows count
    as ingested."""
    ingest = runs.get((capture_id, "ingest"))
    derive = runs.get((capture_id, "derive"))
    if ingest is not None and not ingest.ok:
        return f"ingest {ingest.outcome}"
    if derive is None:
        return "not derived"
    if not derive.ok:
        return f"derive {derive.outcome}"
    if derive.source_run != (ingest.run_id if ingest is not None else None):
        return "derived from an earlier ingest"
    return COMPLETE


def pending_derive(lake: Lake, bronze_capture_ids: Sequence[str]) -> list[str]:
    """Captures whose bronze rows are newer than their derived rows (or that were never derived),
    among those whose ingest finished."""
    runs = stage_runs(lake, bronze_capture_ids)
    pending = []
    for cid in bronze_capture_ids:
        ingest = runs.get((cid, "ingest"))
        if ingest is not None and not ingest.ok:
            continue  # bronze incomplete: the next ingest repairs it first
        if completeness(runs, cid) != COMPLETE:
            pending.append(cid)
    return sorted(pending)


def failed_outcome(exc: BaseException) -> str:
    """The runs-table outcome for a stage ended by ``exc``: its first line."""
    text = str(exc).strip().splitlines()
    return f"{OUTCOME_FAILED_PREFIX}{type(exc).__name__}: {text[0] if text else ''}"[:500]


def forget(lake: Lake, capture_ids: Sequence[str]) -> None:
    """Drop the runs rows of captures no longer in the lake (superseded by a longer rotation)."""
    if capture_ids and lake.exists(RUNS_TABLE):
        lake.write_rows([], RUNS_SCHEMA, RUNS_TABLE, replace_capture_ids=capture_ids)
