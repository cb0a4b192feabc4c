"""The lake's delta-spark backend: Delta Lake's own Spark integration (a Databricks runtime, or a
JVM with the delta-spark jars), for tables by path or registered in Unity Catalog.

A table is named ``catalog.schema.<table>`` when the lake is given a Unity Catalog schema (a
managed table: Unity Catalog keeps its files, and does not allow tables inside a volume), else it
is the Delta table at ``<root>/<table>``. What this module sends to Spark is SQL text and writer
options, each built by a function of its own, so that what reaches Delta can be checked without
Delta's jars (tests/test_delta_spark.py parses the statements with Spark's own SQL parser):

- a new table is created first, by ``CREATE TABLE IF NOT EXISTS``, with each column's comment and
  the table's description from ``schemas/`` (``schemas.catalog``), clustered by ``capture_id``
  (liquid clustering): OPTIMIZE then keeps each capture's rows together in a few large files,
  where partitioning by capture left one directory of small files per capture and table. A table
  an older amqpscope created partitioned by ``capture_id`` stays so (Delta keeps a table's
  partitioning when a write names none);
- rows are written with ``replaceWhere`` on the capture ids: one commit replaces those captures'
  rows (Delta checks that every row written matches the predicate);
- maintenance (``amqpscope maintain``): OPTIMIZE, VACUUM, and the comments and description of a
  table brought up to those of ``schemas/`` (a table created before a comment was written).

Overlapping runs rely on Delta's own optimistic concurrency: each commit carries the run that made it
(``userMetadata``), and the conflicts Delta raises (``commit_conflict``) become the lake's one-line
``WriteConflict`` naming the run that won (``jobs.lake.lake``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

CAPTURE_ID = "capture_id"
# Delta's commit conflicts (io.delta.exceptions, all DeltaConcurrentModificationException): another
# transaction committed, since this one read the table, what this one's commit contradicts. delta-spark's
# Python package raises them as classes of the same names (delta.exceptions); without it PySpark
# raises the Py4JJavaError that holds the Java exception.
DELTA_CONFLICTS = frozenset(
    {
        "DeltaConcurrentModificationException",
        "ConcurrentWriteException",
        "MetadataChangedException",
        "ProtocolChangedException",
        "ConcurrentAppendException",
        "ConcurrentDeleteReadException",
        "ConcurrentDeleteDeleteException",
        "ConcurrentTransactionException",
    }
)
# Delta's message of a conflict ends "Conflicting commit: {...}", the winning commit's commitInfo as JSON.
_CONFLICTING_VERSION = re.compile(r'"version"\s*:\s*(\d+)')


@dataclass(frozen=True)
class TableRef:
    """A table of the lake as delta-spark reaches it: its Unity Catalog name, or its path."""

    table: str
    name: str | None = None  # catalog.schema.table
    path: str | None = None

    def __post_init__(self) -> None:
        if (self.name is None) == (self.path is None):
            raise ValueError(f"table {self.table!r} needs a name or a path, not both or neither")

    @property
    def sql(self) -> str:
        """The table in a SQL statement: `catalog`.`schema`.`table`, or delta.`path`."""
        if self.name is not None:
            return ".".join(quoted(part) for part in self.name.split("."))
        return f"delta.{quoted(str(self.path))}"

    def __str__(self) -> str:
        return str(self.name if self.name is not None else self.path)


def quoted(identifier: str) -> str:
    """An identifier (or a path) quoted for Spark SQL."""
    return "`" + identifier.replace("`", "``") + "`"


def sql_string(value: str) -> str:
    """A Spark SQL string literal (backslash is an escape character there by default)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def create_table_sql(
    ref: TableRef, schema: StructType, description: str | None, cluster_by: Sequence[str] = (CAPTURE_ID,)
) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for ``ref`` with ``schema``'s columns (their ``comment``
    metadata as column comments), clustered by ``cluster_by``, described by ``description``.

    Every column is nullable, as the delta-rs writer's tables are: Spark writes every Parquet
    column optional."""
    columns = []
    for field in schema.fields:
        comment = (field.metadata or {}).get("comment")
        columns.append(
            f"{quoted(field.name)} {field.dataType.simpleString()}"
            + (f" COMMENT {sql_string(comment)}" if comment else "")
        )
    clauses = [f"CREATE TABLE IF NOT EXISTS {ref.sql} (", "  " + ",\n  ".join(columns), ")", "USING DELTA"]
    if cluster_by:
        clauses.append(f"CLUSTER BY ({', '.join(quoted(c) for c in cluster_by)})")
    if description:
        clauses.append(f"COMMENT {sql_string(description)}")
    return "\n".join(clauses)


def replace_where(capture_ids: Sequence[str]) -> str:
    """The predicate of the rows a write replaces: those of ``capture_ids``."""
    return f"{quoted(CAPTURE_ID)} IN ({', '.join(sql_string(i) for i in capture_ids)})"


def write_options(capture_ids: Sequence[str], merge_schema: bool, user_metadata: str | None = None) -> dict[str, str]:
    """The Delta writer's options of a write replacing ``capture_ids``' rows; ``merge_schema``
    when the rows add columns at the table's end (checked by the caller); ``user_metadata`` for the
    commit's commitInfo (the run that wrote it: a run its write conflicts with can name it)."""
    options = {"replaceWhere": replace_where(capture_ids)}
    if merge_schema:
        options["mergeSchema"] = "true"
    if user_metadata:
        options["userMetadata"] = user_metadata
    return options


