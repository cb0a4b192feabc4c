"""A capture file to rows: packets, TCP connections and segments, AMQP frames, and what could not be decoded.

``decode_capture`` is plain Python (no Spark): the ingest job runs it on executors, one capture per
task, and turns its rows into Arrow batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from amqpscope.ingest import amqp091, amqp10
from amqpscope.ingest.framing import FrameError, FrameFormat, FrameSplitter, RawFrame
from amqpscope.ingest.messages import StreamDecoder, stream_decoder
from amqpscope.ingest.packets import LINK_TYPE_NAMES, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, Segment, parse_tcp
from amqpscope.ingest.pcap import Damage, read_container, read_records, scan
from amqpscope.ingest.quarantine import STATUS_OK, capture_status, damage_row, quarantine_row, unframed_row
from amqpscope.ingest.reasons import (
    CONNECTION_AMQP_OVER_TLS,
    CONNECTION_NO_CLIENT_BYTES,
    CONNECTION_NOT_AMQP,
    CONNECTION_TLS,
    CONNECTION_UNSUPPORTED_PROTOCOL_HEADER,
    DECODER_DEFECT,
    FRAMING_MID_STREAM_START,
    TCP_GAP,
    DecodeError,
)
from amqpscope.ingest.rows import add_arguments
from amqpscope.ingest.tcp import Data, DirectionStream, Event, Gap
from amqpscope.ingest.tls_keylog import KeyLog
from amqpscope.ingest.tls_stage import Decided, TlsStage
from amqpscope.ingest.tls_stream import AMQP_TLS_HEADER, Break, Plain, Problem, starts_tls

# AMQP (IANA 5672) and AMQP over TLS (IANA 5671).
DEFAULT_PORTS: Final = (5672, 5671)
C2S, S2C = "c2s", "s2c"
_HEADER_PROTOCOLS: Final = {
    amqp091.PROTOCOL_HEADER: (amqp091.PROTOCOL, "amqp-0-9-1"),
    **{header: (amqp10.PROTOCOL, name) for header, name in amqp10.PROTOCOL_HEADERS.items()},
}
_FORMATS: Final[dict[str, FrameFormat]] = {
    amqp091.PROTOCOL: amqp091.Amqp091Format(),
    amqp10.PROTOCOL: amqp10.Amqp10Format(),
}
# Bytes of a stream examined before giving up on recognising AMQP in it.
_DETECT_BYTES: Final = 64
_GAP: Final = "capture gap: bytes missing from the capture"
_NOT_AMQP: Final = (CONNECTION_NOT_AMQP, "not decoded: not AMQP")
# A connection picked up mid-stream on an AMQP port (no SYN captured) may start inside a frame as
# long as RabbitMQ's frame_max (131072 by default), and the version is taken from two whole frames
# back to back after it and the start of a third: up to this many bytes of each direction (the cut
# frame's rest, two frames of frame_max and room for the third's header) are searched before it is
# taken for something else.
_INFER_BYTES: Final = 4 * 131072
# Held undecided at most this many bytes a direction (the search then decides on what it has).
_INFER_HOLD: Final = 4 * _INFER_BYTES
# The bytes of such a direction before its first frame (the rest of a frame the capture cut).
_MID_STREAM_START: Final = FrameError(
    "capture started inside a frame (connection picked up mid-stream)", 0, FRAMING_MID_STREAM_START
)

Row = dict[str, Any]
Rows = list[tuple[str, Row]]
_NO_ROWS: Final[Sequence[tuple[str, Row]]] = ()


@dataclass
class _Direction:
    stream: DirectionStream = field(default_factory=DirectionStream)
    splitter: FrameSplitter | None = None
    decoder: StreamDecoder | None = None  # per direction: a 1.0 message spans transfer frames
    held: list[Event] = field(default_factory=list)  # data and gaps met before the protocol was known
    held_bytes: int = 0
    payload_bytes: int = 0
    missing_bytes: int = 0


@dataclass
class _Connection:
    connection_id: str
    client: tuple[str, int]
    server: tuple[str, int]
    directions: dict[str, _Direction] = field(default_factory=lambda: {C2S: _Direction(), S2C: _Direction()})
    protocol: str | None = None
    protocol_inferred: bool = False
    not_amqp: bool = False
    not_amqp_reason: tuple[str, str] | None = None  # (reason id, sentence): why it is not decoded
    accountable: bool = False  # on an AMQP port or announced as AMQP: its bytes must be accounted
    frames: int = 0
    first_ts: int | None = None
    last_ts: int | None = None
    fin: set[str] = field(default_factory=set)
    reset: bool = False
    # Window scale option of each direction's SYN (absent key: that SYN not captured).
    syn_scale: dict[str, int | None] = field(default_factory=dict)
    held_segments: list[Row] = field(default_factory=list)  # tcp_segments rows before the protocol is known
    tls: TlsStage | None = None  # a TLS connection's records, between reassembly and framing
    infer_at: int = _DETECT_BYTES  # held bytes at which a mid-stream search for frames runs next


class CaptureDecoder:
    """Streams one capture's packets through TCP reassembly and the AMQP frame decoders.

    With ``segments=True`` it also emits a "tcp_segments" row per TCP segment of every AMQP
    connection (``schemas.tcp.TCP_SEGMENTS_SCHEMA``): one row per packet, so only on request.

    Each packet's rows are collected in a list by plain method calls rather than passed up through
    nested generators: this runs once a packet, and generator frames cost more than the work.
    """

    def __init__(
        self,
        capture_id: str,
        ports: tuple[int, ...] = DEFAULT_PORTS,
        segments: bool = False,
        keys: KeyLog | None = None,
    ) -> None:
        self.capture_id = capture_id
        self.ports = frozenset(ports)
        self.segments = segments
        self.keys = keys  # TLS secrets, read when a TLS connection is first met
        self._live: dict[tuple[str, int, str, int], _Connection] = {}  # by (client, server), in creation order
        # Both directions of every live connection by (source, destination): one lookup a packet.
        self._flows: dict[tuple[str, int, str, int], tuple[_Connection, str, _Direction]] = {}
        self._finished: list[_Connection] = []
        self._seen_ids: dict[str, int] = {}
        self.packets = 0
        self.first_ts: int | None = None
        self.last_ts: int | None = None
        self.link_types: set[int] = set()
        self._last_packet = 0

    # --- connection tracking ------------------------------------------------------------------

    def _new_connection(self, client: tuple[str, int], server: tuple[str, int]) -> _Connection:
        base = f"{client[0]}:{client[1]}-{server[0]}:{server[1]}"
        n = self._seen_ids.get(base, 0) + 1
        self._seen_ids[base] = n
        conn = _Connection(base if n == 1 else f"{base}#{n}", client, server)
        self._live[(*client, *server)] = conn
        self._flows[(*client, *server)] = (conn, C2S, conn.directions[C2S])
        self._flows[(*server, *client)] = (conn, S2C, conn.directions[S2C])
        return conn

    def _locate(self, seg: Segment) -> tuple[_Connection, str, _Direction]:
        """The connection of a segment, its direction and that direction's state."""
        flags = seg.flags
        flow = self._flows.get(seg[:4])  # (src, sport, dst, dport)
        if flow is not None:
            conn = flow[0]
            if not (flags & TCP_SYN and not flags & TCP_ACK and (conn.fin or conn.reset)):
                return flow
            # Port reuse: a new connection on the same four-tuple.
            key = (*conn.client, *conn.server)
            self._finished.append(self._live.pop(key))
            del self._flows[key], self._flows[(*conn.server, *conn.client)]
        a, b = (seg.src, seg.sport), (seg.dst, seg.dport)
        if flags & TCP_SYN:
            # SYN comes from the client, SYN-ACK from the server.
            client, server = (a, b) if not flags & TCP_ACK else (b, a)
        elif seg.dport in self.ports or (seg.sport not in self.ports and seg.dport < seg.sport):
            client, server = a, b
        else:
            client, server = b, a
        self._new_connection(client, server)
        return self._flows[seg[:4]]

    # --- packets to rows ------------------------------------------------------------------------

    def packet(self, number: int, ts_us: int, linktype: int, data: bytes, wirelen: int) -> Sequence[tuple[str, Row]]:
        """The rows one captured packet completes, in order (often none)."""
        self.packets += 1
        self._last_packet = number
        self.link_types.add(linktype)
        first_ts, last_ts = self.first_ts, self.last_ts
        if first_ts is None or last_ts is None:
            self.first_ts = self.last_ts = ts_us
        elif ts_us < first_ts:
            self.first_ts = ts_us
        elif ts_us > last_ts:
            self.last_ts = ts_us
        seg = parse_tcp(linktype, data, wirelen)
        if seg is None:
            return _NO_ROWS
        flow = self._flows.get(seg[:4])  # (src, sport, dst, dport)
        if flow is None or seg.flags & TCP_SYN:
            flow = self._locate(seg)  # a new connection, or maybe a new one on a reused four-tuple
        conn, direction, side = flow
        if conn.not_amqp and not conn.accountable:
            return _NO_ROWS
        _src, _sport, _dst, _dport, seq, _ack, flags, _window, payload, missing, window_scale, _dsack = seg
        if flags & TCP_SYN:
            side.stream.syn(seq)
            conn.syn_scale[direction] = window_scale
        rows: Rows = []
        if self.segments:
            row = self._segment_row(conn, direction, seg, number, ts_us)
            if conn.protocol is None and conn.tls is None:
                conn.held_segments.append(row)  # flushed once the connection is known to be AMQP
            else:
                rows.append(("tcp_segments", row))
        if payload or missing:
            if conn.first_ts is None:
                conn.first_ts = ts_us
            conn.last_ts = ts_us
            # Bytes cut off by the snapshot length come back as a gap right after the captured ones.
            for event in side.stream.segment(seq, payload, number, ts_us, missing):
                self._deliver(conn, direction, side, event, rows)
        if flags & TCP_FIN:
            conn.fin.add(direction)
        if flags & TCP_RST:
            conn.reset = True
        return rows

    def _deliver(self, conn: _Connection, direction: str, side: _Direction, event: Event, rows: Rows) -> None:
        if isinstance(event, Gap):
            side.missing_bytes += event.size
            if conn.tls is not None:
                self._tls_event(conn, direction, event, rows)
                return
            if conn.not_amqp:
                return  # classified, not decoded: quarantined as one run per direction at the end
            if conn.protocol is None:
                side.held.append(event)  # quarantined (or counted in the run) once the protocol is known
                return
            self._gap(conn, direction, side, event, rows)
            return
        side.payload_bytes += len(event.payload)
        if conn.tls is not None:
            self._tls_event(conn, direction, event, rows)
            return
        if conn.not_amqp:
            return
        if conn.protocol is None:
            side.held.append(event)
            side.held_bytes += len(event.payload)
            self._detect(conn, direction, rows)
            return
        self._split(conn, direction, side, event, rows)

    def _gap_row(self, conn: _Connection, direction: str, gap: Gap) -> Row:
        """The quarantine row of bytes missing from the capture (before or under TLS alike)."""
        return quarantine_row(
            self.capture_id,
            conn.connection_id,
            direction,
            gap.offset,
            gap.size,
            gap.packet_number,
            _GAP,
            TCP_GAP,
            missing=True,
        )

    def _gap(self, conn: _Connection, direction: str, side: _Direction, gap: Gap, rows: Rows) -> None:
        """Bytes missing from the capture: a quarantine row, and the splitter resynchronises after them."""
        rows.append(("quarantine", self._gap_row(conn, direction, gap)))
        if side.splitter is not None:
            left = side.splitter.skip(gap.size, gap.packet_number, "capture gap")
            if left is not None:
                rows.append(("quarantine", unframed_row(self.capture_id, conn.connection_id, direction, left)))

    def _detect(self, conn: _Connection, direction: str, rows: Rows, final: bool = False) -> None:
        """Pick the protocol from the client's protocol header, else from frame shapes."""
        c2s = conn.directions[C2S]
        head, cut = _held_head(c2s, _DETECT_BYTES)
        final = final or cut  # bytes after a gap cannot extend the head
        tls = self._tls_detect(conn, head, final)
        if tls is None:
            return
        if tls:
            self._start_tls(conn, rows)
            return
        protocol = None
        starts: dict[str, int] = {}  # mid-stream: where each direction's first frame starts in its held bytes
        if c2s.held and c2s.held[0].offset == 0 and head.startswith(b"AMQP"):
            if len(head) < 8 and not final:
                return
            protocol, name = _HEADER_PROTOCOLS.get(head[:8], (None, None))
            if name == "tls":
                protocol = None  # AMQP over TLS: the header is clear, the rest is ciphertext
        elif conn.server[1] in self.ports and not conn.syn_scale:  # no handshake captured: mid-stream
            found = self._infer_mid_stream(conn, final)
            if found is None:
                return  # undecided: more bytes are needed
            protocol, starts = found
            conn.protocol_inferred = protocol is not None
        elif len(head) >= _DETECT_BYTES or final or (direction == S2C and not c2s.held):
            protocol = self._infer(conn)
            conn.protocol_inferred = protocol is not None
        else:
            return
        if protocol is None:
            conn.not_amqp = True
            conn.not_amqp_reason = _not_amqp_reason(head)
            conn.accountable = conn.server[1] in self.ports or head.startswith(b"AMQP")
            for side in conn.directions.values():
                side.held, side.held_bytes = [], 0
            conn.held_segments = []
            return
        conn.protocol = protocol
        held_segments, conn.held_segments = conn.held_segments, []
        rows.extend(("tcp_segments", row) for row in held_segments)
        waiting: dict[str, list[Event]] = {}
        for d, side in conn.directions.items():
            held, side.held, side.held_bytes = side.held, [], 0
            if conn.protocol_inferred and held and side.splitter is None:
                held = self._frames_start(conn, d, side, held, starts.get(d), rows)
            waiting[d] = held
        # Both directions' bytes in capture order, as if the protocol had been known from the start
        # (a connection's frames are numbered, frame_index, in the order their packets came); each
        # direction's own events in their stream order.
        c2s_events, s2c_events = waiting[C2S], waiting[S2C]
        i = j = 0
        while i < len(c2s_events) or j < len(s2c_events):
            if j >= len(s2c_events) or (
                i < len(c2s_events) and c2s_events[i].packet_number <= s2c_events[j].packet_number
            ):
                d, event, i = C2S, c2s_events[i], i + 1
            else:
                d, event, j = S2C, s2c_events[j], j + 1
            side = conn.directions[d]
            if isinstance(event, Gap):
                self._gap(conn, d, side, event, rows)
            else:
                self._split(conn, d, side, event, rows)

    def _infer(self, conn: _Connection) -> str | None:
        """Mid-stream pickup: the version whose frame shapes fit the bytes seen."""
        if conn.server[1] not in self.ports:
            return None  # shapes alone are no evidence on a port not known to carry AMQP
        for side in (conn.directions[C2S], conn.directions[S2C]):
            head = memoryview(_held_head(side, _DETECT_BYTES * 4)[0])
            if len(head) < 8:
                continue
            for protocol, fmt in _FORMATS.items():
                if fmt.plausible(head, 0) and _chain_plausible(fmt, head):
                    return protocol
        return None

    # --- TLS: a stage between reassembly and framing (ingest.tls_stage) ----------------------------

    def _tls_detect(self, conn: _Connection, head: bytes, final: bool) -> bool | None:
        """Whether this is TLS on an AMQP port (or announced by AMQP 1.0's TLS header), from the
        client's first bytes, or the server's when the capture has none of the client's; None while
        too few bytes are there to tell."""
        if not head:
            if conn.directions[C2S].held:
                return False  # the client's first bytes were lost: no TLS start to recognise
            head = _held_head(conn.directions[S2C], _DETECT_BYTES)[0]
        verdict = starts_tls(head)
        if verdict is None:
            return False if final else None
        return verdict and (conn.server[1] in self.ports or head.startswith(AMQP_TLS_HEADER))

    def _start_tls(self, conn: _Connection, rows: Rows) -> None:
        conn.tls = TlsStage(self.keys, _plaintext_protocol)
        conn.accountable = True
        held_segments, conn.held_segments = conn.held_segments, []
        rows.extend(("tcp_segments", row) for row in held_segments)
        for d, side in conn.directions.items():
            held, side.held, side.held_bytes = side.held, [], 0
            for event in held:
                self._tls_event(conn, d, event, rows)

    def _tls_event(self, conn: _Connection, direction: str, event: Event, rows: Rows) -> None:
        tls = conn.tls
        assert tls is not None
        if isinstance(event, Gap):
            rows.append(("quarantine", self._gap_row(conn, direction, event)))
        self._above_tls(conn, tls.event(direction, event), rows)

    def _above_tls(
        self, conn: _Connection, items: list[tuple[str, Plain | Problem | Break | Decided]], rows: Rows
    ) -> None:
        """The TLS stage's output: decrypted bytes framed, what was not decrypted quarantined."""
        for direction, item in items:
            side = conn.directions[direction]
            if isinstance(item, Plain):
                self._split(
                    conn,
                    direction,
                    side,
                    Data(item.offset, item.payload, item.packet_number, item.ts_us),
                    rows,
                    item.record,
                )
            elif isinstance(item, Problem):
                rows.append(
                    (
                        "quarantine",
                        quarantine_row(
                            self.capture_id,
                            conn.connection_id,
                            direction,
                            item.offset,
                            item.size,
                            item.packet_number,
                            item.reason,
                            item.reason_id,
                        ),
                    )
                )
            elif isinstance(item, Break):
                if side.splitter is not None:
                    left = side.splitter.skip(0, item.packet_number, "TLS records not decrypted")
                    if left is not None:
                        rows.append(("quarantine", unframed_row(self.capture_id, conn.connection_id, direction, left)))
            else:
                conn.protocol, conn.protocol_inferred = item.protocol, item.inferred

    def _finish_tls(self, conn: _Connection, tls: TlsStage) -> Iterator[tuple[str, Row]]:
        rows: Rows = []
        self._above_tls(conn, tls.finish(self._last_packet), rows)
        yield from rows
        for direction, side in conn.directions.items():
            if side.splitter is not None:
                left = side.splitter.close(self._last_packet)
                if left is not None:
                    yield "quarantine", unframed_row(self.capture_id, conn.connection_id, direction, left)
        row = self._connection_row(conn)
        row["protocol"] = conn.protocol or "tls"
        row.update(tls.columns())
        yield "connections", row

    def _infer_mid_stream(self, conn: _Connection, final: bool) -> tuple[str | None, dict[str, int]] | None:
        """A connection picked up mid-stream: the version whose frames run back to back from some
        offset in one direction's held bytes (``_frames_from``), and that offset per direction where
        found; (None, {}) when the bytes are not AMQP; None while undecided (the search runs again
        once half as many bytes again are held, so its cost stays linear)."""
        held = sum(side.held_bytes for side in conn.directions.values())
        final = final or any(side.held_bytes >= _INFER_HOLD for side in conn.directions.values())
        if held < conn.infer_at and not final:
            return None
        conn.infer_at = held + held // 2
        found: dict[str, tuple[str, int]] = {}
        settled = True  # every direction with bytes has as many as the search looks at
        for d, side in conn.directions.items():
            head, cut = _held_head(side, _INFER_BYTES)
            complete = final or cut or len(head) >= _INFER_BYTES
            settled = settled and (complete or not head)
            start = _frames_from(memoryview(head), complete)
            if start is not None:
                found[d] = start
        if not found:
            return (None, {}) if final or settled else None
        protocol = (found.get(C2S) or found[S2C])[0]
        return protocol, {d: offset for d, (p, offset) in found.items() if p == protocol}

    def _frames_start(
        self, conn: _Connection, direction: str, side: _Direction, held: list[Event], start: int | None, rows: Rows
    ) -> list[Event]:
        """A mid-stream direction's splitter, started at its first frame: the bytes before it (the
        rest of a frame the capture cut) are quarantined. Where no frame was found yet, the splitter
        starts resynchronising, as after bytes it cannot frame. Returns the held events left to split."""
        first = held[0]
        fmt = _FORMATS[conn.protocol or ""]
        if start is None:
            side.splitter = FrameSplitter(fmt, start_offset=first.offset, unframed=_MID_STREAM_START)
            side.decoder = stream_decoder(conn.protocol or "")
            return held
        side.splitter = FrameSplitter(fmt, start_offset=first.offset + start)
        side.decoder = stream_decoder(conn.protocol or "")
        if start == 0:
            return held
        rows.append(
            (
                "quarantine",
                unframed_row(
                    self.capture_id,
                    conn.connection_id,
                    direction,
                    _MID_STREAM_START.unframed(first.offset, start, first.packet_number),
                ),
            )
        )
        left, skip = [], start
        for event in held:
            if skip and isinstance(event, Data):
                if len(event.payload) <= skip:
                    skip -= len(event.payload)
                    continue
                event = Data(event.offset + skip, event.payload[skip:], event.packet_number, event.ts_us)
                skip = 0
            left.append(event)
        return left

    def _split(
        self, conn: _Connection, direction: str, side: _Direction, event: Data, rows: Rows, record: int | None = None
    ) -> None:
        protocol = conn.protocol
        assert protocol is not None, "frames split before the protocol is known"
        splitter, decode = side.splitter, side.decoder
        if splitter is None or decode is None:
            splitter = side.splitter = FrameSplitter(_FORMATS[protocol], start_offset=event.offset)
            decode = side.decoder = stream_decoder(protocol)
        if not event.payload:
            return
        capture_id, connection_id = self.capture_id, conn.connection_id
        # Runs once a frame: the frame's row is built here in one go rather than through a call a step.
        for item in splitter.feed(event.payload, event.packet_number, event.ts_us):
            if not isinstance(item, RawFrame):
                rows.append(("quarantine", unframed_row(capture_id, connection_id, direction, item)))
                continue
            offset, data, packet_number, ts_us, is_protocol_header = item
            if is_protocol_header:
                name = _HEADER_PROTOCOLS.get(data, (protocol, data.hex()))[1]
                decoded = {
                    "frame_type": "protocol-header",
                    "method": name,
                    "arguments": {"protocol-id": data[4], "version": ".".join(map(str, data[5:8]))},
                }
            else:
                try:
                    decoded = decode(data)
                except Exception as exc:
                    rows.append(("quarantine", self._undecodable(conn, direction, item, exc)))
                    continue
            row = {
                "capture_id": capture_id,
                "connection_id": connection_id,
                "direction": direction,
                "frame_index": conn.frames,
                "ts": ts_us,
                "ts_us": ts_us,
                "packet_number": packet_number,
                "stream_offset": offset,
                "frame_size": len(data),
                # The frame's kind, as ``rows.frame_row`` sets it.
                "protocol": protocol,
                "frame_type": decoded["frame_type"],
                "channel": decoded.get("channel"),
                "method": decoded.get("method"),
                "class_id": decoded.get("class_id"),
                "method_id": decoded.get("method_id"),
            }
            try:
                add_arguments(row, protocol, decoded)
            except Exception as exc:
                rows.append(("quarantine", self._undecodable(conn, direction, item, exc)))
                continue
            if record is not None:
                row["tls_record_number"] = record
            conn.frames += 1
            rows.append(("frames", row))

    def _undecodable(self, conn: _Connection, direction: str, raw: RawFrame, exc: Exception) -> Row:
        """The quarantine row of a whole frame that did not decode: the reason, and where in the stream.

        A ``DecodeError`` names its reason and offset; any other exception is a decoder defect,
        kept by its type and message at the frame's first byte, so that decoding goes on.
        """
        if isinstance(exc, DecodeError):
            offset = raw.offset + exc.offset
            reason_id, reason, length, expected, found = exc.reason_id, exc.reason, exc.length, exc.expected, exc.found
        else:
            reason_id = DECODER_DEFECT
            offset, reason, length, expected = raw.offset, f"{type(exc).__name__}: {str(exc)[:200]}", None, None
            found = type(exc).__name__
        return quarantine_row(
            self.capture_id,
            conn.connection_id,
            direction,
            raw.offset,
            len(raw.data),
            raw.packet_number,
            f"undecodable {conn.protocol} frame: {reason} (byte {offset})",
            reason_id,
            False,
            offset,
            length,
            expected,
            found,
        )

    def _segment_row(self, conn: _Connection, direction: str, seg: Segment, number: int, ts_us: int) -> Row:
        """The tcp_segments row of one segment, before its payload enters the stream."""
        stream = conn.directions[direction].stream
        peer = conn.directions[S2C if direction == C2S else C2S].stream
        if seg.flags & TCP_SYN:
            seq_offset: int | None = 0  # the SYN's own sequence number precedes stream offset 0
        elif stream.isn is None:
            # Picked up mid-stream: the first byte seen is offset 0.
            seq_offset = 0 if seg.payload or seg.missing else None
        else:
            seq_offset = stream.offset_of(seg.seq)
        ack_offset = None
        dsack_left = dsack_right = None
        if seg.flags & TCP_ACK and peer.isn is not None:
            ack_offset = peer.offset_of(seg.ack)
            if seg.dsack is not None:
                dsack_left, dsack_right = peer.offset_of(seg.dsack[0]), peer.offset_of(seg.dsack[1])
        if seg.flags & TCP_SYN:
            scale: int | None = 0  # RFC 7323 2.2: the window of a SYN is never scaled
        elif len(conn.syn_scale) < 2:
            scale = None  # handshake not captured: the shift is unknown
        elif None in conn.syn_scale.values():
            scale = 0  # window scaling is in effect only if both SYNs carried the option
        else:
            scale = conn.syn_scale[direction]
        # On the wire: bytes cut by the snapshot length still occupied sequence space.
        length = len(seg.payload) + seg.missing
        retransmitted = 0
        if seq_offset is not None and length:
            retransmitted = max(0, min(seq_offset + length, stream.next_offset) - seq_offset)
        return {
            "capture_id": self.capture_id,
            "connection_id": conn.connection_id,
            "direction": direction,
            "packet_number": number,
            "ts": ts_us,
            "ts_us": ts_us,
            "seq_offset": seq_offset,
            "ack_offset": ack_offset,
            "flags": seg.flags,
            "window": seg.window,
            "window_scale": scale,
            "effective_window": seg.window << (scale or 0),
            "payload_length": length,
            "retransmitted_bytes": retransmitted,
            "dsack_left_offset": dsack_left,
            "dsack_right_offset": dsack_right,
        }

    # --- end of capture -------------------------------------------------------------------------

    def finish(self) -> Iterator[tuple[str, Row]]:
        """Flush every connection: open holes become gaps, partial frames go to the quarantine."""
        for conn in [*self._finished, *self._live.values()]:
            rows: Rows = []
            for direction, side in conn.directions.items():
                for event in side.stream.finish(self._last_packet):
                    self._deliver(conn, direction, side, event, rows)
            if conn.protocol is None and not conn.not_amqp and any(s.held for s in conn.directions.values()):
                self._detect(conn, C2S, rows, final=True)
            yield from rows
            if conn.tls is not None:
                yield from self._finish_tls(conn, conn.tls)
                continue
            if conn.not_amqp:
                if conn.accountable:
                    yield from self._classified_rows(conn)
                continue
            if conn.protocol is None:
                continue
            for direction, side in conn.directions.items():
                if side.splitter is not None:
                    left = side.splitter.close(self._last_packet)
                    if left is not None:
                        yield "quarantine", unframed_row(self.capture_id, conn.connection_id, direction, left)
            yield "connections", self._connection_row(conn)

    def _classified_rows(self, conn: _Connection) -> Iterator[tuple[str, Row]]:
        """A connection on an AMQP port that is not AMQP: its bytes in one quarantine run a direction."""
        reason_id, reason = conn.not_amqp_reason or _NOT_AMQP
        for direction, side in conn.directions.items():
            if side.payload_bytes:
                yield (
                    "quarantine",
                    quarantine_row(
                        self.capture_id,
                        conn.connection_id,
                        direction,
                        0,
                        side.payload_bytes,
                        self._last_packet,
                        reason,
                        reason_id,
                    ),
                )
            if side.missing_bytes:
                yield (
                    "quarantine",
                    quarantine_row(
                        self.capture_id,
                        conn.connection_id,
                        direction,
                        0,
                        side.missing_bytes,
                        self._last_packet,
                        _GAP,
                        TCP_GAP,
                        missing=True,
                    ),
                )
        row = self._connection_row(conn)
        row["protocol"] = "tls" if "TLS" in reason else "not-amqp"
        yield "connections", row

    def _connection_row(self, conn: _Connection) -> Row:
        c2s, s2c = conn.directions[C2S], conn.directions[S2C]
        return {
            "capture_id": self.capture_id,
            "connection_id": conn.connection_id,
            "client_address": conn.client[0],
            "client_port": conn.client[1],
            "server_address": conn.server[0],
            "server_port": conn.server[1],
            "protocol": conn.protocol,
            "protocol_inferred": conn.protocol_inferred,
            "first_ts": conn.first_ts,
            "last_ts": conn.last_ts,
            "frames": conn.frames,
            "c2s_bytes": c2s.payload_bytes,
            "s2c_bytes": s2c.payload_bytes,
            "c2s_missing_bytes": c2s.missing_bytes,
            "s2c_missing_bytes": s2c.missing_bytes,
            "retransmitted_bytes": c2s.stream.retransmitted_bytes + s2c.stream.retransmitted_bytes,
        }

    def capture_row(self, path: str | Path, file_size: int, status: str = STATUS_OK) -> Row:
        """The captures row of a one-file capture (whose id is that file's content hash)."""
        return {
            "capture_id": self.capture_id,
            "file_name": Path(path).name,
            "file_size": file_size,
            "parts": [{"file_name": Path(path).name, "file_size": file_size, "content_hash": self.capture_id}],
            "packets": self.packets,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "link_types": ",".join(sorted(LINK_TYPE_NAMES.get(t, str(t)) for t in self.link_types)),
            "status": status,
            "tcp_connections": len(self._seen_ids),  # pairs of endpoints, as the Spark ingest counts them
        }


