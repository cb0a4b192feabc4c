"""Processes that race on one lake: each commits through ``Lake`` (delta-rs, no Spark) or marks the
runs table, in step with the others at a barrier, trial after trial. Spawned (not forked): every racer
is a process of its own with its own delta-rs runtime, as two runs of amqpscope are."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("writer", IntegerType(), False),
        StructField("n", LongType(), False),
    ]
)
ROWS_PER_WRITE = 3
TABLE = "t"


@dataclass(frozen=True)
class Trial:
    """One race: the lake, what each racer writes, and whether they all read the table before any writes."""

    root: str
    captures: tuple[str, ...]  # racer i writes (or claims) captures[i]
    read_first: bool  # all read the version at one barrier, then commit at the next (a stale read, always)
    action: str = "write"  # "write": Lake.write_rows; "claim": runs.claim of stage ingest


def _race(index: int, trials: Sequence[Trial], barrier, results) -> None:
    from amqpscope.jobs.lake import runs
    from amqpscope.jobs.lake.errors import CaptureBusy, WriteConflict
    from amqpscope.jobs.lake.lake import Lake

    run_id = f"racer-{index}"
    for number, trial in enumerate(trials):
        lake = Lake(None, trial.root, backend="delta-rs", run_id=run_id)
        capture = trial.captures[index]
        barrier.wait()
        version = lake.version(TABLE) if trial.read_first else None
        if trial.read_first:
            barrier.wait()
        try:
            if trial.action == "claim":
                busy = runs.claim(lake, run_id, "ingest", [capture])
                outcome = f"busy: {busy[0][1]}" if busy else "ok"
            else:
                rows = [{"capture_id": capture, "writer": index, "n": n} for n in range(ROWS_PER_WRITE)]
                lake.write_rows(rows, SCHEMA, TABLE, replace_capture_ids=[capture], read_version=version)
                outcome = "ok"
        except (WriteConflict, CaptureBusy) as exc:
            outcome = f"conflict: {exc}"
        except Exception as exc:
            outcome = f"error: {type(exc).__name__}: {exc}"
        results.put((number, index, outcome))


def race(trials: Sequence[Trial], racers: int) -> dict[int, dict[int, str]]:
    """Run every trial with ``racers`` processes; per trial, each racer's outcome ("ok", "busy: <holder>",
    "conflict: <message>" or "error: <message>")."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(racers)
    results = context.Queue()
    processes = [context.Process(target=_race, args=(i, list(trials), barrier, results)) for i in range(racers)]
    for process in processes:
        process.start()
    outcomes: dict[int, dict[int, str]] = {}
    try:
        for _ in range(len(trials) * racers):
            number, index, outcome = results.get(timeout=300)
            outcomes.setdefault(number, {})[index] = outcome
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return outcomes
