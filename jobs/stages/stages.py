"""What every job shares: timed stages that name themselves when they fail, and the job's session.

A failure inside a stage (a Py4J / JVM error most often, whose trace is pages long) becomes one
``StageFailed`` naming the stage and the table being written; the command line prints that line
and keeps the trace for ``-v``.
"""

from __future__ import annotations

import importlib
import logging
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.jobs.engine.session import build_session, resolve_remote, stop_session
from amqpscope.jobs.lake.errors import LakeError, printable, table_of
from amqpscope.jobs.stages.progress import Progress
from amqpscope.threads import in_background

log = logging.getLogger("amqpscope.jobs")


class StageFailed(RuntimeError):
    """A stage of a job failed: ``where`` names the stage (and table), the cause is chained."""

    def __init__(self, where: str, cause: BaseException) -> None:
        self.where = where
        super().__init__(f"{where}: {one_line(cause)}")


def one_line(exc: BaseException) -> str:
    """The gist of an exception in one line: a JVM error's first line without its Java class prefix;
    control characters escaped (a damaged file's bytes must not reach the terminal raw)."""
    if isinstance(exc, LakeError):  # its table is named by the stage
        return f"{type(exc).__name__}: {exc.detail}"
    text = str(exc).strip()
    java = getattr(exc, "java_exception", None)  # py4j.protocol.Py4JJavaError
    if java is not None:
        try:
            text = str(java.getMessage() or java.toString())
            root = _root_cause(java)
            if root is not None:  # what happened under Spark's wrapping ("No space left on device")
                text = f"{text.strip().splitlines()[0] if text.strip() else ''} ({root})"
        except Exception:  # the JVM may be gone (killed executor, stopped context)
            pass
    lines = [line.strip() for line in _TERMINAL_STYLE.sub("", text).splitlines() if line.strip()]
    # delta-rs renders its error's causes on the lines after it, each after an arrow: the last one is
    # what happened ("Generic LocalFileSystem error: ...: No space left on device (os error 28)").
    causes = [line.lstrip(_CAUSE).strip() for line in lines[1:] if line.startswith(_CAUSE)]
    first = printable(": ".join(lines[:1] + causes))
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _root_cause(java: object) -> str | None:
    """The innermost cause of a JVM exception, "Class: message", when it has one."""
    root, depth = java, 0
    while depth < 20:
        cause = root.getCause()  # type: ignore[attr-defined]
        if cause is None or cause.equals(root):
            break
        root, depth = cause, depth + 1
    if depth == 0:
        return None
    message = str(root.getMessage() or "").strip().splitlines()  # type: ignore[attr-defined]
    name = str(root.getClass().getSimpleName())  # type: ignore[attr-defined]
    return f"{name}: {message[0]}" if message else name


_TERMINAL_STYLE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colours a library put in its message
_CAUSE = "\u21b3"  # "↳"


@dataclass
class StageClock:
    """Seconds per stage of one run, and where the run is (the stage and table being worked on)."""

    seconds: dict[str, float] = field(default_factory=dict)
    progress: Progress | None = None
    table: str | None = None

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time ``name``; a failure inside it becomes a StageFailed naming it and the table."""
        start = time.perf_counter()
        self.table = None
        log.info("%s ...", name)
        if self.progress is not None:
            self.progress.step(name)
        try:
            yield
        except StageFailed:
            raise
        except Exception as exc:
            table = table_of(exc) or self.table  # the write that failed names its table (bronze's too)
            where = f"stage {name}" + (f", table {table}" if table else "")
            raise StageFailed(where, exc) from exc
        took = time.perf_counter() - start
        self.seconds[name] = self.seconds.get(name, 0.0) + took  # a step in two parts: both summed
        log.info("%s done in %.1f s", name, took)

    def writing(self, table: str) -> None:
        self.table = table
        if self.progress is not None:
            self.progress.detail(f"writing {table}")


def preload(modules: Sequence[str]) -> None:
    """Import ``modules`` on a background thread: Python work done while the JVM starts. A later
    import waits for it (the import lock); a failure here is raised by that import instead."""

    def load() -> None:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # the job's own import will raise it, where it is needed
                log.debug("preloading %s failed", name, exc_info=True)

    if modules:
        in_background(load, "amqpscope-preload")


@contextmanager
def job_session(config: AnalyzeConfig, app_name: str, preload_modules: Sequence[str] = ()) -> Iterator[SparkSession]:
    """The job's SparkSession: the runtime's own when there is one (a Databricks task, classic or
    Spark Connect), left running; otherwise one built for the job and stopped at the end: with
    ``config.engine`` "sail", a session on a Sail server started for the job; else a Spark Connect
    session on ``config.remote`` (else SPARK_REMOTE's), else a classic one on ``config.master``
    (else the master spark-submit was given, else local[2]). ``preload_modules`` are imported while
    it starts."""
    remote = resolve_remote(config.master, config.remote)  # a master and a remote together: before any work
    preload(preload_modules)
    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    if config.engine == "sail":
        from amqpscope.jobs.engine.sail import sail_session

        verbose = logging.getLogger("amqpscope").isEnabledFor(logging.INFO)
        with sail_session(dict(config.spark_conf), verbose=verbose) as sail:
            yield sail
        return
    spark = build_session(
        config.master,
        app_name,
        dict(config.spark_conf),
        write_class_archive=remote is None,
        remote=remote,
        remember_py4j_lookups=True,
    )
    try:
        yield spark
    finally:
        stop_session(spark)
