"""Byte accounting: every TCP payload byte of an AMQP connection is in a frame, in the
quarantine, or missing from the capture — per connection and direction, nothing else. Over TLS
a decrypted frame holds plaintext, and the bytes TLS adds (record headers, tags, handshake:
``connections.c2s_tls_bytes`` / ``s2c_tls_bytes``) are the third part of the payload; records not
decrypted are quarantined ("encrypted, not decoded")."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

_KEY = ("capture_id", "connection_id", "direction")


class ByteAccountingError(AssertionError):
    """The identity does not hold: bytes were lost or counted twice somewhere in ingestion."""


def _tls_bytes(connections: DataFrame, direction: str) -> Column:
    """TLS's own bytes of a direction: 0 without TLS (and in a lake written before the column)."""
    column = f"{direction}_tls_bytes"
    return F.coalesce(F.col(column), F.lit(0).cast("long")) if column in connections.columns else F.lit(0).cast("long")


def byte_accounting(connections: DataFrame, frames: DataFrame, quarantine: DataFrame) -> DataFrame:
    """Per connection and direction: payload, framed, quarantined, TLS and missing bytes, and whether
    payload = framed + quarantined + TLS's own bytes (missing bytes were never seen, so they are not payload)."""
    payload = connections.select(
        "capture_id",
        "connection_id",
        F.explode(
            F.array(
                *[
                    F.struct(
                        F.lit(d).alias("direction"),
                        F.col(f"{d}_bytes").alias("payload_bytes"),
                        F.col(f"{d}_missing_bytes").alias("missing_bytes"),
                        _tls_bytes(connections, d).alias("tls_bytes"),
                    )
                    for d in ("c2s", "s2c")
                ]
            )
        ).alias("d"),
    ).select("capture_id", "connection_id", "d.*")
    framed = frames.groupBy(*_KEY).agg(F.sum("frame_size").alias("framed_bytes"))
    quarantined = (
        quarantine.filter(~F.col("missing")).groupBy(*_KEY).agg(F.sum("byte_count").alias("quarantined_bytes"))
    )
    gaps = quarantine.filter(F.col("missing")).groupBy(*_KEY).agg(F.sum("byte_count").alias("gap_bytes"))
    joined = (
        payload.join(framed, on=list(_KEY), how="left")
        .join(quarantined, on=list(_KEY), how="left")
        .join(gaps, on=list(_KEY), how="left")
        .fillna(0, subset=["framed_bytes", "quarantined_bytes", "gap_bytes"])
    )
    return joined.withColumn(
        "balanced",
        (F.col("payload_bytes") == F.col("framed_bytes") + F.col("quarantined_bytes") + F.col("tls_bytes"))
        & (F.col("missing_bytes") == F.col("gap_bytes")),
    )


def assert_bytes_accounted(accounting: DataFrame, limit: int = 5) -> None:
    """Fail loudly, naming the first unbalanced connections, when the identity does not hold."""
    # In order, so the same connections are named each time (and a take in order is one Spark job).
    broken = accounting.filter(~F.col("balanced")).orderBy(*_KEY).limit(limit).collect()
    if broken:
        lines = [
            f"{r.capture_id} {r.connection_id} {r.direction}: payload {r.payload_bytes} != framed {r.framed_bytes}"
            f" + quarantined {r.quarantined_bytes} + TLS {r.tls_bytes} (missing {r.missing_bytes}, gaps recorded"
            f" {r.gap_bytes})"
            for r in broken
        ]
        raise ByteAccountingError("byte accounting does not balance:\n  " + "\n  ".join(lines))
