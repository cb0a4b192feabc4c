"""AMQP 0-9-1 frames: framing (spec section 4.2.3), methods, content headers, bodies, heartbeats.

Method ids and argument types come from RabbitMQ's JSON definition (``specs.amqp091()``); field
table value types are RabbitMQ's (its ``rabbit_binary_parser``), which differ from the 0-9-1 PDF in
a few letters (``s`` is a signed short, ``l`` a signed 64-bit integer, ``x`` a byte array).
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from typing import Any, Callable

from amqpscope.ingest.amqp10_types import DecodeError
from amqpscope.ingest.specs import amqp091

PROTOCOL = "amqp-0-9-1"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

_SPEC = amqp091()
FRAME_TYPES = {
    _SPEC.constants["FRAME-METHOD"]: "method",
    _SPEC.constants["FRAME-HEADER"]: "header",
    _SPEC.constants["FRAME-BODY"]: "body",
    _SPEC.constants["FRAME-HEARTBEAT"]: "heartbeat",
}
FRAME_END = _SPEC.constants["FRAME-END"]
FRAME_HEADER_SIZE = 7  # type(1) channel(2) size(4)
# Upper bound used only to tell a plausible frame from garbage when resynchronising.
_PLAUSIBLE_MAX_SIZE = 1 << 27

_HEADER = struct.Struct(">BHI")

# Arguments that carry credentials: never decoded into a row (the mechanism is kept).
SECRET_ARGUMENTS = frozenset(
    {
        ("connection.start-ok", "response"),
        ("connection.secure-ok", "response"),
        ("connection.update-secret", "new-secret"),
    }
)


class Amqp091Format:
    """Frame boundaries of 0-9-1: a 7-byte header, the payload, and frame-end 0xCE."""

    def frame_length(self, buf: memoryview, pos: int) -> int | None:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            if buf[pos] not in FRAME_TYPES:
                raise ValueError(f"unknown 0-9-1 frame type {buf[pos]}")
            return None
        frame_type, _channel, size = _HEADER.unpack_from(buf, pos)
        if frame_type not in FRAME_TYPES:
            raise ValueError(f"unknown 0-9-1 frame type {frame_type}")
        return FRAME_HEADER_SIZE + size + 1

    def validate(self, frame: memoryview) -> str | None:
        if frame[-1] != FRAME_END:
            return f"frame-end is 0x{frame[-1]:02x}, not 0xce"
        return None

    def plausible(self, buf: memoryview, pos: int) -> bool | None:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return None
        frame_type, _channel, size = _HEADER.unpack_from(buf, pos)
        if frame_type not in FRAME_TYPES or size > _PLAUSIBLE_MAX_SIZE:
            return False
        end = pos + FRAME_HEADER_SIZE + size
        # The frame-end octet is the evidence; until it has arrived, the answer is unknown.
        return None if end >= len(buf) else buf[end] == FRAME_END


# --- primitive readers: (buf, pos) -> (value, new pos) ------------------------------------------

Reader = Callable[[memoryview, int], tuple[Any, int]]


def _need(buf: memoryview, pos: int, n: int) -> None:
    if pos + n > len(buf):
        raise DecodeError(f"value needs {n} bytes, {len(buf) - pos} left", pos)


def _struct_reader(fmt: str) -> Reader:
    s = struct.Struct(fmt)

    def read(buf: memoryview, pos: int) -> tuple[Any, int]:
        _need(buf, pos, s.size)
        return s.unpack_from(buf, pos)[0], pos + s.size

    return read


_octet = _struct_reader(">B")
_short = _struct_reader(">H")
_long = _struct_reader(">I")
_longlong = _struct_reader(">Q")


def _shortstr(buf: memoryview, pos: int) -> tuple[str, int]:
    n, pos = _octet(buf, pos)
    _need(buf, pos, n)
    return bytes(buf[pos : pos + n]).decode("utf-8", errors="replace"), pos + n


def _longstr_bytes(buf: memoryview, pos: int) -> tuple[bytes, int]:
    n, pos = _long(buf, pos)
    _need(buf, pos, n)
    return bytes(buf[pos : pos + n]), pos + n


def _longstr(buf: memoryview, pos: int) -> tuple[Any, int]:
    raw, pos = _longstr_bytes(buf, pos)
    try:
        return raw.decode("utf-8"), pos
    except UnicodeDecodeError:
        return raw, pos


def _timestamp(buf: memoryview, pos: int) -> tuple[datetime, int]:
    seconds, pos = _longlong(buf, pos)
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc), pos
    except (OverflowError, OSError, ValueError):
        raise DecodeError(f"timestamp {seconds} out of range", pos - 8) from None


def _decimal(buf: memoryview, pos: int) -> tuple[str, int]:
    scale, pos = _octet(buf, pos)
    value, pos = _struct_reader(">i")(buf, pos)
    return f"{value}e-{scale}", pos


def _table(buf: memoryview, pos: int) -> tuple[dict[str, Any], int]:
    raw_size, pos = _long(buf, pos)
    end = pos + raw_size
    if end > len(buf):
        raise DecodeError(f"field table of {raw_size} bytes overruns the frame", pos)
    table: dict[str, Any] = {}
    with buf[:end] as inner:
        while pos < end:
            key, pos = _shortstr(inner, pos)
            table[key], pos = _field_value(inner, pos)
    return table, pos


def _array(buf: memoryview, pos: int) -> tuple[list[Any], int]:
    raw_size, pos = _long(buf, pos)
    end = pos + raw_size
    if end > len(buf):
        raise DecodeError(f"field array of {raw_size} bytes overruns the frame", pos)
    items = []
    with buf[:end] as inner:
        while pos < end:
            value, pos = _field_value(inner, pos)
            items.append(value)
    return items, pos


def _boolean(buf: memoryview, pos: int) -> tuple[bool, int]:
    value, pos = _octet(buf, pos)
    return value != 0, pos


def _void(buf: memoryview, pos: int) -> tuple[None, int]:
    return None, pos


# RabbitMQ's field value types (rabbit_binary_parser:parse_field_value).
_FIELD_READERS: dict[int, Reader] = {
    ord("t"): _boolean,
    ord("b"): _struct_reader(">b"),
    ord("B"): _octet,
    ord("s"): _struct_reader(">h"),
    ord("u"): _short,
    ord("I"): _struct_reader(">i"),
    ord("i"): _long,
    ord("l"): _struct_reader(">q"),
    ord("f"): _struct_reader(">f"),
    ord("d"): _struct_reader(">d"),
    ord("D"): _decimal,
    ord("S"): _longstr,
    ord("x"): _longstr_bytes,
    ord("A"): _array,
    ord("T"): _timestamp,
    ord("F"): _table,
    ord("V"): _void,
}


def _field_value(buf: memoryview, pos: int) -> tuple[Any, int]:
    kind, pos = _octet(buf, pos)
    reader = _FIELD_READERS.get(kind)
    if reader is None:
        raise DecodeError(f"unknown field value type {chr(kind)!r}", pos - 1)
    return reader(buf, pos)


# Domain primitive types of the JSON spec to readers; "bit" is packed and handled by the caller.
_ARGUMENT_READERS: dict[str, Reader] = {
    "octet": _octet,
    "short": _short,
    "long": _long,
    "longlong": _longlong,
    "shortstr": _shortstr,
    "longstr": _longstr,
    "table": _table,
    "timestamp": _timestamp,
}


def _skip_longstr(buf: memoryview, pos: int) -> tuple[None, int]:
    n, pos = _long(buf, pos)
    _need(buf, pos, n)
    return None, pos + n


def decode_arguments(buf: memoryview, pos: int, arguments: tuple[tuple[str, str], ...], method: str) -> dict[str, Any]:
    """Decode a method's arguments in spec order; consecutive bits share octets (spec 4.2.5.2)."""
    values: dict[str, Any] = {}
    bit_octet, bit_index = 0, 8
    for name, kind in arguments:
        if kind == "bit":
            if bit_index == 8:
                bit_octet, pos = _octet(buf, pos)
                bit_index = 0
            values[name] = bool(bit_octet >> bit_index & 1)
            bit_index += 1
            continue
        bit_index = 8
        if (method, name) in SECRET_ARGUMENTS:
            _, pos = _skip_longstr(buf, pos)
            continue
        values[name], pos = _ARGUMENT_READERS[kind](buf, pos)
    return values


