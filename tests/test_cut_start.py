"""What began before a capture's first packet is not counted as beginning at it (issue 62): a
connection.blocked in force when the capture began, and the diagnosis naming what it could not judge."""

from __future__ import annotations

from datetime import timedelta

from pyspark.testing import assertDataFrameEqual

from amqpscope.pipelines.blocking import connection_blocked_intervals
from amqpscope.pipelines.channel_unacked import channel_unacked_timeline, consumer_unacked_timeline
from amqpscope.pipelines.diagnosis.verdict import diagnosis
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
