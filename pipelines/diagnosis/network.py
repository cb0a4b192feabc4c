"""A connection held at its link's capacity: a pure function from the TCP flow table (and the
retransmission measure) to one row per connection that is not on loopback and lost segments, in
the shape of every bottleneck measure (``pipelines.diagnosis.measures``).

A sender the network holds back has data outstanding all the time it sends, and the link passes
its bytes at one rate: a shaper's token bucket or a router's queue forwards a fixed number of bytes
a second and drops what exceeds it, and the peer acknowledges what got through at that rate. So
the rate is read from the peer's acknowledgements (the bytes it acknowledged per bucket of
``bandwidth_bucket_ms``), not from what the sender put on the wire: a capture taken before the
bottleneck sees the sender's bursts above the link's rate and their copies, one taken after it
sees what the link passed, and both see the same acknowledgements. An application pacing itself
below the link's rate waits between its messages with everything acknowledged (its ``busy_share``
is small) and loses nothing at a shaper. The round trip is read from the same acknowledgements:
from a data segment to the first ack of exactly its end (Wireshark's tcp.analysis.ack_rtt for the
segments acknowledged one by one or in pairs).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.pipelines.columns import lower_median, with_columns
from amqpscope.pipelines.diagnosis.figures import CONNECTION, LOOPBACK
from amqpscope.pipelines.held import clipped, first_packets, held_time, timestamp
from amqpscope.pipelines.tcp_pressure import retransmission_recovery


def _sender(flow: DataFrame) -> DataFrame:
    """Per connection: the direction that carried the most payload (the bulk sender)."""
    return (
        flow.groupBy(*CONNECTION, "direction")
        .agg(F.sum("payload_length").alias("_bytes"))
        .groupBy(*CONNECTION)
        .agg(F.max_by("direction", F.struct("_bytes", "direction")).alias("sender"))
    )


def ack_round_trips(flow: DataFrame) -> DataFrame:
    """Per connection and sending direction: the median and smallest round trip from a data segment
    (not a retransmission) to the first acknowledgement of exactly its end from the peer."""
    data = flow.filter((F.col("payload_length") > 0) & ~F.col("is_retransmission")).select(
        *CONNECTION,
        F.col("direction").alias("sender"),
        (F.col("seq_offset") + F.col("payload_length")).alias("_end"),
        F.col("ts_us").alias("_sent_us"),
    )
    acks = flow.filter(F.col("ack_offset").isNotNull()).select(
        *CONNECTION,
        F.when(F.col("direction") == "c2s", F.lit("s2c")).otherwise(F.lit("c2s")).alias("sender"),
        F.col("ack_offset").alias("_end"),
        F.col("ts_us").alias("_acked_us"),
    )
    samples = (
        data.join(acks, [*CONNECTION, "sender", "_end"])
        .filter(F.col("_acked_us") >= F.col("_sent_us"))
        .groupBy(*CONNECTION, "sender", "_end", "_sent_us")
        .agg(F.min(F.col("_acked_us") - F.col("_sent_us")).alias("_rtt"))
    )
    return samples.groupBy(*CONNECTION, "sender").agg(
        lower_median(F.col("_rtt")).alias("ack_rtt_p50_us"),
        F.min("_rtt").alias("ack_rtt_min_us"),
        F.count(F.lit(1)).alias("rtt_samples"),
    )


def _ordered(keys: tuple[str, ...]) -> WindowSpec:
    return Window.partitionBy(*keys).orderBy("ts_us", "packet_number")


def _sending(flow: DataFrame, sender: DataFrame) -> DataFrame:
    """Per segment of each connection, from the bulk sender's first data segment to its last: the
    sender's highest stream offset sent so far (``_sent``), the peer's highest acknowledgement so far
    (``_acked``), the bytes that acknowledgement adds (``_delivered``) and the time to the next
    segment (``_gap_us``)."""
    rows = flow.join(sender, list(CONNECTION))
    mine = F.col("direction") == F.col("sender")
    data = mine & (F.col("payload_length") > 0)
    so_far = _ordered(CONNECTION).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = Window.partitionBy(*CONNECTION)
    rows = with_columns(
        rows,
        [
            ("_sent", F.max(F.when(data, F.col("seq_offset") + F.col("payload_length"))).over(so_far)),
            ("_acked", F.max(F.when(~mine, F.col("ack_offset"))).over(so_far)),
            ("_first_us", F.min(F.when(data, F.col("ts_us"))).over(whole)),
            ("_last_us", F.max(F.when(data, F.col("ts_us"))).over(whole)),
            ("_first_seq", F.min(F.when(data, F.col("seq_offset"))).over(whole)),
            ("_gap_us", F.lead("ts_us").over(_ordered(CONNECTION)) - F.col("ts_us")),
            ("_before", F.lag("_acked").over(_ordered(CONNECTION))),
        ],
    )
    # An acknowledgement delivers what it adds to the one before it, or to the first byte sent.
    added = F.col("_acked") - F.coalesce(F.col("_before"), F.col("_first_seq"))
    return rows.filter(F.col("ts_us").between(F.col("_first_us"), F.col("_last_us"))).withColumn(
        "_delivered", F.greatest(F.coalesce(added, F.lit(0)), F.lit(0))
    )


def bandwidth_limited(
    tcp_flow: DataFrame, retransmission_recovery: DataFrame, limits: DiagnosisThresholds
) -> DataFrame:
    """Per connection not on loopback that lost segments (``retransmission_recovery``), over its bulk
    sender's sending span (first data segment to last): ``busy_share``, the share of that span in
    which the sender had bytes the peer had not acknowledged; the bytes the peer acknowledged in
    each bucket of ``bandwidth_bucket_ms`` (``sending_buckets`` of them, empty ones included); the
    ceiling, the median bucket (as bits per second); ``at_ceiling_share``, the share of buckets
    at ``bandwidth_ceiling_share`` of it or more and at most it over that share (a plateau); the round trip from the
    acks; and the retransmission figures. ``held_us``: the time in buckets at the ceiling."""
    bucket_us = int(limits.bandwidth_bucket_ms * 1000)
    lossy = retransmission_recovery.filter(
        ~F.coalesce(F.col("loopback"), F.lit(True)) & (F.col("lost_segments") > 0)
    ).select(*CONNECTION, "queue", "retransmissions", "lost_segments", "lost_bytes", "packet_numbers")
    flow = tcp_flow.join(F.broadcast(lossy.select(*CONNECTION)), list(CONNECTION), "left_semi")
    sender = _sender(flow)
    sending = _sending(flow, sender).withColumn(
        "_bucket", F.floor((F.col("ts_us") - F.col("_first_us")) / F.lit(bucket_us))
    )
    idle = (F.col("_sent") - F.coalesce(F.col("_acked"), F.lit(0)) <= 0) | F.col("_sent").isNull()
    span = sending.groupBy(*CONNECTION, "sender").agg(
        F.min("_first_us").alias("_low"),
        F.min("_last_us").alias("_high"),
        F.sum(F.when(idle & (F.col("ts_us") < F.col("_last_us")), F.col("_gap_us")).otherwise(0)).alias("_idle_us"),
    )
    every_bucket = span.withColumn(
        "_bucket", F.explode(F.sequence(F.lit(0), F.floor((F.col("_high") - F.col("_low")) / F.lit(bucket_us))))
    ).select(*CONNECTION, "_bucket")
    buckets = every_bucket.join(
        sending.groupBy(*CONNECTION, "_bucket").agg(F.sum("_delivered").alias("_bytes")),
        [*CONNECTION, "_bucket"],
        "left",
    ).withColumn("_bytes", F.coalesce("_bytes", F.lit(0)))
    ceiling = buckets.groupBy(*CONNECTION).agg(lower_median(F.col("_bytes")).alias("_ceiling"))
    share = F.lit(limits.bandwidth_ceiling_share)
    at = (F.col("_bytes") >= F.col("_ceiling") * share) & (F.col("_bytes") * share <= F.col("_ceiling"))
    per = (
        buckets.join(ceiling, list(CONNECTION))
        .groupBy(*CONNECTION)
        .agg(
            F.count(F.lit(1)).alias("sending_buckets"),
            F.sum((at & (F.col("_ceiling") > 0)).cast("long")).alias("_at_ceiling"),
            F.min("_ceiling").alias("_ceiling"),
            F.sum("_bytes").alias("acked_bytes"),
        )
        .join(span, list(CONNECTION))
    )
    seconds = F.lit(bucket_us / 1e6)
    span_us = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
    return (
        per.join(lossy, list(CONNECTION))
        .join(ack_round_trips(flow), [*CONNECTION, "sender"], "left")
        .select(
            *CONNECTION,
            "queue",
            "sender",
            F.when(F.col("sender") == "c2s", F.lit("client-to-broker"))
            .otherwise(F.lit("broker-to-client"))
            .alias("sender_name"),
            "sending_buckets",
            (F.col("_ceiling") * 8 / seconds).alias("ceiling_bits_per_second"),
            (F.col("_ceiling") * 8 / seconds / F.lit(1e6)).alias("ceiling_mbit_per_second"),
            (F.col("_at_ceiling") / F.col("sending_buckets")).alias("at_ceiling_share"),
            (1 - F.col("_idle_us") / span_us).alias("busy_share"),
            "acked_bytes",
            "retransmissions",
            "lost_segments",
            "lost_bytes",
            "ack_rtt_p50_us",
            "ack_rtt_min_us",
            (F.col("_at_ceiling") * F.lit(bucket_us)).alias("held_us"),
            span_us.alias("span_us"),
            timestamp(F.col("_low")).alias("start_ts"),
            timestamp(F.col("_high")).alias("end_ts"),
            F.coalesce(F.try_element_at("packet_numbers", F.lit(1)), F.lit(0)).alias("start_packet_number"),
            F.try_element_at("packet_numbers", F.lit(-1)).alias("end_packet_number"),
            F.coalesce("packet_numbers", F.array().cast("array<long>")).alias("packet_numbers"),
        )
    )


def retransmissions(tcp_flow: DataFrame, connections: DataFrame, connection_queues: DataFrame) -> DataFrame:
    """Per connection with retransmissions: how many were spurious (the receiver had the bytes)
    and the time lost recovering from the others (``pipelines.tcp_pressure``), within the
    connection's life; whether both ends are on loopback (then the host dropped the packets)."""
    counts = (
        tcp_flow.filter(F.col("is_retransmission") & ~F.col("is_keep_alive") & ~F.col("is_zero_window_probe"))
        .groupBy(*CONNECTION)
        .agg(
            F.count(F.lit(1)).alias("retransmissions"),
            F.sum(F.col("is_spurious_retransmission").cast("long")).alias("spurious_retransmissions"),
            F.sum("retransmitted_bytes").alias("retransmitted_bytes"),
        )
    )
    life = tcp_flow.groupBy(*CONNECTION).agg(
        F.min("ts_us").alias("_low"), F.max("ts_us").alias("_high"), F.sum("payload_length").alias("payload_bytes")
    )
    lost = retransmission_recovery(tcp_flow)
    recovered = held_time(clipped(lost.join(life, list(CONNECTION)), F.col("_low"), F.col("_high")), CONNECTION)
    genuine = lost.groupBy(*CONNECTION).agg(
        F.count(F.lit(1)).alias("lost_segments"),
        F.sum("retransmitted_bytes").alias("lost_bytes"),
        first_packets("start_packet_number").alias("packet_numbers"),
    )
    ends = connections.select(
        *CONNECTION,
        "client_address",
        "server_address",
        (
            F.col("client_address").startswith(LOOPBACK[0])
            | F.col("client_address").isin(LOOPBACK[1])
            | F.col("client_address").startswith(LOOPBACK[2])
        ).alias("loopback"),
    )
    span = F.greatest(F.col("_high") - F.col("_low"), F.lit(1))
    return (
        counts.join(life, list(CONNECTION))
        .join(ends, list(CONNECTION), "left")
        .join(recovered, list(CONNECTION), "left")
        .join(genuine, list(CONNECTION), "left")
        .join(connection_queues, list(CONNECTION), "left")
        .fillna(0, subset=["held_us", "lost_segments", "lost_bytes"])
        .select(
            *CONNECTION,
            "queue",
            "retransmissions",
            "spurious_retransmissions",
            "retransmitted_bytes",
            "payload_bytes",
            "lost_segments",
            "lost_bytes",
            "loopback",
            "held_us",
            span.alias("span_us"),
            (F.col("held_us") / span).alias("held_share"),
            timestamp(F.coalesce(F.col("held_start_us"), F.col("_low"))).alias("start_ts"),
            timestamp(F.col("held_end_us")).alias("end_ts"),
            F.try_element_at("packet_numbers", F.lit(1)).alias("start_packet_number"),
            F.try_element_at("packet_numbers", F.lit(-1)).alias("end_packet_number"),
            F.coalesce(F.col("packet_numbers"), F.array().cast("array<long>")).alias("packet_numbers"),
        )
    )
