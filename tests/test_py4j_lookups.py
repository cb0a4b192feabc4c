"""Py4J's lookups remembered (jobs.engine.py4j_lookups): fewer round trips, the same answers."""

from __future__ import annotations

import subprocess
import sys

import pyspark.sql.functions as F
import pytest
from py4j.protocol import Py4JError

from amqpscope.jobs.engine import py4j_lookups


@pytest.fixture
def round_trips(spark, monkeypatch):
    """The commands sent to the JVM from now on, by their first line (c: call, r: reflection)."""
    client = spark.sparkContext._gateway._gateway_client
    sent: list[str] = []
    send = client.send_command

    def counting(command, *args, **kwargs):
        sent.append(command.split("\n", 1)[0])
        return send(command, *args, **kwargs)

    monkeypatch.setattr(client, "send_command", counting)
    return sent


def test_the_suite_session_has_them_installed(spark):
    assert py4j_lookups.installed()


def test_a_function_is_looked_up_once_then_only_called(spark, round_trips):
    F.col("warm_up")  # the lookups of functions and col, if no test made them before
    round_trips.clear()
    columns = [F.col(f"c{i}") for i in range(5)]
    assert [str(c) for c in columns] == [f"Column<'c{i}'>" for i in range(5)]
    # One call each (Py4J's releases of earlier objects may be interleaved: "m").
    assert [c for c in round_trips if c != "m"] == ["c"] * 5 + ["c"] * 5  # col, then toString


def test_answers_are_the_jvm_s_own(spark):
    jvm = spark.sparkContext._jvm
    lang = jvm.java.lang  # a package the view finds: asked each time (an import may change it)
    math, integer = lang.Math, lang.Integer
    for _ in range(2):
        assert math.abs(-3) == 3
        assert integer.MAX_VALUE == 2**31 - 1  # a static field: read, not remembered
        assert jvm.java.util.AbstractMap.SimpleEntry("k", 1).getValue() == 1  # a nested class
        assert jvm.PythonUtils.toSeq([1, 2]).size() == 2  # a short name of one of PySpark's imports
    assert lang.Math is math and math.abs is math.abs
    assert "MAX_VALUE" not in vars(integer)["_amqpscope_names"]
    assert "java" not in vars(jvm)["_amqpscope_names"] and "PythonUtils" in vars(jvm)["_amqpscope_names"]


def test_a_missing_name_fails_every_time(spark, round_trips):
    math = spark.sparkContext._jvm.java.lang.Math
    for _ in range(2):
        round_trips.clear()
        with pytest.raises(Py4JError, match="java.lang.Math.no_such_member does not exist"):
            _ = math.no_such_member
        # Asked again, not remembered (Py4J's releases of earlier objects may be interleaved: "m").
        assert [c for c in round_trips if c != "m"] == ["r"]


def test_installing_twice_keeps_one_layer(spark):
    from py4j.java_gateway import JavaClass

    wrapped = JavaClass.__getattr__
    py4j_lookups.install()
    assert JavaClass.__getattr__ is wrapped


_CHILD = """
from py4j.java_gateway import JavaClass, JavaPackage, JVMView
from amqpscope.jobs.engine import py4j_lookups
from amqpscope.jobs.engine.session import build_session
def patched():
    return [hasattr(cls.__getattr__, "__wrapped__") for cls in (JVMView, JavaPackage, JavaClass)]
spark = build_session("local[1]", "amqpscope-py4j-opt-in")
print(py4j_lookups.installed(), patched(), spark.range(3).count())
spark = build_session("local[1]", "amqpscope-py4j-opt-in", remember_py4j_lookups=True)
print(py4j_lookups.installed(), patched(), spark.range(3).count())
spark.stop()
"""


def test_only_a_session_that_asks_changes_py4j_for_the_process():
    """build_session leaves Py4J's classes as they are unless its caller asks (the jobs' sessions
    do: jobs.stages.stages.job_session); in a process of its own, as the suite's session has asked."""
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["False [False, False, False] 3", "True [True, True, True] 3"]


def test_the_jobs_sessions_ask_for_it(monkeypatch, tmp_path):
    from amqpscope.conf.settings import AnalyzeConfig
    from amqpscope.jobs.stages import stages

    asked = {}

    class Built:
        def stop(self):
            pass

    def build_session(*args, **kwargs):
        asked.update(kwargs)
        return Built()

    monkeypatch.setattr(stages.SparkSession, "getActiveSession", staticmethod(lambda: None))
    monkeypatch.setattr(stages, "build_session", build_session)
    monkeypatch.setattr(stages, "stop_session", lambda spark: None)
    with stages.job_session(AnalyzeConfig(lake=tmp_path / "lake"), "amqpscope-test") as spark:
        assert isinstance(spark, Built)
    assert asked["remember_py4j_lookups"] is True
