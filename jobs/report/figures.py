"""The report's charts per capture: the series of ``series`` drawn as the figures of ``charts``.

Each chart is drawn when its table was given and the capture has rows in it; a chart is a dict with
its HTML id, its title, a note (what was left out), and its escaped JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyspark.sql.functions as F

from amqpscope.jobs.report import series as S
from amqpscope.jobs.report.charts import embedded_json, lane_label, line_chart, timeline_chart, wire
from amqpscope.pipelines.throughput import message_events

if TYPE_CHECKING:
    from amqpscope.jobs.report import Inputs

_DIRECTION = {"c2s": "client→broker", "s2c": "broker→client"}


def capture_figures(
    inputs: Inputs, models: Sequence[Mapping[str, Any]], spans: Mapping[str, tuple[int, int]]
) -> dict[str, list[dict[str, Any]]]:
    """Capture id -> its charts, in page order."""
    shown = [m["capture_id"] for m in models if m["capture_id"] in spans]
    if not shown:
        return {}
    starts = {c: spans[c][0] for c in shown}
    ends = {c: (spans[c][1] - spans[c][0]) / 1e6 for c in shown}  # seconds after the start
    names = {m["capture_id"]: {e["row"]["connection_id"]: e["label"] for e in m["entities"]} for m in models}
    flow = {name: df.where(F.col("capture_id").isin(shown)) for name, df in inputs.flow.items()}
    charts: dict[str, list[dict[str, Any]]] = {c: [] for c in shown}

    def add(capture_id: str, key: str, title: str, figure: dict[str, Any], note: str | None = None) -> None:
        charts[capture_id].append({"id": f"chart-{key}-{len(charts[capture_id])}-{capture_id[:12]}",
                                   "title": title, "note": note, "json": embedded_json(figure)})

    def who(capture_id: str, connection_id: str) -> str:
        return str(names.get(capture_id, {}).get(connection_id) or connection_id)

    def left_out(drawn: Sequence[S.Series], what: str) -> str | None:
        total = max((s.total for s in drawn), default=0)
        return f"The {len(drawn)} busiest of {total} {what} are drawn." if total > len(drawn) else None

    timelines = _timelines(inputs, models, flow, starts, ends, who)
    for capture_id, figure in timelines.items():
        add(capture_id, "timeline", "Timeline", figure)

    if "consumer_unacked" in flow:
        drawn = S.collect_series(S.unacked_series(flow["consumer_unacked"], starts),
                                 ["connection_id", "channel", "consumer_tag"], ["unacked", "prefetch"])
        for capture_id, series in drawn.items():
            figure = line_chart(
                "Unacked deliveries and prefetch per consumer", "deliveries", series,
                [("unacked", "unacked", {}), ("prefetch", "prefetch", {"line": {"shape": "hv", "dash": "dot"}})],
                lambda s, c=capture_id: wire(f"{who(c, s.key[0])} · ch {s.key[1]} · {s.key[2]}", 70))
            add(capture_id, "unacked", "Unacked vs prefetch", figure, left_out(series, "consumers"))
    if "link_state" in flow:
        drawn = S.collect_series(S.link_series(flow["link_state"].where(F.col("link_credit_snd").isNotNull()), starts),
                                 ["connection_id", "link_name", "sender_side"], ["link_credit", "delivery_count"])
        for capture_id, series in drawn.items():
            figure = line_chart(
                "AMQP 1.0 link credit (sender's view) and delivery-count per link", "credit / count", series,
                [("link_credit", "link-credit", {}),
                 ("delivery_count", "delivery-count", {"line": {"shape": "hv", "dash": "dot"}, "yaxis": "y2"})],
                lambda s, c=capture_id: wire(f"{who(c, s.key[0])} · {s.key[1]} ({s.key[2]} sends)", 70))
            figure["layout"]["yaxis2"] = {"title": {"text": "delivery-count"}, "overlaying": "y", "side": "right"}
            add(capture_id, "credit", "Link credit", figure, left_out(series, "links"))
    if "channel_confirms" in flow:
        drawn = S.collect_series(S.confirms_series(flow["channel_confirms"], starts),
                                 ["connection_id", "channel"], ["outstanding"])
        for capture_id, series in drawn.items():
            figure = line_chart("Publisher confirms outstanding per channel", "publishes not yet confirmed", series,
                                [("outstanding", "", {})],
                                lambda s, c=capture_id: wire(f"{who(c, s.key[0])} · ch {s.key[1]}", 70))
            add(capture_id, "confirms", "Confirms outstanding", figure, left_out(series, "channels"))
    widths = {c: S.rate_width(ends[c]) for c in shown}
    # Both rate charts bucket the same message rows: found once (a join and windows over the frames).
    messages = message_events(inputs.frames.where(F.col("capture_id").isin(shown)), flow.get("link_state")).persist()
    for scope, title in (("connection", "per connection"), ("address", "per queue / address")):
        keys = ["connection_id", "direction"] if scope == "connection" else ["address", "direction"]
        drawn = S.collect_series(S.rate_series(messages, starts, widths, scope), keys, ["messages_per_s", "bytes_per_s"])
        for capture_id, series in drawn.items():
            def name(s: S.Series, c: str = capture_id, scope: str = scope) -> str:
                first = who(c, s.key[0]) if scope == "connection" else s.key[0]
                return wire(f"{first} {_DIRECTION.get(s.key[1], s.key[1])}", 70)
            figure = line_chart(
                f"Messages and bytes per second {title} ({_width_text(widths[capture_id])} buckets)", "messages/s",
                series, [("messages_per_s", "msg/s", {}),
                         ("bytes_per_s", "bytes/s", {"line": {"shape": "hv", "dash": "dot"}, "yaxis": "y2"})], name)
            figure["layout"]["yaxis2"] = {"title": {"text": "bytes/s"}, "overlaying": "y", "side": "right",
                                          "rangemode": "tozero"}
            add(capture_id, f"rate-{scope}", f"Throughput {title}", figure,
                left_out(series, "connection directions" if scope == "connection" else "addresses"))
    messages.unpersist()
    if "tcp_flow" in flow:
        drawn = S.collect_series(S.window_series(flow["tcp_flow"], starts), ["connection_id", "direction"],
                                 ["window", "zero_windows"])
        for capture_id, series in drawn.items():
            figure = line_chart(
                "TCP receive window advertised, per connection and sender", "bytes", series, [("window", "", {})],
                lambda s, c=capture_id: wire(f"{who(c, s.key[0])} {_DIRECTION.get(s.key[1], s.key[1])} advertises", 70))
            zero = [(x, s) for s in series for x, n in zip(s.x, s.values["zero_windows"]) if n]
            if zero:
                figure["data"].append({
                    "type": "scatter", "mode": "markers", "name": "zero window",
                    "x": [x for x, _ in zero], "y": [0] * len(zero),
                    "text": [wire(f"{who(capture_id, s.key[0])} {_DIRECTION.get(s.key[1], s.key[1])}") for _, s in zero],
                    "hovertemplate": "zero window: %{text}<br>%{x:.6f} s<extra></extra>",
                    "marker": {"symbol": "x", "size": 10, "color": "#b00020"},
                })
            add(capture_id, "tcp", "TCP windows", figure, left_out(series, "connection directions"))
    return {c: v for c, v in charts.items() if v}


def _width_text(width: float) -> str:
    return f"{width * 1000:g} ms" if width < 1 else f"{width:g} s"


def _timelines(
    inputs: Inputs, models: Sequence[Mapping[str, Any]], flow: Mapping[str, Any],
    starts: Mapping[str, int], ends: Mapping[str, float], who: Any,
) -> dict[str, dict[str, Any]]:
    """The swimlane of each capture: every connection, consumer and link with its lifetime, the
    flow_intervals of each entity, the bottleneck findings and the violations as markers."""
    lanes: dict[str, list[dict[str, Any]]] = {c: [] for c in starts}
    bars: dict[str, list[dict[str, Any]]] = {c: [] for c in starts}
    markers: dict[str, list[dict[str, Any]]] = {c: [] for c in starts}
    for model in models:
        capture_id = model["capture_id"]
        if capture_id not in starts:
            continue
        t0 = starts[capture_id] / 1e6
        for finding in model["findings"]:
            end = finding["end_ts"].timestamp() - t0 if finding["end_ts"] else ends[capture_id]
            start = finding["start_ts"].timestamp() - t0
            bars[capture_id].append({
                "label": lane_label(f"finding #{finding['rank']}", finding["component"], finding["entity"]),
                "start": start, "end": max(end, start), "kind": "finding (bottleneck)",
                "hover": wire(f"#{finding['rank']} {finding['component']} / {finding['effect']}: "
                              f"{finding['entity']} from packet {finding['start_packet_number']}"),
            })
        for entity in model["entities"]:
            row = entity["row"]
            if row["first_ts"] is None:
                continue
            connection = lane_label(who(capture_id, row["connection_id"]))
            lanes[capture_id].append({"label": connection, "start": row["first_ts"].timestamp() - t0,
                                      "end": row["last_ts"].timestamp() - t0,
                                      "hover": wire(f"connection {row['client']} → {row['server']}")})
            for consumer in entity["consumers"]:
                lanes[capture_id].append({
                    "label": lane_label(who(capture_id, row["connection_id"]), "consumer", consumer["consumer_tag"]),
                    "start": consumer["first_ts"].timestamp() - t0, "end": consumer["last_ts"].timestamp() - t0,
                    "hover": wire(f"consumer {consumer['consumer_tag']} on {consumer['queue']}")})
            for link in entity["links"]:
                lanes[capture_id].append({
                    "label": lane_label(who(capture_id, row["connection_id"]), "link", link["link_name"]),
                    "start": link["first_ts"].timestamp() - t0, "end": link["last_ts"].timestamp() - t0,
                    "hover": wire(f"link {link['link_name']} ({link['sender_side']} sends)")})
    if "flow_intervals" in flow:
        # At most LANES x INTERVALS_PER_LANE rows a capture: ordered here, sparing Spark a sort.
        lane_rows = sorted(S.lanes(flow["flow_intervals"], starts, ends).collect(),
                           key=lambda r: (r["capture_id"], r["_series_rank"], r["start"], r["end"]))
        for row in lane_rows:
            # Consumers and links send one way: their intervals share the lane of their lifetime.
            direction = "" if row["entity"] in ("consumer", "link") else _DIRECTION.get(row["direction"], "")
            label = lane_label(who(row["capture_id"], row["connection_id"]), row["entity"], row["name"], direction)
            bars[row["capture_id"]].append({
                "label": label, "start": row["start"], "end": row["end"], "kind": row["cause"],
                "hover": wire(f"{row['cause']} {row['detail'] or ''}: {row['end'] - row['start']:.6f} s from packet "
                              f"{row['start_packet_number']} to {row['end_packet_number'] or 'the end'}"),
            })
    for row in S.violation_markers(inputs.violations.where(F.col("capture_id").isin(list(starts))), starts).collect():
        markers[row["capture_id"]].append({
            "label": lane_label("violation", row["rule_id"]), "x": row["x"], "kind": row["severity"],
            "hover": wire(f"{row['rule_id']} on {who(row['capture_id'], row['connection_id'])}"
                          + (f", packet {row['packet_number']}" if row["packet_number"] is not None else "")),
        })
    return {
        c: timeline_chart(lanes[c], bars[c], markers[c])
        for c in starts if lanes[c] or bars[c] or markers[c]
    }
