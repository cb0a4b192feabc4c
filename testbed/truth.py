"""The expected bottleneck of a capture, read from the broker's own states sampled while it ran.

``expected_bottleneck(truth)`` looks only at ``broker_states`` (what RabbitMQ said about its
connections, channels, queues, consumers and alarms every 0.25 s, see ``testbed.broker_states``)
plus, where the broker cannot see the cause, what the scenario's client itself did
(``broker_summary.broker_blind``). It is the reference the wire-only diagnosis is checked
against. The rule, first match wins:

1. **A resource alarm in force** (``rabbit_alarm:get_alarms/0`` lists it in at least
   ``MIN_SAMPLES`` samples): ``memory_alarm`` or ``disk_alarm`` (the one seen longer).
   Publishing connections are blocked whatever else is slow.
2. **Credit flow** (RabbitMQ, "Finding bottlenecks with RabbitMQ 3.3", 2014, and
   docs/FLOW_CONTROL.md section 5): messages pass reader (connection) -> channel -> queue ->
   message store; each process grants its upstream credit and a process out of credit shows
   state ``flow``, so a slow stage pushes ``flow`` upstream and *the bottleneck is the first
   stage downstream of the last one in flow*. Per sample: a queue in flow -> ``message_store``;
   else a channel in flow -> ``queue``; else a connection in flow -> ``channel``. When samples
   with any of these make at least ``FLOW_MIN_SHARE`` of the samples (and ``MIN_SAMPLES``), the
   component is the verdict of most of them (a tie goes to the stage further downstream).
3. **The client, where the broker cannot see it**: a client that does not read its socket looks,
   from inside the broker, like a consumer that does not ack (or like nothing at all); the
   scenario records what its client did in ``broker_blind`` and that is the truth: ``client``.
4. **Problems the broker counts** (its running totals, ``counters`` in each sample; the
   thresholds and their arguments are with ``expected_findings`` below): publishes it nacked
   (``queue``: the fullest queue refused them), connections or channels opened at a churn rate
   (``client``), deliveries that are mostly redeliveries (``consumer``: it requeues what it cannot
   process), or a consumer channel whose unacked count only grows past NEVER_ACK_MIN_UNACKED
   (``consumer``: it never acks).
5. **A slow consumer**: a queue that has messages ready and a consumer, whose consumers are all
   held back (a channel's unacknowledged count at its prefetch, or, for credit-based consumers
   such as AMQP 1.0 links, the queue's consumer utilisation below ``UTILISATION_HELD``) in at
   least ``CONSUMER_MIN_SHARE`` of the samples in which it has a consumer: ``consumer``.
6. Otherwise ``none``.

Shares count samples, not time: the sampler takes one every 0.25 s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from amqpscope.expectations.finding_ids import (
    DIAGNOSIS_CLIENT_CHANNEL_CHURN,
    DIAGNOSIS_CLIENT_CONNECTION_CHURN,
    DIAGNOSIS_CLIENT_REQUEST_REPLY_LATENCY,
    DIAGNOSIS_CONSUMER_NEVER_ACKS,
    DIAGNOSIS_CONSUMER_PREFETCH_BOUND,
    DIAGNOSIS_CONSUMER_REDELIVERY_LOOP,
    DIAGNOSIS_NETWORK_BANDWIDTH_LIMITED,
    DIAGNOSIS_PUBLISHER_REFUSED,
    DIAGNOSIS_PUBLISHER_SLOW_SETTLEMENT,
    DIAGNOSIS_PUBLISHER_UNROUTABLE,
    DIAGNOSIS_QUEUE_BACKLOG_WITHOUT_CONSUMER,
)

MIN_SAMPLES = 2  # a state seen in one sample only is a blip, not a bottleneck
FLOW_MIN_SHARE = 0.2  # share of samples with some stage in flow
CONSUMER_MIN_SHARE = 0.5  # share of a consumed queue's samples with its consumers held back
UTILISATION_HELD = 0.5  # consumer_utilisation below this: the queue mostly cannot deliver

# Credit-flow stages in message order; the verdict names the stage after the last one in flow.
CHAIN = ("connection", "channel", "queue", "message_store")
ALARM_COMPONENTS = {"memory": "memory_alarm", "disk": "disk_alarm"}

Sample = Mapping[str, Any]


def _channel_key(channel: Mapping[str, Any]) -> str:
    return str(channel["name"])


def _connection_key(connection: Mapping[str, Any]) -> str:
    return f"{connection['peer_host']}:{connection['peer_port']}"


def _flow_verdict(sample: Sample) -> tuple[str, str] | None:
    """The bottleneck stage this sample's flow states point at, with the entity in flow furthest down."""
    queues = [q["name"] for q in sample["queues"] if q["state"] == "flow"]
    if queues:
        return "message_store", queues[0]
    channels = [_channel_key(c) for c in sample["channels"] if c["state"] == "flow"]
    if channels:
        return "queue", channels[0]
    connections = [_connection_key(c) for c in sample["connections"] if c["state"] == "flow"]
    if connections:
        return "channel", connections[0]
    return None


