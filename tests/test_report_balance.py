"""The report's queue balance charts, drawn from queue_balance rows (no Spark)."""

from __future__ import annotations

import json

from amqpscope.jobs.report.balance import QUEUES_DRAWN, balance_figures, depth_figure


def row(queue: str, bucket: int, backlog_from: str = "declare-ok", **counts) -> dict:
    names = (
        "published",
        "delivered",
        "redelivered",
        "acked",
        "requeued",
        "discarded",
        "returned",
        "confirmed",
        "refused",
    )
    return dict(
        capture_id="c",
        queue=queue,
        bucket=bucket,
        bucket_s=0.5,
        backlog=counts.pop("backlog", None),
        backlog_from=backlog_from,
        **{n: counts.get(n, 0) for n in names},
    )


def traces(figure: dict) -> dict[str, list]:
    return {t["name"]: t["y"] for t in figure["data"]}


def test_a_queue_balance_draws_its_rates_and_its_backlog_per_bucket():
    rows = [
        row("orders", 0, published=4, delivered=2, acked=1, backlog=5),
        row("orders", 1, published=2, delivered=3, requeued=1, discarded=1, redelivered=1, backlog=5),
    ]
    ((key, title, figure, note),) = balance_figures(rows)
    assert (key, title) == ("queue-balance-1", "Queue balance: orders")
    drawn = traces(figure)
    # Counts of a bucket as its mean rate (0.5 s buckets); nacked is requeued plus discarded.
    assert drawn["published"] == [8.0, 4.0] and drawn["delivered"] == [4.0, 6.0]
    assert drawn["acked"] == [2.0, 0.0] and drawn["nacked / rejected"] == [0.0, 4.0]
    assert drawn["redelivered"] == [0.0, 2.0] and drawn["backlog (ready)"] == [5, 5]
    # Metrics that never happened are not drawn.
    assert "returned" not in drawn and "refused by the broker" not in drawn
    assert "declare-ok" in note
    assert [t["x"] for t in figure["data"]][0] == [0.0, 0.5]


def test_a_backlog_the_capture_never_saw_set_says_it_is_a_lower_bound_and_the_busiest_queues_are_drawn():
    rows = [row(f"q{n}", 0, "lower bound", published=n + 1, backlog=n + 1) for n in range(QUEUES_DRAWN + 2)]
    drawn = balance_figures(rows)
    assert [title for _k, title, _f, _n in drawn] == [f"Queue balance: q{n}" for n in range(QUEUES_DRAWN + 1, 1, -1)]
    assert all("the least it can have held" in note for _k, _t, _f, note in drawn)
    assert f"The {QUEUES_DRAWN} busiest of {QUEUES_DRAWN + 2} queues are drawn." in drawn[-1][3]


def test_a_queue_name_from_the_wire_is_text_in_the_figure():
    ((_key, _title, figure, _note),) = balance_figures([row("<b>x</b>", 0, published=1)])
    assert "<b>" not in json.dumps(figure["layout"]["title"])


def test_the_depth_chart_draws_each_backlog_at_its_buckets_end_and_says_where_it_counts_from():
    rows = [
        row("orders", 0, published=4, backlog=None),
        row("orders", 1, published=2, backlog=7),
        row("held", 0, "lower bound", delivered=3, backlog=1),
        row("held", 1, "lower bound", delivered=1, backlog=0),
    ]
    figure, note = depth_figure(rows)
    drawn = {t["name"]: (t["x"], t["y"]) for t in figure["data"]}
    # No level before the declare-ok set it; each level at its bucket's end (0.5 s buckets).
    assert drawn == {"orders ready": ([0.5, 1.0], [None, 7]), "held ready": ([0.5, 1.0], [1, 0])}
    assert "declare-ok" in note and "the least it can have held" in note
    assert depth_figure([]) is None
