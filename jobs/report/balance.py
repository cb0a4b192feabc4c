"""The report's queue balance charts, drawn from the queue_balance gold table's rows
(``pipelines.queue_accounting``; no Spark here): per queue, what went in and came out per bucket
and the backlog that leaves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from amqpscope.jobs.report.charts import Series, left_out, line_chart, wire

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


_BACKLOG_FROM = {
    "declare-ok": "The backlog counts from the broker's queue.declare-ok message-count (none is drawn before it).",
    "lower bound": "The capture never shows this queue's count (no queue.declare-ok): the backlog is the "
    "least it can have held, the messages in and out since the first packet raised by the fewest it "
    "must have held then.",
}
# A lake written before backlog_from said "lower bound" (it said "first packet": counted from 0).
_UNKNOWN_START = "The backlog counts from 0 at the capture's first packet: what the queue held then is unknown."


def depth_figure(rows: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], str] | None:
    """The queue depth chart of a capture's queue_balance rows (its busiest queues' backlog at each
    bucket's end) and its note, None without queues."""
    series = queue_series(rows)[:QUEUES_DRAWN]
    if not series:
        return None
    # Each backlog is the level at its bucket's end: drawn there.
    at_end = [
        replace(
            s,
            points={
                "backlog": (tuple(round(x + s.bucket_s, 6) for x in s.points["backlog"][0]), s.points["backlog"][1])
            },
        )
        for s in series
    ]
    figure = line_chart(
        "Ready messages per queue at each bucket's end",
        "messages",
        at_end,
        [("backlog", "ready", {})],
        lambda q: wire(q.key[2], 60),
    )
    notes = [_BACKLOG_FROM.get(kind, _UNKNOWN_START) for kind in sorted({s.key[3] for s in series})]
    return figure, " ".join([*notes, left_out(series, "queues") or ""]).strip()


def balance_figures(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, dict[str, Any], str | None]]:
    """Per queue drawn: (key, title, figure, note) of its balance chart (rates in and out, what
    the consumers and the broker did) with its backlog on the same time axis."""
    drawn = []
    series = queue_series(rows)[:QUEUES_DRAWN]
    more = left_out(series, "queues")
    for s in series:
        queue = s.key[2]
        flows = [(metric, label, {}) for metric, label in FLOWS if any(s.points[metric][1])]
        figure = line_chart(
            f"Queue {wire(queue, 60)}: messages in and out", "messages/s", [s], flows, lambda _s: "", per_second=True
        )
        backlog = line_chart("", "", [s], [("backlog", "backlog (ready)", {"yaxis": "y2"})], lambda _s: "")
        figure["data"] += backlog["data"]
        figure["layout"]["yaxis2"] = {"title": {"text": "ready messages"}, "overlaying": "y", "side": "right"}
        note = _BACKLOG_FROM.get(s.key[3], _UNKNOWN_START)
        if more and s is series[-1]:
            note += f" {more}"
        drawn.append((f"queue-balance-{s.rank}", f"Queue balance: {queue}", figure, note))
    return drawn
