"""The queue- and consumer-side rules of the diagnosis on hand-timed traffic, each with its near miss.

Consumers whose prefetch is set channel-wide (basic.qos global=true, as Celery sets it), consumers
that never ack, redelivery loops, a slow consumer a fast one hides, a queue filling with nobody
consuming, and AMQP 1.0 senders whose transfers the broker settles late. Each case is one capture
built from frames timed by hand (``tests.test_bottlenecks.Traffic``); the flow-state pipelines and
the diagnosis run once on all of them, and each test compares its capture's findings with what the
timing means.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.test_bottlenecks import Diagnosed, Traffic, consumer, summary

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


def message(
    traffic: Traffic, conn: str, ms: float, direction: str, method: str, *, message_id: str | None = None, **fields
) -> None:
    """A content method, its header (with ``message_id``) and one 64-byte body, in one packet's time."""
    channel = fields.get("channel", 1)
    traffic.frame(conn, ms, direction, method, **fields)
    traffic.frame(conn, ms, direction, None, frame_type="header", body_size=64, message_id=message_id, channel=channel)
    traffic.frame(conn, ms, direction, None, frame_type="body", frame_size=72, channel=channel)


def declared(traffic: Traffic, conn: str, queue: str, ready: int, ms: float = 0.0) -> None:
    """The queue declared and the broker's declare-ok saying ``ready`` messages are in it."""
    traffic.frame(conn, ms, "c2s", "queue.declare", channel=1, queue=queue)
    traffic.frame(conn, ms + 0.05, "s2c", "queue.declare-ok", channel=1, queue=queue, message_count=ready)


def subscribed(
    traffic: Traffic, conn: str, ms: float, *, queue: str, tag: str, channel: int = 1, no_ack: bool = False
) -> None:
    traffic.frame(conn, ms, "c2s", "basic.consume", channel=channel, queue=queue, no_ack=no_ack)
    traffic.frame(conn, ms + 0.05, "s2c", "basic.consume-ok", channel=channel, consumer_tag=tag)


# -- basic.qos(global=true): the channel's prefetch (Celery / kombu) ------------------------------


def channel_wide(traffic: Traffic) -> None:
    """The capture's basic.qos made channel-wide: the same prefetch, shared by the channel's consumers."""
    for frame in traffic.frames:
        if frame["method"] == "basic.qos":
            frame["global"] = True


@case
def slow_consumer_global_qos(traffic: Traffic) -> None:
    traffic.connection("worker", 41001)
    consumer(traffic, "worker", prefetch=4, messages=40, ack_after_ms=25, refill_after_ms=0.3)
    channel_wide(traffic)


@case
def fast_consumer_global_qos(traffic: Traffic) -> None:
    traffic.connection("worker", 41002)
    consumer(traffic, "worker", prefetch=4, messages=400, ack_after_ms=0.3, refill_after_ms=0.05)
    channel_wide(traffic)


def test_a_slow_consumer_whose_prefetch_is_channel_wide_is_prefetch_bound(findings):
    rows = findings("slow_consumer_global_qos")
    assert summary(rows) == [
        (1, "diagnosis.consumer.prefetch_bound", "consumer", "deliveries_wait_for_acks", "consumer", "ctag-1")
    ]
    # The channel's 4 slots full from the 4th delivery (0.2 ms) to each ack, refilled 0.3 ms later:
    # 40 acks 25 ms apart, at the prefetch all but 0.3 ms of every 25 ms while the queue had messages.
    evidence = rows[0].evidence
    assert evidence["prefetch_count"] == "4"
    assert float(evidence["at_prefetch_share"]) > 0.9


def test_a_fast_consumer_whose_prefetch_is_channel_wide_is_not(findings):
    assert findings("fast_consumer_global_qos") == []


# -- consumers that never ack -------------------------------------------------------------------------


def unacked_consumer(traffic: Traffic, conn: str, *, deliveries: int, ack: bool, no_ack: bool = False) -> None:
    """A consumer with no basic.qos of queue "work": the broker delivers a message every 5 ms;
    with ``ack`` the consumer acks each 2 ms after it came, else never."""
    subscribed(traffic, conn, 0.0, queue="work", tag="forgetful", no_ack=no_ack)
    for tag in range(1, deliveries + 1):
        t = tag * 5.0
        message(
            traffic,
            conn,
            t,
            "s2c",
            "basic.deliver",
            channel=1,
            consumer_tag="forgetful",
            delivery_tag=tag,
            exchange="",
            routing_key="work",
        )
        if ack:
            traffic.frame(conn, t + 2.0, "c2s", "basic.ack", channel=1, delivery_tag=tag, multiple=False)


@case
def never_acks(traffic: Traffic) -> None:
    traffic.connection("con", 41011)
    unacked_consumer(traffic, "con", deliveries=150, ack=False)


