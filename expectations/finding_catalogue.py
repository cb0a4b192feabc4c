"""Every finding amqpscope can report, as one catalogue of :class:`~amqpscope.expectations.findings.Finding`.

The rules of rules.yml, the event kinds of events.yml, the bottleneck rules of bottlenecks.yml, the
quarantine reasons of ``ingest.reasons`` (the TLS ones among them) and the capture statuses of
``ingest.quarantine``, each with its id, layer, group and severity on the one scale. Ids are unique
across them all.
"""

from __future__ import annotations

from amqpscope.expectations.bottleneck_rules import load_bottleneck_rules
from amqpscope.expectations.catalogue import load_rules
from amqpscope.expectations.event_catalogue import load_events
from amqpscope.expectations.findings import CAPTURE_STATUS, QUARANTINE, Finding, finding
from amqpscope.ingest.quarantine import DAMAGED, FAILED, STATUS_OK
from amqpscope.ingest.reasons import REASONS

# ``captures.status``: its id here, its own value (the status, or its prefix) and what it means.
CAPTURE_STATUSES = (
    ("capture.status.ok", STATUS_OK, "the whole capture file was read"),
    ("capture.status.damaged", DAMAGED, "part of the file could not be read (the rest was): the first place and why"),
    ("capture.status.failed", FAILED, "none of the file could be read (not a capture): why"),
)


def capture_status_findings() -> tuple[Finding, ...]:
    return tuple(finding(i, CAPTURE_STATUS, value.rstrip(": "), text) for i, value, text in CAPTURE_STATUSES)


def reason_findings() -> tuple[Finding, ...]:
    """The quarantine reasons: the severity of each is its layer's."""
    return tuple(finding(i, QUARANTINE, i.split(".")[0], text) for i, text in REASONS.items())


def every_finding() -> tuple[Finding, ...]:
    """The one catalogue, rules first, then events, bottleneck rules, reasons and statuses; ids unique."""
    found = (
        *(r.finding for r in load_rules()),
        *(e.finding for e in load_events()),
        *(r.finding for r in load_bottleneck_rules()),
        *reason_findings(),
        *capture_status_findings(),
    )
    ids = [f.id for f in found]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ValueError(f"finding ids given to two findings: {', '.join(twice)}")
    return found
