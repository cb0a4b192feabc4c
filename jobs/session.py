"""The one place a SparkSession is built (entry points and the tests' fixture call it)."""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

# Spark's defaults that would make our tables unreadable or our runs slow on a laptop-sized box.
_BASE_CONF = {
    # delta-rs and every Parquet reader other than Spark expect TIMESTAMP_MICROS, not INT96.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.session.timeZone": "UTC",
    # Captures decode to modest row counts per capture; 200 shuffle partitions is pure overhead.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.enabled": "false",
    # Spark's console bar would interleave with amqpscope's own progress lines (jobs/progress.py).
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Spark's cache writes its column batches with Java serialization, whose streams keep every
    # object written reachable until reset (default: every 100 objects, i.e. up to 100 batches of
    # 10,000 rows outside Spark's memory accounting). Reset after each: memory flat in capture size.
    "spark.serializer.objectStreamReset": "1",
    # Spark keeps 100 compiled code-generated classes by default. One flow-state table's plan alone
    # needs more (link_state: 32 window operators), so each of its tasks compiled them again with
    # Janino: link_state took 3.5 s a query warm, 0.6 s with this. Bounded by entries, not by data.
    "spark.sql.codegen.cache.maxEntries": "4000",
}


DEFAULT_MASTER = "local[2]"


def launched_by_spark_submit() -> bool:
    """True in a driver that spark-submit started: its JVM is up, with --master among its settings."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(master: str | None = DEFAULT_MASTER, app_name: str = "amqpscope",
                  conf: dict[str, str] | None = None) -> SparkSession:
    """Build (or reuse) the SparkSession for an amqpscope job, on ``master``; None: the master
    spark-submit was given, else local[2]."""
    if master is None and not launched_by_spark_submit():
        master = DEFAULT_MASTER
    # Executors must run the interpreter that has amqpscope installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # pandas-on-Spark (used by pyspark.testing) asks for this on both driver and executors.
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, no interface guessing
    builder = SparkSession.builder.appName(app_name)
    if master is not None:  # else spark-submit's JVM has spark.master set already
        builder = builder.master(master)
    for key, value in {**_BASE_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def jvm_has_delta(spark: SparkSession) -> bool:
    """True when the JVM can load Delta Lake's Spark integration (Databricks, delta-spark jars)."""
    try:
        spark.sparkContext._jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception:  # Py4JJavaError (ClassNotFoundException) or no JVM gateway at all
        return False
    return True
