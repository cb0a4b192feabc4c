"""``amqpscope ingest LANDING_DIR``: only new captures are decoded; bad files are recorded, not fatal."""

from __future__ import annotations

import shutil
from pathlib import Path

from pyspark.sql import functions as F

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.landing import ingest_landing
from amqpscope.schemas.bronze import BRONZE_SCHEMAS

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def counts(spark, lake: Path) -> dict[str, int]:
    store = Lake(spark, lake)
    return {name: store.read(name).count() for name in BRONZE_SCHEMAS}


def test_incremental_ingestion(spark, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    config = AnalyzeConfig(lake=lake)
    first, second = SAMPLES / "amqp091-qos-confirms.pcap", SAMPLES / "amqp10-credit.pcap"
    shutil.copy(first, landing / "a.pcap")
    shutil.copy(first, landing / "a-copy.pcap")  # the same bytes under another name: one capture
    (landing / "notes.pcap").write_text("not a capture")
    (landing / "b.pcap.part").write_bytes(second.read_bytes())  # still being written: not picked up

    run1 = ingest_landing(spark, landing, config)
    assert run1.ingested == (capture_id(first),)
    assert run1.failed == (("notes.pcap", "not a pcap or pcapng file"),)
    after1 = counts(spark, lake)
    assert after1["frames"] > 1000
    store = Lake(spark, lake)
    statuses = {r.file_name: r.status for r in store.read("captures").collect()}
    assert statuses["notes.pcap"] == "failed: not a pcap or pcapng file"
    # The first name in name order stands for the bytes it shares with its copy.
    assert statuses.get("a-copy.pcap") == "ok" and "a.pcap" not in statuses
    bad = store.read("quarantine").filter(F.col("reason").startswith("capture unreadable")).collect()
    assert [(r.byte_count) for r in bad] == [len("not a capture")]

    run2 = ingest_landing(spark, landing, config)  # nothing new: nothing changes
    assert run2.ingested == () and run2.failed == ()
    assert counts(spark, lake) == after1

    (landing / "b.pcap.part").rename(landing / "b.pcap")
    run3 = ingest_landing(spark, landing, config)
    assert run3.ingested == (capture_id(second),)
    after3 = counts(spark, lake)
    assert after3["frames"] > after1["frames"]
    assert store.read("frames").filter(F.col("capture_id") == capture_id(first)).count() == after1["frames"]
