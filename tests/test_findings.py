"""One catalogue of findings (expectations.findings): every rule, event kind, bottleneck rule,
quarantine reason and capture status is a Finding on one severity scale, the three YAML catalogues
are read by one loader, and the ids Python code names are constants of expectations.finding_ids."""

from __future__ import annotations

import ast

import pytest
import yaml

from amqpscope.expectations import finding_ids
from amqpscope.expectations.bottleneck_rules import load_bottleneck_rules
from amqpscope.expectations.catalogue import SEVERITIES as RULE_SEVERITIES
from amqpscope.expectations.catalogue import load_rules
from amqpscope.expectations.event_catalogue import load_events
from amqpscope.expectations.finding_catalogue import every_finding
from amqpscope.expectations.findings import GROUPS, ON_THE_SCALE, SEVERITIES, Finding, load_catalogue, rank
from amqpscope.ingest.reasons import REASONS
from amqpscope.schemas.diagnosis import FINDING_SEVERITIES
from tests.paths import ROOT


def test_every_finding_is_one_record_with_a_unique_id():
    found = every_finding()
    assert all(isinstance(f, Finding) for f in found)
    assert len({f.id for f in found}) == len(found)
    rules, events, bottlenecks = load_rules(), load_events(), load_bottleneck_rules()
    assert len(found) == len(rules) + len(events) + len(bottlenecks) + len(REASONS) + 3
    assert {f.group for f in found} == set(GROUPS)


def test_the_one_scale_orders_error_warning_info():
    assert SEVERITIES == ("error", "warning", "info")
    assert rank("error") < rank("warning") < rank("info")


def test_every_own_severity_has_its_place_on_the_scale():
    assert set(ON_THE_SCALE["violation"]) == set(RULE_SEVERITIES)
    assert set(ON_THE_SCALE["bottleneck"]) == set(ON_THE_SCALE["problem"]) == set(FINDING_SEVERITIES)
    assert set(ON_THE_SCALE["quarantine"]) == {i.split(".")[0] for i in REASONS}
    assert all(s in SEVERITIES for own in ON_THE_SCALE.values() for s in own.values())


def test_the_tables_keep_their_own_severities():
    """The one scale is the catalogue's: a rule's record keeps the value the violations table holds."""
    rules = load_rules()
    assert {r.severity for r in rules} <= set(RULE_SEVERITIES)
    assert {r.finding.severity for r in rules if r.severity == "capture"} <= {"warning"}
    assert {r.severity for r in load_bottleneck_rules()} <= set(FINDING_SEVERITIES)


def test_the_id_constants_are_the_catalogues_ids():
    ids = []
    for name, key in (("rules.yml", "rules"), ("events.yml", "events"), ("bottlenecks.yml", "rules")):
        document = yaml.safe_load((ROOT / "expectations" / name).read_text(encoding="utf-8"))
        ids += [entry["id"] for entry in document[key]]
    named = {k: v for k, v in vars(finding_ids).items() if k.isupper()}
    assert sorted(named.values()) == sorted(ids)
    assert all(k == v.replace(".", "_").upper() for k, v in named.items())


def test_python_names_catalogue_ids_by_their_constants():
    """No literal rule, event or bottleneck-rule id in the product's code or the testbed."""
    ids = {v for k, v in vars(finding_ids).items() if k.isupper()}
    bare = []
    for folder in ("package", "ingest", "schemas", "pipelines", "expectations", "jobs", "conf", "testbed"):
        for path in (ROOT / folder).rglob("*.py"):
            if "node_modules" in path.parts or path.name == "finding_ids.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and node.value in ids:
                    bare.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert bare == []


def test_one_loader_rejects_a_duplicate_id_and_a_wrong_document(tmp_path):
    path = tmp_path / "x.yml"
    path.write_text("things:\n  - id: a.b\n  - id: a.b\n")
    with pytest.raises(ValueError, match=r"thing 'a.b': duplicate id"):
        load_catalogue(path, "things", "thing", lambda entry, source: Finding(entry["id"], "a", "info", "event", "s"))
    path.write_text("others: []\n")
    with pytest.raises(ValueError, match="expected a top-level 'things' list"):
        load_catalogue(path, "things", "thing", lambda entry, source: entry)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (("Not.An.Id", "Not", "info", "event", "s"), "dotted lower-case"),
        (("a.b", "b", "info", "event", "s"), "layer the first"),
        (("a.b", "a", "capture", "event", "s"), "unknown severity 'capture'"),
        (("a.b", "a", "info", "verdict", "s"), "unknown group 'verdict'"),
        (("a.b", "a", "info", "event", " "), "summary"),
    ],
)
def test_a_finding_is_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        Finding(*fields)
