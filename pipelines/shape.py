"""Rows put in a table's shape, for pipelines that build a table from several differently shaped parts."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType


def in_schema(df: DataFrame, schema: StructType, **columns: Column) -> DataFrame:
    """``df`` as rows of ``schema``, field by field: the column given in ``columns`` under the
    field's name, else ``df``'s column of that name, else null; each cast to the field's type."""
    have = {f.name: f.dataType for f in df.schema.fields}

    def field(f: StructField) -> Column:
        if f.name in columns:
            return columns[f.name].cast(f.dataType).alias(f.name)
        if have.get(f.name) == f.dataType:
            # Taken as it is: no cast or alias to build (each a Py4J round trip; the analyser
            # drops a cast to the same type anyway).
            return F.col(f.name)
        return (F.col(f.name) if f.name in have else F.lit(None)).cast(f.dataType).alias(f.name)

    return df.select(*[field(f) for f in schema.fields])
