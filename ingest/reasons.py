"""Why bytes were not decoded: every reason has a stable id, as Wireshark's expert info has.

A quarantine row (``schemas.frames.QUARANTINE_SCHEMA``) carries its reason three ways: the id
(``reason_id``, one of ``REASONS``: reports, dashboards and tests group and count by it), a sentence
for people (``reason``, with the place in words), and the details that make one occurrence differ
from another in columns of their own (``error_offset``, ``error_length``, ``expected``, ``found``), so
that one cause is one group however many offsets it was met at.

Ids are dotted and lower-case, by layer: ``capture.`` the capture file, ``tcp.`` reassembly,
``connection.`` a connection on an AMQP port that is not decoded, ``framing.`` the frame splitter
of either version, ``tls.`` the TLS record layer, ``amqp091.`` / ``amqp10.`` the versions' framing and decoders, ``limit.`` the
decoders' limits (``ingest.limits``), ``decoder.`` a defect of ours. A decoder failure inside an AMQP
1.0 message does not quarantine its transfer (the transfer stays a frame, with ``message-error`` in
``frames.arguments``): those ids name message errors. docs/RULES.md lists them all
(``expectations.rules_doc``). Each id is named once, by a constant here (``TCP_GAP``), and the code
gives the constant, never the id written out: tests/test_reasons.py checks that no literal id is
left outside this module, and that every constant is given somewhere.
"""

from __future__ import annotations

from typing import Final, NamedTuple

