"""AMQP 0-9-1 frames: framing (spec section 4.2.3), methods, content headers, bodies, heartbeats.

Method ids and argument types come from RabbitMQ's JSON definition (``specs.amqp091()``): at import
each method's argument list is compiled into one Python function (``method_decoder``), so the
fixed-width arguments and packed bits of a method are read with a single ``struct`` call. Field
table value types are RabbitMQ's (its ``rabbit_binary_parser``), which differ from the 0-9-1 PDF in
a few letters (``s`` is a signed short, ``l`` a signed 64-bit integer, ``x`` a byte array).

Every decoder reads the whole frame (``data``) between ``pos`` and ``end`` and reports errors as a
``DecodeError`` with the offset from the start of the frame.
"""

from __future__ import annotations

import struct
from datetime import datetime, timezone
from decimal import Decimal
from functools import cache
from typing import Any, Callable

from amqpscope.ingest.amqp10_types import DecodeError
from amqpscope.ingest.framing import RawFrame, new_frame
from amqpscope.ingest.specs import MethodSpec, amqp091

PROTOCOL = "amqp-0-9-1"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"

_SPEC = amqp091()
FRAME_TYPES = {
    _SPEC.constants["FRAME-METHOD"]: "method",
    _SPEC.constants["FRAME-HEADER"]: "header",
    _SPEC.constants["FRAME-BODY"]: "body",
    _SPEC.constants["FRAME-HEARTBEAT"]: "heartbeat",
}
FRAME_METHOD = _SPEC.constants["FRAME-METHOD"]
FRAME_HEADER = _SPEC.constants["FRAME-HEADER"]
FRAME_BODY = _SPEC.constants["FRAME-BODY"]
FRAME_END = _SPEC.constants["FRAME-END"]
FRAME_HEADER_SIZE = 7  # type(1) channel(2) size(4)
# Upper bound used only to tell a plausible frame from garbage when resynchronising.
_PLAUSIBLE_MAX_SIZE = 1 << 27

_HEADER = struct.Struct(">BHI")
_unpack_size = struct.Struct(">I").unpack_from
_CONTENT_HEADER = struct.Struct(">HHQ")  # class-id, weight, body-size (spec 4.2.6.1)

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

    def validate(self, buf: bytes, pos: int, length: int) -> str | None:
        end = buf[pos + length - 1]
        return None if end == FRAME_END else f"frame-end is 0x{end:02x}, not 0xce"

    def plausible(self, buf: memoryview, pos: int) -> bool | None:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return None
        frame_type, _channel, size = _HEADER.unpack_from(buf, pos)
        if frame_type not in FRAME_TYPES or size > _PLAUSIBLE_MAX_SIZE:
            return False
        end = pos + FRAME_HEADER_SIZE + size
        # The frame-end octet is the evidence; until it has arrived, the answer is unknown.
        return None if end >= len(buf) else buf[end] == FRAME_END

    def take_frames(self, buf: bytes, pos: int, end: int, base: int, packet_number: int, ts_us: int,
                    out: list) -> int:
        frame_types = FRAME_TYPES  # a protocol header's "A" (0x41) is no frame type: it stops here
        append = out.append
        while end - pos >= FRAME_HEADER_SIZE and buf[pos] in frame_types:
            stop = pos + FRAME_HEADER_SIZE + 1 + _unpack_size(buf, pos + 3)[0]
            if stop > end or buf[stop - 1] != FRAME_END:
                break
            append(new_frame(RawFrame, (base + pos, buf[pos:stop], packet_number, ts_us, False)))
            pos = stop
        return pos


# --- primitive readers: (data, pos, end) -> (value, new pos) ------------------------------------

Reader = Callable[[bytes, int, int], tuple[Any, int]]


def short_of(n: int, pos: int, end: int) -> DecodeError:
    """The error for a value of ``n`` bytes at ``pos`` that the frame (ending at ``end``) cannot hold."""
    return DecodeError(f"value needs {n} bytes, {max(end - pos, 0)} left", pos)


def _struct_reader(fmt: str) -> Reader:
    s = struct.Struct(fmt)
    size, unpack = s.size, s.unpack_from

    def read(data: bytes, pos: int, end: int) -> tuple[Any, int]:
        if pos + size > end:
            raise short_of(size, pos, end)
        return unpack(data, pos)[0], pos + size

    return read


