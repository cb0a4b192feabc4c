"""Bottleneck scenarios: real traffic that makes RabbitMQ slow in one known way, with the broker's truth.

Each scenario drives real clients (pika, python-qpid-proton, and ``testbed.raw091`` where pika is
too slow or reads too eagerly) so that the broker really does what the scenario is named after;
while it is captured, ``testbed.broker_states`` samples the broker's own view of every connection,
channel, queue and consumer and its alarms every 0.25 s. The truth file gets the samples
(``broker_states``) and a ``broker_summary``: per entity the share of samples in flow / blocked,
the alarms with their times, and the client-side facts (which connection is which role, queues,
message sizes, persistence, prefetch). ``testbed.truth.expected_bottleneck`` reads the verdict
from the broker's states; ``INTENDED`` says what each scenario is built to produce.

    python -m testbed.bottleneck_scenarios --out samples/bottlenecks   # root: tcpdump on lo
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from testbed import bottleneck_clients as clients
from testbed import client_scenarios, network_scenarios, raw091, throttling_scenarios
from testbed.amqp10_clients import LinkPlan, healthy_amqp10, two_receivers
from testbed.broker import NORMAL_WATERMARK, PrivateBroker
from testbed.broker_states import SAMPLE_INTERVAL_MS, BrokerStateSampler
from testbed.capture import capture_scenario, default_capture_port, truth_path
from testbed.flow_scenarios import ALARM_WATERMARK
from testbed.scenarios import CLIENT_SCENARIOS, GUEST, SCENARIO_TIMEOUT, SCENARIOS, Truth
from testbed.truth import broker_summary

PREFIX = "amqpscope.bn."
ALARM_AFTER_SECONDS = 1.5  # traffic after an alarm is cleared: the blocked publisher resumes
NORMAL_DISK_FREE_LIMIT = "50000000"  # RabbitMQ's default disk_free_limit.absolute (50 MB)

# The broker a scenario runs against, lent by port while the scenarios are registered: alarms
# are raised with rabbitmqctl, and scenarios only get (host, port).
_BROKERS: dict[int, PrivateBroker] = {}


def _broker(port: int) -> PrivateBroker:
    try:
        return _BROKERS[port]
    except KeyError:
        raise RuntimeError(f"no broker lent for port {port}: run inside registered(broker)") from None


def _facts(scenario: str, roles: list[dict[str, Any]], **more: Any) -> Truth:
    return {"scenario": scenario, "clients": roles, **more}


# -- healthy -----------------------------------------------------------------------------------


def healthy(host: str, port: int) -> Truth:
    """A 0-9-1 publisher at 100 msg/s with a fast consumer, and a 1.0 sender + receiver: nothing held back."""
    queue, address_queue = PREFIX + "healthy.091", PREFIX + "healthy.10"
    clients.declare(host, port, (queue,))
    seconds, rate = 4.0, 100.0
    expected = int(seconds * rate)
    publisher, consumer, amqp10 = clients.in_threads(
        lambda: clients.paced_publisher(host, port, queue, rate, seconds, 256, "healthy publisher"),
        lambda: clients.consumer(host, port, queue, expected, 50, "healthy consumer"),
        lambda: healthy_amqp10(host, port, address_queue, messages=200, rate=50.0, body_size=256),
    )
    clients.delete(host, port, (queue, address_queue))
    return _facts("healthy", [publisher, consumer, *amqp10])


def fast_consumer_at_prefetch(host: str, port: int) -> Truth:
    """The near miss of a slow consumer: a pika publisher at 150 msg/s and a consumer with prefetch 2
    that acks at once. Its unacked count touches the prefetch all the time, yet the queue stays
    empty: nothing waits for it."""
    queue = PREFIX + "fast-consumer"
    clients.declare(host, port, (queue,))
    seconds, rate = 4.0, 150.0
    publisher, consumer = clients.in_threads(
        lambda: clients.paced_publisher(host, port, queue, rate, seconds, 64, "fast consumer publisher"),
        lambda: clients.consumer(host, port, queue, int(seconds * rate), 2, "fast consumer at prefetch"),
    )
    clients.delete(host, port, (queue,))
    return _facts("fast_consumer_at_prefetch", [publisher, consumer])


# -- alarms ----------------------------------------------------------------------------------------


def _alarm_scenario(
    host: str, port: int, resource: str, raise_alarm: Callable[[], None], clear_alarm: Callable[[], None]
) -> Truth:
    """A publisher at 100 msg/s and a slow consumer of a filled queue; after 1 s the ``resource``
    alarm is raised, cleared 2 s after that took effect, and both go on for 1.5 s after the clearing
    took effect (rabbitmqctl takes 2-4 s a call here, so the alarm lasts ~4-8 s)."""
    published, consumed = PREFIX + f"{resource}-alarm.publish", PREFIX + f"{resource}-alarm.consume"
    clients.declare(host, port, (published, consumed))
    filler = clients.fill(host, port, consumed, 300, 64, f"{resource} alarm filler")
    notices: list[dict[str, Any]] = []
    alarm: dict[str, int] = {}
    stop = threading.Event()

    def alarm_window() -> None:
        time.sleep(1.0)
        alarm["raise_requested_us"] = time.time_ns() // 1000
        raise_alarm()
        alarm["raised_us"] = time.time_ns() // 1000
        time.sleep(2.0)
        alarm["clear_requested_us"] = time.time_ns() // 1000
        clear_alarm()
        alarm["cleared_us"] = time.time_ns() // 1000
        time.sleep(ALARM_AFTER_SECONDS)
        stop.set()

    publisher, consumer, _ = clients.in_threads(
        lambda: clients.paced_publisher(
            host, port, published, 100.0, SCENARIO_TIMEOUT, 64, f"{resource} alarm publisher", notices, stop
        ),
        lambda: clients.consumer(
            host, port, consumed, 300, 10, f"{resource} alarm consumer", work_seconds=0.02, stop=stop
        ),
        alarm_window,
    )
    clients.delete(host, port, (published, consumed))
    return _facts(
        f"{resource}_alarm",
        [filler, publisher, consumer],
        alarm={"resource": resource, **alarm},
        publisher_notices=notices,
    )


def memory_alarm(host: str, port: int) -> Truth:
    broker = _broker(port)
    return _alarm_scenario(
        host,
        port,
        "memory",
        lambda: broker.set_vm_memory_high_watermark(ALARM_WATERMARK),
        lambda: broker.set_vm_memory_high_watermark(NORMAL_WATERMARK),
    )


def disk_alarm(host: str, port: int) -> Truth:
    broker = _broker(port)
    assert broker.base_dir is not None
    # A limit 1 TB above the free space of the node's data directory raises the disk alarm.
    above_free = shutil.disk_usage(broker.base_dir).free + 10**12
    return _alarm_scenario(
        host,
        port,
        "disk",
        lambda: broker.ctl("set_disk_free_limit", str(above_free)),
        lambda: broker.ctl("set_disk_free_limit", NORMAL_DISK_FREE_LIMIT),
    )


# -- slow consumer ---------------------------------------------------------------------------------


def slow_consumer(host: str, port: int) -> Truth:
    """300 messages in a queue, a consumer with prefetch 10 acking each 20 ms after it came: ~6 s."""
    queue = PREFIX + "slow-consumer"
    clients.declare(host, port, (queue,))
    filler = clients.fill(host, port, queue, 300, 64, "slow consumer filler")
    consumer = clients.consumer(host, port, queue, 300, 10, "slow consumer", work_seconds=0.02)
    clients.delete(host, port, (queue,))
    return _facts("slow_consumer", [filler, consumer])


# -- credit flow: fast publishers of small messages fanned out to several queues -------------------


def credit_flow(host: str, port: int) -> Truth:
    """Four raw publishers of 16-byte transient messages (10 000 each, as fast as the broker reads
    them) to a fanout exchange bound to four queues."""
    fanout = PREFIX + "fanout"
    queues = tuple(PREFIX + f"fanout.{i}" for i in range(1, 5))
    clients.declare(host, port, queues, fanout=fanout)
    publishers = clients.in_threads(
        *(
            (lambda i=i: clients.raw_publisher(host, port, fanout, "", 5.0, 10_000, 16, f"credit flow publisher {i}"))
            for i in range(1, 5)
        )
    )
    clients.delete(host, port, queues, fanout=fanout)
    return _facts("credit_flow", publishers, exchange=fanout, exchange_type="fanout", queues=list(queues))


def channel_routing(host: str, port: int) -> Truth:
    """Two raw publishers of 16-byte messages (20 000 each, as fast as the broker reads them) to a
    topic exchange whose 200 bindings match none of them: routing is all the work, no queue gets any."""
    topic, sink = PREFIX + "topic", PREFIX + "topic.sink"
    connection = clients.connect(host, port, "amqpscope setup")
    try:
        channel = connection.channel()
        channel.exchange_declare(topic, exchange_type="topic", durable=False)
        channel.queue_declare(sink, durable=False)
        for index in range(200):
            channel.queue_bind(sink, topic, routing_key=f"bn.{index}.*.#")
    finally:
        connection.close()
    publishers = clients.in_threads(
        *(
            (
                lambda i=i: clients.raw_publisher(
                    host, port, topic, "nobody.listens.here", 5.0, 20_000, 16, f"channel routing publisher {i}"
                )
            )
            for i in range(1, 3)
        )
    )
    clients.delete(host, port, (sink,), fanout=topic)
    return _facts(
        "channel_routing",
        publishers,
        exchange=topic,
        exchange_type="topic",
        bindings=200,
        routing_key="nobody.listens.here",
        queues_routed_to=[],
    )


# -- head-of-line: one 0-9-1 connection publishing into an overloaded queue and consuming another --


HOL_ALONE_SECONDS = 1.0  # the shared connection's consumer runs alone before the flood
HOL_WORK_SECONDS = 0.002  # the consumer's work per message: ~500 acks a second when nothing holds it
HOL_RECOVERED_ACKS = 250  # acks after the flood that show the consumer back at its own pace


def _head_of_line_connection(
    host: str, port: int, busy: str, work: str, seconds: float, max_messages: int
) -> dict[str, Any]:
    """Channel 2 consumes ``work`` (prefetch 10) throughout; after HOL_ALONE_SECONDS channel 1 of the
    same connection publishes ``max_messages`` to ``busy`` as fast as the broker reads, then the
    consumer goes on until it has acked HOL_RECOVERED_ACKS more. One lock keeps frames from interleaving."""
    name = "head-of-line publisher+consumer"
    connection = raw091.RawConnection(host, port, *GUEST, name, sndbuf=clients.PUBLISHER_SNDBUF)
    connection.sock.sendall(raw091.method(2, raw091.CHANNEL, raw091.CHANNEL_OPEN, raw091.shortstr("")))
    connection.expect(raw091.CHANNEL, raw091.CHANNEL_OPEN_OK)
    consumer = raw091.start_consumer(connection, 2, work, 10, "amqpscope-head-of-line")
    lock = threading.Lock()
    stop = threading.Event()
    acks: list[int] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            for delivery_tag in raw091.deliveries(connection, stop):
                time.sleep(HOL_WORK_SECONDS)
                with lock:
                    connection.sock.sendall(raw091.ack(2, delivery_tag))
                acks.append(time.time_ns() // 1000)
        except BaseException as error:  # reported below
            errors.append(error)

    reader = threading.Thread(target=consume, name="head-of-line consumer")
    reader.start()
    one = raw091.publish_frames(1, "", busy, b"x" * 16, connection.frame_max)
    burst = one * 20
    published = 0
    try:
        time.sleep(HOL_ALONE_SECONDS)
        flood_started = time.time_ns() // 1000
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and published < max_messages:
            with lock:
                connection.sock.sendall(burst)  # blocks while the broker does not read this socket
            published += 20
        flood_ended = time.time_ns() // 1000
        # The broker reads the backlog of publishes before the acks written after it: wait until
        # the consumer is back at work (HOL_RECOVERED_ACKS acked after the last publish was written).
        recovered_by = time.monotonic() + SCENARIO_TIMEOUT
        while sum(1 for t in acks if t > flood_ended) < HOL_RECOVERED_ACKS and time.monotonic() < recovered_by:
            if errors:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join(SCENARIO_TIMEOUT)
        client_port = connection.client_port
        connection.close()
    if errors:
        raise errors[0]
    common = {
        "client_port": client_port,
        "connection_name": name,
        "protocol": "amqp-0-9-1",
        "client_library": "amqpscope raw091",
    }
    buckets: dict[int, int] = {}
    for t in acks:
        start_ms = (t - flood_started) // 250_000 * 250
        buckets[start_ms] = buckets.get(start_ms, 0) + 1
    phases = {
        "publishing_started_us": flood_started,
        "publishing_written_us": flood_ended,
        "acked_before_publishing": sum(1 for t in acks if t < flood_started),
        "acked_after_publishing_started": sum(1 for t in acks if t >= flood_started),
        # [start of a 250 ms interval relative to the first publish (ms), acks sent in it]
        "acks_per_250ms": [[start, buckets.get(start, 0)] for start in range(min(buckets), max(buckets) + 250, 250)],
    }
    return {
        "connection": common,
        "channels": [
            {
                "role": "publisher",
                "channel": 1,
                "queue": busy,
                "messages": published,
                "body_size": 16,
                "persistent": False,
                "publisher_confirms": False,
                **common,
            },
            {
                "role": "consumer",
                "channel": 2,
                "queue": work,
                "consumer_tag": consumer,
                "prefetch_count": 10,
                "prefetch_global": False,
                "acked": len(acks),
                "work_seconds_per_message": HOL_WORK_SECONDS,
                **phases,
                **common,
            },
        ],
    }


def _flooder(host: str, port: int, queue: str, seconds: float, messages: int, name: str) -> dict[str, Any]:
    time.sleep(HOL_ALONE_SECONDS)  # flood together with the shared connection's publisher
    return clients.raw_publisher(host, port, "", queue, seconds, messages, 16, name)


def head_of_line(host: str, port: int) -> Truth:
    """One connection: channel 1 publishes into a queue three raw publishers also flood, channel 2
    consumes a filled queue; the reader throttled by credit flow slows the consumer's acks too."""
    busy, work = PREFIX + "hol.busy", PREFIX + "hol.work"
    clients.declare(host, port, (busy, work))
    filler = clients.fill(host, port, work, 3000, 64, "head-of-line filler")
    seconds, messages = 5.0, 9_000
    shared, *flooders = clients.in_threads(
        lambda: _head_of_line_connection(host, port, busy, work, seconds, messages),
        *(
            (lambda i=i: _flooder(host, port, busy, seconds, messages, f"head-of-line flooder {i}"))
            for i in range(1, 4)
        ),
    )
    clients.delete(host, port, (busy, work))
    return _facts("head_of_line", [filler, *shared["channels"], *flooders], shared_connection=shared["connection"])


