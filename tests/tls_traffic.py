"""TLS conversations made in memory by OpenSSL (Python's ``ssl`` over memory BIOs), written as captures.

A real client and server context (``testbed.tls``: a throwaway CA, the client writing its key
log) run the handshake and carry a plaintext conversation: by default the AMQP bytes of a bundled
plain sample, write for write as its segments carried them, so that the frames they should decode
to are those of the plain sample. What went over the wire is written as a pcap (Ethernet, IPv4,
TCP with a handshake, checksums set), which tshark reads as it reads any capture.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from amqpscope.ingest.packets import TCP_SYN, parse_tcp
from amqpscope.ingest.pcap import read_records
from amqpscope.ingest.tcp import Data, DirectionStream
from testbed.processes import free_port
from testbed.tls import HOSTNAME, Certificates

Transcript = list[tuple[str, bytes]]  # (direction, bytes on the wire), in the order they were sent
CLIENT = ("10.1.0.1", 40001)
SERVER = ("10.1.0.2", 5671)


@dataclass
class Session:
    transcript: Transcript
    received: dict[str, bytes]  # plaintext each side read, by the direction it travelled


def conversation(sample: Path, server_port: int = 5672, limit: int | None = None) -> list[tuple[str, bytes]]:
    """The first connection of a plain capture as (direction, payload) in packet order."""
    streams: dict[str, DirectionStream] = {"c2s": DirectionStream(), "s2c": DirectionStream()}
    out: list[tuple[str, bytes]] = []
    client: tuple[str, int] | None = None
    for record in read_records(sample):
        seg = parse_tcp(record.linktype, record.data, record.wirelen)
        if seg is None or server_port not in (seg.sport, seg.dport):
            continue
        peer = (seg.src, seg.sport) if seg.dport == server_port else (seg.dst, seg.dport)
        client = client or peer
        if peer != client:
            continue
        direction = "c2s" if seg.dport == server_port else "s2c"
        if seg.flags & TCP_SYN:
            streams[direction].syn(seg.seq)
        for event in streams[direction].segment(seg.seq, seg.payload, record.number, record.ts_us):
            if isinstance(event, Data):
                out.append((direction, event.payload))
        if limit is not None and len(out) >= limit:
            break
    return out


def memory_session(
    client: ssl.SSLContext, server: ssl.SSLContext, steps: Iterable[tuple[str, bytes]], key_update_every: int = 0
) -> Session:
    """A TLS session between ``client`` and ``server`` carrying ``steps`` (each one write by the
    side it leaves), and what crossed the wire."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    ends = {
        "c2s": client.wrap_bio(c_in, c_out, server_hostname=HOSTNAME),
        "s2c": server.wrap_bio(s_in, s_out, server_side=True),
    }
    transcript: Transcript = []
    received = {"c2s": bytearray(), "s2c": bytearray()}

    def pump() -> None:
        moved = True
        while moved:
            moved = False
            for direction, (outgoing, incoming) in (("c2s", (c_out, s_in)), ("s2c", (s_out, c_in))):
                data = outgoing.read()
                if data:
                    transcript.append((direction, data))
                    incoming.write(data)
                    moved = True

    def drain() -> None:
        for direction, reader in (("c2s", ends["s2c"]), ("s2c", ends["c2s"])):
            while True:
                try:
                    data = reader.read(1 << 16)
                except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
                    break
                if not data:
                    break
                received[direction] += data
            pump()

    done = set()
    for _ in range(20):
        for name, end in ends.items():
            if name in done:
                continue
            try:
                end.do_handshake()
                done.add(name)
            except ssl.SSLWantReadError:
                pass
        pump()
        if len(done) == 2:
            break
    assert len(done) == 2, "handshake did not complete"
    for direction, data in steps:
        ends[direction].write(data)
        pump()
        drain()
    return Session(transcript, {d: bytes(v) for d, v in received.items()})


