"""The Databricks bundle as a deploy would take it: every file valid against the bundle JSON schema the
Databricks CLI publishes (tests/data/bundle/), the references between the files resolved (artifact,
libraries, variables, job parameters, task keys, entry points, the dashboard's file and datasets),
the production basics declared (access mode, file-arrival trigger, retries and timeouts, permissions,
tags, sync), and the dashboard's queries run on a real lake, each giving what the tables say."""

from __future__ import annotations

import configparser
import copy
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest
import regex
import yaml
from jsonschema import validators
from pyspark.sql import functions as F

from amqpscope.jobs.lake.lake import Lake
from amqpscope.schemas.catalog import tables
from amqpscope.schemas.diagnosis import COMPONENTS
from tests.paths import ROOT
from tests.test_jobs import TASK_ORDER, bundle

SCHEMA = ROOT / "tests" / "data" / "bundle" / "jsonschema.json"
VARIABLE = re.compile(r"\$\{var\.([\w-]+)\}")
JOB_PARAMETER = re.compile(r"\{\{job\.parameters\.([\w.-]+)\}\}")
RESOURCE = re.compile(r"\$\{resources\.(\w+)\.([\w-]+)\.")
NOT_A_BOTTLENECK = ("none", "no_amqp", "encrypted")


def _pattern(validator, pattern, instance, schema):
    # The CLI's patterns use Unicode property classes (\p{L}, \p{N}), which Python's re does not read.
    if validator.is_type(instance, "string") and not regex.search(pattern, instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


BundleValidator = validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})


def bundle_files() -> dict[str, dict]:
    """databricks.yml and every file it includes, each as parsed YAML, by path relative to the root."""
    top = yaml.safe_load((ROOT / "databricks.yml").read_text())
    found = {"databricks.yml": top}
    for pattern in top["include"]:
        for path in sorted(ROOT.glob(pattern)):
            found[str(path.relative_to(ROOT))] = yaml.safe_load(path.read_text())
    return found


def schema_errors(config: dict) -> list[str]:
    """Every error, down to the ones inside a ``oneOf`` (a value or an interpolated ``${...}`` string)."""
    validator = BundleValidator(json.loads(SCHEMA.read_text()))

    def leaves(error: jsonschema.ValidationError) -> list[str]:
        if error.context:
            return [m for e in error.context for m in leaves(e)]
        return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}"]

    return [m for e in validator.iter_errors(config) for m in leaves(e)]


def resources() -> dict[str, dict]:
    """Every resource of every file, by kind (jobs, dashboards, ...) then key."""
    merged: dict[str, dict] = {}
    for config in bundle_files().values():
        for kind, found in (config.get("resources") or {}).items():
            merged.setdefault(kind, {}).update(found)
    return merged


def strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return [node] if isinstance(node, str) else []


def test_every_file_of_the_bundle_is_valid_against_the_published_schema():
    files = bundle_files()
    assert set(files) == {
        "databricks.yml",
        "resources/amqpscope_job.yml",
        "resources/amqpscope_serverless_job.yml",
        "resources/amqpscope_catalog.yml",
        "resources/amqpscope_dashboard.yml",
    }
    for name, config in files.items():
        assert schema_errors(config) == [], name


def test_the_schema_check_finds_what_a_deploy_would_refuse():
    """The check is not vacuous: a misspelt key, an unknown enum value, a missing required field
    and a wrongly typed value are each found."""
    job_file = bundle_files()["resources/amqpscope_job.yml"]
    broken = copy.deepcopy(job_file)
    job = broken["resources"]["jobs"]["amqpscope"]
    job["tasks"][0]["max_retry"] = 2
    job["job_clusters"][0]["new_cluster"]["data_security_mode"] = "DEDICATED_TO_ME"
    del job["trigger"]["file_arrival"]["url"]
    job["tasks"][1]["timeout_seconds"] = "an hour"
    found = "\n".join(schema_errors(broken))
    assert "'max_retry' was unexpected" in found
    assert "DEDICATED_TO_ME" in found
    assert "'url' is a required property" in found
    assert "an hour" in found
    # An interpolated reference in place of a typed value is what the CLI accepts.
    job_file = copy.deepcopy(job_file)
    job_file["resources"]["jobs"]["amqpscope"]["tasks"][1]["timeout_seconds"] = "${var.derive_timeout}"
    assert schema_errors(job_file) == []


