"""Decoding captures on Spark executors: capture files in, the bronze DataFrames out.

1. Each capture is cut into byte ranges on record boundaries (``ingest.ranges``); one task a range
   reads its packets and keys each TCP packet by its connection's endpoints. A range that ends in
   damage (a truncated file) keeps what it read and reports where reading stopped.
2. Packet numbers (tshark's ``frame.number``) come from per-range counts: a prefix sum over the
   ranges of a capture, computed from a tiny aggregate.
3. Packets are shuffled by (capture, connection) and sorted by packet number, so every
   connection's packets meet in one task, in capture order, whichever range or file they came
   from; that task runs reassembly and the AMQP decoders (``ingest.capture.CaptureDecoder``).

The outputs of a decode (frames, connections, quarantine, tcp_segments) leave the Python workers
multiplexed in one DataFrame of structs as Arrow batches (``mapInArrow``), shuffled by (capture,
connection), persisted and split, so every capture is decoded exactly once however many tables are
written, and the flow-state pipelines, which partition by connection, need no shuffle of their
own. No task holds a whole capture, and nothing but per-range counts reaches the driver.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa
from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from amqpscope.ingest.capture import CaptureDecoder
from amqpscope.ingest.packets import LINK_TYPE_NAMES, parse_tcp
from amqpscope.ingest.pcap import CaptureError, Damage, scan
from amqpscope.ingest.quarantine import capture_status, damage_row
from amqpscope.ingest.ranges import read_container, split
from amqpscope.ingest.reasons import CAPTURE_DAMAGED
from amqpscope.ingest.rotation import CapturePart, resolve_parts
from amqpscope.ingest.tls_keylog import KeyLog
from amqpscope.jobs.engine.session import default_parallelism, is_connect
from amqpscope.jobs.lake.lake import Lake, lake_capture_filter
from amqpscope.jobs.stages.progress import Progress, TaskCounters
from amqpscope.pipelines.tables import STORED_FRAMES
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from amqpscope.schemas.packets import PACKETS_SCHEMA


@dataclass(frozen=True)
class CaptureFile:
    """One capture: a single file, or the rotated parts of one in time order (``ingest.rotation``)."""

    parts: tuple[CapturePart, ...]

    @property
    def capture_id(self) -> str:
        return self.parts[0].content_hash  # stays the same when the capture grows by a part

    @property
    def part_hashes(self) -> tuple[str, ...]:
        return tuple(p.content_hash for p in self.parts)

    @property
    def size(self) -> int:
        """Bytes of all its parts."""
        return sum(p.size for p in self.parts)


@dataclass(frozen=True)
class Bronze:
    """The decoded tables of a set of captures: lazy DataFrames over persisted intermediates."""

    tables: dict[str, DataFrame]
    capture_ids: tuple[str, ...]
    _persisted: tuple[DataFrame, ...]

    def table(self, name: str) -> DataFrame:
        return self.tables[name]

    @property
    def frames(self) -> DataFrame:
        return self.tables["frames"]

    @property
    def connections(self) -> DataFrame:
        return self.tables["connections"]

    @property
    def captures(self) -> DataFrame:
        return self.tables["captures"]

    @property
    def quarantine(self) -> DataFrame:
        return self.tables["quarantine"]

    @property
    def tcp_segments(self) -> DataFrame:
        return self.tables["tcp_segments"]

    def release(self) -> None:
        for df in self._persisted:
            df.unpersist()


def resolve_captures(
    paths: Sequence[str | Path], group_rotated: bool = True, say: Callable[[str], None] | None = None
) -> list[CaptureFile]:
    """Check every file's container header before any work starts (a clear error naming the file
    and the place); the same bytes twice are one capture; rotated files are grouped into one, and
    ``say`` is told which files were grouped and why (``ingest.rotation.Grouping.explain``)."""
    grouping = resolve_parts(paths, group_rotated)
    if say is not None:
        for line in grouping.explain():
            say(line)
    return [CaptureFile(parts) for parts in grouping.captures]


def superseded_captures(lake: Lake, captures: Sequence[CaptureFile]) -> list[str]:
    """Captures in the lake that share a file with one of ``captures`` under another id (a rotation
    decoded before its first part arrived, or before it was known to be one): their rows go when
    ``captures`` are written, so no packet is in the lake twice."""
    if not lake.exists("captures"):
        return []
    hashes = {h for c in captures for h in c.part_hashes}
    ids = {c.capture_id for c in captures}
    stored = lake.read("captures").select("capture_id", F.explode("parts.content_hash").alias("content_hash"))
    return sorted(
        {
            r.capture_id
            for r in stored.filter(F.col("content_hash").isin(*hashes)).select("capture_id").distinct().collect()
        }
        - ids
    )


DEFAULT_RANGE_BYTES = 64 << 20
# The intermediates (packets as read, packets numbered, decoded rows) are as big as the captures:
# on disk, not in the heap. Cached in memory they fill Spark's storage pool, and evicted blocks
# read back into the heap ran a 1 GiB driver out of memory on a 269 MB capture
# (docs/BENCHMARKS.md, Memory); each is written once and read a few times.
_INTERMEDIATE = StorageLevel.DISK_ONLY
_BATCH_ROWS = 8192
# The bronze tables derive reads from the persisted decoded rows after they are written, not from
# their Parquet files: the large ones, which the flow state reads partitioned by connection.
_READ_PERSISTED = ("frames", "tcp_segments")
# The connection key of the decoded rows, kept as columns of its own while they are muxed: a
# bronze column -> the muxed rows' column it is taken from.
_MUX_KEY = {"capture_id": "_capture_id", "connection_id": "_connection_id"}

_DECODED_KINDS = tuple(kind for kind in BRONZE_SCHEMAS if kind != "captures")
_MUX_SCHEMA = StructType(
    [StructField("kind", StringType(), False)]
    + [StructField(kind, BRONZE_SCHEMAS[kind], True) for kind in _DECODED_KINDS]
)


@dataclass(frozen=True)
class CaptureRange:
    path: str
    capture_id: str
    range_index: int
    start: int
    end: int


def plan_ranges(
    captures: Sequence[CaptureFile], range_bytes: int = DEFAULT_RANGE_BYTES, cores: int = 1
) -> list[CaptureRange]:
    """Every capture's byte ranges (boundary finding reads a few KiB around each cut, on the driver).

    A capture larger than ``range_bytes`` is cut into the fewest ranges of about ``range_bytes`` or
    less whose count is a multiple of ``cores``, all about the same size, so that its read tasks keep
    every core busy to the end: three ranges on two cores would leave one core idle for the third
    range's whole time.
    """
    ranges: list[CaptureRange] = []
    for c in captures:
        target = range_bytes
        if c.size > range_bytes and cores > 1:
            target = _ceil_div(c.size, cores * _ceil_div(c.size, range_bytes * cores))
        # Range indexes run on across the parts of a rotation, so packet numbers do too.
        cuts = [(part.path, start, end) for part in c.parts for start, end in split(part.path, target)]
        ranges.extend(
            CaptureRange(path, c.capture_id, index, start, end) for index, (path, start, end) in enumerate(cuts)
        )
    return ranges


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _flow_key(linktype: int, data: bytes, wirelen: int) -> str | None:
    seg = parse_tcp(linktype, data, wirelen)
    if seg is None:
        return None
    a, b = f"{seg.src}|{seg.sport}", f"{seg.dst}|{seg.dport}"
    return f"{a}~{b}" if a < b else f"{b}~{a}"


def _range_reader(counters: str | None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The read task: a range's packets, keyed by connection; its counts go to ``counters``."""
    schema = to_arrow_schema(PACKETS_SCHEMA)

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for r in batch.to_pylist():
                yield from _read_range(r, schema, counters)

    return read


