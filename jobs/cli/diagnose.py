"""``amqpscope diagnose``: what the bottleneck is, in a few lines an operator reads.

Captures already analysed into ``--lake`` by a run that finished are answered from its gold tables
with delta-rs alone (no Spark, a second or so); the others (not in the lake, or left incomplete by a
run killed or failed part way: the runs table says which) are analysed first (``jobs.stages.analyze``,
which repairs them), then answered.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.expectations.bottleneck_rules import UNITS, evidence_units
from amqpscope.ingest.rotation import resolve_parts
from amqpscope.jobs.cli.outcomes import ExitCode
from amqpscope.jobs.lake.read import python_values, read_rows
from amqpscope.jobs.stages.preflight import check_capture_arguments, without_packets
from amqpscope.schemas.diagnosis import COMPONENTS, ENCRYPTED, NO_AMQP, Component

_MAX_FINDINGS_SHOWN = 10
# diagnosis.bottleneck when a capture gave nothing to judge (no AMQP decoded; or every AMQP-port
# connection encrypted and not decoded): ``diagnose`` exits ExitCode.NOTHING_TO_JUDGE (4) when no
# capture could be judged.
NOTHING_TO_JUDGE = (NO_AMQP, ENCRYPTED)
# diagnosis.bottleneck values that name a component: ``diagnose`` exits ExitCode.BOTTLENECK (3).
_BOTTLENECKS = frozenset(COMPONENTS) - {Component.NONE.value}


def _read_capture_rows(lake: Path, table: str, ids: Sequence[str]) -> list[dict[str, Any]]:
    # delta-rs, through the helper that cannot abort the process at exit (jobs.lake.read)
    return read_rows(lake / table, ids)


def incomplete(lake: Path, ids: Sequence[str]) -> list[str]:
    """Those of ``ids`` whose rows the runs table does not call complete (a run killed or failed
    part way, a derive older than the latest ingest, no run recorded): ``jobs.lake.runs.completeness``."""
    from amqpscope.jobs.lake.runs import COMPLETE, RUNS_TABLE, StageRun, completeness

    runs = [StageRun(**r) for r in _read_capture_rows(lake, RUNS_TABLE, ids)]
    by_stage = {(r.capture_id, r.stage): r for r in runs}
    return [cid for cid in ids if completeness(by_stage, cid) != COMPLETE]


def stored_answers(lake: Path, ids: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """The diagnosis and bottlenecks rows of ``ids`` when the lake has a diagnosis for every one,
    each from a complete run."""
    diagnoses = _read_capture_rows(lake, "diagnosis", ids)
    if {d["capture_id"] for d in diagnoses} != set(ids) or incomplete(lake, ids):
        return None
    return diagnoses, _read_capture_rows(lake, "bottlenecks", ids)


def diagnose(
    captures: Sequence[str],
    config: AnalyzeConfig | None,
    progress: str = "never",
    reanalyze: bool = False,
    tls_keylog: Sequence[str | Path] = (),
    remote: str | None = None,
    engine: str = "spark",
) -> list[dict[str, Any]]:
    """Per capture: its file, diagnosis row and ranked findings (bottlenecks rows), analysing the
    captures not in the lake yet (a temporary lake when ``config`` is None, TLS decrypted with
    ``tls_keylog``, on the Spark Connect server ``remote`` or the ``engine`` there)."""
    check_capture_arguments(captures)  # a directory, a missing file: said before anything is read
    captured = resolve_parts(captures, config.group_rotated if config else True).captures  # as analyze names them
    known = [(parts[0].content_hash, str(parts[0].path)) for parts in captured]
    ids = [capture_id for capture_id, _ in known]
    if len(without_packets(captured)) == len(captured):  # nothing to judge: answered without Spark's modules
        from amqpscope.pipelines.diagnosis.verdict import no_packets_diagnosis

        return [{"file": file, **no_packets_diagnosis(capture_id), "findings": []} for capture_id, file in known]
    with tempfile.TemporaryDirectory(prefix="amqpscope-diagnose-") as scratch:
        if config is None:
            config = AnalyzeConfig(
                lake=Path(scratch) / "lake",
                report=Path(scratch) / "report.html",
                data_docs=Path(scratch) / "data_docs",
                tls_keylog=tuple(map(Path, tls_keylog)),
                remote=remote,
                engine=engine,
            )
        answers = None if reanalyze else stored_answers(config.lake, ids)
        if answers is not None and config.tls_keylog and any(d.get("encrypted_connections") for d in answers[0]):
            answers = None  # answered before without the key log given now: decrypt and judge again
        if answers is None:
            from amqpscope.jobs.stages import analyze  # Spark is imported only when a capture must be analysed

            result = analyze.main(captures, config, progress)
            answers = stored_answers(config.lake, ids)
            if answers is None and result.report is None:  # no packet in any: answered without the lake
                answers = list(result.diagnoses), []
            if answers is None:
                raise RuntimeError(f"analyze wrote no diagnosis for every capture into {config.lake}")
    diagnoses, findings = answers
    by_capture = {d["capture_id"]: d for d in diagnoses}
    return [
        {
            "file": file,
            **by_capture[capture_id],
            "findings": sorted((f for f in findings if f["capture_id"] == capture_id), key=lambda f: f["rank"]),
        }
        for capture_id, file in known
    ]


def exit_code(answers: Sequence[dict[str, Any]]) -> ExitCode:
    """BOTTLENECK when any capture's diagnosis names a component; else NOTHING_TO_JUDGE when no
    capture could be judged (each ``no_amqp`` or ``encrypted``); else OK (no bottleneck)."""
    if any(a["bottleneck"] in _BOTTLENECKS for a in answers):
        return ExitCode.BOTTLENECK
    if answers and all(a["bottleneck"] in NOTHING_TO_JUDGE for a in answers):
        return ExitCode.NOTHING_TO_JUDGE
    return ExitCode.OK


def _clock(ts: datetime | None) -> str:
    return ts.strftime("%H:%M:%S.%f")[:-3] if ts is not None else "capture end"


def _finding_lines(f: dict[str, Any]) -> list[str]:
    """One finding: rank, severity (a problem's), component, effect, entity, times, packets, confidence,
    its sentence and its Wireshark filter."""
    severity = f"[{f.get('severity') or 'warning'}] " if f.get("kind") == "problem" else ""
    return [
        f"  {f['rank']}. {severity}{f['component']} / {f['effect']}: {f['entity_kind']} {f['entity']}, "
        f"{_clock(f['start_ts'])}-{_clock(f['end_ts'])} UTC, packets {f['start_packet_number']}-"
        f"{f['end_packet_number'] if f['end_packet_number'] is not None else 'end'}, "
        f"held {f['duration_us'] / 1e6:.3f} s ({f['lifetime_share']:.0%}), confidence {f['confidence']:.2f}",
        f"     {f['explanation']}",
        f"     Wireshark: {f['wireshark_filter']}",
    ]


def render_text(answers: Sequence[dict[str, Any]]) -> str:
    """The plain-language answer: per capture the headline, then the ranked bottleneck findings and
    after them the problems found beside the verdict (warnings first), each with entity, times,
    packets, confidence and a Wireshark filter."""
    lines: list[str] = []
    for answer in answers:
        lines.append(f"{answer['file']} (capture {answer['capture_id'][:12]})")
        lines.append(f"  {answer['headline']}")
        findings = answer["findings"]
        shown = findings[:_MAX_FINDINGS_SHOWN]
        bottlenecks = [f for f in shown if f.get("kind") != "problem"]
        problems = [f for f in shown if f.get("kind") == "problem"]
        for f in bottlenecks:
            lines += _finding_lines(f)
        if problems:
            lines.append(f"  Problems beside the verdict ({_problem_counts(findings)}):")
            for f in problems:
                lines += _finding_lines(f)
        if len(findings) > _MAX_FINDINGS_SHOWN:
            lines.append(f"  ... and {len(findings) - _MAX_FINDINGS_SHOWN} more findings (--json lists every one)")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _problem_counts(findings: Sequence[dict[str, Any]]) -> str:
    """ "2 warnings, 1 info": a capture's problems by severity."""
    counts: dict[str, int] = {}
    for f in findings:
        if f.get("kind") == "problem":
            counts[f.get("severity") or "warning"] = counts.get(f.get("severity") or "warning", 0) + 1
    words = {"warning": ("warning", "warnings"), "info": ("info", "infos")}
    return ", ".join(
        f"{n} {words.get(s, (s, s))[n != 1]}" for s, n in sorted(counts.items(), key=lambda kv: kv[0] != "warning")
    )


def _typed(value: str | None, unit: str | None) -> Any:
    """An evidence value (stored as text) as the JSON type of its unit (``expectations.bottleneck_rules.UNITS``)."""
    if value is None or unit is None:
        return value
    kind = UNITS[unit][1]
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
    except ValueError:
        return value
    if kind == "boolean":
        return value == "true"
    return value


def typed_evidence(rule_id: str, evidence: dict[str, str | None]) -> dict[str, Any]:
    """A finding's evidence with numbers as numbers and flags as booleans, by its rule's units;
    the text of keys no catalogue rule declares (another producer's rows) is kept."""
    units = _catalogue_units().get(rule_id, {})
    return {key: _typed(value, units.get(key)) for key, value in evidence.items()}


@cache
def _catalogue_units() -> dict[str, dict[str, str]]:
    return evidence_units()


def _plain(value: Any) -> Any:
    """Arrow's Python values made JSON: timestamps as ISO text, map columns (lists of pairs) as objects."""
    return python_values(value, datetime.isoformat)


def render_json(answers: Sequence[dict[str, Any]]) -> str:
    """Every capture's diagnosis with every finding (each with its kind and severity), as JSON;
    evidence values typed by their unit. ``problems`` lists the findings of kind problem (beside the
    verdict), warnings first, by the finding ids of ``findings``."""
    captures = []
    for answer in answers:
        plain = _plain(answer)
        for finding in plain["findings"]:
            finding["evidence"] = typed_evidence(finding["rule_id"], finding.get("evidence") or {})
        plain["problems"] = [
            {k: f.get(k) for k in ("finding_id", "rank", "severity", "rule_id", "component", "entity", "explanation")}
            for f in plain["findings"]
            if f.get("kind") == "problem"
        ]
        captures.append(plain)
    return json.dumps({"captures": captures}, indent=2) + "\n"
