"""Every table of the lake, declared once: its name, schema, layer, the step that writes it, its
builder (a pure ``pipelines/`` function), the tables and shared results the builder reads, and
how its rows are partitioned and ordered.

``derive`` walks this graph (``jobs/stages/derive.py``): it writes the diagnosis's inputs first, then the
diagnosis, then the rest, each table built from its inputs as stored (read back from the lake) and
from the shared results (``Shared``: a pass over the frames or a table that several tables are drawn from,
computed once and kept while they are written). ``analyze``, ``report``, the row counts and the
tests take their table lists from here. A new table is one declaration here and its schema in
``schemas/``; a gold table small enough for readers to take without Spark says so
(``read_without_spark``: ``Lake.read_rows`` reads it through delta-rs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Literal

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from amqpscope.pipelines.accounting import byte_accounting
from amqpscope.pipelines.blocking import channel_flow_intervals, connection_blocked_intervals
from amqpscope.pipelines.channel_unacked import channel_unacked_timeline, consumer_unacked_timeline, unacked_ledger
from amqpscope.pipelines.channels import channel_pass
from amqpscope.pipelines.confirms import channel_confirms_timeline
from amqpscope.pipelines.diagnosis.findings import bottleneck_findings
from amqpscope.pipelines.diagnosis.round_trips import round_trips
from amqpscope.pipelines.diagnosis.verdict import diagnosis
from amqpscope.pipelines.dq_summary import dq_summary
from amqpscope.pipelines.events import events_timeline
from amqpscope.pipelines.flow_intervals import flow_intervals
from amqpscope.pipelines.frame_limits import frame_limits_timeline
from amqpscope.pipelines.idle_gaps import idle_gaps_timeline
from amqpscope.pipelines.lifecycle_091 import lifecycle_091_timeline
from amqpscope.pipelines.lifecycle_10 import lifecycle_10_timeline
from amqpscope.pipelines.link_credit import link_credit_of, link_state_timeline
from amqpscope.pipelines.messages import deliveries_10, messages_091
from amqpscope.pipelines.partitioning import checkpointed
from amqpscope.pipelines.queue_accounting import queue_balance
from amqpscope.pipelines.report.chart_series import chart_series
from amqpscope.pipelines.report.sections import report_sections
from amqpscope.pipelines.sessions import session_map, session_window_timeline
from amqpscope.pipelines.tcp_flow import tcp_flow_timeline
from amqpscope.pipelines.throughput import message_events, throughput_of
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from amqpscope.schemas.diagnosis import BOTTLENECKS_SCHEMA, DIAGNOSIS_SCHEMA, ROUND_TRIPS_SCHEMA
from amqpscope.schemas.events import EVENTS_SCHEMA
from amqpscope.schemas.flow import (
    CHANNEL_CONFIRMS_SCHEMA,
    CHANNEL_FLOW_SCHEMA,
    CHANNEL_UNACKED_SCHEMA,
    CONNECTION_BLOCKED_SCHEMA,
    CONSUMER_UNACKED_SCHEMA,
    FLOW_INTERVALS_SCHEMA,
    FRAME_LIMITS_SCHEMA,
    IDLE_GAPS_SCHEMA,
    LINK_CREDIT_SCHEMA,
    LINK_STATE_SCHEMA,
    SESSION_WINDOW_SCHEMA,
    THROUGHPUT_SCHEMA,
)
from amqpscope.schemas.lifecycle import LIFECYCLE_091_SCHEMA, LIFECYCLE_10_SCHEMA
from amqpscope.schemas.messages import DELIVERIES_10_SCHEMA, MESSAGES_091_SCHEMA
from amqpscope.schemas.quality import DQ_SUMMARY_SCHEMA
from amqpscope.schemas.queues import QUEUE_BALANCE_SCHEMA
from amqpscope.schemas.report import CHART_SERIES_SCHEMA, REPORT_SECTIONS_SCHEMA
from amqpscope.schemas.runs import RUNS_SCHEMA
from amqpscope.schemas.tcp import TCP_FLOW_SCHEMA
from amqpscope.schemas.verdicts import VIOLATIONS_SCHEMA

Layer = Literal["bronze", "silver", "gold", "bookkeeping"]
# The steps of a run, in order (jobs.stages.analyze times each; a step may write in two parts).
STEPS = ("ingest", "messages", "flow_state", "diagnosis", "verdicts", "charts", "report")
AMQP091, AMQP10 = "amqp-0-9-1", "amqp-1.0"
# Within a connection, the order frames completed on the wire.
_FRAME = ("connection_id", "frame_index")
_CHANNEL = ("connection_id", "channel", "frame_index")
# The frames as stored, which derive may be given besides the frames it reads for windows
# (jobs.stages.decode.write_bronze): in a large run those are the decoded rows kept partitioned by
# connection, which a window over every frame of a connection reads without a shuffle, but every
# read of them takes every column of every kind; the stored Parquet files give a query the columns
# it takes (at 1 M frames, half the CPU for the begins: docs/BENCHMARKS.md). Without it (a small
# run, the derive job, tests), the frames serve both. A builder that reads both has it as an input
# of this name; one that only picks a few kinds of frame says ``frames_as_stored``.
STORED_FRAMES = "stored_frames"


@dataclass(frozen=True)
class Shared:
    """A result several tables are drawn from, not a table: computed once, when a first table
    needs it, and kept (Spark's block manager) until derive ends."""

    name: str
    build: Callable[..., DataFrame]
    inputs: tuple[str, ...]
    frames_as_stored: bool = False  # as Table's


@dataclass(frozen=True)
class Table:
    """One lake table. ``build(**inputs, **settings)`` gives its rows; without a builder its step
    writes it itself (ingest's decoder, the verdicts' rule evaluation, the runs' marks)."""

    name: str
    schema: StructType
    layer: Layer
    step: str | None  # the step of a run that writes it (None: every step, the runs table)
    build: Callable[..., DataFrame] | None = None
    inputs: tuple[str, ...] = ()  # tables and Shared results, passed by name as keyword arguments
    settings: tuple[str, ...] = ()  # the run's settings build takes besides (diagnosis limits, run id, ...)
    # Delta partition columns: every write replaces whole captures.
    partition_by: tuple[str, ...] = ("capture_id",)
    # Within a capture, the columns that tell its rows apart, in the order they follow one another
    # (an entity, then its frames): tests check no two rows share them.
    order_by: tuple[str, ...] = ()
    # A small gold table its readers take through delta-rs, without a Spark query (Lake.read_rows).
    read_without_spark: bool = False
    # The AMQP version whose frames its rows come from, when only one's: without a connection of
    # that version among the run's captures it has no rows, and derive does not build it.
    protocol: str | None = None
    # Its builder picks a few kinds of frame or sums their columns, with no window over every frame:
    # it reads the frames as stored (STORED_FRAMES), a columnar read of the columns it takes.
    frames_as_stored: bool = False

    def __post_init__(self) -> None:
        if self.step is not None and self.step not in STEPS:
            raise ValueError(f"table {self.name}: step {self.step!r} is not one of {', '.join(STEPS)}")
        if not self.inputs and self.build is not None:
            raise ValueError(f"table {self.name}: a builder needs inputs")
        unknown = [c for c in (*self.partition_by, *self.order_by) if c not in self.schema.fieldNames()]
        if unknown:
            raise ValueError(f"table {self.name}: {', '.join(unknown)} not in its schema")


def _timeline(
    name: str,
    schema: StructType,
    build: Callable[..., DataFrame],
    *inputs: str,
    order_by: tuple[str, ...],
    protocol: str | None = None,
    frames_as_stored: bool = False,
) -> Table:
    return Table(
        name,
        schema,
        "silver",
        "flow_state",
        build,
        inputs,
        order_by=order_by,
        protocol=protocol,
        frames_as_stored=frames_as_stored,
    )


_BRONZE_ORDER = {
    "frames": _FRAME,
    "connections": ("connection_id",),
    "captures": ("capture_id",),
    "tcp_segments": ("connection_id", "packet_number"),
}

# The shared results, by name. The 0-9-1 channel tables start from one pass over the channels'
# frames (pipelines.channels: incarnations, confirm mode, consumers, lifecycle state); the two
# unacked tables from one ledger of deliveries and their settlements drawn from it (computed once,
# the pair took 0.72-0.83x the time at 1 M frames: docs/BENCHMARKS.md, "What is set": shared results
# computed once). The AMQP 1.0 tables that bind frames to sessions share one session map (a row per
# begin). The byte accounting is checked before anything is derived and summed by dq_summary. The
# message events (a row per message, both versions: a pass over the frames with a window per channel
# and direction) are summed per second by throughput and per bucket by the report's charts.
SHARED: dict[str, Shared] = {
    s.name: s
    for s in (
        Shared("accounting", byte_accounting, ("connections", "frames", "quarantine"), frames_as_stored=True),
        Shared("channels", channel_pass, ("frames",)),
        Shared("ledger", unacked_ledger, ("frames", "channels")),
        Shared("sessions", session_map, ("frames",), frames_as_stored=True),
        Shared("message_events", message_events, ("frames", "link_state", STORED_FRAMES)),
    )
}

# In the order derive writes them when nothing asks for another: every table after its inputs.
TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        # Bronze: what ingest decodes and writes (jobs.stages.decode), as schemas.bronze lists them.
        *(
            Table(name, schema, "bronze", "ingest", order_by=_BRONZE_ORDER.get(name, ()))
            for name, schema in BRONZE_SCHEMAS.items()
        ),
        # Silver: messages and the flow state (docs/FLOW_STATE.md), rule state and events.
        Table(
            "messages_091",
            MESSAGES_091_SCHEMA,
            "silver",
            "messages",
            messages_091,
            ("frames", "channels"),
            order_by=_CHANNEL,
            protocol=AMQP091,
        ),
        Table(
            "deliveries_10",
            DELIVERIES_10_SCHEMA,
            "silver",
            "messages",
            deliveries_10,
            ("frames", STORED_FRAMES),
            order_by=("connection_id", "direction", "channel", "handle", "frame_index"),
            protocol=AMQP10,
        ),
        _timeline(
            "channel_unacked",
            CHANNEL_UNACKED_SCHEMA,
            channel_unacked_timeline,
            "frames",
            "ledger",
            order_by=_CHANNEL,
            protocol=AMQP091,
        ),
        _timeline(
            "link_state",
            LINK_STATE_SCHEMA,
            link_state_timeline,
            "frames",
            "sessions",
            order_by=("connection_id", "link_name", "sender_side", "frame_index"),
            protocol=AMQP10,
        ),
        # The link state's credit rows: its credit state computed once for both tables.
        _timeline(
            "link_credit",
            LINK_CREDIT_SCHEMA,
            link_credit_of,
            "link_state",
            order_by=("connection_id", "link_name", "sender_side", "frame_index"),
            protocol=AMQP10,
        ),
        _timeline(
            "session_window",
            SESSION_WINDOW_SCHEMA,
            session_window_timeline,
            "frames",
            "sessions",
            order_by=("connection_id", "session_id", "frame_index"),
            protocol=AMQP10,
        ),
        _timeline(
            "consumer_unacked",
            CONSUMER_UNACKED_SCHEMA,
            consumer_unacked_timeline,
            "frames",
            "ledger",
            order_by=("connection_id", "channel", "consumer_tag", "frame_index"),
            protocol=AMQP091,
        ),
        _timeline(
            "channel_confirms",
            CHANNEL_CONFIRMS_SCHEMA,
            channel_confirms_timeline,
            "frames",
            "channels",
            order_by=_CHANNEL,
            protocol=AMQP091,
        ),
        _timeline(
            "connection_blocked",
            CONNECTION_BLOCKED_SCHEMA,
            connection_blocked_intervals,
            "frames",
            order_by=("connection_id", "start_frame_index"),
            protocol=AMQP091,
            frames_as_stored=True,
        ),
        _timeline(
            "channel_flow",
            CHANNEL_FLOW_SCHEMA,
            channel_flow_intervals,
            "frames",
            order_by=("connection_id", "channel", "direction", "start_frame_index"),
            protocol=AMQP091,
            frames_as_stored=True,
        ),
        _timeline("frame_limits", FRAME_LIMITS_SCHEMA, frame_limits_timeline, "frames", order_by=_FRAME),
        _timeline("idle_gaps", IDLE_GAPS_SCHEMA, idle_gaps_timeline, "frames", order_by=_FRAME),
        _timeline(
            "lifecycle_10",
            LIFECYCLE_10_SCHEMA,
            lifecycle_10_timeline,
            "frames",
            "sessions",
            order_by=_FRAME,
            protocol=AMQP10,
        ),
        _timeline(
            "lifecycle_091",
            LIFECYCLE_091_SCHEMA,
            lifecycle_091_timeline,
            "frames",
            "channels",
            order_by=_FRAME,
            protocol=AMQP091,
        ),
        _timeline(
            "events", EVENTS_SCHEMA, events_timeline, "frames", order_by=(*_FRAME, "event_id"), frames_as_stored=True
        ),
        _timeline(
            "tcp_flow", TCP_FLOW_SCHEMA, tcp_flow_timeline, "tcp_segments", order_by=("connection_id", "packet_number")
        ),
        # From the stored timelines: every starved or blocked interval, and messages per second.
        _timeline(
            "flow_intervals",
            FLOW_INTERVALS_SCHEMA,
            flow_intervals,
            "link_state",
            "session_window",
            "consumer_unacked",
            "channel_unacked",
            "channel_confirms",
            "connection_blocked",
            "channel_flow",
            "tcp_flow",
            order_by=(
                "cause",
                "entity",
                "connection_id",
                "channel",
                "link_name",
                "consumer_tag",
                "direction",
                "start_packet_number",
            ),
        ),
        _timeline(
            "throughput",
            THROUGHPUT_SCHEMA,
            throughput_of,
            "message_events",
            order_by=("scope", "connection_id", "protocol", "direction", "channel", "link_name", "address", "second"),
        ),
        # Gold: the diagnosis (docs/DIAGNOSIS.md), the verdicts and the data quality summary.
        Table(
            "bottlenecks",
            BOTTLENECKS_SCHEMA,
            "gold",
            "diagnosis",
            bottleneck_findings,
            (
                "frames",
                "connections",
                "messages_091",
                "flow_intervals",
                "consumer_unacked",
                "link_state",
                "connection_blocked",
                "channel_confirms",
                "tcp_flow",
                "deliveries_10",
            ),
            ("limits", "spoken"),
            order_by=("rank",),
            read_without_spark=True,
            frames_as_stored=True,
        ),
        Table(
            "diagnosis",
            DIAGNOSIS_SCHEMA,
            "gold",
            "diagnosis",
            diagnosis,
            ("bottlenecks", "captures", "connections", "tcp_flow", "frames"),
            order_by=("capture_id",),
            read_without_spark=True,
            frames_as_stored=True,
        ),
        # Every round trip a client waited on: request/reply calls, synchronous methods, confirms. No
        # diagnosis rule reads it (request_reply pairs the calls itself), so it is written after the
        # answer, with the flow tables' step.
        Table(
            "round_trips",
            ROUND_TRIPS_SCHEMA,
            "gold",
            "flow_state",
            round_trips,
            ("frames", "messages_091"),
            order_by=("connection_id", "channel", "kind", "request_ts", "request", "correlation_id"),
            read_without_spark=True,
            protocol="amqp-0-9-1",
        ),
        # Written by the verdicts as the rules are evaluated (expectations.suite).
        Table("violations", VIOLATIONS_SCHEMA, "gold", "verdicts"),
        Table(
            "dq_summary",
            DQ_SUMMARY_SCHEMA,
            "gold",
            "verdicts",
            dq_summary,
            ("captures", "connections", "frames", "quarantine", "violations", "diagnosis", "accounting"),
            ("suite_of_rule", "suites_run", "run_id", "run_ts"),
            order_by=("capture_id",),
            read_without_spark=True,
            frames_as_stored=True,
        ),
        # Queue accounting from the wire (pipelines.queue_accounting): per queue and bucket what went
        # in and out and the backlog; the report charts every queue's balance from it.
        Table(
            "queue_balance",
            QUEUE_BALANCE_SCHEMA,
            "gold",
            "charts",
            queue_balance,
            ("captures", "frames", "messages_091", "link_state", "deliveries_10"),
            order_by=("queue", "bucket"),
            read_without_spark=True,
            frames_as_stored=True,
        ),
        # The report's charts (pipelines.report.chart_series): every point it draws, so that it reads them
        # through delta-rs and a capture of any size is drawn without a Spark query.
        Table(
            "chart_series",
            CHART_SERIES_SCHEMA,
            "gold",
            "charts",
            chart_series,
            (
                "captures",
                "frames",
                "message_events",
                "link_state",
                "consumer_unacked",
                "channel_unacked",
                "channel_confirms",
                "tcp_flow",
                "flow_intervals",
                "violations",
            ),
            read_without_spark=True,
            frames_as_stored=True,
        ),
        # Every other row the report shows (pipelines.report.sections): with the gold tables above,
        # the page of a capture of any size is drawn from rows read through delta-rs.
        Table(
            "report_sections",
            REPORT_SECTIONS_SCHEMA,
            "gold",
            "report",
            report_sections,
            (
                "captures",
                "frames",
                "connections",
                "violations",
                "quarantine",
                "accounting",
                "throughput",
                "consumer_unacked",
                "link_state",
                "bottlenecks",
            ),
            order_by=("section", "position"),
            read_without_spark=True,
            frames_as_stored=True,
        ),
        # Bookkeeping: each stage's latest run per capture, marked without Spark (jobs.lake.runs).
        Table("runs", RUNS_SCHEMA, "bookkeeping", None, order_by=("capture_id", "stage")),
    )
}


