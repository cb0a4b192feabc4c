"""Client scenarios that exercise every corner the decoders must get right, against a real broker.

``register()`` (or, for a while, ``registered()``) adds them to the scenarios of
``testbed.scenarios`` (``CLIENT_SCENARIOS`` / ``SCENARIOS``), so ``testbed.capture.capture_scenario``
captures them like the others:

- ``amqp091_methods``: AMQPLAIN login, four channels, exchange / queue declare-bind-unbind-purge-
  delete with typed field-table arguments, publishes carrying every basic property, basic.get /
  get-empty, ack with multiple, reject and nack with and without requeue, publisher confirms
  acked and nacked (a reject-publish queue), a mandatory publish returned, a consumer with a
  global qos, basic.recover, tx.select / commit, connection.update-secret.
- ``amqp091_heartbeats``: a 1 s heartbeat and an idle connection.
- ``amqp091_blocked``: a memory alarm raised while publishing: connection.blocked / unblocked.
  It needs to switch the alarm: ``alarm_switch(broker)`` must be entered around the capture.
- ``amqp091_frame_max``: the smallest frame-max (4096), bodies split into frames of it, then a
  content header larger than it, which RabbitMQ answers by closing the connection (501).
- ``amqp091_content_cut_short``: a content header followed by less body than it declares, then a
  method, which RabbitMQ answers by closing the connection (505).
- ``amqp10_large``: 100 KB messages over a client max-frame-size of 4096 (multi-frame transfers
  both ways), every message-properties field, application properties, annotations and the three
  body kinds. (No aborted delivery: we could not make proton 0.40 put ``aborted=true`` on the
  wire, so aborts are unit-tested on built bytes.)
- ``amqp10_drain_idle``: a drain flow answered by the broker, then an idle connection (empty
  frames both ways; the broker needs ``HEARTBEAT_BROKER_CONFIG`` to ask for them every second).

As in ``testbed.scenarios``, the ground truth is what the clients did, not what a decoder saw.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import struct
import time
from collections.abc import Callable, Iterator
from importlib.metadata import version as distribution_version
from typing import Any

import pika
import pika.exceptions
from proton import Message, symbol, ulong
from proton.handlers import MessagingHandler
from proton.reactor import Container

from testbed.broker import PrivateBroker, memory_alarm_switch
from testbed.broker import alarm_switch as lend_alarm_switch
from testbed.scenarios import CLIENT_SCENARIOS, GUEST, SCENARIO_TIMEOUT, SCENARIOS, Truth, message_body

# -- the memory alarm: scenarios get (host, port), the broker is reached through this switch -----

ALARM_WATERMARK = 0.000001  # a fraction of RAM any running node exceeds: raises the memory alarm


def alarm_switch(broker: PrivateBroker) -> contextlib.AbstractContextManager[None]:
    """Let ``amqp091_blocked`` raise and clear ``broker``'s memory alarm while it runs."""
    return lend_alarm_switch(broker, ALARM_WATERMARK)


# -- AMQP 0-9-1 ------------------------------------------------------------------------------


class AmqplainCredentials(pika.PlainCredentials):
    """RabbitMQ's AMQPLAIN mechanism: the response is a field table without its size prefix."""

    MECHANISM = "AMQPLAIN"

    def response_for(self, start: Any) -> tuple[str | None, bytes | None]:
        if self.MECHANISM.encode() not in bytes(start.mechanisms).split():
            return None, None
        table = b"".join(
            struct.pack(">B", len(key)) + key.encode() + b"S" + struct.pack(">I", len(value)) + value.encode()
            for key, value in (("LOGIN", self.username or ""), ("PASSWORD", self.password or ""))
        )
        return self.MECHANISM, table


