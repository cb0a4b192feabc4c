"""The TLS stage of one connection, between TCP reassembly and AMQP framing.

``ingest.capture.CaptureDecoder`` hands a TLS connection's reassembled bytes to its ``TlsStage``
and gets back, per direction and in stream order, what to do with the bytes of the layer above:
``Plain`` (decrypted bytes for the frame splitter), ``Problem`` (a quarantine row), ``Break`` (the
frame splitter drops the frame it holds), and once, ``Decided``: the AMQP version the decrypted
bytes carry (the client's protocol header, else frame shapes, as for plain traffic), before any
``Plain``. Decrypted bytes that are not AMQP are quarantined (``tls.not_amqp``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from amqpscope.ingest.reasons import TLS_NOT_AMQP
from amqpscope.ingest.tcp import Data, Gap
from amqpscope.ingest.tls_keylog import KeyLog
from amqpscope.ingest.tls_stream import C2S, S2C, Break, Item, Output, Plain, Problem, TlsSession, reason

# (client's first decrypted bytes, server's, no more will come) -> (decided, protocol or None, inferred)
Classify = Callable[[bytes, bytes, bool], tuple[bool, str | None, bool]]


class Decided(NamedTuple):
    protocol: str | None  # None: not AMQP
    inferred: bool  # from frame shapes: no protocol header in the decrypted bytes


Routed = list[tuple[str, Item | Decided]]


class TlsStage:
    def __init__(self, keys: KeyLog | None, classify: Classify) -> None:
        self.session = TlsSession(keys)
        self._classify = classify
        self._pending: list[tuple[str, Item]] = []  # decrypted bytes (and breaks) before the version is known
        self._decided: Decided | None = None

    def event(self, direction: str, event: Data | Gap) -> Routed:
        return self._route(
            self.session.gap(direction, event) if isinstance(event, Gap) else self.session.feed(direction, event)
        )

    def finish(self, packet_number: int) -> Routed:
        out: Routed = []
        for direction in (C2S, S2C):
            out += self._route(self.session.finish(direction, packet_number))
        if self._decided is None and self._pending:
            self._decide(out, final=True)
        return out

    def _route(self, items: Output) -> Routed:
        out: Routed = []
        for direction, item in items:
            if isinstance(item, Problem):
                out.append((direction, item))
            elif self._decided is None:
                if isinstance(item, Break):
                    # Only a break after decrypted bytes changes what the splitter will get (and keeping
                    # none otherwise bounds what is held: a session without keys breaks every record).
                    if self._last_is_plain(direction):
                        self._pending.append((direction, item))
                    continue
                self._pending.append((direction, item))
                self._decide(out, final=False)
            else:
                out.append((direction, self._above(item)))
        return out

    def _decide(self, out: Routed, final: bool) -> None:
        decided, protocol, inferred = self._classify(self._head(C2S), self._head(S2C), final)
        if not decided:
            return
        self._decided = Decided(protocol, inferred)
        out.append((C2S, self._decided))
        pending, self._pending = self._pending, []
        out.extend((direction, self._above(item)) for direction, item in pending)

    def _above(self, item: Item) -> Item:
        """What the layer above gets of decrypted bytes: themselves, or their quarantine when not AMQP."""
        assert self._decided is not None
        if isinstance(item, Plain) and self._decided.protocol is None:
            return Problem(item.offset, len(item.payload), item.packet_number, reason(TLS_NOT_AMQP), TLS_NOT_AMQP)
        return item

    def _last_is_plain(self, direction: str) -> bool:
        for d, item in reversed(self._pending):
            if d == direction:
                return isinstance(item, Plain)
        return False

    def _head(self, direction: str) -> bytes:
        """A direction's first decrypted bytes, up to a break."""
        parts: list[bytes] = []
        for d, item in self._pending:
            if d != direction:
                continue
            if not isinstance(item, Plain):
                break
            parts.append(item.payload)
        return b"".join(parts)

    def columns(self) -> dict[str, object]:
        """The connections row's TLS columns (``schemas.frames.TLS_CONNECTION_FIELDS``)."""
        session = self.session
        return {
            "tls_version": session.version,
            "tls_cipher_suite": session.suite_name(),
            "tls_sni": session.sni,
            "tls_alpn": session.alpn,
            "tls_alpn_offered": session.alpn_offered or None,
            "tls_status": session.outcome(),
            "c2s_tls_bytes": session.tls_bytes(C2S),
            "s2c_tls_bytes": session.tls_bytes(S2C),
        }
