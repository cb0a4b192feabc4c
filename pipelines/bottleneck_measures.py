"""The measures the bottleneck rules read (expectations/bottlenecks.yml): pure functions from the
flow-state tables to one row per entity with the figures a rule tests.

Every measure returns rows in one shape, whatever the entity, so that one engine
(``pipelines.bottlenecks``) turns any of them into findings:

| column | meaning |
|---|---|
| capture_id, connection_id | where |
| channel, consumer_tag, link_name, queue | the entity's names, where they apply |
| start_ts, end_ts, start_packet_number, end_packet_number | when it was held back (end null: until the capture ends) |
| held_us | the union of the intervals that held it back, within ``span_us`` |
| span_us | the time it was active: the denominator of its share |
| packet_numbers | up to 20 packets where it was held back |
| packet_filter | a Wireshark field filter naming exactly those packets (else null: frame numbers are listed) |

plus the figures each rule names (``held_share``, ``window``, ...). A measure shared by several
rules is computed once per run (``Measures``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.pipelines.churn import channel_churn, connection_churn
from amqpscope.pipelines.consumer_window import consumer_windows
from amqpscope.pipelines.held import MAX_PACKETS, clipped, first_packets, held_time, merged_intervals, timestamp
from amqpscope.pipelines.link_capacity import bandwidth_limited
from amqpscope.pipelines.messages import deliveries_10, settlement_times
from amqpscope.pipelines.partitioning import kept, next_value
from amqpscope.pipelines.publisher_problems import closes_with_error, publish_refusals, unroutable_returns
from amqpscope.pipelines.publishing import publish_routes, publishing, queue_declarations
from amqpscope.pipelines.queue_depth import depth_events
from amqpscope.pipelines.queue_measures import (
    consumer_acks,
    neighbour_speeds,
    redeliveries,
    transfer_settlement,
    unconsumed_queues,
)
from amqpscope.pipelines.round_trips import request_reply
from amqpscope.pipelines.tcp_pressure import (
    retransmission_recovery,
    window_limited_gaps,
    zero_windows,
    zero_windows_advertised,
)

_CONNECTION = ("capture_id", "connection_id")
_LOOPBACK = ("127.", "::1", "::ffff:127.")


@dataclass(frozen=True)
class Tables:
    """The tables the diagnosis reads, by name."""

    frames: DataFrame
    connections: DataFrame
    messages_091: DataFrame
    flow_intervals: DataFrame
    consumer_unacked: DataFrame
    link_state: DataFrame
    connection_blocked: DataFrame
    channel_confirms: DataFrame
    tcp_flow: DataFrame
    # AMQP 1.0 deliveries with their settlements (the deliveries_10 table); drawn from the frames
    # when not given.
    deliveries_10: DataFrame | None = None


def _us(ts: Column | str) -> Column:
    return F.unix_micros(F.col(ts) if isinstance(ts, str) else ts)


def _share(part: str, whole: str) -> Column:
    return F.col(part) / F.greatest(F.col(whole), F.lit(1))


def _per_second(count: str, low: str, high: str) -> Column:
    """``count`` over the seconds from ``low`` to ``high`` (microseconds); null for an empty span."""
    seconds = (F.col(high) - F.col(low)) / F.lit(1e6)
    return F.when(seconds > 0, F.col(count) / seconds)


def _apart(rows: DataFrame) -> DataFrame:
    """``rows`` under new column identities: the right side of a join with a table it was derived
    from (the same columns, traced to the same plan) is otherwise a self-join Spark may fail to
    resolve ("Failure when resolving conflicting references in Join")."""
    return rows.select(*[F.col(f"`{name}`").alias(name) for name in rows.columns])


def _listed(packets: Column) -> Column:
    return F.slice(F.array_sort(F.array_distinct(packets)), 1, MAX_PACKETS)


# The columns of a window-pressure measure after its entity's (``_window_pressure``).
_PRESSURE_COLUMNS = (
    "held_us",
    "held_intervals",
    "zero_window_us",
    "zero_windows",
    "span_us",
    "held_share",
    "start_ts",
    "end_ts",
    "start_packet_number",
    "end_packet_number",
    "packet_numbers",
)


def _window_pressure(held: DataFrame, zero: DataFrame, sending: DataFrame) -> DataFrame:
    """Per connection of ``sending`` (``_low`` to ``_high``: the µs it was sending): the union of the
    ``held`` intervals (a peer's window holding it back) and of the ``zero`` ones (zero windows alone)
    within that time, the span, the share held and the packets (``_PRESSURE_COLUMNS``)."""

    def within(intervals: DataFrame) -> DataFrame:
        joined = intervals.join(sending, list(_CONNECTION))
        return held_time(clipped(joined, F.col("_low"), F.col("_high")), _CONNECTION)

    zero_time = within(zero).select(
        *_CONNECTION, F.col("held_us").alias("zero_window_us"), F.col("held_intervals").alias("zero_windows")
    )
    span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
    return (
        within(held)
        .join(sending, list(_CONNECTION))
        .join(zero_time, list(_CONNECTION), "left")
        .fillna(0, subset=["zero_window_us", "zero_windows"])
        .select(
            *_CONNECTION,
            "held_us",
            "held_intervals",
            "zero_window_us",
            "zero_windows",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            timestamp(F.col("held_start_us")).alias("start_ts"),
            timestamp(F.col("held_end_us")).alias("end_ts"),
            F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
            F.try_element_at("held_packets", F.lit(-1)).alias("end_packet_number"),
            F.col("held_packets").alias("packet_numbers"),
        )
    )


@dataclass
class Measures:
    """The measures of one run, each computed once when a rule first asks for it."""

    tables: Tables
    limits: DiagnosisThresholds
    _found: dict[str, DataFrame] = field(default_factory=dict)
    _computed: dict[str, DataFrame] = field(default_factory=dict)

    # -- shared intermediates --------------------------------------------------------------

    @cached_property
    def lifetimes(self) -> DataFrame:
        """Per connection: its first and last frame (``first_ts``, ``last_ts``)."""
        return self.tables.frames.groupBy(*_CONNECTION).agg(F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"))

    @cached_property
    def declarations(self) -> DataFrame:
        return queue_declarations(self.tables.frames)

    @cached_property
    def routes(self) -> DataFrame:
        """Every publish with the queue(s) it reaches: read by three measures, computed once."""
        return kept(publish_routes(self.tables.messages_091, self.tables.link_state, self.tables.frames))

    @cached_property
    def depth_events(self) -> DataFrame:
        return depth_events(self.tables.frames, self.tables.messages_091, self.tables.link_state, self.routes)

    @cached_property
    def consumer_windows(self) -> DataFrame:
        t = self.tables
        return kept(
            consumer_windows(
                t.flow_intervals,
                t.consumer_unacked,
                t.link_state,
                t.messages_091,
                t.frames,
                self.depth_events,
                self.limits,
            )
        )

    @cached_property
    def deliveries_10(self) -> DataFrame:
        """AMQP 1.0 deliveries and the dispositions that settled them (``pipelines.messages``)."""
        given = self.tables.deliveries_10
        return deliveries_10(self.tables.frames) if given is None else given

    @cached_property
    def connection_queues(self) -> DataFrame:
        """Per connection: the queue it publishes to most, else the queue it consumes from first."""
        published = (
            self.routes.filter(F.col("queue").isNotNull())
            .groupBy(*_CONNECTION, "queue")
            .agg(F.count(F.lit(1)).alias("_n"))
            .groupBy(*_CONNECTION)
            .agg(F.max_by("queue", "_n").alias("_published"))
        )
        consumed = self.consumer_windows.groupBy(*_CONNECTION).agg(
            F.min_by("queue", "active_start_us").alias("_consumed")
        )
        return published.join(consumed, list(_CONNECTION), "full").select(
            *_CONNECTION, F.coalesce(F.col("_published"), F.col("_consumed")).alias("queue")
        )

    @cached_property
    def alarmed(self) -> DataFrame:
        """The connections RabbitMQ blocked at some point (connection.blocked)."""
        return self.tables.connection_blocked.select(*_CONNECTION).distinct()

    def window_held(self, direction: str) -> DataFrame:
        """Intervals in which the sender in ``direction`` was held back by its peer's window: too
        little room for its next segment, or a zero window (``pipelines.tcp_pressure``)."""
        gaps = window_limited_gaps(self.tables.tcp_flow, direction).select(
            *_CONNECTION, "start_us", "end_us", "start_packet_number"
        )
        closed = zero_windows(self.tables.flow_intervals, self.lifetimes, direction).select(
            *_CONNECTION, "start_us", "end_us", "start_packet_number"
        )
        return gaps.unionByName(closed)

    def measure(self, name: str) -> DataFrame:
        """The measure ``name`` (``MEASURES``), computed once, with its ``held_share`` (the time held
        back over the span) where it has none of its own."""
        if name not in self._computed:
            rows = MEASURES[name](self)
            if "held_share" not in rows.columns:
                rows = rows.withColumn("held_share", F.col("held_us") / F.greatest(F.col("span_us"), F.lit(1)))
            self._computed[name] = rows
        return self._computed[name]

    def found(self, rule_id: str) -> DataFrame:
        """The rows of ``rule_id``'s measure that passed its test, with its component and confidence
        (set by the engine once the rule has run)."""
        return self._found[rule_id]

    def record(self, rule_id: str, rows: DataFrame) -> None:
        self._found[rule_id] = rows

    # -- the measures ----------------------------------------------------------------------

    def resource_alarms(self) -> DataFrame:
        """Per connection that RabbitMQ blocked (connection.blocked ... connection.unblocked): the
        union of its blocked intervals over its lifetime, the reason, the notifications."""
        blocked = self.tables.connection_blocked.join(self.lifetimes, list(_CONNECTION))
        intervals = blocked.select(
            *_CONNECTION,
            _us("start_ts").alias("start_us"),
            _us(F.coalesce(F.col("end_ts"), F.col("last_ts"))).alias("end_us"),
            "start_packet_number",
        )
        held = held_time(intervals, _CONNECTION)
        notices = self.tables.frames.filter(F.col("method").isin("connection.blocked", "connection.unblocked"))
        packets = notices.groupBy(*_CONNECTION).agg(
            first_packets("packet_number").alias("packet_numbers"),
            F.countDistinct("packet_number").alias("packet_count"),
        )
        described = blocked.groupBy(*_CONNECTION).agg(
            # A block in force when the capture began has no connection.blocked, so no reason.
            F.coalesce(
                F.min_by("reason", F.when(F.col("reason").isNotNull(), F.col("start_ts"))),
                F.lit("not in the capture: blocked before it began"),
            ).alias("reason"),
            F.sum("notifications").alias("notifications"),
            F.max(F.col("end_ts").isNull().cast("int")).alias("_open"),
            F.max(F.coalesce("end_packet_number", "start_packet_number")).alias("end_packet_number"),
            F.max("end_ts").alias("_last_end"),
            F.first("first_ts").alias("first_ts"),
            F.first("last_ts").alias("last_ts"),
        )
        return (
            held.join(described, list(_CONNECTION))
            .join(packets, list(_CONNECTION), "left")
            .join(self.connection_queues, list(_CONNECTION), "left")
            .select(
                *_CONNECTION,
                "queue",
                "reason",
                "notifications",
                "held_us",
                "held_intervals",
                (_us("last_ts") - _us("first_ts")).alias("span_us"),
                timestamp(F.col("held_start_us")).alias("start_ts"),
                F.when(F.col("_open") == 0, F.col("_last_end")).alias("end_ts"),
                F.try_element_at(F.col("held_packets"), F.lit(1)).alias("start_packet_number"),
                "end_packet_number",
                "packet_numbers",
                "packet_count",
                (F.col("_open") == 0).alias("unblocked"),
                F.lit("amqp.method.class == 10 && amqp.method.method in {60,61}").alias("packet_filter"),
            )
        )

    def publishing_sessions_closed(self) -> DataFrame:
        """AMQP 1.0: per session that publishes (sends transfers), the union of the intervals in
        which the broker held its incoming-window at 0 (how RabbitMQ stops 1.0 publishers in an
        alarm, DOMAIN.md section 3)."""
        frames = self.tables.frames
        publishing_ = (
            frames.filter(
                (F.col("protocol") == "amqp-1.0") & (F.col("method") == "transfer") & (F.col("direction") == "c2s")
            )
            .select(*_CONNECTION, "channel")
            .distinct()
        )
        keys = (*_CONNECTION, "channel")
        closed = (
            self.tables.flow_intervals.filter(
                (F.col("cause") == "session_window_closed") & (F.col("direction") == "c2s")
            )
            .join(publishing_, list(keys), "left_semi")
            .join(self.lifetimes, list(_CONNECTION))
        )
        intervals = closed.select(
            *keys,
            _us("start_ts").alias("start_us"),
            _us(F.coalesce(F.col("end_ts"), F.col("last_ts"))).alias("end_us"),
            "start_packet_number",
            "end_packet_number",
        )
        held = held_time(intervals, keys)
        ends = intervals.groupBy(*keys).agg(
            F.max("end_packet_number").alias("end_packet_number"),
            first_packets(F.col("start_packet_number")).alias("_starts"),
            F.collect_set("end_packet_number").alias("_ends"),
        )
        return (
            held.join(ends, list(keys))
            .join(self.lifetimes, list(_CONNECTION))
            .join(self.connection_queues, list(_CONNECTION), "left")
            .select(
                *keys,
                "queue",
                "held_us",
                "held_intervals",
                (_us("last_ts") - _us("first_ts")).alias("span_us"),
                timestamp(F.col("held_start_us")).alias("start_ts"),
                timestamp(F.col("held_end_us")).alias("end_ts"),
                F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
                "end_packet_number",
                _listed(F.concat("_starts", "_ends")).alias("packet_numbers"),
            )
        )

    def consumer_window(self) -> DataFrame:
        """Per 0-9-1 consumer and AMQP 1.0 receiving link: its window and what it did
        (``pipelines.consumer_window``)."""
        return self.consumer_windows.select(
            "*",
            timestamp(F.coalesce(F.col("held_start_us"), F.col("active_start_us"))).alias("start_ts"),
            timestamp(F.coalesce(F.col("held_end_us"), F.col("active_end_us"))).alias("end_ts"),
            F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
            F.try_element_at("held_packets", F.lit(-1)).alias("end_packet_number"),
            F.coalesce(F.col("held_packets"), F.array().cast("array<long>")).alias("packet_numbers"),
            (F.col("refill_p50_us") + F.col("wait_p50_us")).alias("round_trip_p50_us"),
            F.coalesce(F.col("consumer_tag"), F.col("link_name")).alias("consumer"),
        )

    def publisher_pressure(self) -> DataFrame:
        """Per publishing connection outside any alarm: what it publishes where (``pipelines.publishing``),
        the time the broker's window held it back within its publishing span (``held_us``, the
        union of window-limited gaps and zero windows), full windows, zero windows (count and
        their own union), and ``together_share``: the share of that time in which another
        publisher to a queue it shares was held back too (a slow queue holds back every publisher
        feeding it; a channel only its own)."""
        published = publishing(self.routes, self.declarations)
        spans = published.join(self.alarmed, list(_CONNECTION), "left_anti").select(
            *_CONNECTION, _us("publish_first_ts").alias("_low"), _us("publish_last_ts").alias("_high")
        )
        held_intervals = clipped(self.window_held("c2s").join(spans, list(_CONNECTION)), F.col("_low"), F.col("_high"))
        held = held_time(held_intervals, _CONNECTION)
        zero = held_time(
            clipped(
                zero_windows(self.tables.flow_intervals, self.lifetimes, "c2s").join(spans, list(_CONNECTION)),
                F.col("_low"),
                F.col("_high"),
            ),
            _CONNECTION,
        ).select(*_CONNECTION, F.col("held_us").alias("zero_window_us"), F.col("held_intervals").alias("zero_windows"))
        full = (
            self.tables.tcp_flow.filter((F.col("direction") == "c2s") & F.col("is_window_full"))
            .join(spans, list(_CONNECTION))
            .filter((F.col("ts_us") >= F.col("_low")) & (F.col("ts_us") <= F.col("_high")))
            .groupBy(*_CONNECTION)
            .agg(F.count(F.lit(1)).alias("window_full_segments"))
        )
        together = self._held_together(merged_intervals(held_intervals, _CONNECTION), published)
        rows = (
            published.join(spans, list(_CONNECTION))
            .join(held, list(_CONNECTION))
            .join(zero, list(_CONNECTION), "left")
            .join(full, list(_CONNECTION), "left")
            .join(together, list(_CONNECTION), "left")
            .fillna(
                0,
                subset=[
                    "zero_window_us",
                    "zero_windows",
                    "window_full_segments",
                    "together_us",
                    "co_throttled_publishers",
                ],
            )
        )
        span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
        return rows.select(
            "*",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            (F.col("held_intervals") / (span / F.lit(1e6))).alias("stalls_per_second"),
            _share("together_us", "held_us").alias("together_share"),
            F.try_element_at("queues", F.lit(1)).alias("queue"),
            F.try_element_at("publish_channels", F.lit(1)).alias("channel"),
            timestamp(F.col("held_start_us")).alias("start_ts"),
            timestamp(F.col("held_end_us")).alias("end_ts"),
            F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
            F.try_element_at("held_packets", F.lit(-1)).alias("end_packet_number"),
            F.col("held_packets").alias("packet_numbers"),
            F.array_join(F.col("publish_channels").cast("array<string>"), ",").alias("publish_channel_list"),
            F.array_join(F.slice("queues", 1, 5), ",").alias("queue_list"),
            F.array_join(F.slice("destinations", 1, 5), ",").alias("destination_list"),
            F.array_join(F.col("queue_types"), ",").alias("queue_type_list"),
            F.array_contains(F.col("queue_types"), "quorum").alias("to_quorum"),
            F.array_contains(F.col("queue_types"), "stream").alias("to_stream"),
            (F.size(F.coalesce(F.col("lazy_queues"), F.array().cast("array<string>"))) > 0).alias("to_lazy"),
            F.array_join(F.coalesce(F.col("bounded_queues"), F.array().cast("array<string>")), ",").alias(
                "bounded_queue_list"
            ),
        )

    def _held_together(self, islands: DataFrame, published: DataFrame) -> DataFrame:
        """Per connection: the time (``together_us``) of its held islands during which another
        connection publishing to a queue (or destination) it shares was held back too, and how
        many such connections (``co_throttled_publishers``). Islands are cut into buckets of
        together_bucket_ms so that two publishers' many short stalls of one credit-flow episode
        meet (a blocked reader is let go and blocked again ~80 times a second, per the seeds)."""
        bucket = int(self.limits.together_bucket_ms * 1000)
        cut = islands.select(
            *_CONNECTION,
            "start_us",
            "end_us",
            F.explode(F.sequence(F.floor(F.col("start_us") / bucket), F.floor((F.col("end_us") - 1) / bucket))).alias(
                "_bucket"
            ),
        )
        per_bucket = cut.select(
            *_CONNECTION,
            "_bucket",
            (
                F.least(F.col("end_us"), (F.col("_bucket") + 1) * bucket)
                - F.greatest(F.col("start_us"), F.col("_bucket") * bucket)
            ).alias("_us"),
        )
        mine = per_bucket.groupBy(*_CONNECTION, "_bucket").agg(F.sum("_us").alias("_us"))
        shared_with = published.select(*_CONNECTION, F.coalesce(F.col("queues"), F.col("destinations")).alias("_to"))
        theirs = mine.select("capture_id", F.col("connection_id").alias("_other"), "_bucket").join(
            shared_with.select("capture_id", F.col("connection_id").alias("_other"), F.col("_to").alias("_their_to")),
            ["capture_id", "_other"],
        )
        met = (
            mine.join(shared_with, list(_CONNECTION))
            .join(theirs, ["capture_id", "_bucket"])
            .filter((F.col("_other") != F.col("connection_id")) & F.arrays_overlap("_to", "_their_to"))
        )
        per_mine = met.groupBy(*_CONNECTION, "_bucket").agg(
            F.first("_us").alias("_us"), F.collect_set("_other").alias("_others")
        )
        return per_mine.groupBy(*_CONNECTION).agg(
            F.sum("_us").alias("together_us"),
            F.size(F.array_distinct(F.flatten(F.collect_list("_others")))).alias("co_throttled_publishers"),
        )

    def head_of_line(self) -> DataFrame:
        """Consumers (with a prefetch) on another channel of a connection whose publisher
        ``diagnosis.publisher.credit_flow`` found throttled: RabbitMQ stops reading the whole
        socket, so their acks wait behind the publishes and the broker cannot refill their
        prefetch. Held: from each ack that freed a slot of a full prefetch while the publisher was
        held back until the next delivery, where that took longer than refill_ms; the consumer's
        delivery rate before, during and after."""
        publishers = self.found("diagnosis.publisher.credit_flow").select(
            *_CONNECTION,
            F.col("component").alias("parent_component"),
            F.col("confidence").alias("parent_confidence"),
            F.col("held_start_us").alias("_throttled_from"),
            F.col("held_end_us").alias("_throttled_until"),
            F.col("publish_channels"),
            F.col("publish_channel_list"),
            F.col("held_us").alias("publisher_held_us"),
        )
        windows = self.consumer_windows.filter(F.col("protocol") == "amqp-0-9-1").select(
            *_CONNECTION, "channel", "consumer_tag", "queue", "window", "active_start_us", "active_end_us", "deliveries"
        )
        sharing = windows.join(publishers, list(_CONNECTION)).filter(
            ~F.array_contains(F.col("publish_channels"), F.col("channel")) & (F.col("window") > 0)
        )
        unacked = self.tables.consumer_unacked
        # One consumer's unacked timeline in order: what follows each ack.
        order = Window.partitionBy(*_CONNECTION, "channel", "consumer_tag").orderBy("frame_index")
        limit = F.coalesce(F.col("prefetch_count"), F.lit(0))
        slots = unacked.withColumn("_delivery_us", F.when(F.col("method") == "basic.deliver", _us("ts"))).select(
            *_CONNECTION,
            "channel",
            "consumer_tag",
            "settled",
            "packet_number",
            _us("ts").alias("ts_us"),
            ((limit > 0) & (F.lag("unacked").over(order) >= limit)).alias("_was_full"),
            # The next delivery, whatever comes between: the acks the consumer sent while the broker
            # did not read the socket reach the wire together, before the delivery they free.
            next_value("_delivery_us", order).alias("_next_us"),
        )
        keys = (*_CONNECTION, "channel", "consumer_tag")
        waits = (
            slots.filter((F.col("settled") > 0) & F.col("_was_full"))
            .join(sharing, list(keys))
            .filter((F.col("ts_us") >= F.col("_throttled_from")) & (F.col("ts_us") <= F.col("_throttled_until")))
            # An ack with no delivery after it is the consumer stopping, not a stall.
            .filter(F.col("_next_us").isNotNull())
            .select(
                *keys,
                F.col("ts_us").alias("start_us"),
                F.col("_next_us").alias("end_us"),
                F.col("packet_number").alias("start_packet_number"),
            )
            .filter(F.col("end_us") - F.col("start_us") > F.lit(int(self.limits.refill_ms * 1000)))
        )
        bounded = clipped(
            waits.join(_apart(sharing.select(*keys, "active_start_us", "active_end_us")), list(keys)),
            F.col("active_start_us"),
            F.col("active_end_us"),
        )
        held = held_time(bounded, keys)
        rows = sharing.join(_apart(held), list(keys))
        delivered = self.tables.messages_091.filter(F.col("method") == "basic.deliver").select(
            *keys, _us("ts").alias("_at")
        )
        phases = (
            delivered.join(_apart(rows.select(*keys, "held_start_us", "held_end_us")), list(keys))
            .groupBy(*keys)
            .agg(
                F.sum((F.col("_at") < F.col("held_start_us")).cast("long")).alias("_before"),
                # The delivery that ends a wait opens "after": during counts what came while it waited.
                F.sum(
                    ((F.col("_at") >= F.col("held_start_us")) & (F.col("_at") < F.col("held_end_us"))).cast("long")
                ).alias("_during"),
                F.sum((F.col("_at") >= F.col("held_end_us")).cast("long")).alias("_after"),
            )
        )
        span = F.greatest(F.col("active_end_us") - F.col("active_start_us"), F.lit(1))
        return rows.join(_apart(phases), list(keys), "left").select(
            *keys,
            "queue",
            "window",
            "deliveries",
            "parent_component",
            "parent_confidence",
            "publish_channel_list",
            "publisher_held_us",
            "held_us",
            "held_intervals",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            _per_second("_before", "active_start_us", "held_start_us").alias("rate_before"),
            _per_second("_during", "held_start_us", "held_end_us").alias("rate_during"),
            _per_second("_after", "held_end_us", "active_end_us").alias("rate_after"),
            timestamp(F.col("held_start_us")).alias("start_ts"),
            timestamp(F.col("held_end_us")).alias("end_ts"),
            F.try_element_at("held_packets", F.lit(1)).alias("start_packet_number"),
            F.try_element_at("held_packets", F.lit(-1)).alias("end_packet_number"),
            F.col("held_packets").alias("packet_numbers"),
        )

    def client_receive_pressure(self) -> DataFrame:
        """Per connection the broker sends to: the time its client's window held the broker back
        (window-limited gaps and zero windows in the server-to-client direction, their union)
        within the time the broker was sending, and the consumer it delivers to."""
        sending = (
            self.tables.frames.filter(F.col("direction") == "s2c")
            .groupBy(*_CONNECTION)
            .agg(_us(F.min("ts")).alias("_low"), _us(F.max("ts")).alias("_high"))
        )
        zero = zero_windows(self.tables.flow_intervals, self.lifetimes, "s2c")
        consumers = self.consumer_windows.groupBy(*_CONNECTION).agg(
            F.min_by("consumer_tag", "active_start_us").alias("consumer_tag"),
            F.min_by("link_name", "active_start_us").alias("link_name"),
            F.min_by("queue", "active_start_us").alias("queue"),
            F.min_by("channel", "active_start_us").alias("channel"),
        )
        return (
            _window_pressure(self.window_held("s2c"), zero, sending)
            .join(consumers, list(_CONNECTION), "left")
            .select(*_CONNECTION, "consumer_tag", "link_name", "queue", "channel", *_PRESSURE_COLUMNS)
        )

    def encrypted_window_pressure(self) -> DataFrame:
        """Per TLS connection whose AMQP was not decoded and per ``sender`` (``c2s`` the client,
        ``s2c`` the broker): the time its peer's window held it back (window-limited gaps and zero
        windows, their union) within the time it was sending, from the TCP segments alone."""
        encrypted = self.tables.connections.filter(F.col("protocol") == "tls").select(*_CONNECTION)
        flow = self.tables.tcp_flow.join(F.broadcast(encrypted), list(_CONNECTION), "left_semi")
        found = []
        for sender in ("c2s", "s2c"):
            sending = (
                flow.filter((F.col("direction") == sender) & (F.col("payload_length") > 0))
                .groupBy(*_CONNECTION)
                .agg(F.min("ts_us").alias("_low"), F.max("ts_us").alias("_high"))
            )
            gaps = window_limited_gaps(flow, sender).select(*_CONNECTION, "start_us", "end_us", "start_packet_number")
            closed = zero_windows_advertised(flow, sender)
            found.append(
                _window_pressure(gaps.unionByName(closed), closed, sending).select(
                    *_CONNECTION, F.lit(sender).alias("sender"), F.lit(False).alias("decoded"), *_PRESSURE_COLUMNS
                )
            )
        return found[0].unionByName(found[1])

    def retransmission_recovery(self) -> DataFrame:
        """Per connection with retransmissions: how many were spurious (the receiver had the bytes)
        and the time lost recovering from the others (``pipelines.tcp_pressure``), within the
        connection's life; whether both ends are on loopback (then the host dropped the packets)."""
        flow = self.tables.tcp_flow
        counts = (
            flow.filter(F.col("is_retransmission") & ~F.col("is_keep_alive") & ~F.col("is_zero_window_probe"))
            .groupBy(*_CONNECTION)
            .agg(
                F.count(F.lit(1)).alias("retransmissions"),
                F.sum(F.col("is_spurious_retransmission").cast("long")).alias("spurious_retransmissions"),
                F.sum("retransmitted_bytes").alias("retransmitted_bytes"),
            )
        )
        life = flow.groupBy(*_CONNECTION).agg(
            F.min("ts_us").alias("_low"), F.max("ts_us").alias("_high"), F.sum("payload_length").alias("payload_bytes")
        )
        lost = retransmission_recovery(flow)
        recovered = held_time(clipped(lost.join(life, list(_CONNECTION)), F.col("_low"), F.col("_high")), _CONNECTION)
        genuine = lost.groupBy(*_CONNECTION).agg(
            F.count(F.lit(1)).alias("lost_segments"),
            F.sum("retransmitted_bytes").alias("lost_bytes"),
            first_packets("start_packet_number").alias("packet_numbers"),
        )
        ends = self.tables.connections.select(
            *_CONNECTION,
            "client_address",
            "server_address",
            (
                F.col("client_address").startswith(_LOOPBACK[0])
                | F.col("client_address").isin(_LOOPBACK[1])
                | F.col("client_address").startswith(_LOOPBACK[2])
            ).alias("loopback"),
        )
        span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
        return (
            counts.join(life, list(_CONNECTION))
            .join(ends, list(_CONNECTION), "left")
            .join(recovered, list(_CONNECTION), "left")
            .join(genuine, list(_CONNECTION), "left")
            .join(self.connection_queues, list(_CONNECTION), "left")
            .fillna(0, subset=["held_us", "lost_segments", "lost_bytes"])
            .select(
                *_CONNECTION,
                "queue",
                "retransmissions",
                "spurious_retransmissions",
                "retransmitted_bytes",
                "payload_bytes",
                "lost_segments",
                "lost_bytes",
                "loopback",
                "held_us",
                span.alias("span_us"),
                (F.col("held_us") / span).alias("held_share"),
                timestamp(F.coalesce(F.col("held_start_us"), F.col("_low"))).alias("start_ts"),
                timestamp(F.col("held_end_us")).alias("end_ts"),
                F.try_element_at("packet_numbers", F.lit(1)).alias("start_packet_number"),
                F.try_element_at("packet_numbers", F.lit(-1)).alias("end_packet_number"),
                F.coalesce(F.col("packet_numbers"), F.array().cast("array<long>")).alias("packet_numbers"),
            )
        )

    def publisher_confirms(self) -> DataFrame:
        """Per 0-9-1 channel publishing with confirms: messages in flight (the most and the median
        outstanding right after a publish), the confirm round trip (median from a publish to its
        confirm), the time it had a publish waiting for its confirm (the union of those waits,
        ``held_us``) within the time from its first publish to its last confirm, and its rate."""
        keys = (*_CONNECTION, "channel")
        settle_times = settlement_times(self.tables.frames, "ts_us", "_confirmed_us")
        # On a connection RabbitMQ blocked, confirms wait for the alarm: that rule says so.
        confirmed = (
            self.tables.messages_091.filter((F.col("method") == "basic.publish") & F.col("publish_seq").isNotNull())
            .join(self.alarmed, list(_CONNECTION), "left_anti")
            .join(settle_times, [*_CONNECTION, "settled_frame_index"], "left")
            .withColumn("_published_us", _us("ts"))
        )
        spans = confirmed.groupBy(*keys).agg(
            F.count(F.lit(1)).alias("publishes"),
            F.min("_published_us").alias("_low"),
            F.greatest(F.max("_confirmed_us"), F.max("_published_us")).alias("_high"),
            F.percentile_approx(F.col("_confirmed_us") - F.col("_published_us"), 0.5).alias("confirm_p50_us"),
            F.first(F.coalesce(F.col("exchange"), F.lit(""))).alias("exchange"),
            F.first("routing_key").alias("routing_key"),
        )
        waits = confirmed.filter(F.col("_confirmed_us").isNotNull()).select(
            *keys,
            F.col("_published_us").alias("start_us"),
            F.col("_confirmed_us").alias("end_us"),
            F.lit(None).cast("long").alias("start_packet_number"),
        )
        held = held_time(waits, keys)
        published = self.tables.channel_confirms.filter(F.col("method") == "basic.publish")
        in_flight = published.groupBy(*keys).agg(
            F.max("outstanding").alias("in_flight_max"),
            F.percentile_approx("outstanding", 0.5).alias("in_flight_p50"),
            first_packets("packet_number").alias("packet_numbers"),
        )
        queues = self.routes.filter(F.col("queue").isNotNull()).groupBy(*keys).agg(F.min("queue").alias("queue"))
        span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
        return (
            spans.join(held, list(keys))
            .join(in_flight, list(keys))
            .join(queues, list(keys), "left")
            .select(
                *keys,
                "queue",
                "publishes",
                "confirm_p50_us",
                "in_flight_max",
                "in_flight_p50",
                "held_us",
                span.alias("span_us"),
                (F.col("held_us") / span).alias("held_share"),
                (F.col("publishes") / (span / F.lit(1e6))).alias("publishes_per_second"),
                timestamp(F.col("_low")).alias("start_ts"),
                timestamp(F.col("_high")).alias("end_ts"),
                F.try_element_at("packet_numbers", F.lit(1)).alias("start_packet_number"),
                F.try_element_at("packet_numbers", F.lit(-1)).alias("end_packet_number"),
                "packet_numbers",
            )
        )