def write_capture(
    path: Path,
    transcript: Sequence[tuple[str, bytes]],
    mss: int = 1448,
    client: tuple[str, int] = CLIENT,
    server: tuple[str, int] = SERVER,
    drop: Iterable[int] = (),
) -> Path:
    """``transcript`` as a pcap of one TCP connection (handshake, data cut at ``mss``, FIN). Packets
    whose number is in ``drop`` are left out (a capture that lost them)."""
    dropped = set(drop)
    seq = {"c2s": 1000, "s2c": 900_000}
    ts = 1_700_000_000.0
    made = []

    def add(direction: str, flags: str, payload: bytes = b"") -> None:
        nonlocal ts
        src, dst = (client, server) if direction == "c2s" else (server, client)
        other = "s2c" if direction == "c2s" else "c2s"
        tcp = TCP(
            sport=src[1],
            dport=dst[1],
            flags=flags,
            seq=seq[direction],
            ack=seq[other] if "A" in flags else 0,
            window=65535,
        )
        packet = Ether() / IP(src=src[0], dst=dst[0]) / tcp / (Raw(payload) if payload else b"")
        ts += 0.0005
        packet.time = ts
        seq[direction] = (seq[direction] + len(payload) + (1 if "S" in flags or "F" in flags else 0)) % (1 << 32)
        made.append(packet)

    add("c2s", "S")
    add("s2c", "SA")
    add("c2s", "A")
    for direction, data in transcript:
        for start in range(0, len(data), mss):
            add(direction, "PA", data[start : start + mss])
    add("c2s", "FA")
    add("s2c", "FA")
    wrpcap(str(path), [p for number, p in enumerate(made, 1) if number not in dropped])
    return path


def tls_sample(
    folder: Path,
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
    steps: list[tuple[str, bytes]],
    name: str = "tls.pcap",
    **capture_options: object,
) -> tuple[Path, Session]:
    session = memory_session(*contexts, steps)
    return write_capture(folder / name, session.transcript, **capture_options), session  # type: ignore[arg-type]


# -- sessions between OpenSSL's own s_client and s_server, recorded by a relay ----------------------


def _relay(listener: socket.socket, upstream: tuple[str, int], transcript: Transcript, lock: threading.Lock) -> None:
    """Accept one connection and relay it to ``upstream``, recording every chunk in order."""
    client, _ = listener.accept()
    server = socket.create_connection(upstream)

    def pipe(src: socket.socket, dst: socket.socket, direction: str) -> None:
        while True:
            try:
                data = src.recv(1 << 16)
            except OSError:
                data = b""
            with lock:
                if data:
                    transcript.append((direction, data))
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)

    threads = [
        threading.Thread(target=pipe, args=(client, server, "c2s")),
        threading.Thread(target=pipe, args=(server, client, "s2c")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    client.close()
    server.close()


def openssl_session(
    certificates: Certificates, keylog: Path, ciphersuite: str, client_input: Sequence[bytes | float]
) -> Transcript:
    """TLS 1.3 between ``openssl s_client`` (logging its keys) and ``openssl s_server`` with only
    ``ciphersuite``; ``client_input`` is written to the client's stdin in order (a float: a pause in
    seconds; the line ``b"k\\n"`` makes s_client send a KeyUpdate, RFC 8446 4.6.3)."""
    transcript: Transcript = []
    lock = threading.Lock()
    server_port, relay_port = free_port(), free_port()
    server = subprocess.Popen(
        [
            "openssl",
            "s_server",
            "-accept",
            f"127.0.0.1:{server_port}",
            "-cert",
            str(certificates.server_certificate),
            "-key",
            str(certificates.server_key),
            "-tls1_3",
            "-ciphersuites",
            ciphersuite,
            "-naccept",
            "1",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    client = None
    try:
        assert server.stdout is not None
        while b"ACCEPT" not in server.stdout.readline():  # listening (a probe would take its one accept)
            assert server.poll() is None, "openssl s_server did not start"
        threading.Thread(target=server.stdout.read, daemon=True).start()  # keep its pipe drained
        with socket.create_server(("127.0.0.1", relay_port)) as listener:
            relay = threading.Thread(target=_relay, args=(listener, ("127.0.0.1", server_port), transcript, lock))
            relay.start()
            client = subprocess.Popen(
                [
                    "openssl",
                    "s_client",
                    "-connect",
                    f"127.0.0.1:{relay_port}",
                    "-tls1_3",
                    "-keylogfile",
                    str(keylog),
                    "-servername",
                    HOSTNAME,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            assert client.stdin is not None
            time.sleep(0.5)
            for item in client_input:
                if isinstance(item, float):
                    time.sleep(item)
                else:
                    client.stdin.write(item)
                    client.stdin.flush()
            time.sleep(0.5)
            client.stdin.close()
            client.wait(10)
            relay.join(15)
    finally:
        for process in (client, server):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(5)
    return transcript
