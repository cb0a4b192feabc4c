"""The driver JVM's class archive (jobs.engine.class_archive): named for the JVM and jars, written by the
first job's JVM as it exits, mapped by the next, and cleaned up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from amqpscope.jobs.engine import class_archive
from amqpscope.jobs.engine.class_archive import ENVIRONMENT, ClassArchive, archive_for_this_jvm, prune
from amqpscope.jobs.engine.session import collector_options, driver_java_options

DAY_S = 86400


@pytest.fixture
def jars(tmp_path, monkeypatch):
    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / "spark-core.jar").write_bytes(b"core")
    monkeypatch.setattr(class_archive, "_jars", lambda: folder)
    monkeypatch.delenv(ENVIRONMENT, raising=False)
    return folder


def test_the_archive_is_named_for_the_jars_it_holds(tmp_path, jars):
    first = archive_for_this_jvm(tmp_path / "cache")
    assert first == archive_for_this_jvm(tmp_path / "cache")
    assert first.path.parent == tmp_path / "cache" and first.path.suffix == ".jsa"
    (jars / "spark-sql.jar").write_bytes(b"sql")  # another Spark: another archive
    assert archive_for_this_jvm(tmp_path / "cache").path != first.path


@pytest.mark.parametrize("setting", ["off", "0", "OFF"])
def test_the_setting_turns_the_archive_off(tmp_path, jars, monkeypatch, setting):
    monkeypatch.setenv(ENVIRONMENT, setting)
    assert archive_for_this_jvm() is None


def test_the_setting_names_the_directory(tmp_path, jars, monkeypatch):
    monkeypatch.setenv(ENVIRONMENT, str(tmp_path / "elsewhere"))
    assert archive_for_this_jvm().path.parent == tmp_path / "elsewhere"


def test_options_write_an_archive_then_map_it(tmp_path):
    archive = ClassArchive(tmp_path / "cache" / "spark-x.jsa", Path("java"))
    assert archive.java_options(create=False) is None
    writing = archive.java_options(create=True)
    assert f"-XX:ArchiveClassesAtExit={archive.pending()}" in writing.split()
    assert archive.pending().parent.is_dir() and not archive.exists
    archive.path.write_bytes(b"classes")
    assert f"-XX:SharedArchiveFile={archive.path}" in archive.java_options(create=True).split()


@pytest.mark.parametrize("folder", ["with space", "with'quote", 'with"quote'])
def test_no_archive_where_spark_would_split_the_option(tmp_path, folder):
    archive = ClassArchive(tmp_path / folder / "spark-x.jsa", Path("java"))
    assert archive.java_options(create=True) is None
    archive.path.parent.mkdir()
    archive.path.write_bytes(b"classes")
    assert archive.java_options(create=True) is None


def test_prune_keeps_what_is_used_or_being_written(tmp_path):
    kept = tmp_path / "spark-new.jsa"
    recent = tmp_path / "spark-recent.jsa"
    old = tmp_path / "spark-old.jsa"
    for path in (kept, recent, old):
        path.write_bytes(b"x")
    long_ago = time.time() - 40 * DAY_S
    os.utime(old, (long_ago, long_ago))
    os.utime(kept, (long_ago, long_ago))
    live = tmp_path / f"spark-new.jsa.{os.getpid()}.part"
    dead_process = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_process.wait()
    dead = tmp_path / f"spark-new.jsa.{dead_process.pid}.part"
    for path in (live, dead):
        path.write_bytes(b"x")
    prune(tmp_path, keep=kept)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([kept.name, recent.name, live.name])


@pytest.mark.parametrize(
    "own, options, collector",
    [
        ("", "-XX:+UseParallelGC", ["-XX:+UseParallelGC"]),
        ("  -Xshare:on ", "-Xshare:on -XX:+UseParallelGC", ["-XX:+UseParallelGC"]),
        ("-XX:+UseGCOverheadLimit", "-XX:+UseGCOverheadLimit -XX:+UseParallelGC", ["-XX:+UseParallelGC"]),
        ("-XX:+UseSerialGC -Dx=1", "-XX:+UseSerialGC -Dx=1", ["-XX:+UseSerialGC"]),
        ("-XX:+UseG1GC", "-XX:+UseG1GC", ["-XX:+UseG1GC"]),
    ],
)
def test_the_parallel_collector_unless_the_user_chooses_one(own, options, collector):
    assert driver_java_options(own) == options
    assert driver_java_options(own, "-XX:SharedArchiveFile=/a.jsa") == f"{options} -XX:SharedArchiveFile=/a.jsa"
    assert collector_options(own) == collector


def test_the_suites_jvm_runs_the_parallel_collector(spark):
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    assert sorted(bean.getName() for bean in beans) == ["PS MarkSweep", "PS Scavenge"]


_JOB = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from amqpscope.conf.settings import AnalyzeConfig
    from amqpscope.jobs.stages.stages import job_session
    config = AnalyzeConfig(lake=Path(sys.argv[1]), spark_conf=json.loads(sys.argv[2]))
    with job_session(config, "amqpscope-class-archive-test") as spark:
        print(spark.range(100).selectExpr("sum(id)").first()[0])
        print(spark.sparkContext._jvm.System.getProperty("java.class.path"))
        beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
        print(",".join(sorted(bean.getName() for bean in beans)))
""")


