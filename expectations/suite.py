"""Rules evaluated once, on Spark; Great Expectations suites validated on what that evaluation found.

Every rule of the catalogue is a row predicate over one table. Each table is read once: its rows
that break any of its rules become violation rows (one per broken rule), and the violations of
every table are one DataFrame, written by the caller (analyze: the ``violations`` table). The
number of violations of each rule is observed while that write runs, so counting costs no
further Spark job. Great Expectations then validates those counts, one suite per table
(``amqpscope.<table>``, one expectation per rule: "no row breaks rule X", observed value the
number of rows that do), in one Checkpoint whose UpdateDataDocsAction writes the Data Docs. GX
works on a one-row pandas frame of the counts: it never queries the tables again, so a rule's
count in Data Docs and its rows in the violations table come from one evaluation and agree.
Since GX needs nothing but those counts, it runs on a thread of its own (``start_verdicts``): the
job writes its next tables and its report meanwhile, and waits for GX only at the end.

The suites are not stored in the repository as GX JSON: they are built from ``rules.yml`` (which
is), the same text giving the same suite, and saved in the Data Docs' context on each run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import reduce
from pathlib import Path

import pandas as pd
import pyspark.sql.functions as F
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Observation

from amqpscope.expectations.catalogue import Rule, load_rules, rules_for, violation_row
from amqpscope.expectations.data_docs import localise
from amqpscope.pipelines.columns import union_all
from amqpscope.pipelines.engine import OBSERVES, does
from amqpscope.schemas.verdicts import VIOLATIONS_SCHEMA
from amqpscope.threads import in_background

# Before GX is imported: no usage analytics from a tool that runs on machines without internet.
os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")

import great_expectations as gx
from great_expectations.checkpoint import UpdateDataDocsAction
from great_expectations.core.batch_definition import BatchDefinition
from great_expectations.core.run_identifier import RunIdentifier
from great_expectations.data_context import FileDataContext
from great_expectations.data_context.data_context.context_factory import set_context
from great_expectations.data_context.types.base import ProgressBarsConfig

from amqpscope.expectations.gx_files import AtomicFileDataContext, configure, repair

SUITE_PREFIX = "amqpscope."
CHECKPOINT_NAME = "amqpscope"
_DATA_SOURCE = "amqpscope_rule_counts"
_ASSET = "rule_counts"  # one row: a column per rule, its number of violating rows
_DOCS_SITE = "local_site"  # the site a file context's default configuration writes
_RUN_NAME_IDS = 4  # capture ids spelled out in a run name; more are counted
_ID_CHARS = 16  # of a capture id (a SHA-256) in a run name: unique enough, short enough for a path

# GX's own failure severities, so Data Docs rank our rules the same way reports do.
_GX_SEVERITY = {"error": "critical", "warning": "warning", "capture": "info"}


@dataclass(frozen=True)
class SuiteResult:
    """Outcome of one table's suite."""

    suite_name: str
    table: str
    success: bool
    unexpected_counts: Mapping[str, int]  # rule id -> violating rows
    seconds: float  # wall time of the Checkpoint run that validated it (with the other suites)
    data_docs_index: Path


@dataclass(frozen=True)
class VerdictRun:
    """Every violation found (VIOLATIONS_SCHEMA) and the GX suite results that agree with them."""

    violations: DataFrame
    suites: tuple[SuiteResult, ...]
    data_docs_index: Path
    data_docs_seconds: float
    run_name: str = ""  # the GX run: Data Docs list the validations under it

    @property
    def success(self) -> bool:
        return all(s.success for s in self.suites)

    def result(self) -> VerdictRun:
        """The run itself: a finished run answers as a PendingVerdicts does (``write_report`` takes either)."""
        return self


def suite_name(table: str) -> str:
    """The GX suite name of a table's rules."""
    return f"{SUITE_PREFIX}{table}"


