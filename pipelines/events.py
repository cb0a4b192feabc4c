"""The events table (``schemas.events.EVENTS_SCHEMA``) from the frames table: one row per event.

Each event is a frame matching one of the event kinds of ``expectations/events.yml`` (severity
``info``; nobody broke a rule by it): closes, ends and detaches carrying an error, 0-9-1 closes
with a reply code of 300 or more, aborted deliveries, undecodable messages, links attached again
(docs/RULES.md, "Events", lists them). A kind is a Spark SQL condition on a frames row, as a rule is.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.expectations.event_catalogue import EventKind, load_events
from amqpscope.pipelines.columns import with_columns
from amqpscope.pipelines.partitioning import CONNECTION
from amqpscope.schemas.events import EVENTS_SCHEMA

AMQP10 = "amqp-1.0"


def _link_attached_before() -> WindowSpec:
    """One endpoint's attaches of one link (its name and role: a link of the same name the other
    way is another link, 2.6.1) on a connection, in order: whether it was attached before."""
    return Window.partitionBy(*CONNECTION, "direction", "name", "role").orderBy("frame_index")


def _kind_columns(kind: EventKind) -> tuple[Column, Column, Column, Column]:
    """(event id, frame condition, condition column, text column) of one event kind."""

    def expression(text: str | None) -> Column:
        return F.expr(text).cast("string") if text is not None else F.lit(None).cast("string")

    return F.lit(kind.id), F.expr(kind.when), expression(kind.condition), expression(kind.text)


def events_timeline(frames: DataFrame, kinds: Sequence[EventKind] | None = None) -> DataFrame:
    """The events table from the frames table: every frame matching an event kind (``kinds``, default
    events.yml), once per kind."""
    kinds = load_events() if kinds is None else tuple(kinds)
    attaches = (F.col("protocol") == AMQP10) & (F.col("method") == "attach")
    # The frames some kind may match, found with every attach taken as attached before: the window
    # that tells then runs over these few rows only (all of a link's attaches among them).
    maybe = F.lit(False)
    for kind in kinds:
        maybe = maybe | F.coalesce(F.expr(kind.when), F.lit(False))
    candidates = frames.withColumn("attached_before", F.lit(True)).filter(maybe).drop("attached_before")
    marked = candidates.withColumn(
        "attached_before",
        attaches
        & (F.count(F.when(attaches, 1)).over(_link_attached_before().rowsBetween(Window.unboundedPreceding, -1)) > 0),
    )
    found = F.array(
        *[
            F.when(condition, F.struct(event_id.alias("event_id"), code.alias("condition"), text.alias("text")))
            for event_id, condition, code, text in map(_kind_columns, kinds)
        ]
    )
    events = with_columns(
        marked.withColumn("_event", F.explode(F.filter(found, lambda e: e.isNotNull()))),
        [
            ("event_id", F.col("_event.event_id")),
            ("condition", F.col("_event.condition")),
            ("text", F.col("_event.text")),
            ("severity", F.lit("info")),
            ("link_name", F.col("name")),
        ],
    )
    return events.select(*[F.col(f.name).cast(f.dataType) for f in EVENTS_SCHEMA.fields])
