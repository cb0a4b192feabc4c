"""Differential tests: our decoded frames against tshark's, field by field, by tshark's field names.

Frames are aligned the way ``tests/test_samples.py`` aligns them (capture frame, sender, name); each
typed column listed in ``FIELDS`` is then compared with its Wireshark field on every frame that has
either, and each 1.0 message's properties with what tshark shows on the delivery's first transfer.
Where tshark 4.0 is known to be wrong, ``KNOWN_WRONG`` says so with the reason, and those values are
counted apart instead of as mismatches. The bundled samples are compared here; the live captures
of ``testbed.decoder_scenarios`` in ``test_decoders_live.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.framing import FrameSplitter, RawFrame
from amqpscope.ingest.messages import stream_decoder
from amqpscope.ingest.packets import TCP_SYN, parse_tcp
from amqpscope.ingest.pcap import read_records
from amqpscope.ingest.rows import TYPED_COLUMNS, frame_row
from amqpscope.ingest.specs import amqp10 as amqp10_spec
from amqpscope.ingest.tcp import Data, DirectionStream
from testbed.tshark import DecodedFrame, decoded_frames, tshark_available

SENDER = {"c2s": "client", "s2c": "broker"}
_CHOICES = amqp10_spec().choices


def _choice_value(type_name: str) -> Callable[[Any], str | None]:
    """Our choice name back to the number tshark shows (``mixed`` -> ``2``, ``receiver`` -> ``1``)."""
    values = {name: value for value, name in _CHOICES[type_name].items()}

    def render(ours: Any) -> str | None:
        if ours is None:
            return None
        value = values[ours]
        return {"true": "1", "false": "0"}.get(value, value)

    return render


def as_tshark(value: Any) -> str | None:
    """Our value as tshark's JSON prints it: booleans 1/0, bytes as colon-separated hex."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (bytes, bytearray)):
        return ":".join(f"{b:02x}" for b in value)
    return str(value)


@dataclass(frozen=True)
class FieldMap:
    """Our column and the tshark field holding the same value, on the frames named (None: all)."""

    column: str
    tshark: str
    names: frozenset[str] | None = None
    render: Callable[[Any], str | None] = as_tshark


def _fields_091() -> list[FieldMap]:
    methods = [
        FieldMap(column, f"amqp.method.arguments.{column}")
        for column in (
            "delivery_tag",
            "multiple",
            "requeue",
            "prefetch_size",
            "prefetch_count",
            "global",
            "frame_max",
            "channel_max",
            "heartbeat",
            "active",
            "reason",
            "exchange",
            "routing_key",
            "queue",
            "consumer_tag",
            "reply_code",
            "reply_text",
            "no_ack",
            "redelivered",
            "mandatory",
            "message_count",
            "mechanism",
        )
    ]
    header = frozenset({"header"})
    properties = [
        FieldMap(column, f"amqp.method.properties.{column}", header)
        for column in (
            "content_type",
            "content_encoding",
            "delivery_mode",
            "priority",
            "correlation_id",
            "reply_to",
            "message_id",
        )
    ]
    return [
        FieldMap("channel", "amqp.channel"),
        FieldMap("body_size", "amqp.header.body-size", header),
        *methods,
        *properties,
    ]


