"""Publisher- and client-side rules on hand-timed traffic, each with its near miss: publishes the broker
refused (basic.nack), messages it returned (basic.return), closes with an error, connection and
channel churn. The traffic builder is tests/test_bottlenecks.py's; the flow-state pipelines and the
diagnosis run once on all the cases together.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from amqpscope.pipelines.diagnosis import diagnosis
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA
from tests.test_bottlenecks import Diagnosed, Traffic, summary

CASES: dict[str, Callable[[Traffic], object]] = {}


def case(build: Callable[[Traffic], object]) -> Callable[[Traffic], object]:
    CASES[build.__name__] = build
    return build


@pytest.fixture(scope="module")
def findings(spark) -> Diagnosed:
    built = {}
    for name, build in CASES.items():
        built[name] = Traffic(capture_id=name)
        build(built[name])
    return Diagnosed(spark, built)


def declare(traffic: Traffic, conn: str, ms: float, queue: str, **arguments) -> None:
    traffic.frame(
        conn, ms, "c2s", "queue.declare", channel=1, queue=queue, arguments={"arguments": json.dumps(arguments)}
    )
    traffic.frame(conn, ms + 0.1, "s2c", "queue.declare-ok", channel=1, queue=queue)


def confirmed_publishes(
    traffic: Traffic, conn: str, *, queue: str, messages: int, refused: set[int], start_ms: float = 1.0
) -> float:
    """A publisher in confirm mode publishing ``messages`` to ``queue`` 1 ms apart, each confirmed
    (basic.ack) or refused (basic.nack, the sequence numbers in ``refused``) 0.5 ms after its publish."""
    traffic.frame(conn, start_ms, "c2s", "confirm.select", channel=1)
    traffic.frame(conn, start_ms + 0.1, "s2c", "confirm.select-ok", channel=1)
    t = start_ms + 1
    for seq in range(1, messages + 1):
        traffic.content(conn, t, "c2s", "basic.publish", channel=1, exchange="", routing_key=queue)
        answer = "basic.nack" if seq in refused else "basic.ack"
        traffic.frame(conn, t + 0.5, "s2c", answer, channel=1, delivery_tag=seq, multiple=False)
        t += 1
    return t


# -- refused publishes ------------------------------------------------------------------------------


@case
def refused_by_a_full_queue(traffic: Traffic) -> None:
    traffic.connection("pub", 41001)
    declare(traffic, "pub", 0, "capped", **{"x-max-length": 10, "x-overflow": "reject-publish"})
    # The queue holds 10 and nothing consumes: the 11th publish on is refused.
    confirmed_publishes(traffic, "pub", queue="capped", messages=40, refused=set(range(11, 41)))


@case
def refused_now_and_then(traffic: Traffic) -> None:
    traffic.connection("pub", 41002)
    confirmed_publishes(traffic, "pub", queue="work", messages=40, refused={7, 30})


@case
def all_confirmed(traffic: Traffic) -> None:
    traffic.connection("pub", 41003)
    declare(traffic, "pub", 0, "capped", **{"x-max-length": 100, "x-overflow": "reject-publish"})
    confirmed_publishes(traffic, "pub", queue="capped", messages=40, refused=set())


def test_publishes_a_full_queue_refuses_are_its_bottleneck_with_its_limits(findings):
    rows = findings("refused_by_a_full_queue")
    assert summary(rows) == [
        (1, "diagnosis.publisher.refused", "queue", "publishes_refused", "channel", "127.0.0.1:41001 channel 1")
    ]
    (row,) = rows
    assert (row.kind, row.severity, row.queue) == ("bottleneck", "warning", "capped")
    evidence = row.evidence
    assert (evidence["publishes"], evidence["refused"], evidence["refused_share"]) == ("40", "30", "0.750")
    assert (evidence["max_length"], evidence["overflow"]) == ("10", "reject-publish")
    assert "x-max-length 10 and x-overflow reject-publish" in row.explanation
    # 30 nacks: more than the 20 a finding lists, so the filter lists the first 20 by number.
    assert len(row.packet_numbers) == 20
    assert row.wireshark_filter.startswith("tcp.port == 41001 && frame.number in {")


def test_a_few_refusals_not_explained_by_a_full_queue_are_a_problem_not_the_verdict(findings):
    rows = findings("refused_now_and_then")
    assert [(r.rule_id, r.kind, r.severity, r.component) for r in rows] == [
        ("diagnosis.publisher.nacked", "problem", "warning", "queue")
    ]
    assert (rows[0].evidence["refused"], rows[0].evidence["publishes"]) == ("2", "40")
    # Both nacks listed: the field filter names exactly them.
    assert rows[0].wireshark_filter == "tcp.port == 41002 && (amqp.method.class == 60 && amqp.method.method == 120)"


def test_a_bounded_queue_that_confirms_every_publish_gives_no_finding(findings):
    assert findings("all_confirmed") == []


# -- returned messages --------------------------------------------------------------------------------


def mandatory_publishes(traffic: Traffic, conn: str, *, messages: int, returned: set[int]) -> None:
    traffic.frame(conn, 0, "c2s", "exchange.declare", channel=1, exchange="orders", arguments={"type": "direct"})
    traffic.frame(conn, 0.1, "s2c", "exchange.declare-ok", channel=1)
    t = 1.0
    for n in range(1, messages + 1):
        key = "nowhere" if n in returned else "billing"
        traffic.content(conn, t, "c2s", "basic.publish", channel=1, exchange="orders", routing_key=key, mandatory=True)
        if n in returned:
            traffic.content(
                conn,
                t + 0.3,
                "s2c",
                "basic.return",
                channel=1,
                exchange="orders",
                routing_key=key,
                reply_code=312,
                reply_text="NO_ROUTE",
            )
        t += 1


@case
def unroutable(traffic: Traffic) -> None:
    traffic.connection("pub", 41011)
    mandatory_publishes(traffic, "pub", messages=10, returned={2, 3, 4, 5, 6, 7, 8, 9})


@case
def mandatory_and_routed(traffic: Traffic) -> None:
    traffic.connection("pub", 41012)
    mandatory_publishes(traffic, "pub", messages=10, returned=set())


def test_returned_messages_are_a_problem_naming_the_exchange_key_and_code(findings):
    rows = findings("unroutable")
    assert [(r.rule_id, r.kind, r.severity, r.component, r.effect) for r in rows] == [
        ("diagnosis.publisher.unroutable", "problem", "warning", "channel", "messages_returned")
    ]
    evidence = rows[0].evidence
    assert (evidence["returned"], evidence["publishes"], evidence["mandatory_publishes"]) == ("8", "10", "10")
    assert (evidence["exchange"], evidence["routing_key"], evidence["reply_code"]) == ("orders", "nowhere", "312")
    assert evidence["returned_share"] == "0.800"
    assert 'exchange orders routes routing key "nowhere" to no queue' in rows[0].explanation
    # Eight returns, all listed: the field filter names exactly their packets.
    assert rows[0].wireshark_filter == "tcp.port == 41011 && (amqp.method.class == 60 && amqp.method.method == 50)"


def test_mandatory_publishes_that_all_route_give_no_finding(findings):
    assert findings("mandatory_and_routed") == []


# -- closes with an error -----------------------------------------------------------------------------


@case
def channel_closed_on_a_missing_exchange(traffic: Traffic) -> None:
    traffic.connection("pub", 41021)
    traffic.frame("pub", 0, "c2s", "channel.open", channel=1)
    traffic.frame("pub", 0.1, "s2c", "channel.open-ok", channel=1)
    traffic.content(
        "pub", 1, "c2s", "basic.publish", channel=1, exchange="missing", routing_key="k", class_id=60, method_id=40
    )
    traffic.frame(
        "pub",
        1.4,
        "s2c",
        "channel.close",
        channel=1,
        reply_code=404,
        reply_text="NOT_FOUND - no exchange 'missing' in vhost '/'",
        arguments={"class-id": "60", "method-id": "40"},
    )
    traffic.frame("pub", 1.5, "c2s", "channel.close-ok", channel=1)


@case
def connection_forced(traffic: Traffic) -> None:
    traffic.connection("pub", 41022)
    traffic.frame("pub", 0, "s2c", "connection.start", channel=0)
    traffic.frame(
        "pub",
        50,
        "s2c",
        "connection.close",
        channel=0,
        reply_code=320,
        reply_text="CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
        arguments={"class-id": "0", "method-id": "0"},
    )


@case
def closed_normally(traffic: Traffic) -> None:
    traffic.connection("pub", 41023)
    traffic.frame("pub", 0, "c2s", "channel.open", channel=1)
    traffic.frame("pub", 0.1, "s2c", "channel.open-ok", channel=1)
    traffic.frame("pub", 1, "c2s", "channel.close", channel=1, reply_code=200, reply_text="Goodbye")
    traffic.frame("pub", 1.1, "s2c", "channel.close-ok", channel=1)
    traffic.frame("pub", 2, "c2s", "connection.close", channel=0, reply_code=200, reply_text="Normal shutdown")
    traffic.frame("pub", 2.1, "s2c", "connection.close-ok", channel=0)


def test_a_channel_closed_with_an_error_names_what_was_refused(findings):
    rows = findings("channel_closed_on_a_missing_exchange")
    assert [(r.rule_id, r.kind, r.component, r.entity) for r in rows] == [
        ("diagnosis.channel.closed_with_error", "problem", "channel", "127.0.0.1:41021 channel 1")
    ]
    evidence = rows[0].evidence
    assert (evidence["reply_code"], evidence["closed_by"], evidence["refused_method"]) == (
        "404",
        "broker",
        "basic.publish",
    )
    assert evidence["refused_target"] == "missing"
    assert rows[0].explanation.startswith(
        "The broker closed channel 1 with 404 \"NOT_FOUND - no exchange 'missing' in vhost '/'\", refusing basic.publish"
    )
    assert rows[0].wireshark_filter == f"tcp.port == 41021 && frame.number in {{{rows[0].start_packet_number}}}"


def test_a_connection_the_broker_forced_closed_is_a_problem_of_the_broker_side(findings):
    rows = findings("connection_forced")
    assert [(r.rule_id, r.kind, r.component, r.evidence["reply_code"]) for r in rows] == [
        ("diagnosis.connection.closed_with_error", "problem", "connection", "320")
    ]


def test_closes_with_reply_success_give_no_finding(findings):
    assert findings("closed_normally") == []


# -- churn ----------------------------------------------------------------------------------------------


def short_connection(
    traffic: Traffic, conn: str, port: int, start_ms: float, *, open_ms: float, messages: int, linger_ms: float = 0.0
) -> float:
    """A connection opened (protocol header to open-ok in ``open_ms``), a channel, ``messages``
    publishes, ``linger_ms`` idle, and closed 1 ms later; returns when its last frame was."""
    traffic.connection(conn, port)
    t = start_ms
    traffic.frame(conn, t, "c2s", None, frame_type="protocol-header", channel=None)
    traffic.frame(conn, t + open_ms * 0.2, "s2c", "connection.start", channel=0)
    traffic.frame(conn, t + open_ms * 0.5, "c2s", "connection.start-ok", channel=0)
    traffic.frame(conn, t + open_ms * 0.6, "s2c", "connection.tune", channel=0)
    traffic.frame(conn, t + open_ms * 0.7, "c2s", "connection.open", channel=0)
    traffic.frame(conn, t + open_ms, "s2c", "connection.open-ok", channel=0)
    t += open_ms
    traffic.frame(conn, t + 0.1, "c2s", "channel.open", channel=1)
    traffic.frame(conn, t + 0.2, "s2c", "channel.open-ok", channel=1)
    t += 0.3
    for _ in range(messages):
        traffic.content(conn, t, "c2s", "basic.publish", channel=1, exchange="", routing_key="events")
        t += 0.1
    t += linger_ms
    traffic.frame(conn, t, "c2s", "connection.close", channel=0, reply_code=200, reply_text="bye")
    traffic.frame(conn, t + 1, "s2c", "connection.close-ok", channel=0)
    return t + 1


def churning(traffic: Traffic, *, connections: int, open_ms: float, messages: int, linger_ms: float = 0.0) -> None:
    t = 0.0
    for n in range(connections):
        t = short_connection(
            traffic, f"c{n}", 42000 + n, t + 0.5, open_ms=open_ms, messages=messages, linger_ms=linger_ms
        )


@case
def connection_per_message(traffic: Traffic) -> None:
    # 20 connections, each 8 ms opening and 1 ms closing for one publish: most of the client's time.
    churning(traffic, connections=20, open_ms=8, messages=1)


@case
def connection_per_message_at_leisure(traffic: Traffic) -> None:
    # The same, each connection then idle 100 ms before it closes: opening is not what bounds it.
    churning(traffic, connections=20, open_ms=8, messages=1, linger_ms=100)


@case
def connections_carrying_many_messages(traffic: Traffic) -> None:
    churning(traffic, connections=20, open_ms=8, messages=50)


@case
def few_short_connections(traffic: Traffic) -> None:
    churning(traffic, connections=5, open_ms=8, messages=1)


def test_a_connection_per_message_is_the_clients_bottleneck(findings):
    rows = findings("connection_per_message")
    assert [(r.rule_id, r.kind, r.component, r.effect, r.entity) for r in rows] == [
        ("diagnosis.client.connection_churn", "bottleneck", "client", "connection_churn", "connections from 127.0.0.1")
    ]
    evidence = rows[0].evidence
    assert (evidence["connections"], evidence["messages_per_connection_p50"]) == ("20", "1")
    # Each connection: 8 ms opening, 0.4 ms of channel and publish, 1 ms closing; 0.5 ms between them.
    # Held: 9 of every 9.9 ms, from the first protocol header to the last close-ok.
    span = 20 * 9.9 - 0.5
    assert rows[0].lifetime_share == pytest.approx(20 * 9 / span, abs=1e-3)
    assert float(evidence["lifetime_p50_ms"]) == pytest.approx(9.4, abs=0.05)
    # Many connections, no one port: the capture's 20 connection.starts are all listed, so the field
    # filter alone names exactly them.
    assert rows[0].wireshark_filter == "(amqp.method.class == 10 && amqp.method.method == 10)"


def test_a_connection_per_message_with_time_to_spare_is_a_problem(findings):
    rows = findings("connection_per_message_at_leisure")
    assert [(r.rule_id, r.kind, r.severity) for r in rows] == [
        ("diagnosis.client.short_lived_connections", "problem", "warning")
    ]


def test_connections_carrying_many_messages_or_few_connections_are_not_churn(findings):
    assert findings("connections_carrying_many_messages") == []
    assert findings("few_short_connections") == []


def channels(traffic: Traffic, *, opens: int, messages: int, open_ms: float) -> None:
    traffic.connection("pub", 43001)
    t = 0.0
    for _ in range(opens):
        traffic.frame("pub", t, "c2s", "channel.open", channel=1)
        traffic.frame("pub", t + open_ms, "s2c", "channel.open-ok", channel=1)
        t += open_ms + 0.1
        for _ in range(messages):
            traffic.content("pub", t, "c2s", "basic.publish", channel=1, exchange="", routing_key="events")
            t += 0.1
        traffic.frame("pub", t, "c2s", "channel.close", channel=1, reply_code=200, reply_text="bye")
        traffic.frame("pub", t + open_ms, "s2c", "channel.close-ok", channel=1)
        t += open_ms + 0.1


@case
def channel_per_message(traffic: Traffic) -> None:
    channels(traffic, opens=20, messages=1, open_ms=5)


@case
def channels_carrying_many_messages(traffic: Traffic) -> None:
    channels(traffic, opens=20, messages=10, open_ms=5)


def test_a_channel_per_message_is_the_clients_bottleneck(findings):
    rows = findings("channel_per_message")
    assert [(r.rule_id, r.kind, r.component, r.effect) for r in rows] == [
        ("diagnosis.client.channel_churn", "bottleneck", "client", "channel_churn")
    ]
    evidence = rows[0].evidence
    assert (evidence["channel_opens"], evidence["messages_per_channel"]) == ("20", "1.0")
    # Each cycle: 5 ms open, 0.1 + 0.1 ms publishing, 5 ms close, 0.1 ms: 10 of 10.3 ms held.
    assert rows[0].lifetime_share == pytest.approx(200 / (20 * 10.3 - 0.1), abs=1e-3)
    # Its 20 channel.opens are all listed: the field filter names exactly them.
    assert rows[0].wireshark_filter == "tcp.port == 43001 && (amqp.method.class == 20 && amqp.method.method == 10)"


def test_channels_carrying_many_messages_are_not_churn(findings):
    assert findings("channels_carrying_many_messages") == []


# -- the headline -------------------------------------------------------------------------------------


def diagnosed(findings: Diagnosed, spark, names: tuple[str, ...]) -> dict:
    """The diagnosis rows of the cases ``names``, from their findings."""
    found = spark.createDataFrame([r.asDict() for name in names for r in findings(name)], BOTTLENECKS_SCHEMA)
    captures = spark.createDataFrame(
        [dict(capture_id=n, packets=100, tcp_connections=1) for n in names],
        "capture_id string, packets long, tcp_connections long",
    )
    return {r.capture_id: r for r in diagnosis(found, captures).collect()}


def test_problems_follow_the_verdict_and_a_none_claims_nothing_the_capture_contradicts(findings, spark):
    rows = diagnosed(findings, spark, ("unroutable", "refused_by_a_full_queue", "all_confirmed"))
    unroutable = rows["unroutable"]
    assert (unroutable.bottleneck, unroutable.problems_count) == ("none", 1)
    assert unroutable.headline.startswith("No bottleneck: ")
    assert unroutable.headline.endswith(
        "Also found 1 problem: (warning, channel) The broker returned 8 of the 10 messages published on channel 1 "
        + unroutable.findings[0].explanation.removeprefix(
            "The broker returned 8 of the 10 messages published on channel 1 "
        )
    )
    assert [f.kind for f in unroutable.findings] == ["problem"]
    refused = rows["refused_by_a_full_queue"]
    assert (refused.bottleneck, refused.problems_count) == ("queue", 0)
    assert refused.headline.startswith("Bottleneck: queue (publishes refused) on channel")
    assert rows["all_confirmed"].headline.startswith("No bottleneck: ")
