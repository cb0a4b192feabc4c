"""The pipeline on a Spark Connect session: Spark's own Connect server (tests/connect_server.py), as
Databricks serverless and standard access mode give one. analyze of a sample writes, table for
table, the rows a classic session writes; the bundle's tasks run on it end to end; ``--remote`` and
SPARK_REMOTE choose it as PySpark reads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.cli import cli
from amqpscope.jobs.engine.sail import engine_of
from amqpscope.jobs.engine.session import REMOTE_ENVIRONMENT, resolve_remote
from amqpscope.jobs.stages.analyze import analyze
from tests.paths import ROOT, SAMPLES
from tests.table_digests import TABLES, table_digests
from tests.test_jobs import TASK_ORDER, bundle, substituted

SAMPLE = SAMPLES / "amqp091-qos-confirms.pcap"
JOB_TIMEOUT_S = 1800  # a whole run on a loaded two-core machine


def amqpscope(*args: str, remote: str | None = None, environ: dict[str, str] | None = None):
    """``python -m amqpscope ARGS`` in a process of its own (SPARK_REMOTE unset unless given)."""
    env = {k: v for k, v in os.environ.items() if k != REMOTE_ENVIRONMENT}
    env.update(environ or {})
    command = [sys.executable, "-m", "amqpscope", *args, *(("--remote", remote) if remote else ())]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)


# --remote and SPARK_REMOTE, before any Spark starts.


def test_remote_is_the_flag_else_spark_remote_else_none():
    assert resolve_remote(None, "sc://flag:15002", {REMOTE_ENVIRONMENT: "sc://env:15002"}) == "sc://flag:15002"
    assert resolve_remote(None, None, {REMOTE_ENVIRONMENT: "sc://env:15002"}) == "sc://env:15002"
    assert resolve_remote(None, None, {REMOTE_ENVIRONMENT: ""}) is None  # set but empty: as unset
    assert resolve_remote(None, None, {}) is None
    assert resolve_remote("local[2]", None, {}) is None
    assert resolve_remote(None, "local[2]", {}) == "local[2]"


@pytest.mark.parametrize(
    ("master", "remote", "environ", "message"),
    [
        ("local[2]", "sc://h:1", {}, r"--remote \(sc://h:1\) name two sessions"),
        ("spark://m:7077", None, {REMOTE_ENVIRONMENT: "sc://h:1"}, r"SPARK_REMOTE \(sc://h:1\) name two sessions"),
        (None, "http://h:1", {}, "remote must be sc://"),
        (None, "", {}, "remote must name a Spark Connect server"),
    ],
)
def test_a_remote_that_cannot_be_is_refused(master, remote, environ, message):
    with pytest.raises(ValueError, match=message):
        resolve_remote(master, remote, environ)


def test_the_remote_flag_reaches_the_config_of_every_spark_command(tmp_path):
    for command in ("analyze", "ingest", "derive", "report", "watch", "maintain"):
        position = {"analyze": ["x.pcap"], "ingest": [str(tmp_path)], "watch": [str(tmp_path)]}.get(command, [])
        args = cli.build_parser().parse_args([command, *position, "--lake", str(tmp_path), "--remote", "sc://h:1"])
        assert cli._config(args).remote == "sc://h:1", command
    with pytest.raises(ValueError, match="name two sessions"):
        AnalyzeConfig(lake=tmp_path, master="local[2]", remote="sc://h:1")


def test_a_master_and_spark_remote_together_are_a_usage_error(tmp_path):
    done = amqpscope(
        "analyze", str(SAMPLE), "--lake", str(tmp_path / "lake"), "--master", "local[2]",
        environ={REMOTE_ENVIRONMENT: "sc://127.0.0.1:1"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "SPARK_REMOTE (sc://127.0.0.1:1) name two sessions: give one" in done.stderr
    assert not (tmp_path / "lake" / "frames").exists()


# The pipeline on Spark Connect.


def test_analyze_on_spark_connect_writes_every_table_as_classic_spark(connect_spark, spark, tmp_path):
    lake = tmp_path / "connect"
    done = amqpscope("analyze", str(SAMPLE), "--lake", str(lake), "--progress", "never", remote=connect_spark.remote)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["engine"] == "connect"
    report = Path(summary["report"]).read_text(encoding="utf-8")
    assert "Computed on Spark Connect." in report

    classic = analyze(spark, [str(SAMPLE)], AnalyzeConfig(lake=tmp_path / "classic"))
    assert classic.engine == engine_of(spark) == "classic"
    assert summary["tables"] == classic.row_counts
    assert summary["diagnosis"] == {d["capture_id"]: {"bottleneck": d["bottleneck"], "headline": d["headline"]}
                                    for d in classic.diagnoses}  # fmt: skip
    on_connect, on_classic = table_digests(spark, lake), table_digests(spark, tmp_path / "classic")
    assert set(on_connect) == set(TABLES)
    assert {t: d for t, d in on_connect.items() if d != on_classic[t]} == {}
    assert sum(d[classic.capture_ids[0]]["rows"] for d in on_connect.values() if d) > 0


@pytest.mark.slow  # four whole jobs in processes of their own; analyze on Connect stays in the fast tier
def test_the_bundles_tasks_run_on_spark_connect_end_to_end(connect_spark, tmp_path):
    """ingest -> derive -> report -> maintain as the job's python_wheel_tasks run them, each in a
    process of its own on the Connect server SPARK_REMOTE names (as a serverless task's session)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    (landing / SAMPLE.name).write_bytes(SAMPLE.read_bytes())
    config = tmp_path / "analyze.yml"
    config.write_text("storage: delta-rs\n")
    values = {"landing": str(landing), "lake": str(lake), "config": str(config), "catalog": "", "schema": ""}
    _, jobs = bundle()
    outputs = {}
    for task in jobs["amqpscope_serverless"]["tasks"]:
        wheel = task["python_wheel_task"]
        call = (
            "import sys; from amqpscope.jobs.cli.entry import {0}; sys.argv = ['amqpscope', *sys.argv[1:]]; {0}()"
        ).format(wheel["entry_point"])
        done = subprocess.run(
            [sys.executable, "-c", call, *substituted(wheel["parameters"], values)],
            cwd=ROOT,
            env={**os.environ, REMOTE_ENVIRONMENT: connect_spark.remote},
            capture_output=True,
            text=True,
            timeout=JOB_TIMEOUT_S,
        )
        assert done.returncode == 0, (task["task_key"], done.stderr)
        outputs[task["task_key"]] = json.loads(done.stdout)
    assert list(outputs) == TASK_ORDER
    [ingested] = outputs["ingest"]["ingested"]
    assert outputs["derive"]["derived"] == [ingested]
    assert outputs["report"]["captures"] == [ingested] and outputs["report"]["incomplete"] == []
    assert ingested in Path(outputs["report"]["report"]).read_text(encoding="utf-8")
    assert "frames" in outputs["maintain"]["tables"]
