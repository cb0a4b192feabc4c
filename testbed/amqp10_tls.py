"""An AMQP 1.0 client over TLS that logs its keys: python-qpid-proton's protocol engine on a Python ``ssl`` socket.

proton's own TLS (its C library's OpenSSL binding, ``SSLDomain``) cannot write a key log, so the
capture could not be decrypted. Here proton does all of AMQP 1.0 (SASL PLAIN, open, begin, attach,
flow, transfer, disposition, detach, end, close: its ``Connection`` and ``Transport``, the same
engine its reactor drives), and this module moves the engine's bytes over a socket from
``testbed.tls.connect``: TLS with the context lent for the port (``ssl.SSLContext.keylog_filename``
writes the key log), plain otherwise. The scenario is ``scenarios.amqp10_credit``'s: send
``messages`` unsettled transfers to ``/queue/<queue>``, all accepted, then receive them all with a
receiver granting ``credit_window`` each time its credit is used up.
"""

from __future__ import annotations

import socket
import time
from dataclasses import asdict, dataclass
from importlib.metadata import version as distribution_version
from typing import Any

from proton import Collector, Connection, Delivery, Event, Message, Transport

from testbed import tls
from testbed.scenarios import GUEST, SCENARIO_TIMEOUT, Truth, message_body

CONTAINER_ID = "amqpscope-testbed-tls"


@dataclass(frozen=True)
class Amqp10CreditTlsTruth:
    """What the client of ``amqp10_credit_tls`` did."""

    protocol: str
    client_library: str
    client_version: str
    transport: str  # "TLS 1.2" / "TLS 1.3" (the socket's), or "plain"
    cipher_suite: str | None
    container_id: str
    address: str
    queue: str
    sasl_mechanism: str
    message_body_size: int
    messages_sent: int
    sender_outcomes_accepted: int
    messages_received: int
    messages_accepted: int
    credit_window: int
    credit_grants: int
    links_attached: int


class _Engine:
    """proton's engine bound to a socket: bytes out, bytes in, events to handle."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.connection = Connection()
        self.connection.container = CONTAINER_ID
        self.connection.hostname = tls.HOSTNAME
        self.connection.user, self.connection.password = GUEST
        self.transport = Transport()
        sasl = self.transport.sasl()
        sasl.allowed_mechs("PLAIN")
        sasl.allow_insecure_mechs = True  # the TLS is this socket's, which proton does not see
        self.transport.bind(self.connection)
        self.collector = Collector()
        self.connection.collect(self.collector)

    def pump(self, timeout: float = 0.05) -> list[Event]:
        """Write what the engine has, read what the peer sent, and return the events that came of it."""
        pending = self.transport.pending()
        if pending > 0:
            data = self.transport.peek(pending)
            self.sock.sendall(data)
            self.transport.pop(len(data))
        capacity = self.transport.capacity()
        if capacity > 0:
            self.sock.settimeout(timeout)
            try:
                data = self.sock.recv(capacity)
            except TimeoutError:
                data = None
            if data == b"":
                self.transport.close_tail()
            elif data:
                self.transport.push(data)
        self.transport.tick(time.monotonic())
        events = []
        while (event := self.collector.peek()) is not None:
            events.append(event)
            self.collector.pop()
        return events

    @property
    def done(self) -> bool:
        return self.transport.pending() < 0 and self.transport.capacity() < 0


def amqp10_credit_tls(
    host: str,
    port: int,
    *,
    messages: int = 100,
    credit_window: int = 5,
    body_size: int = 256,
    queue: str = "amqpscope.credit.tls",
) -> Truth:
    """``amqp10_credit`` over the port's TLS (see the module docstring); the clients' truth."""
    if messages % credit_window:
        raise ValueError("messages must be a multiple of credit_window (no drain at the end)")
    address = f"/queue/{queue}"
    sock = tls.connect(host, port, timeout=SCENARIO_TIMEOUT)
    engine = _Engine(sock)
    counts = {"sent": 0, "accepted_by_broker": 0, "received": 0, "accepted": 0, "grants": 0, "links": 1}
    connection = engine.connection
    connection.open()
    session = connection.session()
    session.open()
    sender = session.sender("amqpscope-tls-sender")
    sender.target.address = address
    sender.open()
    receiver: Any = None
    deadline = time.monotonic() + SCENARIO_TIMEOUT
    try:
        while not engine.done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"amqp10_credit_tls: sent {counts['sent']}, received {counts['received']}")
            for event in engine.pump():
                kind, link = event.type, event.link
                # proton hands out new wrappers of the same endpoint: tell the two links by their role.
                is_sender, is_receiver = link is not None and link.is_sender, link is not None and link.is_receiver
                if kind == Event.LINK_FLOW and is_sender:
                    while sender.credit > 0 and counts["sent"] < messages:
                        counts["sent"] += 1
                        sender.delivery(str(counts["sent"]).encode())
                        message = Message(id=counts["sent"], body=message_body("1.0", counts["sent"], body_size))
                        sender.send(message.encode())
                        sender.advance()
                elif kind == Event.DELIVERY and is_sender and event.delivery.remote_state == Delivery.ACCEPTED:
                    event.delivery.settle()
                    counts["accepted_by_broker"] += 1
                    if counts["accepted_by_broker"] == messages:
                        sender.close()
                        receiver = session.receiver("amqpscope-tls-receiver")
                        receiver.source.address = address
                        receiver.open()
                        receiver.flow(credit_window)
                        counts["grants"] += 1
                        counts["links"] += 1
                elif kind == Event.DELIVERY and is_receiver and event.delivery.readable and not event.delivery.partial:
                    Message().decode(receiver.recv(event.delivery.pending))
                    receiver.advance()
                    event.delivery.update(Delivery.ACCEPTED)
                    event.delivery.settle()
                    counts["received"] += 1
                    counts["accepted"] += 1
                    if counts["received"] == messages:
                        receiver.close()
                    elif receiver.credit == 0:
                        receiver.flow(credit_window)
                        counts["grants"] += 1
                elif (
                    kind in (Event.LINK_REMOTE_CLOSE, Event.LINK_REMOTE_DETACH)
                    and is_receiver
                    and counts["received"] == messages
                ):
                    session.close()
                elif kind == Event.SESSION_REMOTE_CLOSE and counts["received"] == messages:
                    connection.close()
                elif kind == Event.TRANSPORT_ERROR:
                    condition = engine.transport.condition
                    raise RuntimeError(f"amqp10_credit_tls: transport error {condition.name if condition else ''}")
    finally:
        version = sock.version() if hasattr(sock, "version") else None
        cipher = sock.cipher()[0] if hasattr(sock, "cipher") and sock.cipher() else None
        sock.close()
    truth = Amqp10CreditTlsTruth(
        protocol="amqp-1.0",
        client_library="python-qpid-proton (engine) over Python ssl",
        client_version=distribution_version("python-qpid-proton"),
        transport=(version or "plain").replace("TLSv", "TLS "),
        cipher_suite=cipher,
        container_id=CONTAINER_ID,
        address=address,
        queue=queue,
        sasl_mechanism="PLAIN",
        message_body_size=body_size,
        messages_sent=counts["sent"],
        sender_outcomes_accepted=counts["accepted_by_broker"],
        messages_received=counts["received"],
        messages_accepted=counts["accepted"],
        credit_window=credit_window,
        credit_grants=counts["grants"],
        links_attached=counts["links"],
    )
    return asdict(truth)
