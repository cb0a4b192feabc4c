"""diagnosis: one row per capture, the headline an operator reads first and the ranked findings.

The headline is the top-ranked bottleneck of ``bottlenecks`` (``pipelines.diagnosis.findings``), or "none"
for a capture in which nothing held traffic back for long enough to matter; a "none" says what was
measured (connections, messages published and delivered, consumers) and claims nothing more. The
problems found beside the verdict (findings of kind problem: returns, refused publishes, churn ...)
follow it, by rank, with their severity and component. A capture whose TLS
connections were not decrypted says so in its headline, and is ``encrypted`` when nothing else could
be judged: no AMQP decoded, no finding (its TCP-level findings still count: the
``diagnosis.encrypted.*`` rules of expectations/bottlenecks.yml).
A capture in which no AMQP connection was decoded, and none was encrypted, has nothing to judge:
``no_amqp``, and a headline that says what the capture holds instead (its packets, its TCP
connections on other ports), never "No bottleneck".
What could not be judged is listed (``not_judged``) and named at the end of the headline: the room
in the TCP windows of connections begun before the capture, and the credit of AMQP 1.0 links
attached before it whose sending half no receiving half pairs with (``link_credit.unbound_senders``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from amqpscope.pipelines.link_credit import unbound_senders
from amqpscope.pipelines.tcp_pressure import unjudged_windows
from amqpscope.schemas.diagnosis import DIAGNOSIS_SCHEMA, ENCRYPTED, FINDING_SUMMARY, NO_AMQP, Component

# Protocols of a decoded AMQP connection (connections.protocol; "tls" and "not-amqp" are not).
AMQP_PROTOCOLS = ("amqp-0-9-1", "amqp-1.0")
NO_AMQP_PREFIX = "No AMQP traffic found: "
NO_PACKETS = f"{NO_AMQP_PREFIX}the capture has no packets."

# What a "none" claims: the rules looked and none found traffic held back; never that something the
# capture may show (a slow consumer, a return) is absent: problems are named after it.
_NONE_FOUND = "none of the diagnosis's rules found traffic held back long enough to matter"
# Problems named in the headline, by rank; the rest are counted.
_PROBLEMS_NAMED = 3


def _when_text() -> Column:
    """ "at 20:59:45.388 (packet 52) for 1.305 s" of the top finding."""
    return F.concat(
        F.lit("from "),
        F.date_format(F.col("start_ts"), "HH:mm:ss.SSS"),
        F.lit(" UTC (packet "),
        F.col("start_packet_number").cast("string"),
        F.lit(") for "),
        F.format_number(F.col("duration_us") / F.lit(1e6), 3),
        F.lit(" s"),
    )


def _headline() -> Column:
    return F.concat(
        F.lit("Bottleneck: "),
        F.regexp_replace(F.col("component"), "_", " "),
        F.lit(" ("),
        F.regexp_replace(F.col("effect"), "_", " "),
        F.lit(") on "),
        F.col("entity_kind"),
        F.lit(" "),
        F.col("entity"),
        F.coalesce(F.concat(F.lit(" (queue "), F.col("queue"), F.lit(")")), F.lit("")),
        F.lit(", "),
        _when_text(),
        F.lit(". "),
        F.col("explanation"),
    )


def _encrypted(connections: DataFrame) -> DataFrame:
    """Per capture: TLS connections not decrypted, their TLS versions, the AMQP connections decoded and
    the connections the table has (those on the AMQP ports)."""
    versions = F.array_sort(F.collect_set(F.when(F.col("protocol") == "tls", F.col("tls_version"))))
    return connections.groupBy("capture_id").agg(
        F.count(F.when(F.col("protocol") == "tls", 1)).cast("int").alias("encrypted_connections"),
        F.count(F.when(F.col("protocol").isin(*AMQP_PROTOCOLS), 1)).alias("_amqp"),
        F.count(F.lit(1)).alias("_port_connections"),
        F.count(F.when((F.col("protocol") == "tls") & F.col("tls_version").isNull(), 1)).alias("_unknown"),
        versions.alias("_versions"),
    )


def _encrypted_sentence() -> Column:
    """ "2 connections are encrypted (TLS 1.3) and were not decoded: give --tls-keylog"."""
    many = F.col("encrypted_connections") > 1
    versions = F.array_join(
        F.when(
            F.col("_unknown") > 0, F.array_union(F.col("_versions"), F.array(F.lit("TLS version not seen")))
        ).otherwise(F.col("_versions")),
        " and ",
    )
    return F.concat(
        F.col("encrypted_connections").cast("string"),
        F.when(many, F.lit(" connections are")).otherwise(F.lit(" connection is")),
        F.lit(" encrypted ("),
        versions,
        F.lit(")"),
        F.when(many, F.lit(" and were")).otherwise(F.lit(" and was")),
        F.lit(" not decoded: give --tls-keylog"),
    )


def _counted(n: Column, one: str, many: str) -> Column:
    """ "1 TCP connection", "3 TCP connections"."""
    return F.concat(F.format_number(n, 0), F.lit(" "), F.when(n == 1, F.lit(one)).otherwise(F.lit(many)))


def _no_amqp_headline(packets: Column, tcp_connections: Column, port_connections: Column) -> Column:
    """ "No AMQP traffic found: 200 packets, 3 TCP connections on other ports; try --ports." The
    connections on the AMQP ports are those the connections table has (not AMQP: TLS, other bytes)."""
    others = F.greatest(tcp_connections - port_connections, F.lit(0))
    return F.when(packets == 0, F.lit(NO_PACKETS)).otherwise(
        F.concat(
            F.lit(NO_AMQP_PREFIX),
            _counted(packets, "packet", "packets"),
            F.when(
                tcp_connections.isNotNull(),
                F.concat(F.lit(", "), _counted(others, "TCP connection", "TCP connections"), F.lit(" on other ports")),
            ).otherwise(F.lit("")),
            F.when(
                port_connections > 0,
                F.concat(
                    F.lit(", "),
                    _counted(port_connections, "connection", "connections"),
                    F.lit(" on the AMQP ports not AMQP (see connections.protocol)"),
                ),
            ).otherwise(F.lit("")),
            F.lit("; try --ports."),
        )
    )


def _problems_sentence(count: Column, problems: Column) -> Column:
    """ "Also found 2 problems: (warning, channel) <its sentence> (info, consumer) <its sentence>": the
    findings of kind problem in rank order (warnings first), the first _PROBLEMS_NAMED of them named
    with their severity and component, the rest counted."""
    named = F.transform(
        F.slice(problems, 1, _PROBLEMS_NAMED),
        lambda p: F.concat(F.lit("("), p["severity"], F.lit(", "), p["component"], F.lit(") "), p["explanation"]),
    )
    more = count - F.lit(_PROBLEMS_NAMED)
    return F.concat(
        F.lit("Also found "),
        _counted(count, "problem", "problems"),
        F.lit(": "),
        F.array_join(named, " "),
        F.when(
            more > 0, F.concat(F.lit(" And "), _counted(more, "more problem", "more problems"), F.lit("."))
        ).otherwise(F.lit("")),
    )


def measured(frames: DataFrame, connections: DataFrame | None = None) -> DataFrame:
    """Per capture, what a "none" headline says was measured: the AMQP connections, the messages
    published (0-9-1 basic.publish, 1.0 transfers from the client that end a delivery) and delivered
    (basic.deliver, basic.get-ok, 1.0 transfers from the broker), and the consumers: the 0-9-1
    consumer tags the broker confirmed (basic.consume-ok) or delivered to, and the links the broker
    sends on (its attach as sender, or its transfers), so that a consumer begun before the capture
    is counted by its deliveries."""
    last = ~F.coalesce(F.col("more"), F.lit(False))
    amqp10 = F.col("protocol") == "amqp-1.0"
    transfer = amqp10 & (F.col("method") == "transfer") & last
    c2s, s2c = F.col("direction") == "c2s", F.col("direction") == "s2c"
    published = ((F.col("method") == "basic.publish") & c2s) | (transfer & c2s)
    delivered = (F.col("method").isin("basic.deliver", "basic.get-ok") & s2c) | (transfer & s2c)
    consumer = F.when(
        F.col("method").isin("basic.consume-ok", "basic.deliver") & s2c,
        F.concat_ws("/", F.col("connection_id"), F.col("channel").cast("string"), F.lit("tag"), F.col("consumer_tag")),
    ).when(
        amqp10
        & s2c
        & ((F.col("method") == "transfer") | ((F.col("method") == "attach") & (F.col("role") == "sender"))),
        F.concat_ws(
            "/",
            F.col("connection_id"),
            F.col("channel").cast("string"),
            F.lit("handle"),
            F.col("handle").cast("string"),
        ),
    )
    counted = frames.groupBy("capture_id").agg(
        F.countDistinct("connection_id").alias("_connections"),
        F.count(F.when(published, 1)).alias("_published"),
        F.count(F.when(delivered, 1)).alias("_delivered"),
        F.countDistinct(consumer).alias("_consumers"),
    )
    if connections is not None:
        amqp = connections.filter(F.col("protocol").isin(*AMQP_PROTOCOLS)).groupBy("capture_id").count()
        counted = counted.join(amqp, "capture_id", "left").select(
            "capture_id",
            F.coalesce(F.col("count"), F.col("_connections")).alias("_connections"),
            "_published",
            "_delivered",
            "_consumers",
        )
    return counted


def _measured_sentence() -> Column:
    """ "3 AMQP connections, 1,200 messages published, 1,150 delivered to 2 consumers" (null
    without the counts)."""
    return F.when(
        F.col("_connections").isNotNull(),
        F.concat(
            _counted(F.col("_connections"), "AMQP connection", "AMQP connections"),
            F.lit(", "),
            _counted(F.col("_published"), "message", "messages"),
            F.lit(" published, "),
            F.format_number(F.col("_delivered"), 0),
            F.lit(" delivered to "),
            _counted(F.col("_consumers"), "consumer", "consumers"),
        ),
    )


def _none_headline(prefix: str) -> Column:
    """ "No bottleneck: 3 AMQP connections, ...; none of the diagnosis's rules found traffic held back
    long enough to matter." (without the counts, the rules' part alone)."""
    return F.concat(
        F.lit(prefix),
        F.coalesce(F.concat(_measured_sentence(), F.lit("; ")), F.lit("")),
        F.lit(_NONE_FOUND),
    )


