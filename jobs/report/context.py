"""Operator context per capture: who talked to whom, with what limits, over which queues, consumers and links.

Everything here is what a RabbitMQ operator checks first in the management UI: products and versions
of the broker and the clients (0-9-1 ``server-properties`` / ``client-properties``, 1.0 ``open``
properties), connection names, virtual host, the negotiated limits, the queues / addresses, the
consumers with their prefetch and the links with their credit window. Aggregated in Spark, one row
per connection, queue, consumer or link. No credential is read: the decoders never keep the SASL
responses nor ``start-ok``'s response, and user names are not shown.
"""

from __future__ import annotations

import pyspark.sql.functions as F
from pyspark.sql import Column, DataFrame

from amqpscope.jobs.report.tables import endpoint
from amqpscope.pipelines.addresses import queue_address


def _json(map_key: str, path: str) -> Column:
    # Composite arguments are kept as JSON text (ingest.rows.text).
    return F.get_json_object(F.col("arguments")[map_key], path)


def _first(value: Column, where: Column) -> Column:
    # The value on the first frame (in capture order) where `where` holds.
    return F.min_by(value, F.when(where & value.isNotNull(), F.col("frame_index")))


def connection_context(frames: DataFrame, connections: DataFrame) -> DataFrame:
    """One row per connection: endpoints, products and versions, name, vhost and negotiated limits.

    0-9-1 limits are the client's ``connection.tune-ok`` (what both sides use); 1.0 limits are
    announced per peer in ``open`` (``client_*``: the client's open, ``broker_*``: the broker's).
    """
    c2s, s2c = F.col("direction") == "c2s", F.col("direction") == "s2c"
    method = F.col("method")
    start, start_ok = method == "connection.start", method == "connection.start-ok"
    open_091, tune_ok, open_10 = method == "connection.open", method == "connection.tune-ok", method == "open"
    per_connection = (
        frames.filter(
            method.isin(
                "connection.start",
                "connection.start-ok",
                "connection.open",
                "connection.tune-ok",
                "open",
                "sasl-init",
                "sasl-mechanisms",
            )
        )
        .groupBy("capture_id", "connection_id")
        .agg(
            F.coalesce(
                _first(_json("server-properties", "$.product"), start),
                _first(_json("properties", "$.product"), open_10 & s2c),
            ).alias("broker_product"),
            F.coalesce(
                _first(_json("server-properties", "$.version"), start),
                _first(_json("properties", "$.version"), open_10 & s2c),
            ).alias("broker_version"),
            F.coalesce(
                _first(_json("server-properties", "$.cluster_name"), start),
                _first(F.col("container_id"), open_10 & s2c),
            ).alias("broker_name"),
            F.coalesce(
                _first(_json("client-properties", "$.product"), start_ok),
                _first(_json("properties", "$.product"), open_10 & c2s),
            ).alias("client_product"),
            F.coalesce(
                _first(_json("client-properties", "$.version"), start_ok),
                _first(_json("properties", "$.version"), open_10 & c2s),
            ).alias("client_version"),
            F.coalesce(
                _first(_json("client-properties", "$.connection_name"), start_ok),
                _first(F.col("container_id"), open_10 & c2s),
            ).alias("connection_name"),
            F.coalesce(
                _first(F.col("arguments")["virtual-host"], open_091), _first(F.col("hostname"), open_10 & c2s)
            ).alias("vhost"),
            F.coalesce(
                _first(F.col("mechanism"), start_ok | (method == "sasl-init")),
                _first(F.col("arguments")["mechanism"], start_ok),
            ).alias("sasl_mechanism"),
            _first(F.col("frame_max"), tune_ok).alias("frame_max"),
            _first(F.col("channel_max").cast("long"), tune_ok).alias("channel_max"),
            _first(F.col("heartbeat").cast("long"), tune_ok).alias("heartbeat_s"),
            _first(F.col("max_frame_size"), open_10 & c2s).alias("client_max_frame_size"),
            _first(F.col("max_frame_size"), open_10 & s2c).alias("broker_max_frame_size"),
            _first(F.col("channel_max").cast("long"), open_10 & c2s).alias("client_channel_max"),
            _first(F.col("channel_max").cast("long"), open_10 & s2c).alias("broker_channel_max"),
            _first(F.col("idle_time_out"), open_10 & c2s).alias("client_idle_time_out_ms"),
            _first(F.col("idle_time_out"), open_10 & s2c).alias("broker_idle_time_out_ms"),
        )
    )
    return connections.select(
        "capture_id",
        "connection_id",
        "protocol",
        "protocol_inferred",
        endpoint("client_address", "client_port").alias("client"),
        endpoint("server_address", "server_port").alias("server"),
        "client_address",
        "client_port",
        "first_ts",
        "last_ts",
        "frames",
    ).join(per_connection, ["capture_id", "connection_id"], "left")


