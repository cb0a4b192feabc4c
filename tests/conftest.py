"""Shared fixtures: one SparkSession for the whole run (it takes ~10 s to start)."""

from __future__ import annotations

import pytest

from amqpscope.jobs.session import build_session


@pytest.fixture(scope="session")
def spark():
    session = build_session(master="local[2]", app_name="amqpscope-tests")
    yield session
    session.stop()
