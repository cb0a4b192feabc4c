"""A healthy connection with spurious retransmissions: nothing lost, segments sent twice.

Linux retransmits the last unacknowledged segment when no ACK came within its probe timeout
(tail loss probe, RFC 8985 section 7.2): about two round trips plus the socket's minimum
retransmission timeout. The receiver acknowledges a pushed segment when its application reads it,
so a broker whose reader is a few milliseconds late (a busy host) lets a sender with a short
timeout retransmit a segment the broker already has: the broker answers the duplicate at once
with a D-SACK (RFC 2883) naming it, and nothing was lost. Here the publisher's minimum
retransmission timeout is lowered to the least the kernel takes (``TCP_RTO_MIN_US``, Linux 6.15
and later: two scheduler ticks, 8 ms at 250 Hz, against the default 200 ms) on its own socket only,
so that a late read of this shared machine's broker makes it retransmit; no other traffic is
touched. On the sample capture 15 segments were sent twice and all 15 D-SACKed.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from testbed import bottleneck_clients as clients
from testbed import raw091
from testbed.scenarios import GUEST, Truth, message_body

PREFIX = "amqpscope.bn."
TCP_RTO_MIN_US = 45  # include/uapi/linux/tcp.h, Linux 6.15
# The lowest the kernel takes (two scheduler ticks; 8 ms at 250 Hz): below the 40 ms delayed ACK.
RTO_MIN_US = 8000


def _sparse_publisher(
    host: str, port: int, queue: str, rate: float, seconds: float, body_size: int, name: str
) -> dict[str, Any]:
    """A raw publisher writing one message at a time, ``rate`` a second, its socket's minimum
    retransmission timeout lowered to RTO_MIN_US."""
    connection = raw091.RawConnection(host, port, *GUEST, name)
    connection.sock.setsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US, RTO_MIN_US)
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # one segment a message
    rto_min = connection.sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MIN_US)
    sent = 0
    try:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            due = started + sent / rate
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
            sent += 1
            connection.sock.sendall(
                raw091.publish_frames(1, "", queue, message_body("0-9-1", sent, body_size), connection.frame_max)
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
        "queue": queue,
        "messages": sent,
        "rate_per_second": rate,
        "body_size": body_size,
        "persistent": False,
        "publisher_confirms": False,
        "tcp_rto_min_us": rto_min,
    }


def spurious_retransmission(host: str, port: int) -> Truth:
    """The publisher (512-byte messages, 300 a second for 3 s) and a pika consumer of its queue."""
    queue = PREFIX + "spurious"
    clients.declare(host, port, (queue,))
    seconds, rate = 3.0, 300.0
    published = threading.Event()

    def publish() -> dict[str, Any]:
        try:
            return _sparse_publisher(host, port, queue, rate, seconds, 512, "publisher retransmitting early")
        finally:
            # A loaded machine may publish fewer than rate * seconds: the consumer stops once the
            # last ones had time to arrive.
            threading.Timer(1.0, published.set).start()

    publisher, consumer = clients.in_threads(
        publish,
        lambda: clients.consumer(host, port, queue, 10**6, 50, "consumer of the early retransmitter", stop=published),
    )
    clients.delete(host, port, (queue,))
    network = {
        "why": "the publisher's minimum retransmission timeout (TCP_RTO_MIN_US) is below the broker's "
        "delayed ACK: it retransmits segments the broker already has, which the broker D-SACKs; "
        "nothing is lost"
    }
    return {"scenario": "spurious_retransmission", "clients": [publisher, consumer], "network": network}
