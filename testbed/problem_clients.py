"""Clients of the problem scenarios, each an unmodified library from PyPI used as its docs show.

- Celery (with kombu and py-amqp): a worker process and a producer (``celery_worker``, ``celery_producer``).
- aio-pika: a publisher, a consumer with or without acks, a publisher with confirms.
- kombu: a publisher opening a connection per message, or one connection for all.

(pika and python-qpid-proton clients are in ``testbed.problem_pika``.)

Each returns the facts of what it did and saw (role, client port, counts, timings), which
``testbed.problem_scenarios`` writes into the truth files: never what a decoder saw.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
import kombu

from testbed import bottleneck_clients
from testbed.processes import ProcessRef, child_environment, descendants, kill_all, wait_gone
from testbed.scenarios import GUEST, SCENARIO_TIMEOUT, message_body

PROTOCOL = "amqp-0-9-1"


def now_us() -> int:
    return time.time_ns() // 1000


def url(host: str, port: int) -> str:
    return f"amqp://{GUEST[0]}:{GUEST[1]}@{host}:{port}/"


def role_facts(role: str, client_port: int, name: str, library: str, **facts: Any) -> dict[str, Any]:
    return {
        "role": role,
        "client_port": client_port,
        "connection_name": name,
        "protocol": PROTOCOL,
        "client_library": library,
        **facts,
    }


def tcp_ports_to(pid: int, remote_port: int) -> set[int]:
    """Local ports of the TCP connections process ``pid`` has open to ``remote_port`` (from /proc:
    the worker process of a library that does not tell its socket's address)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == remote_port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


# -- Celery: a worker process (solo pool) and a producer ---------------------------------------------


class CeleryWorker:
    """``celery worker`` in a process of its own (solo pool, one task at a time), stopped by PID.

    Celery asks for ``basic.qos(prefetch_count = worker_prefetch_multiplier x concurrency)``; on
    RabbitMQ it sets ``global=true`` (py-amqp says RabbitMQ's qos semantics differ from the spec's,
    and Celery then applies the limit channel-wide, as RabbitMQ documents for ``global``)."""

    def __init__(self, host: str, port: int, queue: str, work_seconds: float, prefetch_multiplier: int) -> None:
        self.host, self.port, self.queue = host, port, queue
        self.work_seconds, self.prefetch_multiplier = work_seconds, prefetch_multiplier
        self.done_file = Path(tempfile.mkstemp(prefix="amqpscope-celery-", suffix=".done")[1])
        self.process: subprocess.Popen[bytes] | None = None
        self.refs: set[ProcessRef] = set()
        self.client_ports: set[int] = set()

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "testbed.problem_celery",
            "worker",
            "--pool=solo",
            "--concurrency=1",
            f"--prefetch-multiplier={self.prefetch_multiplier}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            f"--queues={self.queue}",
            "--loglevel=WARNING",
        ]

    def start(self) -> None:
        env = {
            **child_environment(),  # the worker imports testbed.problem_celery
            "AMQPSCOPE_CELERY_BROKER": url(self.host, self.port),
            "AMQPSCOPE_CELERY_WORK_SECONDS": str(self.work_seconds),
            "AMQPSCOPE_CELERY_DONE_FILE": str(self.done_file),
        }
        self.process = subprocess.Popen(
            self.command(), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
        )
        self._track()

    def done(self) -> list[tuple[int, int]]:
        rows = [line.split() for line in self.done_file.read_text().splitlines()]
        return [(int(index), int(ts)) for index, ts in rows if ts.isdigit()]

    def wait_done(self, count: int, timeout: float = SCENARIO_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while len(self.done()) < count:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"celery worker exited with {self.process.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"celery worker did {len(self.done())} of {count} tasks")
            self._track()
            time.sleep(0.05)

    def _track(self) -> None:
        if self.process is None:
            return
        ref = ProcessRef.of(self.process.pid)
        if ref is not None:
            self.refs.add(ref)
        self.refs |= descendants(self.process.pid)
        try:
            self.client_ports |= tcp_ports_to(self.process.pid, self.port)
        except OSError:
            pass

    def stop(self) -> None:
        """SIGTERM (Celery's warm shutdown: the task at hand ends, the rest go back to the queue)."""
        if self.process is None:
            return
        self._track()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5.0)
        leftovers = kill_all(wait_gone(self.refs, 10.0))
        self.process = None
        if leftovers:
            raise RuntimeError(f"celery worker processes survived SIGKILL: {sorted(leftovers)}")

    def facts(self) -> dict[str, Any]:
        done = self.done()
        self.done_file.unlink(missing_ok=True)
        return role_facts(
            "consumer",
            min(self.client_ports, default=0),
            "celery worker",
            "celery",
            client_ports=sorted(self.client_ports),
            queue=self.queue,
            pool="solo",
            concurrency=1,
            worker_prefetch_multiplier=self.prefetch_multiplier,
            prefetch_count=self.prefetch_multiplier,
            prefetch_global=True,
            tasks_done=len(done),
            work_seconds_per_task=self.work_seconds,
        )


