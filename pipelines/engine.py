"""What the session's engine does its own way, as settings on the session: classic Spark and a Spark
Connect server leave them unset; an embedded engine that differs sets them when it starts
(jobs.engine.sail). The pipelines and the verdicts read them where the engines differ, so that the same
code gives the same rows on each."""

from __future__ import annotations

from pyspark.sql import SparkSession

# "false": a local checkpoint is kept where the engine chooses and takes no storage level (Sail);
# Spark keeps it on disk (DISK_ONLY), its heap the same whatever the capture (partitioning.checkpointed).
CHECKPOINT_ON_DISK = "amqpscope.engine.checkpointOnDisk"
# "false": no observed metrics (DataFrame.observe) while a query runs; the verdicts count the
# violations they stored instead (expectations.suite).
OBSERVES = "amqpscope.engine.observes"

SAIL = {CHECKPOINT_ON_DISK: "false", OBSERVES: "false"}


def does(spark: SparkSession, setting: str) -> bool:
    """False when the session's engine says it does not do ``setting`` its default way."""
    return spark.conf.get(setting, "true") != "false"
