"""Typed configuration of amqpscope's jobs: frozen dataclasses, validated on construction.

Per-environment values (a cluster's master URL, the lake's location) come from the command line
or a YAML file (``conf/analyze.yml`` documents every key); nothing is read from ``spark.conf``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from amqpscope.conf.diagnosis import DiagnosisThresholds

STORAGE_BACKENDS = ("auto", "delta-rs", "delta-spark")
# The engines a local run can be given (--engine): Spark (classic, or Spark Connect with remote) and
# Sail, the embedded Rust engine on Spark Connect's protocol (jobs.engine.sail).
ENGINE_CHOICES = ("spark", "sail")
_UC_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
DEFAULT_PORTS = (5672, 5671)  # AMQP, and AMQP over TLS (IANA)


@dataclass(frozen=True)
class AnalyzeConfig:
    """Everything ``amqpscope analyze`` needs besides the capture files."""

    lake: Path
    # None: the master spark-submit was given, else local[2]; a Databricks task uses its runtime's session.
    master: str | None = None
    # A Spark Connect server (sc://host:port, or local[N]: one started in this process) instead of
    # a classic session; None: SPARK_REMOTE's when it is set (jobs.engine.session.resolve_remote).
    remote: str | None = None
    # The engine a session is built on when no runtime gives one: "spark" (master or remote) or
    # "sail", a Sail server started in this process for the run (jobs.engine.sail).
    engine: str = "spark"
    storage: str = "auto"
    ports: tuple[int, ...] = DEFAULT_PORTS
    report: Path | None = None  # default: <lake>/reports/<run id>.html, one per run
    data_docs: Path | None = None  # default: <lake>/_data_docs
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # Decode rotated files (tcpdump -C / -G / -W) as the parts of one capture (ingest.rotation).
    group_rotated: bool = True
    # Thresholds of the bottleneck diagnosis (conf/diagnosis.py; YAML key ``diagnosis:``).
    diagnosis: DiagnosisThresholds = field(default_factory=DiagnosisThresholds)
    # Unity Catalog: with both, the tables are catalog.schema.<table> (delta-spark only) and the lake
    # directory keeps the rest (reports, Data Docs); an empty value is none (a job parameter left blank).
    catalog: str | None = None
    schema: str | None = None
    # NSS key logs (SSLKEYLOGFILE) TLS is decrypted with: paths, read where a capture is decoded (on a
    # cluster they must be readable at the same path by every executor); never copied into the lake.
    tls_keylog: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.diagnosis, Mapping):
            object.__setattr__(self, "diagnosis", DiagnosisThresholds.from_mapping(self.diagnosis))
        if self.storage not in STORAGE_BACKENDS:
            raise ValueError(f"storage must be one of {', '.join(STORAGE_BACKENDS)}, not {self.storage!r}")
        if not self.ports or any(not 0 < p < 65536 for p in self.ports):
            raise ValueError(f"ports must be TCP ports (1-65535), got {self.ports!r}")
        if self.master is not None and not self.master:
            raise ValueError("master must name a Spark master, e.g. local[2] or spark://host:7077")
        if self.remote is not None and not self.remote:
            raise ValueError("remote must name a Spark Connect server, e.g. sc://host:15002 or local[2]")
        if self.remote is not None and self.master is not None:
            raise ValueError(f"master ({self.master}) and remote ({self.remote}) name two sessions: give one")
        if self.engine not in ENGINE_CHOICES:
            raise ValueError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, not {self.engine!r}")
        if self.engine == "sail" and (self.master is not None or self.remote is not None):
            raise ValueError("the sail engine runs in this process: give no master or remote with it")
        object.__setattr__(self, "lake", Path(self.lake))
        for name in ("catalog", "schema"):
            value = getattr(self, name) or None
            if value is not None and not _UC_NAME.fullmatch(value):
                raise ValueError(f"{name} must be a Unity Catalog name (letters, digits, '_' and '-'), got {value!r}")
            object.__setattr__(self, name, value)
        if (self.catalog is None) != (self.schema is None):
            raise ValueError("catalog and schema go together: give both (tables catalog.schema.<table>) or neither")
        keylogs = (self.tls_keylog,) if isinstance(self.tls_keylog, (str, Path)) else self.tls_keylog
        object.__setattr__(self, "tls_keylog", tuple(Path(p) for p in keylogs))
        if self.tls_keylog:
            from amqpscope.ingest.tls_keylog import check_key_logs

            check_key_logs(self.tls_keylog)  # a missing or empty key log is an error naming it, before any work

    def report_path_for(self, run_id: str) -> Path:
        """The report of run ``run_id``: ``report`` when set, else one file per run under the lake,
        so that concurrent runs never overwrite each other's."""
        return self.report if self.report is not None else self.lake / "reports" / f"{run_id}.html"

    @property
    def data_docs_dir(self) -> Path:
        return self.data_docs if self.data_docs is not None else self.lake / "_data_docs"


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Settings from a YAML file; unknown keys are an error naming the file and the key."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping of settings at the top level")
    known = {f.name for f in fields(AnalyzeConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if "ports" in raw:
        raw["ports"] = tuple(int(p) for p in raw["ports"])
    if isinstance(raw.get("tls_keylog"), list):
        raw["tls_keylog"] = tuple(raw["tls_keylog"])  # one path, or a list of them
    return raw
