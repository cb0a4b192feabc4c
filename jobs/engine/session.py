"""The one place a SparkSession is built (entry points and the tests' fixture call it)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from amqpscope.jobs.engine import py4j_lookups
from amqpscope.jobs.engine.class_archive import ClassArchive, archive_for_this_jvm

log = logging.getLogger("amqpscope.jobs")

# Spark's defaults that would make our tables unreadable or our runs slow on a laptop-sized box.
_BASE_CONF = {
    # delta-rs and every Parquet reader other than Spark expect TIMESTAMP_MICROS, not INT96.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    # Captures decode to modest row counts per capture; 200 shuffle partitions is pure overhead.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.enabled": "false",
    # Spark's console bar would interleave with amqpscope's own progress lines (jobs/stages/progress.py).
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Spark's cache writes its column batches with Java serialization, whose streams keep every
    # object written reachable until reset (default: every 100 objects, i.e. up to 100 batches of
    # 10,000 rows outside Spark's memory accounting). Reset after each: memory flat in capture size.
    "spark.serializer.objectStreamReset": "1",
    # Spark's memory pages are 8 MiB here by default (its memory pool / cores / 16, rounded up to
    # a power of two). A task whose chained window operators buffer one large partition (a queue's
    # events, in the diagnosis) then makes each operator take a whole page, push the next to spill
    # to get it back, and so on: the derive job on a stored 1 M-frame capture spilled 1.44 GB of
    # pages as 4.65 MB of files in one task (some 170 page-sized spills or more), and ran out of
    # heap reading them back (each file read opens with 2 MiB of buffers). With 2 MiB pages the
    # same job spills once a pool share is full and completes (docs/BENCHMARKS.md, "What is set":
    # 2 MiB memory pages).
    "spark.buffer.pageSize": "2m",
    # Spark keeps 100 compiled code-generated classes by default. One flow-state table's plan alone
    # needs more (link_state: 32 window operators), so each of its tasks compiled them again with
    # Janino: link_state took 3.5 s a query warm, 0.6 s with this. Bounded by entries, not by data.
    "spark.sql.codegen.cache.maxEntries": "4000",
    # PySpark 4 wraps every DataFrame and Column call to record its Python call site for error
    # messages: three to four more Py4J round trips and a walk of the Python stack a call. Building
    # the flow-state plans (about 15,000 Py4J calls) took 8.6 s with it, 4.1-6.5 s without. A failed
    # stage is named by the job itself (jobs.stages.stages.StageFailed).
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Ingest hands the frames over hash-partitioned by connection (jobs.stages.decode), and every join of
    # two tables derived from them is on the connection and more (channel, direction, frame). By
    # default Spark shuffles both sides again unless they are partitioned on all the join keys; a
    # connection's rows are never skewed enough to need that. Analyze of the sample: 174 Spark jobs
    # instead of 184, its wall time level; 0.95-0.99x at 100 k frames (docs/BENCHMARKS.md, "What is
    # set": joins that keep the partitioning).
    "spark.sql.requireAllClusterKeysForCoPartition": "false",
}


# The collector of a local driver JVM. HotSpot's default, G1, spends CPU beside the application
# (concurrent marking, remembered sets, write barriers) to keep pauses short; a batch job on a
# couple of saturated cores wants the CPU instead. Analyze of the sample: 0.907x the wall time
# with the parallel collector (docs/BENCHMARKS.md, "What is set": the parallel collector).
_COLLECTOR = "-XX:+UseParallelGC"
_CHOOSES_COLLECTOR = re.compile(r"-XX:\+Use\w*GC\b")

DEFAULT_MASTER = "local[2]"
# PySpark's own variable naming a Spark Connect server (sc://host:port, or local[N] for one it starts).
REMOTE_ENVIRONMENT = "SPARK_REMOTE"
JVM_EXIT_TIMEOUT_S = 300  # the JVM writing the class archive as it exits (about 5 s for Spark's)

# Where a JVM that build_session launched to write the class archive as it exits keeps what
# stop_session needs: the archive, and that JVM's class path and collector, which a JVM checking
# the archive must have. An attribute of the JVM's Py4J gateway, so that it goes with that JVM.
_ARCHIVE_WRITTEN = "_amqpscope_archive_written"


def driver_java_options(own: str, archive_options: str | None = None) -> str:
    """The options of a local driver JVM: the user's ``own``, the parallel collector unless they
    choose a collector, then the class archive's."""
    options = [own.strip(), "" if _CHOOSES_COLLECTOR.search(own) else _COLLECTOR, archive_options or ""]
    return " ".join(o for o in options if o)


