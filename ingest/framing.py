"""Splitting one direction's reassembled byte stream into AMQP frames.

The one place where stream bytes become frames, for both protocol versions: bytes are fed as they
arrive, and a frame is returned only once all of its bytes are there (like Scapy's
``tcp_reassemble``). A protocol header (``AMQP`` + 4 bytes) can appear at any frame boundary:
AMQP 1.0 sends a second one after the SASL exchange.
"""

from __future__ import annotations

from typing import Final, NamedTuple, Protocol

from amqpscope.ingest.reasons import FRAMING_CUT_BY_GAP, FRAMING_INCOMPLETE_FRAME, DecodeError

PROTOCOL_HEADER_SIZE: Final = 8
_AMQP: Final = b"AMQP"
# How far the splitter looks past a framing error for the next plausible frame boundary.
RESYNC_WINDOW: Final = 1 << 20


class RawFrame(NamedTuple):
    """A complete frame (or protocol header) and where it sits in the stream."""

    offset: int  # stream offset of the first byte
    data: bytes  # the whole frame, header to end
    packet_number: int  # capture record that completed the frame
    ts_us: int
    is_protocol_header: bool


# Builds a RawFrame from a tuple of its fields without the NamedTuple's Python-level __new__:
# the per-frame fast paths (``FrameFormat.take_frames``) create one per frame, and this is 40 % cheaper.
new_frame: Final = tuple.__new__


class Unframed(NamedTuple):
    """Bytes that could not be framed: they go to the quarantine with the reason (``ingest.reasons``)."""

    offset: int
    size: int
    packet_number: int
    reason: str  # in words
    reason_id: str
    error_offset: int | None = None  # stream offset of the byte at fault
    error_length: int | None = None
    expected: str | None = None
    found: str | None = None


class FrameError(DecodeError):
    """Bytes that cannot start (or end) a frame: raised by ``FrameFormat.frame_length``, returned by
    ``validate``; ``offset`` is the byte at fault, from the frame's first."""

    def unframed(self, offset: int, size: int, packet_number: int, reason: str | None = None) -> Unframed:
        """The quarantine item of ``size`` bytes from stream offset ``offset`` that this error made unframeable."""
        return Unframed(
            offset,
            size,
            packet_number,
            self.reason if reason is None else reason,
            self.reason_id,
            offset + self.offset,
            self.length,
            self.expected,
            self.found,
        )


_INCOMPLETE: Final = "stream ended inside a frame"


class FrameFormat(Protocol):
    """What a protocol version tells the splitter about its frames."""

    def frame_length(self, buf: bytes | memoryview, pos: int) -> int | None:
        """Length of the frame starting at ``pos``; None until the length is known.

        Raises FrameError (with the reason) when the bytes cannot start a frame.
        """

    def validate(self, buf: bytes, pos: int, length: int) -> FrameError | None:
        """Why the complete frame at ``pos`` is malformed (e.g. 0-9-1 frame-end not 0xCE), if it is."""

    def plausible(self, buf: bytes | memoryview, pos: int) -> bool | None:
        """Whether a frame could start at ``pos``; None while the bytes to tell are not there yet.

        Used to resynchronise after an error.
        """

    def evidence(self, buf: bytes | memoryview, pos: int) -> int:
        """How many bytes from ``pos`` on ``plausible`` needs to decide (it answered None with fewer)."""

    def take_frames(
        self, buf: bytes, pos: int, end: int, base: int, packet_number: int, ts_us: int, out: list[RawFrame | Unframed]
    ) -> int:
        """Append the complete, well-formed frames from ``pos`` on to ``out``; where they stop.

        The splitter's fast path: it stops, leaving the bytes to the splitter's general loop, at
        anything else (a byte "A" that may start a protocol header, bytes that cannot start a
        frame, a frame not yet whole or malformed).
        """


def protocol_header_at(buf: bytes | memoryview, pos: int) -> bool:
    return buf[pos : pos + 4] == _AMQP