def _fields_10() -> list[FieldMap]:
    performative = {
        "container_id": "containerId",
        "hostname": "hostname",
        "max_frame_size": "maxFrameSize",
        "channel_max": "channelMax",
        "idle_time_out": "idleTimeout",
        "remote_channel": "remoteChannel",
        "next_incoming_id": "nextIncomingId",
        "incoming_window": "incomingWindow",
        "next_outgoing_id": "nextOutgoingId",
        "outgoing_window": "outgoingWindow",
        "handle_max": "handleMax",
        "name": "name",
        "handle": "handle",
        "initial_delivery_count": "initDeliveryCount",
        "max_message_size": "maxMessageSize",
        "delivery_count": "deliveryCount",
        "link_credit": "linkCredit",
        "available": "available",
        "drain": "drain",
        "echo": "echo",
        "delivery_id": "deliveryId",
        "delivery_tag_bytes": "deliveryTag",
        "message_format": "messageFormat",
        "settled": "settled",
        "more": "more",
        "resume": "resume",
        "aborted": "aborted",
        "batchable": "batchable",
        "first": "first",
        "last": "last",
        "closed": "closed",
    }
    amqp_frames = frozenset(c.name for c in amqp10_spec().described.values() if "frame" in c.provides)
    return [
        FieldMap("channel", "amqp.channel", amqp_frames),
        *(FieldMap(column, f"amqp.performative.arguments.{name}") for column, name in performative.items()),
        FieldMap("role", "amqp.performative.arguments.role", render=_choice_value("role")),
        FieldMap(
            "snd_settle_mode", "amqp.performative.arguments.sndSettleMode", render=_choice_value("sender-settle-mode")
        ),
        FieldMap(
            "rcv_settle_mode", "amqp.performative.arguments.rcvSettleMode", render=_choice_value("receiver-settle-mode")
        ),
        FieldMap("error_condition", "amqp.error.condition"),
        FieldMap("error_description", "amqp.error.description"),
        FieldMap("mechanism", "amqp.sasl.mechanism"),
        FieldMap("sasl_code", "amqp.sasl.saslCode", render=_choice_value("sasl-code")),
    ]


FIELDS = {amqp091.PROTOCOL: _fields_091(), amqp10.PROTOCOL: _fields_10()}

# Message properties of a 1.0 delivery (on our frame completing it) and tshark's fields for them
# (decoded by tshark from the delivery's first transfer only).
MESSAGE_FIELDS = [
    FieldMap("subject", "amqp.message.subject"),
    FieldMap("content_type", "amqp.message.contentType"),
    FieldMap("content_encoding", "amqp.message.contentEncoding"),
    FieldMap("priority", "amqp.message.priority"),
    FieldMap("to_address", "amqp.message.to.string"),
    FieldMap("reply_to", "amqp.message.replyTo.string"),
    FieldMap("correlation_id", "amqp.message.correlationId.string"),
    FieldMap("message_id", "amqp.message.messageId"),  # .uint / .string / .bytes / .guid
]


def _tshark_message_id(fields: Mapping[str, str]) -> str | None:
    for suffix in ("uint", "string", "guid"):
        if f"amqp.message.messageId.{suffix}" in fields:
            return fields[f"amqp.message.messageId.{suffix}"]
    raw = fields.get("amqp.message.messageId.bytes")
    return raw.replace(":", "") if raw is not None else None


@dataclass(frozen=True)
class KnownWrong:
    """A value where tshark 4.0 is wrong, and why."""

    column: str
    applies: Callable[[Mapping[str, Any], Mapping[str, str]], bool]  # (our row, tshark fields)
    reason: str


KNOWN_WRONG = [
    KnownWrong(
        "reason",
        lambda row, _theirs: row.get("method") == "connection.update-secret",
        "tshark 4.0 does not know connection.update-secret (10.70) and decodes none of its arguments",
    ),
    KnownWrong(
        "message_id",
        lambda row, _theirs: row.get("message_id", "").isdigit() and int(row["message_id"]) > 0xFFFFFFFF,
        "tshark reads a ulong (8-byte) message-id through a 4-byte field (expert info 'Trying to fetch an "
        "unsigned integer with length 8') and shows a wrong number",
    ),
]
# Not compared at all, with the reason (tshark does not decode what these frames carry).
NOT_COMPARED = {
    "continuation transfers": "tshark does not reassemble a multi-frame 1.0 delivery: it decodes each "
    "continuation transfer's payload as if it started a message ('Unknown AMQP type'), so message "
    "fields are compared on the delivery's first frame only",
}


@dataclass
class Comparison:
    frames: int = 0
    values: int = 0
    mismatches: list[str] = field(default_factory=list)
    known_wrong: list[str] = field(default_factory=list)
    deliveries: int = 0

    def check(
        self,
        where: str,
        column: str,
        ours: str | None,
        theirs: str | None,
        row: Mapping[str, Any],
        fields: Mapping[str, str],
    ) -> None:
        self.values += 1
        if ours == theirs:
            return
        for known in KNOWN_WRONG:
            if known.column == column and known.applies(row, fields):
                self.known_wrong.append(f"{where} {column}: ours {ours!r}, tshark {theirs!r} ({known.reason})")
                return
        self.mismatches.append(f"{where} {column}: ours {ours!r}, tshark {theirs!r}")


