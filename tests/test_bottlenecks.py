"""Inference rules of the bottleneck diagnosis on hand-timed traffic, each with its near miss.

Every case builds the bronze tables of a small exchange whose timing is worked out by hand (one
capture each); the real flow-state pipelines and the diagnosis run once on all of them together,
and each test compares its capture's findings with what the timing means (docs/DIAGNOSIS.md): a slow consumer is one that keeps its prefetch full and acks
slowly while every freed slot is refilled at once; a fast one touching its prefetch is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.expectations.bottleneck_rules import evidence_units, load_bottleneck_rules
from amqpscope.pipelines.diagnosis.findings import bottleneck_findings
from amqpscope.pipelines.diagnosis.measures import MEASURE_PROTOCOL, MEASURES
from amqpscope.pipelines.diagnosis.verdict import diagnosis
from amqpscope.pipelines.messages import messages_091
from amqpscope.pipelines.tables import FLOW, Build
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA
from amqpscope.schemas.frames import CAPTURES_SCHEMA, CONNECTIONS_SCHEMA, FRAMES_SCHEMA
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at_ms(ms: float) -> datetime:
    return T0 + timedelta(microseconds=round(ms * 1000))


def us_at_ms(ms: float) -> int:
    """``at_ms(ms)`` in microseconds since the epoch: the ts_us of a row at that time."""
    return round(T0.timestamp() * 1_000_000) + round(ms * 1000)


@dataclass
class Traffic:
    """Frames and TCP segments of one capture, added in time order per connection."""

    capture_id: str = "cap"
    frames: list[dict] = field(default_factory=list)
    segments: list[dict] = field(default_factory=list)
    connections: dict[str, int] = field(default_factory=dict)  # connection id -> client port
    packet: int = 0

    def connection(self, name: str, port: int) -> None:
        self.connections[name] = port

    def frame(self, conn: str, ms: float, direction: str, method: str, protocol: str = "amqp-0-9-1", **fields) -> None:
        self.packet += 1
        row = {n: None for n in FRAMES_SCHEMA.fieldNames()}
        index = sum(1 for f in self.frames if f["connection_id"] == conn)
        row.update(
            capture_id=self.capture_id,
            connection_id=conn,
            direction=direction,
            frame_index=index,
            ts=at_ms(ms),
            ts_us=us_at_ms(ms),
            packet_number=self.packet,
            stream_offset=0,
            frame_size=8,
            protocol=protocol,
            frame_type="amqp" if protocol == "amqp-1.0" else "method",
            channel=1,
            method=method,
            arguments={},
        )
        row.update(fields)
        self.frames.append(row)

    def content(
        self, conn: str, ms: float, direction: str, method: str, body_size: int = 64, delivery_mode=None, **fields
    ) -> None:
        """A content method, its header and one body frame, in one packet's time."""
        self.frame(conn, ms, direction, method, **fields)
        self.frame(
            conn,
            ms,
            direction,
            None,
            frame_type="header",
            body_size=body_size,
            delivery_mode=delivery_mode,
            channel=fields.get("channel", 1),
        )
        self.frame(
            conn, ms, direction, None, frame_type="body", frame_size=body_size + 8, channel=fields.get("channel", 1)
        )

    def segment(
        self,
        conn: str,
        ms: float,
        direction: str,
        seq: int,
        ack: int,
        window: int,
        payload: int = 0,
        retransmitted: int = 0,
        dsack: tuple[int, int] | None = None,
    ) -> None:
        self.packet += 1
        self.segments.append(
            dict(
                capture_id=self.capture_id,
                connection_id=conn,
                direction=direction,
                packet_number=self.packet,
                ts=at_ms(ms),
                ts_us=us_at_ms(ms),
                seq_offset=seq,
                ack_offset=ack,
                flags=0x18,
                window=window,
                window_scale=0,
                effective_window=window,
                payload_length=payload,
                retransmitted_bytes=retransmitted,
                dsack_left_offset=dsack[0] if dsack else None,
                dsack_right_offset=dsack[1] if dsack else None,
            )
        )


class Diagnosed:
    """The cases' captures run through the flow-state pipelines once; findings per capture and limits."""

    def __init__(self, spark, cases: dict[str, Traffic]):
        frames = spark.createDataFrame([f for t in cases.values() for f in t.frames], FRAMES_SCHEMA)
        segments = spark.createDataFrame([s for t in cases.values() for s in t.segments], TCP_SEGMENTS_SCHEMA)
        connections = spark.createDataFrame(
            [
                dict(
                    capture_id=t.capture_id,
                    connection_id=c,
                    client_address="127.0.0.1",
                    client_port=port,
                    server_address="127.0.0.1",
                    server_port=5672,
                    protocol="amqp-0-9-1",
                    protocol_inferred=False,
                    first_ts=T0,
                    last_ts=T0,
                    frames=0,
                    c2s_bytes=0,
                    s2c_bytes=0,
                    c2s_missing_bytes=0,
                    s2c_missing_bytes=0,
                    retransmitted_bytes=0,
                )
                for t in cases.values()
                for c, port in t.connections.items()
            ],
            CONNECTIONS_SCHEMA,
        )
        # Each flow table kept as derive keeps what it writes and reads back: the diagnosis is planned
        # over the tables' rows, not over the whole lineage of every one of them (a 3.2 MB plan).
        kept = Build({"frames": frames, "tcp_segments": segments}, store=lambda _table, rows: rows.localCheckpoint())
        flow = kept.build(FLOW)
        self.inputs = dict(
            frames=frames.cache(),
            connections=connections,
            messages_091=messages_091(frames).cache(),
            flow_intervals=flow["flow_intervals"],
            consumer_unacked=flow["consumer_unacked"],
            link_state=flow["link_state"],
            connection_blocked=flow["connection_blocked"],
            channel_confirms=flow["channel_confirms"],
            tcp_flow=flow["tcp_flow"],
        )
        self.by_limits: dict[DiagnosisThresholds, dict[str, list]] = {}

    def __call__(self, capture_id: str, limits: DiagnosisThresholds = DiagnosisThresholds()) -> list:
        if limits not in self.by_limits:
            rows = bottleneck_findings(**self.inputs, limits=limits).orderBy("capture_id", "rank").collect()
            self.by_limits[limits] = {}
            for row in rows:
                self.by_limits[limits].setdefault(row.capture_id, []).append(row)
        return self.by_limits[limits].get(capture_id, [])


