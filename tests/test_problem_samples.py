"""The committed problem captures (samples/problems): each one's broker truth gives what it was built for.

``expected_bottleneck`` and ``expected_findings`` read the states and running totals RabbitMQ
reported while the capture ran (and the clients' record where the broker is blind), so this is how
we know each scenario really produced its problem with its real client library, and that each
near miss is healthy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed import truth as broker_truth
from testbed.capture import capture_file_name
from testbed.problem_network import LINK_SCENARIOS
from testbed.problem_scenarios import FINDINGS, INTENDED, PROBLEM_SCENARIOS
from testbed.truth import expected_bottleneck, expected_findings
from tests.test_bottleneck_samples import packet_times_us

SAMPLES = Path(__file__).resolve().parent.parent / "samples" / "problems"
BOTTLENECK_SAMPLES = SAMPLES.parent / "bottlenecks"
MAX_CAPTURE_BYTES = 3_000_000
MAX_TOTAL_BYTES = 35_000_000
TRUTHS = sorted(SAMPLES.glob("*.truth.json"))


def _truth(path: Path) -> dict:
    return json.loads(path.read_text())


def _clients(truth: dict) -> list[dict]:
    return truth["ground_truth"][truth["scenario"]]["clients"]


def test_every_scenario_has_its_capture() -> None:
    names = {_truth(p)["scenario"] for p in TRUTHS}
    assert names == set(PROBLEM_SCENARIOS) | set(LINK_SCENARIOS)


def test_the_captures_are_small() -> None:
    sizes = [p.with_name(capture_file_name(_truth(p)["scenario"], pcapng=False)).stat().st_size for p in TRUTHS]
    assert max(sizes) <= MAX_CAPTURE_BYTES and sum(sizes) <= MAX_TOTAL_BYTES


@pytest.mark.parametrize("truth_file", TRUTHS, ids=lambda p: p.name.split(".")[0])
def test_broker_truth_is_the_intended_bottleneck(truth_file: Path) -> None:
    truth = _truth(truth_file)
    scenario = truth["scenario"]
    component, entity = expected_bottleneck(truth)
    assert component == INTENDED.get(scenario, "none")
    assert truth["intended_bottleneck"] == INTENDED.get(scenario, "none")
    assert (entity is None) == (component == "none")


@pytest.mark.parametrize("truth_file", TRUTHS, ids=lambda p: p.name.split(".")[0])
def test_broker_truth_gives_the_intended_findings(truth_file: Path) -> None:
    truth = _truth(truth_file)
    expected = FINDINGS.get(truth["scenario"], frozenset())
    assert expected_findings(truth) == expected
    assert set(truth["intended_findings"]) == expected


@pytest.mark.parametrize("truth_file", TRUTHS, ids=lambda p: p.name.split(".")[0])
def test_broker_states_are_on_the_captures_clock(truth_file: Path) -> None:
    truth = _truth(truth_file)
    capture = truth_file.with_name(capture_file_name(truth["scenario"], pcapng=False))
    first_packet, last_packet, packets = packet_times_us(capture)
    assert packets == truth["capture"]["packets_captured"]
    samples = truth["broker_states"]["samples"]
    stamps = [s["ts_us"] for s in samples]
    assert truth["broker_states"]["sampler_errors"] == []
    assert len(stamps) >= 8 and stamps == sorted(stamps)
    interval = truth["broker_states"]["interval_ms"] * 1000
    for before, after in zip(samples, samples[1:]):
        assert after["ts_us"] - before["ts_us"] <= max(interval, before["took_us"]) + 250_000
    assert stamps[0] - 1_000_000 <= first_packet and last_packet <= stamps[-1] + 2_500_000
    # Every sample carries the node's running totals the problem rules read.
    assert all("messages_received_total" in s["counters"] and "connection_created" in s["counters"] for s in samples)


@pytest.mark.parametrize("truth_file", TRUTHS, ids=lambda p: p.name.split(".")[0])
def test_every_client_connection_is_in_the_brokers_view(truth_file: Path) -> None:
    truth = _truth(truth_file)
    samples = truth["broker_states"]["samples"]
    # AMQP 1.0 connections show only as the plugin's channel named after the client's address and port.
    seen = {c["peer_port"] for s in samples for c in s["connections"]}
    seen |= {c["peer_port"] for s in samples for c in s["channels"]}
    ports = {c["client_port"] for c in _clients(truth)} - {None}
    assert ports & seen
    roles = {c["role"] for c in truth["broker_summary"]["clients"]}
    assert roles <= {"publisher", "consumer"}


def test_at_least_three_client_libraries() -> None:
    libraries = {c.get("client_library") for p in TRUTHS for c in _clients(_truth(p))}
    assert {"celery", "aio-pika", "kombu", "pika", "python-qpid-proton"} <= libraries


# -- what the clients recorded agrees with what the broker counted --------------------------------


def _counted(truth: dict, name: str) -> int:
    delta = broker_truth._counter_delta(truth["broker_states"]["samples"], name)
    assert delta is not None
    return delta


def _sample(name: str) -> dict:
    return _truth(SAMPLES / f"{name.replace('_', '-')}.truth.json")


def test_the_nacks_the_publisher_got_are_the_publishes_the_broker_refused() -> None:
    truth = _sample("reject_publish_nacks")
    (publisher,) = _clients(truth)
    assert publisher["nacks_received"] == broker_truth.refused_publishes(truth["broker_states"]["samples"])
    assert publisher["nacks_received"] + publisher["acks_received"] == publisher["messages"]
    assert publisher["nacks_received"] > publisher["acks_received"]


def test_the_returns_the_publisher_got_are_the_ones_the_broker_counted() -> None:
    truth = _sample("unroutable_returns")
    publisher = next(c for c in _clients(truth) if c["role"] == "publisher")
    assert sum(publisher["returns_received"].values()) == _counted(truth, "messages_unroutable_returned_total")
    assert set(publisher["returns_received"]) == {"312 NO_ROUTE"}


def test_the_redeliveries_the_consumer_saw_are_the_brokers() -> None:
    truth = _sample("requeue_loop")
    consumer = next(c for c in _clients(truth) if c["role"] == "consumer")
    # Each requeue is redelivered; the last may be on its way when the consumer cancels.
    assert consumer["redeliveries"] <= _counted(truth, "messages_redelivered_total") <= consumer["nacked_requeue"]
    assert consumer["acked"] == 0 and consumer["redeliveries"] >= broker_truth.REDELIVERY_MIN


def test_the_churning_publishers_opened_the_connections_the_broker_counted() -> None:
    truth = _sample("connection_churn")
    publishers = [c for c in _clients(truth) if c["role"] == "publisher"]
    opened = sum(c["connections_opened"] for c in publishers)
    # Besides the publishers': the consumer's, the scenario's setup and teardown connections.
    assert opened <= _counted(truth, "connection_created") <= opened + 4
    assert all(c["publishes_per_connection"] == 1 for c in publishers)


def test_celery_applies_its_prefetch_channel_wide() -> None:
    truth = _sample("celery_slow_worker")
    worker = next(c for c in _clients(truth) if c["client_library"] == "celery" and c["role"] == "consumer")
    samples = truth["broker_states"]["samples"]
    task_channels = {c["channel_pid"] for s in samples for c in s["consumers"] if c["queue"] == worker["queue"]}
    limits = {
        (ch["prefetch_count"], ch["global_prefetch_count"])
        for s in samples
        for ch in s["channels"]
        if ch["pid"] in task_channels
    }
    assert {ch["peer_port"] for s in samples for ch in s["channels"] if ch["pid"] in task_channels} <= set(
        worker["client_ports"]
    )
    assert limits == {(0, worker["prefetch_count"])}


def test_the_slow_responder_takes_most_of_each_call() -> None:
    slow, fast = _sample("request_reply_slow_responder"), _sample("request_reply_fast")
    (caller,) = [c for c in _clients(slow) if c.get("rpc") == "caller"]
    (quick,) = [c for c in _clients(fast) if c.get("rpc") == "caller"]
    for call in caller["call_timings"]:
        assert call["request_sent_us"] <= call["request_received_us"] <= call["reply_sent_us"]
        assert call["reply_sent_us"] <= call["reply_received_us"]
    assert caller["median_responder_us"] >= 0.9 * 40_000
    assert quick["median_call_us"] < broker_truth.CALL_SLOW_US


# -- the new rules give no finding on the healthy bottleneck captures ------------------------------


HEALTHY_BOTTLENECK_SAMPLES = [
    "healthy",
    "fast-consumer-at-prefetch",
    "busy-healthy-mix",
    "confirm-paced",
    "fan-in-quorum-paced",
    "prefetch-one-empty-queue",
    "spurious-retransmission",
]


@pytest.mark.parametrize("name", HEALTHY_BOTTLENECK_SAMPLES)
def test_healthy_bottleneck_captures_give_no_finding(name: str) -> None:
    assert expected_findings(_truth(BOTTLENECK_SAMPLES / f"{name}.truth.json")) == set()
