"""The report in a real browser: Debian's chromium, headless, driven through chromium-driver by Selenium.

The lake is made by ``analyze`` from two bundled samples (samples/mixed.pcapng and
samples/flow/amqp091-memory-alarm.pcap). Expected values come from their ground truth
(``*.truth.json``: what the clients and the broker did) and from tshark, not from the report. The
page is opened from disk and must: show every capture's file name and verdict on the first screen
(1400x900, no scrolling), weigh at most 3 MB, log no console error, make no network request
(Chrome's performance log), draw every chart with data (marks counted in the SVG), draw a queue's
publishes per bucket as tshark counts them, show the diagnosis, and land a drill-down link on its
target. The Data Docs index, opened with the network cut, is styled and makes no request. A
screenshot of each page is kept in out/artifacts/.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.report.page import write_report
from amqpscope.jobs.stages.analyze import analyze
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA, DIAGNOSIS_SCHEMA
from amqpscope.schemas.report import CHART_SERIES_SCHEMA
from testbed.browser import available, headless_chromium, offline, open_drawn, page_timing
from tests.paths import ROOT
from tests.paths import SAMPLES as SAMPLES_DIR

SAMPLES = [SAMPLES_DIR / "mixed.pcapng", SAMPLES_DIR / "flow" / "amqp091-memory-alarm.pcap"]
ARTIFACTS = ROOT / "out" / "artifacts"
FIRST_SCREEN = (1400, 900)
MAX_PAGE_BYTES = 3 * 1024 * 1024

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not available(), reason="chromium / chromium-driver not installed"),
]

selenium = pytest.importorskip("selenium")
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def truth(sample: Path) -> dict[str, Any]:
    return json.loads(sample.with_name(sample.name.split(".")[0] + ".truth.json").read_text())


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory) -> tuple[Lake, Path, list[str]]:
    """A lake and report made by ``analyze`` of SAMPLES; AMQPSCOPE_TEST_LAKE and AMQPSCOPE_TEST_REPORT
    name ones it made already (``amqpscope analyze`` of the same two samples), to spare the run."""
    made = os.environ.get("AMQPSCOPE_TEST_LAKE"), os.environ.get("AMQPSCOPE_TEST_REPORT")
    if all(made):
        store = Lake(spark, made[0])
        names = [s.name for s in SAMPLES]
        ids = [r["capture_id"] for r in store.read("captures").where(F.col("file_name").isin(names)).collect()]
        assert len(ids) == len(SAMPLES)
        return store, Path(made[1]), ids
    root = tmp_path_factory.mktemp("browser")
    config = AnalyzeConfig(lake=root / "lake", report=root / "analyze-report.html")
    result = analyze(spark, [str(s) for s in SAMPLES], config)
    return Lake(spark, config.lake), result.report, list(result.capture_ids)


def alarm_diagnosis(lake: Lake, capture_ids: list[str]):
    """Diagnosis rows for the memory-alarm capture, standing in for the diagnosis pipeline's.

    What they say is the sample's ground truth (a memory alarm blocked the publisher, reason "low on
    memory"); where it happened is the lake's connection_blocked interval.
    """
    spark = lake.spark
    blocked = lake.read("connection_blocked").where(F.col("capture_id").isin(capture_ids)).collect()
    assert len(blocked) == 1  # truth: one connection.blocked, one connection.unblocked
    b = blocked[0]
    connection = (
        lake.read("connections")
        .where((F.col("capture_id") == b["capture_id"]) & (F.col("connection_id") == b["connection_id"]))
        .collect()[0]
    )
    client = f"{connection['client_address']}:{connection['client_port']}"
    reason = truth(SAMPLES[1])["ground_truth"]["amqp091_memory_alarm"]["blocked_reason"]
    explanation = f"RabbitMQ's memory alarm blocked publishing on {client} ({reason})."
    finding = dict(
        capture_id=b["capture_id"],
        rank=1,
        finding_id="alarm-1",
        rule_id="diagnosis.alarm.blocked",
        connection_id=b["connection_id"],
        entity_kind="connection",
        entity=client,
        connection_name=None,
        client=client,
        channel=None,
        consumer_tag=None,
        link_name=None,
        queue=None,
        component="memory_alarm",
        effect="blocked",
        severity="warning",
        start_ts=b["start_ts"],
        end_ts=b["end_ts"],
        start_packet_number=b["start_packet_number"],
        end_packet_number=b["end_packet_number"],
        duration_us=b["duration_us"],
        lifetime_share=0.5,
        confidence=0.9,
        evidence={"reason": reason},
        packet_numbers=[b["start_packet_number"], b["end_packet_number"]],
        wireshark_filter=f"frame.number in {{{b['start_packet_number']} {b['end_packet_number']}}}",
        explanation=explanation,
    )
    summary = {
        k: finding[k]
        for k in (
            "rank",
            "component",
            "effect",
            "entity_kind",
            "entity",
            "connection_id",
            "start_ts",
            "end_ts",
            "start_packet_number",
            "confidence",
            "explanation",
        )
    }
    diagnosis = [
        dict(
            capture_id=b["capture_id"],
            bottleneck="memory_alarm",
            effect="blocked",
            entity_kind="connection",
            entity=client,
            connection_id=b["connection_id"],
            start_packet_number=b["start_packet_number"],
            headline=explanation,
            findings_count=1,
            findings=[summary],
        )
    ]
    healthy = [
        dict(
            capture_id=c,
            bottleneck="none",
            effect=None,
            entity_kind=None,
            entity=None,
            connection_id=None,
            start_packet_number=None,
            headline="Every connection kept up with its traffic.",
            findings_count=0,
            findings=[],
        )
        for c in capture_ids
        if c != b["capture_id"]
    ]
    return (
        spark.createDataFrame(diagnosis + healthy, DIAGNOSIS_SCHEMA),
        spark.createDataFrame([finding], BOTTLENECKS_SCHEMA),
        explanation,
    )


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with headless_chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


# Drawn marks per chart: bars, line paths with a drawn path, and point markers.
MARKS = """
return Array.from(document.querySelectorAll('div.chart')).map(function (div) {
  var lines = Array.from(div.querySelectorAll('.scatterlayer path.js-line'))
      .filter(function (p) { return (p.getAttribute('d') || '').length > 1; }).length;
  var points = div.querySelectorAll('.scatterlayer path.point').length;
  var bars = div.querySelectorAll('.barlayer .point path').length;
  return {id: div.id, title: (div.querySelector('.gtitle') || {}).textContent || '', lines: lines,
          points: points, bars: bars, traces: (div.data || []).length};
});
"""


def open_page(driver, page: Path) -> list[dict[str, Any]]:
    driver.get_log("performance")  # drop what earlier pages logged
    driver.get_log("browser")
    open_drawn(driver, page)
    return driver.execute_script(MARKS)


def requests(driver, page: str) -> list[str]:
    """What the page's document asked for (the browser's own chrome:// pages are not the page's)."""
    sent = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent" and message["params"].get("documentURL") == page:
            sent.append(message["params"]["request"]["url"])
    return sent