CASES: dict[str, Callable[[Traffic], object]] = {}


def case(build: Callable[[Traffic], object]) -> Callable[[Traffic], object]:
    """Registers ``build`` as the maker of the capture named after it."""
    CASES[build.__name__] = build
    return build


@pytest.fixture(scope="module")
def findings(spark) -> Diagnosed:
    built = {}
    for name, build in CASES.items():
        built[name] = Traffic(capture_id=name)
        build(built[name])
    return Diagnosed(spark, built)


def summary(rows) -> list[tuple]:
    return [(r.rank, r.rule_id, r.component, r.effect, r.entity_kind, r.entity) for r in rows]


# -- consumers ----------------------------------------------------------------------------------


def consumer(
    traffic: Traffic,
    conn: str,
    *,
    prefetch: int,
    messages: int,
    ack_after_ms: float,
    refill_after_ms: float,
    start_ms: float = 0.0,
    channel: int = 2,
    tag: str = "ctag-1",
) -> float:
    """A consumer with basic.qos(prefetch) on a queue holding ``messages``: the broker delivers
    ``prefetch`` at once, the consumer acks each ``ack_after_ms`` after the one before (it works on one
    message at a time), and the broker refills each freed slot ``refill_after_ms`` after the ack."""
    t = start_ms
    traffic.frame(conn, t, "c2s", "basic.qos", channel=channel, prefetch_count=prefetch, **{"global": False})
    traffic.frame(conn, t, "s2c", "basic.qos-ok", channel=channel)
    traffic.frame(conn, t, "c2s", "basic.consume", channel=channel, queue="orders")
    traffic.frame(conn, t + 0.1, "s2c", "basic.consume-ok", channel=channel, consumer_tag=tag)
    t += 0.2
    delivered = 0
    for _ in range(min(prefetch, messages)):
        delivered += 1
        traffic.content(
            conn,
            t,
            "s2c",
            "basic.deliver",
            channel=channel,
            consumer_tag=tag,
            delivery_tag=delivered,
            routing_key="orders",
            exchange="",
        )
    for acked in range(1, messages + 1):
        t += ack_after_ms
        traffic.frame(conn, t, "c2s", "basic.ack", channel=channel, delivery_tag=acked, multiple=False)
        if delivered < messages:
            delivered += 1
            traffic.content(
                conn,
                t + refill_after_ms,
                "s2c",
                "basic.deliver",
                channel=channel,
                consumer_tag=tag,
                delivery_tag=delivered,
                routing_key="orders",
                exchange="",
            )
    return t


@case
def slow_consumer(traffic: Traffic) -> None:
    traffic.connection("conn", 40001)
    consumer(traffic, "conn", prefetch=5, messages=40, ack_after_ms=25, refill_after_ms=0.3)


@case
def fast_consumer(traffic: Traffic) -> None:
    traffic.connection("conn", 40001)
    # At prefetch most of the time too, but each delivery is acked within a millisecond and a half.
    consumer(traffic, "conn", prefetch=5, messages=400, ack_after_ms=0.3, refill_after_ms=0.05)


@case
def slow_consumer_empty_queue(traffic: Traffic) -> None:
    traffic.connection("conn", 40001)
    # Slow acks, but no delivery follows an ack for 200 ms: the queue had nothing waiting.
    consumer(traffic, "conn", prefetch=5, messages=30, ack_after_ms=25, refill_after_ms=200)


