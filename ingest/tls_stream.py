"""TLS between TCP reassembly and AMQP framing: records of one connection to plaintext, a direction at a time.

``TlsSession`` takes each direction's reassembled bytes (``ingest.tcp.Data`` and ``Gap``) and
returns, in stream order:

- ``Plain``: application data decrypted from one record, with the packet that completed the record
  (the packet that completes a frame is then the one that completed the record completing it),
  the record's number in its direction and its offset in the direction's decrypted stream;
- ``Problem``: bytes that were not decrypted, with a reason (``tls.<id>: sentence``), offsets in the
  TCP stream; consecutive ones with the same reason are one run;
- ``Break``: plaintext was lost here (a record not decrypted, bytes missing): the AMQP framer drops
  the frame it holds.

Records are split on their 5-byte header (RFC 8446 5.1, RFC 5246 6.2) whatever the segments: a
record may span segments and a segment hold several records. The handshake is read in the clear
(``ingest.tls_handshake``): the ClientHello's random finds the session's secrets in the key log;
TLS 1.2 switches a direction to its keys at its ChangeCipherSpec, TLS 1.3 at the ServerHello
(handshake keys) and after each Finished (application keys), and a KeyUpdate moves to the next
secret. After bytes are lost the next record boundary is the first plausible header followed by
another one, and the records lost are found by trying the sequence numbers they may have taken.

Every byte of a direction is accounted for: in a ``Plain``, in a ``Problem``, or in ``tls_bytes``
(record headers, nonces and tags, padding, handshake, alerts: TLS's own bytes).
This module is not compiled (``ingest.compiled``): it runs only for TLS connections, and the
decryption itself is the ``cryptography`` package's.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final, NamedTuple

from amqpscope.ingest.reasons import (
    REASONS,
    TLS_CIPHER_UNSUPPORTED,
    TLS_DECRYPT_FAILED,
    TLS_NO_HANDSHAKE,
    TLS_NO_KEY,
    TLS_NOT_A_RECORD,
    TLS_RECORD_TRUNCATED,
    TLS_SEGMENT_MISSING,
)
from amqpscope.ingest.tcp import Data, Gap
from amqpscope.ingest.tls_handshake import (
    CLIENT_HELLO,
    ENCRYPTED_EXTENSIONS,
    FINISHED,
    KEY_UPDATE,
    SERVER_HELLO,
    TLS13,
    HandshakeMessages,
    client_hello,
    encrypted_extensions,
    server_hello,
)
from amqpscope.ingest.tls_keylog import KeyLog

if TYPE_CHECKING:
    from amqpscope.ingest.tls_crypto import RecordKeys

C2S, S2C = "c2s", "s2c"
RECORD_HEADER: Final = 5
CHANGE_CIPHER_SPEC, ALERT, HANDSHAKE, APPLICATION_DATA, HEARTBEAT = 20, 21, 22, 23, 24
# RFC 5246 6.2.3: a TLSCiphertext fragment is at most 2^14 + 2048 bytes (TLS 1.3 allows less).
MAX_RECORD_BODY: Final = (1 << 14) + 2048
_SMALLEST_SEALED_RECORD: Final = RECORD_HEADER + 16 + 1  # header, AEAD tag, TLS 1.3 content type
# AMQP 1.0's TLS negotiation (AMQP 1.0 part 5, 5.2.1): this header each way, then the TLS handshake.
AMQP_TLS_HEADER: Final = b"AMQP\x02\x01\x00\x00"
# Records held while the ServerHello they need has not been read (the other direction may lag).
MAX_WAITING_BYTES: Final = 4 << 20
# After lost bytes: how many sequence numbers past the expected one a record is tried under.
MAX_SEQUENCE_TRIES: Final = 1024


def reason(reason_id: str, detail: str = "") -> str:
    """The sentence of a TLS reason id (``ingest.reasons.REASONS``), and the detail, which never holds
    key material."""
    return f"{REASONS[reason_id]}{' (' + detail + ')' if detail else ''}"


class Plain(NamedTuple):
    offset: int  # in the direction's decrypted stream
    payload: bytes
    packet_number: int  # the packet that completed the record
    ts_us: int
    record: int  # the record's number in its direction, from 1


class Problem(NamedTuple):
    offset: int  # in the direction's TCP stream
    size: int
    packet_number: int
    reason: str
    reason_id: str


class Break(NamedTuple):
    packet_number: int


Item = Plain | Problem | Break
# Items with the direction they belong to: a record held for the other direction's ServerHello is
# decrypted when that arrives, so one call's output may be of either direction.
Output = list[tuple[str, Item]]


# A plausible record header, as _plausible_header says (length 1 to MAX_RECORD_BODY: 0x0001-0x4800),
# for the searches after lost bytes, which then run in C rather than a Python loop a byte.
_HEADER: Final = re.compile(rb"[\x14-\x18]\x03[\x00-\x04](?:\x00[\x01-\xff]|[\x01-\x47][\x00-\xff]|\x48\x00)")


def _plausible_header(buf: bytes | bytearray, pos: int) -> bool:
    content_type, major, minor = buf[pos], buf[pos + 1], buf[pos + 2]
    length = (buf[pos + 3] << 8) | buf[pos + 4]
    return (
        CHANGE_CIPHER_SPEC <= content_type <= HEARTBEAT and major == 3 and minor <= 4 and 0 < length <= MAX_RECORD_BODY
    )


def starts_tls(head: bytes) -> bool | None:
    """Whether a direction's first bytes are TLS (a record header, or AMQP 1.0's TLS protocol
    header): True or False, None while too few bytes are there to tell."""
    if head[:1] == b"A":
        if len(head) < len(AMQP_TLS_HEADER):
            return None if AMQP_TLS_HEADER.startswith(head) else False
        return head.startswith(AMQP_TLS_HEADER)
    if len(head) < RECORD_HEADER:
        prefix = bytes(head) + b"\x03\x00\x00\x01"[len(head) - 1 :] if head else b""
        return None if not head or _plausible_header(prefix, 0) else False
    return _plausible_header(head, 0)


class _Record(NamedTuple):
    offset: int
    header: bytes
    body: bytes
    packet_number: int
    ts_us: int
    number: int

    @property
    def size(self) -> int:
        return RECORD_HEADER + len(self.body)


class _Side:
    """One direction: its bytes not yet a whole record, its keys, its counts."""

    def __init__(self, name: str) -> None:
        self.name = name  # the direction, C2S or S2C
        self.buf = bytearray()
        self.base = 0  # TCP stream offset of buf[0]
        self.begun = False  # past a leading AMQP TLS header, if any
        self.records = 0
        self.lost: str | None = None  # while the next record boundary is unknown: why
        self.scan = 0  # where in buf to look next for that boundary
        self.encrypted = False  # records are sealed (TLS 1.2 after ChangeCipherSpec, 1.3 after ServerHello)
        self.keys: RecordKeys | None = None
        self.secret: bytes | None = None  # TLS 1.3: the secret of ``keys``, for a key update
        self.later: list[tuple[RecordKeys, bytes]] = []  # TLS 1.3: application keys while handshake keys run
        self.why = TLS_NO_KEY  # why records cannot be decrypted, when ``keys`` and ``later`` are empty
        self.seq = 0
        self.tries = 1  # sequence numbers to try for the next record (more after lost bytes)
        self.handshake = HandshakeMessages()
        self.plain_offset = 0
        self.tls_bytes = 0
        self.decrypted = 0
        self.run: Problem | None = None  # the quarantine run being extended
        self.waiting: list[_Record] = []  # records that need the ServerHello
        self.waiting_bytes = 0
        self.switch_keys = False  # TLS 1.3: a Finished or KeyUpdate in this record: next keys after it
        self.key_update = False


class TlsSession:
    """The TLS layer of one TCP connection."""

    def __init__(self, keys: KeyLog | None) -> None:
        self.keys = keys
        self.sides = {C2S: _Side(C2S), S2C: _Side(S2C)}
        self.client: str | None = None  # the direction that sent the ClientHello
        self.client_random: bytes | None = None
        self.server_random: bytes | None = None
        self.version: str | None = None
        self.suite: int | None = None
        self.sni: str | None = None
        self.alpn_offered: list[str] = []
        self.alpn: str | None = None
        self.status: str | None = None  # the first problem's reason id
        self._hello_seen = False  # a ClientHello or ServerHello, in either direction

    # --- input ----------------------------------------------------------------------------------

    def feed(self, direction: str, data: Data) -> Output:
        side = self.sides[direction]
        out: Output = []
        if data.offset != side.base + len(side.buf):
            # Reassembly delivers contiguous data; anything else is a discontinuity to resynchronise after.
            out += self._drop_partial(side, data.packet_number, TLS_SEGMENT_MISSING)
            side.base = data.offset
            side.lost, side.scan = TLS_SEGMENT_MISSING, 0
        side.buf += data.payload
        self._records(direction, side, data.packet_number, data.ts_us, out)
        return out

    def gap(self, direction: str, gap: Gap) -> Output:
        """Bytes missing from the capture: the record they cut is lost, and the boundary after them unknown."""
        side = self.sides[direction]
        out = self._drop_partial(side, gap.packet_number, TLS_SEGMENT_MISSING)
        side.base = gap.offset + gap.size
        side.lost, side.scan = TLS_SEGMENT_MISSING, 0
        # Each lost record took a sequence number: try as many as could have fit in the gap.
        side.tries = min(MAX_SEQUENCE_TRIES, side.tries + gap.size // _SMALLEST_SEALED_RECORD + 1)
        return out

    def finish(self, direction: str, packet_number: int) -> Output:
        """End of capture: a record still incomplete is truncated; records still waiting had no handshake."""
        side = self.sides[direction]
        out: Output = []
        if side.lost is not None:
            self._records(direction, side, packet_number, 0, out, final=True)
        if side.buf:
            if side.lost is not None:
                self._problem(side, side.base, len(side.buf), packet_number, side.lost, out)
            elif not side.begun:
                self._problem(side, side.base, len(side.buf), packet_number, TLS_NOT_A_RECORD, out)
            else:
                expected = RECORD_HEADER + ((side.buf[3] << 8) | side.buf[4]) if len(side.buf) >= RECORD_HEADER else 0
                detail = f"{len(side.buf)} of {expected} bytes" if expected else f"{len(side.buf)} bytes of a header"
                self._problem(side, side.base, len(side.buf), packet_number, TLS_RECORD_TRUNCATED, out, detail)
            side.base += len(side.buf)
            side.buf.clear()
        for record in side.waiting:
            self._problem(
                side,
                record.offset,
                record.size,
                record.packet_number,
                TLS_NO_HANDSHAKE,
                out,
                "no ServerHello in the capture",
            )
        side.waiting, side.waiting_bytes = [], 0
        if side.run is not None:
            out.append((side.name, side.run))
            side.run = None
        return out

    # --- records ----------------------------------------------------------------------------------

    def _records(self, direction: str, side: _Side, packet: int, ts_us: int, out: Output, final: bool = False) -> None:
        buf = side.buf
        pos = 0
        end = len(buf)
        while True:
            if not side.begun:
                if buf[pos : pos + 1] == b"A":
                    if end - pos < len(AMQP_TLS_HEADER) and AMQP_TLS_HEADER.startswith(buf[pos:end]):
                        break
                    if buf[pos : pos + len(AMQP_TLS_HEADER)] == AMQP_TLS_HEADER:
                        side.tls_bytes += len(AMQP_TLS_HEADER)
                        pos += len(AMQP_TLS_HEADER)
                side.begun = end > pos
                if not side.begun:
                    break
            if side.lost is not None:
                found = self._boundary(side, buf, pos, final)
                if found is None:
                    if side.scan > pos:  # bytes known to start no record: quarantined now, not held
                        self._problem(side, side.base + pos, side.scan - pos, packet, side.lost, out)
                        pos = side.scan
                    break
                if found > pos:
                    self._problem(side, side.base + pos, found - pos, packet, side.lost, out)
                pos = found
                side.lost = None
            if end - pos < RECORD_HEADER:
                break
            if not _plausible_header(buf, pos):
                side.lost, side.scan = TLS_NOT_A_RECORD, pos + 1
                out.append((side.name, Break(packet)))
                continue
            size = RECORD_HEADER + ((buf[pos + 3] << 8) | buf[pos + 4])
            if end - pos < size:
                break
            side.records += 1
            record = _Record(
                side.base + pos,
                bytes(buf[pos : pos + RECORD_HEADER]),
                bytes(buf[pos + RECORD_HEADER : pos + size]),
                packet,
                ts_us,
                side.records,
            )
            pos += size
            self._record(direction, side, record, out)
        if pos:
            del buf[:pos]
            side.base += pos
            side.scan = max(0, side.scan - pos)

    def _boundary(self, side: _Side, buf: bytearray, pos: int, final: bool) -> int | None:
        """Where the next record starts after lost bytes: a plausible header whose record is followed
        by another plausible header (or ends the stream, at its end); None until that can be told.

        Each position is looked at once, however many feeds the search takes (``side.scan``), and
        only where a content type and version could start is a header looked at: those are found by
        a regular expression (in C), and each costs two of its searches, not a Python loop a byte."""
        end = len(buf)
        at = max(pos, side.scan)
        search, match = _HEADER.search, _HEADER.match
        while True:
            candidate = search(buf, at)
            if candidate is None:
                side.scan = max(at, end - RECORD_HEADER + 1)  # a header may start in the last bytes
                return None
            at = candidate.start()
            after = at + RECORD_HEADER + ((buf[at + 3] << 8) | buf[at + 4])
            if after + RECORD_HEADER <= end:
                if match(buf, after):
                    return at
            elif not (final and after == end):
                side.scan = at
                return None  # wait for the bytes that tell
            else:
                return at
            at += 1

    def _drop_partial(self, side: _Side, packet: int, why: str) -> Output:
        out: Output = []
        if side.buf:
            self._problem(side, side.base, len(side.buf), packet, side.lost or why, out)
            side.base += len(side.buf)
            side.buf.clear()
        out.append((side.name, Break(packet)))
        return out

    def _problem(
        self, side: _Side, offset: int, size: int, packet: int, reason_id: str, out: Output, detail: str = ""
    ) -> None:
        if self.status is None:
            self.status = reason_id
        text = reason(reason_id, detail)
        run = side.run
        if run is not None and run.reason == text and run.offset + run.size == offset:
            side.run = Problem(run.offset, run.size + size, packet, text, reason_id)
            return
        if run is not None:
            out.append((side.name, run))
        side.run = Problem(offset, size, packet, text, reason_id)

    def _record(self, direction: str, side: _Side, record: _Record, out: Output) -> None:
        content_type = record.header[0]
        if content_type == CHANGE_CIPHER_SPEC:
            side.tls_bytes += record.size
            if self.version != TLS13 and not side.encrypted:  # TLS 1.3's is for middleboxes only (D.4)
                side.encrypted = True
                side.seq = 0
                if self.server_random is not None:
                    self._arm(direction)
            return
        if not side.encrypted:
            if content_type == HANDSHAKE:
                side.tls_bytes += record.size
                self._handshake(direction, side, record.body, out)
            elif content_type == APPLICATION_DATA:
                if self._hello_seen:
                    self._wait(side, record, out)  # TLS 1.3 whose ServerHello has not been read yet
                else:
                    self._problem(side, record.offset, record.size, record.packet_number, TLS_NO_HANDSHAKE, out)
                    out.append((side.name, Break(record.packet_number)))
            else:
                side.tls_bytes += record.size  # alerts, heartbeats
            return
        if self.server_random is None or self.version is None:
            self._wait(side, record, out)
            return
        self._sealed(direction, side, record, out)

    def _wait(self, side: _Side, record: _Record, out: Output) -> None:
        if side.waiting_bytes + record.size > MAX_WAITING_BYTES:
            self._problem(
                side,
                record.offset,
                record.size,
                record.packet_number,
                TLS_NO_HANDSHAKE,
                out,
                "no ServerHello before the session's first 4 MiB",
            )
            out.append((side.name, Break(record.packet_number)))
            return
        side.waiting.append(record)
        side.waiting_bytes += record.size

    def _sealed(self, direction: str, side: _Side, record: _Record, out: Output) -> None:
        plain = self._open(side, record)
        if plain is None:
            why = TLS_DECRYPT_FAILED if side.keys is not None or side.later else side.why
            detail = ""
            if why == TLS_CIPHER_UNSUPPORTED:
                detail = self.suite_name() or ""
            elif why == TLS_NO_KEY and (self.keys is None or not self.keys.given):
                detail = "no key log given"
            self._problem(side, record.offset, record.size, record.packet_number, why, out, detail)
            out.append((side.name, Break(record.packet_number)))
            return
        side.decrypted += 1
        content_type = record.header[0]
        if self.version == TLS13:
            # TLSInnerPlaintext (RFC 8446 5.2): content, the real type, then zero padding.
            stripped = plain.rstrip(b"\x00")
            if not stripped:
                self._problem(
                    side, record.offset, record.size, record.packet_number, TLS_DECRYPT_FAILED, out, "no content type"
                )
                out.append((side.name, Break(record.packet_number)))
                return
            content_type, plain = stripped[-1], stripped[:-1]
        if content_type == APPLICATION_DATA:
            side.tls_bytes += record.size - len(plain)
            if plain:
                out.append(
                    (side.name, Plain(side.plain_offset, plain, record.packet_number, record.ts_us, record.number))
                )
                side.plain_offset += len(plain)
        else:
            side.tls_bytes += record.size
            if content_type == HANDSHAKE:
                self._handshake(direction, side, plain, out)
        if side.switch_keys:
            self._next_keys(side)

    def _open(self, side: _Side, record: _Record) -> bytes | None:
        """The record's plaintext under the direction's keys: the expected sequence number (several
        after lost bytes), else the next epoch's keys from its start (TLS 1.3 records whose
        Finished was lost); None when nothing authenticates it."""
        tries = side.tries
        keys = side.keys
        if keys is not None:
            for seq in range(side.seq, side.seq + tries):
                plain = keys.open(seq, record.header, record.body)
                if plain is not None:
                    side.seq, side.tries = seq + 1, 1
                    return plain
        for index, (later, secret) in enumerate(side.later):
            for seq in range(tries):
                plain = later.open(seq, record.header, record.body)
                if plain is not None:
                    side.keys, side.secret, side.later = later, secret, side.later[index + 1 :]
                    side.seq, side.tries = seq + 1, 1
                    return plain
        side.seq += 1  # a damaged record took its number too
        side.tries = max(1, tries // 2)  # the search after lost bytes narrows: its cost stays bounded
        return None

    def _next_keys(self, side: _Side) -> None:
        from amqpscope.ingest.tls_crypto import SUITES, tls13_keys, tls13_next_secret

        side.switch_keys = False
        if side.key_update:
            side.key_update = False
            suite = SUITES.get(self.suite or -1)
            if side.secret is not None and suite is not None and not side.later:
                side.secret = tls13_next_secret(suite, side.secret)
                side.keys, side.seq = tls13_keys(suite, side.secret), 0
            return
        if side.later:
            (side.keys, side.secret), side.later = side.later[0], side.later[1:]
            side.seq = 0

    # --- the handshake ---------------------------------------------------------------------------

    def _handshake(self, direction: str, side: _Side, content: bytes, out: Output) -> None:
        for kind, body in side.handshake.feed(content):
            try:
                if kind == CLIENT_HELLO:
                    self._client_hello(direction, body)
                elif kind == SERVER_HELLO:
                    self._server_hello(direction, body, out)
                elif kind == ENCRYPTED_EXTENSIONS:
                    selected = encrypted_extensions(body)
                    self.alpn = selected[0] if selected else self.alpn
                elif kind == FINISHED and side.encrypted and self.version == TLS13:
                    side.switch_keys = True  # the application keys from the next record on (RFC 8446 7.1)
                elif kind == KEY_UPDATE and side.encrypted and self.version == TLS13:
                    side.switch_keys = side.key_update = True
            except ValueError:
                continue  # a malformed hello: its session's keys cannot be found, and the records say so

    def _client_hello(self, direction: str, body: bytes) -> None:
        hello = client_hello(body)
        self._hello_seen = True
        if self.client is None:
            self.client = direction
            self.client_random = hello.random  # a second ClientHello (after a HelloRetryRequest) keeps it
            self.sni, self.alpn_offered = hello.sni, hello.alpn

    def _server_hello(self, direction: str, body: bytes, out: Output) -> None:
        hello = server_hello(body)
        self._hello_seen = True
        self.version, self.suite = hello.version, hello.cipher_suite
        if hello.retry:
            return  # HelloRetryRequest: the real ServerHello follows a second ClientHello
        self.server_random = hello.random
        if hello.alpn:
            self.alpn = hello.alpn[0]
        if self.client is None:
            self.client = C2S if direction == S2C else S2C
        if self.version == TLS13:
            for side in self.sides.values():
                side.encrypted, side.seq = True, 0
        for name, side in self.sides.items():
            if side.encrypted:
                self._arm(name)
        for name, side in self.sides.items():
            waiting, side.waiting, side.waiting_bytes = side.waiting, [], 0
            for record in waiting:
                self._record(name, side, record, out)

    def _arm(self, direction: str) -> None:
        """The direction's record keys from the key log (or why there are none)."""
        from amqpscope.ingest.tls_crypto import SUITES, TLS12, tls12_keys, tls13_keys

        side = self.sides[direction]
        side.keys, side.later, side.secret = None, [], None
        suite = SUITES.get(self.suite if self.suite is not None else -1)
        if suite is None or suite.version != self.version:
            side.why = TLS_CIPHER_UNSUPPORTED
            return
        side.why = TLS_NO_KEY
        if self.keys is None or self.client_random is None:
            side.why = TLS_NO_KEY if self.client_random is not None else TLS_NO_HANDSHAKE
            return
        role = "CLIENT" if direction == self.client else "SERVER"
        if suite.version == TLS12:
            master = self.keys.secret(self.client_random, "CLIENT_RANDOM")
            if master is not None and self.server_random is not None:
                client, server = tls12_keys(suite, master, self.client_random, self.server_random)
                side.keys = client if role == "CLIENT" else server
            return
        handshake = self.keys.secret(self.client_random, f"{role}_HANDSHAKE_TRAFFIC_SECRET")
        application = self.keys.secret(self.client_random, f"{role}_TRAFFIC_SECRET_0")
        if handshake is not None:
            side.keys, side.secret = tls13_keys(suite, handshake), handshake
        if application is not None:
            side.later = [(tls13_keys(suite, application), application)]

    # --- what the connection row says --------------------------------------------------------------

    def suite_name(self) -> str | None:
        from amqpscope.ingest.tls_crypto import suite_name

        return suite_name(self.suite) if self.suite is not None else None

    def tls_bytes(self, direction: str) -> int:
        return self.sides[direction].tls_bytes

    @property
    def decrypted(self) -> bool:
        return any(side.decrypted for side in self.sides.values())

    def outcome(self) -> str:
        """``decrypted`` when every record was, else the first problem's reason id (``tls.no_key`` ...);
        ``handshake`` when no sealed record was seen at all."""
        if self.status is not None:
            return self.status
        return "decrypted" if self.decrypted else "handshake"
