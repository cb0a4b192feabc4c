"""The byte-accounting identity on inline tables."""

from __future__ import annotations

import pytest

from amqpscope.pipelines.accounting import ByteAccountingError, assert_bytes_accounted, byte_accounting
from amqpscope.schemas.frames import CONNECTIONS_SCHEMA, QUARANTINE_SCHEMA


def accounting(spark, *, c2s_bytes=30, framed=(10, 12), quarantined=8, missing=0, gap=0):
    """One connection whose client sent ``c2s_bytes``: frames, one quarantined run, maybe a gap."""
    conn = {f.name: 0 for f in CONNECTIONS_SCHEMA.fields}
    conn.update(capture_id="c", connection_id="k", client_address="a", server_address="b", protocol="amqp-0-9-1",
                protocol_inferred=False, first_ts=None, last_ts=None, c2s_bytes=c2s_bytes, c2s_missing_bytes=missing)
    connections = spark.createDataFrame([conn], CONNECTIONS_SCHEMA)
    frames = spark.createDataFrame([("c", "k", "c2s", n) for n in framed],
                                   "capture_id string, connection_id string, direction string, frame_size long")
    rows = [("c", "k", "c2s", 0, quarantined, 1, False, "bad frame-end")]
    if gap:
        rows.append(("c", "k", "c2s", 40, gap, 2, True, "capture gap"))
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
