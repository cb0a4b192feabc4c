"""``spark.read.format("amqp")`` and ``spark.readStream.format("amqp")``: captures as a Spark data source.

PySpark's Python Data Source API (PySpark 4). Each capture file is one input partition, decoded
whole by one task (``ingest.capture.decode_capture``) and yielded as Arrow record batches of a
bronze table: ``frames`` by default, ``option("table", ...)`` for ``connections``, ``quarantine``,
``tcp_segments`` or ``captures``. What the data source cannot do that ``amqpscope ingest`` does:
split a capture into byte ranges read in parallel and shuffle its packets by connection (a source
partition cannot exchange rows with another), and group rotated files into one capture (each file
here is its own capture). ``ingest`` stays the default way in; the data source suits many small
captures, and streams.

A file that is not a capture does not fail the read: it becomes its ``captures`` row (status
``failed: reason``) and a ``quarantine`` row holding its bytes, as ``amqpscope ingest`` records it,
and gives no rows to the other tables.

``option("tls_keylog", path)`` (or a JSON list of paths) decrypts TLS with NSS key logs: each task
reads them from their path where it runs (on a cluster, a path every executor can read, such as a
volume), so only the paths travel with the query, never a secret.

The streaming form watches a landing directory: every micro-batch reads the capture files that
appeared since the last offset, so with a checkpoint and ``trigger(availableNow=True)`` each
capture is read once (``_StreamReader`` says how the offset stays small).

Registered by ``register(spark)`` (also ``amqpscope.register``).
"""

from __future__ import annotations

import json
import os
import sys
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
from amqpscope.ingest.pcap import CaptureError, capture_id
from amqpscope.schemas.bronze import BRONZE_SCHEMAS

FORMAT = "amqp"
_BATCH_ROWS = 8192
# How far behind the newest file's modification time the stream's offset lists file names.
DEFAULT_LOOKBACK_SECONDS = 3600


@dataclass
class CapturePartition(InputPartition):
    """One capture file, decoded by one task."""

    path: str


def _paths(options: dict[str, str]) -> list[Path]:
    """The files named by ``load(path)`` / ``load([paths])`` (``paths`` arrives as JSON), directories
    expanded as ``amqpscope ingest`` lists a landing directory."""
    from amqpscope.jobs.stages.landing import landing_files

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


def _keylogs(options: dict[str, str]) -> tuple[str, ...]:
    """``option("tls_keylog", ...)``: one path, or a JSON list of paths."""
    value = options.get("tls_keylog", "").strip()
    if not value:
        return ()
    return tuple(json.loads(value)) if value.startswith("[") else (value,)


def _batches(
    path: str, table: str, ports: tuple[int, ...], schema: StructType, keylogs: tuple[str, ...] = ()
) -> Iterator[pa.RecordBatch]:
    """The rows of ``table`` of one capture file, as Arrow batches."""
    arrow_schema = to_arrow_schema(schema)
    rows: list[dict] = []
    cid = capture_id(path)
    for kind, row in _or_unreadable(
        decode_capture(path, cid, ports, segments=table == "tcp_segments", tls_keylog=keylogs), cid, path
    ):
        if kind != table:
            continue
        rows.append(row)
        if len(rows) >= _BATCH_ROWS:
            yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)
            rows = []
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema)


def _or_unreadable(decoded: Iterator[tuple[str, dict]], cid: str, path: str) -> Iterator[tuple[str, dict]]:
    """``decoded``'s rows; for a file that is not a readable capture (``decode_capture`` raises
    before its first row), the rows ``amqpscope ingest`` records it with instead."""
    from amqpscope.jobs.stages.landing import unreadable_rows

    try:
        first = next(decoded, None)
    except CaptureError as exc:
        yield from unreadable_rows(cid, Path(path), exc.reason).items()
        return
    if first is not None:
        yield first
        yield from decoded


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
        self.keylogs = _keylogs(options)
        self.files = [str(p) for p in _paths(options)]
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [CapturePartition(path) for path in self.files]

    def read(self, partition: CapturePartition) -> Iterator[pa.RecordBatch]:
        yield from _batches(partition.path, self.table, self.ports, self.schema, self.keylogs)


