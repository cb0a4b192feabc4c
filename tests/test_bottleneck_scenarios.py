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

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.analyze import analyze
from amqpscope.jobs.lake import Lake
from amqpscope.testbed.truth import expected_bottleneck

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SCENARIOS = sorted((SAMPLES / "bottlenecks").glob("*.pcap"))
FLOW_SAMPLES = sorted((SAMPLES / "flow").glob("*.pcap"))
HEALTHY = sorted([*SAMPLES.glob("*.pcap"), *SAMPLES.glob("*.pcapng"), *(SAMPLES / "decoders").glob("*.pcap")])


# Scenarios whose bottleneck leaves no trace on the wire, with why (docs/DIAGNOSIS.md, "What the wire
# cannot tell apart"). The diagnosis must then say none, never name another component.
WIRE_BLIND = {
    # Routing to no queue kept the readers in flow for milliseconds at a time; the broker's 2.5 MB
    # receive buffers absorbed it: no window filled or closed, no publish stalled.
    "channel-routing": "channel",
}


def truth_of(capture: Path) -> dict:
    return json.loads(capture.with_name(capture.name.rsplit(".", 1)[0] + ".truth.json").read_text())


def clients_of(capture: Path) -> list[dict]:
    (scenario,) = truth_of(capture)["ground_truth"].values()
    return scenario.get("clients", [])


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("bottleneck-lake")
    config = AnalyzeConfig(lake=root, report=root / "report.html", data_docs=root / "data_docs")
    result = analyze(spark, [str(c) for c in (*SCENARIOS, *FLOW_SAMPLES, *HEALTHY)], config)
    tables = Lake(spark, root)
    return {
        "root": root,
        "result": result,
        "diagnosis": {r.capture_id: r for r in tables.read("diagnosis").collect()},
        "bottlenecks": tables.read("bottlenecks").orderBy("capture_id", "rank").collect(),
    }


def findings(lake, capture: Path) -> list:
    return [f for f in lake["bottlenecks"] if f.capture_id == capture_id(capture)]


def test_every_scenario_has_its_truth():
    assert {c.stem for c in SCENARIOS} >= {"healthy", "credit-flow", "channel-routing", "head-of-line", "memory-alarm",
                                           "disk-alarm", "slow-consumer", "amqp10-slow-link", "slow-reader"}
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
    assert truth_of(SAMPLES / "flow" / "amqp091-memory-alarm.pcap")["ground_truth"]["amqp091_memory_alarm"]["alarm"] == "memory"
    assert by_stem["amqp091-memory-alarm"].bottleneck == "memory_alarm"
    assert by_stem["amqp091-slow-consumer"].bottleneck == "consumer"


@pytest.mark.parametrize("capture", HEALTHY, ids=lambda c: c.name)
def test_healthy_captures_have_no_bottleneck(lake, capture):
    diagnosis = lake["diagnosis"][capture_id(capture)]
    assert (diagnosis.bottleneck, diagnosis.findings_count) == ("none", 0), diagnosis.headline


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
    assert hol[0].evidence["consumer_channel"] == str(shared["channel"])
    publisher_channels = {c["channel"] for c in clients_of(capture)
                          if c.get("role") == "publisher" and c.get("client_port") == shared["client_port"]}
    assert hol[0].evidence["publisher_channels"] == ",".join(str(c) for c in sorted(publisher_channels))


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
    summary = Lake(spark, lake["root"]).read("dq_summary").select("bottleneck", "suites_passed", "suites_failed").collect()
    assert {r.bottleneck for r in summary} - {"none"}  # bottlenecks found ...
    assert {(r.suites_passed, tuple(r.suites_failed)) for r in summary} == {(True, ())}  # ... and no suite failed


def test_real_broker_traffic_breaks_no_protocol_rule(lake, spark):
    # Healthy or slow, every scenario is RabbitMQ 3.10.8 with real clients doing what the spec allows:
    # the violations table is empty, the findings are in the bottlenecks table only (issue 14: no
    # false alarm; issue 35: a bottleneck is not a rule violation).
    protocol = Lake(spark, lake["root"]).read("violations")
    assert protocol.select("rule_id", "severity").collect() == []
