"""Chart data for the report, aggregated and downsampled in Spark: bounded rows reach the driver.

Every time is in seconds since the capture's first packet (``x``, Wireshark's ``frame.time_relative``).
A series with at most ``POINTS`` rows keeps them all; a longer one is cut into ``POINTS`` equal time
buckets and keeps one point per bucket: its first time and the extreme of each value that matters
(the most unacked, the least credit, the smallest window), so a stall never disappears in a summary.
Only the ``SERIES`` busiest series of a capture are drawn (the page says how many were left out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain

import pyspark.sql.functions as F
from pyspark.sql import Column, DataFrame, Window

from amqpscope.pipelines.columns import with_columns

POINTS = 400  # points per series at most
SERIES = 12  # series per chart and capture at most
LANES = 60  # swimlanes per capture at most
INTERVALS_PER_LANE = 100  # the longest intervals of a lane
MARKERS_PER_RULE = 100  # the earliest violations of a rule
# Bucket widths for message rates, in seconds: the smallest giving at most RATE_BUCKETS buckets.
RATE_WIDTHS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300, 600, 1800, 3600)
RATE_BUCKETS = 300


def since_start(ts: Column, starts: Mapping[str, int]) -> Column:
    """Seconds since the capture's first packet (``starts``: capture id -> epoch microseconds).

    Subtracted in whole microseconds, so 30 ms after the start is exactly 0.03."""
    return (F.unix_micros(ts) - _lookup(starts, F.col("capture_id"), "long")) / F.lit(1_000_000.0)


def _lookup(mapping: Mapping[str, float], key: Column, kind: str = "double") -> Column:
    if not mapping:
        return F.lit(None).cast(kind)
    pairs = chain.from_iterable((F.lit(k), F.lit(v).cast(kind)) for k, v in sorted(mapping.items()))
    return F.create_map(*pairs)[key]


def rate_width(duration_s: float) -> float:
    """The bucket width for a capture lasting ``duration_s``: sub-second for short captures."""
    for width in RATE_WIDTHS:
        if duration_s / width <= RATE_BUCKETS:
            return float(width)
    return float(math.ceil(duration_s / RATE_BUCKETS))


def busiest(df: DataFrame, keys: Sequence[str], weight: Column, limit: int = SERIES) -> DataFrame:
    """``df`` restricted to the ``limit`` series (``keys``) of each capture with the most ``weight``,
    with ``_series_rank`` (1 = busiest) and ``_series_total`` (series in the capture)."""
    # Every window here and in what follows (downsample, rate buckets, lanes) partitions by the
    # capture and more: one exchange by capture serves them all, where ranking the series apart
    # and joining them back cost three Spark jobs more per chart.
    series = Window.partitionBy("capture_id", *keys)  # unordered: a series' weight
    # Ranks a capture's series, heaviest first (ties by key, so the choice is stable).
    heaviest_first = Window.partitionBy("capture_id").orderBy(F.col("_weight").desc(), *keys)
    in_capture = Window.partitionBy("capture_id")  # unordered: counts a capture's series
    return (
        df.repartition("capture_id")
        .withColumn("_weight", F.sum(weight).over(series))
        .withColumn("_series_rank", F.dense_rank().over(heaviest_first))
        .withColumn("_series_total", F.max("_series_rank").over(in_capture))
        .where(F.col("_series_rank") <= limit)
        .drop("_weight")
    )


def downsample(
    df: DataFrame, keys: Sequence[str], x: Column, values: Mapping[str, Column], points: int = POINTS
) -> DataFrame:
    """At most ``points`` rows per series (``capture_id`` + ``keys``): ``x`` and each aggregate of ``values``.

    ``values`` are aggregate expressions (``F.max("unacked")``) applied per time bucket.
    """
    series = ["capture_id", *keys]
    in_series = Window.partitionBy(*series)  # unordered: a series' size and time span
    in_order = Window.partitionBy(*series).orderBy("_x")  # a series' rows in time: the n-th row
    width = F.greatest((F.col("_x_max") - F.col("_x_min")) / F.lit(points), F.lit(1e-9))
    bucketed = with_columns(df, [
        ("_x", x),
        ("_n", F.count(F.lit(1)).over(in_series)),
        ("_x_min", F.min("_x").over(in_series)),
        ("_x_max", F.max("_x").over(in_series)),
        ("_bucket", F.when(F.col("_n") <= points, F.row_number().over(in_order))
         .otherwise(F.least(F.floor((F.col("_x") - F.col("_x_min")) / width), F.lit(points - 1)))),
    ])
    extra = [c for c in ("_series_rank", "_series_total") if c in df.columns]
    return (
        bucketed.groupBy(*series, *extra, "_bucket")
        .agg(F.min("_x").alias("x"), *[agg.alias(name) for name, agg in values.items()])
    )


@dataclass(frozen=True)
class Series:
    """One drawn series: its key values, points in time order and the chart's series count."""

    key: tuple
    x: tuple[float, ...]
    values: Mapping[str, tuple]
    total: int  # series of this kind in the capture (drawn or not)


