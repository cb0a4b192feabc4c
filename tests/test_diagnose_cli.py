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
from amqpscope.jobs.cli.diagnose import exit_code, incomplete, stored_answers, typed_evidence
from amqpscope.jobs.cli.outcomes import ExitCode
from amqpscope.jobs.lake.read import read_table
from amqpscope.schemas.runs import OUTCOME_RUNNING
from tests.paths import SAMPLES

SAMPLE = SAMPLES / "flow" / "amqp091-memory-alarm.pcap"


def diagnose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amqpscope.jobs.cli.cli", "diagnose", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def first_answer(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """The first diagnose of the sample, into a new lake: it analyses the capture (Spark starts)."""
    root = tmp_path_factory.mktemp("diagnose-lake")
    first = diagnose(str(SAMPLE), "--lake", str(root), "--progress", "never")
    assert first.returncode == ExitCode.BOTTLENECK, first.stderr[-3000:]
    return root, first


@pytest.fixture(scope="module")
def lake(first_answer) -> Path:
    return first_answer[0]


def test_a_run_that_starts_spark_prints_only_its_own_lines(first_answer):
    """Without -v nothing of the engine's own reaches stderr (the JVM's warnings, log4j's defaults,
    Spark's first WARN lines): only the headline analyze prints as soon as it is known."""
    root, first = first_answer
    [diagnosis], _ = stored_answers(root, [capture_id(SAMPLE)])
    assert first.stderr.splitlines() == [f"{capture_id(SAMPLE)[:12]}: {diagnosis['headline']}"]


def test_the_answer_names_the_alarm_the_connection_and_where_to_look(lake):
    answer = diagnose(str(SAMPLE), "--lake", str(lake))
    assert answer.returncode == ExitCode.BOTTLENECK, answer.stderr[-3000:]
    lines = answer.stdout.splitlines()
    assert lines[0] == f"{SAMPLE} (capture {capture_id(SAMPLE)[:12]})"
    assert lines[1].startswith("  Bottleneck: memory alarm (blocked) on connection ")
    assert 'connection.blocked("low on memory")' in answer.stdout
    assert lines[2].startswith("  1. memory_alarm / blocked: connection ")
    assert any(line.strip().startswith("Wireshark: tcp.port == ") for line in lines)


def test_a_stored_answer_needs_no_spark(lake):
    # No Java on the PATH: starting Spark would fail, so the answer must come from the lake alone.
    env = {**os.environ, "PATH": "/nonexistent", "JAVA_HOME": "/nonexistent"}
    answer = diagnose(str(SAMPLE), "--lake", str(lake), "--json", env=env)
    assert answer.returncode == ExitCode.BOTTLENECK, answer.stderr[-3000:]
    (capture,) = json.loads(answer.stdout)["captures"]
    assert (capture["capture_id"], capture["bottleneck"], capture["findings_count"]) == (
        capture_id(SAMPLE),
        "memory_alarm",
        1,
    )
    (finding,) = capture["findings"]
    assert finding["rule_id"] == "diagnosis.alarm.connection_blocked"
    # Numbers as numbers, flags as booleans, text as text: typed by the catalogue's units.
    evidence = finding["evidence"]
    assert evidence["reason"] == "low on memory" and evidence["unblocked"] is True
    assert isinstance(evidence["notifications"], int) and isinstance(evidence["blocked_seconds"], float)
    assert evidence["blocked_seconds"] == pytest.approx(finding["duration_us"] / 1e6, abs=0.0005)


def test_a_missing_file_is_named(tmp_path):
    answer = diagnose(str(tmp_path / "nope.pcap"), "--lake", str(tmp_path / "lake"))
    assert answer.returncode == 2
    assert "nope.pcap" in answer.stderr


def test_a_usage_error_exits_2_and_help_gives_the_exit_statuses():
    assert diagnose("--no-such-flag", "x.pcap").returncode == 2
    shown = diagnose("--help")
    assert shown.returncode == 0
    assert "0 no bottleneck" in " ".join(shown.stdout.split()) and "3 a bottleneck found" in " ".join(
        shown.stdout.split()
    )


@pytest.mark.parametrize(
    "verdicts, status",
    [
        (["none"], ExitCode.OK),
        (["none", "none"], ExitCode.OK),
        (["none", "consumer"], ExitCode.BOTTLENECK),
        (["client"], ExitCode.BOTTLENECK),
        (["network", "none"], ExitCode.BOTTLENECK),
        (["encrypted"], ExitCode.NOTHING_TO_JUDGE),
        (["no_amqp", "encrypted"], ExitCode.NOTHING_TO_JUDGE),
        (["encrypted", "none"], ExitCode.OK),
        (["encrypted", "queue"], ExitCode.BOTTLENECK),
        ([], ExitCode.OK),
    ],
)
def test_the_exit_code_says_whether_any_capture_has_a_bottleneck(verdicts, status):
    assert exit_code([{"bottleneck": v} for v in verdicts]) == status


def test_evidence_is_typed_by_its_rules_units_and_other_text_is_kept():
    typed = typed_evidence(
        "diagnosis.publisher.credit_flow",
        {
            "publishes": "120",
            "held_share": "0.250",
            "queues": "q1,q2",
            "client_product": "Pika",
            "zero_window_seconds": None,
        },
    )
    assert typed == {
        "publishes": 120,
        "held_share": 0.25,
        "queues": "q1,q2",
        "client_product": "Pika",
        "zero_window_seconds": None,
    }
    assert typed_evidence("tls.unknown_rule", {"n": "3"}) == {"n": "3"}


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
