"""The measures the diagnosis's rules read (expectations/bottlenecks.yml), and how they are computed.

A measure is a pure function of named inputs: its parameters name what it reads, and ``Inputs``
gives each by that name, computed once a run:

- a table the diagnosis reads (``Tables``: the flow-state tables derive wrote);
- a shared intermediate (``SHARED``: rows several measures read, such as every publish with the
  queues it reaches);
- another measure (``MEASURES``), by its name;
- ``limits``, the run's thresholds (``conf.diagnosis``), and ``found``, the rows another rule
  found (a rule whose measure reads them runs after that rule: ``pipelines.diagnosis.findings``).

Every measure returns rows in one shape, whatever the entity, so that one engine
(``pipelines.diagnosis.findings``) turns any of them into findings:

| column | meaning |
|---|---|
| capture_id, connection_id | where |
| channel, consumer_tag, link_name, queue | the entity's names, where they apply |
| start_ts, end_ts, start_packet_number, end_packet_number | when it was held back (end null: until the capture ends) |
| held_us | the union of the intervals that held it back, within ``span_us`` |
| span_us | the time it was active: the denominator of its share |
| packet_numbers | up to 20 packets where it was held back |
| packet_filter | a Wireshark field filter naming exactly those packets (else null: frame numbers are listed) |

plus the figures each rule names (``held_share``, ``window``, ...). The measures live by what they
look at: ``alarms`` (resource alarms), ``windows`` (TCP windows holding a sender back),
``consumer_window`` and ``queue_measures`` (consumers and queues), ``publisher_problems`` (what
the broker refused, returned or confirmed), ``churn``, ``round_trips`` and ``network``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.pipelines.diagnosis.alarms import publishing_sessions_closed, resource_alarms
from amqpscope.pipelines.diagnosis.churn import channel_churn, connection_churn
from amqpscope.pipelines.diagnosis.consumer_window import consumer_window, consumer_windows_of
from amqpscope.pipelines.diagnosis.figures import CONNECTION
from amqpscope.pipelines.diagnosis.network import bandwidth_limited, retransmissions
from amqpscope.pipelines.diagnosis.publisher_problems import (
    closes_with_error,
    publish_refusals,
    publisher_confirms,
    unroutable_returns,
)
from amqpscope.pipelines.diagnosis.queue_measures import (
    consumer_acks,
    neighbour_speeds,
    redeliveries,
    transfer_settlement,
    unconsumed_queues,
)
from amqpscope.pipelines.diagnosis.round_trips import request_reply
from amqpscope.pipelines.diagnosis.windows import (
    client_receive_pressure,
    encrypted_window_pressure,
    head_of_line,
    publisher_pressure,
)
from amqpscope.pipelines.messages import deliveries_10
from amqpscope.pipelines.partitioning import kept
from amqpscope.pipelines.publishing import publish_routes, queue_declarations
from amqpscope.pipelines.queue_depth import depth_events


@dataclass(frozen=True)
class Tables:
    """The tables the diagnosis reads, by name."""

    frames: DataFrame
    connections: DataFrame
    messages_091: DataFrame
    flow_intervals: DataFrame
    consumer_unacked: DataFrame
    link_state: DataFrame
    connection_blocked: DataFrame
    channel_confirms: DataFrame
    tcp_flow: DataFrame
    # AMQP 1.0 deliveries with their settlements (the deliveries_10 table); drawn from the frames
    # when not given.
    deliveries_10: DataFrame | None = None


# -- shared intermediates -----------------------------------------------------------------------


def _lifetimes(frames: DataFrame) -> DataFrame:
    """Per connection: its first and last frame (``first_ts``, ``last_ts``)."""
    return frames.groupBy(*CONNECTION).agg(F.min("ts").alias("first_ts"), F.max("ts").alias("last_ts"))


def _connection_queues(routes: DataFrame, consumer_windows: DataFrame) -> DataFrame:
    """Per connection: the queue it publishes to most, else the queue it consumes from first."""
    published = (
        routes.filter(F.col("queue").isNotNull())
        .groupBy(*CONNECTION, "queue")
        .agg(F.count(F.lit(1)).alias("_n"))
        .groupBy(*CONNECTION)
        .agg(F.max_by("queue", "_n").alias("_published"))
    )
    consumed = consumer_windows.groupBy(*CONNECTION).agg(F.min_by("queue", "active_start_us").alias("_consumed"))
    return published.join(consumed, list(CONNECTION), "full").select(
        *CONNECTION, F.coalesce(F.col("_published"), F.col("_consumed")).alias("queue")
    )


def _alarmed(connection_blocked: DataFrame) -> DataFrame:
    """The connections RabbitMQ blocked at some point (connection.blocked)."""
    return connection_blocked.select(*CONNECTION).distinct()


# The intermediates several measures read, by the name their parameters give them.
SHARED: dict[str, Callable[..., DataFrame]] = {
    "lifetimes": _lifetimes,
    "declarations": queue_declarations,
    # Every publish with the queue(s) it reaches (pipelines.publishing).
    "routes": publish_routes,
    "depth_events": depth_events,
    # Every consumer's window and what it did (pipelines.diagnosis.consumer_window).
    "consumer_windows": consumer_windows_of,
    "connection_queues": _connection_queues,
    "alarmed": _alarmed,
}


# The protocol (the connections table's ``protocol``) of every connection the rows of a measure
# can come from, for the measures that read one protocol's connections only; in a run without such
# a connection a measure has no rows, and its rules are not planned (``pipelines.diagnosis.findings``).
# The 0-9-1 and 1.0 ones read the frames or tables of that AMQP version alone (pipelines.tables
# builds no such table without its protocol's connections).
MEASURE_PROTOCOL: dict[str, str] = {
    "publishing_sessions_closed": "amqp-1.0",  # 1.0 sessions' transfers
    "head_of_line": "amqp-0-9-1",  # 0-9-1 consumers' prefetch windows
    "consumer_acks": "amqp-0-9-1",  # 0-9-1 consumers' acknowledgements
    "redeliveries": "amqp-0-9-1",  # 0-9-1 deliveries requeued
    "transfer_settlement": "amqp-1.0",  # 1.0 senders' transfers and the broker's dispositions
    "publisher_confirms": "amqp-0-9-1",  # messages_091's publishes in confirm mode
    "encrypted_window_pressure": "tls",  # connections whose AMQP was not decoded
    "publish_refusals": "amqp-0-9-1",  # basic.nack of publishes in confirm mode
    "unroutable_returns": "amqp-0-9-1",  # basic.return
    "channel_churn": "amqp-0-9-1",  # channel.open / close
    "request_reply": "amqp-0-9-1",  # messages_091's publishes and deliveries
}

# Every measure, by the name the rules (and other measures' parameters) give it.
MEASURES: dict[str, Callable[..., DataFrame]] = {
    "resource_alarms": resource_alarms,
    "publishing_sessions_closed": publishing_sessions_closed,
    "consumer_window": consumer_window,
    "consumer_acks": consumer_acks,
    "redeliveries": redeliveries,
    "neighbour_speeds": neighbour_speeds,
    "unconsumed_queues": unconsumed_queues,
    "transfer_settlement": transfer_settlement,
    "publisher_pressure": publisher_pressure,
    "head_of_line": head_of_line,
    "client_receive_pressure": client_receive_pressure,
    "encrypted_window_pressure": encrypted_window_pressure,
    "retransmission_recovery": retransmissions,
    "publisher_confirms": publisher_confirms,
    "publish_refusals": publish_refusals,
    "unroutable_returns": unroutable_returns,
    "closes_with_error": closes_with_error,
    "connection_churn": connection_churn,
    "channel_churn": channel_churn,
    "request_reply": request_reply,
    "bandwidth_limited": bandwidth_limited,
}

# The shared intermediates computed now and kept (``partitioning.kept``): read by several measures,
# they would otherwise be computed again inside each one's plan.
KEPT = frozenset({"routes", "consumer_windows"})

_TABLES = frozenset(f.name for f in fields(Tables))


def inputs_of(build: Callable[..., DataFrame]) -> tuple[str, ...]:
    """The names a measure or shared intermediate reads: its parameters."""
    return tuple(inspect.signature(build).parameters)


class Inputs:
    """What one run's measures read, given by name (the module docstring), each computed once
    when a first measure asks for it; the rows each rule found, recorded by the rule engine."""

    def __init__(self, tables: Tables, limits: DiagnosisThresholds) -> None:
        self.tables = tables
        self.limits = limits
        self._values: dict[str, DataFrame] = {}
        self._found: dict[str, DataFrame] = {}

    def value(self, name: str) -> Any:
        """The input ``name``: a table, a shared intermediate, a measure, ``limits`` or ``found``."""
        if name == "limits":
            return self.limits
        if name == "found":
            return self.found
        if name not in self._values:
            self._values[name] = self._computed(name)
        return self._values[name]

    def _computed(self, name: str) -> DataFrame:
        if name in _TABLES:
            given = getattr(self.tables, name)
            # The 1.0 deliveries, drawn from the frames when the table was not given.
            return deliveries_10(self.tables.frames) if given is None else given
        build = SHARED.get(name) or MEASURES.get(name)
        if build is None:
            raise KeyError(f"no table, shared intermediate or measure {name!r} for the diagnosis")
        rows = build(**{p: self.value(p) for p in inputs_of(build)})
        if name in KEPT:
            return kept(rows)
        if name in MEASURES and "held_share" not in rows.columns:
            # The time held back over the span, where the measure gives none of its own.
            rows = rows.withColumn("held_share", F.col("held_us") / F.greatest(F.col("span_us"), F.lit(1)))
        return rows

    def measure(self, name: str) -> DataFrame:
        """The measure ``name`` (``MEASURES``), with its ``held_share``."""
        if name not in MEASURES:
            raise KeyError(f"no measure {name!r}")
        return self.value(name)

    def found(self, rule_id: str) -> DataFrame:
        """The rows of ``rule_id``'s measure that passed its test, with its component and confidence
        (set by the engine once the rule has run)."""
        return self._found[rule_id]

    def record(self, rule_id: str, rows: DataFrame) -> None:
        self._found[rule_id] = rows
