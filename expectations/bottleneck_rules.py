"""The bottleneck rule catalogue: expectations/bottlenecks.yml loaded into validated, frozen rules.

A rule reads one measure (``pipelines.diagnosis.measures.MEASURES``: one row per entity with
figures), keeps the rows its ``test`` holds for, and says what they mean: the component that is
the bottleneck (one value, or the first of several cases that holds), the effect on traffic, a
confidence, the evidence figures, one sentence and where RabbitMQ documents the mechanism.
``pipelines.diagnosis.findings`` runs the catalogue; ``expectations.diagnosis_doc`` renders
docs/DIAGNOSIS.md from it. Pure Python (no Spark): ``amqpscope diagnose`` reads the evidence
units from here to type its JSON.

Expressions (``test``, ``where``, a case's ``when``, ``confidence``) are Spark SQL over the
measure's columns, in which ``{name}`` stands for the threshold of that name in
``conf.diagnosis.DiagnosisThresholds``. Templates (``sentence``, a case's ``because``) and
evidence values name a measure column, formatted by a unit: ``{queue}``, ``{seconds(held_us)}``.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.expectations.findings import Finding, check_keys, finding, load_catalogue
from amqpscope.schemas.diagnosis import COMPONENTS, EFFECTS, ENTITY_KINDS, FINDING_KINDS, FINDING_SEVERITIES

CATALOGUE_PATH = Path(__file__).with_name("bottlenecks.yml")

# How a figure is shown: unit -> (what the column holds, how it is written as text, its JSON type).
UNITS: Mapping[str, tuple[str, str]] = {
    "text": ("text", "string"),
    "count": ("a whole number", "integer"),
    "bytes": ("bytes", "integer"),
    "seconds": ("microseconds, written in seconds with 3 decimals", "number"),
    "ms": ("microseconds, written in milliseconds with 1 decimal", "number"),
    "share": ("a share between 0 and 1, with 3 decimals", "number"),
    "percent": ("a share between 0 and 1, written as a whole percentage", "number"),
    "rate": ("per second, with 1 decimal", "number"),
    "flag": ("true or false", "boolean"),
}
# What a component of "parent" means: the rule takes the component of the finding it follows.
PARENT = "parent"

_RULE_ID = re.compile(r"diagnosis(\.[a-z0-9_]+)+")
_VALUE = re.compile(r"(?:(?P<unit>[a-z]+)\((?P<inner>[a-z0-9_]+)\)|(?P<bare>[a-z0-9_]+))")
_THRESHOLD = re.compile(r"\{([a-z0-9_]+)\}")
_THRESHOLDS = frozenset(f.name for f in fields(DiagnosisThresholds))
# A number with a decimal point outside a quoted string (a quoted string is matched first, and kept).
_QUOTED_OR_DECIMAL = re.compile(r"""('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|(?<![\w.])(\d+\.\d+)(?![\w.])""")
_RULE_KEYS = {
    "id",
    "measure",
    "entity_kind",
    "component",
    "effect",
    "priority",
    "test",
    "confidence",
    "evidence",
    "sentence",
    "docs",
    "where",
    "after",
    "description",
    "kind",
    "severity",
}
_REQUIRED = (
    "id",
    "measure",
    "entity_kind",
    "component",
    "effect",
    "priority",
    "test",
    "evidence",
    "sentence",
    "docs",
    "description",
)
_CASE_KEYS = {"when", "is", "confidence", "because"}


@dataclass(frozen=True)
class Value:
    """A measure column shown in a unit (``seconds(held_us)``; a bare column is ``text``)."""

    column: str
    unit: str

    @classmethod
    def parse(cls, text: str, where: str) -> Value:
        match = _VALUE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"{where}: {text!r} is not a column or unit(column)")
        if match["bare"]:
            return cls(match["bare"], "text")
        if match["unit"] not in UNITS:
            raise ValueError(f"{where}: unknown unit {match['unit']!r} (one of {', '.join(UNITS)})")
        return cls(match["inner"], match["unit"])


