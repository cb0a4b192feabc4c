"""Decoding captures on Spark executors: capture files in, the bronze DataFrames out.

Each capture is decoded by one task (``ingest.capture.decode_capture``, plain Python) whose rows
leave the Python worker as Arrow batches through ``mapInArrow``. The four outputs of a decode
(frames, connections, quarantine, captures) travel multiplexed in one DataFrame, persisted, so
each capture is decoded exactly once however many tables are written from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.pcap import CaptureError, capture_id, read_records
from amqpscope.schemas.frames import CAPTURES_SCHEMA, CONNECTIONS_SCHEMA, FRAMES_SCHEMA, QUARANTINE_SCHEMA

BRONZE_SCHEMAS: dict[str, StructType] = {
    "frames": FRAMES_SCHEMA,
    "connections": CONNECTIONS_SCHEMA,
    "quarantine": QUARANTINE_SCHEMA,
    "captures": CAPTURES_SCHEMA,
}
_MUX_SCHEMA = StructType(
    [StructField("kind", StringType(), False)] + [StructField(kind, schema, True) for kind, schema in BRONZE_SCHEMAS.items()]
)
_BATCH_ROWS = 8192


@dataclass(frozen=True)
class CaptureFile:
    path: str
    capture_id: str


@dataclass(frozen=True)
class Bronze:
    """The decoded tables of a set of captures (lazy DataFrames over one persisted decode)."""

    captures: DataFrame
    connections: DataFrame
    frames: DataFrame
    quarantine: DataFrame
    capture_ids: tuple[str, ...]
    _mux: DataFrame

    def table(self, name: str) -> DataFrame:
        return getattr(self, name)

    def release(self) -> None:
        self._mux.unpersist()


def resolve_captures(paths: Sequence[str | Path]) -> list[CaptureFile]:
    """Check every capture is readable before any work starts; identify each by content hash."""
    resolved: list[CaptureFile] = []
    for raw in paths:
        path = Path(raw).resolve()
        if not path.is_file():
            raise CaptureError(path, "file", "no such capture file")
        # Reading the first record validates the container header with a clear error.
        next(iter(read_records(path)), None)
        resolved.append(CaptureFile(str(path), capture_id(path)))
    unique = {c.capture_id: c for c in resolved}  # the same bytes twice are one capture
    return list(unique.values())


def _decode_batches(ports: tuple[int, ...]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    arrow_schema = to_arrow_schema(_MUX_SCHEMA)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for path, cid in zip(batch.column("path").to_pylist(), batch.column("capture_id").to_pylist()):
                rows: list[dict] = []
                for kind, row in decode_capture(path, cid, ports):
                    rows.append({"kind": kind, kind: row})
                    if len(rows) >= _BATCH_ROWS:
                        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)
                        rows = []
                if rows:
                    yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)

    return decode


def decode_captures(spark: SparkSession, captures: Sequence[CaptureFile], ports: tuple[int, ...]) -> Bronze:
    """Decode captures in parallel, one task per capture."""
    files = spark.createDataFrame([(c.path, c.capture_id) for c in captures], "path string, capture_id string")
    mux = (
        files.repartition(max(1, len(captures)))
        .mapInArrow(_decode_batches(tuple(ports)), _MUX_SCHEMA)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    tables = {kind: mux.filter(F.col("kind") == kind).select(f"{kind}.*") for kind in BRONZE_SCHEMAS}
    return Bronze(capture_ids=tuple(c.capture_id for c in captures), _mux=mux, **tables)
