"""The table registry (pipelines/tables.py): every table declared once, and the declarations true of
the code and of the rows."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.expectations.catalogue import TABLE_SCHEMAS
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.analyze import analyze
from amqpscope.jobs.stages.derive import ANSWER
from amqpscope.pipelines import tables as lake_tables
from amqpscope.pipelines.partitioning import by_connection
from amqpscope.schemas import catalog
from tests.paths import SAMPLES
from tests.table_digests import table_digests
from tests.test_same_rows import EXPECTED as DIGESTS


def columns(schema) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def test_the_registry_and_the_schemas_name_the_same_tables_with_the_same_columns():
    documented = catalog.tables()
    assert set(lake_tables.TABLES) == set(documented)
    for name, table in lake_tables.TABLES.items():
        assert columns(table.schema) == columns(documented[name].schema), name


def test_the_rules_catalogue_reads_tables_as_declared():
    for name, schema in TABLE_SCHEMAS.items():
        assert columns(schema) == columns(lake_tables.table(name).schema), name


def test_every_input_is_declared_before_what_reads_it():
    # The frames as stored are the frames table, there from the start as the bronze tables are.
    seen = {*lake_tables.SHARED, lake_tables.STORED_FRAMES}
    assert lake_tables.upstream(lake_tables.STORED_FRAMES) == {"frames"}
    for table in lake_tables.TABLES.values():
        assert set(table.inputs) <= seen, table.name
        seen.add(table.name)
    assert lake_tables.in_order(["diagnosis", "frames", "messages_091"]) == ("frames", "messages_091", "diagnosis")
    with pytest.raises(KeyError, match="no table nonesuch"):
        lake_tables.in_order(["nonesuch"])


def test_a_table_declared_wrong_is_refused():
    frames = lake_tables.table("frames").schema
    with pytest.raises(ValueError, match="step 'later'"):
        lake_tables.Table("x", frames, "silver", "later")
    with pytest.raises(ValueError, match="nonesuch not in its schema"):
        lake_tables.Table("x", frames, "silver", "flow_state", order_by=("nonesuch",))
    with pytest.raises(ValueError, match="needs inputs"):
        lake_tables.Table("x", frames, "silver", "flow_state", build=lambda: frames)


def test_the_answer_is_what_the_diagnosis_reads():
    # What the bottleneck rules and flow_intervals read (pipelines.diagnosis.findings, pipelines.flow_intervals),
    # written out here from those modules rather than from the registry under test.
    assert set(ANSWER) == {
        "messages_091",
        "deliveries_10",  # the 1.0 senders' settlements (diagnosis.publisher.slow_settlement)
        "link_state",
        "session_window",
        "consumer_unacked",
        "channel_unacked",
        "channel_confirms",
        "connection_blocked",
        "channel_flow",
        "tcp_flow",
        "flow_intervals",
        "bottlenecks",
        "diagnosis",
    }
    assert ANSWER[-1] == "diagnosis"


@pytest.fixture(scope="module")
def every_table(spark):
    """Every built table, from empty inputs, and the analysed plans of what derive checkpoints on
    the way (the shared results, the diagnosis's intermediates), which the tables' plans only read."""
    empty = {name: spark.createDataFrame([], schema) for name, schema in lake_tables.schemas("bronze").items()}
    empty["frames"] = by_connection(empty["frames"])
    empty["violations"] = spark.createDataFrame([], lake_tables.table("violations").schema)
    build = lake_tables.Build(
        empty,
        {
            "limits": DiagnosisThresholds(),
            "spoken": None,  # every rule planned
            "run_id": "r",
            "run_ts": datetime.now(UTC),
            "suite_of_rule": {},
            "suites_run": [],
        },
    )
    checkpointed: list[str] = []
    frame_class = type(empty["frames"])
    checkpoint = frame_class.localCheckpoint

    def recorded(df, *args, **kwargs):
        checkpointed.append(df._jdf.queryExecution().analyzed().toString())
        return checkpoint(df, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(frame_class, "localCheckpoint", recorded)
        built = {name: build.table(name) for name in lake_tables.names(built=True)}
    return built, checkpointed


def test_every_builder_gives_its_declared_columns(every_table):
    built, _ = every_table
    for name, df in built.items():
        assert columns(df.schema) == columns(lake_tables.table(name).schema), name


# A frame from a later row to the partition's end, e.g. rowsBetween(1, unboundedFollowing): Spark
# aggregates the rest of the partition again for every row, quadratic in a partition's rows (a TCP
# direction, a consumer, a link of a long capture; pipelines.partitioning.next_value).
REAGGREGATING = re.compile(
    r"specifiedwindowframe\((?:Row|Range)Frame, (?!unboundedpreceding\$\(\))[^,]+, unboundedfollowing"
)


def test_no_window_aggregates_the_rest_of_its_partition_again_for_every_row(every_table):
    built, checkpointed = every_table
    assert len(checkpointed) >= 5  # the shared results and the diagnosis's own
    plans = {name: df._jdf.queryExecution().analyzed().toString() for name, df in built.items()}
    plans |= {f"checkpoint {i}": plan for i, plan in enumerate(checkpointed)}
    assert any("unboundedfollowing" in plan for plan in plans.values())  # whole partitions: one pass
    assert {name: REAGGREGATING.findall(plan) for name, plan in plans.items() if REAGGREGATING.search(plan)} == {}


def test_no_two_rows_share_their_declared_order(spark, samples_lake):
    _root, config, _result = samples_lake
    lake = Lake(spark, config.lake)
    checked = 0
    for name, table in lake_tables.TABLES.items():
        if not table.order_by or not lake.exists(name):
            continue
        keys = [*table.partition_by, *table.order_by]
        repeated = lake.read(name).groupBy(*keys).count().filter(F.col("count") > 1)
        assert repeated.limit(3).collect() == [], name
        checked += 1
    assert checked >= 20


def test_a_capture_of_one_amqp_version_has_the_same_rows_without_the_others_tables_built(spark, tmp_path):
    # Alone in its run, a 0-9-1 capture leaves the AMQP 1.0 tables unbuilt (committed empty): every
    # table holds the rows the reference digests say, as when it is analysed with 1.0 captures.
    capture = SAMPLES / "amqp091-qos-confirms.pcap"
    lake = tmp_path / "lake"
    result = analyze(
        spark, [str(capture)], AnalyzeConfig(lake=lake, report=tmp_path / "report.html", data_docs=tmp_path / "docs")
    )
    unbuilt = lake_tables.without_rows({"amqp-0-9-1"})
    assert unbuilt == {"deliveries_10", "link_credit", "link_state", "session_window", "lifecycle_10"}
    assert all(result.row_counts[name] == 0 and Lake(spark, lake).exists(name) for name in unbuilt)
    expected = json.loads(DIGESTS.read_text(encoding="utf-8"))["tables"]
    found = table_digests(spark, lake)
    cid = capture_id(capture)
    assert {name: found[name].get(cid) for name in expected} == {name: expected[name].get(cid) for name in expected}