@dataclass(frozen=True)
class Template:
    """A sentence with ``{value}`` fields: literal parts and values, in order."""

    parts: tuple[str | Value, ...]

    @classmethod
    def parse(cls, text: str, where: str, extra: frozenset[str] = frozenset()) -> Template:
        parts: list[str | Value] = []
        for literal, name, spec, conversion in string.Formatter().parse(" ".join(text.split())):
            if literal:
                parts.append(literal)
            if name is None:
                continue
            if spec or conversion:
                raise ValueError(f"{where}: write {{unit(column)}}, not a format spec, in {{{name}:{spec}}}")
            parts.append(name if name in extra else Value.parse(name, where))
        return cls(tuple(parts))

    def values(self) -> tuple[Value, ...]:
        return tuple(p for p in self.parts if isinstance(p, Value))


@dataclass(frozen=True)
class Case:
    """One component a rule can name, when ``when`` holds (always, when None)."""

    component: str
    when: str | None = None
    confidence: str | None = None
    because: Template | None = None


@dataclass(frozen=True)
class BottleneckRule:
    """One catalogue rule."""

    id: str
    description: str
    measure: str
    entity_kind: str
    effect: str
    priority: int  # rank within a capture: lower first (the finding an operator acts on first)
    test: str
    cases: tuple[Case, ...]
    evidence: tuple[tuple[str, Value], ...]
    sentence: Template
    docs: tuple[str, ...]
    confidence: str | None = None
    where: str | None = None
    after: str | None = None  # the rule whose findings this one's measure reads
    # bottleneck: where traffic is held back (the top one is the capture's verdict); problem: wrong
    # or an anti-pattern, listed beside the verdict (schemas.diagnosis FINDING_KINDS).
    kind: str = "bottleneck"
    severity: str = "warning"  # FINDING_SEVERITIES
    source: str = field(default="<inline>", compare=False)

    def thresholds(self) -> frozenset[str]:
        """The thresholds the rule's expressions name."""
        texts = [self.test, self.where or "", self.confidence or ""]
        texts += [t for c in self.cases for t in (c.when or "", c.confidence or "")]
        return frozenset(name for text in texts for name in _THRESHOLD.findall(text))

    @property
    def finding(self) -> Finding:
        """The rule in the one catalogue: its group is its kind (bottleneck or problem)."""
        return finding(self.id, self.kind, self.severity, self.description)

    def units(self) -> dict[str, str]:
        """Evidence key -> unit."""
        return {key: value.unit for key, value in self.evidence}


def bind(expression: str, limits: DiagnosisThresholds) -> str:
    """``expression`` with every ``{threshold}`` replaced by its value, and every number with a
    decimal point as a double literal (``0.9D``). Spark SQL reads ``0.9`` as a decimal and takes the
    double side where it meets a double (``least(0.9, share)`` is a double); not every Spark Connect
    engine does (Sail computes that ``least`` as a decimal of scale 15: a confidence 4e-16 off).
    Written as doubles, the arithmetic is the same on every engine."""
    bound = _THRESHOLD.sub(lambda m: repr(float(getattr(limits, m[1]))), expression)
    return _QUOTED_OR_DECIMAL.sub(lambda m: m[1] or f"{m[2]}D", bound)


def _case(entry: Any, where: str) -> Case:
    if isinstance(entry, str):
        return Case(component=entry)
    if not isinstance(entry, Mapping) or "is" not in entry or set(entry) - _CASE_KEYS:
        raise ValueError(
            f"{where}: a component case is a mapping with 'is' and optionally {', '.join(sorted(_CASE_KEYS - {'is'}))}"
        )
    because = Template.parse(entry["because"], f"{where} because") if "because" in entry else None
    return Case(component=entry["is"], when=entry.get("when"), confidence=entry.get("confidence"), because=because)


