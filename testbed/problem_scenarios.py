"""Problem scenarios: popular client libraries used the way that makes RabbitMQ traffic go wrong,
each with a near miss that is healthy, captured with the broker's own states.

The clients are unmodified libraries from PyPI (Celery with kombu and py-amqp, aio-pika, kombu,
pika, python-qpid-proton; ``testbed.problem_clients``, ``testbed.problem_pika``). While each
runs, ``testbed.broker_states`` samples the broker every 0.25 s, its running totals included
(redeliveries, returns, confirms, connections and channels opened). ``INTENDED`` is the
bottleneck each is built to make and ``FINDINGS`` the rules it should raise;
``testbed.truth.expected_bottleneck`` and ``expected_findings`` read both from the broker's
states, and from the clients' record where the broker cannot see the problem (``broker_blind``).

    python -m testbed.problem_scenarios --out samples/problems   # root: tcpdump
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as distribution_version
from pathlib import Path
from typing import Any

from amqpscope.expectations import finding_ids as ids
from testbed import bottleneck_clients as clients
from testbed import problem_clients as pc
from testbed import problem_pika as pp
from testbed.amqp10_clients import sender as amqp10_sender
from testbed.broker import PrivateBroker
from testbed.broker_states import BrokerStateSampler
from testbed.capture import capture_scenario, default_capture_port, truth_path
from testbed.scenarios import CLIENT_SCENARIOS, SCENARIOS, Truth
from testbed.truth import broker_summary

PREFIX = "amqpscope.pr."
LIBRARIES = ("celery", "kombu", "amqp", "aio-pika", "aiormq", "pika", "python-qpid-proton")


def _facts(scenario: str, roles: list[dict[str, Any]], **more: Any) -> Truth:
    return {"scenario": scenario, "clients": roles, **more}


def _publish(
    host: str, port: int, queue: str, bodies: list[bytes], name: str, rate: float | None = None
) -> dict[str, Any]:
    """pika: publish ``bodies`` to ``queue``, ``rate`` a second or at once."""
    connection = clients.connect(host, port, name)
    try:
        client_port = clients.local_port(connection)
        channel = connection.channel()
        started = time.monotonic()
        for index, body in enumerate(bodies):
            if rate is not None:
                connection.process_data_events(time_limit=max(0.0, started + index / rate - time.monotonic()))
            channel.basic_publish("", queue, body)
        channel.close()
    finally:
        connection.close()
    return pc.role_facts(
        "publisher", client_port, name, "pika", queue=queue, messages=len(bodies), rate_per_second=rate
    )


# -- Celery: a worker slower than its producer, and one that keeps up -------------------------------


def _celery(host: str, port: int, scenario: str, work_seconds: float, rate: float | None, tasks: int) -> Truth:
    queue = PREFIX + scenario
    worker = pc.CeleryWorker(host, port, queue, work_seconds, prefetch_multiplier=4)
    worker.start()
    try:
        warm = pc.celery_producer(host, port, queue, None, 1, "celery producer (first task)")
        worker.wait_done(1)  # the worker consumes: the capture's traffic starts
        producer = pc.celery_producer(host, port, queue, rate, tasks)
        time.sleep(2.0)
    finally:
        worker.stop()
    consumer = worker.facts()
    clients.delete(host, port, (queue,), fanout=queue)  # Celery declares an exchange named as the queue
    return _facts(scenario, [warm, producer, consumer])


def celery_slow_worker(host: str, port: int) -> Truth:
    """A Celery worker (solo pool, prefetch multiplier 4: basic.qos 4, global) doing 50 ms per task
    while a producer sends 600 tasks at 300 a second: the queue grows to hundreds."""
    return _celery(host, port, "celery_slow_worker", 0.05, 300.0, 600)


def celery_worker_keeps_up(host: str, port: int) -> Truth:
    """Near miss: the same worker doing 2 ms per task, fed 150 tasks at 50 a second."""
    return _celery(host, port, "celery_worker_keeps_up", 0.002, 50.0, 150)


# -- aio-pika: a slow consumer with prefetch 20 -----------------------------------------------------


def _aio_slow(host: str, port: int, scenario: str, messages: int, rate: float | None) -> Truth:
    queue = PREFIX + scenario
    clients.declare(host, port, (queue,))
    publisher, consumer = pc.in_threads(
        lambda: pc.aio_publisher(host, port, queue, messages, rate, 128, "aio-pika publisher"),
        lambda: pc.aio_consumer(
            host, port, queue, prefetch=20, work_seconds=0.05, ack=True, seconds=4.0, name="aio-pika consumer"
        ),
    )
    clients.delete(host, port, (queue,))
    return _facts(scenario, [publisher, consumer])


def aio_pika_slow_consumer(host: str, port: int) -> Truth:
    """3 000 messages published at once; an aio-pika consumer (prefetch 20) awaiting 50 ms of work on
    each for 4 s (aio-pika runs a callback per delivery: up to 20 at a time, ~400 a second)."""
    return _aio_slow(host, port, "aio_pika_slow_consumer", 3000, None)


def aio_pika_paced_publisher(host: str, port: int) -> Truth:
    """Near miss: the same consumer, the publisher at 50 messages a second for 3 s."""
    return _aio_slow(host, port, "aio_pika_paced_publisher", 150, 50.0)


# -- kombu: a connection per publish ----------------------------------------------------------------

CHURN_RATE = 40.0  # per publishing thread
CHURN_PUBLISHERS = 4
CHURN_SECONDS = 3.0


def _kombu(host: str, port: int, scenario: str, per_message: bool) -> Truth:
    queue = PREFIX + scenario
    clients.declare(host, port, (queue,))
    messages = int(CHURN_RATE * CHURN_SECONDS) * CHURN_PUBLISHERS
    consumer, *publishers = pc.in_threads(
        lambda: clients.consumer(host, port, queue, messages, 50, "orders consumer"),
        *(
            (
                lambda i=i: pc.kombu_publisher(
                    host, port, queue, CHURN_RATE, CHURN_SECONDS, per_message=per_message, name=f"kombu publisher {i}"
                )
            )
            for i in range(1, CHURN_PUBLISHERS + 1)
        ),
    )
    clients.delete(host, port, (queue,))
    return _facts(scenario, [*publishers, consumer])


def connection_churn(host: str, port: int) -> Truth:
    """Four kombu publishers, 40 messages a second each for 3 s, each message on a new connection;
    a pika consumer takes them."""
    return _kombu(host, port, "connection_churn", per_message=True)


def connection_reused(host: str, port: int) -> Truth:
    """Near miss: the same rate, each publisher on one connection."""
    return _kombu(host, port, "connection_reused", per_message=False)


# -- pika: a message requeued forever ---------------------------------------------------------------


def _requeue(host: str, port: int, scenario: str, forever: bool, prefetch: int, rate: float | None) -> Truth:
    """The poison message, then 200 good ones: all before the consumer starts (``rate`` None), or
    published ``rate`` a second while it consumes."""
    queue, dead = PREFIX + scenario, PREFIX + scenario + ".dead"
    clients.declare(host, port, (dead,))
    clients.declare(host, port, (queue,), arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    good = [json.dumps({"order": i, "quantity": 1}).encode() for i in range(200)]

    def consume() -> dict[str, Any]:
        return pp.nacking_consumer(
            host,
            port,
            queue,
            prefetch=prefetch,
            requeue_forever=forever,
            max_redeliveries=3000,
            good_messages=len(good),
            name="orders consumer",
        )

    if rate is None:
        filler = _publish(host, port, queue, [pp.POISON, *good], "orders publisher")
        consumer = consume()
    else:
        poison = _publish(host, port, queue, [pp.POISON], "orders publisher (the poison message)")
        consumer, publisher = pc.in_threads(
            consume, lambda: _publish(host, port, queue, good, "orders publisher", rate=rate)
        )
        filler = {**publisher, "messages_before": poison["messages"]}
    clients.delete(host, port, (queue, dead))
    return _facts(scenario, [filler, consumer], dead_letter_queue=dead)


def requeue_loop(host: str, port: int) -> Truth:
    """201 messages, the first not JSON; a pika consumer (prefetch 1) nacks it with requeue=true
    every time it comes: it comes back at once, 3 000 times, and the other 200 never come."""
    return _requeue(host, port, "requeue_loop", forever=True, prefetch=1, rate=None)


def requeue_once(host: str, port: int) -> Truth:
    """Near miss: the poison message, then 200 good ones at 100 a second while the consumer
    (prefetch 20) runs: it requeues the poison message once, rejects its redelivery without requeue
    (dead-lettered) and acks the others as they come (no backlog: each waits for nothing)."""
    return _requeue(host, port, "requeue_once", forever=False, prefetch=20, rate=100.0)


# -- aio-pika: publishes into a full queue with overflow=reject-publish ------------------------------


REJECT_ARGUMENTS = {"x-max-length": 100, "x-overflow": "reject-publish"}


def reject_publish_nacks(host: str, port: int) -> Truth:
    """1 000 publishes with confirms (50 in flight) into a queue of x-max-length 100, x-overflow
    reject-publish, that nobody consumes."""
    queue = PREFIX + "reject_publish_nacks"
    clients.declare(host, port, (queue,), arguments=REJECT_ARGUMENTS)
    publisher = pc.aio_confirmed_publisher(host, port, queue, 1000, "aio-pika confirmed publisher")
    clients.delete(host, port, (queue,))
    return _facts("reject_publish_nacks", [publisher], queue_arguments=REJECT_ARGUMENTS)


def reject_publish_room(host: str, port: int) -> Truth:
    """Near miss: the same queue and publisher at 250 messages a second, a pika consumer (prefetch 50)
    acking at once: the limit is never reached."""
    queue = PREFIX + "reject_publish_room"
    clients.declare(host, port, (queue,), arguments=REJECT_ARGUMENTS)
    publisher, consumer = pc.in_threads(
        lambda: pc.aio_confirmed_publisher(host, port, queue, 1000, "aio-pika confirmed publisher", rate=250.0),
        lambda: clients.consumer(host, port, queue, 1000, 50, "orders consumer"),
    )
    clients.delete(host, port, (queue,))
    return _facts("reject_publish_room", [publisher, consumer], queue_arguments=REJECT_ARGUMENTS)


# -- pika: mandatory publishes that route nowhere -----------------------------------------------------


def _mandatory(host: str, port: int, scenario: str, unroutable_share: float) -> Truth:
    exchange, queue = PREFIX + scenario, PREFIX + scenario + ".orders"
    clients.declare(host, port, (queue,))
    connection = clients.connect(host, port, "amqpscope setup")
    try:
        channel = connection.channel()
        channel.exchange_declare(exchange, exchange_type="direct", durable=False)
        channel.queue_bind(queue, exchange, routing_key="orders.created")
    finally:
        connection.close()
    messages = 400
    # Interleaved, the same mix throughout: of every ten, round(10 * share) route nowhere.
    keys = ["orders.cancelled" if i % 10 < round(10 * unroutable_share) else "orders.created" for i in range(messages)]
    unroutable = keys.count("orders.cancelled")
    publisher, consumer = pc.in_threads(
        lambda: pp.mandatory_publisher(host, port, exchange, keys, 200.0, "mandatory publisher"),
        lambda: clients.consumer(host, port, queue, messages - unroutable, 50, "orders consumer"),
    )
    clients.delete(host, port, (queue,), fanout=exchange)
    return _facts(scenario, [publisher, consumer], exchange=exchange, bound_routing_key="orders.created")


def unroutable_returns(host: str, port: int) -> Truth:
    """400 mandatory publishes at 200 a second to a direct exchange, 90% with a key no queue is bound with."""
    return _mandatory(host, port, "unroutable_returns", 0.9)


def mandatory_routed(host: str, port: int) -> Truth:
    """Near miss: the same publisher, every message routed."""
    return _mandatory(host, port, "mandatory_routed", 0.0)


# -- aio-pika: a consumer that never acks --------------------------------------------------------------


def _acks(host: str, port: int, scenario: str, ack: bool) -> Truth:
    queue = PREFIX + scenario
    clients.declare(host, port, (queue,))
    publisher, consumer = pc.in_threads(
        lambda: pc.aio_publisher(host, port, queue, 2000, 400.0, 128, "aio-pika publisher"),
        lambda: pc.aio_consumer(
            host, port, queue, prefetch=None, work_seconds=0.0, ack=ack, seconds=5.5, name="aio-pika consumer"
        ),
    )
    clients.delete(host, port, (queue,))
    return _facts(scenario, [publisher, consumer])


def consumer_never_acks(host: str, port: int) -> Truth:
    """2 000 messages at 400 a second for 5 s to an aio-pika consumer with manual acks, no basic.qos,
    that never acks."""
    return _acks(host, port, "consumer_never_acks", ack=False)


def consumer_acks_each(host: str, port: int) -> Truth:
    """Near miss: the same consumer acking each message."""
    return _acks(host, port, "consumer_acks_each", ack=True)


# -- pika RPC: a slow responder -----------------------------------------------------------------------


def _rpc(host: str, port: int, scenario: str, work_seconds: float, calls: int) -> Truth:
    queue = PREFIX + scenario
    stop, ready = threading.Event(), threading.Event()
    stamps: dict[str, dict[str, int]] = {}

    def caller() -> dict[str, Any]:
        ready.wait(30.0)
        try:
            return pp.rpc_caller(host, port, queue, calls, 3.0, stamps, "rpc caller")
        finally:
            stop.set()

    responder, calling = pc.in_threads(
        lambda: pp.rpc_responder(host, port, queue, work_seconds, stop, ready, stamps, "rpc responder"), caller
    )
    clients.delete(host, port, (queue,))
    blind = None
    if work_seconds:
        blind = {
            "component": "consumer",
            "entity": f"{host}:{responder['client_port']}",
            "reason": f"the responder works {work_seconds * 1000:.0f} ms on each request and the caller waits for "
            "each reply before its next request; inside the broker no queue grows and nothing is in flow",
        }
    return _facts(scenario, [calling, responder], broker_blind=blind)


def request_reply_slow_responder(host: str, port: int) -> Truth:
    """A pika caller making calls back to back for 3 s (reply_to an exclusive queue, correlation_id);
    the pika responder works 40 ms on each before it replies."""
    return _rpc(host, port, "request_reply_slow_responder", 0.04, 200)


def request_reply_fast(host: str, port: int) -> Truth:
    """Near miss: the responder answers at once (300 calls)."""
    return _rpc(host, port, "request_reply_fast", 0.0, 300)


# -- AMQP 1.0: senders faster than the broker reads them ---------------------------------------------


def amqp10_senders_read_slowly(host: str, port: int) -> Truth:
    """Three python-qpid-proton senders, each on its own connection, writing 14 000 16-byte
    transfers (8-byte bodies) as fast as their credit (65 536 from the broker) and socket allow, to
    one queue nobody consumes (the capture holds 42 000 transfers; their deliveries would not fit)."""
    queue = PREFIX + "amqp10.burst"
    clients.declare(host, port, (queue,))
    senders = pc.in_threads(
        *((lambda i=i: pp.amqp10_burst_sender(host, port, queue, 14_000, 8, f"1.0 sender {i}")) for i in (1, 2, 3))
    )
    clients.delete(host, port, (queue,))
    return _facts("amqp10_senders_read_slowly", senders)


def amqp10_senders_paced(host: str, port: int) -> Truth:
    """Near miss: the three senders at 100 transfers a second each for 3 s, a 1.0 receiver taking them."""
    queue = PREFIX + "amqp10.paced"
    clients.declare(host, port, (queue,))

    def send(i: int) -> dict[str, Any]:
        facts = amqp10_sender(host, port, queue, seconds=3.0, body_size=8, name=f"1.0 sender {i}", rate=100.0)
        return {**facts, "client_library": "python-qpid-proton"}

    receiver, *senders = pc.in_threads(
        lambda: pp.amqp10_receiver(host, port, queue, 4.0, "1.0 receiver"), *((lambda i=i: send(i)) for i in (1, 2, 3))
    )
    clients.delete(host, port, (queue,))
    return _facts("amqp10_senders_paced", [*senders, receiver])


# -- registration ----------------------------------------------------------------------------------

PROBLEM_SCENARIOS: Mapping[str, Callable[[str, int], Truth]] = {
    "celery_slow_worker": celery_slow_worker,
    "celery_worker_keeps_up": celery_worker_keeps_up,
    "aio_pika_slow_consumer": aio_pika_slow_consumer,
    "aio_pika_paced_publisher": aio_pika_paced_publisher,
    "connection_churn": connection_churn,
    "connection_reused": connection_reused,
    "requeue_loop": requeue_loop,
    "requeue_once": requeue_once,
    "reject_publish_nacks": reject_publish_nacks,
    "reject_publish_room": reject_publish_room,
    "unroutable_returns": unroutable_returns,
    "mandatory_routed": mandatory_routed,
    "consumer_never_acks": consumer_never_acks,
    "consumer_acks_each": consumer_acks_each,
    "request_reply_slow_responder": request_reply_slow_responder,
    "request_reply_fast": request_reply_fast,
    "amqp10_senders_read_slowly": amqp10_senders_read_slowly,
    "amqp10_senders_paced": amqp10_senders_paced,
}

# The component each is built to make the bottleneck, and the rules it should raise. A near miss
# has none: healthy traffic gives no finding.
INTENDED: Mapping[str, str] = {
    "celery_slow_worker": "consumer",
    "aio_pika_slow_consumer": "consumer",
    "connection_churn": "client",
    "requeue_loop": "consumer",
    "reject_publish_nacks": "queue",
    "unroutable_returns": "none",
    "consumer_never_acks": "consumer",
    "request_reply_slow_responder": "consumer",
    "amqp10_senders_read_slowly": "queue",
    "slow_link": "network",
}
FINDINGS: Mapping[str, frozenset[str]] = {
    "celery_slow_worker": frozenset({ids.DIAGNOSIS_CONSUMER_PREFETCH_BOUND}),
    "aio_pika_slow_consumer": frozenset({ids.DIAGNOSIS_CONSUMER_PREFETCH_BOUND}),
    "connection_churn": frozenset({ids.DIAGNOSIS_CLIENT_CONNECTION_CHURN}),
    "requeue_loop": frozenset({ids.DIAGNOSIS_CONSUMER_REDELIVERY_LOOP}),
    "reject_publish_nacks": frozenset({ids.DIAGNOSIS_PUBLISHER_REFUSED}),
    "unroutable_returns": frozenset({ids.DIAGNOSIS_PUBLISHER_UNROUTABLE}),
    "consumer_never_acks": frozenset({ids.DIAGNOSIS_CONSUMER_NEVER_ACKS}),
    "request_reply_slow_responder": frozenset({ids.DIAGNOSIS_CLIENT_REQUEST_REPLY_LATENCY}),
    # Nobody consumes: 42 000 deliveries and acks would not fit in the capture.
    "amqp10_senders_read_slowly": frozenset(
        {ids.DIAGNOSIS_PUBLISHER_SLOW_SETTLEMENT, ids.DIAGNOSIS_QUEUE_BACKLOG_WITHOUT_CONSUMER}
    ),
    "slow_link": frozenset({ids.DIAGNOSIS_NETWORK_BANDWIDTH_LIMITED}),
}


def intended(name: str) -> str:
    return INTENDED.get(name, "none")


def findings(name: str) -> frozenset[str]:
    return FINDINGS.get(name, frozenset())


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The problem scenarios registered, each its own capture scenario."""
    added = [name for name in PROBLEM_SCENARIOS if name not in SCENARIOS]
    for name, scenario in PROBLEM_SCENARIOS.items():
        CLIENT_SCENARIOS[name] = scenario  # type: ignore[index]
        SCENARIOS[name] = (name,)  # type: ignore[index]
    try:
        yield
    finally:
        for name in added:
            SCENARIOS.pop(name, None)  # type: ignore[attr-defined]
            CLIENT_SCENARIOS.pop(name, None)  # type: ignore[attr-defined]


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        with contextlib.suppress(PackageNotFoundError):
            versions[name] = distribution_version(name)
    return versions