def _held_queues(sample: Sample) -> set[str]:
    """Queues with messages ready whose consumers are all held back in this sample."""
    channels = {c["pid"]: c for c in sample["channels"]}
    held = set()
    for queue in sample["queues"]:
        if queue["messages_ready"] <= 0 or queue["consumers"] <= 0:
            continue
        consumers = [c for c in sample.get("consumers", []) if c["queue"] == queue["name"]]
        at_prefetch = [_at_prefetch(c, channels.get(c["channel_pid"])) for c in consumers]
        utilisation = queue.get("consumer_utilisation")
        if (at_prefetch and all(at_prefetch)) or (utilisation is not None and utilisation < UTILISATION_HELD):
            held.add(queue["name"])
    return held


def _at_prefetch(consumer: Mapping[str, Any], channel: Mapping[str, Any] | None) -> bool:
    if channel is None or not consumer["ack_required"]:
        return False
    limits = [n for n in (consumer["prefetch_count"], channel["global_prefetch_count"]) if n > 0]
    return bool(limits) and channel["messages_unacknowledged"] >= min(limits)


def expected_bottleneck(truth: Mapping[str, Any]) -> tuple[str, str | None]:
    """``(component, entity)`` by the rule of this module's docstring; entity None for ``none``."""
    samples: Sequence[Sample] = truth["broker_states"]["samples"]
    if not samples:
        raise ValueError("no broker samples in the truth file")
    alarms = Counter(resource for s in samples for resource in set(s["alarms"]))
    if alarms:
        resource, seen = max(alarms.items(), key=lambda item: (item[1], item[0]))
        if seen >= MIN_SAMPLES:
            return ALARM_COMPONENTS.get(resource, "alarm"), resource

    verdicts = [v for v in map(_flow_verdict, samples) if v is not None]
    if len(verdicts) >= MIN_SAMPLES and len(verdicts) >= FLOW_MIN_SHARE * len(samples):
        counts = Counter(component for component, _ in verdicts)
        component = max(counts, key=lambda c: (counts[c], CHAIN.index(c)))
        entities = Counter(entity for c, entity in verdicts if c == component)
        return component, entities.most_common(1)[0][0]

    blind = truth.get("broker_summary", {}).get("broker_blind")
    if blind:
        return str(blind["component"]), blind.get("entity")

    fullest = max(((q["messages_ready"], q["name"]) for s in samples for q in s["queues"]), default=(0, None))[1]
    if refused_publishes(samples) and fullest is not None:
        return "queue", fullest
    if connection_churn(samples) or channel_churn(samples):
        hosts = Counter(c["peer_host"] for s in samples for c in s["connections"])
        return "client", hosts.most_common(1)[0][0] if hosts else "unknown"
    if redelivery_loop(samples):
        consumed = Counter(q["name"] for s in samples for q in s["queues"] if q["consumers"] > 0)
        return "consumer", consumed.most_common(1)[0][0] if consumed else "unknown"
    never = never_acking_channels(samples)
    if never:
        return "consumer", min(never)
    held = _held_consumer(samples)
    if held is not None:
        return "consumer", held
    return "none", None


