"""What began before a capture's first packet is not counted as beginning at it (issue 62): a
connection.blocked in force when the capture began, and the diagnosis naming what it could not judge."""

from __future__ import annotations

from datetime import timedelta

from pyspark.testing import assertDataFrameEqual

from amqpscope.pipelines.blocking import connection_blocked_intervals
from amqpscope.pipelines.channel_unacked import channel_unacked_timeline, consumer_unacked_timeline
from amqpscope.pipelines.diagnosis.verdict import diagnosis
from amqpscope.pipelines.link_credit import link_credit_timeline, link_state_timeline, unbound_senders
from amqpscope.pipelines.tcp_flow import tcp_flow_timeline
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA
from amqpscope.schemas.frames import CAPTURES_SCHEMA
from tests.test_flow_state import T0, frames_df
from tests.test_window_scale import segments

BLOCKED = "reason string, start_frame_index long, end_frame_index long, duration_us long, notifications long, began_before_capture boolean"


def test_an_unblocked_with_no_blocked_before_it_ends_a_block_in_force_when_the_capture_began(spark):
    # Picked up mid-connection: no connection.start; the first notice lifts a block.
    events = [
        dict(direction="c2s", method="basic.ack", channel=1),
        dict(direction="c2s", method="basic.ack", channel=1),
        dict(direction="s2c", method="connection.unblocked"),
        dict(direction="s2c", method="connection.blocked", reason="low on memory"),
        dict(direction="s2c", method="connection.unblocked"),
    ]
    assertDataFrameEqual(
        connection_blocked_intervals(frames_df(spark, "amqp-0-9-1", events)).select(*BLOCKED_COLUMNS),
        spark.createDataFrame(
            [(None, 0, 2, 2000, 0, True), ("low on memory", 3, 4, 1000, 1, False)],
            BLOCKED,
        ),
    )


def test_an_unblocked_first_on_a_connection_opened_in_the_capture_starts_nothing(spark):
    events = [
        dict(direction="s2c", method="connection.start"),
        dict(direction="s2c", method="connection.unblocked"),
    ]
    found = connection_blocked_intervals(frames_df(spark, "amqp-0-9-1", events))
    assert found.count() == 0


BLOCKED_COLUMNS = [c.split()[0] for c in BLOCKED.split(", ")]


def test_the_diagnosis_says_which_windows_it_did_not_judge(spark):
    late = tcp_flow_timeline(segments(spark, None, "late"))
    known = tcp_flow_timeline(segments(spark, 7, "known")).selectExpr("'other' as capture_id", "* except (capture_id)")
    captures = spark.createDataFrame(
        [
            {name: None for name in CAPTURES_SCHEMA.fieldNames()}
            | dict(capture_id=c, file_name=f"{c}.pcap", file_size=1, packets=7, first_ts=T0, last_ts=T0 + timedelta(1))
            for c in ("cap", "other")
        ],
        CAPTURES_SCHEMA,
    )
    none = spark.createDataFrame([], BOTTLENECKS_SCHEMA)
    rows = {r.capture_id: r for r in diagnosis(none, captures, None, late.unionByName(known)).collect()}
    assert rows["cap"].not_judged == [
        "TCP window room on 1 connection begun before the capture (window scale not in it; zero windows judged)"
    ]
    assert rows["cap"].headline.endswith(
        " Not judged: whether a TCP window held a sender back on 1 connection begun before the capture,"
        " whose window scale it does not show."
    )
    assert (rows["other"].not_judged, rows["other"].bottleneck) == ([], "none")
    assert "Not judged" not in rows["other"].headline


