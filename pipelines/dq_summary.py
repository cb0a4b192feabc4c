"""The ``dq_summary`` gold table (schemas/quality.py): one row per capture for this run.

A pure join of per-capture aggregates: the byte accounting (``pipelines.accounting``), gaps from the
quarantine, violations by severity, the diagnosis headline and the suites that found unexpected rows
in the capture. A suite's unexpected rows are exactly its rules' rows in the violations table
(``expectations.suite``), so a capture's failed suites are the suites of the rules it broke.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from itertools import chain

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.accounting import byte_accounting
from amqpscope.pipelines.shape import in_schema
from amqpscope.schemas.quality import DQ_SUMMARY_SCHEMA

_SEVERITIES = ("error", "warning", "capture")


def _lookup(mapping: Mapping[str, str], key: Column) -> Column:
    if not mapping:
        return F.lit(None).cast("string")
    return F.create_map(*[F.lit(v) for v in chain.from_iterable(sorted(mapping.items()))])[key]


def dq_summary(
    *,
    captures: DataFrame,
    connections: DataFrame,
    frames: DataFrame,
    quarantine: DataFrame,
    violations: DataFrame,
    diagnosis: DataFrame | None,
    suite_of_rule: Mapping[str, str],
    suites_run: Sequence[str],
    run_id: str,
    run_ts: datetime,
    accounting: DataFrame | None = None,
) -> DataFrame:
    """DQ_SUMMARY_SCHEMA rows, one per row of ``captures``.

    ``accounting`` is the captures' ``byte_accounting`` when the caller has it already (derive
    checks it before deriving anything); it is computed from the bronze tables when not given.

    ``suite_of_rule`` names each rule's suite; ``suites_run`` are the suites this run evaluated.
    ``diagnosis`` (DIAGNOSIS_SCHEMA) may be None when no diagnosis was made: bottleneck stays null.
    """
    kinds = connections.groupBy("capture_id").agg(
        F.count(F.when(F.col("protocol").isin("amqp-0-9-1", "amqp-1.0"), 1)).alias("amqp_connections"),
        F.count(F.when(F.col("protocol") == "tls", 1)).alias("tls_connections"),
        F.count(F.when(~F.col("protocol").isin("amqp-0-9-1", "amqp-1.0", "tls") | F.col("protocol").isNull(), 1)).alias(
            "other_connections"
        ),
    )
    frame_counts = frames.groupBy("capture_id").agg(F.count(F.lit(1)).alias("frames"))
    if accounting is None:
        accounting = byte_accounting(connections, frames, quarantine)
    by_capture = accounting.groupBy("capture_id").agg(
        F.sum("payload_bytes").alias("payload_bytes"),
        F.sum("framed_bytes").alias("framed_bytes"),
        F.sum("quarantined_bytes").alias("quarantined_bytes"),
        F.sum("missing_bytes").alias("missing_bytes"),
        F.bool_and("balanced").alias("bytes_accounted"),
    )
    gaps = quarantine.filter(F.col("missing")).groupBy("capture_id").agg(F.count(F.lit(1)).alias("gaps"))
    broken = violations.groupBy("capture_id").agg(
        *[F.count(F.when(F.col("severity") == s, 1)).alias(f"violations_{s}") for s in _SEVERITIES],
        F.array_sort(F.collect_set(_lookup(suite_of_rule, F.col("rule_id")))).alias("_failed"),
    )
    joined = (
        captures.select("capture_id", "file_name", "packets")
        .join(kinds, "capture_id", "left")
        .join(frame_counts, "capture_id", "left")
        .join(by_capture, "capture_id", "left")
        .join(gaps, "capture_id", "left")
        .join(broken, "capture_id", "left")
    )
    if diagnosis is not None:
        joined = joined.join(
            diagnosis.select(
                "capture_id",
                "bottleneck",
                F.col("entity").alias("bottleneck_entity"),
                F.col("findings_count").alias("findings"),
            ),
            "capture_id",
            "left",
        )
    counts = [
        "amqp_connections",
        "tls_connections",
        "other_connections",
        "frames",
        "payload_bytes",
        "framed_bytes",
        "quarantined_bytes",
        "missing_bytes",
        "gaps",
        *[f"violations_{s}" for s in _SEVERITIES],
    ]
    failed = F.coalesce(F.col("_failed"), F.array().cast("array<string>"))
    values = {
        **{c: F.coalesce(F.col(c), F.lit(0)) for c in counts},
        "run_id": F.lit(run_id),
        "run_ts": F.lit(run_ts),
        # No connection, nothing to account for: the identity holds trivially.
        "bytes_accounted": F.coalesce(F.col("bytes_accounted"), F.lit(True)),
        "suites_run": F.lit(len(suites_run)),
        "suites_failed": failed,
        "suites_passed": F.size(failed) == 0,
    }
    return in_schema(joined, DQ_SUMMARY_SCHEMA, **values)
