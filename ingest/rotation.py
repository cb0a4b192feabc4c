"""Rotated capture files: the consecutive parts of one tcpdump run, put back together on evidence.

``tcpdump -C`` (rotate by size), ``-G`` (rotate by time) and ``-W`` (a ring of files) write one
capture as several files: ``cap.pcap``, ``cap.pcap1``, ``cap.pcap2`` for ``-C``; a strftime
pattern such as ``cap-%H%M%S.pcap`` for ``-G``; ``cap.pcap0``, ``cap.pcap1`` ... with ``-W``
(tcpdump(8), options -C, -G, -W). Wireshark's ``editcap -c`` / ``-i`` splits into
``out_00000_20261121221900.pcap`` and so on. A TCP connection runs on from one part into the next,
so the parts decode as one capture: one capture id, packet numbers running on across the parts,
every connection reassembled across them.

A name is no evidence: ``cap0.pcap`` ... ``cap3.pcap`` copied from four days, or a user's
``test1.pcap`` and ``test2.pcap``, have names that differ only in digits too. Files whose names
match (one directory, equal once every run of digits is read as one placeholder and a trailing run
is dropped, so ``cap.pcap`` goes with ``cap.pcap1``) are put in time order, and each one is joined
to the one before it only when the bytes say it continues it (``Boundary``):

- the same container format, link types, snapshot lengths and time resolution: one tcpdump run
  writes every part with the header of the first;
- it starts where the one before ends: not before its last packet, and within ``MAX_GAP_US``;
- where traffic continues (a TCP connection still open at the end of the earlier part), a TCP
  connection runs on across the boundary: its next segment, at the start of the later part, takes
  its sequence numbers up where the earlier part left them (or repeats bytes before that: a
  retransmission, a keep-alive), not after bytes no file holds;
- where no connection was open, nothing can run across, and only a gap within ``MAX_QUIET_GAP_US``
  joins them (decoding such parts apart loses no connection either).

Every decision has its reason in words (``Grouping.explain``): ``analyze`` and ``ingest`` print
which files were grouped and why, and which were not.

A capture's id is its first part's content hash, so a capture that grows by a new part keeps its
id; each part's own hash is kept in the ``captures`` table to tell a grown capture from a known one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from amqpscope.ingest.packets import LINK_TYPE_NAMES, TCP_FIN, TCP_RST, TCP_SYN, parse_tcp
from amqpscope.ingest.pcap import CaptureError, Container, Damage, capture_id, find_boundary, read_container, scan

_DIGITS = re.compile(r"\d+")
# How far into a part its first packets, and before its end its last ones, are read.
_EDGE_BYTES = 1 << 20
# The longest pause between two parts of one run while a connection runs across: an idle AMQP
# connection still sends a heartbeat every half of its timeout (RabbitMQ's default timeout is
# 60 s: 0-9-1 connection.tune, 1.0 idle-time-out), so a live connection is silent for ~30 s at most.
MAX_GAP_US = 60_000_000
# The longest pause between two parts when no connection was open at the boundary: a name and a
# layout are all the evidence then, so only a pause that traffic itself could make joins them.
MAX_QUIET_GAP_US = 1_000_000
_SEQ_MOD = 1 << 32
# A later part's first segment of a connection may repeat bytes sent before the boundary
# (retransmissions, keep-alives one byte back), not by more than this.
_RESENT_BYTES = 1 << 24

Flow = tuple[str, int, str, int]  # one direction of a TCP connection: source, port, destination, port


class FlowStart(NamedTuple):
    """The first segment of one direction of a connection in a part."""

    flow: Flow
    seq: int
    syn: bool  # a new connection, not one that runs on


class FlowEnd(NamedTuple):
    """One direction of a connection still open at the end of a part: where its bytes stop."""

    flow: Flow
    next_seq: int  # the sequence number its next segment takes


@dataclass(frozen=True)
class CapturePart:
    """One file of a capture: where it is, its content hash, its layout, the times of its first and
    last packets and the TCP connections at its two ends."""

    path: str
    content_hash: str
    size: int
    first_ts_us: int | None  # None: the file holds no packet
    last_ts_us: int | None
    # Container format, link types, snapshot lengths and time resolution: equal across parts.
    layout: tuple[str, tuple[int, ...], tuple[int, ...], int]
    head: tuple[FlowStart, ...] = field(default=(), compare=False)
    tail: tuple[FlowEnd, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        return Path(self.path).name


@dataclass(frozen=True)
class Boundary:
    """Two files of one name pattern, the second the next in time: whether they are one capture, and why."""

    earlier: CapturePart
    later: CapturePart
    joined: bool
    why: str


@dataclass(frozen=True)
class Grouping:
    """Captures as tuples of parts in time order, and the decision at every boundary of files whose
    names match."""

    captures: list[tuple[CapturePart, ...]]
    boundaries: tuple[Boundary, ...] = ()

    def explain(self) -> list[str]:
        """In words: each group of files taken as one capture, with why; each pair of files whose names
        match that were not, with why not."""
        lines = []
        for parts in self.captures:
            if len(parts) > 1:
                lines.append(
                    f"{', '.join(p.name for p in parts)}: one capture, the rotated parts of one capture run "
                    f"({_describe_layout(parts[0].layout)}; --no-group-rotated keeps them apart)"
                )
                lines += [f"  {b.why}" for b in self.boundaries if b.joined and b.earlier in parts]
        lines += [
            f"{b.earlier.name} and {b.later.name}: separate captures: {b.why}" for b in self.boundaries if not b.joined
        ]
        return lines


def rotation_key(path: str | Path) -> tuple[str, str]:
    """Directory and name with digit runs as ``#`` and a trailing run dropped: equal for the parts of a rotation."""
    p = Path(path)
    return str(p.parent), _DIGITS.sub("#", p.name).removesuffix("#")