def add_broker_truth(capture: Path, sampler: BrokerStateSampler, name: str) -> None:
    """Write the broker's samples within the capture, their summary and the intent into its truth file."""
    path = truth_path(capture)
    truth = json.loads(path.read_text())
    started = _epoch_us(truth["capture"]["started_utc"])
    finished = _epoch_us(truth["capture"]["finished_utc"])
    samples = [s.to_json() for s in sampler.samples if started <= s.ts_us <= finished]
    truth["broker_states"] = {
        "source": "rabbitmqctl eval: rabbit_networking:connection_info_all/1, rabbit_channel:info_all/1, "
        "rabbit_amqqueue:info_all/2, rabbit_amqqueue:consumers_all/1, rabbit_alarm:get_alarms/0, "
        "rabbit_global_counters:overview/0, ets connection_churn_metrics",
        "clock": "node wall clock, os:system_time(microsecond), the clock tcpdump stamps packets with",
        "interval_ms": sampler.interval_ms,
        "sampler_errors": sampler.errors,
        "samples": samples,
    }
    truth["broker_summary"] = broker_summary(samples, truth["ground_truth"][name])
    truth["intended_bottleneck"] = intended(name)
    truth["intended_findings"] = sorted(findings(name))
    truth["clients"] = {**truth["clients"], **library_versions()}
    path.write_text(json.dumps(truth, indent=1) + "\n")


