"""Bottleneck findings on connections whose TLS was not decrypted: what TCP alone says.

Without the key log a TLS connection's AMQP is not decoded, but its TCP segments are
(``tcp_segments`` / ``tcp_flow``), so the transport's push-back is still visible (RFC 9293 3.8.6):

| rule id                               | component  | effect              | evidence on the wire                                     |
|---------------------------------------|------------|---------------------|----------------------------------------------------------|
| diagnosis.encrypted.client_not_reading | client    | client_not_reading  | the client's window full or closed while the broker sends |
| diagnosis.encrypted.broker_not_reading | connection | publisher_throttled | the broker's window full or closed while the client sends |

Retransmissions need no AMQP at all: ``bottlenecks.network_findings`` covers every connection's
segments, these included. Which stage of the broker stops reading a client cannot be told without
the frames (DOMAIN.md section 5 needs the publishes and the queues), so the second rule names the
reader process (``connection``), with a lower confidence than the rule that sees the publishes.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.pipelines.bottlenecks import _candidate, _figures, _seconds, _stalls
from amqpscope.pipelines.columns import with_columns

_CONNECTION = ("capture_id", "connection_id")


def _receiver_in_order() -> WindowSpec:
    """One direction's segments in capture order: how long each zero window it advertised lasted."""
    return Window.partitionBy(*_CONNECTION, "direction").orderBy("packet_number")


def _after(window: WindowSpec) -> WindowSpec:
    return window.rowsBetween(1, Window.unboundedFollowing)


def _zero_window_time(tcp_flow: DataFrame, receiver: str) -> DataFrame:
    """Per connection: time the ``receiver`` direction advertised a zero window (from the first zero
    window of a run to the window update ending it, or the connection's last segment)."""
    window = _receiver_in_order()
    own = tcp_flow.filter(F.col("direction") == receiver)  # is_zero_window is never a RST's (tcp_flow)
    marked = with_columns(own, [
        ("_starts", F.col("is_zero_window") & ~F.coalesce(F.lag("is_zero_window").over(window), F.lit(False))),
        ("_reopened_us", F.first(F.when(~F.col("is_zero_window"), F.col("ts_us")), ignorenulls=True).over(_after(window))),
        ("_last_us", F.max("ts_us").over(window.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing))),
    ])
    runs = marked.filter(F.col("_starts")).withColumn(
        "_closed_us", F.coalesce(F.col("_reopened_us"), F.col("_last_us")) - F.col("ts_us"))
    return runs.groupBy(*_CONNECTION).agg(
        F.sum("_closed_us").alias("zero_window_us"),
        F.count(F.lit(1)).alias("zero_windows"),
        F.min("ts").alias("zero_first_ts"),
        F.min("packet_number").alias("zero_first_packet"),
        F.slice(F.array_sort(F.collect_list("packet_number")), 1, 20).alias("zero_packets"),
    )


def _held_sender(tcp_flow: DataFrame, encrypted: DataFrame, sender: str, receiver: str) -> DataFrame:
    """Per encrypted connection: the time ``sender`` met a full or closed window of ``receiver``, and
    the span over which it sent."""
    flow = tcp_flow.join(encrypted, list(_CONNECTION), "left_semi")
    sending = (flow.filter((F.col("direction") == sender) & (F.col("payload_length") > 0))
               .groupBy(*_CONNECTION).agg(F.min("ts_us").alias("_first_us"), F.max("ts_us").alias("_last_us")))
    held = (_stalls(flow, sender).join(_zero_window_time(flow, receiver), list(_CONNECTION), "full")
            .fillna(0, subset=["stalls", "stall_us", "zero_window_us", "zero_windows"]))
    return with_columns(held.join(sending, list(_CONNECTION)), [
        ("held_us", F.col("stall_us") + F.col("zero_window_us")),
        ("start_ts", F.least("stall_first_ts", "zero_first_ts")),
        ("start_packet_number", F.least("stall_first_packet", "zero_first_packet")),
        ("end_ts", F.col("stall_last_ts")),
        ("end_packet_number", F.col("stall_last_packet")),
        ("packet_numbers", F.slice(F.array_sort(F.array_distinct(F.concat(
            F.coalesce(F.col("zero_packets"), F.array().cast("array<long>")),
            F.coalesce(F.col("stall_packets"), F.array().cast("array<long>"))))), 1, 20)),
        ("_share", F.least(F.lit(1.0), F.col("held_us") / F.greatest(F.col("_last_us") - F.col("_first_us"), F.lit(1)))),
    ]).filter(F.col("start_ts").isNotNull())


def _evidence(share: Column) -> Column:
    return _figures(zero_windows=F.col("zero_windows"), zero_window_seconds=_seconds(F.col("zero_window_us")),
                    window_full_stalls=F.col("stalls"), stall_seconds=_seconds(F.col("stall_us")),
                    held_share=F.format_number(share, 3), decoded=F.lit("no: TLS not decrypted"))


def encrypted_connection_findings(tcp_flow: DataFrame, connections: DataFrame, limits: DiagnosisThresholds) -> DataFrame:
    """Findings (the bottleneck candidates' shape) on TLS connections that were not decrypted
    (``connections.protocol`` = tls), from their TCP segments alone."""
    encrypted = connections.filter(F.col("protocol") == "tls").select(*_CONNECTION)
    long_enough = F.col("held_us") >= F.lit(limits.min_held_ms * 1000)
    client = _held_sender(tcp_flow, encrypted, "s2c", "c2s").filter(
        long_enough & (F.col("_share") >= limits.client_window_closed_share))
    broker = _held_sender(tcp_flow, encrypted, "c2s", "s2c").filter(
        long_enough & (F.col("_share") >= limits.publisher_throttled_share))
    common = {"entity_kind": F.lit("connection"), "severity": F.lit("warning"), "duration_us": F.col("held_us"),
              "lifetime_share": F.col("_share"), "evidence": _evidence(F.col("_share"))}
    return _candidate(
        client,
        rule_id=F.lit("diagnosis.encrypted.client_not_reading"),
        component=F.lit("client"),
        effect=F.lit("client_not_reading"),
        confidence=F.least(F.lit(0.9), F.lit(0.5) + F.lit(0.4) * F.col("_share")),
        explanation=F.concat(
            F.lit("The client did not read its socket fast enough: its TCP receive window was full or closed for "),
            _seconds(F.col("held_us")), F.lit(" s ("), F.format_number(F.col("_share") * 100, 0),
            F.lit("% of the time the broker was sending) on this TLS connection, whose AMQP was not decoded "
                  "(give --tls-keylog to see which consumer).")),
        **common,
    ).unionByName(_candidate(
        broker,
        rule_id=F.lit("diagnosis.encrypted.broker_not_reading"),
        component=F.lit("connection"),
        effect=F.lit("publisher_throttled"),
        confidence=F.least(F.lit(0.6), F.lit(0.3) + F.lit(0.3) * F.col("_share")),
        explanation=F.concat(
            F.lit("The broker read this client slower than it sent: the broker's TCP receive window was full or "
                  "closed for "), _seconds(F.col("held_us")), F.lit(" s ("), F.format_number(F.col("_share") * 100, 0),
            F.lit("% of the client's sending time), as when RabbitMQ's reader is held by credit flow or an alarm; "
                  "the AMQP was not decoded (TLS), so which stage and which publisher cannot be told "
                  "(give --tls-keylog).")),
        **common,
    ))