def table_exists(spark: SparkSession, ref: TableRef) -> bool:
    if ref.name is not None:
        return bool(spark.catalog.tableExists(ref.name))
    from delta.tables import DeltaTable  # the delta-spark pip package

    return bool(DeltaTable.isDeltaTable(spark, str(ref.path)))


def read_table(spark: SparkSession, ref: TableRef) -> DataFrame:
    if ref.name is not None:
        return spark.read.table(ref.name)
    return spark.read.format("delta").load(str(ref.path))


def create_table(
    spark: SparkSession,
    ref: TableRef,
    schema: StructType,
    description: str | None,
    cluster_by: Sequence[str] = (CAPTURE_ID,),
) -> None:
    """Create ``ref`` (unless another writer did meanwhile) with ``schema``'s columns and comments."""
    spark.sql(create_table_sql(ref, schema, description, cluster_by))


def write_rows(
    df: DataFrame, ref: TableRef, capture_ids: Sequence[str], merge_schema: bool, user_metadata: str | None = None
) -> None:
    """Replace the rows of ``capture_ids`` in ``ref`` (an existing table) by ``df``'s, in one commit."""
    writer = (
        df.write.format("delta").mode("overwrite").options(**write_options(capture_ids, merge_schema, user_metadata))
    )
    if ref.name is not None:
        writer.saveAsTable(ref.name)
    else:
        writer.save(str(ref.path))


@dataclass(frozen=True)
class Conflict:
    """A commit Delta refused because another transaction committed first."""

    kind: str  # the exception's class name: ConcurrentAppendException, ...
    message: str  # Delta's, with the winning commit's commitInfo
    version: int | None  # the winning commit's version, when the message shows it

    def user_metadata(self, key: str) -> str | None:
        """The value the winning commit's ``userMetadata`` gave ``key`` (``key=value``), if shown."""
        found = re.search(re.escape(key) + r"=([\w.-]+)", self.message)
        return found.group(1) if found else None


def commit_conflict(exc: BaseException) -> Conflict | None:
    """``exc`` as one of Delta's commit conflicts (``DELTA_CONFLICTS``), as PySpark raises them, else None."""
    for cls in type(exc).__mro__:
        if cls.__name__ in DELTA_CONFLICTS and cls.__module__.split(".")[0] == "delta":
            return _conflict(cls.__name__, str(exc))
    java = getattr(exc, "java_exception", None)  # py4j's Py4JJavaError
    if java is None:
        return None
    try:
        name, message = str(java.getClass().getName()), str(java.getMessage() or "")
    except Exception:  # the JVM may be gone: not something to tell apart
        return None
    package, _, kind = name.rpartition(".")
    return _conflict(kind, message) if package == "io.delta.exceptions" and kind in DELTA_CONFLICTS else None


def _conflict(kind: str, message: str) -> Conflict:
    version = _CONFLICTING_VERSION.search(message)
    return Conflict(kind, message, int(version.group(1)) if version else None)


def optimize_sql(ref: TableRef) -> str:
    """Compact the table's small files (and, on a clustered table, cluster its rows by capture)."""
    return f"OPTIMIZE {ref.sql}"


def vacuum_sql(ref: TableRef, retain_hours: int) -> str:
    """Delete the files no version of the last ``retain_hours`` hours references."""
    if retain_hours < 0:
        raise ValueError(f"retain_hours must not be negative, got {retain_hours}")
    return f"VACUUM {ref.sql} RETAIN {int(retain_hours)} HOURS"


def comment_sql(
    ref: TableRef, current: StructType, documented: StructType, current_description: str | None, description: str | None
) -> list[str]:
    """The statements that give ``ref`` (whose columns are ``current``) the column comments of
    ``documented`` and ``description``, for those that differ; none when all are as documented."""
    statements = []
    have = {f.name: (f.metadata or {}).get("comment") for f in current.fields}
    for field in documented.fields:
        wanted = (field.metadata or {}).get("comment")
        if wanted and field.name in have and have[field.name] != wanted:
            statements.append(f"ALTER TABLE {ref.sql} ALTER COLUMN {quoted(field.name)} COMMENT {sql_string(wanted)}")
    if description and description != current_description:
        statements.append(f"COMMENT ON TABLE {ref.sql} IS {sql_string(description)}")
    return statements


def table_description(spark: SparkSession, ref: TableRef) -> str | None:
    """The table's description, as Delta keeps it (DESCRIBE DETAIL)."""
    return spark.sql(f"DESCRIBE DETAIL {ref.sql}").select("description").first()[0]


def file_count(spark: SparkSession, ref: TableRef) -> int:
    """Data files of the table's current version (DESCRIBE DETAIL)."""
    return int(spark.sql(f"DESCRIBE DETAIL {ref.sql}").select("numFiles").first()[0])