def run_name(capture_ids: Sequence[str]) -> str:
    """The GX run name of a validation of these captures: their ids (shortened), so Data Docs say
    which captures each run checked."""
    ids = sorted(set(capture_ids))
    if not ids:
        return "amqpscope"
    shown = "+".join(i[:_ID_CHARS] for i in ids[:_RUN_NAME_IDS])
    more = f"+{len(ids) - _RUN_NAME_IDS}-more" if len(ids) > _RUN_NAME_IDS else ""
    return f"captures-{shown}{more}"


def table_violations(df: DataFrame, table: str, rules: Sequence[Rule]) -> DataFrame:
    """The violations of `rules` in `df` (VIOLATIONS_SCHEMA), `df` read once for all of them.

    A row breaking several rules gives a violation per rule. A predicate Spark cannot analyse on
    `df` is a ValueError naming the rule and the table.
    """
    try:
        predicates = [F.expr(rule.violation) for rule in rules]
        found = F.array(*[F.when(p, violation_row(df, rule)) for p, rule in zip(predicates, rules)])
        # SQL WHERE semantics: a predicate that is null (state unknown) does not flag the row.
        breaking = df.where(reduce(lambda a, b: a | b, predicates))
        return breaking.select(F.explode(F.filter(found, lambda v: v.isNotNull())).alias("v")).select("v.*")
    except AnalysisException:
        for rule in rules:  # which one: each analysed alone
            try:
                df.select(F.expr(rule.violation))
            except AnalysisException as exc:
                raise ValueError(
                    f"rule {rule.id} ({rule.source}): cannot be evaluated on table {table}: "
                    f"{exc.getMessage() if hasattr(exc, 'getMessage') else exc}"
                ) from exc
        raise


def build_suite(table: str, rules: Sequence[Rule]) -> gx.ExpectationSuite:
    """The expectation suite of `table`: per rule, no row breaks it (observed: the rows that do)."""
    return gx.ExpectationSuite(
        name=suite_name(table),
        expectations=[
            gx.expectations.ExpectColumnMaxToBeBetween(
                column=rule.id,
                min_value=0,
                max_value=0,
                description=f"{rule.id} ({rule.severity}): {rule.description}",
                severity=_GX_SEVERITY[rule.severity],
                meta={"rule_id": rule.id, "severity": rule.severity, "table": table, "violation": rule.violation},
            )
            for rule in rules
        ],
    )


def file_context(docs_dir: Path) -> FileDataContext:
    """A GX file context rooted in `docs_dir` (created or reused), quiet and offline, whose files are
    written atomically (``expectations.gx_files``); what an earlier run left damaged is removed
    first, to be rebuilt by this one."""
    docs_dir.mkdir(parents=True, exist_ok=True)
    removed = repair(docs_dir / FileDataContext.GX_DIR)
    context = _open_context(docs_dir)
    if configure(context):  # a project file of GX's own making: its stores now write atomically
        context = _open_context(docs_dir)
    quiet = ProgressBarsConfig(globally=False)
    if context.variables.analytics_enabled is not False or context.variables.progress_bars != quiet:
        context.variables.analytics_enabled = False
        context.variables.progress_bars = quiet
        context.variables.save()
    if any(p.suffix == ".html" for p in removed):  # pages of earlier runs: rendered again from the stores
        context.build_data_docs(site_names=[_DOCS_SITE])
    return context


def _open_context(docs_dir: Path) -> FileDataContext:
    context = AtomicFileDataContext(project_root_dir=docs_dir)
    set_context(context)  # as gx.get_context does: validations and checkpoints find their stores through it
    return context


def _batch_definition(context: FileDataContext) -> BatchDefinition:
    source = context.data_sources.all().get(_DATA_SOURCE)
    if source is None:
        source = context.data_sources.add_pandas(name=_DATA_SOURCE)
    if _ASSET in {a.name for a in source.assets}:
        return source.get_asset(_ASSET).get_batch_definition(_ASSET)
    return source.add_dataframe_asset(name=_ASSET).add_batch_definition_whole_dataframe(_ASSET)


