"""Flow-state throughput: every flow-state job on synthetic frames tables of realistic shape, on Spark.

One command:

    .venv/bin/python benchmarks/flow_state.py --frames 10000000 [--shape balanced|skewed|both]
                                              [--master local[2]] [--work DIR] [--driver-memory 12g]

1. A frames table of ``--frames`` rows is generated in Spark (``spark.range``, no Python loop) and
   written to Parquet under ``--work``, with a tcp_segments table of half as many rows. Connections
   alternate between the two protocols:
   - AMQP 1.0: a session (begin / begin) and two links in opposite directions, then cycles of 24
     frames: the receiver's flow granting 20 credits (session fields set as RabbitMQ does, incoming
     window 400), 20 transfers, a disposition settling them, a session flow, a heartbeat;
   - AMQP 0-9-1: a confirm channel and a consuming channel with prefetch 10, then per message
     publish + header + body, the broker's confirm, deliver + header + body, and the consumer's ack
     of the delivery 9 before (so unacked sits at the prefetch count).
   ``balanced``: 5,000-frame connections (2,000 at 10 M frames). ``skewed``: one AMQP 1.0 connection
   whose single link carries 90 % of all frames, the rest balanced.
2. Each flow-state job (``pipelines.flow_state``) runs on the stored tables and writes its table
   to Parquet (the timelines, as ``analyze`` stores them) or to Spark's ``noop`` sink (the derived
   tables, read from the stored timelines); wall time per job, frames per second and the totals
   are printed and written to ``WORK/flow_state.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from amqpscope.jobs.engine.session import build_session
from amqpscope.pipelines.tables import FLOW, Build, upstream
from amqpscope.schemas.frames import FRAMES_SCHEMA
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA

CONNECTION_FRAMES = 5000
SKEWED_SHARE = 0.9
T0_US = 1_795_000_000_000_000  # 2026-11-17, in microseconds
AMQP10_SETUP, AMQP10_CYCLE, CREDIT = 6, 24, 20
AMQP091_SETUP, AMQP091_CYCLE, PREFETCH = 9, 8, 10


def _pick(position: Column, values: dict[int, object], default: object = None) -> Column:
    """A column whose value depends on the frame's position in its cycle."""
    out = F.lit(default)
    for pos, value in values.items():
        out = F.when(position == pos, value if isinstance(value, Column) else F.lit(value)).otherwise(out)
    return out


def _layout(spark: SparkSession, frames: int, shape: str) -> DataFrame:
    """id -> (connection number, frame index in the connection, links on the connection)."""
    ids = spark.range(frames)
    heavy = int(frames * SKEWED_SHARE) if shape == "skewed" else 0
    rest = F.col("id") - heavy
    return ids.select(
        "id",
        F.when(F.col("id") < heavy, 0)
        .otherwise(F.lit(1 if heavy else 0) + F.floor(rest / CONNECTION_FRAMES))
        .alias("conn"),
        F.when(F.col("id") < heavy, F.col("id")).otherwise(rest % CONNECTION_FRAMES).alias("idx"),
        F.when(F.col("id") < heavy, 1).otherwise(2).alias("links"),
    )


