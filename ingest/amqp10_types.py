"""The AMQP 1.0 type system (spec part 1): a decoder for every encoding listed in types.xml.

The constructor table is built from ``specs.amqp10().encodings``; what a category means
(fixed / variable / compound / array, section 1.2) and how a primitive maps to Python is the only
logic written here.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from amqpscope.ingest.specs import Encoding, amqp10


class DecodeError(ValueError):
    """Bytes that do not decode; ``offset`` is relative to the start of the frame."""

    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at byte {offset}")
        self.reason = reason
        self.offset = offset


class Symbol(str):
    """An AMQP symbol (ASCII), kept distinct from strings so maps render faithfully."""


@dataclass(frozen=True)
class Described:
    """A described value (section 1.3): the descriptor (ulong code or symbol) and the value."""

    descriptor: Any
    value: Any


@dataclass(frozen=True)
class Decimal:
    """decimal32/64/128 kept as their IEEE 754 bytes (Python has no decimal interchange format)."""

    width: int
    raw: bytes


Decoder = Callable[[memoryview, int], tuple[Any, int]]

# How each fixed-width primitive's bytes become a value (struct formats, network byte order).
_FIXED_FORMATS = {
    ("ubyte", 1): ">B", ("ushort", 2): ">H", ("uint", 4): ">I", ("uint", 1): ">B",
    ("ulong", 8): ">Q", ("ulong", 1): ">B", ("byte", 1): ">b", ("short", 2): ">h",
    ("int", 4): ">i", ("int", 1): ">b", ("long", 8): ">q", ("long", 1): ">b",
    ("float", 4): ">f", ("double", 8): ">d", ("timestamp", 8): ">q", ("boolean", 1): ">B",
}  # fmt: skip


def _need(buf: memoryview, pos: int, n: int) -> None:
    if pos + n > len(buf):
        raise DecodeError(f"value needs {n} bytes, {len(buf) - pos} left", pos)


def _fixed(enc: Encoding) -> Decoder:
    width = enc.width
    if width == 0:
        # null, true/false, uint0/ulong0 and list0 carry their value in the constructor.
        constant = {"null": None, "true": True, "false": False, "list0": []}.get(enc.name, 0)
        if enc.type_name == "list":
            return lambda buf, pos: ([], pos)
        return lambda buf, pos: (constant, pos)
    fmt = _FIXED_FORMATS.get((enc.type_name, width))
    if fmt is not None:
        unpack = struct.Struct(fmt).unpack_from
        convert = bool if enc.type_name == "boolean" else None

        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            _need(buf, pos, width)
            (value,) = unpack(buf, pos)
            return (convert(value) if convert else value), pos + width

        return decode
    if enc.type_name == "uuid":

        def decode_uuid(buf: memoryview, pos: int) -> tuple[Any, int]:
            _need(buf, pos, 16)
            return uuid.UUID(bytes=bytes(buf[pos : pos + 16])), pos + 16

        return decode_uuid
    if enc.type_name == "char":

        def decode_char(buf: memoryview, pos: int) -> tuple[Any, int]:
            _need(buf, pos, 4)
            return chr(struct.unpack_from(">I", buf, pos)[0]), pos + 4

        return decode_char
    if enc.type_name.startswith("decimal"):

        def decode_decimal(buf: memoryview, pos: int) -> tuple[Any, int]:
            _need(buf, pos, width)
            return Decimal(width, bytes(buf[pos : pos + width])), pos + width

        return decode_decimal
    raise NotImplementedError(f"fixed encoding {enc.name} of {enc.type_name}")  # the spec has no other


def _size_reader(width: int) -> Callable[[memoryview, int], tuple[int, int]]:
    unpack = struct.Struct(">B" if width == 1 else ">I").unpack_from

    def read(buf: memoryview, pos: int) -> tuple[int, int]:
        _need(buf, pos, width)
        return unpack(buf, pos)[0], pos + width

    return read


def _variable(enc: Encoding) -> Decoder:
    read_size = _size_reader(enc.width)
    kind = enc.type_name

    def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
        size, pos = read_size(buf, pos)
        _need(buf, pos, size)
        raw = bytes(buf[pos : pos + size])
        if kind == "string":
            try:
                return raw.decode("utf-8"), pos + size
            except UnicodeDecodeError as exc:
                raise DecodeError("string is not valid UTF-8", pos + exc.start) from None
        if kind == "symbol":
            return Symbol(raw.decode("ascii", errors="replace")), pos + size
        return raw, pos + size

    return decode


def _sequence(enc: Encoding) -> Decoder:
    """list, map and array encodings: size, count, then the elements (an array's share one constructor)."""
    read_size = _size_reader(enc.width)
    is_map = enc.type_name == "map"
    is_array = enc.category == "array"

    def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
        size, pos = read_size(buf, pos)
        end = pos + size
        if end > len(buf) or size < enc.width:
            raise DecodeError(f"{enc.name} of {size} bytes overruns the frame", pos)
        count, pos = read_size(buf, pos)
        element: Decoder = decode_value
        if is_array:
            element, pos = _constructor(buf, pos)
        items = []
        for _ in range(count):
            value, pos = element(buf, pos)
            items.append(value)
        if pos != end:
            raise DecodeError(f"{enc.name} size {size} disagrees with its {count} elements", pos)
        if is_map:
            if count % 2:
                raise DecodeError(f"{enc.name} has an odd number ({count}) of elements", pos)
            return dict(zip(map(_hashable, items[0::2]), items[1::2])), pos
        return items, pos

    return decode


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(key)
    if isinstance(key, dict):
        return tuple(key.items())
    return key


_CATEGORY = {"fixed": _fixed, "variable": _variable, "compound": _sequence, "array": _sequence}
PRIMITIVE_DECODERS: dict[int, Decoder] = {code: _CATEGORY[e.category](e) for code, e in amqp10().encodings.items()}

def _constructor(buf: memoryview, pos: int) -> tuple[Decoder, int]:
    """Read a constructor (section 1.2): a format code, or 0x00 descriptor format-code."""
    _need(buf, pos, 1)
    code = buf[pos]
    if code == 0x00:
        descriptor, pos = decode_value(buf, pos + 1)
        inner, pos = _constructor(buf, pos)

        def described(b: memoryview, p: int) -> tuple[Any, int]:
            value, p = inner(b, p)
            return Described(descriptor, value), p

        return described, pos
    decoder = PRIMITIVE_DECODERS.get(code)
    if decoder is None:
        raise DecodeError(f"unknown format code 0x{code:02x}", pos)
    return decoder, pos + 1


def decode_value(buf: memoryview, pos: int = 0) -> tuple[Any, int]:
    """Decode one AMQP value at ``pos``; returns the value and the position after it."""
    _need(buf, pos, 1)
    code = buf[pos]
    decoder = PRIMITIVE_DECODERS.get(code)
    if decoder is not None:
        return decoder(buf, pos + 1)
    decoder, pos = _constructor(buf, pos)
    return decoder(buf, pos)