@case
def acks_each(traffic: Traffic) -> None:
    traffic.connection("con", 41012)
    unacked_consumer(traffic, "con", deliveries=150, ack=True)


@case
def auto_ack(traffic: Traffic) -> None:
    traffic.connection("con", 41013)
    unacked_consumer(traffic, "con", deliveries=150, ack=False, no_ack=True)


def test_a_manual_ack_consumer_that_acks_nothing_never_acks(findings):
    rows = findings("never_acks")
    assert summary(rows) == [
        (1, "diagnosis.consumer.never_acks", "consumer", "deliveries_never_acked", "consumer", "forgetful")
    ]
    evidence = rows[0].evidence
    # 150 deliveries 5 ms apart from 5 ms: unacked grows to 150, the first waits until the last frame (750 ms).
    assert (evidence["deliveries"], evidence["acked"], evidence["unacked_max"]) == ("150", "0", "150")
    assert evidence["prefetch_scope"] == "unbounded" and evidence["without_ack_seconds"] == "0.745"
    assert rows[0].duration_us == 745_000


def test_a_consumer_acking_each_delivery_or_consuming_with_auto_ack_is_not(findings):
    assert findings("acks_each") == []
    assert findings("auto_ack") == []


# -- redelivery loops ---------------------------------------------------------------------------------


def requeueing_consumer(traffic: Traffic, conn: str, *, loops: int, others: int) -> None:
    """A consumer with prefetch 1 of queue "tasks", which holds ``others`` + 1 messages when declared.
    The first message ("poison") fails: the consumer nacks it with requeue 0.5 ms after each
    delivery and RabbitMQ redelivers it 0.5 ms later, ``loops`` times after its first delivery;
    then the consumer gives up on it (nack without requeue) and acks the ``others`` behind it."""
    declared(traffic, conn, "tasks", others + 1)
    traffic.frame(conn, 0.2, "c2s", "basic.qos", channel=1, prefetch_count=1, **{"global": False})
    traffic.frame(conn, 0.25, "s2c", "basic.qos-ok", channel=1)
    subscribed(traffic, conn, 0.3, queue="tasks", tag="picky")
    t, tag = 1.0, 0
    for attempt in range(loops + 1):
        tag += 1
        message(
            traffic,
            conn,
            t,
            "s2c",
            "basic.deliver",
            message_id="poison",
            channel=1,
            consumer_tag="picky",
            delivery_tag=tag,
            redelivered=attempt > 0,
            exchange="",
            routing_key="tasks",
        )
        last = attempt == loops
        traffic.frame(conn, t + 0.5, "c2s", "basic.nack", channel=1, delivery_tag=tag, multiple=False, requeue=not last)
        t += 1.0
    for n in range(others):
        tag += 1
        message(
            traffic,
            conn,
            t,
            "s2c",
            "basic.deliver",
            message_id=f"m{n}",
            channel=1,
            consumer_tag="picky",
            delivery_tag=tag,
            redelivered=False,
            exchange="",
            routing_key="tasks",
        )
        traffic.frame(conn, t + 0.5, "c2s", "basic.ack", channel=1, delivery_tag=tag, multiple=False)
        t += 1.0


@case
def redelivery_loop(traffic: Traffic) -> None:
    traffic.connection("con", 41021)
    requeueing_consumer(traffic, "con", loops=60, others=5)


@case
def retried_a_few_times(traffic: Traffic) -> None:
    traffic.connection("con", 41022)
    requeueing_consumer(traffic, "con", loops=3, others=5)


def test_a_message_requeued_again_and_again_is_a_redelivery_loop(findings):
    rows = findings("redelivery_loop")
    assert summary(rows)[0] == (
        1,
        "diagnosis.consumer.redelivery_loop",
        "consumer",
        "redelivery_loop",
        "consumer",
        "picky",
    )
    evidence = rows[0].evidence
    # Delivered 61 times: 60 redeliveries, 59 of them requeued again (the last dropped); 66 deliveries
    # in all; after its last delivery the 5 others wait (6 declared, 61 delivered, 60 requeued).
    assert evidence["message_id"] == "poison" and evidence["requeued_redeliveries"] == "59"
    assert evidence["deliveries_of_the_message"] == "61" and evidence["queue_deliveries"] == "66"
    assert evidence["other_messages_delivered"] == "5" and evidence["ready_after"] == "5"
    assert evidence["looping_seconds"] == "0.060"


def test_a_message_retried_a_few_times_is_not_a_loop(findings):
    assert [r.rule_id for r in findings("retried_a_few_times")] == []


# -- a slow consumer a faster one hides --------------------------------------------------------------


