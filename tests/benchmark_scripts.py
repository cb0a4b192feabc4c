"""The benchmarks' scripts imported by their tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from tests.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"


@contextmanager
def benchmark_script(script: str) -> Iterator[ModuleType]:
    """``benchmarks/<script>.py`` as a module. A script puts benchmarks/ first on sys.path and
    imports its siblings as top-level modules (end_to_end, decode, ingest): sys.path is put back and
    those modules forgotten afterwards."""
    saved_path = list(sys.path)
    spec = importlib.util.spec_from_file_location(f"bench_{script}", BENCHMARKS / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path[:] = saved_path
        for name, loaded in list(sys.modules.items()):
            if Path(getattr(loaded, "__file__", None) or "/").parent == BENCHMARKS:  # the script too
                del sys.modules[name]
