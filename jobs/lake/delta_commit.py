"""One delta-rs commit of a capture-by-capture replacement, made the way Delta's optimistic
concurrency control has it: the commit names the version it read, and goes through only if no
commit made since then touched the same captures.

delta-rs commits at the version after the snapshot it was given, without retries of its own
(``max_commit_retries=0``): if that version is taken, the commits in between are read
(``jobs.lake.delta_log.conflicting_commit``). One that replaced rows of the same captures wins, and this
write fails with a ``WriteConflict`` naming the table and the other run; others (different
captures, the table created meanwhile by another run) are harmless, and the commit is tried again
on the newer snapshot. Since a version file is created only if absent, the check and the commit
cannot interleave with another writer's.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deltalake import DeltaTable, Schema
from deltalake.transaction import AddAction, CommitProperties, create_table_with_add_actions

from amqpscope.jobs.lake import delta_log
from amqpscope.jobs.lake.errors import printable

log = logging.getLogger("amqpscope.lake")

# Versions lost to other writers (of other captures) before giving up; each attempt waits a little,
# at random, so that writers in step fall out of it.
MAX_ATTEMPTS = 60
_BACKOFF_SECONDS = 0.05
NO_TABLE = -1  # the read version of a write that found no table


@dataclass(frozen=True)
class Commit:
    """What one write commits: its files (already in place), the captures it replaces, the version it read."""

    path: str
    table: str
    schema: Schema
    adds: Sequence[AddAction]
    capture_ids: Sequence[str]
    partition_columns: Sequence[str]
    read_version: int  # NO_TABLE when the table did not exist
    run_id: str | None
    description: str | None = None


def process_owner() -> str:
    """This process as the lake names a writer: host and process id."""
    return f"pid {os.getpid()} on {socket.gethostname()}"


def commit(request: Commit, opened: DeltaTable | None, fits: Callable[[DeltaTable], None]) -> int:
    """Commit ``request`` and return its version. ``opened`` is the snapshot read (None: no table);
    ``fits`` checks the rows against a newer snapshot (schema, partitioning) before a new attempt."""
    commit_id = uuid.uuid4().hex
    base, table = request.read_version, opened
    metadata = {delta_log.COMMIT_KEY: commit_id, delta_log.OWNER_KEY: process_owner()}
    if request.run_id:
        metadata[delta_log.RUN_KEY] = request.run_id
    if request.read_version >= 0:
        metadata["readVersion"] = request.read_version  # the Delta protocol's commitInfo field
    partition = request.partition_columns[0]
    for attempt in range(1, MAX_ATTEMPTS + 1):
        latest = delta_log.check_log(request.path, request.table)
        latest = NO_TABLE if latest is None else latest
        if latest > base:
            delta_log.conflicting_commit(
                request.path, request.table, request.read_version, base, latest, request.capture_ids, partition
            )
            base, table = latest, None
        properties = CommitProperties(max_commit_retries=0, custom_metadata=metadata)
        try:
            if base == NO_TABLE:
                create_table_with_add_actions(
                    request.path,
                    request.schema,
                    list(request.adds),
                    mode="error",
                    partition_by=list(request.partition_columns),
                    name=request.table,
                    description=request.description,
                    commit_properties=properties,
                )
            else:
                if table is None:
                    table = DeltaTable(request.path, version=base)
                    fits(table)
                table.create_write_transaction(
                    list(request.adds),
                    mode="overwrite",
                    schema=request.schema,
                    partition_by=list(request.partition_columns),
                    partition_filters=[(partition, "in", list(request.capture_ids))],
                    commit_properties=properties,
                )
            return base + 1
        except Exception as exc:
            now = delta_log.latest_version(request.path)
            done = delta_log.committed_by(request.path, request.table, commit_id, base, now)
            if done is not None:  # the commit went through; what failed came after it
                log.warning(
                    "table %s: committed version %d, then: %s",
                    request.table,
                    done,
                    printable(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__),
                )
                return done
            if now is None or now <= base:
                raise  # no other writer took the version: a failure of its own
            table = None
        time.sleep(_BACKOFF_SECONDS * attempt * random.random())
    raise RuntimeError(
        f"table {request.table}: not committed after {MAX_ATTEMPTS} attempts: other writers committed first each time"
    )
