"""Great Expectations' files written so that a failure cannot leave one half-written, and repaired
when an earlier run (or an older amqpscope) left one so.

GX 1.x writes its project file (``great_expectations.yml``), its stores (expectation suites,
validation definitions, checkpoints, validation results) and the Data Docs by opening the file
itself and writing into it: a full disk or a kill leaves it empty or cut short, and every later
run that reads it fails (an empty suite file made each later ``analyze`` fail with a ``TypeError``).
Here every such file is written to a temporary name in its own directory, flushed to disk, and
renamed over the old one (``os.replace``, atomic on POSIX): a reader sees the old file or the new,
never part of one.

- ``AtomicFilesystemStoreBackend`` is GX's ``TupleFilesystemStoreBackend`` whose writes are atomic;
  the file context names it for every store and the Data Docs site (``configure``).
- ``AtomicFileDataContext`` writes its project file atomically.
- ``repair`` runs before a context is opened: a project file, store file or Data Docs page that is
  empty or does not parse is removed (each is rebuilt: the project file and suites by this run, a
  page by a Data Docs rebuild; a damaged validation result of an earlier run is lost, not fatal),
  and temporary files a killed writer left are removed.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import yaml
from great_expectations.data_context import FileDataContext
from great_expectations.data_context.store import TupleFilesystemStoreBackend

log = logging.getLogger("amqpscope.expectations")

_TEMP_MARK = ".amqpscope-tmp-"  # in the name of a file being written: ".<name>.amqpscope-tmp-<id>"
# The GX folders whose files are JSON (stores) and HTML (Data Docs), under the context's root.
_JSON_FOLDERS = ("expectations", "validation_definitions", "checkpoints", "uncommitted/validations")
_DOCS_FOLDER = "uncommitted/data_docs"
_STORE_ID_FILE = ".ge_store_backend_id"  # "store_backend_id = <uuid>"
_YAML_FILES = ("great_expectations.yml", "uncommitted/config_variables.yml")


def atomic_write(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` all or nothing: a temporary file beside it, flushed, then renamed."""
    target = Path(path)
    temporary = target.with_name(f".{target.name}{_TEMP_MARK}{uuid.uuid4().hex}")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise


class AtomicFilesystemStoreBackend(TupleFilesystemStoreBackend):
    """GX's filesystem store backend, each file written to a temporary name and renamed."""

    def _set(self, key: Any, value: Any, **kwargs: Any) -> str:
        if not isinstance(key, tuple):
            key = key.to_tuple()
        filepath = os.path.join(self.full_base_directory, self._convert_key_to_filepath(key))
        os.makedirs(os.path.dirname(filepath), exist_ok=True)
        atomic_write(filepath, value.encode("utf-8") if isinstance(value, str) else value)
        return filepath


class AtomicFileDataContext(FileDataContext):
    """A file data context that writes ``great_expectations.yml`` all or nothing."""

    def _save_project_config(self) -> None:
        # GX's own serialization, into a temporary name (the path is built from GX_YML), then renamed.
        final = Path(self.root_directory, type(self).GX_YML)
        temporary = final.with_name(f".{final.name}{_TEMP_MARK}{uuid.uuid4().hex}")
        self.GX_YML = temporary.name  # type: ignore[misc]  (this instance only)
        try:
            super()._save_project_config()
            if temporary.exists():  # GX logs and skips a write it is not permitted
                with open(temporary, "rb+") as handle:
                    os.fsync(handle.fileno())
                os.replace(temporary, final)
        finally:
            del self.GX_YML
            if temporary.exists():
                temporary.unlink()


_BACKEND = {"class_name": AtomicFilesystemStoreBackend.__name__, "module_name": __name__}


def configure(context: FileDataContext) -> bool:
    """Name the atomic backend in every store and Data Docs site of ``context``'s project file;
    True when the file changed (the context must then be opened again to use it)."""
    changed = False
    configs = [store.get("store_backend") for store in context.config.stores.values()]
    configs += [site.get("store_backend") for site in context.config.data_docs_sites.values()]
    for backend in configs:
        if isinstance(backend, dict) and backend.get("class_name") == TupleFilesystemStoreBackend.__name__:
            backend.update(_BACKEND)
            changed = True
    if changed:
        context._save_project_config()
    return changed


def repair(root: Path) -> list[Path]:
    """Remove what an earlier run left broken under the GX context root ``root``: temporary files,
    and files that are empty or do not parse (YAML, JSON, a store's id, an HTML page cut short).
    Returns what was removed; each is logged."""
    if not root.is_dir():
        return []
    removed = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        reason = _damage(path, relative)
        if reason is None:
            continue
        path.unlink()
        removed.append(path)
        log.warning("Great Expectations file %s %s: removed, to be rebuilt", path, reason)
    return removed


def _damage(path: Path, relative: str) -> str | None:
    """Why the GX file at ``relative`` cannot be used as it is, or None."""
    if _TEMP_MARK in path.name:
        return "was being written by a run that did not finish"
    if relative in _YAML_FILES:
        return _yaml_damage(path, required=relative == _YAML_FILES[0])
    if path.name == _STORE_ID_FILE:
        return None if path.read_bytes().strip().startswith(b"store_backend_id = ") else "is not a store id"
    if path.suffix == ".json" and relative.startswith(_JSON_FOLDERS):
        try:
            json.loads(path.read_bytes())
        except ValueError as exc:  # UnicodeDecodeError included
            return f"is not JSON ({path.stat().st_size} bytes: {exc})"
        return None
    if path.suffix == ".html" and relative.startswith(_DOCS_FOLDER):
        # GX renders every page whole: one without its closing tag was cut short.
        return None if b"</html>" in path.read_bytes()[-4096:].lower() else "was cut short"
    return None


def _yaml_damage(path: Path, required: bool) -> str | None:
    try:
        loaded = yaml.safe_load(path.read_bytes())
    except (yaml.YAMLError, ValueError) as exc:
        return f"is not YAML ({exc.__class__.__name__})"
    if required and not (isinstance(loaded, dict) and "stores" in loaded):
        return f"is not a GX project file ({path.stat().st_size} bytes)"
    if not required and loaded is not None and not isinstance(loaded, dict):
        return "is not a mapping"
    return None