def test_the_job_declares_its_access_mode_trigger_parameters_retries_and_timeouts():
    top, jobs = bundle()
    job = jobs["amqpscope"]
    [cluster] = job["job_clusters"]
    assert cluster["new_cluster"]["data_security_mode"] == "SINGLE_USER"  # dedicated access mode
    assert cluster["new_cluster"]["spark_version"].startswith("17.3.")
    schema = "${resources.schemas.amqpscope.name}"  # prefixed with dev_<user>_ in development mode
    landing = f"/Volumes/${{var.catalog}}/{schema}/${{resources.volumes.landing.name}}/"
    assert job["trigger"]["file_arrival"]["url"] == landing
    assert job["trigger"]["file_arrival"]["min_time_between_triggers_seconds"] >= 60
    assert "schedule" not in job  # the landing volume's new files start it
    assert {p["name"]: p["default"] for p in job["parameters"]} == {
        "landing": landing,
        "lake": f"/Volumes/${{var.catalog}}/{schema}/${{resources.volumes.lake.name}}",
        "config": "${var.config_path}",
        "catalog": "${var.catalog}",
        "schema": schema,
    }
    for task in job["tasks"]:
        assert task["max_retries"] >= 1 and task["timeout_seconds"] > 0, task["task_key"]
        assert task["python_wheel_task"]["parameters"]
    assert job["max_concurrent_runs"] == 1 and job["timeout_seconds"] > 0
    assert job["tags"]["project"] == "amqpscope"
    prod = top["targets"]["prod"]
    assert prod["resources"]["jobs"]["amqpscope"]["permissions"] == [
        {"level": "CAN_MANAGE_RUN", "group_name": "${var.operators_group}"}
    ]
    assert prod["resources"]["jobs"]["amqpscope"]["tags"] == {"environment": "prod"}
    assert prod["permissions"] and prod["run_as"]["service_principal_name"] == "${var.service_principal}"
    assert top["targets"]["dev"]["resources"]["jobs"]["amqpscope"]["trigger"]["pause_status"] == "PAUSED"
    assert {"samples/**", "tests/**"} <= set(top["sync"]["exclude"])


def test_the_serverless_job_runs_the_same_tasks_on_a_serverless_environment():
    """The serverless variant: the cluster job's tasks, parameters, retries and timeouts, each task on
    the job's one environment (no cluster, no libraries: the wheel is the environment's dependency),
    and no trigger of its own on the landing volume the cluster job watches."""
    _, jobs = bundle()
    cluster_job, job = jobs["amqpscope"], jobs["amqpscope_serverless"]
    assert job["parameters"] == cluster_job["parameters"]
    assert "job_clusters" not in job and "trigger" not in job
    [environment] = job["environments"]
    assert environment["spec"]["environment_version"] == "4"  # Python 3.12, Spark 4's Connect client
    artifact = yaml.safe_load((ROOT / "databricks.yml").read_text())["artifacts"]["amqpscope_wheel"]
    [output] = artifact["files"]
    [wheel] = environment["spec"]["dependencies"]
    assert (ROOT / "resources" / wheel).resolve() == (ROOT / output["source"]).resolve()
    on_a_cluster = {"job_cluster_key", "libraries", "environment_key"}
    assert [t["task_key"] for t in job["tasks"]] == TASK_ORDER
    for task, same in zip(job["tasks"], cluster_job["tasks"], strict=True):
        assert task["environment_key"] == environment["environment_key"], task["task_key"]
        assert "job_cluster_key" not in task and "libraries" not in task, task["task_key"]
        assert {k: v for k, v in task.items() if k not in on_a_cluster} == {
            k: v for k, v in same.items() if k not in on_a_cluster
        }
    broken = copy.deepcopy(bundle_files()["resources/amqpscope_serverless_job.yml"])
    broken["resources"]["jobs"]["amqpscope_serverless"]["environments"][0]["spec"]["environment_versions"] = "4"
    assert "'environment_versions' was unexpected" in "\n".join(schema_errors(broken))


def test_the_landing_and_lake_paths_are_the_volumes_the_bundle_declares():
    found = resources()
    schema = found["schemas"]["amqpscope"]
    assert (schema["catalog_name"], schema["name"]) == ("${var.catalog}", "${var.schema}")
    volumes = found["volumes"]
    assert set(volumes) == {"landing", "lake"}
    parameters = {p["name"]: p["default"] for p in found["jobs"]["amqpscope"]["parameters"]}
    for key, volume in volumes.items():
        assert volume["catalog_name"] == schema["catalog_name"]
        assert volume["schema_name"] == "${resources.schemas.amqpscope.name}"
        assert parameters[key].rstrip("/") == (
            f"/Volumes/{volume['catalog_name']}/{volume['schema_name']}/${{resources.volumes.{key}.name}}"
        )