def test_a_consumer_that_keeps_its_prefetch_full_and_acks_slowly_is_the_bottleneck(findings):
    rows = findings("slow_consumer")
    assert summary(rows) == [
        (1, "diagnosis.consumer.prefetch_bound", "consumer", "deliveries_wait_for_acks", "consumer", "ctag-1")
    ]
    evidence = rows[0].evidence
    # Each delivery waits for the 5 before it: 5 x 25 ms on median, 4 x 25 ms for the first ones.
    assert float(evidence["ack_wait_p50_ms"]) == pytest.approx(125.0, abs=0.5)
    assert evidence["prefetch_count"] == "5" and evidence["queue"] == "orders"
    # Every ack from a full prefetch frees a slot: 36, the last of them when the queue is empty; 35 refilled.
    assert (int(evidence["slots_freed"]), int(evidence["slots_refilled_at_once"])) == (36, 35)
    # At prefetch from the 5th delivery to the first ack (25 ms), then from each refill to the next ack
    # (35 x 24.7 ms), of the 1000 ms from the first delivery to the last ack.
    assert rows[0].lifetime_share == pytest.approx((25 + 35 * 24.7) / 1000, abs=1e-6)
    # Wireshark 4 sets: members separated by commas (tests/test_wireshark_filters.py runs them in tshark).
    listed = ",".join(str(n) for n in rows[0].packet_numbers)
    assert rows[0].wireshark_filter == f"tcp.port == 40001 && frame.number in {{{listed}}}"
    assert (rows[0].queue, rows[0].channel, rows[0].consumer_tag) == ("orders", 2, "ctag-1")


def test_a_fast_consumer_touching_its_prefetch_is_not_a_bottleneck(findings):
    assert findings("fast_consumer") == []


def test_a_slow_consumer_of_an_empty_queue_is_not_a_bottleneck(findings):
    assert [r.rule_id for r in findings("slow_consumer_empty_queue")] == []


# -- alarms ------------------------------------------------------------------------------------


def blocked(traffic: Traffic, conn: str, reason: str, start_ms: float, end_ms: float) -> None:
    traffic.frame(conn, start_ms - 10, "c2s", "basic.publish", channel=1, exchange="", routing_key="q")
    traffic.frame(conn, start_ms, "s2c", "connection.blocked", channel=0, reason=reason)
    traffic.frame(conn, end_ms, "s2c", "connection.unblocked", channel=0)


ALARMS = {"memory_alarm": "low on memory", "disk_alarm": "low on disk", "alarm": "operator said so"}
for _component, _reason in ALARMS.items():

    def _alarm(traffic: Traffic, reason: str = _reason) -> None:
        traffic.connection("conn", 40002)
        blocked(traffic, "conn", reason, 100, 1400)

    _alarm.__name__ = f"blocked_{_component}"
    case(_alarm)


@case
def blocked_blip(traffic: Traffic) -> None:
    traffic.connection("conn", 40002)
    blocked(traffic, "conn", "low on memory", 100, 130)  # 30 ms < min_held_ms 100


@pytest.mark.parametrize("component", ALARMS)
def test_connection_blocked_names_its_alarm(findings, component):
    rows = findings(f"blocked_{component}")
    assert summary(rows) == [
        (1, "diagnosis.alarm.connection_blocked", component, "blocked", "connection", "127.0.0.1:40002")
    ]
    assert rows[0].duration_us == 1_300_000
    assert (rows[0].start_packet_number, rows[0].end_packet_number) == (2, 3)
    # Every connection.blocked / unblocked packet of the connection is listed: a field filter names them.
    assert rows[0].packet_numbers == [2, 3]
    assert rows[0].wireshark_filter == "tcp.port == 40002 && (amqp.method.class == 10 && amqp.method.method in {60,61})"
    assert rows[0].evidence["blocked_seconds"] == "1.300"


def test_a_blocked_blip_is_not_a_bottleneck(findings):
    assert findings("blocked_blip") == []
    assert [r.component for r in findings("blocked_blip", DiagnosisThresholds(min_held_ms=20))] == ["memory_alarm"]


# -- TCP: publishers throttled, clients not reading, head-of-line -----------------------------------


def throttled_publisher(
    traffic: Traffic,
    conn: str,
    *,
    start_ms: float = 0.0,
    stalls: int = 10,
    stall_ms: float = 40.0,
    body_size: int = 64,
    delivery_mode=None,
    routing_key: str = "q",
    window: int = 1000,
) -> float:
    """A publisher that fills the broker's 1000-byte receive window ``stalls`` times; the broker acks
    ``stall_ms`` later each time, advertising ``window`` again (its reader blocked by credit flow meanwhile)."""
    t, sent = start_ms, 0
    for _ in range(stalls):
        traffic.content(
            conn,
            t,
            "c2s",
            "basic.publish",
            channel=1,
            exchange="",
            routing_key=routing_key,
            body_size=body_size,
            delivery_mode=delivery_mode,
        )
        traffic.segment(conn, t, "c2s", sent, 0, 65535, 1000)  # fills the window the broker advertised
        sent += 1000
        traffic.segment(conn, t + stall_ms, "s2c", 0, sent, window)  # read at last: the window opens again
        t += stall_ms + 1
    return t


@case
def throttled(traffic: Traffic) -> None:
    traffic.connection("pub", 40003)
    traffic.segment("pub", 0, "s2c", 0, 0, 1000)
    throttled_publisher(traffic, "pub")


@case
def throttled_short_of_full(traffic: Traffic) -> None:
    """The broker's window has room for 1000 bytes; the publisher sends 600 and stops: no room for
    its next 600-byte segment (Linux avoids a silly window), so nothing fills the window exactly."""
    traffic.connection("pub", 40013)
    traffic.segment("pub", 0, "s2c", 0, 0, 1000)
    t, sent = 0.0, 0
    for _ in range(10):
        traffic.content("pub", t, "c2s", "basic.publish", channel=1, exchange="", routing_key="q")
        traffic.segment("pub", t, "c2s", sent, 0, 65535, 600)
        sent += 600
        traffic.segment("pub", t + 40, "s2c", 0, sent, 1000)  # read 40 ms later: room again
        t += 41


