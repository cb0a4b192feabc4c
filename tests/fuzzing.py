"""The fuzz target over the per-packet decoder, its invariants, and the inputs it is fed.

``run(case)`` sends one TCP connection's two byte streams, cut into segments, through
``CaptureDecoder.packet`` (TCP reassembly, framing, both decoders, 1.0 message assembly, rows) as
raw IPv4 packets, then ``finish``, and checks what must hold for any bytes at all:

- nothing raises out of the decoder (every failure inside a frame is that frame's quarantine row);
- every payload byte of each direction is in a frame or in the quarantine (byte accounting);
- every row fits its table's Arrow schema (what the Spark ingest converts them with), so that no
  decoded value can fail a batch.

Inputs come from four sources: the real samples' streams, TLS sessions carrying them with their key
logs, and the cases of issue 12 (the seed corpus, ``corpus()``), byte-level mutations of them
(``mutate``), a structure-aware generator for both type systems (``generated``): deep nesting,
huge declared counts, bad constructors and value letters, wrong section types, odd timestamps; and
one for the TLS record layer (``generated_tls``): records dropped, repeated, reordered, cut,
damaged, lying lengths and types, junk between them, malformed hellos, wrong or missing keys. ``tests/test_fuzz.py`` runs them for a bounded
time under Hypothesis; ``python -m tests.fuzz`` (``make fuzz``) for as long as asked.
"""

from __future__ import annotations

import json
import random
import struct
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from amqpscope.ingest.capture import CaptureDecoder, direction_payloads
from amqpscope.ingest.tls_keylog import KeyLog
from amqpscope.schemas.frames import CONNECTIONS_SCHEMA, FRAMES_SCHEMA, QUARANTINE_SCHEMA
from tests import amqp_bytes as b
from tests.paths import SAMPLES

# Inputs that once broke an invariant, kept as regression tests (``test_fuzz.py`` replays them).
CRASHES = Path(__file__).resolve().parent / "fuzz_crashes"
LINKTYPE_RAW = 101
CLIENT, SERVER = (bytes([127, 0, 0, 1]), 40000), (bytes([127, 0, 0, 2]), 5672)
_SCHEMAS = {"frames": FRAMES_SCHEMA, "connections": CONNECTIONS_SCHEMA, "quarantine": QUARANTINE_SCHEMA}


