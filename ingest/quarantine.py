"""The one builder of what went wrong with a capture: its quarantine rows and its ``captures.status``.

Every path that reads captures builds them here: the whole-file decode (``ingest.capture``: tests'
reference, and the Spark data source), the parallel ingest's read tasks and its captures table
(``jobs.stages.decode``), and the landing job's unreadable files (``jobs.stages.landing``). A row's reason is an id
of ``ingest.reasons.REASONS``, a sentence, and the details in columns (``QUARANTINE_SCHEMA``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from amqpscope.ingest.framing import Unframed
from amqpscope.ingest.pcap import Damage
from amqpscope.ingest.reasons import CAPTURE_UNREADABLE

Row = dict[str, Any]

# ``captures.status``, defined here only (``expectations.finding_catalogue`` lists them): a file read
# whole; the prefix of one read past damage (the rest was read), and of one not read at all.
STATUS_OK: Final = "ok"
DAMAGED: Final = "damaged: "
FAILED: Final = "failed: "
_FILE_DAMAGED: Final = "capture file damaged: "
_UNREADABLE: Final = "capture unreadable: "


def quarantine_row(
    capture_id: str,
    connection_id: str | None,
    direction: str | None,
    stream_offset: int | None,
    byte_count: int,
    packet_number: int | None,
    reason: str,
    reason_id: str,
    missing: bool = False,
    error_offset: int | None = None,
    error_length: int | None = None,
    expected: str | None = None,
    found: str | None = None,
) -> Row:
    """One quarantine row: where the bytes are, how many, and why (id, sentence, details)."""
    return {
        "capture_id": capture_id,
        "connection_id": connection_id,
        "direction": direction,
        "stream_offset": stream_offset,
        "byte_count": byte_count,
        "packet_number": packet_number,
        "missing": missing,
        "reason": reason,
        "reason_id": reason_id,
        "error_offset": error_offset,
        "error_length": error_length,
        "expected": expected,
        "found": found,
    }


def unframed_row(capture_id: str, connection_id: str, direction: str, item: Unframed) -> Row:
    """The quarantine row of bytes the frame splitter could not frame."""
    return quarantine_row(
        capture_id,
        connection_id,
        direction,
        item.offset,
        item.size,
        item.packet_number,
        f"unframeable bytes: {item.reason}",
        item.reason_id,
        False,
        item.error_offset,
        item.error_length,
        item.expected,
        item.found,
    )


def damage_row(capture_id: str, damage: Damage, part: str = "") -> Row:
    """The quarantine row of bytes of a capture file that were read past (``ingest.pcap.scan``):
    ``stream_offset`` and ``error_offset`` are file offsets; ``part`` names the file of a rotation."""
    return quarantine_row(
        capture_id,
        None,
        None,
        damage.offset,
        damage.size,
        None,
        f"{_FILE_DAMAGED}{part}{damage.place}: {damage.reason}",
        damage.reason_id,
        False,
        damage.offset,
        None,
        damage.expected,
        damage.found,
    )


def capture_status(damage_rows: Sequence[Row]) -> str:
    """``captures.status`` of a capture read past the damage of ``damage_rows`` (``damage_row``'s, in
    file order): ``ok``, else the first place, and with more than one how many and how many bytes."""
    if not damage_rows:
        return STATUS_OK
    status = DAMAGED + str(damage_rows[0]["reason"]).removeprefix(_FILE_DAMAGED)
    if len(damage_rows) > 1:
        skipped = sum(int(row["byte_count"]) for row in damage_rows)
        status += f" (and {len(damage_rows) - 1} more places: {skipped} bytes skipped in all)"
    return status


def unreadable_rows(capture_id: str, file_name: str, file_size: int, reason: str) -> dict[str, Row]:
    """By table, the ``captures`` row (status ``failed: ``) and the ``quarantine`` row (every byte) of a
    file that is no readable capture at all."""
    capture = {
        "capture_id": capture_id,
        "file_name": file_name,
        "file_size": file_size,
        "parts": [{"file_name": file_name, "file_size": file_size, "content_hash": capture_id}],
        "packets": 0,
        "first_ts": None,
        "last_ts": None,
        "link_types": None,
        "status": FAILED + reason,
    }
    quarantine = quarantine_row(capture_id, None, None, 0, file_size, None, _UNREADABLE + reason, CAPTURE_UNREADABLE)
    return {"captures": capture, "quarantine": quarantine}
