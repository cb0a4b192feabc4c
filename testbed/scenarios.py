"""Real client scenarios against a broker; each returns the ground truth of what its clients did.

The ground truth is what the client code did and observed (messages published, acks sent,
credit granted, values negotiated), never what a decoder saw on the wire: it is the reference
the decoders and flow-control pipelines are checked against.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib.metadata import version as distribution_version
from typing import Any

import pika
from proton import SASL, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from testbed import tls

Truth = dict[str, Any]

GUEST = ("guest", "guest")
SCENARIO_TIMEOUT = 60.0


def message_body(protocol: str, index: int, size: int) -> bytes:
    """A recognisable, deterministic body of exactly ``size`` bytes."""
    prefix = f"amqpscope {protocol} message {index:05d} ".encode()
    return prefix.ljust(size, b".")[:size]


# -- AMQP 0-9-1: prefetch, acks with multiple, a requeueing nack, publisher confirms ----------


@dataclass(frozen=True)
class Amqp091QosConfirmsTruth:
    """What the pika clients of ``amqp091_qos_confirms`` did."""

    protocol: str
    client_library: str
    client_version: str
    queue: str
    exchange: str
    routing_key: str
    message_body_size: int
    messages_published: int
    publisher_confirms: bool
    confirms_expected: int
    confirms_acked: int
    prefetch_count: int
    prefetch_global: bool
    consumer_tag: str
    deliveries_received: int
    redeliveries_received: int
    distinct_messages_received: int
    acks_sent: int
    acks_single: int
    acks_multiple: int
    deliveries_settled_by_multiple_acks: int
    nacks_sent: int
    nack_requeue: bool
    nacked_delivery_tags: list[int]
    redelivered_delivery_tags: list[int]
    rejects_sent: int
    connections_opened: int
    channels_opened: int
    publish_channel: int
    consume_channel: int
    heartbeat: int
    frame_max: int
    channel_max: int
    server_product: str
    server_version: str


def amqp091_qos_confirms(
    host: str,
    port: int,
    *,
    messages: int = 200,
    prefetch_count: int = 10,
    body_size: int = 256,
    queue: str = "amqpscope.qos-confirms",
    nack_delivery_tag: int = 7,
    multiple_ack_every: int = 5,
) -> Truth:
    """Publish with confirms on channel 1, consume with ``basic.qos`` on channel 2.

    Ack pattern by delivery tag ``t`` (``k = multiple_ack_every``): ``t % k == k - 1`` is held
    back, ``t % k == 0`` is acked with ``multiple=True`` (settling the held one too), every
    other tag is acked singly, except ``nack_delivery_tag`` which is nacked with requeue and
    comes back as a redelivery under a new tag.
    """
    if not 0 < nack_delivery_tag <= messages or nack_delivery_tag % multiple_ack_every in (
        0,
        multiple_ack_every - 1,
    ):
        raise ValueError("nack_delivery_tag must be a delivery that would be acked singly")
    credentials = pika.PlainCredentials(*GUEST)
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(host=host, port=port, credentials=credentials, ssl_options=tls.pika_ssl_options(port))
    )
    try:
        publish_channel = connection.channel()
        publish_channel.queue_declare(queue=queue, durable=False, auto_delete=False)
        publish_channel.confirm_delivery()
        for index in range(1, messages + 1):
            # With confirms on, BlockingChannel.basic_publish waits for the broker's
            # basic.ack and raises NackError/UnroutableError otherwise.
            publish_channel.basic_publish(
                exchange="",
                routing_key=queue,
                body=message_body("0-9-1", index, body_size),
                properties=pika.BasicProperties(message_id=str(index), delivery_mode=1),
            )
        consumer = _Amqp091Consumer(messages, nack_delivery_tag, multiple_ack_every)
        consume_channel = connection.channel()
        consume_channel.basic_qos(prefetch_count=prefetch_count, global_qos=False)
        consumer_tag = consume_channel.basic_consume(queue, consumer.on_message, auto_ack=False)
        deadline = time.monotonic() + SCENARIO_TIMEOUT
        while not consumer.done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {len(consumer.acked_ids)} of {messages} messages")
            connection.process_data_events(time_limit=0.5)
        consumer.flush(consume_channel)
        consume_channel.basic_cancel(consumer_tag)
        consume_channel.queue_delete(queue)
        consume_channel.close()
        publish_channel.close()
        # pika keeps the tune-ok values on the impl's parameters; there is no public accessor.
        params = connection._impl.params
        server = connection._impl.server_properties
        truth = Amqp091QosConfirmsTruth(
            protocol="amqp-0-9-1",
            client_library="pika",
            client_version=pika.__version__,
            queue=queue,
            exchange="",
            routing_key=queue,
            message_body_size=body_size,
            messages_published=messages,
            publisher_confirms=True,
            confirms_expected=messages,
            confirms_acked=messages,
            prefetch_count=prefetch_count,
            prefetch_global=False,
            consumer_tag=consumer_tag,
            deliveries_received=consumer.deliveries,
            redeliveries_received=len(consumer.redelivered_tags),
            distinct_messages_received=len(consumer.seen_ids),
            acks_sent=consumer.acks_single + consumer.acks_multiple,
            acks_single=consumer.acks_single,
            acks_multiple=consumer.acks_multiple,
            deliveries_settled_by_multiple_acks=consumer.settled_by_multiple,
            nacks_sent=len(consumer.nacked_tags),
            nack_requeue=True,
            nacked_delivery_tags=consumer.nacked_tags,
            redelivered_delivery_tags=consumer.redelivered_tags,
            rejects_sent=0,
            connections_opened=1,
            channels_opened=2,
            publish_channel=publish_channel.channel_number,
            consume_channel=consume_channel.channel_number,
            heartbeat=int(params.heartbeat),
            frame_max=int(params.frame_max),
            channel_max=int(params.channel_max),
            server_product=_text(server.get("product", "")),
            server_version=_text(server.get("version", "")),
        )
    finally:
        if connection.is_open:
            connection.close()
    return asdict(truth)


@dataclass
class _Amqp091Consumer:
    """Consumer callback state: which tags were acked how, what came back redelivered."""

    expected: int
    nack_delivery_tag: int
    multiple_ack_every: int
    deliveries: int = 0
    acks_single: int = 0
    acks_multiple: int = 0
    settled_by_multiple: int = 0
    held: list[int] = field(default_factory=list)
    nacked_tags: list[int] = field(default_factory=list)
    redelivered_tags: list[int] = field(default_factory=list)
    seen_ids: set[str] = field(default_factory=set)
    acked_ids: set[str] = field(default_factory=set)
    held_ids: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.acked_ids) + len(self.held_ids) >= self.expected

    def on_message(
        self,
        channel: Any,
        method: pika.spec.Basic.Deliver,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        tag = method.delivery_tag
        message_id = str(properties.message_id)
        self.deliveries += 1
        self.seen_ids.add(message_id)
        if method.redelivered:
            self.redelivered_tags.append(tag)
        k = self.multiple_ack_every
        if tag == self.nack_delivery_tag:
            channel.basic_nack(delivery_tag=tag, multiple=False, requeue=True)
            self.nacked_tags.append(tag)
        elif tag % k == k - 1:
            self.held.append(tag)
            self.held_ids.append(message_id)
        elif tag % k == 0:
            channel.basic_ack(delivery_tag=tag, multiple=True)
            self._settled_multiple(message_id)
        else:
            channel.basic_ack(delivery_tag=tag, multiple=False)
            self.acks_single += 1
            self.acked_ids.add(message_id)

    def flush(self, channel: Any) -> None:
        """Settle deliveries still held back when the last message arrived."""
        if self.held:
            tag, message_id = self.held.pop(), self.held_ids.pop()
            channel.basic_ack(delivery_tag=tag, multiple=True)
            self._settled_multiple(message_id)

    def _settled_multiple(self, message_id: str) -> None:
        self.acks_multiple += 1
        self.settled_by_multiple += 1 + len(self.held)
        self.acked_ids.add(message_id)
        self.acked_ids.update(self.held_ids)
        self.held.clear()
        self.held_ids.clear()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- AMQP 1.0: sender credit from the broker, receiver granting a small credit window ---------


@dataclass(frozen=True)
class Amqp10CreditTruth:
    """What the python-qpid-proton client of ``amqp10_credit`` did."""

    protocol: str
    client_library: str
    client_version: str
    container_id: str
    address: str
    queue: str
    sasl_mechanism: str
    sasl_user: str
    message_body_size: int
    body_section: str
    messages_sent: int
    sender_settle_mode: str
    sender_outcomes_accepted: int
    messages_received: int
    messages_accepted: int
    credit_window: int
    credit_grants: int
    credit_granted_total: int
    receiver_opened_after_all_sent: bool
    connections_opened: int
    sessions_opened: int
    links_attached: int
    remote_max_frame_size: int
    remote_idle_timeout_s: float
    remote_container_id: str


def amqp10_credit(
    host: str,
    port: int,
    *,
    messages: int = 100,
    credit_window: int = 5,
    body_size: int = 256,
    queue: str = "amqpscope.credit",
) -> Truth:
    """Send ``messages`` unsettled transfers to ``/queue/<queue>``, then receive them all.

    The receiver never holds more than ``credit_window`` credit: it grants the window with
    one ``flow`` when the link opens and again each time the credit is used up, and accepts
    every message. RabbitMQ 3.10's plugin declares the queue on attach to ``/queue/<name>``.
    """
    if messages % credit_window:
        raise ValueError("messages must be a multiple of credit_window (no drain at the end)")
    handler = _CreditHandler(host, port, f"/queue/{queue}", messages, credit_window, body_size)
    container = Container(handler)
    container.container_id = "amqpscope-testbed"
    container.run()
    if handler.error is not None:
        raise RuntimeError(f"amqp10_credit failed: {handler.error}")
    truth = Amqp10CreditTruth(
        protocol="amqp-1.0",
        client_library="python-qpid-proton",
        client_version=distribution_version("python-qpid-proton"),
        container_id=container.container_id,
        address=handler.address,
        queue=queue,
        sasl_mechanism=handler.sasl_mechanism,
        sasl_user=GUEST[0],
        message_body_size=body_size,
        body_section="data",
        messages_sent=handler.sent,
        sender_settle_mode="unsettled",
        sender_outcomes_accepted=handler.sender_accepted,
        messages_received=handler.received,
        messages_accepted=handler.accepted,
        credit_window=credit_window,
        credit_grants=handler.credit_grants,
        credit_granted_total=handler.credit_grants * credit_window,
        receiver_opened_after_all_sent=True,
        connections_opened=1,
        sessions_opened=1,
        links_attached=2,
        remote_max_frame_size=handler.remote_max_frame_size,
        remote_idle_timeout_s=handler.remote_idle_timeout,
        remote_container_id=handler.remote_container_id,
    )
    return asdict(truth)


class ClosedInTurn:
    """A proton receiver's handler that, once it has ``received`` all its ``messages`` and closed
    its receiving link, closes the session and then the connection, each after the peer answered:
    closing all at once races RabbitMQ 3.10, which can send its detach and end after its close, so
    the socket is gone and the kernel answers RST."""

    received: int
    messages: int

    def on_link_closed(self, event: Any) -> None:
        if event.link.is_receiver and self.received == self.messages:
            event.session.close()

    def on_link_remote_detach(self, event: Any) -> None:
        # RabbitMQ 3.10 answers our closing detach with a detach without closed=true, which
        # proton reports as a detach, not a close (so on_link_closed never comes).
        self.on_link_closed(event)

    def on_session_closed(self, event: Any) -> None:
        if self.received == self.messages:
            event.connection.close()


class _CreditHandler(ClosedInTurn, MessagingHandler):  # type: ignore[misc]
    """Sender first, receiver once every transfer is accepted; credit granted by hand."""

    def __init__(self, host: str, port: int, address: str, messages: int, window: int, body_size: int) -> None:
        # prefetch=0: no FlowController, so every credit grant on the wire is one of ours.
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.url = f"amqp://{host}:{port}"
        self.address = address
        self.messages = messages
        self.window = window
        self.body_size = body_size
        self.sent = 0
        self.sender_accepted = 0
        self.received = 0
        self.accepted = 0
        self.credit_grants = 0
        self.sasl_mechanism = ""
        self.remote_max_frame_size = 0
        self.remote_idle_timeout = 0.0
        self.remote_container_id = ""
        self.error: str | None = None
        self._connection: Any = None
        self._timer: Any = None

    def on_start(self, event: Any) -> None:
        self._connection = event.container.connect(
            self.url,
            user=GUEST[0],
            password=GUEST[1],
            allowed_mechs="PLAIN",
            # PLAIN without TLS is the point: the capture shows the sasl-init in clear text.
            allow_insecure_mechs=True,
            reconnect=False,
        )
        event.container.create_sender(self._connection, self.address)
        self._timer = event.container.schedule(SCENARIO_TIMEOUT, _Timeout(self))

    def on_connection_opened(self, event: Any) -> None:
        transport = event.transport
        self.sasl_mechanism = SASL(transport).mech or ""
        self.remote_max_frame_size = int(transport.remote_max_frame_size)
        self.remote_idle_timeout = float(transport.remote_idle_timeout)
        self.remote_container_id = str(event.connection.remote_container or "")

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit > 0 and self.sent < self.messages:
            self.sent += 1
            body = message_body("1.0", self.sent, self.body_size)
            sender.send(Message(id=self.sent, body=body, inferred=True))

    def on_accepted(self, event: Any) -> None:
        self.sender_accepted += 1
        if self.sender_accepted == self.messages:
            event.link.close()
            receiver = event.container.create_receiver(self._connection, self.address)
            self._grant(receiver)

    def on_rejected(self, event: Any) -> None:
        self._fail(f"broker rejected delivery {event.delivery.tag!r}")

    def on_released(self, event: Any) -> None:
        self._fail(f"broker released delivery {event.delivery.tag!r}")

    def on_message(self, event: Any) -> None:
        self.received += 1
        self.accept(event.delivery)
        self.accepted += 1
        receiver = event.receiver
        if self.received == self.messages:
            # Close link, session and connection one after the other, each after the peer
            # answered: closing all at once races RabbitMQ 3.10, which can send its detach
            # and end after its close, so our socket is gone and the kernel answers RST.
            receiver.close()
        elif receiver.credit == 0:
            self._grant(receiver)

    def on_transport_closed(self, event: Any) -> None:
        # A cancelled timer still keeps the reactor waiting for its next wake-up (~3 s).
        if self._timer is not None:
            self._timer.cancel()
        event.container.stop()

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        detail = f"{condition.name}: {condition.description}" if condition else "unknown"
        self._fail(f"transport error: {detail}")

    def _grant(self, receiver: Any) -> None:
        receiver.flow(self.window)
        self.credit_grants += 1

    def _fail(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
        if self._connection is not None:
            self._connection.close()
        if self._timer is not None:
            self._timer.cancel()


class _Timeout:
    """Scheduled task: give up (and close the connection) if the scenario hangs."""

    def __init__(self, handler: _CreditHandler) -> None:
        self.handler = handler

    def on_timer_task(self, event: Any) -> None:
        self.handler._fail(
            f"timed out after {SCENARIO_TIMEOUT:.0f} s (sent {self.handler.sent}, received {self.handler.received})"
        )


# -- running scenarios, alone or several at once ----------------------------------------------

CLIENT_SCENARIOS: Mapping[str, Callable[[str, int], Truth]] = {
    "amqp091_qos_confirms": amqp091_qos_confirms,
    "amqp10_credit": amqp10_credit,
}

# A capture scenario runs one or more client scenarios concurrently, each on its own queue.
SCENARIOS: Mapping[str, tuple[str, ...]] = {
    "amqp091_qos_confirms": ("amqp091_qos_confirms",),
    "amqp10_credit": ("amqp10_credit",),
    "mixed": ("amqp091_qos_confirms", "amqp10_credit"),
}


def run_scenario(name: str, host: str, port: int) -> dict[str, Truth]:
    """Run scenario ``name``; return each client scenario's ground truth by its name."""
    try:
        parts = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose from {sorted(SCENARIOS)}") from None
    if len(parts) == 1:
        return {parts[0]: CLIENT_SCENARIOS[parts[0]](host, port)}
    results: dict[str, Truth] = {}
    errors: dict[str, BaseException] = {}

    def run(part: str) -> None:
        try:
            results[part] = CLIENT_SCENARIOS[part](host, port)
        except BaseException as exc:  # re-raised in the calling thread below
            errors[part] = exc

    threads = [threading.Thread(target=run, args=(part,), name=part) for part in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        part, exc = next(iter(errors.items()))
        raise RuntimeError(f"scenario {name}: {part} failed") from exc
    return {part: results[part] for part in parts}
