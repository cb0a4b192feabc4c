"""Shared fixtures: one SparkSession for the whole run (it takes ~10 s to start)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.engine.class_archive import ENVIRONMENT as CLASS_ARCHIVE_ENVIRONMENT
from amqpscope.jobs.engine.session import build_session
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.analyze import analyze
from tests.paths import BOTTLENECK_SCENARIOS, FLOW_SAMPLES, HEALTHY_SAMPLES, SAMPLE_CAPTURES


def pytest_configure(config):
    # The JVM class archive the jobs' sessions write (jobs.engine.class_archive): the run's own, not the
    # user's cache. The JVMs of the commands the tests start in subprocesses share it.
    config.class_archive_dir = tempfile.mkdtemp(prefix="amqpscope-class-archive-")
    os.environ[CLASS_ARCHIVE_ENVIRONMENT] = config.class_archive_dir


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "class_archive_dir", ""), ignore_errors=True)


@pytest.fixture(scope="session")
def spark():
    # Spark waits 15 s by default for a Python process it starts (a streaming source's runner) to
    # connect back; on a loaded test machine that start alone can take longer.
    # One session serves the whole suite, the 21 MB of bottleneck scenarios included: with Spark's
    # 1 GiB default driver heap a full run ran out of heap (java.lang.OutOfMemoryError) after them.
    session = build_session(
        master="local[2]",
        app_name="amqpscope-tests",
        conf={"spark.python.authenticate.socketTimeout": "180s", "spark.driver.memory": "4g"},
        remember_py4j_lookups=True,  # as the jobs' sessions
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sail_spark():
    """A Spark Connect session on Sail, the embedded engine (jobs.engine.sail), for the whole run: its
    server starts in about a second, in this process, and stops at the end. PySpark cannot hold it
    beside the classic ``spark`` session in one process: a test that compares the two runs Sail in
    a process of its own (tests.engine_derive)."""
    from amqpscope.jobs.engine.sail import sail_available, start_sail

    if not sail_available():
        pytest.fail("pysail is not installed: pip install -e '.[sail]'")
    engine = start_sail()
    yield engine.session
    engine.stop()


@pytest.fixture(scope="session")
def samples_lake(spark, tmp_path_factory):
    """The three bundled samples (samples/*.pcap, *.pcapng) analysed once into one lake, shared by
    the modules that check that lake; they may re-run analyze on it (re-runs change nothing).
    Returns the lake's root, the config and the run's result."""
    root = tmp_path_factory.mktemp("samples-lake")
    config = AnalyzeConfig(lake=root, report=root / "report.html")
    return root, config, analyze(spark, [str(c) for c in SAMPLE_CAPTURES], config)


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def built_once_for_the_run(tmp_path_factory, name: str, build: Callable[[Path], object]) -> tuple[Path, object]:
    """``build(root)`` run once for the whole test run, whichever worker asks first, into a folder
    the run's workers share (pytest-xdist's workers have base folders side by side): the others
    wait for it and read what it wrote. Its result is kept pickled beside it. For a lake the tests
    only read: two workers each analysing the same 33 MB of captures took about 250 s each."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root, done = shared / name, shared / f"{name}.result.pickle"
    with _exclusive(shared / f"{name}.lock"):
        if not done.exists():
            done.write_bytes(pickle.dumps(build(root)))
        return root, pickle.loads(done.read_bytes())


@pytest.fixture(scope="session")
def bottleneck_lake(spark, tmp_path_factory):
    """The bottleneck scenarios, the client-side flow samples and the healthy samples analysed once
    for the run into one lake (tests/test_bottleneck_scenarios.py and tests/test_wireshark_filters.py
    read it, on either worker): its root, the run's result, the diagnosis rows by capture and the
    findings in rank order."""

    def build(root: Path) -> object:
        config = AnalyzeConfig(lake=root, report=root / "report.html", data_docs=root / "data_docs")
        return analyze(spark, [str(c) for c in (*BOTTLENECK_SCENARIOS, *FLOW_SAMPLES, *HEALTHY_SAMPLES)], config)

    root, result = built_once_for_the_run(tmp_path_factory, "bottleneck-lake", build)
    tables = Lake(spark, root)
    return {
        "root": root,
        "result": result,
        "diagnosis": {r.capture_id: r for r in tables.read("diagnosis").collect()},
        "bottlenecks": tables.read("bottlenecks").orderBy("capture_id", "rank").collect(),
    }


@pytest.fixture(scope="session")
def connect_spark(tmp_path_factory):
    """Spark's own Spark Connect server on local[2] (tests/connect_server.py), started once for the
    run and stopped at its end by its PID: its address (``.remote``) is what the jobs under test
    are given, as ``--remote`` or SPARK_REMOTE, in processes of their own."""
    from tests import connect_server

    server = connect_server.start(tmp_path_factory.mktemp("connect-server") / "server.log")
    yield server
    connect_server.stop(server)
