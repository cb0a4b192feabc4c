"""AMQP 1.0 frames (transport spec section 2.3): performatives, SASL frames, empty frames.

Performatives, SASL frames, delivery states, termini and errors are described lists whose field
names and order come from the spec XML (``specs.amqp10().described``); restricted types with
choices (role, settle modes, SASL codes) are rendered by the choice names of the same files.
"""

from __future__ import annotations

import struct
from typing import Any

from amqpscope.ingest.amqp10_types import DecodeError, Described, Symbol, decode_value
from amqpscope.ingest.specs import Composite, amqp10

PROTOCOL = "amqp-1.0"
PROTOCOL_HEADERS = {
    b"AMQP\x00\x01\x00\x00": "amqp",
    b"AMQP\x03\x01\x00\x00": "sasl",
    b"AMQP\x02\x01\x00\x00": "tls",
}
FRAME_HEADER_SIZE = 8  # size(4) doff(1) type(1) type-specific(2)
FRAME_TYPES = {0x00: "amqp", 0x01: "sasl"}
_HEADER = struct.Struct(">IBBH")
_PLAUSIBLE_MAX_SIZE = 1 << 27

_SPEC = amqp10()

# Fields that carry credentials (SASL PLAIN puts the password in the initial response).
SECRET_FIELDS = frozenset({("sasl-init", "initial-response"), ("sasl-response", "response")})


class Amqp10Format:
    """Frame boundaries of 1.0: a 4-byte size that includes the 8-byte frame header."""

    def frame_length(self, buf: memoryview, pos: int) -> int | None:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return None
        size, doff, frame_type, _channel = _HEADER.unpack_from(buf, pos)
        if size < FRAME_HEADER_SIZE:
            raise ValueError(f"frame size {size} is below the 8-byte minimum")
        if doff < 2 or doff * 4 > size:
            raise ValueError(f"data offset {doff} does not fit a {size}-byte frame")
        if frame_type not in FRAME_TYPES:
            raise ValueError(f"unknown 1.0 frame type {frame_type}")
        return size

    def validate(self, frame: memoryview) -> str | None:
        return None

    def plausible(self, buf: memoryview, pos: int) -> bool | None:
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


def descriptor_name(descriptor: Any) -> str:
    """The spec name of a descriptor code or symbol, or its text when it is not in the spec."""
    if isinstance(descriptor, int):
        composite = _SPEC.described.get(descriptor)
        return composite.name if composite else f"0x{descriptor:016x}"
    composite = _SPEC.described_by_symbol.get(str(descriptor))
    return composite.name if composite else str(descriptor)


def _composite_of(value: Described) -> Composite | None:
    d = value.descriptor
    return _SPEC.described.get(d) if isinstance(d, int) else _SPEC.described_by_symbol.get(str(d))


def _choice(type_name: str, value: Any) -> Any:
    choices = _SPEC.choices.get(type_name)
    if choices is None or value is None:
        return value
    key = str(value).lower() if isinstance(value, bool) else str(value)
    return choices.get(key, value)


def present(value: Any) -> Any:
    """Turn decoded values into plain Python: described lists become dicts keyed by field name."""
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
    """Name a described list's elements by the spec's field list; absent trailing fields are null."""
    fields: dict[str, Any] = {}
    for index, field in enumerate(composite.fields):
        if (composite.name, field.name) in SECRET_FIELDS:
            continue
        value = items[index] if index < len(items) else None
        fields[field.name] = _choice(field.type, present(value))
    return fields


def decode_frame(data: bytes) -> dict[str, Any]:
    """Decode a complete 1.0 frame: its kind, channel, performative and named fields."""
    size, doff, frame_type, channel = _HEADER.unpack_from(data, 0)
    body_start = doff * 4
    kind = FRAME_TYPES[frame_type]
    if size == body_start:
        return {"frame_type": "empty", "channel": channel, "arguments": {}}
    with memoryview(data) as buf:
        performative, end = decode_value(buf, body_start)
    if not isinstance(performative, Described):
        raise DecodeError("frame body is not a described performative", body_start)
    composite = _composite_of(performative)
    expected = "sasl-frame" if kind == "sasl" else "frame"
    if composite is None or expected not in composite.provides or not isinstance(performative.value, list):
        raise DecodeError(f"{descriptor_name(performative.descriptor)} is not a {kind} performative", body_start)
    arguments = composite_fields(composite, performative.value)
    decoded = {
        "frame_type": kind,
        "channel": channel if kind == "amqp" else None,
        "method": composite.name,
        "arguments": arguments,
    }
    if composite.name == "transfer":
        decoded["payload"] = data[end:]
    return decoded


def decode_sections(payload: bytes) -> list[dict[str, Any]]:
    """Split a complete message into its sections (messaging spec 3.2), each with its byte size."""
    sections = []
    pos = 0
    with memoryview(payload) as buf:
        while pos < len(buf):
            start = pos
            value, pos = decode_value(buf, pos)
            name = descriptor_name(value.descriptor) if isinstance(value, Described) else type(value).__name__
            sections.append({"section": name, "size": pos - start, "value": present(value)})
    return sections


__all__ = [
    "Amqp10Format",
    "DecodeError",
    "FRAME_TYPES",
    "PROTOCOL",
    "PROTOCOL_HEADERS",
    "Symbol",
    "decode_frame",
    "decode_sections",
    "descriptor_name",
    "present",
]
