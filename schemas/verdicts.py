"""Verdict tables: rule violations with their evidence."""

from __future__ import annotations

from pyspark.sql.types import (
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

VIOLATIONS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("rule_id", StringType(), False),  # stable id, e.g. amqp10.link.credit_exceeded
        StructField("severity", StringType(), False),  # error | warning | capture
        StructField("description", StringType(), False),
        StructField("connection_id", StringType(), True),
        StructField("channel", IntegerType(), True),
        StructField("handle", LongType(), True),
        StructField("frame_index", LongType(), True),
        StructField("ts", TimestampType(), True),
        StructField("evidence", MapType(StringType(), StringType()), True),
        # The frame's packet (tshark frame.number) where the rule's table has one: drill-down.
        StructField("packet_number", LongType(), True),
    ]
)
