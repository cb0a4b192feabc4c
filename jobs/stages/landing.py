"""``amqpscope ingest LANDING_DIR``: incremental ingestion of a landing directory.

Captures are keyed by content hash: a file whose bytes were ingested before (under any name) is
skipped, so re-running on the same directory changes nothing. A file that is not a readable
capture is recorded in the ``captures`` table with its reason and in the ``quarantine`` table with
its size, while the rest of the batch commits; it is not retried until its bytes change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.pcap import CaptureError, capture_id
from amqpscope.ingest.quarantine import FAILED
from amqpscope.ingest.quarantine import unreadable_rows as quarantine_rows
from amqpscope.ingest.rotation import CapturePart, describe_part, group_parts
from amqpscope.jobs.engine.session import sized_for
from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.decode import Bronze, CaptureFile, superseded_captures, write_bronze
from amqpscope.jobs.stages.progress import Progress
from amqpscope.jobs.stages.stages import StageClock, one_line
from amqpscope.schemas.frames import CAPTURES_SCHEMA, QUARANTINE_SCHEMA
from amqpscope.schemas.runs import OUTCOME_OK, OUTCOME_RUNNING

log = logging.getLogger("amqpscope.ingest")

# Names that writers use for files still being written: never picked up.
_IN_PROGRESS_SUFFIXES = (".part", ".tmp", ".partial", ".crdownload")


@dataclass(frozen=True)
class LandingResult:
    ingested: tuple[str, ...]  # capture ids decoded by this run
    skipped: tuple[str, ...]  # already in the lake
    failed: tuple[tuple[str, str], ...]  # (file name, reason)
    busy: tuple[tuple[str, str], ...] = ()  # (capture id, the live run writing it): left to that run


def landing_files(landing: Path, settled_for: float = 0.0) -> list[Path]:
    """Regular files of the landing directory (recursively), in name order, minus work in progress:
    hidden files, names writers give files being written, and files changed within the last
    ``settled_for`` seconds (tcpdump writes its files under their final names)."""
    if not landing.is_dir():
        raise CaptureError(landing, "landing directory", "not a directory")
    changed_after = time.time() - settled_for
    return sorted(
        p
        for p in landing.rglob("*")
        if p.is_file()
        and not p.name.startswith(".")
        and not p.name.endswith(_IN_PROGRESS_SUFFIXES)
        and (settled_for <= 0 or _changed_before(p, changed_after))
    )


# A file as listed (path, size, change time in ns), and what reading it gave: its content hash and its
# description, or the reason it is not a readable capture (None: not read beyond its hash).
_FileKey = tuple[str, int, int]
_Described = tuple[str, CapturePart | str | None]


def _file_key(path: Path) -> _FileKey:
    stat = path.stat()
    return str(path), stat.st_size, stat.st_mtime_ns


def _describe(path: Path, cid: str) -> CapturePart | str:
    try:
        return describe_part(path, cid)
    except CaptureError as exc:
        return exc.reason


def _changed_before(path: Path, when: float) -> bool:
    """Whether ``path`` was last changed before ``when`` (a file gone meanwhile was not)."""
    try:
        return path.stat().st_mtime <= when
    except OSError:
        return False


def ingest_files(
    spark: SparkSession,
    lake: Lake,
    captures: Sequence[CaptureFile],
    ports: tuple[int, ...],
    superseded: Sequence[str] = (),
    *,
    run_id: str,
    progress: Progress | None = None,
    claimed: bool = False,
    tls_keylog: Sequence[str | Path] = (),
) -> Bronze:
    """Decode ``captures`` into the bronze tables (replacing their rows and the ``superseded``
    captures'), marked ``running`` in the runs table before the first write (unless ``claimed``
    so already: ``runs.claim``) and ``ok`` after the last; the caller releases the returned tables."""
    ids = [c.capture_id for c in captures]
    if not claimed:
        runs.mark(lake, run_id, "ingest", ids, OUTCOME_RUNNING)
    try:
        bronze = write_bronze(spark, lake, captures, ports, superseded, progress, tls_keylog)
    except Exception as exc:
        try:
            runs.mark(lake, run_id, "ingest", ids, runs.failed_outcome(exc))
        except Exception as unrecorded:  # the lake itself may be what failed: the rows stay "running", still incomplete
            log.warning("could not record the failed ingest of %s: %s", ", ".join(ids), one_line(unrecorded))
            log.info("the failure to record it:", exc_info=True)  # the trace with -v
        raise
    runs.mark(lake, run_id, "ingest", ids, OUTCOME_OK)
    return bronze


def ingest_landing(
    spark: SparkSession,
    landing: Path,
    config: AnalyzeConfig,
    progress: Progress | None = None,
    run_id: str | None = None,
    settled_for: float = 0.0,
    remembered: dict[_FileKey, _Described] | None = None,
) -> LandingResult:
    """Decode every capture of ``landing`` not in the lake yet (or whose last ingest did not
    finish); record the ones that cannot be read. Files changed within the last ``settled_for``
    seconds are left for a later run (``landing_files``). ``remembered``, kept by the caller from
    one run to the next (``jobs.stages.watch``), saves reading files again whose path, size and change time
    are as they were.

    Rotated files are decoded as one capture (``ingest.rotation``); when a new part joins a
    capture already in the lake, the whole capture is decoded again and replaces its rows."""
    run_id = run_id or runs.new_run_id()
    lake = Lake.of(spark, config, run_id=run_id)
    lake.remove_stale_staging()
    known = _known_captures(lake)
    failed_before = {cid for cid, hashes in known.items() if hashes is None}
    parts: dict[str, CapturePart] = {}
    failed: dict[str, tuple[Path, str]] = {}
    described: dict[_FileKey, _Described] = {}
    for path in landing_files(landing, settled_for):
        try:
            key = _file_key(path)
            cid, part = described[key] = (remembered or {}).get(key) or (capture_id(path), None)
        except FileNotFoundError:
            continue  # removed since the directory was listed
        if cid in parts or cid in failed or cid in failed_before:
            continue  # the same bytes under an earlier name, or recorded as unreadable before
        if part is None:
            part = _describe(path, cid)
            described[key] = (cid, part)
        if isinstance(part, str):
            failed[cid] = (path, part)
        else:
            parts[cid] = part
    if remembered is not None:  # the files of this run only: a long watch sees files come and go
        remembered.clear()
        remembered.update(described)
    grouping = group_parts(parts.values(), config.group_rotated)
    for line in grouping.explain():  # which files are one capture, and why (and which are not)
        if progress is not None:
            progress.announce(line)
        else:
            log.info("%s", line)
    captures = [CaptureFile(g) for g in grouping.captures]
    fresh = [c for c in captures if known.get(c.capture_id) != c.part_hashes]
    skipped = sorted(c.capture_id for c in captures if known.get(c.capture_id) == c.part_hashes)
    clock = StageClock(progress=progress)
    busy: list[tuple[str, str]] = []
    with clock.stage("ingest"):  # a failure names the stage and the table
        if failed:
            _record_failures(spark, lake, failed)
        if fresh:
            # Captures another live run is writing (an analyze of the same file) are left to it.
            busy = runs.claim(lake, run_id, "ingest", [c.capture_id for c in fresh])
            for cid, holder in busy:
                log.warning("capture %s not ingested: %s", cid[:12], holder)
            fresh = [c for c in fresh if c.capture_id not in dict(busy)]
        if fresh:
            if progress is not None:
                progress.step(f"decoding {len(fresh)} capture(s) from {sum(len(c.parts) for c in fresh)} file(s)")
            superseded = superseded_captures(lake, fresh)
            with sized_for(spark, sum(c.size for c in fresh)):
                ingest_files(
                    spark,
                    lake,
                    fresh,
                    config.ports,
                    superseded,
                    run_id=run_id,
                    progress=progress,
                    tls_keylog=config.tls_keylog,
                    claimed=True,
                ).release()
            # The superseded captures' derived rows go with the next derive (no bronze rows left).
            runs.forget(lake, superseded)
    log.info("ingested %d, skipped %d, failed %d, busy %d", len(fresh), len(skipped), len(failed), len(busy))
    return LandingResult(
        tuple(c.capture_id for c in fresh),
        tuple(skipped),
        tuple((p.name, reason) for p, reason in failed.values()),
        tuple(busy),
    )


def _known_captures(lake: Lake) -> dict[str, tuple[str, ...] | None]:
    """Captures in the lake and the content hashes of their parts (None: recorded as unreadable);
    a capture whose last ingest did not finish is not known, so that it is decoded again."""
    if not lake.exists("captures"):
        return {}
    unfinished = {cid for (cid, stage), r in runs.stage_runs(lake).items() if stage == "ingest" and not r.ok}
    # A row per capture: read on the driver (no Spark query with delta-rs).
    rows = lake.read_rows("captures", StructType([CAPTURES_SCHEMA[c] for c in ("capture_id", "status", "parts")]))
    return {
        r["capture_id"]: None
        if (r["status"] or "").startswith(FAILED)
        else tuple([p["content_hash"] for p in r["parts"] or ()] or (r["capture_id"],))
        for r in rows
        if r["capture_id"] not in unfinished
    }


def unreadable_rows(cid: str, path: Path, reason: str) -> dict[str, dict]:
    """The rows that record a file that is not a readable capture: its ``captures`` row (status
    names the reason) and one ``quarantine`` row holding all its bytes (``ingest.quarantine``)."""
    return quarantine_rows(cid, path.name, path.stat().st_size, reason)


def _record_failures(spark: SparkSession, lake: Lake, failed: dict[str, tuple[Path, str]]) -> None:
    """One captures row (status names the reason) and one quarantine row (all bytes) per bad file."""
    rows = [unreadable_rows(cid, path, reason) for cid, (path, reason) in failed.items()]
    captures = spark.createDataFrame([r["captures"] for r in rows], CAPTURES_SCHEMA)
    quarantine = spark.createDataFrame([r["quarantine"] for r in rows], QUARANTINE_SCHEMA)
    ids = list(failed)
    lake.write(quarantine, "quarantine", replace_capture_ids=ids)
    lake.write(captures, "captures", replace_capture_ids=ids)
    for path, reason in failed.values():
        log.warning("%s: not ingested: %s", path, reason)
