"""An analyze against its floors, in rounds: how near can any analyze of this design come to its
goal's yardstick (a bare Spark session for the sample, tshark for a large capture)?

One command:

    .venv/bin/python benchmarks/floors.py [--rounds 6] [--frames N] [--out out/bench-floors]

Issue 36 asks analyze of the bundled sample to take at most 3x a bare ``SparkSession`` start, one
action and stop, and of a 1 M-frame capture at most 6x tshark's wall (``-T fields`` on the same
file), and asks that a target out of reach by design be shown by a measurement, for example the
same work as a bare Spark job of the same shape. ``end_to_end.py`` measures such jobs once each,
beside one analyze; from one of its runs to the next the same job has measured 2.3x to 3.8x the
bare session (5.9x to 7.6x tshark at 1 M frames), as the machine's load moved the yardstick more
than the jobs. Here every run is repeated once per round, each in its own process (its own JVM,
mapping the class archive as a user's runs after the first do), in a rotated order so that none
always follows another. Without ``--frames`` the capture is the bundled sample; with it,
a capture of N AMQP frames built as ``end_to_end.py`` builds it (reused from ``--out`` if there):

- ``yardstick``: the bare session (``end_to_end.py one-spark``) for the sample, tshark for a
  built capture (``end_to_end.tshark_command``);
- ``analyze``: ``amqpscope analyze``'s steps on the capture into a fresh lake (``one-analyze``);
- ``least_work``: analyze's session and ingest with a decoder that costs nothing, then every derived
  table read from analyze's lake and written (``one-floor``, ``end_to_end._child_floor``): no
  decoding, flow state, diagnosis, Great Expectations or report;
- ``same_shape``: every table of the lake through a window and written, and small window queries
  up to analyze's count of Spark jobs (``one-writes``, ``end_to_end._child_writes``).

For the sample, a fifth run takes its place in the rotation:

- ``least_answer``: the least work, then what analyze does to give its answer as analyze runs it:
  Great Expectations imported while Spark starts, every table's suite validated and the Data Docs
  built on their own thread, while the run is marked and the report page written from the gold
  tables (``one-answer-floor``, ``end_to_end._answer_without_work``);

and each round then runs that work outside Spark alone (Great Expectations' import, suites and
Data Docs, and the report page: ``one-python``, ``end_to_end._child_python``), and takes its CPU
with the least work's: spread over every core with nothing waiting, the least wall the two could
take (``cpu_floor``, over the round's yardstick).

Each run is divided by the yardstick of its own round. Printed and written to
``OUT/floors.json``: every round's seconds and ratios, then each yardstick's median, lowest and
highest ratio. A floor whose lowest ratio is above the goal is a measurement that no analyze doing
at least that work comes under the goal on this machine; the difference between analyze and its
least work is what an analyze of this design could still save.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import broker_port
from end_to_end import GOALS, SAMPLE, _measure, captures, class_archive, cpu_floor, tshark_command

from ingest import _commit, machine

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("yardstick", "analyze", "least_work", "same_shape")
# For the sample, the least work with Great Expectations and the report as analyze runs them too.
SAMPLE_KINDS = (*KINDS, "least_answer")


def rotated(round_index: int, kinds: tuple[str, ...] = KINDS) -> tuple[str, ...]:
    """The runs ``kinds`` in round ``round_index``'s order: each round starts one further along."""
    shift = round_index % len(kinds)
    return kinds[shift:] + kinds[:shift]


def summary(rounds: list[dict]) -> dict:
    """Per run but the yardstick: the median, lowest and highest of its ratio to its round's
    yardstick, and the same for analyze over its least work."""
    ran = [kind for kind in SAMPLE_KINDS[1:] if all(kind in r["ratios"] for r in rounds)]
    result = {kind: _spread([r["ratios"][kind] for r in rounds]) for kind in ran}
    if all("cpu_floor" in r["ratios"] for r in rounds):
        result["cpu_floor"] = _spread([r["ratios"]["cpu_floor"] for r in rounds])
    result["analyze_over_least_work"] = _spread([r["seconds"]["analyze"] / r["seconds"]["least_work"] for r in rounds])
    return result


def _spread(values: list[float]) -> dict:
    """The median, lowest and highest of ``values``, to two decimals."""
    return {"median": round(statistics.median(values), 2), "low": round(min(values), 2), "high": round(max(values), 2)}


