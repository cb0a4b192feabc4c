"""The page: the report's gold rows (read from the lake by delta-rs, ``write_gold_report``, or
collected from DataFrames, ``write_report``) rendered as one self-contained HTML file from the Jinja2
templates (``templates/``), with the figures of ``figures`` and the tables of ``tables``."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from amqpscope.jobs.report.balance import by_capture as balance_by_capture
from amqpscope.jobs.report.figures import by_capture, capture_figures
from amqpscope.jobs.report.tables import (
    MAX_CAPTURES,
    Section,
    Sections,
    first_read_rows,
    listed_by_capture,
    sections_of,
)
from amqpscope.pipelines.report.sections import FINDINGS_SHOWN, FRAMES_PER_FINDING
from amqpscope.schemas.diagnosis import ENCRYPTED, NO_AMQP, Component
from amqpscope.web_assets import asset

if TYPE_CHECKING:  # neither Spark nor Great Expectations is needed to draw a page
    from pyspark.sql import DataFrame

    from amqpscope.expectations.suite import PendingVerdicts, VerdictRun
    from amqpscope.jobs.lake.lake import Lake

__all__ = ["write_report", "write_gold_report", "gold_rows", "anchor", "REPORT_GOLD", "GIVEN"]

TEMPLATES = Path(__file__).with_name("templates")

TLS_ADVICE = (
    "Their records were not decrypted, so their AMQP is not in the tables, the timelines or the diagnosis "
    "(only their TCP is). Give the clients' TLS key log with --tls-keylog (the NSS key log format: "
    "SSLKEYLOGFILE, ssl.SSLContext.keylog_filename in Python; docs/TLS.md says how each client writes one) "
    "and they decode like plain connections; tls.no_key: the key log has no secret for the session, "
    "tls.decrypt_failed: its secrets are another session's."
)


def anchor(capture_id: str, kind: str, *key: Any) -> str:
    """The HTML id of an entity's place in the page: stable, and free of anything from the wire."""
    digest = hashlib.sha1("\x1f".join(map(str, (capture_id, kind, *key))).encode()).hexdigest()[:12]
    return f"{kind[:4]}-{digest}"


# The gold tables a report reads, through delta-rs (``Lake.read_rows``) by the report job and analyze.
REPORT_GOLD = ("report_sections", "diagnosis", "bottlenecks", "dq_summary", "chart_series", "queue_balance")
# A gold table's rows read without Spark (``Lake.read_rows``: delta-rs), or collected.
GoldRows = Sequence[Mapping[str, Any]]
# The optional tables a page has sections for when they are given (a lake derive wrote has them all):
# without one, its section says it was not computed rather than that it is empty.
GIVEN = frozenset({"consumer_unacked", "link_state", "quarantine", "diagnosis"})


def gold_rows(lake: Lake, capture_ids: Sequence[str]) -> dict[str, GoldRows | None]:
    """The rows of ``capture_ids`` in the report's gold tables, read through delta-rs (no Spark
    query), as ``write_gold_report``'s keyword arguments; a table not in the lake gives none."""
    from amqpscope.pipelines import tables

    read = {
        name: lake.read_rows(name, tables.table(name).schema, capture_ids) if lake.exists(name) else None
        for name in REPORT_GOLD
    }
    return {
        "sections": read["report_sections"] or [],
        "diagnosis": read["diagnosis"],
        "bottlenecks": read["bottlenecks"],
        "dq_summary": read["dq_summary"],
        "chart_series": read["chart_series"] or [],
        "queue_balance": read["queue_balance"] or [],
    }


