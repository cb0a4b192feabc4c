"""queue_balance on a hand-timed capture: what went into each queue and came out, bucket by bucket,
and the backlog it leaves, counted from the broker's declare-ok where the capture has one."""

from __future__ import annotations

import pytest

from amqpscope.pipelines.tables import Build
from amqpscope.schemas.frames import CAPTURES_SCHEMA, FRAMES_SCHEMA
from amqpscope.schemas.queues import QUEUE_BALANCE_SCHEMA
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA
from tests.test_bottlenecks import Traffic, at_ms


def balanced() -> Traffic:
    """Queue "q" holds 3 messages when declared; a publisher in confirm mode publishes 4 to it
    (10, 20, 30, 40 ms), the broker confirms 3 and nacks the 4th; a consumer gets 2 at 50 ms, acks
    the first, nacks the second with requeue, gets it back redelivered at 60 ms and rejects it
    without requeue. A mandatory publish to "gone" (no such queue) comes back as basic.return. Queue
    "old" held messages before the capture began."""
    t = Traffic(capture_id="balance")
    t.connection("pub", 42001)
    t.connection("con", 42002)
    t.frame("pub", 0.0, "c2s", "queue.declare", channel=1, queue="q")
    t.frame("pub", 0.1, "s2c", "queue.declare-ok", channel=1, queue="q", message_count=3)
    t.frame("pub", 0.2, "c2s", "confirm.select", channel=1)
    t.frame("pub", 0.3, "s2c", "confirm.select-ok", channel=1)
    for n, ms in enumerate((10.0, 20.0, 30.0, 40.0), start=1):
        t.content("pub", ms, "c2s", "basic.publish", channel=1, exchange="", routing_key="q")
        method = "basic.nack" if n == 4 else "basic.ack"
        t.frame("pub", ms + 1.0, "s2c", method, channel=1, delivery_tag=n, multiple=False)
    t.frame("con", 45.0, "c2s", "basic.consume", channel=1, queue="q")
    t.frame("con", 45.1, "s2c", "basic.consume-ok", channel=1, consumer_tag="c")
    for tag in (1, 2):
        t.content(
            "con",
            50.0,
            "s2c",
            "basic.deliver",
            channel=1,
            consumer_tag="c",
            delivery_tag=tag,
            exchange="",
            routing_key="q",
        )
    t.frame("con", 52.0, "c2s", "basic.ack", channel=1, delivery_tag=1, multiple=False)
    t.frame("con", 53.0, "c2s", "basic.nack", channel=1, delivery_tag=2, multiple=False, requeue=True)
    t.content(
        "con",
        60.0,
        "s2c",
        "basic.deliver",
        channel=1,
        consumer_tag="c",
        delivery_tag=3,
        redelivered=True,
        exchange="",
        routing_key="q",
    )
    t.frame("con", 61.0, "c2s", "basic.reject", channel=1, delivery_tag=3, requeue=False)
    t.content("pub", 70.0, "c2s", "basic.publish", channel=1, exchange="", routing_key="gone", mandatory=True)
    t.frame("pub", 71.0, "s2c", "basic.ack", channel=1, delivery_tag=5, multiple=False)
    t.content("pub", 71.0, "s2c", "basic.return", channel=1, exchange="", routing_key="gone", reply_code=312)
    # "old" is never declared in the capture: it already held messages, which a consumer on
    # channel 2 takes at 81, 82 and 90 ms; one more is published to it at 85 ms.
    t.frame("con", 80.0, "c2s", "basic.consume", channel=2, queue="old")
    t.frame("con", 80.1, "s2c", "basic.consume-ok", channel=2, consumer_tag="o")
    for tag, ms in enumerate((81.0, 82.0, 90.0), start=1):
        t.content(
            "con",
            ms,
            "s2c",
            "basic.deliver",
            channel=2,
            consumer_tag="o",
            delivery_tag=tag,
            exchange="",
            routing_key="old",
        )
    t.content("pub", 85.0, "c2s", "basic.publish", channel=1, exchange="", routing_key="old")
    t.frame("pub", 100.0, "c2s", "channel.close", channel=1)
    return t


