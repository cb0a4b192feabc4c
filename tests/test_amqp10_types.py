"""The AMQP 1.0 type system on hand-built encodings (types spec part 1), boundary values included."""

from __future__ import annotations

import struct
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from amqpscope.ingest.amqp10_types import DecodeError, Described, Symbol, Timestamp, decode_value, value_extent


def value(raw: bytes):
    decoded, end = decode_value(raw)
    assert end == len(raw)  # every encoding consumes exactly its own bytes
    return decoded


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\x43", 0),  # uint0
        (b"\x52\xff", 255),  # smalluint
        (b"\x70\xff\xff\xff\xff", 2**32 - 1),
        (b"\x44", 0),  # ulong0
        (b"\x80" + struct.pack(">Q", 2**64 - 1), 2**64 - 1),
        (b"\x54\xff", -1),  # smallint
        (b"\x81" + struct.pack(">q", -(2**63)), -(2**63)),
        (b"\x60\xff\xff", 65535),
        (b"\x41", True),
        (b"\x42", False),
        (b"\x56\x01", True),
        (b"\x40", None),
        (b"\x83" + struct.pack(">q", 1_700_000_000_000), 1_700_000_000_000),  # timestamp, ms
        (b"\x73\x00\x01\xf6\x00", "\U0001f600"),  # char, UTF-32
    ],
)
def test_fixed_width_encodings(raw, expected):
    assert value(raw) == expected


def test_strings_symbols_and_binary_at_their_size_limits():
    assert value(b"\xa1\x00") == ""
    assert value(b"\xa1\xff" + b"x" * 255) == "x" * 255
    assert value(b"\xb1" + struct.pack(">I", 256) + b"y" * 256) == "y" * 256
    sym = value(b"\xa3\x05amqp:")
    assert isinstance(sym, Symbol) and sym == "amqp:"
    assert value(b"\xb0\x00\x00\x00\x02\x00\xff") == b"\x00\xff"


def test_uuid():
    u = uuid.uuid4()
    assert value(b"\x98" + u.bytes) == u


def test_list_forms_and_nested_described_values():
    assert value(b"\x45") == []
    assert value(b"\xc0\x01\x00") == []
    assert value(b"\xd0\x00\x00\x00\x05\x00\x00\x00\x01\x41") == [True]
    nested = value(b"\x00\x53\x28\xc0\x07\x01\x00\x53\x29\xc0\x01\x00")
    assert nested == Described(0x28, [Described(0x29, [])])


def test_maps_and_arrays():
    assert value(b"\xc1\x07\x02\xa3\x01k\xa1\x01v") == {"k": "v"}
    assert value(b"\xe0\x06\x02\xa3\x01a\x01b") == ["a", "b"]  # one constructor for all elements
    assert value(b"\xf0\x00\x00\x00\x0d\x00\x00\x00\x02\x70\x00\x00\x00\x01\x00\x00\x00\x02") == [1, 2]


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\xc0\x05\x02\x41", "overruns"),  # list8 claims more bytes than there are
        (b"\xc0\x02\x02\x41\x41", "disagrees"),  # count says 2, the size only fits one
        (b"\xc1\x02\x01\x41", "odd number"),
        (b"\x70\x00\x01", "needs 4 bytes"),
        (b"\xa1\x02\xc3\x28", "UTF-8"),
        (b"\x0f", "unknown format code 0x0f"),
    ],
)
def test_malformed_encodings_raise_with_reason_and_offset(raw, reason):
    with pytest.raises(DecodeError) as err:
        decode_value(raw)
    assert reason in err.value.reason
    assert 0 <= err.value.offset <= len(raw)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\x74" + bytes.fromhex("32800001"), Decimal("1")),  # decimal32: exponent 0 (bias 101), coefficient 1
        (b"\x74" + bytes.fromhex("B2800001"), Decimal("-1")),
        (b"\x84" + bytes.fromhex("318000000000013A"), Decimal("3.14")),  # decimal64: 314e-2 (bias 398)
        (b"\x94" + bytes.fromhex("30400000000000000000000000000000"), Decimal("0")),  # decimal128 zero, exponent 0
        (b"\x74" + bytes.fromhex("78000000"), Decimal("Infinity")),
        (b"\x74" + bytes.fromhex("7C000000"), Decimal("NaN")),
        (b"\x74" + bytes.fromhex("6CBFFFFF"), Decimal("0")),  # '11' form, coefficient 10485759 > 9999999: non-canonical
    ],
)
def test_decimals_from_binary_integer_decimal(raw, expected):
    decoded = value(raw)
    assert str(decoded) == str(expected) if expected.is_nan() else decoded == expected


def test_timestamps_are_milliseconds_with_their_datetime():
    stamp = value(b"\x83" + struct.pack(">q", 1_700_000_000_123))
    assert isinstance(stamp, Timestamp) and stamp == 1_700_000_000_123
    assert stamp.datetime == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert value(b"\x83" + struct.pack(">q", -(2**63))).datetime is None  # beyond Python's years


def test_arrays_of_described_values_and_of_zero_width_elements():
    # array8 of described symbols: one constructor (0x00 descriptor 0xa3) for both elements.
    raw = b"\xe0\x09\x02\x00\x53\x01\xa3\x01a\x01b"
    assert value(raw) == [Described(1, "a"), Described(1, "b")]
    assert value(b"\xe0\x02\x05\x40") == [None] * 5  # five nulls in two bytes
    with pytest.raises(DecodeError):
        value(b"\xf0\x00\x00\x00\x05\x7f\xff\xff\xff\x40")  # 2^31 zero-width elements: refused


def test_map_keys_that_are_lists_stay_hashable():
    assert value(b"\xc1\x05\x02\xc0\x01\x00\x40") == {(): None}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"\x56\x02", "neither 0x00 nor 0x01"),
        (b"\x73\x00\x11\x00\x00", "beyond Unicode"),
        (b"\xa3\x01\xff", "symbol is not ASCII"),
        (b"\x98" + bytes(15), "needs 16 bytes"),
    ],
)
def test_more_malformed_encodings(raw, reason):
    with pytest.raises(DecodeError) as err:
        decode_value(raw)
    assert reason in err.value.reason


def test_value_extent_reads_sizes_without_decoding():
    assert value_extent(b"\x00\x53\x75\xb0\x00\x01\x00\x00", 0) == 3 + 5 + 65536  # a data section cut short
    assert value_extent(b"\x52\x07", 0) == 2
    assert value_extent(b"\x00\x53", 0) is None  # the constructor itself is not all there