def _held_head(side: _Direction, limit: int) -> tuple[bytes, bool]:
    """Up to ``limit`` contiguous bytes held at the start of a direction, and whether a gap ends them."""
    parts: list[bytes] = []
    size = 0
    for event in side.held:
        if isinstance(event, Gap):
            return b"".join(parts)[:limit], True
        parts.append(event.payload)
        size += len(event.payload)
        if size >= limit:
            break
    return b"".join(parts)[:limit], False


def _plaintext_protocol(c2s: bytes, s2c: bytes, final: bool) -> tuple[bool, str | None, bool]:
    """The AMQP version of decrypted bytes (``ingest.tls_stage.Classify``): the client's protocol
    header, else the frame shapes of either direction's first bytes."""
    if c2s.startswith(b"AMQP"):
        if len(c2s) < 8 and not final:
            return False, None, False
        return True, _HEADER_PROTOCOLS.get(c2s[:8], (None, None))[0], False
    if len(c2s) < _DETECT_BYTES and len(s2c) < _DETECT_BYTES and not final:
        return False, None, False
    for head in (memoryview(c2s[: _DETECT_BYTES * 4]), memoryview(s2c[: _DETECT_BYTES * 4])):
        for protocol, fmt in _FORMATS.items():
            if len(head) >= 8 and fmt.plausible(head, 0) and _chain_plausible(fmt, head):
                return True, protocol, True
    return True, None, False