def write_report(
    path: Path,
    *,
    frames: DataFrame,
    connections: DataFrame,
    violations: DataFrame,
    captures: DataFrame | None,
    verdicts: VerdictRun | PendingVerdicts | None,
    data_docs_index: Path | None,
    flow: Mapping[str, DataFrame] | None = None,
    quarantine: DataFrame | None = None,
    diagnosis: DataFrame | None = None,
    bottlenecks: DataFrame | None = None,
    dq_summary: DataFrame | None = None,
    accounting: DataFrame | None = None,
    chart_series: GoldRows = (),
    queue_balance: GoldRows = (),
    left_out: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Write the HTML report of the tables given as DataFrames to `path` and return it: the page
    ``write_gold_report`` draws from the lake's gold tables, with their rows computed here
    (``pipelines.report.sections``, one Spark action, and the gold tables given collected).

    ``flow`` holds flow-state tables by name (consumer_unacked, link_state: the consumers and
    links sections; throughput: the queues' traffic). ``accounting`` is the byte accounting when
    the caller has it (``pipelines.accounting.byte_accounting``), else it is computed."""
    from amqpscope.pipelines.report.sections import report_sections

    flow = dict(flow or {})
    sections = report_sections(
        captures,
        frames,
        connections,
        violations,
        quarantine,
        accounting,
        flow.get("throughput"),
        flow.get("consumer_unacked"),
        flow.get("link_state"),
        bottlenecks,
    )

    def collected(given: DataFrame | None) -> GoldRows | None:
        return [r.asDict(recursive=True) for r in given.collect()] if given is not None else None

    present = {"consumer_unacked", "link_state"} & flow.keys()
    present |= {n for n, df in (("quarantine", quarantine), ("diagnosis", diagnosis)) if df is not None}
    return write_gold_report(
        path,
        sections=[r.asDict() for r in sections.collect()],
        diagnosis=collected(diagnosis),
        bottlenecks=collected(bottlenecks),
        dq_summary=collected(dq_summary),
        chart_series=chart_series,
        queue_balance=queue_balance,
        verdicts=verdicts,
        data_docs_index=data_docs_index,
        left_out=left_out,
        given=frozenset(present),
    )


def write_gold_report(
    path: Path,
    *,
    sections: GoldRows,
    diagnosis: GoldRows | None,
    bottlenecks: GoldRows | None,
    dq_summary: GoldRows | None,
    chart_series: GoldRows,
    verdicts: VerdictRun | PendingVerdicts | None,
    data_docs_index: Path | None,
    left_out: Sequence[Mapping[str, Any]] = (),
    given: frozenset[str] = GIVEN,
    queue_balance: GoldRows = (),
    engine: str | None = None,
) -> Path:
    """Write the HTML report of the captures whose rows are given to `path` and return it. No
    Spark: every argument is a gold table's rows (``REPORT_GOLD``), read through delta-rs.

    ``sections`` are the report_sections rows (``pipelines.report.sections``: the captures, their
    tables and context), ``chart_series`` the chart_series rows (each chart is drawn when the
    capture has rows of it), ``queue_balance`` the queue_balance rows (a balance chart per queue); ``diagnosis`` / ``bottlenecks`` (schemas.diagnosis) and
    ``dq_summary`` (schemas.quality) add their sections. ``left_out`` lists the captures the
    report leaves out (capture_id, file_name, why); ``given`` names the optional tables that were
    computed (``GIVEN``). `data_docs_index` defaults to the Data Docs of `verdicts`, when there are
    verdicts. Pending verdicts (GX still validating) are waited for last. ``engine`` names the
    engine the run computed the tables on (``jobs.engine.sail.engine_of``), shown at the top.
    """
    found = sections_of(sections)
    lines = sorted((s.rows[0] for s in found.get("capture", {}).values()), key=lambda r: r["capture_id"])
    listed = lines[:MAX_CAPTURES]
    shown = [c["capture_id"] for c in listed]
    # Lists per capture: (rows, their order, at most how many in all).
    findings = [r for r in bottlenecks if r["rank"] <= FINDINGS_SHOWN] if bottlenecks is not None else None
    listed_in_order: dict[str, tuple[GoldRows | None, list[str], int]] = {
        "diagnoses": (diagnosis, [], MAX_CAPTURES),
        "findings": (findings, ["rank"], MAX_CAPTURES * FINDINGS_SHOWN),
        "dq": (dq_summary, ["run_ts"], MAX_CAPTURES),
    }
    lists = {
        name: listed_by_capture(first_read_rows(rows, shown, order, limit) if rows is not None else [], order)
        for name, (rows, order, limit) in listed_in_order.items()
    }
    frames_of: dict[tuple[str, int], list[dict]] = {}
    for capture, section in found.get("finding_frames", {}).items():
        for row in section.rows:
            frames_of.setdefault((capture, row["packet_number"]), []).append(row)

    models = [
        _capture_model(
            capture,
            found,
            given,
            lists["diagnoses"].get(capture["capture_id"]),
            lists["findings"].get(capture["capture_id"], []),
            frames_of,
            lists["dq"].get(capture["capture_id"], []),
        )
        for capture in listed
    ]
    series = by_capture(chart_series)
    balances = balance_by_capture(queue_balance)
    for model in models:
        charts = series.get(model["capture_id"], {})
        balance = balances.get(model["capture_id"], [])
        names = {e["row"]["connection_id"]: e["label"] for e in model["entities"]}
        # No chart rows and no finding: nothing was measured over time, so no chart (not even a
        # timeline of bare lifetimes).
        model["charts"] = (
            capture_figures(model, charts, lambda c, names=names: str(names.get(c) or c or "—"), balance)
            if charts or model["findings"] or balance
            else []
        )
        model["utilisation"] = _utilisation(charts)
    verdicts = verdicts.result() if verdicts is not None else None  # pending: GX ran meanwhile
    index = data_docs_index or (verdicts.data_docs_index if verdicts is not None else None)
    return render_page(
        path,
        captures=models,
        capture_total=len(lines),
        left_out=left_out,
        suites=_suites(verdicts),
        data_docs_index=index,
        # The times on the page are written in derive's session time zone (report_sections).
        time_zone=str(listed[0]["time_zone"]) if listed else "UTC",
        engine=engine,
    )


def _wireshark_filter(connection: Mapping[str, Any] | None, packet_number: int | None) -> str | None:
    if packet_number is not None:
        return f"frame.number == {packet_number}"
    if connection is None:
        return None
    ip = "ipv6" if ":" in connection["client_address"] else "ip"
    return f"{ip}.addr == {connection['client_address']} && tcp.port == {connection['client_port']}"


def _docs_href(index: Path, report: Path) -> str:
    # Relative, so the report and the Data Docs can be moved or served together.
    try:
        target = os.path.relpath(index.resolve(), report.resolve().parent)
    except ValueError:  # another drive on Windows: no relative path exists
        return index.resolve().as_uri()
    return quote(Path(target).as_posix())


@lru_cache(maxsize=1)
def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(str(TEMPLATES)),
        autoescape=select_autoescape(["html", "j2"], default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["text"] = _text
    env.filters["num"] = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    return env


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


# plotly.js's basic bundle (scatter and bar traces, all the report draws): 1.2 MB where the full
# bundle is 4.8 MB.
PLOTLY = ("plotly.js-basic-dist-min", "plotly-basic.min.js")


@lru_cache(maxsize=1)
def _plotly_js() -> str:
    script = asset(*PLOTLY).read_text(encoding="utf-8")
    # Inlined in a <script> element: it must not end it early.
    if "</script" in script.lower():
        raise ValueError(f"{asset(*PLOTLY)} holds '</script': it cannot be inlined in the page")
    return script


def render_page(
    path: Path,
    *,
    captures: Sequence[Mapping[str, Any]],
    capture_total: int,
    left_out: Sequence[Mapping[str, Any]],
    suites: list[dict[str, Any]] | None,
    data_docs_index: Path | None,
    time_zone: str,
    engine: str | None = None,
) -> Path:
    """Render the page of ``captures`` (models of ``_capture_model``, with their charts) to ``path``:
    the overview, worst first, then a collapsed section per capture; ``left_out`` are the captures
    not reported, with why. No Spark here: a lake without a complete capture gets a page too."""
    path = Path(path)
    rows = {c["capture_id"]: overview_row(c) for c in captures}
    page = (
        _environment()
        .get_template("report.html.j2")
        .render(
            time_zone=time_zone,
            engine=engine,
            capture_total=capture_total,
            # The sections in the overview's order: the worst capture first.
            captures=sorted(captures, key=lambda c: rows[c["capture_id"]]["order"]),
            overview=sorted(rows.values(), key=lambda r: r["order"]),
            left_out=list(left_out),
            suites=suites,
            docs_href=_docs_href(data_docs_index, path) if data_docs_index is not None else None,
            tls_advice=TLS_ADVICE,
            plotly_js=_plotly_js() if any(c["charts"] for c in captures) else None,
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


# Verdict levels of the overview, worst first: its row's colour and order.
LEVELS = ("bottleneck", "error", "warning", "unknown", "healthy")


def problems_of(diagnosis: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A capture's problems beside the verdict (findings of kind problem), warnings first, then by
    rank: severity, component and sentence each."""
    found = [f for f in (diagnosis or {}).get("findings") or () if f.get("kind") == "problem"]
    found.sort(key=lambda f: (f.get("severity") != "warning", f.get("rank") or 0))
    return [
        {
            "severity": f.get("severity") or "warning",
            "component": f.get("component"),
            "explanation": f.get("explanation"),
        }
        for f in found
    ]


def overview_row(model: Mapping[str, Any]) -> dict[str, Any]:
    """A capture's line in the overview: its verdict in words, with its component and entity, its
    level (LEVELS) and the figures an operator compares captures by."""
    diagnosis = model["diagnosis"]
    counts = model["counts"].rows if model["counts"] else ()
    by_severity = {
        s: sum(r["violations"] for r in counts if r["severity"] == s) for s in ("error", "warning", "capture")
    }
    dq = model["dq"][-1] if model["dq"] else None
    component = diagnosis["bottleneck"] if diagnosis else None
    problems = problems_of(diagnosis)
    if component in (None, NO_AMQP, ENCRYPTED):
        level = "unknown"
    elif component != Component.NONE:
        level = "bottleneck"
    elif by_severity["error"]:
        level = "error"
    elif (
        by_severity["warning"]
        or by_severity["capture"]
        or (dq is not None and dq["gaps"])
        or any(p["severity"] == "warning" for p in problems)
    ):
        level = "warning"
    else:
        level = "healthy"
    if diagnosis is None:
        verdict = "Not diagnosed: the diagnosis tables were not given to the report."
    elif component == Component.NONE:
        verdict = "No bottleneck found" + (
            f"; {by_severity['error']:,} protocol errors." if by_severity["error"] else "."
        )
    else:
        verdict = diagnosis["headline"]
    frames = (
        dq["frames"] if dq is not None else sum(r["frames"] for r in (model["frames"].rows if model["frames"] else ()))
    )
    return {
        "anchor": model["anchor"],
        "file_name": model["capture"].get("file_name") or model["capture_id"],
        "capture_id": model["capture_id"],
        "span_s": model["duration_s"],
        "level": level,
        "component": component if level == "bottleneck" else None,
        "entity": ((diagnosis.get("entity_kind") or "") + " " + (diagnosis.get("entity") or "")).strip()
        if level == "bottleneck"
        else None,
        "verdict": verdict,
        "findings": diagnosis["findings_count"] if diagnosis else None,
        "problems": problems,
        "frames": frames,
        "connections": model["connections"].total if model["connections"] else 0,
        "violations": sum(by_severity.values()),
        "violations_error": by_severity["error"],
        "order": (
            LEVELS.index(level),
            -(diagnosis["findings_count"] if diagnosis else 0),
            -sum(by_severity.values()),
            str(model["capture"].get("file_name") or model["capture_id"]),
        ),
    }


def _utilisation(charts: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[tuple, float]:
    # (connection, channel, consumer tag or link name) -> the consumer's overall utilisation.
    return {
        (r["connection_id"], r["channel"], r["name"]): r["value"]
        for r in charts.get("consumer_utilisation", ())
        if r["metric"] == "utilisation_overall"
    }


def _suites(verdicts: VerdictRun | None) -> list[dict[str, Any]] | None:
    if verdicts is None:
        return None
    return [
        {
            "name": s.suite_name,
            "table": s.table,
            "outcome": "passed" if s.success else "failed",
            "rules": sorted(s.unexpected_counts.items()),
            "seconds": s.seconds,
        }
        for s in verdicts.suites
    ]


def _capture_model(
    capture: Mapping[str, Any],
    sections: Sections,
    given: frozenset[str],
    diagnosis: list[dict] | None,
    findings: list[dict],
    finding_frames: Mapping[tuple[str, int], list[dict]],
    dq_rows: list[dict],
) -> dict[str, Any]:
    """Everything the template shows of one capture, with the anchors that tie it together."""
    capture_id = capture["capture_id"]

    def rows(name: str) -> Section | None:
        return sections.get(name, {}).get(capture_id)

    context = rows("context")
    if context is not None:
        context = Section(
            tuple({**r, "anchor": anchor(capture_id, "connection", r["connection_id"])} for r in context.rows),
            context.total,
        )
    connections = {r["connection_id"]: r for r in (context.rows if context else ())}
    entities: dict[str, dict[str, Any]] = {}
    for connection_id, row in connections.items():
        entities[connection_id] = {
            "anchor": row["anchor"],
            "row": row,
            "label": row["connection_name"] or row["client"],
            "consumers": [],
            "links": [],
            "findings": [],
            "violations": [],
        }
    anchors = {e["anchor"] for e in entities.values()}
    for kind in ("consumers", "links"):
        section = rows(kind)
        for row in section.rows if section else ():
            entity = entities.get(row["connection_id"])
            key = (
                (row["channel"], row["consumer_tag"]) if kind == "consumers" else (row["link_name"], row["sender_side"])
            )
            row = {**row, "anchor": anchor(capture_id, kind[:-1], row["connection_id"], *key)}
            if entity is not None:
                entity[kind].append(row)
                anchors.add(row["anchor"])
    queues = rows("queues")
    queue_rows = [{**r, "anchor": anchor(capture_id, "queue", r["address"])} for r in (queues.rows if queues else ())]
    anchors.update(r["anchor"] for r in queue_rows)

    def target(
        connection_id: str | None,
        channel: Any = None,
        consumer_tag: Any = None,
        link_name: Any = None,
        sender_side: Any = None,
        queue: Any = None,
    ) -> str | None:
        # The most specific entity section the page has for these keys.
        candidates = []
        if consumer_tag is not None:
            candidates.append(anchor(capture_id, "consumer", connection_id, channel, consumer_tag))
        if link_name is not None:
            candidates += [
                anchor(capture_id, "link", connection_id, link_name, side) for side in (sender_side, "client", "server")
            ]
        if queue is not None:
            candidates += [anchor(capture_id, "queue", f"/queues/{queue}"), anchor(capture_id, "queue", queue)]
        if connection_id is not None:
            candidates.append(anchor(capture_id, "connection", connection_id))
        return next((c for c in candidates if c in anchors), None)

    finding_models = []
    for f in findings:
        packets = [finding_frames.get((capture_id, p), []) for p in (f["packet_numbers"] or [])[:FRAMES_PER_FINDING]]
        frames = [
            fr
            for found in packets
            for fr in found
            if f["connection_id"] is None or fr["connection_id"] == f["connection_id"]
        ]
        model = {
            **f,
            "target": target(f["connection_id"], f["channel"], f["consumer_tag"], f["link_name"], None, f["queue"]),
            "frames": frames,
            # Packets carrying more frames than the page keeps of them: (packet, kept, carried).
            "frames_cut": [
                (found[0]["packet_number"], len(found), found[0]["frames_in_packet"])
                for found in packets
                if found and (found[0].get("frames_in_packet") or 0) > len(found)
            ],
            "evidence": sorted((f["evidence"] or {}).items()),
        }
        finding_models.append(model)
        if f["connection_id"] in entities:
            entities[f["connection_id"]]["findings"].append(model)
    example_models = []
    examples = rows("examples")
    for e in examples.rows if examples else ():
        connection = connections.get(e["connection_id"])
        model = {
            **e,
            "target": target(e["connection_id"]),
            "filter": _wireshark_filter(connection, e["packet_number"]),
            "evidence": sorted((e["evidence"] or {}).items()),
        }
        example_models.append(model)
        if e["connection_id"] in entities:
            entities[e["connection_id"]]["violations"].append(model)
    tls = [r for r in (rows("connections").rows if rows("connections") else ()) if r["protocol"] == "tls"]
    return {
        "capture_id": capture_id,
        "anchor": anchor(capture_id, "capture"),
        "capture": capture,
        "duration_s": (capture["last_us"] - capture["first_us"]) / 1e6 if capture["first_us"] is not None else None,
        "start_s": capture["first_us"] / 1e6 if capture["first_us"] is not None else None,
        "diagnosis": diagnosis[0] if diagnosis else None,
        "diagnosed": "diagnosis" in given,
        "findings": finding_models,
        "counts": rows("counts"),
        "examples": example_models,
        "connections": rows("connections"),
        "context": context,
        "entities": list(entities.values()),
        "queues": queue_rows,
        "queues_total": queues.total if queues else 0,
        "consumers": rows("consumers"),
        "links": rows("links"),
        "has_consumers": "consumer_unacked" in given,
        "has_links": "link_state" in given,
        "tls": tls,
        "frames": rows("frames"),
        "quarantine": rows("quarantine"),
        "has_quarantine": "quarantine" in given,
        "accounting": list(rows("accounting").rows) if rows("accounting") else [],
        "dq": dq_rows,
        "charts": [],
    }