# Every field-table value type pika writes (RabbitMQ's letters: t I l D T F A V x S).
RICH_HEADERS: dict[str, Any] = {
    "bool": True,
    "int": -7,
    "long": 2**40,
    "decimal": decimal.Decimal("3.14"),
    "when": dt.datetime(2024, 1, 2, 3, 4, 5),
    "nested": {"inner": "x", "deeper": {"n": 1}},
    "empty": {},
    "list": [1, "two", [3]],
    "none": None,
    "bytes": b"\x00\x01",
    "text": "h\u00e9llo",
}


def rich_properties(index: int) -> pika.BasicProperties:
    """Every basic property set (user-id must be the authenticated user, RabbitMQ checks it)."""
    return pika.BasicProperties(
        content_type="text/plain",
        content_encoding="utf-8",
        headers=RICH_HEADERS,
        delivery_mode=2,
        priority=3,
        correlation_id=f"corr-{index}",
        reply_to="amqpscope.replies",
        expiration="60000",
        message_id=f"msg-{index}",
        timestamp=1_700_000_000 + index,
        type="amqpscope.test",
        user_id=GUEST[0],
        app_id="amqpscope",
    )


def amqp091_methods(host: str, port: int, *, messages: int = 8, body_size: int = 64) -> Truth:
    """The 0-9-1 methods and arguments of RabbitMQ's definition, each on the wire at least once."""
    exchange, exchange2 = "amqpscope.dec.direct", "amqpscope.dec.fanout"
    queue, capped, consumed = "amqpscope.dec.get", "amqpscope.dec.capped", "amqpscope.dec.consume"
    parameters = pika.ConnectionParameters(host=host, port=port, credentials=AmqplainCredentials(*GUEST))
    connection = pika.BlockingConnection(parameters)
    truth: Truth = {
        "protocol": "amqp-0-9-1",
        "client_library": "pika",
        "client_version": pika.__version__,
        "sasl_mechanism": AmqplainCredentials.MECHANISM,
    }
    try:
        admin = connection.channel()  # channel 1: topology
        admin.exchange_declare(exchange, "direct", durable=False, arguments={"x-note": "amqpscope"})
        admin.exchange_declare(exchange2, "fanout", auto_delete=True)
        admin.exchange_bind(exchange2, exchange, routing_key="to-fanout")
        admin.exchange_unbind(exchange2, exchange, routing_key="to-fanout")
        admin.queue_declare(queue, arguments={"x-max-length": 1000, "x-message-ttl": 600_000})
        admin.queue_bind(queue, exchange, routing_key="get", arguments={"x-match": "all"})
        admin.queue_declare(capped, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
        admin.queue_declare(consumed)

        publisher = connection.channel()  # channel 2: publishes with confirms
        publisher.confirm_delivery()
        for index in range(1, messages + 1):
            publisher.basic_publish(exchange, "get", message_body("0-9-1", index, body_size), rich_properties(index))
        confirms_nacked = 0
        for index in range(4):
            try:
                publisher.basic_publish("", capped, message_body("0-9-1", index, body_size))
            except pika.exceptions.NackError:
                confirms_nacked += 1
        returned = 0
        try:
            publisher.basic_publish(exchange, "no-such-key", b"unroutable", mandatory=True)
        except pika.exceptions.UnroutableError:
            returned += 1

        getter = connection.channel()  # channel 3: basic.get, settled every way
        tags = []
        while True:
            method, _props, _body = getter.basic_get(queue, auto_ack=False)
            if method is None:
                break
            tags.append(method.delivery_tag)
        # tags 1..n: ack 1-2 with multiple, reject 3 (requeue), reject 4 (drop), nack 5-6 multiple
        # (requeue), nack 7 single (drop), ack the rest singly.
        getter.basic_ack(tags[1], multiple=True)
        getter.basic_reject(tags[2], requeue=True)
        getter.basic_reject(tags[3], requeue=False)
        getter.basic_nack(tags[5], multiple=True, requeue=True)
        getter.basic_nack(tags[6], multiple=False, requeue=False)
        for tag in tags[7:]:
            getter.basic_ack(tag)
        requeued = []
        while True:
            method, _props, _body = getter.basic_get(queue, auto_ack=True)
            if method is None:
                break
            requeued.append(method.delivery_tag)
        getter.queue_purge(queue)

        consumer = connection.channel()  # channel 4: a consumer under a global qos, recover, tx
        consumer.basic_qos(prefetch_count=3, global_qos=True)
        consumer.tx_select()
        for index in range(3):
            consumer.basic_publish("", consumed, message_body("0-9-1", index, body_size))
        consumer.tx_commit()
        delivered: list[int] = []
        consumer_tag = consumer.basic_consume(consumed, lambda ch, m, p, b: delivered.append(m.delivery_tag))
        _wait(connection, lambda: len(delivered) >= 3)
        consumer.basic_recover(requeue=True)
        _wait(connection, lambda: len(delivered) >= 6)
        consumer.basic_ack(0, multiple=True)
        consumer.basic_cancel(consumer_tag)
        consumer.tx_commit()

        careless = connection.channel()  # channel 5: one delivery acked twice, a classic client bug
        careless.basic_publish("", consumed, b"acked twice")
        twice = None
        for _attempt in range(50):  # the publish reaches the queue before the get (one channel, in order)
            twice, _props, _body = careless.basic_get(consumed, auto_ack=False)
            if twice is not None:
                break
        if twice is None:
            raise RuntimeError(f"the message published to {consumed} never arrived")
        careless.basic_ack(twice.delivery_tag)
        careless.basic_ack(twice.delivery_tag)  # RabbitMQ: 406 PRECONDITION_FAILED "unknown delivery tag"
        _wait(connection, lambda: careless.is_closed)

        connection.update_secret(GUEST[1], "amqpscope rotation")
        admin.queue_unbind(queue, exchange, routing_key="get", arguments={"x-match": "all"})
        for name in (queue, capped, consumed):
            admin.queue_delete(name)
        admin.exchange_delete(exchange2)
        admin.exchange_delete(exchange, if_unused=False)
        for channel in (consumer, getter, publisher, admin):
            channel.close()
        truth.update(
            channels_opened=5,
            messages_published=messages,
            publishes_to_capped_queue=4,
            confirms_nacked=confirms_nacked,
            confirms_acked=messages + 4 - confirms_nacked + returned,
            returned=returned,
            gets_ok=len(tags) + len(requeued) + 1,
            acked_twice_channel=careless.channel_number,
            acked_twice_tag=twice.delivery_tag,
            gets_empty=2,
            requeued_by_reject_and_nack=len(requeued),
            rejects_sent=2,
            nacks_sent=2,
            tx_commits=2,
            deliveries_to_consumer=len(delivered),
            prefetch_count=3,
            prefetch_global=True,
            update_secret=True,
        )
    finally:
        if connection.is_open:
            connection.close()
    return truth


def _wait(connection: pika.BlockingConnection, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SCENARIO_TIMEOUT
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError("scenario condition not reached")
        connection.process_data_events(time_limit=0.2)


def amqp091_heartbeats(host: str, port: int, *, heartbeat: int = 1, idle_seconds: float = 3.5) -> Truth:
    """Negotiate a 1 s heartbeat and stay idle: heartbeat frames from both peers."""
    parameters = pika.ConnectionParameters(
        host=host, port=port, heartbeat=heartbeat, credentials=pika.PlainCredentials(*GUEST)
    )
    connection = pika.BlockingConnection(parameters)
    try:
        connection.channel()
        connection.sleep(idle_seconds)  # pika sends heartbeats from its I/O loop while sleeping
        negotiated = int(connection._impl.params.heartbeat)
    finally:
        if connection.is_open:
            connection.close()
    return {"protocol": "amqp-0-9-1", "heartbeat": negotiated, "idle_seconds": idle_seconds}


BLOCKED_HEARTBEAT = 60  # seconds: longer than raising and clearing the alarm takes


def amqp091_blocked(host: str, port: int, *, before: int = 3, after: int = 3, body_size: int = 64) -> Truth:
    """Publish, raise the memory alarm, publish once more (blocked), clear it (unblocked), go on."""
    switch = memory_alarm_switch(port)
    if switch is None:
        raise RuntimeError("amqp091_blocked needs testbed.decoder_scenarios.alarm_switch(broker)")
    queue = "amqpscope.dec.blocked"
    # Pika's blocking connection sends nothing while the switch runs (rabbitmqctl: about 1.8 s a
    # call, more on a loaded machine) and while it sleeps: with the module broker's 1 s heartbeat
    # (HEARTBEAT_BROKER_CONFIG) RabbitMQ took it for dead and reset it. This connection asks for 60 s.
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            host=host, port=port, heartbeat=BLOCKED_HEARTBEAT, credentials=pika.PlainCredentials(*GUEST)
        )
    )
    events: list[str] = []
    connection.add_on_connection_blocked_callback(lambda _c, frame: events.append(f"blocked:{frame.method.reason}"))
    connection.add_on_connection_unblocked_callback(lambda _c, _f: events.append("unblocked"))
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        for index in range(before):
            channel.basic_publish("", queue, message_body("0-9-1", index, body_size))
        switch(True)
        time.sleep(0.5)
        # The reader blocks on the first content method after the alarm and says so.
        channel.basic_publish("", queue, message_body("0-9-1", before, body_size))
        _wait(connection, lambda: any(e.startswith("blocked") for e in events))
        switch(False)
        _wait(connection, lambda: "unblocked" in events)
        for index in range(before + 1, before + 1 + after):
            channel.basic_publish("", queue, message_body("0-9-1", index, body_size))
        channel.queue_delete(queue)
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return {
        "protocol": "amqp-0-9-1",
        "messages_published": before + 1 + after,
        "events": events,
        "blocked_reason": events[0].split(":", 1)[1] if events else None,
    }