@dataclass(frozen=True)
class Case:
    """One input: the bytes of each direction of a connection and the TCP segment size."""

    c2s: bytes
    s2c: bytes = b""
    segment: int = 1460
    handshake: bool = True  # False: the capture starts mid-stream
    keylog: str = ""  # NSS key log lines TLS is decrypted with (throwaway test sessions' secrets)

    def to_json(self) -> str:
        return json.dumps(
            {
                "c2s": self.c2s.hex(),
                "s2c": self.s2c.hex(),
                "segment": self.segment,
                "handshake": self.handshake,
                "keylog": self.keylog,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Case:
        d = json.loads(text)
        return cls(bytes.fromhex(d["c2s"]), bytes.fromhex(d["s2c"]), d["segment"], d["handshake"], d.get("keylog", ""))


class InvariantBroken(AssertionError):
    """The decoder did something no input may make it do."""


# --- the target ---------------------------------------------------------------------------------


def _packet(src: tuple[bytes, int], dst: tuple[bytes, int], seq: int, flags: int, payload: bytes) -> bytes:
    """A raw IPv4 + TCP packet (no options, checksums left zero: the decoder does not check them)."""
    tcp = struct.pack(">HHIIHHHH", src[1], dst[1], seq % 2**32, 0, (5 << 12) | flags, 65535, 0, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 0, 0, 64, 6, 0, src[0], dst[0])
    return ip + tcp + payload


def packets(case: Case) -> list[bytes]:
    """The case as packets: handshake (unless mid-stream), then both directions' segments interleaved."""
    isn_c, isn_s = 1000, 5000
    out = []
    if case.handshake:
        out += [_packet(CLIENT, SERVER, isn_c, 0x02, b""), _packet(SERVER, CLIENT, isn_s, 0x12, b"")]
    size = max(1, case.segment)
    c2s = [case.c2s[i : i + size] for i in range(0, len(case.c2s), size)]
    s2c = [case.s2c[i : i + size] for i in range(0, len(case.s2c), size)]
    for i in range(max(len(c2s), len(s2c))):
        if i < len(c2s):
            out.append(_packet(CLIENT, SERVER, isn_c + 1 + i * size, 0x18, c2s[i]))
        if i < len(s2c):
            out.append(_packet(SERVER, CLIENT, isn_s + 1 + i * size, 0x18, s2c[i]))
    return out


def decode(case: Case) -> dict[str, list[dict[str, Any]]]:
    """Every row the per-packet decoder makes of the case, by table."""
    keys = KeyLog.from_lines(case.keylog.splitlines()) if case.keylog else None
    decoder = CaptureDecoder("fuzz", keys=keys)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for number, data in enumerate(packets(case), 1):
        for kind, row in decoder.packet(number, number * 1000, LINKTYPE_RAW, data, len(data)):
            out[kind].append(row)
    for kind, row in decoder.finish():
        out[kind].append(row)
    return out


@cache
def _arrow_schemas() -> dict[str, pa.Schema]:
    return {name: to_arrow_schema(schema) for name, schema in _SCHEMAS.items()}


def check(case: Case, out: dict[str, list[dict[str, Any]]]) -> None:
    """The invariants every decode must keep (raises ``InvariantBroken``)."""
    framed: dict[str, int] = defaultdict(int)
    quarantined: dict[str, int] = defaultdict(int)
    for f in out["frames"]:
        framed[f["direction"]] += f["frame_size"]
    for q in out["quarantine"]:
        quarantined[q["direction"]] += q["byte_count"]
    for c in out["connections"]:
        for d, sent in (("c2s", case.c2s), ("s2c", case.s2c)):
            if c[f"{d}_bytes"] != len(sent):
                raise InvariantBroken(f"{d}: {c[f'{d}_bytes']} payload bytes counted, {len(sent)} sent")
            tls = c.get(f"{d}_tls_bytes") or 0  # over TLS: its own bytes are the third part
            if c["protocol"] in ("amqp-0-9-1", "amqp-1.0", "tls") and framed[d] + quarantined[d] + tls != len(sent):
                raise InvariantBroken(
                    f"{d}: {framed[d]} framed + {quarantined[d]} quarantined + {tls} TLS != {len(sent)} bytes"
                )
    for kind, rows in out.items():
        if kind in _SCHEMAS and rows:
            try:
                pa.RecordBatch.from_pylist(rows, schema=_arrow_schemas()[kind])
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                raise InvariantBroken(f"a {kind} row does not fit its schema: {exc}") from None


def run(case: Case) -> dict[str, list[dict[str, Any]]]:
    """Decode and check one case: the fuzz target. Any exception is a finding."""
    out = decode(case)
    check(case, out)
    return out


# --- the seed corpus ----------------------------------------------------------------------------

# Issue 12's cases, as the bytes after the protocol header that the issue gives or describes.
ISSUE_CASES: dict[str, Case] = {
    "amqp10_header_section_not_a_list": Case(b.HEADER_10 + bytes.fromhex("0000001402000000005314c00302434300537043")),
    "amqp10_open_properties_list_key": Case(
        b.HEADER_10 + bytes.fromhex("0000001e02000000005310c0110aa101784040404040404040c103024540")
    ),
    "amqp10_descriptor_chain": Case(b.HEADER_10 + b.frame10(b"\x00" * 120_000 + b"\x40")),
}


def _seed_streams(limit: int = 6000) -> list[Case]:
    """The start of both directions of every connection of the bundled samples."""
    cases = []
    for path in sorted(p for p in SAMPLES.rglob("*") if p.suffix in (".pcap", ".pcapng")):
        payloads = direction_payloads(path)
        for (src, sport, dst, dport), chunks in sorted(payloads.items()):
            if dport != 5672:
                continue
            c2s = b"".join(chunks)[:limit]
            s2c = b"".join(payloads.get((dst, dport, src, sport), []))[:limit]
            cases.append(Case(c2s, s2c))
    return cases


@cache
def tls_seeds() -> tuple[Case, ...]:
    """Real TLS sessions (OpenSSL over memory BIOs, a throwaway CA) carrying the start of the samples'
    conversations, each with its key log: TLS 1.3, and TLS 1.2 with AES-GCM and ChaCha20-Poly1305."""
    import tempfile

    from testbed.tls import make_certificates, new_client_context, new_server_context
    from tests.tls_traffic import conversation, memory_session

    cases = []
    with tempfile.TemporaryDirectory(prefix="amqpscope-fuzz-tls-") as folder:
        certificates = make_certificates(Path(folder) / "ca")
        sessions = [
            ("1.3", None, "amqp091-qos-confirms.pcap"),
            ("1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", "amqp10-credit.pcap"),
            ("1.2", "ECDHE-ECDSA-CHACHA20-POLY1305", "amqp10-credit.pcap"),
        ]
        for index, (version, ciphers, sample) in enumerate(sessions):
            keylog = Path(folder) / f"{index}.keylog"
            session = memory_session(
                new_client_context(certificates.ca_certificate, keylog, version, ciphers),
                new_server_context(certificates),
                conversation(SAMPLES / sample, limit=40),
            )
            c2s = b"".join(data for d, data in session.transcript if d == "c2s")
            s2c = b"".join(data for d, data in session.transcript if d == "s2c")
            cases.append(Case(c2s, s2c, keylog=keylog.read_text()))
    return tuple(cases)


@cache
def corpus() -> tuple[Case, ...]:
    """Seeds: the real samples' streams (their first few kilobytes), TLS sessions carrying them, and the issue's cases."""
    return (*_seed_streams(), *tls_seeds(), *ISSUE_CASES.values())


# --- byte-level mutation --------------------------------------------------------------------------

_INTERESTING_OCTETS = (
    0x00,
    0x01,
    0x40,
    0x41,
    0x45,
    0x53,
    0x70,
    0x7F,
    0x80,
    0xA0,
    0xB0,
    0xC0,
    0xC1,
    0xCE,
    0xD0,
    0xE0,
    0xF0,
    0xFF,
    ord("A"),
    ord("F"),
    ord("T"),
)
_INTERESTING_WORDS = (0, 1, 7, 8, 0xFF, 0x100, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFF0, 0x7FFFFFFF, 0xFFFFFFFF)


def mutate(rng: random.Random, data: bytes, other: bytes = b"") -> bytes:
    """A few random edits of ``data``: bit flips, interesting octets and words, cuts, copies, splices."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        n = len(out)
        op = rng.randrange(8)
        at = rng.randrange(n) if n else 0
        if op == 0 and n:
            out[at] ^= 1 << rng.randrange(8)
        elif op == 1 and n:
            out[at] = rng.choice(_INTERESTING_OCTETS)
        elif op == 2 and n >= 4:
            at = rng.randrange(n - 3)
            out[at : at + 4] = struct.pack(">I", rng.choice(_INTERESTING_WORDS))
        elif op == 3 and n:
            del out[at : at + rng.randint(1, 64)]
        elif op == 4 and n:
            chunk = out[at : at + rng.randint(1, 256)]
            out[at:at] = chunk * rng.randint(1, 8)
        elif op == 5:
            out[at:at] = bytes(rng.choice(_INTERESTING_OCTETS) for _ in range(rng.randint(1, 32)))
        elif op == 6 and other:
            start = rng.randrange(len(other))
            out[at:at] = other[start : start + rng.randint(1, 512)]
        elif op == 7 and n:
            del out[at:]
    return bytes(out)


def _segment(rng: random.Random, size: int) -> int:
    """A TCP segment size for ``size`` bytes: tiny ones too, but not more than about 2000 packets
    (the per-packet cost is the decoder's, linear, and not what an input's second is for)."""
    return max(rng.choice((1, 7, 64, 536, 1460, 65495)), size // 2000)


def mutated(rng: random.Random) -> Case:
    seeds = corpus()
    seed, other = rng.choice(seeds), rng.choice(seeds)
    c2s, s2c = seed.c2s, seed.s2c
    which = rng.randrange(3)
    if which != 1:
        c2s = mutate(rng, c2s, other.c2s)
    if which != 0:
        s2c = mutate(rng, s2c, other.s2c)
    return Case(c2s, s2c, _segment(rng, len(c2s) + len(s2c)), rng.random() > 0.1, seed.keylog)


# --- structure-aware generation -----------------------------------------------------------------


def _value10(rng: random.Random, depth: int) -> bytes:
    """An AMQP 1.0 value, sometimes malformed: any constructor, nested lists / maps / arrays /
    described values (deep on purpose), sizes and counts that lie."""
    roll = rng.random()
    if depth <= 0 or roll < 0.35:
        return rng.choice(
            (
                b"\x40",
                b"\x41",
                b"\x42",
                b"\x43",
                b"\x44",
                b"\x45",
                b"\x56\x01",
                b"\x56\x02",
                b"\x50\x07",
                b"\x52\xff",
                b"\x53\x10",
                b"\x54\x80",
                b"\x55\x80",
                b"\x60\xff\xff",
                b"\x70\x7f\xff\xff\xff",
                b"\x71\x80\x00\x00\x00",
                b"\x72\x7f\x80\x00\x00",
                b"\x73\x00\x00\xd8\x00",
                b"\x73\x00\x11\x00\x00",
                b"\x74\x7f\x80\x00\x00",
                b"\x80" + bytes(8),
                b"\x81\x80" + bytes(7),
                b"\x82" + bytes(8),
                b"\x83\x00\x06\x0a\x00\x00\x00\x00\x00",
                b"\x83\x7f\xff\xff\xff\xff\xff\xff\xff",
                b"\x83\x80\x00\x00\x00\x00\x00\x00\x00",
                b"\x84\x7f\xff\xff\xff",
                b"\x94" + bytes(16),
                b"\x98" + bytes(16),
                b"\xa0\x03abc",
                b"\xa1\x02\xc3\x28",
                b"\xa1\x03abc",
                b"\xa3\x02\xff\xfe",
                b"\xa3\x04amqp",
                b"\xb0\x7f\xff\xff\xff",
                b"\xb1\x00\x00\x00\x01x",
                bytes([rng.randrange(256)]),
            )
        )
    if roll < 0.5:  # described: a descriptor (sometimes itself described) then a value
        descriptor = rng.choice((b"\x53" + bytes([rng.randrange(0x10, 0x78)]), b"\xa3\x04amqp", b"\x00"))
        return b"\x00" + descriptor + _value10(rng, depth - 1)
    count = rng.choice((0, 1, 2, 3, rng.randrange(8), 255))
    if roll < 0.8:  # list or map
        items = b"".join(_value10(rng, depth - 1) for _ in range(min(count, 8)))
        code, count = rng.choice(((0xC0, count), (0xC1, count - count % 2), (0xD0, count), (0xD1, count)))
    else:  # array: one constructor, elements without one (zero-width ones included)
        constructor = rng.choice((b"\x40", b"\x45", b"\x43", b"\x52", b"\xa1", b"\xe0", b"\x00\x53\x70\x45"))
        body = b"".join(_value10(rng, 0)[1:] for _ in range(min(count, 8)))
        items = constructor + body
        code = rng.choice((0xE0, 0xF0))
        count = rng.choice((count, 255, 65536, 0xFFFFFFFF))
    if rng.random() < 0.1:
        count = rng.choice((count + 1, 0xFFFFFFFF, 0x7FFFFFFF))
    if code in (0xC0, 0xC1, 0xE0):
        size = len(items) + 1
        if size > 255 or count > 255:
            code += 0x10
        else:
            return bytes([code, size if rng.random() > 0.05 else rng.randrange(256), count]) + items
    return bytes([code]) + struct.pack(">II", len(items) + 4, count & 0xFFFFFFFF) + items


def _nested10(rng: random.Random) -> bytes:
    """One value nested far past any limit: lists, maps, map keys, arrays, descriptors."""
    depth = rng.choice((99, 100, 101, 500, 3000))
    shape = rng.randrange(5)
    value = b"\x40"
    for _ in range(depth):
        if shape == 0:
            value = b"\xd0" + struct.pack(">II", len(value) + 4, 1) + value
        elif shape == 1:
            value = b"\xd1" + struct.pack(">II", len(value) + 5, 2) + value + b"\x40"
        elif shape == 2:
            value = b"\xd1" + struct.pack(">II", len(value) + 5, 2) + b"\x40" + value
        elif shape == 3:
            value = b"\x00\x53\x70" + value
        else:
            value = b"\x00" + value
    return value


def _amplifying_array(rng: random.Random) -> bytes:
    """Arrays of arrays of zero-width elements: a few bytes declaring millions of values."""
    inner = b"\x40"
    for _ in range(rng.randint(1, 3)):
        count = rng.choice((255, 65536))
        inner = b"\xf0" + struct.pack(">II", 4 + len(inner), count) + inner
    return inner


def _frame10(rng: random.Random) -> bytes:
    code = rng.choice((0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x41, 0x44, 0x70, 0x77, 0x99))
    fields = [_value10(rng, rng.randint(0, 6)) for _ in range(rng.randint(0, 12))]
    if rng.random() < 0.2:
        fields[rng.randrange(len(fields)) if fields else 0 : 0] = [rng.choice((_nested10, _amplifying_array))(rng)]
    body_list = b"".join(fields)
    if len(body_list) + 1 < 256 and len(fields) < 256:
        performative = b"\xc0" + bytes([len(body_list) + 1, len(fields)]) + body_list
    else:
        performative = b"\xd0" + struct.pack(">II", len(body_list) + 4, len(fields)) + body_list
    if rng.random() < 0.1:
        performative = _value10(rng, 3)  # not a list at all
    payload = b""
    if code == 0x14:  # transfer: message sections, in or out of order, of the right type or not
        sections = [
            bytes([0x00, 0x53, rng.randrange(0x70, 0x79)]) + _value10(rng, rng.randint(0, 4))
            for _ in range(rng.randint(0, 4))
        ]
        payload = b"".join(sections)
    frame_type = 1 if code in (0x41, 0x44) else 0
    return b.frame10(
        b"\x00\x53" + bytes([code]) + performative, channel=rng.randrange(3), frame_type=frame_type, payload=payload
    )


def _field_value091(rng: random.Random, depth: int) -> bytes:
    roll = rng.random()
    if depth <= 0 or roll < 0.5:
        return rng.choice(
            (
                b"t\x01",
                b"b\x80",
                b"B\xff",
                b"s\x80\x00",
                b"u\xff\xff",
                b"I\x80\x00\x00\x00",
                b"i\xff\xff\xff\xff",
                b"l" + bytes(8),
                b"f\x7f\x80\x00\x00",
                b"d\x7f\xf8" + bytes(6),
                b"D\xff\x7f\xff\xff\xff",
                b"S\x00\x00\x00\x02\xc3\x28",
                b"x\x00\x00\x00\x01z",
                b"T\xff\xff\xff\xff\xff\xff\xff\xff",
                b"T\x00\x06\x0a\x00\x00\x00\x00\x00",
                b"V",
                b"S\xff\xff\xff\xff",
                bytes([rng.randrange(256)]),
            )
        )
    items = b"".join(_field_value091(rng, depth - 1) for _ in range(rng.randint(0, 4)))
    if roll < 0.75:
        return b"A" + struct.pack(">I", len(items)) + items
    table = b"".join(b.shortstr(f"k{i}") + _field_value091(rng, depth - 1) for i in range(rng.randint(0, 4)))
    return b"F" + struct.pack(">I", len(table)) + table


def _frame091(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.4:  # queue.declare with arguments, possibly nested far too deep
        nested = _field_value091(rng, rng.randint(0, 8))
        if rng.random() < 0.3:
            nested = b"V"
            for _ in range(rng.choice((99, 100, 1000))):
                nested = b"A" + struct.pack(">I", len(nested)) + nested
        entry = b"\x01k" + nested
        args = struct.pack(">I", len(entry)) + entry
        body = struct.pack(">H", 0) + b.shortstr("q") + b"\x00" + args
        return b.method091(50, 10, body)
    if roll < 0.7:  # content header: flags and property values, odd timestamps among them
        flags = rng.choice((0x0040, 0x8000, 0x2000, 0x0001, 0xFFFE, rng.randrange(65536)))
        props = b""
        if flags == 0x0040:
            props = struct.pack(
                ">Q",
                rng.choice(
                    (
                        1_700_000_000,
                        1_700_000_000_000,
                        1_700_000_000_000_000,
                        1_700_000_000_000_000_000,
                        2**64 - 1,
                        2**63,
                    )
                ),
            )
        elif flags == 0x2000:
            props = struct.pack(">I", 0) + b"\x01h" + _field_value091(rng, 3)
            props = struct.pack(">I", len(props) - 4) + props[4:]
        else:
            props = bytes(rng.randrange(256) for _ in range(rng.randint(0, 24)))
        return b.content_header(rng.randrange(10), flags=flags, props=props)
    if roll < 0.85:
        return b.basic_ack(rng.choice((0, 1, 2**63, 2**64 - 1)), rng.random() < 0.5)
    return b.frame091(
        rng.randrange(256),
        rng.randrange(3),
        bytes(rng.randrange(256) for _ in range(rng.randint(0, 30))),
        end=rng.choice((0xCE, 0xCE, 0x00)),
    )


def generated(rng: random.Random) -> Case:
    """A connection of structure-aware frames of one protocol version."""
    if rng.random() < 0.5:
        c2s = b.HEADER_10 + b"".join(_frame10(rng) for _ in range(rng.randint(1, 6)))
        s2c = b.HEADER_10 + b"".join(_frame10(rng) for _ in range(rng.randint(0, 3)))
    else:
        c2s = b.HEADER_091 + b"".join(_frame091(rng) for _ in range(rng.randint(1, 6)))
        s2c = b"".join(_frame091(rng) for _ in range(rng.randint(0, 3)))
    return Case(c2s, s2c, _segment(rng, len(c2s) + len(s2c)))


# --- the TLS record layer -----------------------------------------------------------------------------


def _records(stream: bytes) -> list[bytes]:
    """A TLS stream cut on its record headers (the generator's own view; junk stays one piece)."""
    out, pos = [], 0
    while pos + 5 <= len(stream):
        end = pos + 5 + int.from_bytes(stream[pos + 3 : pos + 5], "big")
        out.append(stream[pos:end])
        pos = end
    if pos < len(stream):
        out.append(stream[pos:])
    return out


def _tls_record(rng: random.Random) -> bytes:
    """A record of any type and version, sometimes lying about its length; handshake ones hold hellos
    with random extension blocks."""
    content_type = rng.choice((20, 21, 22, 23, 24, 0, 25, 0xFF))
    body = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 5, 40, 300))))
    if content_type == 22 and rng.random() < 0.7:
        kind = rng.choice((1, 2, 8, 20, 24, 4))
        extensions = b"".join(
            struct.pack(">HH", rng.choice((0, 16, 43, 0xFFFF)), n)
            + bytes(rng.randrange(256) for _ in range(min(n, 40)))
            for n in (rng.choice((0, 2, 3, 40, 0xFFFF)) for _ in range(rng.randint(0, 3)))
        )
        hello = (
            struct.pack(">H", rng.choice((0x0303, 0x0301, 0xFFFF)))
            + bytes(32)
            + bytes([rng.choice((0, 32, 255))])
            + struct.pack(">H", rng.choice((0x1301, 0xC02B, 0xCCA8, 0xC013, 0)))
            + b"\x00"
            + struct.pack(">H", len(extensions) if rng.random() < 0.7 else rng.randrange(65536))
            + extensions
        )
        length = len(hello) if rng.random() < 0.8 else rng.choice((0, 1 << 20, 0xFFFFFF))
        body = bytes([kind]) + length.to_bytes(3, "big") + hello
    length = len(body) if rng.random() < 0.8 else rng.choice((0, 1, 0x4000, 0x4800, 0x4801, 0xFFFF))
    return bytes([content_type, 3, rng.choice((1, 3, 4, 9))]) + struct.pack(">H", length) + body


