"""Typed configuration of amqpscope's jobs: frozen dataclasses, validated on construction.

Per-environment values (a cluster's master URL, the lake's location) come from the command line
or a YAML file (``conf/analyze.yml`` documents every key); nothing is read from ``spark.conf``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from amqpscope.conf.diagnosis import DiagnosisThresholds

STORAGE_BACKENDS = ("auto", "delta-rs", "delta-spark")
DEFAULT_PORTS = (5672,)


@dataclass(frozen=True)
class AnalyzeConfig:
    """Everything ``amqpscope analyze`` needs besides the capture files."""

    lake: Path
    master: str = "local[2]"
    storage: str = "auto"
    ports: tuple[int, ...] = DEFAULT_PORTS
    report: Path | None = None  # default: <lake>/report.html
    data_docs: Path | None = None  # default: <lake>/_data_docs
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # Decode rotated files (tcpdump -C / -G / -W) as the parts of one capture (ingest.rotation).
    group_rotated: bool = True
    # Thresholds of the bottleneck diagnosis (conf/diagnosis.py; YAML key ``diagnosis:``).
    diagnosis: DiagnosisThresholds = field(default_factory=DiagnosisThresholds)

    def __post_init__(self) -> None:
        if isinstance(self.diagnosis, Mapping):
            object.__setattr__(self, "diagnosis", DiagnosisThresholds.from_mapping(self.diagnosis))
        if self.storage not in STORAGE_BACKENDS:
            raise ValueError(f"storage must be one of {', '.join(STORAGE_BACKENDS)}, not {self.storage!r}")
        if not self.ports or any(not 0 < p < 65536 for p in self.ports):
            raise ValueError(f"ports must be TCP ports (1-65535), got {self.ports!r}")
        if not self.master:
            raise ValueError("master must name a Spark master, e.g. local[2] or spark://host:7077")
        object.__setattr__(self, "lake", Path(self.lake))

    @property
    def report_path(self) -> Path:
        return self.report if self.report is not None else self.lake / "report.html"

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
    return raw
