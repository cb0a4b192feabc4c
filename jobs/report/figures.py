"""The report's charts per capture, drawn from the chart_series gold table's rows (no Spark here).

Derive computed every series on the capture's time grid (``pipelines.report.chart_series``); this module
turns a capture's rows into Plotly figures (``charts``), in page order. A chart is a dict with its
HTML id, its title, a note (what was left out, or a caveat) and its escaped JSON.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from amqpscope.jobs.report.balance import balance_figures, depth_figure
from amqpscope.jobs.report.charts import (
    QUEUE_DASHES,
    Series,
    embedded_json,
    lane_label,
    left_out,
    line_chart,
    timeline_chart,
    wire,
)

_DIRECTION = {"c2s": "client→broker", "s2c": "broker→client"}
_DOT = {"line": {"shape": "hv", "dash": "dot"}}


def by_capture(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[Mapping[str, Any]]]]:
    """chart_series rows by capture and chart."""
    grouped: dict[str, dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        grouped[row["capture_id"]][row["chart"]].append(row)
    return grouped


def series_of(rows: Sequence[Mapping[str, Any]]) -> list[Series]:
    """A chart's rows as its series, busiest first, each metric's points in time order."""
    points: dict[tuple, dict[str, list[tuple[float, Any]]]] = defaultdict(lambda: defaultdict(list))
    heads: dict[tuple, Mapping[str, Any]] = {}
    for row in rows:
        key = (row["connection_id"], row["channel"], row["name"], row["direction"])
        heads.setdefault(key, row)
        points[key][row["metric"]].append((row["x"], row["value"]))
    ordered = sorted(heads, key=lambda k: (heads[k]["series_rank"], tuple(str(v) for v in k)))
    return [
        Series(
            key,
            heads[key]["series_rank"],
            heads[key]["series_total"],
            heads[key]["bucket_s"],
            {
                metric: (
                    tuple(x for x, _ in sorted(p, key=lambda q: q[0])),
                    tuple(v for _, v in sorted(p, key=lambda q: q[0])),
                )
                for metric, p in points[key].items()
            },
        )
        for key in ordered
    ]


def capture_figures(
    model: Mapping[str, Any],
    charts: Mapping[str, Sequence[Mapping[str, Any]]],
    who: Callable[[str | None], str],
    balance: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The charts of one capture (``model``: the page's model of it; ``charts``: its chart_series
    rows by chart; ``who``: a connection's name; ``balance``: its queue_balance rows), in page order."""
    capture_id = model["capture_id"]
    drawn: list[dict[str, Any]] = []

    def add(key: str, title: str, figure: dict[str, Any], note: str | None = None) -> None:
        drawn.append(
            {
                "id": f"chart-{key}-{len(drawn)}-{capture_id[:12]}",
                "title": title,
                "note": note,
                "json": embedded_json(figure),
            }
        )

    def channel_of(s: Series) -> str:
        return f"{who(s.key[0])} · ch {s.key[1]}"

    timeline = timeline_figure(model, charts.get("timeline", ()), charts.get("violations", ()), who)
    if timeline is not None:
        add("timeline", "Timeline", timeline)

    queues = series_of(charts.get("queue_rates", ()))
    if queues:
        figure = line_chart("Message rates per queue: publish, deliver, redeliver, ack", "messages/s", [], [], None)
        for position, s in enumerate(queues):
            colour = {"line": {"shape": "hv", "color": _colour(position)}}
            for metric, dash in QUEUE_DASHES.items():
                part = line_chart(
                    "",
                    "",
                    [s],
                    [(metric, metric, {"legendgroup": wire(s.key[2]), "line": {**colour["line"], "dash": dash}})],
                    lambda q: wire(q.key[2], 60),
                    per_second=True,
                )
                figure["data"] += part["data"]
        # Four traces a queue: the legend beside the chart, grouped by queue, keeps the axis free.
        figure["layout"]["legend"] = {"orientation": "v", "x": 1.02, "y": 1, "tracegroupgap": 6}
        figure["layout"]["margin"] = {**figure["layout"]["margin"], "r": 20}
        add("queue-rates", "Queue rates", figure, left_out(queues, "queues"))
    depth = depth_figure(balance)
    if depth is not None:
        add("queue-depth", "Queue depth", *depth)
    for key, title, figure, note in balance_figures(balance):
        add(key, title, figure, note)

    utilisation = series_of(charts.get("consumer_utilisation", ()))
    if utilisation:

        def named(s: Series) -> str:
            overall = s.points.get("utilisation_overall", ((), (None,)))[1][0]
            kind = f"ch {s.key[1]}" if s.key[1] is not None else "link"
            text = f"{who(s.key[0])} · {kind} · {s.key[2]}"
            return wire(text, 70) + (f" ({overall:.0%} overall)" if overall is not None else "")

        figure = line_chart(
            "Consumer utilisation: the share of time each consumer could take a delivery",
            "utilisation",
            utilisation,
            [("utilisation", "", {})],
            named,
            scale=100,
            unit=" %",
        )
        figure["layout"]["yaxis"] = {**figure["layout"]["yaxis"], "range": [0, 105]}
        add("utilisation", "Consumer utilisation", figure, left_out(utilisation, "consumers"))

    consumers = series_of(charts.get("consumer_unacked", ()))
    if consumers:
        add(
            "unacked",
            "Unacked vs prefetch",
            line_chart(
                "Unacked deliveries and prefetch per consumer",
                "deliveries",
                consumers,
                [("unacked", "unacked", {}), ("prefetch", "prefetch", _DOT)],
                lambda s: wire(f"{channel_of(s)} · {s.key[2]}", 70),
            ),
            left_out(consumers, "consumers"),
        )
    channels = series_of(charts.get("channel_unacked", ()))
    if channels:
        add(
            "channel-unacked",
            "Unacked per channel",
            line_chart(
                "Unacked deliveries per channel",
                "deliveries",
                channels,
                [("unacked", "unacked", {}), ("prefetch", "prefetch", _DOT)],
                lambda s: wire(channel_of(s), 70),
            ),
            left_out(channels, "channels"),
        )

    def link_name(s: Series) -> str:
        return wire(f"{who(s.key[0])} · {s.key[2]} ({_DIRECTION.get(s.key[3], s.key[3])})", 70)

    credit = series_of(charts.get("link_credit", ()))
    if credit:
        add(
            "credit",
            "Link credit",
            line_chart(
                "AMQP 1.0 link credit per link (the sender's view)",
                "credit",
                credit,
                [("link_credit", "link-credit", {})],
                link_name,
            ),
            left_out(credit, "links"),
        )
    deliveries = series_of(charts.get("link_deliveries", ()))
    if deliveries:
        add(
            "link-deliveries",
            "Link deliveries",
            line_chart(
                "AMQP 1.0 deliveries per link",
                "deliveries/s",
                deliveries,
                [("deliveries", "", {})],
                link_name,
                per_second=True,
            ),
            left_out(deliveries, "links"),
        )
    confirms = series_of(charts.get("confirms", ()))
    if confirms:
        add(
            "confirms",
            "Confirms outstanding",
            line_chart(
                "Publisher confirms outstanding per channel",
                "publishes not yet confirmed",
                confirms,
                [("outstanding", "", {})],
                lambda s: wire(channel_of(s), 70),
            ),
            left_out(confirms, "channels"),
        )

    rates = series_of(charts.get("connection_rates", ()))
    if rates:
        figure = line_chart(
            f"Messages and bytes per second per connection ({_width(rates)} buckets)",
            "messages/s",
            rates,
            [("messages", "msg/s", {}), ("bytes", "bytes/s", {**_DOT, "yaxis": "y2"})],
            lambda s: wire(f"{who(s.key[0])} {_DIRECTION.get(s.key[3], s.key[3])}", 70),
            per_second=True,
        )
        figure["layout"]["yaxis2"] = {
            "title": {"text": "bytes/s"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "exponentformat": "SI",
            "ticksuffix": "B/s",
        }
        add("rate-connection", "Throughput per connection", figure, left_out(rates, "connection directions"))
    churn = series_of(charts.get("churn", ()))
    if churn:
        add(
            "churn",
            "Churn",
            line_chart(
                "Connection and channel churn: opened and closed per second",
                "per second",
                churn,
                [
                    (m, m.replace("_", " "), {})
                    for m in ("connections_opened", "connections_closed", "channels_opened", "channels_closed")
                ],
                lambda s: "",
                per_second=True,
            ),
        )

    windows = series_of(charts.get("tcp_window", ()))
    if windows:
        figure = line_chart(
            "TCP receive window advertised, per connection and sender",
            "bytes",
            windows,
            [("window", "", {})],
            lambda s: wire(f"{who(s.key[0])} {_DIRECTION.get(s.key[3], s.key[3])} advertises", 70),
        )
        zero = [(x, s) for s in windows for x, n in zip(*s.points.get("zero_windows", ((), ()))) if n]
        if zero:
            figure["data"].append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": "zero window",
                    "x": [x for x, _ in zero],
                    "y": [0] * len(zero),
                    "text": [wire(f"{who(s.key[0])} {_DIRECTION.get(s.key[3], s.key[3])}") for _, s in zero],
                    "hovertemplate": "zero window: %{text}<br>%{x:.6g} s<extra></extra>",
                    "marker": {"symbol": "x", "size": 10, "color": "#b00020"},
                }
            )
        add("tcp", "TCP windows", figure, left_out(windows, "connection directions"))
    return drawn


