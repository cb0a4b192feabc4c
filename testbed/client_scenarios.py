"""Bottleneck scenarios where the clients set the pace, and their near misses.

- ``confirm_bound``: a pika publisher that waits for each confirm before its next publish (one
  message in flight) for 2 s: its rate is bound by the confirm round trip, not by the broker.
  Near miss ``confirm_paced``: the same publisher at 100 messages a second (it waits for each
  confirm too, but spends most of its time on its own pace).
- ``prefetch_one``: a consumer with prefetch 1 that acks each delivery at once, on a queue with a
  backlog: each message costs a round trip. Near miss ``prefetch_one_empty_queue``: the same
  consumer of a queue fed at 100 messages a second, which it keeps empty.
- ``two_consumers_one_slow``: one queue fed faster than its two consumers take together (one acks
  after 4 ms of work, the other after 50 ms): the queue grows, both are held at their prefetch.
  Near miss ``two_consumers_one_slow_no_backlog``: the fast consumer acks at once and keeps the
  queue empty; the slow one still holds its prefetch, but no message waits in the queue.
- ``busy_healthy_mix``: 0-9-1 publishers and consumers (plain, with confirms, to a quorum queue)
  and an AMQP 1.0 sender and receiver, all at rates the broker takes: nothing is held back.

The broker cannot see a client's own pace: the truth of ``confirm_bound`` and ``prefetch_one`` is
what their client did (``broker_blind``, as for ``slow_reader``); the others' truth is the
broker's states alone.
"""

from __future__ import annotations

import threading
from typing import Any

from testbed import bottleneck_clients as clients
from testbed.amqp10_clients import healthy_amqp10
from testbed.scenarios import Truth

PREFIX = "amqpscope.bn."


def _facts(scenario: str, roles: list[dict[str, Any]], **more: Any) -> Truth:
    return {"scenario": scenario, "clients": roles, **more}


def confirm_bound(host: str, port: int) -> Truth:
    queue = PREFIX + "confirm-bound"
    clients.declare(host, port, (queue,))
    publisher = clients.confirmed_publisher(host, port, queue, 2.0, 64, "confirm-bound publisher")
    clients.delete(host, port, (queue,))
    blind = {
        "component": "client",
        "entity": f"{host}:{publisher['client_port']}",
        "reason": "the publisher waits for each message's confirm before it publishes the next (one in "
        "flight): its rate is one message per confirm round trip; inside the broker nothing "
        "is in flow and no queue grows faster than it drains",
    }
    return _facts("confirm_bound", [publisher], broker_blind=blind)


def confirm_paced(host: str, port: int) -> Truth:
    queue = PREFIX + "confirm-paced"
    clients.declare(host, port, (queue,))
    publisher = clients.confirmed_publisher(host, port, queue, 2.0, 64, "confirm-paced publisher", rate=100.0)
    clients.delete(host, port, (queue,))
    return _facts("confirm_paced", [publisher])


def prefetch_one(host: str, port: int) -> Truth:
    queue = PREFIX + "prefetch-one"
    clients.declare(host, port, (queue,))
    filler = clients.raw_publisher(host, port, "", queue, 5.0, 2000, 64, "prefetch one filler")
    consumer = clients.consumer(host, port, queue, 1000, 1, "prefetch one consumer")
    clients.delete(host, port, (queue,))
    blind = {
        "component": "client",
        "entity": f"{host}:{consumer['client_port']}",
        "reason": "the consumer acks each delivery as soon as it arrives, with prefetch 1: the broker may "
        "send the next message only when the ack arrives, so every message costs a round "
        "trip while messages wait in the queue",
    }
    return _facts("prefetch_one", [filler, consumer], broker_blind=blind)