@case
def two_throttled_to_one_queue(traffic: Traffic) -> None:
    for conn, port in (("a", 40004), ("b", 40005)):
        traffic.connection(conn, port)
        traffic.segment(conn, 0, "s2c", 0, 0, 1000)
    throttled_publisher(traffic, "a", routing_key="shared")
    throttled_publisher(traffic, "b", start_ms=5, routing_key="shared")


@case
def two_throttled_apart(traffic: Traffic) -> None:
    """The near miss of publishers throttled together: same queue, but held back two seconds apart."""
    for conn, port in (("a", 40014), ("b", 40015)):
        traffic.connection(conn, port)
        traffic.segment(conn, 0, "s2c", 0, 0, 1000)
    throttled_publisher(traffic, "a", routing_key="shared")
    throttled_publisher(traffic, "b", start_ms=2000, routing_key="shared")


@case
def to_quorum_queue(traffic: Traffic) -> None:
    traffic.connection("pub", 40016)
    traffic.frame(
        "pub",
        0,
        "c2s",
        "queue.declare",
        channel=1,
        queue="votes",
        arguments={
            "durable": "true",
            "passive": "false",
            "arguments": '{"x-queue-type":"quorum","x-max-length":100000}',
        },
    )
    traffic.frame("pub", 0.1, "s2c", "queue.declare-ok", channel=1, queue="votes", message_count=0)
    traffic.segment("pub", 0.2, "s2c", 0, 0, 1000)
    throttled_publisher(traffic, "pub", start_ms=1, routing_key="votes")


@case
def large_persistent(traffic: Traffic) -> None:
    traffic.connection("pub", 40006)
    traffic.segment("pub", 0, "s2c", 0, 0, 1000)
    throttled_publisher(traffic, "pub", body_size=8192, delivery_mode=2)


@case
def never_full_window(traffic: Traffic) -> None:
    traffic.connection("pub", 40003)
    traffic.segment("pub", 0, "s2c", 0, 0, 65535)
    throttled_publisher(traffic, "pub", window=65535)  # 1000-byte segments against a 64 KB window: never full


@case
def head_of_line(traffic: Traffic) -> None:
    """Channel 2 consumes with prefetch 2, acking every 20 ms and refilled at once, until the
    publisher on channel 1 is throttled from 200 ms to 609 ms: the ack at 205 ms frees a slot, but
    the next delivery comes at 620 ms; then the consumer goes on as before."""
    traffic.connection("both", 40007)
    traffic.frame("both", 0, "c2s", "basic.qos", channel=2, prefetch_count=2, **{"global": False})
    traffic.frame("both", 0, "s2c", "basic.qos-ok", channel=2)
    traffic.frame("both", 0.5, "c2s", "basic.consume", channel=2, queue="other")
    traffic.frame("both", 0.6, "s2c", "basic.consume-ok", channel=2, consumer_tag="c-other")
    tag = 0

    def deliver(ms: float) -> None:
        nonlocal tag
        tag += 1
        traffic.content(
            "both",
            ms,
            "s2c",
            "basic.deliver",
            channel=2,
            consumer_tag="c-other",
            delivery_tag=tag,
            exchange="",
            routing_key="other",
        )

    deliver(1)
    deliver(1)
    acked = 0
    for ms in [*range(25, 206, 20), *range(640, 1100, 20)]:
        acked += 1
        traffic.frame("both", ms, "c2s", "basic.ack", channel=2, delivery_tag=acked, multiple=False)
        deliver(620 if ms == 205 else ms + 0.5)
    traffic.segment("both", 150, "s2c", 0, 0, 1000)
    throttled_publisher(traffic, "both", start_ms=200)


@case
def not_reading(traffic: Traffic) -> None:
    traffic.connection("slow", 40008)
    traffic.frame("slow", 0, "s2c", "basic.deliver", channel=1, consumer_tag="big", delivery_tag=1)
    traffic.segment("slow", 0, "s2c", 0, 0, 65535, 60000)
    traffic.segment("slow", 1, "c2s", 0, 60000, 0)  # the client's buffer is full: zero window
    traffic.segment("slow", 400, "c2s", 0, 60000, 30000)  # it read half, 400 ms later
    traffic.segment("slow", 401, "s2c", 60000, 0, 65535, 30000)
    traffic.segment("slow", 402, "c2s", 0, 90000, 0)
    traffic.segment("slow", 800, "c2s", 0, 90000, 60000)
    traffic.frame("slow", 801, "s2c", "basic.deliver", channel=1, consumer_tag="big", delivery_tag=2)


def test_a_publisher_filling_the_brokers_window_is_throttled_by_its_channel(findings):
    rows = findings("throttled")
    assert summary(rows) == [
        (1, "diagnosis.publisher.credit_flow", "channel", "publisher_throttled", "connection", "127.0.0.1:40003")
    ]
    assert rows[0].evidence["window_full_segments"] == "10" and rows[0].evidence["stalls"] == "9"
    # From each full window until the broker's ack made room for the next segment, 40 ms (the
    # millisecond after it is the publisher's own); the last segment has no next one.
    assert rows[0].duration_us == 9 * 40_000
    assert rows[0].lifetime_share == pytest.approx(9 * 40 / (9 * 41), abs=1e-9)
    assert rows[0].queue == "q"


