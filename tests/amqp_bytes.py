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


def field_value(letter: str, value) -> bytes:
    """A field-table value (RabbitMQ's letters) for the few types the tests nest."""
    if letter == "F":
        return b"F" + table(value)
    if letter == "A":
        items = b"".join(field_value(*item) for item in value)
        return b"A" + struct.pack(">I", len(items)) + items
    if letter == "S":
        return b"S" + longstr(value.encode())
    if letter == "I":
        return b"I" + struct.pack(">i", value)
    if letter == "t":
        return b"t" + bytes([int(value)])
    raise ValueError(letter)


def table(fields: dict) -> bytes:
    """A field table (0-9-1 spec 4.2.5.5): size, then name + typed value pairs; values as (letter, value)."""
    body = b"".join(shortstr(name) + field_value(*typed) for name, typed in fields.items())
    return struct.pack(">I", len(body)) + body


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


def map8(*items: bytes) -> bytes:
    body = b"".join(items)
    return b"\xc1" + bytes([len(body) + 1, len(items)]) + body


def array8_symbols(*symbols: str) -> bytes:
    """An array8 of sym8 (one constructor shared by the elements)."""
    body = b"\xa3" + b"".join(bytes([len(s)]) + s.encode("ascii") for s in symbols)
    return b"\xe0" + bytes([len(body) + 1, len(symbols)]) + body


def described(code: int, value: bytes) -> bytes:
    return b"\x00" + ulong_small(code) + value


def frame10(body: bytes, channel: int = 0, frame_type: int = 0, payload: bytes = b"") -> bytes:
    return struct.pack(">IBBH", 8 + len(body) + len(payload), 2, frame_type, channel) + body + payload


def flow(
    handle: int,
    delivery_count: int,
    link_credit: int,
    next_incoming_id: int = 0,
    incoming_window: int = 100,
    next_outgoing_id: int = 0,
    outgoing_window: int = 100,
    drain: bool = False,
    channel: int = 0,
) -> bytes:
    fields = list8(
        uint(next_incoming_id),
        uint(incoming_window),
        uint(next_outgoing_id),
        uint(outgoing_window),
        uint(handle),
        uint(delivery_count),
        uint(link_credit),
        NULL,
        boolean(drain),
    )
    return frame10(described(0x13, fields), channel)


def transfer(
    handle: int, delivery_id: int, tag: bytes, payload: bytes = b"", more: bool = False, channel: int = 0
) -> bytes:
    fields = list8(uint(handle), uint(delivery_id), binary(tag), uint(0), boolean(False), boolean(more))
    return frame10(described(0x14, fields), channel, payload=payload)


def attach(
    name: str,
    handle: int,
    role_receiver: bool,
    address: str,
    initial_delivery_count: int | None = None,
    channel: int = 0,
) -> bytes:
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


def transfer_aborted(handle: int, channel: int = 0) -> bytes:
    """A continuation transfer with aborted=true (transport 2.6.14): fields up to aborted."""
    fields = list8(uint(handle), NULL, NULL, NULL, NULL, boolean(False), NULL, NULL, NULL, boolean(True))
    return frame10(described(0x14, fields), channel)


def disposition(
    receiver: bool, first: int, last: int | None = None, settled: bool = False, state_code: int = 0x24, channel: int = 0
) -> bytes:
    """A disposition (2.7.6) with an outcome, accepted by default (messaging 3.4.2: 0x24)."""
    fields = list8(
        boolean(receiver),
        uint(first),
        NULL if last is None else uint(last),
        boolean(settled),
        described(state_code, list8()),
    )
    return frame10(described(0x15, fields), channel)
