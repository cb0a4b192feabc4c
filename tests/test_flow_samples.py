"""Flow state on the real captures, against what the clients that made them did (``*.truth.json``).

The bundled samples (``samples/``) and the flow-control scenarios (``samples/flow/``: a consumer
held at its prefetch by slow processing, a publisher blocked by a memory alarm) are decoded once,
every flow-state table is built from them, and the ground truth must hold in the tables.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from amqpscope.expectations.catalogue import load_rules, violations
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.stages.decode import decode_captures, resolve_captures
from amqpscope.pipelines import tables as lake_tables

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CAPTURES = sorted(p for p in [*SAMPLES.iterdir(), *(SAMPLES / "flow").iterdir()] if p.suffix in (".pcap", ".pcapng"))
SLOW_CONSUMER = SAMPLES / "flow" / "amqp091-slow-consumer.pcap"
MEMORY_ALARM = SAMPLES / "flow" / "amqp091-memory-alarm.pcap"
CREDIT = SAMPLES / "amqp10-credit.pcap"
QOS_CONFIRMS = SAMPLES / "amqp091-qos-confirms.pcap"


def truth_of(capture: Path) -> dict:
    return json.loads(capture.with_name(capture.name.rsplit(".", 1)[0] + ".truth.json").read_text())


def only(capture: Path, df: DataFrame) -> DataFrame:
    return df.filter(F.col("capture_id") == capture_id(capture))


@pytest.fixture(scope="module")
def tables(spark) -> dict[str, DataFrame]:
    """Every flow-state table of every sample capture, computed once (checkpointed: cheap to query)."""
    bronze = decode_captures(spark, resolve_captures([str(c) for c in CAPTURES]), (5672,))
    try:
        frames = bronze.frames.localCheckpoint()
        segments = bronze.tcp_segments.localCheckpoint()
        # Each table checkpointed as built, as derive reads the tables it built from stored rows.
        build = lake_tables.Build(
            {"frames": frames, "tcp_segments": segments}, store=lambda _table, rows: rows.localCheckpoint()
        )
        built = build.build([*lake_tables.FLOW, "messages_091"])
    finally:
        bronze.release()
    return {**built, "frames": frames, "tcp_segments": segments}


def test_flow_samples_exist_with_ground_truth():
    assert [c.name for c in CAPTURES if c.parent.name == "flow"] == [
        "amqp091-memory-alarm.pcap",
        "amqp091-slow-consumer.pcap",
    ]
    # What a clone carries: the bottleneck scenarios (samples/bottlenecks, up to 5 MB each, with their
    # broker's states), the real clients' problems (samples/problems, with theirs) and the encrypted
    # captures (samples/tls, with their key logs) have budgets of
    # their own; everything else stays small.
    budgets = {"bottlenecks": 36 * 1024 * 1024, "tls": 4 * 1024 * 1024, "problems": 20 * 1024 * 1024}
    small = [f for f in SAMPLES.rglob("*") if f.is_file() and not budgets.keys() & set(f.parts)]
    assert sum(f.stat().st_size for f in small) <= 3 * 1024 * 1024
    for directory, budget in budgets.items():
        assert sum(f.stat().st_size for f in (SAMPLES / directory).iterdir()) <= budget, directory


def test_slow_consumer_unacked_never_exceeds_prefetch_and_sits_at_it(tables):
    gt = truth_of(SLOW_CONSUMER)["ground_truth"]["amqp091_slow_consumer"]
    consumer = only(SLOW_CONSUMER, tables["consumer_unacked"]).orderBy("frame_index").collect()
    deliveries = [r for r in consumer if r.method == "basic.deliver"]
    assert len(deliveries) == gt["deliveries_received"]
    assert sum(r.settled for r in consumer if r.method == "basic.ack") == gt["acks_sent"]
    assert {r.prefetch_count for r in consumer} == {gt["prefetch_count"]}
    assert max(r.unacked for r in consumer) == gt["prefetch_count"]
    # Time at the prefetch limit, from the first delivery to the last ack: the broker refills the
    # window as soon as an ack frees a place, so the consumer spends most of its time full.
    timeline = [r for r in consumer if r.method in ("basic.deliver", "basic.ack")]
    full = sum(
        (b.ts - a.ts).total_seconds() for a, b in zip(timeline, timeline[1:]) if a.unacked == gt["prefetch_count"]
    )
    total = (timeline[-1].ts - timeline[0].ts).total_seconds()
    assert full / total > 0.8
    # The same, as flow_intervals reports it.
    starved = only(SLOW_CONSUMER, tables["flow_intervals"]).filter(F.col("cause") == "prefetch_full")
    assert starved.agg(F.sum("duration_us")).first()[0] / 1e6 == pytest.approx(full, rel=1e-6)
    assert abs(total - gt["consume_seconds"]) < 0.5


def test_qos_sample_never_exceeds_prefetch(tables):
    gt = truth_of(QOS_CONFIRMS)["ground_truth"]["amqp091_qos_confirms"]
    consumer = only(QOS_CONFIRMS, tables["consumer_unacked"])
    assert consumer.agg(F.max("unacked"), F.min("prefetch_count"), F.max("prefetch_count")).first() == (
        gt["prefetch_count"],
        gt["prefetch_count"],
        gt["prefetch_count"],
    )
    confirms = only(QOS_CONFIRMS, tables["channel_confirms"])
    assert confirms.agg(F.max("published"), F.sum("confirmed"), F.max("outstanding")).first() == (
        gt["messages_published"],
        gt["confirms_acked"],
        1,
    )  # pika's BlockingChannel waits for each confirm


def test_memory_alarm_is_one_blocked_interval_matching_the_notices(tables):
    gt = truth_of(MEMORY_ALARM)["ground_truth"]["amqp091_memory_alarm"]
    assert (gt["blocked_notifications"], gt["unblocked_notifications"]) == (1, 1)
    [interval] = (
        only(MEMORY_ALARM, tables["connection_blocked"])
        .select("*", F.unix_micros("start_ts").alias("start_us"), F.unix_micros("end_ts").alias("end_us"))
        .collect()
    )
    notices = only(MEMORY_ALARM, tables["frames"]).filter(
        F.col("method").isin("connection.blocked", "connection.unblocked")
    )
    [blocked, unblocked] = notices.orderBy("frame_index").collect()
    assert (interval.reason, interval.notifications) == (gt["blocked_reason"], 1)
    assert (interval.start_frame_index, interval.end_frame_index) == (blocked.frame_index, unblocked.frame_index)
    assert (interval.start_ts, interval.end_ts) == (blocked.ts, unblocked.ts)
    # Within the alarm as the scenario raised and cleared it (rabbitmqctl takes up to a second or two).
    raised, cleared = (
        datetime.fromisoformat(gt[k]).timestamp() * 1e6 for k in ("alarm_raised_utc", "alarm_cleared_utc")
    )
    assert raised < interval.start_us < interval.end_us < cleared + 1e6
    assert interval.duration_us > 0.9 * (gt["alarm_cleared_after_seconds"] - 0.5) * 1e6
    [row] = only(MEMORY_ALARM, tables["flow_intervals"]).filter(F.col("cause") == "connection_blocked").collect()
    assert (row.entity, row.direction, row.detail, row.start_ts, row.end_ts) == (
        "connection",
        "c2s",
        gt["blocked_reason"],
        interval.start_ts,
        interval.end_ts,
    )
    # The publish caught by the block waited for its confirm at least as long as the block lasted.
    waits = only(MEMORY_ALARM, tables["flow_intervals"]).filter(F.col("cause") == "confirms_outstanding")
    assert waits.agg(F.max("duration_us")).first()[0] >= interval.duration_us


def test_receiver_credit_windows_equal_what_the_receiver_granted(tables):
    gt = truth_of(CREDIT)["ground_truth"]["amqp10_credit"]
    links = only(CREDIT, tables["link_state"])
    grants = links.filter(
        (F.col("method") == "flow") & (F.col("role") == "receiver") & (F.col("sender_side") == "server")
    )
    assert [r.link_credit_rcv for r in grants.orderBy("frame_index").collect()] == [gt["credit_window"]] * gt[
        "credit_grants"
    ]
    deliveries = links.filter(F.col("is_new_delivery") & (F.col("sender_side") == "server"))
    assert deliveries.count() == gt["messages_received"]
    assert deliveries.agg(
        F.min("link_credit_snd"), F.max("link_credit_snd_before"), F.max("deliveries_in_flight")
    ).first() == (0, gt["credit_window"], gt["credit_window"])
    # The broker uses each grant up and waits for the next: one exhausted interval per grant.
    exhausted = only(CREDIT, tables["flow_intervals"]).filter(
        (F.col("cause") == "link_credit_exhausted") & (F.col("direction") == "s2c")
    )
    assert exhausted.count() == gt["credit_grants"]
    assert exhausted.filter(F.col("end_ts").isNull()).count() == 0
    # Every delivery was accepted and settled by the end of each link (both endpoints detach both links).
    assert [r.unsettled for r in links.filter(F.col("method") == "detach").collect()] == [0, 0, 0, 0]
    assert links.filter(F.col("method") == "transfer").agg(F.max("unsettled")).first()[0] > 0


def test_session_windows_stay_open_in_the_samples(tables):
    session = only(CREDIT, tables["session_window"])
    transfers = session.filter(F.col("method") == "transfer")
    assert transfers.count() == 200
    assert transfers.agg(F.min("remote_incoming_window")).first()[0] > 0
    last = session.orderBy(F.desc("frame_index")).first()
    # Both endpoints sent 100 transfer frames each, from next-outgoing-id 0.
    assert (last.client_next_outgoing_id, last.server_next_outgoing_id, last.client_next_incoming_id) == (100, 100, 100)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_every_packet_is_a_segment_and_no_window_closed(tables, capture):
    segments = only(capture, tables["tcp_segments"])
    assert segments.count() == truth_of(capture)["capture"]["packets_captured"]  # one AMQP connection's packets, or two
    flow = only(capture, tables["tcp_flow"])
    assert flow.filter(F.col("is_zero_window") | F.col("is_retransmission")).count() == 0


def test_throughput_adds_up_to_the_messages_sent(tables):
    gt = truth_of(QOS_CONFIRMS)["ground_truth"]["amqp091_qos_confirms"]
    per_direction = {
        r.direction: (r.messages, r.bytes)
        for r in only(QOS_CONFIRMS, tables["throughput"])
        .filter(F.col("scope") == "connection")
        .groupBy("direction")
        .agg(F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"))
        .collect()
    }
    size = gt["message_body_size"]
    assert per_direction == {
        "c2s": (gt["messages_published"], gt["messages_published"] * size),
        "s2c": (gt["deliveries_received"], gt["deliveries_received"] * size),
    }
    queue = f"/queues/{gt['queue']}"
    addresses = only(QOS_CONFIRMS, tables["throughput"]).filter(
        (F.col("scope") == "address") & (F.col("address") == queue)
    )
    assert addresses.agg(F.sum("messages")).first()[0] == gt["messages_published"] + gt["deliveries_received"]
    credit = truth_of(CREDIT)["ground_truth"]["amqp10_credit"]
    links = (
        only(CREDIT, tables["throughput"]).filter(F.col("scope") == "link").groupBy("direction").agg(F.sum("messages"))
    )
    assert dict(links.collect()) == {"c2s": credit["messages_sent"], "s2c": credit["messages_received"]}


def test_no_violations_in_clean_traffic(tables):
    found = {rule.id: violations(tables[rule.table], rule).count() for rule in load_rules() if rule.table in tables}
    assert set(found) >= {
        "amqp10.session.transfer_beyond_window",
        "amqp091.confirm.unknown_sequence",
        "amqp091.consumer.unacked_above_prefetch",
        "amqp091.frame.larger_than_frame_max",
        "amqp091.content.cut_short",
    }
    assert found == {rule_id: 0 for rule_id in found}


def test_every_flow_table_is_built(tables):
    assert set(lake_tables.FLOW) <= set(tables)
    # No sample uses channel.flow, and none stays silent for a heartbeat interval (60 s, longer
    # than any sample lasts), and nothing in them closes with an error or aborts: those tables
    # are empty here.
    assert {name for name in lake_tables.FLOW if tables[name].count() == 0} == {"channel_flow", "idle_gaps", "events"}
    heartbeats = {r.heartbeat for r in tables["frames"].filter("method = 'connection.tune-ok'").collect()}
    longest = tables["frames"].groupBy("connection_id").agg(F.max("ts_us") - F.min("ts_us")).collect()
    assert min(heartbeats) * 1_000_000 > max(r[1] for r in longest)


def test_frame_limits_follow_the_captured_negotiation(tables):
    """Every limit on a real connection is the one its own tune-ok or the other peer's open set
    (AMQP 1.0 frames pipelined before the other peer's open: unknown, transport 2.4.2)."""
    frames = tables["frames"]
    tuned = {
        r.connection_id: (r.frame_max, r.channel_max)
        for r in frames.filter("method = 'connection.tune-ok' AND direction = 'c2s'").collect()
    }
    opened = {
        (r.connection_id, r.direction): (r.frame_index, r.max_frame_size, r.channel_max)
        for r in frames.filter("protocol = 'amqp-1.0' AND method = 'open'").collect()
    }
    assert tuned and opened
    rows = tables["frame_limits"].filter("method NOT IN ('connection.tune-ok', 'open')").collect()
    assert {r.protocol for r in rows} == {"amqp-0-9-1", "amqp-1.0"}
    for r in rows:
        if r.protocol == "amqp-0-9-1":
            frame_max, channel_max = tuned[r.connection_id]
            expected = (frame_max or None, channel_max or None)
        else:
            index, max_frame_size, channel_max = opened[(r.connection_id, "s2c" if r.direction == "c2s" else "c2s")]
            if r.frame_index < index:  # sent before the peer's open arrived (pipelined): not known yet
                expected = (None, None)
            else:
                expected = (
                    None if max_frame_size in (None, 2**32 - 1) else max_frame_size,
                    65535 if channel_max is None else channel_max,
                )
        assert (r.frame_size_limit, r.channel_limit) == expected, r
        if r.protocol == "amqp-1.0":
            assert r.peer_opened == (
                r.frame_index > opened[(r.connection_id, "s2c" if r.direction == "c2s" else "c2s")][0]
            )
