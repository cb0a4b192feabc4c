"""Bottleneck scenarios of publishers throttled together: many publishers, one slow queue.

``fan_in_quorum``: four raw 0-9-1 publishers write to one quorum queue as fast as the broker reads
them. A quorum queue writes every message to its Raft log before it confirms or takes more, so the
queue is the slow stage: RabbitMQ puts the publishers' channels (and connections) in credit flow and
stops reading their sockets, all at the same time. ``amqp10_senders_in_flow`` does the same with
AMQP 1.0 senders (``testbed.raw10``: proton in Python is too slow to load the broker here) on
connections of their own.

Their near misses run the same clients at a pace the queue keeps up with: nothing is held back.
"""

from __future__ import annotations

from typing import Any

import threading

from amqpscope.testbed import bottleneck_clients as clients
from amqpscope.testbed import raw10
from amqpscope.testbed.scenarios import GUEST, Truth, message_body

PREFIX = "amqpscope.bn."
QUORUM = {"x-queue-type": "quorum"}
PUBLISHERS = 4
SECONDS = 4.0


def _facts(scenario: str, roles: list[dict[str, Any]], **more: Any) -> Truth:
    return {"scenario": scenario, "clients": roles, **more}


def fan_in_quorum(host: str, port: int) -> Truth:
    """Four raw publishers of 16-byte messages (as fast as the broker reads them, 5 000 at most
    each) to one quorum queue for 4 s."""
    queue = PREFIX + "fan-in.quorum"
    clients.declare(host, port, (queue,), arguments=QUORUM)
    publishers = clients.in_threads(*(
        (lambda i=i: clients.raw_publisher(host, port, "", queue, SECONDS, 5_000, 16, f"fan-in publisher {i}"))
        for i in range(1, PUBLISHERS + 1)
    ))
    clients.delete(host, port, (queue,))
    return _facts("fan_in_quorum", publishers, queue=queue, queue_arguments=QUORUM)


def fan_in_quorum_paced(host: str, port: int) -> Truth:
    """The near miss: four pika publishers of 64-byte messages at 100 a second each to one quorum
    queue for 4 s, a rate the queue takes without credit flow."""
    queue = PREFIX + "fan-in.quorum.paced"
    clients.declare(host, port, (queue,), arguments=QUORUM)
    publishers = clients.in_threads(*(
        (lambda i=i: clients.paced_publisher(host, port, queue, 100.0, SECONDS, 64, f"paced fan-in publisher {i}"))
        for i in range(1, PUBLISHERS + 1)
    ))
    clients.delete(host, port, (queue,))
    return _facts("fan_in_quorum_paced", publishers, queue=queue, queue_arguments=QUORUM)


def _raw_sender(host: str, port: int, queue: str, name: str, max_messages: int, rate: float | None) -> dict[str, Any]:
    """One raw AMQP 1.0 sender of 16-byte pre-settled messages to ``/amq/queue/<queue>``."""
    address = f"/amq/queue/{queue}"
    sender = raw10.RawSender(host, port, *GUEST, name, address)
    stop = threading.Event()
    reader = sender.drain_in_background(stop)
    try:
        sent = raw10.send_for(sender, message_body("1.0", 0, 16), SECONDS, max_messages, rate)
        client_port = sender.client_port
    finally:
        stop.set()
        reader.join(5.0)
        sender.close()
    return {"role": "publisher", "client_port": client_port, "connection_name": name, "protocol": "amqp-1.0",
            "client_library": "amqpscope raw10", "link": name, "address": address, "queue": queue, "messages": sent,
            "body_size": 16, "settled_by_sender": True, "persistent": False, "rate_limit_per_second": rate}


def amqp10_senders_in_flow(host: str, port: int) -> Truth:
    """Four raw AMQP 1.0 senders, each on a connection of its own, send 16-byte messages to one
    quorum queue as fast as the broker reads them (10 000 at most each), for 4 s."""
    queue = PREFIX + "amqp10.senders"
    clients.declare(host, port, (queue,), arguments=QUORUM)
    senders = clients.in_threads(*(
        (lambda i=i: _raw_sender(host, port, queue, f"amqp10 sender {i}", 10_000, None)) for i in range(1, 5)
    ))
    clients.delete(host, port, (queue,))
    return _facts("amqp10_senders_in_flow", senders, queue=queue, queue_arguments=QUORUM)


def amqp10_senders_paced(host: str, port: int) -> Truth:
    """The near miss: the same four senders at 100 messages a second each."""
    queue = PREFIX + "amqp10.senders.paced"
    clients.declare(host, port, (queue,), arguments=QUORUM)
    senders = clients.in_threads(*(
        (lambda i=i: _raw_sender(host, port, queue, f"paced amqp10 sender {i}", 10_000, 100.0)) for i in range(1, 5)
    ))
    clients.delete(host, port, (queue,))
    return _facts("amqp10_senders_paced", senders, queue=queue, queue_arguments=QUORUM)
