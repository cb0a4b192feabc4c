"""The Scapy layer: amqpscope's decoders behind ``rdpcap`` / ``sniff(session=TCPSession)`` and ``.show()``."""

from __future__ import annotations

import json
from pathlib import Path

from scapy.packet import Raw
from scapy.sendrecv import sniff
from scapy.sessions import TCPSession
from scapy.utils import rdpcap

from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.scapy_layers import AMQP, detect

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def frames(packets) -> list[AMQP]:
    out = []
    for packet in packets:
        layer = packet.getlayer(AMQP)
        while isinstance(layer, AMQP):
            out.append(layer)
            layer = layer.payload
    return out


def table_frames(capture: Path) -> list[dict]:
    port = json.loads(capture.with_name(capture.name.rsplit(".", 1)[0] + ".truth.json").read_text())["broker"]["port"]
    return [row for kind, row in decode_capture(capture, "t", (port,)) if kind == "frames"]


def test_session_dissection_gives_the_frames_table_frames():
    capture = SAMPLES / "mixed.pcapng"
    ours = sorted(
        (r["packet_number"], r["stream_offset"], r["method"] or r["frame_type"]) for r in table_frames(capture)
    )
    layers = frames(sniff(offline=str(capture), session=TCPSession))
    assert len(layers) == len(ours)
    assert sorted(layer.method or layer.frame_type for layer in layers) == sorted(name for *_, name in ours)
    assert all(not layer.error for layer in layers)


def test_multi_frame_deliveries_show_their_message_on_the_last_transfer():
    capture = SAMPLES / "decoders" / "amqp10-large.pcap"
    layers = frames(sniff(offline=str(capture), session=TCPSession))
    completed = [layer for layer in layers if layer.method == "transfer" and layer.message]
    assert len(completed) == 6
    first = completed[0].message
    assert first["frames"] > 1 and first["properties.subject"] == "large data"
    assert first["properties.message-id"] == 2**40 + 1
    shown = completed[0].show(dump=True)
    assert "transfer" in shown and "properties.subject=large data" in shown and "data.size=100008" in shown


def test_show_names_methods_and_arguments():
    packets = rdpcap(str(SAMPLES / "amqp091-qos-confirms.pcap"))
    wanted = {"basic.publish", "basic.qos", "connection.tune", "confirm.select"}
    shown = "\n".join(layer.show(dump=True) for layer in frames(packets) if layer.method in wanted)
    for expected in ("basic.publish", "basic.qos", "prefetch-count=10", "connection.tune", "confirm.select"):
        assert expected in shown
    # Credentials never shown: start-ok keeps its mechanism, not its response.
    [start_ok] = [layer for layer in frames(packets) if layer.method == "connection.start-ok"]
    assert start_ok.arguments["mechanism"] == "PLAIN" and "response" not in start_ok.arguments
    assert "guest" not in start_ok.show(dump=True).split("client-properties")[0]


def test_rdpcap_without_session_leaves_cut_frames_raw():
    packets = rdpcap(str(SAMPLES / "decoders" / "amqp10-large.pcap"))
    layers = frames(packets)
    assert any(layer.method == "transfer" for layer in layers)
    assert any(packet.haslayer(Raw) for packet in packets if packet.haslayer(AMQP))
    # Stateless: the frames cut across segments are the only ones missing.
    assert len(layers) < len(table_frames(SAMPLES / "decoders" / "amqp10-large.pcap"))


def test_detect_protocol_from_first_bytes():
    assert detect(b"AMQP\x00\x00\x09\x01") == "amqp-0-9-1"
    assert detect(b"AMQP\x03\x01\x00\x00") == "amqp-1.0"
    assert detect(b"\x08\x00\x00\x00\x00\x00\x00\xce") == "amqp-0-9-1"
    assert detect(b"\x00\x00\x00\x08\x02\x00\x00\x00") == "amqp-1.0"
    assert detect(b"GET / HTTP/1.1\r\n") is None


def test_malformed_frame_is_an_error_field_not_an_exception():
    bad = AMQP(b"\x01\x00\x01\x00\x00\x00\x05\x00\x3c\x00\x50\x00\xce")  # basic.ack with 1 argument byte
    assert bad.method is None and bad.error == "value needs 9 bytes, 1 left (byte 11)"
