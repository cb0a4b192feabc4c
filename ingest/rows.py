"""Decoded frames to rows of the frames table (``schemas.frames.FRAMES_SCHEMA``).

A frame's arguments, named as in the specs, go to the typed column of the same snake_cased
name when the schema has one; every other argument is kept as text in the ``arguments`` map.
An AMQP 1.0 transfer that completes a delivery also carries its message (``ingest.messages``):
section sizes, body kind and the properties' values, typed where the schema has a column, the
other section fields in ``arguments`` under ``section.field`` keys. Message bodies are never kept.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

from amqpscope.ingest.amqp091_values import PosixTime
from amqpscope.ingest.amqp10_types import Described, Timestamp
from amqpscope.ingest.limits import MAX_DEPTH
from amqpscope.schemas.frames import (
    FRAME_KEY_FIELDS,
    FRAME_KIND_FIELDS,
    FRAME_TLS_FIELDS,
    FRAMES_COLUMNS,
    FRAMES_SCHEMA,
)

# Columns a frame argument never fills: the frame's own identity (connection.close's class-id is
# an argument, the frame's class_id is not) and the map of the others.
_RESERVED: Final = frozenset(f.name for f in FRAME_KEY_FIELDS + FRAME_KIND_FIELDS + FRAME_TLS_FIELDS) | {"arguments"}
TYPED_COLUMNS: Final = frozenset(FRAMES_COLUMNS) - _RESERVED
# Spec argument names whose column is named differently (to keep one meaning per column).
_RENAMED: Final = {
    ("amqp-1.0", "delivery-tag"): "delivery_tag_bytes",
    ("amqp-1.0", "code"): "sasl_code",
    ("amqp-0-9-1", "body-size"): "body_size",
}
# 1.0 fields whose values are described composites: the typed columns take one member each.
_NESTED: Final = {
    "source": (("address", "source_address"),),
    "target": (("address", "target_address"),),
    "error": (("condition", "error_condition"), ("description", "error_description")),
}
# 1.0 message section fields with a typed column (messaging 3.2.1, 3.2.4); "to" is an address.
_SECTION_COLUMNS: Final = {
    ("header", "priority"): "priority",
    **{
        ("properties", name): name.replace("-", "_")
        for name in ("message-id", "subject", "reply-to", "correlation-id", "content-type", "content-encoding")
    },
    ("properties", "to"): "to_address",
}
# The same by section: the fields of a section name -> their columns.
_SECTION_COLUMNS_BY_NAME: Final[dict[str, dict[str, str]]] = {"header": {}, "properties": {}}
for (_section, _field), _name in _SECTION_COLUMNS.items():
    _SECTION_COLUMNS_BY_NAME[_section][_field] = _name
# Sections kept whole as text in ``arguments`` (maps of annotations and application properties).
_MAP_SECTIONS: Final = frozenset({"delivery-annotations", "message-annotations", "application-properties", "footer"})
_INT64_MIN, _INT64_END = -(1 << 63), 1 << 63  # a long column's range
# What each typed column can hold, from its Spark type: a value of another kind or beyond the range
# (a field of the wrong type on the wire, a ulong above 2^63-1) is kept as text in ``arguments``
# instead, so that no decoded value can fail the Arrow conversion of its batch.
_KINDS: Final[dict[str, tuple[type, int, int]]] = {
    f.name: {
        "string": (str, 0, 0),
        "boolean": (bool, 0, 0),
        "binary": (bytes, 0, 0),
        "bigint": (int, _INT64_MIN, _INT64_END),
        "int": (int, -(1 << 31), 1 << 31),
    }.get(f.dataType.simpleString(), (type(None), 0, 0))
    for f in FRAMES_SCHEMA.fields
}


def text(value: Any) -> str | None:
    """A faithful, compact text rendering of any decoded value."""
    if value is None:
        return None
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Timestamp):
        moment = value.datetime
        return moment.isoformat(timespec="milliseconds") if moment is not None else value.described()
    if isinstance(value, PosixTime):
        return value.described()
    if isinstance(value, (int, float, Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError):
        # Map keys JSON has no form for (1.0 lists, described values, binaries as keys): rendered
        # as text first, the rest as before.
        return _ENCODER.encode(_plain_keys(value, 0))


def _plain_keys(value: Any, depth: int) -> Any:
    """``value`` with every map key JSON cannot take rendered by ``text``; as deep as the decoders allow."""
    if depth > 2 * MAX_DEPTH:  # decoded values nest at most MAX_DEPTH; a described one adds a level
        raise ValueError(f"value nested deeper than {2 * MAX_DEPTH} levels")
    if isinstance(value, dict):
        return {
            (k if k is None or isinstance(k, (str, int, float)) else text(k)): _plain_keys(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_plain_keys(v, depth + 1) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, (Timestamp, PosixTime)):
        return text(value)
    if isinstance(value, Described):  # left as it was decoded only where it is a map key
        return {"descriptor": value.descriptor, "value": value.value}
    return str(value)


# ``json.dumps`` with these options builds a new encoder every call: one, made once, does the same.
_ENCODER: Final = json.JSONEncoder(default=_json_default, separators=(",", ":"), sort_keys=False)


def _column(protocol: str, name: str) -> str | None:
    column = _RENAMED.get((protocol, name)) or name.replace("-", "_")
    return column if column in TYPED_COLUMNS else None


# Argument name -> typed column (or None), per protocol: filled as names are met.
_COLUMNS: Final[dict[str, dict[str, str | None]]] = {}


def frame_row(protocol: str, decoded: dict[str, Any], key: dict[str, Any]) -> dict[str, Any]:
    """One frames-table row from a decoded frame and its key columns (``key`` becomes the row)."""
    row = key
    row["protocol"] = protocol
    row["frame_type"] = decoded["frame_type"]
    row["channel"] = decoded.get("channel")
    row["method"] = decoded.get("method")
    row["class_id"] = decoded.get("class_id")
    row["method_id"] = decoded.get("method_id")
    return add_arguments(row, protocol, decoded)


def add_arguments(row: dict[str, Any], protocol: str, decoded: dict[str, Any]) -> dict[str, Any]:
    """The rest of ``frame_row``: a row holding the key and frame kind columns gets the frame's arguments."""
    try:
        columns = _COLUMNS[protocol]
    except KeyError:
        columns = _COLUMNS[protocol] = {}
    extra: dict[str, str | None] = {}
    for name, value in decoded["arguments"].items():
        try:
            column = columns[name]
        except KeyError:
            column = columns[name] = _column(protocol, name)
        # The common cases inline (this runs for every argument of every frame), the rest in _argument.
        kind = type(value)
        if column is None:
            if kind is int or kind is str:
                extra[name] = str(value)  # as ``text`` renders them
            elif kind is bool:
                extra[name] = "true" if value else "false"
            elif value is None:
                extra[name] = None
            else:
                _argument(row, extra, name, None, value)
        elif value is None:
            row[column] = None
        else:
            fits, low, end = _KINDS[column]
            if kind is fits and (kind is not int or low <= value < end):
                row[column] = value
            else:
                _argument(row, extra, name, column, value)
    # Only 1.0 transfers have these ("in" before reading: a cheaper test than a call to get).
    if "payload" in decoded and decoded["payload"] is not None:
        row["payload_size"] = len(decoded["payload"])
    if "message" in decoded and decoded["message"] is not None:
        _message_columns(row, extra, decoded["message"])
    row["arguments"] = extra
    return row


