"""Delta file statistics from the Parquet footers Spark wrote: row count, and per column minimum,
maximum and null count, so that readers of the lake (Spark, delta-rs, Databricks SQL) can skip files.

Delta's statistics (PROTOCOL.md, "Per-file Statistics") are per leaf column of the table schema,
nested structs as nested objects; like delta-spark we give no min / max for binary, boolean, map,
array or decimal columns, and only null counts where no min / max is kept. Strings longer than
STRING_PREFIX characters keep a prefix as the minimum and the prefix followed by U+10FFFF (above
every character) as the maximum, so both stay true bounds. Partition columns are in the log, not
the files, and have no statistics.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

STRING_PREFIX = 32
_ABOVE_EVERY_CHARACTER = "\U0010ffff"
_NO_BOUNDS = (BinaryType, BooleanType, DecimalType)


def _leaves(schema: StructType, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], DataType]]:
    """Leaf columns outside lists and maps, by path (a map or list counts as one leaf, null counts only)."""
    leaves: list[tuple[tuple[str, ...], DataType]] = []
    for field in schema.fields:
        path = (*prefix, field.name)
        if isinstance(field.dataType, StructType):
            leaves += _leaves(field.dataType, path)
        else:
            leaves.append((path, field.dataType))
    return leaves


def _bound(value: Any, data_type: DataType, upper: bool) -> Any:
    """A footer min / max as Delta's JSON statistics spell it; None when it cannot be a bound."""
    if isinstance(data_type, StringType):
        if not isinstance(value, str):
            return None
        if len(value) <= STRING_PREFIX:
            return value
        return value[:STRING_PREFIX] + _ABOVE_EVERY_CHARACTER if upper else value[:STRING_PREFIX]
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        if not isinstance(value, dt.datetime):
            return None
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(data_type, DateType):
        return value.isoformat() if isinstance(value, dt.date) else None
    if isinstance(data_type, (DoubleType, FloatType)):
        return value if isinstance(value, (int, float)) and math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def _nest(flat: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, value in flat.items():
        node = nested
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = value
    return nested


def file_stats(file_path: str, schema: StructType, partition_columns: Sequence[str]) -> str:
    """The Delta ``stats`` JSON of one Parquet file of a table with ``schema``."""
    metadata = pq.read_metadata(file_path)  # the footer only
    data_schema = StructType([f for f in schema.fields if f.name not in partition_columns])
    # Parquet leaf paths ("s.x", "m.key_value.key", "tags.list.element") to column positions.
    positions: dict[str, list[int]] = {}
    for index in range(metadata.num_columns):
        positions.setdefault(metadata.schema.column(index).path, []).append(index)
    minimum: dict[tuple[str, ...], Any] = {}
    maximum: dict[tuple[str, ...], Any] = {}
    nulls: dict[tuple[str, ...], int] = {}
    for path, data_type in _leaves(data_schema):
        columns = positions.get(".".join(path), [])
        compound = isinstance(data_type, (ArrayType, MapType))
        if compound:
            # A list or map: nulls of the value itself are those of its first leaf at the top level;
            # Parquet does not tell them apart from empty ones, so no count rather than a wrong one.
            continue
        if len(columns) != 1:
            continue
        chunks = [metadata.row_group(g).column(columns[0]).statistics for g in range(metadata.num_row_groups)]
        if metadata.num_row_groups == 0:
            nulls[path] = 0
            continue
        if any(s is None or s.null_count is None for s in chunks):
            continue
        nulls[path] = int(sum(s.null_count for s in chunks))
        if isinstance(data_type, _NO_BOUNDS):
            continue
        with_values = [s for s in chunks if s.num_values > 0]
        if not with_values or not all(s.has_min_max for s in with_values):
            continue
        low = _bound(min(s.min for s in with_values), data_type, upper=False)
        high = _bound(max(s.max for s in with_values), data_type, upper=True)
        if low is not None and high is not None:
            minimum[path], maximum[path] = low, high
    return json.dumps(
        {
            "numRecords": metadata.num_rows,
            "minValues": _nest(minimum),
            "maxValues": _nest(maximum),
            "nullCount": _nest(nulls),
        }
    )
