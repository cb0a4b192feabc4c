"""Paired A/B of ``analyze``: this tree's code (A) against a git ref's (B), run in turn on one capture.

One command:

    .venv/bin/python benchmarks/paired.py REF [--a REF] [--pairs 5] [--frames N | --capture FILE] [--out DIR]
                                          [--ports P] [--a-env KEY=VALUE ...] [--b-env KEY=VALUE ...]

Each run is ``end_to_end.py one-analyze`` in its own process (its own JVM, mapping the class archive),
sampled from ``/proc`` for the CPU of its process tree, into a fresh lake. B imports REF's code: the
ref's files (``git archive``) laid out as the ``amqpscope`` package (setup.cfg's ``package_dir``),
first on PYTHONPATH, with this tree's compiled decoders where REF's decoder sources are the same
(``ingest.compiled`` checks). REF may also be a directory holding a copy of a tree, and ``.`` is
this tree (``--a`` chooses A's code the same way; by default this tree): two sides with the same
code are told apart by ``--a-env`` / ``--b-env``. The runs alternate A B, B A, ..., and each pair's ratio A/B is taken, so a drift
of the machine's speed between pairs cancels out: on a shared machine a ratio of paired runs says
something when absolute times do not. Printed and written to ``OUT/paired.json``: every run, and the
median ratio (min-max) of wall, CPU, JVM CPU, Spark jobs and first answer, whole and per step.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import DEFAULT_SEEDS, broker_port, build_capture
from end_to_end import SAMPLE, STEPS, _measure

ROOT = Path(__file__).resolve().parent.parent


def baseline(ref: str, out: Path) -> Path:
    """REF's code importable as ``amqpscope``: the directory to put first on PYTHONPATH. REF is a git
    ref, or a directory holding a copy of a tree (a version not committed)."""
    if Path(ref).is_dir():
        source = Path(ref).resolve()
        tree = out / f"baseline-{source.name}"
    else:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", ref], capture_output=True, text=True, check=True
        ).stdout.strip()
        tree = out / f"baseline-{commit}"
        source = tree / "source"
    path = tree / "path"
    if not source.exists():
        source.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        for built in [*(ROOT / "ingest").glob("*.so"), ROOT / "ingest" / "_compiled_sources.json"]:
            if built.exists():
                shutil.copy2(built, source / "ingest" / built.name)
        # The report's npm packages (installed by make setup, not in git): this tree's.
        modules = ROOT / "package" / "web" / "node_modules"
        if modules.is_dir() and (source / "package" / "web").is_dir():
            (source / "package" / "web" / "node_modules").symlink_to(modules, target_is_directory=True)
    if not path.exists():
        config = configparser.ConfigParser()
        config.read(source / "setup.cfg")
        mapping = dict(line.split("=") for line in config["options"]["package_dir"].split("\n") if "=" in line)
        mapping = {name.strip(): folder.strip() for name, folder in mapping.items()}
        package = path / "amqpscope"
        package.mkdir(parents=True)
        for entry in (source / mapping.pop("amqpscope")).iterdir():
            (package / entry.name).symlink_to(entry)
        for name, folder in mapping.items():
            target = package.joinpath(*name.split(".")[1:])
            if not target.exists():
                target.symlink_to(source / folder, target_is_directory=True)
    return path


def capture_of(args: argparse.Namespace) -> tuple[Path, str]:
    """The capture to analyse and its broker ports: the sample, a built one, or the one given."""
    seed_ports = ",".join(map(str, sorted({broker_port(seed) for seed in DEFAULT_SEEDS})))
    if args.capture:
        return Path(args.capture), args.ports or seed_ports
    if not args.frames:
        return SAMPLE, str(broker_port(SAMPLE))
    path = args.out / f"e2e-{args.frames}.pcap"
    if not path.exists():
        build_capture(list(DEFAULT_SEEDS), args.frames, path)
    return path, seed_ports


def _environment(pairs: list[str], extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    env.update(dict(pair.split("=", 1) for pair in pairs))
    return env


def run(args: argparse.Namespace) -> dict:
    args.out.mkdir(parents=True, exist_ok=True)
    capture, ports = capture_of(args)
    child = [sys.executable, str(Path(__file__).resolve().parent / "end_to_end.py"), "one-analyze"]
    b_path = {} if args.ref == "." else {"PYTHONPATH": str(baseline(args.ref, args.out))}
    a_path = {} if args.a == "." else {"PYTHONPATH": str(baseline(args.a, args.out))}
    environments = {"A": _environment(args.a_env, a_path), "B": _environment(args.b_env, b_path)}
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for pair in range(args.pairs):
        for side in "AB" if pair % 2 == 0 else "BA":
            lake = Path(tempfile.mkdtemp(prefix=f"lake-{side}-", dir=args.out))
            saved = dict(os.environ)
            os.environ.clear()
            os.environ.update(environments[side])  # _measure's child inherits it
            try:
                measured = _measure([*child, str(capture), str(lake), ports], args.out / f"{side}-{pair}.log")
            finally:
                os.environ.clear()
                os.environ.update(saved)
                shutil.rmtree(lake, ignore_errors=True)
            runs[side].append(measured)
            print(
                f"[{time.strftime('%H:%M:%S')}] pair {pair + 1} {side}: {measured['wall_s']} s wall, "
                f"{measured['cpu_s']} CPU s, {measured['jobs']} jobs",
                file=sys.stderr,
                flush=True,
            )
    return {
        "a": args.a,
        "ref": args.ref,
        "capture": str(capture),
        "a_env": args.a_env,
        "b_env": args.b_env,
        "load_average_at_end": os.getloadavg(),
        "runs": runs,
        "ratios": ratios(runs),
    }


def _spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def ratios(runs: dict[str, list[dict]]) -> dict:
    """Per measure, the median A and B and the pair-by-pair ratio A/B (median, min, max)."""
    measures = {
        "wall_s": lambda r: r["wall_s"],
        "cpu_s": lambda r: r["cpu_s"],
        "jvm_cpu_s": lambda r: r["jvm_cpu_s"],
        "jobs": lambda r: r["jobs"],
        "answer_s": lambda r: r["answer_s"],
        **{f"{step} CPU s": (lambda r, s=step: r.get("step_cpu_s", {}).get(s)) for step in STEPS},
        **{f"{step} jobs": (lambda r, s=step: r["spark_work"].get(s, {}).get("jobs")) for step in STEPS},
    }
    found = {}
    for name, of in measures.items():
        pairs = [(of(a), of(b)) for a, b in zip(runs["A"], runs["B"]) if of(a) is not None and of(b) is not None]
        if not pairs:
            continue
        found[name] = {
            "A": statistics.median(a for a, _ in pairs),
            "B": statistics.median(b for _, b in pairs),
            "ratio": _spread([a / b for a, b in pairs if b]),
        }
    return found


def markdown(result: dict) -> str:
    pairs = len(result["runs"]["A"])
    lines = [
        f"A: {result['a']} {' '.join(result['a_env'])}; B: {result['ref']} {' '.join(result['b_env'])}; "
        f"{pairs} pairs on {Path(result['capture']).name}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in result['load_average_at_end'])}",
        "",
        "| measure | A (median) | B (median) | A/B pair by pair: median (min-max) |",
        "|---|---|---|---|",
    ]
    for name, r in result["ratios"].items():
        spread = r["ratio"]
        lines.append(
            f"| {name} | {r['A']:g} | {r['B']:g} | **{spread['median']:.3f}** "
            f"({spread['min']:.3f}-{spread['max']:.3f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ref", help="B's code: a git ref, a directory holding a copy of a tree, or . for this tree")
    parser.add_argument("--a", default=".", help="A's code, as REF (default: this tree)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--frames", type=int, default=0, help="a capture of this many frames (default: the sample)")
    parser.add_argument("--capture", help="this capture file instead")
    parser.add_argument("--ports", help="its broker ports, comma-separated (default: those of the built captures)")
    parser.add_argument("--a-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--b-env", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench-paired")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    result = run(args)
    (args.out / "paired.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
