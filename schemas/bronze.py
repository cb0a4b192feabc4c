"""The bronze tables ingestion writes, by name, in the order they are written."""

from __future__ import annotations

from pyspark.sql.types import StructType

from amqpscope.schemas.frames import CAPTURES_SCHEMA, CONNECTIONS_SCHEMA, FRAMES_SCHEMA, QUARANTINE_SCHEMA
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA

BRONZE_SCHEMAS: dict[str, StructType] = {
    "frames": FRAMES_SCHEMA,
    "connections": CONNECTIONS_SCHEMA,
    "quarantine": QUARANTINE_SCHEMA,
    "captures": CAPTURES_SCHEMA,
    "tcp_segments": TCP_SEGMENTS_SCHEMA,
}
