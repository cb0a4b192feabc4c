"""docs/RULES.md is generated from rules.yml and must be current."""

from __future__ import annotations

from amqpscope.expectations.catalogue import CATALOGUE_PATH, load_rules
from amqpscope.expectations.rules_doc import DOC_PATH, EVENTS, not_implemented, render
from amqpscope.pipelines.events import EVENT_IDS


def test_committed_rules_doc_is_current():
    assert DOC_PATH.read_text(encoding="utf-8") == render(load_rules(CATALOGUE_PATH), not_implemented()), (
        "docs/RULES.md is stale: run python -m amqpscope.expectations.rules_doc")


def test_rules_doc_lists_every_rule_event_and_gap():
    text = render(load_rules(CATALOGUE_PATH), not_implemented())
    assert all(f"`{rule.id}`" in text for rule in load_rules(CATALOGUE_PATH))
    assert set(EVENTS) == set(EVENT_IDS)
    assert all(m["rule"] and m["why"] for m in not_implemented())
    assert f"{len(load_rules(CATALOGUE_PATH))} rules: " in text
