"""diagnosis: one row per capture, the headline an operator reads first and the ranked findings.

The headline is the top-ranked finding of ``bottlenecks`` (``pipelines.bottlenecks``), or "none"
for a capture in which nothing held traffic back for long enough to matter. A capture whose TLS
connections were not decrypted says so in its headline, and is ``encrypted`` when nothing else could
be judged: no AMQP decoded, no finding (its TCP-level findings still count: the
``diagnosis.encrypted.*`` rules of expectations/bottlenecks.yml).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.schemas.diagnosis import DIAGNOSIS_SCHEMA, FINDING_SUMMARY

_NO_BOTTLENECK = ("No bottleneck: no connection, channel, consumer or link was held back long enough to matter "
                  "(no resource alarm, no throttled publisher, no prefetch- or credit-bound consumer, no client "
                  "that stopped reading or waited on its own round trips, no lost segment).")


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
        F.col("entity"), F.coalesce(F.concat(F.lit(" (queue "), F.col("queue"), F.lit(")")), F.lit("")),
        F.lit(", "), _when_text(), F.lit(". "), F.col("explanation"))


def _encrypted(connections: DataFrame) -> DataFrame:
    """Per capture: TLS connections not decrypted, their TLS versions, and the AMQP connections decoded."""
    versions = F.array_sort(F.collect_set(F.when(F.col("protocol") == "tls", F.col("tls_version"))))
    return connections.groupBy("capture_id").agg(
        F.count(F.when(F.col("protocol") == "tls", 1)).cast("int").alias("encrypted_connections"),
        F.count(F.when(F.col("protocol").isin("amqp-0-9-1", "amqp-1.0"), 1)).alias("_amqp"),
        F.count(F.when((F.col("protocol") == "tls") & F.col("tls_version").isNull(), 1)).alias("_unknown"),
        versions.alias("_versions"))


def _encrypted_sentence() -> Column:
    """"2 connections are encrypted (TLS 1.3) and were not decoded: give --tls-keylog"."""
    many = F.col("encrypted_connections") > 1
    versions = F.array_join(F.when(F.col("_unknown") > 0, F.array_union(F.col("_versions"), F.array(F.lit(
        "TLS version not seen")))).otherwise(F.col("_versions")), " and ")
    return F.concat(
        F.col("encrypted_connections").cast("string"),
        F.when(many, F.lit(" connections are")).otherwise(F.lit(" connection is")),
        F.lit(" encrypted ("), versions, F.lit(")"),
        F.when(many, F.lit(" and were")).otherwise(F.lit(" and was")),
        F.lit(" not decoded: give --tls-keylog"))


def diagnosis(bottlenecks: DataFrame, captures: DataFrame, connections: DataFrame | None = None) -> DataFrame:
    """The diagnosis table (``schemas.diagnosis.DIAGNOSIS_SCHEMA``): every capture of ``captures``,
    with its top finding as the headline ("none" when it has no finding). With ``connections``, TLS
    connections that were not decrypted are counted and named in the headline, and a capture of
    nothing else with no finding is ``encrypted``."""
    summary = F.struct(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in FINDING_SUMMARY.fields])
    ranked = bottlenecks.groupBy("capture_id").agg(
        F.array_sort(F.collect_list(summary)).alias("findings"))  # rank is the struct's first field
    top = bottlenecks.filter(F.col("rank") == 1).select(
        "capture_id", F.col("component").alias("bottleneck"), "effect", "entity_kind", "entity", "connection_id",
        "start_packet_number", _headline().alias("headline"))
    every = captures.select("capture_id").distinct()
    joined = every.join(top, "capture_id", "left").join(ranked, "capture_id", "left")
    if connections is not None:
        joined = joined.join(_encrypted(connections), "capture_id", "left")
    else:
        joined = joined.select("*", F.lit(0).alias("encrypted_connections"), F.lit(0).alias("_amqp"),
                               F.lit(0).alias("_unknown"), F.array().cast("array<string>").alias("_versions"))
    encrypted = F.coalesce(F.col("encrypted_connections"), F.lit(0)) > 0
    nothing_else = encrypted & (F.coalesce(F.col("_amqp"), F.lit(0)) == 0) & F.col("bottleneck").isNull()
    sentence = F.concat(_encrypted_sentence(), F.lit("."))
    headline = (F.when(nothing_else, F.concat(sentence, F.lit(" No AMQP was decoded, and TCP showed no finding: "
                                                                "nothing else could be judged.")))
                .when(encrypted & F.col("headline").isNull(), F.concat(
                    F.lit("No bottleneck in the decoded traffic (no resource alarm, no throttled publisher, no "
                          "prefetch- or credit-bound consumer, no client that stopped reading, no retransmission); "),
                    sentence))
                .when(encrypted, F.concat(F.col("headline"), F.lit(" "), sentence))
                .otherwise(F.coalesce(F.col("headline"), F.lit(_NO_BOTTLENECK))))
    empty = F.array().cast(DIAGNOSIS_SCHEMA["findings"].dataType)
    return joined.select(
        "capture_id",
        F.when(nothing_else, F.lit("encrypted")).otherwise(F.coalesce(F.col("bottleneck"), F.lit("none")))
        .alias("bottleneck"),
        "effect", "entity_kind", "entity", "connection_id", "start_packet_number",
        headline.alias("headline"),
        F.when(F.col("findings").isNull(), F.lit(0)).otherwise(F.size("findings")).alias("findings_count"),
        F.coalesce(F.col("findings"), empty).alias("findings"),
        F.coalesce(F.col("encrypted_connections"), F.lit(0)).alias("encrypted_connections"),
    ).select(*[F.col(f.name).cast(f.dataType) for f in DIAGNOSIS_SCHEMA.fields])
