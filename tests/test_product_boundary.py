"""The product stands alone: no module of the wheel imports the testbed (the scaffolding that makes
the ground-truth captures: a top-level package of the repository, not installed), the tests or the
benchmarks; setup.cfg ships no testbed; and ``amqpscope`` has no command of the testbed's."""

from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from amqpscope.jobs.cli.cli import build_parser
from testbed.processes import REPOSITORY_ROOT, child_environment
from tests.paths import ROOT

# The repository's top-level folders the wheel installs, and the name each becomes (setup.cfg's package_dir).
PRODUCT = {
    "package": "amqpscope",
    "ingest": "amqpscope.ingest",
    "schemas": "amqpscope.schemas",
    "pipelines": "amqpscope.pipelines",
    "expectations": "amqpscope.expectations",
    "jobs": "amqpscope.jobs",
    "conf": "amqpscope.conf",
}
# What no product module may import: the repository's own scaffolding, outside the wheel.
OUTSIDE = ("testbed", "tests", "benchmarks")


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return config


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


def product_modules() -> dict[str, Path]:
    """Every module of the product by its installed name (``amqpscope.jobs.cli.cli``), and its file."""
    modules = {}
    for folder, package in PRODUCT.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" in path.parts or "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def import_source(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_names(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, at any depth (a function's lazy
    imports too): ``from X import y`` gives ``X.y`` and ``X``, relative imports resolved."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            source = import_source(module, path, node)
            yield node.lineno, source
            for alias in node.names:
                yield node.lineno, f"{source}.{alias.name}"


def test_setup_cfg_installs_the_product_folders_and_no_testbed():
    config = _setup_cfg()
    package_dir = dict(line.replace(" ", "").split("=") for line in _lines(config["options"]["package_dir"]))
    packages = _lines(config["options"]["packages"])
    assert {folder.split("/")[0] for folder in package_dir.values()} == set(PRODUCT)
    assert set(PRODUCT.values()) <= set(package_dir) and set(package_dir) == set(packages)
    for name in [*package_dir, *package_dir.values(), *packages, *config["options.package_data"]]:
        assert not any(part in OUTSIDE for part in name.replace("/", ".").split(".")), name
    assert not set(config["options.extras_require"]) & set(OUTSIDE)  # no extra only the testbed needs
    for group in config["options.entry_points"].values():
        assert not any(part in OUTSIDE for part in group.replace(":", ".").replace("=", " ").split(".")), group


def test_no_product_module_imports_the_testbed_the_tests_or_the_benchmarks():
    modules = product_modules()
    assert (
        len(modules) > 50 and "amqpscope.jobs.cli.cli" in modules and "amqpscope.expectations.diagnosis_doc" in modules
    )
    crossing = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for module, path in modules.items()
        for line, name in imported_names(module, path)
        if name.split(".")[0] in OUTSIDE or (name.startswith("amqpscope.") and name.split(".")[1] in OUTSIDE)
    ]
    assert not crossing, crossing


def test_the_check_sees_an_import_of_the_testbed(tmp_path):
    """The test above would see one: at the top, in a function, relative, or as a product name."""
    source = tmp_path / "module.py"
    source.write_text(
        "import testbed.capture\n"
        "def f():\n    from testbed import truth\n"
        "from ..testbed import broker\n"
        "from amqpscope.testbed.scenarios import SCENARIOS\n"
    )
    names = {name for _, name in imported_names("amqpscope.jobs.module", source)}
    assert {"testbed.capture", "testbed.truth", "amqpscope.testbed.broker", "amqpscope.testbed.scenarios"} <= names


def test_the_command_has_no_testbed_command():
    """``capture`` is the testbed's own (``python -m testbed capture``), not a command of the product."""
    [commands] = [action.choices for action in build_parser()._subparsers._group_actions]
    assert "capture" not in commands
    assert {"analyze", "ingest", "derive", "report", "watch", "maintain", "diagnose"} == set(commands)


def test_a_child_process_imports_the_testbed_from_anywhere(tmp_path):
    """Not installed, the testbed is found from the repository's root: a child Python process
    started with ``child_environment`` (the netns publisher, the Celery worker) imports it
    whatever its working directory, and runs its command."""
    assert REPOSITORY_ROOT == ROOT
    env = child_environment({"PATH": "/usr/bin:/bin", "PYTHONPATH": f"/elsewhere:{ROOT}"})
    assert env["PYTHONPATH"] == f"{ROOT}:/elsewhere"
    env = child_environment()
    ran = subprocess.run(
        [sys.executable, "-m", "testbed", "capture", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage: python -m testbed capture") and "--pcapng" in ran.stdout
