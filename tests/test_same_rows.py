"""Every table analyze writes holds, row for row, what the code before the speed work wrote.

The expected digests (tests/data/table_digests.json, made by tests/table_digests.py) were written by
the commit named in that file, before analyze was made faster; the captures are every real capture
bundled with the repository. A second analyze of the same captures into the same lake, with
generated code where the first interpreted, must leave every table as it was, and so must a third
that reads its tables as a large capture's are read.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from amqpscope.jobs.engine import session
from amqpscope.jobs.lake import lake as lake_module
from amqpscope.jobs.lake.lake import Lake
from tests.table_digests import CAPTURES, ROOT, analyze_samples, table_digests

EXPECTED = Path(__file__).resolve().parent / "data" / "table_digests.json"


def differences(got: dict, want: dict) -> list[str]:
    """Tables (and captures) whose rows differ, named, or that are in only one of the two."""
    found = []
    for table in sorted(set(got) | set(want)):
        for capture in sorted(set(got.get(table, {})) | set(want.get(table, {}))):
            g, w = got.get(table, {}).get(capture), want.get(table, {}).get(capture)
            if g != w:
                found.append(f"{table} / {capture[:12]}: {g} != {w}")
    return found


def test_every_table_equals_the_code_before_and_a_rerun_changes_nothing(spark, tmp_path, monkeypatch):
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    assert expected["captures"] == [str(c.relative_to(ROOT)) for c in CAPTURES]
    # The first run interprets its expressions (the captures are small: jobs.engine.session.sized_for),
    # the second generates code for them, as a larger capture would: both write the same rows.
    # It also joins without broadcasts (small enough: JOINS_UNBROADCAST_UP_TO_BYTES).
    assert sum(c.stat().st_size for c in CAPTURES) <= session.JOINS_UNBROADCAST_UP_TO_BYTES
    assert session.JOINS_UNBROADCAST_UP_TO_BYTES <= session.INTERPRETED_UP_TO_BYTES
    lake = tmp_path / "lake"
    analyze_samples(spark, lake)
    first = table_digests(spark, lake)
    # Tables newer than the digests file are compared once the file is written again with them.
    assert differences({t: d for t, d in first.items() if t in expected["tables"]}, expected["tables"]) == []
    monkeypatch.setattr(session, "INTERPRETED_UP_TO_BYTES", -1)
    analyze_samples(spark, lake)
    assert differences(table_digests(spark, lake), first) == []
    # And as a large capture is derived: no table is kept through the driver, so derive reads the
    # persisted decoded rows for the frames' windows and the stored frames for the rest.
    monkeypatch.setattr(lake_module, "KEPT_UP_TO_BYTES", -1)
    analyze_samples(spark, lake)
    assert differences(table_digests(spark, lake), first) == []


@pytest.mark.slow  # every sample derived again; tests/test_sail.py analyses one end to end in the fast tier
def test_every_table_derived_on_sail_equals_classic_from_the_same_bronze(spark, tmp_path):
    # The captures analysed on classic Spark; then every derived table written again by derive on
    # Sail (in a process of its own: tests.engine_derive), from the same bronze tables, in a copy of
    # that lake. Both lakes read back on classic Spark.
    classic = tmp_path / "classic"
    analyze_samples(spark, classic)
    on_sail = tmp_path / "sail"
    shutil.copytree(classic, on_sail)
    ids = sorted(Lake(spark, classic).capture_ids("captures"))
    run = subprocess.run(
        [sys.executable, "-m", "tests.engine_derive", "sail", str(on_sail)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    done = json.loads(run.stdout.splitlines()[-1])
    assert (done["engine"], done["derived"], done["suites_passed"]) == ("sail", ids, True)
    want, got = table_digests(spark, classic), table_digests(spark, on_sail)
    assert sorted(got) == sorted(want)
    assert differences(got, want) == []
