"""Byte accounting: every TCP payload byte of an AMQP connection is in a frame, in the
quarantine, or missing from the capture — per connection and direction, nothing else."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

_KEY = ("capture_id", "connection_id", "direction")


class ByteAccountingError(AssertionError):
    """The identity does not hold: bytes were lost or counted twice somewhere in ingestion."""


def byte_accounting(connections: DataFrame, frames: DataFrame, quarantine: DataFrame) -> DataFrame:
    """Per connection and direction: payload, framed, quarantined and missing bytes, and whether
    payload = framed + quarantined (missing bytes were never seen, so they are not payload)."""
    payload = connections.select(
        "capture_id", "connection_id",
        F.explode(F.array(
            F.struct(F.lit("c2s").alias("direction"), F.col("c2s_bytes").alias("payload_bytes"), F.col("c2s_missing_bytes").alias("missing_bytes")),
            F.struct(F.lit("s2c").alias("direction"), F.col("s2c_bytes").alias("payload_bytes"), F.col("s2c_missing_bytes").alias("missing_bytes")),
        )).alias("d"),
    ).select("capture_id", "connection_id", "d.*")  # fmt: skip
    framed = frames.groupBy(*_KEY).agg(F.sum("frame_size").alias("framed_bytes"))
    quarantined = quarantine.filter(~F.col("missing")).groupBy(*_KEY).agg(F.sum("byte_count").alias("quarantined_bytes"))
    gaps = quarantine.filter(F.col("missing")).groupBy(*_KEY).agg(F.sum("byte_count").alias("gap_bytes"))
    joined = (
        payload.join(framed, on=list(_KEY), how="left")
        .join(quarantined, on=list(_KEY), how="left")
        .join(gaps, on=list(_KEY), how="left")
        .fillna(0, subset=["framed_bytes", "quarantined_bytes", "gap_bytes"])
    )
    return joined.withColumn(
        "balanced",
        (F.col("payload_bytes") == F.col("framed_bytes") + F.col("quarantined_bytes"))
        & (F.col("missing_bytes") == F.col("gap_bytes")),
    )


def assert_bytes_accounted(accounting: DataFrame, limit: int = 5) -> None:
    """Fail loudly, naming the first unbalanced connections, when the identity does not hold."""
    broken = accounting.filter(~F.col("balanced")).limit(limit).collect()
    if broken:
        lines = [
            f"{r.capture_id} {r.connection_id} {r.direction}: payload {r.payload_bytes} != framed {r.framed_bytes}"
            f" + quarantined {r.quarantined_bytes} (missing {r.missing_bytes}, gaps recorded {r.gap_bytes})"
            for r in broken
        ]
        raise ByteAccountingError("byte accounting does not balance:\n  " + "\n  ".join(lines))
