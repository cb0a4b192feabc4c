"""``amqpscope maintain``: the lake's tables compacted, their unused files removed, their comments current.

Every write replaces some captures' rows, so a table collects small files and, in its history,
files no version needs any more. The maintain stage (a task of the Databricks job, after report)
goes over every table of ``schemas/`` that the lake has:

- delta-spark: ``OPTIMIZE`` (a clustered table's rows are clustered by ``capture_id`` into few large
  files), ``VACUUM ... RETAIN n HOURS``, and the column comments and description of ``schemas/``
  set where the table's differ (a table created before a comment was written);
- delta-rs: its compaction (``optimize.compact``: the small files of each capture's partition
  rewritten as one) and ``vacuum``. Its tables get their comments at every write.

The rows do not change. The retention (default 168 hours, Delta's own minimum) is what keeps
readers of an older version, and runs still writing, safe: a file is removed only when no version
of the last ``retain_hours`` hours references it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.lake import delta_spark
from amqpscope.jobs.lake.lake import Lake
from amqpscope.schemas.catalog import description, documented, tables

log = logging.getLogger("amqpscope.maintain")

DEFAULT_RETAIN_HOURS = 168


@dataclass(frozen=True)
class TableMaintenance:
    table: str
    files_before: int  # data files of the current version, before and after compaction
    files_after: int
    files_vacuumed: int | None  # None: the engine does not say (delta-spark)
    comments_set: int  # statements that brought comments and description up to schemas/


@dataclass(frozen=True)
class MaintainResult:
    tables: tuple[TableMaintenance, ...]


def maintain_lake(
    spark: SparkSession, config: AnalyzeConfig, retain_hours: int = DEFAULT_RETAIN_HOURS
) -> MaintainResult:
    """Compact, vacuum and document every table of the lake ``config`` names."""
    if retain_hours < 0:
        raise ValueError(f"retain_hours must not be negative, got {retain_hours}")
    lake = Lake.of(spark, config)
    done = []
    for table in tables():
        if not lake.exists(table):
            continue
        step = _delta_spark if lake.backend == "delta-spark" else _delta_rs
        done.append(step(lake, table, retain_hours))
        log.info("%s: %d file(s) -> %d", table, done[-1].files_before, done[-1].files_after)
    return MaintainResult(tuple(done))


def _delta_rs(lake: Lake, table: str, retain_hours: int) -> TableMaintenance:
    path = lake.table_path(table)
    before = len(DeltaTable(path).file_uris())
    DeltaTable(path).optimize.compact()
    after = len(DeltaTable(path).file_uris())
    removed = DeltaTable(path).vacuum(retention_hours=retain_hours, dry_run=False)
    return TableMaintenance(table, before, after, len(removed), 0)


def _delta_spark(lake: Lake, table: str, retain_hours: int) -> TableMaintenance:
    spark, ref = lake.spark, lake.table_ref(table)
    before = delta_spark.file_count(spark, ref)
    spark.sql(delta_spark.optimize_sql(ref))
    after = delta_spark.file_count(spark, ref)
    spark.sql(delta_spark.vacuum_sql(ref, retain_hours))
    current = delta_spark.read_table(spark, ref).schema
    statements = delta_spark.comment_sql(
        ref, current, documented(table, current), delta_spark.table_description(spark, ref), description(table)
    )
    for statement in statements:
        spark.sql(statement)
    return TableMaintenance(table, before, after, None, len(statements))