def _docs_index(context: FileDataContext) -> Path:
    # Where the site's index.html is (or will be, once Data Docs are built).
    site = context.variables.data_docs_sites[_DOCS_SITE]["store_backend"]
    return Path(context.root_directory, site["base_directory"], "index.html")


def validate_counts(
    context: FileDataContext, checked: Mapping[str, Sequence[Rule]], counts: Mapping[str, int], name: str
) -> tuple[tuple[SuiteResult, ...], float]:
    """Run every table's suite on the rule counts in one Checkpoint (Data Docs updated by its
    action); the suite results, in the order of `checked`, and the Checkpoint's wall time."""
    batch = _batch_definition(context)
    definitions = []
    for table, rules in checked.items():
        suite = context.suites.add_or_update(build_suite(table, rules))
        definitions.append(
            context.validation_definitions.add_or_update(
                gx.ValidationDefinition(name=suite.name, data=batch, suite=suite)
            )
        )
    checkpoint = context.checkpoints.add_or_update(
        gx.Checkpoint(
            name=CHECKPOINT_NAME,
            validation_definitions=definitions,
            actions=[UpdateDataDocsAction(name="update_data_docs", site_names=[_DOCS_SITE])],
            result_format="SUMMARY",
        )
    )
    frame = pd.DataFrame({rule.id: [int(counts.get(rule.id, 0))] for rules in checked.values() for rule in rules})
    started = time.perf_counter()
    result = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=RunIdentifier(run_name=name))
    seconds = time.perf_counter() - started

    by_suite = {r.suite_name: r for r in result.run_results.values()}
    suites = []
    for table in checked:
        outcome = by_suite[suite_name(table)]
        found: dict[str, int] = {}
        for expectation in outcome.results:
            rule_id = expectation.expectation_config.meta["rule_id"]
            observed = (expectation.result or {}).get("observed_value")
            if observed is None:  # GX failed on a frame of counts: a bug here, not a verdict
                raise RuntimeError(
                    f"suite {outcome.suite_name}: rule {rule_id}: GX gave no count ({expectation.exception_info})"
                )
            found[rule_id] = int(observed)
        suites.append(
            SuiteResult(
                suite_name=outcome.suite_name,
                table=table,
                success=bool(outcome.success),
                unexpected_counts=found,
                seconds=seconds,
                data_docs_index=_docs_index(context),
            )
        )
    return tuple(suites), seconds


def _rule_counts(
    violations: DataFrame, rule_ids: Sequence[str], store: Callable[[DataFrame], DataFrame | None] | None
) -> dict[str, int]:
    """Violations per rule: observed while `store` writes them (no extra Spark job), else counted
    (in the rows `store` returns as stored, when it does)."""
    if not rule_ids:
        if store is not None:
            store(violations)
        return {}
    if store is None:
        return _counted(violations, rule_ids)
    if not does(violations.sparkSession, OBSERVES):
        # An engine without observed metrics: the violations as stored are counted (a small table).
        written = store(violations)
        return _counted(written if written is not None else violations, rule_ids)
    observation = Observation("amqpscope_rule_counts")
    # Aliases by position: rule ids hold dots.
    observed = violations.observe(
        observation,
        *[F.count_if(F.col("rule_id") == F.lit(rule_id)).alias(f"rule_{i}") for i, rule_id in enumerate(rule_ids)],
    )
    store(observed)
    values = observation.get
    if not values:  # a Spark Connect server (4.0) returns no observed metrics of a write: counted
        return _counted(violations, rule_ids)
    return {rule_id: int(values[f"rule_{i}"]) for i, rule_id in enumerate(rule_ids)}


def _counted(violations: DataFrame, rule_ids: Sequence[str]) -> dict[str, int]:
    counted = {r.rule_id: r["count"] for r in violations.groupBy("rule_id").count().collect()}
    return {rule_id: counted.get(rule_id, 0) for rule_id in rule_ids}


