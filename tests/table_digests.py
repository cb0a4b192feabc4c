"""A digest of every table ``analyze`` writes, per capture: what the same-rows test compares.

A table's digest for one capture is the SHA-256 of its rows' own SHA-256 digests, sorted: every
column of every row counts (as Spark's JSON of the row, in the table's column order), the order in
which rows were written does not. ``tests/data/table_digests.json`` holds the digests written by
the code before the speed work (its commit is in the file); to write them again from the code of
the working tree (say, on ``main`` after a change that is meant to change rows):

    .venv/bin/python -m tests.table_digests tests/data/table_digests.json
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyspark.sql.functions as F
from pyspark.sql import DataFrame, SparkSession

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.analyze import analyze
from amqpscope.pipelines import tables as lake_tables
from tests.paths import ROOT, SAMPLES

# The three samples and the decoder and flow scenario captures (the bottleneck scenarios' 21 MB
# would make this the slowest test of the suite; their diagnosis has its own acceptance test).
CAPTURES = tuple(
    sorted(
        p
        for folder in (SAMPLES, SAMPLES / "decoders", SAMPLES / "flow")
        for p in folder.iterdir()
        if p.suffix in (".pcap", ".pcapng")
    )
)
# Every table analyze writes but those whose rows name the run that wrote them (dq_summary, runs).
TABLES = tuple(t.name for t in lake_tables.TABLES.values() if "run_id" not in t.schema.fieldNames())


def table_digests(spark: SparkSession, lake_root: Path, tables=TABLES) -> dict[str, dict[str, dict]]:
    """table -> capture_id -> {"rows": n, "sha256": digest} of the lake at ``lake_root``."""
    lake = Lake(spark, lake_root)
    digests: dict[str, dict[str, dict]] = {}
    for table in tables:
        df = lake.read(table)
        row_digest = F.sha2(F.to_json(F.struct(*[F.col(c) for c in df.columns])), 256)
        rows: dict[str, list[str]] = {}
        for r in df.select("capture_id", row_digest.alias("d")).collect():
            rows.setdefault(r.capture_id, []).append(r.d)
        digests[table] = {
            capture: {"rows": len(ds), "sha256": hashlib.sha256("\n".join(sorted(ds)).encode()).hexdigest()}
            for capture, ds in sorted(rows.items())
        }
    return digests


def sorted_rows(df: DataFrame, columns: list[str]) -> list[tuple[str, ...]]:
    """Every row of ``df``'s ``columns`` as strings (a map as its sorted items), sorted: two tables
    hold the same rows when these are equal, whatever order they were written in."""

    def value(v: object) -> str:
        return str(sorted(v.items())) if isinstance(v, dict) else str(v)

    return sorted(tuple(value(r[c]) for c in columns) for r in df.select(*columns).collect())


def analyze_samples(spark: SparkSession, lake_root: Path, runs: int = 1) -> None:
    """``analyze`` of every bundled capture in one run into ``lake_root`` (``runs`` times over)."""
    config = AnalyzeConfig(lake=lake_root, report=lake_root / "report.html", data_docs=lake_root / "docs")
    for _ in range(runs):
        analyze(spark, [str(c) for c in CAPTURES], config)


def _commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def main(out: str) -> None:
    from amqpscope.jobs.engine.session import build_session

    spark = build_session("local[2]", "amqpscope-table-digests", remember_py4j_lookups=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            analyze_samples(spark, Path(tmp) / "lake")
            digests = table_digests(spark, Path(tmp) / "lake")
    finally:
        spark.stop()
    document = {
        "written_by_commit": _commit(),
        "captures": [str(c.relative_to(ROOT)) for c in CAPTURES],
        "tables": digests,
    }
    Path(out).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1])
