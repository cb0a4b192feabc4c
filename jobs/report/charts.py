"""Plotly figures of the report, as plain dicts, and their escaped JSON for embedding in the page.

Plotly draws trace names, tick labels and hover text as its own small subset of HTML (it reads
``<br>``, ``<b>`` and entities), so every string from the wire goes through :func:`wire` first: it
is shown as text, never read as markup. The figure JSON is embedded in a
``<script type="application/json">`` block with ``<``, ``>`` and ``&`` written as ``\\u`` escapes
(:func:`embedded_json`), so no value can close the block or open a tag.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# One colour per flow_intervals cause (and the findings / violations traces), stable across charts.
CAUSE_COLOURS = {
    "connection_blocked": "#d62728",
    "tcp_zero_window": "#8c564b",
    "link_credit_exhausted": "#ff7f0e",
    "session_window_closed": "#e377c2",
    "prefetch_full": "#1f77b4",
    "confirms_outstanding": "#9467bd",
    "channel_flow": "#bcbd22",
}
# One dash per queue metric, so a queue keeps its colour across its four traces.
QUEUE_DASHES = {"publish": "solid", "deliver": "dash", "ack": "dot", "redeliver": "dashdot"}
LIFETIME_COLOUR = "#dddddd"
FINDING_COLOUR = "#b00020"
_LABEL = 60  # characters of a lane label at most

CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": True}


def wire(value: Any, limit: int | None = None) -> str:
    """A value from the wire, as text Plotly shows literally (entities escaped, never markup)."""
    text = "—" if value is None else str(value)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return html.escape(text, quote=False)


def embedded_json(figure: Mapping[str, Any]) -> str:
    """JSON safe inside a <script type="application/json"> block: no '<', '>' or '&' left raw."""
    text = json.dumps(figure, separators=(",", ":"), allow_nan=False, default=str)
    return (
        text.replace("&", "\\u0026")
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


@dataclass(frozen=True)
class Series:
    """One series of a chart (rows of the chart_series table): its keys, and per metric its points
    in time order (x, value)."""

    key: tuple  # connection_id, channel, name, direction
    rank: int  # 1 = the chart's busiest series in the capture
    total: int  # the chart's series in the capture, drawn or not
    bucket_s: float
    points: Mapping[str, tuple[tuple[float, ...], tuple[Any, ...]]]


def left_out(drawn: Sequence[Series], what: str) -> str | None:
    """The note of a chart that draws only its busiest series: how many of how many ``what``."""
    total = max((s.total for s in drawn), default=0)
    return f"The {len(drawn)} busiest of {total} {what} are drawn." if total > len(drawn) else None


def _layout(title: str, y_title: str, height: int = 360, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}},
        "height": height,
        "margin": {"l": 70, "r": 30, "t": 40, "b": 45},
        "xaxis": {"title": {"text": "seconds since the capture's first packet"}, "zeroline": False},
        # SI prefixes for large values (k, M, G), never Plotly's "B" for billions; small ones as they are.
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero", "exponentformat": "SI"},
        "legend": {"orientation": "h", "y": -0.2},
        "hovermode": "closest",
        **extra,
    }


def _finite(values: Sequence[Any]) -> list[Any]:
    return [None if v is None or (isinstance(v, float) and v != v) else v for v in values]


def _mode(points: int) -> str:
    # Few points: markers too, so a series of one point still shows.
    return "lines+markers" if points < 50 else "lines"


def line_chart(
    title: str,
    y_title: str,
    series: Sequence[Series],
    traces: Sequence[tuple[str, str, Mapping[str, Any]]],
    name_of: Any,
    *,
    per_second: bool = False,
    scale: float = 1.0,
    unit: str = "",
) -> dict[str, Any]:
    """One trace per (series, metric), drawn as steps: ``traces`` are (metric, label, extra trace
    attributes); ``name_of(series)`` is the series' (already escaped) name. ``per_second``: the
    values are counts a bucket, drawn as the bucket's mean rate (count / width) from its start;
    ``scale`` multiplies the values (100: a fraction as %)."""
    data = []
    for s in series:
        for metric, label, extra in traces:
            if metric not in s.points:
                continue
            xs, ys = s.points[metric]
            factor = scale / s.bucket_s if per_second else scale
            name = f"{name_of(s)} {label}".strip()
            # A rate or a share: six significant digits, what a reader can tell apart (half the JSON);
            # a state as it is (a window of 6,291,456 bytes stays that).
            y = [None if v is None else float(f"{v * factor:.6g}") if factor != 1 else v for v in _finite(ys)]
            hover = (
                f"{name}<br>%{{x:.6g}} s: %{{y:,.4~r}}{unit} (%{{customdata}} in {_width_text(s.bucket_s)})"
                if per_second
                else f"{name}<br>%{{x:.6g}} s: %{{y:,~r}}{unit}"
            )
            trace = {
                "type": "scatter",
                "mode": _mode(len(xs)),
                "name": name,
                "x": [round(x, 6) for x in xs],
                "y": y,
                "line": {"shape": "hv"},
                "hovertemplate": hover + "<extra></extra>",
                **extra,
            }
            if per_second:
                trace["customdata"] = [0 if v is None else round(v) for v in ys]
            data.append(trace)
    layout = _layout(title, y_title)
    if unit:
        layout["yaxis"] = {**layout["yaxis"], "ticksuffix": unit}
    if any(t.get("yaxis") == "y2" for _, _, t in traces):
        layout["margin"] = {**layout["margin"], "r": 80}  # room for the right-hand axis
    return {"data": data, "layout": layout, "config": CONFIG}


def _width_text(width: float) -> str:
    return f"{width * 1000:g} ms" if width < 1 else f"{width:g} s"


def timeline_chart(
    lanes: Sequence[Mapping[str, Any]],
    bars: Sequence[Mapping[str, Any]],
    markers: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The swimlane: ``lanes`` (label, start, end: the entity's captured lifetime), ``bars``
    (label, start, end, kind, hover) drawn per kind, ``markers`` (label, x, kind, hover).

    Labels and hover texts are already escaped."""
    order = list(dict.fromkeys(lane["label"] for lane in lanes))
    data: list[dict[str, Any]] = []
    if lanes:
        data.append(_bars("captured lifetime", LIFETIME_COLOUR, lanes, 0.25))
    kinds = list(dict.fromkeys(bar["kind"] for bar in bars))
    for kind in kinds:
        of_kind = [bar for bar in bars if bar["kind"] == kind]
        colour = FINDING_COLOUR if kind.startswith("finding") else CAUSE_COLOURS.get(kind, "#7f7f7f")
        data.append(_bars(wire(kind), colour, of_kind, 0.7))
    for kind in dict.fromkeys(m["kind"] for m in markers):
        of_kind = [m for m in markers if m["kind"] == kind]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": wire(kind),
                "x": [m["x"] for m in of_kind],
                "y": [m["label"] for m in of_kind],
                "text": [m["hover"] for m in of_kind],
                "hovertemplate": "%{text}<extra></extra>",
                "marker": {"symbol": "x", "size": 9, "color": "#b00020" if kind == "error" else "#a05a00"},
            }
        )
    for label in (*[b["label"] for b in bars], *[m["label"] for m in markers]):
        if label not in order:
            order.append(label)
    layout = _layout(
        "Timeline: entities, the intervals they were held back, findings and violations",
        "",
        height=140 + 26 * max(len(order), 1),
        barmode="overlay",
    )
    layout["yaxis"] = {
        "type": "category",
        "categoryorder": "array",
        "categoryarray": order,
        "autorange": "reversed",
        "automargin": True,
    }
    layout["margin"] = {**layout["margin"], "l": 20, "t": 70}
    # Above the lanes: below them it would cover the time axis of a tall chart.
    layout["legend"] = {"orientation": "h", "x": 0, "y": 1, "yanchor": "bottom"}
    return {"data": data, "layout": layout, "config": CONFIG}


def _bars(name: str, colour: str, items: Sequence[Mapping[str, Any]], width: float) -> dict[str, Any]:
    return {
        "type": "bar",
        "orientation": "h",
        "name": name,
        "y": [i["label"] for i in items],
        "base": [i["start"] for i in items],
        # A zero-length interval is drawn one microsecond long, so it still shows when zoomed in.
        "x": [max(i["end"] - i["start"], 1e-6) for i in items],
        "text": [i.get("hover", "") for i in items],
        "textposition": "none",
        "hovertemplate": "%{text}<extra></extra>",
        "marker": {"color": colour},
        "width": width,
    }


def lane_label(*parts: Any) -> str:
    """A swimlane's label from its parts (connection, entity kind, name), escaped and bounded."""
    return wire(" · ".join(str(p) for p in parts if p not in (None, "")), _LABEL)