FRAME_MAX = 4096  # the smallest frame-max 0-9-1 allows (FRAME-MIN-SIZE)


def amqp091_frame_max(host: str, port: int, *, messages: int = 6, body_size: int = 64) -> Truth:
    """Negotiate the smallest frame-max, publish within it, then a message whose content header
    (a big headers table) does not fit in one frame: pika sends it whole, RabbitMQ closes the
    connection (501 FRAME_ERROR)."""
    queue = "amqpscope.dec.frame-max"
    parameters = pika.ConnectionParameters(
        host=host, port=port, frame_max=FRAME_MAX, credentials=pika.PlainCredentials(*GUEST)
    )
    connection = pika.BlockingConnection(parameters)
    try:
        channel = connection.channel()
        channel.queue_declare(queue, auto_delete=True)
        for index in range(1, messages + 1):
            # Bodies larger than a frame: pika splits them into frames of frame-max.
            channel.basic_publish(
                "", queue, message_body("0-9-1", index, body_size * index * 20), rich_properties(index)
            )
        oversized = pika.BasicProperties(headers={"padding": "x" * (2 * FRAME_MAX)})
        channel.basic_publish("", queue, b"too big a header", oversized)
        closed_by = _closed_by_broker(connection)
    finally:
        if connection.is_open:
            connection.close()
    return {
        "protocol": "amqp-0-9-1",
        "frame_max": FRAME_MAX,
        "messages_published": messages + 1,
        "closed_by_broker": closed_by,
    }