def _chain_plausible(fmt: FrameFormat, head: memoryview) -> bool:
    """A second frame boundary right after the first one makes a shape match convincing."""
    try:
        length = fmt.frame_length(head, 0)
    except ValueError:
        return False
    if length is None or length >= len(head):
        return True
    return bool(fmt.plausible(head, length))  # None: too few bytes to tell


def _frames_from(head: memoryview, complete: bool) -> tuple[str, int] | None:
    """The first offset of ``head`` from which frames of one AMQP version run back to back, and the
    version: three frames, or two whose successor's evidence is not all held yet; with ``complete``
    (no more bytes will come), also a last frame that ends exactly at the end of the bytes."""
    for offset in range(max(0, len(head) - 7)):
        for protocol, fmt in _FORMATS.items():
            frames, ran_out, pos = 0, False, offset
            while frames < 3:
                verdict = fmt.plausible(head, pos)
                if verdict is None:
                    ran_out = True
                    break
                if not verdict:
                    break
                try:
                    length = fmt.frame_length(head, pos)
                except ValueError:
                    break
                if length is None:
                    ran_out = True
                    break
                frames += 1
                pos += length
                if pos >= len(head):
                    ran_out = pos > len(head) or not complete
                    break
            if frames >= 3 or (frames >= 2 and ran_out) or (complete and frames >= 1 and pos == len(head)):
                return protocol, offset
    return None


