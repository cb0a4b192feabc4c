"""The scheduled stages on one lake: the bundle's tasks run locally with its own parameters, give the
tables ``analyze`` gives, derive only what is new, and change nothing when run again."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.report.page import write_report
from amqpscope.jobs.stages.analyze import analyze
from amqpscope.pipelines import tables
from amqpscope.pipelines.tables import BRONZE, DERIVED, FLOW
from amqpscope.schemas.quality import RUN_COLUMNS
from tests.paths import ROOT, SAMPLES

FIRST, SECOND = SAMPLES / "amqp10-credit.pcap", SAMPLES / "amqp091-qos-confirms.pcap"
TABLES = (*BRONZE, *DERIVED)
TASK_ORDER = ["ingest", "derive", "report", "maintain"]


def same_input(lake: Lake, table: str):
    """The table without the columns naming the run that wrote it (dq_summary's)."""
    return lake.read(table).drop(*RUN_COLUMNS)


def bundle() -> tuple[dict, dict]:
    """databricks.yml and the job of resources/*.yml, as parsed YAML."""
    top = yaml.safe_load((ROOT / "databricks.yml").read_text())
    jobs = {}
    for pattern in top["include"]:
        for path in sorted(ROOT.glob(pattern)):
            jobs.update(yaml.safe_load(path.read_text())["resources"].get("jobs", {}))
    return top, jobs


def substituted(parameters: list[str], values: dict[str, str]) -> list[str]:
    """A task's parameters as a run started with the job parameters ``values`` gets them (every
    parameter of the job given: a run started by hand may set each)."""
    _, jobs = bundle()
    assert set(values) == {p["name"] for p in jobs["amqpscope"]["parameters"]}
    return [re.sub(r"\{\{job\.parameters\.([\w.-]+)\}\}", lambda m: values[m.group(1)], p) for p in parameters]


def wheel_task_function(entry_point: str):
    """The function a ``python_wheel_task`` calls: the entry point of that name among the installed
    amqpscope distribution's, whatever its group (as the Databricks CLI's python_wheel_task wrapper
    finds it: bundle/trampoline/python_wheel.go of github.com/databricks/cli)."""
    found = [e for e in importlib.metadata.distribution("amqpscope").entry_points if e.name == entry_point]
    assert len(found) == 1, f"no entry point {entry_point} in the installed amqpscope"
    return found[0].load()


def run_wheel_task(wheel: dict, parameters: list[str]) -> None:
    """A ``python_wheel_task`` run: ``sys.argv`` the package name and the parameters, the entry
    point called, what it returns ignored; a failed stage raises."""
    saved = sys.argv
    sys.argv = [wheel["package_name"], *parameters]
    try:
        wheel_task_function(wheel["entry_point"])()
    finally:
        sys.argv = saved


def test_bundle_declares_the_stages_with_their_parameters():
    top, jobs = bundle()
    assert set(top["targets"]) == {"dev", "prod"}
    assert top["targets"]["dev"]["resources"]["jobs"]["amqpscope"]["trigger"]["pause_status"] == "PAUSED"
    prod = top["targets"]["prod"]
    assert "service_principal_name" in prod["run_as"]
    assert prod["resources"]["jobs"]["amqpscope"]["email_notifications"]["on_failure"]
    assert top["artifacts"]["amqpscope_wheel"]["type"] == "whl"
    job = jobs["amqpscope"]
    tasks = {t["task_key"]: t for t in job["tasks"]}
    assert list(tasks) == TASK_ORDER
    assert [t.get("depends_on", [{}])[0].get("task_key") for t in job["tasks"]] == [None, *TASK_ORDER[:-1]]
    parameters = {p["name"] for p in job["parameters"]}
    for task in tasks.values():
        wheel = task["python_wheel_task"]
        assert wheel["package_name"] == "amqpscope"
        assert callable(wheel_task_function(wheel["entry_point"]))
        used = set(re.findall(r"\{\{job\.parameters\.(\w+)\}\}", " ".join(wheel["parameters"])))
        assert used <= parameters and {"lake", "config", "catalog", "schema"} <= used
    assert "{{job.parameters.landing}}" in tasks["ingest"]["python_wheel_task"]["parameters"]


@pytest.fixture(scope="module")
def clean(spark, tmp_path_factory):
    """The reference: ``analyze`` on the first sample, in one run; and what its ``answered`` got:
    the diagnoses, the stages timed by then and the derived tables in the lake by then."""
    root = tmp_path_factory.mktemp("clean")
    timings: dict[str, float] = {}
    answers: list[tuple[tuple, list[str], list[str]]] = []
    store = Lake(spark, root / "lake", backend="delta-rs")

    def answered(found: tuple) -> None:
        answers.append((found, list(timings), [t for t in DERIVED if store.exists(t)]))

    result = analyze(
        spark, [str(FIRST)], AnalyzeConfig(lake=root / "lake", storage="delta-rs"), timings, answered=answered
    )
    return root / "lake", result, answers


# What the diagnosis reads (pipelines.diagnosis.findings: the findings' inputs and flow_intervals' own).
DIAGNOSIS_INPUTS = {
    "messages_091",
    "deliveries_10",
    "link_state",
    "session_window",
    "consumer_unacked",
    "channel_unacked",
    "channel_confirms",
    "connection_blocked",
    "channel_flow",
    "tcp_flow",
    "flow_intervals",
}


def test_analyze_hands_the_diagnoses_over_before_the_verdicts_and_the_report(spark, clean):
    lake, result, answers = clean
    [(diagnoses, stages_done, tables_by_then)] = answers
    # "derive": the captures marked running in the runs table before the first derived table is written.
    assert stages_done == ["ingest", "derive", "messages", "flow_state", "diagnosis"]
    # Only what the diagnosis reads was written before it: the other tables follow the answer.
    assert set(tables_by_then) == DIAGNOSIS_INPUTS | {"bottlenecks", "diagnosis"}
    assert all(Lake(spark, lake).exists(t) for t in DERIVED)
    assert diagnoses == result.diagnoses
    stored = Lake(spark, lake).read("diagnosis").collect()
    assert [(d["capture_id"], d["headline"]) for d in diagnoses] == [(r.capture_id, r.headline) for r in stored]
    assert len(stored) == 1 and stored[0].headline


def run_tasks(values: dict[str, str], capsys) -> dict[str, dict]:
    """Every task of the bundle's job, in order, as its python_wheel_task runs it, with its parameters."""
    _, jobs = bundle()
    outputs = {}
    for task in jobs["amqpscope"]["tasks"]:
        wheel = task["python_wheel_task"]
        run_wheel_task(wheel, substituted(wheel["parameters"], values))
        outputs[task["task_key"]] = json.loads(capsys.readouterr().out)
    return outputs


@pytest.mark.slow
def test_bundle_tasks_run_locally_and_equal_analyze(spark, tmp_path, clean, capsys):
    clean_lake, clean_result, _ = clean
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    config = tmp_path / "analyze.yml"
    config.write_text(yaml.safe_dump({"lake": "ignored-the-flag-wins", "storage": "delta-rs"}))
    # No Unity Catalog here (no Delta jars): a blank catalog and schema, as a run of the job may give.
    values = {"landing": str(landing), "lake": str(lake), "config": str(config), "catalog": "", "schema": ""}
    first, second = capture_id(FIRST), capture_id(SECOND)
    shutil.copy(FIRST, landing / FIRST.name)

    out = run_tasks(values, capsys)
    assert out["ingest"]["ingested"] == [first]
    assert out["derive"]["derived"] == [first]
    assert out["report"]["captures"] == [first] and out["report"]["incomplete"] == []
    assert Path(out["report"]["report"]).parent == lake / "reports"
    # Every table compacted, nothing vacuumed yet (the files replaced are younger than the retention).
    assert set(out["maintain"]["tables"]) == set(TABLES) | {"runs"}
    assert all(
        t["files_vacuumed"] == 0 and t["files_after"] <= t["files_before"] for t in out["maintain"]["tables"].values()
    )
    assert Path(out["report"]["report"]).read_text().count(first) >= 1

    # ingest + derive gives the tables analyze gives.
    store, reference = Lake(spark, lake), Lake(spark, clean_lake)
    for table in TABLES:
        assertDataFrameEqual(same_input(store, table), same_input(reference, table))
    assert {t: store.read(t).count() for t in TABLES} == clean_result.row_counts

    # Run again with nothing new: nothing is decoded or derived, no row changes.
    again = run_tasks(values, capsys)
    assert again["ingest"]["ingested"] == [] and again["ingest"]["skipped"] == [first]
    assert again["derive"]["derived"] == [] and again["derive"]["up_to_date"] == [first]
    assert again["report"]["report"] != out["report"]["report"]  # a report per run

    # One capture lands: only it is ingested and derived; the first's rows stay as they were.
    shutil.copy(SECOND, landing / SECOND.name)
    third = run_tasks(values, capsys)
    assert third["ingest"]["ingested"] == [second]
    assert third["derive"]["derived"] == [second] and third["derive"]["up_to_date"] == [first]
    assert sorted(third["report"]["captures"]) == sorted([first, second])
    state = runs.stage_runs(store)
    assert {runs.completeness(state, c) for c in (first, second)} == {runs.COMPLETE}
    assert state[(first, "derive")].run_id != state[(second, "derive")].run_id
    for table in TABLES:
        assertDataFrameEqual(
            same_input(store, table).filter(F.col("capture_id") == first), same_input(reference, table)
        )


def test_report_of_a_lake_with_no_complete_capture_says_so(spark, tmp_path, clean):
    # Ingested, never derived: the bronze tables of the clean lake, no derived table, the runs table
    # saying derive is still running (a run killed in derive leaves that).
    clean_lake, _, _ = clean
    lake = tmp_path / "lake"
    for table in (*BRONZE, "runs"):
        shutil.copytree(clean_lake / table, lake / table)
    first = capture_id(FIRST)
    store = Lake(spark, lake, backend="delta-rs")
    runs.mark(store, "killed-run", "derive", [first], "running")
    config = AnalyzeConfig(lake=lake, storage="delta-rs")

    from amqpscope.jobs.stages.report_job import report_lake

    result = report_lake(spark, config)
    assert result.captures == () and result.incomplete == ((first, "derive running"),)
    page = result.report.read_text(encoding="utf-8")
    assert "No capture is complete in this lake" in page
    # The capture left out is listed with its file and why.
    assert re.search(rf"<code>{first[:16]}</code></td><td>{FIRST.name}</td><td>derive running</td>", page)


def test_the_report_job_reads_the_gold_tables_without_spark_and_draws_the_page_their_queries_draw(
    spark, tmp_path, monkeypatch
):
    # A capture with findings: their timestamps and evidence maps are what pyarrow and Spark's
    # collect give in other types.
    capture = SAMPLES / "bottlenecks" / "memory-alarm.pcap"
    config = AnalyzeConfig(lake=tmp_path / "lake", storage="delta-rs")
    analyze(spark, [str(capture)], config)
    store, first = Lake(spark, config.lake, backend="delta-rs"), capture_id(capture)
    findings = store.read_rows("bottlenecks", tables.table("bottlenecks").schema, [first])
    assert findings and all(f["start_ts"] is not None and f["evidence"] for f in findings)

    # The page of the same lake with every table queried in Spark, the gold ones included.
    keep = F.col("capture_id") == first
    queried = write_report(
        config.report_path_for("queried"),
        frames=store.read("frames").filter(keep),
        connections=store.read("connections").filter(keep),
        violations=store.read("violations").filter(keep),
        captures=store.read("captures").filter(keep),
        verdicts=None,
        data_docs_index=next(config.data_docs_dir.rglob("index.html")),
        flow={name: store.read(name).filter(keep) for name in FLOW},
        quarantine=store.read("quarantine").filter(keep),
        **{name: store.read(name).filter(keep) for name in ("diagnosis", "bottlenecks", "dq_summary")},
        chart_series=store.read_rows("chart_series", tables.table("chart_series").schema, [first]),
        queue_balance=store.read_rows("queue_balance", tables.table("queue_balance").schema, [first]),
    ).read_text(encoding="utf-8")
    assert first in queried and "memory" in queried

    # The report job: every row of its page read through delta-rs; a Spark read of any table, or
    # a Spark job, fails the test.
    def read(self, name, *args, **kwargs):
        raise AssertionError(f"{name} queried in Spark")

    monkeypatch.setattr(Lake, "read", read)
    context = spark.sparkContext
    context.setJobGroup("the-report-job", "jobs the report job runs")
    from amqpscope.jobs.stages.report_job import report_lake

    result = report_lake(spark, config)
    assert result.captures == (first,)
    assert result.report.read_text(encoding="utf-8") == queried
    ran = list(context.statusTracker().getJobIdsForGroup("the-report-job"))
    spark.range(3).count()  # the probe sees a Spark job of this thread
    probed = list(context.statusTracker().getJobIdsForGroup("the-report-job"))
    context.setLocalProperty("spark.jobGroup.id", None)
    assert ran == [] and probed

    # A lake derived before the report's sections were a gold table: they are computed from the
    # stored tables, and the page is the same.
    monkeypatch.undo()
    shutil.rmtree(config.lake / "report_sections")
    again = report_lake(spark, config)
    assert again.report != result.report and again.report.read_text(encoding="utf-8") == queried


def test_the_report_job_starts_no_spark_where_the_lake_is_read_with_delta_rs(spark, clean, tmp_path):
    lake = tmp_path / "lake"
    shutil.copytree(clean[0], lake)
    # `amqpscope report` as a scheduled stage runs it, in a process of its own: no Spark session
    # is started, so no JVM is launched at all.
    script = (
        "import json, sys\n"
        "from pyspark import SparkContext\n"
        "from amqpscope.jobs.cli import cli\n"
        "code = cli.main(['report', '--lake', sys.argv[1], '--report', sys.argv[2], '--progress', 'never'])\n"
        "print(json.dumps({'exit': int(code), 'jvm': SparkContext._gateway is not None}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    done = subprocess.run(
        [sys.executable, "-c", script, str(lake), str(tmp_path / "alone.html")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"exit": 0, "jvm": False}
    # The page is the one the job draws beside a running session.
    from amqpscope.jobs.stages.report_job import report_lake

    beside = report_lake(spark, AnalyzeConfig(lake=lake, report=tmp_path / "beside.html", storage="delta-rs"))
    assert beside.captures == (capture_id(FIRST),)
    assert (tmp_path / "alone.html").read_text(encoding="utf-8") == beside.report.read_text(encoding="utf-8")
