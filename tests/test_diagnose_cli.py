"""``amqpscope diagnose`` as a user runs it: the answer in plain text and JSON, from the lake without Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqpscope.ingest.pcap import capture_id

SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "flow" / "amqp091-memory-alarm.pcap"


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
