"""AMQP 0-9-1 primitive values: strings, timestamps, and field tables with RabbitMQ's value types.

Field table value types are RabbitMQ's (its ``rabbit_binary_parser``), which differ from the 0-9-1
PDF in a few letters (``s`` is a signed short, ``l`` a signed 64-bit integer, ``x`` a byte array).
Every reader takes the whole frame (``data``), a position and the end of the value's room, and
reports errors as a ``DecodeError`` with the offset from the start of the frame.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

from mypy_extensions import mypyc_attr

from amqpscope.ingest.amqp10_types import likely_unit
from amqpscope.ingest.limits import BUDGET
from amqpscope.ingest.reasons import (
    AMQP091_VALUE_OVERRUNS_FRAME,
    AMQP091_VALUE_TRUNCATED,
    AMQP091_VALUE_UNKNOWN_TYPE,
    DecodeError,
    beyond,
)

# Arguments that carry credentials: never decoded into a row (the mechanism is kept).
SECRET_ARGUMENTS: Final = frozenset(
    {
        ("connection.start-ok", "response"),
        ("connection.secure-ok", "response"),
        ("connection.update-secret", "new-secret"),
    }
)

# Primitive readers: (data, pos, end) -> (value, new pos).
Reader = Callable[[bytes, int, int], tuple[Any, int]]


def short_of(n: int, pos: int, end: int) -> DecodeError:
    """The error for a value of ``n`` bytes at ``pos`` that the frame (ending at ``end``) cannot hold."""
    return DecodeError(
        f"value needs {n} bytes, {max(end - pos, 0)} left",
        pos,
        AMQP091_VALUE_TRUNCATED,
        expected=str(n),
        found=str(max(end - pos, 0)),
    )


def _struct_reader(fmt: str) -> Reader:
    s = struct.Struct(fmt)
    size, unpack = s.size, s.unpack_from

    def read(data: bytes, pos: int, end: int) -> tuple[Any, int]:
        if pos + size > end:
            raise short_of(size, pos, end)
        return unpack(data, pos)[0], pos + size

    return read


_octet: Final = _struct_reader(">B")
_long: Final = _struct_reader(">I")
_unpack_long: Final = struct.Struct(">I").unpack_from


def read_shortstr(data: bytes, pos: int, end: int) -> tuple[str, int]:
    """A short string: length octet, then UTF-8 (bytes that are not are replaced, as a name must be text)."""
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


def read_longstr(data: bytes, pos: int, end: int) -> tuple[Any, int]:
    """A long string: text when it is UTF-8, else its bytes (e.g. a binary consumer argument)."""
    raw, pos = _longstr_bytes(data, pos, end)
    try:
        return raw.decode("utf-8"), pos
    except UnicodeDecodeError:
        return raw, pos


def skip_longstr(data: bytes, pos: int, end: int) -> int:
    """Past a long string without keeping it (credentials)."""
    return _longstr_bytes(data, pos, end)[1]


@mypyc_attr(native_class=False)  # compiled classes cannot subclass int
class PosixTime(int):
    """A 0-9-1 timestamp that is no moment as seconds: the raw integer, kept as it was sent.

    Many publishers put milliseconds or microseconds there (``int(time.time() * 1e6)``): valid on
    the wire (a 64-bit integer), so never a reason to drop the frame.
    """

    def described(self) -> str:
        """The integer, with the unit it is likely in (``amqp10_types.likely_unit``)."""
        return likely_unit(int(self), 1)


def timestamp(seconds: int, offset: int) -> datetime | PosixTime:
    """A 0-9-1 timestamp (POSIX seconds, spec 4.2.5.4) as an aware datetime, or the raw integer
    (``PosixTime``) when it is beyond the years a datetime holds as seconds."""
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return PosixTime(seconds)


def _timestamp(data: bytes, pos: int, end: int) -> tuple[datetime | PosixTime, int]:
    seconds, stop = _longlong(data, pos, end)
    return timestamp(seconds, pos), stop


_longlong: Final = _struct_reader(">Q")
_decimal_parts: Final = struct.Struct(">Bi")


def _decimal(data: bytes, pos: int, end: int) -> tuple[Decimal, int]:
    """A decimal: scale octet then a signed 32-bit value, value * 10^-scale."""
    if pos + 5 > end:
        raise short_of(5, pos, end)
    scale, value = _decimal_parts.unpack_from(data, pos)
    return Decimal(value).scaleb(-scale), pos + 5


def _sized(data: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """A field table's or array's long size: (where its contents end, where they start)."""
    if pos + 4 > end:
        raise short_of(4, pos, end)
    stop = pos + 4 + _unpack_long(data, pos)[0]
    if stop > end:
        raise DecodeError(
            f"{what} of {stop - pos - 4} bytes overruns the frame",
            pos,
            AMQP091_VALUE_OVERRUNS_FRAME,
            length=stop - pos - 4,
        )
    return stop, pos + 4


def read_table(data: bytes, pos: int, end: int) -> tuple[dict[str, Any], int]:
    """A field table (spec 4.2.5.5): size, then (shortstr name, typed value) pairs.

    Tables and arrays nest; their depth counts against ``ingest.limits.MAX_DEPTH`` (every value
    takes a byte at least, so the bytes bound how many there are).
    """
    exceeded = BUDGET.enter()
    if exceeded is not None:
        raise beyond(exceeded, pos)
    stop, pos = _sized(data, pos, end, "field table")
    table: dict[str, Any] = {}
    while pos < stop:
        key, pos = read_shortstr(data, pos, stop)
        table[key], pos = _field_value(data, pos, stop)
    BUDGET.leave()
    return table, pos


def _array(data: bytes, pos: int, end: int) -> tuple[list[Any], int]:
    exceeded = BUDGET.enter()
    if exceeded is not None:
        raise beyond(exceeded, pos)
    stop, pos = _sized(data, pos, end, "field array")
    items: list[Any] = []
    while pos < stop:
        value, pos = _field_value(data, pos, stop)
        items.append(value)
    BUDGET.leave()
    return items, pos


def _boolean(data: bytes, pos: int, end: int) -> tuple[bool, int]:
    value, pos = _octet(data, pos, end)
    return value != 0, pos


def _void(data: bytes, pos: int, end: int) -> tuple[None, int]:
    return None, pos


# RabbitMQ's field value types (rabbit_binary_parser:parse_field_value).
FIELD_VALUE_READERS: Final[dict[int, Reader]] = {
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
    ord("S"): read_longstr,
    ord("x"): _longstr_bytes,
    ord("A"): _array,
    ord("T"): _timestamp,
    ord("F"): read_table,
    ord("V"): _void,
}


def _field_value(data: bytes, pos: int, end: int) -> tuple[Any, int]:
    if pos >= end:
        raise short_of(1, pos, end)
    reader = FIELD_VALUE_READERS.get(data[pos])
    if reader is None:
        raise DecodeError(
            f"unknown field value type {chr(data[pos])!r}", pos, AMQP091_VALUE_UNKNOWN_TYPE, found=chr(data[pos])
        )
    return reader(data, pos + 1, end)