def describe_part(path: str | Path, content_hash: str | None = None) -> CapturePart:
    """Read the container header, and the first and last packets of one capture file."""
    path = Path(path).resolve()
    container = read_container(path)
    size = path.stat().st_size
    first, last, head, tail = _edges(path, container, size)
    return CapturePart(str(path), content_hash or capture_id(path), size, first, last, _layout(container), head, tail)


def _layout(c: Container) -> tuple[str, tuple[int, ...], tuple[int, ...], int]:
    if c.kind == "pcap":
        return c.kind, (c.linktype,), (c.snaplen,), 1_000_000_000 if c.nano else 1_000_000
    ticks = {t for _, t in c.interfaces}
    return c.kind, tuple(lt for lt, _ in c.interfaces), c.snaplens, ticks.pop() if len(ticks) == 1 else 0


def _edges(
    path: Path, c: Container, size: int
) -> tuple[int | None, int | None, tuple[FlowStart, ...], tuple[FlowEnd, ...]]:
    """First and last packet times, the first segment of each flow in the head of the file and
    the flows still open in its tail."""
    first = last = None
    head: dict[Flow, FlowStart] = {}
    ends: dict[Flow, int | None] = {}  # next sequence number; None: ended (FIN, RST)
    damage: list[Damage] = []  # read past, as the decode reads past it
    try:
        head_end = min(size, c.data_start + _EDGE_BYTES)
        for _offset, ts_us, linktype, data, wirelen in scan(path, c, c.data_start, head_end, damage):
            first = ts_us if first is None else first
            seg = parse_tcp(linktype, data, wirelen)
            if seg is not None and seg[:4] not in head:
                head[seg[:4]] = FlowStart(seg[:4], seg.seq, bool(seg.flags & TCP_SYN))
        if first is None:
            return None, None, (), ()
        tail = find_boundary(path, c, max(c.data_start, size - _EDGE_BYTES), size)
        for _offset, ts_us, linktype, data, wirelen in scan(path, c, tail, size, damage):
            last = ts_us
            seg = parse_tcp(linktype, data, wirelen)
            if seg is None:
                continue
            flow, flags = seg[:4], seg.flags
            if flags & TCP_RST:
                ends[flow] = ends[(seg.dst, seg.dport, seg.src, seg.sport)] = None
            elif flags & TCP_FIN:
                ends[flow] = None
            elif flags & TCP_SYN:  # a connection (re)starting: its data begins after the SYN's number
                ends[flow] = (seg.seq + 1) % _SEQ_MOD
            elif ends.get(flow, -1) is not None:  # open, or not seen yet; a retransmission does not move it back
                after = (seg.seq + len(seg.payload) + seg.missing) % _SEQ_MOD
                known = ends.get(flow)
                if known is None or (after - known) % _SEQ_MOD < _SEQ_MOD // 2:
                    ends[flow] = after
    except CaptureError:
        pass  # no record boundary near the end: the times and flows read so far stand
    tail_open = tuple(FlowEnd(flow, seq) for flow, seq in ends.items() if seq is not None)
    return first, last if last is not None else first, tuple(head.values()), tail_open


