"""Limits on what one frame may make the decoders build: captures are hostile input.

Bytes on the wire bound almost everything a decoder allocates: every 0-9-1 field value and every
1.0 list or map element takes at least one byte. What they do not bound is enforced here, while
decoding, the same way compiled (mypyc) and as Python source:

- ``MAX_DEPTH``: nesting of compound values (0-9-1 field tables and arrays; 1.0 lists, maps,
  arrays, described values and descriptors). Counted, so that no input can exhaust the Python
  stack (``RecursionError``) or, compiled, the C stack.
- ``MAX_ELEMENTS``: elements one compound value declares.
- ``MAX_OBJECTS``: values one frame (or one 1.0 message) may decode to beyond one per byte. 1.0
  arrays of a zero-width type (``null``, ``true``, ``uint0``, ``list0`` ...) hold elements of no
  bytes at all; nested, their counts multiply. A frame of ``n`` bytes decodes to at most
  ``n + MAX_OBJECTS`` values, so memory stays in proportion to the input.
- ``MAX_VALUE_BYTES``: bytes of one string, binary or symbol value (RabbitMQ's own ceiling on a
  message, ``max_message_size``, is 512 MiB).

A value past a limit is a ``DecodeError`` naming the limit: the frame goes to the quarantine and
decoding goes on with the next frame. The counters live in one ``Budget`` per process, started
afresh by every public entry point of the decoders (``Budget.start``): the decoders run one frame
at a time (a Spark Python worker, the Scapy layer), never two at once in one process.
"""

from __future__ import annotations

from typing import Final

from amqpscope.ingest.reasons import LIMIT_DEPTH, LIMIT_ELEMENTS, LIMIT_OBJECTS, Reason

MAX_DEPTH: Final = 100
MAX_ELEMENTS: Final = 1 << 20
MAX_OBJECTS: Final = 1 << 12
MAX_VALUE_BYTES: Final = 1 << 29


class Budget:
    """What the frame being decoded has used of the limits: nesting depth now, values so far."""

    def __init__(self) -> None:
        self.depth = 0
        self.objects = 0
        self.allowed = MAX_OBJECTS

    def start(self, size: int) -> None:
        """A new frame (or message) of ``size`` bytes: nothing used yet."""
        self.depth = 0
        self.objects = 0
        self.allowed = size + MAX_OBJECTS

    def enter(self) -> Reason | None:
        """One level deeper; the reason when that is too deep (the caller raises, with its offset:
        ``reasons.beyond``)."""
        if self.depth >= MAX_DEPTH:
            return Reason(LIMIT_DEPTH, f"values nested deeper than {MAX_DEPTH} levels (limit)", expected=str(MAX_DEPTH))
        self.depth += 1
        return None

    def leave(self) -> None:
        self.depth -= 1

    def take(self, count: int) -> Reason | None:
        """Room for ``count`` more values; the reason when the frame may not build them."""
        if count > MAX_ELEMENTS:
            return Reason(
                LIMIT_ELEMENTS,
                f"{count} elements in one value, above {MAX_ELEMENTS} (limit)",
                expected=str(MAX_ELEMENTS),
                found=str(count),
            )
        self.objects += count
        if self.objects > self.allowed:
            return Reason(
                LIMIT_OBJECTS,
                f"more than {self.allowed} values in one frame of {self.allowed - MAX_OBJECTS} bytes (limit)",
                expected=str(self.allowed),
            )
        return None


# The one budget of this process (see the module docstring).
BUDGET: Final = Budget()