def test_references_between_the_files_resolve():
    files = bundle_files()
    top = files["databricks.yml"]
    found = resources()
    declared = set(top["variables"])
    for name, config in files.items():
        used = {m for s in strings(config) for m in VARIABLE.findall(s)}
        assert used <= declared, (name, used - declared)
        for kind, key in {m for s in strings(config) for m in RESOURCE.findall(s)}:
            assert key in found.get(kind, {}), (name, kind, key)
    for target in top["targets"].values():
        assert set(target.get("variables", {})) <= declared
    # The artifact is this directory's wheel; the tasks install what its build writes.
    artifact = top["artifacts"]["amqpscope_wheel"]
    assert (ROOT / artifact["path"] / "setup.cfg").is_file()
    assert "AMQPSCOPE_COMPILE=${var.compile_decoders}" in artifact["build"]
    [output] = artifact["files"]
    job_file = ROOT / "resources" / "amqpscope_job.yml"
    entry_points = configparser.ConfigParser()
    entry_points.read(ROOT / "setup.cfg")
    task_functions = dict(
        line.split(" = ") for line in entry_points["options.entry_points"]["amqpscope.tasks"].split("\n") if line
    )
    job = found["jobs"]["amqpscope"]
    parameters = {p["name"] for p in job["parameters"]}
    keys = [t["task_key"] for t in job["tasks"]]
    assert keys == TASK_ORDER
    clusters = {c["job_cluster_key"] for c in job["job_clusters"]}
    for task in job["tasks"]:
        assert task["job_cluster_key"] in clusters
        for dependency in task.get("depends_on", []):
            assert keys.index(dependency["task_key"]) < keys.index(task["task_key"])
        [library] = task["libraries"]
        assert (job_file.parent / library["whl"]).resolve() == (ROOT / output["source"]).resolve()
        wheel = task["python_wheel_task"]
        assert wheel["entry_point"] in task_functions
        assert task_functions[wheel["entry_point"]] == f"amqpscope.jobs.cli.entry:{task['task_key']}_task"
        assert {m for s in wheel["parameters"] for m in JOB_PARAMETER.findall(s)} <= parameters
    # The dashboard's file, and the datasets its widgets read.
    dashboard = found["dashboards"]["amqpscope"]
    definition = json.loads((job_file.parent / dashboard["file_path"]).read_text())
    datasets = {d["name"] for d in definition["datasets"]}
    for page in definition["pages"]:
        for item in page["layout"]:
            for query in item["widget"]["queries"]:
                assert query["query"]["datasetName"] in datasets, item["widget"]["name"]
    assert (dashboard["dataset_catalog"], dashboard["dataset_schema"]) == (
        "${var.catalog}",
        "${resources.schemas.amqpscope.name}",
    )
    alert = found["alerts"]["new_bottlenecks"]
    assert alert["evaluation"]["source"]["name"] in alert["query_text"]


def dashboard() -> dict:
    return json.loads((ROOT / "resources" / "amqpscope.lvdash.json").read_text())


def dataset_sql(name: str) -> str:
    [found] = [d for d in dashboard()["datasets"] if d["name"] == name]
    return "".join(found["queryLines"])


@pytest.fixture
def lake_views(spark, samples_lake):
    """The samples' lake, each table a temporary view of its name (as the dashboard's datasets,
    given the catalog and schema, name them), changed as a lake in use may be: the last capture's
    derive still running (a killed run leaves it so), the first capture diagnosed with a bottleneck
    (the samples are healthy), every derive ended now."""
    root, config, result = samples_lake
    lake = Lake(spark, root)
    names = [t for t in tables() if lake.exists(t)]
    for name in names:
        lake.read(name).createOrReplaceTempView(name)
    ids = sorted(result.capture_ids)
    complete, incomplete = ids[:-1], ids[-1]
    is_derive = F.col("stage") == "derive"
    lake.read("runs").select(
        *[c for c in lake.read("runs").columns if c not in ("outcome", "ended")],
        F.when(is_derive & (F.col("capture_id") == incomplete), F.lit("running"))
        .otherwise(F.col("outcome"))
        .alias("outcome"),
        F.when(is_derive, F.lit(datetime.now(UTC))).otherwise(F.col("ended")).alias("ended"),
    ).createOrReplaceTempView("runs")
    lake.read("diagnosis").withColumn(
        "bottleneck", F.when(F.col("capture_id") == complete[0], F.lit(COMPONENTS[2])).otherwise(F.col("bottleneck"))
    ).createOrReplaceTempView("diagnosis")
    # Violations of two rules: a complete capture's (shown) and the incomplete one's (not shown).
    found = [
        (cid, rule, "error", "made up", None, None, None, None, None, None, None)
        for cid, rule in (
            (complete[0], "amqp091.x"),
            (complete[0], "amqp091.x"),
            (complete[-1], "amqp10.y"),
            (incomplete, "amqp10.y"),
        )
    ]
    lake.read("violations").unionByName(
        spark.createDataFrame(found, lake.read("violations").schema)
    ).createOrReplaceTempView("violations")
    yield lake, complete, incomplete
    for name in names:
        spark.catalog.dropTempView(name)