def _held_consumer(samples: Sequence[Sample]) -> str | None:
    """The queue whose consumers are held back in the largest share of its consumed samples (rule 5)."""
    consumed = Counter(q["name"] for s in samples for q in s["queues"] if q["consumers"] > 0)
    held = Counter(name for s in samples for name in _held_queues(s))
    candidates = [
        (held[name] / consumed[name], name)
        for name in held
        if held[name] >= MIN_SAMPLES and held[name] >= CONSUMER_MIN_SHARE * consumed[name]
    ]
    return max(candidates)[1] if candidates else None


# -- the summary written beside the samples -----------------------------------------------------


def _shares(states: Counter[str], total: int) -> dict[str, float]:
    return {state: round(count / total, 3) for state, count in sorted(states.items())}


def broker_summary(samples: Sequence[Sample], facts: Mapping[str, Any]) -> dict[str, Any]:
    """Per entity the share of samples in each state, the alarms with their times, and the
    client-side facts (roles by client port, queues, sizes, persistence, prefetch)."""
    connections: dict[str, dict[str, Any]] = {}
    channels: dict[str, dict[str, Any]] = {}
    queues: dict[str, dict[str, Any]] = {}
    alarms: dict[str, dict[str, Any]] = {}
    states: dict[tuple[str, str], Counter[str]] = {}
    roles: dict[int, set[str]] = {}
    for client in facts.get("clients", []):
        roles.setdefault(client["client_port"], set()).add(client["role"])
    for sample in samples:
        for connection in sample["connections"]:
            key = _connection_key(connection)
            entry = connections.setdefault(
                key,
                {
                    "name": connection["name"],
                    "connection_name": connection["connection_name"],
                    "protocol": connection["protocol"],
                    "samples": 0,
                    "role": "+".join(sorted(roles.get(connection["peer_port"], ()))) or None,
                },
            )
            entry["samples"] += 1
            # Client properties arrive with connection.start-ok: the first samples may not have them.
            entry["connection_name"] = entry["connection_name"] or connection["connection_name"]
            states.setdefault(("connection", key), Counter())[connection["state"]] += 1
        for channel in sample["channels"]:
            key = _channel_key(channel)
            entry = channels.setdefault(
                key,
                {
                    "peer_port": channel["peer_port"],
                    "number": channel["number"],
                    "samples": 0,
                    "max_unacknowledged": 0,
                    "prefetch_count": channel["prefetch_count"],
                    "max_consumers": 0,
                },
            )
            entry["samples"] += 1
            entry["max_unacknowledged"] = max(entry["max_unacknowledged"], channel["messages_unacknowledged"])
            entry["max_consumers"] = max(entry["max_consumers"], channel["consumer_count"])
            states.setdefault(("channel", key), Counter())[channel["state"]] += 1
        held = _held_queues(sample)
        for queue in sample["queues"]:
            entry = queues.setdefault(
                queue["name"],
                {
                    "samples": 0,
                    "samples_with_ready": 0,
                    "max_ready": 0,
                    "max_consumers": 0,
                    "samples_consumers_held": 0,
                    "min_consumer_utilisation": None,
                },
            )
            entry["samples"] += 1
            entry["samples_with_ready"] += queue["messages_ready"] > 0
            entry["max_ready"] = max(entry["max_ready"], queue["messages_ready"])
            entry["max_consumers"] = max(entry["max_consumers"], queue["consumers"])
            entry["samples_consumers_held"] += queue["name"] in held
            utilisation = queue.get("consumer_utilisation")
            if utilisation is not None:
                low = entry["min_consumer_utilisation"]
                entry["min_consumer_utilisation"] = utilisation if low is None else min(low, utilisation)
            states.setdefault(("queue", queue["name"]), Counter())[queue["state"]] += 1
        for resource in sample["alarms"]:
            entry = alarms.setdefault(resource, {"resource": resource, "first_ts_us": sample["ts_us"], "samples": 0})
            entry["last_ts_us"] = sample["ts_us"]
            entry["samples"] += 1
    for kind, table in (("connection", connections), ("channel", channels), ("queue", queues)):
        for key, entry in table.items():
            entry["state_shares"] = _shares(states[(kind, key)], entry["samples"])
    flow_samples = Counter(
        kind
        for sample in samples
        for kind, rows in (
            ("connection", sample["connections"]),
            ("channel", sample["channels"]),
            ("queue", sample["queues"]),
        )
        if any(row["state"] == "flow" for row in rows)
    )
    blocked_samples = sum(1 for s in samples if any(c["state"] in ("blocked", "blocking") for c in s["connections"]))
    total = len(samples)
    return {
        "samples": total,
        "first_ts_us": samples[0]["ts_us"] if samples else None,
        "last_ts_us": samples[-1]["ts_us"] if samples else None,
        # Share of samples in which at least one entity of the kind was in that state.
        "share_of_samples": {
            "connection_flow": round(flow_samples["connection"] / total, 3) if total else 0.0,
            "channel_flow": round(flow_samples["channel"] / total, 3) if total else 0.0,
            "queue_flow": round(flow_samples["queue"] / total, 3) if total else 0.0,
            "connection_blocked_or_blocking": round(blocked_samples / total, 3) if total else 0.0,
        },
        "connections": connections,
        "channels": channels,
        "queues": queues,
        "alarms": list(alarms.values()),
        "clients": facts.get("clients", []),
        "broker_blind": facts.get("broker_blind"),
    }


