"""The report's overview shows each capture's verdict and, under it, the problems found beside the
verdict (findings of kind problem), warnings first; a capture whose only findings are warnings is a
warning, not healthy."""

from __future__ import annotations

from amqpscope.schemas.diagnosis import DIAGNOSIS_SCHEMA
from tests.test_report import overview, write


def problem(rank: int, severity: str, component: str, explanation: str) -> dict:
    return dict(rank=rank, kind="problem", severity=severity, component=component, explanation=explanation)


def test_the_overview_lists_the_problems_under_the_verdict_warnings_first(spark, tmp_path):
    diagnosis = spark.createDataFrame(
        [
            {
                "capture_id": "cap-a",
                "bottleneck": "none",
                "headline": "No bottleneck: 1 AMQP connection.",
                "findings_count": 2,
                "findings": [
                    problem(1, "info", "consumer", "A slow consumer hidden by a fast one."),
                    problem(2, "warning", "channel", "The broker returned 8 of the 10 messages."),
                ],
                "problems_count": 2,
            },
        ],
        DIAGNOSIS_SCHEMA,
    )
    (row,) = [r for r in overview(write(spark, tmp_path, diagnosis=diagnosis)) if r[0] == "cap-a"]
    # The sample frames' violations make cap-a an error capture: its level says so, and the
    # problems follow the verdict, the warning before the info.
    assert row[2].split() == [
        "error",
        *"No bottleneck found; 2 protocol errors.".split(),
        "warning",
        "channel",
        *"The broker returned 8 of the 10 messages.".split(),
        "info",
        "consumer",
        *"A slow consumer hidden by a fast one.".split(),
    ]
