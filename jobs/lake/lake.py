"""The lake: every amqpscope table, one Delta table per name under one root directory, or in a
Unity Catalog schema.

Tables are written capture by capture: a write replaces the rows of the captures it
(re)processed, in one Delta commit, so re-running a job on a capture is idempotent and leaves
every other capture's rows alone.

Two backends behind one interface:

- ``delta-spark``: Delta Lake's own Spark integration (Databricks, or a JVM with the
  delta-spark jars), ``jobs.lake.delta_spark``: tables at ``<root>/<table>`` or, given a catalog and a
  schema, the Unity Catalog tables ``catalog.schema.<table>``; created with their comments and
  clustered by ``capture_id``; ``replaceWhere`` on the capture ids gives the replacement.
- ``delta-rs``: for a JVM without Delta. Tables are partitioned by ``capture_id``. Spark
  computes and writes plain Parquet into a staging directory inside the table; the files are
  moved into the table's Hive-style
  partition directories and delta-rs commits the add actions (and, through the overwrite's
  partition filter, the removes). Only file metadata passes through the driver. Local
  filesystem only. The few rows the driver makes itself (``write_rows``: the runs table) are
  written by pyarrow in the same layout instead, and read back by delta-rs: no Spark query.

Schemas: rows must have the table's schema, or that schema with columns added at its end (a newer
amqpscope adding a column to a table): the commit then widens the table's schema, and the rows of
earlier writes read the new columns as null, as Delta's schema evolution has it. Anything else
(a column dropped, renamed, retyped or moved) is refused before any file is written.

Concurrency: each write is a single Delta commit, so readers see all of it or none of it, and
each commit names the version it read (optimistic concurrency). With delta-rs, the version read is
the snapshot opened before Spark writes the files; a commit made since then that replaced rows of
the same captures wins, and this write fails naming the table and the other run
(``jobs.lake.delta_commit``: delta-rs alone would keep both runs' rows of a capture new to the table);
commits of other captures, or the table created meanwhile by another run, are harmless and the
commit is tried again on the newer version. delta-spark's ``replaceWhere`` has Delta's own
conflict detection. There is no lock (the runs table's leases keep two live runs off one capture,
``jobs.lake.runs``), and vacuum with a zero retention period may delete a delta-rs write's files
between their move and their commit.

Damage: a commit file of the log that is empty or does not parse is reported naming the table and
the version (``jobs.lake.delta_log``), never read as a commit of nothing. ``written`` keeps, per table and
capture, the rows this Lake's writes committed, for checking the lake against them after a run
(``jobs.lake.commits.check_stored``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyspark.sql.functions as F
from deltalake import DeltaTable, Schema
from deltalake.transaction import AddAction
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.engine.sail import is_sail
from amqpscope.jobs.engine.session import jvm_has_delta, staged_on_driver
from amqpscope.jobs.lake import delta_commit, delta_log, delta_spark
from amqpscope.jobs.lake.delta_spark import TableRef
from amqpscope.jobs.lake.errors import WriteConflict, name_table
from amqpscope.jobs.lake.files import (
    NULL_PARTITION_DIR,
    STAGING_DIR,
    make_staging,
    partition_string,
    spark_unescape,
    stage_arrow,
    stage_rows,
    staged_files,
    staging_is_stale,
)
from amqpscope.jobs.lake.read import add_actions, is_delta_table, open_table, read_table
from amqpscope.jobs.lake.stats import file_stats
from amqpscope.pipelines.columns import union_all
from amqpscope.schemas.catalog import description, documented

BACKENDS = ("auto", "delta-spark", "delta-rs")
CAPTURE_ID = "capture_id"

# Partition values travel as directory names and as strings in the Delta log; for these types
# Spark's directory rendering and Delta's partition value serialization are the same text.
_PARTITION_TYPES = (StringType, BooleanType, ByteType, ShortType, IntegerType, LongType, DateType)
_TABLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")


class Lake:
    """The amqpscope tables under one root, written and read with one of two Delta backends."""

    def __init__(
        self,
        spark: SparkSession | None,
        root: str | Path,
        backend: str = "auto",
        catalog: str | None = None,
        schema: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        if (catalog is None) != (schema is None):
            raise ValueError("catalog and schema go together: give both or neither")
        # No session: delta-rs alone, for the driver-made rows (write_rows, read_rows, version).
        has_delta = spark is not None and jvm_has_delta(spark)
        if backend == "delta-spark" and not has_delta:
            raise ValueError("backend 'delta-spark' needs Delta Lake's jars in the JVM (io.delta.tables)")
        self.spark = spark
        self.backend: str = backend if backend != "auto" else ("delta-spark" if has_delta else "delta-rs")
        if catalog is not None and self.backend != "delta-spark":
            raise ValueError(
                f"Unity Catalog tables ({catalog}.{schema}.<table>) are written by the delta-spark "
                f"backend (a Databricks runtime), not {self.backend}"
            )
        self.catalog, self.schema = catalog, schema
        if self.backend == "delta-rs":
            if "://" in str(root):
                raise ValueError(f"the delta-rs backend writes through the local filesystem; got root {root!s}")
            self.root = os.path.abspath(root)
        else:
            self.root = str(root).rstrip("/")
        self.run_id = run_id  # named in the commits, so that a conflicting run can be told who wrote first
        # table -> capture id -> rows committed by this Lake's writes and not checked yet (delta-rs; from
        # the files' footers).
        self.written: dict[str, dict[str, int]] = {}

    @classmethod
    def of(cls, spark: SparkSession, config: AnalyzeConfig, run_id: str | None = None) -> Lake:
        """The lake ``config`` names: its root, backend and Unity Catalog schema (written by ``run_id``)."""
        return cls(
            spark, config.lake, backend=config.storage, catalog=config.catalog, schema=config.schema, run_id=run_id
        )

    def table_path(self, table: str) -> str:
        """Where `table` lives without Unity Catalog: ``<root>/<table>``."""
        if not _TABLE_NAME.fullmatch(table):
            raise ValueError(f"table names are letters, digits and '_', not starting with '_'; got {table!r}")
        return f"{self.root}/{table}"

    def table_ref(self, table: str) -> TableRef:
        """`table` as the delta-spark backend reaches it: ``catalog.schema.<table>``, or its path."""
        path = self.table_path(table)
        if self.catalog is not None:
            return TableRef(table, name=f"{self.catalog}.{self.schema}.{table}")
        return TableRef(table, path=path)

    def exists(self, table: str) -> bool:
        """True when `table` is a Delta table (it has a commit)."""
        if self.backend == "delta-spark":
            return delta_spark.table_exists(self.spark, self.table_ref(table))
        return is_delta_table(self.table_path(table))

    def version(self, table: str) -> int | None:
        """The version a read-modify-write reads ``table`` at (-1: no table yet), to hand to ``write``
        / ``write_rows`` as ``read_version``. None with delta-spark, whose commits take the version
        their own transaction read."""
        if self.backend == "delta-spark":
            return None
        version = delta_log.check_log(self.table_path(table), table)
        return delta_commit.NO_TABLE if version is None else version

    def write(
        self,
        df: DataFrame,
        table: str,
        *,
        replace_capture_ids: Sequence[str],
        partition_by: Sequence[str] = (CAPTURE_ID,),
        read_version: int | None = None,
        kept: list[pa.Table] | None = None,
    ) -> None:
        """Replace the rows of `replace_capture_ids` in `table` by `df`'s rows, in one commit.

        Every row of `df` must belong to one of `replace_capture_ids`; an empty `df` deletes
        those captures' rows (and creates the table with `df`'s schema if it is new). delta-spark
        clusters a new table by `partition_by` instead of partitioning it. The commit conflicts with
        any made after `read_version` (``version``; default: the version current when the write
        starts) that touched the same captures. Rows staged through the driver (``staged_on_driver``)
        are appended to ``kept`` as committed (``write_and_read``).
        """
        path = self.table_path(table)
        capture_ids = _checked_capture_ids(replace_capture_ids)
        partition_columns = _checked_partition_columns(df.schema, partition_by)
        try:
            if self.backend == "delta-spark":
                ref = self.table_ref(table)
                widens = False
                if self.exists(table):
                    widens = _checked_schema_change(str(ref), delta_spark.read_table(self.spark, ref).schema, df.schema)
                else:
                    _create_delta_spark(
                        self.spark, ref, documented(table, df.schema), description(table), partition_columns
                    )
                _write_delta_spark(df, ref, capture_ids, widens, self.run_id)
            else:
                self._committed(
                    table,
                    capture_ids,
                    _write_delta_rs(
                        self.spark, df, path, capture_ids, partition_columns, self._writer(table, read_version), kept
                    ),
                )
        except Exception as exc:
            name_table(exc, table)
            raise

    def write_and_read(
        self,
        df: DataFrame,
        table: str,
        *,
        replace_capture_ids: Sequence[str],
        capture_ids: Sequence[str],
        partition_by: Sequence[str] = (CAPTURE_ID,),
    ) -> DataFrame:
        """``write``, then the rows of ``capture_ids`` in ``table`` as stored, as ``read`` gives them
        (the columns of ``df``, nullable): those ``write_and_keep`` kept, else read back."""
        kept = self.write_and_keep(
            df, table, replace_capture_ids=replace_capture_ids, capture_ids=capture_ids, partition_by=partition_by
        )
        return kept if kept is not None else self.read(table).filter(lake_capture_filter(capture_ids))

    def write_and_keep(
        self,
        df: DataFrame,
        table: str,
        *,
        replace_capture_ids: Sequence[str],
        capture_ids: Sequence[str],
        partition_by: Sequence[str] = (CAPTURE_ID,),
    ) -> DataFrame | None:
        """``write``; where the rows were staged through the driver (a small run's delta-rs lake) and
        take at most KEPT_UP_TO_BYTES, the rows of ``capture_ids`` as ``read`` would give them, kept:
        a table of a few rows that the tables after it read is not scanned from its Parquet files by
        each of their queries (derive). Otherwise None."""
        kept: list[pa.Table] = []
        self.write(df, table, replace_capture_ids=replace_capture_ids, partition_by=partition_by, kept=kept)
        if not kept or kept[0].nbytes > KEPT_UP_TO_BYTES:
            return None
        # Typed as read gives them: the table's Delta schema (every field nullable), no comments.
        schema = _plain_schema(_delta_schema_json(df.schema))
        return self.spark.createDataFrame(kept[0], schema).filter(lake_capture_filter(capture_ids))

    def write_rows(
        self,
        rows: Sequence[Mapping[str, Any]],
        schema: StructType,
        table: str,
        *,
        replace_capture_ids: Sequence[str],
        partition_by: Sequence[str] = (CAPTURE_ID,),
        read_version: int | None = None,
    ) -> None:
        """``write`` for a few rows made on the driver (the runs table's bookkeeping): with delta-rs
        they go to Parquet through pyarrow, no Spark job; with delta-spark, through Spark."""
        if self.backend == "delta-spark":
            self.write(
                self.spark.createDataFrame(list(rows), schema),
                table,
                replace_capture_ids=replace_capture_ids,
                partition_by=partition_by,
                read_version=read_version,
            )
            return
        capture_ids = _checked_capture_ids(replace_capture_ids)
        partition_columns = _checked_partition_columns(schema, partition_by)
        path = self.table_path(table)
        try:
            self._committed(
                table,
                capture_ids,
                _commit_staged(
                    path,
                    schema,
                    capture_ids,
                    partition_columns,
                    lambda staging: stage_rows(rows, schema, staging, partition_columns),
                    self._writer(table, read_version),
                ),
            )
        except Exception as exc:
            name_table(exc, table)
            raise

    def _writer(self, table: str, read_version: int | None) -> _Writer:
        return _Writer(table, self.run_id, read_version)

    def _committed(self, table: str, capture_ids: Sequence[str], rows: Mapping[str, int]) -> None:
        written = self.written.setdefault(table, {})
        for cid in capture_ids:
            written[cid] = rows.get(cid, 0)

    def take_written(self, capture_ids: Sequence[str], exclude: Sequence[str] = ()) -> dict[str, dict[str, int]]:
        """The rows committed per table (but ``exclude``) for ``capture_ids`` since they were last
        taken: what a check of the lake against the run compares (``jobs.lake.commits.check_stored``)."""
        taken: dict[str, dict[str, int]] = {}
        for table, by_capture in self.written.items():
            if table in exclude:
                continue
            for cid in capture_ids:
                if cid in by_capture:
                    taken.setdefault(table, {})[cid] = by_capture.pop(cid)
        return taken

    def read_rows(
        self, table: str, schema: StructType, capture_ids: Sequence[str] | None = None, version: int | None = None
    ) -> list[dict]:
        """The rows of ``table`` (of ``capture_ids``, or all; at ``version``, or the latest) as dicts
        of ``schema``'s columns (nested structs as dicts too): for small tables only. With delta-rs
        they are read through pyarrow, no Spark job."""
        if capture_ids is not None and not capture_ids:
            return []
        if self.backend == "delta-spark":
            df = self.read(table, schema)
            if capture_ids is not None:
                df = df.filter(lake_capture_filter(capture_ids))
            return [r.asDict(recursive=True) for r in df.collect()]  # nested rows as dicts, as pyarrow gives them
        # On the partition column: only the chosen captures' files are read.
        found = read_table(self.table_path(table), capture_ids, _open(self.table_path(table), table, version))
        names = schema.fieldNames()
        # A column the table does not have yet (written by an older amqpscope) reads as null, as with read().
        return [{name: row.get(name) for name in names} for row in found.to_pylist()]

    def remove_stale_staging(self) -> list[str]:
        """Remove the staging folders of delta-rs writes that were killed before they committed
        (``_staging/<host>-<pid>-<id>`` of a process gone); returns the folders removed. Files of
        a write that moved them into a partition but did not commit stay for ``vacuum``."""
        if self.backend != "delta-rs" or not os.path.isdir(self.root):
            return []
        removed = []
        now = time.time()
        for table in sorted(os.listdir(self.root)):
            staging_root = os.path.join(self.root, table, STAGING_DIR)
            if not os.path.isdir(staging_root):
                continue
            for name in sorted(os.listdir(staging_root)):
                folder = os.path.join(staging_root, name)
                try:
                    modified = os.path.getmtime(folder)
                except OSError:
                    continue  # its writer finished meanwhile
                if staging_is_stale(name, modified, now):
                    shutil.rmtree(folder, ignore_errors=True)
                    removed.append(folder)
            try:
                os.rmdir(staging_root)
            except OSError:
                pass  # still in use
        return removed

    def capture_ids(self, table: str) -> set[str]:
        """The captures that have rows in `table` (from the partition values, not the data)."""
        path = self.table_path(table)
        if self.backend == "delta-spark":
            rows = delta_spark.read_table(self.spark, self.table_ref(table)).select(CAPTURE_ID).distinct().collect()
            return {r[CAPTURE_ID] for r in rows}
        return {v for v in add_actions(path, _open(path, table))[f"partition.{CAPTURE_ID}"] if v is not None}

    def read(self, table: str, schema: StructType | None = None) -> DataFrame:
        """The current snapshot of `table`; with `schema`, exactly its columns in its order."""
        path = self.table_path(table)
        if not self.exists(table):
            raise FileNotFoundError(
                f"no Delta table at {path}" if self.catalog is None else f"no table {self.table_ref(table)}"
            )
        if self.backend == "delta-spark":
            df = delta_spark.read_table(self.spark, self.table_ref(table))
            return df if schema is None else df.select(*schema.fieldNames())
        return _read_delta_rs(self.spark, path, schema)


def lake_capture_filter(capture_ids: Sequence[str]) -> Column:
    """Rows of the given captures (tables are partitioned by capture_id, so this prunes files)."""
    return F.col(CAPTURE_ID).isin(*capture_ids) if capture_ids else F.lit(False)


def _checked_capture_ids(capture_ids: Sequence[str]) -> list[str]:
    if isinstance(capture_ids, str):  # a lone string is a sequence of one-letter capture ids
        raise TypeError("replace_capture_ids must be a sequence of capture ids, not a string")
    ids = sorted(set(capture_ids))
    if not ids or not all(isinstance(i, str) and i for i in ids):
        raise ValueError(
            f"replace_capture_ids must name at least one capture, each a non-empty string; got {capture_ids!r}"
        )
    return ids


def _checked_partition_columns(schema: StructType, partition_by: Sequence[str]) -> list[str]:
    columns = list(partition_by)
    if CAPTURE_ID not in columns:
        raise ValueError(
            f"tables are replaced capture by capture, so partition_by must include {CAPTURE_ID!r}; got {columns}"
        )
    fields = {f.name: f for f in schema.fields}
    for name in columns:
        if name not in fields:
            raise ValueError(f"partition column {name!r} is not a column of the DataFrame")
        if not isinstance(fields[name].dataType, _PARTITION_TYPES):
            raise ValueError(
                f"partition column {name!r} has type {fields[name].dataType.simpleString()}; "
                "supported: string, boolean, integral, date"
            )
    return columns


def _checked_schema_change(path: str, table: StructType, rows: StructType) -> bool:
    """Whether rows of schema ``rows`` widen table ``path`` of schema ``table`` (columns added at
    its end); False when the schemas are the same. Any other difference is a ValueError.

    Compared as Delta stores them (every field nullable), field by field.
    """
    # Column comments (metadata) may change freely: only names, types and order count.
    table_fields = _plain_fields(_delta_schema_json(table))
    rows_fields = _plain_fields(_delta_schema_json(rows))
    if rows_fields[: len(table_fields)] == table_fields:
        return len(rows_fields) > len(table_fields)
    by_name = {f["name"]: f for f in rows_fields}
    problems = []
    for field in table_fields:
        found = by_name.get(field["name"])
        if found is None:
            problems.append(f"column {field['name']!r} is missing")
        elif found["type"] != field["type"]:
            problems.append(
                f"column {field['name']!r} has type {json.dumps(found['type'])}, not {json.dumps(field['type'])}"
            )
    if not problems:  # every column there with its type: some are out of place
        problems = [
            f"column {field['name']!r} is not in place {position}"
            for position, (field, found) in enumerate(zip(table_fields, rows_fields), 1)
            if found["name"] != field["name"]
        ]
    raise ValueError(
        f"schema of the rows does not fit table {path} (new columns may only be added at "
        f"its end): {'; '.join(problems)}"
    )


def _write_delta_spark(
    df: DataFrame, ref: TableRef, capture_ids: list[str], merge_schema: bool, run_id: str | None
) -> None:
    """``delta_spark.write_rows``, naming the run in the commit (``userMetadata``), with Delta's
    concurrent-modification errors as one line naming the table and the run that won."""
    try:
        delta_spark.write_rows(
            df,
            ref,
            capture_ids,
            merge_schema=merge_schema,
            user_metadata=f"{delta_log.RUN_KEY}={run_id}" if run_id else None,
        )
    except Exception as exc:
        conflict = _delta_spark_conflict(exc, ref.table, capture_ids)
        if conflict is None:
            raise
        raise conflict from exc


def _delta_spark_conflict(exc: Exception, table: str, capture_ids: list[str]) -> WriteConflict | None:
    """Delta's commit conflicts (``delta_spark.commit_conflict``) as one WriteConflict line naming
    the table and, when Delta's message shows its ``userMetadata``, the run that won."""
    conflict = delta_spark.commit_conflict(exc)
    if conflict is None:
        return None
    run = conflict.user_metadata(delta_log.RUN_KEY)
    other = f"run {run}" if run else f"another writer ({conflict.kind})"
    return WriteConflict(table, capture_ids, None, conflict.version, other)


def _create_delta_spark(
    spark: SparkSession, ref: TableRef, schema: StructType, table_description: str | None, cluster_by: list[str]
) -> None:
    """``CREATE TABLE IF NOT EXISTS``; when another run creates the table at the same moment, Delta
    refuses one of the two creations (ProtocolChangedException: two writers of an empty directory),
    and the refused run writes into the table the other created."""
    try:
        delta_spark.create_table(spark, ref, schema, table_description, cluster_by)
    except Exception as exc:
        if delta_spark.commit_conflict(exc) is None or not delta_spark.table_exists(spark, ref):
            raise


# --- delta-rs backend: Spark writes Parquet, delta-rs commits the log ----------------------------


def _delta_schema_json(schema: StructType) -> str:
    """`schema` as a Delta schema string, every field nullable.

    Delta's schema serialization is Spark's StructType JSON, so the conversion is lossless
    (timestamps stay microsecond UTC, maps, binaries and nested structs as they are). Like
    delta-spark, the table's columns are nullable: Spark writes every Parquet column optional.
    """

    def nullable(node: Any) -> Any:
        if isinstance(node, list):
            return [nullable(item) for item in node]
        if not isinstance(node, dict):
            return node
        return {
            key: True
            if key in ("nullable", "containsNull", "valueContainsNull")
            else value
            if key == "metadata"
            else nullable(value)
            for key, value in node.items()
        }

    return json.dumps(nullable(schema.jsonValue()))


@dataclass(frozen=True)
class _Writer:
    """Who commits a write and the version it read (None: the version current when it starts)."""

    table: str
    run_id: str | None
    read_version: int | None


# A table's rows kept in the driver's memory by write_and_read, at most (the largest of the 29 tables
# an analyze of the bundled sample writes takes 1.0 MiB as Arrow, all 29 together 2.8 MiB): 29 tables
# at the bound would take 116 MiB of the driver's default 1 GiB heap until derive ends. Larger tables
# are scanned from their files.
KEPT_UP_TO_BYTES = 4 << 20


def _plain_fields(schema_json: str) -> list[dict[str, Any]]:
    """The fields of a schema's JSON without their column comments (metadata)."""
    return [{k: v for k, v in f.items() if k != "metadata"} for f in json.loads(schema_json)["fields"]]


def _plain_schema(schema_json: str) -> StructType:
    """A schema's JSON as rows read back are typed: no column comments (they are for the lake's other
    readers)."""
    return StructType.fromJson(
        {"type": "struct", "fields": [{**f, "metadata": {}} for f in _plain_fields(schema_json)]}
    )


def _kept(rows: pa.Table, kept: list[pa.Table] | None) -> pa.Table:
    if kept is not None:
        kept.append(rows)
    return rows


def _open(path: str, table: str, version: int | None = None) -> DeltaTable:
    """The table at ``version`` (default latest) through delta-rs, its log checked for damage first."""
    delta_log.check_log(path, table)
    return open_table(path, version)


def _write_delta_rs(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    capture_ids: list[str],
    partition_columns: list[str],
    writer: _Writer,
    kept: list[pa.Table] | None = None,
) -> dict[str, int]:
    # delta-rs and every non-Spark Parquet reader need TIMESTAMP_MICROS (INT96 is legacy).
    timestamp_type = spark.conf.get("spark.sql.parquet.outputTimestampType")
    if timestamp_type != "TIMESTAMP_MICROS":
        raise ValueError(
            "spark.sql.parquet.outputTimestampType must be TIMESTAMP_MICROS, "
            f"not {timestamp_type} (jobs/engine/session.py sets it)"
        )
    return _commit_staged(
        path,
        df.schema,
        capture_ids,
        partition_columns,
        (
            (lambda staging: stage_arrow(_kept(df.toArrow(), kept), df.schema, staging, partition_columns))
            if staged_on_driver(spark)
            # "error": the one name of errorifexists that Spark Connect takes too
            else (lambda staging: df.write.mode("error").partitionBy(*partition_columns).parquet(staging))
        ),
        writer,
    )


def _read_snapshot(path: str, table: str, read_version: int | None) -> tuple[int, DeltaTable | None]:
    """The version a write reads (given, or the latest) and the table at it (None: no table)."""
    if read_version is None:
        latest = delta_log.check_log(path, table)
        read_version = delta_commit.NO_TABLE if latest is None else latest
    if read_version == delta_commit.NO_TABLE:
        return read_version, None
    return read_version, _open(path, table, read_version)


def _fits(path: str, rows_schema: StructType, partition_columns: list[str]) -> Callable[[DeltaTable], None]:
    """The check that rows of ``rows_schema`` may be committed on a snapshot of table ``path``."""

    def check(table: DeltaTable) -> None:
        # The commit replaces the table's schema with the rows' one: only a widening keeps the other
        # captures' files readable (their missing columns read as null).
        _checked_schema_change(path, StructType.fromJson(json.loads(table.schema().to_json())), rows_schema)
        if table.metadata().partition_columns != partition_columns:
            raise ValueError(
                f"table {path} is partitioned by {table.metadata().partition_columns}, not {partition_columns}"
            )

    return check


def _commit_staged(
    path: str,
    rows_schema: StructType,
    capture_ids: list[str],
    partition_columns: list[str],
    stage: Callable[[str], None],
    writer: _Writer,
) -> dict[str, int]:
    """``stage(staging)`` writes the rows' Parquet files into the staging folder in Spark's
    partition layout; they are moved into the table and committed, replacing ``capture_ids``, on
    the version read before staging (``jobs.lake.delta_commit``). Returns the rows committed per capture."""
    name = os.path.basename(path)
    # The columns' comments of schemas/ go into the Delta schema: readers see what each column means.
    schema = Schema.from_json(_delta_schema_json(documented(name, rows_schema)))
    fits = _fits(path, rows_schema, partition_columns)
    read_version, table = _read_snapshot(path, name, writer.read_version)
    if table is not None:
        fits(table)

    folder = make_staging(path)
    # The rows go into a folder of their own inside it: a Spark write makes its target itself.
    staging = os.path.join(folder, "rows")
    moved: list[str] = []
    try:
        stage(staging)
        staged = [f for f in staged_files(staging, partition_columns) if f.num_records > 0]
        strays = sorted({f.partition_values[CAPTURE_ID] or "" for f in staged} - set(capture_ids))
        if strays:
            raise ValueError(f"rows of captures {strays} are not in replace_capture_ids {capture_ids}")
        adds = []
        rows: dict[str, int] = {}
        for f in staged:
            # Into the table's own partition directories: the layout every Delta reader expects
            # and that vacuum cleans (it skips "_" directories such as the staging one).
            relative_path = f"{f.relative_dir}/{f.name}"
            target = os.path.join(path, relative_path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.exists(target):  # Spark's file names carry the write job's UUID
                raise FileExistsError(target)
            os.rename(os.path.join(staging, relative_path), target)
            moved.append(target)
            adds.append(
                AddAction(
                    path=relative_path,  # the file's own name: delta-rs URI-encodes it for the log
                    size=f.size,
                    partition_values=f.partition_values,
                    modification_time=int(os.path.getmtime(target) * 1000),
                    data_change=True,
                    # Row count, min, max and null counts from the footer: readers skip files on them.
                    stats=file_stats(target, rows_schema, partition_columns),
                )
            )
            capture = f.partition_values[CAPTURE_ID] or ""
            rows[capture] = rows.get(capture, 0) + f.num_records
        delta_commit.commit(
            delta_commit.Commit(
                path, name, schema, adds, capture_ids, partition_columns, read_version, writer.run_id, description(name)
            ),
            table,
            fits,
        )
    except Exception:
        for target in moved:  # referenced by no commit (delta_commit returns if it went through)
            os.remove(target)
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(folder))
        except OSError:
            pass  # another write is staging too
    return rows


def _hive_layout_matches(
    relative_paths: list[str], partitions: list[Mapping[str, Any]], partition_columns: list[str]
) -> bool:
    """True when Spark's partition discovery on these paths yields the log's partition values."""
    for relative_path, values in zip(relative_paths, partitions):
        if relative_path.startswith("/") or "://" in relative_path:
            return False
        segments = relative_path.split("/")[:-1]
        if len(segments) != len(partition_columns):
            return False
        for segment, column in zip(segments, partition_columns):
            name, eq, escaped = segment.partition("=")
            found = None if escaped == NULL_PARTITION_DIR else spark_unescape(escaped)
            if name != column or not eq or found != partition_string(values[column]):
                return False
    return True


def _read_delta_rs(spark: SparkSession, path: str, schema: StructType | None) -> DataFrame:
    table = _open(path, os.path.basename(path))
    table_schema = _plain_schema(table.schema().to_json())
    schema = table_schema if schema is None else schema
    partition_columns = table.metadata().partition_columns
    actions = add_actions(path, table)
    if not actions["path"]:
        return spark.createDataFrame([], schema)
    relative_paths = [unquote(p) for p in actions["path"]]
    files = [os.path.join(path, p) for p in relative_paths]
    partitions = [{c: actions[f"partition.{c}"][i] for c in partition_columns} for i in range(len(files))]
    # Partition columns are in the log, not in the files.
    read_schema = StructType(
        [f for f in schema.fields if f.name not in partition_columns]
        + [f for f in table_schema.fields if f.name in partition_columns]
    )
    # Sail's partition discovery of a list of files does not take the values from their folders,
    # and its own Delta reader gives the columns' comments as field metadata, which its unions then
    # refuse beside columns without ("Physical input schema should be the same as the one converted
    # from logical input schema"): on Sail, one scan a capture, typed by the plain schema.
    if _hive_layout_matches(relative_paths, partitions, partition_columns) and not is_sail(spark):
        # One scan; Spark's partition discovery from the directories gives the same values
        # as the log, typed by the schema.
        df = spark.read.schema(read_schema).option("basePath", path).parquet(*files)
    else:
        df = _read_by_partition(spark, read_schema, files, partitions, partition_columns)
    return df.select(*schema.fieldNames())


def _read_by_partition(
    spark: SparkSession,
    read_schema: StructType,
    files: list[str],
    partitions: list[Mapping[str, Any]],
    partition_columns: list[str],
) -> DataFrame:
    """One scan per partition, its values from the log: for layouts Spark can't discover."""
    data_schema = StructType([f for f in read_schema.fields if f.name not in partition_columns])
    groups: dict[tuple[Any, ...], list[str]] = {}
    for file, values in zip(files, partitions):
        groups.setdefault(tuple(values[c] for c in partition_columns), []).append(file)
    types = {f.name: f.dataType for f in read_schema.fields}
    scans = [
        spark.read.schema(data_schema)
        .parquet(*group_files)
        .select("*", *[F.lit(value).cast(types[c]).alias(c) for c, value in zip(partition_columns, key)])
        for key, group_files in groups.items()
    ]
    return union_all(scans)
