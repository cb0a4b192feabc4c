"""Failures of the lake that a user must be told about in one line: which table, which version,
which other run. Light on imports, so the command line can tell them apart before Spark is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence

# A C0 or C1 control character, or DEL: shown escaped, never written raw to a terminal or a log.
_CONTROL = frozenset([*range(0x20), *range(0x7F, 0xA0)])


def printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\x00``, ``\\n``): one line, safe to print."""
    if not any(ord(c) in _CONTROL for c in text):
        return text
    return "".join(c.encode("unicode_escape").decode("ascii") if ord(c) in _CONTROL else c for c in text)


def short_ids(capture_ids: Sequence[str]) -> str:
    """Capture ids (SHA-256 hex) as people read them: their first 12 characters."""
    return ", ".join(cid[:12] for cid in capture_ids)


class LakeError(RuntimeError):
    """A failure of the lake itself (not of the input), named by its table."""

    def __init__(self, table: str, message: str) -> None:
        self.table = table
        self.lake_table = table  # as name_table marks any other exception
        self.detail = printable(message)  # the message without the table
        super().__init__(f"table {table}: {self.detail}")


class DamagedLog(LakeError):
    """A commit file of a table's Delta log that is empty or does not parse: never taken as a commit
    of nothing, as a Delta reader would."""

    def __init__(self, table: str, version: int, path: str, reason: str) -> None:
        self.version = version
        self.path = path
        super().__init__(table, f"Delta log damaged: commit {version} ({path}) {reason}")


class WriteConflict(LakeError):
    """Another writer replaced rows of the same captures after this write read the table
    (optimistic concurrency: the first commit wins)."""

    def __init__(
        self, table: str, capture_ids: Sequence[str], read_version: int | None, version: int | None, other: str
    ) -> None:
        """``read_version``: the version this write read, negative when there was no table yet, None
        when unknown here (delta-spark's transactions read their own); ``version``: the winning
        commit's, None when not known."""
        self.capture_ids = tuple(capture_ids)
        self.version = version
        self.other = other
        won = f"{other} (version {version})" if version is not None else other
        read = (
            "after this run read the table"
            if read_version is None
            else "after this run read no table yet"
            if read_version < 0
            else f"after this run read version {read_version}"
        )
        super().__init__(table, f"capture {short_ids(capture_ids)} was written by {won} {read}; not written twice")


class CaptureBusy(LakeError):
    """Captures held by another live run (its lease in the runs table has not expired)."""

    def __init__(self, table: str, holders: Sequence[tuple[str, str]]) -> None:
        self.capture_ids = tuple(cid for cid, _ in holders)
        held = "; ".join(f"capture {cid[:12]} is being written by {who}" for cid, who in holders)
        super().__init__(table, held)


class StoredRowsMismatch(LakeError):
    """The lake's rows of a capture differ in number from what the run committed."""

    def __init__(self, table: str, capture_id: str, stored: int, written: int) -> None:
        self.capture_id = capture_id
        super().__init__(
            table,
            f"capture {capture_id[:12]} has {stored:,} rows in the lake, but this run "
            f"wrote {written:,}: the lake does not hold what was decoded",
        )


def name_table(exc: BaseException, table: str) -> None:
    """Mark ``exc`` as raised while writing ``table`` (the innermost write names it), so that the
    stage it ends names the table; the exception keeps its type."""
    if getattr(exc, "lake_table", None) is None:
        try:
            exc.lake_table = table  # type: ignore[attr-defined]
        except AttributeError:  # an exception type with __slots__: the stage's own table stands
            pass


def table_of(exc: BaseException) -> str | None:
    """The table whose write raised ``exc`` (``name_table``), if known."""
    table = getattr(exc, "lake_table", None)
    return table if isinstance(table, str) else None
