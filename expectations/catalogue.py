"""The rule catalogue: rules.yml loaded into validated, frozen rules, and the violations they find.

A rule is a row-level Spark SQL predicate over one input table (docs/FLOW_CONTROL.md section 6). The same
predicate text drives both :func:`violations` (the rows written to the violations table) and the
Great Expectations suites in :mod:`amqpscope.expectations.suite`, so the two always agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any, Literal, get_args

import pyspark.sql.functions as F
from pyspark.sql import Column, DataFrame
from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StructType

from amqpscope.expectations.findings import ID, VIOLATION, Finding, check_keys, finding, load_catalogue
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA
from amqpscope.schemas.flow import (
    CHANNEL_CONFIRMS_SCHEMA,
    CHANNEL_UNACKED_SCHEMA,
    CONSUMER_UNACKED_SCHEMA,
    FRAME_LIMITS_SCHEMA,
    IDLE_GAPS_SCHEMA,
    LINK_CREDIT_SCHEMA,
    LINK_STATE_SCHEMA,
    SESSION_WINDOW_SCHEMA,
)
from amqpscope.schemas.frames import CONNECTIONS_SCHEMA, FRAMES_SCHEMA
from amqpscope.schemas.lifecycle import LIFECYCLE_091_SCHEMA, LIFECYCLE_10_SCHEMA
from amqpscope.schemas.messages import MESSAGES_091_SCHEMA
from amqpscope.schemas.verdicts import VIOLATIONS_SCHEMA

Severity = Literal["error", "warning", "capture"]
SEVERITIES: tuple[str, ...] = get_args(Severity)

# The tables a rule can be written against, with the schema its evidence columns are checked on.
TABLE_SCHEMAS: Mapping[str, StructType] = {
    "frames": FRAMES_SCHEMA,
    "connections": CONNECTIONS_SCHEMA,
    "link_credit": LINK_CREDIT_SCHEMA,
    "channel_unacked": CHANNEL_UNACKED_SCHEMA,
    "session_window": SESSION_WINDOW_SCHEMA,
    "consumer_unacked": CONSUMER_UNACKED_SCHEMA,
    "channel_confirms": CHANNEL_CONFIRMS_SCHEMA,
    "frame_limits": FRAME_LIMITS_SCHEMA,
    "idle_gaps": IDLE_GAPS_SCHEMA,
    "messages_091": MESSAGES_091_SCHEMA,
    "bottlenecks": BOTTLENECKS_SCHEMA,
    "link_state": LINK_STATE_SCHEMA,
    "lifecycle_10": LIFECYCLE_10_SCHEMA,
    "lifecycle_091": LIFECYCLE_091_SCHEMA,
}

# The suites judge the data and the protocol; a bottleneck is the diagnosis's answer, never a rule
# violation nor a failed suite (docs/DIAGNOSIS.md).
CATALOGUE_PATH = Path(__file__).with_name("rules.yml")

_RULE_KEYS = ("id", "severity", "description", "table", "violation", "evidence")


@dataclass(frozen=True)
class Rule:
    """One catalogue rule: a row of `table` breaks it when `violation` is true."""

    id: str
    severity: Severity
    description: str
    table: str
    violation: str  # Spark SQL boolean expression over the table's columns
    evidence: tuple[str, ...]
    source: str = field(default="<inline>", compare=False)  # file the rule came from, for errors

    def __post_init__(self) -> None:
        def fail(problem: str) -> ValueError:
            return ValueError(f"{self.source}: rule {self.id!r}: {problem}")

        if not isinstance(self.id, str) or not ID.fullmatch(self.id):
            raise fail("id must be dotted lower-case words, e.g. amqp10.link.credit_exceeded")
        if self.severity not in SEVERITIES:
            raise fail(f"unknown severity {self.severity!r} (one of {', '.join(SEVERITIES)})")
        for name in ("description", "violation"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise fail(f"{name} must be a non-empty string")
        if not isinstance(self.table, str) or self.table not in TABLE_SCHEMAS:
            raise fail(f"unknown table {self.table!r} (one of {', '.join(TABLE_SCHEMAS)})")
        if not (isinstance(self.evidence, tuple) and all(isinstance(c, str) for c in self.evidence)):
            raise fail("evidence must be a list of column names")
        unknown = [c for c in self.evidence if c not in TABLE_SCHEMAS[self.table].fieldNames()]
        if unknown:
            raise fail(f"evidence columns not in table {self.table}: {', '.join(unknown)}")

    @property
    def finding(self) -> Finding:
        """The rule in the one catalogue (its severity on the one scale; the violations table keeps its own)."""
        return finding(self.id, VIOLATION, self.severity, self.description)


def rule_from_mapping(entry: Mapping[str, Any], source: str = "<inline>") -> Rule:
    """A Rule from one YAML entry; a missing or unknown key is a ValueError naming the rule."""
    check_keys(entry, source, "rule", _RULE_KEYS, ())
    evidence = entry["evidence"]
    return Rule(
        id=entry["id"],
        severity=entry["severity"],
        description=entry["description"],
        table=entry["table"],
        violation=entry["violation"],
        evidence=tuple(evidence) if isinstance(evidence, list) else evidence,
        source=source,
    )


def load_rules(path: Path | None = None) -> tuple[Rule, ...]:
    """Load and validate a rule file (default: rules.yml); rule ids must be unique."""
    return load_catalogue(Path(CATALOGUE_PATH if path is None else path), "rules", "rule", rule_from_mapping)


def rules_for(table: str, rules: Iterable[Rule] | None = None) -> tuple[Rule, ...]:
    """The rules checked on `table`, from `rules` or the shipped catalogue, in catalogue order."""
    return tuple(r for r in (load_rules() if rules is None else rules) if r.table == table)


def _as_text(column: Column, data_type: DataType) -> Column:
    # Evidence is map<string,string>: binary delivery tags read best as hex, nested values as JSON.
    if isinstance(data_type, BinaryType):
        return F.hex(column)
    if isinstance(data_type, (ArrayType, MapType, StructType)):
        return F.to_json(column)
    return column.cast("string")


def violation_row(df: DataFrame, rule: Rule) -> Column:
    """A row of `df` as the VIOLATIONS_SCHEMA struct of a `rule` violation, carrying its evidence.

    Key columns the table lacks (handle on a 0-9-1 table, channel on connections) are null.
    """
    column_types = {f.name: f.dataType for f in df.schema.fields}
    evidence = F.create_map(
        *chain.from_iterable((F.lit(name), _as_text(F.col(name), column_types[name])) for name in rule.evidence)
    )
    constants = {
        "rule_id": F.lit(rule.id),
        "severity": F.lit(rule.severity),
        "description": F.lit(rule.description),
        "evidence": evidence,
    }
    columns = []
    for target in VIOLATIONS_SCHEMA.fields:
        if target.name in constants:
            value = constants[target.name]
        elif target.name in column_types:  # the row's own key: capture, connection, channel, ...
            value = F.col(target.name)
        else:
            value = F.lit(None)
        columns.append(value.cast(target.dataType).alias(target.name))
    return F.struct(*columns)


def violations(df: DataFrame, rule: Rule) -> DataFrame:
    """The rows of `df` that break `rule`, as VIOLATIONS_SCHEMA rows carrying their evidence."""
    return df.where(F.expr(rule.violation)).select(violation_row(df, rule).alias("v")).select("v.*")
