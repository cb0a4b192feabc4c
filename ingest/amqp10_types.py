"""The AMQP 1.0 type system (spec part 1): a decoder for every encoding listed in types.xml.

The constructor table is built from ``specs.amqp10().encodings``; what a category means
(fixed / variable / compound / array, section 1.2) and how a primitive maps to Python is the only
logic written here:

| AMQP | Python |
|---|---|
| null, boolean, integers, float, double | None, bool, int, float |
| decimal32 / 64 / 128 | ``decimal.Decimal`` (IEEE 754-2008, binary integer decimal encoding) |
| char, string, symbol | str (UTF-32 code point), str, ``Symbol`` |
| timestamp | ``Timestamp`` (int milliseconds since the Unix epoch, with ``.datetime``) |
| uuid, binary | ``uuid.UUID``, bytes |
| list, map, array | list, dict (hashable keys), list |
| described | ``Described(descriptor, value)`` |
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Final

from mypy_extensions import mypyc_attr

from amqpscope.ingest.limits import BUDGET, MAX_DEPTH, MAX_VALUE_BYTES
from amqpscope.ingest.reasons import (
    AMQP10_VALUE_BAD_ASCII,
    AMQP10_VALUE_BAD_BOOLEAN,
    AMQP10_VALUE_BAD_UTF8,
    AMQP10_VALUE_COUNT_EXCEEDS_SIZE,
    AMQP10_VALUE_INVALID,
    AMQP10_VALUE_ODD_MAP,
    AMQP10_VALUE_OVERRUNS_FRAME,
    AMQP10_VALUE_SIZE_MISMATCH,
    AMQP10_VALUE_TRUNCATED,
    AMQP10_VALUE_UNKNOWN_FORMAT_CODE,
    LIMIT_DEPTH,
    LIMIT_VALUE_BYTES,
    DecodeError,
    beyond,
)
from amqpscope.ingest.specs import Encoding, amqp10


@mypyc_attr(native_class=False)  # compiled classes cannot subclass str
class Symbol(str):
    """An AMQP symbol (ASCII), kept distinct from strings so maps render faithfully."""


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# Units applications put in a timestamp field instead of the protocol's, finest last: (name, per second).
_UNITS: Final = (("milliseconds", 10**3), ("microseconds", 10**6), ("nanoseconds", 10**9))
# The years a timestamp's likely unit must place it in to be named (a guess, so a narrow one).
_PLAUSIBLE_YEARS: Final = range(1970, 2200)


def likely_unit(value: int, per_second: int) -> str:
    """A timestamp that is no moment in its protocol's unit (``per_second`` ticks a second): the raw
    integer, and the finer unit that would make it a moment of these centuries, if one does."""
    for name, ticks in _UNITS:
        if ticks <= per_second:
            continue
        try:
            moment = _EPOCH + timedelta(microseconds=value * 1_000_000 // ticks)
        except OverflowError:
            continue
        if moment.year in _PLAUSIBLE_YEARS:
            return f"{value} (likely {name}: {moment.isoformat()})"
    return str(value)


@mypyc_attr(native_class=False)  # nor int
class Timestamp(int):
    """An AMQP timestamp: milliseconds since the Unix epoch (types section 1.6.20), signed 64-bit."""

    @property
    def datetime(self) -> datetime | None:
        """The moment as an aware datetime; None beyond the years Python can represent."""
        try:
            return _EPOCH + timedelta(milliseconds=int(self))
        except OverflowError:
            return None

    def described(self) -> str:
        """The raw integer of a timestamp beyond the datetime range, with its likely unit."""
        return likely_unit(int(self), 1000)


@dataclass(frozen=True)
class Described:
    """A described value (section 1.3): the descriptor (ulong code or symbol) and the value."""

    descriptor: Any
    value: Any


Decoder = Callable[[bytes, int], tuple[Any, int]]


def short_of(n: int, pos: int, left: int) -> DecodeError:
    return DecodeError(
        f"value needs {n} bytes, {max(left, 0)} left",
        pos,
        AMQP10_VALUE_TRUNCATED,
        expected=str(n),
        found=str(max(left, 0)),
    )


# How each fixed-width primitive's bytes become a value (struct formats, network byte order).
_FIXED_FORMATS: Final = {
    ("ubyte", 1): ">B",
    ("ushort", 2): ">H",
    ("uint", 4): ">I",
    ("uint", 1): ">B",
    ("ulong", 8): ">Q",
    ("ulong", 1): ">B",
    ("byte", 1): ">b",
    ("short", 2): ">h",
    ("int", 4): ">i",
    ("int", 1): ">b",
    ("long", 8): ">q",
    ("long", 1): ">b",
    ("float", 4): ">f",
    ("double", 8): ">d",
    ("timestamp", 8): ">q",
    ("boolean", 1): ">B",
}
# Zero-width encodings carry their value in the constructor.
_CONSTANTS: Final = {"null": None, "true": True, "false": False}


def decimal_from_bid(raw: bytes) -> Decimal:
    """An IEEE 754-2008 decimal in the binary integer decimal encoding (types 1.6.16-18)."""
    bits = len(raw) * 8
    exponent_bits = {32: 8, 64: 10, 128: 14}[bits]
    bias = {32: 101, 64: 398, 128: 6176}[bits]
    digits = {32: 7, 64: 16, 128: 34}[bits]
    x = int.from_bytes(raw, "big")
    sign = x >> (bits - 1)
    if x >> (bits - 5) & 0b1111 == 0b1111:
        return Decimal("-Infinity" if sign else "Infinity") if not x >> (bits - 6) & 1 else Decimal("NaN")
    if x >> (bits - 3) & 0b11 == 0b11:
        shift = bits - 3 - exponent_bits
        coefficient = (0b100 << shift) | (x & ((1 << shift) - 1))
    else:
        shift = bits - 1 - exponent_bits
        coefficient = x & ((1 << shift) - 1)
    exponent = (x >> shift & ((1 << exponent_bits) - 1)) - bias
    if coefficient >= 10**digits:
        coefficient = 0  # non-canonical coefficients read as zero (IEEE 754-2008 3.5.2)
    return Decimal((sign, tuple(int(d) for d in str(coefficient)), exponent))


def _fixed(enc: Encoding) -> Decoder:
    width = enc.width
    if width == 0:
        if enc.type_name == "list":
            return lambda buf, pos: ([], pos)
        constant = _CONSTANTS.get(enc.name, 0)  # uint0 / ulong0 are 0
        return lambda buf, pos: (constant, pos)
    if enc.type_name == "boolean":

        def decode_boolean(buf: bytes, pos: int) -> tuple[bool, int]:
            if pos >= len(buf):
                raise short_of(1, pos, 0)
            if buf[pos] > 1:
                raise DecodeError(
                    f"boolean octet 0x{buf[pos]:02x} is neither 0x00 nor 0x01",
                    pos,
                    AMQP10_VALUE_BAD_BOOLEAN,
                    expected="0x00 or 0x01",
                    found=f"0x{buf[pos]:02x}",
                )
            return buf[pos] == 1, pos + 1

        return decode_boolean
    fmt = _FIXED_FORMATS.get((enc.type_name, width))
    if fmt == ">B":
        # ubyte, smalluint, smallulong: the octet is the value (the small forms are most of a
        # performative's numbers: handles, delivery-ids, descriptor codes).
        def decode_octet(buf: bytes, pos: int) -> tuple[int, int]:
            if pos >= len(buf):
                raise short_of(1, pos, len(buf) - pos)
            return buf[pos], pos + 1

        return decode_octet
    if fmt is not None:
        unpack = struct.Struct(fmt).unpack_from
        if enc.type_name == "timestamp":

            def decode_timestamp(buf: bytes, pos: int) -> tuple[Timestamp, int]:
                if pos + width > len(buf):
                    raise short_of(width, pos, len(buf) - pos)
                return Timestamp(unpack(buf, pos)[0]), pos + width

            return decode_timestamp

        def decode(buf: bytes, pos: int) -> tuple[Any, int]:
            if pos + width > len(buf):
                raise short_of(width, pos, len(buf) - pos)
            return unpack(buf, pos)[0], pos + width

        return decode
    convert: Callable[[bytes], Any]
    if enc.type_name == "uuid":
        convert = lambda raw: uuid.UUID(bytes=raw)  # noqa: E731
    elif enc.type_name == "char":
        convert = _char
    elif enc.type_name.startswith("decimal"):
        convert = decimal_from_bid
    else:
        raise NotImplementedError(f"fixed encoding {enc.name} of {enc.type_name}")  # the spec has no other

    def decode_raw(buf: bytes, pos: int) -> tuple[Any, int]:
        if pos + width > len(buf):
            raise short_of(width, pos, len(buf) - pos)
        try:
            return convert(bytes(buf[pos : pos + width])), pos + width
        except ValueError as exc:
            raise DecodeError(
                f"{enc.type_name}: {exc}", pos, AMQP10_VALUE_INVALID, found=bytes(buf[pos : pos + width]).hex()
            ) from None

    return decode_raw


def _char(raw: bytes) -> str:
    code_point = int.from_bytes(raw, "big")
    if code_point > 0x10FFFF:
        raise ValueError(f"U+{code_point:X} is beyond Unicode")
    if 0xD800 <= code_point <= 0xDFFF:  # UTF-32 has no surrogates (nor can a table's text hold one)
        raise ValueError(f"U+{code_point:X} is a surrogate, not a character")
    return chr(code_point)


def _size_reader(width: int) -> Callable[[bytes, int], tuple[int, int]]:
    unpack = struct.Struct(">B" if width == 1 else ">I").unpack_from

    def read(buf: bytes, pos: int) -> tuple[int, int]:
        if pos + width > len(buf):
            raise short_of(width, pos, len(buf) - pos)
        return unpack(buf, pos)[0], pos + width

    return read


def _variable(enc: Encoding) -> Decoder:
    read_size = _size_reader(enc.width)
    kind = enc.type_name
    width = enc.width

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        if width == 1:  # read_size inlined for the one-octet sizes (vbin8, str8, sym8: the usual ones)
            if pos >= len(buf):
                raise short_of(1, pos, len(buf) - pos)
            size = buf[pos]
            pos += 1
        else:
            size, pos = read_size(buf, pos)
            if size > MAX_VALUE_BYTES:
                raise DecodeError(
                    f"{enc.name} of {size} bytes, above {MAX_VALUE_BYTES} (limit)",
                    pos - width,
                    LIMIT_VALUE_BYTES,
                    expected=str(MAX_VALUE_BYTES),
                    found=str(size),
                )
        stop = pos + size
        if stop > len(buf):
            raise short_of(size, pos, len(buf) - pos)
        raw = bytes(buf[pos:stop])
        if kind == "string":
            try:
                return raw.decode("utf-8"), stop
            except UnicodeDecodeError as exc:
                raise DecodeError("string is not valid UTF-8", pos + exc.start, AMQP10_VALUE_BAD_UTF8) from None
        if kind == "symbol":
            try:
                return Symbol(raw.decode("ascii")), stop
            except UnicodeDecodeError as exc:
                raise DecodeError("symbol is not ASCII", pos + exc.start, AMQP10_VALUE_BAD_ASCII) from None
        return raw, stop

    return decode


_MAX_ZERO_WIDTH_ELEMENTS: Final = 1 << 16


def _sequence(enc: Encoding) -> Decoder:
    """list, map and array encodings: size, count, then the elements (an array's share one constructor)."""
    read_size = _size_reader(enc.width)
    is_map = enc.type_name == "map"
    is_array = enc.category == "array"
    by_code = _BY_CODE  # filled once every decoder exists
    width = enc.width
    budget = BUDGET

    def decode(buf: bytes, pos: int) -> tuple[Any, int]:
        length = len(buf)
        if width == 1:  # read_size inlined for list8, map8, array8 (the usual ones)
            if pos >= length:
                raise short_of(1, pos, length - pos)
            size = buf[pos]
            pos += 1
        else:
            size, pos = read_size(buf, pos)
        end = pos + size
        if end > length or size < width:
            raise DecodeError(
                f"{enc.name} of {size} bytes overruns the frame", pos, AMQP10_VALUE_OVERRUNS_FRAME, length=size
            )
        if width == 1:
            count = buf[pos]
            pos += 1
        else:
            count, pos = read_size(buf, pos)
        # List and map elements take a byte at least; array elements of a zero-width type none,
        # so those are only bounded, against a count that would loop for ever.
        if count > size and (not is_array or count > _MAX_ZERO_WIDTH_ELEMENTS):
            raise DecodeError(
                f"{enc.name} of {size} bytes cannot hold {count} elements",
                pos,
                AMQP10_VALUE_COUNT_EXCEEDS_SIZE,
                length=size,
                found=str(count),
            )
        # Limits (ingest.limits), checked before anything is built: nesting, and the values a
        # frame may build (zero-width array elements multiply when arrays nest).
        exceeded = budget.enter() or budget.take(count)
        if exceeded is not None:
            raise beyond(exceeded, pos)
        items: list[Any] = []
        append = items.append
        if is_array:
            element, pos = _constructor(buf, pos)
            for _ in range(count):
                value, pos = element(buf, pos)
                append(value)
        else:
            # decode_value inlined: a performative's or section's fields are most of the values
            # decoded, and a call less per element is a fifth of the cost of a list.
            for _ in range(count):
                if pos >= length:
                    raise short_of(1, pos, 0)
                code = buf[pos]
                if code == 0x40:  # null: absent fields are common in performatives
                    append(None)
                    pos += 1
                    continue
                known = by_code[code]
                if known is None:
                    value, pos = read_value(buf, pos)  # described, or an unknown code to report
                else:
                    value, pos = known(buf, pos + 1)
                append(value)
        if pos != end:
            raise DecodeError(
                f"{enc.name} size {size} disagrees with its {count} elements",
                pos,
                AMQP10_VALUE_SIZE_MISMATCH,
                length=size,
                found=str(count),
            )
        budget.leave()
        if is_map:
            if count % 2:
                raise DecodeError(
                    f"{enc.name} has an odd number ({count}) of elements", pos, AMQP10_VALUE_ODD_MAP, found=str(count)
                )
            return dict(zip(map(_hashable, items[0::2]), items[1::2])), pos
        return items, pos

    return decode


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(map(_hashable, key))
    if isinstance(key, dict):
        return tuple((k, _hashable(v)) for k, v in key.items())
    if isinstance(key, Described):
        return Described(key.descriptor, _hashable(key.value))
    return key


# Indexed by constructor byte: the hot path of decode_value is one list lookup (filled below).
_BY_CODE: Final[list[Decoder | None]] = [None] * 256
_CATEGORY: Final = {"fixed": _fixed, "variable": _variable, "compound": _sequence, "array": _sequence}
PRIMITIVE_DECODERS: Final[dict[int, Decoder]] = {
    code: _CATEGORY[e.category](e) for code, e in amqp10().encodings.items()
}
_BY_CODE[:] = [PRIMITIVE_DECODERS.get(code) for code in range(256)]
# The primitive decoder of each format code (None: described 0x00, or not a format code), read-only.
DECODERS_BY_CODE: Final[tuple[Decoder | None, ...]] = tuple(_BY_CODE)


def _constructor(buf: bytes, pos: int) -> tuple[Decoder, int]:
    """Read a constructor (section 1.2): a format code, or 0x00 descriptor format-code."""
    if pos >= len(buf):
        raise short_of(1, pos, 0)
    code = buf[pos]
    if code == 0x00:
        exceeded = BUDGET.enter()
        if exceeded is not None:
            raise beyond(exceeded, pos)
        descriptor, pos = read_value(buf, pos + 1)
        inner, pos = _constructor(buf, pos)
        BUDGET.leave()

        def described(b: bytes, p: int) -> tuple[Any, int]:
            value, p = inner(b, p)
            return Described(descriptor, value), p

        return described, pos
    decoder = _BY_CODE[code]
    if decoder is None:
        raise DecodeError(
            f"unknown format code 0x{code:02x}", pos, AMQP10_VALUE_UNKNOWN_FORMAT_CODE, found=f"0x{code:02x}"
        )
    return decoder, pos + 1


def decode_value(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """Decode one AMQP value at ``pos``; returns the value and the position after it.

    The value is held to the limits of ``ingest.limits`` as one frame of ``len(buf)`` bytes.
    """
    BUDGET.start(len(buf))
    return read_value(buf, pos)


def read_value(buf: bytes, pos: int) -> tuple[Any, int]:
    """``decode_value`` within the frame being decoded: counts against its limits, started by the caller."""
    if pos >= len(buf):
        raise short_of(1, pos, 0)
    code = buf[pos]
    decoder = _BY_CODE[code]
    if decoder is not None:
        return decoder(buf, pos + 1)
    if code == 0x00:
        # A described value read directly (what ``_constructor`` would build a closure for). The
        # descriptor is itself a value, possibly described: nesting counts either way.
        exceeded = BUDGET.enter()
        if exceeded is not None:
            raise beyond(exceeded, pos)
        descriptor, pos = read_value(buf, pos + 1)
        value, pos = read_value(buf, pos)
        BUDGET.leave()
        return Described(descriptor, value), pos
    raise DecodeError(f"unknown format code 0x{code:02x}", pos, AMQP10_VALUE_UNKNOWN_FORMAT_CODE, found=f"0x{code:02x}")


def value_extent(buf: bytes, pos: int, depth: int = 0) -> int | None:
    """Bytes the value at ``pos`` occupies, read from its constructor and size alone (None: not there yet).

    Lets a decoder tell a value cut off at the end of a frame (a section continued in the next
    transfer) from a malformed one, without decoding it.
    """
    spec = amqp10().encodings
    start = pos
    while True:
        if pos >= len(buf):
            return None
        code = buf[pos]
        if code != 0x00:
            break
        if depth >= MAX_DEPTH:
            raise DecodeError(
                f"descriptors nested deeper than {MAX_DEPTH} levels (limit)",
                pos,
                LIMIT_DEPTH,
                expected=str(MAX_DEPTH),
            )
        descriptor = value_extent(buf, pos + 1, depth + 1)
        if descriptor is None:
            return None
        pos += 1 + descriptor
    enc = spec.get(code)
    if enc is None:
        raise DecodeError(
            f"unknown format code 0x{code:02x}", pos, AMQP10_VALUE_UNKNOWN_FORMAT_CODE, found=f"0x{code:02x}"
        )
    if enc.category == "fixed":
        return pos + 1 + enc.width - start
    if pos + 1 + enc.width > len(buf):
        return None
    size = int.from_bytes(buf[pos + 1 : pos + 1 + enc.width], "big")
    return pos + 1 + enc.width + size - start
