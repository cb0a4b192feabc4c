"""The time grid every chart of the report shares, and the two kinds of series drawn on it.

A capture's buckets are ``bucket_width(span)`` seconds wide from its first packet: the smallest
width of a 1-2-5 ladder that gives at most ``BUCKETS`` buckets, so a chart has a few hundred
points whatever the capture's length. Two kinds of series (rows of ``schemas.report.CHART_SERIES_SCHEMA``):

- **counts** (messages published, acks, connections opened ...): the events in each bucket, every
  bucket of the capture present, zero when nothing happened. A rate is never held through an
  empty bucket, and a count divided by the width is the bucket's mean rate.
- **states** (unacked, credit, window, outstanding confirms): drawn as steps, the value holding
  until the next point. A series with at most ``POINTS`` points keeps them all; a longer one keeps
  one point per bucket, its first time and the extreme that matters (the most unacked, the least
  credit, the smallest window), so a stall never disappears in a summary.

Only the ``SERIES`` busiest series of a chart are kept; ``series_total`` says how many there were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import with_columns
from amqpscope.pipelines.shape import in_schema
from amqpscope.schemas.report import CHART_SERIES_SCHEMA

BUCKETS = 300  # buckets of a capture at most (for captures up to 300 h)
# Bucket widths in seconds, a 1-2-5 ladder: the smallest giving at most BUCKETS buckets is used.
WIDTHS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
)
POINTS = 400  # points of a state series kept as they are
SERIES = 12  # series of a chart and capture at most

# Every series is named by these columns (null where a chart has no such key).
KEYS = ("connection_id", "channel", "name", "direction")


def bucket_width(span_s: float) -> float:
    """The bucket width of a capture spanning ``span_s`` seconds (what ``bucket_grid`` computes)."""
    return next((w for w in WIDTHS if span_s / w <= BUCKETS), float(-(-span_s // BUCKETS)))


def _width_of(span_s: Column) -> Column:
    width = F.ceil(span_s / F.lit(BUCKETS)).cast("double")  # beyond the ladder: whole seconds
    for w in reversed(WIDTHS):
        width = F.when(span_s / F.lit(w) <= BUCKETS, F.lit(w)).otherwise(width)
    return width


def bucket_grid(captures: DataFrame) -> DataFrame:
    """Per capture: ``_start_us`` (first packet, epoch µs), ``bucket_s``, ``_buckets`` (their number)
    and ``_span_s`` (first to last packet)."""
    start = F.unix_micros("first_ts")
    span = (F.unix_micros("last_ts") - start) / F.lit(1e6)
    return with_columns(
        captures.where(F.col("first_ts").isNotNull()).select(
            "capture_id", start.alias("_start_us"), span.alias("_span_s")
        ),
        [
            ("bucket_s", _width_of(F.col("_span_s"))),
            ("_buckets", (F.floor(F.col("_span_s") / F.col("bucket_s")) + 1).cast("int")),
        ],
    )


def since_start(ts: str | Column) -> Column:
    """Seconds since the capture's first packet (needs the grid's ``_start_us``), exact to the µs."""
    return (F.unix_micros(F.col(ts) if isinstance(ts, str) else ts) - F.col("_start_us")) / F.lit(1e6)


def _bucket(ts: str | Column) -> Column:
    # Whole microseconds over the width in microseconds: 30 ms after the start is bucket 3 of 10 ms.
    return F.floor(
        (F.unix_micros(F.col(ts) if isinstance(ts, str) else ts) - F.col("_start_us"))
        / F.round(F.col("bucket_s") * F.lit(1e6))
    ).cast("int")


_KEY_TYPES = {"connection_id": "string", "channel": "int", "name": "string", "direction": "string"}


def keyed(df: DataFrame, **keys: Column | str) -> DataFrame:
    """``df`` with the series keys (KEYS) given here, by column name or expression; the others null."""
    given = {k: keys[k] for k in KEYS if k in keys}
    return df.withColumns(
        {
            k: (F.col(v) if isinstance(v, str) else v).cast(_KEY_TYPES[k])
            if k in given
            else F.lit(None).cast(_KEY_TYPES[k])
            for k, v in ((k, given.get(k)) for k in KEYS)
        }
    )


def exact_sum(column: Column) -> Column:
    """The sum of a column of seconds (doubles), the same whatever order the rows come in and on
    every engine. Each value is split into whole seconds (its floor) and whole nanoseconds of the
    rest; both are summed exactly as longs, then added as seconds. Floor, the subtraction of a
    value's floor and the product by 1e9 are IEEE arithmetic, which every engine does alike. Added
    as doubles, the last digits depend on the plan's order (adaptive execution, the number of
    partitions); cast to decimals, on the engine (Spark casts a double's shortest decimal form,
    Sail its binary value)."""
    whole = F.floor(column)
    nanoseconds = F.floor((column - whole) * F.lit(1e9))
    return F.sum(whole.cast("long")).cast("double") + F.sum(nanoseconds.cast("long")) / F.lit(1e9)


def busiest(
    df: DataFrame, weight: Column, limit: int = SERIES, keys: Sequence[str] = KEYS, within: Sequence[str] = ()
) -> DataFrame:
    """``df`` restricted to the ``limit`` series (``keys``) of each capture (and ``within`` columns,
    e.g. the chart) with the most ``weight``, with ``series_rank`` (1 = busiest) and
    ``series_total`` (series there).

    The series are weighed by an aggregation and ranked among themselves (a few rows), then joined
    back: ``df``'s rows are never sorted, so a chart of a million points costs one hash
    aggregation, not a sort of them all in one task per capture and chart."""
    weights = df.groupBy("capture_id", *within, *keys).agg(F.sum(weight).alias("_weight"))
    return on_series(df, series_ranks(weights, limit, keys, within), ["capture_id", *within, *keys])


def series_ranks(
    weights: DataFrame, limit: int = SERIES, keys: Sequence[str] = KEYS, within: Sequence[str] = ()
) -> DataFrame:
    """Per series (capture_id, ``within``, ``keys``) of ``weights`` (a row each, its ``_weight``):
    ``series_rank`` and ``series_total``, the ``limit`` heaviest series of each capture only."""
    # Ranks a chart's series in a capture, heaviest first (ties by key, so the choice is stable).
    heaviest_first = Window.partitionBy("capture_id", *within).orderBy(F.col("_weight").desc(), *keys)
    in_capture = Window.partitionBy("capture_id", *within)  # unordered: counts the series
    return (
        weights.withColumn("series_rank", F.dense_rank().over(heaviest_first))
        .withColumn("series_total", F.max("series_rank").over(in_capture))
        .where(F.col("series_rank") <= limit)
        .drop("_weight")
    )


def on_series(df: DataFrame, per_series: DataFrame, series: Sequence[str]) -> DataFrame:
    """``df``'s rows of the series in ``per_series`` (a few rows: broadcast), with its other columns;
    a null key matches a null key (a series' keys are null where its chart has no such key)."""
    rows, small = df.alias("_rows"), F.broadcast(per_series).alias("_series")
    matched = reduce(Column.__and__, [F.col(f"_rows.{k}").eqNullSafe(F.col(f"_series.{k}")) for k in series])
    added = [F.col(f"_series.{c}") for c in per_series.columns if c not in series]
    return rows.join(small, matched, "inner").select("_rows.*", *added)


@dataclass(frozen=True)
class CountChart:
    """A chart of counts: ``events`` (capture_id, KEYS, metric, ts, n) summed per bucket for each of
    ``metrics``; its series ranked by their ``rank_by`` metric's total (None: every metric's; a
    ``w`` column in ``events``, when there is one, weighs instead)."""

    name: str
    events: DataFrame
    metrics: tuple[str, ...]
    rank_by: str | None = None


def counts(charts: Sequence[CountChart], grid: DataFrame) -> DataFrame:
    """Count charts, all in one pass: per chart, series and metric the sum of ``n`` in every bucket
    of the capture, zero where there is none (CHART_SERIES_SCHEMA rows)."""

    def weight(c: CountChart) -> Column:
        if "w" in c.events.columns:
            return F.col("w")
        return F.col("n") if c.rank_by is None else F.when(F.col("metric") == c.rank_by, F.col("n")).otherwise(F.lit(0))

    events = reduce(
        DataFrame.unionByName,
        [
            c.events.select(
                "capture_id",
                *KEYS,
                "metric",
                "ts",
                F.col("n").cast("double").alias("n"),
                F.lit(c.name).alias("chart"),
                weight(c).cast("double").alias("_w"),
            )
            for c in charts
        ],
    )
    counted = (
        events.join(F.broadcast(grid), "capture_id")
        .withColumn("_bucket", _bucket("ts"))
        .groupBy("capture_id", "chart", *KEYS, "metric", "_bucket")
        .agg(F.sum("n").alias("value"), F.sum("_w").alias("_w"))
    )
    # One pass over the counts: each series' buckets gathered on its row (a few hundred at most) with
    # its weight, the series ranked among themselves (a row each), the kept ones spread over every
    # bucket of the capture and every metric of their chart, zero where nothing was counted.
    cell = F.struct(F.col("metric"), F.col("_bucket"))
    per_series = counted.groupBy("capture_id", "chart", *KEYS).agg(
        F.sum("_w").alias("_weight"),
        F.map_from_entries(F.collect_list(F.struct(cell.alias("cell"), F.col("value")))).alias("_values"),
    )
    metrics = F.lit(None).cast("array<string>")
    for chart in charts:
        # Cast as the null it is chosen over: Sail otherwise types the cells below with names it cannot
        # cast ("Unsupported CAST from List(List(non-null Struct ...").
        names = F.array(*[F.lit(m) for m in chart.metrics]).cast("array<string>")
        metrics = F.when(F.col("chart") == chart.name, names).otherwise(metrics)
    buckets = F.sequence(F.lit(0), F.col("_buckets") - 1)
    every_cell = F.flatten(
        F.transform(metrics, lambda m: F.transform(buckets, lambda b: F.struct(m.alias("metric"), b.alias("_bucket"))))
    )
    # A count outside the grid's cells (none is expected) is kept as it is, as the sum of a cell's
    # zero and its counts would keep it.
    cells = F.array_union(every_cell, F.map_keys(F.col("_values")))
    filled = (
        series_ranks(per_series, within=["chart"])
        .join(F.broadcast(grid), "capture_id")
        .withColumn("_cell", F.explode(cells))
        .withColumns(
            {
                "metric": F.col("_cell.metric"),
                "_bucket": F.col("_cell._bucket"),
                "value": F.coalesce(F.element_at(F.col("_values"), F.col("_cell")), F.lit(0.0)),
            }
        )
    )
    return in_schema(filled, CHART_SERIES_SCHEMA, x=F.col("_bucket") * F.col("bucket_s"))


@dataclass(frozen=True)
class StateChart:
    """A step chart: ``events`` (capture_id, KEYS, ts, ``_order``: ties in time, and the columns
    ``values`` read) and per metric (column, aggregate in a bucket: max, min or sum); its series
    ranked by ``weight`` summed over their events (None: their number of events)."""

    name: str
    events: DataFrame
    values: Mapping[str, tuple[str, str]]
    weight: Column | None = None


def states(charts: Sequence[StateChart], grid: DataFrame, points: int = POINTS) -> DataFrame:
    """Step charts, all in one pass: each series' points as they are when it has at most
    ``points``, else one point per bucket (its first time, each metric's aggregate)."""
    first = {c.name: next(iter(c.values)) for c in charts}
    events = reduce(
        DataFrame.unionByName,
        [
            c.events.select(
                "capture_id",
                *KEYS,
                "ts",
                F.col("_order").cast("long").alias("_order"),
                F.lit(c.name).alias("chart"),
                (F.lit(1) if c.weight is None else c.weight).cast("double").alias("_w"),
                F.explode(
                    F.array(
                        *[
                            F.struct(
                                F.lit(metric).alias("metric"),
                                F.col(column).cast("double").alias("_value"),
                                F.lit(agg).alias("_agg"),
                            )
                            for metric, (column, agg) in c.values.items()
                        ]
                    )
                ).alias("_m"),
            )
            .select("*", "_m.*")
            .drop("_m")
            for c in charts
        ],
    )
    series = ["capture_id", "chart", *KEYS]
    first_metric = F.col("metric") == _lookup(first, F.col("chart"))
    # One aggregation over the points: per series and metric their number (a short series keeps
    # each point) and the weight that ranks the series (its first metric's points'), gathered on the
    # series' row; the series ranked among themselves (a row each).
    per_series = (
        events.groupBy(*series, "metric")
        .agg(
            F.count(F.lit(1)).alias("_n"),
            F.sum(F.when(first_metric, F.col("_w")).otherwise(F.lit(0.0))).alias("_weight"),
        )
        .groupBy(*series)
        .agg(
            F.sum("_weight").alias("_weight"),
            F.map_from_entries(F.collect_list(F.struct("metric", "_n"))).alias("_counts"),
        )
    )
    kept = series_ranks(per_series, within=["chart"])
    # A short series' points are told apart by their time and order (no two of a series share both).
    short = F.col("_n") <= points
    points_of = with_columns(
        on_series(events.join(F.broadcast(grid), "capture_id"), kept, series),
        [
            ("_n", F.element_at(F.col("_counts"), F.col("metric"))),
            ("_x", since_start("ts")),
            ("_bucket", F.when(short, F.lit(-1)).otherwise(_bucket("ts"))),
            ("_point_ts", F.when(short, F.col("ts"))),
            ("_point_order", F.when(short, F.col("_order"))),
        ],
    )
    aggregated = points_of.groupBy(
        *series, "metric", "series_rank", "series_total", "bucket_s", "_bucket", "_point_ts", "_point_order"
    ).agg(
        F.min("_x").alias("x"),
        F.max("_value").alias("_max"),
        F.min("_value").alias("_min"),
        F.sum("_value").alias("_sum"),
        F.first("_agg").alias("_agg"),
    )
    value = (
        F.when(F.col("_agg") == "min", F.col("_min"))
        .when(F.col("_agg") == "sum", F.col("_sum"))
        .otherwise(F.col("_max"))
    )
    return in_schema(aggregated, CHART_SERIES_SCHEMA, value=value)


def _lookup(mapping: Mapping[str, str], key: Column) -> Column:
    return F.create_map(*[F.lit(v) for pair in sorted(mapping.items()) for v in pair])[key]
