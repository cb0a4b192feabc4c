"""Negotiated limits and the rules on them: frame size and channels (pipelines/frame_limits.py),
heartbeats and idle time-outs (pipelines/idle_gaps.py)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from amqpscope.expectations.catalogue import load_rules, rules_for, violations
from amqpscope.pipelines.frame_limits import frame_limits_timeline
from amqpscope.pipelines.idle_gaps import idle_gaps_timeline
from tests.test_flow_state import frames_df

HEADER = dict(direction="c2s", frame_type="protocol-header", method="amqp-0-9-1", frame_size=8)
COLUMNS = "frame_index long, method string, frame_size long, frame_size_limit long, channel_limit long"


def found(timeline: DataFrame) -> dict[str, list[int]]:
    """The frames each frame_limits rule flags, by rule."""
    return {
        rule.id: sorted(r.frame_index for r in violations(timeline, rule).collect())
        for rule in rules_for("frame_limits")
    }


def flagged(**by_rule: list[int]) -> dict[str, list[int]]:
    """Every frame_limits rule with the frames it should flag (keyword: the rule id, "." as "_")."""
    return {rule.id: by_rule.get(rule.id.replace(".", "_"), []) for rule in rules_for("frame_limits")}


def test_amqp091_frames_and_channels_within_the_tuned_limits(spark):
    events = [
        HEADER,
        dict(direction="s2c", method="connection.start", frame_size=5000),  # above 4096 before tune-ok
        dict(direction="s2c", method="connection.tune", channel_max=2047, frame_max=131072),
        dict(direction="c2s", method="connection.tune-ok", channel_max=2047, frame_max=131072),
        dict(direction="c2s", method="channel.open", channel=5),
        dict(direction="c2s", method="channel.open", channel=2048),  # above channel-max
        dict(direction="c2s", frame_type="body", method=None, channel=5, frame_size=131072),  # at frame-max
        dict(direction="s2c", frame_type="body", method=None, channel=5, frame_size=131073),  # above
        dict(direction="s2c", frame_type="body", method=None, channel=5, frame_size=4000),  # below 4096: no row
    ]
    timeline = frame_limits_timeline(frames_df(spark, "amqp-0-9-1", events))
    assertDataFrameEqual(
        timeline.select("frame_index", "method", "frame_size", "frame_size_limit", "channel_limit"),
        spark.createDataFrame(
            [
                (1, "connection.start", 5000, 4096, None),
                (3, "connection.tune-ok", 8, 4096, None),
                (4, "channel.open", 8, 131072, 2047),
                (5, "channel.open", 8, 131072, 2047),
                (6, None, 131072, 131072, 2047),
                (7, None, 131073, 131072, 2047),
            ],
            COLUMNS,
        ),
    )
    assert found(timeline) == flagged(amqp091_frame_larger_than_frame_max=[1, 7], amqp091_channel_above_channel_max=[5])


def test_amqp091_tune_ok_outside_the_offer(spark):
    def tune(offer_channels: int, offer_frame: int, channels: int, frame: int) -> list[dict]:
        return [
            HEADER,
            dict(direction="s2c", method="connection.tune", channel_max=offer_channels, frame_max=offer_frame),
            dict(direction="c2s", method="connection.tune-ok", channel_max=channels, frame_max=frame),
        ]

    connections = {
        "within": tune(2047, 131072, 2047, 65536),
        "above": tune(2047, 131072, 2047, 131073),
        "unlimited-against-a-limit": tune(2047, 131072, 0, 131072),
        "below-frame-min-size": tune(0, 0, 0, 2048),
        "no-limit-offered": tune(0, 0, 0, 0),
        "channels-above": tune(100, 0, 101, 0),
    }
    frames = None
    for name, events in connections.items():
        df = frames_df(spark, "amqp-0-9-1", events).withColumn("connection_id", F.lit(name))
        frames = df if frames is None else frames.unionByName(df)
    timeline = frame_limits_timeline(frames)
    rule = next(r for r in load_rules() if r.id == "amqp091.connection.tune_ok_outside_offer")
    assert sorted(r.connection_id for r in violations(timeline, rule).collect()) == [
        "above",
        "below-frame-min-size",
        "channels-above",
        "unlimited-against-a-limit",
    ]
    [row] = timeline.filter("connection_id = 'within'").collect()
    assert (row.offered_frame_max, row.tuned_frame_max, row.offered_channel_max, row.tuned_channel_max) == (
        131072,
        65536,
        2047,
        2047,
    )


def test_a_connection_picked_up_mid_stream_has_no_known_limits(spark):
    events = [
        dict(direction="c2s", method="channel.open", channel=9000),
        dict(direction="s2c", frame_type="body", method=None, channel=1, frame_size=10**6),
    ]
    timeline = frame_limits_timeline(frames_df(spark, "amqp-0-9-1", events))
    assert [(r.frame_size_limit, r.channel_limit) for r in timeline.orderBy("frame_index").collect()] == [
        (None, None),
        (None, None),
    ]
    assert found(timeline) == flagged()


def test_amqp10_frames_sent_under_the_other_peers_open(spark):
    events = [
        dict(direction="c2s", frame_type="protocol-header", method="amqp", frame_size=8),
        dict(direction="c2s", method="open", max_frame_size=1000, channel_max=3, frame_size=600),  # above 512
        dict(direction="c2s", method="begin", channel=1),  # pipelined before the server's open: limits unknown
        dict(direction="s2c", method="open", frame_size=60),  # defaults: no frame limit, channels to 65535
        dict(direction="s2c", method="begin", channel=4),  # above the client's channel-max 3
        dict(direction="s2c", method="transfer", channel=0, frame_size=1000),  # at the client's limit
        dict(direction="s2c", method="transfer", channel=0, frame_size=1001),  # above it
        dict(direction="c2s", method="transfer", channel=1, frame_size=10**6),  # the server set no limit
        dict(direction="c2s", method="begin", channel=7),
    ]
    timeline = frame_limits_timeline(frames_df(spark, "amqp-1.0", events))
    assertDataFrameEqual(
        timeline.select("frame_index", "method", "frame_size", "frame_size_limit", "channel_limit"),
        spark.createDataFrame(
            [
                (1, "open", 600, None, None),
                (2, "begin", 8, None, None),
                (3, "open", 60, 1000, 3),
                (4, "begin", 8, 1000, 3),
                (5, "transfer", 1000, 1000, 3),
                (6, "transfer", 1001, 1000, 3),
                (7, "transfer", 10**6, None, 65535),
                (8, "begin", 8, None, 65535),
            ],
            COLUMNS,
        ),
    )
    assert [r.peer_opened for r in timeline.orderBy("frame_index").collect()] == [False, False] + [True] * 6
    assert found(timeline) == flagged(
        amqp10_frame_larger_than_max_frame_size=[6],
        amqp10_session_channel_above_channel_max=[4],
        amqp10_frame_pipelined_above_min_max_frame_size=[1],
    )


def test_amqp10_pipelined_open_and_begin_are_not_flagged(spark):
    """qpid-proton sends open and begin on channel 1 in one packet, before the broker's open
    (transport 2.4.2): the issue 14 false alarm, both opens announcing channel-max 32767."""
    events = [
        dict(direction="c2s", frame_type="protocol-header", method="amqp", frame_size=8),
        dict(direction="c2s", method="open", channel=0, channel_max=32767, frame_size=120),
        dict(direction="c2s", method="begin", channel=1, frame_size=40),
        dict(direction="c2s", method="attach", channel=1, frame_size=300),
        dict(direction="s2c", frame_type="protocol-header", method="amqp", frame_size=8),
        dict(direction="s2c", method="open", channel=0, channel_max=32767, frame_size=100),
        dict(direction="s2c", method="begin", channel=0, frame_size=40),
        dict(direction="c2s", method="begin", channel=2, frame_size=40),
    ]
    timeline = frame_limits_timeline(frames_df(spark, "amqp-1.0", events))
    assert [
        (r.method, r.channel, r.channel_limit, r.peer_opened) for r in timeline.orderBy("frame_index").collect()
    ] == [
        ("open", 0, None, False),
        ("begin", 1, None, False),
        ("open", 0, 32767, True),
        ("begin", 0, 32767, True),
        ("begin", 2, 32767, True),
    ]
    assert found(timeline) == flagged()


# --- idle_gaps: silences against the negotiated heartbeat / idle time-out ---------------------------


def gaps(spark, protocol: str, events: list[tuple[int, dict]]) -> DataFrame:
    """idle_gaps of one connection whose frames are given as (ms since the first, frame fields)."""
    frames = frames_df(spark, protocol, [event for _ms, event in events])
    times = {index: ms for index, (ms, _event) in enumerate(events)}
    timed = frames.withColumn(
        "ts_us",
        F.element_at(
            F.create_map(*[x for index, ms in times.items() for x in (F.lit(index), F.lit(ms * 1000))]),
            F.col("frame_index"),
        ),
    )
    return idle_gaps_timeline(timed.withColumn("ts", F.timestamp_micros("ts_us")))


def test_amqp091_silence_of_two_heartbeats_is_flagged(spark):
    beat = dict(frame_type="heartbeat", method=None, channel=0)
    timeline = gaps(
        spark,
        "amqp-0-9-1",
        [
            (0, HEADER),
            (10, dict(direction="s2c", method="connection.tune", heartbeat=5)),
            (20, dict(direction="c2s", method="connection.tune-ok", heartbeat=2)),  # 2 s, both directions
            (1000, dict(direction="c2s", **beat)),
            (2500, dict(direction="s2c", **beat)),  # 2.49 s after the tune: late, not yet missed
            (3500, dict(direction="c2s", **beat)),  # 2.5 s: late
            (5600, dict(direction="c2s", **beat)),  # 2.1 s: late
            (9600, dict(direction="c2s", **beat)),  # 4 s: two intervals, missed
            (9700, dict(direction="s2c", **beat)),  # 7.2 s: missed
        ],
    )
    assertDataFrameEqual(
        timeline.select("frame_index", "direction", "gap_us", "interval_us", "allowed_us"),
        spark.createDataFrame(
            [
                (4, "s2c", 2_490_000, 2_000_000, 4_000_000),
                (5, "c2s", 2_500_000, 2_000_000, 4_000_000),
                (6, "c2s", 2_100_000, 2_000_000, 4_000_000),
                (7, "c2s", 4_000_000, 2_000_000, 4_000_000),
                (8, "s2c", 7_200_000, 2_000_000, 4_000_000),
            ],
            "frame_index long, direction string, gap_us long, interval_us long, allowed_us long",
        ),
    )
    rule = next(r for r in load_rules() if r.id == "amqp091.connection.heartbeats_missed")
    assert sorted(r.frame_index for r in violations(timeline, rule).collect()) == [7, 8]


def test_no_heartbeat_or_no_negotiation_means_no_gap(spark):
    silent = [
        (0, HEADER),
        (20, dict(direction="c2s", method="connection.tune-ok", heartbeat=0)),
        (60_000, dict(direction="c2s", method="channel.open", channel=1)),
    ]
    picked_up = [
        (0, dict(direction="c2s", method="basic.ack", channel=1)),
        (60_000, dict(direction="c2s", method="basic.ack", channel=1)),
    ]
    assert gaps(spark, "amqp-0-9-1", silent).count() == 0
    assert gaps(spark, "amqp-0-9-1", picked_up).count() == 0


def test_amqp10_frames_are_held_to_the_receivers_idle_time_out(spark):
    empty = dict(frame_type="amqp", method=None, channel=0)
    timeline = gaps(
        spark,
        "amqp-1.0",
        [
            (0, dict(direction="c2s", frame_type="protocol-header", method="amqp", frame_size=8)),
            (5, dict(direction="c2s", method="open", idle_time_out=1000)),  # a frame from the server every 1 s
            (10, dict(direction="s2c", method="open", idle_time_out=30000)),  # from the client every 30 s
            (900, dict(direction="s2c", **empty)),  # 0.89 s: in time
            (2100, dict(direction="s2c", **empty)),  # 1.2 s: late
            (4100, dict(direction="s2c", **empty)),  # 2 s: the client's threshold, twice its idle-time-out
            (40_000, dict(direction="c2s", **empty)),  # 39.995 s: late for the server, within its 60 s
        ],
    )
    assertDataFrameEqual(
        timeline.select("frame_index", "direction", "gap_us", "interval_us", "allowed_us"),
        spark.createDataFrame(
            [
                (4, "s2c", 1_200_000, 1_000_000, 2_000_000),
                (5, "s2c", 2_000_000, 1_000_000, 2_000_000),
                (6, "c2s", 39_995_000, 30_000_000, 60_000_000),
            ],
            "frame_index long, direction string, gap_us long, interval_us long, allowed_us long",
        ),
    )
    rule = next(r for r in load_rules() if r.id == "amqp10.connection.idle_time_out_exceeded")
    assert [r.frame_index for r in violations(timeline, rule).collect()] == [5]
