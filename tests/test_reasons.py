"""Quarantine reasons as stable ids with their details in columns, and one builder of a capture's
status and damage rows for every path (the one-pass decode, the data source and the Spark ingest)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from amqpscope.ingest import amqp091
from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.framing import FrameSplitter
from amqpscope.ingest.reasons import REASONS
from amqpscope.jobs.stages.decode import decode_tables, resolve_captures
from amqpscope.schemas.bronze import BRONZE_SCHEMAS
from tests.fuzzing import Case, run
from tests.test_rotation import rotate_like_tcpdump_c

INGEST = Path(__file__).resolve().parent.parent / "ingest"
JOBS = INGEST.parent / "jobs"
SAMPLE = Path(__file__).resolve().parent.parent / "samples" / "amqp091-qos-confirms.pcap"
_ID = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")
# The layers ids are named by (ingest/reasons.py's docstring): a constant of another name is no id.
_LAYERS = {"capture", "tcp", "connection", "tls", "framing", "amqp091", "amqp10", "limit", "decoder"}
DETAIL_COLUMNS = ("reason_id", "error_offset", "error_length", "expected", "found")


def _given_ids() -> set[str]:
    """Every reason id the ingest code gives: ``reason_id=...`` (an argument or an assignment), a
    ``Reason``'s first argument, a constant (``NO_KEY = "tls.no_key"``), a ``DecodeError``'s or ``FrameError``'s third, a ``Damage``'s
    fifth, ..., or an id paired with its sentence (``("connection.tls", "not decoded: TLS handshake")``)."""
    positions = {
        "Reason": 0,
        "DecodeError": 2,
        "FrameError": 2,
        "Damage": 4,
        "_skip_damage": 6,
        "quarantine_row": 7,
        "Unframed": 4,
    }
    found: set[str] = set()
    for path in [*INGEST.glob("*.py"), *JOBS.glob("*.py")]:
        if path.name == "reasons.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "reason_id" for t in node.targets):
                if isinstance(node.value, ast.Constant):
                    found.add(node.value.value)
            if isinstance(node, ast.Assign) and all(str(getattr(t, "id", "")).isupper() for t in node.targets):
                value = node.value.value if isinstance(node.value, ast.Constant) else None
                if isinstance(value, str) and _ID.fullmatch(value) and value.split(".")[0] in _LAYERS:
                    found.add(value)  # an id named once as a constant (NO_KEY = "tls.no_key")
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                values = [k.value for k in node.keywords if k.arg == "reason_id"]
                if name in positions and len(node.args) > positions[name]:
                    values.append(node.args[positions[name]])
                found |= {v.value for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[0], ast.Constant):
                reason_id, sentence = node.elts[0].value, node.elts[1]
                words = sentence.value if isinstance(sentence, ast.Constant) else ast.unparse(sentence)
                if isinstance(reason_id, str) and _ID.fullmatch(reason_id) and " " in str(words):
                    found.add(reason_id)
    return found


def test_every_reason_the_decoders_give_is_in_the_catalogue_and_every_one_is_given():
    given = _given_ids()
    assert given - set(REASONS) == set(), "reason ids without a catalogue entry (ingest/reasons.py)"
    assert set(REASONS) - given == set(), "catalogue entries no code gives"


def test_the_quarantine_schema_declares_the_details():
    names = BRONZE_SCHEMAS["quarantine"].fieldNames()
    assert names[-len(DETAIL_COLUMNS) :] == list(DETAIL_COLUMNS)  # added at the end: older lakes widen
    assert {"reason", "stream_offset", "byte_count"} <= set(names)


def test_bytes_that_cannot_start_a_frame_give_the_type_octet_found():
    stream = amqp091.PROTOCOL_HEADER + b"\xff" * 40
    [row] = run(Case(stream))["quarantine"]
    assert row["reason"] == "unframeable bytes: unknown 0-9-1 frame type 255"
    assert (row["reason_id"], row["found"], row["expected"]) == ("amqp091.frame.unknown_type", "255", "1, 2, 3, 8")
    assert (row["stream_offset"], row["byte_count"], row["error_offset"]) == (8, 40, 8)


def test_a_bad_frame_end_names_the_octet_and_where_it_is():
    heartbeat = bytes([8, 0, 0, 0, 0, 0, 0])  # type, channel 0, size 0, then the frame-end octet
    [unframed] = FrameSplitter(amqp091.Amqp091Format(), start_offset=100).feed(heartbeat + b"\x00", 1, 0)
    assert (unframed.reason_id, unframed.expected, unframed.found) == ("amqp091.frame.bad_frame_end", "0xce", "0x00")
    assert (unframed.offset, unframed.error_offset, unframed.error_length) == (100, 107, 8)


def test_an_undecodable_frame_gives_the_byte_and_the_sizes():
    # connection.start (10.10) whose arguments stop short: version octets, then a table claiming 1000 bytes.
    body = (10).to_bytes(2, "big") + (10).to_bytes(2, "big") + b"\x00\x09" + (1000).to_bytes(4, "big") + b"ab"
    frame = bytes([1, 0, 0]) + len(body).to_bytes(4, "big") + body + b"\xce"
    [row] = run(Case(amqp091.PROTOCOL_HEADER, frame))["quarantine"]
    assert row["reason_id"] == "amqp091.value.overruns_frame"
    assert (row["stream_offset"], row["byte_count"]) == (0, len(frame))
    assert (row["error_offset"], row["error_length"]) == (13, 1000)  # the table's size field, 7 + 4 + 2 in
    assert row["reason"] == "undecodable amqp-0-9-1 frame: field table of 1000 bytes overruns the frame (byte 13)"


def test_a_tls_handshake_on_the_amqp_port_is_tls_bytes_not_a_quarantine_reason():
    hello = b"\x16\x03\x01\x00\x50" + b"\x01" * 80
    out = run(Case(hello, b"\x16\x03\x03\x00\x10" + b"\x02" * 16))
    (connection,) = out["connections"]
    assert out["quarantine"] == []  # handshake records are TLS's own bytes (ingest.tls_stream)
    assert (connection["protocol"], connection["tls_status"]) == ("tls", "handshake")
    assert (connection["c2s_tls_bytes"], connection["s2c_tls_bytes"]) == (len(hello), 21)


def damaged_copy(capture: Path, out: Path, cuts: list[int]) -> tuple[Path, list[tuple[int, int]]]:
    """``capture`` with a record of impossible captured length put before its first record at or past
    each of ``cuts`` (file offsets): the damaged file, and each bogus record's (file offset, size)."""
    data = capture.read_bytes()
    boundaries, pos = [], 24
    while pos < len(data):
        boundaries.append(pos)
        pos += 16 + int.from_bytes(data[pos + 8 : pos + 12], "little")
    pieces, bogus, last, added = [], [], 0, 0
    for cut in cuts:
        at = next(b for b in boundaries if b >= cut)
        record = data[at : at + 8] + (0x7FFFFFF0).to_bytes(4, "little") * 2 + b"\xa5" * 40
        pieces += [data[last:at], record]
        bogus.append((at + added, len(record)))
        added += len(record)
        last = at
    out.write_bytes(b"".join(pieces) + data[last:])
    return out, bogus


