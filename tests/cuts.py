"""Captures cut to begin part of the way through, as tcpdump started on a broker whose connections
were already open: the cut points, the files (``editcap -r``, which keeps the link layer and the
times) and the verdicts of a lake that holds each capture and its cuts.

``python -m tests.cuts LAKE CAPTURE...`` analyses the captures and their cuts into LAKE in one run
and prints the table of capture, cut point, full verdict and cut verdict (markdown).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from amqpscope.ingest.pcap import read_records

# A quarter, a third, a half and two thirds of the packets are before the cut.
CUT_POINTS = (Fraction(1, 4), Fraction(1, 3), Fraction(1, 2), Fraction(2, 3))


@dataclass(frozen=True)
class Cut:
    capture: Path  # the full capture
    point: Fraction  # the share of its packets left out
    path: Path  # the cut file

    @property
    def label(self) -> str:
        return f"{self.point.numerator}/{self.point.denominator}"


def packet_count(capture: Path) -> int:
    return sum(1 for _ in read_records(capture))


def cut(capture: Path, point: Fraction, directory: Path) -> Cut:
    """``capture`` without the first ``point`` of its packets, written under ``directory``."""
    first = int(packet_count(capture) * point) + 1
    suffix = capture.suffix if capture.suffix in (".pcap", ".pcapng") else ".pcap"
    out = directory / f"{capture.stem}.from-{point.numerator}-{point.denominator}{suffix}"
    subprocess.run(["editcap", "-r", str(capture), str(out), f"{first}-{10**9}"], check=True, capture_output=True)
    return Cut(capture, point, out)


def cuts(captures: list[Path], points: tuple[Fraction, ...], directory: Path) -> list[Cut]:
    directory.mkdir(parents=True, exist_ok=True)
    return [cut(capture, point, directory) for capture in captures for point in points]


def verdicts(spark, lake: Path) -> dict[str, tuple[str, int, int]]:
    """Per file name: the diagnosis' verdict (its ``bottleneck`` component) and the data quality
    rules' error and warning violations (the dq_summary table)."""
    from amqpscope.jobs.lake.lake import Lake

    rows = Lake(spark, lake).read("dq_summary").collect()
    return {r.file_name: (r.bottleneck, r.violations_error, r.violations_warning) for r in rows}


def table(made: list[Cut], found: dict[str, tuple[str, int, int]]) -> str:
    """The markdown table: capture, cut point, full verdict, cut verdict, and the violations (errors /
    warnings) of each."""
    missing = ("(missing)", -1, -1)
    lines = [
        "| capture | cut point | full verdict | cut verdict | violations full | violations cut |",
        "|---|---|---|---|---|---|",
    ]
    for c in made:
        whole, part = found.get(c.capture.name, missing), found.get(c.path.name, missing)
        lines.append(
            f"| {c.capture.name} | {c.label} | {whole[0]} | {part[0]} | {whole[1]}/{whole[2]} | {part[1]}/{part[2]} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from amqpscope.conf.settings import AnalyzeConfig
    from amqpscope.jobs.engine.session import build_session
    from amqpscope.jobs.stages.analyze import analyze

    lake, captures = Path(argv[0]), [Path(a) for a in argv[1:]]
    made = cuts(captures, CUT_POINTS, lake.parent / f"{lake.name}-cuts")
    spark = build_session(
        master="local[2]", app_name="amqpscope-cuts", conf={"spark.driver.memory": "4g"}, remember_py4j_lookups=True
    )
    config = AnalyzeConfig(lake=lake, report=lake / "report.html", data_docs=lake / "data_docs", group_rotated=False)
    analyze(spark, [str(p) for p in (*captures, *(c.path for c in made))], config)
    print(table(made, verdicts(spark, lake)))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
