"""The embedded engine's checks (tests/sail_checks.py), in a pytest process of their own: PySpark
cannot hold a Sail (Spark Connect) session beside the classic one this worker may already hold; and
``analyze --engine sail`` end to end in a process of its own, table for table against classic Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.stages.analyze import analyze
from tests.table_digests import TABLES, table_digests
from tests.test_connect import SAMPLE, amqpscope

CHECKS = Path(__file__).with_name("sail_checks.py")


def test_the_sail_checks_pass_in_a_process_of_their_own():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(CHECKS)],
        cwd=CHECKS.parent.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout.splitlines()[-1] and "failed" not in run.stdout.splitlines()[-1], run.stdout[-2000:]


def test_analyze_on_the_sail_engine_writes_every_table_as_classic_spark(spark, tmp_path):
    """``analyze --engine sail`` end to end (ingest's decode included), in a process of its own:
    every table's rows are the ones a classic session writes from the same capture."""
    lake = tmp_path / "sail"
    done = amqpscope("analyze", str(SAMPLE), "--lake", str(lake), "--engine", "sail", "--progress", "never")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["engine"] == "sail"
    assert "Computed on Sail." in Path(summary["report"]).read_text(encoding="utf-8")
    classic = analyze(spark, [str(SAMPLE)], AnalyzeConfig(lake=tmp_path / "classic"))
    assert summary["tables"] == classic.row_counts
    on_sail, on_classic = table_digests(spark, lake), table_digests(spark, tmp_path / "classic")
    assert set(on_sail) == set(TABLES)
    assert {t: d for t, d in on_sail.items() if d != on_classic[t]} == {}
    assert sum(d[classic.capture_ids[0]]["rows"] for d in on_sail.values() if d) > 0


def test_the_engine_flag_reaches_the_config_and_sail_takes_no_master_or_remote(tmp_path):
    from amqpscope.jobs.cli import cli

    for command in ("analyze", "ingest", "derive", "report", "maintain"):
        position = {"analyze": ["x.pcap"], "ingest": [str(tmp_path)]}.get(command, [])
        args = cli.build_parser().parse_args([command, *position, "--lake", str(tmp_path), "--engine", "sail"])
        assert cli._config(args).engine == "sail", command
    assert AnalyzeConfig(lake=tmp_path).engine == "spark"
    for given in ({"master": "local[2]"}, {"remote": "sc://h:1"}):
        with pytest.raises(ValueError, match="the sail engine runs in this process"):
            AnalyzeConfig(lake=tmp_path, engine="sail", **given)
    with pytest.raises(ValueError, match="engine must be one of spark, sail, not 'duckdb'"):
        AnalyzeConfig(lake=tmp_path, engine="duckdb")
