"""A capture of one long AMQP 1.0 link, the case a window over a whole link's rows meets at its largest.

One command (root: tcpdump on loopback):

    .venv/bin/python benchmarks/long_link.py [--messages 60000] [--window 200] [--body 100] [--out out/bench-long-link]

The testbed's private RabbitMQ (``testbed.broker.PrivateBroker``) is started on loopback; pika
publishes ``--messages`` transient messages into a queue (before the capture starts); then, captured
by the testbed's tcpdump, one python-qpid-proton receiver takes them all over ONE link from
``/amq/queue/amqpscope.long-link``, with ``--window`` credit topped up when half is used, accepting
each. Every process started is stopped by PID (the testbed's context managers). Writes
``OUT/long-link.pcap`` and ``OUT/long-link.truth.json`` (what the clients did). Time analyze on it
with ``benchmarks/paired.py REF --capture OUT/long-link.pcap --ports 5672`` (docs/BENCHMARKS.md, "No
window frame to the end of a partition").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import pika

sys.path.append(str(Path(__file__).resolve().parent.parent))  # the repository's root: testbed (not installed)
from testbed.amqp10_clients import _Handler, _run
from testbed.broker import PrivateBroker
from testbed.capture import DRAIN_SECONDS, Tcpdump, default_capture_port, truth_path
from testbed.scenarios import GUEST, ClosedInTurn, message_body

QUEUE = "amqpscope.long-link"


def publish(host: str, port: int, messages: int, body_size: int) -> float:
    """Declare QUEUE and publish ``messages`` transient messages into it with pika; seconds taken."""
    started = time.monotonic()
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(host=host, port=port, credentials=pika.PlainCredentials(*GUEST))
    )
    try:
        channel = connection.channel()
        channel.queue_declare(queue=QUEUE, durable=False, auto_delete=False)
        properties = pika.BasicProperties(delivery_mode=1)
        for index in range(1, messages + 1):
            channel.basic_publish("", QUEUE, message_body("0-9-1", index, body_size), properties)
            if index % 5000 == 0:
                connection.process_data_events(0)
        # No confirms (60k round trips): wait until the queue holds every message instead.
        deadline = time.monotonic() + 120
        while True:
            depth = channel.queue_declare(queue=QUEUE, passive=True).method.message_count
            if depth == messages:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"queue holds {depth} of {messages} messages")
            time.sleep(0.2)
        channel.close()
    finally:
        if connection.is_open:
            connection.close()
    return time.monotonic() - started


class _LongReceiver(ClosedInTurn, _Handler):  # type: ignore[misc]
    """One receiving link on /amq/queue/QUEUE; credit window ``window`` topped up when half used;
    every message accepted (auto_accept); link, session, connection closed one after the other."""

    def __init__(self, host: str, port: int, messages: int, window: int) -> None:
        super().__init__(host, port, "amqpscope long link")
        self.messages, self.window = messages, window
        self.address = f"/amq/queue/{QUEUE}"
        self.received = 0
        self.grants = 0
        self.credit_granted = 0

    def on_start(self, event: Any) -> None:
        connection = self.connect(event)
        self.grant(event.container.create_receiver(connection, self.address, name="long-link"), self.window)

    def grant(self, receiver: Any, amount: int) -> None:
        receiver.flow(amount)
        self.grants += 1
        self.credit_granted += amount

    def on_message(self, event: Any) -> None:  # auto_accept=True accepts after this returns
        self.received += 1
        receiver = event.receiver
        if self.received == self.messages:
            self.stop_timers()
            receiver.close()  # then the session and the connection, in turn (ClosedInTurn)
        elif receiver.credit < self.window // 2:
            self.grant(receiver, self.window - receiver.credit)  # 2.6.7: credit is set; proton adds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=60_000, help="messages taken over the one link")
    parser.add_argument("--window", type=int, default=200, help="the receiver's link credit")
    parser.add_argument("--body", type=int, default=100, help="bytes a message body")
    parser.add_argument("--out", type=Path, default=Path("out/bench-long-link"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    capture = args.out / "long-link.pcap"

    t0 = time.monotonic()
    with PrivateBroker(port=default_capture_port()) as broker:
        t_broker = time.monotonic() - t0
        print(f"RabbitMQ {broker.version()} on {broker.host}:{broker.port} ({t_broker:.1f} s)", file=sys.stderr)
        t_publish = publish(broker.host, broker.port, args.messages, args.body)
        print(f"published {args.messages} in {t_publish:.1f} s", file=sys.stderr)
        handler = _LongReceiver(broker.host, broker.port, args.messages, args.window)
        t1 = time.monotonic()
        with Tcpdump(capture, broker.port) as tcpdump:
            _run(handler)
            t_consume = time.monotonic() - t1
            time.sleep(DRAIN_SECONDS)
        t_capture = time.monotonic() - t1
        print(f"consumed {handler.received} in {t_consume:.1f} s; tcpdump: {tcpdump.stats.lines[-3:]}", file=sys.stderr)
        port = broker.port
        version = broker.version()
    total = time.monotonic() - t0
    dropped = tcpdump.stats.counter("packets dropped by kernel")
    record = {
        "scenario": "long_link",
        "broker": {"product": "RabbitMQ", "version": version, "host": "127.0.0.1", "port": port},
        "ground_truth": {
            "protocol": "amqp-1.0",
            "client_port": handler.client_port,
            "container_id": handler.container_id,
            "address": handler.address,
            "queue": QUEUE,
            "link_name": "long-link",
            "links_attached": 1,
            "messages_published_091_before_capture": args.messages,
            "body_size": args.body,
            "messages_received": handler.received,
            "messages_accepted": handler.received,
            "credit_window": args.window,
            "credit_grants": handler.grants,
            "credit_granted_total": handler.credit_granted,
        },
        "capture": {
            "file": capture.name,
            "filter": tcpdump.filter,
            "packets_captured": tcpdump.stats.counter("packets captured"),
            "packets_dropped_by_kernel": dropped,
        },
        "seconds": {
            "broker_start": round(t_broker, 2),
            "publish_091": round(t_publish, 2),
            "consume_10": round(t_consume, 2),
            "capture_window": round(t_capture, 2),
            "total_including_broker_stop": round(total, 2),
        },
    }
    truth_path(capture).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record["seconds"]), file=sys.stderr)
    if dropped:
        print(f"WARNING: {dropped} packets dropped by kernel", file=sys.stderr)
        return 1
    return 0 if handler.received == args.messages else 1


if __name__ == "__main__":
    raise SystemExit(main())
