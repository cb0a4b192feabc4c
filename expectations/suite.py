"""Great Expectations suites built from the rule catalogue, validated on Spark DataFrames.

One suite per input table (``amqpscope.<table>``), one ``UnexpectedRowsExpectation`` per rule whose
query is ``SELECT ... FROM {batch} WHERE (<rule.violation>)``: the very predicate
:func:`amqpscope.expectations.catalogue.violations` filters on, so a rule's unexpected count in
Data Docs is the number of its rows in the violations table.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from amqpscope.expectations.catalogue import Rule, load_rules, rules_for, violations
from amqpscope.schemas.verdicts import VIOLATIONS_SCHEMA

# Before GX is imported: no usage analytics from a tool that runs on machines without internet.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")

import great_expectations as gx  # noqa: E402  (needs the environment above)
from great_expectations.core.batch_definition import BatchDefinition  # noqa: E402
from great_expectations.data_context import FileDataContext  # noqa: E402
from great_expectations.data_context.types.base import ProgressBarsConfig  # noqa: E402

SUITE_PREFIX = "amqpscope."
_DATA_SOURCE = "amqpscope"
_DOCS_SITE = "local_site"  # the site a file context's default configuration writes

# GX's own failure severities, so Data Docs rank our rules the same way reports do.
_GX_SEVERITY = {"error": "critical", "warning": "warning", "capture": "info"}

# Violation key columns, selected alongside the evidence so the (bounded) rows GX keeps are small.
_KEY_COLUMNS = tuple(f.name for f in VIOLATIONS_SCHEMA.fields)


@dataclass(frozen=True)
class SuiteResult:
    """Outcome of one table's suite."""

    suite_name: str
    table: str
    success: bool
    unexpected_counts: Mapping[str, int]  # rule id -> violating rows
    seconds: float  # wall time of the GX validation
    data_docs_index: Path


@dataclass(frozen=True)
class VerdictRun:
    """Every violation found (VIOLATIONS_SCHEMA) and the GX suite results that agree with them."""

    violations: DataFrame
    suites: tuple[SuiteResult, ...]
    data_docs_index: Path
    data_docs_seconds: float

    @property
    def success(self) -> bool:
        return all(s.success for s in self.suites)


def suite_name(table: str) -> str:
    """The GX suite name of a table's rules."""
    return f"{SUITE_PREFIX}{table}"


def unexpected_rows_query(rule: Rule, columns: Sequence[str]) -> str:
    """The GX query listing `rule`'s violating rows: the rule's predicate, verbatim."""
    wanted = [c for c in (*_KEY_COLUMNS, *rule.evidence) if c in columns]
    selected = ", ".join(f"`{c}`" for c in dict.fromkeys(wanted)) or "*"
    # GX fills {batch} with str.format: a literal brace in the predicate must be doubled. The
    # predicate sits on lines of its own so a trailing "--" comment cannot swallow the ")".
    predicate = rule.violation.replace("{", "{{").replace("}", "}}")
    return f"SELECT {selected} FROM {{batch}} WHERE (\n{predicate}\n)"


def build_suite(table: str, rules: Sequence[Rule], columns: Sequence[str]) -> gx.ExpectationSuite:
    """The expectation suite of `table`: one UnexpectedRowsExpectation per rule."""
    return gx.ExpectationSuite(
        name=suite_name(table),
        expectations=[
            gx.expectations.UnexpectedRowsExpectation(
                unexpected_rows_query=unexpected_rows_query(rule, columns),
                description=f"{rule.id} ({rule.severity}): {rule.description}",
                severity=_GX_SEVERITY[rule.severity],
                meta={"rule_id": rule.id, "severity": rule.severity},
            )
            for rule in rules
        ],
    )


def file_context(docs_dir: Path) -> FileDataContext:
    """A GX file context rooted in `docs_dir` (created or reused), quiet and offline."""
    docs_dir.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=docs_dir)
    context.variables.analytics_enabled = False
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.variables.save()
    return context


