"""Every table of the lake with its description and column comments, read from ``schemas/``.

The schema modules explain their tables and columns in comments: the comment lines above a
``*_SCHEMA = StructType(...)`` describe the table (else, in a module of one table, the module's
docstring does: in a module of several it would describe them all alike), a comment
at the end of a ``StructField(...)`` line (or on the lines just above it) describes the column.
This module reads those comments once, so they stay the one place to write them: the lake puts
them into each Delta table's schema (StructField metadata ``comment``) and description, and
``python -m amqpscope.schemas.catalog`` writes docs/TABLES.md.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from dataclasses import dataclass
from functools import cache
from types import ModuleType

from pyspark.sql.types import StructField, StructType

from amqpscope.schemas import (
    diagnosis,
    events,
    flow,
    frames,
    lifecycle,
    messages,
    quality,
    queues,
    report,
    runs,
    tcp,
    verdicts,
)

# The modules whose ``<TABLE>_SCHEMA`` constants are lake tables, in the order of docs/TABLES.md.
TABLE_MODULES: tuple[ModuleType, ...] = (
    frames,
    tcp,
    messages,
    flow,
    lifecycle,
    events,
    verdicts,
    diagnosis,
    queues,
    quality,
    report,
    runs,
)
_FIELD_LINE = re.compile(r'StructField\(\s*"(\w+)"')
# Key columns many tables share, where their own module says nothing more.
COMMON_COLUMNS = {
    "capture_id": "the capture: content hash of its first file (every table's partition column)",
    "connection_id": "the TCP connection carrying AMQP, within the capture",
    "frame_index": "the frame's order within its connection, both directions",
    "ts": "capture time of the packet that completed the frame",
    "channel": "0-9-1 channel / 1.0 session's channel number",
    "direction": "c2s client to server, s2c server to client",
    "method": "0-9-1 class.method or 1.0 performative",
}
_TRAILING_COMMENT = re.compile(r"#\s?(.*)$")


@dataclass(frozen=True)
class Table:
    name: str
    schema: StructType  # with every documented column's comment in its metadata
    description: str
    module: str


def _comment_lines(lines: list[str], end: int) -> list[str]:
    """The run of comment-only lines ending just above line index ``end``."""
    found = []
    index = end - 1
    while index >= 0 and lines[index].strip().startswith("#"):
        found.insert(0, lines[index].strip().lstrip("#").strip())
        index -= 1
    return found


def _field_comments(lines: list[str], first: int, last: int) -> dict[str, str]:
    """Column name -> comment, for the StructField lines between line indexes first and last."""
    comments: dict[str, str] = {}
    for index in range(first, last + 1):
        line = lines[index]
        found = _FIELD_LINE.search(line)
        if not found:
            continue
        code, _, trailing = line.partition("  #")
        text = trailing.strip() if trailing else " ".join(_comment_lines(lines, index))
        if text and found.group(1) not in comments:
            comments[found.group(1)] = text
    return comments


@cache
def _module_tables(module: ModuleType) -> tuple[Table, ...]:
    source = inspect.getsource(module)
    lines = source.splitlines()
    tree = ast.parse(source)
    spans = {  # module-level constants and their line spans (0-based, inclusive)
        node.targets[0].id: (node.lineno - 1, node.end_lineno - 1)
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    }
    docstring = (ast.get_docstring(tree) or "").split("\n\n")[0].replace("\n", " ")
    constants = [c for c in spans if c.endswith("_SCHEMA") and isinstance(getattr(module, c), StructType)]
    if len(constants) > 1:
        docstring = ""
    tables = []
    for constant in constants:
        first, last = spans[constant]
        schema = getattr(module, constant)
        comments = _field_comments(lines, first, last)
        # Fields listed in other constants (FRAME_KEY_FIELDS + ...): their comments are there.
        node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == constant)
        for name in sorted({n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)} & spans.keys()):
            for column, text in _field_comments(lines, *spans[name]).items():
                comments.setdefault(column, text)
        for column, text in COMMON_COLUMNS.items():
            comments.setdefault(column, text)
        description = " ".join(_comment_lines(lines, first)) or docstring
        tables.append(
            Table(
                constant.removesuffix("_SCHEMA").lower(),
                with_comments(schema, comments),
                description,
                module.__name__.rsplit(".", 1)[-1],
            )
        )
    return tuple(tables)


def with_comments(schema: StructType, comments: dict[str, str]) -> StructType:
    """``schema`` with ``comments`` in its top-level fields' metadata (other metadata kept)."""
    return StructType(
        [
            StructField(
                f.name,
                f.dataType,
                f.nullable,
                {**(f.metadata or {}), "comment": comments[f.name]} if f.name in comments else f.metadata,
            )
            for f in schema.fields
        ]
    )


@cache
def tables() -> dict[str, Table]:
    """Every lake table by name."""
    return {t.name: t for module in TABLE_MODULES for t in _module_tables(module)}


def documented(table: str, schema: StructType) -> StructType:
    """``schema`` (rows about to be written to ``table``) with the declared columns' comments."""
    known = tables().get(table)
    if known is None:
        return schema
    comments = {f.name: f.metadata["comment"] for f in known.schema.fields if f.metadata.get("comment")}
    return with_comments(schema, comments)


def description(table: str) -> str | None:
    known = tables().get(table)
    return known.description if known is not None else None


def markdown() -> str:
    """docs/TABLES.md: one section per table, each column with its type and meaning."""
    out = [
        "# Tables of the lake",
        "",
        "Generated from `schemas/` by `python -m amqpscope.schemas.catalog > docs/TABLES.md` (a test checks",
        "it is current). Every table is partitioned by `capture_id`; the comments below are also in each",
        "Delta table's schema (column metadata `comment`) and description.",
        "",
    ]
    for table in tables().values():
        out += [
            f"## `{table.name}`",
            "",
            table.description or "(no description)",
            "",
            f"Declared in `schemas/{table.module}.py`.",
            "",
            "| column | type | meaning |",
            "|---|---|---|",
        ]
        for f in table.schema.fields:
            meaning = (f.metadata or {}).get("comment", "").replace("|", "\\|")
            out.append(f"| `{f.name}` | `{f.dataType.simpleString()}` | {meaning} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(markdown())