def table(name: str) -> Table:
    found = TABLES.get(name)
    if found is None:
        raise KeyError(f"no table {name!r} in pipelines.tables")
    return found


def names(*, layer: str | None = None, step: str | None = None, built: bool | None = None) -> tuple[str, ...]:
    """The tables' names in declaration order, of one layer / one step / with or without a builder."""
    return tuple(
        t.name
        for t in TABLES.values()
        if (layer is None or t.layer == layer)
        and (step is None or t.step == step)
        and (built is None or (t.build is not None) == built)
    )


def schemas(layer: str) -> dict[str, StructType]:
    return {t.name: t.schema for t in TABLES.values() if t.layer == layer}


# The bronze tables (ingest's) and those derive writes, in order.
BRONZE: tuple[str, ...] = names(layer="bronze")
DERIVED: tuple[str, ...] = tuple(t.name for t in TABLES.values() if t.layer in ("silver", "gold"))
# The flow-state tables (the report draws its charts from some of them).
FLOW: tuple[str, ...] = names(step="flow_state")


def inputs_of(name: str) -> tuple[str, ...]:
    """What ``name`` is built from directly: tables and shared results."""
    if name == STORED_FRAMES:
        return ("frames",)
    node = TABLES.get(name) or SHARED.get(name)
    if node is None:
        raise KeyError(f"no table or shared result {name!r} in pipelines.tables")
    return node.inputs


