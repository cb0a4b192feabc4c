"""Frame splitting and decoding on hand-built bytes, both protocol versions."""

from __future__ import annotations

import pytest

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.amqp10_types import DecodeError
from amqpscope.ingest.framing import FrameSplitter, RawFrame, Unframed
from tests import amqp_bytes as b


def split(fmt, chunks: list[bytes]) -> list[RawFrame | Unframed]:
    splitter = FrameSplitter(fmt)
    out: list[RawFrame | Unframed] = []
    for number, chunk in enumerate(chunks, start=1):
        out.extend(splitter.feed(chunk, number, number * 1000))
    left = splitter.close(len(chunks))
    return out + ([left] if left else [])


def test_091_frames_split_at_every_chunk_boundary():
    stream = (
        b.HEADER_091
        + b.basic_qos(10)
        + b.basic_deliver(1)
        + b.content_header(3)
        + b.frame091(3, 1, b"abc")
        + b.HEARTBEAT_091
    )
    expected_sizes = [8, len(b.basic_qos(10)), len(b.basic_deliver(1)), len(b.content_header(3)), 11, 8]
    # Every way of cutting the stream in two gives the same frames; each completes in the second
    # chunk exactly when its last byte is there.
    for cut in range(len(stream) + 1):
        frames = split(amqp091.Amqp091Format(), [stream[:cut], stream[cut:]])
        assert [len(f.data) for f in frames] == expected_sizes
        assert all(isinstance(f, RawFrame) for f in frames)
        offsets = [f.offset for f in frames]
        assert offsets == [sum(expected_sizes[:i]) for i in range(len(expected_sizes))]
        for frame in frames:
            end = frame.offset + len(frame.data)
            assert frame.packet_number == (1 if end <= cut else 2)


def test_091_byte_by_byte_feed_completes_frames_on_their_last_byte():
    stream = b.basic_ack(5, multiple=True) + b.HEARTBEAT_091
    frames = split(amqp091.Amqp091Format(), [bytes([x]) for x in stream])
    assert [f.packet_number for f in frames] == [len(b.basic_ack(5)), len(stream)]


def test_091_bad_frame_end_is_quarantined_and_next_frame_recovered():
    bad = b.frame091(1, 1, b"\x00\x3c\x00\x50" + bytes(9), end=0x00)
    frames = split(amqp091.Amqp091Format(), [bad + b.HEARTBEAT_091])
    assert isinstance(frames[0], Unframed)
    assert frames[0].size == len(bad)
    assert "frame-end" in frames[0].reason
    assert isinstance(frames[1], RawFrame) and frames[1].data == b.HEARTBEAT_091


def test_091_incomplete_frame_at_stream_end_is_reported_with_its_size():
    frames = split(amqp091.Amqp091Format(), [b.basic_ack(1)[:-3]])
    assert len(frames) == 1 and isinstance(frames[0], Unframed)
    assert frames[0].size == len(b.basic_ack(1)) - 3


def test_091_method_arguments_decoded_by_spec_types():
    ack = amqp091.decode_frame(b.basic_ack(2**64 - 1, multiple=True))
    assert ack["method"] == "basic.ack"
    assert ack["arguments"] == {"delivery-tag": 2**64 - 1, "multiple": True}
    qos = amqp091.decode_frame(b.basic_qos(65535, global_=True))
    assert qos["arguments"] == {"prefetch-size": 0, "prefetch-count": 65535, "global": True}
    deliver = amqp091.decode_frame(b.basic_deliver(7, consumer_tag="c" * 255))
    assert deliver["arguments"]["consumer-tag"] == "c" * 255
    assert deliver["arguments"]["routing-key"] == "q"


def test_091_content_header_and_heartbeat():
    header = amqp091.decode_frame(b.content_header(123456, flags=0x8000, props=b.shortstr("text/plain")))
    assert header["frame_type"] == "header"
    assert header["arguments"] == {"body-size": 123456, "content-type": "text/plain"}
    assert amqp091.decode_frame(b.HEARTBEAT_091) == {"frame_type": "heartbeat", "channel": 0, "arguments": {}}


def test_091_start_ok_response_never_decoded():
    args = b"\x00\x00\x00\x00" + b.shortstr("PLAIN") + b.longstr(b"\x00guest\x00s3cret") + b.shortstr("en_US")
    decoded = amqp091.decode_frame(b.method091(10, 11, args, channel=0))
    assert decoded["arguments"]["mechanism"] == "PLAIN"
    assert "response" not in decoded["arguments"]
    assert "s3cret" not in repr(decoded)


