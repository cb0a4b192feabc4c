"""Runs that overlap on one lake: real processes racing, many times.

On the commit layer (``Lake.write_rows`` and the runs table's marks, no Spark: a few milliseconds a
race), racers write in step at a barrier, most trials after all of them read the table (the stale
snapshot a Spark write commits from). Whatever the interleaving, each capture is stored exactly once,
by one writer, and a racer that did not win was told so in one line naming the table and the run
that won. ``AMQPSCOPE_RACE_TRIALS`` multiplies the trials (the suite runs 1x).
"""

from __future__ import annotations

import os
import re
import socket
from collections import Counter
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.errors import CaptureBusy
from amqpscope.jobs.lake.lake import Lake
from amqpscope.schemas.runs import RUNS_SCHEMA
from tests.racers import ROWS_PER_WRITE, SCHEMA, TABLE, Trial, race

SCALE = int(os.environ.get("AMQPSCOPE_RACE_TRIALS", "1"))
RACERS = 3


def stored(root: str) -> dict[str, list[int]]:
    """capture -> writers of its rows, as a reader of the table finds them."""
    found: dict[str, list[int]] = {}
    for row in DeltaTable(os.path.join(root, TABLE)).to_pyarrow_table().to_pylist():
        found.setdefault(row["capture_id"], []).append(row["writer"])
    return found


def seed(root: str, capture: str) -> None:
    """The table made beforehand with a row of ``capture`` (writer -1), as an earlier run left it."""
    write_deltalake(
        os.path.join(root, TABLE),
        pa.table({"capture_id": [capture], "writer": pa.array([-1], pa.int32()), "n": pa.array([0], pa.int64())}),
        partition_by=["capture_id"],
    )


# (name, captures the racers write, capture already in the table beforehand or None, no table at all)
SCENARIOS = [
    ("one capture, new lake", ("c", "c", "c"), None, True),
    ("two captures, new lake", ("a", "b", "a"), None, True),
    ("one capture new to the table", ("c", "c", "c"), "other", False),
    ("one capture stored before", ("c", "c", "c"), "c", False),
]


