"""docs/DIAGNOSIS.md written: the product's rule catalogue and thresholds (rendered by
``amqpscope.expectations.diagnosis_doc``) with the rows of the bottleneck scenario captures, built
here from the scenarios and their broker truth.

    python -m testbed.diagnosis_doc [OUT]   # default: docs/DIAGNOSIS.md

tests/test_diagnosis_doc.py checks that the committed file is what this renders.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from amqpscope.expectations.bottleneck_rules import CATALOGUE_PATH, load_bottleneck_rules
from amqpscope.expectations.diagnosis_doc import ScenarioRow, render
from amqpscope.expectations.doc_command import write_doc
from testbed.bottleneck_scenarios import INTENDED, WIRE_BLIND
from testbed.processes import REPOSITORY_ROOT
from testbed.truth import expected_bottleneck

DOC_PATH = REPOSITORY_ROOT / "docs" / "DIAGNOSIS.md"
SCENARIOS_DIR = REPOSITORY_ROOT / "samples" / "bottlenecks"


def scenario_rows(directory: Path = SCENARIOS_DIR) -> list[ScenarioRow]:
    """The comparison row of every scenario capture in ``directory``: built to be, the broker's
    truth, the diagnosis (none where the wire is blind to the cause)."""
    rows = []
    for truth_file in sorted(directory.glob("*.truth.json")):
        truth = json.loads(truth_file.read_text())
        component, _entity = expected_bottleneck(truth)
        stem = truth_file.name.split(".")[0]
        said = "none (the wire is blind to it: below)" if stem in WIRE_BLIND else component
        rows.append(ScenarioRow(stem, INTENDED[truth["scenario"]], component, said))
    return rows


def text() -> str:
    """The text of docs/DIAGNOSIS.md."""
    return render(load_bottleneck_rules(CATALOGUE_PATH), scenario_rows())


def main(argv: Sequence[str] | None = None) -> int:
    return write_doc(argv, "testbed.diagnosis_doc", __doc__.splitlines()[0], DOC_PATH, text)


if __name__ == "__main__":
    raise SystemExit(main())
