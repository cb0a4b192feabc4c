"""AMQP 1.0 clients (python-qpid-proton) of the bottleneck scenarios: a healthy sender and receiver,
and one connection with a fast and a slow receiving link.

Credit is granted by hand (``prefetch=0``: no automatic flow controller), so every ``flow`` frame
on the wire is one these handlers chose to send. RabbitMQ 3.10's plugin declares the queue of
``/queue/NAME`` when a link attaches to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from testbed.scenarios import GUEST, SCENARIO_TIMEOUT, message_body

PROTOCOL = "amqp-1.0"


def _local_port(event: Any) -> int:
    # proton keeps the socket behind the transport's selectable; there is no public accessor.
    return int(event.transport._selectable.getsockname()[1])


class _Handler(MessagingHandler):  # type: ignore[misc]
    """Connects with SASL PLAIN (guest), fails the scenario after SCENARIO_TIMEOUT."""

    def __init__(self, host: str, port: int, container_id: str) -> None:
        super().__init__(prefetch=0, auto_accept=True, auto_settle=True)
        self.url = f"amqp://{host}:{port}"
        self.container_id = container_id
        self.client_port = 0
        self.error: str | None = None
        self.connection: Any = None
        self.closing = False
        self._timers: list[Any] = []

    def connect(self, event: Any) -> Any:
        event.container.container_id = self.container_id
        self.connection = event.container.connect(
            self.url,
            user=GUEST[0],
            password=GUEST[1],
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            reconnect=False,
        )
        self.schedule(event.container, SCENARIO_TIMEOUT, lambda: self.fail("timed out"))
        return self.connection

    def schedule(self, container: Any, delay: float, action: Any) -> None:
        if not self.closing:
            self._timers.append(container.schedule(delay, _Call(action)))

    def on_connection_opened(self, event: Any) -> None:
        self.client_port = _local_port(event)

    def stop_timers(self) -> None:
        """No more timers: those pending are cancelled, later ones not scheduled (the handler is closing)."""
        self.closing = True
        for timer in self._timers:
            timer.cancel()

    def finish(self) -> None:
        self.stop_timers()
        if self.connection is not None:
            self.connection.close()

    def fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
        self.finish()

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        self.fail(f"transport error: {condition.name if condition else 'unknown'}")

    def on_transport_closed(self, event: Any) -> None:
        event.container.stop()


class _Call:
    def __init__(self, action: Any) -> None:
        self.action = action

    def on_timer_task(self, _event: Any) -> None:
        self.action()


def _run(handler: _Handler) -> None:
    Container(handler).run()
    if handler.error is not None:
        raise RuntimeError(f"{type(handler).__name__}: {handler.error}")


# -- healthy: a paced sender and a receiver with ample credit on one connection ------------------


class _Healthy(_Handler):
    def __init__(self, host: str, port: int, address: str, messages: int, rate: float, body_size: int) -> None:
        super().__init__(host, port, "amqpscope healthy 1.0")
        self.address, self.messages, self.rate, self.body_size = address, messages, rate, body_size
        self.credit = 100
        self.sent = self.received = 0
        self.sender: Any = None
        self.receiver: Any = None

    def on_start(self, event: Any) -> None:
        connection = self.connect(event)
        self.receiver = event.container.create_receiver(connection, self.address)
        self.receiver.flow(self.credit)
        self.sender = event.container.create_sender(connection, self.address)
        self.schedule(event.container, 1.0 / self.rate, lambda: self.tick(event.container))

    def tick(self, container: Any) -> None:
        if self.sent < self.messages:
            if self.sender.credit > 0:
                self.sent += 1
                self.sender.send(Message(id=self.sent, body=message_body("1.0", self.sent, self.body_size)))
            self.schedule(container, 1.0 / self.rate, lambda: self.tick(container))

    def on_message(self, event: Any) -> None:
        self.received += 1
        receiver = event.receiver
        if self.received == self.messages:
            self.finish()
        elif receiver.credit < self.credit // 2:
            receiver.flow(self.credit - receiver.credit)  # top up: credit is set, not added (2.6.7)


def healthy_amqp10(
    host: str, port: int, queue: str, *, messages: int, rate: float, body_size: int
) -> list[dict[str, Any]]:
    """Send ``messages`` at ``rate`` a second to ``/queue/<queue>`` and receive them on the same connection."""
    handler = _Healthy(host, port, f"/queue/{queue}", messages, rate, body_size)
    _run(handler)
    common = {
        "client_port": handler.client_port,
        "connection_name": handler.container_id,
        "protocol": PROTOCOL,
        "address": handler.address,
        "queue": queue,
        "body_size": body_size,
        "persistent": False,
    }
    return [
        {"role": "publisher", "link": "sender", "messages": handler.sent, "rate_per_second": rate, **common},
        {
            "role": "consumer",
            "link": "receiver",
            "messages": handler.received,
            "credit_window": handler.credit,
            **common,
        },
    ]


# -- one connection, two receiving links: one grants credit fast, one slowly ------------------------


@dataclass(frozen=True)
class LinkPlan:
    queue: str
    credit: int  # credit granted each time
    grant_every: float  # seconds between grants; 0: top up as soon as half is used


class _TwoReceivers(_Handler):
    def __init__(self, host: str, port: int, fast: LinkPlan, slow: LinkPlan, seconds: float) -> None:
        super().__init__(host, port, "amqpscope two receivers")
        self.fast, self.slow, self.seconds = fast, slow, seconds
        self.received = {fast.queue: 0, slow.queue: 0}
        self.grants = {fast.queue: 0, slow.queue: 0}
        self.links: dict[str, Any] = {}

    def on_start(self, event: Any) -> None:
        connection = self.connect(event)
        session = connection.session()  # both links on one session
        session.open()
        for plan in (self.fast, self.slow):
            link = session.receiver(plan.queue)
            link.source.address = f"/queue/{plan.queue}"
            link.open()
            self.links[plan.queue] = link
            self.grant(plan)
        self.schedule(event.container, self.slow.grant_every, lambda: self.slow_tick(event.container))
        self.schedule(event.container, self.seconds, self.finish)

    def grant(self, plan: LinkPlan) -> None:
        self.links[plan.queue].flow(plan.credit)
        self.grants[plan.queue] += 1

    def slow_tick(self, container: Any) -> None:
        if self.closing:
            return
        link = self.links[self.slow.queue]
        if link.credit == 0:
            self.grant(self.slow)
        self.schedule(container, self.slow.grant_every, lambda: self.slow_tick(container))

    def on_message(self, event: Any) -> None:
        name = event.receiver.name
        self.received[name] += 1
        if name == self.fast.queue and event.receiver.credit < self.fast.credit // 2:
            event.receiver.flow(self.fast.credit - event.receiver.credit)
            self.grants[name] += 1


def two_receivers(host: str, port: int, fast: LinkPlan, slow: LinkPlan, seconds: float) -> list[dict[str, Any]]:
    """Receive from two queues on one connection and session for ``seconds``; each link's facts."""
    handler = _TwoReceivers(host, port, fast, slow, seconds)
    _run(handler)
    return [
        {
            "role": "consumer",
            "client_port": handler.client_port,
            "connection_name": handler.container_id,
            "protocol": PROTOCOL,
            "link": plan.queue,
            "address": f"/queue/{plan.queue}",
            "queue": plan.queue,
            "credit_per_grant": plan.credit,
            "grant_every_seconds": plan.grant_every,
            "grants": handler.grants[plan.queue],
            "received": handler.received[plan.queue],
            "link_speed": speed,
        }
        for plan, speed in ((fast, "fast"), (slow, "slow"))
    ]


