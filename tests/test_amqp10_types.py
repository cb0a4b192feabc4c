"""The AMQP 1.0 type system on hand-built encodings (types spec part 1), boundary values included."""

from __future__ import annotations

import struct
import uuid

import pytest

from amqpscope.ingest.amqp10_types import DecodeError, Described, Symbol, decode_value


def value(raw: bytes):
    decoded, end = decode_value(memoryview(raw))
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
        (b"\x41", True), (b"\x42", False), (b"\x56\x01", True), (b"\x40", None),
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
        decode_value(memoryview(raw))
    assert reason in err.value.reason
    assert 0 <= err.value.offset <= len(raw)