def capture_problem(name: str, out_dir: Path, broker: PrivateBroker) -> Path:
    with BrokerStateSampler(broker) as sampler:
        capture = capture_scenario(name, out_dir, broker=broker)
    add_broker_truth(capture, sampler, name)
    return capture


def _epoch_us(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1_000_000)


def capture_problems(out_dir: Path, names: tuple[str, ...]) -> list[Path]:
    """Capture each scenario (``slow_link`` on its own veth link) with one private broker."""
    from testbed import problem_network

    captures = []
    loopback = [n for n in names if n in PROBLEM_SCENARIOS]
    if loopback:
        with PrivateBroker(port=default_capture_port()) as broker, registered():
            captures += [capture_problem(name, out_dir, broker) for name in loopback]
    for name in names:
        if name in problem_network.LINK_SCENARIOS:
            captures.append(problem_network.capture_link_scenario(name, out_dir))
    return captures


def all_names() -> tuple[str, ...]:
    from testbed import problem_network

    return (*PROBLEM_SCENARIOS, *problem_network.LINK_SCENARIOS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.problem_scenarios", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("samples/problems"), help="output directory (default: samples/problems)"
    )
    parser.add_argument("--scenario", action="append", choices=sorted(all_names()), help="repeatable (default: all)")
    args = parser.parse_args(argv)
    for path in capture_problems(args.out, tuple(args.scenario or all_names())):
        print(f"{path} ({path.stat().st_size} bytes) + {truth_path(path).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
