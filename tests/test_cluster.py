"""``amqpscope analyze`` on a real Spark standalone cluster (master + two workers on loopback)
writes the same tables as local mode (the suite's local session analysing the same samples)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.testing import assertDataFrameEqual

from amqpscope.jobs.lake import Lake
from amqpscope.testbed.spark_cluster import StandaloneCluster
from tests.paths import SAMPLE_CAPTURES

SAMPLES = [str(p) for p in SAMPLE_CAPTURES]
COMPARED = ("captures", "connections", "frames", "quarantine", "link_credit", "channel_unacked", "violations")


def run_analyze(lake: Path, master: str) -> dict:
    """The CLI in its own process: a SparkContext per process, so the cluster's can't be the suite's."""
    out = subprocess.run(
        [sys.executable, "-m", "amqpscope.jobs.cli", "analyze", *SAMPLES, "--lake", str(lake), "--master", master],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.cluster
def test_standalone_cluster_matches_local_mode(spark, samples_lake, tmp_path):
    local_lake, _config, local = samples_lake
    with StandaloneCluster(tmp_path / "cluster-work", workers=2) as cluster:
        remote = run_analyze(tmp_path / "cluster", cluster.master_url)
        # The run really used the cluster: the application registered with the master.
        assert "Registered app amqpscope-analyze" in (tmp_path / "cluster-work" / "master.log").read_text()
    assert cluster.alive() == []
    assert remote["tables"] == local.row_counts
    for table in COMPARED:
        expected = Lake(spark, local_lake).read(table)
        actual = Lake(spark, tmp_path / "cluster").read(table)
        assertDataFrameEqual(actual, expected)
