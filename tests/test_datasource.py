"""``format("amqp")``: the samples' frames through the Spark data source, batch and streaming,
equal the reference decode that ``ingest`` is checked against; a second availableNow run adds nothing; a
file that is not a capture is recorded, not fatal; the stream's offset stays one window of names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from amqpscope import register
from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.datasource import AmqpDataSource
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from tests.test_parallel_ingest import as_python

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
FIRST, SECOND = SAMPLES / "amqp10-credit.pcap", SAMPLES / "amqp091-qos-confirms.pcap"


def reference(spark, table: str, *captures: Path):
    """The plain-Python decode of each whole file (what the parallel ingest is checked against)."""
    schema = BRONZE_SCHEMAS[table]
    rows = [
        as_python(row, schema)
        for c in captures
        for kind, row in decode_capture(c, capture_id(c), segments=True)
        if kind == table
    ]
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


def test_tls_keylog_option_decrypts_where_the_tasks_run(amqp):
    """The option carries the key log's path; each task reads it (no secret in the query plan)."""
    capture = SAMPLES / "tls" / "amqp091-qos-confirms-tls13-aes256gcm.pcap"
    keylog = capture.with_suffix(".keylog")
    reader = amqp.read.format("amqp").option("tls_keylog", str(keylog))
    frames = reader.load(str(capture))
    want = [row for kind, row in decode_capture(capture, capture_id(capture), tls_keylog=[keylog]) if kind == "frames"]
    assert frames.count() == len(want) > 1000
    assert frames.filter(F.col("tls_record_number").isNull()).count() == 0
    connections = (
        amqp.read.format("amqp")
        .option("table", "connections")
        .option("tls_keylog", f'["{keylog}"]')
        .load(str(capture))
        .collect()
    )
    assert [(c.protocol, c.tls_status) for c in connections] == [("amqp-0-9-1", "decrypted")]
    without = amqp.read.format("amqp").option("table", "connections").load(str(capture)).collect()
    assert [(c.protocol, c.tls_status) for c in without] == [("tls", "tls.no_key")]


