"""docs/DIAGNOSIS.md is generated from the bottleneck rule catalogue and must be current; the
catalogue itself is checked when it is loaded."""

from __future__ import annotations

import pytest

from amqpscope.expectations.bottleneck_rules import CATALOGUE_PATH, load_bottleneck_rules, rule_from_mapping
from amqpscope.expectations.diagnosis_doc import COMPONENT_MEANINGS, DOC_PATH, EFFECT_MEANINGS, render, scenario_rows
from amqpscope.pipelines.diagnosis.measures import MEASURES
from amqpscope.schemas.diagnosis import COMPONENTS, EFFECTS
from tests.paths import BOTTLENECK_SCENARIOS


def test_committed_diagnosis_doc_is_current():
    assert DOC_PATH.read_text(encoding="utf-8") == render(load_bottleneck_rules(CATALOGUE_PATH), scenario_rows()), (
        "docs/DIAGNOSIS.md is stale: run python -m amqpscope.expectations.diagnosis_doc"
    )


def test_the_doc_lists_every_rule_component_effect_and_scenario():
    rules = load_bottleneck_rules(measures=frozenset(MEASURES))
    text = render(rules, scenario_rows())
    assert all(f"### `{rule.id}`" in text for rule in rules)
    assert set(COMPONENT_MEANINGS) == set(COMPONENTS) and set(EFFECT_MEANINGS) == set(EFFECTS)
    assert {row[0] for row in scenario_rows()} == {c.stem for c in BOTTLENECK_SCENARIOS}


RULE = {
    "id": "diagnosis.test.rule",
    "description": "d",
    "measure": "consumer_window",
    "entity_kind": "consumer",
    "component": "consumer",
    "effect": "credit_starved",
    "priority": 3,
    "test": "held_us >= {min_held_ms} * 1000",
    "confidence": "0.5",
    "evidence": {"held_seconds": "seconds(held_us)"},
    "sentence": "held {seconds(held_us)} s",
    "docs": ["https://www.rabbitmq.com/docs/consumer-prefetch"],
}


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"component": "cpu"}, "unknown component 'cpu'"),
        ({"effect": "slow"}, "unknown effect 'slow'"),
        ({"test": "held_us >= {min_hold_ms}"}, "unknown threshold(s) min_hold_ms"),
        ({"evidence": {"held": "minutes(held_us)"}}, "unknown unit 'minutes'"),
        ({"sentence": "held {held_us:.3f}"}, "not a format spec"),
        ({"docs": ["rabbitmq.com"]}, "https links"),
        ({"measure": "nothing"}, "unknown measure 'nothing'"),
        ({"component": [{"when": "x > 1", "is": "queue"}, {"when": "x > 2", "is": "channel"}]}, "the last none"),
        ({"component": "parent"}, "needs 'after'"),
        ({"colour": "red"}, "unknown keys colour"),
    ],
)
def test_a_bad_rule_is_named_with_its_problem(change, problem):
    with pytest.raises(ValueError) as raised:
        rule_from_mapping({**RULE, **change}, "bottlenecks.yml", frozenset(MEASURES))
    assert "diagnosis.test.rule" in str(raised.value) and problem in str(raised.value)


def test_a_good_rule_loads():
    rule = rule_from_mapping(RULE, "bottlenecks.yml", frozenset(MEASURES))
    assert rule.thresholds() == {"min_held_ms"} and rule.units() == {"held_seconds": "seconds"}