def _batch_definition(context: FileDataContext, table: str) -> BatchDefinition:
    source = context.data_sources.all().get(_DATA_SOURCE)
    if source is None:
        # persist=False: GX would persist() every DataFrame it is given and never release it.
        source = context.data_sources.add_spark(name=_DATA_SOURCE, persist=False)
    if table in {a.name for a in source.assets}:
        source.delete_asset(table)  # left by an earlier run in this docs_dir; adding again fails
    return source.add_dataframe_asset(name=table).add_batch_definition_whole_dataframe(table)


def validate_table(
    context: FileDataContext, table: str, df: DataFrame, rules: Sequence[Rule]
) -> SuiteResult:
    """Run `table`'s suite on `df` and store the result for Data Docs (built by the caller).

    GX registers `df` as the Spark temporary view ``tmp_view`` (replacing any view of that name).

    Every rule costs two Spark queries (row count, first rows). They read only the columns the
    rule uses, which a Parquet or Delta source prunes to; a table computed by an expensive
    pipeline is worth caching by the caller first.
    """
    suite = context.suites.add_or_update(build_suite(table, rules, df.columns))
    batch = _batch_definition(context, table)
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(name=suite.name, data=batch, suite=suite)
    )
    started = time.perf_counter()
    result = definition.run(batch_parameters={"dataframe": df}, result_format="SUMMARY")
    seconds = time.perf_counter() - started

    counts: dict[str, int] = {}
    for outcome in result.results:
        rule_id = outcome.expectation_config.meta["rule_id"]
        observed = (outcome.result or {}).get("observed_value")
        if observed is None:
            # A rule GX could not evaluate has no count; reporting it as failed would hide that.
            raise RuntimeError(
                f"suite {suite.name}: rule {rule_id}: GX could not evaluate it: "
                f"{_exception_message(outcome.exception_info)}"
            )
        counts[rule_id] = int(observed)
    return SuiteResult(
        suite_name=suite.name,
        table=table,
        success=bool(result.success),
        unexpected_counts=counts,
        seconds=seconds,
        data_docs_index=_docs_index(context),
    )


def _exception_message(info: Mapping[str, Any]) -> str:
    # GX reports either one exception or one per failed metric, keyed by metric id.
    if "exception_message" in info:
        return str(info["exception_message"])
    return "; ".join(str(getattr(e, "exception_message", e)) for e in info.values())


def _docs_index(context: FileDataContext) -> Path:
    # Where the site's index.html is (or will be, once build_data_docs has run).
    site = context.variables.data_docs_sites[_DOCS_SITE]["store_backend"]
    return Path(context.root_directory, site["base_directory"], "index.html")


def run_verdicts(
    tables: Mapping[str, DataFrame], docs_dir: Path, *, rules: Sequence[Rule] | None = None
) -> VerdictRun:
    """Check every table against its rules: violations as data, GX suites and Data Docs in docs_dir.

    `rules` defaults to the shipped catalogue. Tables without rules are ignored and rules whose
    table is absent (a capture without AMQP 1.0 has no link_credit) are skipped.
    """
    if not tables:
        raise ValueError("run_verdicts needs at least one table")
    catalogue = load_rules() if rules is None else tuple(rules)
    checked = {name: rules_for(name, catalogue) for name in tables}
    checked = {name: rules_ for name, rules_ in checked.items() if rules_}

    # Built first: Spark analyses each predicate here, so a bad rule fails before GX starts.
    found = [violations(tables[name], rule) for name, rules_ in checked.items() for rule in rules_]
    if found:
        union = reduce(DataFrame.unionByName, found)
    else:
        union = next(iter(tables.values())).sparkSession.createDataFrame([], VIOLATIONS_SCHEMA)

    context = file_context(Path(docs_dir))
    suites = tuple(
        validate_table(context, name, tables[name], rules_) for name, rules_ in checked.items()
    )
    started = time.perf_counter()
    context.build_data_docs(site_names=[_DOCS_SITE])
    return VerdictRun(
        violations=union,
        suites=suites,
        data_docs_index=_docs_index(context),
        data_docs_seconds=time.perf_counter() - started,
    )
