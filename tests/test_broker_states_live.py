"""Live: the broker-state sampler against a private RabbitMQ during a memory alarm.

A pika publisher keeps publishing while the alarm is raised; RabbitMQ must list the alarm and
the publisher's connection as ``blocked`` in samples stamped inside the window the test raised
and cleared the alarm in (both clocks are this machine's wall clock).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pika
import pytest

from testbed.broker import NORMAL_WATERMARK, RABBITMQ_BIN, PrivateBroker
from testbed.broker_states import BrokerStateSampler
from testbed.flow_scenarios import ALARM_WATERMARK
from testbed.scenarios import GUEST

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not (RABBITMQ_BIN / "rabbitmq-server").exists(), reason="rabbitmq-server not installed"),
    pytest.mark.skipif(shutil.which("epmd") is None, reason="epmd not installed"),
]


def samples_files_open(broker: PrivateBroker) -> list[str]:
    """Sample files the node's processes hold open (the loop inside the node writes one)."""
    found = []
    for ref in broker.started_processes:
        fd_dir = Path(f"/proc/{ref.pid}/fd")
        try:
            found += [target for fd in fd_dir.iterdir() if "broker-states-" in (target := os.readlink(fd))]
        except OSError:
            continue
    return found


def test_sampler_sees_the_memory_alarm_and_the_blocked_publisher() -> None:
    with PrivateBroker() as broker:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters(
                host=broker.host,
                port=broker.port,
                credentials=pika.PlainCredentials(*GUEST),
                client_properties={"connection_name": "sampler test publisher"},
            )
        )
        client_port = connection._impl._transport._sock.getsockname()[1]
        channel = connection.channel()
        channel.queue_declare("amqpscope.sampler-test")
        stop = threading.Event()

        def publish() -> None:
            # Publishes during the alarm are not read by the broker: the connection goes blocked.
            while not stop.is_set():
                channel.basic_publish("", "amqpscope.sampler-test", b"x" * 64)
                connection.process_data_events(time_limit=0.05)

        with BrokerStateSampler(broker) as sampler:
            publisher = threading.Thread(target=publish)
            publisher.start()
            time.sleep(1.0)
            before_raise_us = time.time_ns() // 1000
            broker.set_vm_memory_high_watermark(ALARM_WATERMARK)
            raised_us = time.time_ns() // 1000
            time.sleep(2.0)
            cleared_from_us = time.time_ns() // 1000
            broker.set_vm_memory_high_watermark(NORMAL_WATERMARK)
            after_clear_us = time.time_ns() // 1000
            time.sleep(1.5)
            stop.set()
            publisher.join(30)
        connection.close()
        sampler_processes = sampler.started_processes
        time.sleep(1.5)  # a turn of the loop inside the node: it sees the CLI gone and ends
        loop_files = samples_files_open(broker)

    assert sampler.errors == []
    assert sampler_processes and not any(ref.is_running() for ref in sampler_processes)
    assert loop_files == [], "the sampling loop still runs inside the node"
    stamps = [s.ts_us for s in sampler.samples]
    assert stamps == sorted(stamps)
    # 0.25 s apart, give or take a loaded machine: never more than a second between two samples.
    assert max(b - a for a, b in zip(stamps, stamps[1:])) < 1_000_000

    in_alarm = [s for s in sampler.samples if "memory" in s.alarms]
    assert in_alarm, "no sample saw the memory alarm"
    assert all(before_raise_us <= s.ts_us <= after_clear_us for s in in_alarm)
    # Between the alarm call returning and the clearing call starting, every sample sees the alarm.
    assert all("memory" in s.alarms for s in sampler.samples if raised_us < s.ts_us < cleared_from_us)
    assert not any(s.alarms for s in sampler.samples if s.ts_us < before_raise_us or s.ts_us > after_clear_us)

    def publisher_state(sample):
        return next(c.state for c in sample.connections if c.peer_port == client_port)

    blocked = [
        s
        for s in sampler.samples
        if any(c.peer_port == client_port for c in s.connections) and publisher_state(s) == "blocked"
    ]
    assert blocked, "the publishing connection was never seen blocked"
    assert all(before_raise_us <= s.ts_us <= after_clear_us for s in blocked)
    names = {c.connection_name for s in sampler.samples for c in s.connections}
    assert "sampler test publisher" in names
