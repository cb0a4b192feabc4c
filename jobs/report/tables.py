"""The report's rows per capture, from its gold tables' rows read through delta-rs (no Spark here).

``report_sections`` rows (``pipelines.report.sections``) become each capture's sections, ranked
as derive ranked them; the other gold tables' rows (diagnosis, findings, data quality) are put in
their order here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from amqpscope.jobs.lake.read import python_values

MAX_CAPTURES = 50  # captures a page reports (the first by id)


@dataclass(frozen=True)
class Section:
    """Rows of one section of one capture, as many as derive kept, and how many there were in all."""

    rows: tuple[Mapping[str, Any], ...]
    total: int


Sections = dict[str, dict[str, Section]]  # section -> capture -> its rows


def sections_of(rows: Iterable[Mapping[str, Any]]) -> Sections:
    """The report_sections rows (capture_id, section, position, total, row) as a Section per
    section and capture, each row's columns decoded, in their position's order."""
    ranked: dict[str, dict[str, list[tuple[int, int, dict[str, Any]]]]] = {}
    for r in rows:
        ranked.setdefault(r["section"], {}).setdefault(r["capture_id"], []).append(
            (r["position"], r["total"], json.loads(r["row"]))
        )
    return {
        section: {
            capture: Section(tuple(row for _, _, row in sorted(found, key=lambda f: f[0])), found[0][1])
            for capture, found in by_capture.items()
        }
        for section, by_capture in ranked.items()
    }


def listed_by_capture(rows: Iterable[Mapping[str, Any]], order: Sequence[str]) -> dict[str, list[dict]]:
    """Rows (of ``first_read_rows``) as plain data per capture, in ``order`` (ascending, nulls
    first, as Spark sorts)."""
    grouped: dict[str, list[dict]] = {}
    for row in _in_order(rows, ("capture_id", *order)):
        grouped.setdefault(row["capture_id"], []).append(dict(row))
    return grouped


def _in_order(rows: Iterable[Any], columns: Sequence[str]) -> list[Any]:
    # Ascending on each column, nulls first, as Spark's orderBy sorts.
    return sorted(rows, key=lambda r: tuple((r[c] is not None, r[c]) for c in columns))


def first_read_rows(
    rows: Iterable[Mapping[str, Any]], captures: Sequence[str], order: Sequence[str], limit: int
) -> list[dict[str, Any]]:
    """The first ``limit`` rows of ``captures`` in (capture, ``order``) of a gold table's rows read
    without Spark (``Lake.read_rows``) or collected, as Spark's collect gives them (``as_collected``)."""
    shown = set(captures)
    return _in_order((as_collected(r) for r in rows if r["capture_id"] in shown), ("capture_id", *order))[:limit]


def as_collected(value: Any) -> Any:
    """A value read through delta-rs (pyarrow) as Spark's ``collect`` gives it, so that a page drawn
    from either is the same: a timestamp as a naive datetime in this process's local time (pyarrow:
    an aware one in UTC), a map as a dict (pyarrow: a list of key-value pairs), recursively."""
    return python_values(value, _local_naive)


def _local_naive(value: datetime) -> datetime:
    return value.astimezone().replace(tzinfo=None) if value.tzinfo is not None else value
