"""The driver JVM's class data sharing archive: Spark's classes parsed once, mapped by later runs.

A local run's JVM loads and verifies tens of thousands of classes from Spark's jars, the same
ones every run. HotSpot can write the classes a run loaded to an archive when it exits
(``-XX:ArchiveClassesAtExit``, JDK 13 and later) and map that archive at the start of the next
run (``-XX:SharedArchiveFile``) instead of reading the jars again (JEP 350, "Dynamic CDS
Archives"). The first job on a machine writes it; every later one uses it.

The archive is only valid for the JVM and the class path that wrote it, so its file name is a
digest of both. A JVM that cannot map it (another JDK, a changed jar, an archive cut short)
starts without it: sharing is an optimisation HotSpot drops silently under ``-Xshare:auto``,
the default. ``AMQPSCOPE_CLASS_ARCHIVE`` names the directory (default
``$XDG_CACHE_HOME/amqpscope``, else ``~/.cache/amqpscope``); ``off`` turns the archive off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("amqpscope.jobs")

ENVIRONMENT = "AMQPSCOPE_CLASS_ARCHIVE"
OFF = frozenset({"off", "0", "false", "no"})
SUFFIX = ".jsa"
UNUSED_DAYS = 30  # archives of other JDKs or Spark versions not used for this long are deleted
CHECK_TIMEOUT_S = 120
# The JVM's own messages about the archive (classes it skips, an archive it cannot map) would
# reach the job's output: sharing is an optimisation, its absence is not worth a line.
_QUIET = "-Xlog:cds*=off"


@dataclass(frozen=True)
class ClassArchive:
    """The archive for this JVM and class path: where it is, and the options that use or write it."""

    path: Path
    java: Path  # the JVM that writes and maps it

    @property
    def exists(self) -> bool:
        return self.path.is_file() and self.path.stat().st_size > 0

    def pending(self) -> Path:
        """Where this process's JVM writes the archive before it is put in place (by ``finish``)."""
        return self.path.with_name(f"{self.path.name}.{os.getpid()}.part")

    def java_options(self, create: bool) -> str | None:
        """The JVM options that map the archive, or, when there is none and ``create``, write it."""
        if any(c.isspace() or c in "\"'\\" for c in str(self.path)):
            return None  # Spark splits the JVM's options at white space and unquotes them
        if self.exists:
            try:
                os.utime(self.path)  # its modification time says when it was last used (see prune)
            except OSError:  # another user's archive: used all the same
                pass
            return f"-XX:SharedArchiveFile={self.path} {_QUIET}"
        if create:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            return f"-XX:ArchiveClassesAtExit={self.pending()} {_QUIET}"
        return None

    def finish(self, class_path: str, java_options: Sequence[str] = ()) -> bool:
        """Put the archive the exited JVM wrote in place, once a JVM on ``class_path`` with
        ``java_options`` (the writer's) has mapped it; True if it is in place."""
        written = self.pending()
        if not written.is_file() or not self._maps(written, class_path, java_options):
            written.unlink(missing_ok=True)
            return False
        os.replace(written, self.path)
        prune(self.path.parent, keep=self.path)
        return True

    def _maps(self, archive: Path, class_path: str, java_options: Sequence[str]) -> bool:
        # HotSpot 17 crashes (SIGBUS) on an archive cut short, even under -Xshare:auto: none is
        # put in place that a JVM has not mapped. -Xshare:on makes a JVM that cannot map it fail.
        command = [
            str(self.java),
            *java_options,
            "-Xshare:on",
            f"-XX:SharedArchiveFile={archive}",
            _QUIET,
            "-XX:ErrorFile=/dev/null",
            "-cp",
            class_path,
            "-version",
        ]
        try:
            checked = subprocess.run(command, capture_output=True, timeout=CHECK_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if checked.returncode != 0:
            log.warning("the JVM's class archive %s cannot be mapped; it is dropped", archive)
        return checked.returncode == 0


def archive_for_this_jvm(directory: Path | None = None) -> ClassArchive | None:
    """The archive for the JVM and Spark jars a local session would start with; None when
    ``AMQPSCOPE_CLASS_ARCHIVE`` is off or no ``java`` is found."""
    setting = os.environ.get(ENVIRONMENT, "")
    if setting.strip().lower() in OFF:
        return None
    java = _java()
    if java is None:
        return None
    if directory is None:
        directory = Path(setting) if setting else _default_directory()
    return ClassArchive(directory / f"spark-{_digest(java, _jars())}{SUFFIX}", java)


def prune(directory: Path, keep: Path) -> None:
    """Delete archives unused for UNUSED_DAYS and archive parts left by JVMs no longer running."""
    now = time.time()
    for entry in directory.glob(f"*{SUFFIX}*"):
        if entry == keep:
            continue
        if entry.name.endswith(".part"):
            stale = not _running(entry.name.rsplit(".", 2)[-2])
        else:
            stale = now - entry.stat().st_mtime > UNUSED_DAYS * 86400
        if stale:
            entry.unlink(missing_ok=True)
            log.debug("deleted the class archive %s", entry)


def _running(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _default_directory() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "amqpscope"


def _java() -> Path | None:
    # As Spark's launcher finds it: JAVA_HOME's, else the first on PATH.
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.is_file():
        on_path = shutil.which("java")
        found = Path(on_path) if on_path else None
    return found.resolve() if found is not None else None


def _jars() -> Path:
    from pyspark.find_spark_home import _find_spark_home  # SPARK_HOME, else pyspark's own jars

    return Path(_find_spark_home()) / "jars"


def _digest(java: Path, jars: Path) -> str:
    # The JVM binary and every jar of the class path, by name, size and modification time.
    parts = [f"{java}:{java.stat().st_size}:{java.stat().st_mtime_ns}"]
    if jars.is_dir():
        parts += sorted(f"{j.name}:{j.stat().st_size}:{j.stat().st_mtime_ns}" for j in jars.glob("*.jar"))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