_octet = _struct_reader(">B")
_long = _struct_reader(">I")
_unpack_long = struct.Struct(">I").unpack_from


def _shortstr(data: bytes, pos: int, end: int) -> tuple[str, int]:
    if pos >= end:
        raise short_of(1, pos, end)
    stop = pos + 1 + data[pos]
    if stop > end:
        raise short_of(data[pos], pos + 1, end)
    return data[pos + 1 : stop].decode("utf-8", "replace"), stop


def _longstr_bytes(data: bytes, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 4 > end:
        raise short_of(4, pos, end)
    stop = pos + 4 + _unpack_long(data, pos)[0]
    if stop > end:
        raise short_of(stop - pos - 4, pos + 4, end)
    return data[pos + 4 : stop], stop


def _longstr(data: bytes, pos: int, end: int) -> tuple[Any, int]:
    """A long string: text when it is UTF-8, else its bytes (e.g. a binary consumer argument)."""
    raw, pos = _longstr_bytes(data, pos, end)
    try:
        return raw.decode("utf-8"), pos
    except UnicodeDecodeError:
        return raw, pos


def _skip_longstr(data: bytes, pos: int, end: int) -> tuple[None, int]:
    _raw, pos = _longstr_bytes(data, pos, end)
    return None, pos


def timestamp(seconds: int, offset: int) -> datetime:
    """A 0-9-1 timestamp (POSIX seconds, spec 4.2.5.4) as an aware datetime."""
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        raise DecodeError(f"timestamp {seconds} out of range", offset) from None


def _timestamp(data: bytes, pos: int, end: int) -> tuple[datetime, int]:
    seconds, stop = _longlong(data, pos, end)
    return timestamp(seconds, pos), stop


_longlong = _struct_reader(">Q")
_decimal_parts = struct.Struct(">Bi")


def _decimal(data: bytes, pos: int, end: int) -> tuple[Decimal, int]:
    """A decimal: scale octet then a signed 32-bit value, value * 10^-scale."""
    if pos + 5 > end:
        raise short_of(5, pos, end)
    scale, value = _decimal_parts.unpack_from(data, pos)
    return Decimal(value).scaleb(-scale), pos + 5


def _table(data: bytes, pos: int, end: int) -> tuple[dict[str, Any], int]:
    """A field table (spec 4.2.5.5): size, then (shortstr name, typed value) pairs."""
    if pos + 4 > end:
        raise short_of(4, pos, end)
    stop = pos + 4 + _unpack_long(data, pos)[0]
    if stop > end:
        raise DecodeError(f"field table of {stop - pos - 4} bytes overruns the frame", pos)
    pos += 4
    table: dict[str, Any] = {}
    while pos < stop:
        key, pos = _shortstr(data, pos, stop)
        table[key], pos = _field_value(data, pos, stop)
    return table, pos


def _array(data: bytes, pos: int, end: int) -> tuple[list[Any], int]:
    if pos + 4 > end:
        raise short_of(4, pos, end)
    stop = pos + 4 + _unpack_long(data, pos)[0]
    if stop > end:
        raise DecodeError(f"field array of {stop - pos - 4} bytes overruns the frame", pos)
    pos += 4
    items = []
    while pos < stop:
        value, pos = _field_value(data, pos, stop)
        items.append(value)
    return items, pos


def _boolean(data: bytes, pos: int, end: int) -> tuple[bool, int]:
    value, pos = _octet(data, pos, end)
    return value != 0, pos


def _void(data: bytes, pos: int, end: int) -> tuple[None, int]:
    return None, pos


# RabbitMQ's field value types (rabbit_binary_parser:parse_field_value).
FIELD_VALUE_READERS: dict[int, Reader] = {
    ord("t"): _boolean,
    ord("b"): _struct_reader(">b"),
    ord("B"): _octet,
    ord("s"): _struct_reader(">h"),
    ord("u"): _struct_reader(">H"),
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


def _field_value(data: bytes, pos: int, end: int) -> tuple[Any, int]:
    if pos >= end:
        raise short_of(1, pos, end)
    reader = FIELD_VALUE_READERS.get(data[pos])
    if reader is None:
        raise DecodeError(f"unknown field value type {chr(data[pos])!r}", pos)
    return reader(data, pos + 1, end)


# --- argument lists compiled from the spec ---------------------------------------------------------

# Fixed-width domain types as struct codes; "bit" is packed eight to an octet (spec 4.2.5.2).
_FIXED_CODES = {"octet": "B", "short": "H", "long": "I", "longlong": "Q", "timestamp": "Q"}
_VARIABLE_READERS: dict[str, Reader] = {"shortstr": _shortstr, "longstr": _longstr, "table": _table}

ArgumentsDecoder = Callable[[bytes, int, int], dict[str, Any]]


def compile_arguments(name: str, arguments: tuple[tuple[str, str], ...]) -> ArgumentsDecoder:
    """One function decoding an argument list (method arguments or basic properties) in spec order.

    Consecutive fixed-width arguments and bit octets become one ``struct`` format, read with one
    bounds check; strings and tables go through their readers. Secrets are skipped unread.
    """
    namespace: dict[str, Any] = {
        "short_of": short_of, "timestamp": timestamp, "DecodeError": DecodeError, "skip": _skip_longstr,
        **{f"read_{kind}": reader for kind, reader in _VARIABLE_READERS.items()},
    }  # fmt: skip
    lines = ["def decode(data, pos, end):", "    out = {}"]
    run: list[tuple[str, str | None, list[str]]] = []  # (struct code, argument or None for bits, bit names)

    def flush() -> None:
        if not run:
            return
        fmt = ">" + "".join(code for code, _arg, _bits in run)
        size = struct.calcsize(fmt)
        unpack = f"unpack_{len(namespace)}"
        namespace[unpack] = struct.Struct(fmt).unpack_from
        targets = [f"v{i}" for i in range(len(run))]
        lines.append(f"    if pos + {size} > end: raise short_of({size}, pos, end)")
        lines.append(f"    {', '.join(targets)}, = {unpack}(data, pos)")
        for index, (target, (code, arg, bits)) in enumerate(zip(targets, run)):
            if arg is None:
                lines.extend(f"    out[{bit!r}] = {target} & {1 << i} != 0" for i, bit in enumerate(bits))
            elif dict(arguments)[arg] == "timestamp":
                at = struct.calcsize(">" + "".join(c for c, _a, _b in run[:index]))
                lines.append(f"    out[{arg!r}] = timestamp({target}, pos + {at})")
            else:
                lines.append(f"    out[{arg!r}] = {target}")
        lines.append(f"    pos += {size}")
        run.clear()

    for arg, kind in arguments:
        if kind == "bit":
            if run and run[-1][1] is None and len(run[-1][2]) < 8:
                run[-1][2].append(arg)
            else:
                run.append(("B", None, [arg]))
        elif kind in _FIXED_CODES:
            run.append((_FIXED_CODES[kind], arg, []))
        else:
            flush()
            if (name, arg) in SECRET_ARGUMENTS:
                lines.append("    _, pos = skip(data, pos, end)")
            elif kind == "shortstr":
                # _shortstr inlined: exchanges, routing keys and consumer tags are in most methods.
                lines.append("    if pos >= end: raise short_of(1, pos, end)")
                lines.append("    stop = pos + 1 + data[pos]")
                lines.append("    if stop > end: raise short_of(data[pos], pos + 1, end)")
                lines.append(f"    out[{arg!r}] = data[pos + 1 : stop].decode('utf-8', 'replace')")
                lines.append("    pos = stop")
            else:
                lines.append(f"    out[{arg!r}], pos = read_{kind}(data, pos, end)")
    flush()
    lines.append("    if pos != end:")
    lines.append(f"        raise DecodeError(f'{{end - pos}} bytes after the arguments of {name}', pos)")
    lines.append("    return out")
    exec("\n".join(lines), namespace)  # noqa: S102 - source generated above from the spec tables
    decoder = namespace["decode"]
    decoder.__qualname__ = decoder.__name__ = f"decode_{name.replace('.', '_').replace('-', '_')}"
    return decoder


METHOD_DECODERS: dict[tuple[int, int], tuple[MethodSpec, ArgumentsDecoder]] = {
    key: (spec, compile_arguments(spec.name, spec.arguments)) for key, spec in _SPEC.methods.items()
}
# The same by class-id and method-id read as one 32-bit number: one unpack and one lookup a method frame.
_METHODS_BY_ID: dict[int, tuple[str, ArgumentsDecoder]] = {
    class_id << 16 | method_id: (spec.name, decoder) for (class_id, method_id), (spec, decoder) in METHOD_DECODERS.items()
}
_METHOD_HEADER = struct.Struct(">BHIHH")  # frame header, class-id, method-id
# A content header's method column by class-id ("basic.header").
_HEADER_METHODS = {class_id: f"{name}.header" for class_id, name in _SPEC.class_names.items()}


@cache
def properties_decoder(flags: tuple[bool, ...]) -> ArgumentsDecoder:
    """The decoder of the basic properties present in one flag combination (cached: few occur)."""
    present = tuple(p for p, on in zip(_SPEC.basic_properties, flags) if on)
    return compile_arguments("basic.properties", present)


# Decoders of the valid single flag words met so far (bit 0 clear: no second word): one lookup a header.
_BY_FLAG_WORD: dict[int, ArgumentsDecoder] = {}


def decode_properties(data: bytes, pos: int, end: int) -> dict[str, Any]:
    """Basic content properties: 15-bit flag words (bit 0 = another word follows), then values."""
    if pos + 2 <= end:
        known = _BY_FLAG_WORD.get(data[pos] << 8 | data[pos + 1])
        if known is not None:
            return known(data, pos + 2, end)
    start = pos
    flags: list[bool] = []
    while True:
        if pos + 2 > end:
            raise short_of(2, pos, end)
        word = data[pos] << 8 | data[pos + 1]
        pos += 2
        flags.extend(word >> (15 - i) & 1 == 1 for i in range(15))
        if not word & 1:
            break
    if any(flags[len(_SPEC.basic_properties) :]):
        raise DecodeError("property flags name a property basic does not have", pos - 2)
    decoder = properties_decoder(tuple(flags[: len(_SPEC.basic_properties)]))
    if pos == start + 2:
        _BY_FLAG_WORD[word] = decoder
    return decoder(data, pos, end)


def decode_frame(data: bytes) -> dict[str, Any]:
    """Decode a complete 0-9-1 frame into its kind and named arguments (spec names, unsnaked)."""
    frame_type, channel, size = _HEADER.unpack_from(data, 0)
    end = FRAME_HEADER_SIZE + size
    if frame_type == FRAME_METHOD:
        if size < 4:
            raise short_of(4, FRAME_HEADER_SIZE, end)
        _type, _channel, _size, class_id, method_id = _METHOD_HEADER.unpack_from(data, 0)
        known = _METHODS_BY_ID.get(class_id << 16 | method_id)
        if known is None:
            raise DecodeError(f"unknown method {class_id}.{method_id}", FRAME_HEADER_SIZE)
        name, decode_arguments = known
        return {"frame_type": "method", "channel": channel, "class_id": class_id, "method_id": method_id,
                "method": name, "arguments": decode_arguments(data, FRAME_HEADER_SIZE + 4, end)}
    if frame_type == FRAME_BODY:
        return {"frame_type": "body", "channel": channel, "arguments": {"body-length": size}}
    if frame_type == FRAME_HEADER:
        if size < 14:
            raise short_of(14, FRAME_HEADER_SIZE, end)
        class_id, weight, body_size = _CONTENT_HEADER.unpack_from(data, FRAME_HEADER_SIZE)
        if weight:
            raise DecodeError(f"content header weight is {weight}, not 0", FRAME_HEADER_SIZE + 2)
        arguments = {"body-size": body_size, **decode_properties(data, FRAME_HEADER_SIZE + 12, end)}
        return {"frame_type": "header", "channel": channel, "class_id": class_id,
                "method": _HEADER_METHODS.get(class_id) or f"{class_id}.header", "arguments": arguments}
    if size:
        raise DecodeError(f"heartbeat frame with a {size}-byte payload", FRAME_HEADER_SIZE)
    return {"frame_type": "heartbeat", "channel": channel, "arguments": {}}
