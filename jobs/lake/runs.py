"""Bookkeeping of runs per capture and stage (the ``runs`` table, ``schemas/runs.py``).

Every stage that writes a capture's rows marks the capture ``running`` first and ``ok`` after its
last commit. Each mark is one Delta commit of the capture's ``runs`` partition, so a reader sees a
capture either as finished by a stage or not, never in between; a capture whose derive is not
``ok`` for its latest ingest is incomplete, and is neither reported nor taken as clean.

Leases: a ``running`` row is its run's lease on the capture. A mark (of any outcome) reads the
capture's rows, refuses (``CaptureBusy``) when another run holds a live lease, and commits on the
version it read: two runs marking one capture at once conflict in the lake (``WriteConflict``), and
the one that lost reads again and sees the other's lease. A lease is live while its owner process
runs: on this host that is known at once (a run killed leaves a lease nobody holds, taken over by the
next run); on another host it is taken as live until ``lease_until`` (``LEASE_SECONDS`` after the
run's latest mark).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from amqpscope.jobs.lake.commits import check_stored
from amqpscope.jobs.lake.delta_commit import process_owner
from amqpscope.jobs.lake.errors import CaptureBusy, WriteConflict
from amqpscope.jobs.lake.files import pid_running
from amqpscope.jobs.lake.lake import Lake
from amqpscope.schemas.runs import OUTCOME_FAILED_PREFIX, OUTCOME_OK, OUTCOME_RUNNING, RUNS_SCHEMA, STAGES

log = logging.getLogger("amqpscope.runs")

RUNS_TABLE = "runs"
COMPLETE = "complete"
# How long a run on another host holds its captures after its latest mark (a stage of a large
# capture runs for minutes; a run killed on another host blocks its captures this long at most).
LEASE_SECONDS = 6 * 3600
# Marks lost to other runs' marks of the same captures before giving up (each then reads again).
_MARK_ATTEMPTS = 20
_OWNER = re.compile(r"pid (\d+) on (.+)")


def new_run_id() -> str:
    """A run id that sorts by start time and does not collide between concurrent runs."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


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
    owner: str | None = None  # "pid N on host" (null in rows of an older amqpscope)
    lease_until: datetime | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == OUTCOME_OK

    def holder(self, now: datetime) -> str | None:
        """The run holding the capture through this row ("run R (pid N on host)"), if its lease is live."""
        if self.outcome != OUTCOME_RUNNING or self.owner is None:
            return None
        alive = owner_alive(self.owner, self.started)
        if alive is False or (alive is None and (self.lease_until is None or self.lease_until <= now)):
            return None
        return f"run {self.run_id} ({self.owner}, since {self.started:%Y-%m-%d %H:%M:%S} UTC)"


def owner_alive(owner: str, started: datetime) -> bool | None:
    """Whether the process ``owner`` ("pid N on host") still runs the run that started at ``started``;
    None when it is another host's.

    A process id taken again by a process started after ``started`` is the run's no more; nor is
    this process, asked about a run other than its own (it runs one at a time: that one ended)."""
    found = _OWNER.fullmatch(owner)
    if found is None or found.group(2) != socket.gethostname():
        return None
    pid = int(found.group(1))
    if pid == os.getpid() or not pid_running(pid):
        return False
    began = _process_start(pid)
    return not (began is not None and began > started + timedelta(seconds=1))


