"""TCP stream reassembly, one direction at a time.

Sequence numbers are turned into 64-bit stream offsets (so a stream may wrap 2^32), segments are
delivered in order, retransmitted and overlapping bytes are delivered once, and out-of-order
segments wait for the hole before them. A hole that never fills (bytes the capture lost) is
reported as a gap of known size, and delivery continues after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

SEQ_MOD = 1 << 32
# Out-of-order bytes held waiting for a hole; beyond this the hole is declared a capture gap.
MAX_PENDING_BYTES = 8 << 20


def unwrap(relative: int, near: int) -> int:
    """A 32-bit sequence number relative to the stream origin, as the 64-bit offset nearest ``near``."""
    base = near - near % SEQ_MOD
    candidates = (base + relative - SEQ_MOD, base + relative, base + relative + SEQ_MOD)
    return min((c for c in candidates if c >= 0), key=lambda c: abs(c - near))


@dataclass(frozen=True, slots=True)
class Data:
    offset: int
    payload: bytes
    packet_number: int
    ts_us: int


@dataclass(frozen=True, slots=True)
class Gap:
    offset: int
    size: int
    packet_number: int  # the packet after which the loss became certain


@dataclass
class DirectionStream:
    """One direction of a TCP connection."""

    isn: int | None = None  # sequence number of stream offset 0
    next_offset: int = 0  # next stream offset to deliver
    retransmitted_bytes: int = 0
    _pending: dict[int, tuple[bytes, int, int]] = field(default_factory=dict)
    _pending_bytes: int = 0

    def offset_of(self, seq: int) -> int:
        """The stream offset of a 32-bit sequence number: the one nearest the delivery point."""
        return unwrap((seq - self.isn) % SEQ_MOD, self.next_offset)

    def syn(self, seq: int) -> None:
        """A SYN fixes the stream origin: data starts at seq + 1."""
        if self.isn is None or self.next_offset == 0:
            self.isn = (seq + 1) % SEQ_MOD

    def segment(self, seq: int, payload: bytes, packet_number: int, ts_us: int) -> Iterator[Data | Gap]:
        """Add a segment; yield what becomes deliverable, in stream order."""
        if not payload:
            return
        if self.isn is None:
            # Picked up mid-stream: the first byte seen is offset 0.
            self.isn = seq
        offset = self.offset_of(seq)
        end = offset + len(payload)
        if end <= self.next_offset:
            self.retransmitted_bytes += len(payload)
            return
        if offset > self.next_offset:
            held = self._pending.get(offset)
            if held is None or len(held[0]) < len(payload):
                self._pending_bytes += len(payload) - (len(held[0]) if held else 0)
                self._pending[offset] = (payload, packet_number, ts_us)
            if self._pending_bytes > MAX_PENDING_BYTES:
                yield from self._skip_hole(packet_number)
            return
        if offset < self.next_offset:
            self.retransmitted_bytes += self.next_offset - offset
            payload = payload[self.next_offset - offset :]
        yield Data(self.next_offset, payload, packet_number, ts_us)
        self.next_offset += len(payload)
        yield from self._drain(packet_number, ts_us)

    def _drain(self, packet_number: int, ts_us: int) -> Iterator[Data]:
        """Deliver held segments that the last delivery made contiguous."""
        while self._pending:
            ready = [o for o in self._pending if o <= self.next_offset]
            if not ready:
                return
            for o in sorted(ready):
                payload, _number, _ts = self._pending.pop(o)
                self._pending_bytes -= len(payload)
                end = o + len(payload)
                if end <= self.next_offset:
                    self.retransmitted_bytes += len(payload)
                    continue
                fresh = payload[self.next_offset - o :]
                self.retransmitted_bytes += len(payload) - len(fresh)
                # The bytes become deliverable with the packet that filled the hole.
                yield Data(self.next_offset, fresh, packet_number, ts_us)
                self.next_offset = end

    def _skip_hole(self, packet_number: int) -> Iterator[Data | Gap]:
        first = min(self._pending)
        yield Gap(self.next_offset, first - self.next_offset, packet_number)
        self.next_offset = first
        _payload, number, ts_us = self._pending[first]
        yield from self._drain(number, ts_us)

    def finish(self, packet_number: int) -> Iterator[Data | Gap]:
        """End of capture or connection: every hole still open is a capture gap."""
        while self._pending:
            yield from self._skip_hole(packet_number)
