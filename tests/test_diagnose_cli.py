"""``amqpscope diagnose`` as a user runs it: the answer in plain text and JSON, from the lake without Spark."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.diagnose import incomplete, stored_answers
from amqpscope.jobs.lake_read import read_table
from amqpscope.schemas.runs import OUTCOME_RUNNING
from tests.paths import SAMPLES

SAMPLE = SAMPLES / "flow" / "amqp091-memory-alarm.pcap"


def diagnose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "amqpscope.jobs.cli", "diagnose", *args], capture_output=True,
                          text=True, timeout=1800, env=env, check=False)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("diagnose-lake")
    first = diagnose(str(SAMPLE), "--lake", str(root), "--progress", "never")
    assert first.returncode == 0, first.stderr[-3000:]
    return root


def test_the_answer_names_the_alarm_the_connection_and_where_to_look(lake):
    answer = diagnose(str(SAMPLE), "--lake", str(lake))
    assert answer.returncode == 0, answer.stderr[-3000:]
    lines = answer.stdout.splitlines()
    assert lines[0] == f"{SAMPLE} (capture {capture_id(SAMPLE)[:12]})"
    assert lines[1].startswith("  Bottleneck: memory alarm (blocked) on connection ")
    assert "connection.blocked(\"low on memory\")" in answer.stdout
    assert lines[2].startswith("  1. memory_alarm / blocked: connection ")
    assert any(line.strip().startswith("Wireshark: tcp.port == ") for line in lines)


def test_a_stored_answer_needs_no_spark(lake):
    # No Java on the PATH: starting Spark would fail, so the answer must come from the lake alone.
    env = {**os.environ, "PATH": "/nonexistent", "JAVA_HOME": "/nonexistent"}
    answer = diagnose(str(SAMPLE), "--lake", str(lake), "--json", env=env)
    assert answer.returncode == 0, answer.stderr[-3000:]
    (capture,) = json.loads(answer.stdout)["captures"]
    assert (capture["capture_id"], capture["bottleneck"], capture["findings_count"]) == (capture_id(SAMPLE), "memory_alarm", 1)
    (finding,) = capture["findings"]
    assert finding["evidence"]["reason"] == "low on memory"
    assert finding["rule_id"] == "diagnosis.alarm.connection_blocked"


def test_a_missing_file_is_named(tmp_path):
    answer = diagnose(str(tmp_path / "nope.pcap"), "--lake", str(tmp_path / "lake"))
    assert answer.returncode != 0
    assert "nope.pcap" in answer.stderr


def test_a_capture_left_incomplete_is_not_answered_from_the_lake(lake, tmp_path):
    """A run killed after its diagnosis was written but before derive was marked done (the runs
    table's outcome still "running"): the stored answer is not taken, so diagnose analyses again."""
    ids = [capture_id(SAMPLE)]
    assert incomplete(lake, ids) == [] and stored_answers(lake, ids) is not None
    killed = tmp_path / "killed-lake"
    shutil.copytree(lake, killed)
    table = DeltaTable(str(killed / "runs"))
    runs = read_table(killed / "runs", table=table)
    derive = pc.equal(runs["stage"], "derive")
    outcome = pc.if_else(derive, OUTCOME_RUNNING, runs["outcome"])
    runs = runs.set_column(runs.schema.get_field_index("outcome"), "outcome", outcome)
    write_deltalake(str(killed / "runs"), runs, mode="overwrite", partition_by=table.metadata().partition_columns)
    assert incomplete(killed, ids) == ids
    assert stored_answers(killed, ids) is None
