"""Decoding one direction of one connection: frames in stream order, AMQP 1.0 deliveries made whole.

A 1.0 message can span several transfer frames (``more=true`` on all but the last, transport
2.6.14), and only the first carries the start of its sections, so a transfer's payload cannot be
read on its own: ``Amqp10Deliveries`` joins the payloads of each delivery (per channel and handle:
a link's deliveries do not interleave, 2.6.14) and decodes the message on the frame that completes
it, or records that it was aborted. 0-9-1 needs no such state here: its content header carries the
properties and body frames only sizes, joined by ``pipelines.messages``.

``stream_decoder(protocol)`` is what a capture decoder keeps per direction; the Scapy layers use
the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.amqp10_types import DecodeError

StreamDecoder = Callable[[bytes], dict[str, Any]]


@dataclass
class _Partial:
    frames: int = 0
    parts: list[bytes] = field(default_factory=list)


class Amqp10Deliveries:
    """The deliveries in progress in one direction of a connection, by (channel, handle)."""

    def __init__(self) -> None:
        self._open: dict[tuple[int, int], _Partial] = {}

    @property
    def in_progress(self) -> int:
        return len(self._open)

    def add(self, decoded: dict[str, Any]) -> dict[str, Any]:
        """Take a decoded frame in stream order; a transfer completing a delivery gets its ``message``.

        ``message`` holds the delivery's frame count, message size and either its sections or,
        for an aborted delivery (2.6.14) or a malformed message, why there are none.
        """
        if decoded.get("method") == "detach":
            # A detached handle may be reused: nothing in progress on it can complete.
            self._open.pop((decoded["channel"], decoded["arguments"].get("handle")), None)
            return decoded
        if decoded.get("method") != "transfer":
            return decoded
        arguments = decoded["arguments"]
        key = (decoded["channel"], arguments.get("handle"))
        partial = self._open.pop(key, None)
        aborted = arguments.get("aborted")
        if partial is None and not aborted and not arguments.get("more"):
            # A delivery in one transfer, the usual case: its message is this frame's payload.
            decoded["message"] = _message(1, decoded["payload"], aborted=False)
            return decoded
        if partial is None:
            partial = _Partial()
        partial.frames += 1
        partial.parts.append(decoded["payload"])
        if aborted:
            decoded["message"] = _message(partial.frames, b"".join(partial.parts), aborted=True)
        elif arguments.get("more"):
            self._open[key] = partial
        else:
            decoded["message"] = _message(partial.frames, b"".join(partial.parts), aborted=False)
        return decoded


def _message(frames: int, payload: bytes, aborted: bool) -> dict[str, Any]:
    message: dict[str, Any] = {
        "frames": frames,
        "size": len(payload),
        "aborted": aborted,
        "sections": None,
        "error": None,
    }
    if aborted:
        return message
    try:
        message["sections"] = amqp10.decode_message(payload)
    except DecodeError as exc:
        message["error"] = f"{exc.reason} (message byte {exc.offset})"
    except Exception as exc:
        message["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return message


def stream_decoder(protocol: str) -> StreamDecoder:
    """A frame decoder for one direction of one connection (feed it every frame, in stream order)."""
    if protocol == amqp10.PROTOCOL:
        deliveries = Amqp10Deliveries()
        decode = amqp10.decode_frame

        def decode_10(data: bytes) -> dict[str, Any]:
            return deliveries.add(decode(data))

        return decode_10
    if protocol == amqp091.PROTOCOL:
        return amqp091.decode_frame
    raise ValueError(f"no decoder for protocol {protocol!r}")
