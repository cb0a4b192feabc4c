"""Bottleneck scenarios of publishers throttled together: many publishers, one slow queue.

``fan_in_quorum``: four raw 0-9-1 publishers write to one quorum queue as fast as the broker reads
them. A quorum queue writes every message to its Raft log before it confirms or takes more, so the
queue is the slow stage: RabbitMQ puts the publishers' channels (and connections) in credit flow and
stops reading their sockets, all at the same time.

Their near misses run the same clients at a pace the queue keeps up with: nothing is held back.
"""

from __future__ import annotations

from typing import Any

from testbed import bottleneck_clients as clients
from testbed.scenarios import Truth

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
    publishers = clients.in_threads(
        *(
            (lambda i=i: clients.raw_publisher(host, port, "", queue, SECONDS, 5_000, 16, f"fan-in publisher {i}"))
            for i in range(1, PUBLISHERS + 1)
        )
    )
    clients.delete(host, port, (queue,))
    return _facts("fan_in_quorum", publishers, queue=queue, queue_arguments=QUORUM)


def fan_in_quorum_paced(host: str, port: int) -> Truth:
    """The near miss: four pika publishers of 64-byte messages at 100 a second each to one quorum
    queue for 4 s, a rate the queue takes without credit flow."""
    queue = PREFIX + "fan-in.quorum.paced"
    clients.declare(host, port, (queue,), arguments=QUORUM)
    publishers = clients.in_threads(
        *(
            (lambda i=i: clients.paced_publisher(host, port, queue, 100.0, SECONDS, 64, f"paced fan-in publisher {i}"))
            for i in range(1, PUBLISHERS + 1)
        )
    )
    clients.delete(host, port, (queue,))
    return _facts("fan_in_quorum_paced", publishers, queue=queue, queue_arguments=QUORUM)
