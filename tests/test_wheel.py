"""The wheel the bundle deploys installs on the runtime its job cluster names (Databricks Runtime
17.3 LTS: CPython 3.12 on Linux x86-64). Built with the bundle's own build command from a copy of the
sources; its tags checked against the runtime's with ``packaging.tags`` (no Python 3.12 can be made
on this machine: Debian 12 has 3.11 only); installed here, its task entry points are the ones the
job names, and one raises on a failed stage."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml
from packaging.specifiers import SpecifierSet
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from amqpscope.jobs.report.page import PLOTLY
from tests.paths import ROOT
from tests.test_jobs import TASK_ORDER, bundle

# The runtime of the job cluster (resources/amqpscope_job.yml: spark_version 17.3.x): Python 3.12.3 on
# Ubuntu 24.04 (glibc 2.39), x86-64 (Databricks Runtime 17.3 LTS release notes, "System environment").
RUNTIME_PYTHON = (3, 12)
RUNTIME_PLATFORMS = [
    *(f"manylinux_2_{minor}_x86_64" for minor in range(39, 16, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
]
RUNTIME_TAGS = {
    *cpython_tags(RUNTIME_PYTHON, abis=["cp312"], platforms=RUNTIME_PLATFORMS),
    *compatible_tags(RUNTIME_PYTHON, interpreter="cp312", platforms=RUNTIME_PLATFORMS),
}


def source_copy(target: Path) -> Path:
    """What the build reads: setup.py, setup.cfg, pyproject.toml, README, LICENSE and the packages."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    folders = {
        line.split("=")[1].strip().split("/")[0]
        for line in config["options"]["package_dir"].splitlines()
        if "=" in line
    }
    target.mkdir()
    for name in ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, target / name)
    for folder in folders:
        shutil.copytree(
            ROOT / folder,
            target / folder,
            ignore=shutil.ignore_patterns("__pycache__", "*.so", "_compiled_sources.json", "node_modules"),
        )
    return target


def test_the_runtime_tags_tell_a_wheel_it_installs_from_one_it_refuses():
    """The check below can fail: the compiled wheel of this machine's Python is refused, the one
    built on the runtime's Python accepted."""
    refused = parse_wheel_filename("amqpscope-0.1.0-cp311-cp311-linux_x86_64.whl")[3]
    accepted = parse_wheel_filename("amqpscope-0.1.0-cp312-cp312-linux_x86_64.whl")[3]
    assert not refused & RUNTIME_TAGS
    assert accepted & RUNTIME_TAGS
    _, jobs = bundle()
    assert jobs["amqpscope"]["job_clusters"][0]["new_cluster"]["spark_version"].startswith("17.3.")


def test_the_bundle_builds_a_wheel_the_runtime_installs(tmp_path):
    top = yaml.safe_load((ROOT / "databricks.yml").read_text())
    artifact = top["artifacts"]["amqpscope_wheel"]
    command = artifact["build"].replace("${var.compile_decoders}", top["variables"]["compile_decoders"]["default"])
    sources = source_copy(tmp_path / "src")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", command], cwd=sources, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    [wheel] = sorted(sources.glob(artifact["files"][0]["source"]))

    name, _, _, tags = parse_wheel_filename(wheel.name)
    assert name == "amqpscope"
    assert {str(t) for t in tags} == {"py3-none-any"}
    assert tags & RUNTIME_TAGS
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
        names = archive.namelist()
    requires = next(
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Python:")
    )
    assert "3.12.3" in SpecifierSet(requires)
    assert not [n for n in names if n.endswith((".so", "_compiled_sources.json"))]  # pure: no extension, no manifest
    # The product alone: the testbed (the capture scaffolding, a top-level folder of the repository) stays out.
    assert "amqpscope/jobs/cli/cli.py" in names
    assert not [n for n in names if "testbed" in n.split("/")[:2]]
    # The package data the stages read at run time.
    assert "amqpscope/conf/analyze.yml" in names
    assert [n for n in names if n.startswith("amqpscope/ingest/specs/") and n.endswith(".json")]
    assert [n for n in names if n.startswith("amqpscope/jobs/report/templates/") and n.endswith(".j2")]
    # The npm files the report inlines and the Data Docs serve (installed by the build's npm ci: the
    # source copy has none), each package with its licence.
    for package, file in (PLOTLY, ("jquery", "dist/jquery.min.js"), ("bootstrap", "dist/css/bootstrap.min.css")):
        assert f"amqpscope/web/node_modules/{package}/{file}" in names
    assert "amqpscope/web/node_modules/bootstrap/LICENSE" in names
    for stage in TASK_ORDER:
        assert f"{stage}_task = amqpscope.jobs.cli.entry:{stage}_task" in entry_points

    # Installed (here, on this Python), the task entry point the job names runs from the wheel and
    # raises when its stage fails: derive on a lake that is a file.
    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    lake = tmp_path / "lake"
    lake.write_text("not a directory")
    probe = (
        "import sys\n"
        "from importlib.metadata import distribution\n"
        "[task] = [e for e in distribution('amqpscope').entry_points if e.name == 'derive_task']\n"
        f"sys.argv = ['amqpscope', '--lake', {str(lake)!r}]\n"
        "function = task.load()\n"
        "print(sys.modules[function.__module__].__file__)\n"
        "from amqpscope.web_assets import asset\n"
        f"print(asset(*{PLOTLY!r}))\n"
        "try:\n"
        "    function()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc.exit_code, exc)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    where, plotly, outcome = ran.stdout.strip().splitlines()
    assert Path(where).is_relative_to(site)
    assert Path(plotly).is_relative_to(site)
    assert outcome == f"TaskFailed 2 amqpscope derive: error: lake {lake} is not writable: File exists"