# Every reason id, named once: the code gives these names, never the bare id (tests/test_reasons.py).
# The capture file (``stream_offset`` and ``error_offset`` are file offsets; no connection).
CAPTURE_UNREADABLE: Final = "capture.unreadable"
CAPTURE_RECORD_LENGTH_IMPOSSIBLE: Final = "capture.record_length_impossible"
CAPTURE_BLOCK_LENGTH_IMPOSSIBLE: Final = "capture.block_length_impossible"
CAPTURE_BLOCK_LENGTH_NOT_REPEATED: Final = "capture.block_length_not_repeated"
CAPTURE_TRUNCATED: Final = "capture.truncated"
CAPTURE_DAMAGED: Final = "capture.damaged"
# TCP reassembly.
TCP_GAP: Final = "tcp.gap"
# A connection on an AMQP port whose bytes are not decoded (one row a direction).
CONNECTION_NOT_AMQP: Final = "connection.not_amqp"
CONNECTION_TLS: Final = "connection.tls"
CONNECTION_AMQP_OVER_TLS: Final = "connection.amqp_over_tls"
CONNECTION_UNSUPPORTED_PROTOCOL_HEADER: Final = "connection.unsupported_protocol_header"
CONNECTION_NO_CLIENT_BYTES: Final = "connection.no_client_bytes"
# The TLS record layer (``ingest.tls_stream``): bytes of a TLS connection not decrypted.
TLS_NO_KEY: Final = "tls.no_key"
TLS_DECRYPT_FAILED: Final = "tls.decrypt_failed"
TLS_CIPHER_UNSUPPORTED: Final = "tls.cipher_unsupported"
TLS_RECORD_TRUNCATED: Final = "tls.record_truncated"
TLS_SEGMENT_MISSING: Final = "tls.segment_missing"
TLS_NOT_A_RECORD: Final = "tls.not_a_record"
TLS_NO_HANDSHAKE: Final = "tls.no_handshake"
TLS_NOT_AMQP: Final = "tls.not_amqp"
# The frame splitter (``ingest.framing``), either version.
FRAMING_INCOMPLETE_FRAME: Final = "framing.incomplete_frame"
FRAMING_MID_STREAM_START: Final = "framing.mid_stream_start"
FRAMING_CUT_BY_GAP: Final = "framing.cut_by_gap"
AMQP091_FRAME_UNKNOWN_TYPE: Final = "amqp091.frame.unknown_type"
AMQP091_FRAME_BAD_FRAME_END: Final = "amqp091.frame.bad_frame_end"
AMQP10_FRAME_SIZE_BELOW_MINIMUM: Final = "amqp10.frame.size_below_minimum"
AMQP10_FRAME_BAD_DATA_OFFSET: Final = "amqp10.frame.bad_data_offset"
AMQP10_FRAME_UNKNOWN_TYPE: Final = "amqp10.frame.unknown_type"
# The 0-9-1 decoder (the whole frame is quarantined; error_offset: where decoding stopped).
AMQP091_METHOD_UNKNOWN: Final = "amqp091.method.unknown"
AMQP091_FRAME_TRAILING_BYTES: Final = "amqp091.frame.trailing_bytes"
AMQP091_PROPERTIES_UNKNOWN_FLAG: Final = "amqp091.properties.unknown_flag"
AMQP091_HEADER_BAD_WEIGHT: Final = "amqp091.header.bad_weight"
AMQP091_HEARTBEAT_PAYLOAD: Final = "amqp091.heartbeat.payload"
AMQP091_VALUE_TRUNCATED: Final = "amqp091.value.truncated"
AMQP091_VALUE_OVERRUNS_FRAME: Final = "amqp091.value.overruns_frame"
AMQP091_VALUE_UNKNOWN_TYPE: Final = "amqp091.value.unknown_type"
# The 1.0 type system and frame bodies.
AMQP10_VALUE_TRUNCATED: Final = "amqp10.value.truncated"
AMQP10_VALUE_BAD_BOOLEAN: Final = "amqp10.value.bad_boolean"
AMQP10_VALUE_INVALID: Final = "amqp10.value.invalid"
AMQP10_VALUE_BAD_UTF8: Final = "amqp10.value.bad_utf8"
AMQP10_VALUE_BAD_ASCII: Final = "amqp10.value.bad_ascii"
AMQP10_VALUE_OVERRUNS_FRAME: Final = "amqp10.value.overruns_frame"
AMQP10_VALUE_COUNT_EXCEEDS_SIZE: Final = "amqp10.value.count_exceeds_size"
AMQP10_VALUE_SIZE_MISMATCH: Final = "amqp10.value.size_mismatch"
AMQP10_VALUE_ODD_MAP: Final = "amqp10.value.odd_map"
AMQP10_VALUE_UNKNOWN_FORMAT_CODE: Final = "amqp10.value.unknown_format_code"
AMQP10_FRAME_NOT_PERFORMATIVE: Final = "amqp10.frame.not_performative"
AMQP10_FRAME_WRONG_BODY: Final = "amqp10.frame.wrong_body"
AMQP10_FRAME_TRAILING_BYTES: Final = "amqp10.frame.trailing_bytes"
# 1.0 message errors: the transfer stays decoded, with ``message-error`` in its arguments.
AMQP10_MESSAGE_NOT_A_SECTION: Final = "amqp10.message.not_a_section"
AMQP10_MESSAGE_SECTION_TYPE: Final = "amqp10.message.section_type"
AMQP10_MESSAGE_SECTION_ORDER: Final = "amqp10.message.section_order"
AMQP10_MESSAGE_AFTER_BODY: Final = "amqp10.message.after_body"
# The decoders' limits (``ingest.limits``; docs/RELIABILITY.md gives their values).
LIMIT_DEPTH: Final = "limit.depth"
LIMIT_ELEMENTS: Final = "limit.elements"
LIMIT_OBJECTS: Final = "limit.objects"
LIMIT_VALUE_BYTES: Final = "limit.value_bytes"
# Ours.
DECODER_DEFECT: Final = "decoder.defect"