def _amqp10(c: dict[str, Column]) -> dict[str, Column]:
    """Columns of an AMQP 1.0 connection's frame at index ``idx`` (see the module docstring)."""
    idx, links = F.col("idx"), F.col("links")
    j = idx - AMQP10_SETUP
    cycle, pos = F.floor(j / AMQP10_CYCLE), j % AMQP10_CYCLE
    on_b = (links == 2) & (cycle % 2 == 1)  # odd cycles of a two-link connection: the server sends
    before = F.when(links == 1, cycle).otherwise(F.floor(cycle / 2))  # earlier cycles of this link
    sender, receiver = F.when(on_b, "s2c").otherwise("c2s"), F.when(on_b, "c2s").otherwise("s2c")
    handle = F.when(on_b, 1).otherwise(0)
    client_sent = CREDIT * F.when(links == 1, cycle).otherwise(F.floor((cycle + 1) / 2))
    server_sent = CREDIT * F.when(links == 1, 0).otherwise(F.floor(cycle / 2))
    client_after = client_sent + F.when(on_b, 0).otherwise(CREDIT)  # after this cycle's transfers
    server_after = server_sent + F.when(on_b, CREDIT).otherwise(0)
    first_id = before * CREDIT
    setup = idx < AMQP10_SETUP
    in_cycle = {
        "direction": _pick(pos, {0: receiver, 21: receiver, 22: F.lit("c2s"), 23: F.lit("c2s")}, None),
        "method": _pick(pos, {0: "flow", 21: "disposition", 22: "flow", 23: None}, "transfer"),
    }
    in_cycle["direction"] = F.coalesce(in_cycle["direction"], sender)
    conn_name = F.col("conn").cast("string")
    setup_direction = _pick(idx, {0: "c2s", 1: "s2c", 2: "c2s", 3: "s2c", 4: "c2s", 5: "s2c"})
    setup_method = _pick(idx, {0: "begin", 1: "begin"}, "attach")
    is_flow = ~setup & (pos.isin(0, 22))
    return {
        **c,
        "protocol": F.lit("amqp-1.0"),
        "direction": F.when(setup, setup_direction).otherwise(in_cycle["direction"]),
        "method": F.when(setup, setup_method).otherwise(in_cycle["method"]),
        "frame_type": F.when(~setup & (pos == 23), "empty").otherwise("amqp"),
        "channel": F.when(~setup & (pos == 23), None).otherwise(F.lit(0)),
        "remote_channel": F.when(idx == 1, 0),
        "name": F.when(idx.isin(2, 3), F.concat(F.lit("A-"), conn_name)).when(
            idx.isin(4, 5), F.concat(F.lit("B-"), conn_name)
        ),
        "role": F.when(setup, _pick(idx, {2: "sender", 3: "receiver", 4: "receiver", 5: "sender"})).when(
            pos == 21, "receiver"
        ),
        "initial_delivery_count": F.when(idx.isin(2, 5), 0),
        "target_address": F.when(idx.isin(2, 3), F.concat(F.lit("/queues/q"), (F.col("conn") % 50).cast("string"))),
        "source_address": F.when(idx.isin(4, 5), F.concat(F.lit("/queues/q"), (F.col("conn") % 50).cast("string"))),
        "handle": F.when(setup, _pick(idx, {2: 0, 3: 0, 4: 1, 5: 1}))
        .when(pos.isin(21, 22, 23), None)
        .otherwise(handle),
        # A flow states its sender's transfers so far and the peer's it has received.
        "next_outgoing_id": F.when(idx.isin(0, 1), 0)
        .when(~setup & (pos == 0), F.when(on_b, client_sent).otherwise(server_sent))
        .when(~setup & (pos == 22), client_after),
        "next_incoming_id": F.when(~setup & (pos == 0), F.when(on_b, server_sent).otherwise(client_sent)).when(
            ~setup & (pos == 22), server_after
        ),
        "incoming_window": F.when(idx == 0, 5000).when(idx == 1, 400).when(is_flow, 400),
        "outgoing_window": F.when(idx.isin(0, 1), 5000).when(is_flow, 5000),
        "delivery_count": F.when(~setup & (pos == 0), before * CREDIT),
        "link_credit": F.when(~setup & (pos == 0), CREDIT),
        "drain": F.when(~setup & (pos == 0), False),
        "echo": F.when(~setup & (pos == 0), False),
        "delivery_id": F.when(~setup & (pos >= 1) & (pos <= CREDIT), first_id + pos - 1),
        "more": F.when(~setup & (pos >= 1) & (pos <= CREDIT), False),
        "settled": F.when(~setup & (pos == 21), True).when(~setup & (pos >= 1) & (pos <= CREDIT), False),
        "payload_size": F.when(~setup & (pos >= 1) & (pos <= CREDIT), 256),
        "first": F.when(~setup & (pos == 21), first_id),
        "last": F.when(~setup & (pos == 21), first_id + CREDIT - 1),
        "state": F.when(~setup & (pos == 21), "accepted"),
    }


