"""A failed stage fails every way it is run: the entry point a Databricks ``python_wheel_task`` calls
raises with the command's one-line error, a console script exits non-zero, and so does
``spark-submit`` of jobs/cli/entry.py. Exit statuses as every command has them: 1 a failure inside a
stage, 2 a usage error or an unreadable input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from amqpscope.jobs.cli import entry
from amqpscope.jobs.cli.entry import TaskFailed
from tests.test_jobs import TASK_ORDER, bundle, run_wheel_task, substituted

SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")


def task_parameters(tmp_path: Path, lake: Path) -> dict[str, tuple[dict, list[str]]]:
    """Each task of the bundle's job: its python_wheel_task and its parameters on ``lake``."""
    landing = tmp_path / "landing"
    landing.mkdir(exist_ok=True)
    values = {
        "landing": str(landing),
        "lake": str(lake),
        "config": str(tmp_path / "analyze.yml"),
        "catalog": "",
        "schema": "",
    }
    (tmp_path / "analyze.yml").write_text("storage: delta-rs\n")
    _, jobs = bundle()
    return {
        t["task_key"]: (t["python_wheel_task"], substituted(t["python_wheel_task"]["parameters"], values))
        for t in jobs["amqpscope"]["tasks"]
    }


def test_every_task_raises_on_an_unusable_lake(tmp_path, capsys):
    """The lake is a file: every stage refuses it before Spark starts (exit status 2); called as a
    python_wheel_task calls it, the entry point raises that one line instead of returning 2."""
    lake = tmp_path / "lake"
    lake.write_text("not a directory")
    tasks = task_parameters(tmp_path, lake)
    assert list(tasks) == TASK_ORDER
    for key, (wheel, parameters) in tasks.items():
        with pytest.raises(TaskFailed) as failed:
            run_wheel_task(wheel, parameters)
        err = capsys.readouterr().err
        assert failed.value.exit_code == 2, key
        assert str(failed.value) == f"amqpscope {key}: error: lake {lake} is not writable: File exists", key
        assert str(failed.value) in err  # the same line the command prints


def test_a_failure_inside_a_stage_raises_with_status_1(spark, tmp_path, capsys):
    """derive on a lake whose captures table has a damaged log: the stage fails (exit status 1)."""
    lake = tmp_path / "lake"
    log = lake / "captures" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("{damaged\n")
    wheel, parameters = task_parameters(tmp_path, lake)["derive"]
    with pytest.raises(TaskFailed) as failed:
        run_wheel_task(wheel, parameters)
    assert failed.value.exit_code == 1
    assert str(failed.value).startswith("amqpscope derive: error: ")
    assert str(failed.value) in capsys.readouterr().err


def test_a_usage_error_raises_with_status_2(capsys):
    """The message is the command's usage error as printed (argparse's last line)."""
    with pytest.raises(TaskFailed) as failed:
        entry.run_task("derive", ["--no-such-flag"])
    assert failed.value.exit_code == 2
    assert str(failed.value).endswith(": error: unrecognized arguments: --no-such-flag")
    assert capsys.readouterr().err.strip().splitlines()[-1] == str(failed.value)
    with pytest.raises(TaskFailed) as failed:
        entry.run_task("report", [])  # no --lake, no config: a required setting missing
    assert failed.value.exit_code == 2
    assert "--lake is required" in str(failed.value)
    assert capsys.readouterr().err.strip().splitlines()[-1] == str(failed.value)


def test_console_scripts_exit_non_zero(tmp_path):
    lake = tmp_path / "lake"
    lake.write_text("not a directory")
    for stage in TASK_ORDER:
        script = Path(sys.executable).with_name(f"amqpscope-{stage}")
        arguments = [str(tmp_path)] if stage == "ingest" else []
        done = subprocess.run(
            [str(script), *arguments, "--lake", str(lake)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, (stage, done.stderr)
        assert done.stderr.strip() == f"amqpscope {stage}: error: lake {lake} is not writable: File exists"


def test_spark_submit_of_the_entry_file_exits_non_zero(tmp_path):
    lake = tmp_path / "lake"
    lake.write_text("not a directory")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [str(SPARK_SUBMIT), "--master", "local[1]", entry.__file__, "derive", "--lake", str(lake)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    # spark-submit's PythonRunner passes the Python process's stderr on with its stdout.
    assert f"amqpscope derive: error: lake {lake} is not writable" in done.stdout