# -- AMQP 1.0: one connection, a fast and a slow receiving link --------------------------------------


def amqp10_slow_link(host: str, port: int) -> Truth:
    """Two queues fed at 50 msg/s each (pika) after 200 each up front; one 1.0 connection receives
    both: the fast link keeps 100 credit topped up, the slow one grants 1 every 0.25 s."""
    fast, slow = PREFIX + "link.fast", PREFIX + "link.slow"
    clients.declare(host, port, (fast, slow))
    fillers = [clients.fill(host, port, q, 200, 64, f"slow link filler {q}") for q in (fast, slow)]
    seconds = 5.0
    links, *feeders = clients.in_threads(
        lambda: two_receivers(host, port, LinkPlan(fast, 100, 0.0), LinkPlan(slow, 1, 0.25), seconds),
        *(
            (lambda q=q: clients.paced_publisher(host, port, q, 50.0, seconds, 64, f"slow link feeder {q}"))
            for q in (fast, slow)
        ),
    )
    clients.delete(host, port, (fast, slow))
    return _facts("amqp10_slow_link", [*fillers, *feeders, *links])


# -- a client that does not read: 1 MB messages to a consumer reading its socket slowly --------------


def slow_reader(host: str, port: int, *, messages: int = 2, size: int = 1 << 20) -> Truth:
    """Two 1 MiB messages (``messages`` of ``size`` bytes) in a queue; a raw consumer (prefetch 1,
    SO_RCVBUF 32 KiB) reads 16 KiB every 50 ms: its TCP receive window closes and the broker cannot
    send faster."""
    queue = PREFIX + "slow-reader"
    clients.declare(host, port, (queue,))
    rcvbuf, read_size, pause, prefetch = 32 << 10, 16 << 10, 0.05, 1
    filler = clients.fill(host, port, queue, messages, size, "slow reader filler")
    connection = raw091.RawConnection(host, port, *GUEST, "slow reader", rcvbuf=rcvbuf)
    try:
        read = raw091.consume_slowly(connection, queue, prefetch, messages, read_size=read_size, pause=pause)
        client_port = connection.client_port
    finally:
        connection.close()
    clients.delete(host, port, (queue,))
    reader = {
        "role": "consumer",
        "client_port": client_port,
        "connection_name": "slow reader",
        "protocol": "amqp-0-9-1",
        "client_library": "amqpscope raw091",
        "channel": 1,
        "queue": queue,
        "prefetch_count": prefetch,
        "prefetch_global": False,
        "so_rcvbuf_requested": rcvbuf,
        "read_size": read_size,
        "pause_seconds": pause,
        "deliveries": read.deliveries,
        "acked": read.acks,
        "bytes_read": read.bytes_read,
        "reads": read.reads,
    }
    blind = {
        "component": "client",
        "entity": f"{host}:{client_port}",
        "reason": "the client reads its socket slowly (16 KiB every 50 ms with a 32 KiB receive buffer); "
        "inside the broker this shows at most as a consumer whose acks come late",
    }
    return _facts("slow_reader", [filler, reader], broker_blind=blind)


