"""docs/RULES.md is generated from rules.yml and must be current."""

from __future__ import annotations

from amqpscope.expectations.catalogue import CATALOGUE_PATH, load_rules
from amqpscope.expectations.event_catalogue import load_events
from amqpscope.expectations.rules_doc import DOC_PATH, not_implemented, render
from amqpscope.ingest.reasons import REASONS


def test_committed_rules_doc_is_current():
    assert DOC_PATH.read_text(encoding="utf-8") == render(load_rules(CATALOGUE_PATH), not_implemented()), (
        "docs/RULES.md is stale: run python -m amqpscope.expectations.rules_doc"
    )


def test_rules_doc_lists_every_rule_event_and_gap():
    text = render(load_rules(CATALOGUE_PATH), not_implemented())
    assert all(f"`{rule.id}`" in text for rule in load_rules(CATALOGUE_PATH))
    assert all(f"| `{event.id}` | " in text for event in load_events())
    assert all(f"| `{reason}` | " in text for reason in REASONS)
    assert all(m["rule"] and m["why"] for m in not_implemented())
    assert f"{len(load_rules(CATALOGUE_PATH))} rules: " in text
