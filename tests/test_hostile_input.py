"""Issue 12's cases, decoder half: bytes on the wire that once stopped, crashed, exhausted or stalled
a decode. Each is built here from the spec layouts (``tests.amqp_bytes``), sent through the
per-packet decoder (``tests.fuzzing.run``: which also checks byte accounting and that every row fits
its Arrow schema), and must give the malformed frame's quarantine row with its reason while every
other frame decodes; values the wire allows, however unusual, must decode."""

from __future__ import annotations

import struct
import tracemalloc

import pytest

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.framing import RESYNC_WINDOW, FrameSplitter, Unframed
from amqpscope.ingest.limits import MAX_DEPTH, MAX_OBJECTS
from amqpscope.ingest.pcap import read_records
from tests import amqp_bytes as b
from tests.fuzzing import ISSUE_CASES, Case, run
from tests.test_damaged_captures import SAMPLE, assert_accounted, decode, essence, write_pcap

OPEN = b.frame10(b.described(0x10, b.list8(b.string("c"))))  # open(container-id "c")
DATA = b"\x00\x53\x75" + b.binary(b"abc")  # a data section (messaging 3.2.6)


def frames_and_quarantine(case: Case) -> tuple[list[dict], list[dict]]:
    out = run(case)
    return out["frames"], out["quarantine"]


def methods(frames: list[dict]) -> list[str | None]:
    return [f["method"] or f["frame_type"] for f in frames]


# --- one frame's failure stays that frame's -------------------------------------------------------


def test_a_header_section_that_is_no_list_is_a_message_error_and_the_stream_goes_on():
    # The issue's 20 bytes: a transfer (handle 0, delivery-id 0) whose payload is a header section
    # (0x70) holding uint0. The transfer is well formed; its message is not (messaging 3.2.1: a list).
    bad = bytes.fromhex("0000001402000000005314c00302434300537043")
    good = b.transfer(0, 1, b"t", payload=DATA)
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + OPEN + bad + good + b.EMPTY_10))
    assert quarantine == []
    assert methods(frames) == ["amqp", "open", "transfer", "transfer", "empty"]
    assert frames[2]["arguments"]["message-error"] == "header section is not a list (message byte 0)"
    assert "section_sizes" not in frames[2]  # no sections: the message did not decode
    assert frames[3]["section_sizes"] == {"data": len(DATA)} and frames[3]["body_kind"] == "data"


@pytest.mark.parametrize(
    "section, value, source",
    [
        (0x74, b.list8(), "map"),  # application-properties (3.2.5)
        (0x75, b.list8(), "binary"),  # data (3.2.6)
        (0x76, b.binary(b"x"), "list"),  # amqp-sequence (3.2.7)
        (0x71, b.string("x"), "map"),  # delivery-annotations: annotations, a map (3.2.2)
    ],
)
def test_a_section_of_the_wrong_type_is_a_message_error(section, value, source):
    names = {0x71: "delivery-annotations", 0x74: "application-properties", 0x75: "data", 0x76: "amqp-sequence"}
    transfer = b.transfer(0, 0, b"t", payload=bytes([0x00, 0x53, section]) + value)
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + transfer))
    assert quarantine == []
    assert frames[1]["arguments"]["message-error"] == f"{names[section]} section is not a {source} (message byte 0)"


def test_a_list_as_a_map_key_renders_as_json():
    # The issue's 30-byte open: properties (its 10th field) is a map8 whose one key is list0 (0x45).
    bad_open = bytes.fromhex("0000001e02000000005310c0110aa101784040404040404040c103024540")
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + bad_open + b.EMPTY_10))
    assert quarantine == []
    assert methods(frames) == ["amqp", "open", "empty"]
    assert frames[1]["container_id"] == "x"
    assert frames[1]["arguments"]["properties"] == '{"[]":null}'