# -- registration ----------------------------------------------------------------------------------

BOTTLENECK_SCENARIOS: Mapping[str, Callable[[str, int], Truth]] = {
    "healthy": healthy,
    "fast_consumer_at_prefetch": fast_consumer_at_prefetch,
    "memory_alarm": memory_alarm,
    "disk_alarm": disk_alarm,
    "slow_consumer": slow_consumer,
    "credit_flow": credit_flow,
    "channel_routing": channel_routing,
    "head_of_line": head_of_line,
    "amqp10_slow_link": amqp10_slow_link,
    "slow_reader": slow_reader,
    "fan_in_quorum": throttling_scenarios.fan_in_quorum,
    "fan_in_quorum_paced": throttling_scenarios.fan_in_quorum_paced,
    "confirm_bound": client_scenarios.confirm_bound,
    "confirm_paced": client_scenarios.confirm_paced,
    "prefetch_one": client_scenarios.prefetch_one,
    "prefetch_one_empty_queue": client_scenarios.prefetch_one_empty_queue,
    "two_consumers_one_slow": client_scenarios.two_consumers_one_slow,
    "two_consumers_one_slow_no_backlog": client_scenarios.two_consumers_one_slow_no_backlog,
    "busy_healthy_mix": client_scenarios.busy_healthy_mix,
    "spurious_retransmission": network_scenarios.spurious_retransmission,
}

