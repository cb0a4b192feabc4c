"""Message assembly: ingest.messages (1.0 deliveries made whole) and pipelines.messages (both versions).

Hand-built frames check the edge cases (multi-frame, aborted, multiple settlements, tag 0, ranges);
the bundled samples check the tables against their ground truth.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.messages import Amqp10Deliveries, stream_decoder
from amqpscope.ingest.rows import frame_row
from amqpscope.pipelines.messages import deliveries_10, messages_091
from amqpscope.schemas.frames import FRAMES_SCHEMA
from amqpscope.schemas.messages import DELIVERIES_10_SCHEMA, MESSAGES_091_SCHEMA
from tests import amqp_bytes as b
from tests.test_tshark_fields import stream_rows

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def message(*sections: bytes) -> bytes:
    return b"".join(sections)


PROPERTIES = b.described(0x73, b.list8(b.string("id-1"), b.NULL, b.string("/queue/q"), b.string("hello")))
DATA = b.described(0x75, b"\xb0" + (1000).to_bytes(4, "big") + bytes(1000))


def test_multi_frame_delivery_is_decoded_on_its_last_frame():
    whole = message(PROPERTIES, DATA)
    parts = [whole[:300], whole[300:700], whole[700:]]
    deliveries = Amqp10Deliveries()
    decoded = [
        deliveries.add(amqp10.decode_frame(b.transfer(0, 5, b"t", part, more=i < 2))) for i, part in enumerate(parts)
    ]
    assert ["message" in d for d in decoded] == [False, False, True]
    done = decoded[-1]["message"]
    assert (done["frames"], done["size"], done["aborted"], done["error"]) == (3, len(whole), False, None)
    assert [(s.name, s.size) for s in done["sections"]] == [("properties", len(PROPERTIES)), ("data", len(DATA))]
    assert done["sections"][0].value["subject"] == "hello" and done["sections"][0].value["to"] == "/queue/q"
    assert deliveries.in_progress == 0


def test_aborted_delivery_has_no_sections_and_the_next_starts_fresh():
    deliveries = Amqp10Deliveries()
    deliveries.add(amqp10.decode_frame(b.transfer(0, 1, b"a", b"\x00\x53\x75\xb0\x00\x00\x10\x00", more=True)))
    aborted = amqp10.decode_frame(b.transfer_aborted(0))
    assert deliveries.add(aborted)["message"] == {
        "frames": 2,
        "size": 8,
        "aborted": True,
        "sections": None,
        "error": None,
    }
    single = deliveries.add(amqp10.decode_frame(b.transfer(0, 2, b"b", message(PROPERTIES))))
    assert single["message"]["frames"] == 1 and single["message"]["sections"][0].name == "properties"


def test_malformed_message_is_an_error_with_its_offset_not_a_crash():
    decode = stream_decoder(amqp10.PROTOCOL)
    broken = decode(b.transfer(0, 0, b"t", PROPERTIES + b"\x00\x53\x75\xa0\x09ab"))
    assert broken["message"]["sections"] is None
    assert broken["message"]["error"] == f"value needs 9 bytes, 2 left (message byte {len(PROPERTIES) + 5})"
    out_of_order = decode(b.transfer(0, 1, b"u", DATA + PROPERTIES))
    assert "properties section out of order" in out_of_order["message"]["error"]


def test_interleaved_links_are_assembled_apart():
    deliveries = Amqp10Deliveries()
    whole = message(PROPERTIES, DATA)
    deliveries.add(amqp10.decode_frame(b.transfer(0, 1, b"a", whole[:100], more=True)))
    deliveries.add(amqp10.decode_frame(b.transfer(1, 7, b"b", whole[:50], more=True)))
    first = deliveries.add(amqp10.decode_frame(b.transfer(0, 1, b"a", whole[100:])))
    second = deliveries.add(amqp10.decode_frame(b.transfer(1, 7, b"b", whole[50:])))
    assert first["message"]["size"] == second["message"]["size"] == len(whole)
    assert first["message"]["error"] is None and second["message"]["error"] is None


# -- pipelines on the samples ----------------------------------------------------------------------


def frames_df(spark, rows: list[dict]):
    """Rows as the frames table holds them (ts from ts_us)."""
    for r in rows:
        r["ts"] = datetime.fromtimestamp(r["ts_us"] / 1e6, tz=UTC)
    return spark.createDataFrame([tuple(r.get(f.name) for f in FRAMES_SCHEMA.fields) for r in rows], FRAMES_SCHEMA)


def sample_frames(spark, capture: Path, streamed: bool):
    port = truth_record(capture)["broker"]["port"]
    if streamed:
        rows = [{**r, "capture_id": "c", "ts_us": r["packet_number"]} for r in stream_rows(capture, port)]
    else:
        rows = [r for kind, r in decode_capture(capture, "c", (port,)) if kind == "frames"]
    return frames_df(spark, rows)


def built_frames(spark, protocol: str, frames: list[tuple[str, bytes]]):
    """Hand-built (direction, frame bytes) of one connection, decoded in order per direction."""
    decoders = {"c2s": stream_decoder(protocol), "s2c": stream_decoder(protocol)}
    rows = [
        frame_row(
            protocol,
            decoders[direction](data),
            {
                "capture_id": "c",
                "connection_id": "x",
                "direction": direction,
                "frame_index": index,
                "ts_us": index,
                "packet_number": index + 1,
                "stream_offset": 0,
                "frame_size": len(data),
            },
        )
        for index, (direction, data) in enumerate(frames)
    ]
    return frames_df(spark, rows)


def truth_record(capture: Path) -> dict:
    return json.loads(capture.with_name(capture.name.rsplit(".", 1)[0] + ".truth.json").read_text())


def truth(capture: Path) -> dict:
    [gt] = truth_record(capture)["ground_truth"].values()
    return gt


def test_messages_091_assembled_numbered_and_settled(spark):
    capture = SAMPLES / "amqp091-qos-confirms.pcap"
    gt = truth(capture)
    table = messages_091(sample_frames(spark, capture, streamed=False))
    assert [(f.name, f.dataType) for f in table.schema] == [(f.name, f.dataType) for f in MESSAGES_091_SCHEMA]
    rows = table.collect()
    publishes = sorted((r for r in rows if r.method == "basic.publish"), key=lambda r: r.frame_index)
    assert len(publishes) == gt["messages_published"]
    assert all(r.complete and r.body_size == r.body_bytes == gt["message_body_size"] for r in rows)
    # Confirms: sequence numbers 1..n in publish order, each acked by the broker.
    assert [r.publish_seq for r in publishes] == list(range(1, gt["confirms_expected"] + 1))
    assert {r.settled_by for r in publishes} == {"basic.ack"}
    assert all(r.settled_frame_index > r.last_frame_index for r in publishes)
    assert publishes[0].message_id == "1" and publishes[0].delivery_mode == 1
    deliveries = [r for r in rows if r.method == "basic.deliver"]
    assert len(deliveries) == gt["deliveries_received"]
    by = {}
    for r in deliveries:
        by.setdefault((r.settled_by, r.settled_multiple, r.requeue), []).append(r.delivery_tag)
    assert len(by["basic.ack", False, None]) == gt["acks_single"]
    assert len(by["basic.ack", True, None]) == gt["deliveries_settled_by_multiple_acks"]
    assert by["basic.nack", False, True] == gt["nacked_delivery_tags"] == [7]
    assert [r.redelivered for r in deliveries if r.delivery_tag in gt["redelivered_delivery_tags"]] == [True]


def test_deliveries_10_with_dispositions(spark):
    capture = SAMPLES / "amqp10-credit.pcap"
    gt = truth(capture)
    table = deliveries_10(sample_frames(spark, capture, streamed=True))
    assert [(f.name, f.dataType) for f in table.schema] == [(f.name, f.dataType) for f in DELIVERIES_10_SCHEMA]
    rows = table.collect()
    sent = [r for r in rows if r.direction == "c2s"]
    received = [r for r in rows if r.direction == "s2c"]
    assert (len(sent), len(received)) == (gt["messages_sent"], gt["messages_received"])
    assert all(r.complete and r.transfers == 1 and r.payload_bytes == r.message_size for r in rows)
    assert {r.body_kind for r in rows} == {gt["body_section"]}
    assert sorted(int(r.message_id) for r in sent) == list(range(1, gt["messages_sent"] + 1))
    # Every delivery settled by the receiving end's disposition (first..last ranges expanded).
    assert {(r.disposition_role, r.state) for r in sent} == {("receiver", "accepted")}
    assert {(r.disposition_role, r.state) for r in received} == {("receiver", "accepted")}
    assert all(r.disposition_frame_index > r.last_frame_index for r in rows)


def test_deliveries_10_multi_frame_and_aborted(spark):
    whole = message(PROPERTIES, DATA)
    frames = [
        ("c2s", b.transfer(0, 0, b"a", whole[:400], more=True)),
        ("c2s", b.transfer(0, 0, b"a", whole[400:])),
        ("c2s", b.transfer(0, 1, b"b", whole[:100], more=True)),
        ("c2s", b.transfer_aborted(0)),
        ("c2s", b.transfer(0, 2, b"c", whole)),
        ("s2c", b.disposition(receiver=True, first=0, last=2, settled=True)),
    ]
    got = deliveries_10(built_frames(spark, amqp10.PROTOCOL, frames)).orderBy("frame_index").collect()
    assert [(r.delivery_id, r.transfers, r.aborted, r.complete, r.payload_bytes) for r in got] == [
        (0, 2, False, True, len(whole)),
        (1, 2, True, False, 100),
        (2, 1, False, True, len(whole)),
    ]
    assert [r.subject for r in got] == ["hello", None, "hello"]
    assert [(r.disposition_frame_index, r.state) for r in got] == [(5, "accepted")] * 3


def test_tag_zero_multiple_settles_everything_delivered(spark):
    frames = [
        ("c2s", b.method091(20, 10, b.shortstr(""), channel=1)),  # channel.open
        ("s2c", b.basic_deliver(1)),
        ("s2c", b.content_header(1)),
        ("s2c", b.frame091(3, 1, b"x")),
        ("s2c", b.basic_deliver(2)),
        ("s2c", b.content_header(1)),
        ("s2c", b.frame091(3, 1, b"y")),
        ("c2s", b.basic_ack(0, multiple=True)),
        ("s2c", b.basic_deliver(3)),
        ("s2c", b.content_header(2)),
        ("s2c", b.frame091(3, 1, b"z")),
    ]
    got = messages_091(built_frames(spark, amqp091.PROTOCOL, frames)).orderBy("frame_index").collect()
    assert [(r.delivery_tag, r.settled_frame_index, r.settled_multiple, r.complete) for r in got] == [
        (1, 7, True, True),
        (2, 7, True, True),
        (3, None, None, False),
    ]


def consume(queue: str, tag: str, no_ack: bool) -> bytes:
    """basic.consume (spec 1.8.3.3): reserved, queue, consumer-tag, bits no-local / no-ack / ..., arguments."""
    return b.method091(60, 20, b"\x00\x00" + b.shortstr(queue) + b.shortstr(tag) + bytes([no_ack << 1]) + b.table({}))


def get(queue: str, no_ack: bool) -> bytes:
    return b.method091(60, 70, b"\x00\x00" + b.shortstr(queue) + bytes([no_ack]))


def get_ok(tag: int) -> bytes:
    return b.method091(60, 71, tag.to_bytes(8, "big") + b"\x00" + b.shortstr("") + b.shortstr("q") + bytes(4))


def test_no_ack_deliveries_are_never_outstanding(spark):
    # Consumer "a" takes no acks, "b" does; a multiple ack of b's tag 4 settles 2 and 4 only, and
    # an ack naming a no-ack delivery (5, from a no-ack get) is refused whole (RabbitMQ's collect_acks).
    frames = [
        ("c2s", b.method091(20, 10, b.shortstr(""))),  # channel.open
        ("c2s", consume("q", "a", no_ack=True)),
        ("s2c", b.method091(60, 21, b.shortstr("a"))),
        ("c2s", consume("q", "b", no_ack=False)),
        ("s2c", b.method091(60, 21, b.shortstr("b"))),
        ("s2c", b.basic_deliver(1, "a")),
        ("s2c", b.basic_deliver(2, "b")),
        ("s2c", b.basic_deliver(3, "a")),
        ("s2c", b.basic_deliver(4, "b")),
        ("c2s", b.basic_ack(4, multiple=True)),
        ("c2s", get("q", no_ack=True)),
        ("s2c", get_ok(5)),
        ("c2s", get("q", no_ack=False)),
        ("s2c", get_ok(6)),
        ("c2s", b.basic_ack(6, multiple=True)),
        ("c2s", b.basic_ack(5)),
    ]
    got = messages_091(built_frames(spark, amqp091.PROTOCOL, frames)).orderBy("frame_index").collect()
    assert [
        (r.method, r.delivery_tag, r.consumer_tag, r.no_ack, r.settled_frame_index, r.settled_multiple) for r in got
    ] == [
        ("basic.deliver", 1, "a", True, None, None),
        ("basic.deliver", 2, "b", False, 9, True),
        ("basic.deliver", 3, "a", True, None, None),
        ("basic.deliver", 4, "b", False, 9, True),
        ("basic.get-ok", 5, None, True, None, None),
        ("basic.get-ok", 6, None, False, 14, True),
    ]