# -- problems: the findings a capture should give, from the broker's states and counters -------------
#
# ``expected_findings(truth)`` names the diagnosis rules (ids of expectations/bottlenecks.yml) a
# capture must raise. The broker's running totals (``counters`` of each sample, the node's since it
# started: a capture's figure is the last sample's minus the first's) and its per-sample states
# show what the broker sees; where it is blind (a caller waiting for its replies, a link's rate),
# the client's own record (``ground_truth``) is the truth. Each threshold's argument:

# A client that opens its connections once makes a handful at start-up (one per role or a small
# pool); RabbitMQ's connection guide calls connections "long-lived" and names a high rate of opened
# and closed connections "churn" that costs the node (https://www.rabbitmq.com/docs/connections,
# "High Connection Churn"). Ten a second sustained over at least CHURN_MIN_CREATED connections is
# no start-up: a process opening its pool at once makes ~1-20 in well under a second, and none after.
CHURN_PER_SECOND = 10.0
CHURN_MIN_CREATED = 20
# A redelivery is a message requeued (nack/reject with requeue, or a channel closed with it
# unacked). A consumer that requeues the odd message after a transient failure redelivers a few
# percent of what it gets; a message it can never process comes back as soon as it is requeued, so
# redeliveries make most deliveries. More than half, and at least REDELIVERY_MIN of them.
REDELIVERY_SHARE = 0.5
REDELIVERY_MIN = 100
# The broker nacks a publish only when it cannot take it (a queue's overflow=reject-publish, an
# internal error: https://www.rabbitmq.com/docs/confirms#server-sent-nacks); each nack is a message
# the publisher must handle. A few in a capture can be one burst against a momentary limit; at least
# REFUSED_MIN and REFUSED_SHARE of the confirmed publishes is a queue refusing steadily.
REFUSED_MIN = 10
REFUSED_SHARE = 0.01
# basic.return 312 NO_ROUTE: a mandatory publish that reached no queue. Same reasoning.
UNROUTABLE_MIN = 10
UNROUTABLE_SHARE = 0.01
# Without basic.qos RabbitMQ sends a consumer every message (unlimited prefetch). RabbitMQ's docs
# suggest prefetch values of 100-300 for throughput (https://www.rabbitmq.com/docs/confirms,
# "Channel Prefetch Setting (QoS)"); a channel with NEVER_ACK_MIN_UNACKED unacked deliveries whose
# count never falls between samples has not acked one of them while more came.
NEVER_ACK_MIN_UNACKED = 1000
# Request-reply: a call is a request and its reply crossing the broker, four hops. With a responder
# that answers at once, pika callers here took 6-10 ms a call on median on the loaded 2-core
# machine (their event loop's polling included; well under a millisecond unloaded). A median call of
# CALL_SLOW_US, twice that, with most of it (RESPONDER_SHARE) spent in the responder between taking
# the request and writing its reply, is a caller waiting on its responder, not on the broker.
CALL_SLOW_US = 20_000
RESPONDER_SHARE = 0.5
# AMQP 1.0 unsettled transfers: RabbitMQ settles each once its queue has the message, within
# milliseconds when it keeps up. A median of SETTLE_SLOW_US after the sender wrote it means the
# broker read and queued the transfers seconds behind the sender.
SETTLE_SLOW_US = 1_000_000
# A link's rate cap: the publisher's throughput at LINK_SHARE of the link's rate or more, with
# retransmissions (the cap's queue dropping what does not fit), is the link holding it back.
LINK_SHARE = 0.8
# A queue nobody consumes during the whole capture while its ready count reaches BACKLOG_MIN_READY.
# Fewer is what a buffer filled before its consumers start, or a publisher's first batch, leaves in
# a capture of seconds; RabbitMQ's docs ask to keep queues short, a long queue costing memory and
# paging (https://www.rabbitmq.com/docs/memory-use, https://www.rabbitmq.com/docs/queues).
BACKLOG_MIN_READY = 1000


