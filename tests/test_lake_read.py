"""Every delta-rs read goes through ``jobs.lake.read``, which cannot abort the process at exit.

deltalake's own ``to_pyarrow_table`` reads through a filesystem written in Python; an Arrow thread
may release one of its files while the interpreter finalizes, and the process then aborts
("terminate called without an active exception", exit status 134), about one run in ten here. A
child process that reads a table and exits is run many times: every one must exit 0 with its rows.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from amqpscope.jobs.lake.read import add_actions, read_rows, read_table

RUNS = 40
CHILD = """
import sys
from amqpscope.jobs.lake.read import read_rows
rows = read_rows(sys.argv[1], sys.argv[2:] or None)
print(len(rows), sum(r["x"] for r in rows))
"""


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    """Many files in many partitions (each may be released on a pool thread), a few appends deep."""
    path = tmp_path_factory.mktemp("lake-read") / "t"
    for round_ in range(5):
        write_deltalake(
            str(path),
            pa.table(
                {"capture_id": [f"c{i % 20}" for i in range(200)], "x": list(range(round_ * 200, round_ * 200 + 200))}
            ),
            mode="append",
            partition_by=["capture_id"],
        )
    return path


def test_the_helper_reads_what_deltalake_reads(table):
    ours = read_table(table).sort_by([("capture_id", "ascending"), ("x", "ascending")])
    theirs = DeltaTable(str(table)).to_pyarrow_table().sort_by([("capture_id", "ascending"), ("x", "ascending")])
    assert ours.to_pylist() == theirs.to_pylist() and ours.num_rows == 1000
    chosen = read_rows(table, ["c3", "c7"])
    assert sorted({r["capture_id"] for r in chosen}) == ["c3", "c7"] and len(chosen) == 100
    assert read_rows(table.parent / "no-such-table") == []
    assert sorted(set(add_actions(table)["partition.capture_id"])) == sorted(f"c{i}" for i in range(20))


def test_a_read_then_exit_never_aborts(table):
    expected = f"1000 {sum(range(1000))}"

    def child(_: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", CHILD, str(table)], capture_output=True, text=True, timeout=300, check=False
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(child, range(RUNS)))
    aborted = [r for r in runs if r.returncode != 0 or "terminate called" in r.stderr]
    assert aborted == [], f"{len(aborted)} of {RUNS} runs failed: {aborted[0].returncode} {aborted[0].stderr[-500:]}"
    assert {r.stdout.strip() for r in runs} == {expected}
