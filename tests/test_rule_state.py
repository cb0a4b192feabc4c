"""The rule-state tables (lifecycle_10, lifecycle_091, link_state's rule columns), the events
table and TCP keep-alives, on tiny hand-built frames tables: each rule has a violating case and a
near miss that is not one (issue 14)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from amqpscope.expectations.catalogue import load_rules, rules_for, violations
from amqpscope.expectations.event_catalogue import load_events
from amqpscope.pipelines.events import events_timeline
from amqpscope.pipelines.lifecycle_091 import lifecycle_091_timeline
from amqpscope.pipelines.lifecycle_10 import lifecycle_10_timeline
from amqpscope.pipelines.link_credit import link_state_timeline
from amqpscope.pipelines.tcp_flow import tcp_flow_timeline
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA
from tests.test_flow_state import at, frames_df, sender_link, session

RULES = {rule.id: rule for rule in load_rules()}
HEADER_10 = dict(direction="c2s", frame_type="protocol-header", method="amqp", channel=None)
HEADER_10_S2C = dict(HEADER_10, direction="s2c")
OPENS = [HEADER_10, dict(direction="c2s", method="open"), HEADER_10_S2C, dict(direction="s2c", method="open")]


def flagged(table: DataFrame, name: str) -> dict[str, list[int]]:
    """The frames each rule on table ``name`` flags (only rules flagging something)."""
    found = {rule.id: sorted(r.frame_index for r in violations(table, rule).collect()) for rule in rules_for(name)}
    return {rule_id: frames for rule_id, frames in found.items() if frames}


# --- AMQP 1.0 lifecycle ---------------------------------------------------------------------------


def test_amqp10_frames_before_open_and_after_close(spark):
    events = [
        HEADER_10,
        dict(direction="c2s", method="begin"),  # 1: before the client's own open
        dict(direction="c2s", method="open"),
        dict(direction="c2s", frame_type="empty", method=None),  # fine: after open
        HEADER_10_S2C,
        dict(direction="s2c", frame_type="empty", method=None),  # 5: the broker's, before its open
        dict(direction="s2c", method="open"),
        dict(direction="c2s", method="close"),
        dict(direction="s2c", method="close"),  # the answer: fine
        dict(direction="c2s", frame_type="empty", method=None),  # 9: after the client's close
    ]
    table = lifecycle_10_timeline(frames_df(spark, "amqp-1.0", events))
    assert flagged(table, "lifecycle_10") == {
        "amqp10.connection.frame_before_open": [1, 5],
        "amqp10.connection.frame_after_close": [9],
    }


def test_amqp10_connection_picked_up_mid_stream_is_not_judged(spark):
    events = [
        dict(direction="c2s", method="transfer", handle=0),
        dict(direction="c2s", method="flow", handle=7),
        dict(direction="c2s", method="attach", handle=0, name="l", role="sender"),
    ]
    table = lifecycle_10_timeline(frames_df(spark, "amqp-1.0", events))
    assert flagged(table, "lifecycle_10") == {}
    assert {(r.started, r.opened_before, r.handle_attached) for r in table.collect()} == {(False, None, None)}


def test_amqp10_handles_attached_in_use_unattached_and_above_handle_max(spark):
    events = OPENS + [
        dict(direction="c2s", method="begin", channel=0, handle_max=10),
        dict(
            direction="c2s", method="attach", channel=0, handle=20, name="early", role="sender"
        ),  # 5: pipelined: not judged
        dict(direction="s2c", method="begin", channel=0, remote_channel=0, handle_max=3),
        dict(direction="c2s", method="attach", channel=0, handle=0, name="a", role="sender"),
        dict(direction="c2s", method="attach", channel=0, handle=0, name="b", role="sender"),  # 8: handle 0 in use
        dict(direction="c2s", method="attach", channel=0, handle=3, name="c", role="sender"),  # at handle-max 3: fine
        dict(direction="c2s", method="attach", channel=0, handle=4, name="d", role="sender"),  # 10: above it
        dict(direction="c2s", method="transfer", channel=0, handle=0, delivery_id=0),
        dict(direction="c2s", method="transfer", channel=0, handle=9, delivery_id=1),  # 12: never attached
        dict(direction="c2s", method="detach", channel=0, handle=0, closed=True),
        dict(direction="c2s", method="flow", channel=0, handle=0, link_credit=1),  # 14: after its detach
        dict(direction="c2s", method="flow", channel=0, incoming_window=5),  # a session flow: no handle
        dict(direction="c2s", method="attach", channel=0, handle=0, name="e", role="sender"),  # re-used after detach
        dict(direction="c2s", method="end", channel=0),
        dict(direction="c2s", method="begin", channel=0),
        dict(direction="c2s", method="attach", channel=0, handle=0, name="f", role="sender"),  # a new session: free
    ]
    table = lifecycle_10_timeline(frames_df(spark, "amqp-1.0", events))
    assert flagged(table, "lifecycle_10") == {
        "amqp10.link.attach_handle_in_use": [8],
        "amqp10.link.attach_above_handle_max": [10],
        "amqp10.link.unattached_handle": [12, 14],
    }
    [early] = table.filter("frame_index = 5").collect()
    assert early.peer_handle_max is None


def test_amqp10_begin_naming_a_remote_channel_the_peer_never_began(spark):
    events = OPENS + [
        dict(direction="c2s", method="begin", channel=2),
        dict(direction="s2c", method="begin", channel=0, remote_channel=2),  # answers channel 2: fine
        dict(direction="s2c", method="begin", channel=1, remote_channel=5),  # 6: the client began nothing on 5
    ]
    table = lifecycle_10_timeline(frames_df(spark, "amqp-1.0", events))
    assert flagged(table, "lifecycle_10") == {"amqp10.session.remote_channel_without_begin": [6]}


# --- AMQP 0-9-1 lifecycle -------------------------------------------------------------------------

HEADER_091 = dict(direction="c2s", frame_type="protocol-header", method="amqp-0-9-1", channel=None)


def test_amqp091_channel_open_twice_methods_after_close_and_content_while_stopped(spark):
    events = [
        HEADER_091,
        dict(direction="c2s", method="channel.open", channel=1),
        dict(direction="c2s", method="channel.open", channel=1),  # 2: already open
        dict(direction="s2c", method="channel.flow", channel=1, active=False),
        dict(direction="c2s", method="basic.publish", channel=1),  # before its flow-ok: in flight, fine
        dict(direction="c2s", method="channel.flow-ok", channel=1, active=False),
        dict(direction="c2s", method="basic.publish", channel=1),  # 6: stopped
        dict(direction="s2c", method="channel.flow", channel=1, active=True),
        dict(direction="c2s", method="basic.publish", channel=1),  # restarted: fine
        dict(direction="c2s", method="channel.close", channel=1),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=1),  # the peer's, in flight: fine
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=1),  # 11: after its own close
        dict(direction="s2c", method="channel.close-ok", channel=1),
        dict(direction="c2s", method="channel.open", channel=1),  # closed: fine
        dict(direction="c2s", method="basic.qos", channel=1),
    ]
    table = lifecycle_091_timeline(frames_df(spark, "amqp-0-9-1", events))
    assert flagged(table, "lifecycle_091") == {
        "amqp091.channel.open_on_open_channel": [2],
        "amqp091.channel.content_while_flow_stopped": [6],
        "amqp091.channel.method_after_close": [11],
    }


def test_amqp091_delivery_tags_connection_close_and_blocked_capability(spark):
    with_capability = {"client-properties": '{"capabilities": {"connection.blocked": true}}'}
    without = {"client-properties": '{"capabilities": {"publisher_confirms": true}}'}

    def connection(name: str, arguments: dict) -> list[dict]:
        return [
            dict(HEADER_091, connection_id=name),
            dict(direction="c2s", method="connection.start-ok", arguments=arguments, connection_id=name),
            dict(direction="s2c", method="connection.blocked", reason="low on memory", connection_id=name),
        ]

    events = connection("capable", with_capability) + connection("incapable", without)
    table = lifecycle_091_timeline(frames_df(spark, "amqp-0-9-1", events))
    rule = RULES["amqp091.connection.blocked_without_capability"]
    assert [r.connection_id for r in violations(table, rule).collect()] == ["incapable"]

    events = [
        HEADER_091,
        dict(direction="c2s", method="channel.open", channel=1),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=1),
        dict(direction="s2c", method="basic.get-ok", channel=1, delivery_tag=2),
        dict(direction="s2c", method="basic.deliver", channel=1, delivery_tag=2),  # 4: not above 2
        dict(direction="c2s", method="connection.close", channel=0, reply_code=200),
        dict(direction="c2s", method="basic.ack", channel=1, delivery_tag=1),  # 6: after its connection.close
        dict(direction="s2c", method="connection.close-ok", channel=0),
    ]
    table = lifecycle_091_timeline(frames_df(spark, "amqp-0-9-1", events))
    assert flagged(table, "lifecycle_091") == {
        "amqp091.basic.delivery_tag_not_increasing": [4],
        "amqp091.connection.method_after_close": [6],
    }


# --- AMQP 1.0 link rules on link_state ------------------------------------------------------------


def test_drain_answered_short_and_transfers_after_the_senders_zero_credit(spark):
    """RabbitMQ 3.10.8 on a quorum queue: the receiver drains 10 credits from delivery-count 0, the
    broker sends 2 messages, answers with delivery-count 2 (not 10) and credit 0, then sends on."""
    events = session() + [
        dict(direction="c2s", method="attach", name="r", handle=0, role="receiver", source_address="/queue/q"),
        dict(direction="s2c", method="attach", name="r", handle=1, role="sender", initial_delivery_count=0),
        dict(direction="c2s", method="flow", handle=0, delivery_count=0, link_credit=10, drain=True),
        dict(direction="s2c", method="transfer", handle=1, delivery_id=0, more=False),
        dict(direction="s2c", method="transfer", handle=1, delivery_id=1, more=False),
        dict(direction="s2c", method="flow", handle=1, delivery_count=2, link_credit=0, drain=True),  # 7: short by 8
        dict(direction="s2c", method="transfer", handle=1, delivery_id=2, more=False),  # 8: after saying credit 0
        dict(direction="c2s", method="flow", handle=0, delivery_count=3, link_credit=5, drain=True),
        dict(direction="s2c", method="transfer", handle=1, delivery_id=3, more=False),  # granted again: fine
        dict(direction="s2c", method="flow", handle=1, delivery_count=8, link_credit=0, drain=True),  # 3 + 5: right
    ]
    table = link_state_timeline(frames_df(spark, "amqp-1.0", events))
    assert flagged(table, "link_state") == {
        "amqp10.link.drain_not_honoured": [7],
        "amqp10.link.transfer_after_sender_announced_no_credit": [8],
    }
    [answer] = violations(table, RULES["amqp10.link.drain_not_honoured"]).collect()
    assert {k: answer.evidence[k] for k in ("delivery_count", "delivery_count_rcv", "link_credit_rcv")} == {
        "delivery_count": "2",
        "delivery_count_rcv": "0",
        "link_credit_rcv": "10",
    }


def test_delivery_counts_backwards_or_ahead_and_transfer_delivery_ids(spark):
    events = (
        session()
        + sender_link(0)
        + [
            dict(direction="s2c", method="flow", handle=3, delivery_count=0, link_credit=10),
            dict(direction="c2s", method="transfer", handle=0, delivery_id=0, more=True),
            dict(direction="c2s", method="transfer", handle=0, delivery_id=0, more=True),  # same id: fine
            dict(direction="c2s", method="transfer", handle=0, more=False),  # id omitted: fine
            dict(direction="c2s", method="transfer", handle=0, delivery_id=1, more=True),
            dict(direction="c2s", method="transfer", handle=0, delivery_id=2, more=False),  # 9: another delivery inside
            dict(direction="c2s", method="transfer", handle=0, more=False),  # 10: a new delivery without delivery-id
            dict(direction="c2s", method="flow", handle=0, delivery_count=1, link_credit=7),  # 11: 3 sent, restated 1
            dict(
                direction="s2c", method="flow", handle=3, delivery_count=5, link_credit=10
            ),  # 12: ahead of the sender's 1
            dict(
                direction="s2c", method="flow", handle=3, delivery_count=1, link_credit=10
            ),  # the sender's count: fine
        ]
    )
    table = link_state_timeline(frames_df(spark, "amqp-1.0", events))
    assert flagged(table, "link_state") == {
        "amqp10.transfer.continuation_with_other_delivery_id": [9],
        "amqp10.transfer.first_without_delivery_id": [10],
        "amqp10.link.delivery_count_backwards": [11],
        "amqp10.link.delivery_count_ahead_of_sender": [12],
    }


def test_link_state_settles_deliveries_at_the_dispositions_that_settle_them(spark):
    """Issue 14: a sending link whose deliveries the broker settled after the last transfer showed
    them unsettled on its last row. A disposition now has a row on each link it settled."""
    events = (
        session()
        + sender_link(0)
        + [
            dict(direction="s2c", method="flow", handle=3, delivery_count=0, link_credit=100),
            *(dict(direction="c2s", method="transfer", handle=0, delivery_id=i, more=False) for i in range(4)),
            dict(
                direction="s2c", method="disposition", role="receiver", first=0, last=2, settled=True, state="accepted"
            ),
            dict(
                direction="s2c", method="disposition", role="receiver", first=1, last=3, settled=True, state="accepted"
            ),
            dict(
                direction="s2c", method="disposition", role="receiver", first=3, settled=True, state="accepted"
            ),  # nothing left
        ]
    )
    table = link_state_timeline(frames_df(spark, "amqp-1.0", events)).select(
        "frame_index", "method", "handle", "role", "delivery_count_snd", "link_credit_snd", "unsettled"
    )
    assertDataFrameEqual(
        table,
        spark.createDataFrame(
            [
                (2, "attach", 0, "sender", 0, 0, 0),
                (3, "attach", 3, "receiver", 0, 0, 0),
                (4, "flow", 3, "receiver", 0, 100, 0),
                (5, "transfer", 0, "sender", 1, 99, 1),
                (6, "transfer", 0, "sender", 2, 98, 2),
                (7, "transfer", 0, "sender", 3, 97, 3),
                (8, "transfer", 0, "sender", 4, 96, 4),
                # The broker's dispositions, on its handle of the link, with the state as of then.
                (9, "disposition", 3, "receiver", 4, 96, 1),
                (10, "disposition", 3, "receiver", 4, 96, 0),
            ],
            "frame_index long, method string, handle long, role string, delivery_count_snd long, link_credit_snd long, "
            "unsettled long",
        ),
    )


# --- events ---------------------------------------------------------------------------------------


def test_events_list_errors_aborts_undecodable_messages_and_reattached_links(spark):
    amqp10 = frames_df(
        spark,
        "amqp-1.0",
        [
            dict(
                direction="s2c",
                method="end",
                channel=0,
                error_condition="amqp:internal-error",
                error_description="crash",
            ),
            dict(direction="c2s", method="end", channel=1),  # no error: no event
            dict(direction="s2c", method="detach", handle=1, closed=True, error_condition="amqp:not-found"),
            dict(direction="c2s", method="close", error_condition="amqp:connection:forced"),
            dict(direction="s2c", method="transfer", handle=1, aborted=True, more=False),
            dict(direction="s2c", method="transfer", handle=1, arguments={"message-error": "unknown format code 0x00"}),
            dict(direction="s2c", method="attach", handle=1, name="l", role="sender"),
            dict(direction="c2s", method="attach", handle=0, name="l", role="receiver"),  # the client's first: no event
            dict(direction="s2c", method="attach", handle=1, name="l", role="sender"),  # 8: the broker's second
            dict(direction="s2c", method="attach", handle=2, name="l", role="receiver"),  # the other way: another link
        ],
    )
    amqp091 = frames_df(
        spark,
        "amqp-0-9-1",
        [
            dict(direction="s2c", method="channel.close", channel=5, reply_code=406, reply_text="PRECONDITION_FAILED"),
            dict(direction="c2s", method="connection.close", reply_code=200, reply_text="Normal shutdown"),  # no event
            dict(direction="s2c", method="connection.close", reply_code=320, reply_text="CONNECTION_FORCED"),
        ],
    ).withColumn("connection_id", F.lit("conn-091"))
    found = events_timeline(amqp10.unionByName(amqp091)).select(
        "connection_id",
        "frame_index",
        "event_id",
        "severity",
        "direction",
        "condition",
        "text",
        "packet_number",
        "link_name",
    )
    assertDataFrameEqual(
        found,
        spark.createDataFrame(
            [
                ("conn", 0, "amqp10.session.ended_with_error", "info", "s2c", "amqp:internal-error", "crash", 1, None),
                ("conn", 2, "amqp10.link.detached_with_error", "info", "s2c", "amqp:not-found", None, 3, None),
                (
                    "conn",
                    3,
                    "amqp10.connection.closed_with_error",
                    "info",
                    "c2s",
                    "amqp:connection:forced",
                    None,
                    4,
                    None,
                ),
                ("conn", 4, "amqp10.delivery.aborted", "info", "s2c", None, None, 5, None),
                ("conn", 5, "amqp10.message.undecodable", "info", "s2c", "unknown format code 0x00", None, 6, None),
                ("conn", 8, "amqp10.link.attached_again", "info", "s2c", None, None, 9, "l"),
                (
                    "conn-091",
                    0,
                    "amqp091.channel.closed_with_error",
                    "info",
                    "s2c",
                    "406",
                    "PRECONDITION_FAILED",
                    1,
                    None,
                ),
                (
                    "conn-091",
                    2,
                    "amqp091.connection.closed_with_error",
                    "info",
                    "s2c",
                    "320",
                    "CONNECTION_FORCED",
                    3,
                    None,
                ),
            ],
            "connection_id string, frame_index long, event_id string, severity string, direction string, condition string, "
            "text string, packet_number long, link_name string",
        ),
    )
    assert {kind.id for kind in load_events()} == {
        "amqp10.session.ended_with_error",
        "amqp10.link.detached_with_error",
        "amqp10.connection.closed_with_error",
        "amqp10.delivery.aborted",
        "amqp10.message.undecodable",
        "amqp10.link.attached_again",
        "amqp091.channel.closed_with_error",
        "amqp091.connection.closed_with_error",
    }


# --- TCP keep-alives ------------------------------------------------------------------------------


def test_keep_alives_are_told_apart_from_zero_window_probes(spark):
    # (direction, seq_offset, flags, effective window, payload)
    segments = [
        ("c2s", 0, 0x18, 1000, 100),
        ("s2c", 0, 0x10, 0, 0),  # the server closes its window
        ("c2s", 99, 0x10, 1000, 1),  # seq one below the next byte, 1 garbage byte: keep-alive
        ("c2s", 100, 0x10, 1000, 1),  # the next byte into the closed window: zero-window probe
        ("s2c", 0, 0x10, 500, 0),
        ("c2s", 101, 0x10, 1000, 0),  # a bare ack at the next byte: neither
        ("c2s", 100, 0x10, 1000, 0),
    ]  # seq one below the next byte (101), no payload: keep-alive
    rows = [
        ("cap", "conn", d, n + 1, at(n), n * 1000, seq, 0, flags, window, 0, window, payload, 0)
        for n, (d, seq, flags, window, payload) in enumerate(segments)
    ]
    # No D-SACK block in any of them (dsack_left_offset, dsack_right_offset).
    flow = tcp_flow_timeline(spark.createDataFrame([(*r, None, None) for r in rows], TCP_SEGMENTS_SCHEMA))
    assertDataFrameEqual(
        flow.select("packet_number", "is_keep_alive", "is_zero_window_probe"),
        spark.createDataFrame(
            [
                (1, False, False),
                (2, False, False),
                (3, True, False),
                (4, False, True),
                (5, False, False),
                (6, False, False),
                (7, True, False),
            ],
            "packet_number long, is_keep_alive boolean, is_zero_window_probe boolean",
        ),
    )


def test_basic_recover_settles_the_channels_unacked_deliveries(spark):
    """amqp091_methods (samples/decoders): a consumer under a global qos of 3 gets 3 deliveries, the
    client sends basic.recover (RabbitMQ requeues them) and gets them again under tags 4-6: never
    more than 3 unacked, so no prefetch rule fires."""
    from amqpscope.pipelines.channel_unacked import channel_unacked_timeline, consumer_unacked_timeline

    events = [
        HEADER_091,
        dict(direction="c2s", method="channel.open", channel=4),
        dict(direction="c2s", method="basic.qos", channel=4, prefetch_count=3, **{"global": True}),
        dict(direction="c2s", method="basic.consume", channel=4, queue="q"),
        dict(direction="s2c", method="basic.consume-ok", channel=4, consumer_tag="c"),
        *(
            dict(direction="s2c", method="basic.deliver", channel=4, consumer_tag="c", delivery_tag=t)
            for t in (1, 2, 3)
        ),
        dict(direction="c2s", method="basic.recover", channel=4, requeue=True),
        *(
            dict(direction="s2c", method="basic.deliver", channel=4, consumer_tag="c", delivery_tag=t)
            for t in (4, 5, 6)
        ),
        dict(direction="c2s", method="basic.ack", channel=4, delivery_tag=0, multiple=True),
    ]
    frames = frames_df(spark, "amqp-0-9-1", events)
    channel = channel_unacked_timeline(frames).filter("method = 'basic.deliver'").orderBy("frame_index")
    assert [r.unacked for r in channel.collect()] == [1, 2, 3, 1, 2, 3]
    for table, timeline in (
        ("channel_unacked", channel_unacked_timeline(frames)),
        ("consumer_unacked", consumer_unacked_timeline(frames)),
    ):
        assert flagged(timeline, table) == {}
