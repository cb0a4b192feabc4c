"""docs/DIAGNOSIS.md is generated from the bottleneck rule catalogue and must be current; the
catalogue itself is checked when it is loaded."""

from __future__ import annotations

import pytest

from amqpscope.expectations.bottleneck_rules import load_bottleneck_rules, rule_from_mapping
from amqpscope.expectations.diagnosis_doc import COMPONENT_MEANINGS, EFFECT_MEANINGS, ScenarioRow, render
from amqpscope.pipelines.diagnosis.measures import MEASURES
from amqpscope.schemas.diagnosis import COMPONENTS, EFFECTS
from testbed import diagnosis_doc
from tests.paths import BOTTLENECK_SCENARIOS, ROOT


def test_committed_diagnosis_doc_is_current():
    assert diagnosis_doc.DOC_PATH == ROOT / "docs" / "DIAGNOSIS.md"
    assert diagnosis_doc.DOC_PATH.read_text(encoding="utf-8") == diagnosis_doc.text(), (
        "docs/DIAGNOSIS.md is stale: run python -m testbed.diagnosis_doc"
    )


def test_the_command_writes_the_page(tmp_path):
    out = tmp_path / "DIAGNOSIS.md"
    assert diagnosis_doc.main([str(out)]) == 0
    assert out.read_text(encoding="utf-8") == diagnosis_doc.text()


def test_the_doc_lists_every_rule_component_effect_and_scenario():
    rules = load_bottleneck_rules(measures=frozenset(MEASURES))
    rows = diagnosis_doc.scenario_rows()
    text = render(rules, rows)
    assert all(f"### `{rule.id}`" in text for rule in rules)
    assert set(COMPONENT_MEANINGS) == set(COMPONENTS) and set(EFFECT_MEANINGS) == set(EFFECTS)
    assert {row.capture for row in rows} == {c.stem for c in BOTTLENECK_SCENARIOS}
    assert all(f"| {row.capture} | {row.built_to_be} | {row.truth} | {row.diagnosis} |" in text for row in rows)


def test_the_product_renders_the_rows_it_is_given():
    rules = load_bottleneck_rules(measures=frozenset(MEASURES))
    text = render(rules, [ScenarioRow("made-up", "a slow consumer", "consumer", "consumer")])
    assert "| made-up | a slow consumer | consumer | consumer |" in text
    assert "| made-up |" not in render(rules, [])


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
