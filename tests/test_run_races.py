"""Whole commands racing on one lake, as scheduled jobs overlap: the same capture analysed twice at once
into a new lake (the creation race and the same-capture race in one), on classic Spark and on Sail.

Each capture ends up stored exactly once: its rows in every table are those of a run that was
never raced (the ``samples_lake`` fixture's). A run that lost says so in one line naming the table
and the run that holds or wrote the capture, and exits 1; the others exit 0. These runs are slow
(Spark), so the suite races each case once; ``AMQPSCOPE_RACE_TRIALS`` repeats them. The commit layer
is raced many times over in ``test_lake_races.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake.runs import COMPLETE
from tests.paths import SAMPLES
from tests.test_jobs_kill import reader_state, tables

SMALL = SAMPLES / "amqp10-credit.pcap"
TRIALS = int(os.environ.get("AMQPSCOPE_RACE_TRIALS", "1"))
# The lake's promises hold whichever engine the racing runs use (the rows compared are classic
# Spark's: the engines write the same rows, tests/test_same_rows.py).
# On Sail the race is in the slow tier: two Sail runs at once took 412 s of the suite beside other
# work, against classic Spark's 81 s.
ENGINES = ("spark", pytest.param("sail", marks=pytest.mark.slow))
# What a run that lost the race prints (without -v): one line naming the stage, the table and the other run,
# and where the trace is (jobs/cli/cli.py).
LOST = re.compile(
    r"amqpscope (analyze|ingest): error: stage \w+, table \w+: (CaptureBusy: capture \w{12} is being "
    r"written by run \S+ \(pid \d+ on .+\)|WriteConflict: capture \w{12} was written by run \S+ "
    r"\(pid \d+ on .+\) \(version \d+\) after this run read .+; not written twice)"
    r" \(run with -v for the full trace\)"
)


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "amqpscope", *args, "--progress", "never"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Each process's exit code, stdout and stderr, once it has ended."""
    ended = [p.communicate(timeout=3600) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, ended)]


def errors(stderr: str) -> list[str]:
    """The lines amqpscope itself printed as errors (Spark's own startup warnings aside)."""
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.startswith("amqpscope ")]


def expected(samples_lake, capture: Path) -> dict[str, list[str]]:
    clean, _config, _result = samples_lake
    return {name: rows for name, rows in tables(clean, capture_id(capture)).items() if name != "runs"}


def assert_stored_once(lake: Path, capture: Path, want: dict[str, list[str]]) -> None:
    cid = capture_id(capture)
    found = {name: rows for name, rows in tables(lake, cid).items() if name != "runs" and rows}
    assert found.keys() == {name for name, rows in want.items() if rows}
    for name, rows in found.items():
        assert rows == want[name], name  # the same rows as an unraced run: none missing, none twice
    assert reader_state(lake, cid) == COMPLETE
    assert sorted(str(p) for p in lake.glob("*/_staging")) == []


@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("engine", ENGINES)
def test_the_same_capture_analysed_twice_at_once(samples_lake, tmp_path, engine, trial):
    lake = tmp_path / "lake"
    outcomes = finish([start("analyze", str(SMALL), "--lake", str(lake), "--engine", engine) for _ in range(2)])
    codes = sorted(code for code, _out, _err in outcomes)
    assert codes in ([0, 0], [0, 1]), outcomes
    for code, out, err in outcomes:
        lines = errors(err)
        if code == 0:
            assert lines == [] and json.loads(out)["captures"] == [capture_id(SMALL)]
        else:
            assert len(lines) == 1 and LOST.fullmatch(lines[0]), lines
    assert_stored_once(lake, SMALL, expected(samples_lake, SMALL))
