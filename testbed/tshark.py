"""What Wireshark's AMQP dissector sees in a capture: an independent check of our samples.

tshark's numeric codes are named with the project's spec-derived tables
(``amqpscope.ingest.specs``), so ``(60, 40)`` reads ``basic.publish`` and performative ``0x13``
reads ``flow``, exactly as our own decoders name them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amqpscope.ingest.specs import amqp091, amqp10

AMQP091 = "amqp-0-9-1"
AMQP10 = "amqp-1.0"
# Spec constants naming the 0-9-1 frame types that are not method frames.
AMQP091_FRAME_TYPES = ("FRAME-HEADER", "FRAME-BODY", "FRAME-HEARTBEAT")
# tshark reassembles only in-order segments unless told otherwise; loopback rarely reorders,
# but a sample must decode the same on every machine.
TSHARK_PREFERENCES = ("-o", "tcp.reassemble_out_of_order:TRUE")


@dataclass(frozen=True)
class DecodedFrame:
    """One AMQP frame (or protocol header) as tshark decoded it."""

    frame_number: int  # capture frame (packet) number
    sender: str  # "client" or "broker"
    protocol: str  # AMQP091 or AMQP10
    name: str  # "basic.publish", "header", "body", "transfer", "sasl-init", "protocol-header"
    fields: Mapping[str, str]  # flattened amqp.* fields of this frame


def tshark_available() -> bool:
    return shutil.which("tshark") is not None


def decoded_frames(capture: Path, broker_port: int, keylog: Path | None = None) -> list[DecodedFrame]:
    """Every AMQP frame tshark decodes in ``capture``, in capture order; over TLS with ``keylog``
    (``tls.keylog_file``, the port decoded as TLS and the TLS payload as AMQP)."""
    decode_as = ["-d", f"tcp.port=={broker_port},amqp"]
    if keylog is not None:
        decode_as = [
            "-o",
            f"tls.keylog_file:{keylog}",
            "-d",
            f"tcp.port=={broker_port},tls",
            "-d",
            f"tls.port=={broker_port},amqp",
        ]
    command = [
        "tshark",
        "-r",
        str(capture),
        *TSHARK_PREFERENCES,
        *decode_as,
        "-Y",
        "amqp",
        "-T",
        "json",
        "--no-duplicate-keys",
        "-J",
        "frame tcp amqp",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    frames: list[DecodedFrame] = []
    for packet in json.loads(result.stdout or "[]"):
        layers = packet["_source"]["layers"]
        tcp = layers["tcp"]
        sender = "broker" if int(tcp["tcp.srcport"]) == broker_port else "client"
        frame_number = int(layers["frame"]["frame.number"])
        amqp_layers = layers.get("amqp", [])
        for layer in amqp_layers if isinstance(amqp_layers, list) else [amqp_layers]:
            fields = dict(_flatten(layer))
            protocol, name = _frame_name(fields)
            frames.append(DecodedFrame(frame_number, sender, protocol, name, fields))
    return frames


def capture_gaps(capture: Path) -> int:
    """Packets tshark flags as following or acknowledging a segment missing from the capture."""
    command = [
        "tshark",
        "-r",
        str(capture),
        *TSHARK_PREFERENCES,
        "-Y",
        "tcp.analysis.lost_segment || tcp.analysis.ack_lost_segment",
        "-T",
        "fields",
        "-e",
        "frame.number",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    return len(result.stdout.split())


def frame_counts(frames: list[DecodedFrame]) -> Counter[tuple[str, str]]:
    """Frames per (sender, name), e.g. ``("client", "basic.ack")``."""
    return Counter((frame.sender, frame.name) for frame in frames)


def _frame_name(fields: Mapping[str, str]) -> tuple[str, str]:
    if "amqp.init.protocol" in fields:
        major = fields.get("amqp.init.version_major")
        return (AMQP10 if major == "1" else AMQP091), "protocol-header"
    if "amqp.doff" in fields:
        if "amqp.performative" in fields:
            code = int(fields["amqp.performative"])
        elif "amqp.sasl.method" in fields:
            code = int(fields["amqp.sasl.method"])
        else:
            return AMQP10, "empty"  # a heartbeat (spec 2.4.5)
        composite = amqp10().described.get(code)
        return AMQP10, composite.name if composite else f"descriptor-{code:#x}"
    if "amqp.method.class" in fields:
        key = (int(fields["amqp.method.class"]), int(fields["amqp.method.method"]))
        method = amqp091().methods.get(key)
        return AMQP091, method.name if method else f"method-{key[0]}.{key[1]}"
    frame_type = int(fields.get("amqp.type", -1))
    constants = amqp091().constants
    names = {constants[name]: name.lower().removeprefix("frame-") for name in AMQP091_FRAME_TYPES}
    return AMQP091, names.get(frame_type, f"frame-type-{frame_type}")


def _flatten(node: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    for key, value in node.items():
        if isinstance(value, Mapping):
            yield from _flatten(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Mapping):
                    yield from _flatten(item)
                else:
                    yield key, str(item)
        else:
            yield key, str(value)
