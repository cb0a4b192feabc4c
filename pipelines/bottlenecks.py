"""bottlenecks: what held traffic back, where, since when and why, inferred from the wire alone.

Each inference rule (docs/DIAGNOSIS.md) is a pure function from flow-state tables to candidate
findings; ``bottlenecks`` unions them, names each entity as an operator knows it, ranks them per
capture and writes the sentence and the Wireshark filter. RabbitMQ's internal states (credit flow
between reader, channel, queue and message store; alarms) are invisible in a capture: a rule shows
the measured figures it rests on in ``evidence``, and its ``confidence`` says how directly the wire
shows the cause (a connection.blocked names its alarm; a window closing only hints at a stage).

| rule id                                | component                      | effect                   | evidence on the wire                                        |
|----------------------------------------|--------------------------------|--------------------------|-------------------------------------------------------------|
| diagnosis.alarm.connection_blocked     | memory_alarm / disk_alarm / alarm | blocked               | connection.blocked(reason) ... connection.unblocked         |
| diagnosis.alarm.incoming_window_closed | alarm                          | blocked                  | 1.0 broker session incoming-window 0 on a publishing session |
| diagnosis.consumer.prefetch_bound      | consumer                       | deliveries_wait_for_acks | unacked at prefetch, slow acks, each ack refilled at once   |
| diagnosis.consumer.credit_bound        | consumer                       | credit_starved           | 1.0 link credit at 0, slow grants, each grant used at once  |
| diagnosis.publisher.credit_flow        | connection / channel / queue / message_store | publisher_throttled | broker's receive window full or closed on a publisher |
| diagnosis.connection.head_of_line      | as the publisher's             | head_of_line             | a consumer on a throttled connection                        |
| diagnosis.client.not_reading           | client                         | client_not_reading       | the client's receive window closed while the broker sends   |
| diagnosis.network.retransmission       | network                        | retransmission           | retransmitted bytes                                         |
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.pipelines.columns import with_columns
from amqpscope.pipelines.shape import in_schema
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA

# Columns a rule fills; naming, ranking, the filter and the id are added once for all rules.
_ADDED_LATER = ("rank", "finding_id", "connection_name", "client", "wireshark_filter")
_CANDIDATE = StructType([f for f in BOTTLENECKS_SCHEMA.fields if f.name not in _ADDED_LATER])
_MAX_PACKETS = 20  # packet numbers listed per finding (and in its Wireshark filter)
_ENTITY_ORDER = {"connection": 0, "channel": 1, "consumer": 2, "link": 3, "session": 4, "queue": 5, "node": 6}


def _us(ts: Column) -> Column:
    return F.unix_micros(ts)


def _seconds(us: Column) -> Column:
    """Microseconds as text in seconds with 3 decimals, e.g. 1.305 (for sentences)."""
    return F.format_number(us / F.lit(1e6), 3)


def _figures(**values: Column) -> Column:
    """The evidence map: each measured figure as text."""
    pairs = []
    for name, value in values.items():
        pairs += [F.lit(name), value.cast("string")]
    return F.create_map(*pairs)


def _candidate(df: DataFrame, **columns: Column) -> DataFrame:
    """Rows in the candidate shape: the given columns, the rest taken from ``df`` by name or null."""
    return in_schema(df, _CANDIDATE, **columns)


def _first_packets(column: str) -> Column:
    """Up to _MAX_PACKETS packet numbers of a group, in order."""
    return F.slice(F.array_sort(F.collect_set(column)), 1, _MAX_PACKETS)


def _lifetimes(frames: DataFrame) -> DataFrame:
    """Each connection's captured lifetime: its first and last frame."""
    return frames.groupBy("capture_id", "connection_id").agg(
        F.min("ts").alias("conn_first_ts"), F.max("ts").alias("conn_last_ts"))


def _held_until(end_ts: Column, last_ts: Column) -> Column:
    """An interval still open when the capture ends lasts until the connection's last frame."""
    return F.coalesce(end_ts, last_ts)


# -- resource alarms --------------------------------------------------------------------------


