"""pika and python-qpid-proton clients of the problem scenarios.

- ``nacking_consumer``: a consumer that ``basic.nack(requeue=true)``s a message it cannot parse,
  endlessly or once (then ``basic.reject(requeue=false)``: dead-lettered).
- ``mandatory_publisher``: ``mandatory=true`` publishes, counting ``basic.return``.
- ``rpc_responder`` / ``rpc_caller``: request-reply with ``reply_to`` and ``correlation_id`` as
  RabbitMQ's RPC tutorial does it, each call's four client-side timestamps recorded.
- ``amqp10_burst_sender``: a 1.0 sender writing a fixed number of transfers as fast as its credit
  and socket allow, noting when each was written and when the broker settled it.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from typing import Any

import pika
from proton import Message

from testbed.amqp10_clients import PROTOCOL as AMQP10
from testbed.amqp10_clients import _Handler, _run
from testbed.bottleneck_clients import connect, local_port
from testbed.scenarios import SCENARIO_TIMEOUT, message_body

LINGER_SECONDS = 1.0  # a consumer done with its messages stays subscribed a second: a few more samples
POISON = b'{"order": 17, "quantity": }'  # a message no consumer can parse


def _now_us() -> int:
    return time.time_ns() // 1000


def _role(role: str, client_port: int, name: str, **facts: Any) -> dict[str, Any]:
    return {
        "role": role,
        "client_port": client_port,
        "connection_name": name,
        "protocol": "amqp-0-9-1",
        "client_library": "pika",
        **facts,
    }


def nacking_consumer(
    host: str,
    port: int,
    queue: str,
    *,
    prefetch: int,
    requeue_forever: bool,
    max_redeliveries: int,
    good_messages: int,
    name: str,
) -> dict[str, Any]:
    """Consume ``queue`` (prefetch ``prefetch``), acking what parses as JSON and nacking what
    does not with ``requeue=true``: endlessly (``requeue_forever``, until ``max_redeliveries``
    redeliveries or SCENARIO_TIMEOUT), or once and then ``basic.reject(requeue=false)`` (then until it
    has acked ``good_messages``)."""
    connection = connect(host, port, name)
    seen = {"deliveries": 0, "redeliveries": 0, "acked": 0, "nacked_requeue": 0, "rejected_no_requeue": 0}
    try:
        client_port = local_port(connection)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch)
        depth = channel.queue_declare(queue, passive=True).method.message_count

        def on_message(ch: Any, method: Any, _properties: Any, body: bytes) -> None:
            seen["deliveries"] += 1
            seen["redeliveries"] += bool(method.redelivered)
            try:
                json.loads(body)
            except ValueError:
                if requeue_forever or not method.redelivered:
                    ch.basic_nack(method.delivery_tag, requeue=True)
                    seen["nacked_requeue"] += 1
                else:
                    ch.basic_reject(method.delivery_tag, requeue=False)
                    seen["rejected_no_requeue"] += 1
                return
            ch.basic_ack(method.delivery_tag)
            seen["acked"] += 1

        tag = channel.basic_consume(queue, on_message, auto_ack=False)
        deadline = time.monotonic() + SCENARIO_TIMEOUT
        while time.monotonic() < deadline:
            if requeue_forever and seen["redeliveries"] >= max_redeliveries:
                break
            if not requeue_forever and seen["acked"] >= good_messages and seen["rejected_no_requeue"]:
                break
            connection.process_data_events(time_limit=0.05)
        linger_until = time.monotonic() + (0.0 if requeue_forever else LINGER_SECONDS)
        while time.monotonic() < linger_until:
            connection.process_data_events(time_limit=0.05)
        channel.basic_cancel(tag)
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return _role(
        "consumer",
        client_port,
        name,
        queue=queue,
        prefetch_count=prefetch,
        prefetch_global=False,
        messages_in_queue_at_start=depth,
        poison_messages=1,
        requeue_forever=requeue_forever,
        **seen,
    )


def mandatory_publisher(host: str, port: int, exchange: str, keys: list[str], rate: float, name: str) -> dict[str, Any]:
    """Publish one message per routing key in ``keys`` (``mandatory=true``, no confirms), ``rate``
    a second, and count the ``basic.return`` frames the broker sends back, by reply code."""
    connection = connect(host, port, name)
    returns: dict[str, int] = {}
    try:
        client_port = local_port(connection)
        channel = connection.channel()

        def on_return(_ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
            key = f"{method.reply_code} {method.reply_text}"
            returns[key] = returns.get(key, 0) + 1

        channel.add_on_return_callback(on_return)
        started = time.monotonic()
        for index, key in enumerate(keys):
            channel.basic_publish(exchange, key, message_body("0-9-1", index, 64), mandatory=True)
            connection.process_data_events(time_limit=max(0.0, started + (index + 1) / rate - time.monotonic()))
        connection.process_data_events(time_limit=0.5)  # the last returns
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return _role(
        "publisher",
        client_port,
        name,
        exchange=exchange,
        messages=len(keys),
        mandatory=True,
        routing_keys=sorted(set(keys)),
        rate_per_second=rate,
        returns_received=returns,
        publisher_confirms=False,
    )


# -- request-reply ------------------------------------------------------------------------------


def rpc_responder(
    host: str,
    port: int,
    queue: str,
    work_seconds: float,
    stop: threading.Event,
    ready: threading.Event,
    stamps: dict[str, dict[str, int]],
    name: str,
) -> dict[str, Any]:
    """Answer each request on ``queue`` after ``work_seconds``, publishing the reply to its
    ``reply_to`` with its ``correlation_id``, then ack it; ``stamps[correlation_id]`` gets when the
    request came and when the reply was handed to pika to write."""
    connection = connect(host, port, name)
    answered = 0
    try:
        client_port = local_port(connection)
        channel = connection.channel()
        channel.queue_declare(queue, durable=False)
        channel.basic_qos(prefetch_count=1)

        def on_request(ch: Any, method: Any, properties: Any, body: bytes) -> None:
            nonlocal answered
            received = _now_us()
            if work_seconds:
                time.sleep(work_seconds)  # the responder's work
            reply = pika.BasicProperties(correlation_id=properties.correlation_id)
            # Stamped as the reply is handed to pika: after basic_publish returns, this thread may
            # run again only once the caller has had the reply.
            stamps[properties.correlation_id] = {"request_received_us": received, "reply_sent_us": _now_us()}
            ch.basic_publish("", properties.reply_to, body, properties=reply)
            ch.basic_ack(method.delivery_tag)
            answered += 1

        channel.basic_consume(queue, on_request)
        ready.set()
        while not stop.is_set():
            connection.process_data_events(time_limit=0.05)
        channel.close()
    finally:
        ready.set()
        if connection.is_open:
            connection.close()
    return _role(
        "consumer",
        client_port,
        name,
        queue=queue,
        prefetch_count=1,
        prefetch_global=False,
        rpc="responder",
        answered=answered,
        work_seconds_per_call=work_seconds,
    )


def rpc_caller(
    host: str, port: int, queue: str, calls: int, seconds: float, stamps: dict[str, dict[str, int]], name: str
) -> dict[str, Any]:
    """Call back to back (the next request once the reply came), ``calls`` times or for ``seconds``:
    an exclusive server-named reply queue, ``reply_to`` + ``correlation_id`` on each request."""
    connection = connect(host, port, name)
    records: list[dict[str, Any]] = []
    try:
        client_port = local_port(connection)
        channel = connection.channel()
        reply_queue = channel.queue_declare("", exclusive=True).method.queue
        pending: dict[str, Any] = {}

        def on_reply(_ch: Any, _method: Any, properties: Any, _body: bytes) -> None:
            if properties.correlation_id in pending:
                pending[properties.correlation_id]["reply_received_us"] = _now_us()

        channel.basic_consume(reply_queue, on_reply, auto_ack=True)
        started = time.monotonic()
        while len(records) < calls and time.monotonic() - started < seconds:
            correlation_id = str(uuid.uuid4())
            record: dict[str, Any] = {"correlation_id": correlation_id, "request_sent_us": _now_us()}
            pending[correlation_id] = record
            properties = pika.BasicProperties(reply_to=reply_queue, correlation_id=correlation_id)
            channel.basic_publish("", queue, message_body("0-9-1", len(records), 64), properties=properties)
            deadline = time.monotonic() + SCENARIO_TIMEOUT
            while "reply_received_us" not in record:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: no reply to call {len(records)}")
                connection.process_data_events(time_limit=0.01)
            records.append(pending.pop(correlation_id))
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    for record in records:
        record.update(stamps.get(record["correlation_id"], {}))
    totals = [r["reply_received_us"] - r["request_sent_us"] for r in records]
    works = [r["reply_sent_us"] - r["request_received_us"] for r in records if "reply_sent_us" in r]
    return _role(
        "publisher",
        client_port,
        name,
        queue=queue,
        rpc="caller",
        reply_queue_exclusive=True,
        calls=len(records),
        median_call_us=int(statistics.median(totals)),
        median_responder_us=int(statistics.median(works)),
        call_timings=records,
    )


# -- AMQP 1.0: a sender writing a burst -------------------------------------------------------


class _Burst(_Handler):
    """Sends ``messages`` transfers (unsettled) whenever it has credit and room in proton's buffer,
    noting when each was handed to proton and when the broker's disposition settled it."""

    QUEUED_MAX = 256
    PUMP_EVERY = 0.002

    def __init__(self, host: str, port: int, address: str, messages: int, body_size: int, name: str) -> None:
        super().__init__(host, port, name)
        self.address, self.messages, self.body_size = address, messages, body_size
        self.sent_us: dict[int, int] = {}
        self.settle_delays_us: list[int] = []
        self.sender: Any = None
        self.first_sent_us = self.last_sent_us = self.last_settled_us = 0

    def on_start(self, event: Any) -> None:
        connection = self.connect(event)
        self.sender = event.container.create_sender(connection, self.address)
        self.schedule(event.container, self.PUMP_EVERY, lambda: self.tick(event.container))

    def tick(self, container: Any) -> None:
        self.pump()
        if len(self.sent_us) < self.messages:
            self.schedule(container, self.PUMP_EVERY, lambda: self.tick(container))

    def pump(self) -> None:
        while len(self.sent_us) < self.messages and self.sender.credit > 0 and self.sender.queued < self.QUEUED_MAX:
            index = len(self.sent_us) + 1
            delivery = self.sender.send(Message(id=index, body=message_body("1.0", index, self.body_size)))
            delivery.amqpscope_index = index
            self.sent_us[index] = self.last_sent_us = _now_us()
            self.first_sent_us = self.first_sent_us or self.last_sent_us

    def on_sendable(self, event: Any) -> None:
        self.pump()

    def on_settled(self, event: Any) -> None:
        self.last_settled_us = _now_us()
        index = getattr(event.delivery, "amqpscope_index", None)
        if index is not None:
            self.settle_delays_us.append(self.last_settled_us - self.sent_us[index])
        if len(self.settle_delays_us) >= self.messages:
            self.finish()


