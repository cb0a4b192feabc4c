"""The compiled decoders (mypyc, ``ingest.compiled``): built, current, and equal to the Python source.

The rest of the suite runs whatever the build made (compiled unless ``AMQPSCOPE_COMPILE=0``); here
the same captures are decoded a second time as Python source, in a child process, and every row
of every table must be the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from amqpscope.ingest import amqp091_codegen, compiled
from amqpscope.ingest.capture import decode_capture

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
CAPTURES = sorted(p for p in SAMPLES.rglob("*") if p.suffix in (".pcap", ".pcapng"))


def rows_digest(path: Path | str) -> tuple[int, str]:
    """How many rows a capture decodes to, and a hash of all of them in order (TLS decrypted with the
    key log beside the capture, if any)."""
    digest = hashlib.sha256()
    count = 0
    keylog = Path(path).with_suffix(".keylog")  # the child process passes its argument as text
    for table, row in decode_capture(path, "c", segments=True, tls_keylog=[keylog] if keylog.exists() else ()):
        digest.update(table.encode())
        digest.update(json.dumps(row, sort_keys=True, default=repr).encode())
        count += 1
    return count, digest.hexdigest()


def test_generated_method_decoders_are_current():
    assert amqp091_codegen.TARGET.read_text() == amqp091_codegen.generate()


def test_the_build_runs_the_decoders_compiled():
    expected = "python (not compiled" if os.environ.get("AMQPSCOPE_COMPILE") == "0" else "compiled (mypyc)"
    assert compiled.running().startswith(expected)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_compiled_and_python_decode_every_row_alike(capture):
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, json; from tests.test_compiled import rows_digest; from amqpscope.ingest import compiled; "
            "print(json.dumps([compiled.running(), *rows_digest(sys.argv[1])]))",
            str(capture),
        ],
        env={**os.environ, compiled.PURE_PYTHON_VARIABLE: "1"},
        cwd=SAMPLES.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    running, count, digest = json.loads(child.stdout)
    assert running == f"python ({compiled.PURE_PYTHON_VARIABLE}=1)"
    assert (count, digest) == rows_digest(capture)
    assert count > 100


def _package(folder: Path, built: bool) -> None:
    """A stand-in for the ingest folder: every module's source, and empty extensions when ``built``."""
    for index, module in enumerate(compiled.MODULES):
        (folder / f"{module}.py").write_text(f"VALUE = {index}\n")
        if built:
            (folder / f"{module}{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    if built:
        (folder / compiled.MANIFEST).write_text(json.dumps(compiled.source_hashes(folder)))


def test_why_source_names_each_reason(tmp_path):
    _package(tmp_path, built=False)
    assert compiled.why_source(tmp_path, {}).startswith("not compiled")
    _package(tmp_path, built=True)
    assert compiled.why_source(tmp_path, {}) is None
    assert compiled.why_source(tmp_path, {compiled.PURE_PYTHON_VARIABLE: "1"}) == "AMQPSCOPE_PURE_PYTHON=1"
    (tmp_path / "framing.py").write_text("VALUE = -1\n")  # edited after the build
    assert compiled.why_source(tmp_path, {}) == (
        "compiled from another version of the source: framing (`make setup` rebuilds them)"
    )
    _package(tmp_path, built=True)
    (tmp_path / f"rows{EXTENSION_SUFFIXES[0]}").unlink()
    assert compiled.why_source(tmp_path, {}) == "compiled modules missing: rows"
    (tmp_path / compiled.MANIFEST).unlink()
    assert compiled.why_source(tmp_path, {}) == f"compiled modules without a readable {compiled.MANIFEST}"