def _counter_delta(samples: Sequence[Sample], name: str) -> int | None:
    with_counters = [s["counters"] for s in samples if s.get("counters")]
    if len(with_counters) < MIN_SAMPLES:
        return None
    return int(with_counters[-1].get(name, 0)) - int(with_counters[0].get(name, 0))


def _span_seconds(samples: Sequence[Sample]) -> float:
    return max(1e-6, (samples[-1]["ts_us"] - samples[0]["ts_us"]) / 1e6)


def _clients(truth: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for part in truth.get("ground_truth", {}).values() for c in part.get("clients", [])]


def connection_churn(samples: Sequence[Sample]) -> bool:
    created = _counter_delta(samples, "connection_created")
    return created is not None and created >= CHURN_MIN_CREATED and created / _span_seconds(samples) >= CHURN_PER_SECOND


def channel_churn(samples: Sequence[Sample]) -> bool:
    """Channels opened beyond one per new connection, at the churn rate."""
    channels, connections = _counter_delta(samples, "channel_created"), _counter_delta(samples, "connection_created")
    if channels is None or connections is None:
        return False
    extra = channels - connections
    return extra >= CHURN_MIN_CREATED and extra / _span_seconds(samples) >= CHURN_PER_SECOND


def redelivery_loop(samples: Sequence[Sample]) -> bool:
    redelivered, delivered = (
        _counter_delta(samples, n) for n in ("messages_redelivered_total", "messages_delivered_total")
    )
    if redelivered is None or not delivered:
        return False
    return redelivered >= REDELIVERY_MIN and redelivered > REDELIVERY_SHARE * delivered


def refused_publishes(samples: Sequence[Sample]) -> int:
    """Publishes the broker nacked: received under confirms, not confirmed (the node counts the
    acks it sends as ``messages_confirmed_total``, and every publish on a confirm channel)."""
    received, confirmed = (
        _counter_delta(samples, n) for n in ("messages_received_confirm_total", "messages_confirmed_total")
    )
    if received is None or confirmed is None:
        return 0
    refused = received - confirmed
    return refused if refused >= REFUSED_MIN and refused >= REFUSED_SHARE * received else 0


def unroutable_returns(samples: Sequence[Sample]) -> bool:
    returned, received = (
        _counter_delta(samples, n) for n in ("messages_unroutable_returned_total", "messages_received_total")
    )
    if returned is None or not received:
        return False
    return returned >= UNROUTABLE_MIN and returned >= UNROUTABLE_SHARE * received