def amqp10_burst_sender(host: str, port: int, queue: str, messages: int, body_size: int, name: str) -> dict[str, Any]:
    handler = _Burst(host, port, f"/amq/queue/{queue}", messages, body_size, name)
    _run(handler)
    delays = sorted(handler.settle_delays_us)
    return {
        "role": "publisher",
        "client_port": handler.client_port,
        "connection_name": name,
        "protocol": AMQP10,
        "client_library": "python-qpid-proton",
        "address": handler.address,
        "queue": queue,
        "messages": len(handler.sent_us),
        "settled_by_broker": len(delays),
        "body_size": body_size,
        "first_sent_us": handler.first_sent_us,
        "last_sent_us": handler.last_sent_us,
        "last_settled_us": handler.last_settled_us,
        "median_settle_delay_us": delays[len(delays) // 2] if delays else None,
        "p90_settle_delay_us": delays[int(len(delays) * 0.9)] if delays else None,
        "max_settle_delay_us": delays[-1] if delays else None,
    }


class _Receiver(_Handler):
    """Receives from one link for ``seconds``, keeping CREDIT granted (topped up when half is used)."""

    CREDIT = 100

    def __init__(self, host: str, port: int, address: str, seconds: float, name: str) -> None:
        super().__init__(host, port, name)
        self.address, self.seconds, self.received = address, seconds, 0

    def on_start(self, event: Any) -> None:
        connection = self.connect(event)
        receiver = event.container.create_receiver(connection, self.address)
        receiver.flow(self.CREDIT)
        self.schedule(event.container, self.seconds, self.finish)

    def on_message(self, event: Any) -> None:
        self.received += 1
        if event.receiver.credit < self.CREDIT // 2:
            event.receiver.flow(self.CREDIT - event.receiver.credit)  # credit is set, not added


def amqp10_receiver(host: str, port: int, queue: str, seconds: float, name: str) -> dict[str, Any]:
    handler = _Receiver(host, port, f"/amq/queue/{queue}", seconds, name)
    _run(handler)
    return {
        "role": "consumer",
        "client_port": handler.client_port,
        "connection_name": name,
        "protocol": AMQP10,
        "client_library": "python-qpid-proton",
        "address": handler.address,
        "queue": queue,
        "credit_window": _Receiver.CREDIT,
        "received": handler.received,
    }
