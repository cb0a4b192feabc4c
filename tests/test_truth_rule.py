"""The truth rule (testbed/truth.py) on hand-made broker states: each branch and its near misses."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.broker_states import parse_sample
from testbed.truth import broker_summary, expected_bottleneck

PUBLISHER, CONSUMER = 40001, 40002


def connection(port: int, state: str = "running") -> dict[str, Any]:
    return {
        "peer_host": "127.0.0.1",
        "peer_port": port,
        "name": f"127.0.0.1:{port} -> 127.0.0.1:5672",
        "protocol": "AMQP 0-9-1",
        "state": state,
        "connection_name": None,
        "pid": f"<0.{port}.0>",
    }


def channel(port: int, state: str = "running", *, unacked: int = 0, prefetch: int = 0) -> dict[str, Any]:
    return {
        "peer_port": port,
        "number": 1,
        "name": f"127.0.0.1:{port} -> 127.0.0.1:5672 (1)",
        "state": state,
        "consumer_count": int(prefetch > 0),
        "messages_unacknowledged": unacked,
        "messages_unconfirmed": 0,
        "prefetch_count": prefetch,
        "global_prefetch_count": 0,
        "connection_pid": f"<0.{port}.0>",
        "pid": f"<0.{port}.1>",
    }


def queue(
    name: str, state: str = "running", *, ready: int = 0, consumers: int = 0, utilisation: float | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "state": state,
        "messages_ready": ready,
        "messages_unacknowledged": 0,
        "consumers": consumers,
        "consumer_utilisation": utilisation,
        "durable": False,
    }


def consumer(queue_name: str, port: int, prefetch: int) -> dict[str, Any]:
    return {
        "queue": queue_name,
        "consumer_tag": "ctag",
        "channel_pid": f"<0.{port}.1>",
        "ack_required": True,
        "prefetch_count": prefetch,
        "active": True,
    }


def sample(i: int, *, alarms: tuple[str, ...] = (), connections=(), channels=(), queues=(), consumers=()) -> dict:
    return {
        "ts_us": 1_700_000_000_000_000 + i * 250_000,
        "took_us": 500,
        "alarms": list(alarms),
        "connections": list(connections),
        "channels": list(channels),
        "queues": list(queues),
        "consumers": list(consumers),
    }


def truth(samples: list[dict], blind: dict | None = None) -> dict:
    return {"broker_states": {"samples": samples}, "broker_summary": {"broker_blind": blind}}


def publishing(i: int, conn: str = "running", chan: str = "running", q: str = "running", **more: Any) -> dict:
    """One publisher on one queue, its three credit-flow stages in the given states."""
    return sample(
        i,
        connections=[connection(PUBLISHER, conn)],
        channels=[channel(PUBLISHER, chan)],
        queues=[queue("work", q, ready=100)],
        **more,
    )


def quiet(n: int) -> list[dict]:
    return [publishing(i) for i in range(n)]


# -- alarms -----------------------------------------------------------------------------------------


def test_memory_alarm_in_force_wins_over_flow() -> None:
    samples = [publishing(i, "flow", "flow", alarms=("memory",)) for i in range(3)] + quiet(7)
    assert expected_bottleneck(truth(samples)) == ("memory_alarm", "memory")


def test_disk_alarm() -> None:
    samples = quiet(5) + [publishing(5 + i, "blocked", alarms=("disk",)) for i in range(4)]
    assert expected_bottleneck(truth(samples)) == ("disk_alarm", "disk")


def test_alarm_seen_in_one_sample_only_is_a_blip() -> None:
    samples = [publishing(0, "blocked", alarms=("memory",))] + quiet(9)
    assert expected_bottleneck(truth(samples)) == ("none", None)


# -- credit flow ------------------------------------------------------------------------------------


def test_connection_in_flow_alone_points_at_the_channel() -> None:
    samples = [publishing(i, "flow") for i in range(4)] + quiet(6)
    assert expected_bottleneck(truth(samples)) == ("channel", f"127.0.0.1:{PUBLISHER}")


def test_connection_and_channel_in_flow_point_at_the_queue() -> None:
    samples = (
        [publishing(i, "flow", "flow") for i in range(5)] + [publishing(5 + i, "flow") for i in range(2)] + quiet(3)
    )
    assert expected_bottleneck(truth(samples)) == ("queue", f"127.0.0.1:{PUBLISHER} -> 127.0.0.1:5672 (1)")


def test_all_three_in_flow_point_at_the_message_store() -> None:
    samples = [publishing(i, "flow", "flow", "flow") for i in range(6)] + quiet(4)
    assert expected_bottleneck(truth(samples)) == ("message_store", "work")


def test_flow_in_few_samples_is_not_a_bottleneck() -> None:
    # 1 sample in 10 is below FLOW_MIN_SHARE (0.2) and MIN_SAMPLES (2).
    samples = [publishing(0, "flow", "flow")] + quiet(9)
    assert expected_bottleneck(truth(samples)) == ("none", None)


def test_flow_tie_goes_downstream() -> None:
    samples = [publishing(i, "flow") for i in range(3)] + [publishing(3 + i, "flow", "flow") for i in range(3)]
    assert expected_bottleneck(truth(samples))[0] == "queue"


# -- consumers --------------------------------------------------------------------------------------


def consuming(i: int, *, unacked: int, ready: int, prefetch: int = 10, utilisation: float | None = None) -> dict:
    return sample(
        i,
        connections=[connection(CONSUMER)],
        channels=[channel(CONSUMER, unacked=unacked, prefetch=prefetch)],
        queues=[queue("jobs", ready=ready, consumers=1, utilisation=utilisation)],
        consumers=[consumer("jobs", CONSUMER, prefetch)],
    )


def test_consumer_held_at_prefetch_with_messages_ready() -> None:
    samples = [consuming(i, unacked=10, ready=200 - i) for i in range(8)] + [consuming(8, unacked=3, ready=0)]
    assert expected_bottleneck(truth(samples)) == ("consumer", "jobs")


def test_fast_consumer_at_prefetch_with_an_empty_queue_is_not_a_bottleneck() -> None:
    # Pipelining at its prefetch is what a fast consumer does; nothing waits in the queue.
    samples = [consuming(i, unacked=10, ready=0) for i in range(10)]
    assert expected_bottleneck(truth(samples)) == ("none", None)


def test_messages_ready_but_consumer_below_prefetch_is_not_held() -> None:
    samples = [consuming(i, unacked=4, ready=50) for i in range(10)]
    assert expected_bottleneck(truth(samples)) == ("none", None)


def test_consumer_held_in_a_minority_of_samples_is_not_a_bottleneck() -> None:
    samples = [consuming(i, unacked=10, ready=5) for i in range(3)] + [
        consuming(3 + i, unacked=2, ready=0) for i in range(7)
    ]
    assert expected_bottleneck(truth(samples)) == ("none", None)


def test_credit_based_consumer_held_by_low_utilisation() -> None:
    # AMQP 1.0 links consume by credit, without a prefetch: the queue's consumer utilisation tells.
    samples = [consuming(i, unacked=0, ready=300, prefetch=0, utilisation=0.05) for i in range(6)]
    assert expected_bottleneck(truth(samples)) == ("consumer", "jobs")


def test_credit_based_consumer_with_high_utilisation_is_not_held() -> None:
    samples = [consuming(i, unacked=0, ready=3, prefetch=0, utilisation=0.9) for i in range(6)]
    assert expected_bottleneck(truth(samples)) == ("none", None)


# -- what the broker cannot see ---------------------------------------------------------------------


def test_client_not_reading_is_the_clients_truth_over_a_held_consumer() -> None:
    samples = [consuming(i, unacked=10, ready=20) for i in range(6)]
    blind = {"component": "client", "entity": "127.0.0.1:40002", "reason": "reads slowly"}
    assert expected_bottleneck(truth(samples, blind)) == ("client", "127.0.0.1:40002")


def test_flow_in_force_wins_over_what_the_client_says() -> None:
    samples = [publishing(i, "flow") for i in range(6)]
    blind = {"component": "client", "entity": "127.0.0.1:40002", "reason": "reads slowly"}
    assert expected_bottleneck(truth(samples, blind))[0] == "channel"


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        expected_bottleneck(truth([]))


# -- the summary and the sample parser --------------------------------------------------------------


def test_summary_shares_per_entity_and_alarm_times() -> None:
    samples = [publishing(i, "flow", "flow") for i in range(3)] + [publishing(3, "blocked", alarms=("memory",))]
    facts = {"clients": [{"role": "publisher", "client_port": PUBLISHER, "queue": "work"}]}
    summary = broker_summary(samples, facts)
    key = f"127.0.0.1:{PUBLISHER}"
    assert summary["connections"][key]["state_shares"] == {"blocked": 0.25, "flow": 0.75}
    assert summary["connections"][key]["role"] == "publisher"
    assert summary["share_of_samples"]["channel_flow"] == 0.75
    assert summary["share_of_samples"]["connection_blocked_or_blocking"] == 0.25
    assert summary["alarms"] == [
        {"resource": "memory", "first_ts_us": samples[3]["ts_us"], "last_ts_us": samples[3]["ts_us"], "samples": 1}
    ]


def test_parse_sample_of_the_loops_json() -> None:
    line = (
        '{"ts_us":1795440111102245,"took_us":812,"alarms":[{"resource":"memory","node":"rabbit@localhost"}],'
        '"connections":[{"pid":"<0.695.0>","name":"127.0.0.1:51966 -> 127.0.0.1:5672","peer_host":"127.0.0.1",'
        '"peer_port":51966,"protocol":"{0,9,1}","state":"blocked","client_properties":"pub"}],'
        '"channels":[{"pid":"<0.702.0>","connection":"<0.695.0>","number":1,"name":"x (1)","state":"running",'
        '"consumer_count":0,"messages_unacknowledged":0,"messages_unconfirmed":3,"prefetch_count":0,'
        '"global_prefetch_count":0}],'
        '"queues":[{"name":"q","state":"running","messages_ready":7,"messages_unacknowledged":0,"consumers":0,'
        '"consumer_utilisation":"","durable":false}],"consumers":[]}'
    )
    parsed = parse_sample(line)
    assert parsed.ts_us == 1795440111102245
    assert parsed.alarms == ("memory",)
    assert (parsed.connections[0].protocol, parsed.connections[0].state) == ("AMQP 0-9-1", "blocked")
    assert parsed.connections[0].connection_name == "pub"
    assert (parsed.channels[0].peer_port, parsed.channels[0].messages_unconfirmed) == (51966, 3)
    assert (parsed.queues[0].messages_ready, parsed.queues[0].consumer_utilisation) == (7, None)