def decode_properties(buf: memoryview, pos: int) -> dict[str, Any]:
    """Basic content properties: 15-bit flag words (bit 0 = another word follows), then values."""
    flags: list[bool] = []
    while True:
        word, pos = _short(buf, pos)
        flags.extend(bool(word >> (15 - i) & 1) for i in range(15))
        if not word & 1:
            break
    values: dict[str, Any] = {}
    for present, (name, kind) in zip(flags, _SPEC.basic_properties):
        if present:
            values[name], pos = _ARGUMENT_READERS[kind](buf, pos)
    return values


def decode_frame(data: bytes) -> dict[str, Any]:
    """Decode a complete 0-9-1 frame into its kind and named arguments (spec names, unsnaked)."""
    frame_type, channel, size = _HEADER.unpack_from(data, 0)
    kind = FRAME_TYPES[frame_type]
    decoded: dict[str, Any] = {"frame_type": kind, "channel": channel, "arguments": {}}
    with memoryview(data)[FRAME_HEADER_SIZE : FRAME_HEADER_SIZE + size] as payload:
        if kind == "method":
            class_id, method_id = struct.unpack_from(">HH", payload, 0) if size >= 4 else (None, None)
            spec = _SPEC.methods.get((class_id, method_id))
            if spec is None:
                raise DecodeError(f"unknown method {class_id}.{method_id}", FRAME_HEADER_SIZE)
            decoded.update(class_id=class_id, method_id=method_id, method=spec.name)
            decoded["arguments"] = _offset(decode_arguments, payload, 4, spec.arguments, spec.name)
        elif kind == "header":
            _need(payload, 0, 14)
            class_id, _weight, body_size = struct.unpack_from(">HHQ", payload, 0)
            decoded.update(class_id=class_id, method=f"{_SPEC.class_names.get(class_id, class_id)}.header")
            decoded["arguments"] = {"body-size": body_size, **_offset(decode_properties, payload, 12)}
        elif kind == "body":
            decoded["arguments"] = {"body-length": size}
        elif size:
            raise DecodeError(f"heartbeat frame with a {size}-byte payload", FRAME_HEADER_SIZE)
    return decoded


def _offset(decode: Callable[..., Any], payload: memoryview, pos: int, *args: Any) -> Any:
    """Run a payload decoder, turning its payload-relative error offsets into frame offsets."""
    try:
        return decode(payload, pos, *args)
    except DecodeError as exc:
        raise DecodeError(exc.reason, exc.offset + FRAME_HEADER_SIZE) from None