# Scenarios run on a broker configured apart. The throttling ones (and their near misses) use the
# socket buffers RabbitMQ's networking guide suggests for many connections (32 KiB, "Tuning for a
# large number of connections"): a reader held by credit flow then shows as TCP backpressure
# within a few thousand messages; with the kernel's autotuned buffers (megabytes) a short capture
# would hold no backpressure at all (see channel-routing below).
_SMALL_BUFFERS = {"tcp_listen_options.recbuf": "32768", "tcp_listen_options.sndbuf": "32768"}
BROKER_SETTINGS: Mapping[str, Mapping[str, str]] = {
    name: _SMALL_BUFFERS for name in ("fan_in_quorum", "fan_in_quorum_paced")
}

# Scenarios whose bottleneck leaves no trace on the wire, with the component the broker's states
# name (docs/DIAGNOSIS.md, "What the wire cannot tell apart"): the diagnosis must say none there,
# never another component. Routing to no queue kept the readers in flow for milliseconds at a
# time; the broker's 2.5 MB receive buffers absorbed it: no window filled or closed.
WIRE_BLIND: Mapping[str, str] = {"channel-routing": "channel"}

# The component each scenario is built to make the bottleneck (docs: testbed/truth.py).
INTENDED: Mapping[str, str] = {
    "healthy": "none",
    "fast_consumer_at_prefetch": "none",
    "memory_alarm": "memory_alarm",
    "disk_alarm": "disk_alarm",
    "slow_consumer": "consumer",
    "credit_flow": "queue",
    "channel_routing": "channel",
    "head_of_line": "queue",
    "amqp10_slow_link": "consumer",
    "slow_reader": "client",
    "fan_in_quorum": "queue",
    "fan_in_quorum_paced": "none",
    "confirm_bound": "client",
    "confirm_paced": "none",
    "prefetch_one": "client",
    "prefetch_one_empty_queue": "none",
    "two_consumers_one_slow": "consumer",
    "two_consumers_one_slow_no_backlog": "none",
    "busy_healthy_mix": "none",
    "spurious_retransmission": "none",
}