def _job(directory: Path, lake: Path, spark_conf: dict[str, str]) -> tuple[str, str, str]:
    """The job's answer (4950), its JVM's class path and its collectors' names."""
    done = subprocess.run(
        [sys.executable, "-c", _JOB, str(lake), json.dumps(spark_conf)],
        env={**os.environ, ENVIRONMENT: str(directory)},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=lake.parent,
    )  # where a crashing JVM leaves its hs_err file
    assert done.returncode == 0, done.stderr[-3000:]
    answer, class_path, collectors = done.stdout.splitlines()[-3:]
    return answer, class_path, collectors


@pytest.mark.slow  # three JVMs started, one dumping its class archive: JVM tuning, not rows
def test_a_job_writes_the_archive_and_the_next_job_maps_it(tmp_path):
    directory = tmp_path / "cache"
    answer, class_path, collectors = _job(directory, tmp_path / "lake", {})
    assert (answer, collectors) == ("4950", "PS MarkSweep,PS Scavenge")
    written = list(directory.iterdir())
    assert len(written) == 1 and written[0].suffix == ".jsa" and written[0].stat().st_size > 1_000_000
    archive = written[0]
    inode = archive.stat().st_ino
    # -Xshare:on: a JVM that cannot map the archive refuses to start (and the job would drop the
    # archive to start without it), so this passes only if its JVM used the archive as it was.
    assert _job(directory, tmp_path / "lake", {"spark.driver.extraJavaOptions": "-Xshare:on"})[0] == "4950"
    assert [(p, p.stat().st_ino) for p in directory.iterdir()] == [(archive, inode)]

    # An archive cut short crashes HotSpot 17 as it maps it: such an archive is never put in place.
    java = archive_for_this_jvm(directory).java
    for kept, size in ((True, archive.stat().st_size), (False, 5_000_000)):
        other = ClassArchive(tmp_path / f"other-{kept}" / archive.name, java)
        other.java_options(create=True)
        other.pending().write_bytes(archive.read_bytes()[:size])
        assert other.finish(class_path) is kept
        assert [p.name for p in other.path.parent.iterdir()] == ([archive.name] if kept else [])

    # Damaged after it was put in place: the job starts its JVM without it, and drops it; the
    # user's own options (here a collector) are kept.
    os.chmod(archive, 0o600)
    archive.write_bytes(archive.read_bytes()[:5_000_000])
    answer, _, collectors = _job(directory, tmp_path / "lake", {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"})
    assert (answer, collectors) == ("4950", "Copy,MarkSweepCompact")
    assert list(directory.iterdir()) == []
