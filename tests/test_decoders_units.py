"""Every 0-9-1 method and every 1.0 performative and SASL frame, on hand-built bytes with boundary values.

The bytes are written by the encoders in ``tests/amqp_bytes.py`` from the spec layouts (0-9-1 spec
4.2.5, AMQP 1.0 types part 1), independently of the decoders; which methods, fields and types exist
is read from the spec files, so a method the decoders forget fails here.
"""

from __future__ import annotations

import hashlib
import struct
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.amqp091_values import SECRET_ARGUMENTS
from amqpscope.ingest.amqp10_types import DecodeError
from amqpscope.ingest.rows import frame_row
from amqpscope.ingest.specs import amqp091 as amqp091_spec
from amqpscope.ingest.specs import amqp10 as amqp10_spec
from amqpscope.ingest.specs import amqp10_primitive
from tests import amqp_bytes as b

SPEC_091 = amqp091_spec()
SPEC_10 = amqp10_spec()

# -- AMQP 0-9-1: every method, every argument at a boundary ----------------------------------------

NESTED_TABLE = {
    "empty": ("F", {}),
    "inner": ("F", {"deep": ("F", {"n": ("I", -1)})}),
    "list": ("A", [("t", True), ("S", "x")]),
}
# (encoded bytes, decoded value) per domain type: the largest value each can carry.
BOUNDARY_091: dict[str, tuple[bytes, Any]] = {
    "octet": (b"\xff", 255),
    "short": (b"\xff\xff", 65535),
    "long": (b"\xff\xff\xff\xff", 2**32 - 1),
    "longlong": (b"\xff" * 8, 2**64 - 1),
    "shortstr": (b.shortstr("s" * 255), "s" * 255),
    "longstr": (b.longstr("\u00e9".encode() * 300), "\u00e9" * 300),
    "table": (b.table(NESTED_TABLE), {"empty": {}, "inner": {"deep": {"n": -1}}, "list": [True, "x"]}),
    "timestamp": (struct.pack(">Q", 1_700_000_000), datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
}


def arguments_091(arguments: tuple[tuple[str, str], ...]) -> tuple[bytes, dict[str, Any]]:
    """Encode a method's arguments (bits packed, alternating true/false) and what they decode to."""
    out, expected, bits = b"", {}, []

    def flush() -> bytes:
        octet = sum(1 << i for i, on in enumerate(bits) if on)
        bits.clear()
        return bytes([octet])

    for index, (name, kind) in enumerate(arguments):
        if kind == "bit":
            if len(bits) == 8:
                out += flush()
            bits.append(index % 2 == 0)
            expected[name] = index % 2 == 0
            continue
        if bits:
            out += flush()
        raw, value = BOUNDARY_091[kind]
        out += raw
        expected[name] = value
    if bits:
        out += flush()
    return out, expected


@pytest.mark.parametrize(
    "spec", sorted(SPEC_091.methods.values(), key=lambda m: (m.class_id, m.method_id)), ids=lambda m: m.name
)
def test_every_091_method_decodes_every_argument(spec):
    raw, expected = arguments_091(spec.arguments)
    decoded = amqp091.decode_frame(b.method091(spec.class_id, spec.method_id, raw, channel=65535))
    for secret in [a for m, a in SECRET_ARGUMENTS if m == spec.name]:
        expected.pop(secret)
    assert (decoded["method"], decoded["channel"]) == (spec.name, 65535)
    assert decoded["arguments"] == expected
    # Every argument lands somewhere in the row: its typed column or the arguments map.
    row = frame_row(amqp091.PROTOCOL, decoded, {})
    for name in expected:
        column = "body_size" if name == "body-size" else name.replace("-", "_")
        assert column in row or name in row["arguments"], name


def test_091_empty_strings_and_empty_table():
    # queue.bind: ticket, queue, exchange, routing-key (all empty), nowait, arguments (empty table).
    args = b"\x00\x00" + b.shortstr("") + b.shortstr("") + b.shortstr("") + b"\x00" + b.table({})
    decoded = amqp091.decode_frame(b.method091(50, 20, args))
    assert decoded["arguments"] == {
        "ticket": 0,
        "queue": "",
        "exchange": "",
        "routing-key": "",
        "nowait": False,
        "arguments": {},
    }


@pytest.mark.parametrize(
    ("letter", "raw", "value"),
    [
        ("t", b"\x01", True),
        ("b", b"\x80", -128),
        ("B", b"\xff", 255),
        ("s", b"\x80\x00", -32768),
        ("u", b"\xff\xff", 65535),
        ("I", b"\x80\x00\x00\x00", -(2**31)),
        ("i", b"\xff\xff\xff\xff", 2**32 - 1),
        ("l", b"\x80" + bytes(7), -(2**63)),
        ("f", struct.pack(">f", 1.5), 1.5),
        ("d", struct.pack(">d", -2.25), -2.25),
        ("D", b"\x02" + struct.pack(">i", 314), Decimal("3.14")),
        ("S", b.longstr(b""), ""),
        ("x", b.longstr(b"\x00\xff"), b"\x00\xff"),
        ("V", b"", None),
        ("T", struct.pack(">Q", 0), datetime(1970, 1, 1, tzinfo=UTC)),
        ("A", struct.pack(">I", 0), []),
    ],
)
def test_091_field_table_value_types(letter, raw, value):
    table = struct.pack(">I", 3 + len(raw)) + b"\x01k" + letter.encode() + raw
    decoded = amqp091.decode_frame(b.method091(50, 10, b"\x00\x00" + b.shortstr("q") + b"\x00" + table))
    assert decoded["arguments"]["arguments"] == {"k": value}


def test_091_content_header_every_property_and_two_flag_words():
    values = b"".join(BOUNDARY_091[kind][0] for _name, kind in SPEC_091.basic_properties)
    header = b.frame091(2, 1, struct.pack(">HHQH", 60, 0, 2**64 - 1, 0xFFFC) + values)
    decoded = amqp091.decode_frame(header)
    assert decoded["arguments"] == {
        "body-size": 2**64 - 1,
        **{name: BOUNDARY_091[kind][1] for name, kind in SPEC_091.basic_properties},
    }
    # A continuation flag word (bit 0 set) followed by an empty one decodes the same.
    continued = b.frame091(2, 1, struct.pack(">HHQHH", 60, 0, 5, 0x8001, 0x0000) + b.shortstr("text/plain"))
    assert amqp091.decode_frame(continued)["arguments"] == {"body-size": 5, "content-type": "text/plain"}
    row = frame_row(amqp091.PROTOCOL, decoded, {})
    assert row.get("body_size") is None and row["arguments"]["body-size"] == str(
        2**64 - 1
    )  # beyond a signed 64-bit column


@pytest.mark.parametrize(
    ("frame", "reason", "offset"),
    [
        (b.method091(60, 80, b"\x00" * 8), "value needs 9 bytes, 8 left", 11),
        (b.method091(60, 80, b"\x00" * 10), "1 bytes after the arguments of basic.ack", 20),
        (b.method091(60, 99), "unknown method 60.99", 7),
        (b.method091(50, 10, b"\x00\x00" + b"\x05ab"), "value needs 5 bytes, 2 left", 14),
        (
            b.method091(50, 10, b"\x00\x00\x00\x00" + struct.pack(">I", 3) + b"\x01kZ"),
            "unknown field value type 'Z'",
            21,
        ),
        (
            b.method091(50, 10, b"\x00\x00\x00\x00" + struct.pack(">I", 99)),
            "field table of 99 bytes overruns the frame",
            15,
        ),
        (
            b.frame091(2, 1, struct.pack(">HHQH", 60, 0, 1, 0x0002)),
            "property flags name a property basic does not have",
            19,
        ),
        (b.frame091(8, 0, b"\x00"), "heartbeat frame with a 1-byte payload", 7),
        (b.frame091(2, 1, struct.pack(">HHQ", 60, 1, 1) + b"\x00\x00"), "content header weight is 1, not 0", 9),
    ],
)
def test_091_malformed_frames_give_reason_and_offset(frame, reason, offset):
    with pytest.raises(DecodeError) as err:
        amqp091.decode_frame(frame)
    assert (err.value.reason, err.value.offset) == (reason, offset)


def test_091_amqplain_start_ok_response_never_decoded():
    response = b.table({"LOGIN": ("S", "guest"), "PASSWORD": ("S", "s3cret")})[4:]  # AMQPLAIN: no size prefix
    args = b.table({}) + b.shortstr("AMQPLAIN") + b.longstr(response) + b.shortstr("en_US")
    decoded = amqp091.decode_frame(b.method091(10, 11, args, channel=0))
    assert decoded["arguments"] == {"client-properties": {}, "mechanism": "AMQPLAIN", "locale": "en_US"}
    assert "s3cret" not in repr(frame_row(amqp091.PROTOCOL, decoded, {}))


# -- AMQP 1.0: every performative and SASL frame, every field --------------------------------------

# (encoding, decoded, in the row) per primitive type: boundary values.
BOUNDARY_10: dict[str, tuple[bytes, Any]] = {
    "uint": (b.uint(2**32 - 1), 2**32 - 1),
    "ulong": (b"\x80" + b"\xff" * 8, 2**64 - 1),
    "ushort": (b"\x60\xff\xff", 65535),
    "ubyte": (b"\x50\x01", 1),
    "boolean": (b.boolean(True), True),
    "string": (b.string("s" * 255), "s" * 255),
    "symbol": (b.symbol("amqp:x"), "amqp:x"),
    "binary": (b.binary(b"\x00" * 32), b"\x00" * 32),
    "map": (b.map8(b.symbol("k"), b.string("v")), {"k": "v"}),
}
SECRET_10 = {(m, f) for m, f in amqp10.SECRET_FIELDS}
FRAMES_10 = sorted(
    (c for c in SPEC_10.described.values() if {"frame", "sasl-frame"} & set(c.provides)), key=lambda c: c.code
)


def fields_10(composite) -> tuple[bytes, dict[str, Any]]:
    """Every field of a performative at a boundary value (composite-typed fields: null)."""
    items, expected = [], {}
    for field in composite.fields:
        primitive = amqp10_primitive(field.type)
        if field.multiple:
            items.append(b.array8_symbols("en", "fr"))
            expected[field.name] = ["en", "fr"]
        elif primitive in BOUNDARY_10:
            raw, value = BOUNDARY_10[primitive]
            choices = SPEC_10.choices.get(field.type)
            if choices is not None:
                value = choices[("true" if value else "false") if isinstance(value, bool) else str(value)]
            items.append(raw)
            expected[field.name] = value
        else:
            items.append(b.NULL)
            expected[field.name] = None
    return b.list32(*items), expected


@pytest.mark.parametrize("composite", FRAMES_10, ids=lambda c: c.name)
def test_every_10_performative_and_sasl_frame_decodes_every_field(composite):
    body, expected = fields_10(composite)
    frame_type = 1 if "sasl-frame" in composite.provides else 0
    frame = b.frame10(b"\x00\x80" + struct.pack(">Q", composite.code) + body, channel=7, frame_type=frame_type)
    decoded = amqp10.decode_frame(frame)
    for secret in [f for m, f in SECRET_10 if m == composite.name]:
        expected.pop(secret)
    assert decoded["method"] == composite.name and decoded["arguments"] == expected
    assert decoded["channel"] == (7 if frame_type == 0 else None)
    # The symbolic descriptor and the list8 / list0 forms name the same performative.
    by_symbol = amqp10.decode_frame(b.frame10(b"\x00" + b.symbol(composite.symbol) + body, frame_type=frame_type))
    assert by_symbol["arguments"] == expected
    empty = amqp10.decode_frame(b.frame10(b.described(composite.code, b"\x45"), frame_type=frame_type))
    assert set(empty["arguments"]) == set(expected) and not any(v is not None for v in empty["arguments"].values())


def test_10_error_conditions_on_detach_end_close():
    error = b.described(
        0x1D, b.list8(b.symbol("amqp:resource-limit-exceeded"), b.string("too many"), b.map8(b.symbol("k"), b.uint(1)))
    )
    for code, name, fields in (
        (0x16, "detach", [b.uint(3), b.boolean(True), error]),
        (0x17, "end", [error]),
        (0x18, "close", [error]),
    ):
        decoded = amqp10.decode_frame(b.frame10(b.described(code, b.list8(*fields))))
        row = frame_row(amqp10.PROTOCOL, decoded, {})
        assert decoded["method"] == name
        assert (row["error_condition"], row["error_description"]) == ("amqp:resource-limit-exceeded", "too many")
        assert '"info":{"k":1}' in row["arguments"]["error"]


def test_10_disposition_states_and_their_fields():
    rejected = b.described(0x25, b.list8(b.described(0x1D, b.list8(b.symbol("amqp:decode-error")))))
    modified = b.described(0x27, b.list8(b.boolean(True), b.boolean(False), b.map8()))
    for state, name in (
        (rejected, "rejected"),
        (modified, "modified"),
        (b.described(0x26, b.list8()), "released"),
        (b.described(0x23, b.list8(b.uint(0), b.ulong_small(0))), "received"),
    ):
        fields = b.list8(b.boolean(True), b.uint(0), b.uint(2**32 - 1), b.boolean(True), state)
        row = frame_row(amqp10.PROTOCOL, amqp10.decode_frame(b.frame10(b.described(0x15, fields))), {})
        assert (row["state"], row["role"], row["first"], row["last"]) == (name, "receiver", 0, 2**32 - 1)
        assert row["arguments"]["state"].startswith('{"$type":"' + name)


def test_10_sasl_plain_response_and_challenge_dropped_mechanism_kept():
    init = amqp10.decode_frame(b.sasl_init("PLAIN", b"\x00guest\x00s3cret"))
    response = amqp10.decode_frame(b.frame10(b.described(0x43, b.list8(b.binary(b"s3cret"))), frame_type=1))
    assert init["arguments"] == {"mechanism": "PLAIN", "hostname": None}
    assert response["arguments"] == {}
    outcome = amqp10.decode_frame(b.frame10(b.described(0x44, b.list8(b"\x50\x01")), frame_type=1))
    assert frame_row(amqp10.PROTOCOL, outcome, {})["sasl_code"] == "auth"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b.described(0x13, b"\xc0\x05\x09\x41"), "overruns the frame"),
        (b.described(0x99, b.list8()), "0x0000000000000099 cannot be the body of a amqp frame"),
        (b.uint(1), "frame body is not a described performative"),
        (b.described(0x41, b.list8()), "sasl-init cannot be the body of a amqp frame"),
        (b.described(0x17, b.list8()) + b"\x00", "1 bytes after the end performative"),
        (b.described(0x13, b.list8(b"\x56\x02")), "boolean octet 0x02 is neither 0x00 nor 0x01"),
    ],
)
def test_10_malformed_frames_give_reason_and_offset(body, reason):
    with pytest.raises(DecodeError) as err:
        amqp10.decode_frame(b.frame10(body))
    assert reason in err.value.reason
    assert 8 <= err.value.offset <= 8 + len(body)