def _unbound_links(frames: DataFrame) -> DataFrame:
    """Per capture: the AMQP 1.0 links attached before the capture whose sending half could not be
    paired with its receiving half (``_links``, ``link_credit.unbound_senders``): their credit is
    not in it."""
    return unbound_senders(frames).groupBy("capture_id").agg(F.count(F.lit(1)).alias("_links"))


def _not_judged(tcp_flow: DataFrame, frames: DataFrame | None) -> DataFrame:
    """Per capture: the measures that could not be judged and why (``not_judged``), and the sentence
    the headline ends with. The room in a TCP window is not judged on a connection whose handshake
    is before the capture (its window scale is unknown: ``tcp_pressure.unjudged_windows``); the
    credit of an AMQP 1.0 link attached before the capture is not judged (``_unbound_links``)."""
    counted = unjudged_windows(tcp_flow).groupBy("capture_id").agg(F.count(F.lit(1)).alias("_n"))
    if frames is not None:
        counted = counted.join(_unbound_links(frames), "capture_id", "full")
    else:
        counted = counted.withColumn("_links", F.lit(None).cast("long"))
    connections = _counted(F.col("_n"), "connection", "connections")
    links = _counted(F.col("_links"), "AMQP 1.0 link", "AMQP 1.0 links")
    windows = F.coalesce(F.col("_n") > 0, F.lit(False))
    credit = F.coalesce(F.col("_links") > 0, F.lit(False))
    window_reason = F.concat(
        F.lit("TCP window room on "),
        connections,
        F.lit(" begun before the capture (window scale not in it; zero windows judged)"),
    )
    credit_reason = F.concat(F.lit("link credit of "), links, F.lit(" attached before the capture"))
    reasons = (
        F.when(windows & credit, F.array(window_reason, credit_reason))
        .when(windows, F.array(window_reason))
        .otherwise(F.array(credit_reason))
    )
    parts = F.concat_ws(
        "; ",
        F.when(
            windows,
            F.concat(
                F.lit("whether a TCP window held a sender back on "),
                connections,
                F.lit(" begun before the capture, whose window scale it does not show"),
            ),
        ),
        F.when(
            credit,
            F.concat(
                F.lit("whether link credit held back "),
                links,
                F.lit(" attached before the capture, whose attach and first credit it does not show"),
            ),
        ),
    )
    sentence = F.concat(F.lit("Not judged: "), parts, F.lit("."))
    return counted.filter(windows | credit).select(
        "capture_id", reasons.alias("not_judged"), sentence.alias("_not_judged")
    )


