"""The events table (``schemas.events.EVENTS_SCHEMA``) from the frames table: one row per event.

Each event is a frame matching one of ``EVENTS`` (severity ``info``; nobody broke a rule by it):

- ``amqp10.connection.closed_with_error``, ``amqp10.session.ended_with_error``,
  ``amqp10.link.detached_with_error``: a close / end / detach carrying an error (transport 2.7.9,
  2.7.8, 2.7.7); the condition and description are the peer's (RabbitMQ 3.10 ends a session with
  ``amqp:internal-error`` when a classic queue answers a drain).
- ``amqp091.connection.closed_with_error``, ``amqp091.channel.closed_with_error``: a
  connection.close / channel.close with a reply code of 300 or more (0-9-1 spec 1.2: the codes of
  the soft and hard errors; 200 is reply-success). DOMAIN.md section 6: "an event to report, not a
  violation of the peer that sent it".
- ``amqp10.delivery.aborted``: a transfer with aborted=true (2.7.5: the delivery is discarded).
- ``amqp10.message.undecodable``: a delivery whose message sections the decoder could not read
  (``message-error`` in ``frames.arguments``; e.g. a payload starting mid-section).
- ``amqp10.link.attached_again``: an attach of a link (name and role) its sender had attached
  before on the connection (a link re-established, e.g. by the broker after a queue restart).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.columns import with_columns
from amqpscope.pipelines.partitioning import CONNECTION
from amqpscope.schemas.events import EVENTS_SCHEMA

AMQP091 = "amqp-0-9-1"
AMQP10 = "amqp-1.0"
# 0-9-1 reply codes from 300 up are errors (RabbitMQ's definition: 311 content-too-large, 312 no-route,
# 313 no-consumers, 320 connection-forced, 4xx / 5xx soft and hard errors).
FIRST_ERROR_REPLY_CODE = 300


def _link_attached_before() -> WindowSpec:
    """One endpoint's attaches of one link (its name and role: a link of the same name the other
    way is another link, 2.6.1) on a connection, in order: whether it was attached before."""
    return Window.partitionBy(*CONNECTION, "direction", "name", "role").orderBy("frame_index")


# The event ids, in the order of _events (docs/RULES.md lists them).
EVENT_IDS = (
    "amqp10.connection.closed_with_error", "amqp10.session.ended_with_error", "amqp10.link.detached_with_error",
    "amqp091.connection.closed_with_error", "amqp091.channel.closed_with_error", "amqp10.delivery.aborted",
    "amqp10.message.undecodable", "amqp10.link.attached_again",
)


def _events(is_10: Column, is_091: Column) -> list[tuple[str, Column, Column, Column]]:
    """(event id, frame condition, condition column, text column) of every event kind."""
    method = F.col("method")
    with_error = is_10 & F.col("error_condition").isNotNull()
    reply_error = is_091 & (F.col("reply_code") >= FIRST_ERROR_REPLY_CODE)
    error = (F.col("error_condition"), F.col("error_description"))
    reply = (F.col("reply_code").cast("string"), F.col("reply_text"))
    return [
        ("amqp10.connection.closed_with_error", with_error & (method == "close"), *error),
        ("amqp10.session.ended_with_error", with_error & (method == "end"), *error),
        ("amqp10.link.detached_with_error", with_error & (method == "detach"), *error),
        ("amqp091.connection.closed_with_error", reply_error & (method == "connection.close"), *reply),
        ("amqp091.channel.closed_with_error", reply_error & (method == "channel.close"), *reply),
        ("amqp10.delivery.aborted", is_10 & (method == "transfer") & F.coalesce(F.col("aborted"), F.lit(False)),
         F.lit(None), F.lit(None)),
        ("amqp10.message.undecodable", is_10 & F.col("arguments")["message-error"].isNotNull(),
         F.col("arguments")["message-error"], F.lit(None)),
        ("amqp10.link.attached_again", is_10 & (method == "attach") & F.col("_attached_before"),
         F.lit(None), F.lit(None)),
    ]


def events_timeline(frames: DataFrame) -> DataFrame:
    """The events table from the frames table: every frame matching an event kind, once per kind."""
    is_10, is_091 = F.col("protocol") == AMQP10, F.col("protocol") == AMQP091
    method = F.col("method")
    candidates = frames.filter(
        (is_10 & (method.isin("close", "end", "detach", "attach") | F.col("aborted")
                  | F.col("arguments")["message-error"].isNotNull()))
        | (is_091 & method.isin("connection.close", "channel.close"))
    )
    attaches = is_10 & (method == "attach")
    marked = candidates.withColumn(
        "_attached_before", attaches & (F.count(F.when(attaches, 1)).over(
            _link_attached_before().rowsBetween(Window.unboundedPreceding, -1)) > 0))
    kinds = _events(is_10, is_091)
    found = F.array(*[F.when(condition, F.struct(F.lit(event_id).alias("event_id"), code.cast("string").alias("condition"),
                                                 text.cast("string").alias("text")))
                      for event_id, condition, code, text in kinds])
    events = with_columns(marked.withColumn("_event", F.explode(F.filter(found, lambda e: e.isNotNull()))), [
        ("event_id", F.col("_event.event_id")),
        ("condition", F.col("_event.condition")),
        ("text", F.col("_event.text")),
        ("severity", F.lit("info")),
        ("link_name", F.col("name")),
    ])
    return events.select(*[F.col(f.name).cast(f.dataType) for f in EVENTS_SCHEMA.fields])