def _read_range(r: dict, schema: pa.Schema, counters: str | None) -> Iterator[pa.RecordBatch]:
    container = read_container(r["path"])
    name = f"read-{r['capture_id'][:16]}-{r['range_index']}"
    rows = []
    position = r["start"]  # where the last good record started
    damage: list[Damage] = []  # what scan read past: impossible records, a cut-short end
    index = 0
    try:
        # Records are numbered from 1 within their range; the prefix sum makes them global.
        for index, (offset, ts_us, linktype, data, wirelen) in enumerate(
            scan(r["path"], container, r["start"], r["end"], damage), 1
        ):
            position = offset
            rows.append(
                {
                    "capture_id": r["capture_id"],
                    "range_index": r["range_index"],
                    "offset": offset,
                    "index_in_range": index,
                    "ts_us": ts_us,
                    "linktype": linktype,
                    "wirelen": wirelen,
                    "data": data,
                    "flow": _flow_key(linktype, data, wirelen),
                    "error": None,
                }
            )
            if len(rows) >= _BATCH_ROWS:
                yield pa.RecordBatch.from_pylist(rows, schema=schema)
                rows = []
                TaskCounters.report(counters, name, {"read_bytes": offset - r["start"], "read_packets": index})
    except CaptureError as exc:
        # A range that cannot be read on: what was read stays, the rest is quarantined with the
        # place and the reason.
        stop = exc.offset if exc.offset is not None else position
        damage.append(Damage(stop, r["end"] - stop, exc.place, exc.reason, CAPTURE_DAMAGED))
    for skipped in damage:
        # The quarantine row, built as every path builds it (ingest.quarantine), travels as JSON.
        quarantined = damage_row(r["capture_id"], skipped, r["part_label"])
        rows.append(
            {
                "capture_id": r["capture_id"],
                "range_index": r["range_index"],
                "offset": skipped.offset,
                "index_in_range": 0,
                "ts_us": 0,
                "linktype": 0,
                "wirelen": skipped.size,
                "data": b"",
                "flow": None,
                "error": json.dumps(quarantined),
            }
        )
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=schema)
    TaskCounters.report(counters, name, {"read_bytes": r["end"] - r["start"], "read_packets": index})


