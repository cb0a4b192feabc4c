"""A connection held at its link's capacity: a pure function from the TCP flow table (and the
retransmission measure) to one row per connection that is not on loopback and lost segments, in
the shape of every bottleneck measure (``pipelines.bottleneck_measures``).

A sender the network holds back sends at the bottleneck link's rate for as long as it has data:
its throughput, in buckets of ``bandwidth_bucket_ms``, stays near one ceiling, and what exceeds
the rate is dropped at the bottleneck (a shaper's token bucket, a router's full queue) and sent
again. A sender the application paces has no such plateau and no loss. The round trip is read
from the peer's acknowledgements: from a data segment to the first ack of exactly its end
(Wireshark's tcp.analysis.ack_rtt for the segments acknowledged one by one or in pairs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from amqpscope.pipelines.held import timestamp

if TYPE_CHECKING:
    from amqpscope.pipelines.bottleneck_measures import Measures

_CONNECTION = ("capture_id", "connection_id")


def _sender(flow: DataFrame) -> DataFrame:
    """Per connection: the direction that carried the most payload (the bulk sender)."""
    return (
        flow.groupBy(*_CONNECTION, "direction")
        .agg(F.sum("payload_length").alias("_bytes"))
        .groupBy(*_CONNECTION)
        .agg(F.max_by("direction", F.struct("_bytes", "direction")).alias("sender"))
    )


def ack_round_trips(flow: DataFrame) -> DataFrame:
    """Per connection and sending direction: the median and smallest round trip from a data segment
    (not a retransmission) to the first acknowledgement of exactly its end from the peer."""
    data = flow.filter((F.col("payload_length") > 0) & ~F.col("is_retransmission")).select(
        *_CONNECTION,
        F.col("direction").alias("sender"),
        (F.col("seq_offset") + F.col("payload_length")).alias("_end"),
        F.col("ts_us").alias("_sent_us"),
    )
    acks = flow.filter(F.col("ack_offset").isNotNull()).select(
        *_CONNECTION,
        F.when(F.col("direction") == "c2s", F.lit("s2c")).otherwise(F.lit("c2s")).alias("sender"),
        F.col("ack_offset").alias("_end"),
        F.col("ts_us").alias("_acked_us"),
    )
    samples = (
        data.join(acks, [*_CONNECTION, "sender", "_end"])
        .filter(F.col("_acked_us") >= F.col("_sent_us"))
        .groupBy(*_CONNECTION, "sender", "_end", "_sent_us")
        .agg(F.min(F.col("_acked_us") - F.col("_sent_us")).alias("_rtt"))
    )
    return samples.groupBy(*_CONNECTION, "sender").agg(
        F.percentile_approx("_rtt", 0.5).alias("ack_rtt_p50_us"),
        F.min("_rtt").alias("ack_rtt_min_us"),
        F.count(F.lit(1)).alias("rtt_samples"),
    )


def bandwidth_limited(m: Measures) -> DataFrame:
    """Per connection not on loopback that lost segments (``retransmission_recovery``): its bulk
    sender's payload bytes per bucket of ``bandwidth_bucket_ms`` while sending (buckets with
    payload), the ceiling (the 90th percentile bucket, as bits per second), the share of those
    buckets at ``bandwidth_ceiling_share`` of it or more, the round trip from the acks, and the
    retransmission figures. ``held_us``: the time in buckets at the ceiling."""
    bucket_us = int(m.limits.bandwidth_bucket_ms * 1000)
    lossy = (
        m.measure("retransmission_recovery")
        .filter(~F.coalesce(F.col("loopback"), F.lit(True)) & (F.col("lost_segments") > 0))
        .select(*_CONNECTION, "queue", "retransmissions", "lost_segments", "lost_bytes", "packet_numbers")
    )
    flow = m.tables.tcp_flow.join(F.broadcast(lossy.select(*_CONNECTION)), list(_CONNECTION), "left_semi")
    sender = _sender(flow)
    sent = flow.join(sender, list(_CONNECTION)).filter(
        (F.col("direction") == F.col("sender")) & (F.col("payload_length") > 0)
    )
    start = Window.partitionBy(*_CONNECTION)
    buckets = (
        sent.withColumn("_bucket", F.floor((F.col("ts_us") - F.min("ts_us").over(start)) / F.lit(bucket_us)))
        .groupBy(*_CONNECTION, "sender", "_bucket")
        .agg(F.sum("payload_length").alias("_bytes"), F.min("ts_us").alias("_from"))
    )
    ceiling = buckets.groupBy(*_CONNECTION).agg(F.percentile_approx("_bytes", 0.9).alias("_ceiling"))
    at = F.col("_bytes") >= F.col("_ceiling") * F.lit(m.limits.bandwidth_ceiling_share)
    per = (
        buckets.join(ceiling, list(_CONNECTION))
        .groupBy(*_CONNECTION, "sender")
        .agg(
            F.count(F.lit(1)).alias("sending_buckets"),
            F.sum(at.cast("long")).alias("_at_ceiling"),
            F.min("_ceiling").alias("_ceiling"),
            F.sum("_bytes").alias("sent_bytes"),
            F.min("_from").alias("_low"),
            F.max("_from").alias("_high"),
        )
    )
    seconds = F.lit(bucket_us / 1e6)
    return (
        per.join(lossy, list(_CONNECTION))
        .join(ack_round_trips(flow), [*_CONNECTION, "sender"], "left")
        .select(
            *_CONNECTION,
            "queue",
            "sender",
            F.when(F.col("sender") == "c2s", F.lit("client-to-broker"))
            .otherwise(F.lit("broker-to-client"))
            .alias("sender_name"),
            "sending_buckets",
            (F.col("_ceiling") * 8 / seconds).alias("ceiling_bits_per_second"),
            (F.col("_ceiling") * 8 / seconds / F.lit(1e6)).alias("ceiling_mbit_per_second"),
            (F.col("_at_ceiling") / F.col("sending_buckets")).alias("at_ceiling_share"),
            "sent_bytes",
            "retransmissions",
            "lost_segments",
            "lost_bytes",
            "ack_rtt_p50_us",
            "ack_rtt_min_us",
            (F.col("_at_ceiling") * F.lit(bucket_us)).alias("held_us"),
            (F.col("sending_buckets") * F.lit(bucket_us)).alias("span_us"),
            timestamp(F.col("_low")).alias("start_ts"),
            timestamp(F.col("_high") + F.lit(bucket_us)).alias("end_ts"),
            F.coalesce(F.try_element_at("packet_numbers", F.lit(1)), F.lit(0)).alias("start_packet_number"),
            F.try_element_at("packet_numbers", F.lit(-1)).alias("end_packet_number"),
            F.coalesce("packet_numbers", F.array().cast("array<long>")).alias("packet_numbers"),
        )
    )