def _argument(row: dict[str, Any], extra: dict[str, str | None], name: str, column: str | None, value: Any) -> None:
    """An argument value of a kind ``add_arguments`` does not place inline: composites, big ints, symbols."""
    kind = type(value)
    if column is None or kind is dict or kind is list:
        nested = _NESTED.get(name)
        if nested is not None and kind is dict:
            for member, nested_column in nested:
                row[nested_column] = text(value.get(member))
        elif column is not None and kind is dict and "$type" in value and _KINDS[column][0] is str:
            # A delivery state or outcome: the column holds its name (accepted, rejected ...).
            row[column] = value["$type"]
        extra[name] = text(value)
    elif isinstance(value, str) and _KINDS[column][0] is str:
        row[column] = str(value)  # a symbol
    else:
        # A value its column cannot hold: a 1.0 ulong (max-message-size) above 2^63-1, or a field
        # of another type than the spec's (a malformed or hostile peer).
        extra[name] = text(value)


def _message_columns(row: dict[str, Any], extra: dict[str, str | None], message: dict[str, Any]) -> None:
    """A completed 1.0 delivery's message: sizes, body kind, property values."""
    row["message_size"] = message["size"]
    row["delivery_frames"] = message["frames"]
    if message["error"] is not None:
        extra["message-error"] = message["error"]
    if message["sections"] is None:
        return
    sizes: dict[str, int] = {}
    for section in message["sections"]:
        sizes[section.name] = sizes.get(section.name, 0) + section.size
        if section.name in _MAP_SECTIONS:
            extra[section.name] = text(section.value)
        elif section.name in _SECTION_COLUMNS_BY_NAME:
            columns = _SECTION_COLUMNS_BY_NAME[section.name]
            for name, value in section.value.items():
                column = columns.get(name)
                if column == "priority" and not (value is None or (type(value) is int and 0 <= value < 256)):
                    column = None  # a priority that is no ubyte: kept as text
                if column is not None:
                    row[column] = value if column == "priority" or value is None else text(value)
                elif value is not None:
                    extra[f"{section.name}.{name}"] = text(value)
        elif row.get("body_kind") is None:
            row["body_kind"] = section.name
    row["section_sizes"] = sizes
