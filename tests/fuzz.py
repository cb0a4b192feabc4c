"""A long fuzz run of the per-packet decoder (``make fuzz``): ``python -m tests.fuzz --minutes 30``.

Draws inputs from ``tests.fuzzing`` (mutated real streams and structure-aware frames, alternately)
with a seeded generator, runs each through the fuzz target and keeps every input that raised,
broke an invariant, took more than ``--per-input`` seconds of CPU time (not wall-clock time: on a
shared machine that measures the neighbours) or grew the process's peak memory by more than
``--memory-mb``: to ``tests/fuzz_crashes/`` (``tests/test_fuzz.py`` replays them as
regression tests). A real hang is stopped by a watchdog (the input being run is on disk first, in
``out/fuzz/``).
Prints, and writes as JSON with ``--summary``, what was run: inputs, frames, quarantine rows,
findings, and whether the decoders ran compiled.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import os
import random
import resource
import sys
import time
from collections import Counter
from pathlib import Path

from amqpscope.ingest import compiled
from tests.fuzzing import CRASHES, GENERATORS, ROOT, Case, InvariantBroken, corpus, run


def _keep(case: Case, finding: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(case.to_json().encode()).hexdigest()[:16]
    path = folder / f"{digest}.json"
    path.write_text(json.dumps({"finding": finding, "case": json.loads(case.to_json())}, indent=1) + "\n")
    return path


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long to run (default 30)")
    parser.add_argument("--seed", type=int, default=12, help="seed of the input generator (default 12)")
    parser.add_argument("--per-input", type=float, default=1.0, help="CPU seconds an input may take (default 1)")
    parser.add_argument(
        "--memory-mb", type=float, default=512.0, help="growth of the peak memory an input may cause (default 512)"
    )
    parser.add_argument("--hang", type=float, default=60.0, help="seconds after which the run is stopped as hung")
    parser.add_argument("--crashes", type=Path, default=CRASHES, help="where findings are kept")
    parser.add_argument("--summary", type=Path, help="write the figures of the run to this JSON file")
    args = parser.parse_args(argv)

    rng = random.Random(args.seed)
    # The input being run, on disk for the watchdog's post-mortem (one file a process: two runs at once).
    current = ROOT / "out" / "fuzz" / f"current-input-{os.getpid()}.json"
    current.parent.mkdir(parents=True, exist_ok=True)
    run(corpus()[0])  # read the samples and warm the caches before the clock starts
    kinds = sorted(GENERATORS)
    figures: Counter[str] = Counter()
    findings: list[str] = []
    slowest = slowest_wall = 0.0
    start = time.monotonic()
    deadline = start + args.minutes * 60
    peak = _peak_mb()
    while time.monotonic() < deadline:
        kind = kinds[figures["inputs"] % len(kinds)]
        case = GENERATORS[kind](rng)
        current.write_text(case.to_json())
        faulthandler.dump_traceback_later(args.hang, exit=True)
        began, began_wall = time.process_time(), time.monotonic()
        finding = None
        try:
            out = run(case)
        except InvariantBroken as exc:
            finding, out = f"invariant: {exc}", {}
        except Exception as exc:
            finding, out = f"{type(exc).__name__}: {str(exc)[:300]}", {}
        took, took_wall = time.process_time() - began, time.monotonic() - began_wall
        faulthandler.cancel_dump_traceback_later()
        slowest, slowest_wall = max(slowest, took), max(slowest_wall, took_wall)
        now_peak = _peak_mb()
        if finding is None and took > args.per_input:
            finding = f"slow: {took:.2f} s of CPU time"
        if finding is None and now_peak - peak > args.memory_mb:
            finding = f"memory: peak grew {now_peak - peak:.0f} MB"
        peak = max(peak, now_peak)
        figures["inputs"] += 1
        figures[f"inputs_{kind}"] += 1
        figures["frames"] += len(out.get("frames", ()))
        figures["quarantine_rows"] += len(out.get("quarantine", ()))
        figures["undecodable_frames"] += sum(1 for q in out.get("quarantine", ()) if "undecodable" in q["reason"])
        figures["bytes"] += len(case.c2s) + len(case.s2c)
        if finding is not None:
            figures["findings"] += 1
            kept = _keep(case, finding, args.crashes)
            findings.append(f"{kept.name}: {finding}")
            print(f"finding: {kept}: {finding}", file=sys.stderr, flush=True)
    current.unlink(missing_ok=True)
    summary = {
        "decoders": compiled.running(),
        "seed": args.seed,
        "seconds": round(time.monotonic() - start, 1),
        **dict(sorted(figures.items())),
        "slowest_input_cpu_seconds": round(slowest, 3),
        "slowest_input_wall_seconds": round(slowest_wall, 3),
        "peak_memory_mb": round(peak),
        "findings_kept": findings,
    }
    print(json.dumps(summary, indent=1))
    if args.summary is not None:
        args.summary.write_text(json.dumps(summary, indent=1) + "\n")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
