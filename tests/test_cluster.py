"""The Databricks bundle's tasks (ingest -> derive -> report -> maintain, resources/*.yml), each run by
``spark-submit`` on a real Spark standalone cluster (master + two workers on loopback) with the
bundle's own parameters, write the same tables as ``analyze`` in local mode (the suite's shared
lake of the same samples)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pyspark.testing import assertDataFrameEqual

from amqpscope.jobs.cli import entry
from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.commits import committed_row_counts
from amqpscope.jobs.lake.lake import Lake
from testbed.spark_cluster import StandaloneCluster
from tests.paths import SAMPLE_CAPTURES
from tests.test_jobs import TABLES, TASK_ORDER, bundle, same_input, substituted

COMPARED = (
    "captures",
    "connections",
    "frames",
    "quarantine",
    "link_credit",
    "channel_unacked",
    "violations",
    "bottlenecks",
    "diagnosis",
    "dq_summary",
)
SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")


def submit(master: str, entry_point: str, parameters: list[str], log: Path) -> dict:
    """One task as spark-submit runs it: jobs/cli/entry.py with the stage first, then the task's
    parameters; its JSON answer. Its own process: a SparkContext per process."""
    command = [str(SPARK_SUBMIT), "--master", master, entry.__file__, entry_point.removesuffix("_task"), *parameters]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    out = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    log.write_text(out.stderr)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.cluster
@pytest.mark.slow
def test_bundle_tasks_on_a_standalone_cluster_match_local_mode(spark, samples_lake, tmp_path):
    local_lake, _config, local = samples_lake
    landing, lake = tmp_path / "landing", tmp_path / "cluster"
    landing.mkdir()
    for sample in SAMPLE_CAPTURES:
        shutil.copy(sample, landing / sample.name)
    config = tmp_path / "analyze.yml"
    config.write_text(yaml.safe_dump({"storage": "delta-rs"}))
    values = {"landing": str(landing), "lake": str(lake), "config": str(config), "catalog": "", "schema": ""}
    _, jobs = bundle()
    tasks = jobs["amqpscope"]["tasks"]
    assert [t["task_key"] for t in tasks] == TASK_ORDER

    with StandaloneCluster(tmp_path / "cluster-work", workers=2) as cluster:
        outputs = {}
        for task in tasks:
            wheel = task["python_wheel_task"]
            outputs[task["task_key"]] = submit(
                cluster.master_url,
                wheel["entry_point"],
                substituted(wheel["parameters"], values),
                tmp_path / f"{task['task_key']}.log",
            )
        master_log = (tmp_path / "cluster-work" / "master.log").read_text()
    assert cluster.alive() == []
    # Every task really ran on the cluster: its application registered with the master.
    for stage in TASK_ORDER:
        assert f"Registered app amqpscope-{stage}" in master_log

    ids = sorted(local.capture_ids)
    assert sorted(outputs["ingest"]["ingested"]) == ids
    assert sorted(outputs["derive"]["derived"]) == ids
    assert sorted(outputs["report"]["captures"]) == ids and outputs["report"]["incomplete"] == []
    assert Path(outputs["report"]["report"]).is_file()

    remote, reference = Lake(spark, lake), Lake(spark, local_lake)
    state = runs.stage_runs(remote)
    assert {runs.completeness(state, c) for c in ids} == {runs.COMPLETE}
    assert committed_row_counts(remote, TABLES, ids) == local.row_counts
    for table in COMPARED:
        assertDataFrameEqual(same_input(remote, table), same_input(reference, table))