def shared_queue(traffic: Traffic, *, slow_ack_ms: float, fast_ack_ms: float, duration_ms: float) -> None:
    """Two consumers with prefetch 5 of queue "orders", empty when declared; a publisher publishes a
    message the moment a consumer has a free slot, so the queue never holds one ready: each
    consumer acks one delivery every ``*_ack_ms`` and gets the next message 0.3 ms after its ack."""
    events: list[tuple[float, int, Callable[[], None]]] = []

    def at(ms: float, action: Callable[[], None]) -> None:
        events.append((ms, len(events), action))

    declared(traffic, "pub", "orders", 0)
    for conn, tag, ack_ms in (("slow", "slow-1", slow_ack_ms), ("fast", "fast-1", fast_ack_ms)):
        traffic.frame(conn, 0.1, "c2s", "basic.qos", channel=1, prefetch_count=5, **{"global": False})
        traffic.frame(conn, 0.15, "s2c", "basic.qos-ok", channel=1)
        subscribed(traffic, conn, 0.2, queue="orders", tag=tag)

        def deliver(ms: float, n: int, conn: str = conn, tag: str = tag) -> None:
            at(
                ms - 0.1,
                lambda: message(traffic, "pub", ms - 0.1, "c2s", "basic.publish", exchange="", routing_key="orders"),
            )
            at(
                ms,
                lambda: message(
                    traffic,
                    conn,
                    ms,
                    "s2c",
                    "basic.deliver",
                    channel=1,
                    consumer_tag=tag,
                    delivery_tag=n,
                    exchange="",
                    routing_key="orders",
                ),
            )

        for n in range(1, 6):
            deliver(1.0, n)
        t, n = 1.0, 5
        acked = 0
        while t + ack_ms <= duration_ms:
            t += ack_ms
            acked += 1
            at(
                t,
                lambda t=t, acked=acked, conn=conn: traffic.frame(
                    conn, t, "c2s", "basic.ack", channel=1, delivery_tag=acked, multiple=False
                ),
            )
            n += 1
            deliver(t + 0.3, n)
    for _ms, _n, action in sorted(events, key=lambda e: (e[0], e[1])):
        action()


@case
def hidden_slow(traffic: Traffic) -> None:
    traffic.connection("pub", 41031)
    traffic.connection("slow", 41032)
    traffic.connection("fast", 41033)
    shared_queue(traffic, slow_ack_ms=20.0, fast_ack_ms=1.0, duration_ms=500.0)


@case
def two_alike(traffic: Traffic) -> None:
    traffic.connection("pub", 41034)
    traffic.connection("slow", 41035)
    traffic.connection("fast", 41036)
    shared_queue(traffic, slow_ack_ms=20.0, fast_ack_ms=12.0, duration_ms=500.0)


def test_a_slow_consumer_hidden_by_a_fast_one_is_a_problem_not_the_verdict(findings):
    rows = findings("hidden_slow")
    assert summary(rows) == [
        (1, "diagnosis.consumer.hidden_slow", "consumer", "deliveries_wait_for_acks", "consumer", "slow-1")
    ]
    assert (rows[0].kind, rows[0].severity) == ("problem", "info")
    evidence = rows[0].evidence
    # Five in hand, one acked every 20 ms and refilled 0.3 ms later: each waits 99.7 ms (the first
    # five 20 to 100 ms); the fast one's 4.7 ms: 21.2 times slower.
    assert evidence["ack_wait_p50_ms"] == "99.7" and evidence["fastest_other_ack_wait_p50_ms"] == "4.7"
    assert evidence["slower_by"] == "21.2" and evidence["other_consumers"] == "1"


def test_two_consumers_alike_in_speed_on_an_empty_queue_give_nothing(findings):
    assert findings("two_alike") == []


# -- a queue nobody consumes --------------------------------------------------------------------------


def filling(traffic: Traffic, *, consumed: bool, messages: int = 1000) -> None:
    """A publisher declares queue "pending" (empty) and publishes ``messages`` to it over a second;
    with ``consumed`` a consumer without prefetch takes and acks each 0.5 ms after it came."""
    declared(traffic, "pub", "pending", 0)
    if consumed:
        subscribed(traffic, "con", 0.5, queue="pending", tag="taker")
    for n in range(1, messages + 1):
        t = n * 1000.0 / messages
        message(traffic, "pub", t, "c2s", "basic.publish", exchange="", routing_key="pending")
        if consumed:
            message(
                traffic,
                "con",
                t + 0.2,
                "s2c",
                "basic.deliver",
                channel=1,
                consumer_tag="taker",
                delivery_tag=n,
                exchange="",
                routing_key="pending",
            )
            traffic.frame("con", t + 0.7, "c2s", "basic.ack", channel=1, delivery_tag=n, multiple=False)