def test_a_consumer_begun_before_the_capture_is_marked_and_never_below_zero(spark):
    # Picked up mid-connection: deliveries 7 and 8 were sent before the capture, 9 and 10 in it.
    deliveries = [
        dict(direction="s2c", method="basic.deliver", channel=1, consumer_tag="c", delivery_tag=tag) for tag in (9, 10)
    ]
    events = [
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=7, multiple=False),
        deliveries[0],
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=8, multiple=False),
        deliveries[1],
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=9, multiple=False),
    ]
    frames = frames_df(spark, "amqp-0-9-1", events)
    assertDataFrameEqual(
        consumer_unacked_timeline(frames).select("frame_index", "unacked", "began_before_capture"),
        spark.createDataFrame(
            [(1, 1, True), (3, 2, True), (4, 1, True)], "frame_index long, unacked long, began_before_capture boolean"
        ),
    )
    # The acks of tags 7 and 8 settle nothing and lower nothing; the channel's tags before are unknown.
    assertDataFrameEqual(
        channel_unacked_timeline(frames).select("frame_index", "unacked", "delivered", "settled"),
        spark.createDataFrame(
            [(0, 0, None, 0), (1, 1, None, None), (2, 1, None, 0), (3, 2, None, None), (4, 1, None, 1)],
            "frame_index long, unacked long, delivered long, settled long",
        ),
    )


def test_a_none_headline_counts_the_consumers_begun_before_the_capture_by_their_deliveries(spark):
    from amqpscope.pipelines.diagnosis.verdict import measured

    # 0-9-1: tag a consumed before the capture (deliveries only), tag b consumed in it and delivered
    # to: two consumers, each once.
    amqp091 = [
        dict(direction="s2c", method="basic.deliver", channel=1, consumer_tag="a"),
        dict(direction="s2c", method="basic.deliver", channel=1, consumer_tag="a"),
        dict(direction="s2c", method="basic.consume-ok", channel=1, consumer_tag="b"),
        dict(direction="s2c", method="basic.deliver", channel=1, consumer_tag="b"),
    ]
    # 1.0: the broker sends on handle 2 attached before the capture, and attaches handle 5 in it.
    amqp10 = [
        dict(direction="s2c", method="transfer", channel=0, handle=2),
        dict(direction="s2c", method="transfer", channel=0, handle=2),
        dict(direction="c2s", method="attach", channel=0, handle=0, role="receiver", name="r"),
        dict(direction="s2c", method="attach", channel=0, handle=5, role="sender", name="r"),
    ]
    for protocol, events, delivered in (("amqp-0-9-1", amqp091, 3), ("amqp-1.0", amqp10, 2)):
        [row] = measured(frames_df(spark, protocol, events)).collect()
        assert (row["_delivered"], row["_consumers"]) == (delivered, 2), protocol


def test_the_diagnosis_says_which_links_credit_it_did_not_judge(spark):
    # The broker sends on handle 2, attached before the capture, and on handle 5, attached in it.
    frames = frames_df(
        spark,
        "amqp-1.0",
        [
            dict(direction="s2c", method="transfer", handle=2),
            dict(direction="c2s", method="attach", handle=0, role="receiver", name="r"),
            dict(direction="s2c", method="attach", handle=5, role="sender", name="r"),
            dict(direction="s2c", method="transfer", handle=5),
            dict(direction="s2c", method="transfer", handle=2),
        ],
    )
    known = tcp_flow_timeline(segments(spark, 7, "cap"))
    captures = spark.createDataFrame(
        [
            {name: None for name in CAPTURES_SCHEMA.fieldNames()}
            | dict(
                capture_id="cap", file_name="cap.pcap", file_size=1, packets=5, first_ts=T0, last_ts=T0 + timedelta(1)
            )
        ],
        CAPTURES_SCHEMA,
    )
    [row] = diagnosis(spark.createDataFrame([], BOTTLENECKS_SCHEMA), captures, None, known, frames).collect()
    assert row.not_judged == ["link credit of 1 AMQP 1.0 link attached before the capture"]
    assert row.headline.endswith(
        " Not judged: whether link credit held back 1 AMQP 1.0 link attached before the capture,"
        " whose attach and first credit it does not show."
    )


