"""The clients of the bottleneck scenarios: pika publishers and consumers, raw 0-9-1 publishers.

Each returns the facts of what it did (role, client port, connection name, queue, message size,
persistence, prefetch), which ``testbed.bottleneck_scenarios`` writes into the truth files.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pika

from testbed import raw091, tls
from testbed.scenarios import GUEST, SCENARIO_TIMEOUT, message_body

PUBLISHER_SNDBUF = 64 << 10  # raw publishers' SO_SNDBUF: what is left unread when they stop stays small


def connect(host: str, port: int, name: str) -> pika.BlockingConnection:
    parameters = pika.ConnectionParameters(
        host=host,
        port=port,
        credentials=pika.PlainCredentials(*GUEST),
        client_properties={"connection_name": name},
        ssl_options=tls.pika_ssl_options(port),
    )
    return pika.BlockingConnection(parameters)


def local_port(connection: pika.BlockingConnection) -> int:
    # pika has no public accessor for the local address of its socket.
    return int(connection._impl._transport._sock.getsockname()[1])


def declare(
    host: str, port: int, queues: tuple[str, ...], fanout: str | None = None, arguments: dict[str, Any] | None = None
) -> None:
    """Declare (purged) queues, bound to a fanout exchange if one is named: transient classic
    queues, or durable ones of the type ``arguments`` name (``{"x-queue-type": "quorum"}``: a
    quorum queue must be durable)."""
    connection = connect(host, port, "amqpscope setup")
    try:
        channel = connection.channel()
        if fanout is not None:
            channel.exchange_declare(fanout, exchange_type="fanout", durable=False)
        for queue in queues:
            channel.queue_declare(queue, durable=bool(arguments), arguments=arguments)
            channel.queue_purge(queue)
            if fanout is not None:
                channel.queue_bind(queue, fanout)
    finally:
        connection.close()


def delete(host: str, port: int, queues: tuple[str, ...], fanout: str | None = None) -> None:
    connection = connect(host, port, "amqpscope teardown")
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue)
        if fanout is not None:
            channel.exchange_delete(fanout)
    finally:
        connection.close()


def fill(host: str, port: int, queue: str, messages: int, body_size: int, name: str) -> dict[str, Any]:
    """Publish ``messages`` transient messages to ``queue`` with pika; the publisher's facts."""
    connection = connect(host, port, name)
    try:
        client_port = local_port(connection)
        channel = connection.channel()
        channel.confirm_delivery()  # the fill is complete when the broker has them all
        for index in range(1, messages + 1):
            channel.basic_publish("", queue, message_body("0-9-1", index, body_size))
        channel.close()
    finally:
        connection.close()
    return {
        "role": "publisher",
        "client_port": client_port,
        "connection_name": name,
        "protocol": "amqp-0-9-1",
        "channel": 1,
        "queue": queue,
        "messages": messages,
        "body_size": body_size,
        "persistent": False,
    }