def _closed_by_broker(connection: pika.BlockingConnection) -> tuple[int, str] | None:
    """Wait for the broker to close ``connection``: its reply code and text (None: closed otherwise)."""
    try:
        _wait(connection, lambda: connection.is_closed)
    except pika.exceptions.ConnectionClosedByBroker as exc:
        return exc.reply_code, exc.reply_text
    return None


CUT_SHORT_BODY_SIZE = 10


def amqp091_content_cut_short(host: str, port: int, *, messages: int = 4, body_size: int = 64) -> Truth:
    """Publish a few messages, then one whose content header promises more body than is sent
    before the next method. pika never does that itself: its frames are sent one by one here
    (``Connection._send_frame``). RabbitMQ closes the connection (505 UNEXPECTED_FRAME)."""
    queue = "amqpscope.dec.cut-short"
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(host=host, port=port, credentials=pika.PlainCredentials(*GUEST))
    )
    try:
        channel = connection.channel()
        channel.queue_declare(queue, auto_delete=True)
        for index in range(1, messages + 1):
            channel.basic_publish("", queue, message_body("0-9-1", index, body_size), rich_properties(index))
        number, send = channel.channel_number, connection._impl._send_frame
        send(pika.frame.Method(number, pika.spec.Basic.Publish(exchange="", routing_key=queue)))
        send(pika.frame.Header(number, CUT_SHORT_BODY_SIZE, pika.BasicProperties()))
        send(pika.frame.Body(number, b"cut"))  # 3 of the 10 bytes the header promised
        send(pika.frame.Method(number, pika.spec.Basic.Qos(prefetch_count=1)))  # a method comes next
        closed_by = _closed_by_broker(connection)
    finally:
        if connection.is_open:
            connection.close()
    return {
        "protocol": "amqp-0-9-1",
        "messages_published": messages + 1,
        "cut_short_body_size": CUT_SHORT_BODY_SIZE,
        "closed_by_broker": closed_by,
    }


