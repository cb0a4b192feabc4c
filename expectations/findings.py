"""One record for every way amqpscope says something is wrong, one severity scale, one YAML loader.

Wireshark's expert info is the model: every item has a dotted id, a layer (the id's first part:
``amqp10``, ``tcp``, ``diagnosis``, ...), a group (what kind of finding it is, and which table holds
it) and a severity on one scale. Five kinds of finding are expressed as a :class:`Finding`
(``expectations.finding_catalogue`` lists them all):

- the data-quality rules of rules.yml (group ``violation``: the violations table),
- the event kinds of events.yml (``event``: the events table),
- the bottleneck rules of bottlenecks.yml (``bottleneck`` or ``problem``, their kind: the bottlenecks table),
- the quarantine reasons of ``ingest.reasons``, the TLS ones with them (``quarantine``: the quarantine table),
- the capture statuses of ``ingest.quarantine`` (``capture_status``: ``captures.status``).

The scale is ``error`` > ``warning`` > ``info``. The tables keep the severities they have always
held (a violation's ``error`` / ``warning`` / ``capture``, a bottleneck finding's ``warning`` /
``info``): :data:`ON_THE_SCALE` maps each kind's own values onto the one scale, and only the
catalogue reads it.

The three YAML catalogues are read by :func:`load_catalogue`: the document's list, each entry a
mapping with its kind's keys and no other, ids unique. Each kind's own fields (a rule's predicate, a
bottleneck rule's component) stay on its own record, which gives its :class:`Finding` as ``finding``.

Pure Python and yaml: no Spark.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import yaml

# The one scale, most severe first.
ERROR: Final = "error"  # something broke a MUST, or bytes that could not be read as what they claim to be
WARNING: Final = "warning"  # a SHOULD, a heuristic, a risk, or what costs throughput or messages
INFO: Final = "info"  # worth knowing, costs little
SEVERITIES: Final = (ERROR, WARNING, INFO)

# The groups: what kind of finding, and where it is stored.
VIOLATION: Final = "violation"  # rules.yml: the violations table
EVENT: Final = "event"  # events.yml: the events table
BOTTLENECK: Final = "bottleneck"  # bottlenecks.yml, kind bottleneck: the bottlenecks table
PROBLEM: Final = "problem"  # bottlenecks.yml, kind problem: the bottlenecks table
QUARANTINE: Final = "quarantine"  # ingest.reasons: the quarantine table
CAPTURE_STATUS: Final = "capture_status"  # ingest.quarantine: captures.status
GROUPS: Final = (VIOLATION, EVENT, BOTTLENECK, PROBLEM, QUARANTINE, CAPTURE_STATUS)

# Each group's own severities (the values its table holds) on the one scale.
ON_THE_SCALE: Final[Mapping[str, Mapping[str, str]]] = {
    VIOLATION: {"error": ERROR, "warning": WARNING, "capture": WARNING},  # capture: the capture is inconsistent
    EVENT: {"info": INFO},
    BOTTLENECK: {"warning": WARNING, "info": INFO},
    PROBLEM: {"warning": WARNING, "info": INFO},
    # A quarantine row holds no severity: its layer gives it. Malformed AMQP and our own defects are
    # errors; damaged captures, lost bytes, undecryptable TLS and the decoders' limits warnings; a
    # connection that is not AMQP (or encrypted with no key log asked for) is not wrong at all.
    QUARANTINE: {
        "capture": WARNING,
        "tcp": WARNING,
        "connection": INFO,
        "tls": WARNING,
        "framing": WARNING,
        "amqp091": ERROR,
        "amqp10": ERROR,
        "limit": WARNING,
        "decoder": ERROR,
    },
    CAPTURE_STATUS: {"ok": INFO, "damaged": WARNING, "failed": ERROR},
}

# Dotted, lower-case and stable: tables, reports and Data Docs refer to every finding by it.
ID: Final = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")


@dataclass(frozen=True)
class Finding:
    """One kind of finding: a rule, an event, a bottleneck rule, a quarantine reason or a capture status."""

    id: str
    layer: str  # the id's first part
    severity: str  # SEVERITIES
    group: str  # GROUPS
    summary: str  # what it means, for people

    def __post_init__(self) -> None:
        if not ID.fullmatch(self.id) or self.id.split(".")[0] != self.layer:
            raise ValueError(f"finding {self.id!r}: the id must be dotted lower-case words, its layer the first")
        if self.severity not in SEVERITIES:
            raise ValueError(
                f"finding {self.id!r}: unknown severity {self.severity!r} (one of {', '.join(SEVERITIES)})"
            )
        if self.group not in GROUPS:
            raise ValueError(f"finding {self.id!r}: unknown group {self.group!r} (one of {', '.join(GROUPS)})")
        if not self.summary.strip():
            raise ValueError(f"finding {self.id!r}: the summary must say something")


def finding(id: str, group: str, own_severity: str, summary: str) -> Finding:
    """The Finding of an item of ``group`` whose own severity (as its table holds it, or for a
    quarantine reason its layer) is ``own_severity``."""
    return Finding(id, id.split(".")[0], ON_THE_SCALE[group][own_severity], group, " ".join(summary.split()))


def rank(severity: str) -> int:
    """A severity's place on the scale: 0 for ``error``, most severe first."""
    return SEVERITIES.index(severity)


def check_keys(entry: Any, source: str, noun: str, required: Collection[str], optional: Collection[str]) -> str:
    """``entry`` (one YAML catalogue entry) checked for a mapping with every ``required`` key and no key
    outside ``required`` and ``optional``: where it is, for messages (``<file>: rule 'x.y'``)."""
    if not isinstance(entry, Mapping):
        raise ValueError(f"{source}: every {noun} must be a mapping, got {entry!r}")
    where = f"{source}: {noun} {entry.get('id', '<no id>')!r}"
    missing = [k for k in required if k not in entry]
    unknown = sorted(map(str, set(entry) - {*required, *optional}))
    if missing or unknown:
        problems = [f"missing {', '.join(missing)}"] if missing else []
        problems += [f"unknown keys {', '.join(unknown)}"] if unknown else []
        raise ValueError(f"{where}: {'; '.join(problems)}")
    return where


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=_Identified)


def load_catalogue(path: Path, key: str, noun: str, build: Callable[[Any, str], Item]) -> tuple[Item, ...]:
    """The items of the YAML catalogue ``path``: its top-level ``key`` list, each entry made by
    ``build(entry, source)`` (which checks it), in file order; ids must be unique."""
    document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(document, Mapping) or not isinstance(document.get(key), list):
        raise ValueError(f"{path}: expected a top-level {key!r} list")
    items: list[Item] = []
    for entry in document[key]:
        item = build(entry, str(path))
        if any(i.id == item.id for i in items):
            raise ValueError(f"{path}: {noun} {item.id!r}: duplicate id")
        items.append(item)
    return tuple(items)
