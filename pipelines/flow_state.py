"""Every flow-state table, named, from the bronze tables: what ``amqpscope analyze`` writes.

Two steps, so a job can store the first before the second reads it: the timelines come from the
bronze frames and tcp_segments tables; flow_intervals and throughput are derived from them. The
timelines are built by name (``FlowTimelines``), so a job can write those the diagnosis reads
(``INTERVAL_INPUTS``) before the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

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
_SHARED_BUILDERS: dict[str, Callable[[DataFrame], DataFrame]] = {"sessions": session_map, "ledger": unacked_ledger}
TIMELINE_TABLES = (*FRAME_TIMELINES, "tcp_flow")
DERIVED_TABLES = ("flow_intervals", "throughput")
FLOW_TABLES = (*TIMELINE_TABLES, *DERIVED_TABLES)
# The timelines flow_intervals is made of; the bottleneck findings read some of them too, and no
# other flow-state table (pipelines.bottlenecks). A job writes these first and the diagnosis from
# them, so its answer comes before the other timelines are written (jobs.derive).
INTERVAL_INPUTS = ("link_state", "session_window", "consumer_unacked", "channel_unacked", "channel_confirms",
                   "connection_blocked", "channel_flow", "tcp_flow")


class FlowTimelines:
    """The flow-state timelines (TIMELINE_TABLES) of the bronze frames and tcp_segments tables,
    built by name when asked for.

    The shared intermediates are computed once each (a Spark job), when a first table needs one:
    each table that uses the session map would otherwise find it again, twice in its own plan
    (about twenty query stages on the sample), and the two unacked tables would each replay the
    ledger's dozen windows (with it computed once, the pair took 0.72-0.83x the time on 1 M frames:
    docs/BENCHMARKS.md)."""

    def __init__(self, frames: DataFrame, tcp_segments: DataFrame) -> None:
        self._frames, self._tcp_segments = frames, tcp_segments
        self._shared: dict[str, DataFrame] = {}

    def build(self, names: Iterable[str]) -> dict[str, DataFrame]:
        return {name: self._timeline(name) for name in names}

    def _timeline(self, name: str) -> DataFrame:
        if name == "tcp_flow":
            return tcp_flow_timeline(self._tcp_segments)
        shared = _SHARED_INPUT.get(name)
        if shared is None:
            return FRAME_TIMELINES[name](self._frames)
        if shared not in self._shared:
            self._shared[shared] = _SHARED_BUILDERS[shared](self._frames).localCheckpoint()
        return FRAME_TIMELINES[name](self._frames, self._shared[shared])


def flow_timelines(frames: DataFrame, tcp_segments: DataFrame) -> dict[str, DataFrame]:
    """Every flow-state timeline (TIMELINE_TABLES) from the bronze frames and tcp_segments tables."""
    return FlowTimelines(frames, tcp_segments).build(TIMELINE_TABLES)


def derived_tables(frames: DataFrame, timelines: Mapping[str, DataFrame]) -> dict[str, DataFrame]:
    """flow_intervals and throughput (DERIVED_TABLES) from the timelines (best read back from storage)."""
    return {
        "flow_intervals": flow_intervals(**{name: timelines[name] for name in INTERVAL_INPUTS}),
        "throughput": throughput(frames, timelines["link_state"]),
    }
