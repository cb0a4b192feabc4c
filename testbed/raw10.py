"""A minimal AMQP 1.0 sender on a plain socket, for traffic python-qpid-proton cannot make.

proton in Python sends a few hundred messages a second on this shared machine: too slow to push
RabbitMQ's AMQP 1.0 plugin into credit flow. This client does a real SASL PLAIN and AMQP 1.0
handshake (open, begin, attach as sender), waits for the broker's link credit, then writes
pre-encoded, pre-settled transfers as fast as the broker reads them, never more than the credit
and the session's incoming window the broker granted. Encodings are those of the AMQP 1.0
specification: types (part 1, section 1.6), frames (part 2, 2.3), performatives (2.7), SASL
(part 5, 5.3) and the data section (part 3, 3.2.6); every byte it writes is valid AMQP 1.0.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

SASL_HEADER, AMQP_HEADER = b"AMQP\x03\x01\x00\x00", b"AMQP\x00\x01\x00\x00"
FRAME_AMQP, FRAME_SASL = 0, 1
# Descriptor codes (smallulong) of the performatives and sections used.
SASL_MECHANISMS, SASL_INIT, SASL_OUTCOME = 0x40, 0x41, 0x44
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, CLOSE = 0x10, 0x11, 0x12, 0x13, 0x14, 0x18
SOURCE, TARGET, DATA = 0x28, 0x29, 0x75


class RawClientError(RuntimeError):
    """The broker answered something the handshake did not expect, or closed the socket."""


# -- encoding (part 1, 1.6) ---------------------------------------------------------------------

NULL = b"\x40"


def boolean(value: bool) -> bytes:
    return b"\x41" if value else b"\x42"


def ubyte(value: int) -> bytes:
    return b"\x50" + bytes([value])


def uint(value: int) -> bytes:
    return b"\x70" + struct.pack("!I", value)


def string(text: str) -> bytes:
    data = text.encode()
    return b"\xa1" + bytes([len(data)]) + data


def symbol(text: str) -> bytes:
    data = text.encode()
    return b"\xa3" + bytes([len(data)]) + data


def binary(data: bytes) -> bytes:
    return b"\xa0" + bytes([len(data)]) + data if len(data) < 256 else b"\xb0" + struct.pack("!I", len(data)) + data


def described_list(code: int, *items: bytes) -> bytes:
    body = b"".join(items)
    return b"\x00\x53" + bytes([code]) + b"\xd0" + struct.pack("!II", len(body) + 4, len(items)) + body


def frame(body: bytes, channel: int = 0, frame_type: int = FRAME_AMQP) -> bytes:
    return struct.pack("!IBBH", 8 + len(body), 2, frame_type, channel) + body


def transfer(delivery_id: int, body: bytes) -> bytes:
    """A whole message in one pre-settled transfer on handle 0: one data section."""
    performative = described_list(TRANSFER, uint(0), uint(delivery_id), binary(struct.pack("!I", delivery_id)),
                                  uint(0), boolean(True))
    return frame(performative + b"\x00\x53" + bytes([DATA]) + binary(body))


# -- the connection ------------------------------------------------------------------------------


@dataclass
class Granted:
    link_credit: int = 0
    incoming_window: int = 0


class RawSender:
    """One AMQP 1.0 connection, one session, one sending link to ``address``."""

    def __init__(self, host: str, port: int, user: str, password: str, container_id: str, address: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=60.0)
        self.buffer = bytearray()
        self.granted = Granted()
        self._sasl(user, password)
        self.sock.sendall(AMQP_HEADER)
        self._expect_header(AMQP_HEADER)
        self.sock.sendall(frame(described_list(OPEN, string(container_id), string("localhost"), uint(65536))))
        self._expect(OPEN)
        self.sock.sendall(frame(described_list(BEGIN, NULL, uint(0), uint(65535), uint(65535))))
        begin = self._expect(BEGIN)
        self.granted.incoming_window = _begin_incoming_window(begin)
        # A sender's attach MUST carry its initial-delivery-count (2.7.3), after unsettled and
        # incomplete-unsettled; snd-settle-mode 1: settled.
        attach = described_list(ATTACH, string(container_id), uint(0), boolean(False), ubyte(1), ubyte(0),
                                described_list(SOURCE, NULL), described_list(TARGET, string(address)), NULL,
                                boolean(False), uint(0))
        self.sock.sendall(frame(attach))
        self._expect(ATTACH)
        self.granted.link_credit = _flow_link_credit(self._expect(FLOW))

    @property
    def client_port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _sasl(self, user: str, password: str) -> None:
        self.sock.sendall(SASL_HEADER)
        self._expect_header(SASL_HEADER)
        self._expect(SASL_MECHANISMS)
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        self.sock.sendall(frame(described_list(SASL_INIT, symbol("PLAIN"), binary(response)), frame_type=FRAME_SASL))
        outcome = self._expect(SASL_OUTCOME)
        if _first_uint_after(outcome, 0) != 0:  # sasl-code ok (5.3.3.6)
            raise RawClientError(f"SASL refused: {outcome!r}")

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise RawClientError("the broker closed the socket")
        self.buffer += data

    def _expect_header(self, header: bytes) -> None:
        while len(self.buffer) < 8:
            self._read()
        if bytes(self.buffer[:8]) != header:
            raise RawClientError(f"expected {header!r}, got {bytes(self.buffer[:8])!r}")
        del self.buffer[:8]

    def _expect(self, code: int) -> bytes:
        """Read frames until one whose performative has descriptor ``code``; its body."""
        while True:
            while len(self.buffer) < 8 or len(self.buffer) < struct.unpack_from("!I", self.buffer)[0]:
                self._read()
            size, doff = struct.unpack_from("!IB", self.buffer)
            body = bytes(self.buffer[doff * 4 : size])
            del self.buffer[:size]
            if body[:2] == b"\x00\x53" and body[2] == code:
                return body
            if body[:2] == b"\x00\x53" and body[2] == CLOSE:
                raise RawClientError(f"closed by the broker: {body[:200]!r}")

    def drain_in_background(self, stop: threading.Event) -> threading.Thread:
        """Read (and drop) what the broker sends from now on, so its flows never fill our buffer."""
        def run() -> None:
            while not stop.is_set():
                try:
                    readable, _, _ = select.select([self.sock], [], [], 0.2)
                    if readable and not self.sock.recv(65536):
                        return
                except OSError:
                    return
        thread = threading.Thread(target=run, name="raw10 reader", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        try:
            self.sock.sendall(frame(described_list(CLOSE)))
        finally:
            self.sock.close()


def _first_uint_after(body: bytes, skip: int) -> int:
    """The ``skip``-th (0-based) field of a described list made only of uint/small values, as the
    broker encodes begin and flow: walks the list's first fields by their constructors."""
    pos = 3  # past 0x00 0x53 code
    constructor = body[pos]
    pos += 1 + (2 if constructor == 0xC0 else 8 if constructor == 0xD0 else 0)
    for index in range(skip + 1):
        kind = body[pos]
        if kind in (0x40, 0x43, 0x44, 0x41, 0x42):  # null, uint0, ulong0, true, false
            value, width = 0, 0
        elif kind in (0x52, 0x53, 0x50, 0x51):  # smalluint, smallulong, ubyte, byte
            value, width = body[pos + 1], 1
        elif kind == 0x60:  # ushort
            value, width = struct.unpack_from("!H", body, pos + 1)[0], 2
        elif kind == 0x70:  # uint
            value, width = struct.unpack_from("!I", body, pos + 1)[0], 4
        elif kind == 0x80:  # ulong
            value, width = struct.unpack_from("!Q", body, pos + 1)[0], 8
        else:
            raise RawClientError(f"unexpected constructor {kind:#x} in {body[:40]!r}")
        if index == skip:
            return int(value)
        pos += 1 + width
    raise RawClientError("field not found")


def _begin_incoming_window(begin: bytes) -> int:
    return _first_uint_after(begin, 2)  # remote-channel, next-outgoing-id, incoming-window


def _flow_link_credit(flow: bytes) -> int:
    return _first_uint_after(flow, 6)  # ..., outgoing-window, handle, delivery-count, link-credit


def send_for(sender: RawSender, body: bytes, seconds: float, max_messages: int, rate: float | None = None,
             batch: int = 50) -> int:
    """Write pre-settled transfers as fast as the broker reads them (``rate`` None, ``batch`` a
    write) or ``rate`` a second, for ``seconds`` or until ``max_messages`` or the credit or
    incoming window granted runs out; return the count."""
    limit = min(max_messages, sender.granted.link_credit, sender.granted.incoming_window)
    sent = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds and sent < limit:
        if rate is not None:
            due = started + sent / rate
            if due > time.monotonic():
                time.sleep(due - time.monotonic())
        count = 1 if rate is not None else min(batch, limit - sent)
        sender.sock.sendall(b"".join(transfer(sent + i, body) for i in range(count)))  # blocks while unread
        sent += count
    return sent
