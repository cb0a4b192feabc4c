"""TCP stream reassembly, one direction at a time.

Sequence numbers are turned into 64-bit stream offsets (so a stream may wrap 2^32), segments are
delivered in order, retransmitted and overlapping bytes are delivered once, and out-of-order
segments wait for the hole before them. Bytes the capture lost are reported as gaps of known size,
and delivery continues after them: a hole that never fills (a lost segment) once it is given up on,
and the tail of a segment cut by the snapshot length as soon as delivery reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

SEQ_MOD: Final = 1 << 32
_HALF: Final = 1 << 31
# Out-of-order bytes held waiting for a hole; beyond this the hole is declared a capture gap.
MAX_PENDING_BYTES: Final = 8 << 20


def unwrap(relative: int, near: int) -> int:
    """A 32-bit sequence number relative to the stream origin, as the 64-bit offset nearest ``near``.

    Of the candidates ``relative + k * 2^32`` that are not negative, the nearest; the lower on a tie.
    """
    candidate = near - near % SEQ_MOD + relative
    distance = candidate - near  # in (-2^32, 2^32)
    if distance >= _HALF and candidate >= SEQ_MOD:
        return candidate - SEQ_MOD
    if distance < -_HALF:
        return candidate + SEQ_MOD
    return candidate


class Data(NamedTuple):
    offset: int
    payload: bytes
    packet_number: int
    ts_us: int


class Gap(NamedTuple):
    offset: int
    size: int
    packet_number: int  # the packet after which the loss became certain


Event = Data | Gap
_new: Final = tuple.__new__  # a Data positionally, without NamedTuple's keyword-handling __new__ (once a segment)
_NOTHING: Final[tuple[Event, ...]] = ()


@dataclass
class DirectionStream:
    """One direction of a TCP connection."""

    isn: int | None = None  # sequence number of stream offset 0
    next_offset: int = 0  # next stream offset to deliver
    retransmitted_bytes: int = 0
    _pending: dict[int, tuple[bytes, int, int]] = field(default_factory=dict)  # offset: (payload, packet, ts)
    _pending_bytes: int = 0
    # Stream ranges known to be missing, [start, end), with the packet that showed it: the tails of
    # segments cut by the snapshot length that delivery has not reached yet.
    _missing: list[tuple[int, int, int]] = field(default_factory=list)

    def offset_of(self, seq: int) -> int:
        """The stream offset of a 32-bit sequence number: the one nearest the delivery point."""
        isn = self.isn
        assert isn is not None, "offset_of before the stream's first sequence number"
        return unwrap((seq - isn) % SEQ_MOD, self.next_offset)

    def syn(self, seq: int) -> None:
        """A SYN fixes the stream origin: data starts at seq + 1."""
        if self.isn is None or self.next_offset == 0:
            self.isn = (seq + 1) % SEQ_MOD

    def segment(self, seq: int, payload: bytes, packet_number: int, ts_us: int, missing: int = 0) -> Sequence[Event]:
        """Add a segment: ``payload`` as captured, then ``missing`` bytes the capture cut off.

        Returns what becomes deliverable, in stream order: data, and gaps where bytes are lost.
        """
        captured = len(payload)
        if not captured and not missing:
            return _NOTHING
        if self.isn is None:
            # Picked up mid-stream: the first byte seen is offset 0.
            self.isn = seq
        delivered = self.next_offset
        relative = (seq - self.isn) % SEQ_MOD
        offset = delivered - delivered % SEQ_MOD + relative
        if not -_HALF <= offset - delivered < _HALF:  # near a 2^32 boundary: let unwrap pick
            offset = unwrap(relative, delivered)
        captured_end = offset + captured
        if captured_end + missing <= delivered:
            self.retransmitted_bytes += captured
            return _NOTHING
        if offset > delivered:
            if captured:
                held = self._pending.get(offset)
                if held is None or len(held[0]) < captured:
                    self._pending_bytes += captured - (len(held[0]) if held else 0)
                    self._pending[offset] = (payload, packet_number, ts_us)
            if missing:
                self._missing.append((captured_end, captured_end + missing, packet_number))
            if self._pending_bytes > MAX_PENDING_BYTES:
                return self._skip_hole(packet_number)
            return _NOTHING
        events: list[Event] = []
        if captured_end > delivered:
            if offset < delivered:
                self.retransmitted_bytes += delivered - offset
                payload = payload[delivered - offset :]
            events.append(_new(Data, (delivered, payload, packet_number, ts_us)))
            self.next_offset = captured_end
        else:
            self.retransmitted_bytes += captured
        if missing:
            self._missing.append((captured_end, captured_end + missing, packet_number))
        if self._pending or self._missing:
            self._drain(events, packet_number, ts_us)
        return events

    def _drain(self, events: list[Event], packet_number: int, ts_us: int) -> None:
        """Deliver what the last delivery made contiguous: held segments first, then known-missing ranges."""
        while True:
            if self._pending:
                ready = [o for o in self._pending if o <= self.next_offset]
                if ready:
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
                        events.append(Data(self.next_offset, fresh, packet_number, ts_us))
                        self.next_offset = end
                    continue
            if not (self._missing and self._declare_missing(events)):
                return

    def _declare_missing(self, events: list[Event]) -> bool:
        """A gap for the known-missing range at the delivery point, if any; False if there is none.

        Captured bytes win: the gap stops where held data begins, and the rest of the range waits.
        """
        at = self.next_offset
        for start, end, number in self._missing:
            if start <= at < end:
                stop = min([end, *(o for o in self._pending if o > at)])
                events.append(Gap(at, stop - at, number))
                self.next_offset = stop
                self._missing = [m for m in self._missing if m[1] > stop]
                return True
        self._missing = [m for m in self._missing if m[1] > at]
        return False

    def _skip_hole(self, packet_number: int) -> list[Event]:
        """Give up on the hole at the delivery point: a gap up to the first byte held or known missing."""
        self._missing = [m for m in self._missing if m[1] > self.next_offset]
        starts = [*self._pending, *(start for start, _end, _number in self._missing)]
        events: list[Event] = []
        if not starts:
            return events
        first = min(starts)
        if first > self.next_offset:
            events.append(Gap(self.next_offset, first - self.next_offset, packet_number))
            self.next_offset = first
        held = self._pending.get(min(self._pending)) if self._pending else None
        number, ts_us = (held[1], held[2]) if held is not None else (packet_number, 0)
        self._drain(events, number, ts_us)
        return events

    def finish(self, packet_number: int) -> list[Event]:
        """End of capture or connection: every hole still open is a capture gap."""
        events: list[Event] = []
        while self._pending or self._missing:
            events += self._skip_hole(packet_number)
        return events
