"""Range- and connection-parallel decoding gives exactly the rows of the one-pass decoder."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql.types import StructType, TimestampType
from pyspark.testing import assertDataFrameEqual

from amqpscope.ingest.capture import decode_capture
from amqpscope.jobs.stages.decode import decode_tables, plan_ranges, resolve_captures
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from tests.paths import SAMPLE_CAPTURES

SAMPLES = SAMPLE_CAPTURES


@pytest.fixture(scope="module")
def one_pass():
    """The plain-Python decoder over each whole file: the reference."""
    rows = defaultdict(list)
    for capture in resolve_captures(SAMPLES):
        for kind, row in decode_capture(capture.parts[0].path, capture.capture_id, segments=True):
            rows[kind].append(row)
    return rows


def as_python(row: dict, schema: StructType) -> dict:
    """Decoder rows carry timestamps as epoch microseconds (Arrow takes those); Python rows need datetimes."""
    out = dict(row)
    for field in schema.fields:
        if isinstance(field.dataType, TimestampType) and isinstance(out.get(field.name), int):
            out[field.name] = datetime.fromtimestamp(0, UTC) + timedelta(microseconds=out[field.name])
    return out


@pytest.mark.parametrize("range_bytes", [16_384, 1 << 26])
def test_parallel_decode_equals_one_pass(spark, one_pass, range_bytes):
    captures = resolve_captures(SAMPLES)
    if range_bytes == 16_384:
        assert len(plan_ranges(captures, range_bytes)) > 30  # many ranges: connections span them
    tables, persisted = decode_tables(spark, captures, (5672,), range_bytes=range_bytes, connection_partitions=3)
    try:
        for kind, schema in BRONZE_SCHEMAS.items():
            expected = spark.createDataFrame([as_python(row, schema) for row in one_pass[kind]], schema)
            assertDataFrameEqual(tables[kind], expected)
    finally:
        for df in persisted:
            df.unpersist()


@pytest.mark.parametrize("cores, expected", [(2, 4), (3, 3)])
def test_a_capture_larger_than_a_range_is_cut_into_even_ranges_a_multiple_of_the_cores(cores, expected):
    capture = resolve_captures([SAMPLES[0]])[0]
    range_bytes = capture.size // 3 + 1  # three ranges of at most this, left to themselves

    ranges = plan_ranges([capture], range_bytes, cores)

    sizes = [r.end - r.start for r in ranges]
    assert len(ranges) == expected  # the fewest ranges of about range_bytes in a multiple of the cores
    assert max(sizes) < 1.2 * min(sizes)
    assert [r.start for r in ranges[1:]] == [r.end for r in ranges[:-1]] and ranges[-1].end == capture.size
    assert [r.range_index for r in ranges] == list(range(len(ranges)))


def test_a_capture_within_one_range_stays_one_range_whatever_the_cores():
    capture = resolve_captures([SAMPLES[0]])[0]
    assert len(plan_ranges([capture], capture.size, cores=2)) == 1


def test_truncated_capture_keeps_what_was_read_and_quarantines_the_rest(spark, tmp_path):
    whole = SAMPLES[0]
    data = whole.read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[: len(data) // 2])
    captures = resolve_captures([cut])
    tables, persisted = decode_tables(spark, captures, (5672,), range_bytes=16_384)
    try:
        [capture] = tables["captures"].collect()
        assert capture.status.startswith("damaged: record at byte ")
        [damage] = tables["quarantine"].filter("reason LIKE 'capture file damaged%'").collect()
        # The unread tail runs from the cut record to the end of the file.
        assert damage.stream_offset + damage.byte_count == len(data) // 2
        assert 0 < damage.byte_count < 70_000
        assert tables["frames"].count() > 500
    finally:
        for df in persisted:
            df.unpersist()


def test_a_record_of_impossible_length_is_read_past_as_by_the_one_pass_decoder(spark, tmp_path):
    # Issue 12: a record header claiming 0x7FFFFFF0 captured bytes in the middle of a real capture.
    whole = SAMPLES[0]
    data = whole.read_bytes()
    at, pos = None, 24
    while pos < len(data) // 2:  # the first record boundary past the middle of the file
        pos += 16 + int.from_bytes(data[pos + 8 : pos + 12], "little")
        at = pos
    assert whole.suffix == ".pcap" and data[:4] == b"\xd4\xc3\xb2\xa1" and at is not None
    bogus = data[at : at + 8] + (0x7FFFFFF0).to_bytes(4, "little") * 2 + b"\xa5" * 40
    damaged = tmp_path / "impossible.pcap"
    damaged.write_bytes(data[:at] + bogus + data[at:])
    reference = defaultdict(list)
    for kind, row in decode_capture(damaged, "x"):
        reference[kind].append(row)
    captures = resolve_captures([damaged])
    tables, persisted = decode_tables(spark, captures, (5672,), range_bytes=16_384)
    try:
        [capture] = tables["captures"].collect()
        reason = f"record at byte {at}: impossible captured length {0x7FFFFFF0}; {len(bogus)} bytes skipped to the next record"
        assert capture.status == reference["captures"][0]["status"] == f"damaged: {reason}"
        [damage] = tables["quarantine"].filter("reason LIKE 'capture file damaged%'").collect()
        assert (damage.stream_offset, damage.byte_count, damage.reason) == (
            at,
            len(bogus),
            f"capture file damaged: {reason}",
        )
        # Every record after the damage is read: the frames of the undamaged file, all of them.
        clean_frames = sum(1 for kind, _row in decode_capture(whole, "w") if kind == "frames")
        assert tables["frames"].count() == len(reference["frames"]) == clean_frames
    finally:
        for df in persisted:
            df.unpersist()


def test_the_read_plan_puts_range_i_alone_in_partition_i(spark):
    """One range per read task, in plan order, as parallelize with a slice per range gave it (and
    as a Spark Connect session, which has no parallelize, gets it too)."""
    import pyspark.sql.functions as F

    from amqpscope.jobs.stages.decode import _read_plan

    rows = [
        (f"/c/{i}.pcap", f"cap{i % 2}", i, 1000 * i, 1000 * (i + 1), "" if i < 4 else f"{i}.pcap: ") for i in range(7)
    ]
    plan = _read_plan(spark, rows)
    assert plan.rdd.getNumPartitions() == len(rows)
    got = plan.select(F.spark_partition_id().alias("task"), "*").collect()
    assert [(r.task, (r.path, r.capture_id, r.range_index, r.start, r.end, r.part_label)) for r in got] == list(
        enumerate(rows)
    )
    assert plan.schema.simpleString() == (
        "struct<path:string,capture_id:string,range_index:int,start:bigint,end:bigint,part_label:string>"
    )
    assert _read_plan(spark, []).collect() == []