def never_acking_channels(samples: Sequence[Sample]) -> set[str]:
    """Channels whose unacked count reached NEVER_ACK_MIN_UNACKED without ever falling."""
    series: dict[str, list[int]] = {}
    for sample in samples:
        for channel in sample["channels"]:
            if channel["consumer_count"] > 0:
                series.setdefault(str(channel["name"]), []).append(channel["messages_unacknowledged"])
    return {
        name
        for name, counts in series.items()
        if max(counts) >= NEVER_ACK_MIN_UNACKED and all(b >= a for a, b in zip(counts, counts[1:]))
    }


def backlog_without_consumer(samples: Sequence[Sample]) -> set[str]:
    """Queues with BACKLOG_MIN_READY messages or more and no consumer in any sample."""
    ready: dict[str, int] = {}
    consumed: set[str] = set()
    for sample in samples:
        for queue in sample["queues"]:
            ready[queue["name"]] = max(ready.get(queue["name"], 0), queue["messages_ready"])
            if queue["consumers"] > 0:
                consumed.add(queue["name"])
    return {name for name, most in ready.items() if most >= BACKLOG_MIN_READY and name not in consumed}


def slow_replies(truth: Mapping[str, Any]) -> bool:
    callers = [c for c in _clients(truth) if c.get("rpc") == "caller" and c.get("calls")]
    return any(
        c["median_call_us"] >= CALL_SLOW_US and c["median_responder_us"] >= RESPONDER_SHARE * c["median_call_us"]
        for c in callers
    )


def slow_settlement(truth: Mapping[str, Any]) -> bool:
    delays = [c.get("median_settle_delay_us") for c in _clients(truth) if c.get("protocol") == "amqp-1.0"]
    return any(d is not None and d >= SETTLE_SLOW_US for d in delays)


def link_bound(truth: Mapping[str, Any]) -> bool:
    links = [c for c in _clients(truth) if c.get("link_rate_bits_per_second")]
    return any(
        c["throughput_bits_per_second"] >= LINK_SHARE * c["link_rate_bits_per_second"] and c["retransmissions"] > 0
        for c in links
    )


def expected_findings(truth: Mapping[str, Any]) -> set[str]:
    """The rule ids a capture must raise, from the broker's view and, where it is blind, the clients'.

    ``diagnosis.consumer.prefetch_bound`` follows ``expected_bottleneck``'s held consumers (rule 5 of
    the module docstring), except on a queue whose deliveries are mostly redeliveries: a consumer
    looping over one message it requeues is at its prefetch because of the loop, not its pace."""
    samples: Sequence[Sample] = truth["broker_states"]["samples"]
    loop = redelivery_loop(samples)
    findings = {rule for rule, seen in _SEEN_BY_BROKER if seen(samples)}
    findings |= {rule for rule, seen in _SEEN_BY_CLIENTS if seen(truth)}
    if _held_consumer(samples) is not None and not loop:
        findings.add(DIAGNOSIS_CONSUMER_PREFETCH_BOUND)
    return findings


# The rules the broker's samples call for, and those only the clients' record shows (the broker is blind).
_SEEN_BY_BROKER: tuple[tuple[str, Any], ...] = (
    (DIAGNOSIS_CONSUMER_REDELIVERY_LOOP, redelivery_loop),
    (DIAGNOSIS_CONSUMER_NEVER_ACKS, never_acking_channels),
    (DIAGNOSIS_QUEUE_BACKLOG_WITHOUT_CONSUMER, backlog_without_consumer),
    (DIAGNOSIS_CLIENT_CONNECTION_CHURN, connection_churn),
    (DIAGNOSIS_CLIENT_CHANNEL_CHURN, channel_churn),
    (DIAGNOSIS_PUBLISHER_REFUSED, refused_publishes),
    (DIAGNOSIS_PUBLISHER_UNROUTABLE, unroutable_returns),
)
_SEEN_BY_CLIENTS: tuple[tuple[str, Any], ...] = (
    (DIAGNOSIS_CLIENT_REQUEST_REPLY_LATENCY, slow_replies),
    (DIAGNOSIS_PUBLISHER_SLOW_SETTLEMENT, slow_settlement),
    (DIAGNOSIS_NETWORK_BANDWIDTH_LIMITED, link_bound),
)
