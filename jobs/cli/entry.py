"""The entry points of the scheduled stages: each runs its ``amqpscope`` command (``jobs.cli.cli``, which
runs the stage's job: ``jobs.cli.commands``).

Each stage runs three ways, and a failed stage fails each of them:

- a console script of the wheel (``amqpscope-ingest``, ``amqpscope-derive``, ``amqpscope-report``,
  ``amqpscope-maintain``; setup.cfg), which exits with the command's status: 0 ok, 1 a failure
  inside the stage, 2 a usage error or an unreadable input;
- a Databricks ``python_wheel_task``, which names an entry point of the wheel (``ingest_task``,
  ``derive_task``, ``report_task``, ``maintain_task``: the ``amqpscope.tasks`` group), sets
  ``sys.argv`` to the package name followed by the task's parameters, calls the function and
  ignores what it returns (docs/SCHEDULING.md, "Failures"). These functions raise ``TaskFailed``
  with the command's one-line error instead, so the task, and the job, fail;
- ``spark-submit`` of this file with the subcommand first, which exits with the command's status::

    spark-submit "$(python -c 'import amqpscope.jobs.cli.entry as e; print(e.__file__)')" derive --lake /lake
"""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from contextlib import redirect_stderr
from typing import TextIO

from amqpscope.jobs.cli import cli


def _stage_main(command: str):
    def main(argv: Sequence[str] | None = None) -> int:
        """Console script of one stage: ``amqpscope <command>`` with the given arguments; its exit status."""
        args = list(sys.argv[1:] if argv is None else argv)
        verbose = [a for a in args if a in ("-v", "--verbose")]  # a top-level flag of amqpscope
        return cli.main([*verbose[:1], command, *(a for a in args if a not in ("-v", "--verbose"))])

    main.__name__ = f"{command}_main"
    return main


ingest_main = _stage_main("ingest")
derive_main = _stage_main("derive")
report_main = _stage_main("report")
maintain_main = _stage_main("maintain")


class TaskFailed(RuntimeError):
    """A stage run as a Databricks task failed: the command's one-line error, and its exit status."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _ErrorLine(io.TextIOBase):
    """Passes what is written on to ``stream`` and keeps the command's last error line."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.line = ""

    def write(self, text: str) -> int:
        self._stream.write(text)
        # ``amqpscope <command>: error: ...`` (cli.main), or argparse's ``<prog>: error: ...``
        found = [line.strip() for line in text.splitlines() if ": error: " in line]
        if found:
            self.line = found[-1]
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()


def run_task(command: str, argv: Sequence[str] | None = None) -> None:
    """``amqpscope <command>`` as a ``python_wheel_task`` runs it (the arguments from ``sys.argv``
    after the package name): returns when the stage succeeded, raises ``TaskFailed`` when it did not."""
    errors = _ErrorLine(sys.stderr)
    with redirect_stderr(errors):
        try:
            status = _stage_main(command)(argv)
        except SystemExit as exc:  # argparse's usage errors, a required setting missing
            status = exc.code
            if isinstance(status, str):  # SystemExit("message"): Python prints it only as it ends
                print(status, file=sys.stderr)
                errors.line = status
    code = 0 if status is None else status if isinstance(status, int) else 2
    if code != 0:
        raise TaskFailed(errors.line or f"amqpscope {command}: failed with exit status {code}", code)


def ingest_task() -> None:
    """``python_wheel_task`` entry point of the ingest stage: raises ``TaskFailed`` when it fails."""
    run_task("ingest")


def derive_task() -> None:
    """``python_wheel_task`` entry point of the derive stage: raises ``TaskFailed`` when it fails."""
    run_task("derive")


def report_task() -> None:
    """``python_wheel_task`` entry point of the report stage: raises ``TaskFailed`` when it fails."""
    run_task("report")


def maintain_task() -> None:
    """``python_wheel_task`` entry point of the maintain stage: raises ``TaskFailed`` when it fails."""
    run_task("maintain")


if __name__ == "__main__":  # spark-submit entry.py COMMAND ARGS...
    sys.exit(cli.main())
