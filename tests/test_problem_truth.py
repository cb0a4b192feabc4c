"""The problem rules of testbed/truth.py (``expected_findings`` and the counter rules of
``expected_bottleneck``) on hand-made broker states: each rule and its near miss."""

from __future__ import annotations

from typing import Any

from testbed import truth as rules
from testbed.broker_states import parse_sample
from testbed.truth import expected_bottleneck, expected_findings
from tests.test_truth_rule import channel, connection, consumer, queue, sample

PUBLISHER, CONSUMER = 41001, 41002
SAMPLES = 12  # 2.75 s of samples


def counted(totals_at: Any, **shape: Any) -> list[dict]:
    """SAMPLES samples; sample i carries the running totals ``totals_at(i)``."""
    samples = []
    for i in range(SAMPLES):
        one = sample(i, **shape)
        one["counters"] = totals_at(i)
        samples.append(one)
    return samples


def truth(samples: list[dict], clients: list[dict] | None = None, blind: dict | None = None) -> dict:
    return {
        "scenario": "s",
        "ground_truth": {"s": {"clients": clients or []}},
        "broker_states": {"samples": samples},
        "broker_summary": {"broker_blind": blind},
    }


def linear(**per_sample: int) -> Any:
    """Totals growing by ``per_sample`` each sample, from an arbitrary start (the node's earlier life)."""
    return lambda i: {name: 1000 + step * i for name, step in per_sample.items()}


def steady() -> dict[str, Any]:
    return {
        "connections": [connection(PUBLISHER)],
        "channels": [channel(PUBLISHER)],
        "queues": [queue("work", ready=0, consumers=1)],
    }


def test_steady_traffic_gives_no_finding() -> None:
    samples = counted(linear(messages_received_total=25, messages_delivered_total=25), **steady())
    assert expected_findings(truth(samples)) == set()
    assert expected_bottleneck(truth(samples)) == ("none", None)


def test_connections_opened_at_a_churn_rate() -> None:
    # 12 a sample is 48 a second, 132 in the capture: far above start-up.
    samples = counted(linear(connection_created=12, channel_created=12, messages_received_total=12), **steady())
    assert expected_findings(truth(samples)) == {"diagnosis.client.connection_churn"}
    assert expected_bottleneck(truth(samples)) == ("client", "127.0.0.1")


def test_a_pool_opened_at_start_is_no_churn() -> None:
    # 19 connections at once (a pool), then none: fewer than CHURN_MIN_CREATED.
    samples = counted(lambda i: {"connection_created": 19 if i else 0, "channel_created": 19 if i else 0}, **steady())
    assert expected_findings(truth(samples)) == set()


def test_channels_opened_and_closed_on_one_connection() -> None:
    samples = counted(linear(connection_created=0, channel_created=10), **steady())
    assert expected_findings(truth(samples)) == {"diagnosis.client.channel_churn"}


def test_mostly_redeliveries_is_a_loop() -> None:
    shape = {
        "connections": [connection(CONSUMER)],
        "channels": [channel(CONSUMER, unacked=1, prefetch=1)],
        "queues": [queue("work", ready=200, consumers=1)],
        "consumers": [consumer("work", CONSUMER, 1)],
    }
    samples = counted(linear(messages_delivered_total=300, messages_redelivered_total=299), **shape)
    # Held at its prefetch with messages ready, yet because of the loop: not prefetch_bound.
    assert expected_findings(truth(samples)) == {"diagnosis.consumer.redelivery_loop"}
    assert expected_bottleneck(truth(samples)) == ("consumer", "work")


def test_the_odd_requeue_is_no_loop() -> None:
    samples = counted(linear(messages_delivered_total=300, messages_redelivered_total=10), **steady())
    assert expected_findings(truth(samples)) == set()


def test_publishes_nacked_by_the_broker_are_refused() -> None:
    shape = {**steady(), "queues": [queue("limited", ready=100)]}
    samples = counted(linear(messages_received_confirm_total=100, messages_confirmed_total=10), **shape)
    assert rules.refused_publishes(samples) == 90 * (SAMPLES - 1)
    assert expected_findings(truth(samples)) == {"diagnosis.publisher.refused"}
    assert expected_bottleneck(truth(samples)) == ("queue", "limited")


def test_every_publish_confirmed_is_not_refused() -> None:
    samples = counted(linear(messages_received_confirm_total=100, messages_confirmed_total=100), **steady())
    assert expected_findings(truth(samples)) == set()


def test_returns_of_unroutable_mandatory_publishes() -> None:
    samples = counted(linear(messages_received_total=50, messages_unroutable_returned_total=45), **steady())
    assert expected_findings(truth(samples)) == {"diagnosis.publisher.unroutable"}
    assert expected_bottleneck(truth(samples)) == ("none", None)


