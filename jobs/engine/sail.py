"""Sail, the embedded engine: a Spark Connect server in this process (``pysail``, a Rust engine),
and a Spark Connect session on it, without a JVM.

``engine_session("sail")`` is what an ``--engine sail`` run opens: the server starts in about a
second on a free loopback port and stops with the session. The session is a plain PySpark Connect
session (``pyspark.sql.connect``). The pipelines give the same rows on it as on classic Spark
(tests/test_same_rows.py) where they avoid what Sail does otherwise: grouping sets
(pipelines/throughput.py), checkpoints with a storage level or of types Sail states but does not
return (pipelines/partitioning.py), observed metrics (expectations/suite.py), decimal literals
beside doubles (expectations/bottleneck_rules.py); pipelines/engine.py names the settings this
module sets for that. The lake's tables are written by the delta-rs backend (jobs.lake.lake): Sail
writes the Parquet files of a table's captures into a staging folder and the project's commit
layer commits them (jobs.lake.delta_commit), so a commit checks conflicts on Sail as on classic Spark.
Tables are read as their snapshot's files, one scan per capture, not through Sail's Delta reader
(docs/ARCHITECTURE.md, "Sail, the embedded engine").

PySpark holds one kind of session per process: its Column and function classes follow a
process-wide switch that the first Connect session sets. A Sail session cannot be opened beside a
classic one (``start_sail`` refuses), and a classic one only after Sail's is stopped.

Sail: https://github.com/lakehq/sail (Apache-2.0), the ``pysail`` package on PyPI.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from amqpscope.conf.settings import ENGINE_CHOICES
from amqpscope.jobs.engine.session import build_session, is_connect
from amqpscope.pipelines import engine

log = logging.getLogger("amqpscope.jobs")

LOOPBACK = "127.0.0.1"

# What the session is told at the start (jobs/engine/session.py sets the same on classic Spark): the lake's
# Parquet timestamps as delta-rs reads them, times in UTC. Sail takes what it does not use.
SAIL_CONF = {
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    # What Sail does its own way (pipelines.engine): checkpoints, no observed metrics.
    **engine.SAIL,
}
# Where Sail keeps checkpoints (its setting execution.checkpoint.path, read from the environment
# when the server starts): a folder of the engine's own, removed when it stops.
CHECKPOINT_PATH = "SAIL_EXECUTION__CHECKPOINT__PATH"
# PySpark's switch to its Connect classes, set in the environment by a first Connect session.
CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


# Sail logs through Rust's env_logger: its INFO lines (server start, each session) are the engine's
# own, shown with -v only (RUST_LOG chosen by the user wins).
RUST_LOG = "RUST_LOG"


def sail_available() -> bool:
    """True when ``pysail`` is installed (the ``sail`` extra)."""
    try:
        import pysail.spark  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class SailEngine:
    """A running Sail server and the Connect session on it; ``stop`` ends both."""

    server: object  # pysail.spark.SparkConnectServer
    session: SparkSession
    checkpoints: str | None = None  # the checkpoint folder made for it (removed by stop)
    clear_connect_mode: bool = False  # PySpark's Connect switch was set by this engine's session

    @property
    def url(self) -> str:
        ip, port = self.server.listening_address  # type: ignore[attr-defined]
        return f"sc://{ip}:{port}"

    def stop(self) -> None:
        _STARTED.discard(self.session.session_id)
        try:
            self.session.stop()
        finally:
            self.server.stop()  # type: ignore[attr-defined]
            if self.checkpoints is not None:
                shutil.rmtree(self.checkpoints, ignore_errors=True)
            if self.clear_connect_mode:  # a classic session may be built after it
                os.environ.pop(CONNECT_MODE, None)


def start_sail(conf: Mapping[str, str] | None = None, ip: str = LOOPBACK, verbose: bool = False) -> SailEngine:
    """Start a Sail server on a free port of ``ip`` (loopback) and open a Connect session on it;
    the engine's own log lines only with ``verbose`` (its errors always)."""
    os.environ.setdefault(RUST_LOG, "info" if verbose else "error")
    try:
        from pysail.spark import SparkConnectServer
    except ImportError as exc:
        raise RuntimeError("the sail engine needs pysail: pip install 'amqpscope[sail]'") from exc
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        # PySpark picks the Column and function classes by a process-wide switch (SPARK_CONNECT_MODE_ENABLED,
        # set by the first Connect session): a classic and a Connect session cannot be used side by side.
        raise RuntimeError("a classic Spark session is running in this process: stop it before starting Sail")
    connect_mode_before = CONNECT_MODE in os.environ
    checkpoints = None
    if CHECKPOINT_PATH not in os.environ:
        checkpoints = tempfile.mkdtemp(prefix="amqpscope-sail-checkpoints-")
        os.environ[CHECKPOINT_PATH] = Path(checkpoints).as_uri()
    try:
        server = SparkConnectServer(ip, 0)
        server.start(background=True)
    finally:
        if checkpoints is not None:  # read at the start: another engine makes its own
            del os.environ[CHECKPOINT_PATH]
    try:
        host, port = server.listening_address
        builder = SparkSession.builder.remote(f"sc://{host}:{port}")
        for key, value in {**SAIL_CONF, **(conf or {})}.items():
            builder = builder.config(key, value)
        session = builder.create()  # a session of its own, not one already open on another server
    except BaseException:
        server.stop()
        if checkpoints is not None:
            shutil.rmtree(checkpoints, ignore_errors=True)
        raise
    _STARTED.add(session.session_id)
    log.debug("sail engine listening on %s:%s", host, port)
    return SailEngine(server, session, checkpoints, clear_connect_mode=not connect_mode_before)


@contextmanager
def sail_session(conf: Mapping[str, str] | None = None, verbose: bool = False) -> Iterator[SparkSession]:
    """A Connect session on a Sail server of its own, both stopped at the end of the block."""
    engine = start_sail(conf, verbose=verbose)
    try:
        yield engine.session
    finally:
        engine.stop()


@contextmanager
def engine_session(
    engine: str, app_name: str = "amqpscope", conf: Mapping[str, str] | None = None, verbose: bool = False
) -> Iterator[SparkSession]:
    """The hook for ``--engine spark|sail``: a session on ``engine`` for the block, stopped after it.
    ``spark`` is today's local session (jobs.engine.session.build_session, on its default master); ``sail``
    the embedded engine. The Spark settings in ``conf`` go to either (Sail takes what it uses)."""
    if engine not in ENGINE_CHOICES:
        raise ValueError(f"engine {engine!r} is not one of {', '.join(ENGINE_CHOICES)}")
    if engine == "sail":
        with sail_session(conf, verbose=verbose) as session:
            yield session
        return
    session = build_session(app_name=app_name, conf=dict(conf or {}), remember_py4j_lookups=True)
    try:
        yield session
    finally:
        session.stop()


def is_sail(spark: SparkSession) -> bool:
    """True for a session on a Sail server this process started (``start_sail``)."""
    return getattr(spark, "session_id", None) in _STARTED


# What the JSON summary and the report name as the engine that ran (``engine_of``).
ENGINES = ("classic", "connect", "sail")


def engine_of(spark: SparkSession) -> str:
    """The engine a session runs on, as the JSON summary and the report name it (ENGINES)."""
    if is_sail(spark):
        return "sail"
    return "connect" if is_connect(spark) else "classic"


# The Connect sessions opened on a Sail server by start_sail, by session id.
_STARTED: set[str] = set()
