"""docs/RULES.md generated from the rule catalogue (rules.yml), the event kinds (events.yml), the
quarantine reasons (``ingest.reasons.REASONS``) and the one catalogue of every finding on one scale
(``expectations.finding_catalogue``).

    python -m amqpscope.expectations.rules_doc [OUT]   # default: docs/RULES.md beside the package

tests/test_rules_doc.py checks that the committed file is what this renders.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from amqpscope.expectations.catalogue import CATALOGUE_PATH, SEVERITIES, Rule, load_rules
from amqpscope.expectations.doc_command import write_doc
from amqpscope.expectations.event_catalogue import EventKind, load_events
from amqpscope.expectations.finding_catalogue import every_finding
from amqpscope.expectations.findings import GROUPS, ON_THE_SCALE
from amqpscope.expectations.findings import SEVERITIES as SCALE
from amqpscope.ingest.reasons import REASONS

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "RULES.md"


def not_implemented(path: Path = CATALOGUE_PATH) -> list[Mapping[str, str]]:
    """The docs/FLOW_CONTROL.md section 6 rules rules.yml lists as not implemented, each with why."""
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return list(document.get("not_implemented") or [])


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# Where each group's findings are stored, for the one-scale table.
_STORED = {
    "violation": "`violations.severity`",
    "event": "`events` (no severity column)",
    "bottleneck": "`bottlenecks.severity`, kind bottleneck",
    "problem": "`bottlenecks.severity`, kind problem",
    "quarantine": "`quarantine.reason_id` (the id's layer gives it)",
    "capture_status": "`captures.status` (its prefix)",
}


def one_scale() -> list[str]:
    """The section on the one catalogue: per group, where it is stored, how its own values map onto
    the scale, and how many of its findings are at each severity."""
    found = every_finding()
    lines = [
        "## Every finding on one scale",
        "",
        f"Everything amqpscope reports as wrong is one of {len(found)} findings "
        "(`expectations/finding_catalogue.py`), each with a dotted id, a layer (the id's first part), a "
        "group and a severity on one scale, " + " > ".join(f"`{s}`" for s in SCALE) + ". The tables keep "
        "the values they have always held; this is how each group's values map onto the scale:",
        "",
        "| group | stored in | its values on the scale | findings: " + " / ".join(SCALE) + " |",
        "|---|---|---|---|",
    ]
    for group in GROUPS:
        mapping = ", ".join(f"`{own}` → {scale}" for own, scale in ON_THE_SCALE[group].items())
        counts = Counter(f.severity for f in found if f.group == group)
        lines.append(f"| {group} | {_STORED[group]} | {mapping} | " + " / ".join(str(counts[s]) for s in SCALE) + " |")
    return [*lines, ""]


def render(
    rules: Sequence[Rule],
    missing: Sequence[Mapping[str, str]],
    events: Sequence[EventKind] | None = None,
    reasons: Mapping[str, str] | None = None,
) -> str:
    """The text of docs/RULES.md (events: events.yml's, reasons: ``REASONS``, unless given)."""
    events = load_events() if events is None else events
    reasons = REASONS if reasons is None else reasons
    counts = Counter(rule.severity for rule in rules)
    lines = [
        "# Rule catalogue",
        "",
        "Generated from `expectations/rules.yml`, `expectations/events.yml`, `expectations/bottlenecks.yml` and `ingest/reasons.py` by "
        "`python -m amqpscope.expectations.rules_doc`; do not edit.",
        "",
        f"{len(rules)} rules: " + ", ".join(f"{counts[s]} {s}" for s in SEVERITIES) + ". "
        "(The bottleneck diagnosis's rules are in `expectations/bottlenecks.yml`, docs/DIAGNOSIS.md.) "
        "Severity `error`: the peer that sent the frame broke a MUST of the spec; `warning`: a SHOULD, "
        "a heuristic or a risk; `capture`: the capture itself is inconsistent. Each rule is a Spark SQL "
        "predicate on one table (its row is the evidence, with the frame's packet number).",
        "",
        *one_scale(),
        "## Rules",
        "",
        "| rule | severity | table | what is broken |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{r.id}` | {r.severity} | `{r.table}` | {_cell(r.description)} |" for r in rules]
    lines += [
        "",
        "## Events",
        "",
        "The `events` table lists, with severity `info`, what an operator wants to see even when nobody broke a rule:",
        "",
        "| event | what happened |",
        "|---|---|",
    ]
    lines += [f"| `{event.id}` | {_cell(event.description)} |" for event in events]
    lines += [
        "",
        "## Not implemented",
        "",
        f"{len(missing)} rules of docs/FLOW_CONTROL.md section 6 are not in the catalogue:",
        "",
        "| rule | why |",
        "|---|---|",
    ]
    lines += [f"| {_cell(m['rule'])} | {_cell(m['why'])} |" for m in missing]
    lines += [
        "",
        "## Quarantine reasons",
        "",
        "Bytes that are not decoded go to the `quarantine` table with a stable `reason_id`, a sentence "
        "(`reason`) and the details in `error_offset`, `error_length`, `expected` and `found`. The "
        "`amqp10.message.*` ids, and decoder ids met inside a 1.0 message, name a `message-error` in "
        "`frames.arguments` instead: the transfer stays decoded.",
        "",
        "| reason | what it means |",
        "|---|---|",
    ]
    lines += [f"| `{reason}` | {_cell(text)} |" for reason, text in reasons.items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    return write_doc(
        argv,
        __spec__.name if __spec__ else __name__,
        __doc__.splitlines()[0],
        DOC_PATH,
        lambda: render(load_rules(CATALOGUE_PATH), not_implemented()),
    )


if __name__ == "__main__":
    raise SystemExit(main())
