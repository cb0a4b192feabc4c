"""docs/RULES.md generated from the rule catalogue (rules.yml) and the event kinds.

    python -m amqpscope.expectations.rules_doc [OUT]   # default: docs/RULES.md beside the package

tests/test_rules_doc.py checks that the committed file is what this renders.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from amqpscope.expectations.catalogue import CATALOGUE_PATH, SEVERITIES, Rule, load_rules

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "RULES.md"

# Event kinds of the events table (pipelines/events.py), with what each means.
EVENTS: Mapping[str, str] = {
    "amqp10.connection.closed_with_error": "a close carrying an error condition (transport 2.7.9)",
    "amqp10.session.ended_with_error": "an end carrying an error condition (2.7.8), e.g. RabbitMQ 3.10.8's "
                                       "amqp:internal-error after a drain on a classic queue",
    "amqp10.link.detached_with_error": "a detach carrying an error condition (2.7.7)",
    "amqp091.connection.closed_with_error": "connection.close with a reply code of 300 or more",
    "amqp091.channel.closed_with_error": "channel.close with a reply code of 300 or more",
    "amqp10.delivery.aborted": "a transfer with aborted=true (2.7.5)",
    "amqp10.message.undecodable": "a delivery whose message sections could not be decoded (message-error in "
                                  "frames.arguments)",
    "amqp10.link.attached_again": "an attach of a link name its sender had attached before on the connection",
}


def not_implemented(path: Path = CATALOGUE_PATH) -> list[Mapping[str, str]]:
    """The DOMAIN.md section 6 rules rules.yml lists as not implemented, each with why."""
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    return list(document.get("not_implemented") or [])


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(rules: Sequence[Rule], missing: Sequence[Mapping[str, str]]) -> str:
    """The text of docs/RULES.md."""
    counts = Counter(rule.severity for rule in rules)
    lines = [
        "# Rule catalogue",
        "",
        "Generated from `expectations/rules.yml` by `python -m amqpscope.expectations.rules_doc`; do not edit.",
        "",
        f"{len(rules)} rules: " + ", ".join(f"{counts[s]} {s}" for s in SEVERITIES) + ". "
        "Severity `error`: the peer that sent the frame broke a MUST of the spec; `warning`: a SHOULD, "
        "a heuristic or a risk; `capture`: the capture itself is inconsistent. Each rule is a Spark SQL "
        "predicate on one table (its row is the evidence, with the frame's packet number).",
        "",
        "| rule | severity | table | what is broken |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{r.id}` | {r.severity} | `{r.table}` | {_cell(r.description)} |" for r in rules]
    lines += [
        "",
        "## Events",
        "",
        "The `events` table lists, with severity `info`, what an operator wants to see even when nobody "
        "broke a rule:",
        "",
        "| event | what happened |",
        "|---|---|",
    ]
    lines += [f"| `{event}` | {_cell(text)} |" for event, text in EVENTS.items()]
    lines += [
        "",
        "## Not implemented",
        "",
        f"{len(missing)} rules of DOMAIN.md section 6 are not in the catalogue:",
        "",
        "| rule | why |",
        "|---|---|",
    ]
    lines += [f"| {_cell(m['rule'])} | {_cell(m['why'])} |" for m in missing]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = Path(args[0]) if args else DOC_PATH
    out.write_text(render(load_rules(CATALOGUE_PATH), not_implemented()), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
