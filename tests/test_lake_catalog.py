"""A lake people can query: column statistics in every delta-rs commit, column comments and table
descriptions from ``schemas/``, and docs/TABLES.md generated from the same schemas."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from amqpscope.jobs.lake.lake import Lake
from amqpscope.pipelines import tables as lake_tables
from amqpscope.schemas import catalog
from amqpscope.schemas.frames import CONNECTIONS_SCHEMA
from amqpscope.schemas.runs import RUNS_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
T1 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
T2 = datetime(2026, 1, 2, 3, 4, 6, 1, tzinfo=UTC)


def test_tables_md_is_current():
    assert (ROOT / "docs" / "TABLES.md").read_text() == catalog.markdown()


def test_catalog_has_every_table_with_its_declared_columns():
    tables = catalog.tables()
    assert lake_tables.TABLES.keys() <= tables.keys()
    for name, schema in lake_tables.schemas("bronze").items():
        assert [(f.name, f.dataType) for f in tables[name].schema.fields] == [
            (f.name, f.dataType) for f in schema.fields
        ]
    # Comments as written next to the columns in schemas/frames.py and schemas/runs.py.
    connections = tables["connections"].schema
    assert connections["c2s_bytes"].metadata["comment"] == "TCP payload bytes client to server (each once)"
    assert connections["protocol_inferred"].metadata["comment"] == "no protocol header in the capture"
    assert tables["runs"].schema["ended"].metadata["comment"] == "when it committed its last row; null while running"
    assert tables["connections"].description == (
        "The connections table: one row per TCP connection carrying AMQP, or TLS on an AMQP port "
        '(protocol "tls" when its records were not decrypted: no key, wrong keys, no handshake).'
    )
    assert CONNECTIONS_SCHEMA["c2s_bytes"].metadata == {}  # the declared schema itself is left alone


def test_commit_carries_statistics_comments_and_description(spark, tmp_path):
    lake = Lake(spark, tmp_path / "lake")
    rows = [
        ("cap-a", "derive", "r1", T1, T2, "ok", "r0", None, None),
        ("cap-a", "ingest", "r0", T2, None, "running", None, "pid 7 on host", T2),
        ("cap-b", "derive", "r2", T1, None, "failed: x", None, None, None),
    ]
    # One task: one file per capture, so each add action holds all of its capture's rows.
    lake.write(spark.createDataFrame(rows, RUNS_SCHEMA).coalesce(1), "runs", replace_capture_ids=["cap-a", "cap-b"])
    table = DeltaTable(lake.table_path("runs"))
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    by_capture = {a["partition.capture_id"]: a for a in actions}
    assert sorted(by_capture) == ["cap-a", "cap-b"] and len(actions) == 2
    a = by_capture["cap-a"]
    assert a["num_records"] == 2
    assert (a["min.stage"], a["max.stage"], a["null_count.stage"]) == ("derive", "ingest", 0)
    assert (a["min.started"], a["max.started"]) == (T1, T2)
    assert (a["min.ended"], a["max.ended"], a["null_count.ended"]) == (T2, T2, 1)
    assert (a["min.source_run"], a["max.source_run"], a["null_count.source_run"]) == ("r0", "r0", 1)
    b = by_capture["cap-b"]
    assert (b["null_count.ended"], b["null_count.source_run"], b["min.outcome"]) == (1, 1, "failed: x")
    assert b.get("min.ended") is None  # a column of nulls only has no bounds
    fields = {f["name"]: f for f in json.loads(table.schema().to_json())["fields"]}
    assert fields["outcome"]["metadata"]["comment"] == "running | ok | failed: reason"
    assert table.metadata().description == catalog.description("runs")
    assert table.metadata().description.startswith("The ``runs`` table: what each stage of amqpscope did")
    # A second write whose rows carry no comments is the same schema: accepted, comments kept.
    lake.write(spark.createDataFrame(rows[:1], RUNS_SCHEMA), "runs", replace_capture_ids=["cap-a"])
    assert json.loads(DeltaTable(lake.table_path("runs")).schema().to_json())["fields"][5]["metadata"]["comment"]