PRE_NAME = "(attached before the capture: server channel 0 handle 1)"
CREDIT = ["frame_index", "link_name", "attach_seen", "role", "delivery_count_snd", "link_credit_snd"]


def test_a_link_attached_before_the_capture_is_paired_by_its_echoed_handle_and_its_credit_known_from_its_flows(
    spark,
):
    # The broker sends on handle 1 and the client grants on handle 1 (an echoed handle); handle 0's
    # ends only flow (no sender), so they are no link the credit is judged on.
    frames = frames_df(
        spark,
        "amqp-1.0",
        [
            dict(direction="s2c", method="transfer", handle=1, delivery_id=10),
            dict(direction="c2s", method="flow", handle=1, delivery_count=100, link_credit=2),
            dict(direction="s2c", method="flow", handle=1, delivery_count=101, link_credit=1),
            dict(direction="s2c", method="transfer", handle=1, delivery_id=11),
            dict(direction="s2c", method="transfer", handle=1, delivery_id=12),
            dict(direction="c2s", method="flow", handle=0, delivery_count=7, link_credit=5),
            dict(direction="s2c", method="flow", handle=0, delivery_count=7, link_credit=5),
        ],
    )
    assertDataFrameEqual(
        link_state_timeline(frames).select(*CREDIT),
        spark.createDataFrame(
            [
                # Nothing is known of the credit before a flow states the counts: not 0 as if known.
                (0, PRE_NAME, False, "sender", None, None),
                (1, PRE_NAME, False, "receiver", None, None),
                (2, PRE_NAME, False, "sender", 101, 1),
                (3, PRE_NAME, False, "sender", 102, 0),
                (4, PRE_NAME, False, "sender", 103, -1),
            ],
            "frame_index long, link_name string, attach_seen boolean, role string, delivery_count_snd long,"
            " link_credit_snd long",
        ),
    )
    assert unbound_senders(frames).count() == 0


def test_the_halves_of_links_attached_before_the_capture_pair_when_alone_and_stay_apart_when_ambiguous(spark):
    alone = [
        dict(direction="s2c", method="transfer", channel=1, handle=3),
        dict(direction="c2s", method="flow", channel=0, handle=0, delivery_count=0, link_credit=1),
    ]
    # Two sending halves and two receiving ones, none with the other's numbers: which is whose is
    # not in the capture.
    ambiguous = [
        dict(direction="s2c", method="transfer", handle=1),
        dict(direction="s2c", method="transfer", handle=2),
        dict(direction="c2s", method="flow", handle=5, delivery_count=0, link_credit=1),
        dict(direction="c2s", method="flow", handle=6, delivery_count=0, link_credit=1),
    ]
    paired = link_state_timeline(frames_df(spark, "amqp-1.0", alone)).select("link_name", "role").collect()
    assert [tuple(r) for r in paired] == [
        ("(attached before the capture: server channel 1 handle 3)", "sender"),
        ("(attached before the capture: server channel 1 handle 3)", "receiver"),
    ]
    assert link_credit_timeline(frames_df(spark, "amqp-1.0", ambiguous)).count() == 0
    left = unbound_senders(frames_df(spark, "amqp-1.0", ambiguous)).select("handle").orderBy("handle").collect()
    assert [r.handle for r in left] == [1, 2]


def test_a_handle_used_unattached_on_a_connection_opened_in_the_capture_is_no_link_begun_before_it(spark):
    # Its open is in the capture, so every link of it was attached in it: transfers on an
    # unattached handle are the sender's protocol error (lifecycle_10), not a link to pair.
    frames = frames_df(
        spark,
        "amqp-1.0",
        [
            dict(direction="c2s", method="open"),
            dict(direction="s2c", method="open"),
            dict(direction="s2c", method="transfer", handle=1),
            dict(direction="c2s", method="flow", handle=1, delivery_count=0, link_credit=1),
        ],
    )
    assert link_state_timeline(frames).count() == 0
    assert unbound_senders(frames).count() == 0