def prefetch_one_empty_queue(host: str, port: int) -> Truth:
    queue = PREFIX + "prefetch-one.empty"
    clients.declare(host, port, (queue,))
    seconds, rate = 3.0, 100.0
    publisher, consumer = clients.in_threads(
        lambda: clients.paced_publisher(host, port, queue, rate, seconds, 64, "prefetch one publisher"),
        lambda: clients.consumer(host, port, queue, int(seconds * rate), 1, "prefetch one consumer"),
    )
    clients.delete(host, port, (queue,))
    return _facts("prefetch_one_empty_queue", [publisher, consumer])


def _two_consumers(host: str, port: int, scenario: str, rate: float, fast_work: float) -> Truth:
    """A pika publisher at ``rate`` a second for 4 s, one consumer acking ``fast_work`` s after
    each delivery and one 50 ms after, both prefetch 10, on one queue."""
    queue = PREFIX + scenario.replace("_", "-")
    clients.declare(host, port, (queue,))
    seconds = 4.0
    publisher, fast, slow = clients.in_threads(
        lambda: clients.paced_publisher(host, port, queue, rate, seconds, 64, f"{scenario} publisher"),
        lambda: clients.consumer(
            host, port, queue, 10**6, 10, "fast consumer", work_seconds=fast_work, stop=stopped_after(seconds + 1.0)
        ),
        lambda: clients.consumer(
            host, port, queue, 10**6, 10, "slow consumer", work_seconds=0.05, stop=stopped_after(seconds + 1.0)
        ),
    )
    clients.delete(host, port, (queue,))
    fast["consumer_speed"], slow["consumer_speed"] = "fast", "slow"
    return _facts(scenario, [publisher, fast, slow], queue=queue)


def stopped_after(seconds: float) -> threading.Event:
    """An event set ``seconds`` from now."""
    event = threading.Event()
    timer = threading.Timer(seconds, event.set)
    timer.daemon = True
    timer.start()
    return event


def two_consumers_one_slow(host: str, port: int) -> Truth:
    # 4 ms a message is 250 a second at most, 50 ms 20: fed 400 a second, the queue grows.
    return _two_consumers(host, port, "two_consumers_one_slow", 400.0, 0.004)


def two_consumers_one_slow_no_backlog(host: str, port: int) -> Truth:
    # Fed 200 a second; the fast consumer acks at once and takes all the slow one leaves.
    return _two_consumers(host, port, "two_consumers_one_slow_no_backlog", 200.0, 0.0)


def busy_healthy_mix(host: str, port: int) -> Truth:
    """For 2.5 s: a pika publisher at 200 a second with a consumer (prefetch 50), a publisher waiting
    for confirms at 50 a second, a publisher at 100 a second to a quorum queue with its consumer
    (prefetch 20), and an AMQP 1.0 sender and receiver at 50 a second."""
    plain, confirmed, quorum, amqp10 = (PREFIX + f"mix.{name}" for name in ("plain", "confirmed", "quorum", "amqp10"))
    clients.declare(host, port, (plain, confirmed))
    clients.declare(host, port, (quorum,), arguments={"x-queue-type": "quorum"})
    seconds = 2.5
    roles = clients.in_threads(
        lambda: clients.paced_publisher(host, port, plain, 200.0, seconds, 256, "mix publisher"),
        lambda: clients.consumer(host, port, plain, int(200 * seconds), 50, "mix consumer"),
        lambda: clients.confirmed_publisher(host, port, confirmed, seconds, 256, "mix confirmed publisher", rate=50.0),
        lambda: clients.paced_publisher(host, port, quorum, 100.0, seconds, 256, "mix quorum publisher"),
        lambda: clients.consumer(host, port, quorum, int(100 * seconds), 20, "mix quorum consumer"),
        lambda: healthy_amqp10(host, port, amqp10, messages=int(50 * seconds), rate=50.0, body_size=256),
    )
    clients.delete(host, port, (plain, confirmed, quorum, amqp10))
    flat = [r for role in roles for r in (role if isinstance(role, list) else [role])]
    return _facts("busy_healthy_mix", flat)
