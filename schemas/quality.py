"""Gold data-quality table: one row per capture and run, for dashboards (Databricks SQL, Grafana, Superset).

``dq_summary`` says, per capture, how much of the capture was decoded (the byte-accounting identity of
``pipelines/accounting.py``), how many gaps the capture has, how many rules it broke by severity, the
diagnosed bottleneck and whether the Great Expectations suites passed on it. Every run replaces the
capture's row (the lake keeps earlier runs in the Delta history: time travel on ``run_ts``).
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# The columns that name the run which wrote a row: two runs on the same input differ only in them.
RUN_COLUMNS = ("run_id", "run_ts")

DQ_SUMMARY_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("run_id", StringType(), False),  # the analyze run that wrote the row
        StructField("run_ts", TimestampType(), False),
        StructField("file_name", StringType(), True),
        StructField("packets", LongType(), True),
        StructField("amqp_connections", LongType(), False),  # decoded as AMQP 0-9-1 or 1.0
        StructField("tls_connections", LongType(), False),  # AMQP port, TLS: seen, not decoded
        StructField("other_connections", LongType(), False),  # AMQP port, neither AMQP nor TLS
        StructField("frames", LongType(), False),
        # Byte accounting over every connection and direction: payload = framed + quarantined;
        # missing bytes (capture gaps) were never seen, so they are not payload.
        StructField("payload_bytes", LongType(), False),
        StructField("framed_bytes", LongType(), False),
        StructField("quarantined_bytes", LongType(), False),
        StructField("missing_bytes", LongType(), False),
        StructField("bytes_accounted", BooleanType(), False),  # the identity holds for every direction
        StructField("gaps", LongType(), False),  # runs of bytes missing from the capture
        StructField("violations_error", LongType(), False),
        StructField("violations_warning", LongType(), False),
        StructField("violations_capture", LongType(), False),
        StructField("bottleneck", StringType(), True),  # diagnosis.bottleneck; null: not diagnosed
        StructField("bottleneck_entity", StringType(), True),
        StructField("findings", IntegerType(), True),  # diagnosis.findings_count
        StructField("suites_run", IntegerType(), False),
        StructField("suites_failed", ArrayType(StringType()), False),  # suite names with unexpected rows here
        StructField("suites_passed", BooleanType(), False),
    ]
)
