"""``amqpscope analyze`` on each engine, side by side: classic Spark (A) against Sail (B) on one capture.

One command:

    .venv/bin/python benchmarks/engines.py [--pairs 3] [--capture samples/mixed.pcapng] [--out out/bench-engines]

Each run is ``python -m amqpscope analyze CAPTURE --lake FRESH --engine E --progress never`` in a
process of its own, into a fresh lake; the runs alternate (spark, sail), (sail, spark), ... so that a
drift of the machine's speed cancels out of each pair's ratio. Wall seconds are read around the
process; the stage seconds (engine start, ingest, the answer, the whole run) are the run's own JSON
summary's. Printed and written to ``OUT/engines.json``: every run, each pair's ratios spark/sail, and
their medians (min-max), with the machine's cores and load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("spark", "sail")
# The summary's seconds compared (jobs.stages.analyze: the engine's start, the decode, the first answer, all).
STAGES = ("spark_start", "ingest", "answer", "total")


def run_once(engine: str, capture: Path, lake: Path) -> dict[str, float]:
    shutil.rmtree(lake, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    command = [sys.executable, "-m", "amqpscope", "analyze", str(capture), "--lake", str(lake)]
    command += ["--engine", engine, "--progress", "never"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode not in (0, 3):  # 3: a bottleneck found, a finished run
        raise SystemExit(f"{engine} run failed ({done.returncode}): {done.stderr[-2000:]}")
    seconds = json.loads(done.stdout)["seconds"]
    return {"wall": round(wall, 2), **{s: seconds[s] for s in STAGES if s in seconds}}


def summary(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--capture", type=Path, default=ROOT / "samples" / "mixed.pcapng")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-engines")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    runs: list[dict[str, object]] = []
    pairs: list[dict[str, float]] = []
    for number in range(args.pairs):
        order = ENGINES if number % 2 == 0 else tuple(reversed(ENGINES))
        got = {engine: run_once(engine, args.capture, args.out / f"lake-{engine}") for engine in order}
        runs += [{"pair": number, "engine": e, **got[e]} for e in order]
        pairs.append({k: got["spark"][k] / max(got["sail"][k], 1e-9) for k in got["sail"] if k in got["spark"]})
        print(json.dumps({"pair": number, **got}), flush=True)
    result = {
        "capture": str(args.capture),
        "cores": os.cpu_count(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "runs": runs,
        "spark_over_sail": {k: summary([p[k] for p in pairs if k in p]) for k in ("wall", *STAGES)},
    }
    (args.out / "engines.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result["spark_over_sail"], indent=1))


if __name__ == "__main__":
    main()
