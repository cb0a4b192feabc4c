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
   ../shared/DOMAIN.md section 5): messages pass reader (connection) -> channel -> queue ->
   message store; each process grants its upstream credit and a process out of credit shows
   state ``flow``, so a slow stage pushes ``flow`` upstream and *the bottleneck is the first
   stage downstream of the last one in flow*. Per sample: a queue in flow -> ``message_store``;
   else a channel in flow -> ``queue``; else a connection in flow -> ``channel``. When samples
   with any of these make at least ``FLOW_MIN_SHARE`` of the samples (and ``MIN_SAMPLES``), the
   component is the verdict of most of them (a tie goes to the stage further downstream).
3. **The client, where the broker cannot see it**: a client that does not read its socket looks,
   from inside the broker, like a consumer that does not ack (or like nothing at all); the
   scenario records what its client did in ``broker_blind`` and that is the truth: ``client``.
4. **A slow consumer**: a queue that has messages ready and a consumer, whose consumers are all
   held back (a channel's unacknowledged count at its prefetch, or, for credit-based consumers
   such as AMQP 1.0 links, the queue's consumer utilisation below ``UTILISATION_HELD``) in at
   least ``CONSUMER_MIN_SHARE`` of the samples in which it has a consumer: ``consumer``.
5. Otherwise ``none``.

Shares count samples, not time: the sampler takes one every 0.25 s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

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

    consumed = Counter(q["name"] for s in samples for q in s["queues"] if q["consumers"] > 0)
    held = Counter(name for s in samples for name in _held_queues(s))
    candidates = [
        (held[name] / consumed[name], name)
        for name in held
        if held[name] >= MIN_SAMPLES and held[name] >= CONSUMER_MIN_SHARE * consumed[name]
    ]
    if candidates:
        return "consumer", max(candidates)[1]
    return "none", None


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