def paced_publisher(
    host: str,
    port: int,
    queue: str,
    rate: float,
    seconds: float,
    body_size: int,
    name: str,
    notices: list[dict[str, Any]] | None = None,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Publish ``int(seconds * rate)`` messages, ``rate`` a second, with pika (no confirms); fewer
    if ``stop`` is set first."""
    connection = connect(host, port, name)
    if notices is not None:
        connection.add_on_connection_blocked_callback(
            lambda _c, frame: notices.append(
                {"notice": "connection.blocked", "reason": frame.method.reason, "client_ts_us": time.time_ns() // 1000}
            )
        )
        connection.add_on_connection_unblocked_callback(
            lambda _c, _f: notices.append({"notice": "connection.unblocked", "client_ts_us": time.time_ns() // 1000})
        )
    sent = 0
    try:
        client_port = local_port(connection)
        channel = connection.channel()
        messages = int(seconds * rate)
        started = time.monotonic()
        while sent < messages and not (stop is not None and stop.is_set()):
            due = min(messages, int((time.monotonic() - started) * rate) + 1)
            while sent < due:
                sent += 1
                channel.basic_publish("", queue, message_body("0-9-1", sent, body_size))
            connection.process_data_events(time_limit=max(0.0, started + sent / rate - time.monotonic()))
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return {
        "role": "publisher",
        "client_port": client_port,
        "connection_name": name,
        "protocol": "amqp-0-9-1",
        "channel": 1,
        "queue": queue,
        "messages": sent,
        "rate_per_second": rate,
        "body_size": body_size,
        "persistent": False,
        "publisher_confirms": False,
    }


def consumer(
    host: str,
    port: int,
    queue: str,
    messages: int,
    prefetch_count: int,
    name: str,
    *,
    work_seconds: float = 0.0,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Consume ``messages`` (or until ``stop``) with ``basic.qos(prefetch_count)``, acking each singly
    ``work_seconds`` after it arrives."""
    connection = connect(host, port, name)
    received: list[int] = []
    try:
        client_port = local_port(connection)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=prefetch_count, global_qos=False)

        def on_message(ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
            if work_seconds:
                time.sleep(work_seconds)  # the slow part
            ch.basic_ack(delivery_tag=method.delivery_tag)
            received.append(method.delivery_tag)

        consumer_tag = channel.basic_consume(queue, on_message, auto_ack=False)
        deadline = time.monotonic() + SCENARIO_TIMEOUT
        while len(received) < messages and not (stop is not None and stop.is_set()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: consumed {len(received)} of {messages} messages")
            connection.process_data_events(time_limit=0.1)
        channel.basic_cancel(consumer_tag)
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return {
        "role": "consumer",
        "client_port": client_port,
        "connection_name": name,
        "protocol": "amqp-0-9-1",
        "channel": 1,
        "queue": queue,
        "consumer_tag": consumer_tag,
        "prefetch_count": prefetch_count,
        "prefetch_global": False,
        "acked": len(received),
        "work_seconds_per_message": work_seconds,
    }


def in_threads(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` at once; their results in order (the first failure is raised)."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            results[index] = calls[index]()
        except BaseException as error:  # re-raised below, in the calling thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def raw_publisher(
    host: str,
    port: int,
    exchange: str,
    routing_key: str,
    seconds: float,
    max_messages: int,
    body_size: int,
    name: str,
    persistent: bool = False,
) -> dict[str, Any]:
    connection = raw091.RawConnection(host, port, *GUEST, name, sndbuf=PUBLISHER_SNDBUF)
    try:
        sent = raw091.publish_for(
            connection,
            exchange,
            routing_key,
            b"x" * body_size,
            seconds,
            max_messages=max_messages,
            persistent=persistent,
        )
        client_port = connection.client_port
    finally:
        connection.close()
    return {
        "role": "publisher",
        "client_port": client_port,
        "connection_name": name,
        "protocol": "amqp-0-9-1",
        "client_library": "amqpscope raw091",
        "channel": 1,
        "exchange": exchange,
        "routing_key": routing_key,
        "messages": sent,
        "body_size": body_size,
        "persistent": persistent,
        "publisher_confirms": False,
    }


def confirmed_publisher(
    host: str, port: int, queue: str, seconds: float, body_size: int, name: str, rate: float | None = None
) -> dict[str, Any]:
    """Publish with publisher confirms through pika's BlockingChannel, which waits for each
    message's confirm before it returns (one publish in flight), for ``seconds``: as fast as that
    allows, or ``rate`` a second at most."""
    connection = connect(host, port, name)
    sent = 0
    try:
        client_port = local_port(connection)
        channel = connection.channel()
        channel.confirm_delivery()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            if rate is not None:
                due = started + sent / rate
                if due > time.monotonic():
                    time.sleep(due - time.monotonic())
            sent += 1
            channel.basic_publish("", queue, message_body("0-9-1", sent, body_size))  # returns once confirmed
        elapsed = time.monotonic() - started
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return {
        "role": "publisher",
        "client_port": client_port,
        "connection_name": name,
        "protocol": "amqp-0-9-1",
        "channel": 1,
        "queue": queue,
        "messages": sent,
        "body_size": body_size,
        "persistent": False,
        "publisher_confirms": True,
        "in_flight_max": 1,
        "rate_limit_per_second": rate,
        "rate_per_second": round(sent / elapsed, 1),
    }
