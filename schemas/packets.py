"""Intermediate rows of parallel ingestion: one per captured packet, keyed for the shuffle."""

from __future__ import annotations

from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

PACKETS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("range_index", IntegerType(), False),  # which byte range of the file
        StructField("offset", LongType(), False),  # file offset of the record
        StructField("index_in_range", LongType(), False),  # 1-based within the range
        StructField("ts_us", LongType(), False),
        StructField("linktype", IntegerType(), False),
        StructField("wirelen", LongType(), False),
        StructField("data", BinaryType(), False),  # the captured bytes, link layer included
        StructField("flow", StringType(), True),  # the connection's two endpoints in canonical order; null: not TCP
        # Set on the rows that are no packet but bytes of the file read past (damage), with `offset`
        # where they start and `wirelen` how many: their quarantine row as JSON (ingest.quarantine).
        StructField("error", StringType(), True),
    ]
)
