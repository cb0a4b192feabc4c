"""How every command ends: the one place outcomes become exit codes, and what each means.

``jobs.cli.cli`` (every command) and ``jobs.cli.diagnose`` (its verdicts) both take them from here, so that
neither imports the other for them.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """How every command ends (``EXIT_MEANINGS`` says what each means, in --help and the README).
    ``diagnose`` adds its own verdicts here."""

    OK = 0
    FAILED = 1
    USAGE = 2
    BOTTLENECK = 3  # diagnose only
    NOTHING_TO_JUDGE = 4  # diagnose only
    INTERRUPTED = 130  # watch only: a second signal (128 + SIGINT, as a shell reports Ctrl-C)


EXIT_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "ok",
    ExitCode.FAILED: "a failure inside a stage (the message names the stage and the table)",
    ExitCode.USAGE: "a usage error or an unreadable input (the message names the argument or the file)",
}
# diagnose's verdicts, in its --help only (its 0 says what ok means there).
DIAGNOSE_EXIT_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "no bottleneck in any capture (problems alone, listed after the verdict, leave it at 0)",
    ExitCode.BOTTLENECK: "a bottleneck found in at least one capture (the answer names the component)",
    ExitCode.NOTHING_TO_JUDGE: "no capture could be judged (no AMQP traffic found, or all of it encrypted and not decoded)",
}
# watch's own, in its --help only (its 0 and 1 are the last round's).
WATCH_EXIT_MEANINGS: dict[ExitCode, str] = {
    ExitCode.INTERRUPTED: "stopped at once by a second signal, during a round (the next run does what it left)",
}
# The meanings of one command only, by command.
COMMAND_EXIT_MEANINGS: dict[str, dict[ExitCode, str]] = {
    "diagnose": DIAGNOSE_EXIT_MEANINGS,
    "watch": WATCH_EXIT_MEANINGS,
}
