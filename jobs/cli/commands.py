"""What each ``amqpscope`` command that runs a stage does (``jobs.cli.cli`` parses its arguments and
calls it): check the arguments, get Spark, run the job. The stages' entry points (``jobs.cli.entry``:
console scripts, Databricks tasks, spark-submit) run them through the command.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.stages.preflight import check_lake_writable


def ingest(landing: Path, config: AnalyzeConfig, progress: str = "auto"):
    """``amqpscope ingest``: the landing directory's new captures into the bronze tables."""
    from amqpscope.jobs.stages.landing import ingest_landing, landing_files
    from amqpscope.jobs.stages.progress import Progress
    from amqpscope.jobs.stages.stages import job_session

    landing_files(landing)  # before Spark: not a directory fails at once
    check_lake_writable(config.lake)
    with job_session(config, "amqpscope-ingest") as spark, Progress(spark, mode=progress) as reporter:
        return ingest_landing(spark, landing, config, reporter)


def derive(config: AnalyzeConfig, capture_ids: Sequence[str] | None = None, progress: str = "auto"):
    """``amqpscope derive``: derived tables for the captures whose bronze rows are newer."""
    from amqpscope.jobs.stages.derive import VERDICTS_MODULE, derive_lake
    from amqpscope.jobs.stages.progress import Progress
    from amqpscope.jobs.stages.stages import StageClock, job_session

    check_lake_writable(config.lake)
    session = job_session(config, "amqpscope-derive", preload_modules=(VERDICTS_MODULE,))
    with session as spark, Progress(spark, mode=progress) as reporter:
        return derive_lake(spark, config, capture_ids, clock=StageClock(progress=reporter))


def report(config: AnalyzeConfig, capture_ids: Sequence[str] | None = None, progress: str = "auto"):
    """``amqpscope report``: the HTML report of complete captures from the lake: from its gold
    tables through delta-rs, with no Spark session to start where the lake allows it
    (``report_job.reads_without_spark``)."""
    from amqpscope.jobs.stages.progress import Progress
    from amqpscope.jobs.stages.report_job import reads_without_spark, report_lake
    from amqpscope.jobs.stages.stages import StageClock, job_session

    check_lake_writable(config.lake)
    if reads_without_spark(config):
        return report_lake(None, config, capture_ids, clock=StageClock())
    with job_session(config, "amqpscope-report") as spark, Progress(spark, mode=progress) as reporter:
        return report_lake(spark, config, capture_ids, clock=StageClock(progress=reporter))


def watch(
    landing: Path,
    config: AnalyzeConfig,
    *,
    interval: float,
    settle: float,
    rounds: int,
    each,
    answered=None,
    progress: str = "auto",
):
    """``amqpscope watch``: rounds of ingest, derive and report of the landing directory in one
    Spark session, until a signal or after ``rounds``; ``each`` gets every round as it ends,
    ``answered`` the diagnoses as soon as they are written."""
    from amqpscope.jobs.stages.derive import VERDICTS_MODULE
    from amqpscope.jobs.stages.landing import landing_files
    from amqpscope.jobs.stages.progress import Progress
    from amqpscope.jobs.stages.stages import job_session
    from amqpscope.jobs.stages.watch import stop_requests
    from amqpscope.jobs.stages.watch import watch as watch_landing

    landing_files(landing)  # before Spark: not a directory fails at once
    check_lake_writable(config.lake)
    with stop_requests() as stop:
        session = job_session(config, "amqpscope-watch", preload_modules=(VERDICTS_MODULE,))
        with session as spark, Progress(spark, mode=progress) as reporter:
            return watch_landing(
                spark,
                landing,
                config,
                interval=interval,
                settle=settle,
                rounds=rounds,
                stop=stop,
                progress=reporter,
                each=each,
                answered=answered,
            )


def maintain(config: AnalyzeConfig, retain_hours: int):
    """``amqpscope maintain``: compact every table of the lake and remove the files it no longer needs."""
    from amqpscope.jobs.stages.maintain import maintain_lake
    from amqpscope.jobs.stages.stages import job_session

    check_lake_writable(config.lake)
    with job_session(config, "amqpscope-maintain") as spark:
        return maintain_lake(spark, config, retain_hours)