@case
def backlog_without_consumer(traffic: Traffic) -> None:
    traffic.connection("pub", 41041)
    filling(traffic, consumed=False)


@case
def batch_without_consumer(traffic: Traffic) -> None:
    traffic.connection("pub", 41044)
    filling(traffic, consumed=False, messages=200)


@case
def backlog_consumed(traffic: Traffic) -> None:
    traffic.connection("pub", 41042)
    traffic.connection("con", 41043)
    filling(traffic, consumed=True)


def test_a_queue_filling_with_no_consumer_names_the_queue(findings):
    rows = findings("backlog_without_consumer")
    assert summary(rows) == [
        (1, "diagnosis.queue.backlog_without_consumer", "consumer", "backlog_unconsumed", "queue", "pending")
    ]
    assert (rows[0].kind, rows[0].severity) == ("problem", "warning")
    evidence = rows[0].evidence
    assert (evidence["ready_at_start"], evidence["ready_at_end"], evidence["published"]) == ("0", "1000", "1000")
    # From the first publish (1 ms) to the last (1000 ms) of a capture from 0 to 1000 ms.
    assert evidence["growing_seconds"] == "0.999" and evidence["growing_share"] == "0.999"


def test_a_queue_whose_consumer_takes_each_message_gives_nothing(findings):
    assert findings("backlog_consumed") == []


def test_a_batch_smaller_than_a_few_consumers_prefetch_gives_nothing(findings):
    # 200 ready messages with no consumer in the capture: one it does not hold may take them at once.
    assert findings("batch_without_consumer") == []


# -- AMQP 1.0 senders settled late --------------------------------------------------------------------


def sender_link(traffic: Traffic, conn: str, *, transfers: int, settle_after_ms: float) -> None:
    """A client attaches a sending link to /queues/inbox, the broker grants it credit for everything,
    the client writes a transfer every 0.5 ms and the broker settles each (accepted)
    ``settle_after_ms`` after it was written, each disposition in time order with the transfers."""
    ten = "amqp-1.0"
    traffic.frame(
        conn,
        0.0,
        "c2s",
        "attach",
        ten,
        channel=0,
        name="writer",
        handle=0,
        role="sender",
        target_address="/queues/inbox",
        initial_delivery_count=0,
    )
    traffic.frame(
        conn,
        0.1,
        "s2c",
        "attach",
        ten,
        channel=0,
        name="writer",
        handle=0,
        role="receiver",
        target_address="/queues/inbox",
    )
    traffic.frame(
        conn,
        0.2,
        "s2c",
        "flow",
        ten,
        channel=0,
        handle=0,
        delivery_count=0,
        link_credit=10_000,
        next_incoming_id=0,
        incoming_window=10_000,
        next_outgoing_id=0,
        outgoing_window=10_000,
    )
    events = []
    for n in range(transfers):
        sent = 1.0 + n * 0.5
        events.append((sent, 0, n))
        events.append((sent + settle_after_ms, 1, n))
    for ms, kind, n in sorted(events):
        if kind == 0:
            traffic.frame(
                conn,
                ms,
                "c2s",
                "transfer",
                ten,
                channel=0,
                handle=0,
                delivery_id=n,
                delivery_tag_bytes=n.to_bytes(4, "big"),
                more=False,
                settled=False,
                payload_size=64,
            )
        else:
            traffic.frame(
                conn,
                ms,
                "s2c",
                "disposition",
                ten,
                channel=0,
                role="receiver",
                first=n,
                last=n,
                settled=True,
                state="accepted",
            )


@case
def slow_settlement(traffic: Traffic) -> None:
    traffic.connection("ten", 41051)
    sender_link(traffic, "ten", transfers=201, settle_after_ms=2000.0)


@case
def prompt_settlement(traffic: Traffic) -> None:
    traffic.connection("ten", 41052)
    sender_link(traffic, "ten", transfers=201, settle_after_ms=2.0)


def test_transfers_the_broker_settles_seconds_late_point_at_the_queue(findings):
    rows = findings("slow_settlement")
    assert summary(rows) == [
        (1, "diagnosis.publisher.slow_settlement", "queue", "settlement_delayed", "link", "writer")
    ]
    evidence = rows[0].evidence
    # 201 transfers 0.5 ms apart from 1 ms (100 ms of writing), each settled 2 s later: waits overlap
    # from 1 ms to 2101 ms.
    assert (evidence["deliveries"], evidence["settled"], evidence["unsettled_at_end"]) == ("201", "201", "0")
    assert evidence["settle_p50_ms"] == "2000.0" and evidence["writing_seconds"] == "0.100"
    assert evidence["waiting_seconds"] == "2.100"


def test_transfers_settled_at_once_give_nothing(findings):
    assert findings("prompt_settlement") == []
