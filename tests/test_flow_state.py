"""Flow-state pipelines on tiny inline frames tables: actual timelines against hand-worked ones."""

from __future__ import annotations

from datetime import datetime, timezone

from pyspark.testing import assertDataFrameEqual

from amqpscope.pipelines.channel_unacked import channel_unacked_timeline
from amqpscope.pipelines.link_credit import link_credit_timeline
from amqpscope.schemas.frames import FRAMES_SCHEMA

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def frames_df(spark, protocol: str, events: list[dict]):
    """A frames table: each event gives direction, method and fields; the rest is filled in."""
    rows = []
    for index, event in enumerate(events):
        row = {name: None for name in FRAMES_SCHEMA.fieldNames()}
        row.update(capture_id="cap", connection_id="conn", frame_index=index, ts=T0, ts_us=index,
                   packet_number=index + 1, stream_offset=0, frame_size=8, protocol=protocol,
                   frame_type="amqp" if protocol == "amqp-1.0" else "method", channel=0, arguments={})
        row.update(event)
        rows.append(row)
    return spark.createDataFrame(rows, FRAMES_SCHEMA)


def sender_link(idc: int) -> list[dict]:
    """Client attaches a sending link 'l' (handle 0); the server attaches its receiving end (handle 3)."""
    return [
        dict(direction="c2s", method="attach", name="l", handle=0, role="sender", initial_delivery_count=idc, target_address="/queue/q"),
        dict(direction="s2c", method="attach", name="l", handle=3, role="receiver", target_address="/queue/q"),
    ]


def credit_rows(spark, events):
    return link_credit_timeline(frames_df(spark, "amqp-1.0", events)).select(
        "frame_index", "method", "is_new_delivery", "delivery_count_snd", "link_credit_snd", "link_credit_snd_before"
    )


def test_link_credit_follows_the_spec_formula(spark):
    events = sender_link(0) + [
        dict(direction="s2c", method="flow", handle=3, delivery_count=0, link_credit=2),
        dict(direction="c2s", method="transfer", handle=0, delivery_id=0, more=False),
        dict(direction="c2s", method="transfer", handle=0, delivery_id=1, more=False),
        dict(direction="c2s", method="transfer", handle=0, delivery_id=2, more=False),
    ]
    expected = spark.createDataFrame(
        [(0, "attach", False, 0, 0, None), (1, "attach", False, 0, 0, None), (2, "flow", False, 0, 2, None),
         (3, "transfer", True, 1, 1, 2), (4, "transfer", True, 2, 0, 1), (5, "transfer", True, 3, -1, 0)],
        "frame_index long, method string, is_new_delivery boolean, delivery_count_snd long, link_credit_snd long, link_credit_snd_before long",
    )
    assertDataFrameEqual(credit_rows(spark, events), expected)


def test_credit_is_set_not_added_and_counts_wrap(spark):
    top = 2**32 - 1
    events = sender_link(top) + [
        dict(direction="s2c", method="flow", handle=3, delivery_count=top, link_credit=2),
        dict(direction="s2c", method="flow", handle=3, delivery_count=top, link_credit=2),  # the same grant again
        dict(direction="c2s", method="transfer", handle=0, delivery_id=0, more=True),
        dict(direction="c2s", method="transfer", handle=0, more=False),  # continuation of the same delivery
        dict(direction="c2s", method="transfer", handle=0, delivery_id=1, more=False),
        # The receiver grants 5 more after seeing both deliveries (its delivery-count wrapped to 1).
        dict(direction="s2c", method="flow", handle=3, delivery_count=1, link_credit=5),
    ]
    expected = spark.createDataFrame(
        [(0, "attach", False, top, 0, None), (1, "attach", False, top, 0, None), (2, "flow", False, top, 2, None),
         (3, "flow", False, top, 2, None), (4, "transfer", True, 0, 1, 2), (5, "transfer", False, 0, 1, None),
         (6, "transfer", True, 1, 0, 1), (7, "flow", False, 1, 5, None)],
        "frame_index long, method string, is_new_delivery boolean, delivery_count_snd long, link_credit_snd long, link_credit_snd_before long",
    )
    assertDataFrameEqual(credit_rows(spark, events), expected)