def test_a_publisher_stopping_short_of_a_full_window_is_throttled_too(findings):
    rows = findings("throttled_short_of_full")
    assert [(r.rule_id, r.component) for r in rows] == [("diagnosis.publisher.credit_flow", "channel")]
    assert rows[0].evidence["window_full_segments"] == "0"  # Wireshark flags none of them
    assert rows[0].duration_us == 9 * 40_000


def test_two_publishers_to_one_queue_throttled_together_point_at_the_queue(findings):
    rows = findings("two_throttled_to_one_queue")
    assert {(r.entity, r.component, r.queue) for r in rows} == {
        ("127.0.0.1:40004", "queue", "shared"),
        ("127.0.0.1:40005", "queue", "shared"),
    }
    assert {r.evidence["co_throttled_publishers"] for r in rows} == {"1"}
    assert all(float(r.evidence["together_share"]) == 1.0 for r in rows)


def test_two_publishers_to_one_queue_throttled_apart_point_at_their_channels(findings):
    rows = findings("two_throttled_apart")
    assert {(r.entity, r.component) for r in rows} == {("127.0.0.1:40014", "channel"), ("127.0.0.1:40015", "channel")}
    assert {r.evidence["together_share"] for r in rows} == {"0.000"}


def test_a_publisher_to_a_quorum_queue_points_at_the_queue_and_says_so(findings):
    (row,) = findings("to_quorum_queue")
    assert (row.component, row.queue) == ("queue", "votes")
    assert row.evidence["queue_types"] == "quorum" and row.evidence["bounded_queues"] == "votes"
    assert "votes (quorum)" in row.explanation and "Raft log" in row.explanation


def test_large_persistent_messages_point_at_the_message_store(findings):
    assert [r.component for r in findings("large_persistent")] == ["message_store"]


def test_a_publisher_never_filling_the_window_is_not_throttled(findings):
    assert findings("never_full_window") == []


def test_head_of_line_blocking_ranks_above_the_throttling_that_causes_it(findings):
    rows = findings("head_of_line")
    assert summary(rows) == [
        (1, "diagnosis.connection.head_of_line", "channel", "head_of_line", "consumer", "c-other"),
        (2, "diagnosis.publisher.credit_flow", "channel", "publisher_throttled", "connection", "127.0.0.1:40007"),
        # Its acks come 20 ms or more after each delivery with its 2 slots always full: slow by the
        # consumer rule's own thresholds too, ranked after what holds it back.
        (3, "diagnosis.consumer.prefetch_bound", "consumer", "deliveries_wait_for_acks", "consumer", "c-other"),
    ]
    hol = rows[0]
    assert (hol.queue, hol.channel, hol.consumer_tag) == ("other", 2, "c-other")
    assert hol.evidence["publisher_channels"] == "1" and hol.evidence["prefetch_count"] == "2"
    # The slot freed at 205 ms waited for its delivery until 620 ms.
    assert hol.duration_us == 415_000
    rates = [float(hol.evidence[f"deliveries_per_second_{p}"]) for p in ("before", "during", "after")]
    assert rates[0] > 40 and rates[1] == 0 and rates[2] > 40


def test_a_client_closing_its_receive_window_is_not_reading(findings):
    rows = findings("not_reading")
    assert summary(rows) == [
        (1, "diagnosis.client.not_reading", "client", "client_not_reading", "connection", "127.0.0.1:40008")
    ]
    assert rows[0].evidence["zero_windows"] == "2"
    assert rows[0].duration_us == 399_000 + 398_000


# -- retransmissions ---------------------------------------------------------------------------------


def retransmitting(traffic: Traffic, conn: str, *, lost: bool, segments: int = 20) -> None:
    """A publisher sends a 1000-byte segment every 10 ms; the broker acks each at once up to segment 5
    (sent at 50 ms), then nothing more until the publisher sends segment 5 again at 250 ms (its
    retransmission timeout) and the broker acks everything. ``lost``: segment 5 never arrived;
    else it had (its ack was late) and the broker's ack D-SACKs the copy (RFC 2883)."""
    traffic.segment(conn, 0, "s2c", 0, 0, 65535)
    for i in range(segments):
        t = i * 10
        traffic.content(conn, t, "c2s", "basic.publish", channel=1, exchange="", routing_key="q")
        traffic.segment(conn, t, "c2s", i * 1000, 0, 65535, 1000)
        traffic.segment(conn, t + 0.1, "s2c", 0, min(i + 1, 5) * 1000, 65535)
    traffic.segment(conn, 250, "c2s", 5000, 0, 65535, 1000, retransmitted=1000)
    traffic.segment(conn, 250.1, "s2c", 0, segments * 1000, 65535, dsack=None if lost else (5000, 6000))


@case
def lost_segment(traffic: Traffic) -> None:
    traffic.connection("pub", 40017)
    retransmitting(traffic, "pub", lost=True)


@case
def spurious_retransmission(traffic: Traffic) -> None:
    traffic.connection("pub", 40018)
    retransmitting(traffic, "pub", lost=False)