def queue_context(frames: DataFrame, throughput: DataFrame | None) -> DataFrame:
    """One row per queue or address: declared by whom, and messages in (published) and out (delivered).

    Addresses are named as the throughput table names them (``/queues/<q>``, ``/exchanges/<x>/<key>``,
    1.0 link addresses); a queue declared but never used shows with no traffic.
    """
    declared = (
        frames.filter((F.col("method") == "queue.declare-ok") & F.col("queue").isNotNull())
        .select("capture_id", queue_address(F.col("queue")).alias("address"), "connection_id")
        .groupBy("capture_id", "address")
        .agg(F.count_distinct("connection_id").alias("declaring_connections"))
    )
    if throughput is None:
        return declared.select(
            "capture_id",
            "address",
            "declaring_connections",
            *[F.lit(None).cast("long").alias(c) for c in ("messages_in", "bytes_in", "messages_out", "bytes_out")],
        )
    traffic = (
        throughput.filter(F.col("scope") == "address")
        .groupBy("capture_id", "address")
        .agg(
            F.sum(F.when(F.col("direction") == "c2s", F.col("messages"))).alias("messages_in"),
            F.sum(F.when(F.col("direction") == "c2s", F.col("bytes"))).alias("bytes_in"),
            F.sum(F.when(F.col("direction") == "s2c", F.col("messages"))).alias("messages_out"),
            F.sum(F.when(F.col("direction") == "s2c", F.col("bytes"))).alias("bytes_out"),
        )
    )
    return declared.join(traffic, ["capture_id", "address"], "full")


def consumer_context(consumer_unacked: DataFrame) -> DataFrame:
    """One row per 0-9-1 consumer (acking): queue, prefetch, deliveries and the most it held unacked."""
    return consumer_unacked.groupBy("capture_id", "connection_id", "channel", "consumer_tag").agg(
        F.max("queue").alias("queue"),
        F.max("prefetch_count").alias("prefetch_count"),
        F.max("channel_prefetch_count").alias("channel_prefetch_count"),
        F.count(F.when(F.col("method").isin("basic.deliver", "basic.get-ok"), 1)).alias("deliveries"),
        F.max("unacked").alias("max_unacked"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
    )


def link_context(link_state: DataFrame) -> DataFrame:
    """One row per 1.0 link: who sends, its addresses, deliveries, the credit window granted, credit's low."""
    return link_state.groupBy("capture_id", "connection_id", "link_name", "sender_side").agg(
        F.min("channel").alias("channel"),
        F.max("source_address").alias("source_address"),
        F.max("target_address").alias("target_address"),
        F.sum(F.col("is_new_delivery").cast("long")).alias("deliveries"),
        F.max("link_credit_rcv").alias("max_link_credit"),
        F.min("link_credit_snd").alias("min_link_credit_snd"),
        F.max("unsettled").alias("max_unsettled"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
    )
