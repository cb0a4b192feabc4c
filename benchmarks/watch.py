"""A capture's answer from ``amqpscope watch`` (a JVM kept from one round to the next) against
``amqpscope analyze`` of it in a process of its own, and against a bare SparkSession start, one
action and stop (issue 36's yardstick for a small capture).

One command:

    .venv/bin/python benchmarks/watch.py [--pairs 3] [--capture samples/mixed.pcapng]
                                         [--warm-up samples/amqp091-qos-confirms.pcap] [--out out/bench-watch]

Each pair, in alternating order:

- **analyze**: analyze of CAPTURE into a fresh lake in a process of its own, as ``end_to_end.py
  one-analyze`` runs it (the command's session), timed from its start to its end (what a scheduled
  run of one capture costs) and to its answer (the diagnosis headline known);
- **watch**: ``amqpscope watch LANDING --interval 1 --settle 0`` into a fresh lake, with the
  ``--warm-up`` capture in LANDING: once its first round has ended, CAPTURE is copied into LANDING,
  and the round that takes it is timed (its own ``seconds``: ingest, derive and report), as is the
  time from the copy to the capture's headline on stderr (which adds up to the 1 s interval); then
  SIGTERM;
- **bare**: a SparkSession started, one action, stopped (``end_to_end.py one-spark``).

Printed and written to ``OUT/watch.json``: every run, the machine and its load, the medians and
each pair's ratios. Nothing is compared with a threshold here: docs/BENCHMARKS.md quotes the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from end_to_end import SAMPLE, _measure

from amqpscope.ingest.pcap import capture_id

sys.path.append(str(Path(__file__).resolve().parent.parent))  # the repository's root: testbed (not installed)
from ingest import _commit, machine
from testbed.processes import watch_process

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WARM_UP = ROOT / "samples" / "amqp091-qos-confirms.pcap"
ROUND_TIMEOUT_S = 1800


def _rounds(proc: subprocess.Popen, log: list[dict]):
    """The watch's JSON lines as they come (each kept in ``log``)."""
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            log.append(json.loads(line))
            yield log[-1]
        elif proc.poll() is not None:
            break
    raise SystemExit(f"the watch ended or took over {ROUND_TIMEOUT_S} s (exit {proc.poll()})")


def watched(capture: Path, warm_up: Path, out: Path) -> dict:
    """The round of a watch that takes ``capture`` after one that took ``warm_up``."""
    landing, lake = out / "landing", out / "lake"
    landing.mkdir(parents=True)
    shutil.copy(warm_up, landing / warm_up.name)
    wanted = capture_id(capture)
    started = time.perf_counter()
    proc = watch_process(landing, lake, interval=1, cwd=ROOT)
    said: list[tuple[float, str]] = []  # stderr's lines and when they came
    reader = threading.Thread(target=lambda: said.extend((time.perf_counter(), line) for line in proc.stderr))
    reader.start()
    log: list[dict] = []
    try:
        rounds = _rounds(proc, log)
        first = next(rounds)
        first_s = time.perf_counter() - started
        copied = time.perf_counter()
        shutil.copy(capture, landing / capture.name)
        taken = next(r for r in rounds if wanted in r["derived"])
        to_round_end = time.perf_counter() - copied
        os.kill(proc.pid, signal.SIGTERM)
        exit_code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the watch's own process group, started above
            proc.wait()
        reader.join()
        proc.stdout.close()
        proc.stderr.close()
        (out / "watch.log").write_text("".join(line for _, line in said))
    headline = next(t for t, line in said if line.startswith(f"{wanted[:12]}: ")) - copied
    if first["error"] or taken["error"] or exit_code != 0:
        raise SystemExit(f"the watch failed (exit {exit_code}): {log}; see {out / 'watch.log'}")
    return {
        "first_round_s": first["seconds"],
        "start_to_first_round_end_s": round(first_s, 2),
        "round_s": taken["seconds"],
        "copy_to_answer_s": round(headline, 2),  # the headline on stderr, as soon as the diagnosis is written
        "copy_to_round_end_s": round(to_round_end, 2),
        "rounds": log,
    }


