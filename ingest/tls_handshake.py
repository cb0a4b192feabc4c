"""TLS handshake messages: what a capture shows of a session, and what its keys are found by.

Only what amqpscope records or needs is read: from the ClientHello its random (the key log's
index), the server name (SNI, RFC 6066 3) and the ALPN offer (RFC 7301 3.1); from the ServerHello
the server random, the cipher suite and the version (``supported_versions``, RFC 8446 4.2.1); from
TLS 1.3's EncryptedExtensions (once decrypted) the ALPN protocol selected. Layouts: RFC 5246 7.4 and
RFC 8446 4. Every length is checked before it is read; a malformed message raises ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

TLS12, TLS13 = "TLS 1.2", "TLS 1.3"
CLIENT_HELLO, SERVER_HELLO, NEW_SESSION_TICKET, ENCRYPTED_EXTENSIONS, FINISHED, KEY_UPDATE = 1, 2, 4, 8, 20, 24
_SERVER_NAME, _ALPN, _SUPPORTED_VERSIONS = 0, 16, 43
_VERSIONS: Final = {0x0301: "TLS 1.0", 0x0302: "TLS 1.1", 0x0303: TLS12, 0x0304: TLS13}
# RFC 8446 4.1.3: a ServerHello with this random is a HelloRetryRequest.
HELLO_RETRY_RANDOM: Final = bytes.fromhex("CF21AD74E59A6111BE1D8C021E65B891C2A211167ABB8C5E079E09E2C8A8339C")
# Handshake messages larger than this are not parsed (a certificate chain is a few KB; the 2^24
# a length allows would be memory for nothing).
MAX_MESSAGE_BYTES: Final = 1 << 18


def version_name(code: int) -> str:
    return _VERSIONS.get(code, f"0x{code:04X}")


class _Reader:
    """A bounds-checked cursor over one message."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise ValueError(f"handshake message ends at byte {len(self.data)}, {size} more needed at byte {self.pos}")
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


@dataclass
class Hello:
    """A ClientHello or ServerHello, as far as amqpscope reads it."""

    random: bytes
    version: str | None = None  # ServerHello: the version negotiated
    cipher_suite: int | None = None  # ServerHello: the suite chosen
    sni: str | None = None  # ClientHello: server_name host_name
    alpn: list[str] = field(default_factory=list)  # ClientHello: offered; ServerHello (TLS 1.2): selected
    retry: bool = False  # a HelloRetryRequest (TLS 1.3)


def _extensions(reader: _Reader) -> Iterator[tuple[int, _Reader]]:
    if not reader.left:
        return  # extensions are optional before TLS 1.3 (RFC 5246 7.4.1.2)
    block = _Reader(reader.vector(2))
    while block.left:
        kind = block.number(2)
        yield kind, _Reader(block.vector(2))


def _protocols(ext: _Reader) -> list[str]:
    names = _Reader(ext.vector(2))
    out = []
    while names.left:
        out.append(names.vector(1).decode("ascii", "replace"))
    return out


def client_hello(body: bytes) -> Hello:
    reader = _Reader(body)
    reader.take(2)  # legacy_version
    hello = Hello(reader.take(32))
    reader.vector(1)  # legacy_session_id
    reader.vector(2)  # cipher_suites
    reader.vector(1)  # legacy_compression_methods
    for kind, ext in _extensions(reader):
        if kind == _SERVER_NAME:
            names = _Reader(ext.vector(2))
            while names.left:
                name_type, name = names.number(1), names.vector(2)
                if name_type == 0:  # host_name
                    hello.sni = name.decode("ascii", "replace")
        elif kind == _ALPN:
            hello.alpn = _protocols(ext)
    return hello


def server_hello(body: bytes) -> Hello:
    reader = _Reader(body)
    legacy_version = reader.number(2)
    hello = Hello(reader.take(32), version=version_name(legacy_version))
    hello.retry = hello.random == HELLO_RETRY_RANDOM
    reader.vector(1)  # legacy_session_id_echo
    hello.cipher_suite = reader.number(2)
    reader.take(1)  # legacy_compression_method
    for kind, ext in _extensions(reader):
        if kind == _SUPPORTED_VERSIONS:
            hello.version = version_name(ext.number(2))
        elif kind == _ALPN:
            hello.alpn = _protocols(ext)
    return hello


def encrypted_extensions(body: bytes) -> list[str]:
    """The ALPN protocol the server selected, if any (RFC 8446 4.3.1)."""
    for kind, ext in _extensions(_Reader(body)):
        if kind == _ALPN:
            return _protocols(ext)
    return []


class HandshakeMessages:
    """One direction's handshake content, cut into messages (a message may span records and a
    record hold several, RFC 8446 5.1)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.broken = False  # a message too large to parse: the rest of the direction is not read

    def feed(self, content: bytes) -> list[tuple[int, bytes]]:
        """The (type, body) of each message ``content`` completes."""
        if self.broken:
            return []
        self._buf += content
        out = []
        while len(self._buf) >= 4:
            length = int.from_bytes(self._buf[1:4], "big")
            if length > MAX_MESSAGE_BYTES:
                self.broken = True
                self._buf.clear()
                break
            if len(self._buf) < 4 + length:
                break
            out.append((self._buf[0], bytes(self._buf[4 : 4 + length])))
            del self._buf[: 4 + length]
        return out
