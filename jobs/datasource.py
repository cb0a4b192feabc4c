"""``spark.read.format("amqp")`` and ``spark.readStream.format("amqp")``: captures as a Spark data source.

PySpark's Python Data Source API (PySpark 4). Each capture file is one input partition, decoded
whole by one task (``ingest.capture.decode_capture``) and yielded as Arrow record batches of a
bronze table: ``frames`` by default, ``option("table", ...)`` for ``connections``, ``quarantine``,
``tcp_segments`` or ``captures``. What the data source cannot do that ``amqpscope ingest`` does:
split a capture into byte ranges read in parallel and shuffle its packets by connection (a source
partition cannot exchange rows with another), and group rotated files into one capture (each file
here is its own capture). ``ingest`` stays the default way in; the data source suits many small
captures, and streams.

The streaming form watches a landing directory: every micro-batch reads the capture files that
appeared since the last offset (the offset is the sorted list of file names seen), so with a
checkpoint and ``trigger(availableNow=True)`` each capture is read once.

Registered by ``register(spark)`` (also ``amqpscope.register``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from amqpscope.conf.settings import DEFAULT_PORTS
from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.pcap import capture_id
from amqpscope.schemas.bronze import BRONZE_SCHEMAS

FORMAT = "amqp"
_BATCH_ROWS = 8192


@dataclass
class CapturePartition(InputPartition):
    """One capture file, decoded by one task."""

    path: str


def _paths(options: dict[str, str]) -> list[Path]:
    """The files named by ``load(path)`` / ``load([paths])`` (``paths`` arrives as JSON), directories
    expanded as ``amqpscope ingest`` lists a landing directory."""
    from amqpscope.jobs.landing import landing_files

    named = json.loads(options["paths"]) if options.get("paths") else []
    if options.get("path"):
        named.append(options["path"])
    if not named:
        raise ValueError("format('amqp') needs capture files or directories: load(path) or load([paths])")
    found: list[Path] = []
    for name in named:
        path = Path(name)
        found += landing_files(path) if path.is_dir() else [path]
    return found


def _options(options: dict[str, str]) -> tuple[str, tuple[int, ...]]:
    table = options.get("table", "frames")
    if table not in BRONZE_SCHEMAS:
        raise ValueError(f"option table must be one of {', '.join(BRONZE_SCHEMAS)}, not {table!r}")
    ports = tuple(int(p) for p in options.get("ports", ",".join(map(str, DEFAULT_PORTS))).split(",") if p)
    return table, ports


def _batches(path: str, table: str, ports: tuple[int, ...], schema: StructType) -> Iterator[pa.RecordBatch]:
    """The rows of ``table`` of one capture file, as Arrow batches."""
    arrow_schema = to_arrow_schema(schema)
    rows: list[dict] = []
    for kind, row in decode_capture(path, capture_id(path), ports, segments=table == "tcp_segments"):
        if kind != table:
            continue
        rows.append(row)
        if len(rows) >= _BATCH_ROWS:
            yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)


class AmqpDataSource(DataSource):
    """Capture files as a bronze table (``option("table", ...)``, default frames)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return BRONZE_SCHEMAS[_options(self.options)[0]]

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(dict(self.options), schema)


class _Reader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.table, self.ports = _options(options)
        self.files = [str(p) for p in _paths(options)]
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [CapturePartition(path) for path in self.files]

    def read(self, partition: CapturePartition) -> Iterator[pa.RecordBatch]:
        yield from _batches(partition.path, self.table, self.ports, self.schema)


class _StreamReader(DataSourceStreamReader):
    """New files of the landing directories since the last offset, one partition each."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.table, self.ports = _options(options)
        self.schema = schema

    def initialOffset(self) -> dict:
        return {"files": []}

    def latestOffset(self) -> dict:
        return {"files": sorted(str(p) for p in _paths(self.options))}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        seen = set(start["files"])
        return [CapturePartition(path) for path in end["files"] if path not in seen]

    def read(self, partition: CapturePartition) -> Iterator[pa.RecordBatch]:
        yield from _batches(partition.path, self.table, self.ports, self.schema)

    def commit(self, end: dict) -> None:
        """Nothing to release: the files stay where they landed."""


def register(spark: SparkSession) -> None:
    """Make ``format("amqp")`` known to ``spark``."""
    spark.dataSource.register(AmqpDataSource)