def no_packets_diagnosis(capture_id: str) -> dict[str, object]:
    """The diagnosis row of a capture without a single packet (answered before Spark starts)."""
    row: dict[str, object] = {name: None for name in DIAGNOSIS_SCHEMA.fieldNames()}
    row.update(
        capture_id=capture_id,
        bottleneck=NO_AMQP,
        headline=NO_PACKETS,
        findings_count=0,
        findings=[],
        encrypted_connections=0,
        problems_count=0,
    )
    return row


def diagnosis(
    bottlenecks: DataFrame,
    captures: DataFrame,
    connections: DataFrame | None = None,
    tcp_flow: DataFrame | None = None,
    frames: DataFrame | None = None,
) -> DataFrame:
    """The diagnosis table (``schemas.diagnosis.DIAGNOSIS_SCHEMA``): every capture of ``captures``,
    with its top bottleneck as the headline ("none" when it has none), the problems found beside it
    after it. With ``connections``, TLS connections that were not decrypted are counted and named in
    the headline, a capture of nothing else with no finding is ``encrypted``, and a capture with no
    AMQP connection decoded and none encrypted is ``no_amqp``. With ``frames``, a "none" headline says
    what was measured (``measured``)."""
    summary = F.struct(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in FINDING_SUMMARY.fields])
    ranked = bottlenecks.groupBy("capture_id").agg(
        F.array_sort(F.collect_list(summary)).alias("findings"),  # rank is the struct's first field
        F.count(F.when(F.col("kind") == "problem", 1)).cast("int").alias("problems_count"),
        F.array_sort(F.collect_list(F.when(F.col("kind") == "problem", summary))).alias("_problems"),
    )
    # Bottlenecks rank before problems, so rank 1 is the verdict when the capture has a bottleneck.
    top = bottlenecks.filter((F.col("rank") == 1) & (F.col("kind") == "bottleneck")).select(
        "capture_id",
        F.col("component").alias("bottleneck"),
        "effect",
        "entity_kind",
        "entity",
        "connection_id",
        "start_packet_number",
        _headline().alias("headline"),
    )
    every = captures.select("capture_id", "packets", "tcp_connections").dropDuplicates(["capture_id"])
    joined = every.join(top, "capture_id", "left").join(ranked, "capture_id", "left")
    if connections is not None:
        joined = joined.join(_encrypted(connections), "capture_id", "left")
    else:
        joined = joined.select(
            "*",
            F.lit(0).alias("encrypted_connections"),
            F.lit(0).alias("_amqp"),
            F.lit(None).cast("long").alias("_port_connections"),
            F.lit(0).alias("_unknown"),
            F.array().cast("array<string>").alias("_versions"),
        )
    if tcp_flow is not None:
        joined = joined.join(_not_judged(tcp_flow, frames), "capture_id", "left")
    else:
        joined = joined.select("*", F.lit(None).alias("not_judged"), F.lit(None).cast("string").alias("_not_judged"))
    if frames is not None:
        joined = joined.join(measured(frames, connections), "capture_id", "left")
    else:
        joined = joined.select(
            "*",
            *[F.lit(None).cast("long").alias(c) for c in ("_connections", "_published", "_delivered", "_consumers")],
        )
    encrypted = F.coalesce(F.col("encrypted_connections"), F.lit(0)) > 0
    nothing_else = encrypted & (F.coalesce(F.col("_amqp"), F.lit(0)) == 0) & F.col("bottleneck").isNull()
    # Nothing decoded as AMQP and nothing encrypted: no verdict at all (never "none").
    no_amqp = F.lit(connections is not None) & ~encrypted & (F.coalesce(F.col("_amqp"), F.lit(0)) == 0)
    sentence = F.concat(_encrypted_sentence(), F.lit("."))
    headline = (
        F.when(
            nothing_else,
            F.concat(sentence, F.lit(" No AMQP was decoded, and TCP showed no finding: nothing else could be judged.")),
        )
        .when(
            no_amqp,
            _no_amqp_headline(
                F.col("packets"), F.col("tcp_connections"), F.coalesce(F.col("_port_connections"), F.lit(0))
            ),
        )
        .when(
            encrypted & F.col("headline").isNull(),
            F.concat(_none_headline("No bottleneck in the decoded traffic: "), F.lit("; "), sentence),
        )
        .when(encrypted, F.concat(F.col("headline"), F.lit(" "), sentence))
        .otherwise(F.coalesce(F.col("headline"), F.concat(_none_headline("No bottleneck: "), F.lit("."))))
    )
    headline = F.when(
        F.coalesce(F.col("problems_count"), F.lit(0)) > 0,
        F.concat(headline, F.lit(" "), _problems_sentence(F.col("problems_count"), F.col("_problems"))),
    ).otherwise(headline)
    headline = F.when(
        F.col("_not_judged").isNotNull() & ~nothing_else & ~no_amqp,
        F.concat(headline, F.lit(" "), F.col("_not_judged")),
    ).otherwise(headline)
    empty = F.array().cast(DIAGNOSIS_SCHEMA["findings"].dataType)
    return joined.select(
        "capture_id",
        F.when(nothing_else, F.lit(ENCRYPTED))
        .when(no_amqp, F.lit(NO_AMQP))
        .otherwise(F.coalesce(F.col("bottleneck"), F.lit(Component.NONE.value)))
        .alias("bottleneck"),
        "effect",
        "entity_kind",
        "entity",
        "connection_id",
        "start_packet_number",
        headline.alias("headline"),
        F.when(F.col("findings").isNull(), F.lit(0)).otherwise(F.size("findings")).alias("findings_count"),
        F.coalesce(F.col("findings"), empty).alias("findings"),
        F.coalesce(F.col("encrypted_connections"), F.lit(0)).alias("encrypted_connections"),
        F.coalesce(F.col("problems_count"), F.lit(0)).alias("problems_count"),
        F.coalesce(F.col("not_judged"), F.array().cast("array<string>")).alias("not_judged"),
    ).select(*[F.col(f.name).cast(f.dataType) for f in DIAGNOSIS_SCHEMA.fields])