def collect_series(df: DataFrame, keys: Sequence[str], names: Sequence[str]) -> dict[str, list[Series]]:
    """Per capture, the series of a downsampled frame, busiest first."""
    rank = ["_series_rank"] if "_series_rank" in df.columns else []
    tie = ["_bucket"] if "_bucket" in df.columns else []  # a series' points in time, equal times too
    records = [row.asDict() for row in df.collect()]
    # Bounded rows (SERIES x POINTS a capture): ordered here, which spares Spark a sort's two jobs.
    records.sort(key=lambda r: (r["capture_id"], *(_sortable(r[k]) for k in rank or keys), r["x"],
                                *(r[k] for k in tie)))
    grouped: dict[str, dict[tuple, dict]] = {}
    for record in records:
        key = tuple(record[k] for k in keys)
        entry = grouped.setdefault(record["capture_id"], {}).setdefault(
            key, {"x": [], "values": {n: [] for n in names}, "total": record.get("_series_total") or 1}
        )
        entry["x"].append(record["x"])
        for name in names:
            entry["values"][name].append(record[name])
    return {
        capture: [
            Series(key, tuple(e["x"]), {n: tuple(v) for n, v in e["values"].items()}, e["total"])
            for key, e in by_key.items()
        ]
        for capture, by_key in grouped.items()
    }


def _sortable(value: object) -> tuple[bool, object]:
    # Spark's ascending order: nulls first.
    return (value is not None, value)


# --- the charts' data ----------------------------------------------------------------------------


def unacked_series(consumer_unacked: DataFrame, starts: Mapping[str, int]) -> DataFrame:
    """Unacked deliveries and the prefetch limit in force per consumer (the most in each bucket)."""
    keys = ["connection_id", "channel", "consumer_tag"]
    limit = F.coalesce(F.nullif(F.col("prefetch_count"), F.lit(0)), F.nullif(F.col("channel_prefetch_count"), F.lit(0)))
    return downsample(
        busiest(consumer_unacked, keys, F.lit(1)), keys, since_start(F.col("ts"), starts),
        {"unacked": F.max("unacked"), "prefetch": F.max(limit)},
    )


def link_series(link_state: DataFrame, starts: Mapping[str, int]) -> DataFrame:
    """Sender's link credit (the least in each bucket) and delivery-count per link."""
    keys = ["connection_id", "link_name", "sender_side"]
    return downsample(
        busiest(link_state, keys, F.lit(1)), keys, since_start(F.col("ts"), starts),
        {"link_credit": F.min("link_credit_snd"), "delivery_count": F.max("delivery_count_snd")},
    )


def confirms_series(channel_confirms: DataFrame, starts: Mapping[str, int]) -> DataFrame:
    """Publishes waiting for their confirm per channel (the most in each bucket)."""
    keys = ["connection_id", "channel"]
    return downsample(
        busiest(channel_confirms, keys, F.lit(1)), keys, since_start(F.col("ts"), starts),
        {"outstanding": F.max("outstanding")},
    )