@cache
def upstream(name: str) -> frozenset[str]:
    """Every table and shared result ``name`` is built from, directly or not."""
    found: set[str] = set()
    for parent in inputs_of(name):
        found |= {parent, *upstream(parent)}
    return frozenset(found)


def in_order(wanted: Iterable[str]) -> tuple[str, ...]:
    """The tables of ``wanted`` in declaration order (every table after its inputs)."""
    chosen = set(wanted)
    unknown = chosen - TABLES.keys()
    if unknown:
        raise KeyError(f"no table {', '.join(sorted(unknown))} in pipelines.tables")
    return tuple(name for name in TABLES if name in chosen)


class Build:
    """Tables of ``TABLES`` built from the ``given`` ones (the bronze tables), each after its inputs;
    each shared result is computed once, when a first table needs it, and kept (a local checkpoint:
    one Spark job). ``store`` gets each table's rows as built and returns them as the tables built
    from it should read them: derive writes them and reads them as stored (``Lake.write_and_read``); by default
    they are used as built (tests, benchmarks). The tables of ``empty`` are known to have no rows
    (``without_rows``): they are not built, ``store`` gets None for their rows."""

    def __init__(
        self,
        given: Mapping[str, DataFrame],
        settings: Mapping[str, object] | None = None,
        store: Callable[[Table, DataFrame | None], DataFrame] | None = None,
        empty: Iterable[str] = (),
    ) -> None:
        self.tables: dict[str, DataFrame] = dict(given)
        self._stored_frames = self.tables.pop(STORED_FRAMES, None)
        self.settings: dict[str, object] = dict(settings or {})
        self._store = store or self._as_built
        self._empty = frozenset(empty)
        self._shared: dict[str, DataFrame] = {}

    def _as_built(self, table: Table, rows: DataFrame | None) -> DataFrame:
        return rows if rows is not None else no_rows(next(iter(self.tables.values())), table)

    def value(self, name: str) -> DataFrame:
        """A table (built if need be) or a shared result."""
        if name in self.tables:
            return self.tables[name]
        shared = SHARED.get(name)
        if shared is None:
            return self.table(name)
        if name not in self._shared:
            self._shared[name] = checkpointed(shared.build(**self._inputs(shared)))
        return self._shared[name]

    def stored_frames(self) -> DataFrame:
        """The frames as stored when given (STORED_FRAMES), else the frames."""
        return self._stored_frames if self._stored_frames is not None else self.value("frames")

    def _inputs(self, node: Table | Shared) -> dict[str, DataFrame]:
        stored = {STORED_FRAMES, *(("frames",) if node.frames_as_stored else ())}
        return {i: self.stored_frames() if i in stored else self.value(i) for i in node.inputs}

    def table(self, name: str) -> DataFrame:
        """Table ``name``, built from its inputs (and stored) unless it already was."""
        if name not in self.tables:
            declared = table(name)
            if declared.build is None:
                raise ValueError(f"table {name} has no builder: its step writes it")
            rows = (
                None
                if name in self._empty
                else declared.build(**self._inputs(declared), **{s: self.settings[s] for s in declared.settings})
            )
            self.tables[name] = self._store(declared, rows)
        return self.tables[name]

    def build(self, names: Iterable[str]) -> dict[str, DataFrame]:
        """``names``, in declaration order."""
        return {name: self.table(name) for name in in_order(names)}


