"""The event kinds: events.yml loaded into validated, frozen events (``pipelines.events`` applies them).

An event is a frame worth listing although nobody broke the spec (docs/FLOW_CONTROL.md section 6): its kind
is data, as a rule of rules.yml is, a Spark SQL condition on a frames row with the expressions that
fill the event's ``condition`` and ``text`` columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amqpscope.expectations.findings import EVENT, ID, INFO, Finding, check_keys, finding, load_catalogue

EVENTS_PATH = Path(__file__).with_name("events.yml")
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
        if not isinstance(self.id, str) or not ID.fullmatch(self.id):
            raise ValueError(f"{self.source}: event {self.id!r}: id must be dotted lower-case words")
        for name in ("description", "when"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{self.source}: event {self.id!r}: {name} must be a non-empty string")
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{self.source}: event {self.id!r}: {name} must be an expression when given")

    @property
    def finding(self) -> Finding:
        """The event kind in the one catalogue: an event is always ``info``."""
        return finding(self.id, EVENT, INFO, self.description)


def _event(entry: Any, source: str) -> EventKind:
    check_keys(entry, source, "event", _REQUIRED, _OPTIONAL)
    return EventKind(**{k: entry[k] for k in (*_REQUIRED, *_OPTIONAL) if k in entry}, source=source)


def load_events(path: Path = EVENTS_PATH) -> tuple[EventKind, ...]:
    """The event kinds of ``path`` (default: events.yml), in file order; ids must be unique."""
    return load_catalogue(path, "events", "event", _event)