# -- AMQP 1.0 --------------------------------------------------------------------------------


class _Amqp10Handler(MessagingHandler):  # type: ignore[misc]
    """Common plumbing: one connection with SASL PLAIN, a timeout, failures kept."""

    def __init__(self, host: str, port: int, **connect: Any) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.url = f"amqp://{host}:{port}"
        self.connect_options = connect
        self.error: str | None = None
        self.connection: Any = None
        self.timer: Any = None

    def on_start(self, event: Any) -> None:
        self.connection = event.container.connect(
            self.url,
            user=GUEST[0],
            password=GUEST[1],
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            reconnect=False,
            **self.connect_options,
        )
        self.timer = event.container.schedule(SCENARIO_TIMEOUT, _Deadline(self))
        self.started(event)

    def started(self, event: Any) -> None:
        raise NotImplementedError

    def on_transport_closed(self, event: Any) -> None:
        if self.timer is not None:
            self.timer.cancel()
        event.container.stop()

    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        self.fail(f"transport error: {condition.name if condition else 'unknown'}")

    def fail(self, reason: str) -> None:
        self.error = self.error or reason
        if self.connection is not None:
            self.connection.close()


class _Deadline:
    def __init__(self, handler: _Amqp10Handler) -> None:
        self.handler = handler

    def on_timer_task(self, event: Any) -> None:
        self.handler.fail(f"timed out after {SCENARIO_TIMEOUT:.0f} s")


class _Later:
    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action

    def on_timer_task(self, event: Any) -> None:
        self.action()


