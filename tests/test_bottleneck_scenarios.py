"""The diagnosis of real captures against the broker's own states (issue 11's acceptance).

Every capture under ``samples/bottlenecks/`` was made with RabbitMQ sampling its own connection,
channel, queue and alarm states every 0.25 s (``testbed.broker_states``); ``testbed.truth`` reads
the expected bottleneck from those states alone. The wire-only diagnosis must name the same
component, and the entity the scenario's clients say was held back. The bundled healthy captures
(``samples/*.pcap*``, ``samples/decoders/``) must give none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake.lake import Lake
from testbed.bottleneck_scenarios import INTENDED, WIRE_BLIND
from testbed.truth import expected_bottleneck
from tests.paths import BOTTLENECK_SCENARIOS as SCENARIOS
from tests.paths import FLOW_SAMPLES, SAMPLES
from tests.paths import HEALTHY_SAMPLES as HEALTHY


def truth_of(capture: Path) -> dict:
    return json.loads(capture.with_name(capture.name.rsplit(".", 1)[0] + ".truth.json").read_text())


def clients_of(capture: Path) -> list[dict]:
    (scenario,) = truth_of(capture)["ground_truth"].values()
    return scenario.get("clients", [])


@pytest.fixture(scope="module")
def lake(bottleneck_lake):
    return bottleneck_lake


def findings(lake, capture: Path) -> list:
    return [f for f in lake["bottlenecks"] if f.capture_id == capture_id(capture)]


def test_every_scenario_has_its_truth():
    assert {c.stem.replace("-", "_") for c in SCENARIOS} == set(INTENDED)
    assert all("broker_states" in truth_of(c) for c in SCENARIOS)


@pytest.mark.parametrize("capture", SCENARIOS, ids=lambda c: c.stem)
def test_diagnosis_names_the_component_the_broker_states_point_at(lake, capture):
    expected, _entity = expected_bottleneck(truth_of(capture))
    diagnosis = lake["diagnosis"][capture_id(capture)]
    if capture.stem in WIRE_BLIND:
        assert WIRE_BLIND[capture.stem] == expected  # the broker's truth is still what the note says
        assert diagnosis.bottleneck == "none", diagnosis.headline
    else:
        assert diagnosis.bottleneck == expected, diagnosis.headline


def test_alarm_samples_from_the_client_side_are_diagnosed_too(lake):
    by_stem = {c.stem: lake["diagnosis"][capture_id(c)] for c in FLOW_SAMPLES}
    # The clients' truth: the memory alarm raised and cleared, the consumer acking 20 ms after each delivery.
    assert (
        truth_of(SAMPLES / "flow" / "amqp091-memory-alarm.pcap")["ground_truth"]["amqp091_memory_alarm"]["alarm"]
        == "memory"
    )
    assert by_stem["amqp091-memory-alarm"].bottleneck == "memory_alarm"
    assert by_stem["amqp091-slow-consumer"].bottleneck == "consumer"


def problems_the_truth_names(capture: Path) -> set[str]:
    """The problem rules a healthy capture's own truth calls for: publishes the broker nacked, messages it
    returned (the decoder sample exercises both, on purpose)."""
    named = set()
    for truth in truth_of(capture)["ground_truth"].values():  # mixed.pcapng holds two scenarios
        if truth.get("confirms_nacked"):
            named.add("diagnosis.publisher.nacked")
        if truth.get("returned"):
            named.add("diagnosis.publisher.unroutable")
    return named


@pytest.mark.parametrize("capture", HEALTHY, ids=lambda c: c.name)
def test_healthy_captures_have_no_bottleneck(lake, capture):
    diagnosis = lake["diagnosis"][capture_id(capture)]
    assert diagnosis.bottleneck == "none", diagnosis.headline
    # No finding but the problems the capture's truth says it has (a nacked publish, a returned message).
    assert {f.kind for f in diagnosis.findings} <= {"problem"}, diagnosis.headline
    assert {f.rule_id for f in findings(lake, capture)} == problems_the_truth_names(capture), diagnosis.headline


def test_the_slow_consumer_is_the_one_the_client_slowed(lake):
    capture = SAMPLES / "bottlenecks" / "slow-consumer.pcap"
    slow = [c for c in clients_of(capture) if c.get("role") == "consumer"]
    top = findings(lake, capture)[0]
    assert (top.component, top.entity_kind) == ("consumer", "consumer")
    assert top.queue in {c["queue"] for c in slow}


def test_the_slow_link_is_named_and_its_fast_neighbour_is_not(lake):
    capture = SAMPLES / "bottlenecks" / "amqp10-slow-link.pcap"
    links = {c["link"]: c["link_speed"] for c in clients_of(capture) if c.get("protocol") == "amqp-1.0"}
    flagged = {f.link_name for f in findings(lake, capture) if f.rule_id == "diagnosis.consumer.credit_bound"}
    assert flagged == {name for name, speed in links.items() if speed == "slow"}


def test_the_client_not_reading_is_the_slow_reader(lake):
    capture = SAMPLES / "bottlenecks" / "slow-reader.pcap"
    (reader,) = [c for c in clients_of(capture) if c.get("role") == "consumer"]
    top = findings(lake, capture)[0]
    assert (top.component, top.effect) == ("client", "client_not_reading")
    assert top.client == f"127.0.0.1:{reader['client_port']}"


def test_head_of_line_names_the_consumer_sharing_the_throttled_connection(lake):
    capture = SAMPLES / "bottlenecks" / "head-of-line.pcap"
    (shared,) = [c for c in clients_of(capture) if c.get("role") == "consumer"]
    hol = [f for f in findings(lake, capture) if f.effect == "head_of_line"]
    assert [(f.consumer_tag, f.client) for f in hol] == [(shared["consumer_tag"], f"127.0.0.1:{shared['client_port']}")]
    assert hol[0].channel == shared["channel"] and hol[0].queue == shared["queue"]
    publisher_channels = {
        c["channel"]
        for c in clients_of(capture)
        if c.get("role") == "publisher" and c.get("client_port") == shared["client_port"]
    }
    assert hol[0].evidence["publisher_channels"] == ",".join(str(c) for c in sorted(publisher_channels))


# The near misses with a problem beside their verdict of none: the rule and the speed of the client it names.
NEAR_MISS_PROBLEMS = {
    "two-consumers-one-slow-no-backlog": [("diagnosis.consumer.hidden_slow", "slow")],
    # Its four publishers fill a quorum queue no one consumes: the broker's queue.delete-ok at the end
    # counts the 1,600 messages deleted with it (tests/test_wireshark_filters.py checks that count with
    # tshark). The broker's samples read that quorum queue's messages_ready as 0 throughout, though
    # it held them: for quorum queues the sampler's count is blind, not the wire's.
    "fan-in-quorum-paced": [("diagnosis.queue.backlog_without_consumer", None)],
}


def test_near_misses_give_no_finding(lake):
    near_misses = [c for c in SCENARIOS if INTENDED[truth_of(c)["scenario"]] == "none"]
    assert len(near_misses) >= 8
    for capture in near_misses:
        found = findings(lake, capture)
        assert [f for f in found if f.kind != "problem"] == [], capture.stem
        speed = {c.get("consumer_tag"): c.get("consumer_speed") for c in clients_of(capture)}
        problems = [(f.rule_id, speed.get(f.consumer_tag)) for f in found if f.kind == "problem"]
        assert problems == NEAR_MISS_PROBLEMS.get(capture.stem, []), capture.stem


def test_a_slow_consumer_a_fast_one_hides_is_a_problem_beside_a_verdict_of_none(lake):
    capture = SAMPLES / "bottlenecks" / "two-consumers-one-slow-no-backlog.pcap"
    tags = {c["consumer_speed"]: c["consumer_tag"] for c in clients_of(capture) if c.get("role") == "consumer"}
    (found,) = findings(lake, capture)
    assert (found.rule_id, found.kind, found.severity) == ("diagnosis.consumer.hidden_slow", "problem", "info")
    assert (found.consumer_tag, found.queue) == (tags["slow"], "amqpscope.bn.two-consumers-one-slow-no-backlog")
    diagnosis = lake["diagnosis"][capture_id(capture)]
    assert (diagnosis.bottleneck, diagnosis.problems_count) == ("none", 1)


def test_publishers_throttled_together_into_a_quorum_queue_point_at_the_queue(lake):
    capture = SAMPLES / "bottlenecks" / "fan-in-quorum.pcap"
    publishers = {f"127.0.0.1:{c['client_port']}" for c in clients_of(capture) if c.get("role") == "publisher"}
    throttled = [f for f in findings(lake, capture) if f.effect == "publisher_throttled"]
    # Every publisher the broker held back is found, not only the one whose window filled first.
    assert {f.client for f in throttled} == publishers
    assert {(f.component, f.queue) for f in throttled} == {
        ("queue", truth_of(capture)["ground_truth"]["fan_in_quorum"]["queue"])
    }
    assert all(f.evidence["queue_types"] == "quorum" for f in throttled)


def test_the_slow_one_of_two_consumers_is_named_first(lake):
    capture = SAMPLES / "bottlenecks" / "two-consumers-one-slow.pcap"
    tags = {c["consumer_speed"]: c["consumer_tag"] for c in clients_of(capture) if c.get("role") == "consumer"}
    top = findings(lake, capture)[0]
    assert (top.component, top.consumer_tag, top.queue) == (
        "consumer",
        tags["slow"],
        "amqpscope.bn.two-consumers-one-slow",
    )


def test_client_bound_clients_are_named_with_their_figures(lake):
    # Its queue also fills with no consumer (a problem the broker's truth calls for too): the bottleneck's figures.
    confirm = [f for f in findings(lake, SAMPLES / "bottlenecks" / "confirm-bound.pcap") if f.kind == "bottleneck"]
    assert [(f.rule_id, f.component, f.channel, f.evidence["in_flight_max"]) for f in confirm] == [
        ("diagnosis.client.confirm_bound", "client", 1, "1")
    ]
    (publisher,) = clients_of(SAMPLES / "bottlenecks" / "confirm-bound.pcap")
    assert float(confirm[0].evidence["publishes_per_second"]) == pytest.approx(publisher["rate_per_second"], rel=0.05)
    prefetch = findings(lake, SAMPLES / "bottlenecks" / "prefetch-one.pcap")
    consumer = [c for c in clients_of(SAMPLES / "bottlenecks" / "prefetch-one.pcap") if c["role"] == "consumer"][0]
    assert [(f.rule_id, f.consumer_tag, f.evidence["window"]) for f in prefetch] == [
        ("diagnosis.client.round_trip_bound", consumer["consumer_tag"], "1")
    ]


def test_every_finding_names_its_queue_and_its_connection_by_the_clients_name(lake):
    named = {c["client_port"]: c["connection_name"] for s in SCENARIOS for c in clients_of(s)}
    checked = 0
    for finding in lake["bottlenecks"]:
        if finding.rule_id in ("diagnosis.network.retransmission", "diagnosis.publisher.unroutable"):
            continue  # the network's, and messages that reached no queue
        assert finding.queue, (finding.rule_id, finding.entity)
        if finding.client is None:  # a queue several connections publish to names none of them,
            # and its filter no port (tests/test_wireshark_filters.py: it matches exactly its packets)
            assert (finding.entity_kind, finding.wireshark_filter.split(" ")[0]) == ("queue", "frame.number")
            continue
        port = int(finding.client.rsplit(":", 1)[1])
        if port in named:
            assert finding.connection_name == named[port]  # what the client called it, never its library
            checked += 1
        assert "client_product" not in finding.evidence or finding.evidence["client_product"] != finding.connection_name
    assert checked > 20


def test_no_finding_holds_an_entity_back_longer_than_it_was_active(lake):
    assert lake["bottlenecks"] and all(0 <= f.lifetime_share <= 1 for f in lake["bottlenecks"])


def test_head_of_line_ranks_first_with_the_consumers_rates(lake):
    capture = SAMPLES / "bottlenecks" / "head-of-line.pcap"
    (shared,) = [c for c in clients_of(capture) if c.get("role") == "consumer"]
    top = findings(lake, capture)[0]
    assert (top.effect, top.consumer_tag) == ("head_of_line", shared["consumer_tag"])
    before, during, after = (float(top.evidence[f"deliveries_per_second_{p}"]) for p in ("before", "during", "after"))
    assert during < before / 2 and during < after / 2


def test_credit_flow_findings_are_the_throttled_publishers(lake):
    capture = SAMPLES / "bottlenecks" / "credit-flow.pcap"
    publishers = {f"127.0.0.1:{c['client_port']}" for c in clients_of(capture) if c.get("role") == "publisher"}
    throttled = [f for f in findings(lake, capture) if f.effect == "publisher_throttled"]
    assert throttled and {f.client for f in throttled} <= publishers
    assert {f.component for f in throttled} == {"queue"}


def test_a_bottleneck_is_the_diagnosis_not_a_failed_suite(lake, spark):
    # The suites judge the data and the protocol (docs/DIAGNOSIS.md): the scenarios have findings,
    # their traffic breaks no rule, so every suite passes, and dq_summary keeps the two apart.
    assert lake["bottlenecks"] and lake["result"].suites_passed is True
    summary = (
        Lake(spark, lake["root"]).read("dq_summary").select("bottleneck", "suites_passed", "suites_failed").collect()
    )
    assert {r.bottleneck for r in summary} - {"none"}  # bottlenecks found ...
    assert {(r.suites_passed, tuple(r.suites_failed)) for r in summary} == {(True, ())}  # ... and no suite failed


def test_real_broker_traffic_breaks_no_protocol_rule(lake, spark):
    # Healthy or slow, every scenario is RabbitMQ 3.10.8 with real clients doing what the spec allows:
    # the violations table is empty, the findings are in the bottlenecks table only (issue 14: no
    # false alarm; issue 35: a bottleneck is not a rule violation).
    protocol = Lake(spark, lake["root"]).read("violations")
    assert protocol.select("rule_id", "severity").collect() == []
