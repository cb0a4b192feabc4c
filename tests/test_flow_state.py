"""Flow-state pipelines on tiny inline frames tables: actual timelines against hand-worked ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.testing import assertDataFrameEqual

from amqpscope.expectations.catalogue import load_rules, violations
from amqpscope.pipelines.blocking import channel_flow_intervals, connection_blocked_intervals
from amqpscope.pipelines.channel_unacked import channel_unacked_timeline, consumer_unacked_timeline
from amqpscope.pipelines.confirms import channel_confirms_timeline
from amqpscope.pipelines.flow_intervals import (
    link_credit_intervals,
    prefetch_intervals,
    session_window_intervals,
    tcp_zero_window_intervals,
)
from amqpscope.pipelines.link_credit import link_credit_timeline, link_state_timeline
from amqpscope.pipelines.messages import messages_091
from amqpscope.pipelines.sessions import session_window_timeline
from amqpscope.pipelines.tcp_flow import tcp_flow_timeline
from amqpscope.pipelines.throughput import throughput
from amqpscope.schemas.frames import FRAMES_SCHEMA
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TOP = 2**32 - 1


def at(index: int) -> datetime:
    """Frame n is captured n milliseconds after T0."""
    return T0 + timedelta(milliseconds=index)


def frames_df(spark, protocol: str, events: list[dict]):
    """A frames table: each event gives direction, method and fields; the rest is filled in."""
    rows = []
    for index, event in enumerate(events):
        row = {name: None for name in FRAMES_SCHEMA.fieldNames()}
        row.update(
            capture_id="cap",
            connection_id="conn",
            frame_index=index,
            ts=at(index),
            ts_us=index * 1000,
            packet_number=index + 1,
            stream_offset=0,
            frame_size=8,
            protocol=protocol,
            frame_type="amqp" if protocol == "amqp-1.0" else "method",
            channel=0,
            arguments={},
        )
        row.update(event)
        rows.append(row)
    return spark.createDataFrame(rows, FRAMES_SCHEMA)


def sender_link(idc: int) -> list[dict]:
    """Client attaches a sending link 'l' (handle 0); the server attaches its receiving end (handle 3)."""
    return [
        dict(
            direction="c2s",
            method="attach",
            name="l",
            handle=0,
            role="sender",
            initial_delivery_count=idc,
            target_address="/queue/q",
        ),
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
        [
            (0, "attach", False, 0, 0, None),
            (1, "attach", False, 0, 0, None),
            (2, "flow", False, 0, 2, None),
            (3, "transfer", True, 1, 1, 2),
            (4, "transfer", True, 2, 0, 1),
            (5, "transfer", True, 3, -1, 0),
        ],
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
        [
            (0, "attach", False, top, 0, None),
            (1, "attach", False, top, 0, None),
            (2, "flow", False, top, 2, None),
            (3, "flow", False, top, 2, None),
            (4, "transfer", True, 0, 1, 2),
            (5, "transfer", False, 0, 1, None),
            (6, "transfer", True, 1, 0, 1),
            (7, "flow", False, 1, 5, None),
        ],
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
    actual = channel_unacked_timeline(frames_df(spark, "amqp-0-9-1", events)).select(
        "frame_index", "method", "unacked", "prefetch_count"
    )
    expected = spark.createDataFrame(
        [
            (1, "basic.qos", 0, 2),
            (2, "basic.deliver", 1, 2),
            (3, "basic.deliver", 2, 2),
            (4, "basic.ack", 1, 2),
            (5, "basic.deliver", 2, 2),
            (7, "basic.deliver", 3, 2),
            (8, "basic.nack", 1, 2),
            (9, "basic.reject", 0, 2),
        ],
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


# One settlement rule (pipelines.settlement) for messages_091 and the flow timelines: a settlement
# naming a tag that is not outstanding settles nothing, not even the outstanding tags below it
# (0-9-1 basic.ack "multiple", rule "exists": RabbitMQ answers 406 "unknown delivery tag").


def test_multiple_ack_of_a_tag_not_outstanding_settles_nothing_in_every_table(spark):
    events = [
        dict(direction="c2s", method="channel.open", channel=1),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=1, consumer_tag="c"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=2, consumer_tag="c"),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=5, multiple=True),  # never delivered
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=3, consumer_tag="c"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=4, consumer_tag="c"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=5, consumer_tag="c"),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=2, multiple=True),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=4, multiple=False),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=4, multiple=True),  # already settled: not 3
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=0, multiple=True),
    ]
    frames = frames_df(spark, "amqp-0-9-1", events)
    unacked = channel_unacked_timeline(frames).select("frame_index", "method", "unacked")
    assertDataFrameEqual(
        unacked,
        spark.createDataFrame(
            [
                (1, "basic.deliver", 1),
                (2, "basic.deliver", 2),
                (3, "basic.ack", 2),
                (4, "basic.deliver", 3),
                (5, "basic.deliver", 4),
                (6, "basic.deliver", 5),
                (7, "basic.ack", 3),
                (8, "basic.ack", 2),
                (9, "basic.ack", 2),
                (10, "basic.ack", 0),
            ],
            "frame_index long, method string, unacked long",
        ),
    )
    messages = messages_091(frames).select("delivery_tag", "settled_by", "settled_frame_index", "settled_multiple")
    assertDataFrameEqual(
        messages,
        spark.createDataFrame(
            [
                (1, "basic.ack", 7, True),
                (2, "basic.ack", 7, True),
                (3, "basic.ack", 10, True),
                (4, "basic.ack", 8, False),
                (5, "basic.ack", 10, True),
            ],
            "delivery_tag long, settled_by string, settled_frame_index long, settled_multiple boolean",
        ),
    )
    settlements = (
        channel_unacked_timeline(frames).filter("method = 'basic.ack'").select("frame_index", "delivered", "settled")
    )
    assertDataFrameEqual(
        settlements,
        spark.createDataFrame(
            [(3, 2, 0), (7, 5, 2), (8, 5, 1), (9, 5, 0), (10, 5, 2)], "frame_index long, delivered long, settled long"
        ),
    )
    assert ack_violations(channel_unacked_timeline(frames)) == {
        "amqp091.ack.unknown_delivery_tag": [3],
        "amqp091.ack.already_settled": [9],
    }


def ack_violations(timeline) -> dict[str, list[int]]:
    """The frames the two settlement rules flag in a channel_unacked timeline, by rule."""
    rules = {r.id: r for r in load_rules()}
    return {
        rule: sorted(r.frame_index for r in violations(timeline, rules[rule]).collect())
        for rule in ("amqp091.ack.unknown_delivery_tag", "amqp091.ack.already_settled")
    }


def test_settling_tag_zero_alone_or_a_no_ack_delivery_is_flagged(spark):
    events = [
        dict(direction="c2s", method="channel.open", channel=1),
        dict(direction="c2s", method="basic.consume", channel=1, consumer_tag="quick", no_ack=True),
        dict(direction="s2c", method="basic.consume-ok", channel=1, consumer_tag="quick"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=1, consumer_tag="quick"),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=1, multiple=False),  # no-ack: not outstanding
        dict(direction="c2s", method="basic.get", channel=1, no_ack=False),
        dict(direction="s2c", method="basic.get-ok", channel=1, delivery_tag=2),
        dict(direction="c2s", method="basic.reject", channel=1, delivery_tag=0, requeue=True),  # tag 0 without multiple
        dict(direction="c2s", method="basic.nack", channel=1, delivery_tag=3, multiple=False, requeue=True),  # not yet
        dict(
            direction="c2s", method="basic.nack", channel=1, delivery_tag=0, multiple=True, requeue=False
        ),  # all: fine
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=0, multiple=True),  # nothing left: still fine
    ]
    timeline = channel_unacked_timeline(frames_df(spark, "amqp-0-9-1", events))
    settlements = timeline.filter("settled IS NOT NULL").select("frame_index", "delivered", "settled", "unacked")
    assertDataFrameEqual(
        settlements,
        spark.createDataFrame(
            [(4, 1, 0, 0), (7, 2, 0, 1), (8, 2, 0, 1), (9, 2, 1, 0), (10, 2, 0, 0)],
            "frame_index long, delivered long, settled long, unacked long",
        ),
    )
    assert ack_violations(timeline) == {"amqp091.ack.unknown_delivery_tag": [7, 8], "amqp091.ack.already_settled": [4]}


def test_settlements_on_a_channel_opened_before_the_capture_are_not_judged(spark):
    events = [
        dict(direction="s2c", method="basic.deliver", channel=3, delivery_tag=41, consumer_tag="c"),
        dict(
            direction="c2s", method="basic.ack", channel=3, delivery_tag=40, multiple=False
        ),  # sent before the capture
        dict(direction="c2s", method="basic.ack", channel=3, delivery_tag=41, multiple=False),
        dict(direction="c2s", method="basic.ack", channel=3, delivery_tag=41, multiple=False),
    ]
    timeline = channel_unacked_timeline(frames_df(spark, "amqp-0-9-1", events))
    assert [(r.delivered, r.settled) for r in timeline.orderBy("frame_index").collect()] == [
        (None, None),
        (None, 0),
        (None, 1),
        (None, 0),
    ]
    assert ack_violations(timeline) == {"amqp091.ack.unknown_delivery_tag": [], "amqp091.ack.already_settled": []}


def test_multiple_confirm_of_a_number_not_outstanding_settles_nothing_in_every_table(spark):
    events = [
        dict(direction="c2s", method="channel.open", channel=1),
        dict(direction="c2s", method="confirm.select", channel=1),
        dict(direction="s2c", method="confirm.select-ok", channel=1),
        *[dict(direction="c2s", method="basic.publish", channel=1, exchange="", routing_key="q") for _ in range(2)],
        dict(direction="s2c", method="basic.ack", channel=1, delivery_tag=5, multiple=True),  # never published
        dict(direction="c2s", method="basic.publish", channel=1, exchange="", routing_key="q"),
        dict(direction="s2c", method="basic.nack", channel=1, delivery_tag=2, multiple=False),
        dict(direction="s2c", method="basic.ack", channel=1, delivery_tag=2, multiple=True),  # already confirmed: not 1
        dict(direction="s2c", method="basic.ack", channel=1, delivery_tag=3, multiple=True),
    ]
    frames = frames_df(spark, "amqp-0-9-1", events)
    confirms = channel_confirms_timeline(frames)
    timeline = confirms.select("frame_index", "method", "publish_seq", "confirmed", "outstanding")
    assertDataFrameEqual(
        timeline,
        spark.createDataFrame(
            [
                (1, "confirm.select", None, 0, 0),
                (3, "basic.publish", 1, 0, 1),
                (4, "basic.publish", 2, 0, 2),
                (5, "basic.ack", None, 0, 2),
                (6, "basic.publish", 3, 0, 3),
                (7, "basic.nack", None, 1, 2),
                (8, "basic.ack", None, 0, 2),
                (9, "basic.ack", None, 2, 0),
            ],
            "frame_index long, method string, publish_seq long, confirmed long, outstanding long",
        ),
    )
    messages = messages_091(frames).select("publish_seq", "settled_by", "settled_frame_index", "settled_multiple")
    assertDataFrameEqual(
        messages,
        spark.createDataFrame(
            [(1, "basic.ack", 9, True), (2, "basic.nack", 7, False), (3, "basic.ack", 9, True)],
            "publish_seq long, settled_by string, settled_frame_index long, settled_multiple boolean",
        ),
    )
    rules = {r.id: r for r in load_rules()}
    found = {
        rule: [r.frame_index for r in violations(confirms, rules[rule]).collect()]
        for rule in ("amqp091.confirm.unknown_sequence", "amqp091.confirm.already_confirmed")
    }
    assert found == {"amqp091.confirm.unknown_sequence": [5], "amqp091.confirm.already_confirmed": [8]}


# --- link_state: deliveries in flight and unsettled deliveries -------------------------------------


def session(client_next_id: int = 0, server_next_id: int = 0) -> list[dict]:
    """Client begins a session on channel 0; the server answers on channel 0."""
    return [
        dict(
            direction="c2s", method="begin", next_outgoing_id=client_next_id, incoming_window=100, outgoing_window=100
        ),
        dict(
            direction="s2c",
            method="begin",
            remote_channel=0,
            next_outgoing_id=server_next_id,
            incoming_window=100,
            outgoing_window=100,
        ),
    ]


def test_link_state_counts_deliveries_in_flight_and_unsettled(spark):
    events = (
        session()
        + sender_link(0)
        + [
            dict(direction="s2c", method="flow", handle=3, delivery_count=0, link_credit=3),
            dict(direction="c2s", method="transfer", handle=0, delivery_id=0, more=False),
            dict(direction="c2s", method="transfer", handle=0, delivery_id=1, more=False),
            # The receiver had seen one delivery when it sent this: one is still in flight.
            dict(direction="s2c", method="flow", handle=3, delivery_count=1, link_credit=3),
            dict(
                direction="s2c", method="disposition", role="receiver", first=0, last=1, settled=True, state="accepted"
            ),
            dict(direction="c2s", method="transfer", handle=0, delivery_id=2, more=False, settled=True),  # pre-settled
        ]
    )
    actual = link_state_timeline(frames_df(spark, "amqp-1.0", events)).select(
        "frame_index",
        "method",
        "delivery_count_snd",
        "link_credit_snd",
        "delivery_count_rcv",
        "deliveries_in_flight",
        "unsettled",
    )
    expected = spark.createDataFrame(
        [
            (2, "attach", 0, 0, 0, 0, 0),
            (3, "attach", 0, 0, 0, 0, 0),
            (4, "flow", 0, 3, 0, 0, 0),
            (5, "transfer", 1, 2, 0, 1, 1),
            (6, "transfer", 2, 1, 0, 2, 2),
            (7, "flow", 2, 2, 1, 1, 2),
            (8, "disposition", 2, 2, 1, 1, 0),  # settles both: the link's state as of then
            (9, "transfer", 3, 1, 1, 2, 0),
        ],
        "frame_index long, method string, delivery_count_snd long, link_credit_snd long, delivery_count_rcv long, "
        "deliveries_in_flight long, unsettled long",
    )
    assertDataFrameEqual(actual, expected)


def test_link_credit_intervals_run_from_exhaustion_to_the_next_grant(spark):
    events = sender_link(0) + [
        dict(direction="s2c", method="flow", handle=3, delivery_count=0, link_credit=1),
        dict(direction="c2s", method="transfer", handle=0, delivery_id=0, more=False),
        dict(direction="s2c", method="flow", handle=3, delivery_count=1, link_credit=2),
        dict(direction="c2s", method="transfer", handle=0, delivery_id=1, more=False),
        dict(direction="c2s", method="transfer", handle=0, delivery_id=2, more=False),
    ]
    found = link_credit_intervals(link_state_timeline(frames_df(spark, "amqp-1.0", events))).select(
        "cause", "direction", "start_frame_index", "end_frame_index", "duration_us", "detail"
    )
    expected = spark.createDataFrame(
        [
            ("link_credit_exhausted", "c2s", 0, 2, 2000, "no flow from the receiver yet"),
            ("link_credit_exhausted", "c2s", 3, 4, 1000, "link-credit(rcv) 1"),
            ("link_credit_exhausted", "c2s", 6, None, None, "link-credit(rcv) 2"),
        ],
        "cause string, direction string, start_frame_index long, end_frame_index long, duration_us long, detail string",
    )
    assertDataFrameEqual(found, expected)


# --- session_window ---------------------------------------------------------------------------------


def test_session_window_follows_the_spec_across_the_wrap(spark):
    events = [
        dict(
            direction="c2s", method="begin", channel=0, next_outgoing_id=TOP - 1, incoming_window=2, outgoing_window=10
        ),
        dict(
            direction="s2c",
            method="begin",
            channel=1,
            remote_channel=0,
            next_outgoing_id=5,
            incoming_window=3,
            outgoing_window=10,
        ),
        *[dict(direction="c2s", method="transfer", channel=0, handle=0) for _ in range(4)],  # the fourth: window closed
        dict(
            direction="s2c",
            method="flow",
            channel=1,
            next_incoming_id=2,
            incoming_window=2,
            next_outgoing_id=5,
            outgoing_window=10,
        ),
    ]
    actual = session_window_timeline(frames_df(spark, "amqp-1.0", events)).select(
        "frame_index",
        "method",
        "session_id",
        "client_channel",
        "server_channel",
        "client_next_outgoing_id",
        "client_remote_incoming_window",
        "server_next_incoming_id",
        "server_remote_incoming_window",
        "remote_incoming_window",
    )
    expected = spark.createDataFrame(
        [
            (0, "begin", 0, 0, 1, TOP - 1, None, TOP - 1, None, None),
            (1, "begin", 0, 0, 1, TOP - 1, 3, TOP - 1, 2, None),
            (2, "transfer", 0, 0, 1, TOP, 2, TOP, 2, 3),
            (3, "transfer", 0, 0, 1, 0, 1, 0, 2, 2),
            (4, "transfer", 0, 0, 1, 1, 0, 1, 2, 1),
            (5, "transfer", 0, 0, 1, 2, -1, 2, 2, 0),
            (6, "flow", 0, 0, 1, 2, 2, 2, 2, None),
        ],
        "frame_index long, method string, session_id long, client_channel int, server_channel int, "
        "client_next_outgoing_id long, client_remote_incoming_window long, server_next_incoming_id long, "
        "server_remote_incoming_window long, remote_incoming_window long",
    )
    assertDataFrameEqual(actual, expected)
    timeline = session_window_timeline(frames_df(spark, "amqp-1.0", events))
    beyond = next(r for r in load_rules() if r.id == "amqp10.session.transfer_beyond_window")
    assert [r.frame_index for r in violations(timeline, beyond).collect()] == [5]
    # The client's window is closed from the transfer that used it up to the server's flow.
    closed = session_window_intervals(timeline).select(
        "direction", "channel", "start_frame_index", "end_frame_index", "detail"
    )
    assertDataFrameEqual(
        closed,
        spark.createDataFrame(
            [("c2s", 0, 4, 6, "peer incoming-window 3")],
            "direction string, channel int, start_frame_index long, end_frame_index long, detail string",
        ),
    )


# --- consumer_unacked and channel_confirms -------------------------------------------------------------


def test_consumer_unacked_scopes_prefetch_per_consumer_and_channel(spark):
    events = [
        dict(direction="c2s", method="channel.open", channel=1),
        dict(direction="c2s", method="basic.qos", channel=1, prefetch_count=2, **{"global": False}),
        dict(direction="c2s", method="basic.consume", channel=1, queue="qa", no_ack=False),
        dict(direction="s2c", method="basic.consume-ok", channel=1, consumer_tag="a"),
        # Consumers created from now on get 1; the channel as a whole 3.
        dict(direction="c2s", method="basic.qos", channel=1, prefetch_count=1, **{"global": False}),
        dict(direction="c2s", method="basic.qos", channel=1, prefetch_count=3, **{"global": True}),
        dict(direction="c2s", method="basic.consume", channel=1, queue="qb", no_ack=False),
        dict(direction="s2c", method="basic.consume-ok", channel=1, consumer_tag="b"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=1, consumer_tag="a"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=2, consumer_tag="b"),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=3, consumer_tag="a"),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=2, multiple=True),  # settles a's 1 and b's 2
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=3, multiple=False),
    ]
    actual = consumer_unacked_timeline(frames_df(spark, "amqp-0-9-1", events)).select(
        "frame_index",
        "consumer_tag",
        "queue",
        "method",
        "settled",
        "unacked",
        "prefetch_count",
        "channel_prefetch_count",
        "channel_unacked",
    )
    expected = spark.createDataFrame(
        [
            (3, "a", "qa", "basic.consume-ok", 0, 0, 2, None, 0),
            (7, "b", "qb", "basic.consume-ok", 0, 0, 1, 3, 0),
            (8, "a", "qa", "basic.deliver", 0, 1, 2, 3, 1),
            (9, "b", "qb", "basic.deliver", 0, 1, 1, 3, 2),
            (10, "a", "qa", "basic.deliver", 0, 2, 2, 3, 3),
            (11, "a", "qa", "basic.ack", 1, 1, 2, 3, 1),
            (11, "b", "qb", "basic.ack", 1, 0, 1, 3, 1),
            (12, "a", "qa", "basic.ack", 1, 0, 2, 3, 0),
        ],
        "frame_index long, consumer_tag string, queue string, method string, settled long, unacked long, prefetch_count int, "
        "channel_prefetch_count int, channel_unacked long",
    )
    assertDataFrameEqual(actual, expected)
    frames = frames_df(spark, "amqp-0-9-1", events)
    full = prefetch_intervals(consumer_unacked_timeline(frames), channel_unacked_timeline(frames)).select(
        "entity", "consumer_tag", "start_frame_index", "end_frame_index", "detail"
    )
    assertDataFrameEqual(
        full,
        spark.createDataFrame(
            [
                ("consumer", "b", 9, 11, "prefetch 1"),
                ("consumer", "a", 10, 11, "prefetch 2"),
                ("channel", None, 10, 11, "prefetch 3"),
            ],
            "entity string, consumer_tag string, start_frame_index long, end_frame_index long, detail string",
        ),
    )


def test_channel_confirms_number_publishes_and_settle_them(spark):
    events = [
        dict(direction="c2s", method="channel.open", channel=1),
        dict(direction="c2s", method="confirm.select", channel=1),
        dict(direction="s2c", method="confirm.select-ok", channel=1),
        *[dict(direction="c2s", method="basic.publish", channel=1, exchange="", routing_key="q") for _ in range(3)],
        dict(direction="s2c", method="basic.ack", channel=1, delivery_tag=2, multiple=True),
        dict(direction="s2c", method="basic.nack", channel=1, delivery_tag=3, multiple=False),
        dict(direction="s2c", method="basic.ack", channel=1, delivery_tag=3, multiple=False),  # confirmed twice
        dict(direction="s2c", method="basic.ack", channel=1, delivery_tag=5, multiple=False),  # never published
        dict(
            direction="c2s", method="basic.ack", channel=1, delivery_tag=1, multiple=False
        ),  # a consumer ack: not a confirm
    ]
    confirms = channel_confirms_timeline(frames_df(spark, "amqp-0-9-1", events))
    expected = spark.createDataFrame(
        [
            (1, "confirm.select", None, None, 0, 0, 0),
            (3, "basic.publish", 1, None, 1, 0, 1),
            (4, "basic.publish", 2, None, 2, 0, 2),
            (5, "basic.publish", 3, None, 3, 0, 3),
            (6, "basic.ack", None, 2, 3, 2, 1),
            (7, "basic.nack", None, 3, 3, 1, 0),
            (8, "basic.ack", None, 3, 3, 0, 0),
            (9, "basic.ack", None, 5, 3, 0, 0),
        ],
        "frame_index long, method string, publish_seq long, delivery_tag long, published long, confirmed long, outstanding long",
    )
    assertDataFrameEqual(
        confirms.select(
            "frame_index", "method", "publish_seq", "delivery_tag", "published", "confirmed", "outstanding"
        ),
        expected,
    )
    rules = {r.id: r for r in load_rules()}
    found = {
        rule: [r.frame_index for r in violations(confirms, rules[rule]).collect()]
        for rule in ("amqp091.confirm.unknown_sequence", "amqp091.confirm.already_confirmed")
    }
    assert found == {"amqp091.confirm.unknown_sequence": [9], "amqp091.confirm.already_confirmed": [8]}


# --- connection.blocked and channel.flow intervals ---------------------------------------------------


def test_blocked_and_flow_intervals(spark):
    events = [
        dict(direction="s2c", method="connection.blocked", reason="low on memory"),
        dict(direction="c2s", method="basic.publish", channel=1),
        dict(direction="s2c", method="connection.blocked", reason="low on memory"),  # a repeated notice
        dict(direction="s2c", method="connection.unblocked"),
        dict(direction="s2c", method="connection.blocked", reason="low on disk"),  # never lifted
        dict(direction="s2c", method="channel.flow", channel=1, active=False),
        dict(direction="c2s", method="channel.flow-ok", channel=1, active=False),
        dict(direction="s2c", method="channel.flow", channel=1, active=True),
    ]
    frames = frames_df(spark, "amqp-0-9-1", events)
    assertDataFrameEqual(
        connection_blocked_intervals(frames).select(
            "reason", "start_frame_index", "end_frame_index", "duration_us", "notifications"
        ),
        spark.createDataFrame(
            [("low on memory", 0, 3, 3000, 2), ("low on disk", 4, None, None, 1)],
            "reason string, start_frame_index long, end_frame_index long, duration_us long, notifications long",
        ),
    )
    assertDataFrameEqual(
        channel_flow_intervals(frames).select(
            "channel", "direction", "start_frame_index", "end_frame_index", "duration_us"
        ),
        spark.createDataFrame(
            [(1, "s2c", 5, 7, 2000)],
            "channel int, direction string, start_frame_index long, end_frame_index long, duration_us long",
        ),
    )


# --- tcp_flow ---------------------------------------------------------------------------------------


def test_tcp_flow_finds_zero_windows_probes_updates_full_windows_and_retransmissions(spark):
    # (direction, seq_offset, ack_offset, effective window, payload, retransmitted bytes)
    segments = [
        ("c2s", 0, 0, 1000, 100, 0),
        ("s2c", 0, 100, 0, 0, 0),
        ("c2s", 100, 0, 1000, 1, 0),
        ("s2c", 0, 100, 500, 0, 0),
        ("c2s", 100, 0, 1000, 500, 0),
        ("c2s", 100, 0, 1000, 500, 500),
    ]
    rows = [
        ("cap", "conn", d, n + 1, at(n), n * 1000, seq, ack, 0x18, window, 0, window, payload, retransmitted)
        for n, (d, seq, ack, window, payload, retransmitted) in enumerate(segments)
    ]
    # No D-SACK block in any of them (dsack_left_offset, dsack_right_offset).
    flow = tcp_flow_timeline(spark.createDataFrame([(*r, None, None) for r in rows], TCP_SEGMENTS_SCHEMA))
    actual = flow.select(
        "packet_number",
        "peer_window",
        "bytes_in_flight",
        "is_zero_window",
        "is_zero_window_probe",
        "is_window_update",
        "is_window_full",
        "is_retransmission",
    )
    expected = spark.createDataFrame(
        [
            (1, None, None, False, False, False, False, False),
            (2, 1000, 0, True, False, False, False, False),
            (3, 0, 1, False, True, False, False, False),
            (4, 1000, 0, False, False, True, False, False),
            (5, 500, 500, False, False, False, True, False),
            (6, 500, 500, False, False, False, True, True),
        ],
        "packet_number long, peer_window long, bytes_in_flight long, is_zero_window boolean, is_zero_window_probe boolean, "
        "is_window_update boolean, is_window_full boolean, is_retransmission boolean",
    )
    assertDataFrameEqual(actual, expected)
    stalls = tcp_zero_window_intervals(flow).select(
        "direction", "start_packet_number", "end_packet_number", "duration_us"
    )
    assertDataFrameEqual(
        stalls,
        spark.createDataFrame(
            [("c2s", 2, 4, 2000)],
            "direction string, start_packet_number long, end_packet_number long, duration_us long",
        ),
    )


# --- throughput ---------------------------------------------------------------------------------


def test_throughput_counts_messages_and_body_bytes_per_second(spark):
    events = [
        dict(direction="c2s", method="basic.consume", channel=1, queue="q"),
        dict(direction="s2c", method="basic.consume-ok", channel=1, consumer_tag="c"),
        dict(direction="c2s", method="basic.publish", channel=2, exchange="", routing_key="q"),
        dict(direction="c2s", method=None, frame_type="header", channel=2, body_size=10),
        dict(direction="c2s", method="basic.publish", channel=2, exchange="x", routing_key="k"),
        dict(direction="c2s", method=None, frame_type="header", channel=2, body_size=20),
        dict(
            direction="s2c",
            method="basic.deliver",
            channel=1,
            consumer_tag="c",
            delivery_tag=1,
            exchange="",
            routing_key="q",
        ),
        dict(direction="s2c", method=None, frame_type="header", channel=1, body_size=30),
    ]
    frames = frames_df(spark, "amqp-0-9-1", events)
    no_links = link_state_timeline(frames_df(spark, "amqp-1.0", []))
    actual = throughput(frames, no_links).select(
        "scope", "direction", "channel", "address", "second", "messages", "bytes"
    )
    second = T0.replace(microsecond=0)
    expected = spark.createDataFrame(
        [
            ("connection", "c2s", None, None, second, 2, 30),
            ("connection", "s2c", None, None, second, 1, 30),
            ("channel", "c2s", 2, None, second, 2, 30),
            ("channel", "s2c", 1, None, second, 1, 30),
            ("address", "c2s", None, "/queues/q", second, 1, 10),
            ("address", "c2s", None, "/exchanges/x/k", second, 1, 20),
            ("address", "s2c", None, "/queues/q", second, 1, 30),
        ],
        "scope string, direction string, channel int, address string, second timestamp, messages long, bytes long",
    )
    assertDataFrameEqual(actual, expected)


def test_throughput_names_a_queue_once_whichever_protocol_addressed_it(spark):
    # A 1.0 sender to /queue/q (RabbitMQ 3.x's v1 address) and a receiver from "q" (a bare queue
    # name), and a 0-9-1 consumer of q: one queue, one address, /queues/q (pipelines.addresses).
    amqp10 = [
        *sender_link(0),
        dict(direction="s2c", method="flow", handle=3, delivery_count=0, link_credit=2),
        dict(direction="c2s", method="transfer", handle=0, delivery_id=0, more=False, payload_size=7),
        dict(direction="c2s", method="attach", name="r", handle=1, role="receiver", source_address="q"),
        dict(
            direction="s2c",
            method="attach",
            name="r",
            handle=4,
            role="sender",
            source_address="q",
            initial_delivery_count=0,
        ),
        dict(direction="c2s", method="flow", handle=1, delivery_count=0, link_credit=5),
        dict(direction="s2c", method="transfer", handle=4, delivery_id=0, more=False, payload_size=7),
    ]
    amqp091 = [
        dict(direction="c2s", method="basic.consume", channel=1, queue="q"),
        dict(direction="s2c", method="basic.consume-ok", channel=1, consumer_tag="c"),
        dict(
            direction="s2c",
            method="basic.deliver",
            channel=1,
            consumer_tag="c",
            delivery_tag=1,
            exchange="",
            routing_key="q",
        ),
        dict(direction="s2c", method=None, frame_type="header", channel=1, body_size=30),
    ]
    actual = throughput(
        frames_df(spark, "amqp-0-9-1", amqp091), link_state_timeline(frames_df(spark, "amqp-1.0", amqp10))
    )
    assertDataFrameEqual(
        actual.where("scope = 'address'").select("direction", "address", "messages", "bytes"),
        spark.createDataFrame(
            [("c2s", "/queues/q", 1, 7), ("s2c", "/queues/q", 2, 37)],
            "direction string, address string, messages long, bytes long",
        ),
    )


# --- 0-9-1 content framing (spec 4.2.6): header and bodies before the next method ------------------


def content(direction: str, body_size: int | None, *bodies: int, method: str = "basic.publish") -> list[dict]:
    """A content method on channel 1, its header (unless ``body_size`` is None) and body frames."""
    frames = [dict(direction=direction, method=method, channel=1, exchange="", routing_key="q")]
    if body_size is not None:
        frames.append(
            dict(direction=direction, frame_type="header", method="basic.header", channel=1, body_size=body_size)
        )
    frames += [dict(direction=direction, frame_type="body", method=None, channel=1, frame_size=8 + n) for n in bodies]
    return frames


def test_content_cut_short_or_overlong_is_flagged_and_the_capture_end_is_not(spark):
    events = [
        dict(direction="c2s", method="channel.open", channel=1),
        *content("c2s", 10, 4),  # frame 1: 4 of 10 bytes, then a method: cut short
        *content("c2s", None),  # frame 4: no header before the next method
        *content("s2c", 3, 3, method="basic.deliver"),  # frame 5: the other direction does not cut frame 4
        *content("c2s", 5, 5, 3),  # frame 8: 8 bytes for a body-size of 5
        dict(direction="c2s", method="basic.qos", channel=1, prefetch_count=1),
        *content("c2s", 0),  # frame 13: an empty body needs no body frame
        *content("c2s", 10, 4),  # frame 15: cut by the end of the capture, not by a method
    ]
    messages = messages_091(frames_df(spark, "amqp-0-9-1", events))
    assertDataFrameEqual(
        messages.select("frame_index", "body_size", "body_bytes", "complete", "next_method_frame_index"),
        spark.createDataFrame(
            [
                (1, 10, 4, False, 4),
                (4, None, 0, False, 8),
                (5, 3, 3, True, None),
                (8, 5, 8, False, 12),
                (13, 0, 0, True, 15),
                (15, 10, 4, False, None),
            ],
            "frame_index long, body_size long, body_bytes long, complete boolean, next_method_frame_index long",
        ),
    )
    rules = {r.id: r for r in load_rules()}
    found = {
        rule: sorted(r.frame_index for r in violations(messages, rules[rule]).collect())
        for rule in ("amqp091.content.cut_short", "amqp091.content.body_exceeds_body_size")
    }
    assert found == {"amqp091.content.cut_short": [1, 4], "amqp091.content.body_exceeds_body_size": [8]}