def frame_name(row: Mapping[str, Any]) -> str:
    return row["method"] if row["frame_type"] in ("method", "amqp", "sasl") else row["frame_type"]


def compare_capture(capture: Path, broker_port: int) -> Comparison:
    """Every typed field of every frame against tshark's, and every 1.0 message's properties."""
    return compare_frames(list(stream_rows(capture, broker_port)), decoded_frames(capture, broker_port))


def compare_frames(rows: list[dict[str, Any]], theirs: list[DecodedFrame]) -> Comparison:
    """Our frames rows (one capture, one broker port) against tshark's frames of the same capture."""
    ours = [row for row in rows if not (row["protocol"] == amqp091.PROTOCOL and row["frame_type"] == "protocol-header")]
    ours.sort(key=lambda r: (r["packet_number"], r["stream_offset"]))
    assert [(r["packet_number"], SENDER[r["direction"]], frame_name(r)) for r in ours] == [
        (f.frame_number, f.sender, f.name) for f in theirs
    ], "frames do not align with tshark's"
    result = Comparison(frames=len(ours))
    first_frames: dict[tuple[str, str, Any, Any], DecodedFrame] = {}
    for row, frame in zip(ours, theirs):
        where = f"frame {frame.frame_number} {frame.sender} {frame.name}"
        for fmap in FIELDS[row["protocol"]]:
            if fmap.names is not None and frame.name not in fmap.names:
                continue
            result.check(
                where, fmap.column, fmap.render(row.get(fmap.column)), frame.fields.get(fmap.tshark), row, frame.fields
            )
        if frame.name == "transfer":
            link = (row["connection_id"], row["direction"], row["channel"], row["handle"])
            first = first_frames.setdefault(link, frame)
            if row.get("message_size") is not None or row.get("aborted"):
                del first_frames[link]
                if row.get("section_sizes") is not None:
                    result.deliveries += 1
                    _compare_message(result, row, first)
    return result


def _compare_message(result: Comparison, row: Mapping[str, Any], first: DecodedFrame) -> None:
    where = f"delivery from frame {first.frame_number} {first.sender}"
    for fmap in MESSAGE_FIELDS:
        theirs = _tshark_message_id(first.fields) if fmap.column == "message_id" else first.fields.get(fmap.tshark)
        result.check(where, fmap.column, fmap.render(row.get(fmap.column)), theirs, row, first.fields)


# -- our frames, one stream decoder per direction (1.0 deliveries made whole) ------------------------


def stream_rows(capture: Path, broker_port: int) -> Iterator[dict[str, Any]]:
    """The frames of every connection, decoded per direction with ``ingest.messages.stream_decoder``.

    ``decode_capture`` decodes frame by frame; the message columns need a decoder that sees a
    direction's frames in order. This drives the same TCP reassembly and frame splitter.
    """
    directions: dict[tuple, dict[str, Any]] = {}
    protocols: dict[tuple, str] = {}
    index: dict[tuple, int] = {}
    for record in read_records(capture):
        seg = parse_tcp(record.linktype, record.data, record.wirelen)
        if seg is None:
            continue
        c2s = seg.dport == broker_port
        client = (seg.src, seg.sport) if c2s else (seg.dst, seg.dport)
        conn = (client, broker_port)
        key = (conn, "c2s" if c2s else "s2c")
        side = directions.setdefault(key, {"stream": DirectionStream(), "splitter": None, "decode": None})
        if seg.flags & TCP_SYN:
            side["stream"].syn(seg.seq)
        for event in side["stream"].segment(seg.seq, seg.payload, record.number, record.ts_us):
            assert isinstance(event, Data), f"capture gap in {key}"
            if side["splitter"] is None:
                if key[1] == "c2s":
                    header = bytes(event.payload[:8])
                    protocols[conn] = amqp091.PROTOCOL if header == amqp091.PROTOCOL_HEADER else amqp10.PROTOCOL
                protocol = protocols[conn]
                fmt = amqp091.Amqp091Format() if protocol == amqp091.PROTOCOL else amqp10.Amqp10Format()
                side.update(splitter=FrameSplitter(fmt, event.offset), decode=stream_decoder(protocol))
            for item in side["splitter"].feed(event.payload, event.packet_number, event.ts_us):
                assert isinstance(item, RawFrame), f"unframed bytes in {key}: {item}"
                protocol = protocols[conn]
                if item.is_protocol_header:
                    decoded = {"frame_type": "protocol-header", "method": "header", "arguments": {}}
                else:
                    decoded = side["decode"](item.data)
                n = index.get(conn, 0)
                index[conn] = n + 1
                yield frame_row(
                    protocol,
                    decoded,
                    {
                        "connection_id": f"{client[0]}:{client[1]}",
                        "direction": key[1],
                        "frame_index": n,
                        "packet_number": item.packet_number,
                        "stream_offset": item.offset,
                        "frame_size": len(item.data),
                    },
                )