def celery_producer(
    host: str, port: int, queue: str, rate: float | None, messages: int, name: str = "celery producer"
) -> dict[str, Any]:
    """``send_task`` ``messages`` times to ``queue``, ``rate`` a second (None: as fast as it goes), on
    a connection of its own, closed at the end (Celery's pool would keep it open for the next send)."""
    from testbed.problem_celery import TASK, app

    app.conf.broker_url = url(host, port)
    started_us, started = now_us(), time.monotonic()
    with app.connection_for_write() as connection:
        producer = kombu.Producer(connection)
        for index in range(messages):
            if rate is not None:
                time.sleep(max(0.0, started + index / rate - time.monotonic()))
            app.send_task(TASK, args=(index,), queue=queue, producer=producer)
        client_port = connection.connection.sock.getsockname()[1]
    return role_facts(
        "publisher",
        int(client_port),
        name,
        "celery",
        queue=queue,
        messages=messages,
        rate_per_second=rate,
        started_us=started_us,
        finished_us=now_us(),
        persistent=True,
        publisher_confirms=False,
    )


# -- aio-pika -----------------------------------------------------------------------------------


def _aio_port(connection: aio_pika.abc.AbstractConnection) -> int:
    # aiormq hands its socket's StreamWriter to its writer task only; no public accessor.
    writer = connection.transport.connection._writer_task.get_coro().cr_frame.f_locals["writer"]
    return int(writer.get_extra_info("sockname")[1])


def aio_publisher(
    host: str, port: int, queue: str, messages: int, rate: float | None, body_size: int, name: str
) -> dict[str, Any]:
    """Publish ``messages`` to ``queue`` on a channel without confirms, ``rate`` a second or at once."""

    async def run() -> dict[str, Any]:
        connection = await aio_pika.connect(url(host, port), client_properties={"connection_name": name})
        client_port = _aio_port(connection)
        async with connection:
            channel = await connection.channel(publisher_confirms=False)
            started = time.monotonic()
            for index in range(messages):
                if rate is not None:
                    await asyncio.sleep(max(0.0, started + index / rate - time.monotonic()))
                await channel.default_exchange.publish(
                    aio_pika.Message(message_body("0-9-1", index, body_size)), routing_key=queue
                )
        return role_facts(
            "publisher",
            client_port,
            name,
            "aio-pika",
            queue=queue,
            messages=messages,
            rate_per_second=rate,
            body_size=body_size,
            persistent=False,
            publisher_confirms=False,
        )

    return asyncio.run(run())