def test_091_truncated_arguments_raise_decode_error_with_offset():
    frame = b.method091(60, 80, b"\x00\x00")  # basic.ack needs 9 bytes of arguments
    with pytest.raises(DecodeError) as err:
        amqp091.decode_frame(frame)
    assert err.value.offset == 7 + 4  # frame header + class/method ids


def test_10_frames_split_across_sasl_and_amqp_headers():
    stream = (
        b.HEADER_10_SASL
        + b.sasl_init("PLAIN", b"\x00guest\x00guest")
        + b.HEADER_10
        + b.flow(0, 0, 5)
        + b.transfer(0, 0, b"t0", b"payload")
        + b.EMPTY_10
    )
    for cut in range(len(stream) + 1):
        frames = split(amqp10.Amqp10Format(), [stream[:cut], stream[cut:]])
        assert [f.is_protocol_header for f in frames] == [True, False, True, False, False, False]
        assert b"".join(f.data for f in frames) == stream


def test_10_flow_fields_by_spec_names():
    decoded = amqp10.decode_frame(b.flow(handle=3, delivery_count=2**32 - 1, link_credit=0, drain=True, channel=7))
    assert decoded["method"] == "flow" and decoded["channel"] == 7
    args = decoded["arguments"]
    assert (args["handle"], args["delivery-count"], args["link-credit"], args["drain"]) == (3, 2**32 - 1, 0, True)
    assert args["echo"] is None and args["available"] is None


def test_10_transfer_payload_and_attach_termini():
    transfer = amqp10.decode_frame(b.transfer(1, 42, b"\x01\x02", b"hello", more=True))
    assert transfer["arguments"]["delivery-tag"] == b"\x01\x02"
    assert transfer["arguments"]["more"] is True
    assert transfer["payload"] == b"hello"
    attach = amqp10.decode_frame(b.attach("sender-link", 0, False, "/queue/q", initial_delivery_count=0))
    args = attach["arguments"]
    assert args["role"] == "sender"
    assert args["target"]["$type"] == "target" and args["target"]["address"] == "/queue/q"


def test_10_sasl_initial_response_dropped():
    decoded = amqp10.decode_frame(b.sasl_init("PLAIN", b"\x00guest\x00s3cret"))
    assert decoded["frame_type"] == "sasl" and decoded["method"] == "sasl-init"
    assert decoded["arguments"]["mechanism"] == "PLAIN"
    assert "initial-response" not in decoded["arguments"]
    assert "s3cret" not in repr(decoded)


def test_10_empty_frame_is_a_heartbeat():
    assert amqp10.decode_frame(b.EMPTY_10)["frame_type"] == "empty"


def test_10_list32_and_list0_forms_decode_alike():
    small = amqp10.decode_frame(b.frame10(b.described(0x17, b.list8())))
    zero = amqp10.decode_frame(b.frame10(b.described(0x17, b"\x45")))
    wide = amqp10.decode_frame(b.frame10(b.described(0x17, b.list32())))
    assert small["method"] == zero["method"] == wide["method"] == "end"
    assert small["arguments"] == zero["arguments"] == wide["arguments"] == {"error": None}


def test_10_bad_size_is_unframed_then_resynchronised():
    garbage = b"\x00\x00\x00\x03\x02\x00\x00\x00"  # size 3 < 8
    frames = split(amqp10.Amqp10Format(), [garbage + b.flow(0, 0, 1)])
    assert isinstance(frames[0], Unframed) and "below the 8-byte minimum" in frames[0].reason
    assert isinstance(frames[1], RawFrame) and frames[1].offset == len(garbage)


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        (amqp091.Amqp091Format(), b.basic_ack(1), b.frame091(1, 1, b"\x00\x3c\x00\x50" + bytes(9), end=0x00)),
        (amqp10.Amqp10Format(), b.flow(0, 0, 1), b"\x00\x00\x00\x10\x09\x00\x00\x00" + bytes(8)),  # doff 9 > size
    ],
    ids=["0-9-1", "1.0"],
)
def test_a_run_of_frames_stops_at_a_malformed_one_and_resumes_after_it(fmt, good, bad):
    """The splitter's fast path (``take_frames``) hands a bad frame in the middle of a chunk to the general loop."""
    stream = good + good + bad + good
    frames = split(fmt, [stream])
    assert [type(f) for f in frames] == [RawFrame, RawFrame, Unframed, RawFrame]
    assert [f.offset for f in frames] == [0, len(good), 2 * len(good), 2 * len(good) + len(bad)]
    assert frames[2].size == len(bad) and frames[3].data == good
    # Fed byte by byte, every frame completes on its last byte and the result is the same.
    assert [f[:2] for f in split(fmt, [bytes([x]) for x in stream])] == [f[:2] for f in frames]