# -- a sender on a connection of its own: as fast as its link credit allows, or paced ---------------


class _Sender(_Handler):
    """Sends on one link: ``rate`` a second, or (``rate`` None) whenever it has credit and fewer
    than QUEUED_MAX messages wait in proton's buffer for the socket (a client with more to send,
    held back only by the broker's credit and TCP window)."""

    QUEUED_MAX = 256
    PUMP_EVERY = 0.002  # seconds between checks for room while the socket is full

    def __init__(
        self, host: str, port: int, address: str, seconds: float, body_size: int, name: str, rate: float | None
    ) -> None:
        super().__init__(host, port, name)
        self.address, self.seconds, self.body_size, self.rate = address, seconds, body_size, rate
        self.sent = self.settled = 0
        self.sender: Any = None
        self.stopped = False

    def on_start(self, event: Any) -> None:
        connection = self.connect(event)
        self.sender = event.container.create_sender(connection, self.address)
        self.schedule(event.container, self.seconds, self.stop)
        period = 1.0 / self.rate if self.rate is not None else self.PUMP_EVERY
        self.schedule(event.container, period, lambda: self.tick(event.container, period))

    def stop(self) -> None:
        self.stopped = True
        self.finish()  # messages still in proton's buffer are not sent

    def send_one(self) -> None:
        self.sent += 1
        self.sender.send(Message(id=self.sent, body=message_body("1.0", self.sent, self.body_size)))

    def pump(self) -> None:
        if self.rate is not None:
            if self.sender.credit > 0:
                self.send_one()
            return
        while not self.stopped and self.sender.credit > 0 and self.sender.queued < self.QUEUED_MAX:
            self.send_one()

    def tick(self, container: Any, period: float) -> None:
        if not self.stopped:
            self.pump()
            self.schedule(container, period, lambda: self.tick(container, period))

    def on_sendable(self, event: Any) -> None:
        if self.rate is None and not self.stopped:
            self.pump()

    def on_settled(self, event: Any) -> None:
        self.settled += 1


def sender(
    host: str, port: int, queue: str, *, seconds: float, body_size: int, name: str, rate: float | None = None
) -> dict[str, Any]:
    """Send to ``/amq/queue/<queue>`` (an existing queue) for ``seconds``, as fast as link credit
    and the socket allow or ``rate`` a second, on a connection of its own (unsettled sends: the
    broker settles each once its queue has it)."""
    handler = _Sender(host, port, f"/amq/queue/{queue}", seconds, body_size, name, rate)
    _run(handler)
    return {
        "role": "publisher",
        "client_port": handler.client_port,
        "connection_name": name,
        "protocol": PROTOCOL,
        "link": "sender",
        "address": handler.address,
        "queue": queue,
        "messages": handler.sent,
        "settled_by_broker": handler.settled,
        "body_size": body_size,
        "persistent": False,
        "rate_limit_per_second": rate,
    }
