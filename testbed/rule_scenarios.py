"""Client scenarios for the rule catalogue's live tests (issue 14), against RabbitMQ 3.10.8.

``registered()`` adds them for a while to ``testbed.scenarios`` so that
``testbed.capture.capture_scenario`` captures them like the others:

- ``amqp10_drain_classic``: a few messages in a classic queue, a receiver drains more credit than
  there are messages. RabbitMQ 3.10.8 ends the session with ``amqp:internal-error``
  (``function_clause`` in ``rabbit_classic_queue:handle_event(send_drained ...)``). The receiver
  settles nothing: an accept that reaches the broker's session process after that crash makes it
  crash too (``noproc`` calling the dead channel), and then the broker sends no end, never answers
  the client's close and resets the connection 2 s later. On a loaded machine that happened in
  about 1 run in 30 (3 of 80 with three busy loops on 2 cores).
- ``amqp10_drain_quorum``: the same on a quorum queue, which answers the drain.
- ``amqp10_pipelined_sessions``: qpid-proton opens the connection, two sessions (channels 0 and 1)
  and a sender on the second before the broker's open arrives (a pipelined open, transport 2.4.2),
  then sends one message, which the broker accepts.

The ground truth is what the client saw (the broker's error condition, messages received, links
opened and outcomes), never what a decoder saw.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from importlib.metadata import version as distribution_version
from typing import Any

import pika
from proton import Message
from proton.reactor import Container

from testbed.decoder_scenarios import _Amqp10Handler, _Later
from testbed.scenarios import CLIENT_SCENARIOS, SCENARIOS, Truth, message_body

DRAIN_MESSAGES = 2
DRAIN_CREDIT = 10
# Time left to the broker after the drain before the client closes: its answer takes milliseconds.
DRAIN_SETTLE_SECONDS = 1.0


def _declare(host: str, port: int, queue: str, queue_type: str, messages: int) -> None:
    """Declare ``queue`` of ``queue_type`` over 0-9-1, empty, and publish ``messages`` to it."""
    with pika.BlockingConnection(pika.ConnectionParameters(host=host, port=port)) as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
        channel.queue_purge(queue)
        channel.confirm_delivery()
        for index in range(1, messages + 1):
            channel.basic_publish("", queue, message_body("0-9-1", index, 64))


def _delete(host: str, port: int, queue: str) -> None:
    with pika.BlockingConnection(pika.ConnectionParameters(host=host, port=port)) as connection:
        connection.channel().queue_delete(queue)


class _DrainHandler(_Amqp10Handler):
    """Attach a receiver with no credit, drain ``credit``, accept what comes if ``accept``, close
    after a while."""

    def __init__(self, host: str, port: int, address: str, credit: int, accept: bool) -> None:
        super().__init__(host, port)
        self.address = address
        self.credit = credit
        self.accept_deliveries = accept
        self.received = 0
        self.accepted = 0
        self.receiver: Any = None
        self.session_error: str | None = None
        self.session_error_description: str | None = None

    def started(self, event: Any) -> None:
        self.receiver = event.container.create_receiver(self.connection, self.address)

    def on_link_opened(self, event: Any) -> None:
        if event.link.is_receiver:  # proton wraps its objects anew for each event: no identity
            event.receiver.drain(self.credit)
            event.container.schedule(DRAIN_SETTLE_SECONDS, _Later(self.finish))

    def on_message(self, event: Any) -> None:
        self.received += 1
        if self.accept_deliveries:
            self.accept(event.delivery)
            self.accepted += 1

    def on_session_error(self, event: Any) -> None:
        self._remember(event.session.remote_condition)

    def on_session_closing(self, event: Any) -> None:
        self._remember(event.session.remote_condition)

    def _remember(self, condition: Any) -> None:
        if condition is not None and self.session_error is None:
            self.session_error, self.session_error_description = condition.name, condition.description

    def finish(self) -> None:
        if self.connection is not None:
            self.connection.close()


def _drain(host: str, port: int, queue_type: str, accept: bool) -> Truth:
    queue = f"amqpscope.rules.drain-{queue_type}"
    _declare(host, port, queue, queue_type, DRAIN_MESSAGES)
    handler = _DrainHandler(host, port, f"/amq/queue/{queue}", DRAIN_CREDIT, accept)
    Container(handler).run()
    _delete(host, port, queue)
    if handler.error is not None and handler.session_error is None:
        raise RuntimeError(f"amqp10_drain_{queue_type} failed: {handler.error}")
    return {
        "protocol": "amqp-1.0",
        "client_library": "python-qpid-proton",
        "client_version": distribution_version("python-qpid-proton"),
        "queue_type": queue_type,
        "messages_in_queue": DRAIN_MESSAGES,
        "drain_credit": DRAIN_CREDIT,
        "messages_received": handler.received,
        "messages_accepted": handler.accepted,
        "session_error": handler.session_error,
        "session_error_description": handler.session_error_description,
    }


def amqp10_drain_classic(host: str, port: int) -> Truth:
    """Drain more credit than messages on a classic queue (RabbitMQ 3.10.8 ends the session); settle
    nothing, so that no accept races the broker's crash (module docstring)."""
    return _drain(host, port, "classic", accept=False)