def large_messages(body_size: int) -> list[Message]:
    """One message per body kind; the first carries every properties field."""
    data = Message(
        id=ulong(2**40 + 1),  # an 8-byte ulong message-id
        user_id=GUEST[0].encode(),
        address="/queue/amqpscope.dec.large",
        subject="large data",
        reply_to="/queue/amqpscope.dec.replies",
        correlation_id="corr-1",
        content_type="application/octet-stream",
        content_encoding="binary",
        expiry_time=2_000_000_000.0,
        creation_time=1_700_000_000.0,
        group_id="group-a",
        group_sequence=7,
        reply_to_group_id="group-b",
        durable=True,
        priority=6,
        ttl=600.0,
        properties={"index": 1, "kind": "data", "flag": True},
        annotations={symbol("x-opt-amqpscope"): "annotated"},
        body=message_body("1.0", 1, body_size),
        inferred=True,
    )
    value = Message(id="message-2", subject="large value", body="v" * body_size)
    sequence = Message(id=3, subject="large sequence", body=[message_body("1.0", 3, body_size // 2), 42], inferred=True)
    return [data, value, sequence]


class _LargeHandler(_Amqp10Handler):
    """Send the large messages, then receive them all."""

    def __init__(self, host: str, port: int, body_size: int, max_frame_size: int) -> None:
        super().__init__(host, port, max_frame_size=max_frame_size)
        self.address = "/queue/amqpscope.dec.large"
        self.messages = large_messages(body_size)
        self.body_size = body_size
        self.sent = 0
        self.accepted = 0
        self.received: list[dict[str, Any]] = []
        self.remote_max_frame_size = 0

    def started(self, event: Any) -> None:
        event.container.create_sender(self.connection, self.address)

    def on_connection_opened(self, event: Any) -> None:
        self.remote_max_frame_size = int(event.transport.remote_max_frame_size)

    def on_sendable(self, event: Any) -> None:
        sender = event.sender
        while sender.credit > 0 and self.sent < len(self.messages):
            sender.send(self.messages[self.sent])
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == len(self.messages):
            event.link.close()
            receiver = event.container.create_receiver(self.connection, self.address)
            receiver.flow(len(self.messages))

    def on_rejected(self, event: Any) -> None:
        self.fail("broker rejected a large message")

    def on_message(self, event: Any) -> None:
        message = event.message
        self.received.append({"id": str(message.id), "subject": message.subject})
        self.accept(event.delivery)
        if len(self.received) == len(self.messages):
            event.receiver.close()

    def on_link_remote_detach(self, event: Any) -> None:
        if event.link.is_receiver:
            event.session.close()

    def on_link_closed(self, event: Any) -> None:
        self.on_link_remote_detach(event)

    def on_session_closed(self, event: Any) -> None:
        event.connection.close()


def amqp10_large(host: str, port: int, *, body_size: int = 100_000, max_frame_size: int = 4096) -> Truth:
    """Messages larger than both peers' max-frame-size: every delivery spans several transfers."""
    handler = _LargeHandler(host, port, body_size, max_frame_size)
    Container(handler).run()
    if handler.error is not None:
        raise RuntimeError(f"amqp10_large failed: {handler.error}")
    return {
        "protocol": "amqp-1.0",
        "client_library": "python-qpid-proton",
        "client_version": distribution_version("python-qpid-proton"),
        "client_max_frame_size": max_frame_size,
        "broker_max_frame_size": handler.remote_max_frame_size,
        "body_size": body_size,
        "messages_sent": handler.sent,
        "messages_accepted_by_broker": handler.accepted,
        "messages_received": len(handler.received),
        "received": handler.received,
        "first_message_id": 2**40 + 1,
        "body_sections": ["data", "amqp-value", "amqp-sequence"],
    }


DRAIN_QUEUE = "amqpscope.dec.drain"
# proton advertises half of it as its idle-time-out; the broker's own comes from its
# ``heartbeat`` setting (``HEARTBEAT_BROKER_CONFIG``), and each peer sends empty frames to the other.
CLIENT_HEARTBEAT = 4
HEARTBEAT_BROKER_CONFIG = {"heartbeat": "1"}


class _DrainIdleHandler(_Amqp10Handler):
    """Queue a few messages, drain a larger credit, then sit idle under a 1 s idle time-out."""

    def __init__(self, host: str, port: int, messages: int, credit: int, idle_seconds: float) -> None:
        super().__init__(host, port, heartbeat=CLIENT_HEARTBEAT)
        self.address = f"/amq/queue/{DRAIN_QUEUE}"
        self.messages = messages
        self.credit = credit
        self.idle_seconds = idle_seconds
        self.sent = 0
        self.accepted = 0
        self.received = 0
        self.drained = False
        self.remote_idle_timeout = 0.0
        self.receiver: Any = None

    def started(self, event: Any) -> None:
        event.container.create_sender(self.connection, self.address)

    def on_connection_opened(self, event: Any) -> None:
        self.remote_idle_timeout = float(event.transport.remote_idle_timeout)

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit > 0 and self.sent < self.messages:
            self.sent += 1
            event.sender.send(Message(id=self.sent, body=message_body("1.0", self.sent, 64), inferred=True))

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.messages:
            event.link.close()
            self.receiver = event.container.create_receiver(self.connection, self.address)
            self.receiver.drain(self.credit)
            # The drain is answered within milliseconds; then the connection idles on heartbeats.
            event.container.schedule(self.idle_seconds, _Later(self.finish))

    def on_message(self, event: Any) -> None:
        self.received += 1
        self.accept(event.delivery)

    def finish(self) -> None:
        self.drained = self.receiver.credit == 0
        self.connection.close()


def amqp10_drain_idle(host: str, port: int, *, messages: int = 3, credit: int = 10, idle_seconds: float = 3.0) -> Truth:
    """A drain the broker must answer by spending the unused credit; then idle-time-out heartbeats.

    The queue is a quorum queue declared over 0-9-1 first: RabbitMQ 3.10 crashes the session
    (``function_clause`` in ``rabbit_classic_queue:handle_event(send_drained ...)``) when a
    classic queue answers a drain.
    """
    with pika.BlockingConnection(pika.ConnectionParameters(host=host, port=port)) as connection:
        channel = connection.channel()
        channel.queue_declare(DRAIN_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_purge(DRAIN_QUEUE)
    handler = _DrainIdleHandler(host, port, messages, credit, idle_seconds)
    Container(handler).run()
    with pika.BlockingConnection(pika.ConnectionParameters(host=host, port=port)) as connection:
        connection.channel().queue_delete(DRAIN_QUEUE)
    if handler.error is not None:
        raise RuntimeError(f"amqp10_drain_idle failed: {handler.error}")
    return {
        "protocol": "amqp-1.0",
        "client_library": "python-qpid-proton",
        "client_version": distribution_version("python-qpid-proton"),
        "messages_sent": handler.sent,
        "messages_received": handler.received,
        "drain_credit": credit,
        "drain_completed": handler.drained,
        "client_heartbeat_s": CLIENT_HEARTBEAT,
        "broker_idle_timeout_s": handler.remote_idle_timeout,
        "idle_seconds": idle_seconds,
    }


DECODER_SCENARIOS: dict[str, Callable[[str, int], Truth]] = {
    "amqp091_methods": amqp091_methods,
    "amqp091_heartbeats": amqp091_heartbeats,
    "amqp091_blocked": amqp091_blocked,
    "amqp091_frame_max": amqp091_frame_max,
    "amqp091_content_cut_short": amqp091_content_cut_short,
    "amqp10_large": amqp10_large,
    "amqp10_drain_idle": amqp10_drain_idle,
}


def register() -> None:
    """Add these scenarios to ``testbed.scenarios`` (what ``capture_scenario`` and the CLI choose from)."""
    CLIENT_SCENARIOS.update(DECODER_SCENARIOS)  # type: ignore[attr-defined]
    SCENARIOS.update({name: (name,) for name in DECODER_SCENARIOS})  # type: ignore[attr-defined]


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The scenarios registered for a while: other tests that iterate SCENARIOS do not see them."""
    added = [name for name in DECODER_SCENARIOS if name not in SCENARIOS]
    register()
    try:
        yield
    finally:
        for name in added:
            SCENARIOS.pop(name, None)  # type: ignore[attr-defined]
            CLIENT_SCENARIOS.pop(name, None)  # type: ignore[attr-defined]
