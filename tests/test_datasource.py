"""``format("amqp")``: the samples' frames through the Spark data source, batch and streaming,
equal the reference decode that ``ingest`` is checked against; a second availableNow run adds nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from amqpscope import register
from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake import Lake
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from tests.test_parallel_ingest import as_python

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
FIRST, SECOND = SAMPLES / "amqp10-credit.pcap", SAMPLES / "amqp091-qos-confirms.pcap"


def reference(spark, table: str, *captures: Path):
    """The plain-Python decode of each whole file (what the parallel ingest is checked against)."""
    schema = BRONZE_SCHEMAS[table]
    rows = [as_python(row, schema) for c in captures
            for kind, row in decode_capture(c, capture_id(c), segments=True) if kind == table]
    return spark.createDataFrame(rows, schema)


@pytest.fixture(scope="module")
def amqp(spark):
    register(spark)
    return spark


def test_batch_read_gives_the_reference_frames(amqp):
    frames = amqp.read.format("amqp").load([str(FIRST), str(SECOND)])
    assert frames.schema == BRONZE_SCHEMAS["frames"]
    assert frames.rdd.getNumPartitions() == 2  # one task a capture
    assertDataFrameEqual(frames, reference(amqp, "frames", FIRST, SECOND))
    connections = amqp.read.format("amqp").option("table", "connections").load(str(FIRST))
    assertDataFrameEqual(connections, reference(amqp, "connections", FIRST))


def test_unknown_table_option_is_refused(amqp):
    with pytest.raises(Exception, match="option table must be one of frames"):
        amqp.read.format("amqp").option("table", "violations").load(str(FIRST)).schema


def test_stream_ingests_each_new_capture_once(amqp, tmp_path):
    landing, checkpoint = tmp_path / "landing", tmp_path / "checkpoint"
    landing.mkdir()
    lake = Lake(amqp, tmp_path / "lake")
    batches = []

    def store(df, batch_id: int) -> None:
        ids = [r.capture_id for r in df.select("capture_id").distinct().collect()]
        batches.append(sorted(ids))
        if ids:
            lake.write(df, "frames", replace_capture_ids=ids)

    def run() -> None:
        query = (amqp.readStream.format("amqp").load(str(landing)).writeStream.foreachBatch(store)
                 .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        query.awaitTermination()
        assert query.exception() is None

    shutil.copy(FIRST, landing / FIRST.name)
    run()
    assertDataFrameEqual(lake.read("frames"), reference(amqp, "frames", FIRST))
    seen = list(batches)
    run()  # nothing new: no batch with rows, the table as it was
    assert [b for b in batches[len(seen):] if b] == []
    assertDataFrameEqual(lake.read("frames"), reference(amqp, "frames", FIRST))
    shutil.copy(SECOND, landing / SECOND.name)
    run()
    assert [b for b in batches if b] == [[capture_id(FIRST)], [capture_id(SECOND)]]
    assert lake.read("frames").filter(F.col("capture_id") == capture_id(SECOND)).count() == \
        reference(amqp, "frames", SECOND).count()