def _not_amqp_reason(head: bytes) -> tuple[str, str]:
    """Why a connection on an AMQP port is not decoded, from the client's first bytes: (id, sentence)."""
    if not head:
        return CONNECTION_NO_CLIENT_BYTES, "not decoded: no payload bytes captured"
    if head.startswith(b"AMQP\x02"):
        return CONNECTION_AMQP_OVER_TLS, "not decoded: AMQP over TLS"
    if head[:1] == b"\x16":
        return CONNECTION_TLS, "not decoded: TLS handshake"
    if head.startswith(b"AMQP"):
        return CONNECTION_UNSUPPORTED_PROTOCOL_HEADER, f"not decoded: unsupported protocol header {head[:8].hex()}"
    return _NOT_AMQP


def direction_payloads(path: str | Path) -> dict[tuple[str, int, str, int], list[bytes]]:
    """Every TCP direction's payload in stream order, as delivered by reassembly, keyed by
    (source, source port, destination, destination port): for the benchmark and tests that feed
    the frame splitter themselves, without connection tracking or decoding."""
    payloads: dict[tuple[str, int, str, int], list[bytes]] = {}
    streams: dict[tuple[str, int, str, int], DirectionStream] = {}
    for record in read_records(path):
        seg = parse_tcp(record.linktype, record.data, record.wirelen)
        if seg is None:
            continue
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        stream = streams.setdefault(key, DirectionStream())
        if seg.flags & TCP_SYN:
            stream.syn(seg.seq)
        for event in stream.segment(seg.seq, seg.payload, record.number, record.ts_us):
            if isinstance(event, Data):
                payloads.setdefault(key, []).append(event.payload)
    return payloads