class FrameSplitter:
    """Incremental splitter for one direction of one connection."""

    def __init__(self, fmt: FrameFormat, start_offset: int = 0, unframed: FrameError | None = None) -> None:
        """``unframed``: the stream starts with bytes that may not be a frame (a capture started
        inside one), for this reason: the splitter starts by looking for a frame boundary."""
        self.fmt = fmt
        self._buf = bytearray()
        self._base = start_offset  # stream offset of self._buf[0]
        # Bytes self._buf must hold before anything more can be decided: the length of the incomplete
        # frame at its start, or what the boundary candidate being looked at needs.
        self._wanted = 0
        # While self._buf starts with bytes that cannot be framed: why, and the next position (in
        # self._buf) to look at for a frame boundary. Every byte is looked at once, however many
        # packets the unframeable run spans: resynchronisation is linear in the bytes scanned.
        self._unframeable: FrameError | None = unframed
        self._scan = 0

    @property
    def pending(self) -> int:
        """Bytes buffered but not yet part of a complete frame."""
        return len(self._buf)

    @property
    def offset(self) -> int:
        return self._base

    def feed(self, data: bytes, packet_number: int, ts_us: int) -> list[RawFrame | Unframed]:
        """Add contiguous stream bytes; the frames they complete, in stream order (often none)."""
        if self._buf:
            self._buf += data
            if len(self._buf) < self._wanted:
                return []  # the frame in progress is still incomplete: nothing to scan
            buf = bytes(self._buf)
        else:
            buf = bytes(data)
        out: list[RawFrame | Unframed] = []
        pos = 0
        end = len(buf)
        fmt = self.fmt
        take_frames = fmt.take_frames
        base = self._base
        self._wanted = 0
        reason = self._unframeable
        if reason is not None:
            # Still looking for the boundary after the unframeable bytes at the start of the buffer.
            self._unframeable = None
            skipped = self._boundary(buf, 0, self._scan)
            if skipped is None:
                self._unframeable = reason
                return out
            if skipped:
                out.append(reason.unframed(base, skipped, packet_number))
            pos = skipped
        while pos < end:
            # Runs of complete, well-formed frames (nearly all the bytes) in the version's own loop;
            # the rest of this loop handles what stops it: a header, an error, a frame not yet whole.
            pos = take_frames(buf, pos, end, base, packet_number, ts_us, out)
            if pos >= end:
                break
            if buf[pos] == 0x41 and _AMQP.startswith(buf[pos : pos + 4]):  # "A": maybe a protocol header
                if end - pos < PROTOCOL_HEADER_SIZE:
                    break
                if buf[pos : pos + 4] == _AMQP:
                    out.append(RawFrame(base + pos, buf[pos : pos + PROTOCOL_HEADER_SIZE], packet_number, ts_us, True))
                    pos += PROTOCOL_HEADER_SIZE
                    continue
            try:
                length = fmt.frame_length(buf, pos)
            except FrameError as exc:
                skipped = self._boundary(buf, pos, pos + 1)
                if skipped is None:
                    # No boundary in sight yet: keep the bytes until more arrive or the stream ends.
                    self._unframeable = exc
                    break
                out.append(exc.unframed(base + pos, skipped, packet_number))
                pos += skipped
                continue
            if length is None or end - pos < length:
                self._wanted = length or 0
                break
            malformed = fmt.validate(buf, pos, length)
            if malformed is not None:
                skipped = self._boundary(buf, pos + 1, pos + 2)
                self._wanted = 0  # no wait: the frame's own length is the fallback
                size = length if skipped is None else 1 + skipped
                out.append(malformed.unframed(base + pos, size, packet_number))
                pos += size
                continue
            out.append(RawFrame(base + pos, buf[pos : pos + length], packet_number, ts_us, False))
            pos += length
        if pos < end:
            self._buf = bytearray(buf[pos:])
        elif self._buf:
            self._buf = bytearray()
        # else: nothing was buffered and everything was framed (the usual case): no new buffer
        self._base = base + pos
        return out

    def _boundary(self, buf: bytes, start: int, first: int) -> int | None:
        """Bytes from ``start`` to the next plausible frame boundary, looking from ``first`` on.

        None when none is visible yet: then ``self._scan`` (from ``start``) is where to look again and
        ``self._wanted`` how many bytes from ``start`` that needs. No boundary within RESYNC_WINDOW
        bytes: that many are given up (the caller quarantines them, and goes on past them).
        """
        limit = start + RESYNC_WINDOW
        end = min(len(buf), limit)
        fmt = self.fmt
        pos = first
        while pos < end:
            if protocol_header_at(buf, pos):
                return pos - start
            verdict = fmt.plausible(buf, pos)
            if verdict:
                return pos - start
            if verdict is None:  # a candidate whose evidence has not arrived yet
                self._scan = pos - start
                self._wanted = pos - start + max(fmt.evidence(buf, pos), PROTOCOL_HEADER_SIZE)
                return None
            pos += 1
        if pos >= limit:
            return RESYNC_WINDOW
        self._scan = pos - start
        self._wanted = pos - start + 1
        return None

    def close(self, packet_number: int) -> Unframed | None:
        """End of stream: whatever is still buffered is an incomplete frame, or bytes that never framed."""
        return self._drop(packet_number, None)

    def skip(self, size: int, packet_number: int, reason: str) -> Unframed | None:
        """A capture gap: drop what was buffered (it cannot complete) and move past the hole."""
        left = self._drop(packet_number, f"before a capture gap ({reason})")
        self._base += size
        return left

    def _drop(self, packet_number: int, gap: str | None) -> Unframed | None:
        """The buffered bytes as unframed: bytes that never framed keep their reason; a frame not yet
        whole is cut by the end of the stream, or by a capture gap (``gap``: the words for it)."""
        if not self._buf:
            return None
        size = len(self._buf)
        unframeable = self._unframeable
        if unframeable is not None:
            left = unframeable.unframed(
                self._base, size, packet_number, unframeable.reason if gap is None else f"{unframeable.reason} ({gap})"
            )
        elif gap is None:
            left = Unframed(self._base, size, packet_number, _INCOMPLETE, FRAMING_INCOMPLETE_FRAME, error_length=size)
        else:
            left = Unframed(
                self._base, size, packet_number, f"incomplete frame {gap}", FRAMING_CUT_BY_GAP, error_length=size
            )
        self._base += size
        self._buf.clear()
        self._unframeable, self._scan, self._wanted = None, 0, 0
        return left
