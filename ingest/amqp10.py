"""AMQP 1.0 frames (transport spec section 2.3): performatives, SASL frames, empty frames, messages.

Performatives, SASL frames, delivery states, termini, errors and message sections are described
types whose field names and order come from the spec XML (``specs.amqp10().described``);
restricted types with choices (role, settle modes, SASL codes) are rendered by the choice names of
the same files. A transfer's payload is returned as bytes: a message can span several transfers,
so its sections are decoded once the delivery is whole (``decode_message``, used by
``ingest.messages``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from amqpscope.ingest.amqp10_types import (
    DECODERS_BY_CODE,
    Described,
    read_value,
)
from amqpscope.ingest.framing import FrameError, RawFrame, new_frame
from amqpscope.ingest.limits import BUDGET
from amqpscope.ingest.reasons import (
    AMQP10_FRAME_BAD_DATA_OFFSET,
    AMQP10_FRAME_NOT_PERFORMATIVE,
    AMQP10_FRAME_SIZE_BELOW_MINIMUM,
    AMQP10_FRAME_TRAILING_BYTES,
    AMQP10_FRAME_UNKNOWN_TYPE,
    AMQP10_FRAME_WRONG_BODY,
    AMQP10_MESSAGE_AFTER_BODY,
    AMQP10_MESSAGE_NOT_A_SECTION,
    AMQP10_MESSAGE_SECTION_ORDER,
    AMQP10_MESSAGE_SECTION_TYPE,
    DecodeError,
)
from amqpscope.ingest.specs import Composite, amqp10

PROTOCOL: Final = "amqp-1.0"
PROTOCOL_HEADERS: Final = {
    b"AMQP\x00\x01\x00\x00": "amqp",
    b"AMQP\x03\x01\x00\x00": "sasl",
    b"AMQP\x02\x01\x00\x00": "tls",
}
FRAME_HEADER_SIZE: Final = 8  # size(4) doff(1) type(1) type-specific(2)
FRAME_TYPES: Final = {0x00: "amqp", 0x01: "sasl"}
_HEADER: Final = struct.Struct(">IBBH")
_PLAUSIBLE_MAX_SIZE: Final = 1 << 27

_SPEC: Final = amqp10()

# Fields that carry credentials (SASL PLAIN puts the password in the initial response).
SECRET_FIELDS: Final = frozenset({("sasl-init", "initial-response"), ("sasl-response", "response")})
# Message sections in their spec order (messaging 3.2); the body is one of the three in the middle.
SECTIONS: Final = tuple(
    c.name for c in sorted(_SPEC.described.values(), key=lambda c: c.code) if "section" in c.provides
)
BODY_SECTIONS: Final = ("data", "amqp-sequence", "amqp-value")
# What a section's value must decode to, by its source type in the spec (messaging 3.2; "*": anything).
_SOURCE_TYPES: Final[dict[str, type]] = {"list": list, "map": dict, "annotations": dict, "binary": bytes}
_TYPE_NAMES: Final[dict[type, str]] = {list: "list", dict: "map", bytes: "binary"}
# Per section name: its rank in SECTIONS, whether it may follow itself (data, amqp-sequence), whether it
# is a body, and the type its value must have (None: any).
_SECTION_RULES: Final = {
    c.name: (SECTIONS.index(c.name), c.name in BODY_SECTIONS[:2], c.name in BODY_SECTIONS, _SOURCE_TYPES.get(c.source))
    for c in _SPEC.described.values()
    if c.name in SECTIONS
}


class Amqp10Format:
    """Frame boundaries of 1.0: a 4-byte size that includes the 8-byte frame header."""

    def frame_length(self, buf: bytes | memoryview, pos: int) -> int | None:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return None
        size, doff, frame_type, _channel = _HEADER.unpack_from(buf, pos)
        if size < FRAME_HEADER_SIZE:
            raise FrameError(
                f"frame size {size} is below the 8-byte minimum",
                0,
                AMQP10_FRAME_SIZE_BELOW_MINIMUM,
                expected=f"at least {FRAME_HEADER_SIZE}",
                found=str(size),
            )
        if doff < 2 or doff * 4 > size:
            raise FrameError(
                f"data offset {doff} does not fit a {size}-byte frame",
                4,
                AMQP10_FRAME_BAD_DATA_OFFSET,
                length=size,
                found=str(doff),
            )
        if frame_type not in FRAME_TYPES:
            raise FrameError(
                f"unknown 1.0 frame type {frame_type}", 5, AMQP10_FRAME_UNKNOWN_TYPE, found=f"0x{frame_type:02x}"
            )
        return size

    def validate(self, buf: bytes, pos: int, length: int) -> FrameError | None:
        return None

    def plausible(self, buf: bytes | memoryview, pos: int) -> bool | None:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return None
        size, doff, frame_type, _channel = _HEADER.unpack_from(buf, pos)
        if not (FRAME_HEADER_SIZE <= size <= _PLAUSIBLE_MAX_SIZE and doff >= 2 and doff * 4 <= size):
            return False
        if frame_type not in FRAME_TYPES:
            return False
        body = pos + doff * 4
        # A non-empty frame's body starts with a described performative (constructor 0x00).
        if size == doff * 4:
            return True
        return None if body >= len(buf) else buf[body] == 0x00

    def evidence(self, buf: bytes | memoryview, pos: int) -> int:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return FRAME_HEADER_SIZE
        return buf[pos + 4] * 4 + 1  # to the first octet of the body

    def take_frames(self, buf: bytes, pos: int, end: int, base: int, packet_number: int, ts_us: int, out: list) -> int:
        unpack = _HEADER.unpack_from
        append = out.append
        # buf[pos] == 0x41 ("A", maybe a protocol header) would be a frame of over 1 GiB: left to the splitter.
        while end - pos >= FRAME_HEADER_SIZE and buf[pos] != 0x41:
            size, doff, frame_type, _channel = unpack(buf, pos)
            stop = pos + size
            if stop > end or doff < 2 or doff * 4 > size or frame_type not in FRAME_TYPES:
                break
            append(new_frame(RawFrame, (base + pos, buf[pos:stop], packet_number, ts_us, False)))
            pos = stop
        return pos


def descriptor_name(descriptor: Any) -> str:
    """The spec name of a descriptor code or symbol, or its text when it is not in the spec."""
    if isinstance(descriptor, int):
        composite = _SPEC.described.get(descriptor)
        return composite.name if composite else f"0x{descriptor:016x}"
    composite = _SPEC.described_by_symbol.get(str(descriptor))
    return composite.name if composite else str(descriptor)


def _composite_of(value: Described) -> Composite | None:
    return _composite_for(value.descriptor)


def _composite_for(descriptor: Any) -> Composite | None:
    if isinstance(descriptor, int):
        return _SPEC.described.get(descriptor)
    return _SPEC.described_by_symbol.get(str(descriptor))


# What ``_decode_described`` returns as the descriptor of a value that is not described.
_NOT_DESCRIBED: Final = object()


def _decode_described(buf: bytes, pos: int) -> tuple[Any, Any, int]:
    """(descriptor, value, position after) of the value at ``pos``; the descriptor is _NOT_DESCRIBED if it has none.

    The descriptor of every performative and section is a small ulong (0x00 0x53 code): that case
    is read directly, without building a ``Described`` the caller would take apart again.
    """
    if pos + 3 < len(buf) and buf[pos] == 0x00 and buf[pos + 1] == 0x53:
        decoder = DECODERS_BY_CODE[buf[pos + 3]]  # of the value: decode_value's first step, inlined
        value, end = read_value(buf, pos + 3) if decoder is None else decoder(buf, pos + 4)
        return buf[pos + 2], value, end
    value, end = read_value(buf, pos)
    if isinstance(value, Described):
        return value.descriptor, value.value, end
    return _NOT_DESCRIBED, value, end


class _FieldPlan(NamedTuple):
    name: str
    choices: Mapping[str, str] | None  # restricted type's value -> choice name
    secret: bool


class _CompositePlan(NamedTuple):
    """How ``composite_fields`` names a described list's elements, worked out once per type."""

    fields: tuple[_FieldPlan, ...]
    # The names (secrets left out) of the fields from index i on, null when a list stops at i.
    absent: tuple[tuple[str, ...], ...]