def window_series(tcp_flow: DataFrame, starts: Mapping[str, int]) -> DataFrame:
    """The receive window each side advertises (the least in each bucket) and its zero windows."""
    keys = ["connection_id", "direction"]
    return downsample(
        busiest(tcp_flow, keys, F.col("payload_length") + F.col("is_zero_window").cast("long") * 1_000_000),
        keys, since_start(F.col("ts"), starts),
        {"window": F.min("effective_window"), "zero_windows": F.sum(F.col("is_zero_window").cast("long"))},
    )


def rate_series(messages: DataFrame, starts: Mapping[str, int], widths: Mapping[str, float],
                scope: str) -> DataFrame:
    """Messages and bytes per second in fixed buckets (``widths``: capture id -> seconds) per
    connection and direction (``scope="connection"``) or per queue / address and direction."""
    keys = ["connection_id", "direction"] if scope == "connection" else ["address", "direction"]
    rows = messages.filter(F.col(keys[0]).isNotNull())
    width = _lookup(widths, F.col("capture_id"))
    bucket = F.floor(since_start(F.col("ts"), starts) / width)
    return (
        busiest(rows, keys, F.col("messages"))
        .groupBy("capture_id", *keys, "_series_rank", "_series_total", bucket.alias("_bucket"))
        .agg(F.sum("messages").alias("_messages"), F.sum("bytes").alias("_bytes"))
        .select(
            "capture_id", *keys, "_series_rank", "_series_total",
            (F.col("_bucket") * width).alias("x"),
            (F.col("_messages") / width).alias("messages_per_s"),
            (F.col("_bytes") / width).alias("bytes_per_s"),
        )
    )


def lanes(flow_intervals: DataFrame, starts: Mapping[str, int], ends: Mapping[str, float]) -> DataFrame:
    """Swimlane bars: per lane (connection, entity, its name, cause, direction) the longest intervals.

    Open intervals (no end in the capture) run to the capture's last packet. Lanes with the most
    time held back come first, at most LANES per capture; at most INTERVALS_PER_LANE bars a lane.
    """
    name = (
        F.when(F.col("entity") == "consumer", F.col("consumer_tag"))
        .when(F.col("entity") == "link", F.col("link_name"))
        .when(F.col("entity").isin("channel", "session"), F.col("channel").cast("string"))
        .otherwise(F.lit(""))
    )
    keys = ["connection_id", "entity", "name", "cause", "direction"]
    start = since_start(F.col("start_ts"), starts)
    end = F.coalesce(since_start(F.col("end_ts"), starts), _lookup(ends, F.col("capture_id")))
    with_lane = with_columns(flow_intervals, [
        ("name", name),
        ("direction", F.coalesce(F.col("direction"), F.lit(""))),
        ("start", start),
        ("end", F.greatest(end, start)),
    ])
    # Orders a lane's intervals longest first, to keep the ones that matter.
    longest_first = Window.partitionBy("capture_id", *keys).orderBy((F.col("end") - F.col("start")).desc(), "start")
    lane_count = Window.partitionBy("capture_id", *keys)  # unordered: a lane's intervals
    return (
        with_columns(busiest(with_lane, keys, F.col("end") - F.col("start"), LANES), [
            ("_n", F.row_number().over(longest_first)),
            ("intervals", F.count(F.lit(1)).over(lane_count)),
        ])
        .where(F.col("_n") <= INTERVALS_PER_LANE)
        .select("capture_id", *keys, "_series_rank", "_series_total", "intervals", "start", "end",
                "start_packet_number", "end_packet_number", "detail")
    )


def violation_markers(violations: DataFrame, starts: Mapping[str, int]) -> DataFrame:
    """The earliest MARKERS_PER_RULE violations of each rule, as points in time."""
    # Orders a rule's violations in time, to mark the earliest.
    earliest = Window.partitionBy("capture_id", "rule_id").orderBy("ts", "connection_id", "frame_index")
    packet = F.col("packet_number") if "packet_number" in violations.columns else F.lit(None)
    return (
        violations.where(F.col("ts").isNotNull())
        .withColumn("_n", F.row_number().over(earliest))
        .where(F.col("_n") <= MARKERS_PER_RULE)
        .select("capture_id", "rule_id", "severity", "connection_id", "channel", "handle",
                since_start(F.col("ts"), starts).alias("x"), packet.cast("long").alias("packet_number"))
    )
