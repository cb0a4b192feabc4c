"""A Delta table's log read as files: the versions committed, each commit's actions, damage, and the
commits that conflict with a write (optimistic concurrency, as the Delta protocol defines it).

The delta-rs backend's tables are on the local filesystem, so their log is read here directly:

- **Damage.** A commit file (``_delta_log/<version>.json``, one JSON action a line) that is empty or
  does not parse is ``DamagedLog``, naming the table and the version. delta-rs reads an empty
  commit as a commit of nothing (the rows it added vanish without an error), and one of bad bytes
  as an error that prints them raw; neither is accepted here. Versions after the last checkpoint
  are checked (what a reader replays); each file once per process.
- **Conflicts.** A write reads the table at a version, works (Spark writes its files), then
  commits. ``conflicting_commit`` reads the commits made after the version read: one that added or
  removed files of the same captures' partitions is another run's replacement of those captures,
  and the write must not commit over it. delta-rs (1.6.6) does not see that conflict when the
  captures had no rows in the version read (a "blind" overwrite of an empty partition: both runs'
  rows stay, twice); it does see removes, but of any partition, so two runs writing different
  captures would conflict for nothing. The lake therefore commits with delta-rs's own retries off
  and checks the commits in between itself (``jobs.lake.lake``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from urllib.parse import unquote

from amqpscope.jobs.lake.errors import DamagedLog, WriteConflict

LOG_DIR = "_delta_log"
_COMMIT = re.compile(r"(\d{20})\.json")
_CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(\.\d+\.\d+)?(\.[0-9a-f-]+)?\.(parquet|json)")
# Keys of commitInfo amqpscope adds to its commits: who wrote it, and the commit's own id.
RUN_KEY = "amqpscope.runId"
OWNER_KEY = "amqpscope.owner"
COMMIT_KEY = "amqpscope.commitId"

# Commit files found sound in this process: (path, size, mtime). A commit file is never rewritten.
_sound: set[tuple[str, int, int]] = set()


def commit_path(path: str, version: int) -> str:
    return os.path.join(path, LOG_DIR, f"{version:020d}.json")


def _log_names(path: str) -> list[str]:
    try:
        return os.listdir(os.path.join(path, LOG_DIR))
    except FileNotFoundError:
        return []


def latest_version(path: str) -> int | None:
    """The table's latest committed version, from the log's file names; None when it has none."""
    versions = [int(m.group(1)) for m in map(_COMMIT.fullmatch, _log_names(path)) if m]
    return max(versions) if versions else None


def last_checkpoint(path: str) -> int | None:
    """The version of the table's latest checkpoint file, if it has one."""
    versions = [int(m.group(1)) for m in map(_CHECKPOINT.fullmatch, _log_names(path)) if m]
    return max(versions) if versions else None


def commit_actions(path: str, table: str, version: int) -> list[dict]:
    """The actions of commit ``version``; ``DamagedLog`` when its file is empty or is not JSON
    actions, one a line."""
    file = commit_path(path, version)
    shown = os.path.join(LOG_DIR, os.path.basename(file))
    try:
        with open(file, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise DamagedLog(table, version, shown, "is missing: later versions exist") from None
    if not data.strip():
        raise DamagedLog(
            table,
            version,
            shown,
            f"is empty ({len(data)} bytes): the commit was cut short "
            "(a crash or a full disk); a reader would take it as a commit "
            "of nothing",
        )
    actions = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise DamagedLog(
                table, version, shown, f"is not JSON at line {number}: {exc} (starts {line[:24]!r})"
            ) from None
        if not isinstance(action, dict) or len(action) != 1:
            raise DamagedLog(table, version, shown, f"line {number} is not one Delta action")
        actions.append(action)
    return actions


def check_log(path: str, table: str) -> int | None:
    """The table's latest version, once every commit a reader replays (after the last checkpoint)
    is there and sound; ``DamagedLog`` names the first that is not. None: no table."""
    latest = latest_version(path)
    if latest is None:
        return None
    checkpoint = last_checkpoint(path)
    first = checkpoint + 1 if checkpoint is not None else 0
    for version in range(first, latest + 1):
        file = commit_path(path, version)
        try:
            stat = os.stat(file)
        except FileNotFoundError:
            stat = None
        key = (file, stat.st_size, stat.st_mtime_ns) if stat is not None else None
        if key is not None and key in _sound:
            continue
        commit_actions(path, table, version)
        if key is not None:
            _sound.add(key)
    return latest


def _commit_info(actions: Sequence[dict]) -> dict:
    return next((a["commitInfo"] for a in actions if isinstance(a.get("commitInfo"), dict)), {})


def writer_of(info: dict) -> str:
    """Who made a commit, from its commitInfo: an amqpscope run by its id, else the engine."""
    run = info.get(RUN_KEY)
    if run:
        owner = info.get(OWNER_KEY)
        return f"run {run}" + (f" ({owner})" if owner else "")
    when = info.get("timestamp")
    stamp = (
        f" at {datetime.fromtimestamp(when / 1000, UTC):%Y-%m-%d %H:%M:%S} UTC"
        if isinstance(when, (int, float))
        else ""
    )
    return f"another writer ({info.get('engineInfo') or 'unknown engine'}, {info.get('operation') or 'commit'}{stamp})"


def _touched_captures(actions: Sequence[dict], partition: str) -> Iterator[str | None]:
    """The partition values (of column ``partition``) of the files a commit's actions add or remove
    as a change of data (a compaction's, ``dataChange`` false, rewrites rows without changing them)."""
    for action in actions:
        for kind in ("add", "remove"):
            body = action.get(kind)
            if not isinstance(body, dict) or body.get("dataChange") is False:
                continue
            values = body.get("partitionValues")
            if isinstance(values, dict) and partition in values:
                yield values[partition]
                continue
            # A remove may leave out its partition values: the Hive-style directory says it.
            first = unquote(str(body.get("path", ""))).split("/", 1)[0]
            name, eq, value = first.partition("=")
            yield value if name == partition and eq else "?"  # unknown: taken as touching every capture


def conflicting_commit(
    path: str, table: str, read_version: int, after: int, upto: int, capture_ids: Sequence[str], partition: str
) -> None:
    """``WriteConflict`` when a commit in (``after``, ``upto``] added or removed files of
    ``capture_ids`` (those commits were made after this write read ``read_version``; -1: before
    the table existed)."""
    wanted = set(capture_ids)
    for version in range(after + 1, upto + 1):
        actions = commit_actions(path, table, version)
        touched = set(_touched_captures(actions, partition))
        if touched & wanted or "?" in touched:
            raise WriteConflict(
                table,
                sorted(wanted & touched) or sorted(wanted),
                read_version,
                version,
                writer_of(_commit_info(actions)),
            )


def committed_by(path: str, table: str, commit_id: str, after: int, upto: int | None) -> int | None:
    """The version in (``after``, ``upto``] whose commitInfo carries ``commit_id``, if any: a
    commit that went through although its call raised (a failure after the commit, a checkpoint)."""
    if upto is None:
        return None
    for version in range(after + 1, upto + 1):
        try:
            info = _commit_info(commit_actions(path, table, version))
        except DamagedLog:
            continue
        if info.get(COMMIT_KEY) == commit_id:
            return version
    return None
