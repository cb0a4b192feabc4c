"""The files of a delta-rs write, as Spark lays them out: ``col=value`` partition directories (values
escaped as Spark escapes them), the staging folder a write fills before its files move into the
table, and whose process left a staging folder behind (``jobs.lake.lake``)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

# How Spark (and Hive, and Delta writers) spell a null partition value in a directory name.
NULL_PARTITION_DIR = "__HIVE_DEFAULT_PARTITION__"
STAGING_DIR = "_staging"
# A staging folder of another host (whose processes we cannot see) is taken as abandoned after this.
STALE_STAGING_SECONDS = 24 * 3600


@dataclass(frozen=True)
class StagedFile:
    """One Parquet file Spark wrote into the staging directory."""

    relative_dir: str  # Hive-style partition directories, e.g. "capture_id=a%3Ab"
    name: str
    partition_values: dict[str, str | None]
    num_records: int
    size: int


def partition_values_of(relative_dir: str, partition_columns: list[str]) -> dict[str, str | None]:
    """Partition values from Spark's ``col=value/...`` directories (values path-escaped)."""
    values: dict[str, str | None] = {}
    for segment in relative_dir.split("/"):
        name, _, escaped = segment.partition("=")
        values[name] = None if escaped == NULL_PARTITION_DIR else spark_unescape(escaped)
    if list(values) != partition_columns:
        raise RuntimeError(f"unexpected partition directories {relative_dir!r} for {partition_columns}")
    return values


def staged_files(staging: str, partition_columns: list[str]) -> list[StagedFile]:
    files = []
    for directory, _, names in os.walk(staging):
        for name in names:
            # Spark's side files (_SUCCESS, .crc checksums) are not data.
            if name.startswith(("_", ".")) or not name.endswith(".parquet"):
                continue
            file_path = os.path.join(directory, name)
            relative_dir = os.path.relpath(directory, staging).replace(os.sep, "/")
            files.append(
                StagedFile(
                    relative_dir=relative_dir,
                    name=name,
                    partition_values=partition_values_of(relative_dir, partition_columns),
                    num_records=pq.read_metadata(file_path).num_rows,  # the footer only
                    size=os.path.getsize(file_path),
                )
            )
    return files


def stage_rows(
    rows: Sequence[Mapping[str, Any]], schema: StructType, staging: str, partition_columns: list[str]
) -> None:
    """Rows made on the driver as Parquet files in ``staging``, laid out as Spark lays out a
    partitioned write (``col=value`` directories, every column optional, timestamps UTC micros)."""
    arrow = pa.schema([field.with_nullable(True) for field in to_arrow_schema(schema)])
    stage_arrow(pa.Table.from_pylist([dict(row) for row in rows], schema=arrow), schema, staging, partition_columns)


def stage_arrow(rows: pa.Table, schema: StructType, staging: str, partition_columns: list[str]) -> None:
    """An Arrow table of rows of ``schema`` (a Spark result's ``toArrow``, or rows made on the
    driver) as Parquet files in ``staging``, one a partition, laid out as ``stage_rows`` says; the
    rows keep their order."""
    if rows.num_rows == 0:
        return
    data = StructType([f for f in schema.fields if f.name not in partition_columns])
    arrow = pa.schema([field.with_nullable(True) for field in to_arrow_schema(data)])
    for values in rows.select(partition_columns).group_by(partition_columns).aggregate([]).to_pylist():
        mask = None
        for column in partition_columns:
            value = values[column]
            matches = (
                pc.is_null(rows[column])
                if value is None
                else pc.equal(rows[column], pa.scalar(value, rows.schema.field(column).type))
            )
            mask = matches if mask is None else pc.and_(mask, matches)
        directory = os.path.join(staging, *(f"{c}={partition_dir(values[c])}" for c in partition_columns))
        os.makedirs(directory, exist_ok=True)
        pq.write_table(
            rows.filter(mask).select(data.fieldNames()).cast(arrow),
            os.path.join(directory, f"part-00000-{uuid.uuid4()}.c000.snappy.parquet"),
            compression="snappy",
        )


# The characters Spark escapes as %XX in a partition directory name (ExternalCatalogUtils), besides
# the control characters.
_ESCAPED_IN_PARTITION_DIRS = frozenset("\"#%'*/:=?\\\x7f{[]^")


def partition_dir(value: Any) -> str:
    """A partition value as Spark names its directory (``spark_unescape`` reads it back)."""
    text = partition_string(value)
    if text is None or text == "":
        return NULL_PARTITION_DIR
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED_IN_PARTITION_DIRS or ord(c) < 0x20 else c for c in text)


def staging_name() -> str:
    """A staging folder name that says who made it: host, process and a unique part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"


# How often a write tries to make its staging folder while other writes keep removing the shared
# ``_staging`` parent they found empty (each retry means another write finished at that instant).
_STAGING_ATTEMPTS = 100


def make_staging(table_path: str) -> str:
    """Make this write's own folder ``<table>/_staging/<host>-<pid>-<id>`` and return it.

    A write that finishes removes ``_staging`` when it is empty (``jobs.lake.lake``), so between making
    that parent and making the folder in it, another write may remove the parent: the folder is
    made again until it exists. Once it does, the parent is not empty and stays."""
    folder = os.path.join(table_path, STAGING_DIR, staging_name())
    for _ in range(_STAGING_ATTEMPTS):
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        try:
            os.mkdir(folder)
            return folder
        except FileNotFoundError:
            continue  # the parent was removed by a write that just finished
    raise OSError(f"{table_path}: could not make a staging folder in {STAGING_DIR}: removed {_STAGING_ATTEMPTS} times")


def staging_is_stale(name: str, modified: float, now: float) -> bool:
    """A staging folder left by a writer that is gone: a process of this host no longer running,
    or (another host's, or a name from an older amqpscope) untouched for STALE_STAGING_SECONDS."""
    parts = name.rsplit("-", 2)  # host names may hold "-"
    host, pid_text = (parts[0], parts[1]) if len(parts) == 3 else ("", "")
    if host == socket.gethostname() and pid_text.isdigit():
        return int(pid_text) != os.getpid() and not pid_running(int(pid_text))
    return now - modified > STALE_STAGING_SECONDS


def pid_running(pid: int) -> bool:
    """Whether a process of this host has id ``pid`` (a zombie, ended but not reaped, has not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True  # no /proc: kill's answer stands


def spark_unescape(value: str) -> str:
    # Spark's partition discovery decodes each %XX to one char (Latin-1), not UTF-8 bytes.
    return unquote(value, encoding="latin-1")


def partition_string(value: Any) -> str | None:
    """A typed partition value from `get_add_actions` back in its directory / log text form."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, date):
        return value.isoformat()
    return str(value)
