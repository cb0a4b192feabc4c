"""Every bundled sample (samples/**) through every rule of rules.yml: healthy traffic gives no
error, no warning and no event (issue 14 acceptance). The real clients' problem captures
(samples/problems) give none either, but for one warning that is the broker's own and true."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from amqpscope.conf.settings import DEFAULT_PORTS
from amqpscope.expectations.catalogue import CATALOGUE_PATH, load_rules, violations
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.stages.decode import decode_captures, resolve_captures
from amqpscope.pipelines import tables as lake_tables
from testbed.tshark import TSHARK_PREFERENCES, tshark_available

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


# RabbitMQ 3.10's AMQP 1.0 plugin, answering a client that sent its last transfer and its close in
# one segment, writes its own close and then the transfer's disposition (AMQP 1.0 2.4.3: a close
# means no more frames follow). The warning is true; test_the_one_warning_is_a_frame_after_the_brokers_close
# checks it with tshark.
BROKER_FRAME_AFTER_CLOSE = "problems/amqp10-senders-paced.pcap"
EXPECTED_WARNINGS = Counter({(BROKER_FRAME_AFTER_CLOSE, "amqp10.connection.frame_after_close"): 1})


def test_every_sample_is_analysed():
    # 3 bundled, 2 client-side flow samples, 2 decoder samples, 7 encrypted ones (each with its key
    # log), 20 real clients' problems and their near misses.
    assert len(CAPTURES) == 34 and len(KEY_LOGS) == 7
    assert sum(1 for c in CAPTURES if "problems" in c.parts) == 20


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
    assert warnings == EXPECTED_WARNINGS


@pytest.mark.skipif(not tshark_available(), reason="tshark not installed")
def test_the_one_warning_is_a_frame_after_the_brokers_close(found):
    by_capture, _events = found
    (warning,) = [row for row in by_capture[BROKER_FRAME_AFTER_CLOSE] if row[1] == "warning"]
    # tshark's dissection: the AMQP 1.0 frames the broker (port 5672) sent on each TCP stream, in order.
    listed = subprocess.run(
        [
            "tshark",
            "-r",
            str(SAMPLES / BROKER_FRAME_AFTER_CLOSE),
            *TSHARK_PREFERENCES,
            "-Y",
            "amqp && tcp.srcport == 5672",
        ]
        + ["-T", "fields", "-e", "tcp.stream", "-e", "amqp.performative", "-e", "amqp.channel"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after_close: list[tuple[str, str]] = []
    closed: set[str] = set()
    for line in listed.splitlines():
        stream, performatives, channels = (line.split("\t") + ["", ""])[:3]
        for performative, channel in zip(performatives.split(","), channels.split(",")):
            if stream in closed:
                after_close.append((performative, channel))
            if performative == "24":  # close
                closed.add(stream)
    assert after_close == [("21", "0")]  # one disposition, on channel 0
    assert (warning[0], warning[2], warning[3]["direction"]) == (
        "amqp10.connection.frame_after_close",
        0,
        "s2c",
    )


def test_events_on_the_samples(found):
    _by_capture, events = found
    # Healthy traffic: nothing closes with an error, aborts or is attached twice.
    assert events == Counter()