@pytest.mark.parametrize(("name", "captures", "before", "new_lake"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_overlapping_writes_store_each_capture_once(tmp_path, name, captures, before, new_lake):
    trials = []
    for number in range(20 * SCALE):
        root = tmp_path / f"trial-{number}"
        root.mkdir()
        if not new_lake:
            seed(str(root), before)
        # Three trials in four read first (a conflict every time); the rest race as they come.
        trials.append(Trial(str(root), captures, read_first=number % 4 != 3))
    outcomes = race(trials, RACERS)

    tally: Counter[str] = Counter()
    for number, trial in enumerate(trials):
        results = outcomes[number]
        assert not [o for o in results.values() if o.startswith("error")], (name, number, results)
        found = stored(trial.root)
        for capture in set(captures):
            writers = found.get(capture, [])
            # Stored once: the rows of exactly one racer, all of them.
            assert len(writers) == ROWS_PER_WRITE and len(set(writers)) == 1, (name, number, capture, found, results)
            winner = writers[0]
            assert results[winner] == "ok", (name, number, results)
            racing = [i for i, c in enumerate(captures) if c == capture]
            for loser in (i for i in racing if results[i] != "ok"):
                # One line: the table, the captures and the run that committed first.
                message = results[loser]
                assert "\n" not in message
                assert re.fullmatch(
                    r"conflict: table t: capture \w+ was written by run racer-\d \(pid \d+ on .+\) "
                    r"\(version \d+\) after this run read (version \d+|no table yet); not written twice",
                    message,
                ), message
            if trial.read_first:
                assert sum(results[i] == "ok" for i in racing) == 1, (name, number, results)
            tally.update(results[i].split(":")[0] for i in racing)
        if before is not None and before not in captures:
            assert found[before] == [-1]  # another capture's rows are left as they were
    print(f"{name}: {len(trials)} trials of {RACERS} racers: {dict(tally)}")


def test_a_write_whose_staging_parent_another_write_removes_still_commits(tmp_path, monkeypatch):
    """The instant a race once hit in CI (the staging parent made, then removed as empty by a write
    that finished, before this write's folder was made in it), made to happen every time."""
    lake = Lake(None, tmp_path, backend="delta-rs", run_id="run-1")
    lake.write_rows([{"capture_id": "a", "writer": 0, "n": 0}], SCHEMA, TABLE, replace_capture_ids=["a"])
    real_makedirs = os.makedirs
    removed = []

    def makedirs_then_another_write_finishes(name, mode=0o777, exist_ok=False):
        real_makedirs(name, mode, exist_ok)
        if os.path.basename(name) == "_staging" and not removed:
            os.rmdir(name)  # what the finishing write does to the parent it finds empty
            removed.append(name)

    monkeypatch.setattr(os, "makedirs", makedirs_then_another_write_finishes)
    rows = [{"capture_id": "b", "writer": 1, "n": n} for n in range(ROWS_PER_WRITE)]
    lake.write_rows(rows, SCHEMA, TABLE, replace_capture_ids=["b"])
    monkeypatch.undo()

    assert removed == [str(tmp_path / TABLE / "_staging")]
    assert stored(str(tmp_path)) == {"a": [0], "b": [1] * ROWS_PER_WRITE}
    assert not (tmp_path / TABLE / "_staging").exists()


def test_leases_let_one_run_claim_a_capture(tmp_path):
    trials = []
    for number in range(30 * SCALE):
        root = tmp_path / f"trial-{number}"
        root.mkdir()
        trials.append(Trial(str(root), ("c", "c", "c"), read_first=False, action="claim"))
    outcomes = race(trials, RACERS)
    for number, trial in enumerate(trials):
        results = outcomes[number]
        winners = [i for i, o in results.items() if o == "ok"]
        assert len(winners) == 1, (number, results)
        lake = Lake(None, trial.root, backend="delta-rs")
        rows = runs.stage_runs(lake)
        assert list(rows) == [("c", "ingest")]
        assert rows[("c", "ingest")].run_id == f"racer-{winners[0]}"
        for loser in (i for i in results if i != winners[0]):
            assert results[loser].startswith(f"busy: run racer-{winners[0]} (pid "), results


def runs_row(run_id: str, owner: str, lease_until: datetime, outcome: str = "running") -> dict:
    now = datetime.now(UTC)
    return {
        "capture_id": "c",
        "stage": "derive",
        "run_id": run_id,
        "started": now - timedelta(minutes=5),
        "ended": None,
        "outcome": outcome,
        "source_run": None,
        "owner": owner,
        "lease_until": lease_until,
    }


def test_a_lease_expires_with_its_run(tmp_path):
    lake = Lake(None, tmp_path, backend="delta-rs")
    now = datetime.now(UTC)
    dead_pid = _free_pid()
    host = socket.gethostname()
    cases = [
        # (owner, lease_until, whether another run must wait)
        ("pid 1 on " + host, now - timedelta(hours=1), True),  # alive on this host (init): expiry does not matter
        (f"pid {dead_pid} on {host}", now + timedelta(hours=1), False),  # killed on this host: free at once
        ("pid 7 on another-host", now + timedelta(hours=1), True),  # another host's, lease not expired
        ("pid 7 on another-host", now - timedelta(seconds=1), False),  # another host's, expired
    ]
    for owner, until, waits in cases:
        lake.write_rows([runs_row("earlier", owner, until)], RUNS_SCHEMA, runs.RUNS_TABLE, replace_capture_ids=["c"])
        if waits:
            with pytest.raises(
                CaptureBusy, match=r"table runs: capture c is being written by run earlier \(" + re.escape(owner)
            ):
                runs.mark(lake, "later", "ingest", ["c"], "running")
            assert runs.busy(lake, "later", ["c"]) == [
                ("c", runs.stage_runs(lake)[("c", "derive")].holder(datetime.now(UTC)))
            ]
        else:
            runs.mark(lake, "later", "ingest", ["c"], "running")
            assert runs.stage_runs(lake)[("c", "ingest")].run_id == "later"
        lake.write_rows([], RUNS_SCHEMA, runs.RUNS_TABLE, replace_capture_ids=["c"])


def _free_pid() -> int:
    """A process id no process has now (one that ran and ended)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid
