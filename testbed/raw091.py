"""A minimal AMQP 0-9-1 client on a plain socket, for traffic pika cannot make.

pika is too slow to push RabbitMQ into credit flow from a few publishers on a shared 2-core
machine, and it reads its socket as fast as it can, so it cannot play a client that does not
read. This client does a real handshake (protocol header, start-ok with PLAIN, tune-ok,
connection.open, channel.open), then either writes pre-encoded publishes as fast as the broker
takes them, or consumes with ``basic.qos`` and reads its socket slowly. Frame layouts are those
of the AMQP 0-9-1 specification, section 4.2 (general frame format) and the method definitions
in ``ingest/specs``; every byte it writes is valid AMQP.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from testbed import tls

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = b"\xce"
FRAME_OVERHEAD = 8  # type(1) channel(2) size(4) + frame-end(1)
CONNECTION, CHANNEL, BASIC = 10, 20, 60
START, START_OK, TUNE, TUNE_OK, OPEN, OPEN_OK, CLOSE, CLOSE_OK = 10, 11, 30, 31, 40, 41, 50, 51
CHANNEL_OPEN, CHANNEL_OPEN_OK = 10, 11
QOS, QOS_OK, CONSUME, CONSUME_OK, PUBLISH, DELIVER, ACK = 10, 11, 20, 21, 40, 60, 80
DELIVERY_MODE_FLAG = 1 << 12  # basic properties flag bit of delivery-mode
REPLY_SUCCESS = 200


class RawClientError(RuntimeError):
    """The broker answered something the handshake did not expect, or closed the socket."""


def shortstr(text: str) -> bytes:
    data = text.encode()
    return struct.pack("!B", len(data)) + data


def longstr(data: bytes) -> bytes:
    return struct.pack("!I", len(data)) + data


def table(fields: dict[str, str | dict[str, bool]]) -> bytes:
    """A field table of long strings ('S') and nested tables ('F') of booleans ('t')."""
    encoded = b""
    for key, value in fields.items():
        if isinstance(value, dict):
            inner = b"".join(shortstr(k) + b"t" + bytes([v]) for k, v in value.items())
            encoded += shortstr(key) + b"F" + longstr(inner)
        else:
            encoded += shortstr(key) + b"S" + longstr(value.encode())
    return longstr(encoded)


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return struct.pack("!BHI", frame_type, channel, len(payload)) + payload + FRAME_END


def method(channel: int, class_id: int, method_id: int, arguments: bytes = b"") -> bytes:
    return frame(FRAME_METHOD, channel, struct.pack("!HH", class_id, method_id) + arguments)


def publish_frames(
    channel: int, exchange: str, routing_key: str, body: bytes, frame_max: int, persistent: bool = False
) -> bytes:
    """basic.publish + content header (delivery-mode only) + body frames of one message."""
    publish = method(
        channel, BASIC, PUBLISH, struct.pack("!H", 0) + shortstr(exchange) + shortstr(routing_key) + b"\x00"
    )
    properties = struct.pack("!HB", DELIVERY_MODE_FLAG, 2 if persistent else 1)
    header = frame(FRAME_HEADER, channel, struct.pack("!HHQ", BASIC, 0, len(body)) + properties)
    chunk = frame_max - FRAME_OVERHEAD
    bodies = b"".join(frame(FRAME_BODY, channel, body[i : i + chunk]) for i in range(0, len(body), chunk))
    return publish + header + bodies


@dataclass
class Frame:
    frame_type: int
    channel: int
    payload: bytes

    @property
    def method_id(self) -> tuple[int, int]:
        return struct.unpack("!HH", self.payload[:4]) if self.frame_type == FRAME_METHOD else (0, 0)


@dataclass
class FrameReader:
    """Splits bytes read from the socket into frames (nothing until a whole frame is there)."""

    buffer: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> list[Frame]:
        self.buffer += data
        frames = []
        while len(self.buffer) >= 7:
            frame_type, channel, size = struct.unpack_from("!BHI", self.buffer)
            if len(self.buffer) < size + FRAME_OVERHEAD:
                break
            if self.buffer[7 + size] != FRAME_END[0]:
                raise RawClientError(f"frame-end {self.buffer[7 + size]:#x} instead of 0xce")
            frames.append(Frame(frame_type, channel, bytes(self.buffer[7 : 7 + size])))
            del self.buffer[: size + FRAME_OVERHEAD]
        return frames


class RawConnection:
    """One AMQP 0-9-1 connection with channel 1 open, on a plain blocking socket."""

    def __init__(
        self,
        host: str,
        port: int,
        user: str,
        password: str,
        connection_name: str,
        *,
        rcvbuf: int | None = None,
        sndbuf: int | None = None,
    ) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if sndbuf is not None:
            # A small send buffer keeps the backlog a throttled publisher leaves behind small.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        if rcvbuf is not None:
            # Before connect, so the window scale offered in the SYN matches the small buffer.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(60.0)
        self.sock.connect((host, port))
        context = tls.client_context(port)
        if context is not None:  # AMQP over TLS: the context lent for the port logs its keys
            self.sock = context.wrap_socket(self.sock, server_hostname=tls.HOSTNAME)
        self.reader = FrameReader()
        self.pending: list[Frame] = []
        self.frame_max = 0
        self._handshake(user, password, connection_name)

    @property
    def client_port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _handshake(self, user: str, password: str, connection_name: str) -> None:
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(CONNECTION, START)
        properties = table(
            {
                "product": "amqpscope raw091",
                "connection_name": connection_name,
                "capabilities": {"connection.blocked": True},
            }
        )
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        self.sock.sendall(
            method(0, CONNECTION, START_OK, properties + shortstr("PLAIN") + longstr(response) + shortstr("en_US"))
        )
        tune = self.expect(CONNECTION, TUNE)
        channel_max, frame_max, _heartbeat = struct.unpack_from("!HIH", tune.payload, 4)
        self.frame_max = frame_max
        # Heartbeat 0: a client that stops reading must not be closed for missed heartbeats.
        self.sock.sendall(method(0, CONNECTION, TUNE_OK, struct.pack("!HIH", channel_max, frame_max, 0)))
        self.sock.sendall(method(0, CONNECTION, OPEN, shortstr("/") + shortstr("") + b"\x00"))
        self.expect(CONNECTION, OPEN_OK)
        self.sock.sendall(method(1, CHANNEL, CHANNEL_OPEN, shortstr("")))
        self.expect(CHANNEL, CHANNEL_OPEN_OK)

    def read_frames(self, size: int = 65536) -> list[Frame]:
        data = self.sock.recv(size)
        if not data:
            raise RawClientError("the broker closed the socket")
        return self.reader.feed(data)

    def expect(self, class_id: int, method_id: int) -> Frame:
        """Read until the method ``(class_id, method_id)`` arrives; keep other frames pending."""
        while True:
            while self.pending:
                frame_ = self.pending.pop(0)
                if frame_.method_id == (class_id, method_id):
                    return frame_
                if frame_.method_id in ((CONNECTION, CLOSE), (CHANNEL, 40)):
                    raise RawClientError(f"closed by the broker: {frame_.payload[4:80]!r}")
            self.pending.extend(self.read_frames())

    def close(self) -> None:
        """connection.close, wait for close-ok (frames still in flight are read and dropped)."""
        try:
            self.sock.sendall(
                method(
                    0, CONNECTION, CLOSE, struct.pack("!H", REPLY_SUCCESS) + shortstr("bye") + struct.pack("!HH", 0, 0)
                )
            )
            self.pending.clear()
            while True:
                frames = self.read_frames()
                if any(f.method_id == (CONNECTION, CLOSE_OK) for f in frames):
                    break
        finally:
            self.sock.close()


def publish_for(
    connection: RawConnection,
    exchange: str,
    routing_key: str,
    body: bytes,
    seconds: float,
    *,
    max_messages: int,
    batch: int = 50,
    persistent: bool = False,
) -> int:
    """Write publishes on channel 1 as fast as the broker reads them, for ``seconds`` or
    ``max_messages`` (a multiple of ``batch``), whichever comes first; return the count."""
    one = publish_frames(1, exchange, routing_key, body, connection.frame_max, persistent)
    burst = one * batch
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and sent < max_messages:
        connection.sock.sendall(burst)  # blocks while the broker does not read (TCP backpressure)
        sent += batch
    return sent


def ack(channel: int, delivery_tag: int) -> bytes:
    """basic.ack of one delivery (multiple=false)."""
    return method(channel, BASIC, ACK, struct.pack("!QB", delivery_tag, 0))


def start_consumer(connection: RawConnection, channel: int, queue: str, prefetch_count: int, consumer_tag: str) -> str:
    """basic.qos(prefetch_count, global=false) + basic.consume with acks on ``channel``; the consumer tag."""
    connection.sock.sendall(method(channel, BASIC, QOS, struct.pack("!IHB", 0, prefetch_count, 0)))
    connection.expect(BASIC, QOS_OK)
    arguments = struct.pack("!H", 0) + shortstr(queue) + shortstr(consumer_tag) + b"\x00" + longstr(b"")
    connection.sock.sendall(method(channel, BASIC, CONSUME, arguments))
    connection.expect(BASIC, CONSUME_OK)
    return consumer_tag


@dataclass
class _Deliveries:
    """Tracks content frames: which delivery is being received and how much of its body is missing."""

    delivery_tag: int = 0
    remaining: int = 0

    def complete(self, frame_: Frame) -> int | None:
        """The delivery tag once ``frame_`` completes a delivery, else None."""
        if frame_.method_id == (BASIC, DELIVER):
            tag_at = 4 + 1 + frame_.payload[4]  # after the consumer-tag shortstr
            (self.delivery_tag,) = struct.unpack_from("!Q", frame_.payload, tag_at)
        elif frame_.method_id in ((CONNECTION, CLOSE), (CHANNEL, 40)):
            raise RawClientError(f"closed by the broker: {frame_.payload[4:80]!r}")
        elif frame_.frame_type == FRAME_HEADER:
            (self.remaining,) = struct.unpack_from("!Q", frame_.payload, 4)
            return self.delivery_tag if self.remaining == 0 else None
        elif frame_.frame_type == FRAME_BODY:
            self.remaining -= len(frame_.payload)
            return self.delivery_tag if self.remaining == 0 else None
        return None


def deliveries(connection: RawConnection, stop: threading.Event) -> Iterator[int]:
    """Delivery tags of complete deliveries as they are read, until ``stop`` is set."""
    tracker = _Deliveries()
    frames, connection.pending = connection.pending, []
    while not stop.is_set():
        for frame_ in frames:
            tag = tracker.complete(frame_)
            if tag is not None:
                yield tag
        # A TLS socket may hold decrypted bytes that select cannot see (SSLSocket.pending).
        buffered = isinstance(connection.sock, ssl.SSLSocket) and connection.sock.pending() > 0
        readable = buffered or bool(select.select([connection.sock], [], [], 0.1)[0])
        frames = connection.read_frames() if readable else []


@dataclass
class SlowReadTruth:
    """What a slowly reading consumer did."""

    deliveries: int = 0
    acks: int = 0
    bytes_read: int = 0
    reads: int = 0


def consume_slowly(
    connection: RawConnection,
    queue: str,
    prefetch_count: int,
    messages: int,
    *,
    read_size: int,
    pause: float,
    timeout: float = 60.0,
) -> SlowReadTruth:
    """Consume on channel 1 with ``basic.qos(prefetch_count)``, reading ``read_size`` bytes every
    ``pause`` s and acking each delivery once its last body frame is read, until ``messages`` are acked."""
    start_consumer(connection, 1, queue, prefetch_count, "amqpscope-slow-reader")
    truth = SlowReadTruth()
    tracker = _Deliveries()
    deadline = time.monotonic() + timeout
    frames, connection.pending = connection.pending, []
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(f"acked {truth.acks} of {messages} messages")
        for frame_ in frames:
            if frame_.method_id == (BASIC, DELIVER):
                truth.deliveries += 1
            tag = tracker.complete(frame_)
            if tag is not None:
                connection.sock.sendall(ack(1, tag))
                truth.acks += 1
        if truth.acks >= messages:
            break
        time.sleep(pause)  # the slow part: the socket is read a little at a time
        data = connection.sock.recv(read_size)
        if not data:
            raise RawClientError("the broker closed the socket")
        truth.bytes_read += len(data)
        truth.reads += 1
        frames = connection.reader.feed(data)
    return truth