def test_described_and_binary_map_keys_render_as_text():
    key_described = b"\x00\x53\x70" + b.list8()  # a header section used as a key
    properties = b.map8(key_described, b.string("v"), b.binary(b"\x01\x02"), b.uint(7))
    fields = b.list8(b.string("c"), *[b.NULL] * 8, properties)
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + b.frame10(b.described(0x10, fields))))
    assert quarantine == []
    # Keys as text: the described key as JSON of its descriptor and value, the binary in hex.
    assert frames[1]["arguments"]["properties"] == '{"{\\"descriptor\\":112,\\"value\\":[]}":"v","0102":7}'


# --- nesting, counts and sizes past the limits -----------------------------------------------------


def _queue_declare(nested: bytes) -> bytes:
    """queue.declare (50.10) of queue "q" whose arguments table holds one entry "k": ``nested``."""
    entry = b.shortstr("k") + nested
    arguments = struct.pack(">I", len(entry)) + entry
    return b.method091(50, 10, struct.pack(">H", 0) + b.shortstr("q") + b"\x00" + arguments)


def _arrays091(depth: int) -> bytes:
    value = b"V"
    for _ in range(depth):
        value = b"A" + struct.pack(">I", len(value)) + value
    return value


def test_091_field_arrays_nest_up_to_the_limit():
    # The arguments table is a level, so MAX_DEPTH - 1 arrays inside it is as deep as allowed.
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_091 + _queue_declare(_arrays091(MAX_DEPTH - 1))))
    assert quarantine == []
    assert methods(frames) == ["amqp-0-9-1", "queue.declare"]
    assert frames[1]["queue"] == "q"
    assert frames[1]["arguments"]["arguments"] == '{"k":' + "[" * (MAX_DEPTH - 1) + "null" + "]" * (MAX_DEPTH - 1) + "}"


@pytest.mark.parametrize("depth", [MAX_DEPTH, 1000])
def test_091_field_arrays_nested_past_the_limit_are_quarantined(depth):
    before, after = b.basic_qos(10), b.HEARTBEAT_091
    declare = _queue_declare(_arrays091(depth))
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_091 + before + declare + after, segment=536))
    assert methods(frames) == ["amqp-0-9-1", "basic.qos", "heartbeat"]
    [q] = quarantine
    start = len(b.HEADER_091 + before)
    # Frame header 7, class and method 4, reserved-1 2, queue "q" 2, bits 1, table size 4, "k" 2: the
    # first array's letter is at byte 22, each array 5 bytes (letter, size) in; the one too deep is
    # the MAX_DEPTH-th (the table is the first level), failing at its size field.
    too_deep = 22 + 5 * (MAX_DEPTH - 1) + 1
    assert q["stream_offset"] == start and q["byte_count"] == len(declare)
    assert q["reason"] == (
        f"undecodable amqp-0-9-1 frame: values nested deeper than {MAX_DEPTH} levels (limit) (byte {start + too_deep})"
    )


def _nested10(shape: str, depth: int) -> bytes:
    value = b.NULL
    for _ in range(depth):
        if shape == "list":
            value = b"\xd0" + struct.pack(">II", len(value) + 4, 1) + value
        elif shape == "map value":
            value = b"\xd1" + struct.pack(">II", len(value) + 5, 2) + b.NULL + value
        elif shape == "map key":
            value = b"\xd1" + struct.pack(">II", len(value) + 5, 2) + value + b.NULL
        elif shape == "described":
            value = b"\x00\x53\x70" + value
        else:  # descriptors of descriptors (each describing a null)
            value = b"\x00" + value + b.NULL
    return value


SHAPES = ["list", "map value", "map key", "described", "descriptor"]


@pytest.mark.parametrize("shape", SHAPES)
def test_10_values_nested_within_the_limit_decode(shape):
    # The performative's list is the first level.
    properties = _nested10(shape, MAX_DEPTH - 1)
    fields = b.list32(b.string("c"), *[b.NULL] * 8, properties)
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + b.frame10(b.described(0x10, fields))))
    assert quarantine == [] and methods(frames) == ["amqp", "open"]


