"""AMQP 0-9-1 and 1.0 as a Scapy layer on TCP port 5672, for looking at captures interactively.

The layer does no decoding of its own: each ``AMQP`` layer is one frame (or protocol header)
decoded by ``ingest.amqp091`` / ``ingest.amqp10``, the same functions that fill the frames table.
With Scapy's ``TCPSession`` the frames are reassembled across segments (``tcp_reassemble`` waits
until a whole frame is there) and each direction is decoded in order by
``ingest.messages.stream_decoder``, so a multi-frame AMQP 1.0 delivery shows its message on the
frame that completes it::

    >>> from scapy.all import sniff
    >>> from scapy.sessions import TCPSession
    >>> import amqpscope.ingest.scapy_layers  # binds the layer to TCP 5672
    >>> for p in sniff(offline="samples/mixed.pcapng", session=TCPSession):
    ...     if AMQP in p: p[AMQP].show()

Without a session (``rdpcap``) each segment is dissected alone, frame by frame, with the
stateless decoders; a frame cut by a segment boundary is left as ``Raw``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from scapy.fields import Field
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet, Padding, Raw, bind_layers

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.amqp10_types import DecodeError
from amqpscope.ingest.framing import PROTOCOL_HEADER_SIZE
from amqpscope.ingest.messages import StreamDecoder, stream_decoder
from amqpscope.ingest.rows import text

AMQP_PORT = 5672
_FORMATS = {amqp091.PROTOCOL: amqp091.Amqp091Format(), amqp10.PROTOCOL: amqp10.Amqp10Format()}
_STATELESS = {amqp091.PROTOCOL: amqp091.decode_frame, amqp10.PROTOCOL: amqp10.decode_frame}
_HEADERS = {amqp091.PROTOCOL_HEADER: amqp091.PROTOCOL, **{h: amqp10.PROTOCOL for h in amqp10.PROTOCOL_HEADERS}}
# A protocol header's name, as the frames table has it (1.0: which layer it starts).
_HEADER_NAMES = {amqp091.PROTOCOL_HEADER: amqp091.PROTOCOL, **amqp10.PROTOCOL_HEADERS}


class _Stream:
    """What the frames of one direction are dissected with: protocol, decoder, where a tail goes."""

    def __init__(self, protocol: str | None, decoder: StreamDecoder | None, tail: type[Packet]) -> None:
        self.protocol = protocol
        self.decoder = decoder
        self.tail = tail


_STREAM: contextvars.ContextVar[_Stream | None] = contextvars.ContextVar("amqpscope_amqp_stream", default=None)


@contextmanager
def _dissecting(stream: _Stream) -> Iterator[None]:
    token = _STREAM.set(stream)
    try:
        yield
    finally:
        _STREAM.reset(token)


class _TextField(Field[Any, Any]):
    """A decoded value shown as amqpscope renders it in the frames table (never built back)."""

    def __init__(self, name: str) -> None:
        super().__init__(name, None)

    def i2repr(self, pkt: Packet | None, x: Any) -> str:
        if isinstance(x, dict):
            return ", ".join(f"{k}={text(v)}" for k, v in x.items()) or "{}"
        return "" if x is None else str(text(x))

    def addfield(self, pkt: Packet, s: bytes, val: Any) -> bytes:
        return s  # the frame's bytes come from the capture (raw_packet_cache), not from the fields

    def getfield(self, pkt: Packet, s: bytes) -> tuple[bytes, Any]:
        return s, None


def detect(data: bytes) -> str | None:
    """The protocol of a stream from its first bytes: a protocol header, else frame shapes."""
    if data[:4] == b"AMQP":
        return _HEADERS.get(bytes(data[:8]))
    view = memoryview(data)
    for protocol, fmt in _FORMATS.items():
        if fmt.plausible(view, 0):
            return protocol
    return None


def frame_length(protocol: str, data: bytes) -> int | None:
    """Bytes of the frame (or protocol header) at the start of ``data``; None until known."""
    if data[:4] == b"AMQP"[: len(data[:4])]:
        return PROTOCOL_HEADER_SIZE if len(data) >= 4 else None
    try:
        return _FORMATS[protocol].frame_length(memoryview(data), 0)
    except ValueError:
        return len(data)  # not a frame: dissected as one undecodable block


class AMQP(Packet):
    """One AMQP frame or protocol header, decoded by amqpscope's decoders."""

    name = "AMQP"
    fields_desc = [
        _TextField("protocol"),
        _TextField("frame_type"),
        _TextField("channel"),
        _TextField("method"),
        _TextField("arguments"),
        _TextField("message"),  # 1.0: the delivery this transfer completed
        _TextField("error"),  # why the frame did not decode, with the byte offset
    ]

    def do_dissect(self, s: bytes) -> bytes:
        stream = _STREAM.get()
        protocol = stream.protocol if stream is not None and stream.protocol else detect(s)
        self.fields.update(protocol=protocol)
        if s[:4] == b"AMQP":
            self.fields.update(frame_type="protocol-header", method=_HEADER_NAMES.get(bytes(s[:8]), s[:8].hex()))
            return s[PROTOCOL_HEADER_SIZE:]
        if protocol is None:
            self.fields.update(error="not an AMQP frame")
            return b""
        size = frame_length(protocol, s)
        if size is None or size > len(s):
            self.fields.update(error=f"incomplete frame: {len(s)} of {size or '?'} bytes")
            return b""
        decode = stream.decoder if stream is not None and stream.decoder else _STATELESS[protocol]
        try:
            decoded = decode(bytes(s[:size]))
        except (DecodeError, ValueError, KeyError, IndexError) as exc:
            self.fields.update(error=f"{getattr(exc, 'reason', exc)} (byte {getattr(exc, 'offset', 0)})")
            return s[size:]
        message = decoded.get("message")
        if message is not None:
            sections = message["sections"] or []
            message = {
                "frames": message["frames"],
                "size": message["size"],
                "aborted": message["aborted"],
                "error": message["error"],
                **{f"{x.name}.size": x.size for x in sections},
                **{
                    f"properties.{k}": v
                    for x in sections
                    if x.name == "properties"
                    for k, v in x.value.items()
                    if v is not None
                },
            }
        self.fields.update(
            frame_type=decoded["frame_type"],
            channel=decoded.get("channel"),
            method=decoded.get("method"),
            arguments=decoded["arguments"],
            message=message,
        )
        return s[size:]

    def guess_payload_class(self, payload: bytes) -> type[Packet]:
        stream = _STREAM.get()
        protocol = self.fields.get("protocol")
        if protocol and payload:
            size = frame_length(protocol, payload)
            if size is not None and size <= len(payload):
                return AMQP
        return stream.tail if stream is not None else Raw

    def mysummary(self) -> str:
        return self.sprintf("AMQP %AMQP.method% ") if self.method else self.sprintf("AMQP %AMQP.frame_type%")

    @classmethod
    def tcp_reassemble(cls, data: bytes, metadata: dict[str, Any], session: dict[str, Any]) -> Packet | None:
        """Scapy's TCPSession hook: a packet once at least one whole frame is there, else None."""
        state = session.setdefault("amqpscope", {"protocol": None, "decoders": {}})
        if state["protocol"] is None:
            state["protocol"] = detect(data)
            if state["protocol"] is None:
                return None if len(data) < 8 else cls(data)
        protocol = state["protocol"]
        size = frame_length(protocol, data)
        if size is None or size > len(data):
            return None
        original = metadata.get("original")
        network = original.getlayer(IP) or original.getlayer(IPv6) if original is not None else None
        key = (network.src, original[TCP].sport) if network is not None else None
        decoder = state["decoders"].get(key)
        if decoder is None:
            decoder = state["decoders"][key] = stream_decoder(protocol)
        with _dissecting(_Stream(protocol, decoder, Padding)):
            return cls(data)


def bind(port: int = AMQP_PORT) -> None:
    """Dissect TCP traffic to and from ``port`` as AMQP."""
    bind_layers(TCP, AMQP, sport=port)
    bind_layers(TCP, AMQP, dport=port)


bind()

__all__ = ["AMQP", "AMQP_PORT", "bind", "detect"]