def _amqp091(c: dict[str, Column]) -> dict[str, Column]:
    """Columns of an AMQP 0-9-1 connection's frame at index ``idx`` (see the module docstring)."""
    idx = F.col("idx")
    j = idx - AMQP091_SETUP
    m, pos = F.floor(j / AMQP091_CYCLE), j % AMQP091_CYCLE
    setup = idx < AMQP091_SETUP
    acks = ~setup & (pos == 7) & (m >= PREFETCH - 1)
    setup_methods = {
        0: "channel.open",
        1: "channel.open-ok",
        2: "confirm.select",
        3: "confirm.select-ok",
        4: "channel.open",
        5: "channel.open-ok",
        6: "basic.qos",
        7: "basic.consume",
        8: "basic.consume-ok",
    }
    cycle_methods = {0: "basic.publish", 3: "basic.ack", 4: "basic.deliver", 7: "basic.ack"}
    return {
        **c,
        "protocol": F.lit("amqp-0-9-1"),
        "direction": F.when(setup, _pick(idx, {1: "s2c", 3: "s2c", 5: "s2c", 8: "s2c"}, "c2s")).otherwise(
            _pick(pos, {0: "c2s", 1: "c2s", 2: "c2s", 7: "c2s"}, "s2c")
        ),
        "method": F.when(setup, _pick(idx, setup_methods))
        .when(~acks & (pos == 7), None)
        .otherwise(_pick(pos, cycle_methods)),
        "frame_type": F.when(setup, "method")
        .when(~acks & (pos == 7), "heartbeat")
        .otherwise(_pick(pos, {1: "header", 2: "body", 5: "header", 6: "body"}, "method")),
        "channel": F.when(setup, F.when(idx < 4, 1).otherwise(2))
        .when(~acks & (pos == 7), 0)
        .otherwise(F.when(pos < 4, 1).otherwise(2)),
        "prefetch_count": F.when(idx == 6, PREFETCH),
        "global": F.when(idx == 6, False),
        "queue": F.when(idx == 7, F.concat(F.lit("q"), (F.col("conn") % 50).cast("string"))),
        "no_ack": F.when(idx == 7, False),
        "consumer_tag": F.when(idx == 8, "ctag").when(~setup & (pos == 4), "ctag"),
        "exchange": F.when(~setup & (pos == 0), ""),
        "routing_key": F.when(~setup & (pos == 0), F.concat(F.lit("q"), (F.col("conn") % 50).cast("string"))),
        "body_size": F.when(~setup & pos.isin(1, 5), 256),
        "delivery_tag": F.when(~setup & pos.isin(3, 4), m + 1).when(acks, m + 2 - PREFETCH),
        "multiple": F.when(~setup & (pos == 3), False).when(acks, False),
    }


def synthetic_frames(spark: SparkSession, frames: int, shape: str) -> DataFrame:
    """A frames table of ``frames`` rows (FRAMES_SCHEMA), generated column by column in Spark."""
    layout = _layout(spark, frames, shape)
    common = {
        "capture_id": F.lit(f"bench-{shape}"),
        "connection_id": F.concat(F.lit("10.0."), F.col("conn").cast("string"), F.lit(":5672")),
        "frame_index": F.col("idx"),
        "ts_us": F.lit(T0_US) + F.col("id") * 10,
        "packet_number": F.col("id") + 1,
        "stream_offset": F.col("idx") * 64,
        "frame_size": F.lit(64).cast("long"),
    }
    is_10 = F.col("conn") % 2 == 0
    amqp10, amqp091 = _amqp10(common), _amqp091(common)
    columns = []
    for field in FRAMES_SCHEMA.fields:
        if field.name == "ts":
            value = F.timestamp_micros(F.lit(T0_US) + F.col("id") * 10)
        else:
            a, b = amqp10.get(field.name), amqp091.get(field.name)
            value = F.when(is_10, a if a is not None else F.lit(None)).otherwise(b if b is not None else F.lit(None))
        columns.append(value.cast(field.dataType).alias(field.name))
    return layout.select(*columns)


def synthetic_segments(spark: SparkSession, segments: int) -> DataFrame:
    """A tcp_segments table: each connection's segments alternate directions, 1 in 1,000 a zero window."""
    per = CONNECTION_FRAMES // 2
    s = spark.range(segments).select("id", F.floor(F.col("id") / per).alias("conn"), (F.col("id") % per).alias("n"))
    c2s = F.col("n") % 2 == 0
    zero = ~c2s & (F.col("n") % 1000 == 1)
    values = {
        "capture_id": F.lit("bench-segments"),
        "connection_id": F.concat(F.lit("10.1."), F.col("conn").cast("string"), F.lit(":5672")),
        "direction": F.when(c2s, "c2s").otherwise("s2c"),
        "packet_number": F.col("id") + 1,
        "ts": F.timestamp_micros(F.lit(T0_US) + F.col("id") * 20),
        "ts_us": F.lit(T0_US) + F.col("id") * 20,
        "seq_offset": F.floor(F.col("n") / 2) * F.when(c2s, 300).otherwise(0),
        "ack_offset": F.floor((F.col("n") + 1) / 2) * F.when(c2s, 0).otherwise(300),
        "flags": F.lit(0x18),
        "window": F.when(zero, 0).otherwise(512),
        "window_scale": F.lit(7),
        "effective_window": F.when(zero, 0).otherwise(512 << 7),
        "payload_length": F.when(c2s, 300).otherwise(0),
        "retransmitted_bytes": F.when(c2s & (F.col("n") % 5000 == 4), 300).otherwise(0),
    }
    return s.select(*[values[f.name].cast(f.dataType).alias(f.name) for f in TCP_SEGMENTS_SCHEMA.fields])


