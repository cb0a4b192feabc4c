"""Flow-control scenarios: a slow consumer held at its prefetch, a publisher blocked by a memory alarm.

They register with ``testbed.scenarios`` (``CLIENT_SCENARIOS`` / ``SCENARIOS``) only while
``registered()`` is active, so ``testbed.capture.capture_scenario`` can capture them and tests that
iterate SCENARIOS do not see them. The memory alarm needs the broker, which scenarios do not get:
``alarm_switch(broker)`` lends it to ``amqp091_memory_alarm`` by port.

    python -m testbed.flow_scenarios --out samples/flow    # as root: tcpdump on lo
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pika

from testbed import tls
from testbed.broker import PrivateBroker, memory_alarm_switch
from testbed.broker import alarm_switch as lend_alarm_switch
from testbed.capture import capture_scenario, default_capture_port, truth_path
from testbed.scenarios import CLIENT_SCENARIOS, GUEST, SCENARIO_TIMEOUT, SCENARIOS, Truth, message_body

ALARM_WATERMARK = 0.0001  # a fraction of RAM any running node exceeds: raises the memory alarm


def alarm_switch(broker: PrivateBroker) -> contextlib.AbstractContextManager[None]:
    """Let ``amqp091_memory_alarm`` raise and clear ``broker``'s memory alarm while it runs."""
    return lend_alarm_switch(broker, ALARM_WATERMARK)


def _connect(host: str, port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            host=host, port=port, credentials=pika.PlainCredentials(*GUEST), ssl_options=tls.pika_ssl_options(port)
        )
    )


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# -- a slow consumer: unacked sits at the prefetch count -----------------------------------------


def amqp091_slow_consumer(
    host: str,
    port: int,
    *,
    messages: int = 100,
    prefetch_count: int = 10,
    work_seconds: float = 0.02,
    body_size: int = 64,
    queue: str = "amqpscope.flow.slow-consumer",
) -> Truth:
    """Fill a queue, then consume it with ``basic.qos(prefetch_count)``, acking each message singly
    ``work_seconds`` after it arrives: the broker keeps the consumer's prefetch window full."""
    connection = _connect(host, port)
    try:
        channel = connection.channel()
        channel.queue_declare(queue=queue, durable=False, auto_delete=False)
        for index in range(1, messages + 1):
            channel.basic_publish("", queue, message_body("0-9-1", index, body_size))
        channel.basic_qos(prefetch_count=prefetch_count, global_qos=False)
        received: list[int] = []

        def on_message(ch: Any, method: Any, _properties: Any, _body: bytes) -> None:
            time.sleep(work_seconds)  # the slow part
            ch.basic_ack(delivery_tag=method.delivery_tag)
            received.append(method.delivery_tag)

        consumer_tag = channel.basic_consume(queue, on_message, auto_ack=False)
        started = time.monotonic()
        deadline = started + SCENARIO_TIMEOUT
        while len(received) < messages:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {len(received)} of {messages} messages")
            connection.process_data_events(time_limit=0.5)
        consumed_seconds = time.monotonic() - started
        channel.basic_cancel(consumer_tag)
        channel.queue_delete(queue)
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return {
        "protocol": "amqp-0-9-1",
        "client_library": "pika",
        "client_version": pika.__version__,
        "queue": queue,
        "messages_published": messages,
        "message_body_size": body_size,
        "prefetch_count": prefetch_count,
        "prefetch_global": False,
        "deliveries_received": len(received),
        "acks_sent": len(received),
        "acks_multiple": 0,
        "work_seconds_per_message": work_seconds,
        "consume_seconds": round(consumed_seconds, 3),
    }


# -- a memory alarm: connection.blocked / connection.unblocked -----------------------------------