def check_page(driver, page: Path) -> list[dict[str, Any]]:
    marks = open_page(driver, page)
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    assert requests(driver, page.resolve().as_uri()) == [page.resolve().as_uri()]  # the page itself, nothing else
    assert marks, "no chart on the page"
    for chart in marks:
        assert chart["traces"] > 0 and chart["lines"] + chart["points"] + chart["bars"] > 0, chart
    return marks


def screenshot(driver, name: str, page: Path) -> Path:
    """Keeps a screenshot of the whole page, and its size and load times (a record, not a check)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    timing = page_timing(driver)
    (ARTIFACTS / f"report-{name}.json").write_text(json.dumps({"bytes": page.stat().st_size, **timing}) + "\n")
    height = driver.execute_script("return document.body.scrollHeight")
    driver.set_window_size(1400, min(height, 12000))
    target = ARTIFACTS / f"report-{name}.png"
    driver.save_screenshot(str(target))
    driver.set_window_size(1400, 1000)
    return target


# Where each overview row and its cells are, after the page opened with no section open.
OVERVIEW = """
return Array.from(document.querySelectorAll('table.overview tbody tr')).map(function (tr) {
  var r = tr.getBoundingClientRect();
  return {file: tr.querySelector('td.file').innerText, verdict: tr.querySelector('td.verdict-cell').innerText,
          level: tr.className, top: r.top, bottom: r.bottom, right: r.right};
});
"""


def test_first_screen_shows_every_capture_and_its_verdict(lake, browser):
    store, report, capture_ids = lake
    browser.set_window_size(*FIRST_SCREEN)
    browser.get_log("performance")
    browser.get(report.resolve().as_uri())
    rows = browser.execute_script(OVERVIEW)
    viewport = browser.execute_script("return [window.innerWidth, window.innerHeight, window.scrollY]")
    # Every capture, its file name and its verdict, within the first screen, nothing scrolled.
    assert sorted(r["file"] for r in rows) == sorted(s.name for s in SAMPLES)
    assert viewport[2] == 0 and all(
        0 <= r["top"] and r["bottom"] <= viewport[1] and r["right"] <= viewport[0] for r in rows
    ), (rows, viewport)
    diagnoses = {
        d["capture_id"]: d for d in store.read("diagnosis").where(F.col("capture_id").isin(capture_ids)).collect()
    }
    names = {r["capture_id"]: r["file_name"] for r in store.read("captures").collect()}
    for capture_id, d in diagnoses.items():
        row = next(r for r in rows if r["file"] == names[capture_id])
        words = d["headline"] if d["bottleneck"] != "none" else "No bottleneck found"
        assert words in row["verdict"], (row, d["headline"])
    # Worst first: a bottleneck before a healthy capture.
    levels = [r["level"] for r in rows]
    assert levels == sorted(
        levels,
        key=lambda c: ["level-bottleneck", "level-error", "level-warning", "level-unknown", "level-healthy"].index(c),
    )
    assert requests(browser, report.resolve().as_uri()) == [report.resolve().as_uri()]
    assert report.stat().st_size <= MAX_PAGE_BYTES
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "report-first-screen.png"))
    (ARTIFACTS / "report-first-screen.json").write_text(
        json.dumps({"bytes": report.stat().st_size, **page_timing(browser), "rows": rows}) + "\n"
    )
    browser.set_window_size(1400, 1000)


def tshark_counts(capture: Path, display_filter: str, field: str, width: float) -> Counter:
    """Occurrences of ``field`` in the frames ``display_filter`` keeps, per bucket of ``width``
    seconds since the capture's first packet (frame.time_relative): several AMQP frames can share
    a packet, each an occurrence."""
    out = subprocess.run(
        [
            "tshark",
            "-r",
            str(capture),
            "-Y",
            display_filter,
            "-T",
            "fields",
            "-e",
            "frame.time_relative",
            "-e",
            field,
            "-E",
            "occurrence=a",
            "-E",
            "aggregator=|",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: Counter = Counter()
    for line in out.splitlines():
        time_relative, values = line.split("\t")
        # In whole microseconds, as amqpscope buckets (pcap times are microseconds).
        counts[math.floor(round(float(time_relative) * 1e6) / round(width * 1e6))] += len(values.split("|"))
    return counts


def test_a_queue_chart_counts_the_publishes_tshark_counts(lake, browser):
    _, report, _ = lake
    open_page(browser, report)
    queue = "amqpscope.qos-confirms"  # truth: mixed.pcapng's 0-9-1 publisher, default exchange
    trace = browser.execute_script(
        "var name = arguments[0], found = null;"
        "document.querySelectorAll('div.chart').forEach(function (d) { (d.data || []).forEach(function (t) {"
        " if (t.name === name) found = {x: t.x, y: t.y, counts: t.customdata}; }); });"
        "return found;",
        f"/queues/{queue} publish",
    )
    assert trace is not None
    width = round(trace["x"][1] - trace["x"][0], 9)
    drawn = {round(x / width): n for x, n in zip(trace["x"], trace["counts"]) if n}
    expected = tshark_counts(
        SAMPLES[0],
        f'amqp.method.class == 60 && amqp.method.method == 40 && amqp.method.arguments.routing_key == "{queue}"',
        "amqp.method.arguments.routing_key",
        width,
    )
    assert sum(expected.values()) == 200 and drawn == dict(expected)
    # The line drawn is the bucket's mean rate: its count over the width.
    assert all(abs(y - n / width) < 1e-6 * max(1.0, y) for y, n in zip(trace["y"], trace["counts"]))


def test_data_docs_open_offline_styled_and_make_no_request(lake, browser):
    store, _, _ = lake
    index = next((Path(store.root) / "_data_docs").rglob("index.html"))
    browser.get_log("performance")
    offline(browser)
    try:
        browser.get(index.resolve().as_uri())
        WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
        styled = browser.execute_script(
            "var fa = document.querySelector('.fas');"
            "return {navbar: getComputedStyle(document.querySelector('.navbar')).display,"
            " icons: fa ? getComputedStyle(fa, '::before').fontFamily : null,"
            " rows: document.querySelectorAll('table[id$=\"-body-table\"] tbody tr').length,"
            " jquery: typeof window.jQuery, vega: typeof window.vegaEmbed};"
        )
        # What the Data Docs' pages (file://) asked for; the browser's own chrome:// pages (Chromium
        # 156 loads its cr_elements for them) are not theirs.
        sent = [json.loads(entry["message"])["message"] for entry in browser.get_log("performance")]
        urls = [
            m["params"]["request"]["url"]
            for m in sent
            if m["method"] == "Network.requestWillBeSent" and m["params"].get("documentURL", "").startswith("file://")
        ]
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "data-docs-offline.png"))
    finally:
        offline(browser, False)
    # Nothing from the network: files from disk, and the images style sheets carry inline (data:).
    assert [u for u in urls if not u.startswith(("file://", "data:"))] == []
    assert any(u.endswith("/static/vendor/bootstrap/dist/css/bootstrap.min.css") for u in urls)
    assert styled["navbar"] == "flex"  # Bootstrap's style sheet applied
    assert "Font Awesome" in (styled["icons"] or "")
    assert styled["rows"] > 0  # jQuery and Bootstrap Table ran: the index lists the validations
    assert styled["jquery"] == "function" and styled["vega"] == "function"
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_analyze_report_opens_offline_with_every_chart_drawn(lake, browser):
    _, report, _ = lake
    marks = check_page(browser, report)
    titles = [m["title"] for m in marks]
    # Ground truth: mixed.pcapng has a prefetch-10 consumer (0-9-1), 1.0 links and confirms;
    # the memory-alarm capture has publisher confirms. Each kind of chart is there for them.
    for title in (
        "Unacked deliveries and prefetch per consumer",
        "AMQP 1.0 link credit",
        "Publisher confirms outstanding per channel",
        "TCP receive window advertised",
        "Messages and bytes per second per connection",
        "Timeline",
        "Message rates per queue",
        "Ready messages per queue",
        "Consumer utilisation",
        "Unacked deliveries per channel",
        "AMQP 1.0 deliveries per link",
        "Connection and channel churn",
    ):
        assert any(t.startswith(title) for t in titles), (title, titles)
    prefetch = browser.execute_script(
        "var d = Array.from(document.querySelectorAll('div.chart')).find(function (x) {"
        " return x.data && x.data.some(function (t) { return / prefetch$/.test(t.name); }); });"
        "return d.data.filter(function (t) { return / prefetch$/.test(t.name); })"
        ".map(function (t) { return Math.max.apply(null, t.y); });"
    )
    assert prefetch == [10]  # truth: basic.qos(prefetch_count=10, global=false)
    screenshot(browser, "analyze", report)


def test_dashboard_answers_first_and_drills_down(lake, browser, tmp_path):
    store, _, capture_ids = lake
    diagnosis, bottlenecks, explanation = alarm_diagnosis(store, capture_ids)
    tables = {
        name: store.read(name).where(F.col("capture_id").isin(capture_ids))
        for name in (
            "frames",
            "connections",
            "violations",
            "captures",
            "quarantine",
            "flow_intervals",
            "consumer_unacked",
            "link_state",
            "channel_confirms",
            "tcp_flow",
            "throughput",
            "dq_summary",
        )
    }
    page = write_report(
        tmp_path / "report.html",
        frames=tables["frames"],
        connections=tables["connections"],
        violations=tables["violations"],
        captures=tables["captures"],
        verdicts=None,
        data_docs_index=None,
        flow={
            k: tables[k]
            for k in ("flow_intervals", "consumer_unacked", "link_state", "channel_confirms", "tcp_flow", "throughput")
        },
        quarantine=tables["quarantine"],
        diagnosis=diagnosis,
        bottlenecks=bottlenecks,
        dq_summary=tables["dq_summary"],
        chart_series=store.read_rows("chart_series", CHART_SERIES_SCHEMA, capture_ids),
    )
    check_page(browser, page)
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "BOTTLENECK: MEMORY_ALARM" in body.upper() and explanation in body
    assert "No bottleneck found. Every connection kept up with its traffic." in body
    # Context from the wire equals the ground truth: broker product and version, client version.
    alarm = truth(SAMPLES[1])
    assert f"{alarm['broker']['product']} {alarm['broker']['version']}" in body
    assert alarm["ground_truth"]["amqp091_memory_alarm"]["client_version"] in body
    # The blocked interval on the timeline lies within the alarm (raised .. cleared, truth).
    blocked = browser.execute_script(
        "return Array.from(document.querySelectorAll('div.chart')).flatMap(function (d) {"
        " return (d.data || []).filter(function (t) { return t.name === 'connection_blocked'; })"
        ".map(function (t) { return t.x; }); });"
    )
    assert len(blocked) == 1 and len(blocked[0]) == 1
    assert 0.5 < blocked[0][0] <= alarm["ground_truth"]["amqp091_memory_alarm"]["alarm_cleared_after_seconds"] + 0.4

    link = browser.find_element(By.CSS_SELECTOR, "table.findings a.drill")
    target = link.get_attribute("href").split("#", 1)[1]
    link.click()
    WebDriverWait(browser, 10).until(lambda d: d.execute_script("return location.hash") == f"#{target}")
    landed = browser.execute_script(
        "var r = document.getElementById(arguments[0]).getBoundingClientRect();return [r.top, window.innerHeight];",
        target,
    )
    assert -1 <= landed[0] < landed[1]  # the target is in view (at the top: within a pixel's rounding)
    assert browser.find_element(By.ID, target).text.startswith("Connection ")
    browser.execute_script("window.scrollTo(0, 0)")
    screenshot(browser, "dashboard", page)


def test_hostile_names_stay_inert_in_the_browser(spark, browser, tmp_path):
    from tests.test_report_dashboard import HOSTILE, flow_tables, render

    _, _ = render(spark, tmp_path, flow=flow_tables(spark))
    check_page(browser, tmp_path / "report.html")
    # Hover a drawn point of every chart (the mouse over it, as a person would): tooltips show names as text.
    tooltips = []
    for chart in browser.find_elements(By.CSS_SELECTOR, "div.chart"):
        marks = chart.find_elements(By.CSS_SELECTOR, ".scatterlayer path.point, .barlayer .point path")
        if marks:
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", marks[0])
            ActionChains(browser).move_to_element(marks[0]).perform()
            tooltips.append(
                browser.execute_script(
                    "return Array.from(document.querySelectorAll('.hoverlayer')).map(function (h) {"
                    " return h.textContent; }).join(' ');"
                )
            )
    state = browser.execute_script(
        "return {pwned: window.pwned === undefined ? null : window.pwned,"
        " images: document.querySelectorAll('img').length,"
        " scripts: document.querySelectorAll('script:not([type])').length};"
    )
    assert state["pwned"] is None and state["images"] == 0 and state["scripts"] == 2  # the library and the loader
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018 (reading it is the check)
    assert HOSTILE in browser.find_element(By.TAG_NAME, "body").text
    assert any("<script>alert('x')</script>" in t for t in tooltips), tooltips
