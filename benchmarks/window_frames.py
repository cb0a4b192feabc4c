"""The nearest later value of a partition, three ways: Spark's frame to the partition's end, a
growing frame in reverse order, and ``lead IGNORE NULLS`` (``pipelines.partitioning.next_value``).

One command:

    .venv/bin/python benchmarks/window_frames.py [--rows 10000,20000,40000] [--out out/bench-window-frames]

For each row count, one partition (a TCP direction, a consumer, a link of a long capture) of that many
rows, one in seven holding a value, is given each row's nearest later value each way and summed (one
Spark job each, in one warm session; a first job each way warms the JVM and is not counted):

- ``to the end``: ``first(value, ignorenulls)`` over ``rowsBetween(1, unboundedFollowing)``, what
  three diagnosis measures used until 2026-11-28;
- ``reversed``: ``last(value, ignorenulls)`` over the rows before, ordered backwards (one more sort
  where the ascending order is sorted for other windows anyway);
- ``lead``: ``next_value``, ``lead(value, 1) IGNORE NULLS`` over the ascending order.

All must give the same sum. Wall seconds printed and written to ``OUT/window_frames.json`` with the
machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pyspark.sql import Column, SparkSession, Window
from pyspark.sql import functions as F

from amqpscope.pipelines.partitioning import next_value


def to_the_end(name: str) -> Column:
    return F.first(name, ignorenulls=True).over(
        Window.partitionBy("k").orderBy("i").rowsBetween(1, Window.unboundedFollowing)
    )


def reversed_frame(name: str) -> Column:
    return F.last(name, ignorenulls=True).over(
        Window.partitionBy("k").orderBy(F.col("i").desc()).rowsBetween(Window.unboundedPreceding, -1)
    )


def lead_ignoring_nulls(name: str) -> Column:
    return next_value(name, Window.partitionBy("k").orderBy("i"))


WAYS = {"to the end": to_the_end, "reversed": reversed_frame, "lead": lead_ignoring_nulls}


def timed(spark: SparkSession, rows: int, way: str) -> tuple[float, int]:
    """Seconds to sum each row's nearest later value over one partition of ``rows`` rows, and the sum."""
    df = spark.range(rows).select(
        F.lit(1).alias("k"), F.col("id").alias("i"), F.when(F.col("id") % 7 == 0, F.col("id")).alias("v")
    )
    started = time.perf_counter()
    total = df.select(WAYS[way]("v").alias("x")).agg(F.sum("x")).collect()[0][0]
    return time.perf_counter() - started, int(total or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10000,20000,40000", help="rows of the one partition, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("out/bench-window-frames"))
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.rows.split(",")]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        for way in WAYS:  # the JVM warmed on both ways' code first
            timed(spark, 1000, way)
        results = []
        for rows in counts:
            sums = {}
            for way in WAYS:
                seconds, sums[way] = timed(spark, rows, way)
                results.append({"rows": rows, "way": way, "wall_s": round(seconds, 3)})
                print(f"{rows:>9} rows  {way:<10}  {seconds:8.3f} s", flush=True)
            if len(set(sums.values())) != 1:
                raise SystemExit(f"the ways disagree at {rows} rows: {sums}")
    finally:
        spark.stop()
    # Run as a script, benchmarks/ is first on sys.path.
    from ingest import _commit, machine

    args.out.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine(), "commit": _commit(), "results": results}
    (args.out / "window_frames.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
