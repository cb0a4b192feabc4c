"""pipelines.columns.with_columns: the rows of the same withColumn chain, in fewer plans; and
pipelines.partitioning.next_value, a window's nearest later value."""

from __future__ import annotations

import random
from functools import reduce

import pyspark.sql.functions as F
import pytest
from pyspark.sql import Window
from pyspark.testing import assertDataFrameEqual

from amqpscope.pipelines import columns
from amqpscope.pipelines.columns import with_columns
from amqpscope.pipelines.partitioning import next_value


@pytest.fixture
def rows(spark):
    return spark.createDataFrame([("a", 1, 10), ("a", 2, 20), ("b", 3, 30), ("b", 4, None)], "k string, i int, v int")


def _chain(df, added):
    return reduce(lambda acc, item: acc.withColumn(*item), added, df)


def _cases():
    # Built per test: PySpark needs an active session to build a window specification.
    so_far = Window.partitionBy("k").orderBy("i").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return {
        "independent": [("x", F.col("i") + 1), ("y", F.col("v") * 2), ("z", F.lit("v"))],
        "uses the one before": [("x", F.col("i") + 1), ("y", F.col("x") * 2), ("z", F.col("y") - F.col("x"))],
        "replaces, then uses": [("v", F.coalesce("v", F.lit(0))), ("x", F.col("v") + 1), ("v", F.col("v") * 10)],
        "uses the old one, then replaces": [("x", F.col("v") + 1), ("v", F.lit(7)), ("y", F.col("v"))],
        "windows": [
            ("s", F.sum("v").over(so_far)),
            ("n", F.count("v").over(so_far)),
            ("m", F.max("s").over(so_far)),
            ("d", F.col("m") - F.col("n")),
        ],
        "star": [("x", F.lit(1)), ("all", F.struct("*"))],
        "quoted": [("a b", F.col("i") + 1), ("c", F.col("`a b`") * 3)],
    }


CASES = [
    "independent",
    "uses the one before",
    "replaces, then uses",
    "uses the old one, then replaces",
    "windows",
    "star",
    "quoted",
]


@pytest.mark.parametrize("case", CASES)
def test_same_rows_as_the_chain(spark, rows, case):
    cases = _cases()
    assert sorted(cases) == sorted(CASES)
    added = cases[case]
    actual = with_columns(rows, added)
    expected = _chain(rows, added)
    assert actual.columns == expected.columns
    assertDataFrameEqual(actual, expected)


def test_columns_that_do_not_use_each_other_are_one_plan(spark, rows, monkeypatch):
    calls = []
    original = type(rows).withColumns
    monkeypatch.setattr(type(rows), "withColumns", lambda df, group: calls.append(list(group)) or original(df, group))
    with_columns(
        rows, [("x", F.col("i") + 1), ("y", F.col("v") * 2), ("z", F.col("x") + F.col("y")), ("w", F.col("k"))]
    )
    assert calls == [["x", "y"], ["z", "w"]]


@pytest.mark.parametrize(
    "column, names, used",
    [
        (lambda: F.col("_prev_more"), ["_prev"], False),
        (lambda: F.col("_prev_more"), ["_prev_more"], True),
        (lambda: F.lit(2) * F.col("i"), ["x"], False),
        (lambda: F.count("*"), ["x"], True),
        (lambda: F.col("`a b`") + 1, ["a b"], True),
    ],
)
def test_uses(spark, column, names, used):
    # Built in the test: a Column needs the session's JVM.
    assert columns._uses(column(), names) is used


def test_next_value_is_the_nearest_later_value_of_the_rows_partition(spark):
    draw = random.Random(7)
    data = [(key, i, draw.choice([None, None, draw.randrange(100)])) for key in "abc" for i in range(40)]
    draw.shuffle(data)
    df = spark.createDataFrame(data, "k string, i int, v int")
    expected = {
        (key, i): next((w for k2, j, w in sorted(data) if k2 == key and j > i and w is not None), None)
        for key, i, _ in data
    }
    found = df.select("k", "i", next_value("v", Window.partitionBy("k").orderBy("i")).alias("n")).collect()
    assert {(r.k, r.i): r.n for r in found} == expected
    assert sum(n is None for n in expected.values()) >= 3  # each key's last rows have none after them
