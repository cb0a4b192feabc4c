"""Columns added in order, as few plans as their dependencies allow.

A chain of ``withColumn`` calls builds and analyses one plan per column, and each window
expression in it becomes a ``Window`` operator of its own. ``with_columns`` adds consecutive
columns that do not use one another in one ``withColumns``: one plan analysed for the group, and
Spark puts the group's window expressions over one window specification into one operator.
``other_direction`` is the direction the other end of a connection sends in. ``lower_median`` is
an exact median that every engine computes alike. ``union_all`` unions DataFrames by name in a
balanced tree: a plan as deep as the log of their count, not the count (a Spark Connect plan is a
nested message, and a client refuses one nested deeper than its protobuf limit).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# A star (``struct(*)``, ``count(*)``) stands for every column; a product is printed ``a * b``.
_STAR = re.compile(r"(^|[(,]\s*)\*")


def with_columns(df: DataFrame, columns: Iterable[tuple[str, Column]]) -> DataFrame:
    """``df`` with ``columns`` (name, expression) added or replaced in order, as the same chain of
    ``withColumn`` calls would: each expression sees the columns before it in the list."""
    group: dict[str, Column] = {}
    for name, column in columns:
        if group and (name in group or _uses(column, group)):
            df = df.withColumns(group)
            group = {}
        group[name] = column
    return df.withColumns(group) if group else df


def _uses(column: Column, names: Iterable[str]) -> bool:
    # From the expression as Spark prints it: a name that only looks used (a string literal, a
    # struct field of that name) starts a new group too, which costs a plan, not a result.
    text = str(column)
    if _STAR.search(text):
        return True
    return any(re.search(rf"(?<![\w`]){re.escape(name)}(?![\w`])|`{re.escape(name)}`", text) for name in names)


def other_direction(direction: Column) -> Column:
    """The direction the peer of the endpoint sending in ``direction`` sends in (c2s <-> s2c)."""
    return F.when(direction == "c2s", "s2c").otherwise("c2s")


def lower_median(values: Column) -> Column:
    """The group's median value, the lower of the two middle ones in an even count: the value at rank
    ceil(n / 2), which Spark's percentile_approx(0.5) gives too while a group holds fewer values than
    its accuracy (10,000), but the same on every engine (Sail's approximation is another one)."""
    ordered = F.sort_array(F.collect_list(values))  # nulls left out
    middle = F.element_at(ordered, (F.floor((F.size(ordered) - 1) / 2) + 1).cast("int"))
    return F.when(F.size(ordered) > 0, middle)


def union_all(frames: Iterable[DataFrame]) -> DataFrame:
    """The rows of ``frames`` by column name, in their order, as ``reduce(DataFrame.unionByName,
    frames)`` gives them, through a balanced tree of unions."""
    level = list(frames)
    if not level:
        raise ValueError("union_all of no DataFrame")
    while len(level) > 1:
        paired = [a.unionByName(b) for a, b in zip(level[::2], level[1::2])]
        level = paired + level[len(paired) * 2 :]
    return level[0]