@contextlib.contextmanager
def registered(broker: PrivateBroker) -> Iterator[None]:
    """The bottleneck scenarios registered (each its own capture scenario), ``broker`` lent to them."""
    added = [name for name in BOTTLENECK_SCENARIOS if name not in SCENARIOS]
    for name, scenario in BOTTLENECK_SCENARIOS.items():
        CLIENT_SCENARIOS[name] = scenario  # type: ignore[index]
        SCENARIOS[name] = (name,)  # type: ignore[index]
    ports = [p for p in (broker.port, broker.tls_port) if p is not None]  # scenarios over TLS run on the TLS port
    for port in ports:
        _BROKERS[port] = broker
    try:
        yield
    finally:
        for port in ports:
            _BROKERS.pop(port, None)
        for name in added:
            SCENARIOS.pop(name, None)  # type: ignore[attr-defined]
            CLIENT_SCENARIOS.pop(name, None)  # type: ignore[attr-defined]


def capture_bottleneck(name: str, out_dir: Path, broker: PrivateBroker, **capture_options: Any) -> Path:
    """Capture scenario ``name`` while sampling the broker; add its states and summary to the truth file.
    ``capture_options`` go to ``capture_scenario`` (over TLS: the TLS port, the file's name)."""
    with BrokerStateSampler(broker) as sampler:
        capture = capture_scenario(name, out_dir, broker=broker, **capture_options)
    path = truth_path(capture)
    truth = json.loads(path.read_text())
    started = _epoch_us(truth["capture"]["started_utc"])
    finished = _epoch_us(truth["capture"]["finished_utc"])
    samples = [s.to_json() for s in sampler.samples if started <= s.ts_us <= finished]
    truth["broker_states"] = {
        "source": "rabbitmqctl eval: rabbit_networking:connection_info_all/1, rabbit_channel:info_all/1, "
        "rabbit_amqqueue:info_all/2, rabbit_amqqueue:consumers_all/1, rabbit_alarm:get_alarms/0",
        "clock": "node wall clock, os:system_time(microsecond), the clock tcpdump stamps packets with",
        "interval_ms": SAMPLE_INTERVAL_MS,
        "sampler_errors": sampler.errors,
        "samples": samples,
    }
    facts = truth["ground_truth"][name]
    truth["broker_summary"] = broker_summary(samples, facts)
    truth["intended_bottleneck"] = INTENDED[name]
    path.write_text(json.dumps(truth, indent=1) + "\n")
    return capture


