"""Every table analyze writes holds, row for row, what the code before the speed work wrote.

The expected digests (tests/data/table_digests.json, made by tests/table_digests.py) were written by
the commit named in that file, before analyze was made faster; the captures are every real capture
bundled with the repository. A second analyze of the same captures into the same lake, with
generated code where the first interpreted, must leave every table as it was, and so must a third
that reads its tables as a large capture's are read.
"""

from __future__ import annotations

import json
from pathlib import Path

from amqpscope.jobs import lake as lake_module
from amqpscope.jobs import session
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
    # The first run interprets its expressions (the captures are small: jobs.session.sized_for),
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