def decode_capture(
    path: str | Path,
    capture_id: str,
    ports: tuple[int, ...] = DEFAULT_PORTS,
    segments: bool = False,
    tls_keylog: Sequence[str | Path] = (),
) -> Iterator[tuple[str, Row]]:
    """Every row of one capture: ("frames" | "connections" | "quarantine" | "captures", row), and
    ("tcp_segments", row) too with ``segments=True``. TLS sessions are decrypted with the secrets of
    the ``tls_keylog`` files (NSS key log format), read when a TLS connection is first met.

    Records are read as the Spark ingest reads a range (``ingest.pcap.scan``); a file damaged part
    way keeps what was read: past a record of impossible length reading goes on at the next
    plausible record, and what was skipped (or, cut short, the unread rest) is a quarantine row
    and the capture's ``status``, as there.
    """
    container = read_container(path)
    file_size = Path(path).stat().st_size
    decoder = CaptureDecoder(capture_id, ports, segments, KeyLog([str(p) for p in tls_keylog]) if tls_keylog else None)
    packet = decoder.packet
    damage: list[Damage] = []
    for number, (_offset, ts_us, linktype, data, wirelen) in enumerate(
        scan(path, container, container.data_start, file_size, damage), 1
    ):
        rows = packet(number, ts_us, linktype, data, wirelen)
        if rows:
            yield from rows
    yield from decoder.finish()
    damaged = [damage_row(capture_id, skipped) for skipped in damage]
    for row in damaged:
        yield "quarantine", row
    yield "captures", decoder.capture_row(path, file_size, capture_status(damaged))
