"""The report's queries per capture: who talked to whom, with what limits, over which queues,
consumers and links; frames, violations, quarantined bytes and the byte accounting summed.

Everything here is what a RabbitMQ operator checks first in the management UI: products and versions
of the broker and the clients (0-9-1 ``server-properties`` / ``client-properties``, 1.0 ``open``
properties), connection names, virtual host, the negotiated limits, the queues / addresses, the
consumers with their prefetch and the links with their credit window. Aggregated in Spark, one row
per connection, queue, consumer or link; ``pipelines.report.sections`` ranks them into the report's
gold table. No credential is read: the decoders never keep the SASL responses nor ``start-ok``'s
response, and user names are not shown. Times shown are text in the session's time zone
(``ts_text``); times the charts place are epoch microseconds.
"""

from __future__ import annotations

import pyspark.sql.functions as F
from pyspark.sql import Column, DataFrame, Window

from amqpscope.expectations.catalogue import SEVERITIES
from amqpscope.ingest.reasons import REASONS
from amqpscope.pipelines.addresses import queue_address

_TS_FORMAT = "yyyy-MM-dd HH:mm:ss.SSSSSS"
_TLS_COLUMNS = ("tls_version", "tls_cipher_suite", "tls_sni", "tls_status")


def endpoint(address: str, port: str) -> Column:
    # IPv6 addresses are bracketed so the port stays readable: [::1]:5672.
    host = F.when(F.col(address).contains(":"), F.concat(F.lit("["), F.col(address), F.lit("]")))
    return F.concat(host.otherwise(F.col(address)), F.lit(":"), F.col(port).cast("string"))


def ts_text(column: str) -> Column:
    # Formatted in Spark, in the session time zone, so the page does not depend on the reader's.
    return F.date_format(F.col(column), _TS_FORMAT).alias(column)


def epoch_micros(column: str, name: str) -> Column:
    # A time the charts place on their axis: microseconds since the epoch, whatever the time zone.
    return F.unix_micros(F.col(column)).alias(name)


def connection_summary(connections: DataFrame) -> DataFrame:
    """One row per connection: endpoints, protocol, frames, bytes and bytes the capture missed, and
    for a TLS connection its version, cipher suite, server name and whether it was decrypted."""
    return connections.select(
        "capture_id",
        "connection_id",
        endpoint("client_address", "client_port").alias("client"),
        endpoint("server_address", "server_port").alias("server"),
        "protocol",
        "frames",
        "c2s_bytes",
        "s2c_bytes",
        (F.col("c2s_missing_bytes") + F.col("s2c_missing_bytes")).alias("missing_bytes"),
        ts_text("first_ts"),
        ts_text("last_ts"),
        # A lake written before TLS was decoded has no such columns.
        *[(F.col(c) if c in connections.columns else F.lit(None).cast("string")).alias(c) for c in _TLS_COLUMNS],
    )


def frame_counts(frames: DataFrame) -> DataFrame:
    """Frames and bytes on the wire per capture, protocol, frame type and method."""
    return frames.groupBy("capture_id", "protocol", "frame_type", "method").agg(
        F.count(F.lit(1)).alias("frames"), F.sum("frame_size").alias("bytes")
    )


def severity_rank(column: str) -> Column:
    # Errors first, then warnings, then capture problems; anything else last.
    rank = F.lit(len(SEVERITIES))
    for position, severity in enumerate(SEVERITIES):
        rank = F.when(F.col(column) == severity, F.lit(position)).otherwise(rank)
    return rank


def _packet_number(df: DataFrame) -> Column:
    if "packet_number" in df.columns:
        return F.col("packet_number").cast("long").alias("packet_number")
    return F.lit(None).cast("long").alias("packet_number")


def violation_counts(violations: DataFrame) -> DataFrame:
    """Violations per capture, rule and severity, with the rule's description."""
    return violations.groupBy("capture_id", "rule_id", "severity").agg(
        F.count(F.lit(1)).alias("violations"), F.min("description").alias("description")
    )


def violation_examples(violations: DataFrame, per_rule: int) -> DataFrame:
    """The first `per_rule` violations of each rule in each capture, in capture order.

    ``packet_number`` is null where the violations table has no such column (written before it had one).
    """
    # Orders a rule's violations in time within its capture, to show the earliest ones.
    first_seen = Window.partitionBy("capture_id", "rule_id").orderBy("ts", "connection_id", "frame_index")
    return (
        violations.withColumn("example", F.row_number().over(first_seen))
        .where(F.col("example") <= per_rule)
        .select(
            "capture_id",
            "rule_id",
            "example",
            "connection_id",
            "channel",
            "handle",
            "frame_index",
            _packet_number(violations),
            ts_text("ts"),
            "evidence",
        )
    )


def quarantine_reasons(quarantine: DataFrame) -> DataFrame:
    """One row per capture and cause of quarantined or missing bytes: its reason id with what it
    means (rows stored before reason ids: their sentence), runs, bytes and first packet."""
    meanings = F.create_map(*[F.lit(x) for reason_id, meaning in REASONS.items() for x in (reason_id, meaning)])
    reason_id = F.coalesce(F.col("reason_id"), F.col("reason"))
    return (
        quarantine.withColumn("reason_id", reason_id)
        .groupBy("capture_id", "reason_id", "missing")
        .agg(
            F.count(F.lit(1)).alias("runs"),
            F.sum("byte_count").alias("bytes"),
            F.min("packet_number").alias("first_packet"),
        )
        .withColumn("reason", F.concat_ws(": ", "reason_id", meanings[F.col("reason_id")]))
    )


def accounting_sums(accounting: DataFrame) -> DataFrame:
    """Per capture and direction: the byte accounting's sums (``pipelines.accounting``) and how
    many of its connections do not balance."""
    return accounting.groupBy("capture_id", "direction").agg(
        *[F.sum(c).alias(c) for c in ("payload_bytes", "framed_bytes", "quarantined_bytes", "missing_bytes")],
        F.count(F.when(~F.col("balanced"), 1)).alias("unbalanced"),
    )


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
        epoch_micros("first_ts", "first_us"),
        epoch_micros("last_ts", "last_us"),
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
        F.min(F.unix_micros("ts")).alias("first_us"),
        F.max(F.unix_micros("ts")).alias("last_us"),
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
        F.min(F.unix_micros("ts")).alias("first_us"),
        F.max(F.unix_micros("ts")).alias("last_us"),
    )
