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

ROOT = Path(__file__).resolve().parent.parent
REASONS_MODULE = ROOT / "ingest" / "reasons.py"
# Where an id may be written out: the catalogue itself (and, for the other kinds of finding, their own).
CATALOGUES = {REASONS_MODULE, ROOT / "expectations" / "finding_catalogue.py"}
# The product's code (setup.cfg's packages).
PRODUCT = [ROOT / name for name in ("package", "ingest", "schemas", "pipelines", "expectations", "jobs", "conf")]
SAMPLE = ROOT / "samples" / "amqp091-qos-confirms.pcap"
_ID = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")
# The layers reason ids are named by (ingest/reasons.py's docstring) but for those a literal of other
# meaning shares (``amqp10.`` rule ids, ``connection.`` 0-9-1 methods): a literal ``capture.x``,
# ``tcp.x``, ... outside the catalogue is a reason id written out, as is any literal id of ``REASONS``.
_REASON_LAYERS = {"capture", "tcp", "tls", "framing", "limit", "decoder"}
DETAIL_COLUMNS = ("reason_id", "error_offset", "error_length", "expected", "found")


def _names() -> dict[str, str]:
    """The reason constants of ingest/reasons.py (``TCP_GAP: Final = "tcp.gap"``): name -> id."""
    names = {}
    for node in ast.parse(REASONS_MODULE.read_text()).body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(node.value, ast.Constant)
        ):
            if isinstance(node.value.value, str) and _ID.fullmatch(node.value.value):
                names[node.target.id] = node.value.value
    return names


def _product_files() -> list[Path]:
    return [p for folder in PRODUCT for p in folder.rglob("*.py") if "node_modules" not in p.parts]


def _bare_ids() -> list[str]:
    """Every string literal of the product, outside the catalogue, that is a reason id or looks like
    one (dotted, lower-case, of a reason layer): where a constant of ingest/reasons.py belongs."""
    found = []
    for path in _product_files():
        if path in CATALOGUES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _ID.fullmatch(node.value):
                if node.value in REASONS or node.value.split(".")[0] in _REASON_LAYERS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return found


def _used_names() -> set[str]:
    """The names the product's modules other than ingest/reasons.py use (``TCP_GAP``, ``reasons.TCP_GAP``)."""
    used: set[str] = set()
    for path in _product_files():
        if path == REASONS_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
    return used


def test_every_reason_has_one_name_and_the_code_gives_names_never_bare_ids():
    names = _names()
    assert sorted(names.values()) == sorted(REASONS), "a constant without a sentence, or a sentence without one"
    assert len(set(names.values())) == len(names), "an id named twice"
    assert _bare_ids() == [], "reason ids written as literals: use the constants of ingest/reasons.py"


def test_every_reason_in_the_catalogue_is_given():
    assert sorted(set(_names()) - _used_names()) == [], "catalogue entries no code gives"


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