def test_a_lost_segment_costs_the_time_until_its_copy_is_acknowledged(findings):
    (row,) = findings("lost_segment")
    assert (row.rule_id, row.component, row.effect) == ("diagnosis.network.retransmission", "network", "retransmission")
    # Sent at 50 ms, its copy at 250 ms, acknowledged at 250.1 ms.
    assert row.duration_us == 200_100
    assert row.evidence["lost_segments"] == "1" and row.evidence["spurious_retransmissions"] == "0"
    assert row.evidence["loopback"] == "true" and "loopback" in row.explanation


def test_a_retransmission_the_receiver_dsacks_costs_nothing(findings):
    assert findings("spurious_retransmission") == []


# -- clients that set the pace -----------------------------------------------------------------------


def confirming_publisher(
    traffic: Traffic, conn: str, *, messages: int, confirm_after_ms: float, next_after_ms: float
) -> None:
    """A publisher in confirm mode: each publish confirmed ``confirm_after_ms`` later, the next
    publish ``next_after_ms`` after that confirm (one in flight)."""
    traffic.frame(conn, 0, "c2s", "confirm.select", channel=1)
    traffic.frame(conn, 0.1, "s2c", "confirm.select-ok", channel=1)
    t = 1.0
    for seq in range(1, messages + 1):
        traffic.content(conn, t, "c2s", "basic.publish", channel=1, exchange="", routing_key="jobs")
        traffic.frame(conn, t + confirm_after_ms, "s2c", "basic.ack", channel=1, delivery_tag=seq, multiple=False)
        t += confirm_after_ms + next_after_ms


@case
def confirm_bound(traffic: Traffic) -> None:
    traffic.connection("pub", 40019)
    confirming_publisher(traffic, "pub", messages=300, confirm_after_ms=1.0, next_after_ms=0.2)


@case
def confirm_paced(traffic: Traffic) -> None:
    traffic.connection("pub", 40020)
    confirming_publisher(traffic, "pub", messages=60, confirm_after_ms=1.0, next_after_ms=9.0)


def prefetch_one_consumer(
    traffic: Traffic, conn: str, *, backlog: int, messages: int, fed_every_ms: float | None
) -> None:
    """A consumer with prefetch 1 of queue "jobs" acking 0.2 ms after each delivery; the queue holds
    ``backlog`` messages when declared (the broker's declare-ok says so) and, when ``fed_every_ms``,
    a publisher on another connection feeds it that often, each message delivered 0.2 ms later."""
    traffic.frame(conn, 0, "c2s", "queue.declare", channel=1, queue="jobs")
    traffic.frame(conn, 0.1, "s2c", "queue.declare-ok", channel=1, queue="jobs", message_count=backlog)
    traffic.frame(conn, 0.2, "c2s", "basic.qos", channel=1, prefetch_count=1, **{"global": False})
    traffic.frame(conn, 0.3, "s2c", "basic.qos-ok", channel=1)
    traffic.frame(conn, 0.4, "c2s", "basic.consume", channel=1, queue="jobs")
    traffic.frame(conn, 0.5, "s2c", "basic.consume-ok", channel=1, consumer_tag="one-by-one")
    t = 1.0
    for tag in range(1, messages + 1):
        if fed_every_ms is not None:
            t = max(t, tag * fed_every_ms)
            traffic.content("feeder", t, "c2s", "basic.publish", channel=1, exchange="", routing_key="jobs")
            t += 0.2
        traffic.content(
            conn,
            t,
            "s2c",
            "basic.deliver",
            channel=1,
            consumer_tag="one-by-one",
            delivery_tag=tag,
            exchange="",
            routing_key="jobs",
        )
        traffic.frame(conn, t + 0.2, "c2s", "basic.ack", channel=1, delivery_tag=tag, multiple=False)
        t += 0.3  # the broker sends the next waiting message 0.1 ms after the ack


@case
def prefetch_one_backlog(traffic: Traffic) -> None:
    traffic.connection("con", 40021)
    prefetch_one_consumer(traffic, "con", backlog=1000, messages=600, fed_every_ms=None)


@case
def prefetch_one_empty_queue(traffic: Traffic) -> None:
    traffic.connection("con", 40022)
    traffic.connection("feeder", 40023)
    prefetch_one_consumer(traffic, "con", backlog=0, messages=60, fed_every_ms=10.0)


def test_a_publisher_waiting_for_each_confirm_is_bound_by_its_round_trips(findings):
    (row,) = findings("confirm_bound")
    assert (row.rule_id, row.component, row.effect, row.entity_kind) == (
        "diagnosis.client.confirm_bound",
        "client",
        "publisher_waits_for_confirms",
        "channel",
    )
    assert (row.channel, row.queue, row.entity) == (1, "jobs", "127.0.0.1:40019 channel 1")
    assert row.evidence["in_flight_max"] == "1" and row.evidence["confirm_round_trip_ms"] == "1.0"
    # Waiting 1 ms of every 1.2 ms cycle, from the first publish to the last confirm.
    assert row.lifetime_share == pytest.approx(300 * 1.0 / (299 * 1.2 + 1.0), abs=1e-6)


def test_a_publisher_waiting_for_each_confirm_at_a_pace_of_its_own_is_not(findings):
    assert findings("confirm_paced") == []