def collector_options(own: str) -> list[str]:
    """The collector a local driver JVM with the user's options ``own`` runs."""
    return _CHOOSES_COLLECTOR.findall(own) or [_COLLECTOR]


def launched_by_spark_submit() -> bool:
    """True in a driver that spark-submit started: its JVM is up, with --master among its settings."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def resolve_remote(master: str | None, remote: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The Spark Connect server a job's session connects to: ``remote`` (``--remote``), else
    SPARK_REMOTE as PySpark reads it; None: a classic session on ``master``. A master and a remote
    together are an error, as they are to PySpark: they name two different sessions."""
    chosen = remote if remote is not None else environ.get(REMOTE_ENVIRONMENT) or None
    if chosen is not None and not chosen:
        raise ValueError("remote must name a Spark Connect server, e.g. sc://host:15002 or local[2]")
    if chosen is not None and master is not None:
        origin = "--remote" if remote is not None else REMOTE_ENVIRONMENT
        raise ValueError(f"a Spark master ({master}) and {origin} ({chosen}) name two sessions: give one")
    if chosen is not None and not chosen.startswith(("sc://", "local")):
        raise ValueError(f"remote must be sc://host[:port][/;param=value...] or local[N], not {chosen!r}")
    return chosen


def build_session(
    master: str | None = DEFAULT_MASTER,
    app_name: str = "amqpscope",
    conf: dict[str, str] | None = None,
    write_class_archive: bool = False,
    remote: str | None = None,
    remember_py4j_lookups: bool = False,
) -> SparkSession:
    """Build (or reuse) the SparkSession for an amqpscope job: a Spark Connect session on
    ``remote`` (sc://host:port, or local[N]: a Connect server PySpark starts in this process),
    else a classic one on ``master``; None: the master spark-submit was given, else local[2].

    A classic JVM this starts maps the class archive of earlier runs (``jobs.engine.class_archive``); with
    ``write_class_archive`` and no archive yet, it writes one when it exits: stop such a session
    with ``stop_session``, which ends the JVM and puts the archive in place. A JVM this starts
    writes its own output (log4j, the JVM's warnings) to ``engine_log_path()`` unless amqpscope
    logs at INFO (-v): a run's stderr holds amqpscope's lines only.

    ``remember_py4j_lookups`` (the jobs' sessions ask for it: ``jobs.stages.stages.job_session``) makes
    Py4J remember its class and method lookups from then on, in the whole process
    (``jobs.engine.py4j_lookups``): a third fewer Py4J round trips while plans are built."""
    if remote is not None:
        return _connect_session(remote, app_name, {**_BASE_CONF, **(conf or {})})
    if remember_py4j_lookups:
        py4j_lookups.install()
    if master is None and not launched_by_spark_submit():
        master = DEFAULT_MASTER
    # Executors must run the interpreter that has amqpscope installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # pandas-on-Spark (used by pyspark.testing) asks for this on both driver and executors.
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, no interface guessing
    plain = settings = {**_BASE_CONF, **(conf or {})}
    mapped = writing = None
    own = settings.get("spark.driver.extraJavaOptions", "")
    if master is not None and master.startswith("local") and SparkContext._gateway is None:
        # A JVM is about to start: with our collector, and the class archive's options.
        plain = settings = {**settings, "spark.driver.extraJavaOptions": driver_java_options(own)}
        archive = archive_for_this_jvm()
        options = archive.java_options(create=write_class_archive) if archive is not None else None
        if options is not None:
            settings = {**plain, "spark.driver.extraJavaOptions": driver_java_options(own, options)}
            mapped, writing = (archive, None) if archive.exists else (None, archive)
    try:
        spark = _start(master, app_name, settings)
    except Exception:
        if mapped is None and writing is None:
            raise
        # An archive damaged since it was written can crash the JVM as it maps it: without it.
        log.warning("the JVM did not start with the class archive's options; starting it without them")
        if mapped is not None:
            mapped.path.unlink(missing_ok=True)
        writing = None
        spark = _start(master, app_name, plain)
    if writing is not None:
        vars(SparkContext._gateway)[_ARCHIVE_WRITTEN] = (
            writing,
            spark.sparkContext._jvm.System.getProperty("java.class.path"),
            collector_options(own),
        )
    # Spark logs a failed task's traces at ERROR, pages of them (a full disk printed 400-600 lines):
    # the job's own error line says what failed, and -v (INFO) shows Spark's errors too.
    spark.sparkContext.setLogLevel("ERROR" if logging.getLogger("amqpscope").isEnabledFor(logging.INFO) else "FATAL")
    return spark


