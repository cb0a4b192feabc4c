"""Publisher- and client-side rules on hand-timed traffic, each with its near miss: publishes the broker
refused (basic.nack), messages it returned (basic.return), closes with an error, connection and
channel churn. The traffic builder is tests/test_bottlenecks.py's; the flow-state pipelines and the
diagnosis run once on all the cases together.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pyspark.sql.functions as F
import pytest

from amqpscope.pipelines.diagnosis.round_trips import round_trips
from amqpscope.pipelines.diagnosis.verdict import diagnosis
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA
from tests.test_bottlenecks import Diagnosed, Traffic, summary

CASES: dict[str, Callable[[Traffic], object]] = {}


def case(build: Callable[[Traffic], object]) -> Callable[[Traffic], object]:
    CASES[build.__name__] = build
    return build


# Cases whose connections are on a real link (link-local addresses), not on loopback.
ON_A_LINK = ("link_at_capacity", "link_paced_by_the_application")


@pytest.fixture(scope="module")
def findings(spark) -> Diagnosed:
    built = {}
    for name, build in CASES.items():
        built[name] = Traffic(capture_id=name)
        build(built[name])
    diagnosed = Diagnosed(spark, built)
    linked = F.col("capture_id").isin(*ON_A_LINK)
    diagnosed.inputs["connections"] = diagnosed.inputs["connections"].withColumns(
        {
            "client_address": F.when(linked, F.lit("169.254.10.1")).otherwise(F.col("client_address")),
            "server_address": F.when(linked, F.lit("169.254.10.2")).otherwise(F.col("server_address")),
        }
    )
    return diagnosed


def declare(traffic: Traffic, conn: str, ms: float, queue: str, **arguments) -> None:
    traffic.frame(
        conn, ms, "c2s", "queue.declare", channel=1, queue=queue, arguments={"arguments": json.dumps(arguments)}
    )
    traffic.frame(conn, ms + 0.1, "s2c", "queue.declare-ok", channel=1, queue=queue)


def confirmed_publishes(
    traffic: Traffic,
    conn: str,
    *,
    queue: str,
    messages: int,
    refused: set[int],
    start_ms: float = 1.0,
    apart_ms: float = 10.0,
) -> float:
    """A publisher in confirm mode publishing ``messages`` to ``queue`` ``apart_ms`` apart, each confirmed
    (basic.ack) or refused (basic.nack, the sequence numbers in ``refused``) 0.5 ms after its publish."""
    traffic.frame(conn, start_ms, "c2s", "confirm.select", channel=1)
    traffic.frame(conn, start_ms + 0.1, "s2c", "confirm.select-ok", channel=1)
    t = start_ms + 1
    for seq in range(1, messages + 1):
        traffic.content(conn, t, "c2s", "basic.publish", channel=1, exchange="", routing_key=queue)
        answer = "basic.nack" if seq in refused else "basic.ack"
        traffic.frame(conn, t + 0.5, "s2c", answer, channel=1, delivery_tag=seq, multiple=False)
        t += apart_ms
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
def refused_by_a_full_queue_briefly(traffic: Traffic) -> None:
    traffic.connection("pub", 41004)
    declare(traffic, "pub", 0, "capped", **{"x-max-length": 10, "x-overflow": "reject-publish"})
    # The same refusals in 30 ms (publishes 1 ms apart): the queue was full for a blip.
    confirmed_publishes(traffic, "pub", queue="capped", messages=40, refused=set(range(11, 41)), apart_ms=1.0)


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


def test_refusals_by_a_queue_full_for_a_blip_are_a_problem_not_the_verdict(findings):
    rows = findings("refused_by_a_full_queue_briefly")
    assert [(r.rule_id, r.kind, r.evidence["refused"]) for r in rows] == [
        ("diagnosis.publisher.nacked", "problem", "30")
    ]


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


# -- request/reply ------------------------------------------------------------------------------------


def message(traffic: Traffic, conn: str, ms: float, direction: str, method: str, **fields) -> None:
    """A content method with its properties on its content header (as messages_091 reads them)."""
    properties = {k: fields.pop(k) for k in ("correlation_id", "reply_to") if k in fields}
    traffic.frame(conn, ms, direction, method, **fields)
    traffic.frame(conn, ms, direction, None, frame_type="header", body_size=16, channel=1, **properties)
    traffic.frame(conn, ms, direction, None, frame_type="body", frame_size=24, channel=1)


def rpc(traffic: Traffic, *, calls: int, responder_ms: float, caller_ms: float, at_once: bool = False) -> None:
    """A caller (port 44001) calls a responder (44002) over queue rpc: the broker delivers each request
    0.4 ms after it is published, the responder replies ``responder_ms`` later, the broker delivers the
    reply 0.4 ms after that, and the caller asks again ``caller_ms`` after a reply (``at_once``: it
    publishes every request first, 0.1 ms apart)."""
    traffic.connection("caller", 44001)
    traffic.connection("responder", 44002)
    traffic.frame("caller", 0, "c2s", "queue.declare", channel=1, queue="rpc")
    traffic.frame("caller", 0.3, "s2c", "queue.declare-ok", channel=1, queue="rpc")
    reply_to = "amq.rabbitmq.reply-to.g1"
    events = []
    t = 1.0
    for n in range(calls):
        start = 1.0 + n * 0.1 if at_once else t
        cid = f"call-{n}"
        events += [
            (start, "caller", "c2s", "basic.publish", dict(reply_to="amq.rabbitmq.reply-to", routing_key="rpc")),
            (start + 0.4, "responder", "s2c", "basic.deliver", dict(reply_to=reply_to, routing_key="rpc")),
            (start + 0.4 + responder_ms, "responder", "c2s", "basic.publish", dict(routing_key=reply_to)),
            (start + 0.8 + responder_ms, "caller", "s2c", "basic.deliver", dict(routing_key=reply_to)),
        ]
        events = [e if len(e) == 6 else (*e, cid) for e in events]
        t = start + 0.8 + responder_ms + caller_ms
    for ms, conn, direction, method, fields, cid in sorted(events, key=lambda e: e[0]):
        message(traffic, conn, ms, direction, method, channel=1, exchange="", correlation_id=cid, **fields)


@case
def rpc_waiting_on_its_responder(traffic: Traffic) -> None:
    # Each call 40.8 ms: 0.8 ms in the broker's hops, 40 ms in the responder; 0.2 ms to the next.
    rpc(traffic, calls=20, responder_ms=40, caller_ms=0.2)


@case
def rpc_at_once(traffic: Traffic) -> None:
    # The same calls, all asked before the first reply: 20 in flight, no round trip per call.
    rpc(traffic, calls=20, responder_ms=40, caller_ms=0.2, at_once=True)


@case
def rpc_caller_busy(traffic: Traffic) -> None:
    # One at a time, but the caller works 200 ms between calls of 1.6 ms: waiting is not its bound.
    rpc(traffic, calls=20, responder_ms=0.8, caller_ms=200)


def test_a_caller_waiting_on_each_reply_is_bound_by_what_takes_the_call(findings):
    rows = findings("rpc_waiting_on_its_responder")
    assert [(r.rule_id, r.kind, r.component, r.effect, r.entity) for r in rows] == [
        (
            "diagnosis.client.request_reply_latency",
            "bottleneck",
            "consumer",
            "request_reply_latency",
            "127.0.0.1:44001 channel 1",
        )
    ]
    evidence = rows[0].evidence
    assert (evidence["calls"], evidence["in_flight_max"]) == ("20", "1")
    assert (evidence["call_p50_ms"], evidence["broker_hops_p50_ms"], evidence["responder_p50_ms"]) == (
        "40.8",
        "0.8",
        "40.0",
    )
    # Of each 41 ms cycle (the last has no next request: 40.8 ms), the responder takes 40 ms.
    assert float(evidence["responder_share"]) == pytest.approx(20 * 40 / (19 * 41 + 40.8), abs=1e-3)
    # Waiting from each request to its reply, over the first request to the last reply.
    assert rows[0].lifetime_share == pytest.approx(20 * 40.8 / (19 * 41 + 40.8), abs=1e-3)


def test_calls_made_together_or_a_caller_busy_between_them_give_no_finding(findings):
    assert findings("rpc_at_once") == []
    assert findings("rpc_caller_busy") == []


def test_round_trips_split_each_call_and_pair_methods_and_confirms(findings, spark):
    inputs = findings.inputs
    rows = round_trips(inputs["frames"], inputs["messages_091"]).filter(
        F.col("capture_id").isin("rpc_waiting_on_its_responder", "refused_by_a_full_queue")
    )
    calls = rows.filter(F.col("kind") == "request_reply").orderBy("request_ts").collect()
    assert len(calls) == 20
    assert [(c.broker_in_us, c.responder_us, c.broker_out_us, c.round_trip_us) for c in calls] == [
        (400, 40_000, 400, 40_800)
    ] * 20
    assert [c.caller_us for c in calls] == [200] * 19 + [None]
    assert {c.responder_connection_id for c in calls} == {"responder"}
    methods = rows.filter(F.col("kind") == "method").collect()
    assert sorted((m.capture_id, m.request, m.response, m.round_trip_us) for m in methods) == [
        ("refused_by_a_full_queue", "confirm.select", "confirm.select-ok", 100),
        ("refused_by_a_full_queue", "queue.declare", "queue.declare-ok", 100),
        ("rpc_waiting_on_its_responder", "queue.declare", "queue.declare-ok", 300),
    ]
    confirms = rows.filter(F.col("kind") == "confirm").groupBy("response").count().collect()
    assert sorted((r.response, r["count"]) for r in confirms) == [("basic.ack", 10), ("basic.nack", 30)]


# -- a real link ------------------------------------------------------------------------------------


def shaped(traffic: Traffic, segments_per_bucket: Callable[[int], int], *, buckets: int = 20) -> None:
    """A publisher on connection link sends 1000-byte segments, ``segments_per_bucket(k)`` of them
    evenly in the k-th 100 ms; the broker acks each 20 ms after it arrives. The 100th segment is
    lost: the segments after it are acked only up to it (duplicate acks) until its copy, sent 60 ms
    after it, which the broker acks 20 ms later up to the last segment sent before the copy."""
    traffic.connection("link", 45001)
    sent = []
    for k in range(buckets):
        count = segments_per_bucket(k)
        sent += [k * 100 + j * 100 / count for j in range(count)]
    lost_at = sent[100]
    copy_at = lost_at + 60
    events = [(t, "c2s", n * 1000, 0, 1000, 0) for n, t in enumerate(sent)]
    events.append((copy_at, "c2s", 100_000, 0, 1000, 1000))
    for n, t in enumerate(sent):
        if n == 100:
            continue
        held = lost_at <= t < copy_at
        events.append((t + 20, "s2c", 0, 100_000 if held else (n + 1) * 1000, 0, 0))
    before_copy = max(n for n, t in enumerate(sent) if t < copy_at)
    events.append((copy_at + 20, "s2c", 0, (before_copy + 1) * 1000, 0, 0))
    for t, direction, seq, ack, payload, again in sorted(events, key=lambda e: (e[0], e[1])):
        traffic.segment("link", t, direction, seq, ack, 1_000_000, payload, retransmitted=again)


@case
def link_at_capacity(traffic: Traffic) -> None:
    # 25 segments of 1000 bytes every 100 ms: 2 Mbit/s, the same every bucket.
    shaped(traffic, lambda k: 25)


@case
def link_paced_by_the_application(traffic: Traffic) -> None:
    # 5, 12 or 19 segments a bucket: the application's pace, no plateau.
    shaped(traffic, lambda k: 5 + (k * 7) % 21)


@case
def loopback_at_a_ceiling(traffic: Traffic) -> None:
    # The same plateau and loss on loopback: the host dropped the segment, no link is involved.
    shaped(traffic, lambda k: 25)


def test_a_link_held_at_its_ceiling_with_loss_is_the_network(findings):
    rows = findings("link_at_capacity")
    assert [(r.rule_id, r.kind, r.component, r.effect) for r in rows] == [
        ("diagnosis.network.bandwidth_limited", "bottleneck", "network", "bandwidth_limited")
    ]
    evidence = rows[0].evidence
    assert (evidence["sender"], evidence["ceiling_mbit_per_second"]) == ("client-to-broker", "2.0")
    # The broker acknowledges 25 segments' bytes in every bucket (the lost one's are acknowledged
    # with its copy, in the same bucket) but the first, whose first 20 ms hold no ack: 20 of 25, at
    # 0.8 of the median, still on the plateau. The sender always has bytes outstanding.
    assert (evidence["at_ceiling_share"], evidence["lost_segments"]) == ("1.000", "1")
    assert evidence["busy_share"] == "1.000"
    assert evidence["ack_round_trip_min_ms"] == "20.0"
    assert rows[0].wireshark_filter == f"tcp.port == 45001 && frame.number in {{{rows[0].start_packet_number}}}"


def test_a_link_paced_by_its_application_or_a_plateau_on_loopback_is_not_bandwidth_bound(findings):
    assert findings("link_paced_by_the_application") == []
    assert [r.rule_id for r in findings("loopback_at_a_ceiling")] == []


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
