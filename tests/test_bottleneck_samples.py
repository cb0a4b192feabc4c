"""The committed bottleneck captures (samples/bottlenecks): each one's broker truth says what it was built for.

``expected_bottleneck`` reads only the states RabbitMQ reported while the capture ran, so this is
how we know each scenario really produced its bottleneck; ``INTENDED`` is what the scenario was
designed to produce.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from testbed.bottleneck_scenarios import BOTTLENECK_SCENARIOS, INTENDED
from testbed.capture import capture_file_name
from testbed.truth import expected_bottleneck

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "bottlenecks"
MAX_CAPTURE_BYTES = 6_000_000
TRUTHS = sorted(SAMPLES.glob("*.truth.json"))


def packet_times_us(path: Path) -> tuple[int, int, int]:
    """First and last packet timestamps (µs since the epoch) and the packet count of a pcap."""
    data = path.read_bytes()
    magic = struct.unpack_from("<I", data)[0]
    order = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    nanos = struct.unpack_from(order + "I", data)[0] == 0xA1B23C4D
    offset, stamps = 24, []
    while offset + 16 <= len(data):
        seconds, fraction, captured, _length = struct.unpack_from(order + "IIII", data, offset)
        stamps.append(seconds * 1_000_000 + (fraction // 1000 if nanos else fraction))
        offset += 16 + captured
    return min(stamps), max(stamps), len(stamps)


def test_every_scenario_has_its_capture() -> None:
    names = {json.loads(p.read_text())["scenario"] for p in TRUTHS}
    assert names == set(BOTTLENECK_SCENARIOS)


@pytest.mark.parametrize("truth_file", TRUTHS, ids=lambda p: p.name.split(".")[0])
def test_broker_truth_is_the_intended_bottleneck(truth_file: Path) -> None:
    truth = json.loads(truth_file.read_text())
    scenario = truth["scenario"]
    component, entity = expected_bottleneck(truth)
    assert component == INTENDED[scenario]
    assert truth["intended_bottleneck"] == INTENDED[scenario]
    assert (entity is None) == (component == "none")


@pytest.mark.parametrize("truth_file", TRUTHS, ids=lambda p: p.name.split(".")[0])
def test_broker_states_are_on_the_captures_clock(truth_file: Path) -> None:
    truth = json.loads(truth_file.read_text())
    capture = truth_file.with_name(capture_file_name(truth["scenario"], pcapng=False))
    assert capture.exists() and capture.stat().st_size <= MAX_CAPTURE_BYTES
    first_packet, last_packet, packets = packet_times_us(capture)
    assert packets == truth["capture"]["packets_captured"]
    samples = truth["broker_states"]["samples"]
    stamps = [s["ts_us"] for s in samples]
    assert truth["broker_states"]["sampler_errors"] == []
    assert len(stamps) >= 8 and stamps == sorted(stamps)
    # One sample every 0.25 s, later by the time the broker took to answer the previous one (busy
    # queue processes answer info calls late under credit flow) and by at most 0.25 s of
    # scheduling delay on this shared machine.
    interval = truth["broker_states"]["interval_ms"] * 1000
    for before, after in zip(samples, samples[1:]):
        assert after["ts_us"] - before["ts_us"] <= max(interval, before["took_us"]) + 250_000
    # The samples span the traffic: the capture starts before the clients and ends after them.
    assert stamps[0] - 1_000_000 <= first_packet and last_packet <= stamps[-1] + 2_500_000
    assert truth["broker_summary"]["samples"] == len(stamps)


@pytest.mark.parametrize("truth_file", TRUTHS, ids=lambda p: p.name.split(".")[0])
def test_every_client_connection_is_in_the_brokers_view(truth_file: Path) -> None:
    truth = json.loads(truth_file.read_text())
    seen = {c["peer_port"] for s in truth["broker_states"]["samples"] for c in s["connections"]}
    ports = {c["client_port"] for c in truth["ground_truth"][truth["scenario"]]["clients"]}
    # A short-lived setup or filler connection can fall between two samples; the scenario's own cannot.
    assert ports & seen
    roles = {c["role"] for c in truth["broker_summary"]["clients"]}
    assert roles <= {"publisher", "consumer"}
