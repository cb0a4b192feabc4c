"""Great Expectations' files: written all or nothing, and rebuilt when an earlier run left one damaged.

GX itself (1.24) opens each file and writes into it: a failure part way leaves it empty or cut short,
and each later run failed on it. These tests break a write part way and damage files by hand, then
check that the next run completes and leaves every file whole.
"""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest
import yaml

from amqpscope.expectations import gx_files
from amqpscope.expectations.catalogue import load_rules, rules_for
from amqpscope.expectations.suite import file_context, validate_counts

RULES = {table: rules_for(table, load_rules()) for table in ("frames", "link_credit")}


def validate(docs_dir: Path, run: str) -> bool:
    """One verdict run of the suites on counts of no violation: its success."""
    suites, _seconds = validate_counts(file_context(docs_dir), RULES, {}, run)
    return all(s.success for s in suites)


def assert_whole(root: Path) -> None:
    """Every GX file under ``root`` parses, and no temporary file is left."""
    files = [p for p in root.rglob("*") if p.is_file()]
    assert [p for p in files if ".amqpscope-tmp-" in p.name] == []
    for path in files:
        if path.suffix == ".json":
            json.loads(path.read_bytes())
        elif path.name == "great_expectations.yml":
            assert "stores" in yaml.safe_load(path.read_bytes())
        elif path.suffix == ".html" and "data_docs" in path.parts:
            assert b"</html>" in path.read_bytes().lower(), path


def test_every_store_and_the_data_docs_write_atomically(tmp_path):
    validate(tmp_path, "first")
    config = yaml.safe_load((tmp_path / "gx" / "great_expectations.yml").read_text())
    backends = [s["store_backend"] for s in config["stores"].values() if "store_backend" in s]
    backends += [s["store_backend"] for s in config["data_docs_sites"].values()]
    assert len(backends) == 5  # expectations, validation results, checkpoints, validation definitions; the site
    assert all(
        b["class_name"] == "AtomicFilesystemStoreBackend" and b["module_name"] == gx_files.__name__ for b in backends
    )


def test_a_write_that_fails_part_way_leaves_the_old_file_and_the_next_run_completes(tmp_path, monkeypatch):
    assert validate(tmp_path, "first")
    suite = tmp_path / "gx" / "expectations" / "amqpscope" / "frames.json"
    before = suite.read_bytes()
    real_fsync = gx_files.os.fsync
    writes = {"n": 0}

    def disk_full(fd: int) -> None:  # the bytes are in the temporary file; the disk refuses them
        writes["n"] += 1
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gx_files.os, "fsync", disk_full)
    suite.write_bytes(before.replace(b'"amqpscope.frames"', b'"amqpscope.frames" '))  # differs: GX writes it again
    changed = suite.read_bytes()
    with pytest.raises(OSError, match="No space left"):
        validate(tmp_path, "disk-full")
    assert writes["n"] >= 1
    assert suite.read_bytes() == changed  # not emptied, not cut short
    assert_whole(tmp_path / "gx")

    monkeypatch.setattr(gx_files.os, "fsync", real_fsync)
    assert validate(tmp_path, "after")
    assert_whole(tmp_path / "gx")
    assert json.loads(suite.read_bytes())["name"] == "amqpscope.frames"


def test_damaged_files_of_an_earlier_run_are_rebuilt(tmp_path, caplog):
    assert validate(tmp_path, "first")
    gx = tmp_path / "gx"
    suite = gx / "expectations" / "amqpscope" / "frames.json"
    result = next((gx / "uncommitted" / "validations" / "amqpscope" / "frames").rglob("*.json"))
    page = next(
        (gx / "uncommitted" / "data_docs" / "local_site" / "validations" / "amqpscope" / "link_credit").rglob("*.html")
    )
    suite.write_bytes(b"")  # the case: a suite file left empty by a full disk
    result.write_bytes(b'{"success": tr\x00\x00')
    page.write_bytes(page.read_bytes()[:1000])
    (gx / "checkpoints" / ".amqpscope.json.amqpscope-tmp-0123").write_bytes(b"{")  # a killed writer's
    (gx / "great_expectations.yml").write_bytes(b"")

    with caplog.at_level(logging.WARNING, logger="amqpscope.expectations"):
        assert validate(tmp_path, "second")
    assert_whole(gx)
    warned = "\n".join(r.getMessage() for r in caplog.records)
    for path in (suite, result, page, gx / "great_expectations.yml"):
        assert f"{path} " in warned
    assert page.is_file()  # the earlier run's page, rendered again from its validation result
    assert json.loads(suite.read_bytes())["name"] == "amqpscope.frames"
    assert not result.exists()  # its validation result could not be read: dropped, not fatal
