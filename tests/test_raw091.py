"""testbed/raw091 writes valid AMQP 0-9-1: its frames decoded by the spec-derived decoder (ingest.amqp091)."""

from __future__ import annotations

import struct

from amqpscope.ingest import amqp091
from testbed import raw091


def split(data: bytes) -> list[bytes]:
    frames, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from("!I", data, pos + 3)
        frames.append(data[pos : pos + 8 + size])
        pos += 8 + size
    return frames


def decoded(data: bytes) -> list[dict]:
    return [
        {k: v for k, v in amqp091.decode_frame(f).items() if k in ("method", "channel", "arguments", "frame_type")}
        for f in split(data)
    ]


def test_a_persistent_publish_split_into_body_frames_of_frame_max() -> None:
    frames = decoded(raw091.publish_frames(3, "ex", "rk", b"y" * 10_000, 4096, persistent=True))
    assert frames == [
        {
            "frame_type": "method",
            "channel": 3,
            "method": "basic.publish",
            "arguments": {"ticket": 0, "exchange": "ex", "routing-key": "rk", "mandatory": False, "immediate": False},
        },
        {
            "frame_type": "header",
            "channel": 3,
            "method": "basic.header",
            "arguments": {"body-size": 10_000, "delivery-mode": 2},
        },
        {"frame_type": "body", "channel": 3, "arguments": {"body-length": 4088}},
        {"frame_type": "body", "channel": 3, "arguments": {"body-length": 4088}},
        {"frame_type": "body", "channel": 3, "arguments": {"body-length": 10_000 - 2 * 4088}},
    ]


def test_transient_publish_and_ack() -> None:
    header = decoded(raw091.publish_frames(1, "", "q", b"x" * 16, 131072))[1]
    assert header["arguments"] == {"body-size": 16, "delivery-mode": 1}
    assert decoded(raw091.ack(2, 7)) == [
        {
            "frame_type": "method",
            "channel": 2,
            "method": "basic.ack",
            "arguments": {"delivery-tag": 7, "multiple": False},
        }
    ]


def test_frame_reader_returns_nothing_until_a_frame_is_whole() -> None:
    data = raw091.ack(1, 1) + raw091.ack(1, 2)  # 21 bytes each: 7 header, 13 arguments, frame-end
    reader = raw091.FrameReader()
    assert reader.feed(data[:20]) == []
    first = reader.feed(data[20:30])
    assert [f.method_id for f in first] == [(60, 80)]
    assert reader.feed(data[30:41]) == []
    second = reader.feed(data[41:])
    assert struct.unpack_from("!Q", second[0].payload, 4) == (2,)
