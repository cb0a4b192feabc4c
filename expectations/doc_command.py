"""The command line of the generated docs (``python -m amqpscope.expectations.rules_doc``, and the
testbed's ``python -m testbed.diagnosis_doc``): one optional argument, where to write the page."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path


def write_doc(argv: Sequence[str] | None, module: str, description: str, default: Path, text: Callable[[], str]) -> int:
    """Parse ``argv`` (``--help`` answers and exits) and write ``text()`` to the path given, else ``default``."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("out", nargs="?", type=Path, default=default, help=f"where to write it (default: {default})")
    args = parser.parse_args(argv)
    args.out.write_text(text(), encoding="utf-8")
    return 0