def run(out: Path, rounds: int, frames: int | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, str(Path(__file__).resolve().parent / "end_to_end.py")]
    if frames is None:
        capture, ports = SAMPLE, (broker_port(SAMPLE),)
        yardstick, goal = [*me, "one-spark"], GOALS["small_vs_bare_spark_wall"]
        named = "a bare SparkSession start, one action and stop"
    else:
        _, capture, ports = captures(out, (frames,))[1]
        yardstick, goal = tshark_command(capture, ports), GOALS["large_vs_tshark_wall"]
        named = "tshark -T fields on the same file"
    listed = ",".join(map(str, ports))
    archive = class_archive(out, me)
    # The lake the floors read their rows from: a first analyze, not counted (it also brings the
    # capture and the project's files into the page cache for every run after it).
    source = Path(tempfile.mkdtemp(prefix="lake-", dir=out))
    try:
        print(f"[{time.strftime('%H:%M:%S')}] a first analyze, whose lake the floors read ...", file=sys.stderr)
        first = _measure([*me, "one-analyze", str(capture), str(source), listed], out / "analyze-source.log")
        commands = {
            "yardstick": lambda _lake: yardstick,
            "analyze": lambda lake: [*me, "one-analyze", str(capture), str(lake), listed],
            "least_work": lambda lake: [*me, "one-floor", str(capture), str(source), str(lake), listed],
            "least_answer": lambda lake: [*me, "one-answer-floor", str(capture), str(source), str(lake), listed],
            "python_work": lambda lake: [*me, "one-python", str(source), str(lake / "lake")],
            "same_shape": lambda lake: [
                *me,
                "one-writes",
                str(source),
                str(lake),
                str(capture.stat().st_size),
                str(first["jobs"]),
            ],
        }
        measured, ran = [], KINDS if frames is not None else SAMPLE_KINDS
        for index in range(rounds):
            seconds, jobs, others, cpu = {}, {}, {}, {}
            kinds = [*rotated(index, ran), *(["python_work"] if frames is None else [])]
            for kind in kinds:
                lake = Path(tempfile.mkdtemp(prefix="lake-", dir=out))
                try:
                    print(f"[{time.strftime('%H:%M:%S')}] round {index + 1}: {kind} ...", file=sys.stderr, flush=True)
                    result = _measure(commands[kind](lake), out / f"{kind}-{index + 1}.log")
                finally:
                    shutil.rmtree(lake, ignore_errors=True)
                seconds[kind] = result["wall_s"]
                jobs[kind] = result.get("jobs", result.get("spark_jobs")) if kind in ran[1:] else None
                others[kind] = result["other_cpu_s"]
                cpu[kind] = result.get("work_cpu_s", result["cpu_s"])
            base = seconds["yardstick"]
            ratios = {kind: round(seconds[kind] / base, 2) for kind in ran[1:]}
            if "python_work" in cpu:
                ratios["cpu_floor"] = cpu_floor(cpu["least_work"], cpu["python_work"], base)
            measured.append(
                {
                    "order": list(rotated(index, ran)),
                    "seconds": seconds,
                    "spark_jobs": jobs,
                    # The CPU seconds of each run (the Python work's from after the least work's
                    # imports), and those the rest of the machine used during it.
                    "cpu_s": cpu,
                    "other_cpu_s": others,
                    "ratios": ratios,
                }
            )
    finally:
        shutil.rmtree(source, ignore_errors=True)
    return {
        "machine": machine(),
        "commit": _commit(),
        "capture": {
            "file": str(capture),
            "megabytes": round(capture.stat().st_size / 1e6, 1),
            "frames": first["frames"],
        },
        "yardstick": named,
        "goal": goal,
        "class_archive": archive,
        "rounds": measured,
        "summary": summary(measured),
    }


def markdown(result: dict) -> str:
    lines = [
        f"Commit {result['commit']}; {result['machine']}",
        f"Capture {result['capture']['file']} ({result['capture']['frames']:,} frames); yardstick: "
        f"{result['yardstick']}; goal {result['goal']}x",
        "",
        "| round | order | yardstick s | analyze | least work | same shape | least work and GX, report | CPU floor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for index, r in enumerate(result["rounds"], 1):
        s, x, c = r["seconds"], r["ratios"], r.get("cpu_s", {})
        floor = f"{c['least_work']} + {c['python_work']} CPU s = {x['cpu_floor']}x" if "cpu_floor" in x else ""
        answer = f"{s['least_answer']} s = {x['least_answer']}x" if "least_answer" in x else ""
        lines.append(
            f"| {index} | {', '.join(r['order'])} | {s['yardstick']} | {s['analyze']} s = {x['analyze']}x | "
            f"{s['least_work']} s = {x['least_work']}x | {s['same_shape']} s = {x['same_shape']}x | {answer} | {floor} |"
        )
    lines += ["", "| run / yardstick of its round | median | lowest | highest |", "|---|---|---|---|"]
    for kind, row in result["summary"].items():
        lines.append(f"| {kind} | {row['median']}x | {row['low']}x | {row['high']}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the runs, one of each a round (default 6)")
    parser.add_argument(
        "--frames", type=int, help="a capture of this many AMQP frames, against tshark (default: the sample)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-floors")
    args = parser.parse_args(argv)
    result = run(args.out, args.rounds, args.frames)
    (args.out / "floors.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
