"""``derive`` of every capture of a lake on Sail, the embedded engine, in a process of its own:
PySpark cannot hold a classic and a Spark Connect session side by side (jobs.sail), and the tests'
own session is classic. Prints the derive's result as JSON.

    .venv/bin/python -m tests.sail_derive LAKE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.derive import derive_lake
from amqpscope.jobs.lake import Lake
from amqpscope.jobs.sail import start_sail


def main(lake: Path) -> dict[str, object]:
    engine = start_sail()
    try:
        config = AnalyzeConfig(lake=lake, report=lake / "report.html", data_docs=lake / "docs")
        ids = sorted(Lake(engine.session, lake).capture_ids("captures"))
        result = derive_lake(engine.session, config, ids)
    finally:
        engine.stop()
    return {"derived": list(result.derived), "suites_passed": result.suites_passed}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
