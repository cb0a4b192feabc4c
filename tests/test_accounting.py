"""The byte-accounting identity on inline tables."""

from __future__ import annotations

import pytest
from pyspark.sql.types import IntegerType, LongType

from amqpscope.pipelines.accounting import ByteAccountingError, assert_bytes_accounted, byte_accounting
from amqpscope.schemas.frames import CONNECTIONS_SCHEMA, QUARANTINE_SCHEMA


def _connection(**values) -> dict:
    """A connections row: counts 0, everything else null, then ``values``."""
    conn = {f.name: 0 if isinstance(f.dataType, (IntegerType, LongType)) else None for f in CONNECTIONS_SCHEMA.fields}
    conn.update(
        capture_id="c",
        connection_id="k",
        client_address="a",
        server_address="b",
        protocol="amqp-0-9-1",
        protocol_inferred=False,
        **values,
    )
    return conn


def accounting(spark, *, c2s_bytes=30, framed=(10, 12), quarantined=8, missing=0, gap=0):
    """One connection whose client sent ``c2s_bytes``: frames, one quarantined run, maybe a gap."""
    conn = _connection(c2s_bytes=c2s_bytes, c2s_missing_bytes=missing)
    connections = spark.createDataFrame([conn], CONNECTIONS_SCHEMA)
    frames = spark.createDataFrame(
        [("c", "k", "c2s", n) for n in framed],
        "capture_id string, connection_id string, direction string, frame_size long",
    )
    details = (None, None, None, None)
    rows = [("c", "k", "c2s", 0, quarantined, 1, False, "bad frame-end", "amqp091.frame.bad_frame_end", *details)]
    if gap:
        rows.append(("c", "k", "c2s", 40, gap, 2, True, "capture gap", "tcp.gap", *details))
    return byte_accounting(connections, frames, spark.createDataFrame(rows, QUARANTINE_SCHEMA))


def balanced(df, direction="c2s") -> bool:
    return df.filter(f"direction = '{direction}'").first().balanced


def test_balanced_connection_passes(spark):
    df = accounting(spark)
    assert balanced(df) and balanced(df, "s2c")
    assert_bytes_accounted(df)


def test_lost_bytes_fail_loudly_naming_the_connection(spark):
    df = accounting(spark, c2s_bytes=31)
    assert not balanced(df)
    with pytest.raises(ByteAccountingError) as err:
        assert_bytes_accounted(df)
    assert "c k c2s: payload 31 != framed 22 + quarantined 8" in str(err.value)


def test_recorded_gaps_must_equal_missing_bytes(spark):
    assert balanced(accounting(spark, missing=5, gap=5))
    assert not balanced(accounting(spark, missing=6, gap=5))
    assert not balanced(accounting(spark, missing=0, gap=5))


def test_over_tls_the_bytes_tls_adds_are_the_third_part(spark):
    """A TLS connection's payload is its frames' plaintext, its quarantine and TLS's own bytes."""

    def tls_accounting(tls_bytes: int):
        conn = _connection(c2s_bytes=100, c2s_tls_bytes=tls_bytes, s2c_tls_bytes=0, tls_version="TLS 1.3")
        frames = spark.createDataFrame(
            [("c", "k", "c2s", 60)], "capture_id string, connection_id string, direction string, frame_size long"
        )
        quarantine = spark.createDataFrame(
            [("c", "k", "c2s", 0, 10, 1, False, "encrypted, not decoded: ...", "tls.no_key", None, None, None, None)],
            QUARANTINE_SCHEMA,
        )
        return byte_accounting(spark.createDataFrame([conn], CONNECTIONS_SCHEMA), frames, quarantine)

    assert balanced(tls_accounting(30))
    assert tls_accounting(30).filter("direction = 'c2s'").first().tls_bytes == 30
    assert not balanced(tls_accounting(29))
    with pytest.raises(ByteAccountingError, match=r"payload 100 != framed 60 \+ quarantined 10 \+ TLS 29"):
        assert_bytes_accounted(tls_accounting(29))