def without_rows(protocols: Iterable[str | None]) -> frozenset[str]:
    """The tables without rows when the run's connections speak ``protocols`` only (the connections
    table's ``protocol``): those whose rows come from the frames of another AMQP version."""
    spoken = set(protocols)
    return frozenset(t.name for t in TABLES.values() if t.protocol is not None and t.protocol not in spoken)


def no_rows(like: DataFrame, table: Table) -> DataFrame:
    """An empty DataFrame of ``table``'s schema, in ``like``'s session (no Spark job reads it)."""
    return like.sparkSession.createDataFrame([], table.schema)


def _check_graph() -> None:
    """Every input is declared before what reads it (so declaration order is a build order): a
    table that reads a shared result comes after every table that result is drawn from."""
    earlier: set[str] = {STORED_FRAMES}
    for shared in SHARED.values():
        missing = [i for i in shared.inputs if i not in TABLES and i not in earlier]
        if missing:
            raise ValueError(f"shared result {shared.name}: no table or earlier shared result {', '.join(missing)}")
        earlier.add(shared.name)
    seen: set[str] = {*SHARED, STORED_FRAMES}
    for t in TABLES.values():
        needed = {*t.inputs, *(u for i in t.inputs if i in SHARED for u in upstream(i))}
        missing = sorted(needed - seen)
        if missing:
            raise ValueError(f"table {t.name}: {', '.join(missing)} not declared before it")
        seen.add(t.name)


_check_graph()