def test_unknown_table_option_is_refused(amqp):
    with pytest.raises(Exception, match="option table must be one of frames"):
        _ = amqp.read.format("amqp").option("table", "violations").load(str(FIRST)).schema


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
        query = (
            amqp.readStream.format("amqp")
            .load(str(landing))
            .writeStream.foreachBatch(store)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert query.exception() is None

    shutil.copy(FIRST, landing / FIRST.name)
    run()
    assertDataFrameEqual(lake.read("frames"), reference(amqp, "frames", FIRST))
    seen = list(batches)
    run()  # nothing new: no batch with rows, the table as it was
    assert [b for b in batches[len(seen) :] if b] == []
    assertDataFrameEqual(lake.read("frames"), reference(amqp, "frames", FIRST))
    shutil.copy(SECOND, landing / SECOND.name)
    run()
    assert [b for b in batches if b] == [[capture_id(FIRST)], [capture_id(SECOND)]]
    assert (
        lake.read("frames").filter(F.col("capture_id") == capture_id(SECOND)).count()
        == reference(amqp, "frames", SECOND).count()
    )


def run_stream(spark, landing: Path, checkpoint: Path, table: str, store) -> None:
    """One availableNow run of ``table``'s stream over ``landing``; it must end without an error."""
    query = (
        spark.readStream.format("amqp")
        .option("table", table)
        .load(str(landing))
        .writeStream.foreachBatch(store)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert query.exception() is None


def test_stream_records_a_file_that_is_not_a_capture_and_goes_on(amqp, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    shutil.copy(FIRST, landing / FIRST.name)
    junk = landing / "notes.txt"
    junk.write_text("not a capture\n" * 10)
    lake = Lake(amqp, tmp_path / "lake")
    read: dict[str, list[list[str]]] = {"captures": [], "frames": [], "quarantine": []}

    def store_for(table: str):
        def store(df, batch_id: int) -> None:
            ids = sorted(r.capture_id for r in df.select("capture_id").distinct().collect())
            read[table].append(ids)
            if ids:
                lake.write(df, table, replace_capture_ids=ids)

        return store

    for _ in range(2):  # the second run, on the same checkpoints, reads nothing again and fails on nothing
        for table in read:
            run_stream(amqp, landing, tmp_path / f"checkpoint-{table}", table, store_for(table))

    good, bad = capture_id(FIRST), capture_id(junk)
    assert [b for b in read["captures"] if b] == [sorted([good, bad])]
    assert [b for b in read["frames"] if b] == [[good]]
    quarantined_good = [good] if reference(amqp, "quarantine", FIRST).count() else []
    assert [b for b in read["quarantine"] if b] == [sorted([bad, *quarantined_good])]
    captures = {r.capture_id: r for r in lake.read("captures").collect()}
    assert captures[good].status == "ok" and captures[good].packets > 0
    assert captures[bad].status == "failed: not a pcap or pcapng file"
    assert (captures[bad].file_name, captures[bad].file_size) == ("notes.txt", junk.stat().st_size)
    [quarantined] = lake.read("quarantine").filter(F.col("capture_id") == bad).collect()
    assert (quarantined.byte_count, quarantined.reason) == (
        junk.stat().st_size,
        "capture unreadable: not a pcap or pcapng file",
    )
    assertDataFrameEqual(lake.read("frames"), reference(amqp, "frames", FIRST))


def test_stream_offset_names_only_the_files_of_its_window(tmp_path):
    """The offset holds the newest modification time and the names modified within the lookback
    before it; each file is in exactly one batch, also one that lands with an older time inside the
    window, and a batch run again from the same offsets reads the same files."""
    from amqpscope.jobs.stages.datasource import _StreamReader

    landing = tmp_path / "landing"
    landing.mkdir()
    hour = 3600

    def land(name: str, age_seconds: int) -> Path:
        path = landing / name
        shutil.copy(FIRST, path)
        when = 2_000_000_000 - age_seconds
        os.utime(path, (when, when))
        return path

    reader = _StreamReader({"path": str(landing), "lookback": str(hour)}, BRONZE_SCHEMAS["frames"])
    names = lambda parts: [Path(p.path).name for p in parts]  # noqa: E731
    for age in (30 * hour, 20 * hour, 10 * hour, 2 * hour):
        land(f"old-{age // hour}h.pcap", age)
    land("new.pcap", 0)
    first = reader.latestOffset()
    assert first == {"newest": 2_000_000_000 * 10**9, "recent": [str(landing / "new.pcap")]}
    assert names(reader.partitions(reader.initialOffset(), first)) == [
        "new.pcap",
        "old-10h.pcap",
        "old-20h.pcap",
        "old-2h.pcap",
        "old-30h.pcap",
    ]
    assert reader.latestOffset() == first  # nothing new: the same offset, no batch

    land("late.pcap", 600)  # older than the newest, inside the window
    land("newer.pcap", -60)
    second = reader.latestOffset()
    assert second["newest"] == (2_000_000_000 + 60) * 10**9
    assert sorted(Path(p).name for p in second["recent"]) == ["late.pcap", "new.pcap", "newer.pcap"]
    assert names(reader.partitions(first, second)) == ["late.pcap", "newer.pcap"]
    assert names(reader.partitions(first, second)) == ["late.pcap", "newer.pcap"]  # replayed: the same
    land("arrived-after.pcap", -30)  # after the offset was taken: not in this batch, in the next
    assert names(reader.partitions(first, second)) == ["late.pcap", "newer.pcap"]
    assert names(reader.partitions(second, reader.latestOffset())) == ["arrived-after.pcap"]
    # An offset of an older amqpscope, every name seen, still covers exactly those files.
    legacy = {"files": [str(landing / "new.pcap")]}
    assert "new.pcap" not in names(reader.partitions(legacy, second))


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Session:
    """What ``register`` reads and sets of a classic session: its context's Python and its settings."""

    def __init__(self, conf: dict[str, str]) -> None:
        self._sc = type("Context", (), {"pythonExec": "python3"})()
        self.conf = _Conf(conf)
        self.registered: list[type] = []
        self.dataSource = type("Registry", (), {"register": lambda _, source: self.registered.append(source)})()


@pytest.mark.parametrize(
    ("environment", "conf", "expected"),
    [
        ({}, {}, sys.executable),  # nobody chose: the driver's interpreter
        ({"PYSPARK_PYTHON": "/opt/py/bin/python"}, {}, "python3"),  # chosen, and already applied by PySpark
        ({}, {"spark.pyspark.python": "/opt/py/bin/python"}, "/opt/py/bin/python"),  # chosen, applied here
    ],
)
def test_register_gives_the_workers_the_drivers_python_unless_one_was_chosen(monkeypatch, environment, conf, expected):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    session = _Session(conf)
    register(session)
    assert session._sc.pythonExec == expected
    assert session.registered == [AmqpDataSource]


def test_the_source_reads_from_the_venvs_python_without_activating_it(tmp_path):
    """The venv's interpreter run by its path, with a PATH whose ``python3`` cannot import amqpscope
    and no PYSPARK_PYTHON: PySpark alone would start the workers with that ``python3``."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        **{k: v for k, v in os.environ.items() if k in ("JAVA_HOME", "AMQPSCOPE_PURE_PYTHON")},
    }
    path_python = subprocess.run(["python3", "-c", "import amqpscope"], env=env, capture_output=True, check=False)
    assert path_python.returncode != 0, "the PATH's python3 imports amqpscope: the test would prove nothing"
    script = (
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "import amqpscope\n"
        "spark = (SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')\n"
        "         .config('spark.python.authenticate.socketTimeout', '180s').getOrCreate())\n"
        "amqpscope.register(spark)\n"
        "print('frames', spark.read.format('amqp').load(sys.argv[1]).count())\n"
        "spark.stop()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(FIRST)], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = sum(1 for kind, _ in decode_capture(FIRST, capture_id(FIRST)) if kind == "frames")
    assert done.stdout.splitlines()[-1] == f"frames {expected}"
