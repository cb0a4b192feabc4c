"""Thin entry points of the scheduled stages: check the arguments, get Spark, run the job.

Each stage is also a console script of the wheel (``amqpscope-ingest``, ``amqpscope-derive``,
``amqpscope-report``; setup.cfg), which a Databricks ``python_wheel_task`` names as its
``entry_point``, and this file runs under ``spark-submit`` with the subcommand first::

    spark-submit "$(python -c 'import amqpscope.jobs.entry as e; print(e.__file__)')" derive --lake /lake
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs import cli
from amqpscope.jobs.preflight import check_lake_writable


def ingest(landing: Path, config: AnalyzeConfig, progress: str = "auto"):
    """``amqpscope ingest``: the landing directory's new captures into the bronze tables."""
    from amqpscope.jobs.landing import ingest_landing, landing_files
    from amqpscope.jobs.progress import Progress
    from amqpscope.jobs.stages import job_session

    landing_files(landing)  # before Spark: not a directory fails at once
    check_lake_writable(config.lake)
    with job_session(config, "amqpscope-ingest") as spark, Progress(spark, mode=progress) as reporter:
        return ingest_landing(spark, landing, config, reporter)


def derive(config: AnalyzeConfig, capture_ids: Sequence[str] | None = None, progress: str = "auto"):
    """``amqpscope derive``: derived tables for the captures whose bronze rows are newer."""
    from amqpscope.jobs.derive import VERDICTS_MODULE, derive_lake
    from amqpscope.jobs.progress import Progress
    from amqpscope.jobs.stages import StageClock, job_session

    check_lake_writable(config.lake)
    session = job_session(config, "amqpscope-derive", preload_modules=(VERDICTS_MODULE,))
    with session as spark, Progress(spark, mode=progress) as reporter:
        return derive_lake(spark, config, capture_ids, clock=StageClock(progress=reporter))


def report(config: AnalyzeConfig, capture_ids: Sequence[str] | None = None, progress: str = "auto"):
    """``amqpscope report``: the HTML report of complete captures from the lake."""
    from amqpscope.jobs.progress import Progress
    from amqpscope.jobs.report_job import report_lake
    from amqpscope.jobs.stages import StageClock, job_session

    check_lake_writable(config.lake)
    with job_session(config, "amqpscope-report") as spark, Progress(spark, mode=progress) as reporter:
        return report_lake(spark, config, capture_ids, clock=StageClock(progress=reporter))


def _stage_main(command: str):
    def main(argv: Sequence[str] | None = None) -> int:
        """Console script of one stage: ``amqpscope <command>`` with the given arguments."""
        args = list(sys.argv[1:] if argv is None else argv)
        verbose = [a for a in args if a in ("-v", "--verbose")]  # a top-level flag of amqpscope
        return cli.main([*verbose[:1], command, *(a for a in args if a not in ("-v", "--verbose"))])

    main.__name__ = f"{command}_main"
    return main


ingest_main = _stage_main("ingest")
derive_main = _stage_main("derive")
report_main = _stage_main("report")

if __name__ == "__main__":  # spark-submit entry.py COMMAND ARGS...
    sys.exit(cli.main())