def decode_capture_frames(capture: Path, broker_port: int) -> list[dict[str, Any]]:
    """The frames rows ``ingest.capture.decode_capture`` makes (what the frames table holds)."""
    return [row for kind, row in decode_capture(capture, "diff", (broker_port,)) if kind == "frames"]


# -- the tests: the bundled samples ----------------------------------------------------------------

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
# The bundled samples and the decoder samples (samples/decoders: every 0-9-1 method, AMQPLAIN,
# multi-frame 1.0 deliveries with every message property).
SAMPLE_CAPTURES = sorted(
    p for d in (SAMPLES, SAMPLES / "decoders") for p in d.iterdir() if p.suffix in (".pcap", ".pcapng")
)


def broker_port(capture: Path) -> int:
    truth = capture.with_name(capture.name.rsplit(".", 1)[0] + ".truth.json")
    return int(json.loads(truth.read_text())["broker"]["port"])


def assert_matches_tshark(capture: Path, port: int) -> Comparison:
    result = compare_capture(capture, port)
    assert result.mismatches == []
    assert result.values > 10 * result.frames // 2  # the comparison did compare
    return result


@pytest.mark.tshark
@pytest.mark.skipif(not tshark_available(), reason="tshark not installed")
@pytest.mark.parametrize("capture", SAMPLE_CAPTURES, ids=lambda p: p.name)
def test_samples_match_tshark_field_by_field(capture):
    result = assert_matches_tshark(capture, broker_port(capture))
    if capture.name == "amqp10-large.pcap":
        # The first message's 8-byte ulong message-id, sent and received.
        assert len(result.known_wrong) == 2 and all("message_id" in k for k in result.known_wrong)
        assert result.deliveries == 6
    elif capture.name == "amqp091-methods.pcap":
        assert len(result.known_wrong) == 1 and "update-secret" in result.known_wrong[0]
    else:
        assert result.known_wrong == []
    if capture.name in ("amqp10-credit.pcap", "mixed.pcapng"):
        assert result.deliveries == 200  # 100 sent, 100 received, properties compared for each


@pytest.mark.parametrize("capture", SAMPLE_CAPTURES, ids=lambda p: p.name)
def test_frames_table_rows_hold_the_compared_values(capture):
    """decode_capture (what the frames table holds) agrees with the per-direction stream decoder.

    Only the columns of a completed 1.0 delivery differ: decode_capture decodes frame by frame.
    """
    port = broker_port(capture)
    message_columns = {
        "delivery_frames",
        "message_size",
        "section_sizes",
        "body_kind",
        "to_address",
        "subject",
        "message_id",
        "correlation_id",
        "content_type",
        "content_encoding",
        "reply_to",
        "priority",
    }
    compared = set(TYPED_COLUMNS) - message_columns
    table = {(r["packet_number"], r["stream_offset"]): r for r in decode_capture_frames(capture, port)}
    streamed = [r for r in stream_rows(capture, port) if r["frame_type"] != "protocol-header"]
    assert len(streamed) > 100
    for row in streamed:
        ours = table[(row["packet_number"], row["stream_offset"])]
        assert (ours["method"], ours["frame_type"]) == (row["method"], row["frame_type"])
        assert {c: ours.get(c) for c in compared} == {c: row.get(c) for c in compared}
        if row.get("message_size") is None:
            assert ours["arguments"] == row["arguments"]
