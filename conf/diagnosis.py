"""Thresholds of the bottleneck diagnosis (docs/DIAGNOSIS.md), with their defaults and why.

A finding is made only where traffic was really held back for long enough to matter: healthy
traffic, a consumer that touches its prefetch but acks at once, or a blocked blip of a few
milliseconds, gives none. Every figure can be set under ``diagnosis:`` in the analyze YAML.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class DiagnosisThresholds:
    """What makes a held-back entity a finding."""

    # An interval shorter than this is a blip, not a bottleneck (connection.blocked, zero windows).
    min_held_ms: float = 100.0
    # A consumer (or 1.0 receiving link) is prefetch- (credit-) bound when it spends at least this
    # share of its consuming time with unacked at prefetch (credit at 0) ...
    consumer_bound_share: float = 0.5
    # ... its deliveries wait at least this long for their ack on median (a consumer acking as fast
    # as it is sent is not slow, even when unacked touches prefetch) ...
    slow_ack_ms: float = 10.0
    # ... and at least this share of the acks (credit grants) that free a slot are answered by a new
    # delivery within refill_ms: the broker had messages waiting for it.
    refill_share: float = 0.5
    refill_ms: float = 20.0
    # A message is in a redelivery loop when a consumer requeued it (basic.nack / basic.reject with
    # requeue) after it came back redelivered at least this many times: RabbitMQ's own delivery
    # limit for quorum queues (https://www.rabbitmq.com/docs/quorum-queues#poison-message-handling,
    # 20 by default since 4.0) treats a message returned that often as one no consumer can handle.
    redelivery_loop_count: int = 20
    # A manual-ack consumer never acks when it holds at least this many deliveries and settled none
    # of them: a consumer that works through its messages acks the first once it is done with it,
    # and RabbitMQ's guidance puts useful prefetch values at 100 to 300
    # (https://www.rabbitmq.com/docs/confirms#channel-qos-prefetch-throughput): 100 deliveries in
    # hand with not one acked is more than any processing pipeline keeps.
    never_acks_deliveries: int = 100
    # A queue without a consumer in the capture is reported once its backlog grew by this many: a
    # consumer the capture does not hold takes a few hundred at once (the prefetch guidance above),
    # so a smaller batch may be one it drains in moments.
    backlog_min_ready: int = 1000
    # A consumer is slow beside its neighbour when its median ack wait is at least this many times
    # the fastest other consumer's of the same queue: consumers of one queue doing the same work
    # differ by their load and their messages' sizes, not by a factor of four.
    slow_consumer_ratio: float = 4.0
    # An AMQP 1.0 sender waits on the broker when its transfers are settled this long after it wrote
    # them on median: RabbitMQ settles a transfer once the queues it is routed to took it, as it
    # confirms a 0-9-1 publish (milliseconds; a quorum queue's Raft commit, tens), and no network's
    # round trip (under 300 ms around the world) comes near a second.
    slow_settlement_ms: float = 1000.0
    # A publisher is throttled by the broker when it fills the broker's receive window (TCP window
    # full, or a zero window) for at least this share of its publishing time ...
    publisher_throttled_share: float = 0.05
    # ... or its connection's reader stalls at least this many times a second of publishing.
    min_window_stalls: int = 3
    # Messages at least this large and persistent go to the message store (RabbitMQ's
    # queue_index_embed_msgs_below default: 4096 bytes).
    message_store_min_bytes: int = 4096
    # A publisher's messages are persistent, or routed nowhere, when at least this share of them
    # is: most of them.
    dominant_share: float = 0.5
    # A connection lost at least this share of its life to recovering lost segments (from a lost
    # segment's first transmission to the acknowledgement of its retransmission; spurious
    # retransmissions cost nothing) and at least min_held_ms: the network loses packets.
    recovery_share: float = 0.05
    # A client whose receive window is closed for at least this share of the time the broker had
    # data for it is not reading its socket.
    client_window_closed_share: float = 0.1
    # Publishers are throttled together when at least this share of a publisher's held time falls
    # in the same together_bucket_ms buckets as another's publishing to a queue they share (the
    # majority: a slow queue holds back every publisher feeding it, most of the time together).
    throttled_together_share: float = 0.5
    # Buckets of this length: long enough for two publishers' stalls of one credit-flow episode to
    # meet (RabbitMQ blocks and lets go of a reader ~80 times a second under credit flow, every
    # ~12 ms: docs/FLOW_CONTROL.md section 5), short against the episodes themselves (hundreds of
    # ms and more).
    together_bucket_ms: float = 100.0
    # A publisher with one message in flight is bound by its confirms' round trips when at least
    # this share of its publishing time waits for a confirm: publishing the next messages before
    # the confirms come back would make it at least 1.5 times as fast.
    client_bound_share: float = 0.33
    # ... with at most this many messages in flight: one publish waiting for its confirm, a
    # consumer's prefetch (or 1.0 link credit) of one.
    round_trip_window: int = 1
    # A client churns connections (channels) when it opens at least this many in the capture: a
    # client reconnecting a few times after errors is not a pattern; ten short lives are ...
    churn_min_opens: int = 10
    # ... that carry no more messages each, on median, than this: opening a 0-9-1 connection takes
    # five round trips before the first publish (TCP handshake; protocol header and
    # connection.start; start-ok and tune; tune-ok, open and open-ok; channel.open and open-ok) and
    # closing one more, while a publish takes none: a connection of four messages or fewer spends
    # more round trips on itself than on what it carries.
    churn_messages_per_open: float = 4.0
    # A caller waits on request/reply round trips when it makes at least this many calls, one at a
    # time, and waits for replies for at least client_bound_share of its time (as a publisher
    # waits for its confirms).
    min_calls: int = 5
    # A link at its capacity: the bytes its peer acknowledged per bucket of this length ...
    bandwidth_bucket_ms: float = 100.0
    # ... at this share of their median bucket or more, and at most the median over it, for at least dominant_share of
    # the buckets of its sending span: a plateau (a token bucket or a full router queue passes the
    # same bytes every bucket; an application pacing itself waits between its messages) ...
    bandwidth_ceiling_share: float = 0.8
    # ... over at least this many buckets (a second of sending at 100 ms: fewer show no plateau).
    bandwidth_min_buckets: int = 10

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"diagnosis.{f.name} must be a non-negative number, got {value!r}")
        for name in (
            "consumer_bound_share",
            "refill_share",
            "publisher_throttled_share",
            "recovery_share",
            "client_window_closed_share",
            "throttled_together_share",
            "client_bound_share",
            "dominant_share",
            "bandwidth_ceiling_share",
        ):
            if getattr(self, name) > 1:
                raise ValueError(f"diagnosis.{name} is a share: between 0 and 1, got {getattr(self, name)!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> DiagnosisThresholds:
        """From the YAML's ``diagnosis:`` mapping; an unknown key is an error naming it."""
        values = dict(values or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown diagnosis setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**values)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)