def _epoch_us(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1_000_000)


def capture_bottlenecks(out_dir: Path, names: tuple[str, ...] = tuple(BOTTLENECK_SCENARIOS)) -> list[Path]:
    """Capture each scenario with a private broker (5672 when free), one broker for the scenarios
    of one broker configuration (``BROKER_SETTINGS``); return the captures."""
    captures = []
    for settings in dict.fromkeys(tuple(sorted(BROKER_SETTINGS.get(n, {}).items())) for n in names):
        group = [n for n in names if tuple(sorted(BROKER_SETTINGS.get(n, {}).items())) == settings]
        with PrivateBroker(port=default_capture_port(), config=dict(settings)) as broker, registered(broker):
            captures += [capture_bottleneck(name, out_dir, broker) for name in group]
    return captures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.bottleneck_scenarios", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path("samples/bottlenecks"), help="output directory (default: samples/bottlenecks)"
    )
    parser.add_argument(
        "--scenario", action="append", choices=sorted(BOTTLENECK_SCENARIOS), help="repeatable (default: all)"
    )
    args = parser.parse_args(argv)
    for path in capture_bottlenecks(args.out, tuple(args.scenario or BOTTLENECK_SCENARIOS)):
        print(f"{path} ({path.stat().st_size} bytes) + {truth_path(path).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