# Reason id -> what it means (docs/RULES.md, "Quarantine reasons").
REASONS: Final[dict[str, str]] = {
    # The capture file (``stream_offset`` and ``error_offset`` are file offsets; no connection).
    CAPTURE_UNREADABLE: "the file is not a capture that can be read at all (no pcap or pcapng header): none of "
    "it is decoded (`amqpscope ingest` records it and goes on with the batch)",
    CAPTURE_RECORD_LENGTH_IMPOSSIBLE: "a pcap record claims more bytes than a capture tool writes (256 KiB): "
    "skipped to the next plausible record (found: the length claimed)",
    CAPTURE_BLOCK_LENGTH_IMPOSSIBLE: "a pcapng block's length is below its type's minimum, not a multiple of 4 "
    "or beyond any block: skipped to the next plausible block (found)",
    CAPTURE_BLOCK_LENGTH_NOT_REPEATED: "a pcapng block does not repeat its length at its end (pcapng 3.1): "
    "skipped to the next plausible block (expected, found)",
    CAPTURE_TRUNCATED: "the file ends inside a record or block: it was cut short, or is still being written "
    "(expected: the bytes the record needs, found: the bytes there)",
    CAPTURE_DAMAGED: "the file could not be read past this place (the sentence says why)",
    # TCP reassembly.
    TCP_GAP: "bytes missing from the capture: a segment the capture lost, or bytes cut by the snapshot "
    "length (missing=true: never seen)",
    # A connection on an AMQP port whose bytes are not decoded (one row a direction).
    CONNECTION_NOT_AMQP: "neither an AMQP protocol header nor AMQP frame shapes: another protocol",
    CONNECTION_TLS: "a TLS handshake: encrypted, not decoded",
    CONNECTION_AMQP_OVER_TLS: "AMQP's TLS protocol header (AMQP 2 1 0 0), then TLS: encrypted, not decoded",
    CONNECTION_UNSUPPORTED_PROTOCOL_HEADER: "an AMQP protocol header of a version not decoded (found: the "
    "header's bytes in hex)",
    CONNECTION_NO_CLIENT_BYTES: "the client's bytes are not in the capture, so nothing tells the protocol",
    # The TLS record layer (``ingest.tls_stream``): bytes of a TLS connection not decrypted.
    TLS_NO_KEY: "encrypted, not decoded: the key log has no secret for this TLS session (give --tls-keylog)",
    TLS_DECRYPT_FAILED: "encrypted, not decoded: the record does not decrypt with the key log's secret for "
    "this session (keys of another session, or a damaged record)",
    TLS_CIPHER_UNSUPPORTED: "encrypted, not decoded: the cipher suite is not one amqpscope decrypts "
    "(AES-GCM or ChaCha20-Poly1305)",
    TLS_RECORD_TRUNCATED: "the capture ends inside a TLS record",
    TLS_SEGMENT_MISSING: "part of a TLS record missing from the capture: the record cannot be decrypted",
    TLS_NOT_A_RECORD: "bytes that are not a TLS record (no plausible record header)",
    TLS_NO_HANDSHAKE: "encrypted, not decoded: the TLS handshake that would find this session's keys is not "
    "in the capture",
    TLS_NOT_AMQP: "decrypted, but the application data is not AMQP",
    # The frame splitter (``ingest.framing``), either version.
    FRAMING_INCOMPLETE_FRAME: "the stream ends inside a frame (a capture that stops mid-frame; error_length: "
    "the bytes of it seen)",
    FRAMING_MID_STREAM_START: "bytes before the first frame of a direction the capture picked up mid-stream "
    "(no SYN captured): the rest of a frame it started inside",
    FRAMING_CUT_BY_GAP: "a frame cut short by a capture gap: its bytes before the gap cannot complete it "
    "(error_length)",
    AMQP091_FRAME_UNKNOWN_TYPE: "bytes that cannot start a 0-9-1 frame: the type octet is none of method, "
    "header, body, heartbeat (found); skipped to the next plausible frame",
    AMQP091_FRAME_BAD_FRAME_END: "a 0-9-1 frame whose frame-end octet is not 0xCE (spec 4.2.3; expected, "
    "found; error_offset: that octet)",
    AMQP10_FRAME_SIZE_BELOW_MINIMUM: "a 1.0 frame size below the 8-byte header (transport 2.3.1; found)",
    AMQP10_FRAME_BAD_DATA_OFFSET: "a 1.0 data offset below 2 words or beyond the frame (transport 2.3.1; found, "
    "error_length: the frame size)",
    AMQP10_FRAME_UNKNOWN_TYPE: "a 1.0 frame type that is neither AMQP (0x00) nor SASL (0x01) (found)",
    # The 0-9-1 decoder (the whole frame is quarantined; error_offset: where decoding stopped).
    AMQP091_METHOD_UNKNOWN: "a class and method id pair the spec does not have (found)",
    AMQP091_FRAME_TRAILING_BYTES: "bytes after the last argument of a method or of the content properties "
    "(error_length)",
    AMQP091_PROPERTIES_UNKNOWN_FLAG: "content property flags name a property the basic class does not have",
    AMQP091_HEADER_BAD_WEIGHT: "a content header whose weight is not 0 (spec 4.2.6.1; expected, found)",
    AMQP091_HEARTBEAT_PAYLOAD: "a heartbeat frame with a payload (spec 4.2.7; expected, found: its size)",
    AMQP091_VALUE_TRUNCATED: "a value needs more bytes than the frame has left (expected, found)",
    AMQP091_VALUE_OVERRUNS_FRAME: "a table, array or string whose declared size runs past the frame "
    "(error_length: the size declared)",
    AMQP091_VALUE_UNKNOWN_TYPE: "a field value type letter RabbitMQ's field tables do not have (found)",
    # The 1.0 type system and frame bodies.
    AMQP10_VALUE_TRUNCATED: "a value needs more bytes than the frame has left (expected, found)",
    AMQP10_VALUE_BAD_BOOLEAN: "a boolean octet that is neither 0x00 nor 0x01 (types 1.6.2; found)",
    AMQP10_VALUE_INVALID: "a fixed-width value that is none of its type's (a char that is no Unicode scalar "
    "value, ...; found)",
    AMQP10_VALUE_BAD_UTF8: "a string that is not valid UTF-8 (types 1.6.20)",
    AMQP10_VALUE_BAD_ASCII: "a symbol that is not ASCII (types 1.6.21)",
    AMQP10_VALUE_OVERRUNS_FRAME: "a variable-width or compound value whose size runs past the frame "
    "(error_length: the size declared)",
    AMQP10_VALUE_COUNT_EXCEEDS_SIZE: "a compound value declaring more elements than its bytes can hold "
    "(error_length: its size, found: the count)",
    AMQP10_VALUE_SIZE_MISMATCH: "a compound value whose elements do not fill exactly the size it declares",
    AMQP10_VALUE_ODD_MAP: "a map with an odd number of elements (types 1.6.23; found)",
    AMQP10_VALUE_UNKNOWN_FORMAT_CODE: "a format code the type system does not have (found)",
    AMQP10_FRAME_NOT_PERFORMATIVE: "a frame body that is not a described performative (transport 2.3.2)",
    AMQP10_FRAME_WRONG_BODY: "a described value that is not a performative of the frame's type (found, "
    "expected: the frame type)",
    AMQP10_FRAME_TRAILING_BYTES: "bytes after the performative that no transfer payload may hold (error_length)",
    # 1.0 message errors: the transfer stays decoded, with ``message-error`` in its arguments.
    AMQP10_MESSAGE_NOT_A_SECTION: "message data that is not a described message section (messaging 3.2)",
    AMQP10_MESSAGE_SECTION_TYPE: "a message section whose value is not of its spec type (found, expected)",
    AMQP10_MESSAGE_SECTION_ORDER: "message sections out of their spec order (messaging 3.2)",
    AMQP10_MESSAGE_AFTER_BODY: "a section after a body of another kind (messaging 3.2)",
    # The decoders' limits (``ingest.limits``; docs/RELIABILITY.md gives their values).
    LIMIT_DEPTH: "values nested deeper than MAX_DEPTH levels (expected: at most that many)",
    LIMIT_ELEMENTS: "one compound value declaring more than MAX_ELEMENTS elements (found, expected)",
    LIMIT_OBJECTS: "a frame that would decode to more values than its bytes and MAX_OBJECTS more (expected)",
    LIMIT_VALUE_BYTES: "one string, binary or symbol of more than MAX_VALUE_BYTES bytes (found, expected)",
    # Ours.
    DECODER_DEFECT: "an exception of the decoder itself inside one frame: a bug (found: its type); the frame "
    "is quarantined and decoding goes on",
}


class Reason(NamedTuple):
    """A reason met while decoding: its id, its sentence, and its details (where known)."""

    id: str
    text: str
    length: int | None = None
    expected: str | None = None
    found: str | None = None


class DecodeError(ValueError):
    """Bytes that do not decode; ``offset`` is relative to the start of the frame. ``reason_id`` is one
    of ``REASONS``; ``length``, ``expected`` and ``found`` are its details, where there are any."""

    def __init__(
        self,
        reason: str,
        offset: int,
        reason_id: str,
        length: int | None = None,
        expected: str | None = None,
        found: str | None = None,
    ) -> None:
        super().__init__(f"{reason} at byte {offset}")
        self.reason = reason
        self.offset = offset
        self.reason_id = reason_id
        self.length = length
        self.expected = expected
        self.found = found


def beyond(limit: Reason, offset: int) -> DecodeError:
    """The error of a frame that went past one of the decoders' limits (``ingest.limits.Budget``)."""
    return DecodeError(limit.text, offset, limit.id, limit.length, limit.expected, limit.found)
