"""Hand-built AMQP bytes for the tests: frames written from the spec layouts, not by the decoders."""

from __future__ import annotations

import struct

# --- AMQP 0-9-1 (spec 4.2.3: type, channel, size, payload, 0xCE) ---------------------------------


def frame091(frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes([end])


def shortstr(s: str) -> bytes:
    raw = s.encode()
    return bytes([len(raw)]) + raw


def longstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def method091(class_id: int, method_id: int, args: bytes = b"", channel: int = 1) -> bytes:
    return frame091(1, channel, struct.pack(">HH", class_id, method_id) + args)


def basic_ack(tag: int, multiple: bool = False, channel: int = 1) -> bytes:
    return method091(60, 80, struct.pack(">QB", tag, int(multiple)), channel)


def basic_qos(prefetch_count: int, global_: bool = False, channel: int = 1) -> bytes:
    return method091(60, 10, struct.pack(">IHB", 0, prefetch_count, int(global_)), channel)


def basic_deliver(tag: int, consumer_tag: str = "ctag", channel: int = 1) -> bytes:
    args = shortstr(consumer_tag) + struct.pack(">QB", tag, 0) + shortstr("") + shortstr("q")
    return method091(60, 60, args, channel)


def content_header(body_size: int, channel: int = 1, flags: int = 0, props: bytes = b"") -> bytes:
    return frame091(2, channel, struct.pack(">HHQH", 60, 0, body_size, flags) + props)


HEARTBEAT_091 = frame091(8, 0, b"")
HEADER_091 = b"AMQP\x00\x00\x09\x01"

# --- AMQP 1.0 (transport 2.3.1: size, doff, type, channel; types part 1) -----------------------

HEADER_10 = b"AMQP\x00\x01\x00\x00"
HEADER_10_SASL = b"AMQP\x03\x01\x00\x00"


def uint(v: int) -> bytes:
    if v == 0:
        return b"\x43"
    if v < 256:
        return b"\x52" + bytes([v])
    return b"\x70" + struct.pack(">I", v)


def ulong_small(v: int) -> bytes:
    return b"\x53" + bytes([v])


def boolean(v: bool) -> bytes:
    return b"\x41" if v else b"\x42"


NULL = b"\x40"


def string(s: str) -> bytes:
    raw = s.encode()
    return (b"\xa1" + bytes([len(raw)]) if len(raw) < 256 else b"\xb1" + struct.pack(">I", len(raw))) + raw


def symbol(s: str) -> bytes:
    return b"\xa3" + bytes([len(s)]) + s.encode("ascii")


def binary(raw: bytes) -> bytes:
    return b"\xa0" + bytes([len(raw)]) + raw


def list8(*items: bytes) -> bytes:
    body = b"".join(items)
    return b"\xc0" + bytes([len(body) + 1, len(items)]) + body


def list32(*items: bytes) -> bytes:
    body = b"".join(items)
    return b"\xd0" + struct.pack(">II", len(body) + 4, len(items)) + body


def described(code: int, value: bytes) -> bytes:
    return b"\x00" + ulong_small(code) + value


def frame10(body: bytes, channel: int = 0, frame_type: int = 0, payload: bytes = b"") -> bytes:
    return struct.pack(">IBBH", 8 + len(body) + len(payload), 2, frame_type, channel) + body + payload


def flow(handle: int, delivery_count: int, link_credit: int, next_incoming_id: int = 0, incoming_window: int = 100,
         next_outgoing_id: int = 0, outgoing_window: int = 100, drain: bool = False, channel: int = 0) -> bytes:
    fields = list8(uint(next_incoming_id), uint(incoming_window), uint(next_outgoing_id), uint(outgoing_window),
                   uint(handle), uint(delivery_count), uint(link_credit), NULL, boolean(drain))
    return frame10(described(0x13, fields), channel)


def transfer(handle: int, delivery_id: int, tag: bytes, payload: bytes = b"", more: bool = False, channel: int = 0) -> bytes:
    fields = list8(uint(handle), uint(delivery_id), binary(tag), uint(0), boolean(False), boolean(more))
    return frame10(described(0x14, fields), channel, payload=payload)


def attach(name: str, handle: int, role_receiver: bool, address: str, initial_delivery_count: int | None = None,
           channel: int = 0) -> bytes:
    terminus = described(0x29 if not role_receiver else 0x28, list8(string(address)))
    source, target = (terminus, NULL) if role_receiver else (NULL, terminus)
    if role_receiver:
        source, target = terminus, described(0x29, list8(NULL))
    else:
        source, target = described(0x28, list8(NULL)), terminus
    idc = NULL if initial_delivery_count is None else uint(initial_delivery_count)
    fields = list8(string(name), uint(handle), boolean(role_receiver), NULL, NULL, source, target, NULL, NULL, idc)
    return frame10(described(0x12, fields), channel)


def sasl_init(mechanism: str, response: bytes) -> bytes:
    return frame10(described(0x41, list8(symbol(mechanism), binary(response))), frame_type=1)


EMPTY_10 = frame10(b"")
