"""The rule catalogue, the violations it finds, and the Great Expectations suites built from it."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyspark.sql.functions as F
import pytest
import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from amqpscope.expectations.catalogue import (
    TABLE_SCHEMAS,
    Rule,
    load_rules,
    rule_from_mapping,
    rules_for,
    violations,
)
from amqpscope.expectations.suite import (
    CHECKPOINT_NAME,
    VerdictRun,
    file_context,
    run_name,
    run_verdicts,
    start_verdicts,
    table_violations,
)
from amqpscope.pipelines.link_credit import link_credit_timeline
from amqpscope.schemas.flow import CHANNEL_UNACKED_SCHEMA, LINK_CREDIT_SCHEMA
from amqpscope.schemas.frames import FRAMES_SCHEMA
from amqpscope.schemas.verdicts import VIOLATIONS_SCHEMA

T0 = datetime(2024, 5, 1, 12, 0, 0)
CREDIT_EXCEEDED = "amqp10.link.credit_exceeded"
ABOVE_PREFETCH = "amqp091.channel.unacked_above_prefetch"
HEARTBEAT_CHANNEL = "amqp091.frame.heartbeat_on_nonzero_channel"


def rule(rule_id: str) -> Rule:
    return next(r for r in load_rules() if r.id == rule_id)


def at(frame_index: int) -> datetime:
    return T0 + timedelta(milliseconds=frame_index)


# (frame_index, method, is_new_delivery, delivery_count_snd, link_credit_snd, credit_before, link_credit_rcv)
LinkEvent = tuple[int, str, bool, int | None, int | None, int | None, int | None]


def link_credit(spark: SparkSession, events: list[LinkEvent]) -> DataFrame:
    """A link_credit timeline of one client-to-server link (handle 0 on channel 0)."""
    return spark.createDataFrame(
        [
            (
                "cap",
                "conn-1",
                0,
                index,
                at(index),
                "c2s",
                method,
                0,
                "sender-link",
                True,  # attach_seen
                "client",
                "/queues/q1",
                None,
                new,
                count,
                credit,
                before,
                rcv,
                False,
                None,
            )
            for index, method, new, count, credit, before, rcv in events
        ],
        LINK_CREDIT_SCHEMA,
    )


# (frame_index, method, delivery_tag, unacked, prefetch_count, prefetch_global)
UnackedEvent = tuple[int, str, int | None, int, int | None, bool | None]


def channel_unacked(spark: SparkSession, events: list[UnackedEvent]) -> DataFrame:
    """A channel_unacked timeline of channel 1 with one consumer."""
    return spark.createDataFrame(
        [
            (
                "cap",
                "conn-2",
                1,
                index,
                at(index),
                "s2c" if method == "basic.deliver" else "c2s",
                method,
                "ctag-1",
                tag,
                False,
                unacked,
                prefetch,
                is_global,
                None,
                None,
            )
            for index, method, tag, unacked, prefetch, is_global in events
        ],
        CHANNEL_UNACKED_SCHEMA,
    )


def frames(spark: SparkSession, rows: list[dict[str, Any]]) -> DataFrame:
    """Frames with the key columns filled in; each row gives the columns it is about."""
    filled = []
    for i, row in enumerate(rows):
        base = {name: None for name in FRAMES_SCHEMA.fieldNames()}
        base.update(
            capture_id="cap",
            connection_id="conn-3",
            direction="s2c",
            frame_index=i,
            ts=at(i),
            ts_us=0,
            packet_number=i + 1,
            stream_offset=8 * i,
            frame_size=8,
            protocol="amqp-0-9-1",
            frame_type="method",
            channel=0,
        )
        base.update(row)
        filled.append(base)
    return spark.createDataFrame(filled, FRAMES_SCHEMA)


def expected(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, VIOLATIONS_SCHEMA)


# --- violations on the link_credit, channel_unacked and frames tables -----------------------


CREDIT_EVIDENCE_KEYS = (
    "direction",
    "sender_side",
    "link_name",
    "target_address",
    "delivery_count_snd",
    "link_credit_snd_before",
    "link_credit_rcv",
    "drain",
)


def test_new_delivery_without_credit_is_one_violation(spark):
    timeline = link_credit(
        spark,
        [
            (1, "attach", False, 0, 0, None, None),
            (2, "flow", False, 0, 1, None, 1),  # receiver grants one credit
            (3, "transfer", True, 1, 0, 1, 1),  # uses it
            (4, "transfer", True, 2, -1, 0, 1),  # starts another delivery with none left
            (5, "transfer", False, 2, -1, 0, 1),  # continuation of that delivery: not a new one
        ],
    )
    evidence = dict(
        zip(
            CREDIT_EVIDENCE_KEYS,
            (
                "c2s",
                "client",
                "sender-link",
                "/queues/q1",
                "2",
                "0",
                "1",
                "false",
            ),
        )
    )
    assertDataFrameEqual(
        violations(timeline, rule(CREDIT_EXCEEDED)),
        expected(
            spark,
            [
                (
                    "cap",
                    CREDIT_EXCEEDED,
                    "error",
                    rule(CREDIT_EXCEEDED).description,
                    "conn-1",
                    0,
                    0,
                    4,
                    at(4),
                    evidence,
                    None,
                ),  # link_credit has no packet_number
            ],
        ),
    )


def test_link_within_its_credit_has_no_violation(spark):
    timeline = link_credit(
        spark,
        [
            (1, "attach", False, 0, 0, None, None),
            (2, "flow", False, 0, 2, None, 2),
            (3, "transfer", True, 1, 1, 2, 2),
            (4, "transfer", True, 2, 0, 1, 2),
            (5, "flow", False, 2, 0, None, 0),  # credit exhausted, and the sender stops
            (6, "transfer", True, None, None, None, None),  # credit unknown: never a verdict
        ],
    )
    assertDataFrameEqual(violations(timeline, rule(CREDIT_EXCEEDED)), expected(spark, []))


def test_unacked_above_prefetch_is_flagged_and_at_prefetch_is_not(spark):
    timeline = channel_unacked(
        spark,
        [
            (1, "basic.qos", None, 0, 2, False),
            (2, "basic.deliver", 1, 1, 2, False),
            (3, "basic.deliver", 2, 2, 2, False),  # at prefetch: allowed
            (4, "basic.deliver", 3, 3, 2, False),  # above: the broker must not send it
            (5, "basic.ack", 3, 0, 2, False),
            (6, "basic.deliver", 4, 1, 2, False),
        ],
    )
    evidence = {
        "direction": "s2c",
        "consumer_tag": "ctag-1",
        "delivery_tag": "3",
        "unacked": "3",
        "prefetch_count": "2",
        "prefetch_global": "false",
    }
    assertDataFrameEqual(
        violations(timeline, rule(ABOVE_PREFETCH)),
        expected(
            spark,
            [
                (
                    "cap",
                    ABOVE_PREFETCH,
                    "error",
                    rule(ABOVE_PREFETCH).description,
                    "conn-2",
                    1,
                    None,
                    4,
                    at(4),
                    evidence,
                    None,
                ),
            ],
        ),
    )


def test_unlimited_prefetch_and_a_lowered_limit_are_not_violations(spark):
    timeline = channel_unacked(
        spark,
        [
            (1, "basic.deliver", 1, 10, 0, False),  # prefetch 0: unlimited
            (2, "basic.deliver", 2, 11, None, None),  # no qos seen: unlimited
            (3, "basic.qos", None, 11, 5, True),  # lowered below the unacked count: legal
            (4, "basic.ack", 11, 0, 5, True),
            (5, "basic.deliver", 12, 5, 5, True),
        ],
    )
    assertDataFrameEqual(violations(timeline, rule(ABOVE_PREFETCH)), expected(spark, []))


def test_heartbeat_on_a_channel_other_than_zero(spark):
    table = frames(
        spark,
        [
            {"frame_type": "heartbeat", "channel": 0},
            {"frame_type": "heartbeat", "channel": 3, "direction": "c2s"},
            {"frame_type": "method", "channel": 3, "method": "basic.publish"},
            {"protocol": "amqp-1.0", "frame_type": "empty", "channel": 3},  # 1.0 heartbeats: any channel
        ],
    )
    evidence = {"direction": "c2s", "channel": "3", "packet_number": "2", "frame_size": "8"}
    assertDataFrameEqual(
        violations(table, rule(HEARTBEAT_CHANNEL)),
        expected(
            spark,
            [
                (
                    "cap",
                    HEARTBEAT_CHANNEL,
                    "error",
                    rule(HEARTBEAT_CHANNEL).description,
                    "conn-3",
                    3,
                    None,
                    1,
                    at(1),
                    evidence,
                    2,
                ),  # the frame's packet: drill-down
            ],
        ),
    )


@pytest.mark.parametrize(
    ("rule_id", "violating", "clean"),
    [
        (
            "amqp091.basic.zero_delivery_tag",
            {"method": "basic.deliver", "channel": 1, "delivery_tag": 0},
            {"method": "basic.ack", "channel": 1, "delivery_tag": 0, "multiple": True},
        ),
        (
            "amqp10.flow.link_fields_without_handle",
            {"protocol": "amqp-1.0", "frame_type": "amqp", "method": "flow", "link_credit": 10},
            {"protocol": "amqp-1.0", "frame_type": "amqp", "method": "flow", "incoming_window": 10, "drain": False},
        ),
        (
            "amqp10.transfer.delivery_tag_too_long",
            {"protocol": "amqp-1.0", "frame_type": "amqp", "method": "transfer", "delivery_tag_bytes": bytearray(33)},
            {"protocol": "amqp-1.0", "frame_type": "amqp", "method": "transfer", "delivery_tag_bytes": bytearray(32)},
        ),
    ],
)
def test_frame_rules_flag_the_violating_frame_only(spark, rule_id, violating, clean):
    found = violations(frames(spark, [clean, violating]), rule(rule_id))
    assertDataFrameEqual(found.select("rule_id", "frame_index"), [(rule_id, 1)])


def test_binary_evidence_is_hex(spark):
    table = frames(
        spark,
        [
            {
                "protocol": "amqp-1.0",
                "frame_type": "amqp",
                "method": "transfer",
                "delivery_id": 7,
                "delivery_tag_bytes": bytes(range(33)),
            }
        ],
    )
    [row] = violations(table, rule("amqp10.transfer.delivery_tag_too_long")).collect()
    assert row.evidence["delivery_tag_bytes"] == bytes(range(33)).hex().upper()
    assert row.evidence["delivery_id"] == "7"


def test_credit_rule_on_the_link_credit_pipeline(spark):
    """The rule reads link_credit as the pipeline writes it: the third delivery on two credits."""
    events = [
        {
            "direction": "c2s",
            "method": "attach",
            "name": "l",
            "handle": 0,
            "role": "sender",
            "initial_delivery_count": 0,
        },
        {"direction": "s2c", "method": "attach", "name": "l", "handle": 3, "role": "receiver"},
        {"direction": "s2c", "method": "flow", "handle": 3, "delivery_count": 0, "link_credit": 2},
        *({"direction": "c2s", "method": "transfer", "handle": 0, "delivery_id": i, "more": False} for i in range(3)),
    ]
    amqp10 = frames(spark, [{"protocol": "amqp-1.0", "frame_type": "amqp", **e} for e in events])
    found = violations(link_credit_timeline(amqp10), rule(CREDIT_EXCEEDED))
    assertDataFrameEqual(
        found.select("rule_id", "frame_index", "handle", F.col("evidence")["link_credit_snd_before"]),
        [(CREDIT_EXCEEDED, 5, 0, "0")],
    )


@pytest.mark.parametrize("catalogue_rule", load_rules(), ids=lambda r: r.id)
def test_every_rule_compiles_against_its_table(spark, catalogue_rule):
    empty = spark.createDataFrame([], TABLE_SCHEMAS[catalogue_rule.table])
    found = violations(empty, catalogue_rule)
    assert [(f.name, f.dataType) for f in found.schema.fields] == [
        (f.name, f.dataType) for f in VIOLATIONS_SCHEMA.fields
    ]
    assert found.count() == 0


def test_catalogue_has_the_required_rules():
    assert {r.id for r in rules_for("link_credit")} == {CREDIT_EXCEEDED}
    assert {r.id for r in rules_for("channel_unacked")} == {
        ABOVE_PREFETCH,
        "amqp091.ack.unknown_delivery_tag",
        "amqp091.ack.already_settled",
    }
    assert HEARTBEAT_CHANNEL in {r.id for r in rules_for("frames")}
    assert {r.severity for r in rules_for("link_credit") + rules_for("channel_unacked")} == {"error"}


# --- catalogue validation ------------------------------------------------------------------

GOOD = {
    "id": "amqp10.test.rule",
    "severity": "error",
    "description": "d",
    "table": "frames",
    "violation": "channel > 1",
    "evidence": ["channel"],
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"severity": "fatal"}, "unknown severity 'fatal'"),
        ({"table": "packets"}, "unknown table 'packets'"),
        ({"evidence": ["channel", "no_such_column"]}, "evidence columns not in table frames: no_such_column"),
        ({"violation": "  "}, "violation must be a non-empty string"),
        ({"id": "Not An Id"}, "id must be dotted"),
        ({"severty": "error"}, "unknown keys severty"),
    ],
)
def test_invalid_rule_is_rejected_naming_rule_and_file(tmp_path, change, message):
    path = tmp_path / "rules.yml"
    entry = {**GOOD, **change}
    path.write_text(_yaml([entry]))
    with pytest.raises(ValueError, match=message) as raised:
        load_rules(path)
    assert str(path) in str(raised.value)
    assert repr(entry["id"]) in str(raised.value)


def test_missing_field_is_rejected_naming_rule_and_file(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(_yaml([{k: v for k, v in GOOD.items() if k != "severity"}]))
    with pytest.raises(ValueError, match=rf"{path}: rule 'amqp10.test.rule': missing severity"):
        load_rules(path)


def test_duplicate_rule_ids_are_rejected(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(_yaml([GOOD, GOOD]))
    with pytest.raises(ValueError, match="'amqp10.test.rule': duplicate id"):
        load_rules(path)


def test_rules_are_frozen():
    built = rule_from_mapping(GOOD)
    with pytest.raises(AttributeError):
        built.severity = "warning"  # type: ignore[misc]
    assert built.evidence == ("channel",)


def _yaml(entries: list[dict[str, Any]]) -> str:
    return yaml.safe_dump({"rules": entries})


# --- Great Expectations --------------------------------------------------------------------


def test_one_evaluation_keeps_a_predicate_with_braces_and_a_trailing_comment(spark):
    odd = rule_from_mapping({**GOOD, "violation": "method = '{weird}' -- trailing comment"})
    table = frames(spark, [{"method": "{weird}"}, {"method": "basic.ack"}, {"method": None}])
    assert [(r.rule_id, r.frame_index) for r in table_violations(table, "frames", [odd]).collect()] == [
        ("amqp10.test.rule", 0)
    ]


def test_one_evaluation_gives_a_row_per_rule_a_row_breaks(spark):
    both = [
        rule_from_mapping({**GOOD, "id": "amqp10.test.wide", "violation": "channel > 1"}),
        rule_from_mapping({**GOOD, "id": "amqp10.test.odd", "violation": "channel % 2 = 1"}),
    ]
    table = frames(spark, [{"channel": 0}, {"channel": 1}, {"channel": 2}, {"channel": 3}, {"channel": None}])
    found = sorted(
        (r.rule_id, r.frame_index, r.evidence["channel"]) for r in table_violations(table, "frames", both).collect()
    )
    assert found == [
        ("amqp10.test.odd", 1, "1"),
        ("amqp10.test.odd", 3, "3"),
        ("amqp10.test.wide", 2, "2"),
        ("amqp10.test.wide", 3, "3"),
    ]


def test_run_names_carry_the_capture_ids():
    first, second = "a" * 64, "b" * 64
    assert run_name([second, first]) == f"captures-{'a' * 16}+{'b' * 16}"
    assert run_name([str(i) * 64 for i in range(6)]).endswith("+2-more")


@pytest.fixture(scope="module")
def failing_tables(spark) -> dict[str, DataFrame]:
    return {
        "link_credit": link_credit(
            spark,
            [
                (1, "flow", False, 0, 1, None, 1),
                (2, "transfer", True, 1, 0, 1, 1),
                (3, "transfer", True, 2, -1, 0, 1),
                (4, "transfer", True, 3, -2, -1, 1),
            ],
        ),
        "channel_unacked": channel_unacked(
            spark,
            [
                (1, "basic.qos", None, 0, 1, True),
                (2, "basic.deliver", 1, 1, 1, True),
                (3, "basic.deliver", 2, 2, 1, True),
            ],
        ),
        "frames": frames(spark, [{"frame_type": "heartbeat", "channel": 0}]),
        "connections": spark.createDataFrame([], TABLE_SCHEMAS["connections"]),  # no rules
    }


@pytest.fixture(scope="module")
def docs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("docs")


CAPTURE = "c" * 64


@pytest.fixture(scope="module")
def failing_run(failing_tables, docs_dir) -> VerdictRun:
    return run_verdicts(failing_tables, docs_dir, capture_ids=[CAPTURE])


def test_gx_suites_fail_where_rules_are_broken(failing_run):
    assert {s.suite_name: s.success for s in failing_run.suites} == {
        "amqpscope.link_credit": False,
        "amqpscope.channel_unacked": False,
        "amqpscope.frames": True,
    }
    assert failing_run.success is False
    assert {s.suite_name: dict(s.unexpected_counts) for s in failing_run.suites} == {
        "amqpscope.link_credit": {CREDIT_EXCEEDED: 2},
        "amqpscope.channel_unacked": {r.id: int(r.id == ABOVE_PREFETCH) for r in rules_for("channel_unacked")},
        "amqpscope.frames": {r.id: 0 for r in rules_for("frames")},
    }


def test_gx_unexpected_counts_equal_violation_rows(failing_run):
    rows_per_rule = {r.rule_id: r["count"] for r in failing_run.violations.groupBy("rule_id").count().collect()}
    for suite in failing_run.suites:
        for rule_id, unexpected in suite.unexpected_counts.items():
            assert rows_per_rule.get(rule_id, 0) == unexpected, rule_id


def test_verdict_violations_are_the_union_of_every_rule(spark, failing_run, failing_tables):
    assertDataFrameEqual(
        failing_run.violations,
        violations(failing_tables["link_credit"], rule(CREDIT_EXCEEDED)).unionByName(
            violations(failing_tables["channel_unacked"], rule(ABOVE_PREFETCH))
        ),
    )


def test_data_docs_are_written_by_the_checkpoint_under_the_captures_run_name(failing_run, docs_dir):
    index = failing_run.data_docs_index
    assert index.name == "index.html" and index.is_file()
    assert all(s.data_docs_index == index for s in failing_run.suites)
    assert "amqpscope.link_credit" in index.read_text(encoding="utf-8").replace("/", ".")
    assert all(s.seconds > 0 for s in failing_run.suites)
    assert failing_run.run_name == f"captures-{'c' * 16}"
    # Data Docs file each validation under its suite's name and the run's.
    pages = [p.relative_to(index.parent).parts for p in index.parent.glob("validations/**/*.html")]
    assert any("link_credit" in parts and failing_run.run_name in parts for parts in pages), pages
    assert file_context(docs_dir).checkpoints.get(CHECKPOINT_NAME).name == CHECKPOINT_NAME


def test_counts_are_taken_from_the_write_of_the_violations(spark, failing_tables, tmp_path):
    stored: list[list] = []
    run = run_verdicts(failing_tables, tmp_path, store=lambda found: stored.append(found.collect()))
    [rows] = stored
    assert sorted(r.rule_id for r in rows) == [ABOVE_PREFETCH, CREDIT_EXCEEDED, CREDIT_EXCEEDED]
    counts = {rule_id: n for s in run.suites for rule_id, n in s.unexpected_counts.items()}
    assert counts[CREDIT_EXCEEDED] == 2 and counts[ABOVE_PREFETCH] == 1
    assert sum(counts.values()) == 3


def test_a_pending_run_names_the_suites_gx_validates(spark, failing_tables, tmp_path):
    # derive writes dq_summary from these while GX runs on its thread: they must be what GX says.
    pending = start_verdicts(failing_tables, tmp_path, capture_ids=[CAPTURE])
    run = pending.result()
    assert pending.suites_run == tuple(s.suite_name for s in run.suites)
    assert dict(pending.suite_of_rule) == {rule_id: s.suite_name for s in run.suites for rule_id in s.unexpected_counts}
    assert pending.violations is run.violations and run.data_docs_index.is_file()


def test_clean_tables_pass_every_suite_in_a_reused_docs_dir(spark, failing_run, docs_dir):
    clean = {
        "link_credit": link_credit(spark, [(1, "flow", False, 0, 5, None, 5), (2, "transfer", True, 1, 4, 5, 5)]),
        "channel_unacked": channel_unacked(spark, [(1, "basic.deliver", 1, 1, 1, False)]),
    }
    run = run_verdicts(clean, docs_dir)  # where failing_run wrote its suites and results
    assert run.success is True
    assert [dict(s.unexpected_counts) for s in run.suites] == [
        {CREDIT_EXCEEDED: 0},
        {r.id: 0 for r in rules_for("channel_unacked")},
    ]
    assertDataFrameEqual(run.violations, expected(spark, []))
    assert run.data_docs_index == failing_run.data_docs_index


def test_a_rule_spark_cannot_evaluate_is_an_error_not_a_failure(spark, tmp_path):
    broken = rule_from_mapping({**GOOD, "violation": "no_such_column = 1", "evidence": []})
    fine = rule_from_mapping({**GOOD, "id": "amqp10.test.fine"})
    with pytest.raises(ValueError, match="rule amqp10.test.rule .*cannot be evaluated on table frames"):
        run_verdicts({"frames": frames(spark, [{}])}, tmp_path, rules=[fine, broken])


def test_run_verdicts_needs_a_table(tmp_path):
    with pytest.raises(ValueError, match="at least one table"):
        run_verdicts({}, tmp_path)


def test_tables_without_rules_give_no_suites(spark, tmp_path):
    run = run_verdicts({"connections": spark.createDataFrame([], TABLE_SCHEMAS["connections"])}, tmp_path)
    assert run.suites == ()
    assertDataFrameEqual(run.violations, expected(spark, []))
    assert isinstance(run.data_docs_index, Path)