def analyzed(capture: Path, out: Path) -> dict:
    """analyze in a process of its own, as ``end_to_end.py`` runs it (its session as the command's)."""
    command = [sys.executable, str(HERE / "end_to_end.py"), "one-analyze", str(capture), str(out / "lake"), "5672,5671"]
    result = _measure(command, out / "analyze.log")
    return {"wall_s": result["wall_s"], "cpu_s": result["cpu_s"], "answer_s": result["answer_s"]}


def bare(out: Path) -> dict:
    return _measure([sys.executable, str(HERE / "end_to_end.py"), "one-spark"], out)


def run(capture: Path, warm_up: Path, pairs: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(pairs):
        here = out / f"pair-{i}"
        shutil.rmtree(here, ignore_errors=True)
        (here / "analyze").mkdir(parents=True)
        row: dict[str, object] = {}
        order = ("analyze", "watch") if i % 2 == 0 else ("watch", "analyze")
        for side in order:
            print(f"[{time.strftime('%H:%M:%S')}] pair {i + 1}: {side} ...", file=sys.stderr, flush=True)
            if side == "analyze":
                row["analyze"] = analyzed(capture, here / "analyze")
            else:
                row["watch"] = watched(capture, warm_up, here / "watch")
        print(f"[{time.strftime('%H:%M:%S')}] pair {i + 1}: bare session ...", file=sys.stderr, flush=True)
        row["bare"] = bare(here / "bare.log")
        runs.append(row)
    return {
        "machine": machine(),
        "commit": _commit(),
        "load_average_at_end": os.getloadavg(),
        "capture": str(capture),
        "warm_up": str(warm_up),
        "runs": runs,
        "summary": summary(runs),
    }


def summary(runs: list[dict]) -> dict:
    """Medians, and each pair's ratios (min-max): the round against analyze's process, the answer
    after the copy against analyze's answer after its start, both against the bare session."""

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    def ratio(part: list[float], whole: list[float]) -> dict:
        values = [p / w for p, w in zip(part, whole, strict=True)]
        return {
            "median": round(statistics.median(values), 3),
            "min_max": [round(min(values), 3), round(max(values), 3)],
        }

    analyze = [r["analyze"]["wall_s"] for r in runs]
    analyze_answer = [r["analyze"]["answer_s"] for r in runs]
    round_s = [r["watch"]["round_s"] for r in runs]
    answer = [r["watch"]["copy_to_answer_s"] for r in runs]
    bare_s = [r["bare"]["wall_s"] for r in runs]
    return {
        "analyze_wall_s": median(analyze),
        "analyze_answer_s": median(analyze_answer),
        "watch_round_s": median(round_s),
        "watch_answer_s": median(answer),
        "watch_first_round_s": median([r["watch"]["first_round_s"] for r in runs]),
        "bare_session_s": median(bare_s),
        "round_vs_analyze": ratio(round_s, analyze),
        "answer_vs_analyze_answer": ratio(answer, analyze_answer),
        "round_vs_bare": ratio(round_s, bare_s),
        "analyze_vs_bare": ratio(analyze, bare_s),
    }


def markdown(result: dict) -> str:
    s = result["summary"]

    def r(name: str) -> str:
        return f"{s[name]['median']} ({s[name]['min_max'][0]}-{s[name]['min_max'][1]})"

    return "\n".join(
        [
            "| pairs | analyze s (answer s) | watch round s (answer s) | bare session s "
            "| round / analyze | answer / analyze's answer | round / bare | analyze / bare |",
            "|---|---|---|---|---|---|---|---|",
            f"| {len(result['runs'])} | {s['analyze_wall_s']} ({s['analyze_answer_s']}) "
            f"| {s['watch_round_s']} ({s['watch_answer_s']}) | {s['bare_session_s']} | {r('round_vs_analyze')} "
            f"| {r('answer_vs_analyze_answer')} | {r('round_vs_bare')} | {r('analyze_vs_bare')} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--capture", type=Path, default=SAMPLE)
    parser.add_argument("--warm-up", type=Path, default=WARM_UP)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-watch")
    args = parser.parse_args(argv)
    if capture_id(args.capture) == capture_id(args.warm_up):
        parser.error("the capture and the warm-up capture must differ (a watch takes the same bytes once)")
    result = run(args.capture.resolve(), args.warm_up.resolve(), args.pairs, args.out)
    (args.out / "watch.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
