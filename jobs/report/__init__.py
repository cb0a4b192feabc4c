"""The report: one self-contained HTML page per run, an operator's dashboard of the captures.

It opens on an overview, one row per capture, worst first: file, span, the verdict in words with
its component and entity, a severity colour, frames, connections and violations, each row linking
to the capture's section. The sections are collapsed (``<details>``) so that many captures are
still one screen of overview. In a section: the answer (the diagnosis headline and the ranked
bottleneck findings, then the rule violations), the operator's context (products, limits, queues,
consumers, links), the charts, a section per connection to drill down to, and the data-quality
view. The captures a report leaves out are listed with why (the runs table says).

The tables are aggregated in Spark (``tables``, ``context``); only bounded rows reach the driver.
The charts are drawn from the chart_series gold table's rows, which derive computed
(``pipelines.chart_series``), and the diagnosis, its findings and the data-quality summary from
their gold tables' rows: the report job and analyze read those through delta-rs, no Spark query
(``REPORT_GOLD``; given as DataFrames their rows are collected, and the page is the same). The
page is rendered from Jinja2 templates with autoescaping on, and the charts are Plotly figures
whose library (plotly.js's basic bundle, installed from npm: ``amqpscope.web_assets``) is inlined
once: nothing is fetched when the page opens, and a capture's charts are drawn when its section is
opened. Every value from the wire is hostile input: escaped in the HTML, escaped again inside the
charts' JSON and shown by Plotly as text (``charts``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyspark.sql.functions as F
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from pyspark.sql import DataFrame

from amqpscope.ingest.reasons import REASONS
from amqpscope.jobs.report.context import connection_context, consumer_context, link_context, queue_context
from amqpscope.jobs.report.figures import by_capture, capture_figures
from amqpscope.jobs.report.tables import (
    EXAMPLES_PER_RULE,
    MAX_CAPTURES,
    Section,
    capture_rows,
    collect_each,
    connection_summary,
    first_read_rows,
    first_rows,
    frame_counts,
    listed_by_capture,
    ranked_rows,
    section_rows,
    severity_rank,
    ts_text,
    violation_counts,
    violation_examples,
)
from amqpscope.pipelines.accounting import byte_accounting
from amqpscope.web_assets import asset

if TYPE_CHECKING:  # the suite module imports Great Expectations, which a report does not need
    from amqpscope.expectations.suite import PendingVerdicts, VerdictRun

__all__ = [
    "connection_summary",
    "frame_counts",
    "violation_counts",
    "violation_examples",
    "write_report",
    "anchor",
]

TEMPLATES = Path(__file__).with_name("templates")
FINDINGS_SHOWN = 50  # bottleneck findings per capture
FRAMES_PER_FINDING = 20  # bottlenecks.packet_numbers holds up to 20

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


# The gold tables a report reads besides the chart series; given as their rows (``GoldRows``) by
# the report job and analyze.
REPORT_GOLD = ("diagnosis", "bottlenecks", "dq_summary")
# A gold table's rows read without Spark (``Lake.read_rows``: delta-rs), in place of its DataFrame.
GoldRows = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Inputs:
    """Every table the report reads (flow-state tables by name; any may be missing)."""

    frames: DataFrame
    connections: DataFrame
    violations: DataFrame
    captures: DataFrame | None
    flow: Mapping[str, DataFrame]
    quarantine: DataFrame | None
    diagnosis: DataFrame | GoldRows | None
    bottlenecks: DataFrame | GoldRows | None
    dq_summary: DataFrame | GoldRows | None
    accounting: DataFrame | None = None  # byte_accounting of the bronze tables, when already made


def _spans(inputs: Inputs, shown: Sequence[str]) -> DataFrame:
    # Per capture: its first and last packet time in epoch microseconds (the charts' time origin).
    source = inputs.captures if inputs.captures is not None else inputs.connections
    return (
        source.where(F.col("capture_id").isin(list(shown)))
        .groupBy("capture_id")
        .agg(F.min(F.unix_micros("first_ts")).alias("first"), F.max(F.unix_micros("last_ts")).alias("last"))
    )


def _finding_frames(frames: DataFrame, findings: Mapping[str, list[dict]]) -> dict[tuple[str, int], list[dict]]:
    # The frames a finding points at (its packet_numbers), by (capture, packet number).
    wanted = {
        (c, p) for c, rows in findings.items() for r in rows for p in (r["packet_numbers"] or [])[:FRAMES_PER_FINDING]
    }
    if not wanted:
        return {}
    rows = (
        frames.where(
            F.col("capture_id").isin(sorted({c for c, _ in wanted}))
            & F.col("packet_number").isin(sorted({p for _, p in wanted}))
        )
        .select(
            "capture_id",
            "packet_number",
            "connection_id",
            "direction",
            "channel",
            "frame_type",
            "method",
            "frame_size",
            ts_text("ts"),
        )
        .orderBy("capture_id", "packet_number", "connection_id")
        .limit(10 * len(wanted))
        .collect()
    )
    found: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        if (row["capture_id"], row["packet_number"]) in wanted:
            found.setdefault((row["capture_id"], row["packet_number"]), []).append(row.asDict())
    return found


def _gold_rows(given: DataFrame | GoldRows | None, shown: Sequence[str]) -> GoldRows | None:
    # A gold table's rows: as given (read through delta-rs), or the shown captures' rows of the
    # DataFrame given, collected (a gold table is small: pipelines.tables, read_without_spark).
    if isinstance(given, DataFrame):
        return [r.asDict(recursive=True) for r in given.where(F.col("capture_id").isin(list(shown))).collect()]
    return given


def _accounting(inputs: Inputs) -> DataFrame | None:
    # Per capture and direction: the byte accounting's sums and its unbalanced connections.
    if inputs.quarantine is None:
        return None
    accounting = inputs.accounting
    if accounting is None:
        accounting = byte_accounting(inputs.connections, inputs.frames, inputs.quarantine)
    return accounting.groupBy("capture_id", "direction").agg(
        *[F.sum(c).alias(c) for c in ("payload_bytes", "framed_bytes", "quarantined_bytes", "missing_bytes")],
        F.count(F.when(~F.col("balanced"), 1)).alias("unbalanced"),
    )


def _quarantine_reasons(inputs: Inputs, shown: Sequence[str]) -> DataFrame | None:
    if inputs.quarantine is None:
        return None
    # One row a cause: its reason id with what it means (rows stored before reason ids: their sentence).
    meanings = F.create_map(*[F.lit(x) for reason_id, meaning in REASONS.items() for x in (reason_id, meaning)])
    reason_id = F.coalesce(F.col("reason_id"), F.col("reason"))
    reasons = (
        inputs.quarantine.withColumn("reason_id", reason_id)
        .groupBy("capture_id", "reason_id", "missing")
        .agg(
            F.count(F.lit(1)).alias("runs"),
            F.sum("byte_count").alias("bytes"),
            F.min("packet_number").alias("first_packet"),
        )
        .withColumn("reason", F.concat_ws(": ", "reason_id", meanings[F.col("reason_id")]))
    )
    return ranked_rows(reasons, shown, [F.col("bytes").desc(), F.col("reason_id")])


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
    diagnosis: DataFrame | GoldRows | None = None,
    bottlenecks: DataFrame | GoldRows | None = None,
    dq_summary: DataFrame | GoldRows | None = None,
    accounting: DataFrame | None = None,
    chart_series: Sequence[Mapping[str, Any]] = (),
    left_out: Sequence[Mapping[str, Any]] = (),
) -> Path:
    """Write the HTML report of the captures to `path` and return it.

    ``flow`` holds flow-state tables by name (consumer_unacked, link_state: the consumers and
    links tables; throughput: the queues' traffic). ``chart_series`` are the rows of the
    chart_series gold table (``pipelines.chart_series``) of these captures: each chart is drawn
    when the capture has rows of it. ``diagnosis`` / ``bottlenecks`` (schemas.diagnosis),
    ``quarantine`` and ``dq_summary`` (schemas.quality) add their sections (the three gold tables
    as their rows read without Spark, ``Lake.read_rows``, or as DataFrames whose rows are collected);
    ``accounting`` is their byte accounting when the caller has it
    (``pipelines.accounting.byte_accounting``), else it is computed. ``left_out`` lists the
    captures the report leaves out (capture_id, file_name, why). `data_docs_index` defaults to the
    Data Docs of `verdicts`, when there are verdicts. Pending verdicts (GX still validating) are
    waited for after every query of the report has run.
    """
    path = Path(path)
    inputs = Inputs(
        frames,
        connections,
        violations,
        captures,
        dict(flow or {}),
        quarantine,
        diagnosis,
        bottlenecks,
        dq_summary,
        accounting,
    )
    listed, capture_total = capture_rows(captures, [connections, frames, violations])
    shown = [c["capture_id"] for c in listed]

    # Every section's query, run together (one Spark action): ranked sections, and lists in an order.
    ranked: dict[str, DataFrame | None] = {
        "connections": ranked_rows(
            connection_summary(connections),
            shown,
            [(F.col("c2s_bytes") + F.col("s2c_bytes")).desc(), F.col("connection_id")],
        ),
        "frames": ranked_rows(
            frame_counts(frames),
            shown,
            [F.col("frames").desc(), F.col("protocol"), F.col("frame_type"), F.col("method")],
        ),
        "counts": ranked_rows(
            violation_counts(violations),
            shown,
            [severity_rank("severity"), F.col("violations").desc(), F.col("rule_id")],
        ),
        "context": ranked_rows(
            connection_context(frames, connections), shown, [F.col("frames").desc(), F.col("connection_id")]
        ),
        "queues": ranked_rows(
            queue_context(frames, inputs.flow.get("throughput")),
            shown,
            [F.coalesce(F.col("messages_in"), F.lit(0)).desc(), F.col("address")],
        ),
        "quarantine": _quarantine_reasons(inputs, shown),
    }
    if "consumer_unacked" in inputs.flow:
        ranked["consumers"] = ranked_rows(
            consumer_context(inputs.flow["consumer_unacked"]),
            shown,
            [F.col("deliveries").desc(), F.col("consumer_tag")],
        )
    if "link_state" in inputs.flow:
        ranked["links"] = ranked_rows(
            link_context(inputs.flow["link_state"]), shown, [F.col("deliveries").desc(), F.col("link_name")]
        )
    # Lists per capture: (rows, their order, at most how many in all). The gold tables' lists are
    # made from their rows, without Spark (``_gold_rows``); the others are queried.
    found = _gold_rows(bottlenecks, shown)
    listed_in_order: dict[str, tuple[DataFrame | GoldRows | None, list[str], int]] = {
        "examples": (violation_examples(violations), ["rule_id", "example"], MAX_CAPTURES * 50 * EXAMPLES_PER_RULE),
        "diagnoses": (_gold_rows(diagnosis, shown), [], MAX_CAPTURES),
        "findings": (
            [r for r in found if r["rank"] <= FINDINGS_SHOWN] if found is not None else None,
            ["rank"],
            MAX_CAPTURES * FINDINGS_SHOWN,
        ),
        "dq": (_gold_rows(dq_summary, shown), ["run_ts"], MAX_CAPTURES),
        "accounting": (_accounting(inputs), ["direction"], 2 * MAX_CAPTURES),
    }
    queries = {
        **{name: df for name, df in ranked.items() if df is not None},
        **{
            name: first_rows(df, shown, order, limit)
            for name, (df, order, limit) in listed_in_order.items()
            if isinstance(df, DataFrame)
        },
        "spans": _spans(inputs, shown),
    }
    rows: dict[str, list[Any]] = {
        **collect_each(queries),
        **{
            name: first_read_rows(given, shown, order, limit)
            for name, (given, order, limit) in listed_in_order.items()
            if given is not None and not isinstance(given, DataFrame)
        },
    }
    sections = {name: section_rows(rows.get(name, [])) for name in ranked}
    lists = {name: listed_by_capture(rows.get(name, []), order) for name, (_, order, _) in listed_in_order.items()}
    examples, diagnoses, findings = lists["examples"], lists["diagnoses"], lists["findings"]
    dq_rows, accounting = lists["dq"], lists["accounting"]
    spans = {r["capture_id"]: (r["first"], r["last"]) for r in rows["spans"] if r["first"] is not None}
    finding_frames = _finding_frames(frames, findings)

    time_zone = frames.sparkSession.conf.get("spark.sql.session.timeZone")
    models = [
        _capture_model(
            capture,
            inputs,
            sections,
            examples.get(capture["capture_id"], []),
            diagnoses.get(capture["capture_id"]),
            findings.get(capture["capture_id"], []),
            finding_frames,
            dq_rows.get(capture["capture_id"], []),
            accounting.get(capture["capture_id"], []),
            spans.get(capture["capture_id"]),
        )
        for capture in listed
    ]
    series = by_capture(chart_series)
    for model in models:
        charts = series.get(model["capture_id"], {})
        names = {e["row"]["connection_id"]: e["label"] for e in model["entities"]}
        # No chart rows and no finding: nothing was measured over time, so no chart (not even a
        # timeline of bare lifetimes).
        model["charts"] = (
            capture_figures(model, charts, lambda c, names=names: str(names.get(c) or c or "—"))
            if charts or model["findings"]
            else []
        )
        model["utilisation"] = _utilisation(charts)
    verdicts = verdicts.result() if verdicts is not None else None  # pending: GX ran meanwhile
    index = data_docs_index or (verdicts.data_docs_index if verdicts is not None else None)
    return render_page(
        path,
        captures=models,
        capture_total=capture_total,
        left_out=left_out,
        suites=_suites(verdicts),
        data_docs_index=index,
        time_zone=str(time_zone),
    )


def render_page(
    path: Path,
    *,
    captures: Sequence[Mapping[str, Any]],
    capture_total: int,
    left_out: Sequence[Mapping[str, Any]],
    suites: list[dict[str, Any]] | None,
    data_docs_index: Path | None,
    time_zone: str,
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
    if component in (None, "no_amqp", "encrypted"):
        level = "unknown"
    elif component != "none":
        level = "bottleneck"
    elif by_severity["error"]:
        level = "error"
    elif by_severity["warning"] or by_severity["capture"] or (dq is not None and dq["gaps"]):
        level = "warning"
    else:
        level = "healthy"
    if diagnosis is None:
        verdict = "Not diagnosed: the diagnosis tables were not given to the report."
    elif component == "none":
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
    inputs: Inputs,
    sections: Mapping[str, Mapping[str, Section]],
    examples: list[dict],
    diagnosis: list[dict] | None,
    findings: list[dict],
    finding_frames: Mapping[tuple[str, int], list[dict]],
    dq_rows: list[dict],
    accounting: list[dict],
    span: tuple[int, int] | None,
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
        frames = [
            fr
            for p in (f["packet_numbers"] or [])[:FRAMES_PER_FINDING]
            for fr in finding_frames.get((capture_id, p), [])
            if f["connection_id"] is None or fr["connection_id"] == f["connection_id"]
        ]
        model = {
            **f,
            "target": target(f["connection_id"], f["channel"], f["consumer_tag"], f["link_name"], None, f["queue"]),
            "frames": frames,
            "evidence": sorted((f["evidence"] or {}).items()),
        }
        finding_models.append(model)
        if f["connection_id"] in entities:
            entities[f["connection_id"]]["findings"].append(model)
    example_models = []
    for e in examples:
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
        "duration_s": (span[1] - span[0]) / 1e6 if span else None,
        "start_s": span[0] / 1e6 if span else None,
        "diagnosis": diagnosis[0] if diagnosis else None,
        "diagnosed": inputs.diagnosis is not None,
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
        "has_consumers": "consumers" in sections,
        "has_links": "links" in sections,
        "tls": tls,
        "frames": rows("frames"),
        "quarantine": rows("quarantine"),
        "has_quarantine": inputs.quarantine is not None,
        "accounting": accounting,
        "dq": dq_rows,
        "charts": [],
    }
