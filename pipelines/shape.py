"""Rows put in a table's shape, for pipelines that build a table from several differently shaped parts."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType


def in_schema(df: DataFrame, schema: StructType, **columns: Column) -> DataFrame:
    """``df`` as rows of ``schema``, field by field: the column given in ``columns`` under the
    field's name, else ``df``'s column of that name, else null; each cast to the field's type."""
    have = {f.name: f.dataType for f in df.schema.fields}
    return df.select(
        *[
            # A column of the field's name and type is taken as it is: no cast or alias to build
            # (each a Py4J round trip, and the analyser drops a cast to the same type anyway).
            F.col(f.name)
            if f.name not in columns and have.get(f.name) == f.dataType
            else (columns[f.name] if f.name in columns else F.col(f.name) if f.name in have else F.lit(None))
            .cast(f.dataType)
            .alias(f.name)
            for f in schema.fields
        ]
    )