def alarm_findings(connection_blocked: DataFrame, frames: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """connection.blocked intervals (RabbitMQ's resource alarms, DOMAIN.md section 4) of at least min_held_ms.

    The reason names the alarm: RabbitMQ sends "low on memory" / "low on disk" (rabbit_alarm).
    """
    lifetimes = _lifetimes(frames)
    held = connection_blocked.join(lifetimes, ["capture_id", "connection_id"])
    end_ts = _held_until(F.col("end_ts"), F.col("conn_last_ts"))
    duration = _us(end_ts) - _us(F.col("start_ts"))
    lifetime = F.greatest(_us(F.col("conn_last_ts")) - _us(F.col("conn_first_ts")), F.lit(1))
    reason = F.lower(F.coalesce(F.col("reason"), F.lit("")))
    component = (F.when(reason.contains("memory"), "memory_alarm")
                 .when(reason.contains("disk"), "disk_alarm").otherwise("alarm"))
    found = held.withColumn("_duration", duration).filter(F.col("_duration") >= F.lit(limits.min_held_ms * 1000))
    packets = F.array_compact(F.array(F.col("start_packet_number"), F.col("end_packet_number")))
    return _candidate(
        found,
        rule_id=F.lit("diagnosis.alarm.connection_blocked"),
        entity_kind=F.lit("connection"),
        component=component,
        effect=F.lit("blocked"),
        severity=F.lit("warning"),
        end_ts=end_ts,
        duration_us=F.col("_duration"),
        lifetime_share=F.least(F.lit(1.0), F.col("_duration") / lifetime),
        confidence=F.lit(0.95),
        evidence=_figures(reason=F.col("reason"), blocked_seconds=_seconds(F.col("_duration")),
                          notifications=F.col("notifications"),
                          unblocked=F.col("end_ts").isNotNull()),
        packet_numbers=packets,
        explanation=F.concat(
            F.lit("RabbitMQ blocked publishing on this connection for "), _seconds(F.col("_duration")),
            F.lit(" s with connection.blocked(\""), F.coalesce(F.col("reason"), F.lit("")), F.lit("\")"),
            F.when(F.col("end_ts").isNull(), F.lit(", still blocked when the capture ends")).otherwise(F.lit("")),
            F.lit(": a "), F.regexp_replace(component, "_", " "),
            F.lit(" stops every publisher until it clears.")),
    )


def incoming_window_findings(flow_intervals: DataFrame, frames: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """AMQP 1.0: the broker holding a publishing session's incoming-window at 0 (how RabbitMQ stops
    1.0 publishers on an alarm, DOMAIN.md section 3), for at least min_held_ms, on a session that sent
    transfers."""
    publishing = (frames.filter((F.col("protocol") == "amqp-1.0") & (F.col("method") == "transfer")
                                & (F.col("direction") == "c2s"))
                  .select("capture_id", "connection_id", F.col("channel").alias("_channel")).distinct())
    lifetimes = _lifetimes(frames)
    closed = (flow_intervals.filter((F.col("cause") == "session_window_closed") & (F.col("direction") == "c2s"))
              .join(publishing, (flow_intervals.capture_id == publishing.capture_id)
                    & (flow_intervals.connection_id == publishing.connection_id)
                    & (flow_intervals.channel == publishing._channel), "left_semi")
              .join(lifetimes, ["capture_id", "connection_id"]))
    end_ts = _held_until(F.col("end_ts"), F.col("conn_last_ts"))
    duration = _us(end_ts) - _us(F.col("start_ts"))
    lifetime = F.greatest(_us(F.col("conn_last_ts")) - _us(F.col("conn_first_ts")), F.lit(1))
    found = closed.withColumn("_duration", duration).filter(F.col("_duration") >= F.lit(limits.min_held_ms * 1000))
    return _candidate(
        found,
        rule_id=F.lit("diagnosis.alarm.incoming_window_closed"),
        entity_kind=F.lit("session"),
        entity=F.lit(None),  # named from the connection below (flow_intervals' own entity column says "session")
        component=F.lit("alarm"),
        effect=F.lit("blocked"),
        severity=F.lit("warning"),
        end_ts=end_ts,
        duration_us=F.col("_duration"),
        lifetime_share=F.least(F.lit(1.0), F.col("_duration") / lifetime),
        confidence=F.lit(0.6),
        evidence=_figures(closed_seconds=_seconds(F.col("_duration")), detail=F.col("detail")),
        packet_numbers=F.array_compact(F.array(F.col("start_packet_number"), F.col("end_packet_number"))),
        explanation=F.concat(
            F.lit("The broker held this publishing session's incoming-window at 0 for "), _seconds(F.col("_duration")),
            F.lit(" s: no transfer may be sent, as RabbitMQ does to AMQP 1.0 publishers during a resource alarm.")),
    )


# -- slow consumers ---------------------------------------------------------------------------

_CONSUMER = ("capture_id", "connection_id", "channel", "consumer_tag")


def _consumer_in_order() -> WindowSpec:
    """One consumer's unacked timeline in order: what follows each acknowledgement."""
    return Window.partitionBy(*_CONSUMER).orderBy("frame_index")


def _ack_latencies(messages_091: DataFrame, frames: DataFrame) -> DataFrame:
    """Per consumer: deliveries that needed an ack, and how long they waited for it (median, p95)."""
    settle_times = frames.select("capture_id", "connection_id", F.col("frame_index").alias("settled_frame_index"),
                                 F.col("ts").alias("_settled_ts"))
    delivered = messages_091.filter((F.col("method") == "basic.deliver") & ~F.coalesce(F.col("no_ack"), F.lit(False)))
    waits = (delivered.join(settle_times, ["capture_id", "connection_id", "settled_frame_index"], "left")
             .withColumn("_wait_us", _us(F.col("_settled_ts")) - _us(F.col("ts"))))
    return waits.groupBy(*_CONSUMER).agg(
        F.count(F.lit(1)).alias("deliveries"),
        F.percentile_approx("_wait_us", 0.5).alias("ack_wait_p50_us"),
        F.percentile_approx("_wait_us", 0.95).alias("ack_wait_p95_us"),
        F.min("ts").alias("first_delivery_ts"),
        F.max(F.coalesce(F.col("_settled_ts"), F.col("ts"))).alias("last_settled_ts"),
    )


def _refills(consumer_unacked: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """Per consumer: acks that freed a slot of a full prefetch, and how many a delivery followed
    within refill_ms (the broker had a message waiting for that slot)."""
    window = _consumer_in_order()
    limit = F.coalesce(F.col("prefetch_count"), F.lit(0))
    freed = with_columns(consumer_unacked, [
        ("_was_full", (limit > 0) & (F.lag("unacked").over(window) >= limit)),
        ("_next_method", F.lead("method").over(window)),
        ("_next_us", F.lead(_us(F.col("ts"))).over(window)),
    ]).filter((F.col("settled") > 0) & F.col("_was_full"))
    refilled = (F.col("_next_method") == "basic.deliver") & (
        F.col("_next_us") - _us(F.col("ts")) <= F.lit(limits.refill_ms * 1000))
    return freed.groupBy(*_CONSUMER).agg(
        F.count(F.lit(1)).alias("slots_freed"),
        F.sum(refilled.cast("long")).alias("slots_refilled"),
        F.first("queue", ignorenulls=True).alias("queue"),
        F.max("prefetch_count").alias("prefetch_count"),
    )


def _held(flow_intervals: DataFrame, frames: DataFrame, entity: str, cause: str, keys: tuple[str, ...],
          where: Column | None = None) -> DataFrame:
    """Per entity: time spent in ``cause`` intervals (open ones until the connection's last frame),
    their count, and the first packets of their starts."""
    chosen = flow_intervals.filter((F.col("entity") == entity) & (F.col("cause") == cause))
    if where is not None:
        chosen = chosen.filter(where)
    with_end = chosen.join(_lifetimes(frames), ["capture_id", "connection_id"]).withColumn(
        "_end_ts", _held_until(F.col("end_ts"), F.col("conn_last_ts")))
    return with_end.groupBy(*keys).agg(
        F.sum(_us(F.col("_end_ts")) - _us(F.col("start_ts"))).alias("held_us"),
        F.count(F.lit(1)).alias("intervals"),
        F.percentile_approx(_us(F.col("_end_ts")) - _us(F.col("start_ts")), 0.5).alias("interval_p50_us"),
        F.min("start_ts").alias("start_ts"),
        F.max("_end_ts").alias("end_ts"),
        F.min("start_packet_number").alias("start_packet_number"),
        F.max(F.coalesce(F.col("end_packet_number"), F.col("start_packet_number"))).alias("end_packet_number"),
        _first_packets("start_packet_number").alias("packet_numbers"),
    )


def prefetch_bound_findings(flow_intervals: DataFrame, consumer_unacked: DataFrame, messages_091: DataFrame,
                            frames: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """AMQP 0-9-1 slow consumers: held at their prefetch most of the time they consume, acking slowly,
    while the broker refills every freed slot at once (the queue has messages waiting for them)."""
    held = _held(flow_intervals, frames, "consumer", "prefetch_full", _CONSUMER)
    stats = (held.join(_ack_latencies(messages_091, frames), list(_CONSUMER))
             .join(_refills(consumer_unacked, limits), list(_CONSUMER)))
    consuming_us = F.greatest(_us(F.col("last_settled_ts")) - _us(F.col("first_delivery_ts")), F.lit(1))
    share = F.least(F.lit(1.0), F.col("held_us") / consuming_us)
    refill_share = F.col("slots_refilled") / F.greatest(F.col("slots_freed"), F.lit(1))
    found = (stats.withColumn("_share", share).withColumn("_refill_share", refill_share)
             .filter((F.col("_share") >= limits.consumer_bound_share)
                     & (F.col("held_us") >= F.lit(limits.min_held_ms * 1000))
                     & (F.col("ack_wait_p50_us") >= F.lit(limits.slow_ack_ms * 1000))
                     & (F.col("_refill_share") >= limits.refill_share)))
    rate = F.col("deliveries") / (consuming_us / F.lit(1e6))
    return _candidate(
        found,
        rule_id=F.lit("diagnosis.consumer.prefetch_bound"),
        entity_kind=F.lit("consumer"),
        entity=F.col("consumer_tag"),
        component=F.lit("consumer"),
        effect=F.lit("deliveries_wait_for_acks"),
        severity=F.lit("warning"),
        duration_us=F.col("held_us"),
        lifetime_share=F.col("_share"),
        confidence=F.least(F.lit(0.9), F.lit(0.4) + F.lit(0.25) * F.col("_share") + F.lit(0.25) * F.col("_refill_share")),
        evidence=_figures(
            queue=F.col("queue"), prefetch_count=F.col("prefetch_count"), deliveries=F.col("deliveries"),
            at_prefetch_share=F.format_number(F.col("_share"), 3),
            at_prefetch_seconds=_seconds(F.col("held_us")),
            ack_wait_p50_ms=F.format_number(F.col("ack_wait_p50_us") / 1000, 1),
            ack_wait_p95_ms=F.format_number(F.col("ack_wait_p95_us") / 1000, 1),
            slots_freed=F.col("slots_freed"), slots_refilled_at_once=F.col("slots_refilled"),
            deliveries_per_second=F.format_number(rate, 1)),
        explanation=F.concat(
            F.lit("Consumer "), F.col("consumer_tag"), F.lit(" on queue "), F.coalesce(F.col("queue"), F.lit("?")),
            F.lit(" held its "), F.col("prefetch_count").cast("string"), F.lit(" prefetch slots full "),
            F.format_number(F.col("_share") * 100, 0), F.lit("% of the time it consumed, acking each delivery after "),
            F.format_number(F.col("ack_wait_p50_us") / 1000, 1),
            F.lit(" ms on median while the broker refilled every freed slot at once: the consumer, at "),
            F.format_number(rate, 1), F.lit(" messages/s, is slower than its queue is fed.")),
    )


# -- AMQP 1.0 receiving links held at credit 0 --------------------------------------------------

_LINK = ("capture_id", "connection_id", "link_name", "sender_side")


def _link_in_order() -> WindowSpec:
    """One link's state timeline in order: what follows each credit grant."""
    return Window.partitionBy(*_LINK).orderBy("frame_index")


def _link_after_row() -> WindowSpec:
    """The rows of a link after each row: the next delivery after a credit grant."""
    return _link_in_order().rowsBetween(1, Window.unboundedFollowing)


def _credit_grants(link_state: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """Per link: the receiver's flows that lifted the sender's credit from 0, and how many a new
    delivery followed within refill_ms (the sender had a message waiting for it)."""
    window = _link_in_order()
    grants = (
        link_state
        .withColumn("_credit_before", F.lag("link_credit_snd").over(window))
        # The next delivery, whatever comes between (RabbitMQ answers a flow with a flow of its own).
        .withColumn("_next_us", F.first(F.when(F.col("is_new_delivery"), _us(F.col("ts"))), ignorenulls=True)
                    .over(_link_after_row()))
        .filter((F.col("method") == "flow") & (F.col("role") == "receiver")
                & (F.col("_credit_before") <= 0) & (F.col("link_credit_snd") > 0))
    )
    used = F.coalesce(F.col("_next_us") - _us(F.col("ts")) <= F.lit(limits.refill_ms * 1000), F.lit(False))
    return grants.groupBy(*_LINK).agg(
        F.count(F.lit(1)).alias("grants"),
        F.sum(used.cast("long")).alias("grants_used_at_once"),
        F.percentile_approx("link_credit_rcv", 0.5).alias("credit_granted_p50"),
    )


def _link_activity(link_state: DataFrame) -> DataFrame:
    """Per link: deliveries and the time from the first grant to the last delivery."""
    return link_state.groupBy(*_LINK).agg(
        F.sum(F.col("is_new_delivery").cast("long")).alias("deliveries"),
        F.min(F.when((F.col("method") == "flow") & (F.col("role") == "receiver"), F.col("ts"))).alias("first_grant_ts"),
        F.max(F.when(F.col("method") == "transfer", F.col("ts"))).alias("last_transfer_ts"),
        F.first(F.coalesce(F.col("source_address"), F.col("target_address")), ignorenulls=True).alias("queue"),
        F.first("channel", ignorenulls=True).alias("channel"),
    )


def credit_bound_findings(flow_intervals: DataFrame, link_state: DataFrame, frames: DataFrame,
                          limits: DiagnosisThresholds) -> DataFrame:
    """AMQP 1.0 slow receivers: a link from the broker whose credit sits at 0 most of the time it
    delivers, the receiver granting credit slowly while every grant is used at once (messages wait)."""
    starved = (F.col("direction") == "s2c") & ~F.coalesce(F.col("detail"), F.lit("")).startswith("no flow")
    keys = ("capture_id", "connection_id", "link_name")
    held = _held(flow_intervals, frames, "link", "link_credit_exhausted", keys, starved)
    # The link's own frames: link_state also has a row per disposition that settled its deliveries.
    receiving = link_state.filter((F.col("sender_side") == "server") & (F.col("method") != "disposition"))
    stats = (held.join(_link_activity(receiving), list(keys))
             .join(_credit_grants(receiving, limits), list(_LINK)))
    active_us = F.greatest(_us(F.col("last_transfer_ts")) - _us(F.col("first_grant_ts")), F.lit(1))
    share = F.least(F.lit(1.0), F.col("held_us") / active_us)
    used_share = F.col("grants_used_at_once") / F.greatest(F.col("grants"), F.lit(1))
    found = (stats.withColumn("_share", share).withColumn("_used_share", used_share)
             .filter((F.col("_share") >= limits.consumer_bound_share)
                     & (F.col("held_us") >= F.lit(limits.min_held_ms * 1000))
                     & (F.col("interval_p50_us") >= F.lit(limits.slow_ack_ms * 1000))
                     & (F.col("_used_share") >= limits.refill_share)))
    rate = F.col("deliveries") / (active_us / F.lit(1e6))
    return _candidate(
        found,
        rule_id=F.lit("diagnosis.consumer.credit_bound"),
        entity_kind=F.lit("link"),
        entity=F.col("link_name"),
        component=F.lit("consumer"),
        effect=F.lit("credit_starved"),
        severity=F.lit("warning"),
        duration_us=F.col("held_us"),
        lifetime_share=F.col("_share"),
        confidence=F.least(F.lit(0.9), F.lit(0.4) + F.lit(0.25) * F.col("_share") + F.lit(0.25) * F.col("_used_share")),
        evidence=_figures(
            address=F.col("queue"), deliveries=F.col("deliveries"), credit_granted_p50=F.col("credit_granted_p50"),
            at_zero_credit_share=F.format_number(F.col("_share"), 3), at_zero_credit_seconds=_seconds(F.col("held_us")),
            zero_credit_p50_ms=F.format_number(F.col("interval_p50_us") / 1000, 1),
            grants=F.col("grants"), grants_used_at_once=F.col("grants_used_at_once"),
            deliveries_per_second=F.format_number(rate, 1)),
        explanation=F.concat(
            F.lit("Receiving link "), F.col("link_name"), F.lit(" from "), F.coalesce(F.col("queue"), F.lit("?")),
            F.lit(" sat at link-credit 0 for "), F.format_number(F.col("_share") * 100, 0),
            F.lit("% of the time it delivered, waiting "), F.format_number(F.col("interval_p50_us") / 1000, 1),
            F.lit(" ms on median for the receiver's next flow, and the broker used every grant at once: the receiver, at "),
            F.format_number(rate, 1), F.lit(" messages/s, grants credit slower than the queue could deliver.")),
    )


# -- TCP: who cannot send ---------------------------------------------------------------------


def _direction_in_order() -> WindowSpec:
    """One direction's segments in capture order: when the sender sends again after a full window."""
    return Window.partitionBy("capture_id", "connection_id", "direction").orderBy("packet_number")


def _stalls(tcp_flow: DataFrame, direction: str) -> DataFrame:
    """Per connection: times the sender in ``direction`` filled the peer's receive window or met a
    zero window, and the time until it sent new payload again (the stall), summed."""
    window = _direction_in_order()
    payload = tcp_flow.filter((F.col("direction") == direction) & (F.col("payload_length") > 0)
                              & ~F.col("is_retransmission"))
    stalled = F.col("is_window_full") | F.col("is_zero_window_probe")
    marked = (payload.withColumn("_next_us", F.lead(F.col("ts_us")).over(window))
              .withColumn("_stall_us", F.when(stalled, F.coalesce(F.col("_next_us") - F.col("ts_us"), F.lit(0)))))
    return marked.groupBy("capture_id", "connection_id").agg(
        F.sum(stalled.cast("long")).alias("stalls"),
        F.coalesce(F.sum("_stall_us"), F.lit(0)).alias("stall_us"),
        F.min(F.when(stalled, F.col("ts"))).alias("stall_first_ts"),
        F.max(F.when(stalled, F.col("ts"))).alias("stall_last_ts"),
        F.min(F.when(stalled, F.col("packet_number"))).alias("stall_first_packet"),
        F.max(F.when(stalled, F.col("packet_number"))).alias("stall_last_packet"),
        F.slice(F.array_sort(F.collect_set(F.when(stalled, F.col("packet_number")))), 1, _MAX_PACKETS)
        .alias("stall_packets"),
        F.min("payload_length").alias("_min_payload"),
    )


def _zero_windows(flow_intervals: DataFrame, frames: DataFrame, direction: str) -> DataFrame:
    """Per connection: time the sender in ``direction`` faced a zero window from its peer."""
    return _held(flow_intervals, frames, "tcp", "tcp_zero_window", ("capture_id", "connection_id"),
                 F.col("direction") == direction).select(
        "capture_id", "connection_id", F.col("held_us").alias("zero_window_us"),
        F.col("intervals").alias("zero_windows"), F.col("start_ts").alias("zero_first_ts"),
        F.col("end_ts").alias("zero_last_ts"), F.col("start_packet_number").alias("zero_first_packet"),
        F.col("end_packet_number").alias("zero_last_packet"), F.col("packet_numbers").alias("zero_packets"))


def _pressure(tcp_flow: DataFrame, flow_intervals: DataFrame, frames: DataFrame, direction: str) -> DataFrame:
    """Per connection: stalls and zero windows met by the sender in ``direction``, combined."""
    stalls = _stalls(tcp_flow, direction)
    zeros = _zero_windows(flow_intervals, frames, direction)
    combined = (stalls.join(zeros, ["capture_id", "connection_id"], "full")
                .fillna(0, subset=["stalls", "stall_us", "zero_window_us", "zero_windows"]))
    return with_columns(combined, [
        ("held_us", F.col("stall_us") + F.col("zero_window_us")),
        ("start_ts", F.least("stall_first_ts", "zero_first_ts")),
        ("end_ts", F.greatest("stall_last_ts", "zero_last_ts")),
        ("start_packet_number", F.least("stall_first_packet", "zero_first_packet")),
        ("end_packet_number", F.greatest("stall_last_packet", "zero_last_packet")),
        ("packet_numbers", F.slice(F.array_sort(F.array_distinct(F.concat(
            F.coalesce(F.col("zero_packets"), F.array().cast("array<long>")),
            F.coalesce(F.col("stall_packets"), F.array().cast("array<long>"))))), 1, _MAX_PACKETS)),
    ])


def client_not_reading_findings(tcp_flow: DataFrame, flow_intervals: DataFrame, frames: DataFrame,
                                limits: DiagnosisThresholds) -> DataFrame:
    """Clients whose receive window stopped the broker: zero windows and full windows met by the
    broker's sends for at least client_window_closed_share of the time it was sending."""
    pressure = _pressure(tcp_flow, flow_intervals, frames, "s2c")
    sending = (frames.filter(F.col("direction") == "s2c").groupBy("capture_id", "connection_id")
               .agg(F.min("ts").alias("_first"), F.max("ts").alias("_last")))
    stats = pressure.join(sending, ["capture_id", "connection_id"])
    span = F.greatest(_us(F.col("_last")) - _us(F.col("_first")), F.lit(1))
    share = F.least(F.lit(1.0), F.col("held_us") / span)
    found = (stats.withColumn("_share", share)
             .filter((F.col("held_us") >= F.lit(limits.min_held_ms * 1000))
                     & (F.col("_share") >= limits.client_window_closed_share)))
    return _candidate(
        found,
        rule_id=F.lit("diagnosis.client.not_reading"),
        entity_kind=F.lit("connection"),
        component=F.lit("client"),
        effect=F.lit("client_not_reading"),
        severity=F.lit("warning"),
        duration_us=F.col("held_us"),
        lifetime_share=F.col("_share"),
        confidence=F.least(F.lit(0.9), F.lit(0.5) + F.lit(0.4) * F.col("_share")),
        evidence=_figures(zero_windows=F.col("zero_windows"), zero_window_seconds=_seconds(F.col("zero_window_us")),
                          window_full_stalls=F.col("stalls"), stall_seconds=_seconds(F.col("stall_us")),
                          held_share=F.format_number(F.col("_share"), 3)),
        explanation=F.concat(
            F.lit("The client did not read its socket fast enough: its TCP receive window was full or closed for "),
            _seconds(F.col("held_us")), F.lit(" s ("), F.format_number(F.col("_share") * 100, 0),
            F.lit("% of the time the broker was sending), so the broker could not deliver to it.")),
    )


def network_findings(tcp_flow: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """Connections losing packets: retransmitted bytes above retransmission_share of their payload."""
    stats = tcp_flow.groupBy("capture_id", "connection_id").agg(
        F.sum("payload_length").alias("_bytes"),
        F.sum("retransmitted_bytes").alias("_retransmitted"),
        F.sum(F.col("is_retransmission").cast("long")).alias("_segments"),
        F.min(F.when(F.col("is_retransmission"), F.col("ts"))).alias("start_ts"),
        F.max(F.when(F.col("is_retransmission"), F.col("ts"))).alias("end_ts"),
        F.min(F.when(F.col("is_retransmission"), F.col("packet_number"))).alias("start_packet_number"),
        F.max(F.when(F.col("is_retransmission"), F.col("packet_number"))).alias("end_packet_number"),
        F.slice(F.array_sort(F.collect_set(F.when(F.col("is_retransmission"), F.col("packet_number")))), 1,
                _MAX_PACKETS).alias("packet_numbers"),
        F.min("ts").alias("_first"), F.max("ts").alias("_last"),
    )
    share = F.col("_retransmitted") / F.greatest(F.col("_bytes"), F.lit(1))
    found = stats.withColumn("_share", share).filter((F.col("_retransmitted") > 0) & (F.col("_share") >= limits.retransmission_share))
    return _candidate(
        found,
        rule_id=F.lit("diagnosis.network.retransmission"),
        entity_kind=F.lit("connection"),
        component=F.lit("network"),
        effect=F.lit("retransmission"),
        severity=F.lit("warning"),
        duration_us=_us(F.col("end_ts")) - _us(F.col("start_ts")),
        lifetime_share=F.least(F.lit(1.0), (_us(F.col("end_ts")) - _us(F.col("start_ts")))
                               / F.greatest(_us(F.col("_last")) - _us(F.col("_first")), F.lit(1))),
        confidence=F.least(F.lit(0.9), F.lit(0.5) + F.col("_share") * 10),
        evidence=_figures(retransmitted_bytes=F.col("_retransmitted"), payload_bytes=F.col("_bytes"),
                          retransmitted_segments=F.col("_segments"),
                          retransmitted_share=F.format_number(F.col("_share"), 4)),
        explanation=F.concat(
            F.lit("The network lost packets: "), F.col("_retransmitted").cast("string"),
            F.lit(" bytes ("), F.format_number(F.col("_share") * 100, 2),
            F.lit("% of the connection's payload) were sent again, and every loss stalls the stream behind it.")),
    )


# -- publishers throttled by credit flow --------------------------------------------------------


def _publishing(messages_091: DataFrame, frames: DataFrame) -> DataFrame:
    """Per connection that publishes: its publishing span, what it publishes, on which channels."""
    published_091 = messages_091.filter(F.col("method") == "basic.publish").select(
        "capture_id", "connection_id", "channel", "ts", "body_size",
        (F.col("delivery_mode") == 2).alias("_persistent"),
        F.concat_ws("/", F.coalesce(F.col("exchange"), F.lit("")), F.coalesce(F.col("routing_key"), F.lit("")))
        .alias("_destination"))
    published_10 = frames.filter((F.col("protocol") == "amqp-1.0") & (F.col("method") == "transfer")
                                 & (F.col("direction") == "c2s") & F.col("message_size").isNotNull()).select(
        "capture_id", "connection_id", "channel", "ts", F.col("message_size").alias("body_size"),
        F.lit(None).cast("boolean").alias("_persistent"), F.coalesce(F.col("to_address"), F.lit("")).alias("_destination"))
    published = published_091.unionByName(published_10)
    return published.groupBy("capture_id", "connection_id").agg(
        F.count(F.lit(1)).alias("publishes"),
        F.min("ts").alias("publish_first_ts"),
        F.max("ts").alias("publish_last_ts"),
        F.percentile_approx("body_size", 0.5).alias("body_size_p50"),
        F.avg(F.coalesce(F.col("_persistent"), F.lit(False)).cast("double")).alias("persistent_share"),
        F.array_sort(F.collect_set("channel")).alias("publish_channels"),
        F.array_sort(F.collect_set("_destination")).alias("destinations"),
    )


def _topic_pattern(binding_key: Column) -> Column:
    """A topic binding key as a regular expression: '*' one word, '#' zero or more (AMQP 0-9-1 3.1.3.3)."""
    words = F.regexp_replace(F.regexp_replace(binding_key, r"([.\\^$|?+()\[\]{}])", r"\\$1"), r"\*", "[^.]+")
    return F.concat(F.lit("^"), F.regexp_replace(words, "#", ".*"), F.lit("$"))


def _unrouted_share(messages_091: DataFrame, frames: DataFrame) -> DataFrame:
    """Per publishing connection: the share of its publishes to an exchange whose declaration and
    bindings the capture holds and none of which routes them to a queue. Such a publisher gives its
    channel all the work (routing) and no queue any: the channel is the only stage it can load."""
    declared = frames.filter(F.col("method") == "exchange.declare").select(
        "capture_id", "exchange", F.col("arguments")["type"].alias("_type")).distinct()
    bindings = frames.filter(F.col("method") == "queue.bind").select(
        "capture_id", "exchange", F.col("routing_key").alias("_binding_key")).distinct()
    publishes = messages_091.filter((F.col("method") == "basic.publish") & (F.col("exchange") != "")).select(
        "capture_id", "connection_id", "frame_index", "exchange", "routing_key")
    known = publishes.join(declared, ["capture_id", "exchange"])
    matches = (F.col("_type") == "fanout") | (F.col("_type") == "headers") | (
        (F.col("_type") == "direct") & (F.col("_binding_key") == F.col("routing_key"))) | (
        # Column.rlike takes a literal pattern only (PySpark 4.0); regexp_like the same regex from a column.
        (F.col("_type") == "topic") & F.regexp_like(F.col("routing_key"), _topic_pattern(F.col("_binding_key"))))
    routed = (known.join(bindings, ["capture_id", "exchange"], "left")
              .groupBy("capture_id", "connection_id", "frame_index")
              .agg(F.max(F.coalesce(matches, F.lit(False)).cast("int")).alias("_routed")))
    every = messages_091.filter(F.col("method") == "basic.publish").groupBy("capture_id", "connection_id").agg(
        F.count(F.lit(1)).alias("_publishes"))
    unrouted = routed.filter(F.col("_routed") == 0).groupBy("capture_id", "connection_id").agg(
        F.count(F.lit(1)).alias("_unrouted"))
    return every.join(unrouted, ["capture_id", "connection_id"], "left").select(
        "capture_id", "connection_id",
        (F.coalesce(F.col("_unrouted"), F.lit(0)) / F.col("_publishes")).alias("unrouted_share"))


def _shared_throttling(throttled: DataFrame) -> DataFrame:
    """Per throttled connection: other throttled connections of the capture publishing to a
    destination it shares (a queue slows every publisher feeding it; a channel only its own). Their
    stalls need not overlap: under credit flow each reader is blocked and unblocked many times a
    second (the seeds saw ~80), so two publishers' closed windows rarely coincide to the packet."""
    mine = throttled.select("capture_id", "connection_id", F.explode("destinations").alias("_dest"))
    theirs = mine.select("capture_id", F.col("connection_id").alias("_other"), "_dest")
    overlapping = (mine.join(theirs, ["capture_id", "_dest"]).filter(F.col("_other") != F.col("connection_id")))
    return overlapping.groupBy("capture_id", "connection_id").agg(
        F.countDistinct("_other").alias("co_throttled_publishers"))


def _publish_span_us() -> Column:
    return F.greatest(_us(F.col("publish_last_ts")) - _us(F.col("publish_first_ts")), F.lit(1))


def throttled_publishers(tcp_flow: DataFrame, flow_intervals: DataFrame, messages_091: DataFrame,
                         frames: DataFrame, connection_blocked: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """Publishers the broker reads slower than they send (its reader held by credit flow, DOMAIN.md
    section 5): the broker's receive window full or closed for at least publisher_throttled_share
    of the publishing time, or at least min_window_stalls stalls a second, outside any alarm. One row
    per connection: its TCP pressure, its publishing and ``_share`` / ``_stall_rate``."""
    pressure = _pressure(tcp_flow, flow_intervals, frames, "c2s")
    alarmed = connection_blocked.select("capture_id", "connection_id").distinct()
    stats = (pressure.join(_publishing(messages_091, frames), ["capture_id", "connection_id"])
             .join(alarmed, ["capture_id", "connection_id"], "left_anti"))
    span_us = _publish_span_us()
    share = F.least(F.lit(1.0), F.col("held_us") / span_us)
    stalls_per_second = F.col("stalls") / (span_us / F.lit(1e6))
    return (stats.withColumns({"_share": share, "_stall_rate": stalls_per_second})
            .filter(((F.col("_share") >= limits.publisher_throttled_share)
                     | (F.col("_stall_rate") >= F.lit(float(limits.min_window_stalls))))
                    & (F.col("held_us") >= F.lit(limits.min_held_ms * 1000))))


def publisher_throttled_findings(throttled: DataFrame, messages_091: DataFrame, frames: DataFrame,
                                 limits: DiagnosisThresholds) -> DataFrame:
    """A finding per throttled publisher (``throttled_publishers``), naming the stage behind it from
    what the wire shows: persistent messages of message_store_min_bytes and more -> message_store;
    other connections to the same destination throttled at the same time, or persistent small
    messages -> queue; publishes that no captured binding routes to a queue, or else -> channel (the
    connection's own processes).
    """
    span_us = _publish_span_us()
    shared = _shared_throttling(throttled)
    # Only the throttled connections' publishes are routed again (a broadcast of a few rows).
    throttled_ids = F.broadcast(throttled.select("capture_id", "connection_id"))
    routing = _unrouted_share(messages_091.join(throttled_ids, ["capture_id", "connection_id"], "left_semi"), frames)
    found = (throttled.join(shared, ["capture_id", "connection_id"], "left")
             .join(routing, ["capture_id", "connection_id"], "left")
             .fillna(0, subset=["co_throttled_publishers", "unrouted_share"]))
    persistent = F.col("persistent_share") >= 0.5
    large = F.col("body_size_p50") >= F.lit(limits.message_store_min_bytes)
    unrouted = F.col("unrouted_share") >= 0.5
    component = (F.when(persistent & large, "message_store")
                 .when(unrouted, "channel")
                 .when(persistent | (F.col("co_throttled_publishers") > 0), "queue")
                 .otherwise("channel"))
    reason = (F.when(persistent & large, F.concat(
                  F.lit("persistent messages of "), F.col("body_size_p50").cast("string"),
                  F.lit(" bytes on median go to the message store (disk)")))
              .when(unrouted, F.concat(
                  F.format_number(F.col("unrouted_share") * 100, 0),
                  F.lit("% of its publishes match no binding of the exchange the capture saw declared, so no queue "
                        "takes them: routing in its channel is all the work there is")))
              .when(F.col("co_throttled_publishers") > 0, F.concat(
                  F.col("co_throttled_publishers").cast("string"),
                  F.lit(" other connection(s) publishing to the same destination were throttled too, so a queue they share is slow")))
              .when(persistent, F.lit("persistent messages make each queue write its index"))
              .otherwise(F.lit("no other publisher to its destinations was throttled, so this connection's channel (routing) is the slow stage")))
    return _candidate(
        found,
        rule_id=F.lit("diagnosis.publisher.credit_flow"),
        entity_kind=F.lit("connection"),
        component=component,
        effect=F.lit("publisher_throttled"),
        severity=F.lit("warning"),
        duration_us=F.col("held_us"),
        lifetime_share=F.col("_share"),
        confidence=F.when(persistent & large, 0.55).when(unrouted, 0.6).when(F.col("co_throttled_publishers") > 0, 0.55)
        .when(persistent, 0.45).otherwise(0.4),
        evidence=_figures(
            publishes=F.col("publishes"), publish_seconds=_seconds(span_us),
            window_full_stalls=F.col("stalls"), stall_seconds=_seconds(F.col("stall_us")),
            zero_windows=F.col("zero_windows"), zero_window_seconds=_seconds(F.col("zero_window_us")),
            throttled_share=F.format_number(F.col("_share"), 3),
            stalls_per_second=F.format_number(F.col("_stall_rate"), 1),
            body_size_p50=F.col("body_size_p50"), persistent_share=F.format_number(F.col("persistent_share"), 2),
            co_throttled_publishers=F.col("co_throttled_publishers"),
            unrouted_share=F.format_number(F.col("unrouted_share"), 2),
            publish_channels=F.array_join(F.col("publish_channels").cast("array<string>"), ","),
            destinations=F.array_join(F.slice(F.col("destinations"), 1, 5), ",")),
        explanation=F.concat(
            F.lit("The broker read this publisher slower than it sent: it filled the broker's receive window "),
            F.col("stalls").cast("string"), F.lit(" times and met a closed window for "),
            _seconds(F.col("zero_window_us")), F.lit(" s, held back "), F.format_number(F.col("_share") * 100, 0),
            F.lit("% of its publishing time (RabbitMQ's reader in credit flow); "), reason, F.lit(".")),
    )


def head_of_line_findings(publishers: DataFrame, messages_091: DataFrame) -> DataFrame:
    """AMQP 0-9-1 head-of-line blocking: consumers on a connection whose publisher is throttled. The
    broker stops reading the whole socket, so their acks wait behind the publishes and their
    deliveries slow with them (DOMAIN.md section 5; the seeds measured 73x lower consumption)."""
    deliveries = messages_091.filter(F.col("method") == "basic.deliver")
    consumers = deliveries.groupBy("capture_id", "connection_id", "channel", "consumer_tag").agg(
        F.count(F.lit(1)).alias("_deliveries"),
        F.min("ts").alias("_first"), F.max("ts").alias("_last"))
    throttled = publishers.select(
        "capture_id", "connection_id", "component", "start_ts", "end_ts", "start_packet_number", "end_packet_number",
        "duration_us", "lifetime_share", "packet_numbers", F.col("confidence").alias("_confidence"),
        F.col("evidence")["publish_channels"].alias("_publish_channels"))
    found = (consumers.join(throttled, ["capture_id", "connection_id"])
             .filter((F.col("_first") <= F.col("end_ts")) & (F.col("_last") >= F.col("start_ts"))
                     & ~F.array_contains(F.split(F.col("_publish_channels"), ","), F.col("channel").cast("string"))))
    return _candidate(
        found,
        rule_id=F.lit("diagnosis.connection.head_of_line"),
        entity_kind=F.lit("consumer"),
        entity=F.col("consumer_tag"),
        effect=F.lit("head_of_line"),
        severity=F.lit("warning"),
        confidence=F.col("_confidence") * 0.9,
        evidence=_figures(publisher_channels=F.col("_publish_channels"), consumer_channel=F.col("channel"),
                          deliveries=F.col("_deliveries")),
        explanation=F.concat(
            F.lit("Consumer "), F.col("consumer_tag"), F.lit(" on channel "), F.col("channel").cast("string"),
            F.lit(" shares its connection with the throttled publisher on channel(s) "), F.col("_publish_channels"),
            F.lit(": while the broker stops reading the socket its acks wait behind the publishes, so its deliveries "
                  "slow down too (AMQP 0-9-1 head-of-line blocking; a separate connection for consuming avoids it).")),
    )


# -- all findings, named and ranked -------------------------------------------------------------


def connection_names(frames: DataFrame, connections: DataFrame) -> DataFrame:
    """Per connection: the client's address:port and the name it gave itself (0-9-1
    client-properties connection_name, else its product; 1.0 the client's open container-id)."""
    properties = F.col("arguments")["client-properties"]
    named_091 = frames.filter((F.col("method") == "connection.start-ok") & (F.col("direction") == "c2s")).select(
        "capture_id", "connection_id",
        F.coalesce(F.get_json_object(properties, "$.connection_name"),
                   F.get_json_object(properties, "$.product")).alias("_name"))
    named_10 = frames.filter((F.col("protocol") == "amqp-1.0") & (F.col("method") == "open")
                             & (F.col("direction") == "c2s")).select("capture_id", "connection_id",
                                                                    F.col("container_id").alias("_name"))
    names = named_091.unionByName(named_10).groupBy("capture_id", "connection_id").agg(
        F.first("_name", ignorenulls=True).alias("connection_name"))
    client = F.when(F.col("client_address").contains(":"),
                    F.concat(F.lit("["), F.col("client_address"), F.lit("]:"), F.col("client_port").cast("string"))
                    ).otherwise(F.concat_ws(":", F.col("client_address"), F.col("client_port").cast("string")))
    return connections.select("capture_id", "connection_id", client.alias("client"), "client_port").join(
        names, ["capture_id", "connection_id"], "left")


def _wireshark_filter() -> Column:
    """tcp.port of the client (ports are unique per connection on one host) and the listed packets."""
    packets = F.array_join(F.col("packet_numbers").cast("array<string>"), " ")
    port = F.concat(F.lit("tcp.port == "), F.col("client_port").cast("string"))
    listed = F.concat(F.lit("frame.number in {"), packets, F.lit("}"))
    return (F.when(F.col("client_port").isNotNull() & (F.size("packet_numbers") > 0), F.concat(port, F.lit(" && "), listed))
            .when(F.col("client_port").isNotNull(), port)
            .when(F.size("packet_numbers") > 0, listed)
            .otherwise(F.lit("amqp")))


# Which findings answer "why is the broker slow?" first: a resource alarm stops every publisher; the
# credit-flow stages are the broker's own; a slow consumer or client is the application's; packet
# loss is below all of them (and on a loaded host even loopback drops packets).
_COMPONENT_PRIORITY = {"memory_alarm": 0, "disk_alarm": 0, "alarm": 0, "connection": 1, "channel": 1, "queue": 1,
                       "message_store": 1, "consumer": 2, "client": 2, "network": 3}


def _rank_in_capture() -> WindowSpec:
    """A capture's findings, most consequential first: by component (alarms, then the broker's
    credit-flow stages, then consumers and clients, then the network), then by time held back
    weighted by confidence."""
    priority = F.coalesce(F.element_at(F.create_map(*[F.lit(x) for kv in _COMPONENT_PRIORITY.items() for x in kv]),
                                       F.col("component")), F.lit(len(_COMPONENT_PRIORITY)))
    return Window.partitionBy("capture_id").orderBy(
        F.col("severity").asc(), priority.asc(), (F.col("duration_us") * F.col("confidence")).desc(),
        F.col("start_packet_number").asc(), F.col("rule_id").asc(), F.col("entity").asc())


def bottleneck_findings(
    *,
    frames: DataFrame,
    connections: DataFrame,
    messages_091: DataFrame,
    flow_intervals: DataFrame,
    consumer_unacked: DataFrame,
    link_state: DataFrame,
    connection_blocked: DataFrame,
    tcp_flow: DataFrame,
    limits: DiagnosisThresholds = DiagnosisThresholds(),
) -> DataFrame:
    """The bottlenecks table (``schemas.diagnosis.BOTTLENECKS_SCHEMA``): every rule's findings,
    named as an operator knows the entity and ranked per capture."""
    from amqpscope.pipelines.encrypted import encrypted_connection_findings  # it builds on this module's measures

    rules = [
        alarm_findings(connection_blocked, frames, limits),
        incoming_window_findings(flow_intervals, frames, limits),
        prefetch_bound_findings(flow_intervals, consumer_unacked, messages_091, frames, limits),
        credit_bound_findings(flow_intervals, link_state, frames, limits),
        client_not_reading_findings(tcp_flow, flow_intervals, frames, limits),
        network_findings(tcp_flow, limits),
        encrypted_connection_findings(tcp_flow, connections, limits),
    ]
    # The throttled publishers are computed once, here: the publisher and head-of-line rules and
    # the throttling shared between publishers all start from these few rows, and a capture without
    # any (most) needs neither rule planned (the two were 44 of the 150 query stages on the sample).
    throttled = throttled_publishers(tcp_flow, flow_intervals, messages_091, frames, connection_blocked,
                                     limits).localCheckpoint()
    if not throttled.isEmpty():
        publishers = publisher_throttled_findings(throttled, messages_091, frames, limits).localCheckpoint()
        rules += [publishers, head_of_line_findings(publishers, messages_091)]
    candidates = reduce(DataFrame.unionByName, rules)
    named = candidates.join(connection_names(frames, connections), ["capture_id", "connection_id"], "left")
    default_entity = F.coalesce(
        F.when(F.col("entity_kind") == "session", F.concat(
            F.coalesce(F.col("connection_name"), F.col("client")), F.lit(" channel "), F.col("channel").cast("string"))),
        F.when(F.col("connection_name").isNotNull(),
               F.concat(F.col("connection_name"), F.lit(" ("), F.col("client"), F.lit(")"))),
        F.col("client"), F.col("connection_id"))
    finding_id = F.substring(F.sha2(F.concat_ws(
        "|", "capture_id", "rule_id", "connection_id", "entity_kind", F.coalesce(F.col("entity"), F.lit("")),
        F.col("start_packet_number").cast("string")), 256), 1, 16)
    shaped = with_columns(named, [
        ("entity", F.coalesce(F.col("entity"), default_entity)),
        ("finding_id", finding_id),
        ("wireshark_filter", _wireshark_filter()),
        ("rank", F.row_number().over(_rank_in_capture())),
    ])
    return shaped.select(*[F.col(f.name).cast(f.dataType) for f in BOTTLENECKS_SCHEMA.fields])