def _damage_records(rng: random.Random, records: list[bytes]) -> list[bytes]:
    records = list(records)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(records) + 1)
        op = rng.randrange(8)
        if op == 0 and records:
            del records[min(at, len(records) - 1)]  # a lost record
        elif op == 1 and records:
            records.insert(at, rng.choice(records))  # a replayed one
        elif op == 2 and len(records) > 1:
            i, j = rng.randrange(len(records)), rng.randrange(len(records))
            records[i], records[j] = records[j], records[i]
        elif op == 3 and records:
            i = min(at, len(records) - 1)
            body = bytearray(records[i])
            if len(body) > 5:
                body[rng.randrange(5, len(body))] ^= 1 << rng.randrange(8)  # fails its tag
            records[i] = bytes(body)
        elif op == 4 and records:
            i = min(at, len(records) - 1)
            records[i] = records[i][: rng.randrange(len(records[i]) + 1)]  # cut short
        elif op == 5:
            records.insert(at, bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))))  # junk between records
        elif op == 6:
            records.insert(at, _tls_record(rng))
        elif op == 7:
            records.insert(0, b"AMQP\x02\x01\x00\x00")  # AMQP 1.0's TLS header first
    return records


def _damage_keylog(rng: random.Random, keylog: str) -> str:
    lines = keylog.splitlines()
    roll = rng.random()
    if roll < 0.15:
        return ""  # no key log
    if roll < 0.3 and lines:
        lines.pop(rng.randrange(len(lines)))  # a secret missing
    elif roll < 0.45 and lines:
        i = rng.randrange(len(lines))
        parts = lines[i].split()
        if len(parts) == 3:
            parts[2] = f"{rng.getrandbits(4 * len(parts[2])):0{len(parts[2])}x}"  # a wrong secret
            lines[i] = " ".join(parts)
    elif roll < 0.5:
        lines.append(rng.choice(("CLIENT_RANDOM zz 00", "garbage", "CLIENT_RANDOM " + "00" * 32 + " 0")))
    return "\n".join(lines)


def generated_tls(rng: random.Random) -> Case:
    """A TLS session of the seed corpus with records damaged in either direction, or records made up."""
    seed = rng.choice(tls_seeds())
    if rng.random() < 0.15:
        c2s = b"".join(_tls_record(rng) for _ in range(rng.randint(1, 8)))
        s2c = b"".join(_tls_record(rng) for _ in range(rng.randint(0, 8)))
        return Case(c2s, s2c, _segment(rng, len(c2s) + len(s2c)), rng.random() > 0.1, seed.keylog)
    c2s, s2c = _records(seed.c2s), _records(seed.s2c)
    if rng.random() < 0.7:
        c2s = _damage_records(rng, c2s)
    if rng.random() < 0.7:
        s2c = _damage_records(rng, s2c)
    joined_c2s, joined_s2c = b"".join(c2s), b"".join(s2c)
    return Case(
        joined_c2s,
        joined_s2c,
        _segment(rng, len(joined_c2s) + len(joined_s2c)),
        rng.random() > 0.1,
        _damage_keylog(rng, seed.keylog),
    )


GENERATORS: dict[str, Callable[[random.Random], Case]] = {
    "mutated": mutated,
    "generated": generated,
    "tls": generated_tls,
}
