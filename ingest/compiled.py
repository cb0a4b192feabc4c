"""Which ingest modules mypyc compiles, and whether this process runs them compiled.

The per-packet path (pcap records to frames-table rows) is plain, typed Python that the build
(setup.py) also compiles with mypyc into C extensions beside the sources. Python prefers an
extension to a source file of the same name, so this module decides, once per process, before any
of them is imported, whether that is right:

- compiled, when every extension is there and was built from the sources as they are now (the
  build writes each source's hash to ``MANIFEST``);
- the Python source, when ``AMQPSCOPE_PURE_PYTHON=1`` asks for it, or when the extensions are
  missing or stale (a source edited after the build: the old code must not run; a warning says so).

All of them or none: compiled modules call each other directly, so a mix would run stale code.
Standard library only: setup.py reads the module list from here before the package exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from collections.abc import Mapping
from functools import cache
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from importlib.util import spec_from_file_location
from pathlib import Path

PACKAGE = "amqpscope.ingest"
# In dependency order; everything a packet goes through on its way to a row.
MODULES = (
    "reasons",
    "limits",
    "pcap",
    "packets",
    "tcp",
    "framing",
    "amqp10_types",
    "amqp091_values",
    "amqp091_methods",
    "amqp091",
    "amqp10",
    "messages",
    "rows",
    "quarantine",
    "capture",
)
GROUP = f"{PACKAGE}._native"  # mypyc's shared library: amqpscope.ingest._native__mypyc
MANIFEST = "_compiled_sources.json"
PURE_PYTHON_VARIABLE = "AMQPSCOPE_PURE_PYTHON"

_HERE = Path(__file__).resolve().parent


def source_hashes(folder: Path) -> dict[str, str]:
    """The SHA-256 of each compiled module's source in ``folder``: what the build records."""
    return {m: hashlib.sha256((folder / f"{m}.py").read_bytes()).hexdigest() for m in MODULES}


def _has_extension(folder: Path, module: str) -> bool:
    return any((folder / f"{module}{suffix}").exists() for suffix in EXTENSION_SUFFIXES)


def why_source(folder: Path, environ: Mapping[str, str]) -> str | None:
    """Why the modules in ``folder`` must run as Python source; None when they can run compiled."""
    built = [m for m in MODULES if _has_extension(folder, m)]
    if environ.get(PURE_PYTHON_VARIABLE) == "1":
        return f"{PURE_PYTHON_VARIABLE}=1"
    if not built:
        return "not compiled (built with AMQPSCOPE_COMPILE=0, or not built)"
    try:
        digests = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return f"compiled modules without a readable {MANIFEST}"
    missing = [m for m in MODULES if m not in built]
    stale = [m for m, digest in source_hashes(folder).items() if digests.get(m) != digest]
    if missing:
        return f"compiled modules missing: {', '.join(missing)}"
    if stale:
        return f"compiled from another version of the source: {', '.join(stale)} (`make setup` rebuilds them)"
    return None


class _SourceFinder:
    """Finds the compiled modules' ``.py`` sources ahead of their extensions."""

    def __init__(self, names: frozenset[str]) -> None:
        self._names = names

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname not in self._names:
            return None
        return spec_from_file_location(fullname, _HERE / f"{fullname.rpartition('.')[2]}.py")


@cache  # the choice is made once
def select() -> str | None:
    """Choose, once per process: None when the modules run compiled, else why they run as source.

    ``amqpscope.ingest`` calls this on import, before any of the modules can be imported.
    """
    reason = why_source(_HERE, os.environ)
    if reason is not None and any(_has_extension(_HERE, m) for m in MODULES):
        names = frozenset(f"{PACKAGE}.{m}" for m in MODULES)
        loaded = sorted(names & sys.modules.keys())
        if loaded:  # too late to choose: the process already runs the extensions
            raise ImportError(f"{PACKAGE}.compiled: {loaded} imported before the choice")
        sys.meta_path.insert(0, _SourceFinder(names))
        if not reason.startswith(PURE_PYTHON_VARIABLE):
            warnings.warn(f"amqpscope: running the ingest decoders as Python: {reason}", RuntimeWarning, stacklevel=2)
    return reason


def running() -> str:
    """How this process runs the decoders: ``compiled (mypyc)`` or ``python (<why>)``."""
    reason = select()
    return "compiled (mypyc)" if reason is None else f"python ({reason})"
