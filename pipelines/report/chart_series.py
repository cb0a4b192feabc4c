"""The report's charts as one gold table (``schemas.report.CHART_SERIES_SCHEMA``), computed by derive.

Each chart is a pure function of the flow-state tables on the capture's time grid
(``pipelines.report.series_grid``): counts zero-filled in every bucket, states as steps. The timeline keeps
the ``LANES`` lanes holding back the most time with their ``INTERVALS_PER_LANE`` longest intervals,
and the first ``MARKERS_PER_RULE`` violations of each rule. ``chart_series`` is every chart of the
captures in one DataFrame: the report reads it back with delta-rs, no Spark query.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import union_all, with_columns
from amqpscope.pipelines.report.queue_series import consumer_utilisation_chart, queue_events, queue_rates_chart
from amqpscope.pipelines.report.series_grid import (
    CountChart,
    StateChart,
    bucket_grid,
    busiest,
    counts,
    keyed,
    since_start,
    states,
)
from amqpscope.pipelines.shape import in_schema
from amqpscope.schemas.report import CHART_SERIES_SCHEMA

LANES = 60  # timeline lanes of a capture at most
INTERVALS_PER_LANE = 100  # the longest intervals of a lane
MARKERS_PER_RULE = 100  # the earliest violations of a rule


def _transfer_direction() -> Column:
    return F.when(F.col("sender_side") == "client", F.lit("c2s")).otherwise(F.lit("s2c"))


def state_charts(
    consumer_unacked: DataFrame,
    channel_unacked: DataFrame,
    link_state: DataFrame,
    channel_confirms: DataFrame,
    tcp_flow: DataFrame,
) -> list[StateChart]:
    """The step charts: unacked deliveries per 0-9-1 consumer and per channel (the most in a bucket)
    with the prefetch in force; the sender's link credit per 1.0 link (the least); publishes
    waiting for their confirm per channel (the most); the receive window each side advertises (the
    least) and its zero windows."""
    limit = F.coalesce(F.nullif(F.col("prefetch_count"), F.lit(0)), F.nullif(F.col("channel_prefetch_count"), F.lit(0)))
    return [
        StateChart(
            "consumer_unacked",
            keyed(consumer_unacked, connection_id="connection_id", channel="channel", name="consumer_tag").withColumns(
                {"_order": F.col("frame_index"), "_prefetch": limit}
            ),
            {"unacked": ("unacked", "max"), "prefetch": ("_prefetch", "max")},
        ),
        StateChart(
            "channel_unacked",
            keyed(channel_unacked, connection_id="connection_id", channel="channel").withColumns(
                {"_order": F.col("frame_index"), "_prefetch": F.nullif(F.col("prefetch_count"), F.lit(0))}
            ),
            {"unacked": ("unacked", "max"), "prefetch": ("_prefetch", "max")},
        ),
        StateChart(
            "link_credit",
            keyed(
                link_state.where(F.col("link_credit_snd").isNotNull()),
                connection_id="connection_id",
                name="link_name",
                direction=_transfer_direction(),
            ).withColumn("_order", F.col("frame_index")),
            {"link_credit": ("link_credit_snd", "min")},
        ),
        StateChart(
            "confirms",
            keyed(channel_confirms, connection_id="connection_id", channel="channel").withColumn(
                "_order", F.col("frame_index")
            ),
            {"outstanding": ("outstanding", "max")},
        ),
        StateChart(
            "tcp_window",
            keyed(tcp_flow, connection_id="connection_id", direction="direction").withColumns(
                {"_order": F.col("packet_number"), "_zero": F.col("is_zero_window").cast("long")}
            ),
            {"window": ("effective_window", "min"), "zero_windows": ("_zero", "sum")},
            weight=F.col("payload_length") + F.col("is_zero_window").cast("long") * 1_000_000,
        ),
    ]


def count_charts(messages: DataFrame, link_state: DataFrame, frames: DataFrame) -> list[CountChart]:
    """The count charts but the queues': messages and their bytes per connection and direction
    (``throughput.message_events``), deliveries per 1.0 link (counted at its first transfer),
    connections and channels opened and closed (churn)."""
    per_connection = keyed(
        messages.where(F.col("connection_id").isNotNull()), connection_id="connection_id", direction="direction"
    )
    both = per_connection.withColumn(
        "_m",
        F.explode(
            F.array(
                F.struct(F.lit("messages").alias("metric"), F.col("messages").cast("long").alias("n")),
                F.struct(F.lit("bytes").alias("metric"), F.col("bytes").cast("long").alias("n")),
            )
        ),
    ).select("*", "_m.*")
    deliveries = keyed(
        link_state.where((F.col("method") == "transfer") & F.col("is_new_delivery")),
        connection_id="connection_id",
        name="link_name",
        direction=_transfer_direction(),
    )
    return [
        CountChart("connection_rates", both, ("messages", "bytes"), rank_by="messages"),
        CountChart(
            "link_deliveries", deliveries.withColumns({"metric": F.lit("deliveries"), "n": F.lit(1)}), ("deliveries",)
        ),
        CountChart("churn", _churn_events(frames), tuple(name for name, _ in _CHURN)),
    ]


# Frames that open or close a connection or a channel, one per handshake: the broker's reply to
# the client (0-9-1 open-ok, 1.0 the broker's open / begin) and the close-ok (0-9-1) or the
# broker's close / end (1.0, which both sides send).
_CHURN = (
    ("connections_opened", (("connection.open-ok", "s2c"), ("open", "s2c"))),
    ("connections_closed", (("connection.close-ok", None), ("close", "s2c"))),
    ("channels_opened", (("channel.open-ok", "s2c"), ("begin", "s2c"))),
    ("channels_closed", (("channel.close-ok", None), ("end", "s2c"))),
)


def _churn_events(frames: DataFrame) -> DataFrame:
    """Connections and channels (1.0 sessions) opened and closed, what RabbitMQ's churn statistics count."""
    metric = F.lit(None).cast("string")
    for name, handshakes in reversed(_CHURN):
        for method, direction in handshakes:
            sent = (F.col("method") == method) & (F.lit(True) if direction is None else F.col("direction") == direction)
            metric = F.when(sent, F.lit(name)).otherwise(metric)
    events = frames.select("capture_id", "ts", metric.alias("metric")).where(F.col("metric").isNotNull())
    return keyed(events).withColumn("n", F.lit(1))