_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
)


def _colour(position: int) -> str:
    return _PALETTE[position % len(_PALETTE)]


def _width(series: Sequence[Series]) -> str:
    width = series[0].bucket_s
    return f"{width * 1000:g} ms" if width < 1 else f"{width:g} s"


def timeline_figure(
    model: Mapping[str, Any],
    bars_rows: Sequence[Mapping[str, Any]],
    marker_rows: Sequence[Mapping[str, Any]],
    who: Callable[[str | None], str],
) -> dict[str, Any] | None:
    """The swimlane of a capture: every connection, consumer and link with its lifetime, the
    flow_intervals of each entity (``bars_rows``), the findings' intervals and the violations as
    markers (``marker_rows``)."""
    start = model["start_s"]
    if start is None:
        return None
    end = model["duration_s"] or 0.0
    lanes: list[dict[str, Any]] = []
    bars: list[dict[str, Any]] = []
    markers: list[dict[str, Any]] = []
    for finding in model["findings"]:
        finding_start = finding["start_ts"].timestamp() - start
        finding_end = finding["end_ts"].timestamp() - start if finding["end_ts"] else end
        bars.append(
            {
                "label": lane_label(f"finding #{finding['rank']}", finding["component"], finding["entity"]),
                "start": finding_start,
                "end": max(finding_end, finding_start),
                "kind": "finding (bottleneck)",
                "hover": wire(
                    f"#{finding['rank']} {finding['component']} / {finding['effect']}: "
                    f"{finding['entity']} from packet {finding['start_packet_number']}"
                ),
            }
        )
    for entity in model["entities"]:
        row = entity["row"]
        if row["first_us"] is None:
            continue
        name = who(row["connection_id"])
        lanes.append(
            {
                "label": lane_label(name),
                "start": row["first_us"] / 1e6 - start,
                "end": row["last_us"] / 1e6 - start,
                "hover": wire(f"connection {row['client']} → {row['server']}"),
            }
        )
        for consumer in entity["consumers"]:
            lanes.append(
                {
                    "label": lane_label(name, "consumer", consumer["consumer_tag"]),
                    "start": consumer["first_us"] / 1e6 - start,
                    "end": consumer["last_us"] / 1e6 - start,
                    "hover": wire(f"consumer {consumer['consumer_tag']} on {consumer['queue']}"),
                }
            )
        for link in entity["links"]:
            lanes.append(
                {
                    "label": lane_label(name, "link", link["link_name"]),
                    "start": link["first_us"] / 1e6 - start,
                    "end": link["last_us"] / 1e6 - start,
                    "hover": wire(f"link {link['link_name']} ({link['sender_side']} sends)"),
                }
            )
    for row in sorted(bars_rows, key=lambda r: (r["series_rank"], r["x"], r["x_end"])):
        # Consumers and links send one way: their intervals share the lane of their lifetime.
        direction = "" if row["entity"] in ("consumer", "link") else _DIRECTION.get(row["direction"] or "", "")
        named = (
            row["name"]
            if row["name"] is not None
            else (row["channel"] if row["entity"] in ("channel", "session") else None)
        )
        bars.append(
            {
                "label": lane_label(who(row["connection_id"]), row["entity"], named, direction),
                "start": row["x"],
                "end": row["x_end"],
                "kind": row["metric"],
                "hover": wire(
                    f"{row['metric']} {row['detail'] or ''}: {row['x_end'] - row['x']:.6f} s from packet "
                    f"{row['packet_number']} to {row['end_packet_number'] or 'the end'}"
                ),
            }
        )
    for row in sorted(marker_rows, key=lambda r: (r["name"], r["x"])):
        markers.append(
            {
                "label": lane_label("violation", row["name"]),
                "x": row["x"],
                "kind": row["metric"],
                "hover": wire(
                    f"{row['name']} on {who(row['connection_id'])}"
                    + (f", packet {row['packet_number']}" if row["packet_number"] is not None else "")
                ),
            }
        )
    if not (lanes or bars or markers):
        return None
    return timeline_chart(lanes, bars, markers)