@pytest.mark.parametrize("depth", [MAX_DEPTH, 5000])
@pytest.mark.parametrize("shape", SHAPES)
def test_10_values_nested_past_the_limit_are_quarantined(shape, depth):
    properties = _nested10(shape, depth)
    fields = b.list32(b.string("c"), *[b.NULL] * 8, properties)
    deep = b.frame10(b.described(0x10, fields))
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + OPEN + deep + b.EMPTY_10, segment=1460))
    assert methods(frames) == ["amqp", "open", "empty"]
    [q] = quarantine
    assert q["stream_offset"] == len(b.HEADER_10 + OPEN) and q["byte_count"] == len(deep)
    assert q["reason"].startswith(f"undecodable amqp-1.0 frame: values nested deeper than {MAX_DEPTH} levels (limit)")


def test_the_120_kb_descriptor_chain_that_crashed_the_compiled_decoder_is_quarantined():
    frames, quarantine = frames_and_quarantine(ISSUE_CASES["amqp10_descriptor_chain"])
    assert methods(frames) == ["amqp"]
    [q] = quarantine
    assert q["byte_count"] == 8 + 120_001
    # The descriptor at depth MAX_DEPTH is the first too deep: the frame's 0x00 octets start at byte 8.
    assert q["reason"] == (
        f"undecodable amqp-1.0 frame: values nested deeper than {MAX_DEPTH} levels (limit) (byte {8 + 8 + MAX_DEPTH})"
    )


def _arrays_of_nulls(outer: int, inner: int) -> bytes:
    """An array32 of ``outer`` arrays32, each of ``inner`` nulls: 9 bytes an inner array."""
    element = struct.pack(">II", 5, inner) + b.NULL  # size, count, constructor; nulls take no bytes
    return b"\xf0" + struct.pack(">II", 5 + len(element) * outer, outer) + b"\xf0" + element * outer


def test_nested_arrays_of_zero_width_elements_cannot_amplify():
    # The issue's amplification: 50 x 65536 nulls from ~470 bytes (3.3 M values without a limit).
    fields = b.list32(b.string("c"), *[b.NULL] * 8, _arrays_of_nulls(50, 65536))
    frame = b.frame10(b.described(0x10, fields))
    tracemalloc.start()
    try:
        with pytest.raises(amqp10.DecodeError) as raised:
            amqp10.decode_frame(frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    allowed = len(frame) + MAX_OBJECTS
    assert raised.value.reason == f"more than {allowed} values in one frame of {len(frame)} bytes (limit)"
    # 65536 values are refused before any is built: far below the 3.3 M x 8 bytes of the list alone.
    assert peak < 2_000_000
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + frame + OPEN))
    assert methods(frames) == ["amqp", "open"] and len(quarantine) == 1


