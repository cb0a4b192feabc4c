"""Every bundled sample (samples/**) through every rule of rules.yml: healthy traffic gives no
error, no warning and no event (issue 14 acceptance)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from amqpscope.conf.settings import DEFAULT_PORTS
from amqpscope.expectations.catalogue import CATALOGUE_PATH, load_rules, violations
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.ingest import decode_captures, resolve_captures
from amqpscope.pipelines import tables as lake_tables

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
# samples/bottlenecks (the diagnosis scenarios) go through every rule in
# tests/test_bottleneck_scenarios.py; the encrypted samples (samples/tls) are decrypted with their key logs.
CAPTURES = sorted(p for p in SAMPLES.rglob("*") if p.suffix in (".pcap", ".pcapng") and "bottlenecks" not in p.parts)
KEY_LOGS = sorted((SAMPLES / "tls").glob("*.keylog"))


@pytest.fixture(scope="module")
def found(spark) -> tuple[dict, Counter]:
    """(capture name -> [(rule, severity, evidence)], event counts by (capture name, event id))."""
    captures = resolve_captures([str(c) for c in CAPTURES], group_rotated=False)
    bronze = decode_captures(spark, captures, DEFAULT_PORTS, tls_keylog=KEY_LOGS)
    names = {capture_id(c): c.relative_to(SAMPLES).as_posix() for c in CAPTURES}
    tables = {"frames": bronze.frames, **lake_tables.Build(bronze.tables).build(lake_tables.names(layer="silver"))}
    by_capture: dict[str, list] = {name: [] for name in names.values()}
    for rule in load_rules(CATALOGUE_PATH):
        for row in violations(tables[rule.table], rule).collect():
            by_capture[names[row.capture_id]].append((rule.id, rule.severity, row.channel, dict(row.evidence)))
    events = Counter((names[r.capture_id], r.event_id) for r in tables["events"].collect())
    return by_capture, events


def test_every_sample_is_analysed():
    # 3 bundled, 2 client-side flow samples, 2 decoder samples, 7 encrypted ones (each with its key log).
    assert len(CAPTURES) == 14 and len(KEY_LOGS) == 7


def test_no_error_on_the_samples(found):
    by_capture, _events = found
    errors = {
        name: [(rule, channel) for rule, severity, channel, _evidence in rows if severity == "error"]
        for name, rows in by_capture.items()
    }
    assert errors == {name: [] for name in by_capture}


def test_warnings_on_the_samples(found):
    by_capture, _events = found
    warnings = Counter(
        (name, rule) for name, rows in by_capture.items() for rule, severity, _c, _e in rows if severity == "warning"
    )
    assert warnings == Counter()


def test_events_on_the_samples(found):
    _by_capture, events = found
    # Healthy traffic: nothing closes with an error, aborts or is attached twice.
    assert events == Counter()