class _StreamReader(DataSourceStreamReader):
    """New files of the landing directories since the last offset, one partition each.

    An offset is the newest modification time of the files listed (nanoseconds) and the names of
    the files modified within ``option("lookback", seconds)`` (default an hour) before it. The
    files it covers are those older than that window and those named: every file listed when it
    was made. Each batch reads the files the end offset covers and the start offset does not, so
    a file is read once, also when a batch is run again after a restart, and the offset holds
    only the names of one window, however many files the directory has seen. A file that lands
    with a modification time older than the window (copied keeping its time, e.g. ``cp -p``) is
    not read; one whose time changes (rewritten: new bytes, a new capture id) is read again.
    """

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.table, self.ports = _options(options)
        self.keylogs = _keylogs(options)
        self.schema = schema
        seconds = float(options.get("lookback", DEFAULT_LOOKBACK_SECONDS))
        if seconds < 0:
            raise ValueError(f"option lookback is seconds, not negative: {seconds}")
        self.lookback_ns = int(seconds * 1e9)

    def _listing(self) -> dict[str, int]:
        """Path -> modification time (ns) of the files there now."""
        found = {}
        for path in _paths(self.options):
            try:
                found[str(path)] = os.stat(path).st_mtime_ns
            except FileNotFoundError:  # removed since it was listed
                continue
        return found

    def _covered(self, offset: dict, path: str, mtime_ns: int) -> bool:
        return mtime_ns < offset["newest"] - self.lookback_ns or path in offset["recent"]

    def initialOffset(self) -> dict:
        return {"newest": 0, "recent": []}

    def latestOffset(self) -> dict:
        listing = self._listing()
        newest = max(listing.values(), default=0)
        return {"newest": newest, "recent": sorted(p for p, t in listing.items() if t >= newest - self.lookback_ns)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        start, end = _offset(start), _offset(end)
        return [
            CapturePartition(path)
            for path, mtime in sorted(self._listing().items())
            if self._covered(end, path, mtime) and not self._covered(start, path, mtime)
        ]

    def read(self, partition: CapturePartition) -> Iterator[pa.RecordBatch]:
        yield from _batches(partition.path, self.table, self.ports, self.schema, self.keylogs)

    def commit(self, end: dict) -> None:
        """Nothing to release: the files stay where they landed."""


def _offset(offset: dict) -> dict:
    """An offset of the checkpoint's log, its names as a set; an offset of an older amqpscope (every
    file name seen, ``{"files": [...]}``) as one that covers exactly those files."""
    if "files" in offset:
        return {"newest": 0, "recent": set(offset["files"])}
    return {"newest": offset["newest"], "recent": set(offset["recent"])}


def register(spark: SparkSession) -> None:
    """Make ``format("amqp")`` known to ``spark``, and its Python workers able to import amqpscope.

    PySpark starts the workers that read the source with ``PYSPARK_PYTHON``, else with ``python3``
    from the PATH: from a virtualenv's interpreter not activated, that is another Python, without
    amqpscope (``ModuleNotFoundError`` in the workers). So unless the user chose the workers' Python,
    they run the driver's own interpreter, the one that imported amqpscope. A choice made with
    ``PYSPARK_PYTHON`` stands; one made with ``spark.pyspark.python``, which only spark-submit turns
    into ``PYSPARK_PYTHON`` (PySpark alone reads the variable, not the setting), is applied here.
    """
    context = getattr(spark, "_sc", None)  # None: a Spark Connect session, whose server runs the workers
    if context is not None and not os.environ.get("PYSPARK_PYTHON"):
        # Read when a Python function is wrapped for the JVM: the data source's reader among them.
        context.pythonExec = spark.conf.get("spark.pyspark.python", None) or sys.executable
    spark.dataSource.register(AmqpDataSource)
