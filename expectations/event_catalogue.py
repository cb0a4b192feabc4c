"""The event kinds: events.yml loaded into validated, frozen events (``pipelines.events`` applies them).

An event is a frame worth listing although nobody broke the spec (docs/FLOW_CONTROL.md section 6): its kind
is data, as a rule of rules.yml is, a Spark SQL condition on a frames row with the expressions that
fill the event's ``condition`` and ``text`` columns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

EVENTS_PATH = Path(__file__).with_name("events.yml")
# Dotted, lower-case and stable, as rule ids: the events table and the report refer to events by it.
_EVENT_ID = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")
_REQUIRED = ("id", "description", "when")
_OPTIONAL = ("condition", "text")


@dataclass(frozen=True)
class EventKind:
    """A frame of the frames table is this event when ``when`` is true on it."""

    id: str
    description: str
    when: str  # Spark SQL boolean expression over a frames row (and ``attached_before``)
    condition: str | None = None  # Spark SQL expression for the event's condition column
    text: str | None = None  # Spark SQL expression for its text column
    source: str = field(default="<inline>", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _EVENT_ID.fullmatch(self.id):
            raise ValueError(f"{self.source}: event {self.id!r}: id must be dotted lower-case words")
        for name in ("description", "when"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{self.source}: event {self.id!r}: {name} must be a non-empty string")
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{self.source}: event {self.id!r}: {name} must be an expression when given")


def _event(entry: Any, source: str) -> EventKind:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{source}: every event must be a mapping, got {entry!r}")
    missing = [k for k in _REQUIRED if k not in entry]
    unknown = sorted(set(entry) - {*_REQUIRED, *_OPTIONAL})
    if missing or unknown:
        problems = [f"missing {', '.join(missing)}"] if missing else []
        problems += [f"unknown keys {', '.join(map(str, unknown))}"] if unknown else []
        raise ValueError(f"{source}: event {entry.get('id', '<no id>')!r}: {'; '.join(problems)}")
    return EventKind(**{k: entry[k] for k in (*_REQUIRED, *_OPTIONAL) if k in entry}, source=source)


def load_events(path: Path = EVENTS_PATH) -> tuple[EventKind, ...]:
    """The event kinds of ``path`` (default: events.yml), in file order; ids must be unique."""
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(document, Mapping) or not isinstance(document.get("events"), list):
        raise ValueError(f"{path}: expected a top-level 'events' list")
    events = tuple(_event(entry, str(path)) for entry in document["events"])
    ids = [e.id for e in events]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise ValueError(f"{path}: event ids defined twice: {', '.join(duplicated)}")
    return events
