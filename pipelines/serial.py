"""RFC-1982 serial-number arithmetic on 32-bit AMQP sequence numbers, as Spark Columns."""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

SERIAL_MOD = 1 << 32
_HALF = 1 << 31


def serial(value: Column) -> Column:
    """A sequence number reduced into [0, 2^32)."""
    return F.pmod(value, F.lit(SERIAL_MOD))


def serial_diff(a: Column, b: Column) -> Column:
    """a - b as a signed distance in (-2^31, 2^31], correct across wraparound."""
    d = F.pmod(a - b, F.lit(SERIAL_MOD))
    return F.when(d > _HALF, d - SERIAL_MOD).otherwise(d)
