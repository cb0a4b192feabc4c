"""The report's queue balance charts, drawn from the queue_balance gold table's rows
(``pipelines.queue_accounting``; no Spark here): per queue, what went in and came out per bucket
and the backlog that leaves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from amqpscope.jobs.report.charts import Series, line_chart, wire

# Queues drawn per capture at most: the busiest (messages in and out).
QUEUES_DRAWN = 6
# The counts of a bucket, drawn as rates: the metric and its label. Nacked is what consumers
# refused, with and without requeue.
FLOWS = (
    ("published", "published"),
    ("delivered", "delivered"),
    ("acked", "acked"),
    ("nacked", "nacked / rejected"),
    ("redelivered", "redelivered"),
    ("returned", "returned"),
    ("refused", "refused by the broker"),
)


def by_capture(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """queue_balance rows by capture."""
    grouped: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[row["capture_id"]].append(row)
    return grouped


def queue_series(rows: Sequence[Mapping[str, Any]]) -> list[Series]:
    """One series per queue of a capture's rows, busiest first, its metrics' points by bucket."""
    per_queue: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        per_queue[row["queue"]].append(row)
    weight = {q: sum(r["published"] + r["delivered"] for r in rs) for q, rs in per_queue.items()}
    ordered = sorted(per_queue, key=lambda q: (-weight[q], q))
    found = []
    for rank, queue in enumerate(ordered, start=1):
        buckets = sorted(per_queue[queue], key=lambda r: r["bucket"])
        xs = tuple(round(r["bucket"] * r["bucket_s"], 6) for r in buckets)
        values = {name: tuple(r[name] for r in buckets) for name, _ in FLOWS if name != "nacked"}
        values["nacked"] = tuple(r["requeued"] + r["discarded"] for r in buckets)
        values["backlog"] = tuple(r["backlog"] for r in buckets)
        points = {name: (xs, ys) for name, ys in values.items()}
        found.append(
            Series((None, None, queue, buckets[0]["backlog_from"]), rank, len(ordered), buckets[0]["bucket_s"], points)
        )
    return found


def balance_figures(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, dict[str, Any], str | None]]:
    """Per queue drawn: (key, title, figure, note) of its balance chart (rates in and out, what
    the consumers and the broker did) with its backlog on the same time axis."""
    drawn = []
    series = queue_series(rows)
    for s in series[:QUEUES_DRAWN]:
        queue = s.key[2]
        flows = [(metric, label, {}) for metric, label in FLOWS if any(s.points[metric][1])]
        figure = line_chart(
            f"Queue {wire(queue, 60)}: messages in and out", "messages/s", [s], flows, lambda _s: "", per_second=True
        )
        backlog = line_chart("", "", [s], [("backlog", "backlog (ready)", {"yaxis": "y2"})], lambda _s: "")
        figure["data"] += backlog["data"]
        figure["layout"]["yaxis2"] = {"title": {"text": "ready messages"}, "overlaying": "y", "side": "right"}
        note = (
            "The backlog counts from the broker's queue.declare-ok message-count."
            if s.key[3] == "declare-ok"
            else "The backlog counts from 0 at the capture's first packet: what the queue held before is "
            "not on the wire (it may go below 0)."
        )
        if len(series) > QUEUES_DRAWN and s is series[QUEUES_DRAWN - 1]:
            note += f" The {QUEUES_DRAWN} busiest of {len(series)} queues are drawn."
        drawn.append((f"queue-balance-{s.rank}", f"Queue balance: {queue}", figure, note))
    return drawn
