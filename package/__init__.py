"""amqpscope: AMQP 0-9-1 / 1.0 packet captures to a Delta lakehouse, flow-control timelines and verdicts.

The subpackages are the architecture (``amqpscope.ingest``, ``.schemas``, ``.pipelines``,
``.expectations``, ``.jobs``, ``.conf``); this top level only carries the version,
``python -m amqpscope`` and the background threads both jobs and verdicts use
(``amqpscope.threads``). Nothing here imports Spark.
"""

from __future__ import annotations

import importlib.metadata

try:
    __version__ = importlib.metadata.version("amqpscope")
except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0+unknown"


def register(spark) -> None:
    """Make ``spark.read.format("amqp")`` and ``spark.readStream.format("amqp")`` known to ``spark``."""
    from amqpscope.jobs.stages.datasource import register as register_source

    register_source(spark)
