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
(``expectations.rules_doc``); tests/test_reasons.py checks that every id the ingest code gives is
here, and every id here is given somewhere.
"""

from __future__ import annotations

from typing import Final, NamedTuple

# Reason id -> what it means (docs/RULES.md, "Quarantine reasons").
REASONS: Final[dict[str, str]] = {
    # The capture file (``stream_offset`` and ``error_offset`` are file offsets; no connection).
    "capture.unreadable": "the file is not a capture that can be read at all (no pcap or pcapng header): none of "
    "it is decoded (`amqpscope ingest` records it and goes on with the batch)",
    "capture.record_length_impossible": "a pcap record claims more bytes than a capture tool writes (256 KiB): "
    "skipped to the next plausible record (found: the length claimed)",
    "capture.block_length_impossible": "a pcapng block's length is below its type's minimum, not a multiple of 4 "
    "or beyond any block: skipped to the next plausible block (found)",
    "capture.block_length_not_repeated": "a pcapng block does not repeat its length at its end (pcapng 3.1): "
    "skipped to the next plausible block (expected, found)",
    "capture.truncated": "the file ends inside a record or block: it was cut short, or is still being written "
    "(expected: the bytes the record needs, found: the bytes there)",
    "capture.damaged": "the file could not be read past this place (the sentence says why)",
    # TCP reassembly.
    "tcp.gap": "bytes missing from the capture: a segment the capture lost, or bytes cut by the snapshot "
    "length (missing=true: never seen)",
    # A connection on an AMQP port whose bytes are not decoded (one row a direction).
    "connection.not_amqp": "neither an AMQP protocol header nor AMQP frame shapes: another protocol",
    "connection.tls": "a TLS handshake: encrypted, not decoded",
    "connection.amqp_over_tls": "AMQP's TLS protocol header (AMQP 2 1 0 0), then TLS: encrypted, not decoded",
    "connection.unsupported_protocol_header": "an AMQP protocol header of a version not decoded (found: the "
    "header's bytes in hex)",
    "connection.no_client_bytes": "the client's bytes are not in the capture, so nothing tells the protocol",
    # The TLS record layer (``ingest.tls_stream``): bytes of a TLS connection not decrypted.
    "tls.no_key": "encrypted, not decoded: the key log has no secret for this TLS session (give --tls-keylog)",
    "tls.decrypt_failed": "encrypted, not decoded: the record does not decrypt with the key log's secret for "
    "this session (keys of another session, or a damaged record)",
    "tls.cipher_unsupported": "encrypted, not decoded: the cipher suite is not one amqpscope decrypts "
    "(AES-GCM or ChaCha20-Poly1305)",
    "tls.record_truncated": "the capture ends inside a TLS record",
    "tls.segment_missing": "part of a TLS record missing from the capture: the record cannot be decrypted",
    "tls.not_a_record": "bytes that are not a TLS record (no plausible record header)",
    "tls.no_handshake": "encrypted, not decoded: the TLS handshake that would find this session's keys is not "
    "in the capture",
    "tls.not_amqp": "decrypted, but the application data is not AMQP",
    # The frame splitter (``ingest.framing``), either version.
    "framing.incomplete_frame": "the stream ends inside a frame (a capture that stops mid-frame; error_length: "
    "the bytes of it seen)",
    "framing.mid_stream_start": "bytes before the first frame of a direction the capture picked up mid-stream "
    "(no SYN captured): the rest of a frame it started inside",
    "framing.cut_by_gap": "a frame cut short by a capture gap: its bytes before the gap cannot complete it "
    "(error_length)",
    "amqp091.frame.unknown_type": "bytes that cannot start a 0-9-1 frame: the type octet is none of method, "
    "header, body, heartbeat (found); skipped to the next plausible frame",
    "amqp091.frame.bad_frame_end": "a 0-9-1 frame whose frame-end octet is not 0xCE (spec 4.2.3; expected, "
    "found; error_offset: that octet)",
    "amqp10.frame.size_below_minimum": "a 1.0 frame size below the 8-byte header (transport 2.3.1; found)",
    "amqp10.frame.bad_data_offset": "a 1.0 data offset below 2 words or beyond the frame (transport 2.3.1; found, "
    "error_length: the frame size)",
    "amqp10.frame.unknown_type": "a 1.0 frame type that is neither AMQP (0x00) nor SASL (0x01) (found)",
    # The 0-9-1 decoder (the whole frame is quarantined; error_offset: where decoding stopped).
    "amqp091.method.unknown": "a class and method id pair the spec does not have (found)",
    "amqp091.frame.trailing_bytes": "bytes after the last argument of a method or of the content properties "
    "(error_length)",
    "amqp091.properties.unknown_flag": "content property flags name a property the basic class does not have",
    "amqp091.header.bad_weight": "a content header whose weight is not 0 (spec 4.2.6.1; expected, found)",
    "amqp091.heartbeat.payload": "a heartbeat frame with a payload (spec 4.2.7; expected, found: its size)",
    "amqp091.value.truncated": "a value needs more bytes than the frame has left (expected, found)",
    "amqp091.value.overruns_frame": "a table, array or string whose declared size runs past the frame "
    "(error_length: the size declared)",
    "amqp091.value.unknown_type": "a field value type letter RabbitMQ's field tables do not have (found)",
    # The 1.0 type system and frame bodies.
    "amqp10.value.truncated": "a value needs more bytes than the frame has left (expected, found)",
    "amqp10.value.bad_boolean": "a boolean octet that is neither 0x00 nor 0x01 (types 1.6.2; found)",
    "amqp10.value.invalid": "a fixed-width value that is none of its type's (a char that is no Unicode scalar "
    "value, ...; found)",
    "amqp10.value.bad_utf8": "a string that is not valid UTF-8 (types 1.6.20)",
    "amqp10.value.bad_ascii": "a symbol that is not ASCII (types 1.6.21)",
    "amqp10.value.overruns_frame": "a variable-width or compound value whose size runs past the frame "
    "(error_length: the size declared)",
    "amqp10.value.count_exceeds_size": "a compound value declaring more elements than its bytes can hold "
    "(error_length: its size, found: the count)",
    "amqp10.value.size_mismatch": "a compound value whose elements do not fill exactly the size it declares",
    "amqp10.value.odd_map": "a map with an odd number of elements (types 1.6.23; found)",
    "amqp10.value.unknown_format_code": "a format code the type system does not have (found)",
    "amqp10.frame.not_performative": "a frame body that is not a described performative (transport 2.3.2)",
    "amqp10.frame.wrong_body": "a described value that is not a performative of the frame's type (found, "
    "expected: the frame type)",
    "amqp10.frame.trailing_bytes": "bytes after the performative that no transfer payload may hold (error_length)",
    # 1.0 message errors: the transfer stays decoded, with ``message-error`` in its arguments.
    "amqp10.message.not_a_section": "message data that is not a described message section (messaging 3.2)",
    "amqp10.message.section_type": "a message section whose value is not of its spec type (found, expected)",
    "amqp10.message.section_order": "message sections out of their spec order (messaging 3.2)",
    "amqp10.message.after_body": "a section after a body of another kind (messaging 3.2)",
    # The decoders' limits (``ingest.limits``; docs/RELIABILITY.md gives their values).
    "limit.depth": "values nested deeper than MAX_DEPTH levels (expected: at most that many)",
    "limit.elements": "one compound value declaring more than MAX_ELEMENTS elements (found, expected)",
    "limit.objects": "a frame that would decode to more values than its bytes and MAX_OBJECTS more (expected)",
    "limit.value_bytes": "one string, binary or symbol of more than MAX_VALUE_BYTES bytes (found, expected)",
    # Ours.
    "decoder.defect": "an exception of the decoder itself inside one frame: a bug (found: its type); the frame "
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
