"""Splitting one direction's reassembled byte stream into AMQP frames.

The one place where stream bytes become frames, for both protocol versions: bytes are fed as they
arrive, and a frame is returned only once all of its bytes are there (like Scapy's
``tcp_reassemble``). A protocol header (``AMQP`` + 4 bytes) can appear at any frame boundary:
AMQP 1.0 sends a second one after the SASL exchange.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

PROTOCOL_HEADER_SIZE = 8
_AMQP = b"AMQP"
# How far the splitter looks past a framing error for the next plausible frame boundary.
RESYNC_WINDOW = 1 << 20


@dataclass(frozen=True, slots=True)
class RawFrame:
    """A complete frame (or protocol header) and where it sits in the stream."""

    offset: int  # stream offset of the first byte
    data: bytes  # the whole frame, header to end
    packet_number: int  # capture record that completed the frame
    ts_us: int
    is_protocol_header: bool


@dataclass(frozen=True, slots=True)
class Unframed:
    """Bytes that could not be framed: they go to the quarantine with the reason."""

    offset: int
    size: int
    packet_number: int
    reason: str


class FrameFormat(Protocol):
    """What a protocol version tells the splitter about its frames."""

    def frame_length(self, buf: memoryview, pos: int) -> int | None:
        """Length of the frame starting at ``pos``; None until the length is known.

        Raises ValueError (with the reason) when the bytes cannot start a frame.
        """

    def validate(self, frame: memoryview) -> str | None:
        """A reason when a complete frame is malformed (e.g. 0-9-1 frame-end not 0xCE)."""

    def plausible(self, buf: memoryview, pos: int) -> bool | None:
        """Whether a frame could start at ``pos``; None while the bytes to tell are not there yet.

        Used to resynchronise after an error.
        """


def protocol_header_at(buf: memoryview, pos: int) -> bool:
    return buf[pos : pos + 4] == _AMQP


class FrameSplitter:
    """Incremental splitter for one direction of one connection."""

    def __init__(self, fmt: FrameFormat, start_offset: int = 0) -> None:
        self.fmt = fmt
        self._buf = bytearray()
        self._base = start_offset  # stream offset of self._buf[0]

    @property
    def pending(self) -> int:
        """Bytes buffered but not yet part of a complete frame."""
        return len(self._buf)

    @property
    def offset(self) -> int:
        return self._base

    def feed(self, data: bytes, packet_number: int, ts_us: int) -> Iterator[RawFrame | Unframed]:
        """Add contiguous stream bytes; yield every frame they complete."""
        self._buf += data
        buf = memoryview(self._buf)
        pos = 0
        try:
            while pos < len(buf):
                if buf[pos] == 0x41:  # "A": maybe a protocol header
                    left = len(buf) - pos
                    if left < 4 and _AMQP.startswith(bytes(buf[pos:])):
                        break
                if buf[pos] == 0x41 and protocol_header_at(buf, pos):
                    if len(buf) - pos < PROTOCOL_HEADER_SIZE:
                        break
                    yield RawFrame(self._base + pos, bytes(buf[pos : pos + PROTOCOL_HEADER_SIZE]), packet_number, ts_us, True)
                    pos += PROTOCOL_HEADER_SIZE
                    continue
                try:
                    length = self.fmt.frame_length(buf, pos)
                except ValueError as exc:
                    skipped = self._resync(buf, pos)
                    if skipped is None:
                        # No boundary in sight yet: keep the bytes until more arrive or the stream ends.
                        break
                    yield Unframed(self._base + pos, skipped, packet_number, str(exc))
                    pos += skipped
                    continue
                if length is None or len(buf) - pos < length:
                    break
                with buf[pos : pos + length] as frame:
                    reason = self.fmt.validate(frame)
                if reason is not None:
                    skipped = self._resync(buf, pos + 1)
                    size = length if skipped is None else 1 + skipped
                    yield Unframed(self._base + pos, size, packet_number, reason)
                    pos += size
                    continue
                yield RawFrame(self._base + pos, bytes(buf[pos : pos + length]), packet_number, ts_us, False)
                pos += length
        finally:
            buf.release()
            del self._buf[:pos]
            self._base += pos

    def _resync(self, buf: memoryview, start: int) -> int | None:
        """Bytes from ``start`` to the next plausible frame boundary, None if none is visible yet."""
        end = min(len(buf), start + RESYNC_WINDOW)
        for pos in range(start + 1, end):
            if protocol_header_at(buf, pos):
                return pos - start
            verdict = self.fmt.plausible(buf, pos)
            if verdict:
                return pos - start
            if verdict is None:
                return None  # wait for more bytes before deciding
        return None

    def close(self, packet_number: int, reason: str = "stream ended inside a frame") -> Unframed | None:
        """End of stream: whatever is still buffered is an incomplete frame."""
        if not self._buf:
            return None
        left = Unframed(self._base, len(self._buf), packet_number, reason)
        self._base += len(self._buf)
        self._buf.clear()
        return left

    def skip(self, size: int, packet_number: int, reason: str) -> Unframed | None:
        """A capture gap: drop what was buffered (it cannot complete) and move past the hole."""
        left = self.close(packet_number, f"incomplete frame before a capture gap ({reason})")
        self._base += size
        return left