def _timed(label: str, rows: int, action) -> dict:
    start = time.perf_counter()
    action()
    seconds = time.perf_counter() - start
    result = {"job": label, "rows_in": rows, "seconds": round(seconds, 1), "rows_per_second": round(rows / seconds)}
    print(f"  {label:<22} {rows:>12,} rows  {seconds:8.1f} s  {rows / seconds:>12,.0f} rows/s", flush=True)
    return result


def run_shape(spark: SparkSession, frames: int, shape: str, work: Path) -> dict:
    """Generate, store and run every flow-state job on one shape; timings per job."""
    base = work / shape
    shutil.rmtree(base, ignore_errors=True)
    print(f"{shape}: generating {frames:,} frames and {frames // 2:,} TCP segments", flush=True)
    generated = [
        _timed(
            "generate frames",
            frames,
            lambda: synthetic_frames(spark, frames, shape).write.parquet(str(base / "frames")),
        ),
        _timed(
            "generate segments",
            frames // 2,
            lambda: synthetic_segments(spark, frames // 2).write.parquet(str(base / "tcp_segments")),
        ),
    ]
    stored_frames = spark.read.parquet(str(base / "frames"))
    stored_segments = spark.read.parquet(str(base / "tcp_segments"))
    jobs = []

    def store(table, rows: DataFrame) -> DataFrame:
        """A timeline written to Parquet and read back, as analyze stores it; a table built from
        stored timelines (flow_intervals, throughput) run into Spark's noop sink."""
        name = table.name
        if set(table.inputs) - {"frames", "tcp_segments"} - {"sessions", "ledger"}:
            jobs.append(_timed(name, frames, lambda: rows.write.format("noop").mode("overwrite").save()))
            return rows
        counted = frames if "frames" in upstream(name) else frames // 2
        jobs.append(_timed(name, counted, lambda: rows.write.parquet(str(base / name))))
        return spark.read.parquet(str(base / name))

    Build({"frames": stored_frames, "tcp_segments": stored_segments}, store=store).build(FLOW)
    frame_jobs = [j for j in jobs if j["job"] != "tcp_flow"]
    total = sum(j["seconds"] for j in frame_jobs)
    print(
        f"  {'all frame jobs':<22} {frames:>12,} frames {total:8.1f} s  {frames / total:>12,.0f} frames/s", flush=True
    )
    return {
        "shape": shape,
        "frames": frames,
        "generated": generated,
        "jobs": jobs,
        "frame_jobs_seconds": round(total, 1),
        "frames_per_second": round(frames / total),
    }


def _machine() -> dict:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    memory = next(
        (line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")), "?"
    )
    return {
        "cores": os.cpu_count(),
        "memory_kib": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
        "java": java[0] if java else "?",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/flow_state.py", description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=10_000_000)
    parser.add_argument("--shape", choices=("balanced", "skewed", "both"), default="both")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="12g")
    parser.add_argument("--work", type=Path, default=Path("out/bench/flow_state"))
    args = parser.parse_args(argv)
    spark = build_session(
        args.master,
        "amqpscope-bench-flow-state",
        {
            "spark.driver.memory": args.driver_memory,
            "spark.sql.shuffle.partitions": "16",
            # Plan strings of these pipelines are long; the UI listener would render them per stage.
            "spark.sql.maxPlanStringLength": "100000",
            "spark.local.dir": str(args.work.resolve() / "spark-tmp"),
        },
        remember_py4j_lookups=True,  # as the jobs' sessions
    )
    try:
        shapes = ("balanced", "skewed") if args.shape == "both" else (args.shape,)
        results = [run_shape(spark, args.frames, shape, args.work) for shape in shapes]
    finally:
        spark.stop()
    report = {"master": args.master, "machine": _machine(), "results": results}
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "flow_state.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({r["shape"]: r["frames_per_second"] for r in results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