def stop_session(spark: SparkSession) -> None:
    """Stop ``spark``; if its JVM writes the class archive, end the JVM and put the archive in place."""
    spark.stop()
    if SparkContext._active_spark_context is None:  # the JVM's output of a run that ended well
        engine_log_path().unlink(missing_ok=True)
    # vars(): a Py4J gateway answers any other name with a member of the JVM's entry point.
    gateway = SparkContext._gateway
    writing: tuple[ClassArchive, str, list[str]] | None = (
        vars(gateway).pop(_ARCHIVE_WRITTEN, None) if gateway is not None else None
    )
    if writing is None:
        return
    archive, class_path, options = writing
    log.info("writing the JVM's class archive for later runs (once): %s", archive.path)
    if _end_jvm() and archive.finish(class_path, options):
        log.info("class archive written")


def _start(master: str | None, app_name: str, settings: dict[str, str]) -> SparkSession:
    builder = SparkSession.builder.appName(app_name)
    if master is not None:  # else spark-submit's JVM has spark.master set already
        builder = builder.master(master)
        _launch_quiet_jvm({**settings, "spark.master": master, "spark.app.name": app_name})
    for key, value in settings.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _connect_session(remote: str, app_name: str, settings: dict[str, str]) -> SparkSession:
    """A Spark Connect session on ``remote``. A server of its own (local[N]) starts in this
    process's JVM with every setting; a server elsewhere (sc://) takes the SQL settings it allows
    and keeps its own for the rest (PySpark sets them one by one and skips those it refuses)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # a local server's Python workers
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    builder = SparkSession.builder.remote(remote).appName(app_name)
    local = remote.startswith("local")
    if not local:  # a server's own settings are its own: only the SQL settings a session may change
        settings = {key: value for key, value in settings.items() if key.startswith("spark.sql.")}
    else:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        own = settings.get("spark.driver.extraJavaOptions", "")
        settings = {**settings, "spark.driver.extraJavaOptions": driver_java_options(own)}
        if SparkContext._gateway is None:
            _launch_quiet_jvm({**settings, "spark.master": remote, "spark.app.name": app_name})
    for key, value in settings.items():
        builder = builder.config(key, value)
    with warnings.catch_warnings(record=True) as refused:
        warnings.simplefilter("always")
        spark = builder.getOrCreate()
    for warning in refused:  # the settings the server keeps as its own: said with -v only
        log.info("Spark Connect server: %s", str(warning.message).splitlines()[0])
    server = SparkContext._active_spark_context if local else None
    if server is not None:  # the local server's context is in this process: its log level as a classic one's
        server.setLogLevel("ERROR" if logging.getLogger("amqpscope").isEnabledFor(logging.INFO) else "FATAL")
    return spark


def engine_log_path() -> Path:
    """Where a JVM this process starts writes its output when amqpscope is not verbose."""
    return Path(tempfile.gettempdir()) / f"amqpscope-spark-{os.getpid()}.log"


def _launch_quiet_jvm(settings: Mapping[str, str]) -> None:
    """Start the JVM PySpark would start for ``settings``, its output to ``engine_log_path()``
    instead of this process's stderr, unless amqpscope logs at INFO (-v). Before the session
    exists the JVM prints its own warnings ("Using incubator modules"), log4j's defaults and Spark's
    first WARN lines (the host's address, Hadoop's native library), which no log level set later
    can take back. A JVM already running (spark-submit's, or a session before) is left as it is."""
    if SparkContext._gateway is not None or launched_by_spark_submit():
        return
    if logging.getLogger("amqpscope").isEnabledFor(logging.INFO):
        return
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf(loadDefaults=True).setAll(list(settings.items()))
    with open(engine_log_path(), "ab") as output:  # the JVM keeps its own descriptor
        gateway = launch_gateway(conf, popen_kwargs={"stdout": output, "stderr": output})
    SparkContext._gateway = gateway
    SparkContext._jvm = gateway.jvm


def _end_jvm() -> bool:
    # PySpark's gateway JVM exits when its standard input closes (PythonGatewayServer); the
    # next session of this process starts a new one. True when it exited in time.
    gateway = SparkContext._gateway
    if gateway is None:
        return False
    process = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:  # the JVM may be gone already
        log.debug("closing the Py4J gateway failed", exc_info=True)
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is None or process.stdin is None:
        return False
    process.stdin.close()
    try:
        return process.wait(timeout=JVM_EXIT_TIMEOUT_S) == 0
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return False


# A run over at most this many bytes of captures evaluates its queries' expressions interpreted
# instead of compiling them. Spark generates Java source for every query stage, compiles it with
# Janino and the JIT compiles the classes again; on captures this small that costs more than the
# rows. Analyze interpreted: 0.795x the wall time on the sample (0.4 MB), 0.876x at 100 k frames
# (18 MB), level at 1 M frames (178 MB: ingest faster, flow state slower), so above this size
# code is generated. docs/BENCHMARKS.md, "What is set": interpreted expressions for small runs.
INTERPRETED_UP_TO_BYTES = 64 * 1024 * 1024
# Spark's settings and its defaults: no whole-stage code, no generated projections and predicates.
_INTERPRETED = {
    "spark.sql.codegen.wholeStage": ("false", "true"),
    "spark.sql.codegen.factoryMode": ("NO_CODEGEN", "FALLBACK"),
}
# A small run also shuffles into one partition a core, not _BASE_CONF's 8: every stage that reads
# the frames (kept partitioned by connection, jobs.stages.decode) runs a task a partition, and on a few
# thousand rows a task's fixed cost is most of its work. Analyze: 0.97x the wall time on the
# sample, 0.95x at 100 k frames (docs/BENCHMARKS.md, "What is set": one shuffle partition a core for
# small runs).
_PARTITIONS = "spark.sql.shuffle.partitions"
# And plans each query once, without adaptive execution: on a small run AQE submits every shuffle
# and broadcast of a plan as a job of its own, and the diagnosis's plan (its rules' union) holds
# some 160. Analyze of the 1,899-frame sample: 317 Spark jobs to 149, 0.977x the wall time (four
# pairs; docs/BENCHMARKS.md, "What is set": adaptive execution off for small runs);
# tests/test_same_rows.py compares the rows of a small run with those of a large one (sums of
# doubles are exact where a plan's order could show).
_ADAPTIVE = "spark.sql.adaptive.enabled"
# And, on the smallest captures (JOINS_UNBROADCAST_UP_TO_BYTES), one shuffle partition, not one a
# core: a stage of a few thousand rows is mostly its tasks' fixed cost, and the diagnosis alone runs
# some 120 stages. Paired against a partition a core (docs/BENCHMARKS.md, "What is set": one shuffle
# partition for the smallest runs): the sample (0.4 MB) 0.932x the wall time (four pairs,
# 0.889-0.970), a 4.0 MB capture level (1.012x, two pairs, 0.960-1.064).
# And, on the smallest captures, joins without broadcasts (neither Spark's own choice of a small side
# nor the pipelines' hints, which larger runs need) or runtime Bloom filters: without adaptive
# execution each broadcast, and each Bloom filter Spark puts before a join, is a Spark job of its
# own run before the query that joins, and on a few thousand rows a sort-merge join in one partition
# a core costs less than that job. Analyze with these settings for every small run and the report's
# queries as one action, against the code before both (paired; docs/BENCHMARKS.md, "What is set":
# joins without broadcasts for the smallest runs): the sample (0.4 MB) 140 Spark jobs to 40 and
# 0.904x the wall time; a 4.0 MB capture 0.991x; an 18 MB one 1.041x, its sorts costing more than
# the jobs saved. So up to the largest capture measured not to lose. The rows are the same
# (tests/test_same_rows.py).
JOINS_UNBROADCAST_UP_TO_BYTES = 4 * 1024 * 1024
_UNBROADCAST = {
    "spark.sql.autoBroadcastJoinThreshold": ("-1", "10485760b"),
    "spark.sql.optimizer.disableHints": ("true", "false"),
    "spark.sql.optimizer.runtime.bloomFilter.enabled": ("false", "true"),
}
# And the delta-rs lake stages a table's rows through the driver (Arrow, written by pyarrow) rather
# than by Spark's Parquet writer: on rows this few, the writer's tasks and output committer are most
# of a write's time (the sample's 29 tables, rows computed beforehand: 5.4 s written by Spark, 1.1 s
# through Arrow; docs/BENCHMARKS.md, "What is set": small tables staged through the driver). Read by
# jobs.lake.lake.
STAGE_ON_DRIVER = "amqpscope.lake.stage_on_driver"


def staged_on_driver(spark: SparkSession) -> bool:
    """Whether the lake stages tables' rows through the driver (set up for a small run: ``sized_for``)."""
    return spark.conf.get(STAGE_ON_DRIVER, "false") == "true"


@contextmanager
def sized_for(spark: SparkSession, capture_bytes: int) -> Iterator[bool]:
    """Within this block, a local ``spark`` is set up for a run over ``capture_bytes`` of captures:
    when that is small (INTERPRETED_UP_TO_BYTES), expressions are interpreted, shuffles make one
    partition a core, queries are planned without adaptive execution (and up to
    JOINS_UNBROADCAST_UP_TO_BYTES, shuffles make one partition, without broadcast joins or Bloom
    filters), and the lake's tables are staged through the driver (STAGE_ON_DRIVER); the settings
    are put back after it. Yields True when set up for a small run.
    Settings chosen in the job's Spark settings or on the session win: a chosen way of evaluating
    expressions leaves the whole session as it is, a number of shuffle partitions other than
    _BASE_CONF's stays (8 itself cannot be told from the default), so do join settings other than
    Spark's defaults, and adaptive execution turned off on the session. A cluster's session (a
    Databricks task: its own engine, a warm JVM) is left as it is; a Spark Connect session is set
    up so when its server runs on a local master, its tables written by Spark all the same."""
    if capture_bytes > INTERPRETED_UP_TO_BYTES or not _local_with_spark_defaults(spark):
        yield False
        return
    partitions, adaptive = spark.conf.get(_PARTITIONS), spark.conf.get(_ADAPTIVE)
    for key, (interpreted, _) in _INTERPRETED.items():
        spark.conf.set(key, interpreted)
    smallest = capture_bytes <= JOINS_UNBROADCAST_UP_TO_BYTES
    if partitions == _BASE_CONF[_PARTITIONS]:
        spark.conf.set(_PARTITIONS, "1" if smallest else str(default_parallelism(spark)))
    spark.conf.set(_ADAPTIVE, "false")
    joins = {key: spark.conf.get(key) for key in _UNBROADCAST} if smallest else {}
    for key, value in joins.items():
        small, default = _UNBROADCAST[key]
        if value == default:
            spark.conf.set(key, small)
    # Not through a Connect client: pyarrow crashed (SIGSEGV) sizing a table the client had collected
    # (the diagnosis's first write, PySpark 4.0.5, pyarrow 26): its tables are written by Spark.
    if not is_connect(spark):
        spark.conf.set(STAGE_ON_DRIVER, "true")
    try:
        yield True
    finally:
        spark.conf.unset(STAGE_ON_DRIVER)
        for key, value in joins.items():
            spark.conf.set(key, value)
        for key in _INTERPRETED:
            spark.conf.unset(key)
        spark.conf.set(_PARTITIONS, partitions)
        spark.conf.set(_ADAPTIVE, adaptive)


def _local_with_spark_defaults(spark: SparkSession) -> bool:
    if is_connect(spark):
        # A Connect server on a local master (--remote local[N], a server started beside the job)
        # runs small captures as a local classic session does; its launch settings are its own.
        try:
            master = spark.conf.get("spark.master", "")
        except Exception:  # a server that does not say (Databricks serverless): not a local one
            return False
        if not master.startswith("local"):
            return False
        return all(spark.conf.get(key, default) == default for key, (_, default) in _INTERPRETED.items())
    if not spark.sparkContext.master.startswith("local"):
        return False
    launched_with = spark.sparkContext.getConf()
    return all(
        not launched_with.contains(key) and spark.conf.get(key, default) == default
        for key, (_, default) in _INTERPRETED.items()
    )


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect session (Databricks' standard access mode and serverless compute),
    which has no SparkContext, JVM gateway or status tracker in this process."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


# A Range's slices in a plan's text: Spark splits a range into the session's default parallelism.
_RANGE_SPLITS = re.compile(r"\bRange \(0, 1, step=1, splits=(\d+)\)")


def default_parallelism(spark: SparkSession) -> int:
    """The number of tasks Spark runs at once by default (the cores of a local session). A Spark
    Connect session has no SparkContext to ask: its server's is read from the physical plan of a
    one-row range, which Spark splits into that many slices (no job runs); 2 if it does not say."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    found = _RANGE_SPLITS.search(spark.range(1)._explain_string(mode="simple"))
    return int(found.group(1)) if found else 2


def session_time_zone(conf: Mapping[str, str]) -> str:
    """The time zone a session built with ``conf`` (``build_session``) writes times in."""
    return str({**_BASE_CONF, **conf}["spark.sql.session.timeZone"])


def jvm_has_delta(spark: SparkSession) -> bool:
    """True when the JVM can load Delta Lake's Spark integration (Databricks, delta-spark jars).

    A Spark Connect session has no JVM here to ask: on a Databricks runtime (its driver sets
    ``DATABRICKS_RUNTIME_VERSION``) it has Delta, elsewhere it is taken not to."""
    if is_connect(spark):
        return "DATABRICKS_RUNTIME_VERSION" in os.environ
    try:
        spark.sparkContext._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception:  # Py4JJavaError (ClassNotFoundException) or no JVM gateway at all
        return False
    return True