def _decode_connections(
    ports: tuple[int, ...], counters: str | None = None, tls_keylog: tuple[str, ...] = ()
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The decode task. ``tls_keylog`` are paths: each task reads the key logs where it runs, when it
    meets a TLS connection (no key material travels with the task or into a DataFrame)."""
    arrow_schema = to_arrow_schema(_MUX_SCHEMA)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoders: dict[str, CaptureDecoder] = {}
        keys = KeyLog(tls_keylog) if tls_keylog else None
        rows: dict[str, list[dict]] = {kind: [] for kind in _DECODED_KINDS}
        pending = 0
        context = TaskContext.get()
        name = f"decode-{context.stageId() if context else 0}-{context.partitionId() if context else 0}"
        decoded = 0

        def flush() -> Iterator[pa.RecordBatch]:
            nonlocal pending
            for kind, kept in rows.items():
                if kept:
                    yield _kind_batch(arrow_schema, kind, kept)
                    kept.clear()
            pending = 0

        def emit(kind: str, row: dict) -> Iterator[pa.RecordBatch]:
            nonlocal pending
            rows[kind].append(row)
            pending += 1
            if pending >= _BATCH_ROWS:
                yield from flush()

        for batch in batches:
            columns = batch.to_pydict()
            for cid, number, ts, linktype, data, wirelen in zip(
                columns["capture_id"],
                columns["packet_number"],
                columns["ts_us"],
                columns["linktype"],
                columns["data"],
                columns["wirelen"],
            ):
                decoder = decoders.get(cid)
                if decoder is None:
                    decoder = decoders[cid] = CaptureDecoder(cid, ports, segments=True, keys=keys)
                for kind, row in decoder.packet(number, ts, linktype, data, wirelen):
                    yield from emit(kind, row)
            decoded += batch.num_rows
            TaskCounters.report(counters, name, {"decoded_packets": decoded})
        for decoder in decoders.values():
            for kind, row in decoder.finish():
                yield from emit(kind, row)
        yield from flush()

    return decode


def _kind_batch(schema: pa.Schema, kind: str, rows: list[dict]) -> pa.RecordBatch:
    """Decoded rows of one kind as muxed rows (the other kinds' columns null). Each kind is
    converted on its own, not row by row across every kind's fields: the decode task's Arrow
    conversion took 0.57x the time (docs/BENCHMARKS.md, "What is set": the decoded rows converted a
    kind at a time). Rows of one kind keep their order, which is all the split tables see."""
    count = len(rows)
    columns = [
        pa.array([kind] * count, field.type)
        if field.name == "kind"
        else pa.array(rows, field.type)
        if field.name == kind
        else pa.nulls(count, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _range_bases(spark: SparkSession, packets: DataFrame) -> DataFrame:
    """First packet number of every range: a prefix sum over the ranges of each capture."""
    counts = packets.groupBy("capture_id", "range_index").agg(F.count(F.lit(1)).alias("n"))
    # Ranges of one capture in file order: the packets before a range are those of the ranges before it.
    earlier_ranges = Window.partitionBy("capture_id").orderBy("range_index").rowsBetween(Window.unboundedPreceding, -1)
    return counts.withColumn("base", F.coalesce(F.sum("n").over(earlier_ranges), F.lit(0))).drop("n")


def decode_captures(
    spark: SparkSession,
    captures: Sequence[CaptureFile],
    ports: tuple[int, ...],
    range_bytes: int = DEFAULT_RANGE_BYTES,
    connection_partitions: int | None = None,
    counters: str | None = None,
    tls_keylog: Sequence[str | Path] = (),
) -> Bronze:
    """The bronze tables of ``captures``, decoded range- and connection-parallel."""
    tables, persisted = decode_tables(
        spark, captures, ports, range_bytes, connection_partitions, counters, tls_keylog=tls_keylog
    )
    return Bronze(tables, tuple(c.capture_id for c in captures), persisted)


def write_bronze(
    spark: SparkSession,
    lake: Lake,
    captures: Sequence[CaptureFile],
    ports: tuple[int, ...],
    superseded: Sequence[str] = (),
    progress: Progress | None = None,
    tls_keylog: Sequence[str | Path] = (),
) -> Bronze:
    """Decode ``captures`` and write every bronze table, replacing exactly these captures' rows
    (and removing those of the ``superseded`` ones). TLS is decrypted with the ``tls_keylog`` files."""
    counters = None
    if progress is not None:
        counters = progress.decoding(sum(c.size for c in captures))
    bronze = decode_captures(spark, captures, ports, counters=counters, tls_keylog=tls_keylog)
    written = {}
    for name in BRONZE_SCHEMAS:
        if progress is not None:
            # The first table written runs the decode: its tasks are the ranges, then the connections.
            progress.detail(f"writing {name}")
        # What derives from them reads the rows a small run kept (Lake.write_and_keep), else the
        # stored rows, except for the frames and the TCP segments: those are the persisted rows,
        # partitioned by connection as every window over a connection's frames wants them. The
        # captures table aggregates every packet read, and the connections and quarantine are a few
        # rows split out of the persisted rows of every kind, which every query reading them reads
        # whole from disk (at 10 M frames, 13 of the 89 reads in derive's plans). So does a query
        # that picks a few kinds of frame: those read the stored frames (pipelines.tables.STORED_FRAMES).
        rows = lake.write_and_keep(
            bronze.table(name),
            name,
            replace_capture_ids=[*bronze.capture_ids, *superseded],
            capture_ids=bronze.capture_ids,
        )
        if rows is None and name in _READ_PERSISTED:
            rows = bronze.table(name)
            if name == "frames":
                written[STORED_FRAMES] = lake.read(name).filter(lake_capture_filter(bronze.capture_ids))
        elif rows is None:
            rows = lake.read(name).filter(lake_capture_filter(bronze.capture_ids))
        written[name] = rows
    return replace(bronze, tables=written)


def decode_tables(
    spark: SparkSession,
    captures: Sequence[CaptureFile],
    ports: tuple[int, ...],
    range_bytes: int = DEFAULT_RANGE_BYTES,
    connection_partitions: int | None = None,
    counters: str | None = None,
    tls_keylog: Sequence[str | Path] = (),
) -> tuple[dict[str, DataFrame], tuple[DataFrame, ...]]:
    """The bronze tables of ``captures``, decoded range- and connection-parallel, and the persisted
    intermediates to release once the tables are written. Tasks report their counts to the
    ``counters`` directory when one is given (jobs.stages.progress.TaskCounters)."""
    cores = default_parallelism(spark)
    ranges = plan_ranges(captures, range_bytes, cores)
    multi_part = {c.capture_id for c in captures if len(c.parts) > 1}
    plan_rows = [
        # In a rotation, damage is placed by the part's file name before its byte offset.
        (
            r.path,
            r.capture_id,
            r.range_index,
            r.start,
            r.end,
            f"{Path(r.path).name}: " if r.capture_id in multi_part else "",
        )
        for r in ranges
    ]
    raw = _read_plan(spark, plan_rows).mapInArrow(_range_reader(counters), PACKETS_SCHEMA).persist(_INTERMEDIATE)
    damage = raw.filter(F.col("error").isNotNull())
    records = raw.filter(F.col("error").isNull())
    decode = _decode_connections(tuple(ports), counters, tuple(str(p) for p in tls_keylog))
    columns = ("capture_id", "packet_number", "ts_us", "linktype", "data", "wirelen")
    if len(ranges) == len(captures):
        # Every capture is one byte range, read by one task in capture order: its packets are
        # numbered by their place in the range and decoded in that task, without a shuffle.
        packets = records.withColumn("packet_number", F.col("index_in_range").cast("long"))
        mux = packets.filter(F.col("flow").isNotNull()).select(*columns).mapInArrow(decode, _MUX_SCHEMA)
        persisted = (raw,)
    else:
        packets = (
            records.join(F.broadcast(_range_bases(spark, records)), on=["capture_id", "range_index"])
            .withColumn("packet_number", F.col("base") + F.col("index_in_range"))
            .drop("base")
            .persist(_INTERMEDIATE)
        )
        # As many decode tasks as ranges, rounded up to a multiple of the cores (the last wave full;
        # never fewer than the cores).
        partitions = connection_partitions or cores * _ceil_div(len(ranges), cores)
        mux = (
            packets.filter(F.col("flow").isNotNull())
            .repartition(partitions, "capture_id", "flow")
            .sortWithinPartitions("capture_id", "flow", "packet_number")
            .select(*columns)
            .mapInArrow(decode, _MUX_SCHEMA)
        )
        persisted = (raw, packets)
    # Every flow-state pipeline partitions the frames (and tcp_flow the segments) by connection and
    # something more (channel, link, session, direction: pipelines.partitioning). The decoded rows
    # are kept hash-partitioned by connection, in as many partitions as a shuffle makes, so those
    # pipelines need no shuffle of their own; the split below keeps that partitioning.
    mux = _by_connection(mux, int(spark.conf.get("spark.sql.shuffle.partitions"))).persist(_INTERMEDIATE)
    persisted = (*persisted, mux)
    tables = {kind: _split(mux, kind) for kind in _DECODED_KINDS}
    tables["quarantine"] = tables["quarantine"].unionByName(_damage_rows(damage))
    tables["captures"] = _captures_table(spark, captures, packets, damage)
    return tables, persisted


# The byte ranges' read plan: one row a range, in plan order.
_PLAN_SCHEMA = StructType(
    [
        StructField("path", StringType()),
        StructField("capture_id", StringType()),
        StructField("range_index", IntegerType()),
        StructField("start", LongType()),
        StructField("end", LongType()),
        StructField("part_label", StringType()),
    ]
)


def _read_plan(spark: SparkSession, plan_rows: Sequence[tuple[object, ...]]) -> DataFrame:
    """The read plan as a DataFrame of one range per partition, partition i holding range i.

    A range of as many slices as rows gives each slice one row id, and each id picks its row out
    of the plan (a literal in the query): one range per read task, in plan order, on any Spark
    session, classic or Connect (which has no ``parallelize``). Rows dealt out by ``repartition``
    would be round-robin from a random start, and two ranges could meet in one task while another
    gets none."""
    if not plan_rows:
        return spark.createDataFrame([], _PLAN_SCHEMA)
    if not is_connect(spark):
        # Classic: parallelize slices the list evenly, and the decoded rows persisted after it are
        # found again by every plan that reads them (tests/test_plan_shapes.py); the literal plan
        # below is what a Connect session takes.
        return spark.createDataFrame(spark.sparkContext.parallelize(plan_rows, len(plan_rows)), _PLAN_SCHEMA)
    rows = F.array(
        *[
            F.struct(*[F.lit(v).cast(f.dataType).alias(f.name) for v, f in zip(row, _PLAN_SCHEMA.fields)])
            for row in plan_rows
        ]
    )
    return (
        spark.range(0, len(plan_rows), 1, len(plan_rows))
        .select(F.element_at(rows, F.col("id").cast("int") + 1).alias("r"))
        .select("r.*")
    )


def _by_connection(mux: DataFrame, partitions: int) -> DataFrame:
    """The decoded rows shuffled into ``partitions`` by (capture, connection), the key also kept as
    the columns ``_MUX_KEY`` (null connection: quarantine rows of no connection, in one partition)."""
    keys = [
        F.coalesce(*[F.col(f"{kind}.{name}") for kind in _DECODED_KINDS]).alias(column)
        for name, column in _MUX_KEY.items()
    ]
    return mux.select(*keys, "*").repartition(partitions, *_MUX_KEY.values())


def _split(mux: DataFrame, kind: str) -> DataFrame:
    """One kind's rows out of the muxed rows, their connection key taken from the key columns the
    rows were partitioned by: Spark then knows these rows are partitioned by connection."""
    fields = BRONZE_SCHEMAS[kind].fieldNames()
    return mux.filter(F.col("kind") == kind).select(
        *[F.col(_MUX_KEY[name]).alias(name) if name in _MUX_KEY else F.col(f"{kind}.{name}") for name in fields]
    )


def _damage_rows(damage: DataFrame) -> DataFrame:
    """Quarantine rows for the bytes of the files that the read tasks read past, as they built them."""
    schema = BRONZE_SCHEMAS["quarantine"]
    row = F.from_json("error", schema)
    return damage.select(*[row[f.name].cast(f.dataType).alias(f.name) for f in schema.fields])


def _capture_status(damage: list[str] | None) -> str:
    """``captures.status`` from a capture's damage rows (JSON, in file order), as every path makes it."""
    return capture_status([json.loads(row) for row in damage or ()])


def _captures_table(
    spark: SparkSession, captures: Sequence[CaptureFile], packets: DataFrame, damage: DataFrame
) -> DataFrame:
    files = spark.createDataFrame(
        [
            (
                c.capture_id,
                Path(c.parts[0].path).name,
                c.size,
                [(Path(p.path).name, p.size, p.content_hash) for p in c.parts],
            )
            for c in captures
        ],
        "capture_id string, file_name string, file_size long, "
        "parts array<struct<file_name: string, file_size: long, content_hash: string>>",
    )
    names = F.create_map(*[x for code, name in LINK_TYPE_NAMES.items() for x in (F.lit(code), F.lit(name))])
    # Per connection first (its key is null for a packet of no TCP connection), then per capture: the
    # connections are counted without a distinct aggregate of their own.
    by_flow = packets.groupBy("capture_id", "flow").agg(
        F.count(F.lit(1)).alias("packets"),
        F.min("ts_us").alias("first_us"),
        F.max("ts_us").alias("last_us"),
        F.collect_set("linktype").alias("linktypes"),
    )
    stats = by_flow.groupBy("capture_id").agg(
        F.sum("packets").alias("packets"),
        F.timestamp_micros(F.min("first_us")).alias("first_ts"),
        F.timestamp_micros(F.max("last_us")).alias("last_ts"),
        F.array_sort(F.array_distinct(F.flatten(F.collect_list("linktypes")))).alias("linktypes"),
        F.count("flow").alias("tcp_connections"),
    )
    # A capture's damage in file order: its parts' ranges in order, and by offset within a range.
    in_file_order = F.array_sort(F.collect_list(F.struct("range_index", "offset", "error")))
    damaged = damage.groupBy("capture_id").agg(F.transform(in_file_order, lambda d: d["error"]).alias("damage"))
    joined = (
        files.join(stats, on="capture_id", how="left")
        .join(damaged, on="capture_id", how="left")
        .fillna(0, subset=["packets", "tcp_connections"])
        .withColumn(
            "link_types",
            F.array_join(F.array_sort(F.transform("linktypes", lambda t: F.coalesce(names[t], t.cast("string")))), ","),
        )
        # Made here, not at import: a UDF is a classic or a Spark Connect one as the session is then.
        .withColumn("status", F.udf(_capture_status, StringType())("damage"))
    )
    return joined.select(*[F.col(f.name).cast(f.dataType) for f in BRONZE_SCHEMAS["captures"].fields])