def test_arrays_of_nulls_within_the_allowance_decode():
    fields = b.list32(b.string("c"), *[b.NULL] * 8, _arrays_of_nulls(2, MAX_OBJECTS // 4))
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + b.frame10(b.described(0x10, fields))))
    assert quarantine == []
    assert (
        frames[1]["arguments"]["properties"]
        == "[" + ",".join(["[" + ",".join(["null"] * (MAX_OBJECTS // 4)) + "]"] * 2) + "]"
    )


# --- resynchronisation ----------------------------------------------------------------------------


class CountingFormat:
    """A frame format that counts how often the splitter asks whether a frame could start somewhere."""

    def __init__(self, fmt) -> None:
        self.fmt = fmt
        self.asked = 0

    def frame_length(self, buf, pos):
        return self.fmt.frame_length(buf, pos)

    def validate(self, buf, pos, length):
        return self.fmt.validate(buf, pos, length)

    def plausible(self, buf, pos):
        self.asked += 1
        return self.fmt.plausible(buf, pos)

    def evidence(self, buf, pos):
        return self.fmt.evidence(buf, pos)

    def take_frames(self, buf, pos, end, base, packet_number, ts_us, out):
        return self.fmt.take_frames(buf, pos, end, base, packet_number, ts_us, out)


@pytest.mark.parametrize("fmt", [amqp091.Amqp091Format(), amqp10.Amqp10Format()], ids=["0-9-1", "1.0"])
def test_resynchronisation_looks_at_each_byte_once(fmt):
    garbage = b"\xff" * (RESYNC_WINDOW + 300_000)
    counting = CountingFormat(fmt)
    splitter = FrameSplitter(counting)
    out: list = []
    for number, i in enumerate(range(0, len(garbage), 1460), 1):
        out += splitter.feed(garbage[i : i + 1460], number, number)
    left = splitter.close(number)
    out += [left] if left else []
    # Every position is asked about once, and the one still undecided when a packet ends once more.
    assert counting.asked <= len(garbage) + number
    assert all(isinstance(u, Unframed) for u in out)
    assert [u.size for u in out] == [RESYNC_WINDOW, 300_000]
    expected = (
        "unknown 0-9-1 frame type 255" if isinstance(fmt, amqp091.Amqp091Format) else "unknown 1.0 frame type 255"
    )
    assert all(u.reason.startswith(expected) for u in out)


def test_unframeable_bytes_at_the_end_of_a_stream_keep_their_reason():
    frames, quarantine = frames_and_quarantine(
        Case(b.HEADER_091 + b.basic_qos(5) + b"\xff" * 250_000, b"", segment=1460)
    )
    assert methods(frames) == ["amqp-0-9-1", "basic.qos"]
    [q] = quarantine
    assert q["byte_count"] == 250_000
    assert q["reason"] == "unframeable bytes: unknown 0-9-1 frame type 255"


def test_a_frame_after_unframeable_bytes_is_found_across_packets():
    stream = b.HEADER_091 + b"\xff" * 5000 + b.basic_ack(3) + b.HEARTBEAT_091
    frames, quarantine = frames_and_quarantine(Case(stream, segment=7))
    assert methods(frames) == ["amqp-0-9-1", "basic.ack", "heartbeat"]
    assert frames[1]["delivery_tag"] == 3
    assert [(q["byte_count"], q["reason"]) for q in quarantine] == [
        (5000, "unframeable bytes: unknown 0-9-1 frame type 255")
    ]


def test_the_issue_megabyte_of_ff_is_quarantined_as_unframeable():
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_091 + b"\xff" * (1 << 20), segment=1460))
    assert methods(frames) == ["amqp-0-9-1"]
    assert sum(q["byte_count"] for q in quarantine) == 1 << 20
    assert {q["reason"] for q in quarantine} == {"unframeable bytes: unknown 0-9-1 frame type 255"}


# --- valid but unusual values ---------------------------------------------------------------------

TIMESTAMP_FLAG = 1 << 6  # basic properties in flag order: timestamp is the 10th (0-9-1 spec 4.2.6.1)


@pytest.mark.parametrize(
    "value, text",
    [
        (1_700_000_000, "2023-11-14T22:13:20+00:00"),  # seconds, as the spec says
        (1_700_000_000_123, "1700000000123 (likely milliseconds: 2023-11-14T22:13:20.123000+00:00)"),
        (1_700_000_000_123_456, "1700000000123456 (likely microseconds: 2023-11-14T22:13:20.123456+00:00)"),
        (1_700_000_000_123_456_789, "1700000000123456789 (likely nanoseconds: 2023-11-14T22:13:20.123456+00:00)"),
        (2**64 - 1, "18446744073709551615"),
    ],
)
def test_091_timestamps_in_other_units_keep_the_content_header(value, text):
    publish = b.method091(60, 40, struct.pack(">H", 0) + b.shortstr("") + b.shortstr("q") + b"\x00")
    header = b.content_header(3, flags=TIMESTAMP_FLAG, props=struct.pack(">Q", value))
    body = b.frame091(3, 1, b"abc")
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_091 + publish + header + body))
    assert quarantine == []
    assert methods(frames) == ["amqp-0-9-1", "basic.publish", "basic.header", "body"]
    assert frames[2]["body_size"] == 3
    assert frames[2]["arguments"]["timestamp"] == text


