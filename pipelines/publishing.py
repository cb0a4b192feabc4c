"""What publishers publish and where it goes, from the capture's own frames.

- ``queue_declarations``: each queue the capture declares, with its type and limits from the
  ``queue.declare`` arguments (RabbitMQ's ``x-queue-type`` classic / quorum / stream,
  ``x-queue-mode`` lazy, ``x-max-length``, ``x-max-length-bytes``, ``x-overflow``) and durability.
- ``publish_routes``: every publish with the queue(s) it reaches as far as the capture tells: the
  default exchange routes to the queue named by the routing key; a declared (or built-in)
  exchange through the ``queue.bind`` frames captured, by its type (AMQP 0-9-1 3.1.3; topic
  patterns: ``*`` one word, ``#`` zero or more); an AMQP 1.0 sender's link through its target
  address (``pipelines.addresses``). A publish to an exchange whose bindings the capture does not
  hold has a null queue; one that no captured binding matches has none and is ``unrouted``.
- ``publishing``: per publishing connection, what and where it publishes.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.addresses import queue_of_address

# RabbitMQ's predeclared exchanges, by type (every vhost has them).
_BUILT_IN_EXCHANGES = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}


def _argument(name: str) -> Column:
    """A queue.declare argument (the field table rendered as JSON in frames.arguments)."""
    return F.get_json_object(F.col("arguments")["arguments"], f"$.{name}")


def queue_declarations(frames: DataFrame) -> DataFrame:
    """Per (capture, queue): ``queue_type`` (classic unless x-queue-type says otherwise),
    ``queue_mode``, ``max_length``, ``max_length_bytes``, ``overflow``, ``durable``, from its first
    non-passive queue.declare (a passive one carries no arguments)."""
    declared = frames.filter(
        (F.col("method") == "queue.declare")
        & (F.col("direction") == "c2s")
        & (F.coalesce(F.col("arguments")["passive"], F.lit("false")) != "true")
        & F.col("queue").isNotNull()
        & (F.col("queue") != "")
    )
    return (
        declared.groupBy("capture_id", "queue")
        .agg(
            F.min_by(
                F.struct(
                    F.coalesce(_argument("x-queue-type"), F.lit("classic")).alias("queue_type"),
                    _argument("x-queue-mode").alias("queue_mode"),
                    _argument("x-max-length").cast("long").alias("max_length"),
                    _argument("x-max-length-bytes").cast("long").alias("max_length_bytes"),
                    _argument("x-overflow").alias("overflow"),
                    (F.col("arguments")["durable"] == "true").alias("durable"),
                ),
                F.col("packet_number"),
            ).alias("_declared"),
        )
        .select("capture_id", "queue", "_declared.*")
    )


def _topic_pattern(binding_key: Column) -> Column:
    """A topic binding key as a regular expression: '*' one word, '#' zero or more (AMQP 0-9-1 3.1.3.3)."""
    words = F.regexp_replace(F.regexp_replace(binding_key, r"([.\\^$|?+()\[\]{}])", r"\\$1"), r"\*", "[^.]+")
    return F.concat(F.lit("^"), F.regexp_replace(words, "#", ".*"), F.lit("$"))


def _exchange_types(frames: DataFrame) -> DataFrame:
    declared = frames.filter((F.col("method") == "exchange.declare") & (F.col("direction") == "c2s")).select(
        "capture_id", "exchange", F.col("arguments")["type"].alias("exchange_type")
    )
    captures = frames.select("capture_id").distinct()
    built_in = captures.crossJoin(
        F.broadcast(
            frames.sparkSession.createDataFrame(
                list(_BUILT_IN_EXCHANGES.items()), "exchange string, exchange_type string"
            )
        )
    )
    return (
        declared.unionByName(built_in)
        .groupBy("capture_id", "exchange")
        .agg(F.first("exchange_type", ignorenulls=True).alias("exchange_type"))
    )


def _destinations_091(messages_091: DataFrame, frames: DataFrame) -> DataFrame:
    """Per distinct (exchange, routing key) published to: the queues it reaches (computed once per
    pair, not per publish), ``routing_known`` (the capture holds what routing needs)."""
    pairs = (
        messages_091.filter(F.col("method") == "basic.publish")
        .select(
            "capture_id",
            F.coalesce(F.col("exchange"), F.lit("")).alias("exchange"),
            F.coalesce(F.col("routing_key"), F.lit("")).alias("routing_key"),
        )
        .distinct()
    )
    bindings = (
        frames.filter((F.col("method") == "queue.bind") & (F.col("direction") == "c2s"))
        .select("capture_id", "exchange", "queue", F.coalesce(F.col("routing_key"), F.lit("")).alias("_binding_key"))
        .distinct()
    )
    typed = pairs.join(_exchange_types(frames), ["capture_id", "exchange"], "left")
    matches = (
        (F.col("exchange_type").isin("fanout", "headers"))
        | ((F.col("exchange_type") == "direct") & (F.col("_binding_key") == F.col("routing_key")))
        # Column.rlike takes a literal pattern only; regexp_like the same regex from a column.
        | (
            (F.col("exchange_type") == "topic")
            & F.regexp_like(F.col("routing_key"), _topic_pattern(F.col("_binding_key")))
        )
    )
    bound = (
        typed.filter(F.col("exchange") != "")
        .join(bindings, ["capture_id", "exchange"], "left")
        .groupBy("capture_id", "exchange", "routing_key")
        .agg(
            F.array_sort(F.collect_set(F.when(matches, F.col("queue")))).alias("queues"),
            F.first(F.col("exchange_type").isNotNull(), ignorenulls=True).alias("routing_known"),
        )
    )
    default = typed.filter(F.col("exchange") == "").select(
        "capture_id",
        "exchange",
        "routing_key",
        F.array("routing_key").alias("queues"),
        F.lit(True).alias("routing_known"),
    )
    return bound.unionByName(default)


def publish_routes(messages_091: DataFrame, link_state: DataFrame, frames: DataFrame) -> DataFrame:
    """One row per publish and queue it reaches (``queue`` null when the capture cannot tell, and
    ``unrouted`` true when the capture's bindings route it nowhere): capture_id, connection_id,
    channel, ts, packet-free position (frame_index), body_size, persistent, destination, protocol."""
    published_091 = messages_091.filter(F.col("method") == "basic.publish").select(
        "capture_id",
        "connection_id",
        "channel",
        "ts",
        "frame_index",
        "body_size",
        (F.col("delivery_mode") == 2).alias("persistent"),
        F.coalesce(F.col("exchange"), F.lit("")).alias("exchange"),
        F.coalesce(F.col("routing_key"), F.lit("")).alias("routing_key"),
    )
    routed_091 = published_091.join(
        _destinations_091(messages_091, frames), ["capture_id", "exchange", "routing_key"], "left"
    )
    rows_091 = routed_091.select(
        "capture_id",
        "connection_id",
        "channel",
        "ts",
        "frame_index",
        "body_size",
        "persistent",
        F.concat_ws("/", "exchange", "routing_key").alias("destination"),
        F.explode_outer(
            F.when(F.coalesce(F.col("routing_known"), F.lit(False)) & (F.size("queues") > 0), F.col("queues"))
            .when(F.coalesce(F.col("routing_known"), F.lit(False)), F.array().cast("array<string>"))
            .otherwise(F.array(F.lit(None).cast("string")))
        ).alias("queue"),
        (F.coalesce(F.col("routing_known"), F.lit(False)) & (F.size("queues") == 0)).alias("unrouted"),
        F.lit("amqp-0-9-1").alias("protocol"),
    )
    # AMQP 1.0: a client's sending link delivers to its target address.
    sent_10 = link_state.filter(
        (F.col("method") == "transfer") & (F.col("sender_side") == "client") & F.col("is_new_delivery")
    )
    rows_10 = sent_10.select(
        "capture_id",
        "connection_id",
        "channel",
        "ts",
        "frame_index",
        F.col("payload_size").alias("body_size"),
        F.lit(None).cast("boolean").alias("persistent"),
        F.coalesce(F.col("target_address"), F.lit("")).alias("destination"),
        queue_of_address(F.col("target_address")).alias("queue"),
        F.lit(False).alias("unrouted"),
        F.lit("amqp-1.0").alias("protocol"),
    )
    return rows_091.unionByName(rows_10)


def publishing(routes: DataFrame, declarations: DataFrame) -> DataFrame:
    """Per publishing connection: ``publishes``, ``publish_first_ts`` / ``publish_last_ts``,
    ``body_size_p50``, ``persistent_share``, ``unrouted_share``, ``publish_channels``,
    ``destinations``, ``queues`` (those its publishes reach) and what the capture declared of them:
    ``queue_types`` (e.g. quorum), ``lazy_queues``, ``bounded_queues`` (x-max-length set)."""
    per_publish = routes.groupBy("capture_id", "connection_id", "frame_index").agg(
        F.first("channel").alias("channel"),
        F.first("ts").alias("ts"),
        F.first("body_size").alias("body_size"),
        F.first("persistent").alias("persistent"),
        F.first("destination").alias("destination"),
        F.max("unrouted").alias("unrouted"),
        F.first("protocol").alias("protocol"),
    )
    stats = per_publish.groupBy("capture_id", "connection_id").agg(
        F.count(F.lit(1)).alias("publishes"),
        F.min("ts").alias("publish_first_ts"),
        F.max("ts").alias("publish_last_ts"),
        F.percentile_approx("body_size", 0.5).alias("body_size_p50"),
        F.avg(F.coalesce(F.col("persistent"), F.lit(False)).cast("double")).alias("persistent_share"),
        F.avg(F.col("unrouted").cast("double")).alias("unrouted_share"),
        F.array_sort(F.collect_set("channel")).alias("publish_channels"),
        F.array_sort(F.collect_set("destination")).alias("destinations"),
        F.first("protocol").alias("protocol"),
    )
    reached = (
        routes.filter(F.col("queue").isNotNull())
        .groupBy("capture_id", "connection_id", "queue")
        .agg(F.count(F.lit(1)).alias("_messages"))
        .join(declarations, ["capture_id", "queue"], "left")
    )
    queues = reached.groupBy("capture_id", "connection_id").agg(
        # The queue it publishes most to first.
        F.transform(
            F.array_sort(F.collect_list(F.struct((-F.col("_messages")).alias("_n"), F.col("queue").alias("q")))),
            lambda s: s["q"],
        ).alias("queues"),
        F.array_sort(F.collect_set(F.col("queue_type"))).alias("queue_types"),
        F.array_sort(F.collect_set(F.when(F.col("queue_mode") == "lazy", F.col("queue")))).alias("lazy_queues"),
        F.array_sort(
            F.collect_set(
                F.when(F.col("max_length").isNotNull() | F.col("max_length_bytes").isNotNull(), F.col("queue"))
            )
        ).alias("bounded_queues"),
    )
    return stats.join(queues, ["capture_id", "connection_id"], "left")