def group_parts(parts: Iterable[CapturePart], group_rotated: bool = True) -> Grouping:
    """Captures as tuples of parts in time order: files whose names match are joined where the
    evidence says they continue one another (``Boundary``); every other file (or every file, when
    not ``group_rotated``) is a capture alone."""
    if not group_rotated:
        return Grouping(sorted(((part,) for part in parts), key=lambda c: c[0].path))
    by_key: dict[tuple[str, str], list[CapturePart]] = {}
    for part in parts:
        by_key.setdefault(rotation_key(part.path), []).append(part)
    captures: list[tuple[CapturePart, ...]] = []
    boundaries: list[Boundary] = []
    for candidates in by_key.values():
        ordered = sorted(candidates, key=_time_order)
        run = [ordered[0]]
        for earlier, later in zip(ordered, ordered[1:]):
            boundary = _boundary(earlier, later)
            boundaries.append(boundary)
            if not boundary.joined:
                captures.append(tuple(run))
                run = []
            run.append(later)
        captures.append(tuple(run))
    return Grouping(sorted(captures, key=lambda c: c[0].path), tuple(boundaries))


def _time_order(part: CapturePart) -> tuple[int, str]:
    return (part.first_ts_us if part.first_ts_us is not None else -1, part.path)


def _seconds(us: int) -> str:
    return f"{us / 1e6:.6f} s"


def _describe_layout(layout: tuple[str, tuple[int, ...], tuple[int, ...], int]) -> str:
    kind, linktypes, snaplens, ticks = layout
    names = ", ".join(LINK_TYPE_NAMES.get(t, str(t)) for t in linktypes)
    return f"{kind}, link type {names}, snaplen {', '.join(map(str, snaplens))}, timestamps 1/{ticks} s"


def _flow_text(flow: Flow) -> str:
    return f"TCP {flow[0]}:{flow[1]} > {flow[2]}:{flow[3]}"


def _boundary(a: CapturePart, b: CapturePart) -> Boundary:
    """Whether ``b``, next in time, continues ``a``, with the evidence either way."""

    def verdict(joined: bool, why: str) -> Boundary:
        return Boundary(a, b, joined, why)

    if a.first_ts_us is None or b.first_ts_us is None or a.last_ts_us is None:
        return verdict(False, f"{(a if a.first_ts_us is None else b).name} holds no packet")
    if a.layout != b.layout:
        return verdict(False, f"{a.name} is {_describe_layout(a.layout)}; {b.name} is {_describe_layout(b.layout)}")
    gap = b.first_ts_us - a.last_ts_us
    if gap < 0:
        return verdict(False, f"{b.name} starts {_seconds(-gap)} before {a.name} ends")
    if not a.tail:
        if gap > MAX_QUIET_GAP_US:
            return verdict(
                False,
                f"no connection was open at the end of {a.name} and {b.name} starts "
                f"{_seconds(gap)} after it (more than {_seconds(MAX_QUIET_GAP_US)})",
            )
        return verdict(
            True, f"{b.name} follows {a.name}: {_seconds(gap)} after its last packet, no connection open between them"
        )
    starts = {s.flow: s for s in b.head}
    running = [
        end
        for end in a.tail
        if end.flow in starts
        and not starts[end.flow].syn
        and (end.next_seq - starts[end.flow].seq) % _SEQ_MOD < _RESENT_BYTES
    ]
    if not running:
        jumps = [
            f"{_flow_text(end.flow)} skips {(starts[end.flow].seq - end.next_seq) % _SEQ_MOD} bytes"
            for end in a.tail
            if end.flow in starts and not starts[end.flow].syn
        ]
        return verdict(
            False,
            f"{len(a.tail)} TCP flow(s) open at the end of {a.name}, none runs on into {b.name}"
            + (f" ({'; '.join(jumps[:3])})" if jumps else ""),
        )
    if gap > MAX_GAP_US:
        return verdict(False, f"{b.name} starts {_seconds(gap)} after {a.name} ends (more than {_seconds(MAX_GAP_US)})")
    more = f" (and {len(running) - 1} more TCP flows)" if len(running) > 1 else ""
    return verdict(
        True,
        f"{b.name} follows {a.name}: {_seconds(gap)} after its last packet, "
        f"{_flow_text(running[0].flow)} runs on{more}",
    )


def resolve_parts(paths: Sequence[str | Path], group_rotated: bool = True) -> Grouping:
    """Check every file's container before any work starts; files with the same bytes count once
    (the first in name order stands for them); rotated parts are grouped unless told not to."""
    seen: dict[str, CapturePart] = {}
    for raw in sorted(Path(p).resolve() for p in paths):
        if not raw.is_file():  # jobs.stages.preflight says more (a directory: which command takes one)
            raise CaptureError(raw, "argument", "not a regular file" if raw.exists() else "no such capture file")
        part = describe_part(raw)
        seen.setdefault(part.content_hash, part)
    return group_parts(seen.values(), group_rotated)