def test_a_single_return_is_no_finding() -> None:
    samples = counted(
        lambda i: {"messages_received_total": 50 * i, "messages_unroutable_returned_total": i > 5}, **steady()
    )
    assert expected_findings(truth(samples)) == set()


def _unacked(counts: list[int]) -> list[dict]:
    return [
        sample(
            i,
            connections=[connection(CONSUMER)],
            channels=[{**channel(CONSUMER, unacked=n), "consumer_count": 1}],
            queues=[queue("work", consumers=1)],
        )
        for i, n in enumerate(counts)
    ]


def test_unacked_only_growing_past_the_limit_never_acks() -> None:
    samples = _unacked([0, 150, 400, 650, 900, 1150, 1250, 1250])
    assert expected_findings(truth(samples)) == {"diagnosis.consumer.never_acks"}
    assert expected_bottleneck(truth(samples)) == ("consumer", "127.0.0.1:41002 -> 127.0.0.1:5672 (1)")


def test_unacked_high_but_falling_acks() -> None:
    samples = _unacked([0, 600, 1200, 1100, 900, 1300, 400, 0])
    assert expected_findings(truth(samples)) == set()


def test_a_queue_filling_with_nobody_consuming() -> None:
    samples = [sample(i, queues=[queue("orphan", ready=300 * i)]) for i in range(8)]
    assert expected_findings(truth(samples)) == {"diagnosis.queue.backlog_without_consumer"}
    fewer = [sample(i, queues=[queue("buffer", ready=100 * i)]) for i in range(8)]
    assert expected_findings(truth(fewer)) == set()


def _caller(call_us: int, responder_us: int) -> dict:
    return {
        "role": "publisher",
        "rpc": "caller",
        "calls": 50,
        "median_call_us": call_us,
        "median_responder_us": responder_us,
    }


def test_a_caller_waiting_on_its_responder() -> None:
    samples = counted(linear(messages_received_total=10), **steady())
    assert expected_findings(truth(samples, [_caller(45_000, 40_000)])) == {"diagnosis.client.request_reply_latency"}
    # Slow calls whose time is not the responder's, and fast calls: not this finding.
    assert expected_findings(truth(samples, [_caller(45_000, 5_000)])) == set()
    assert expected_findings(truth(samples, [_caller(8_000, 300)])) == set()


def test_transfers_settled_seconds_after_they_were_written() -> None:
    samples = counted(linear(messages_received_total=10), **steady())
    slow = {"role": "publisher", "protocol": "amqp-1.0", "median_settle_delay_us": 2_400_000}
    fast = {**slow, "median_settle_delay_us": 3_000}
    assert expected_findings(truth(samples, [slow])) == {"diagnosis.publisher.slow_settlement"}
    assert expected_findings(truth(samples, [fast])) == set()


def test_throughput_at_the_links_rate_with_retransmissions() -> None:
    samples = counted(linear(messages_received_total=10), **steady())
    capped = {
        "role": "publisher",
        "link_rate_bits_per_second": 2_000_000,
        "throughput_bits_per_second": 1_930_000,
        "retransmissions": 130,
    }
    blind = {"component": "network", "entity": "169.254.61.2:40000", "reason": "the link"}
    assert expected_findings(truth(samples, [capped], blind)) == {"diagnosis.network.bandwidth_limited"}
    assert expected_bottleneck(truth(samples, [capped], blind)) == ("network", "169.254.61.2:40000")
    under = {**capped, "throughput_bits_per_second": 330_000, "retransmissions": 0}
    assert expected_findings(truth(samples, [under])) == set()


def test_samples_without_counters_give_no_counter_finding() -> None:
    # Truth files made before the sampler read the node's totals: the counter rules stay silent.
    samples = [sample(i, **steady()) for i in range(SAMPLES)]
    assert rules.connection_churn(samples) is False and rules.refused_publishes(samples) == 0
    assert expected_findings(truth(samples)) == set()


def test_parse_sample_keeps_the_running_totals() -> None:
    line = (
        '{"ts_us":1795440111102245,"took_us":812,"alarms":[],"connections":[],"channels":[],"queues":[],'
        '"consumers":[],"counters":{"messages_redelivered_total":7,"connection_created":3}}'
    )
    assert parse_sample(line).counters == {"connection_created": 3, "messages_redelivered_total": 7}
    assert (
        parse_sample(line.replace(',"counters":{"messages_redelivered_total":7,"connection_created":3}', "")).counters
        == {}
    )
