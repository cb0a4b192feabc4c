"""The ``runs`` table: what each stage of amqpscope did to each capture, and whether it finished.

A stage marks its captures ``running`` before it writes any of their rows and ``ok`` after its last
commit, so a run killed in between leaves ``running`` behind: readers tell a half-analysed capture
from a finished one here, and the next run of the stage repairs it. A ``running`` row is also the
run's lease on the capture: while its owner lives (and, seen from another host, until
``lease_until``), no other run writes the capture (``jobs.lake.runs``).
"""

from __future__ import annotations

from pyspark.sql.types import StringType, StructField, StructType, TimestampType

# The stages, in the order a capture goes through them.
STAGES = ("ingest", "derive", "report")
OUTCOME_RUNNING = "running"
OUTCOME_OK = "ok"
# Any other outcome starts with "failed: " and names the reason.
OUTCOME_FAILED_PREFIX = "failed: "

RUNS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("stage", StringType(), False),  # ingest | derive | report (STAGES)
        StructField("run_id", StringType(), False),  # the latest run of this stage on this capture
        StructField("started", TimestampType(), False),  # when that run began the stage
        StructField("ended", TimestampType(), True),  # when it committed its last row; null while running
        StructField("outcome", StringType(), False),  # running | ok | failed: reason
        # The run of the stage before whose rows this one read (derive: the ingest run; report:
        # the derive run): a derive older than its capture's ingest is stale.
        StructField("source_run", StringType(), True),
        # The process of the run, "pid N on host": another run on that host tells a live lease from
        # a killed run's at once.
        StructField("owner", StringType(), True),
        # Until when a running row holds the capture for a run on another host (renewed by every mark).
        StructField("lease_until", TimestampType(), True),
    ]
)
