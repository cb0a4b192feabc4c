"""Build: the distribution setup.cfg declares, with the decoders' per-packet path compiled by mypyc.

The modules in ``ingest.compiled.MODULES`` are ordinary, fully typed Python. mypyc (a build
dependency, pyproject.toml) translates them to C and the machine's C compiler builds one extension
per module, the way black and mypy ship; nothing else changes. The sources stay the one
implementation: ``ingest.compiled`` runs them as Python when the extensions are missing, older than
the source, or ``AMQPSCOPE_PURE_PYTHON=1`` asks for it.

``AMQPSCOPE_COMPILE=0`` builds without the extensions (no C compiler needed): a pure-Python wheel,
tagged py3-none-any, that installs on any platform and Python (>= 3.11), such as a Databricks
runtime's. It leaves the source tree's compiled build alone (a developer's editable install keeps
running it), and carries no manifest of compiled sources.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "ingest"))
from compiled import GROUP, MANIFEST, MODULES, source_hashes  # noqa: E402  (ingest/compiled.py: no imports of its own)

sys.path.pop(0)

# setup.cfg maps ``amqpscope.<name>`` to top-level folders; mypyc names a module by its path, so the
# compiled modules are staged under an ``amqpscope/`` folder that links back to the sources.
_STAGE = ROOT / "build" / "mypyc-src"
_PACKAGES = ("ingest", "schemas")  # what the compiled modules import
# PySpark (behind schemas.frames) and cryptography (behind the TLS stage, which is not compiled) are
# not in the isolated build environment, and may or may not be beside it: never analysed, so that
# every build compiles the same code.
_MYPY_CONFIG = """[mypy]
[mypy-pyspark.*]
follow_imports = skip
ignore_missing_imports = True
[mypy-cryptography.*]
follow_imports = skip
ignore_missing_imports = True
"""


def _stage() -> list[str]:
    shutil.rmtree(_STAGE, ignore_errors=True)
    package = _STAGE / "amqpscope"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in _PACKAGES:
        (package / name).symlink_to(ROOT / name, target_is_directory=True)
    config = _STAGE / "mypy.ini"
    config.write_text(_MYPY_CONFIG)
    modules = [str((package / "ingest" / f"{module}.py").relative_to(ROOT)) for module in MODULES]
    return ["--config-file", str(config.relative_to(ROOT)), *modules]


def _write_manifest() -> None:
    """The hash of each compiled module's source: how ``ingest.compiled`` tells a stale build."""
    digests = source_hashes(ROOT / "ingest")
    (ROOT / "ingest" / MANIFEST).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


def _compiling() -> bool:
    return os.environ.get("AMQPSCOPE_COMPILE", "1") != "0"


def _extensions() -> list:
    if not _compiling():
        if "editable_wheel" in sys.argv:
            # An editable install runs the tree itself: extensions an earlier build left there must not run.
            (ROOT / "ingest" / MANIFEST).unlink(missing_ok=True)
        return []
    from mypyc.build import mypycify

    paths = _stage()
    _write_manifest()
    extensions = mypycify(paths, opt_level="3", group_name=GROUP)
    for extension in extensions:
        # No C compiler: the install goes on without them, and the sources run as Python.
        extension.optional = True
    return extensions


setup(
    ext_modules=_extensions(),
    # A pure build ships no manifest: there are no extensions for it to vouch for.
    exclude_package_data={} if _compiling() else {"amqpscope.ingest": [MANIFEST]},
)
