"""The charts' sums of seconds are the same whatever order a plan adds them in (series_grid.exact_sum)."""

from __future__ import annotations

import math

from pyspark.sql import functions as F

from amqpscope.pipelines.report.series_grid import exact_sum

SECONDS = [0.1, 0.2, 0.3, 1 / 3, 2.675, 1e-10, 12345.678901234, 0.0271, 86400.000001]


def test_exact_sum_is_the_whole_seconds_and_nanoseconds_summed_whatever_the_order(spark):
    want = sum(math.floor(v) for v in SECONDS) + sum(math.floor((v - math.floor(v)) * 1e9) for v in SECONDS) / 1e9
    for order, partitions in ((SECONDS, 1), (SECONDS[::-1], 3), (SECONDS[3:] + SECONDS[:3], 2)):
        df = spark.createDataFrame([(v,) for v in order], "v double").repartition(partitions)
        assert df.agg(exact_sum(F.col("v")).alias("s")).first().s == want
