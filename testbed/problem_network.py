"""A publisher behind a slow link: two network namespaces, veth pairs with link-local addresses,
a token bucket (``tc qdisc ... tbf``) on the hop toward the broker; and its near miss.

    client namespace            router namespace                          root namespace
    169.254.61.2 [veth] ---- [veth] 169.254.61.1   169.254.62.1 [veth, tbf] ---- [veth] 169.254.62.2
    pika publisher                                  (forwarding)                   RabbitMQ listener

The broker runs in the root namespace (its node, epmd and the sampler's ``rabbitmqctl`` talk over
the root namespace's loopback), listening on 169.254.62.2 besides 127.0.0.1. The token bucket sits
on a forwarding hop, as on a real link: what does not fit in its queue is dropped there and the
publisher's TCP sends it again. tcpdump captures on the client's veth (every retransmission on
the wire). The publisher runs in the client namespace in a process of its own (``ip netns exec``)
and reports what it did and what its socket's ``TCP_INFO`` counted (bytes acked, retransmissions).
Namespaces and links are deleted and every process stopped by PID in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testbed import capture as cap
from testbed.broker import PrivateBroker
from testbed.broker_states import BrokerStateSampler
from testbed.capture import Tcpdump, capture_file_name, truth_path
from testbed.processes import child_environment, free_port
from testbed.scenarios import GUEST, message_body

CLIENT_ADDRESS, ROUTER_CLIENT_SIDE = "169.254.61.2", "169.254.61.1"
ROUTER_BROKER_SIDE, BROKER_ADDRESS = "169.254.62.1", "169.254.62.2"
LINK_RATE_BITS = 2_000_000  # tbf rate 2mbit
TBF_BURST_BYTES = 10_000  # a few segments at line speed
TBF_LIMIT_BYTES = 20_000  # queue at the bucket: ~80 ms of the rate; beyond it, drops
MESSAGE_BYTES = 4096
SECONDS = 4.0
PUBLISHER_TIMEOUT = 60.0


@dataclass(frozen=True)
class LinkPlan:
    scenario: str
    rate_per_second: float | None  # None: as fast as the link takes


LINK_SCENARIOS: Mapping[str, LinkPlan] = {
    "slow_link": LinkPlan("slow_link", None),
    # 10 x 4 KiB a second: ~0.33 Mbit/s, a sixth of the link's rate.
    "slow_link_under_cap": LinkPlan("slow_link_under_cap", 10.0),
}


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


class SlowLink:
    """The namespaces and links above, created on enter and deleted on exit."""

    def __init__(self) -> None:
        tag = os.getpid() % 100_000
        self.client_ns, self.router_ns = f"aps-cl-{tag}", f"aps-rt-{tag}"
        self.client_if, self.router_in = f"apc{tag}", f"apri{tag}"
        self.router_out, self.root_if = f"apro{tag}", f"aprr{tag}"
        self.created: list[str] = []

    def __enter__(self) -> SlowLink:
        try:
            self._create()
        except BaseException:
            self.delete()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.delete()

    def _create(self) -> None:
        cn, rn = self.client_ns, self.router_ns
        for ns in (cn, rn):
            _run("ip", "netns", "add", ns)
            self.created.append(ns)
        _run("ip", "link", "add", self.client_if, "type", "veth", "peer", "name", self.router_in)
        _run("ip", "link", "add", self.root_if, "type", "veth", "peer", "name", self.router_out)
        self.created.append(self.root_if)  # deleting one end deletes the pair (and its routes)
        _run("ip", "link", "set", self.client_if, "netns", cn)
        _run("ip", "link", "set", self.router_in, "netns", rn)
        _run("ip", "link", "set", self.router_out, "netns", rn)
        inside = ("ip", "netns", "exec")
        _run(*inside, cn, "ip", "addr", "add", f"{CLIENT_ADDRESS}/30", "dev", self.client_if)
        _run(*inside, rn, "ip", "addr", "add", f"{ROUTER_CLIENT_SIDE}/30", "dev", self.router_in)
        _run(*inside, rn, "ip", "addr", "add", f"{ROUTER_BROKER_SIDE}/30", "dev", self.router_out)
        _run("ip", "addr", "add", f"{BROKER_ADDRESS}/30", "dev", self.root_if)
        for ns, dev in ((cn, self.client_if), (cn, "lo"), (rn, self.router_in), (rn, self.router_out), (rn, "lo")):
            _run(*inside, ns, "ip", "link", "set", dev, "up")
        _run("ip", "link", "set", self.root_if, "up")
        _run(*inside, rn, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _run(*inside, cn, "ip", "route", "add", f"{BROKER_ADDRESS}/32", "via", ROUTER_CLIENT_SIDE)
        _run("ip", "route", "add", f"{CLIENT_ADDRESS}/32", "via", ROUTER_BROKER_SIDE, "dev", self.root_if)
        _run(
            *inside, rn, "tc", "qdisc", "add", "dev", self.router_out, "root", "tbf",
            "rate", f"{LINK_RATE_BITS // 1000}kbit", "burst", str(TBF_BURST_BYTES), "limit", str(TBF_LIMIT_BYTES),
        )  # fmt: skip

    def delete(self) -> None:
        for name in reversed(self.created):
            if name.startswith("aps-"):
                subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
            else:
                subprocess.run(["ip", "link", "delete", name], capture_output=True, timeout=30)
        self.created.clear()

    def qdisc_stats(self) -> str:
        result = subprocess.run(
            ["ip", "netns", "exec", self.router_ns, "tc", "-s", "qdisc", "show", "dev", self.router_out],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        return " ".join(result.stdout.split())


class NamespaceTcpdump(Tcpdump):
    """tcpdump on an interface of a network namespace (``ip netns exec`` execs it: its PID is tcpdump's)."""

    def __init__(self, output: Path, port: int, interface: str, namespace: str) -> None:
        super().__init__(output, port, interface)
        self.namespace = namespace

    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *super().command()]


# -- the publisher, run inside the client namespace --------------------------------------------------


def tcp_info(sock: socket.socket) -> dict[str, int]:
    """Linux ``struct tcp_info`` (include/uapi/linux/tcp.h): total retransmissions and bytes acked."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    return {
        "total_retrans": struct.unpack_from("I", raw, 100)[0],
        "bytes_acked": struct.unpack_from("Q", raw, 120)[0],
        "rtt_us": struct.unpack_from("I", raw, 68)[0],
    }


def publish(host: str, port: int, queue: str, seconds: float, rate: float | None) -> dict[str, Any]:
    """pika: publish MESSAGE_BYTES messages to ``queue`` for ``seconds`` (``rate`` a second or as fast
    as the socket takes them); what the socket counted, before the connection closes."""
    import pika

    parameters = pika.ConnectionParameters(
        host=host, port=port, credentials=pika.PlainCredentials(*GUEST),
        client_properties={"connection_name": "publisher behind a slow link"}, blocked_connection_timeout=60,
    )  # fmt: skip
    connection = pika.BlockingConnection(parameters)
    sock = connection._impl._transport._sock  # pika has no public accessor for its socket
    channel = connection.channel()
    before = tcp_info(sock)
    started, sent = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        if rate is not None:
            time.sleep(max(0.0, started + sent / rate - time.monotonic()))
        channel.basic_publish("", queue, message_body("0-9-1", sent, MESSAGE_BYTES))
        sent += 1
    elapsed = time.monotonic() - started
    after = tcp_info(sock)
    client_port = sock.getsockname()[1]
    connection.close()
    acked = after["bytes_acked"] - before["bytes_acked"]
    return {
        "role": "publisher",
        "client_port": client_port,
        "client_address": CLIENT_ADDRESS,
        "connection_name": "publisher behind a slow link",
        "protocol": "amqp-0-9-1",
        "client_library": "pika",
        "queue": queue,
        "messages": sent,
        "body_size": MESSAGE_BYTES,
        "rate_per_second": rate,
        "seconds": round(elapsed, 3),
        "bytes_acked_by_broker": acked,
        "throughput_bits_per_second": int(acked * 8 / elapsed),
        "link_rate_bits_per_second": LINK_RATE_BITS,
        "retransmissions": after["total_retrans"] - before["total_retrans"],
        "smoothed_rtt_us": after["rtt_us"],
    }


def _publisher_in_namespace(link: SlowLink, port: int, queue: str, plan: LinkPlan) -> dict[str, Any]:
    command = [
        "ip", "netns", "exec", link.client_ns, sys.executable, "-m", "testbed.problem_network",
        "publish", "--host", BROKER_ADDRESS, "--port", str(port), "--queue", queue, "--seconds", str(SECONDS),
    ]  # fmt: skip
    if plan.rate_per_second is not None:
        command += ["--rate", str(plan.rate_per_second)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_environment()
    )
    try:
        out, err = process.communicate(timeout=PUBLISHER_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"publisher in {link.client_ns} failed: {err.strip()[-800:]}")
    return json.loads(out.strip().splitlines()[-1])


# -- capture --------------------------------------------------------------------------------------


def capture_link_scenario(name: str, out_dir: Path) -> Path:
    """Capture ``name`` on the client's veth, with a private broker listening on the link and its states."""
    from testbed import bottleneck_clients as clients
    from testbed.problem_scenarios import add_broker_truth

    plan = LINK_SCENARIOS[name]
    queue = "amqpscope.pr." + name
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / capture_file_name(name, pcapng=False)
    with SlowLink() as link:
        port = cap.default_capture_port() or free_port()
        config = {"listeners.tcp.2": f"{BROKER_ADDRESS}:{port}", "loopback_users.guest": "false"}
        with PrivateBroker(port=port, config=config) as broker:
            clients.declare(broker.host, broker.port, (queue,))
            stop = threading.Event()
            with BrokerStateSampler(broker) as sampler:
                started = datetime.now(UTC)
                with NamespaceTcpdump(final, port, link.client_if, link.client_ns) as tcpdump:
                    # A consumer on the broker's loopback (not on the link, not in the capture) keeps the queue empty.
                    consumer = threading.Thread(
                        target=clients.consumer,
                        args=(broker.host, broker.port, queue, 10**6, 50, "consumer on the broker's host"),
                        kwargs={"stop": stop},
                    )
                    consumer.start()
                    try:
                        publisher = _publisher_in_namespace(link, port, queue, plan)
                        time.sleep(cap.DRAIN_SECONDS)
                    finally:
                        stop.set()
                        consumer.join(30.0)
                finished = datetime.now(UTC)
            qdisc = link.qdisc_stats()
            clients.delete(broker.host, broker.port, (queue,))
            meta = cap._capture_metadata(final, tcpdump, started, finished)
            if meta["packets_dropped_by_kernel"]:
                final.unlink(missing_ok=True)
                raise cap.CaptureError(f"{name}: tcpdump dropped {meta['packets_dropped_by_kernel']} packets")
            meta.update({"file": final.name, "attempt": 1, "namespace": "client namespace (deleted after)"})
            blind = None
            if plan.rate_per_second is None:
                blind = {
                    "component": "network",
                    "entity": f"{CLIENT_ADDRESS}:{publisher['client_port']}",
                    "reason": "the link to the broker carries 2 Mbit/s (a token bucket on the router); the publisher "
                    "sends at its rate and loses segments at its queue; inside the broker nothing waits",
                }
            truth = {
                "scenario": name,
                "clients": [publisher],
                "link": {
                    "client": CLIENT_ADDRESS,
                    "broker": BROKER_ADDRESS,
                    "hops": "client veth -> router namespace (forwarding) -> tbf -> root namespace veth",
                    "qdisc": f"tbf rate {LINK_RATE_BITS // 1000}kbit burst {TBF_BURST_BYTES} limit {TBF_LIMIT_BYTES}",
                    "qdisc_stats_after": qdisc,
                    "rate_bits_per_second": LINK_RATE_BITS,
                },
                "broker_blind": blind,
            }
            record = {
                "truth_format_version": cap.TRUTH_FORMAT_VERSION,
                "scenario": name,
                "ground_truth": {name: truth},
                "capture": meta,
                "broker": {**cap._broker_metadata(broker, port), "host": BROKER_ADDRESS},
                "clients": cap._client_metadata(),
            }
            truth_path(final).write_text(json.dumps(record, indent=2) + "\n")
            add_broker_truth(final, sampler, name)
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.problem_network")
    sub = parser.add_subparsers(dest="command", required=True)
    pub = sub.add_parser("publish", help="run the publisher (inside the client namespace)")
    pub.add_argument("--host", required=True)
    pub.add_argument("--port", type=int, required=True)
    pub.add_argument("--queue", required=True)
    pub.add_argument("--seconds", type=float, default=SECONDS)
    pub.add_argument("--rate", type=float, default=None)
    args = parser.parse_args(argv)
    print(json.dumps(publish(args.host, args.port, args.queue, args.seconds, args.rate)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