def test_10_creation_time_in_microseconds_keeps_the_raw_value():
    micros = 1_700_000_000_123_456  # milliseconds in the spec (1.6.20); as such beyond year 9999
    properties = b"\x00\x53\x73" + b.list8(*[b.NULL] * 9, b"\x83" + struct.pack(">q", micros))
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + b.transfer(0, 0, b"t", payload=properties + DATA)))
    assert quarantine == []
    assert frames[1]["arguments"]["properties.creation-time"] == (
        "1700000000123456 (likely microseconds: 2023-11-14T22:13:20.123456+00:00)"
    )


def test_fields_of_another_type_than_their_column_are_kept_as_text():
    # flow with handle (a uint, 2.7.4) sent as a string; begin with remote-channel (a ushort) as a uint.
    flow = b.frame10(b.described(0x13, b.list8(*[b.uint(0)] * 4, b.string("h"), b.uint(0), b.uint(5))))
    begin = b.frame10(b.described(0x11, b.list8(b"\x70\xff\xff\xff\xff", b.uint(0), b.uint(10), b.uint(10))))
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + begin + flow))
    assert quarantine == []
    assert frames[1].get("remote_channel") is None and frames[1]["arguments"]["remote-channel"] == "4294967295"
    assert frames[2].get("handle") is None and frames[2]["arguments"]["handle"] == "h"
    assert frames[2]["link_credit"] == 5


def test_a_surrogate_char_is_no_character():
    # UTF-32 excludes U+D800..U+DFFF (types 1.6.19: char is a UTF-32BE code point).
    fields = b.list8(b.string("c"), *[b.NULL] * 8, b.map8(b.symbol("k"), b"\x73\x00\x00\xd8\x00"))
    frames, quarantine = frames_and_quarantine(Case(b.HEADER_10 + b.frame10(b.described(0x10, fields))))
    assert methods(frames) == ["amqp"]
    assert quarantine[0]["reason"].startswith("undecodable amqp-1.0 frame: char: U+D800 is a surrogate")


# --- damaged capture files ------------------------------------------------------------------------


def test_a_record_of_impossible_length_is_skipped_and_the_rest_read(tmp_path):
    records = list(read_records(SAMPLE))
    clean = decode(SAMPLE)
    cut = len(records) // 2
    path = write_pcap(tmp_path / "impossible.pcap", records)
    data = path.read_bytes()
    # The file offset of record ``cut``: the 24-byte file header, then 16 bytes + data a record.
    at = 24 + sum(16 + len(r.data) for r in records[:cut])
    bogus = struct.pack("<IIII", records[cut].ts_us // 1_000_000, 0, 0x7FFFFFF0, 0x7FFFFFF0) + b"\x5a" * 100
    damaged = tmp_path / "damaged.pcap"
    damaged.write_bytes(data[:at] + bogus + data[at:])
    out = decode(damaged)
    # Every record after the damage is read: the frames are those of the undamaged file.
    assert essence(out["frames"]) == essence(clean["frames"])
    assert_accounted(out)
    [damage] = [q for q in out["quarantine"] if q["connection_id"] is None]
    reason = (
        f"record at byte {at}: impossible captured length {0x7FFFFFF0}; {len(bogus)} bytes skipped to the next record"
    )
    assert (damage["stream_offset"], damage["byte_count"]) == (at, len(bogus))
    assert damage["reason"] == f"capture file damaged: {reason}"
    [capture] = out["captures"]
    assert capture["status"] == f"damaged: {reason}"
    assert capture["packets"] == len(records)


def test_an_impossible_record_with_nothing_readable_after_it_skips_to_the_end(tmp_path):
    records = list(read_records(SAMPLE))[:20]
    path = write_pcap(tmp_path / "head.pcap", records)
    at = path.stat().st_size
    tail = struct.pack("<IIII", 0, 0, 0x7FFFFFF0, 0x7FFFFFF0) + b"\x00" * 3000
    path.write_bytes(path.read_bytes() + tail)
    out = decode(path)
    [capture] = out["captures"]
    assert capture["packets"] == 20
    assert capture["status"] == (
        f"damaged: record at byte {at}: impossible captured length {0x7FFFFFF0}; "
        f"the {len(tail)} bytes to the end of the file skipped (no record found in them)"
    )