def rule_from_mapping(
    entry: Mapping[str, Any], source: str = "<inline>", measures: frozenset[str] | None = None
) -> BottleneckRule:
    """A rule from one YAML entry; anything missing, unknown or inconsistent is a ValueError naming it."""
    where = check_keys(entry, source, "rule", _REQUIRED, _RULE_KEYS)
    if not _RULE_ID.fullmatch(str(entry["id"])):
        raise ValueError(f"{where}: id must be diagnosis.<dotted lower-case words>")
    raw_cases = entry["component"] if isinstance(entry["component"], list) else [entry["component"]]
    cases = tuple(_case(c, f"{where} component") for c in raw_cases)
    if any(c.when is None for c in cases[:-1]) or (len(cases) > 1 and cases[-1].when is not None):
        raise ValueError(f"{where}: every component case but the last needs 'when'; the last none")
    for case in cases:
        if case.component not in COMPONENTS and case.component != PARENT:
            raise ValueError(
                f"{where}: unknown component {case.component!r} (one of {', '.join(COMPONENTS)}, {PARENT})"
            )
    if any(c.component == PARENT for c in cases) and "after" not in entry:
        raise ValueError(f"{where}: component {PARENT!r} needs 'after' (the rule whose finding it follows)")
    if entry["effect"] not in EFFECTS:
        raise ValueError(f"{where}: unknown effect {entry['effect']!r} (one of {', '.join(EFFECTS)})")
    kind, severity = entry.get("kind", "bottleneck"), entry.get("severity", "warning")
    if kind not in FINDING_KINDS:
        raise ValueError(f"{where}: unknown kind {kind!r} (one of {', '.join(FINDING_KINDS)})")
    if severity not in FINDING_SEVERITIES:
        raise ValueError(f"{where}: unknown severity {severity!r} (one of {', '.join(FINDING_SEVERITIES)})")
    if entry["entity_kind"] not in ENTITY_KINDS:
        raise ValueError(f"{where}: unknown entity_kind {entry['entity_kind']!r} (one of {', '.join(ENTITY_KINDS)})")
    if measures is not None and entry["measure"] not in measures:
        raise ValueError(f"{where}: unknown measure {entry['measure']!r} (one of {', '.join(sorted(measures))})")
    if "confidence" not in entry and any(c.confidence is None for c in cases):
        raise ValueError(f"{where}: a confidence for the rule, or one for every component case")
    evidence = entry["evidence"]
    if not isinstance(evidence, Mapping) or not evidence:
        raise ValueError(f"{where}: evidence must map names to columns (unit(column))")
    docs = entry["docs"]
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) and d.startswith("https://") for d in docs):
        raise ValueError(f"{where}: docs must list https links to where the mechanism is documented")
    rule = BottleneckRule(
        id=entry["id"],
        description=" ".join(str(entry["description"]).split()),
        measure=entry["measure"],
        entity_kind=entry["entity_kind"],
        effect=entry["effect"],
        priority=int(entry["priority"]),
        test=entry["test"],
        cases=cases,
        evidence=tuple((str(k), Value.parse(str(v), f"{where} evidence {k}")) for k, v in evidence.items()),
        sentence=Template.parse(entry["sentence"], f"{where} sentence", frozenset({"because"})),
        docs=tuple(docs),
        confidence=entry.get("confidence"),
        where=entry.get("where"),
        after=entry.get("after"),
        kind=kind,
        severity=severity,
        source=source,
    )
    unknown_thresholds = sorted(rule.thresholds() - _THRESHOLDS)
    if unknown_thresholds:
        raise ValueError(f"{where}: unknown threshold(s) {', '.join(unknown_thresholds)} (conf/diagnosis.py)")
    if "because" in (p for p in rule.sentence.parts if isinstance(p, str)) and not any(c.because for c in cases):
        raise ValueError(f"{where}: the sentence uses {{because}} but no component case has one")
    return rule


def load_bottleneck_rules(
    path: Path = CATALOGUE_PATH, measures: frozenset[str] | None = None
) -> tuple[BottleneckRule, ...]:
    """The catalogue, validated: ids unique, every ``after`` naming an earlier rule."""
    rules = load_catalogue(path, "rules", "rule", lambda entry, source: rule_from_mapping(entry, source, measures))
    for earlier, rule in enumerate(rules):
        if rule.after is not None and all(r.id != rule.after for r in rules[:earlier]):
            raise ValueError(f"{path}: rule {rule.id!r}: after {rule.after!r}, which is not an earlier rule")
    return rules


def evidence_units(rules: Sequence[BottleneckRule] | None = None) -> dict[str, dict[str, str]]:
    """Per rule id: evidence key -> unit (what ``amqpscope diagnose --json`` types by)."""
    return {r.id: r.units() for r in (load_bottleneck_rules() if rules is None else rules)}
