"""diagnosis: one row per capture, the headline an operator reads first and the ranked findings.

The headline is the top-ranked finding of ``bottlenecks`` (``pipelines.bottlenecks``), or "none"
for a capture in which nothing held traffic back for long enough to matter.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.schemas.diagnosis import DIAGNOSIS_SCHEMA, FINDING_SUMMARY

_NO_BOTTLENECK = ("No bottleneck: no connection, channel, consumer or link was held back long enough to matter "
                  "(no resource alarm, no throttled publisher, no prefetch- or credit-bound consumer, no client "
                  "that stopped reading, no retransmission).")


def _when_text() -> Column:
    """"at 20:59:45.388 (packet 52) for 1.305 s" of the top finding."""
    return F.concat(
        F.lit("from "), F.date_format(F.col("start_ts"), "HH:mm:ss.SSS"), F.lit(" UTC (packet "),
        F.col("start_packet_number").cast("string"), F.lit(") for "),
        F.format_number(F.col("duration_us") / F.lit(1e6), 3), F.lit(" s"))


def _headline() -> Column:
    return F.concat(
        F.lit("Bottleneck: "), F.regexp_replace(F.col("component"), "_", " "), F.lit(" ("),
        F.regexp_replace(F.col("effect"), "_", " "), F.lit(") on "), F.col("entity_kind"), F.lit(" "),
        F.col("entity"), F.lit(", "), _when_text(), F.lit(". "), F.col("explanation"))


def diagnosis(bottlenecks: DataFrame, captures: DataFrame) -> DataFrame:
    """The diagnosis table (``schemas.diagnosis.DIAGNOSIS_SCHEMA``): every capture of ``captures``,
    with its top finding as the headline ("none" when it has no finding)."""
    summary = F.struct(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in FINDING_SUMMARY.fields])
    ranked = bottlenecks.groupBy("capture_id").agg(
        F.array_sort(F.collect_list(summary)).alias("findings"))  # rank is the struct's first field
    top = bottlenecks.filter(F.col("rank") == 1).select(
        "capture_id", F.col("component").alias("bottleneck"), "effect", "entity_kind", "entity", "connection_id",
        "start_packet_number", _headline().alias("headline"))
    every = captures.select("capture_id").distinct()
    joined = every.join(top, "capture_id", "left").join(ranked, "capture_id", "left")
    empty = F.array().cast(DIAGNOSIS_SCHEMA["findings"].dataType)
    return joined.select(
        "capture_id",
        F.coalesce(F.col("bottleneck"), F.lit("none")).alias("bottleneck"),
        "effect", "entity_kind", "entity", "connection_id", "start_packet_number",
        F.coalesce(F.col("headline"), F.lit(_NO_BOTTLENECK)).alias("headline"),
        F.when(F.col("findings").isNull(), F.lit(0)).otherwise(F.size("findings")).alias("findings_count"),
        F.coalesce(F.col("findings"), empty).alias("findings"),
    ).select(*[F.col(f.name).cast(f.dataType) for f in DIAGNOSIS_SCHEMA.fields])
