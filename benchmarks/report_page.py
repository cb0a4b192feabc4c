"""What the report's plotly.js bundle costs a page: the same report with the basic bundle (what
amqpscope inlines) and with plotly's full bundle, opened in turn in one headless chromium.

    .venv/bin/python benchmarks/report_page.py REPORT.html [--runs 7]

The second page is the first with its inlined library swapped for the full bundle of the ``plotly``
PyPI package (``pip install plotly`` first; it is no dependency of amqpscope). Each run opens the
page from disk (DOMContentLoaded, load: the first screen, sections closed), then opens every
section and waits until every chart is drawn. Pages alternate A B A B ..., and the medians and the
per-pair ratio A/B are printed as JSON; the machine's load goes with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from amqpscope.jobs.report.page import _plotly_js

sys.path.append(str(Path(__file__).resolve().parent.parent))  # the repository's root: testbed (not installed)
from testbed import browser


def _open(driver, page: Path) -> dict[str, float]:
    driver.get("about:blank")
    driver.get(page.resolve().as_uri())
    timing = browser.page_timing(driver)
    drawn = browser.draw_every_chart(driver)
    return {**timing, "charts_drawn_ms": drawn}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    from plotly.offline import get_plotlyjs  # the full bundle, for comparison only

    page = args.report.read_text(encoding="utf-8")
    basic = _plotly_js()
    if basic not in page:
        raise SystemExit(f"{args.report} does not inline amqpscope's plotly.js bundle")
    with tempfile.TemporaryDirectory(prefix="report-page-") as scratch:
        pages = {"basic": Path(scratch) / "basic.html", "full": Path(scratch) / "full.html"}
        pages["basic"].write_text(page, encoding="utf-8")
        pages["full"].write_text(page.replace(basic, get_plotlyjs()), encoding="utf-8")
        runs: dict[str, list[dict[str, float]]] = {"basic": [], "full": []}
        with browser.headless_chromium(Path(scratch) / "profile") as driver:
            for name in pages:  # a warm-up of each, not counted
                _open(driver, pages[name])
            for _ in range(args.runs):
                for name in pages:
                    runs[name].append(_open(driver, pages[name]))
    result = {
        "load_average": os.getloadavg()[0],
        "bytes": {"basic": len(page.encode()), "full": len(page.replace(basic, get_plotlyjs()).encode())},
        "median_ms": {
            name: {k: round(statistics.median(r[k] for r in rs)) for k in rs[0]} for name, rs in runs.items()
        },
        "median_ratio_basic_over_full": {
            k: round(statistics.median(a[k] / b[k] for a, b in zip(runs["basic"], runs["full"])), 3)
            for k in runs["basic"][0]
        },
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