def _plan(composite: Composite) -> _CompositePlan:
    fields = tuple(
        _FieldPlan(f.name, _SPEC.choices.get(f.type), (composite.name, f.name) in SECRET_FIELDS)
        for f in composite.fields
    )
    absent = tuple(tuple(f.name for f in fields[i:] if not f.secret) for i in range(len(fields) + 1))
    return _CompositePlan(fields, absent)


_PLANS: Final = {code: _plan(composite) for code, composite in _SPEC.described.items()}
_PLAIN: Final = frozenset({type(None), bool, int, str, bytes, float})


def present(value: Any) -> Any:
    """Turn decoded values into plain Python: described lists become dicts keyed by field name."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, Described):
        composite = _composite_of(value)
        if composite is None:
            return {"$descriptor": descriptor_name(value.descriptor), "value": present(value.value)}
        if composite.source == "list" and isinstance(value.value, list):
            return {"$type": composite.name, **composite_fields(composite, value.value)}
        return {"$type": composite.name, "value": present(value.value)}
    if isinstance(value, list):
        return [present(v) for v in value]
    if isinstance(value, dict):
        return {k: present(v) for k, v in value.items()}
    return value


def composite_fields(composite: Composite, items: list[Any]) -> dict[str, Any]:
    """Name a described list's elements by the spec's field list; absent trailing fields are null.

    Elements beyond the spec's fields are kept under ``$extra`` (a peer of a later version).
    """
    fields: dict[str, Any] = {}
    count = len(items)
    plan = _PLANS[composite.code]
    plain = _PLAIN
    for (name, choices, secret), value in zip(plan.fields, items):
        if secret:
            continue
        if type(value) not in plain:
            value = present(value)
        if choices is not None and value is not None:
            key = ("true" if value else "false") if type(value) is bool else str(value)
            value = choices.get(key, value)
        fields[name] = value
    if count < len(plan.fields):
        for name in plan.absent[count]:
            fields[name] = None
    elif count > len(plan.fields):
        fields["$extra"] = present(items[len(plan.fields) :])
    return fields


def decode_frame(data: bytes) -> dict[str, Any]:
    """Decode a complete 1.0 frame: its kind, channel, performative and named fields."""
    size, doff, frame_type, channel = _HEADER.unpack_from(data, 0)
    body_start = doff * 4
    kind = FRAME_TYPES[frame_type]
    if size == body_start:
        return {"frame_type": "empty", "channel": channel, "arguments": {}}
    BUDGET.start(len(data))
    descriptor, items, end = _decode_described(data, body_start)
    if descriptor is _NOT_DESCRIBED:
        raise DecodeError("frame body is not a described performative", body_start, AMQP10_FRAME_NOT_PERFORMATIVE)
    composite = _composite_for(descriptor)
    expected = "sasl-frame" if kind == "sasl" else "frame"
    if composite is None or expected not in composite.provides or not isinstance(items, list):
        raise DecodeError(
            f"{descriptor_name(descriptor)} cannot be the body of a {kind} frame",
            body_start,
            AMQP10_FRAME_WRONG_BODY,
            expected=kind,
            found=descriptor_name(descriptor),
        )
    decoded = {
        "frame_type": kind,
        "channel": channel if kind == "amqp" else None,
        "method": composite.name,
        "arguments": composite_fields(composite, items),
    }
    if composite.name == "transfer":
        decoded["payload"] = data[end:]
    elif end != size:
        raise DecodeError(
            f"{size - end} bytes after the {composite.name} performative",
            end,
            AMQP10_FRAME_TRAILING_BYTES,
            length=size - end,
        )
    return decoded


class Section(NamedTuple):
    """One section of a message (messaging 3.2): its spec name, encoded size and decoded value."""

    name: str
    size: int
    value: Any  # fields by name for header / properties, a map for annotations, the body as decoded


# A Section from a tuple of its fields, without the NamedTuple's __new__ (Python code even compiled).
_new_section: Final = tuple.__new__


def decode_message(payload: bytes) -> list[Section]:
    """Split a whole message (the payloads of a delivery's transfers, joined) into its sections.

    Offsets in errors are from the start of the message.
    """
    sections: list[Section] = []
    BUDGET.start(len(payload))
    pos = 0
    order = -1
    body: str | None = None
    while pos < len(payload):
        start = pos
        descriptor, inner, pos = _decode_described(payload, pos)
        composite = None if descriptor is _NOT_DESCRIBED else _composite_for(descriptor)
        rules = None if composite is None else _SECTION_RULES.get(composite.name)
        if composite is None or rules is None:
            raise DecodeError("message data is not a message section", start, AMQP10_MESSAGE_NOT_A_SECTION)
        rank, repeats, is_body, source_type = rules
        if source_type is not None and not isinstance(inner, source_type):
            raise DecodeError(
                f"{composite.name} section is not a {_TYPE_NAMES[source_type]}",
                start,
                AMQP10_MESSAGE_SECTION_TYPE,
                expected=_TYPE_NAMES[source_type],
                found=composite.name,
            )
        # Sections come in spec order, and only body sections repeat (data, amqp-sequence).
        if rank < order or (rank == order and not repeats):
            raise DecodeError(
                f"{composite.name} section out of order", start, AMQP10_MESSAGE_SECTION_ORDER, found=composite.name
            )
        if is_body:
            if body is not None and body != composite.name:
                raise DecodeError(
                    f"{composite.name} section after a {body} body",
                    start,
                    AMQP10_MESSAGE_AFTER_BODY,
                    found=composite.name,
                )
            body = composite.name
        order = rank
        if composite.source == "list" and isinstance(inner, list):
            inner = composite_fields(composite, inner)
        elif type(inner) not in _PLAIN:  # a data section's bytes are already plain
            inner = present(inner)
        sections.append(_new_section(Section, (composite.name, pos - start, inner)))
    return sections


__all__ = [
    "Amqp10Format",
    "BODY_SECTIONS",
    "DecodeError",
    "FRAME_TYPES",
    "PROTOCOL",
    "PROTOCOL_HEADERS",
    "SECTIONS",
    "Section",
    "decode_frame",
    "decode_message",
    "descriptor_name",
    "present",
]
