"""Shared fixtures: one SparkSession for the whole run (it takes ~10 s to start)."""

from __future__ import annotations

import pytest

from amqpscope.jobs.session import build_session


@pytest.fixture(scope="session")
def spark():
    # Spark waits 15 s by default for a Python process it starts (a streaming source's runner) to
    # connect back; on a loaded test machine that start alone can take longer.
    # One session serves the whole suite, the 21 MB of bottleneck scenarios included: with Spark's
    # 1 GiB default driver heap a full run ran out of heap (java.lang.OutOfMemoryError) after them.
    session = build_session(master="local[2]", app_name="amqpscope-tests",
                            conf={"spark.python.authenticate.socketTimeout": "180s", "spark.driver.memory": "4g"})
    yield session
    session.stop()
