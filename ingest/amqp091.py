"""AMQP 0-9-1 frames: framing (spec section 4.2.3), methods, content headers, bodies, heartbeats.

Method ids and argument lists come from RabbitMQ's JSON definition (``specs.amqp091()``):
``amqp091_codegen`` generates one decoder per method and one for the basic properties
(``amqp091_methods``), which read the fixed-width arguments and packed bits of a run with a single
``struct`` call. Strings, timestamps and field tables are read by ``amqp091_values``.

Every decoder reads the whole frame (``data``) between ``pos`` and ``end`` and reports errors as a
``DecodeError`` with the offset from the start of the frame.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from amqpscope.ingest.amqp091_methods import METHODS, decode_basic_properties
from amqpscope.ingest.amqp091_values import short_of
from amqpscope.ingest.framing import FrameError, RawFrame, new_frame
from amqpscope.ingest.limits import BUDGET
from amqpscope.ingest.reasons import (
    AMQP091_FRAME_BAD_FRAME_END,
    AMQP091_FRAME_TRAILING_BYTES,
    AMQP091_FRAME_UNKNOWN_TYPE,
    AMQP091_HEADER_BAD_WEIGHT,
    AMQP091_HEARTBEAT_PAYLOAD,
    AMQP091_METHOD_UNKNOWN,
    AMQP091_PROPERTIES_UNKNOWN_FLAG,
    DecodeError,
)
from amqpscope.ingest.specs import amqp091

PROTOCOL: Final[str] = "amqp-0-9-1"
PROTOCOL_HEADER: Final[bytes] = b"AMQP\x00\x00\x09\x01"

_SPEC: Final = amqp091()
FRAME_TYPES: Final = {
    _SPEC.constants["FRAME-METHOD"]: "method",
    _SPEC.constants["FRAME-HEADER"]: "header",
    _SPEC.constants["FRAME-BODY"]: "body",
    _SPEC.constants["FRAME-HEARTBEAT"]: "heartbeat",
}
_FRAME_TYPE_CODES: Final = ", ".join(str(code) for code in sorted(FRAME_TYPES))
FRAME_METHOD: Final = _SPEC.constants["FRAME-METHOD"]
FRAME_HEADER: Final = _SPEC.constants["FRAME-HEADER"]
FRAME_BODY: Final = _SPEC.constants["FRAME-BODY"]
FRAME_END: Final = _SPEC.constants["FRAME-END"]
FRAME_HEADER_SIZE: Final = 7  # type(1) channel(2) size(4)
# Upper bound used only to tell a plausible frame from garbage when resynchronising.
_PLAUSIBLE_MAX_SIZE: Final = 1 << 27

_HEADER: Final = struct.Struct(">BHI")
_unpack_size: Final = struct.Struct(">I").unpack_from
_CONTENT_HEADER: Final = struct.Struct(">HHQ")  # class-id, weight, body-size (spec 4.2.6.1)


class Amqp091Format:
    """Frame boundaries of 0-9-1: a 7-byte header, the payload, and frame-end 0xCE."""

    def frame_length(self, buf: bytes | memoryview, pos: int) -> int | None:
        if buf[pos] not in FRAME_TYPES:
            raise FrameError(
                f"unknown 0-9-1 frame type {buf[pos]}",
                0,
                AMQP091_FRAME_UNKNOWN_TYPE,
                expected=_FRAME_TYPE_CODES,
                found=str(buf[pos]),
            )
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return None
        return FRAME_HEADER_SIZE + _unpack_size(buf, pos + 3)[0] + 1

    def validate(self, buf: bytes, pos: int, length: int) -> FrameError | None:
        end = buf[pos + length - 1]
        if end == FRAME_END:
            return None
        return FrameError(
            f"frame-end is 0x{end:02x}, not 0xce",
            length - 1,
            AMQP091_FRAME_BAD_FRAME_END,
            length=length,
            expected="0xce",
            found=f"0x{end:02x}",
        )

    def plausible(self, buf: bytes | memoryview, pos: int) -> bool | None:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return None
        frame_type, _channel, size = _HEADER.unpack_from(buf, pos)
        if frame_type not in FRAME_TYPES or size > _PLAUSIBLE_MAX_SIZE:
            return False
        end = pos + FRAME_HEADER_SIZE + size
        # The frame-end octet is the evidence; until it has arrived, the answer is unknown.
        return None if end >= len(buf) else buf[end] == FRAME_END

    def evidence(self, buf: bytes | memoryview, pos: int) -> int:
        if len(buf) - pos < FRAME_HEADER_SIZE:
            return FRAME_HEADER_SIZE
        return FRAME_HEADER_SIZE + _unpack_size(buf, pos + 3)[0] + 1  # to the frame-end octet

    def take_frames(self, buf: bytes, pos: int, end: int, base: int, packet_number: int, ts_us: int, out: list) -> int:
        frame_types = FRAME_TYPES  # a protocol header's "A" (0x41) is no frame type: it stops here
        append = out.append
        while end - pos >= FRAME_HEADER_SIZE and buf[pos] in frame_types:
            stop = pos + FRAME_HEADER_SIZE + 1 + _unpack_size(buf, pos + 3)[0]
            if stop > end or buf[stop - 1] != FRAME_END:
                break
            append(new_frame(RawFrame, (base + pos, buf[pos:stop], packet_number, ts_us, False)))
            pos = stop
        return pos


# Method ids and argument decoders are generated from the spec (``amqp091_methods``, by
# ``amqp091_codegen``); content headers are named by their class ("basic.header").
_HEADER_METHODS: Final = {class_id: f"{name}.header" for class_id, name in _SPEC.class_names.items()}
_METHOD_HEADER: Final = struct.Struct(">BHIHH")  # frame header, class-id, method-id
# Flag bits of the first word past basic's properties (bit 0 only says another word follows).
_NO_SUCH_PROPERTY: Final = sum(1 << (15 - i) for i in range(len(_SPEC.basic_properties), 15))


def decode_properties(data: bytes, pos: int, end: int) -> dict[str, Any]:
    """Basic content properties (spec 4.2.6.1): 15-bit flag words (bit 0: another word follows), then
    the values of the properties whose flags are set, in flag order."""
    first = -1
    unknown = 0
    while True:
        if pos + 2 > end:
            raise short_of(2, pos, end)
        word = data[pos] << 8 | data[pos + 1]
        pos += 2
        if first < 0:
            first = word
            unknown = word & _NO_SUCH_PROPERTY
        else:
            unknown |= word & 0xFFFE
        if not word & 1:
            break
    if unknown:
        raise DecodeError(
            "property flags name a property basic does not have",
            pos - 2,
            AMQP091_PROPERTIES_UNKNOWN_FLAG,
            found=f"0x{unknown:04x}",
        )
    properties, stop = decode_basic_properties(data, pos, end, first)
    if stop != end:
        raise DecodeError(
            f"{end - stop} bytes after the arguments of basic.properties",
            stop,
            AMQP091_FRAME_TRAILING_BYTES,
            length=end - stop,
        )
    return properties


def decode_frame(data: bytes) -> dict[str, Any]:
    """Decode a complete 0-9-1 frame into its kind and named arguments (spec names, unsnaked)."""
    frame_type, channel, size = _HEADER.unpack_from(data, 0)
    end = FRAME_HEADER_SIZE + size
    BUDGET.start(len(data))
    if frame_type == FRAME_METHOD:
        if size < 4:
            raise short_of(4, FRAME_HEADER_SIZE, end)
        _type, _channel, _size, class_id, method_id = _METHOD_HEADER.unpack_from(data, 0)
        known = METHODS.get(class_id << 16 | method_id)
        if known is None:
            raise DecodeError(
                f"unknown method {class_id}.{method_id}",
                FRAME_HEADER_SIZE,
                AMQP091_METHOD_UNKNOWN,
                found=f"{class_id}.{method_id}",
            )
        name, decode_arguments = known
        arguments, stop = decode_arguments(data, FRAME_HEADER_SIZE + 4, end)
        if stop != end:
            raise DecodeError(
                f"{end - stop} bytes after the arguments of {name}",
                stop,
                AMQP091_FRAME_TRAILING_BYTES,
                length=end - stop,
            )
        return {
            "frame_type": "method",
            "channel": channel,
            "class_id": class_id,
            "method_id": method_id,
            "method": name,
            "arguments": arguments,
        }
    if frame_type == FRAME_BODY:
        return {"frame_type": "body", "channel": channel, "arguments": {"body-length": size}}
    if frame_type == FRAME_HEADER:
        if size < 14:
            raise short_of(14, FRAME_HEADER_SIZE, end)
        class_id, weight, body_size = _CONTENT_HEADER.unpack_from(data, FRAME_HEADER_SIZE)
        if weight:
            raise DecodeError(
                f"content header weight is {weight}, not 0",
                FRAME_HEADER_SIZE + 2,
                AMQP091_HEADER_BAD_WEIGHT,
                expected="0",
                found=str(weight),
            )
        arguments = {"body-size": body_size, **decode_properties(data, FRAME_HEADER_SIZE + 12, end)}
        return {
            "frame_type": "header",
            "channel": channel,
            "class_id": class_id,
            "method": _HEADER_METHODS.get(class_id) or f"{class_id}.header",
            "arguments": arguments,
        }
    if size:
        raise DecodeError(
            f"heartbeat frame with a {size}-byte payload",
            FRAME_HEADER_SIZE,
            AMQP091_HEARTBEAT_PAYLOAD,
            expected="0",
            found=str(size),
        )
    return {"frame_type": "heartbeat", "channel": channel, "arguments": {}}