def amqp091_memory_alarm(
    host: str,
    port: int,
    *,
    before: int = 5,
    during: int = 3,
    after: int = 5,
    blocked_seconds: float = 1.0,
    body_size: int = 64,
    queue: str = "amqpscope.flow.memory-alarm",
) -> Truth:
    """Publish with confirms, raise the memory alarm and keep publishing: the broker blocks the
    connection at the next publish and stops reading it, so that publish waits for its confirm
    until the alarm is cleared ``blocked_seconds`` later; then publish the rest."""
    switch = memory_alarm_switch(port)
    if switch is None:
        raise RuntimeError("amqp091_memory_alarm needs testbed.flow_scenarios.alarm_switch(broker)")
    connection = _connect(host, port)
    notices: list[dict[str, Any]] = []
    alarm: dict[str, str] = {}

    def clear_alarm() -> None:
        switch(False)
        alarm["cleared_utc"] = _utc_now()

    # pika hands these over from process_data_events, not while basic_publish waits for a confirm.
    connection.add_on_connection_blocked_callback(
        lambda _c, frame: notices.append({"notice": "connection.blocked", "reason": frame.method.reason})
    )
    connection.add_on_connection_unblocked_callback(lambda _c, _f: notices.append({"notice": "connection.unblocked"}))
    clearing = threading.Timer(blocked_seconds, clear_alarm)
    try:
        channel = connection.channel()
        channel.queue_declare(queue=queue, durable=False, auto_delete=False)
        channel.confirm_delivery()
        index = 0
        for _ in range(before):
            index += 1
            channel.basic_publish("", queue, message_body("0-9-1", index, body_size))
        switch(True)
        alarm["raised_utc"] = _utc_now()
        time.sleep(0.5)
        clearing.start()
        # Each publish waits for its confirm: the first one now blocks the connection and waits.
        for _ in range(during):
            index += 1
            channel.basic_publish("", queue, message_body("0-9-1", index, body_size))
        deadline = time.monotonic() + SCENARIO_TIMEOUT
        while not any(n["notice"] == "connection.unblocked" for n in notices):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no connection.unblocked: {notices}")
            connection.process_data_events(time_limit=0.2)
        for _ in range(after):
            index += 1
            channel.basic_publish("", queue, message_body("0-9-1", index, body_size))
        channel.queue_delete(queue)
        channel.close()
    finally:
        if clearing.is_alive():
            clearing.join()
        elif "cleared_utc" not in alarm:
            switch(False)
        if connection.is_open:
            connection.close()
    blocked = [n for n in notices if n["notice"] == "connection.blocked"]
    return {
        "protocol": "amqp-0-9-1",
        "client_library": "pika",
        "client_version": pika.__version__,
        "queue": queue,
        "messages_published": index,
        "publisher_confirms": True,
        "confirms_acked": index,
        "alarm": "memory",
        "alarm_watermark": ALARM_WATERMARK,
        "alarm_raised_utc": alarm["raised_utc"],
        "alarm_cleared_utc": alarm["cleared_utc"],
        "alarm_cleared_after_seconds": 0.5 + blocked_seconds,
        "blocked_notifications": len(blocked),
        "unblocked_notifications": sum(1 for n in notices if n["notice"] == "connection.unblocked"),
        "blocked_reason": blocked[0]["reason"] if blocked else None,
    }


# -- registration ---------------------------------------------------------------------------

FLOW_CLIENT_SCENARIOS: Mapping[str, Callable[[str, int], Truth]] = {
    "amqp091_slow_consumer": amqp091_slow_consumer,
    "amqp091_memory_alarm": amqp091_memory_alarm,
}


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """The flow scenarios registered (each its own capture scenario) for a while."""
    added = [name for name in FLOW_CLIENT_SCENARIOS if name not in SCENARIOS]
    for name, scenario in FLOW_CLIENT_SCENARIOS.items():
        CLIENT_SCENARIOS[name] = scenario  # type: ignore[index]
        SCENARIOS[name] = (name,)  # type: ignore[index]
    try:
        yield
    finally:
        for name in added:
            SCENARIOS.pop(name, None)  # type: ignore[attr-defined]
            CLIENT_SCENARIOS.pop(name, None)  # type: ignore[attr-defined]


def capture_flow_scenarios(out_dir: Path, names: tuple[str, ...] = tuple(FLOW_CLIENT_SCENARIOS)) -> list[Path]:
    """Capture each flow scenario with one private broker (5672 when free); return the captures."""
    with PrivateBroker(port=default_capture_port()) as broker, registered(), alarm_switch(broker):
        return [capture_scenario(name, out_dir, broker=broker) for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.flow_scenarios", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("samples/flow"), help="output directory (default: samples/flow)"
    )
    parser.add_argument(
        "--scenario", action="append", choices=sorted(FLOW_CLIENT_SCENARIOS), help="repeatable (default: all)"
    )
    args = parser.parse_args(argv)
    for path in capture_flow_scenarios(args.out, tuple(args.scenario or FLOW_CLIENT_SCENARIOS)):
        print(f"{path} ({path.stat().st_size} bytes) + {truth_path(path).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
