"""Decoded frames to rows of the frames table (``schemas.frames.FRAMES_SCHEMA``).

A frame's arguments, named as in the specs, go to the typed column of the same snake_cased
name when the schema has one; every other argument is kept as text in the ``arguments`` map.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from amqpscope.schemas.frames import FRAMES_COLUMNS

_TYPED = frozenset(FRAMES_COLUMNS)
# Spec argument names whose column is named differently (to keep one meaning per column).
_RENAMED = {
    ("amqp-1.0", "delivery-tag"): "delivery_tag_bytes",
    ("amqp-1.0", "code"): "sasl_code",
    ("amqp-0-9-1", "body-size"): "body_size",
}
# 1.0 fields whose values are described composites: the typed columns take one member each.
_NESTED = {
    "source": (("address", "source_address"),),
    "target": (("address", "target_address"),),
    "error": (("condition", "error_condition"), ("description", "error_description")),
}
# Arguments that are not useful as text (they are counted, not stored: message bodies).
_DROPPED = frozenset({"payload"})


def text(value: Any) -> str | None:
    """A faithful, compact text rendering of any decoded value."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return json.dumps(value, default=_json_default, separators=(",", ":"), sort_keys=False)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def _overflows(value: Any) -> bool:
    # 1.0 ulong fields (max-message-size) can exceed a signed 64-bit column: keep those as text.
    return isinstance(value, int) and not isinstance(value, bool) and not -(1 << 63) <= value < (1 << 63)


def _typed_value(column: str, value: Any) -> Any:
    if isinstance(value, dict) and "$type" in value:
        # A delivery state or outcome: the column holds its name (accepted, rejected ...).
        return value["$type"]
    if isinstance(value, str):
        return str(value)  # symbols are a str subclass
    return value


def frame_row(protocol: str, decoded: dict[str, Any], key: dict[str, Any]) -> dict[str, Any]:
    """One frames-table row from a decoded frame and its key columns."""
    row: dict[str, Any] = dict(key)
    row["protocol"] = protocol
    row["frame_type"] = decoded["frame_type"]
    row["channel"] = decoded.get("channel")
    row["method"] = decoded.get("method")
    row["class_id"] = decoded.get("class_id")
    row["method_id"] = decoded.get("method_id")
    extra: dict[str, str | None] = {}
    for name, value in decoded["arguments"].items():
        nested = _NESTED.get(name)
        if nested is not None and isinstance(value, dict):
            for member, column in nested:
                row[column] = text(value.get(member))
            extra[name] = text(value)
            continue
        column = _RENAMED.get((protocol, name)) or name.replace("-", "_")
        if column in _TYPED and column not in row and not _overflows(value):
            row[column] = _typed_value(column, value)
        elif name not in _DROPPED:
            extra[name] = text(value)
    if "payload" in decoded:
        row["payload_size"] = len(decoded["payload"])
    row["arguments"] = extra
    return row
