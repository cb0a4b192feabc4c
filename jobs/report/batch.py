"""Several small queries of the report answered by one Spark query.

Each of the report's tables and charts is a few rows a capture, but asked on its own it is a Spark
query with its planning, its jobs (one a shuffle stage under adaptive execution) and its round
trips; asked one after another, each waits for the last. ``collect_together`` puts them side by
side in one query: a union whose every branch is one query's rows as a struct column of its own,
the other branches' columns null. The shuffle stages of all branches are then planned once and
run as they are ready, and one collect brings every row back with its own types.

The union keeps no order: callers order their rows in Python (they are bounded rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce

import pyspark.sql.functions as F
from pyspark.sql import DataFrame, Row
from pyspark.sql.types import StructType

_QUERY = "_query"


def collect_together(queries: Mapping[str, DataFrame]) -> dict[str, list[Row]]:
    """Name -> the rows of that query, all found by one Spark query (in no particular order)."""
    if not queries:
        return {}
    names = list(queries)
    shapes = [StructType(queries[name].schema.fields) for name in names]

    def branch(position: int, df: DataFrame) -> DataFrame:
        rows = [
            F.struct(*[F.col(f"`{c}`") for c in df.columns]) if other == position else F.lit(None).cast(shape)
            for other, shape in enumerate(shapes)
        ]
        return df.select(F.lit(position).alias(_QUERY), *[r.alias(f"_{i}") for i, r in enumerate(rows)])

    union = reduce(DataFrame.unionAll, [branch(i, queries[name]) for i, name in enumerate(names)])
    found: dict[str, list[Row]] = {name: [] for name in names}
    for row in union.collect():
        position = row[_QUERY]
        found[names[position]].append(row[f"_{position}"])
    return found