def test_a_prefetch_one_consumer_of_a_backlog_is_bound_by_its_round_trips(findings):
    (row,) = findings("prefetch_one_backlog")
    assert (row.rule_id, row.component, row.effect, row.consumer_tag, row.queue) == (
        "diagnosis.client.round_trip_bound",
        "client",
        "consumer_round_trip_bound",
        "one-by-one",
        "jobs",
    )
    # The queue's ready count is known (its declare-ok): a message waited at every ack.
    assert row.evidence["waiting_share"] == "1.000" and row.evidence["window"] == "1"
    assert row.evidence["round_trip_ms"] == "0.3"


def test_a_prefetch_one_consumer_of_an_empty_queue_is_not(findings):
    # Each message is delivered as it is published: none waits in the queue (its ready count is 0
    # at every ack), though each delivery follows the previous ack within refill_ms.
    assert findings("prefetch_one_empty_queue") == []


# -- AMQP 1.0 receiving links ------------------------------------------------------------------------


def receiving_link(
    traffic: Traffic,
    conn: str,
    name: str,
    handle: int,
    *,
    grants: int,
    credit: int,
    grant_after_ms: float,
    channel: int = 0,
) -> None:
    """The client attaches a receiving link and grants ``credit`` ``grant_after_ms`` after the last was
    used; the broker has messages waiting and uses each grant at once (0.2 ms a transfer)."""
    t = 0.0
    traffic.frame(
        conn,
        t,
        "c2s",
        "attach",
        "amqp-1.0",
        channel=channel,
        name=name,
        handle=handle,
        role="receiver",
        source_address=f"/queues/{name}",
    )
    traffic.frame(
        conn,
        t,
        "s2c",
        "attach",
        "amqp-1.0",
        channel=channel,
        name=name,
        handle=handle,
        role="sender",
        source_address=f"/queues/{name}",
        initial_delivery_count=0,
    )
    delivery = 0
    for _ in range(grants):
        t += grant_after_ms
        traffic.frame(
            conn,
            t,
            "c2s",
            "flow",
            "amqp-1.0",
            channel=channel,
            handle=handle,
            delivery_count=delivery,
            link_credit=credit,
            next_incoming_id=0,
            incoming_window=1000,
            next_outgoing_id=0,
            outgoing_window=1000,
        )
        for _ in range(credit):
            t += 0.2
            traffic.frame(
                conn,
                t,
                "s2c",
                "transfer",
                "amqp-1.0",
                channel=channel,
                handle=handle,
                delivery_id=delivery,
                delivery_tag_bytes=bytes([delivery % 256]),
                more=False,
                settled=False,
            )
            delivery += 1


@case
def slow_and_fast_receivers(traffic: Traffic) -> None:
    traffic.connection("amqp10", 40009)
    receiving_link(traffic, "amqp10", "slow", 0, grants=20, credit=2, grant_after_ms=50)
    receiving_link(traffic, "amqp10", "fast", 1, grants=20, credit=2, grant_after_ms=0.5)


def test_a_receiver_granting_credit_slowly_is_a_slow_consumer_and_its_fast_neighbour_is_not(findings):
    rows = findings("slow_and_fast_receivers")
    assert summary(rows) == [(1, "diagnosis.consumer.credit_bound", "consumer", "credit_starved", "link", "slow")]
    assert rows[0].queue == "slow"  # the queue the link's source address /queues/slow names
    assert float(rows[0].evidence["zero_credit_p50_ms"]) == pytest.approx(50.0, abs=0.5)


# -- the headline ------------------------------------------------------------------------------------


@case
def alarm_and_slow_consumer(traffic: Traffic) -> None:
    traffic.connection("conn", 40002)
    traffic.connection("c2", 40001)
    blocked(traffic, "conn", "low on memory", 100, 1400)
    consumer(traffic, "c2", prefetch=5, messages=20, ack_after_ms=25, refill_after_ms=0.3)


def test_diagnosis_heads_with_the_alarm_and_says_none_for_a_quiet_capture(spark, findings):
    found = spark.createDataFrame(findings("alarm_and_slow_consumer"), BOTTLENECKS_SCHEMA)
    captures = spark.createDataFrame(
        [
            dict(
                {n: None for n in CAPTURES_SCHEMA.fieldNames()},
                capture_id=c,
                file_name=f"{c}.pcap",
                file_size=1,
                packets=1,
            )
            for c in ("alarm_and_slow_consumer", "quiet")
        ],
        CAPTURES_SCHEMA,
    )
    rows = {r.capture_id: r for r in diagnosis(found, captures).collect()}
    cap = rows["alarm_and_slow_consumer"]
    assert cap.bottleneck == "memory_alarm" and cap.findings_count == 2
    assert [f.component for f in cap.findings] == ["memory_alarm", "consumer"]
    assert cap.headline.startswith(
        "Bottleneck: memory alarm (blocked) on connection 127.0.0.1:40002 (queue q), from 00:00:00.100 UTC (packet "
    )
    assert rows["quiet"].bottleneck == "none" and rows["quiet"].findings == []
    assert rows["quiet"].headline.startswith("No bottleneck")


