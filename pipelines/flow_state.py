"""Every flow-state table, named, from the bronze tables: what ``amqpscope analyze`` writes.

Two steps, so a job can store the first before the second reads it: the timelines come from the
bronze frames and tcp_segments tables; flow_intervals and throughput are derived from them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame

from amqpscope.pipelines.blocking import channel_flow_intervals, connection_blocked_intervals
from amqpscope.pipelines.channel_unacked import channel_unacked_timeline, consumer_unacked_timeline, unacked_ledger
from amqpscope.pipelines.confirms import channel_confirms_timeline
from amqpscope.pipelines.flow_intervals import flow_intervals
from amqpscope.pipelines.frame_limits import frame_limits_timeline
from amqpscope.pipelines.events import events_timeline
from amqpscope.pipelines.idle_gaps import idle_gaps_timeline
from amqpscope.pipelines.lifecycle_10 import lifecycle_10_timeline
from amqpscope.pipelines.lifecycle_091 import lifecycle_091_timeline
from amqpscope.pipelines.link_credit import link_credit_timeline, link_state_timeline
from amqpscope.pipelines.sessions import session_map, session_window_timeline
from amqpscope.pipelines.tcp_flow import tcp_flow_timeline
from amqpscope.pipelines.throughput import throughput

# Tables computed from the frames table, by name.
FRAME_TIMELINES: dict[str, Callable[..., DataFrame]] = {
    "link_credit": link_credit_timeline,
    "channel_unacked": channel_unacked_timeline,
    "link_state": link_state_timeline,
    "session_window": session_window_timeline,
    "consumer_unacked": consumer_unacked_timeline,
    "channel_confirms": channel_confirms_timeline,
    "connection_blocked": connection_blocked_intervals,
    "channel_flow": channel_flow_intervals,
    "frame_limits": frame_limits_timeline,
    "idle_gaps": idle_gaps_timeline,
    # Rule state and events (expectations/rules.yml, docs/RULES.md).
    "lifecycle_10": lifecycle_10_timeline,
    "lifecycle_091": lifecycle_091_timeline,
    "events": events_timeline,
}
# Those computed from an intermediate they share, by the intermediate's name: the AMQP 1.0 ones
# that bind frames to sessions share one session map (sessions.session_map), the 0-9-1 unacked
# counts one ledger of deliveries and their settlements (channel_unacked.unacked_ledger).
_SHARED_INPUT = {
    "link_state": "sessions", "session_window": "sessions", "lifecycle_10": "sessions",
    "channel_unacked": "ledger", "consumer_unacked": "ledger",
}
TIMELINE_TABLES = (*FRAME_TIMELINES, "tcp_flow")
DERIVED_TABLES = ("flow_intervals", "throughput")
FLOW_TABLES = (*TIMELINE_TABLES, *DERIVED_TABLES)


def flow_timelines(frames: DataFrame, tcp_segments: DataFrame) -> dict[str, DataFrame]:
    """The flow-state timelines (TIMELINE_TABLES) from the bronze frames and tcp_segments tables.

    The shared intermediates are computed here, once each (a Spark job now): each table that uses
    the session map would otherwise find it again, twice in its own plan (about twenty query stages
    on the sample), and the two unacked tables would each replay the ledger's dozen windows (with
    it computed once, the pair took 0.72-0.83x the time on 1 M frames: docs/BENCHMARKS.md)."""
    shared = {"sessions": session_map(frames).localCheckpoint(), "ledger": unacked_ledger(frames).localCheckpoint()}
    timelines = {name: build(frames, shared[_SHARED_INPUT[name]]) if name in _SHARED_INPUT else build(frames)
                 for name, build in FRAME_TIMELINES.items()}
    return {**timelines, "tcp_flow": tcp_flow_timeline(tcp_segments)}


def derived_tables(frames: DataFrame, timelines: Mapping[str, DataFrame]) -> dict[str, DataFrame]:
    """flow_intervals and throughput (DERIVED_TABLES) from the timelines (best read back from storage)."""
    return {
        "flow_intervals": flow_intervals(
            link_state=timelines["link_state"],
            session_window=timelines["session_window"],
            consumer_unacked=timelines["consumer_unacked"],
            channel_unacked=timelines["channel_unacked"],
            channel_confirms=timelines["channel_confirms"],
            connection_blocked=timelines["connection_blocked"],
            channel_flow=timelines["channel_flow"],
            tcp_flow=timelines["tcp_flow"],
        ),
        "throughput": throughput(frames, timelines["link_state"]),
    }