def _process_start(pid: int) -> datetime | None:
    """When process ``pid`` started (Linux /proc), None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])  # field 22: clock ticks after boot
        with open("/proc/stat", encoding="ascii") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, IndexError, StopIteration, ValueError):
        return None
    return datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"), UTC)


def stage_runs(
    lake: Lake, capture_ids: Sequence[str] | None = None, version: int | None = None
) -> dict[tuple[str, str], StageRun]:
    """The runs rows (of ``capture_ids``, or all; at ``version``, or the latest) by (capture_id,
    stage); times in UTC."""
    if version == -1 or (version is None and not lake.exists(RUNS_TABLE)):
        return {}
    rows = lake.read_rows(RUNS_TABLE, RUNS_SCHEMA, capture_ids, version=version)
    found = [StageRun(**{k: _utc(v) for k, v in r.items()}) for r in rows]
    return {(r.capture_id, r.stage): r for r in found}


def _utc(value: object) -> object:
    # Spark collects timestamps as naive local times, pyarrow as aware UTC ones: both as aware UTC.
    return value.astimezone(UTC) if isinstance(value, datetime) else value


def mark(
    lake: Lake,
    run_id: str,
    stage: str,
    capture_ids: Sequence[str],
    outcome: str,
    source_runs: Mapping[str, str | None] | None = None,
) -> None:
    """Record ``outcome`` of ``stage`` for ``capture_ids`` in one commit (their other stages' rows kept).

    ``running`` starts the clock; any other outcome ends it (the start kept when this run marked
    the stage running before). ``CaptureBusy`` when another live run holds one of the captures.
    Before ``ok``, the tables this run wrote are checked to hold the captures' rows it committed
    (``jobs.lake.commits.check_stored``: ``StoredRowsMismatch`` names the table)."""
    _checked(stage, outcome)
    if outcome == OUTCOME_OK:
        check_stored(lake, lake.take_written(capture_ids, exclude=(RUNS_TABLE,)))
    # A failure is recorded for the captures no other run holds (a run that lost a race to another
    # leaves the other's rows alone); any other mark of a held capture is refused.
    _mark(
        lake,
        run_id,
        stage,
        sorted(set(capture_ids)),
        outcome,
        source_runs,
        skip_busy=outcome.startswith(OUTCOME_FAILED_PREFIX),
    )


def claim(lake: Lake, run_id: str, stage: str, capture_ids: Sequence[str]) -> list[tuple[str, str]]:
    """Mark ``stage`` running for those of ``capture_ids`` no other live run holds; returns the
    others, (capture id, the run holding it), left alone."""
    _checked(stage, OUTCOME_RUNNING)
    return _mark(lake, run_id, stage, sorted(set(capture_ids)), OUTCOME_RUNNING, None, skip_busy=True)


def _checked(stage: str, outcome: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, not {stage!r}")
    if outcome not in (OUTCOME_RUNNING, OUTCOME_OK) and not outcome.startswith(OUTCOME_FAILED_PREFIX):
        raise ValueError(f"outcome must be running, ok or 'failed: reason', not {outcome!r}")


def _mark(
    lake: Lake,
    run_id: str,
    stage: str,
    ids: list[str],
    outcome: str,
    source_runs: Mapping[str, str | None] | None,
    skip_busy: bool,
) -> list[tuple[str, str]]:
    owner = process_owner()
    for _attempt in range(_MARK_ATTEMPTS):
        if not ids:
            return []
        now = datetime.now(UTC)
        version = lake.version(RUNS_TABLE)  # the marks commit on what they read
        existing = stage_runs(lake, ids, version)
        busy = _holders(existing, run_id, now)
        if busy and not skip_busy:
            raise CaptureBusy(RUNS_TABLE, busy)
        free = [cid for cid in ids if cid not in dict(busy)]
        if outcome.startswith(OUTCOME_FAILED_PREFIX):
            # A failure is recorded over this run's own rows only: a capture another run has written
            # since (a run that lost a race to it) keeps that run's outcome.
            free = [cid for cid in free if (cid, stage) not in existing or existing[(cid, stage)].run_id == run_id]
        if not free:
            return busy
        rows = [r for (cid, st), r in existing.items() if st != stage and cid in free]
        for cid in free:
            before = existing.get((cid, stage))
            same_run = before is not None and before.run_id == run_id
            started = before.started if same_run and outcome != OUTCOME_RUNNING else now
            source = (source_runs or {}).get(cid, before.source_run if same_run else None)
            ended = None if outcome == OUTCOME_RUNNING else now
            rows.append(
                StageRun(
                    cid, stage, run_id, started, ended, outcome, source, owner, now + timedelta(seconds=LEASE_SECONDS)
                )
            )
        try:
            lake.write_rows(
                [r.__dict__ for r in rows], RUNS_SCHEMA, RUNS_TABLE, replace_capture_ids=free, read_version=version
            )
        except WriteConflict:
            continue  # another run marked some of these captures since they were read: read again
        return busy
    raise RuntimeError(
        f"table {RUNS_TABLE}: the marks of {len(ids)} capture(s) lost to other runs' {_MARK_ATTEMPTS} times"
    )


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


def busy(lake: Lake, run_id: str, capture_ids: Sequence[str]) -> list[tuple[str, str]]:
    """Those of ``capture_ids`` another live run holds, with that run."""
    return _holders(stage_runs(lake, capture_ids), run_id, datetime.now(UTC))


def _holders(rows: Mapping[tuple[str, str], StageRun], run_id: str, now: datetime) -> list[tuple[str, str]]:
    """(capture id, the run holding it) for each capture of ``rows`` another run than ``run_id`` holds."""
    held: dict[str, str] = {}
    for (cid, _stage), row in sorted(rows.items()):
        who = row.holder(now) if row.run_id != run_id else None
        if who is not None:
            held.setdefault(cid, who)
    return sorted(held.items())


@contextmanager
def verdicts_failing_derive(lake: Lake, run_id: str, capture_ids: Sequence[str], verdicts: Future) -> Iterator[None]:
    """Around what waits for the verdicts Great Expectations validates on a thread of its own
    (after derive marked its tables ``ok``): if they failed (a full disk under the Data Docs), the
    captures' derive is marked failed, so that they are not complete and the next run derives them."""
    try:
        yield
    except Exception:
        failure = verdicts.exception() if verdicts.done() else None
        if failure is not None:
            try:
                mark(lake, run_id, "derive", capture_ids, failed_outcome(failure))
            except Exception as unrecorded:  # the lake may be full too: the next run's check decides
                log.warning(
                    "could not record the failed verdicts of %s: %s",
                    ", ".join(capture_ids),
                    str(unrecorded).splitlines()[0] if str(unrecorded) else type(unrecorded).__name__,
                )
        raise
