"""Connections picked up mid-stream on an AMQP port (the capture started after the handshake, inside a
frame) are decoded: the version is inferred from frames running back to back, the cut frame's
bytes are quarantined, and every later frame is decoded.

The reference is tshark told the port carries AMQP (``-d tcp.port==5672,amqp``, Decode As): every
frame it decodes, we decode (same packet, sender and frame), and on 0-9-1 exactly its frames. A cut
used to leave such a connection ``not-amqp`` with all its bytes quarantined (issue 32: 111 KB and
200 publishes of a cut 0-9-1 capture lost).
"""

from __future__ import annotations

import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.pcap import read_records
from testbed.tshark import decoded_frames, tshark_available
from tests.paths import SAMPLES

pytestmark = [pytest.mark.tshark, pytest.mark.skipif(not tshark_available(), reason="needs tshark")]

SENDER = {"c2s": "client", "s2c": "broker"}
# (capture, the AMQP port, cuts: random packets after the handshake and before the close)
CAPTURES = [(SAMPLES / "amqp091-qos-confirms.pcap", 4), (SAMPLES / "decoders" / "amqp10-large.pcap", 3)]


def cut(capture: Path, first: int, out: Path) -> Path:
    """``capture`` from packet ``first`` on (editcap keeps the link layer and the times)."""
    subprocess.run(["editcap", "-r", str(capture), str(out), f"{first}-{10**9}"], check=True, capture_output=True)
    return out


def ours(frame: dict) -> tuple[int, str, str]:
    kind = frame["frame_type"]
    name = frame["method"] if kind in ("method", "amqp", "sasl") else kind
    return frame["packet_number"], SENDER[frame["direction"]], name


def cuts(capture: Path, count: int) -> list[int]:
    """Packets to start from, chosen at random (seeded) among those carrying payload in the middle
    half of the capture: inside the busy part of its connection."""
    records = list(read_records(capture))
    middle = range(len(records) // 4, 3 * len(records) // 4)
    return sorted(random.Random(f"32:{capture.name}").sample(list(middle), count))


@pytest.mark.parametrize(("capture", "count"), CAPTURES, ids=[c.name for c, _ in CAPTURES])
def test_a_capture_cut_inside_a_busy_connection_is_decoded(tmp_path, capture, count):
    for first in cuts(capture, count):
        late = cut(capture, first, tmp_path / f"from-{first}.pcap")
        rows = list(decode_capture(late, "late"))
        [conn] = [r for kind, r in rows if kind == "connections"]
        frames = [r for kind, r in rows if kind == "frames"]
        assert (conn["protocol"], conn["protocol_inferred"]) == (
            "amqp-0-9-1" if "091" in capture.name else "amqp-1.0",
            True,
        ), first

        reference = Counter((f.frame_number, f.sender, f.name) for f in decoded_frames(late, 5672))
        found = Counter(ours(f) for f in frames)
        assert sum(reference.values()) > 50, first
        assert reference - found == Counter(), first  # every frame tshark decodes, we decode
        if "091" in capture.name:
            assert found == reference, first

        # Every payload byte is in a frame or the quarantine; the quarantine holds at most the frame
        # the cut went through in each direction.
        quarantined = [r for kind, r in rows if kind == "quarantine"]
        for direction in ("c2s", "s2c"):
            framed = sum(f["frame_size"] for f in frames if f["direction"] == direction)
            lost = [q for q in quarantined if q["direction"] == direction]
            assert framed + sum(q["byte_count"] for q in lost) == conn[f"{direction}_bytes"], (first, direction)
            assert len(lost) <= 1 and all(q["stream_offset"] == 0 for q in lost), (first, lost)
            assert all("capture started inside a frame" in q["reason"] for q in lost), lost


def test_a_cut_inside_a_body_frame_of_frame_max_is_decoded_from_the_next_frame(tmp_path):
    """The slow reader's broker sends message bodies in frames of RabbitMQ's frame_max (131,072
    bytes, a dozen packets each) to a client that sends nothing: a cut inside one has its rest, then
    whole frames. tshark decodes none of them in the cut (it cannot resync); in the whole capture it
    names each frame's segments, so every frame whose first segment is in the cut is one we decode
    there, at the packet tshark gives it, moved by the packets cut."""
    capture, port, first = SAMPLES / "bottlenecks" / "slow-reader.pcap", 34706, 178
    listed = subprocess.run(
        ["tshark", "-r", str(capture), "-d", "tcp.port==5672,amqp", "-Y", f"tcp.port=={port} && amqp"]
        + ["-T", "fields", "-e", "frame.number", "-e", "amqp.type", "-e", "tcp.segment"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    whole = Counter()
    for line in listed:
        number, types, segments = line.split("\t")
        starts = min(int(n) for n in segments.split(",")) if segments else int(number)
        if starts >= first:
            whole.update((int(number) - first + 1, int(t)) for t in types.split(","))
    assert sum(whole.values()) > 15 and sum(n for (_, t), n in whole.items() if t == 3) > 10

    rows = list(decode_capture(cut(capture, first, tmp_path / "late.pcap"), "late"))
    [conn] = [r for kind, r in rows if kind == "connections" and r["client_port"] == port]
    assert (conn["protocol"], conn["protocol_inferred"]) == ("amqp-0-9-1", True)
    types = {"method": 1, "header": 2, "body": 3, "heartbeat": 8}
    ours = Counter(
        (r["packet_number"], types[r["frame_type"]])
        for kind, r in rows
        if kind == "frames" and r["connection_id"] == conn["connection_id"]
    )
    assert ours == whole