def test_encrypted_connections_are_named_in_the_headline_and_alone_are_encrypted(spark, findings):
    """TLS not decrypted (connections.protocol tls): after a finding, beside decoded traffic, or alone."""
    found = spark.createDataFrame(findings("alarm_and_slow_consumer"), BOTTLENECKS_SCHEMA)
    ids = ("alarm_and_slow_consumer", "mixed", "only_tls", "plain")
    captures = spark.createDataFrame(
        [
            dict(
                {n: None for n in CAPTURES_SCHEMA.fieldNames()},
                capture_id=c,
                file_name=f"{c}.pcap",
                file_size=1,
                packets=1,
            )
            for c in ids
        ],
        CAPTURES_SCHEMA,
    )

    def connection(capture: str, port: int, protocol: str, version: str | None) -> dict:
        row = {f.name: 0 for f in CONNECTIONS_SCHEMA.fields}
        row.update(
            capture_id=capture,
            connection_id=f"{capture}-{port}",
            client_address="127.0.0.1",
            client_port=port,
            server_address="127.0.0.1",
            server_port=5671,
            protocol=protocol,
            protocol_inferred=False,
            first_ts=None,
            last_ts=None,
            tls_alpn_offered=None,
            tls_version=version,
        )
        return row

    connections = spark.createDataFrame(
        [
            connection("alarm_and_slow_consumer", 1, "amqp-0-9-1", None),
            connection("alarm_and_slow_consumer", 2, "tls", "TLS 1.3"),
            connection("mixed", 1, "amqp-1.0", "TLS 1.2"),
            connection("mixed", 2, "tls", "TLS 1.2"),
            connection("only_tls", 1, "tls", "TLS 1.3"),
            connection("only_tls", 2, "tls", "TLS 1.3"),
            connection("plain", 1, "amqp-0-9-1", None),
        ],
        CONNECTIONS_SCHEMA,
    )
    rows = {r.capture_id: r for r in diagnosis(found, captures, connections).collect()}
    assert rows["alarm_and_slow_consumer"].bottleneck == "memory_alarm"
    assert rows["alarm_and_slow_consumer"].headline.startswith("Bottleneck: memory alarm (blocked)")
    assert rows["alarm_and_slow_consumer"].headline.endswith(
        " 1 connection is encrypted (TLS 1.3) and was not decoded: give --tls-keylog."
    )
    assert rows["mixed"].bottleneck == "none"
    assert rows["mixed"].headline.startswith("No bottleneck in the decoded traffic")
    assert rows["mixed"].headline.endswith(
        "1 connection is encrypted (TLS 1.2) and was not decoded: give --tls-keylog."
    )
    assert (rows["only_tls"].bottleneck, rows["only_tls"].encrypted_connections) == ("encrypted", 2)
    assert rows["only_tls"].headline == (
        "2 connections are encrypted (TLS 1.3) and were not decoded: give "
        "--tls-keylog. No AMQP was decoded, and TCP showed no finding: nothing "
        "else could be judged."
    )
    assert (rows["plain"].bottleneck, rows["plain"].encrypted_connections) == ("none", 0)
    assert rows["plain"].headline.startswith("No bottleneck: ")


@pytest.mark.slow  # the whole catalogue planned per protocol, twice: a check of a speed-up, not of a verdict
def test_the_rules_of_a_protocol_no_connection_speaks_are_left_out_and_the_others_find_the_same(findings):
    """derive passes the run's connection protocols (``spoken``): a rule whose measure reads only
    another protocol's connections is not planned; every other rule's findings are as with all
    rules planned (the rank aside: it counts within what is found)."""
    measure_of = {r.id: r.measure for r in load_bottleneck_rules(measures=frozenset(MEASURES))}

    def found(spoken=None) -> list[tuple]:
        rows = bottleneck_findings(**findings.inputs, spoken=spoken).collect()
        return sorted((r.capture_id, r.rule_id, r.finding_id, r.entity, r.explanation) for r in rows)

    everything = found()
    left_out = {}
    for spoken in ({"amqp-0-9-1"}, {"amqp-1.0"}):
        kept = [f for f in everything if MEASURE_PROTOCOL.get(measure_of[f[1]]) in (None, *spoken)]
        assert found(spoken) == kept, spoken
        left_out[min(spoken)] = {f[1] for f in everything} - {f[1] for f in kept}
    # The cases hold findings of the 0-9-1-scoped rules (left out of a 1.0-only run) and none of the
    # 1.0-scoped one (a 0-9-1-only run finds all they find, the 1.0 links' and sessions' too).
    assert left_out == {
        "amqp-0-9-1": set(),
        "amqp-1.0": {"diagnosis.connection.head_of_line", "diagnosis.client.confirm_bound"},
    }


# -- every finding ------------------------------------------------------------------------------------


def test_no_finding_holds_an_entity_back_longer_than_it_was_active(findings):
    rows = [r for case in CASES for r in findings(case)]
    assert rows and all(0 <= r.lifetime_share <= 1 for r in rows)
    assert all(r.start_ts <= (r.end_ts or r.start_ts) for r in rows)


def test_evidence_numbers_are_plain_decimals(findings):
    # Written without grouping (1234.5, never 1,234.5) so that diagnose --json can type them.
    units = evidence_units()
    checked = 0
    for row in (r for case in CASES for r in findings(case)):
        for key, value in row.evidence.items():
            unit = units[row.rule_id].get(key)
            if value is None or unit in (None, "text"):
                continue
            checked += 1
            assert value in ("true", "false") if unit == "flag" else float(value) == float(value), (
                row.rule_id,
                key,
                value,
            )
    assert checked > 50
