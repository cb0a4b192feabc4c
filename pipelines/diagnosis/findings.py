"""The findings: what held traffic back, where, since when and why, inferred from the wire alone.

One small engine runs the rule catalogue (expectations/bottlenecks.yml, docs/DIAGNOSIS.md): each
rule reads a measure (``pipelines.diagnosis.measures``), keeps the rows its test holds for and
turns them into findings: the component and effect, a confidence, the evidence figures, one
sentence. ``bottleneck_findings`` unions every rule's findings, names each entity as an operator
knows it, writes its Wireshark filter and ranks the findings per capture. RabbitMQ's internal
states are invisible in a capture: a finding shows the figures it rests on, and its confidence
says how directly the wire shows the cause.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.expectations.bottleneck_rules import PARENT, BottleneckRule, Template, Value, bind, load_bottleneck_rules
from amqpscope.pipelines import partitioning
from amqpscope.pipelines.columns import union_all, with_columns
from amqpscope.pipelines.diagnosis.measures import MEASURE_PROTOCOL, MEASURES, Inputs, Tables
from amqpscope.pipelines.shape import in_schema
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA

# Columns a rule fills; naming, ranking, the filter and the id are added once for all rules.
_ADDED_LATER = ("rank", "finding_id", "connection_name", "client", "wireshark_filter")
# ... and what the engine needs of a rule's rows until then: its priority, and a field filter
# naming the listed packets with how many packets it names.
_CANDIDATE = StructType(
    [f for f in BOTTLENECKS_SCHEMA.fields if f.name not in _ADDED_LATER]
    + [
        StructField("priority", IntegerType(), False),
        StructField("packet_filter", StringType(), True),
        StructField("packet_count", LongType(), True),
    ]
)

# How each unit is written as text (evidence and sentences): plain decimals, no grouping.
_DECIMALS = {
    "seconds": ("%.3f", 1e6),
    "ms": ("%.1f", 1e3),
    "share": ("%.3f", 1.0),
    "percent": ("%.0f", 0.01),
    "rate": ("%.1f", 1.0),
}


def formatted(value: Value) -> Column:
    """A measure column as text in its unit (null stays null)."""
    column = F.col(value.column)
    if value.unit in _DECIMALS:
        pattern, per = _DECIMALS[value.unit]
        return F.when(column.isNotNull(), F.format_string(pattern, column.cast("double") / F.lit(per)))
    if value.unit in ("count", "bytes"):
        return F.round(column).cast("long").cast("string")
    if value.unit == "flag":
        return F.when(column.isNotNull(), F.when(column.cast("boolean"), F.lit("true")).otherwise(F.lit("false")))
    return column.cast("string")


def sentence(template: Template, because: Column | None = None) -> Column:
    """A template as a text column; a null value reads "?"."""
    parts = []
    for part in template.parts:
        if isinstance(part, Value):
            parts.append(F.coalesce(formatted(part), F.lit("?")))
        elif part == "because" and because is not None:
            parts.append(F.coalesce(because, F.lit("")))
        else:
            parts.append(F.lit(part))
    return F.concat(*parts)


def _evidence(rule: BottleneckRule) -> Column:
    pairs = []
    for key, value in rule.evidence:
        pairs += [F.lit(key), formatted(value)]
    return F.create_map(*pairs)


def _cases(rule: BottleneckRule, limits: DiagnosisThresholds) -> tuple[Column, Column, Column | None]:
    """The component, confidence and reason columns of the first case that holds."""
    component: Column | None = None
    confidence: Column | None = None
    because: Column | None = None
    default_confidence = F.expr(bind(rule.confidence, limits)) if rule.confidence else None
    for case in reversed(rule.cases):
        name = F.col("parent_component") if case.component == PARENT else F.lit(case.component)
        sure = F.expr(bind(case.confidence, limits)) if case.confidence else default_confidence
        reason = sentence(case.because) if case.because else None
        if case.when is None:
            component, confidence, because = name, sure, reason
        else:
            holds = F.coalesce(F.expr(bind(case.when, limits)), F.lit(False))
            component = F.when(holds, name).otherwise(component)
            confidence = F.when(holds, sure).otherwise(confidence)
            because = F.when(holds, reason).otherwise(because) if (reason is not None or because is not None) else None
    assert component is not None and confidence is not None
    return component, confidence, because


def rule_findings(rule: BottleneckRule, measures: Inputs, kept: bool = False) -> DataFrame:
    """The findings of one rule: its measure's rows that pass its test, in the candidate shape
    (the schema's columns but the names, rank, id and filter, plus priority and packet_filter).
    ``kept``: the rows that pass are computed now, once, for the findings and for the rules that
    read them (``Inputs.found``)."""
    limits = measures.limits
    rows = measures.measure(rule.measure)
    try:
        # One filter (each DataFrame step analyses the measure's whole plan again).
        test = F.expr(bind(rule.test, limits))
        component, confidence, because = _cases(rule, limits)
        passed = rows.filter(F.expr(rule.where) & test if rule.where else test).withColumns(
            {
                "component": component,
                "confidence": F.least(F.lit(1.0), F.greatest(F.lit(0.0), confidence.cast("double"))),
            }
        )
        if kept:
            passed = partitioning.kept(passed)
        return _candidates(rule, measures, passed, because)
    except AnalysisException as error:
        raise ValueError(
            f"{rule.source}: rule {rule.id!r} does not fit its measure {rule.measure!r}: {str(error).splitlines()[0]}"
        ) from error


def _candidates(rule: BottleneckRule, measures: Inputs, passed: DataFrame, because: Column | None) -> DataFrame:
    measures.record(rule.id, passed)
    columns = {
        "rule_id": F.lit(rule.id),
        "entity_kind": F.lit(rule.entity_kind),
        "effect": F.lit(rule.effect),
        "severity": F.lit(rule.severity),
        "kind": F.lit(rule.kind),
        "duration_us": F.col("held_us"),
        "lifetime_share": F.col("held_us") / F.greatest(F.col("span_us"), F.lit(1)),
        "evidence": _evidence(rule),
        "explanation": sentence(rule.sentence, because),
        # A measure may name its entity itself (a client's connections); else it is named later.
        "entity": F.col("entity") if "entity" in passed.columns else F.lit(None).cast("string"),
        "priority": F.lit(rule.priority),
    }
    return in_schema(passed, _CANDIDATE, **columns)


# -- naming, the filter and the rank --------------------------------------------------------------


def connection_names(frames: DataFrame, connections: DataFrame) -> DataFrame:
    """Per connection: the client's address:port, the name the client gave the connection (0-9-1
    client-properties ``connection_name``; 1.0: ``connection_name`` in the open's properties,
    else its container-id) and the client library it says it is (``product`` and ``version``)."""
    properties = F.col("arguments")["client-properties"]
    named_091 = frames.filter((F.col("method") == "connection.start-ok") & (F.col("direction") == "c2s")).select(
        "capture_id",
        "connection_id",
        F.get_json_object(properties, "$.connection_name").alias("_name"),
        F.concat_ws(" ", F.get_json_object(properties, "$.product"), F.get_json_object(properties, "$.version")).alias(
            "_product"
        ),
    )
    open_properties = F.col("arguments")["properties"]
    named_10 = frames.filter(
        (F.col("protocol") == "amqp-1.0") & (F.col("method") == "open") & (F.col("direction") == "c2s")
    ).select(
        "capture_id",
        "connection_id",
        F.coalesce(F.get_json_object(open_properties, "$.connection_name"), F.col("container_id")).alias("_name"),
        F.concat_ws(
            " ", F.get_json_object(open_properties, "$.product"), F.get_json_object(open_properties, "$.version")
        ).alias("_product"),
    )
    names = (
        named_091.unionByName(named_10)
        .groupBy("capture_id", "connection_id")
        .agg(
            F.first("_name", ignorenulls=True).alias("connection_name"),
            F.first(F.when(F.col("_product") != "", F.col("_product")), ignorenulls=True).alias("client_product"),
        )
    )
    client = F.when(
        F.col("client_address").contains(":"),
        F.concat(F.lit("["), F.col("client_address"), F.lit("]:"), F.col("client_port").cast("string")),
    ).otherwise(F.concat_ws(":", F.col("client_address"), F.col("client_port").cast("string")))
    return connections.select("capture_id", "connection_id", client.alias("client"), "client_port").join(
        names, ["capture_id", "connection_id"], "left"
    )


def _wireshark_filter() -> Column:
    """The client's TCP port (unique per connection on one host) and the listed packets: by a
    field filter where one names exactly those packets (all of them listed), else by their
    numbers (Wireshark 4 sets: members separated by commas)."""
    numbers = F.concat(
        F.lit("frame.number in {"), F.array_join(F.col("packet_numbers").cast("array<string>"), ","), F.lit("}")
    )
    complete = F.col("packet_filter").isNotNull() & (F.col("packet_count") == F.size("packet_numbers"))
    listed = F.when(complete, F.concat(F.lit("("), F.col("packet_filter"), F.lit(")"))).otherwise(numbers)
    port = F.concat(F.lit("tcp.port == "), F.col("client_port").cast("string"))
    return (
        F.when(F.col("client_port").isNotNull() & (F.size("packet_numbers") > 0), F.concat(port, F.lit(" && "), listed))
        .when(F.col("client_port").isNotNull(), port)
        .when(F.size("packet_numbers") > 0, listed)
        .otherwise(F.lit("amqp"))
    )


def _rank_in_capture() -> WindowSpec:
    """A capture's findings, the one to act on first: bottlenecks before problems, warnings before
    infos (FINDING_SEVERITIES sorts so descending), then by the rule's priority (alarms; head-of-line,
    which a separate connection fixes; the broker's credit-flow stages; consumers and clients;
    the network), then by time held back weighted by confidence."""
    return Window.partitionBy("capture_id").orderBy(
        (F.col("kind") == "bottleneck").desc(),
        F.col("severity").desc(),
        F.col("priority").asc(),
        (F.col("duration_us") * F.col("confidence")).desc(),
        F.col("start_packet_number").asc(),
        F.col("rule_id").asc(),
        F.col("entity").asc(),
    )


def _entity_name() -> Column:
    """What an operator recognises: the consumer tag, the link's name, the connection by its name
    and address, a session or channel by its connection and number."""
    connection = F.coalesce(
        F.when(
            F.col("connection_name").isNotNull(),
            F.concat(F.col("connection_name"), F.lit(" ("), F.col("client"), F.lit(")")),
        ),
        F.col("client"),
        F.col("connection_id"),
    )
    named = (
        F.when(F.col("entity_kind") == "consumer", F.coalesce(F.col("consumer_tag"), F.col("link_name")))
        .when(F.col("entity_kind") == "link", F.col("link_name"))
        .when(
            F.col("entity_kind").isin("session", "channel"),
            F.concat(connection, F.lit(" channel "), F.col("channel").cast("string")),
        )
        .when(F.col("entity_kind") == "queue", F.col("queue"))
    )
    return F.coalesce(named, connection)


def bottleneck_findings(
    *,
    frames: DataFrame,
    connections: DataFrame,
    messages_091: DataFrame,
    flow_intervals: DataFrame,
    consumer_unacked: DataFrame,
    link_state: DataFrame,
    connection_blocked: DataFrame,
    channel_confirms: DataFrame,
    tcp_flow: DataFrame,
    deliveries_10: DataFrame | None = None,
    limits: DiagnosisThresholds = DiagnosisThresholds(),
    rules: Sequence[BottleneckRule] | None = None,
    spoken: Iterable[str | None] | None = None,
) -> DataFrame:
    """The bottlenecks table (``schemas.diagnosis.BOTTLENECKS_SCHEMA``): every catalogue rule's
    findings, named as an operator knows the entity and ranked per capture. ``spoken``, when
    known, is the protocols of the run's connections (the connections table's ``protocol``): a rule
    whose measure reads only another protocol's connections (``MEASURE_PROTOCOL``) has no findings
    and is not planned."""
    catalogue = load_bottleneck_rules(measures=frozenset(MEASURES)) if rules is None else tuple(rules)
    if spoken is not None:
        present = set(spoken)
        catalogue = tuple(r for r in catalogue if MEASURE_PROTOCOL.get(r.measure) in (None, *present))
    measures = Inputs(
        Tables(
            frames=frames,
            connections=connections,
            messages_091=messages_091,
            flow_intervals=flow_intervals,
            consumer_unacked=consumer_unacked,
            link_state=link_state,
            connection_blocked=connection_blocked,
            channel_confirms=channel_confirms,
            tcp_flow=tcp_flow,
            deliveries_10=deliveries_10,
        ),
        limits,
    )
    followed = {r.after for r in catalogue if r.after}
    found: list[DataFrame] = []
    skipped: set[str] = set()
    for rule in catalogue:
        if rule.after in skipped:
            skipped.add(rule.id)
            continue
        findings = rule_findings(rule, measures, kept=rule.id in followed)
        # A rule others follow has the rows that pass its test computed once (``kept``); with none
        # (most captures) the rules after it are not even planned.
        if rule.id in followed and measures.found(rule.id).isEmpty():
            skipped.add(rule.id)
        found.append(findings)
    candidates = union_all(found)
    named = candidates.join(connection_names(frames, connections), ["capture_id", "connection_id"], "left")
    product = F.when(
        F.col("client_product").isNotNull(),
        F.map_concat(F.col("evidence"), F.create_map(F.lit("client_product"), F.col("client_product"))),
    )
    finding_id = F.substring(
        F.sha2(
            F.concat_ws(
                "|",
                "capture_id",
                "rule_id",
                "connection_id",
                "entity_kind",
                F.coalesce(F.col("entity"), F.lit("")),
                F.col("start_packet_number").cast("string"),
            ),
            256,
        ),
        1,
        16,
    )
    shaped = with_columns(
        named,
        [
            ("entity", F.coalesce(F.col("entity"), _entity_name())),
            ("evidence", F.coalesce(product, F.col("evidence"))),
            ("finding_id", finding_id),
            ("wireshark_filter", _wireshark_filter()),
            ("rank", F.row_number().over(_rank_in_capture())),
        ],
    )
    return shaped.select(*[F.col(f.name).cast(f.dataType) for f in BOTTLENECKS_SCHEMA.fields])