def aio_consumer(
    host: str,
    port: int,
    queue: str,
    *,
    prefetch: int | None,
    work_seconds: float,
    ack: bool,
    seconds: float,
    name: str,
) -> dict[str, Any]:
    """Consume ``queue`` for ``seconds`` with manual acks: ``basic.qos(prefetch)`` (None: no qos at
    all), ``work_seconds`` per message, then ack it (or, ``ack`` False, never)."""

    async def run() -> dict[str, Any]:
        connection = await aio_pika.connect(url(host, port), client_properties={"connection_name": name})
        client_port = _aio_port(connection)
        received = acked = 0
        async with connection:
            channel = await connection.channel()
            if prefetch is not None:
                await channel.set_qos(prefetch_count=prefetch)
            target = await channel.get_queue(queue, ensure=False)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                nonlocal received, acked
                received += 1
                if work_seconds:
                    await asyncio.sleep(work_seconds)  # the slow part
                if ack:
                    await message.ack()
                    acked += 1

            await target.consume(on_message, no_ack=False)
            await asyncio.sleep(seconds)
        return role_facts(
            "consumer",
            client_port,
            name,
            "aio-pika",
            queue=queue,
            prefetch_count=prefetch or 0,
            prefetch_global=False,
            basic_qos_sent=prefetch is not None,
            manual_ack=True,
            received=received,
            acked=acked,
            work_seconds_per_message=work_seconds,
        )

    return asyncio.run(run())


def aio_confirmed_publisher(
    host: str, port: int, queue: str, messages: int, name: str, rate: float | None = None
) -> dict[str, Any]:
    """Publish ``messages`` with publisher confirms (aio-pika's default), 50 in flight at a time
    (``rate`` a second, or each 50 as soon as the last 50 are confirmed); count the broker's acks
    and nacks (a nack raises ``DeliveryError``)."""

    async def run() -> dict[str, Any]:
        connection = await aio_pika.connect(url(host, port), client_properties={"connection_name": name})
        client_port = _aio_port(connection)
        acks = nacks = 0
        async with connection:
            channel = await connection.channel(publisher_confirms=True)

            async def one(index: int) -> None:
                nonlocal acks, nacks
                try:
                    await channel.default_exchange.publish(
                        aio_pika.Message(message_body("0-9-1", index, 64)), routing_key=queue
                    )
                    acks += 1
                except aio_pika.exceptions.DeliveryError:
                    nacks += 1

            started = time.monotonic()
            for start in range(0, messages, 50):
                if rate is not None:
                    await asyncio.sleep(max(0.0, started + start / rate - time.monotonic()))
                await asyncio.gather(*(one(i) for i in range(start, min(messages, start + 50))))
        return role_facts(
            "publisher",
            client_port,
            name,
            "aio-pika",
            queue=queue,
            messages=messages,
            publisher_confirms=True,
            confirms_in_flight=50,
            rate_per_second=rate,
            acks_received=acks,
            nacks_received=nacks,
        )

    return asyncio.run(run())


# -- kombu: a connection per publish, or one for all ---------------------------------------------


def kombu_publisher(
    host: str, port: int, queue: str, rate: float, seconds: float, *, per_message: bool, name: str
) -> dict[str, Any]:
    """Publish ``rate`` a second for ``seconds`` with kombu's Producer: opening, using and closing a
    new connection for every message (``per_message``), or on one connection."""
    ports: list[int] = []
    published = 0
    started = time.monotonic()
    messages = int(rate * seconds)

    def connection() -> kombu.Connection:
        conn = kombu.Connection(url(host, port), transport_options={"client_properties": {"connection_name": name}})
        conn.connect()
        ports.append(int(conn.connection.sock.getsockname()[1]))
        return conn

    shared = None if per_message else connection()
    try:
        for index in range(messages):
            time.sleep(max(0.0, started + index / rate - time.monotonic()))
            conn = shared if shared is not None else connection()
            try:
                conn.Producer().publish(message_body("0-9-1", index, 64), routing_key=queue, declare=None)
                published += 1
            finally:
                if shared is None:
                    conn.release()
    finally:
        if shared is not None:
            shared.release()
    elapsed = time.monotonic() - started
    return role_facts(
        "publisher",
        ports[0],
        name,
        "kombu",
        client_ports=ports,
        queue=queue,
        messages=published,
        connections_opened=len(ports),
        publishes_per_connection=published / len(ports),
        rate_per_second=rate,
        achieved_per_second=round(published / elapsed, 1),
    )


def in_threads(*calls: Callable[[], Any]) -> list[Any]:
    return bottleneck_clients.in_threads(*calls)
