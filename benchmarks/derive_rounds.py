"""Derive's tables built again and again in one process: what a first pass through the code costs.

One command:

    .venv/bin/python benchmarks/derive_rounds.py LAKE [--capture-id ID] [--steps messages,flow_state]
                                                [--rounds AAA] [--set KEY=VALUE ...] [--java-options "..."]
                                                [--out out/bench-rounds]

``LAKE`` is a lake ``analyze`` wrote (for instance the one ``end_to_end.py`` leaves for a capture of
1 M frames). In one fresh process (its own JVM, started as analyze starts it, set up for the
capture's size by ``jobs.engine.session.sized_for``), the tables of ``--steps`` are built by
``pipelines.tables.Build`` from the capture's stored bronze tables (and the stored tables of other
steps that they read: ``--steps diagnosis`` builds the diagnosis alone), the frames partitioned by
connection and persisted as ingest hands them to derive, each table written as Parquet and read back
by the tables after it, as derive's store does. That is done once a letter of ``--rounds``; the
rounds marked ``B`` run with the Spark SQL settings of ``--set``, the ``A`` rounds without them, so
one process can alternate a setting on a warm JVM. ``--java-options`` are the driver JVM's options
for the whole process (a JIT setting, say), compared between processes.

For every round: its wall seconds; the JVM's CPU seconds by thread (HotSpot's C2 and C1 compilers,
Spark's task threads, the garbage collector, the rest: the driver's threads that analyse and plan;
and the threads that ended during the round), read from ``/proc/<pid>/task``; the classes Spark
generated and Janino compiled (``CodegenMetrics``); each table's wall and JVM CPU seconds; and each
shared result's (``pipelines.tables.SHARED``: its checkpoint, apart from the tables). The
first round is analyze's case: a JVM that has run none of this code yet. Printed and written to
``OUT/derive_rounds.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.engine.session import sized_for
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.derive import bronze_tables
from amqpscope.jobs.stages.stages import job_session
from amqpscope.pipelines import tables
from amqpscope.pipelines.partitioning import by_connection

_TICK = os.sysconf("SC_CLK_TCK")


def _thread_kind(name: str) -> str:
    if name.startswith("C2 "):
        return "c2"
    if name.startswith("C1 "):
        return "c1"
    if name.startswith("Executor task"):
        return "tasks"
    if "GC" in name:
        return "gc"
    return "other"


def _cpu_seconds(stat: Path) -> float:
    """user + system CPU seconds of a /proc ``stat`` file (a process's or a thread's)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm) "; comm may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK


def jvm_threads_cpu(pid: int) -> dict[str, tuple[str, float]]:
    """The JVM ``pid``'s live threads: thread id -> (kind, ``_thread_kind``; CPU seconds so far)."""
    out: dict[str, tuple[str, float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            cpu = _cpu_seconds(Path(f"/proc/{pid}/task/{tid}/stat"))
        except OSError:  # the thread ended meanwhile
            continue
        out[tid] = (_thread_kind(name), cpu)
    return out


def threads_delta(before: dict[str, tuple[str, float]], after: dict[str, tuple[str, float]], total: float) -> dict:
    """CPU seconds by thread kind between two ``jvm_threads_cpu``; ``ended``: the rest of the JVM's
    ``total``, spent by threads that ended before ``after`` (Spark's idle task threads end after 60 s)."""
    out: dict[str, float] = {}
    for tid, (kind, cpu) in after.items():
        out[kind] = out.get(kind, 0.0) + cpu - before.get(tid, (kind, 0.0))[1]
    out["ended"] = total - sum(out.values())
    return {kind: round(cpu, 2) for kind, cpu in sorted(out.items())}


def jvm_cpu(pid: int) -> float:
    """CPU seconds of the whole JVM ``pid`` (its ended threads included)."""
    return _cpu_seconds(Path(f"/proc/{pid}/stat"))


def _janino_compilations(spark: SparkSession) -> int:
    return int(
        spark.sparkContext._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()
    )


def step_tables(steps: list[str]) -> list[str]:
    """The tables derive writes in ``steps``, in declaration order (a protocol's tables too when
    the capture does not speak it: ``build_round`` then skips them, as derive writes them empty)."""
    return [n for n in tables.in_order(tables.names(built=True)) if tables.table(n).step in steps]


def build_round(
    spark: SparkSession,
    bronze: dict[str, DataFrame],
    names: list[str],
    spoken: frozenset[str],
    out: Path,
) -> dict:
    """``names`` built from ``bronze`` once, each table written under ``out`` and read back."""
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    shutil.rmtree(out, ignore_errors=True)
    per_table: dict[str, dict[str, float]] = {}
    per_shared: dict[str, dict[str, float]] = {}

    def store(table: tables.Table, rows: DataFrame | None) -> DataFrame:
        if rows is None:
            return tables.no_rows(bronze["frames"], table)
        started, cpu = time.perf_counter(), jvm_cpu(pid)
        rows.write.parquet(str(out / table.name))
        per_table[table.name] = {
            "wall_s": round(time.perf_counter() - started, 2),
            "jvm_cpu_s": round(jvm_cpu(pid) - cpu, 2),
        }
        return spark.read.parquet(str(out / table.name))

    class Timed(tables.Build):
        """Build, with each shared result's computation (its checkpoint) timed as a table's write is."""

        def value(self, name: str) -> DataFrame:
            if name not in tables.SHARED or name in self._shared:
                return super().value(name)
            started, cpu = time.perf_counter(), jvm_cpu(pid)
            rows = super().value(name)
            per_shared[name] = {
                "wall_s": round(time.perf_counter() - started, 2),
                "jvm_cpu_s": round(jvm_cpu(pid) - cpu, 2),
            }
            return rows

    build = Timed(
        bronze,
        {"limits": DiagnosisThresholds(), "run_id": "derive-rounds", "spoken": spoken},
        store,
        empty=tables.without_rows(spoken),
    )
    threads, janino, cpu = jvm_threads_cpu(pid), _janino_compilations(spark), jvm_cpu(pid)
    started = time.perf_counter()
    for name in names:
        build.table(name)
    wall = time.perf_counter() - started
    after, used = jvm_threads_cpu(pid), jvm_cpu(pid) - cpu
    return {
        "wall_s": round(wall, 2),
        "jvm_cpu_s": round(used, 2),
        "threads_cpu_s": threads_delta(threads, after, used),
        "janino_compilations": _janino_compilations(spark) - janino,
        "tables": per_table,
        "shared": per_shared,
    }


def rounds(
    spark: SparkSession,
    lake: Lake,
    capture_id: str,
    steps: list[str],
    order: str,
    settings: dict[str, str],
    work: Path,
) -> list[dict]:
    """One ``build_round`` a letter of ``order``; ``B`` rounds with the SQL ``settings``."""
    spoken = frozenset(
        c["protocol"] for c in lake.read_rows("connections", tables.table("connections").schema, [capture_id])
    )
    bronze = bronze_tables(lake, [capture_id])
    frames = by_connection(bronze["frames"]).persist(StorageLevel.DISK_ONLY)  # as ingest hands them over
    frames.count()
    bronze["frames"] = frames
    names = step_tables(steps)
    # The tables of other steps that these read are taken as stored, not built again.
    for name in tables.DERIVED:
        if name not in names and lake.exists(name):
            bronze[name] = lake.read(name, tables.table(name).schema).filter(F.col("capture_id") == capture_id)
    done = []
    try:
        for i, letter in enumerate(order):
            for key, value in settings.items():
                if letter == "B":
                    spark.conf.set(key, value)
                else:
                    spark.conf.unset(key)
            result = build_round(spark, bronze, names, spoken, work / f"round-{i}")
            done.append({"round": i, "letter": letter, **result})
            print(
                f"round {i} {letter}: {result['wall_s']} s wall, {result['jvm_cpu_s']} JVM CPU s "
                f"{result['threads_cpu_s']}, {result['janino_compilations']} generated classes",
                flush=True,
            )
    finally:
        for key in settings:
            spark.conf.unset(key)
        frames.unpersist()
    return done


def _only_capture(lake: Lake) -> str:
    ids = sorted(lake.capture_ids("frames"))
    if len(ids) != 1:
        raise SystemExit(f"the lake holds {len(ids)} captures: name one with --capture-id")
    return ids[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lake", type=Path, help="a lake analyze wrote")
    parser.add_argument("--capture-id", help="its capture to build from (default: its only one)")
    parser.add_argument("--steps", default="messages,flow_state", help="derive's steps whose tables are built")
    parser.add_argument("--rounds", default="AAA", help="one letter a round: A, or B with the --set settings")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a SQL setting of B rounds")
    parser.add_argument("--java-options", default="", help="the driver JVM's options for the whole process")
    parser.add_argument("--out", type=Path, default=Path("out/bench-rounds"))
    args = parser.parse_args(argv)
    if set(args.rounds) - {"A", "B"}:
        parser.error("--rounds: letters A and B only")
    settings = dict(s.split("=", 1) for s in args.set)
    steps = [s for s in args.steps.split(",") if s]
    unknown = set(steps) - {str(t.step) for t in tables.TABLES.values() if t.build is not None}
    if unknown:
        parser.error(f"--steps: no step of built tables named {', '.join(sorted(unknown))}")
    if "verdicts" in steps:  # dq_summary needs the Great Expectations run's suites
        parser.error("--steps: verdicts runs Great Expectations, which this does not")
    args.out.mkdir(parents=True, exist_ok=True)
    conf = {"spark.driver.extraJavaOptions": args.java_options} if args.java_options else {}
    config = AnalyzeConfig(lake=args.lake, spark_conf=conf)
    with job_session(config, "amqpscope-bench-rounds") as spark:
        lake = Lake.of(spark, config, run_id="derive-rounds")
        capture_id = args.capture_id or _only_capture(lake)
        capture_bytes = next(
            int(r["file_size"]) for r in lake.read("captures").filter(F.col("capture_id") == capture_id).collect()
        )
        with sized_for(spark, capture_bytes):  # set up as analyze is for that capture
            done = rounds(spark, lake, capture_id, steps, args.rounds, settings, args.out / "tables")
    # Run as a script, benchmarks/ is first on sys.path: the machine and the code measured are
    # recorded as the other benchmarks record them.
    from ingest import _commit, machine

    result = {
        "machine": machine(),
        "commit": _commit(),
        "lake": str(args.lake),
        "capture_id": capture_id,
        "steps": steps,
        "settings": settings,
        "java_options": args.java_options,
        "rounds": done,
    }
    (args.out / "derive_rounds.json").write_text(json.dumps(result, indent=1))
    shutil.rmtree(args.out / "tables", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
