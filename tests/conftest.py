"""Shared fixtures: one SparkSession for the whole run (it takes ~10 s to start)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.analyze import analyze
from amqpscope.jobs.class_archive import ENVIRONMENT as CLASS_ARCHIVE_ENVIRONMENT
from amqpscope.jobs.lake import Lake
from amqpscope.jobs.session import build_session
from tests.paths import BOTTLENECK_SCENARIOS, FLOW_SAMPLES, HEALTHY_SAMPLES, SAMPLE_CAPTURES


def pytest_configure(config):
    # The JVM class archive the jobs' sessions write (jobs.class_archive): the run's own, not the
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
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def sail_spark():
    """A Spark Connect session on Sail, the embedded engine (jobs.sail), for the whole run: its
    server starts in about a second, in this process, and stops at the end. PySpark cannot hold it
    beside the classic ``spark`` session in one process: a test that compares the two runs Sail in
    a process of its own (tests.engine_derive)."""
    from amqpscope.jobs.sail import sail_available, start_sail

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


@pytest.fixture(scope="session")
def bottleneck_lake(spark, tmp_path_factory):
    """The bottleneck scenarios, the client-side flow samples and the healthy samples analysed once
    into one lake (tests/test_bottleneck_scenarios.py and tests/test_wireshark_filters.py read it):
    its root, the run's result, the diagnosis rows by capture and the findings in rank order."""
    root = tmp_path_factory.mktemp("bottleneck-lake")
    config = AnalyzeConfig(lake=root, report=root / "report.html", data_docs=root / "data_docs")
    result = analyze(spark, [str(c) for c in (*BOTTLENECK_SCENARIOS, *FLOW_SAMPLES, *HEALTHY_SAMPLES)], config)
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