# The spec files the decoders are derived from, as published (OASIS AMQP 1.0 type definitions,
# RabbitMQ's AMQP 0-9-1 JSON with its licence): any change to them is a change of the decoders' source.
SPEC_SHA256 = {
    "LICENSE-0.9.1-json.txt": "68592c636a42d2171299e872ad20d340b22a64a7080380a816ad76550cb6045f",
    "amqp-1.0/messaging.xml": "c6785248bb7fdafbb4945f312b0f223cf87cd988ab737b6b3ef9a10402d4c565",
    "amqp-1.0/security.xml": "8c069db2f358a1756dce770513a4c42877d58b6becef9300c5d77f09cea3b99e",
    "amqp-1.0/transactions.xml": "713da3f806c21d8bf3ba3e0564df1fb81ddf67b975a900d85c82384551e27900",
    "amqp-1.0/transport.xml": "70004a3079d4098866e9e1d387b1565b0bdd8ba4c23ce2a865c27f1af39838d3",
    "amqp-1.0/types.xml": "fd2d907ea872d4feec9639cbfcad24e8ea8b422143a6b9f3e09566ae19c9a462",
    "amqp-rabbitmq-0.9.1.json": "48dd1bb5374de5db3a0d789899a8cc2fbbe7f9a3d4efc69c8daf79dfb0591303",
}


def test_specs_are_the_pinned_files():
    """ingest/specs holds exactly the spec files above, byte for byte (SHA-256)."""
    specs = Path(__file__).resolve().parent.parent / "ingest" / "specs"
    found = {
        path.relative_to(specs).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in specs.rglob("*")
        if path.is_file()
    }
    assert found == SPEC_SHA256