def test_every_widget_field_is_a_column_of_its_dataset(spark, lake_views):
    columns = {d["name"]: set(spark.sql("".join(d["queryLines"])).columns) for d in dashboard()["datasets"]}
    for page in dashboard()["pages"]:
        for item in page["layout"]:
            widget = item["widget"]
            [query] = widget["queries"]
            dataset = query["query"]["datasetName"]
            names = {f["name"] for f in query["query"]["fields"]}
            for field in query["query"]["fields"]:
                assert set(re.findall(r"`(\w+)`", field["expression"])) <= columns[dataset], widget["name"]
            encoded = widget["spec"]["encodings"]
            used = [c["fieldName"] for c in encoded.get("columns", [])] + [
                e["fieldName"] for k, e in encoded.items() if k != "columns"
            ]
            assert set(used) <= names, widget["name"]


def test_the_datasets_show_the_complete_captures_as_the_tables_have_them(spark, lake_views):
    lake, complete, incomplete = lake_views
    verdicts = {r.capture_id: r for r in spark.sql(dataset_sql("verdicts")).collect()}
    assert sorted(verdicts) == complete
    diagnosis = {r.capture_id: r for r in spark.table("diagnosis").collect()}
    quality = {r.capture_id: r for r in lake.read("dq_summary").collect()}
    for cid, row in verdicts.items():
        assert (row.bottleneck, row.headline, row.findings_count) == (
            diagnosis[cid].bottleneck,
            diagnosis[cid].headline,
            diagnosis[cid].findings_count,
        )
        assert (row.violations_error, row.suites_passed) == (quality[cid].violations_error, quality[cid].suites_passed)
        assert row.fails_a_suite == (0 if quality[cid].suites_passed else 1)
    assert {cid: row.has_bottleneck for cid, row in verdicts.items()} == {
        cid: int(cid == complete[0]) for cid in complete
    }
    violations = spark.table("violations").filter(F.col("capture_id").isin(*complete))
    expected = {
        (r.rule_id, r.severity): (r["count"], r.captures)
        for r in violations.groupBy("rule_id", "severity")
        .agg(F.count("*").alias("count"), F.countDistinct("capture_id").alias("captures"))
        .collect()
    }
    by_rule = {
        (r.rule_id, r.severity): (r.violations, r.captures)
        for r in spark.sql(dataset_sql("violations_by_rule")).collect()
    }
    assert by_rule == expected
    assert by_rule[("amqp091.x", "error")] == (2, 1) and by_rule[("amqp10.y", "error")] == (1, 1)
    findings = lake.read("bottlenecks").filter(F.col("capture_id").isin(*complete)).count()
    assert spark.sql(dataset_sql("bottlenecks_over_time")).count() == findings
    quality_rows = spark.sql(dataset_sql("data_quality")).collect()
    assert sorted(r.capture_id for r in quality_rows) == complete
    for r in quality_rows:
        payload = quality[r.capture_id].payload_bytes
        assert r.framed_percent == (round(100.0 * quality[r.capture_id].framed_bytes / payload, 2) if payload else None)
    pending = spark.sql(dataset_sql("incomplete")).collect()
    assert {r.capture_id for r in pending} == {incomplete}
    assert {(r.stage, r.outcome) for r in pending if r.stage == "derive"} == {("derive", "running")}


def test_the_alert_counts_the_captures_with_a_bottleneck(spark, lake_views):
    lake, complete, _ = lake_views
    alert = resources()["alerts"]["new_bottlenecks"]
    query = alert["query_text"].replace("${var.catalog}.${resources.schemas.amqpscope.name}.", "")
    assert "${" not in query
    expected = (
        spark.table("diagnosis")
        .filter(F.col("capture_id").isin(*complete) & ~F.col("bottleneck").isin(*NOT_A_BOTTLENECK))
        .count()
    )
    assert expected == 1  # the first capture's, as lake_views made it
    [row] = spark.sql(query).collect()
    assert row.new_bottlenecks == expected
    # Derived before the last hour: not new any more.
    stale = query.replace("INTERVAL 1 HOUR", "INTERVAL 0 SECONDS")
    assert spark.sql(stale).collect()[0].new_bottlenecks == 0


def test_the_wheel_task_entry_points_are_in_the_wheel_metadata():
    """What setup.cfg declares is what the installed distribution offers the runtime."""
    import importlib.metadata

    group = {
        e.name: e.value
        for e in importlib.metadata.distribution("amqpscope").entry_points
        if e.group == "amqpscope.tasks"
    }
    assert group == {f"{stage}_task": f"amqpscope.jobs.cli.entry:{stage}_task" for stage in TASK_ORDER}
    assert Path(ROOT / "resources" / "amqpscope.lvdash.json").is_file()
