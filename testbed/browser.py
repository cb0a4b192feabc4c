"""The report opened in a real browser: Debian's ``chromium``, headless, driven by Selenium through
``chromium-driver`` (installed by .ci/system-deps.sh; never a downloaded browser).

Used by the browser test (tests/test_report_browser.py) and by the end-to-end benchmark, which
records what a report weighs and how long it takes to open (benchmarks/end_to_end.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PAGE_TIMEOUT_S = 120
_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1000",
)
# Every chart has its first SVG layer once Plotly has drawn it.
_CHARTS_DRAWN = (
    "return Array.from(document.querySelectorAll('div.chart')).every(function (c) {"
    " return c.querySelector('.main-svg') !== null; })"
)
# A capture's charts are drawn when its section opens: every section opened, as a reader would.
_OPEN_SECTIONS = "document.querySelectorAll('details').forEach(function (d) { d.open = true; });"


def available() -> bool:
    return CHROMIUM is not None and DRIVER is not None


@contextmanager
def headless_chromium(profile: Path) -> Iterator[Any]:
    """A Selenium driver of headless chromium with a fresh profile in ``profile``, logging the
    console and the network (Chrome's performance log); chromium and its driver end on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    driver.set_page_load_timeout(PAGE_TIMEOUT_S)
    try:
        yield driver
    finally:
        driver.quit()  # ends chromium and the driver process it started


def open_drawn(driver, page: Path) -> float:
    """Open ``page`` from disk, open every section and wait until every chart on it is drawn; the
    ms from the start of the navigation until that was seen (checked every 50 ms)."""
    driver.get(page.resolve().as_uri())
    return draw_every_chart(driver)


def draw_every_chart(driver) -> float:
    """Open every section of the open page and wait until every chart is drawn; the ms from the
    start of the navigation until that was seen (checked every 50 ms)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.execute_script(_OPEN_SECTIONS)
    WebDriverWait(driver, PAGE_TIMEOUT_S, poll_frequency=0.05).until(lambda d: d.execute_script(_CHARTS_DRAWN))
    return driver.execute_script("return performance.now()")


def offline(driver, on: bool = True) -> None:
    """Cut the browser's network (DevTools' network emulation): a page must then work from disk."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.emulateNetworkConditions",
        {"offline": on, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )


def page_timing(driver) -> dict[str, float]:
    """The open page's navigation timing, in ms from the start of the navigation: DOMContentLoaded
    ended and load ended."""
    return driver.execute_script(
        "var t = performance.getEntriesByType('navigation')[0];"
        "return {dom_content_loaded_ms: t.domContentLoadedEventEnd, load_ms: t.loadEventEnd};"
    )