@dataclass(frozen=True)
class PendingVerdicts:
    """A verdict run whose rules are evaluated and violations stored, while Great Expectations
    validates the counts and writes Data Docs on a thread of its own: pure Python, it runs while the
    job goes on with Spark. ``result()`` waits for it (and raises what it raised)."""

    violations: DataFrame
    suite_of_rule: Mapping[str, str]  # rule id -> the suite that checks it
    suites_run: tuple[str, ...]
    validation: Future[VerdictRun]

    def result(self) -> VerdictRun:
        return self.validation.result()

    @classmethod
    def of(
        cls, checked: Mapping[str, Sequence[Rule]], violations: DataFrame, validation: Future[VerdictRun]
    ) -> PendingVerdicts:
        """The pending run validating ``checked`` (table -> its rules), one suite a table."""
        return cls(
            violations=violations,
            suite_of_rule={rule.id: suite_name(table) for table, rules_ in checked.items() for rule in rules_},
            suites_run=tuple(suite_name(table) for table in checked),
            validation=validation,
        )


def rules_by_table(tables: Iterable[str], rules: Sequence[Rule] | None = None) -> dict[str, tuple[Rule, ...]]:
    """Each of ``tables`` that has rules in ``rules`` (default: the shipped catalogue), with them."""
    catalogue = load_rules() if rules is None else tuple(rules)
    checked = {name: rules_for(name, catalogue) for name in tables}
    return {name: rules_ for name, rules_ in checked.items() if rules_}


def start_verdicts(
    tables: Mapping[str, DataFrame],
    docs_dir: Path,
    *,
    rules: Sequence[Rule] | None = None,
    capture_ids: Sequence[str] = (),
    store: Callable[[DataFrame], DataFrame | None] | None = None,
) -> PendingVerdicts:
    """Check every table against its rules: violations as data (now), GX suites and Data Docs in
    docs_dir (on a thread: ``PendingVerdicts.result``).

    `rules` defaults to the shipped catalogue. Tables without rules are ignored and rules whose
    table is absent (a capture without AMQP 1.0 has no link_credit) are skipped. `store`, when
    given, is called once with the violations DataFrame (to write it) and the counts per rule are
    taken from that write; `capture_ids` name the GX run.
    """
    if not tables:
        raise ValueError("run_verdicts needs at least one table")
    checked = rules_by_table(tables, rules)

    # Built first: Spark analyses each predicate here, so a bad rule fails before anything runs.
    found = [table_violations(tables[name], name, rules_) for name, rules_ in checked.items()]
    if found:
        union = union_all(found)
    else:
        union = next(iter(tables.values())).sparkSession.createDataFrame([], VIOLATIONS_SCHEMA)
    counts = _rule_counts(union, [r.id for rules_ in checked.values() for r in rules_], store)

    name = run_name(capture_ids)
    validation = in_background(lambda: _validate(Path(docs_dir), checked, counts, union, name), "amqpscope-gx")
    return PendingVerdicts.of(checked, union, validation)


def _validate(
    docs_dir: Path, checked: Mapping[str, Sequence[Rule]], counts: Mapping[str, int], violations: DataFrame, name: str
) -> VerdictRun:
    # GX only: no Spark call here (it runs beside the job's own Spark work).
    context = file_context(docs_dir)
    if checked:
        suites, seconds = validate_counts(context, checked, counts, name)
    else:  # nothing to validate: the site still gets its index
        started = time.perf_counter()
        context.build_data_docs(site_names=[_DOCS_SITE])
        suites, seconds = (), time.perf_counter() - started
    localise(_docs_index(context).parent)  # the site as GX built it, made to open offline
    return VerdictRun(
        violations=violations,
        suites=suites,
        data_docs_index=_docs_index(context),
        data_docs_seconds=seconds,
        run_name=name,
    )


def run_verdicts(
    tables: Mapping[str, DataFrame],
    docs_dir: Path,
    *,
    rules: Sequence[Rule] | None = None,
    capture_ids: Sequence[str] = (),
    store: Callable[[DataFrame], DataFrame | None] | None = None,
) -> VerdictRun:
    """``start_verdicts``, waited for."""
    return start_verdicts(tables, docs_dir, rules=rules, capture_ids=capture_ids, store=store).result()