def test_every_path_gives_a_damaged_capture_the_same_status_and_damage_rows(spark, tmp_path):
    """Two places of damage: the one-pass decode (tests' reference, the data source) and the Spark
    ingest build the captures row's status and the quarantine rows alike, by one builder."""
    size = SAMPLE.stat().st_size
    damaged, bogus = damaged_copy(SAMPLE, tmp_path / "twice.pcap", [size // 3, 2 * size // 3])
    reference = defaultdict(list)
    for kind, row in decode_capture(damaged, "x"):
        reference[kind].append(row)
    tables, persisted = decode_tables(spark, resolve_captures([damaged]), (5672,), range_bytes=16_384)
    try:
        [capture] = tables["captures"].collect()
        first = reference["quarantine"][-2]["reason"].removeprefix("capture file damaged: ")
        assert (
            capture.status
            == reference["captures"][0]["status"]
            == (f"damaged: {first} (and 1 more places: {sum(n for _, n in bogus)} bytes skipped in all)")
        )
        want = [{**r, "capture_id": capture.capture_id} for r in reference["quarantine"] if r["connection_id"] is None]
        got = [
            r.asDict() for r in tables["quarantine"].filter("connection_id IS NULL").orderBy("stream_offset").collect()
        ]
        assert got == want
        assert [(r["stream_offset"], r["byte_count"], r["reason_id"], r["found"]) for r in got] == [
            (at, n, "capture.record_length_impossible", str(0x7FFFFFF0)) for at, n in bogus
        ]
    finally:
        for df in persisted:
            df.unpersist()


def test_a_rotations_status_names_its_first_damage_in_file_order(spark, tmp_path):
    """Damage in the middle of the first part and near the start of the second: the status names
    the first part's, though the second part's is at the smaller file offset."""
    (tmp_path / "clean").mkdir()
    (tmp_path / "run").mkdir()
    parts = rotate_like_tcpdump_c(SAMPLE, tmp_path / "clean", 60_000)
    first, [(at1, n1)] = damaged_copy(parts[0], tmp_path / "run" / parts[0].name, [parts[0].stat().st_size // 2])
    second, [(at2, n2)] = damaged_copy(parts[1], tmp_path / "run" / parts[1].name, [2_000])
    assert at2 < at1
    [capture_file] = resolve_captures([first, second])
    assert len(capture_file.parts) == 2
    tables, persisted = decode_tables(spark, [capture_file], (5672,), range_bytes=16_384)
    try:
        [capture] = tables["captures"].collect()
        assert capture.status == (
            f"damaged: {first.name}: record at byte {at1}: impossible captured length {0x7FFFFFF0}; {n1} bytes skipped "
            f"to the next record (and 1 more places: {n1 + n2} bytes skipped in all)"
        )
        damage = tables["quarantine"].filter("connection_id IS NULL").collect()
        assert sorted((r.reason.split(": ")[1], r.stream_offset, r.byte_count, r.reason_id) for r in damage) == [
            (first.name, at1, n1, "capture.record_length_impossible"),
            (second.name, at2, n2, "capture.record_length_impossible"),
        ]
    finally:
        for df in persisted:
            df.unpersist()