def amqp10_drain_quorum(host: str, port: int) -> Truth:
    """Drain more credit than messages on a quorum queue."""
    return _drain(host, port, "quorum", accept=True)


class _PipelinedHandler(_Amqp10Handler):
    """Open, two sessions and a sender on the second, all before the broker's open; send one message."""

    def __init__(self, host: str, port: int, address: str) -> None:
        super().__init__(host, port)
        self.address = address
        self.sessions_opened = 0
        self.accepted = 0
        self.sent = False
        self.sender: Any = None

    def started(self, event: Any) -> None:
        # Nothing has been written yet: proton sends all of this with its open.
        first = self.connection.session()
        first.open()
        second = self.connection.session()
        second.open()
        self.sender = second.sender("amqpscope-pipelined")
        self.sender.target.address = self.address
        self.sender.open()

    def on_session_opened(self, event: Any) -> None:
        self.sessions_opened += 1

    def on_sendable(self, event: Any) -> None:
        if event.link.is_sender and event.sender.credit > 0 and not self.sent:
            self.sent = True
            event.sender.send(Message(id=1, body=message_body("1.0", 1, 64), inferred=True))

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        self.connection.close()


def amqp10_pipelined_sessions(host: str, port: int) -> Truth:
    """A pipelined open with two sessions (channels 0 and 1) and a sender on channel 1."""
    queue = "amqpscope.rules.pipelined"
    _declare(host, port, queue, "classic", 0)
    handler = _PipelinedHandler(host, port, f"/amq/queue/{queue}")
    Container(handler).run()
    _delete(host, port, queue)
    if handler.error is not None:
        raise RuntimeError(f"amqp10_pipelined_sessions failed: {handler.error}")
    return {
        "protocol": "amqp-1.0",
        "client_library": "python-qpid-proton",
        "client_version": distribution_version("python-qpid-proton"),
        "sessions_opened": handler.sessions_opened,
        "messages_accepted": handler.accepted,
    }


RULE_SCENARIOS: dict[str, Callable[[str, int], Truth]] = {
    "amqp10_drain_classic": amqp10_drain_classic,
    "amqp10_drain_quorum": amqp10_drain_quorum,
    "amqp10_pipelined_sessions": amqp10_pipelined_sessions,
}


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """These scenarios registered in ``testbed.scenarios`` for a while."""
    added = [name for name in RULE_SCENARIOS if name not in SCENARIOS]
    CLIENT_SCENARIOS.update(RULE_SCENARIOS)  # type: ignore[attr-defined]
    SCENARIOS.update({name: (name,) for name in RULE_SCENARIOS})  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for name in added:
            SCENARIOS.pop(name, None)  # type: ignore[attr-defined]
            CLIENT_SCENARIOS.pop(name, None)  # type: ignore[attr-defined]
