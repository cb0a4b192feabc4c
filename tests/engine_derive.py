"""``derive`` of every capture of a lake, whole process, on the engine named: the same-rows test
derives on Sail so (PySpark cannot hold a classic and a Connect session side by side: jobs.engine.sail),
and the embedded engine's benchmark times it (engine start, derive, stop) beside classic Spark.
Prints the run as JSON.

    .venv/bin/python -m tests.engine_derive sail|spark LAKE
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.derive import derive_lake


def main(engine: str, lake: Path) -> dict[str, object]:
    start = time.perf_counter()
    if engine == "sail":
        from amqpscope.jobs.engine.sail import start_sail

        started = start_sail()
        spark, stop = started.session, started.stop
    else:
        from amqpscope.jobs.engine.session import build_session

        spark = build_session("local[2]", "amqpscope-engine-derive", remember_py4j_lookups=True)
        stop = spark.stop
    up = time.perf_counter() - start
    try:
        config = AnalyzeConfig(lake=lake, report=lake / "report.html", data_docs=lake / "docs")
        ids = sorted(Lake(spark, lake).capture_ids("captures"))
        result = derive_lake(spark, config, ids)
    finally:
        stop()
    return {
        "engine": engine,
        "start_s": round(up, 2),
        "derive_s": round(time.perf_counter() - start - up, 2),
        "derived": list(result.derived),
        "suites_passed": result.suites_passed,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]))))