@pytest.fixture(scope="module")
def balance(spark) -> list:
    traffic = balanced()
    frames = spark.createDataFrame(traffic.frames, FRAMES_SCHEMA)
    captures = spark.createDataFrame(
        [
            {n: None for n in CAPTURES_SCHEMA.fieldNames()}
            | dict(
                capture_id="balance",
                file_name="balance.pcap",
                file_size=0,
                packets=traffic.packet,
                first_ts=at_ms(0),
                last_ts=at_ms(100),
            )
        ],
        CAPTURES_SCHEMA,
    )
    segments = spark.createDataFrame([], TCP_SEGMENTS_SCHEMA)
    built = Build({"frames": frames, "tcp_segments": segments, "captures": captures}).build(["queue_balance"])
    table = built["queue_balance"]
    assert [(f.name, f.dataType) for f in table.schema] == [(f.name, f.dataType) for f in QUEUE_BALANCE_SCHEMA]
    return table.orderBy("queue", "bucket").collect()


def totals(rows: list, queue: str) -> dict[str, int]:
    names = (
        "published",
        "delivered",
        "redelivered",
        "acked",
        "requeued",
        "discarded",
        "returned",
        "confirmed",
        "refused",
    )
    return {n: sum(getattr(r, n) for r in rows if r.queue == queue) for n in names}


def test_every_bucket_of_the_capture_is_there_for_each_queue(balance):
    # 100 ms of capture in 1 ms buckets (the report's grid): buckets 0 to 100 for every queue.
    assert {r.queue for r in balance} == {"q", "gone", "old"}
    for queue in ("q", "gone", "old"):
        assert [r.bucket for r in balance if r.queue == queue] == list(range(101))
    assert {r.bucket_s for r in balance} == {0.001}


def test_what_went_in_and_out_of_a_queue_and_what_the_broker_did(balance):
    assert totals(balance, "q") == dict(
        published=4, delivered=3, redelivered=1, acked=1, requeued=1, discarded=1, returned=0, confirmed=3, refused=1
    )
    assert totals(balance, "gone") == dict(
        published=1, delivered=0, redelivered=0, acked=0, requeued=0, discarded=0, returned=1, confirmed=1, refused=0
    )
    by_bucket = {r.bucket: r for r in balance if r.queue == "q"}
    assert (by_bucket[10].published, by_bucket[11].confirmed, by_bucket[41].refused) == (1, 1, 1)
    assert (by_bucket[50].delivered, by_bucket[53].requeued, by_bucket[60].redelivered) == (2, 1, 1)
    assert by_bucket[10].in_per_second == 1000.0 and by_bucket[50].out_per_second == 2000.0


def test_the_backlog_counts_from_the_declare_ok_where_the_capture_has_one(balance):
    backlog = {r.bucket: r.backlog for r in balance if r.queue == "q"}
    assert {r.backlog_from for r in balance if r.queue == "q"} == {"declare-ok"}
    # 3 declared, +4 published by 40 ms, -2 delivered at 50, +1 requeued at 53, -1 redelivered at 60.
    assert (backlog[5], backlog[40], backlog[50], backlog[53], backlog[60], backlog[100]) == (3, 7, 5, 6, 5, 5)


def test_the_backlog_of_a_queue_never_declared_is_the_least_it_held(balance):
    gone = [r for r in balance if r.queue == "gone"]
    assert {r.backlog_from for r in gone} == {"lower bound"}
    # Published at 70 ms and returned at 71: it never entered the queue.
    assert [(r.bucket, r.backlog) for r in gone if r.bucket in (69, 70, 71, 100)] == [
        (69, 0),
        (70, 1),
        (71, 0),
        (100, 0),
    ]


def test_a_queue_that_held_messages_before_the_capture_is_not_counted_from_zero(balance):
    old = {r.bucket: r for r in balance if r.queue == "old"}
    assert {r.backlog_from for r in old.values()} == {"lower bound"}
    # Delivered at 81, 82 and 90 ms, one published at 85: the changes go 0, -1, -2, -1, -2, so it
    # held at least 2 at the first packet, and none after the last delivery.
    assert [old[b].backlog for b in (0, 80, 81, 82, 84, 85, 89, 90, 100)] == [2, 2, 1, 0, 0, 1, 1, 0, 0]
    assert totals(balance, "old")["delivered"] == 3