# The protocol (the connections table's ``protocol``) of every connection the rows of a measure
# can come from, for the measures that read one protocol's connections only; in a run without such
# a connection a measure has no rows, and its rules are not planned (``pipelines.bottlenecks``).
# The 0-9-1 and 1.0 ones read the frames or tables of that AMQP version alone (pipelines.tables
# builds no such table without its protocol's connections).
MEASURE_PROTOCOL: dict[str, str] = {
    "publishing_sessions_closed": "amqp-1.0",  # 1.0 sessions' transfers
    "head_of_line": "amqp-0-9-1",  # 0-9-1 consumers' prefetch windows
    "consumer_acks": "amqp-0-9-1",  # 0-9-1 consumers' acknowledgements
    "redeliveries": "amqp-0-9-1",  # 0-9-1 deliveries requeued
    "transfer_settlement": "amqp-1.0",  # 1.0 senders' transfers and the broker's dispositions
    "publisher_confirms": "amqp-0-9-1",  # messages_091's publishes in confirm mode
    "encrypted_window_pressure": "tls",  # connections whose AMQP was not decoded
    "publish_refusals": "amqp-0-9-1",  # basic.nack of publishes in confirm mode
    "unroutable_returns": "amqp-0-9-1",  # basic.return
    "channel_churn": "amqp-0-9-1",  # channel.open / close
    "request_reply": "amqp-0-9-1",  # messages_091's publishes and deliveries
}

MEASURES: dict[str, Callable[[Measures], DataFrame]] = {
    "resource_alarms": Measures.resource_alarms,
    "publishing_sessions_closed": Measures.publishing_sessions_closed,
    "consumer_window": Measures.consumer_window,
    "consumer_acks": consumer_acks,
    "redeliveries": redeliveries,
    "neighbour_speeds": neighbour_speeds,
    "unconsumed_queues": unconsumed_queues,
    "transfer_settlement": transfer_settlement,
    "publisher_pressure": Measures.publisher_pressure,
    "head_of_line": Measures.head_of_line,
    "client_receive_pressure": Measures.client_receive_pressure,
    "encrypted_window_pressure": Measures.encrypted_window_pressure,
    "retransmission_recovery": Measures.retransmission_recovery,
    "publisher_confirms": Measures.publisher_confirms,
    "publish_refusals": publish_refusals,
    "unroutable_returns": unroutable_returns,
    "closes_with_error": closes_with_error,
    "connection_churn": connection_churn,
    "channel_churn": channel_churn,
    "request_reply": request_reply,
    "bandwidth_limited": bandwidth_limited,
}