def timeline(flow_intervals: DataFrame, grid: DataFrame) -> DataFrame:
    """Swimlane bars: per lane (connection, entity, its name, cause, direction) its longest intervals.

    Open intervals (no end in the capture) run to the capture's last packet. Lanes with the most
    time held back come first, at most LANES a capture; at most INTERVALS_PER_LANE bars a lane.
    """
    name = (
        F.when(F.col("entity") == "consumer", F.col("consumer_tag"))
        .when(F.col("entity") == "link", F.col("link_name"))
        .otherwise(F.lit(None))
    )
    lanes = ["connection_id", "channel", "name", "direction", "entity", "metric"]
    with_lane = with_columns(
        flow_intervals.join(F.broadcast(grid), "capture_id"),
        [
            ("name", name),
            ("metric", F.col("cause")),
            ("x", since_start("start_ts")),
            ("x_end", F.greatest(F.coalesce(since_start("end_ts"), F.col("_span_s")), F.col("x"))),
            ("packet_number", F.col("start_packet_number")),
        ],
    )
    # Orders a lane's intervals longest first, to keep the ones that matter.
    longest_first = Window.partitionBy("capture_id", *lanes).orderBy((F.col("x_end") - F.col("x")).desc(), "x")
    kept = (
        busiest(with_lane, F.col("x_end") - F.col("x"), LANES, lanes)
        .withColumn("_n", F.row_number().over(longest_first))
        .where(F.col("_n") <= INTERVALS_PER_LANE)
    )
    return in_schema(kept, CHART_SERIES_SCHEMA, chart=F.lit("timeline"))


def violation_markers(violations: DataFrame, grid: DataFrame) -> DataFrame:
    """The earliest MARKERS_PER_RULE violations of each rule, as points in time (metric: the severity)."""
    # Orders a rule's violations in time, to mark the earliest.
    earliest = Window.partitionBy("capture_id", "rule_id").orderBy("ts", "connection_id", "frame_index")
    rules = Window.partitionBy("capture_id").orderBy("rule_id")  # ranks the rules: a series each
    in_capture = Window.partitionBy("capture_id")  # unordered: counts a capture's rules
    packet = F.col("packet_number") if "packet_number" in violations.columns else F.lit(None)
    marked = with_columns(
        violations.where(F.col("ts").isNotNull()).join(F.broadcast(grid), "capture_id"),
        [
            ("_n", F.row_number().over(earliest)),
            ("series_rank", F.dense_rank().over(rules)),
            ("series_total", F.max("series_rank").over(in_capture)),
        ],
    )
    return in_schema(
        marked.where(F.col("_n") <= MARKERS_PER_RULE),
        CHART_SERIES_SCHEMA,
        chart=F.lit("violations"),
        name=F.col("rule_id"),
        metric=F.col("severity"),
        x=since_start("ts"),
        packet_number=packet.cast("long"),
    )


def chart_series(
    *,
    captures: DataFrame,
    frames: DataFrame,
    message_events: DataFrame,
    link_state: DataFrame,
    consumer_unacked: DataFrame,
    channel_unacked: DataFrame,
    channel_confirms: DataFrame,
    tcp_flow: DataFrame,
    flow_intervals: DataFrame,
    violations: DataFrame,
) -> DataFrame:
    """Every chart of the captures (CHART_SERIES_SCHEMA rows), from their bronze and flow-state tables
    and their ``message_events`` (``throughput.message_events``: derive computes them once, for the
    throughput table and for these charts).

    The count charts are one pass (one aggregation and ranking for all of them), the step charts
    another: a chart more is a branch of a union, not a pipeline of its own."""
    grid = bucket_grid(captures)
    messages = message_events
    charts = [
        counts(
            [queue_rates_chart(queue_events(messages, consumer_unacked)), *count_charts(messages, link_state, frames)],
            grid,
        ),
        states(state_charts(consumer_unacked, channel_unacked, link_state, channel_confirms, tcp_flow), grid),
        consumer_utilisation_chart(consumer_unacked, link_state, flow_intervals, grid),
        timeline(flow_intervals, grid),
        violation_markers(violations, grid),
    ]
    return union_all(charts)