def test_drain_sender_flow_restates_delivery_count(spark):
    events = sender_link(10) + [
        dict(direction="s2c", method="flow", handle=3, delivery_count=10, link_credit=4, drain=True),
        dict(direction="c2s", method="transfer", handle=0, delivery_id=0, more=False),
        # Nothing more to send: the sender advances delivery-count by the remaining 3 credits.
        dict(direction="c2s", method="flow", handle=0, delivery_count=14, link_credit=0),
    ]
    rows = {r.frame_index: r for r in credit_rows(spark, events).collect()}
    assert (rows[3].delivery_count_snd, rows[3].link_credit_snd) == (11, 3)
    assert (rows[4].delivery_count_snd, rows[4].link_credit_snd) == (14, 0)


def test_unacked_counts_single_and_multiple_acks(spark):
    events = [
        dict(direction="c2s", method="channel.open", channel=1),
        dict(direction="c2s", method="basic.qos", channel=1, prefetch_count=2, **{"global": False}),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=1, consumer_tag="c"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=2, consumer_tag="c"),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=1, multiple=False),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=3, consumer_tag="c"),
        dict(direction="s2c", method="basic.ack", channel=1, delivery_tag=7, multiple=True),  # a publisher confirm
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=4, consumer_tag="c"),
        dict(direction="c2s", method="basic.nack", channel=1, delivery_tag=3, multiple=True, requeue=True),
        dict(direction="c2s", method="basic.reject", channel=1, delivery_tag=4, requeue=False),
    ]
    actual = channel_unacked_timeline(frames_df(spark, "amqp-0-9-1", events)).select("frame_index", "method", "unacked", "prefetch_count")
    expected = spark.createDataFrame(
        [(1, "basic.qos", 0, 2), (2, "basic.deliver", 1, 2), (3, "basic.deliver", 2, 2), (4, "basic.ack", 1, 2),
         (5, "basic.deliver", 2, 2), (7, "basic.deliver", 3, 2), (8, "basic.nack", 1, 2), (9, "basic.reject", 0, 2)],
        "frame_index long, method string, unacked long, prefetch_count int",
    )
    assertDataFrameEqual(actual, expected)


def test_multiple_ack_with_tag_zero_settles_everything_delivered(spark):
    events = [
        dict(direction="s2c", method="basic.deliver", channel=2, delivery_tag=1),
        dict(direction="s2c", method="basic.deliver", channel=2, delivery_tag=2),
        dict(direction="c2s", method="basic.ack", channel=2, delivery_tag=0, multiple=True),
        dict(direction="s2c", method="basic.deliver", channel=2, delivery_tag=3),
    ]
    actual = channel_unacked_timeline(frames_df(spark, "amqp-0-9-1", events)).select("frame_index", "unacked")
    expected = spark.createDataFrame([(0, 1), (1, 2), (2, 0), (3, 1)], "frame_index long, unacked long")
    assertDataFrameEqual(actual, expected)


def test_no_ack_deliveries_are_never_unacked(spark):
    events = [
        dict(direction="c2s", method="basic.consume", channel=1, consumer_tag="", no_ack=True),
        dict(direction="s2c", method="basic.consume-ok", channel=1, consumer_tag="amq.ctag-1"),
        dict(direction="c2s", method="basic.consume", channel=1, consumer_tag="acking", no_ack=False),
        dict(direction="s2c", method="basic.consume-ok", channel=1, consumer_tag="acking"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=1, consumer_tag="amq.ctag-1"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=2, consumer_tag="acking"),
        dict(direction="c2s", method="basic.get", channel=1, no_ack=True),
        dict(direction="s2c", method="basic.get-ok", channel=1, delivery_tag=3),
        dict(direction="c2s", method="basic.get", channel=1, no_ack=False),
        dict(direction="s2c", method="basic.get-ok", channel=1, delivery_tag=4),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=0, multiple=True),
    ]
    actual = channel_unacked_timeline(frames_df(spark, "amqp-0-9-1", events)).select("frame_index", "unacked")
    expected = spark.createDataFrame([(4, 0), (5, 1), (7, 1), (9, 2), (10, 0)], "frame_index long, unacked long")
    assertDataFrameEqual(actual, expected)
