"""Columns added in order, as few plans as their dependencies allow.

A chain of ``withColumn`` calls builds and analyses one plan per column, and each window
expression in it becomes a ``Window`` operator of its own. ``with_columns`` adds consecutive
columns that do not use one another in one ``withColumns``: one plan analysed for the group, and
Spark puts the group's window expressions over one window specification into one operator.
``other_direction`` is the direction the other end of a connection sends in.
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
