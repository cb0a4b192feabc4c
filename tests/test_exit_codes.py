"""Exit codes of every command: 0 ok, 1 a failure inside a stage, 2 a usage error or an unreadable
input; said in --help and the README, mapped in one place (``jobs.cli.ExitCode``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amqpscope.jobs import cli
from amqpscope.jobs.cli import DIAGNOSE_EXIT_MEANINGS, EXIT_MEANINGS, ExitCode, build_parser, main
from tests.paths import SAMPLES

README = Path(__file__).resolve().parent.parent / "README.md"
SAMPLE = SAMPLES / "amqp10-credit.pcap"


def test_analyze_without_a_lake_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["analyze", str(SAMPLE)]) == ExitCode.USAGE == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: amqpscope analyze ")
    assert err.rstrip().endswith("amqpscope analyze: error: --lake is required (or lake: in --config)")


def test_diagnose_of_a_directory_says_it_is_one(tmp_path, capsys):
    assert main(["diagnose", str(SAMPLES), "--lake", str(tmp_path / "lake")]) == 2
    err = capsys.readouterr().err
    assert f"{SAMPLES}: argument: is a directory" in err and "no such capture file" not in err
    assert not (tmp_path / "lake").exists()


def test_diagnose_config_without_a_lake_is_a_usage_error(tmp_path, capsys):
    config = tmp_path / "settings.yml"
    config.write_text("ports: [5672]\n")
    assert main(["diagnose", str(SAMPLE), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: amqpscope diagnose ") and "--config without a lake" in err


def test_an_unreadable_settings_file_is_an_unreadable_input(tmp_path, capsys):
    config = tmp_path / "settings.yml"
    config.write_text("lake: [unclosed\n")
    assert main(["analyze", str(SAMPLE), "--config", str(config)]) == 2
    assert "amqpscope analyze: error: " in capsys.readouterr().err


def test_an_unreadable_capture_is_an_unreadable_input(tmp_path, capsys):
    bogus = tmp_path / "notes.pcap"
    bogus.write_text("not a capture")
    assert main(["analyze", str(bogus), "--lake", str(tmp_path / "lake")]) == 2
    assert f"{bogus}: file header: not a pcap or pcapng file" in capsys.readouterr().err


def test_a_failure_inside_a_stage_exits_1(tmp_path, capsys, monkeypatch):
    from amqpscope.jobs import analyze
    from amqpscope.jobs.stages import StageFailed

    def fail(*_args, **_kwargs):
        raise StageFailed("stage ingest, table frames", OSError("disk full"))

    monkeypatch.setattr(analyze, "main", fail)
    assert main(["analyze", str(SAMPLE), "--lake", str(tmp_path / "lake")]) == ExitCode.FAILED == 1
    err = capsys.readouterr().err
    assert err.startswith("amqpscope analyze: error: stage ingest, table frames: OSError: disk full")


def test_argparse_usage_errors_exit_2_too(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["analyze"])
    assert exited.value.code == ExitCode.USAGE


def test_every_exit_code_is_in_help_and_in_the_readme():
    parser = build_parser()
    helps = [parser.format_help()] + [p.format_help() for p in parser._subparsers._group_actions[0].choices.values()]
    readme = README.read_text(encoding="utf-8")
    table = dict(re.findall(r"^\s*\| `(\d+)` \| (.+?) \|$", readme, flags=re.MULTILINE))
    assert {int(code) for code in table} == {int(code) for code in ExitCode}
    commands = parser._subparsers._group_actions[0].choices
    diagnose_help = " ".join(commands["diagnose"].format_help().split())
    for code, meaning in EXIT_MEANINGS.items():
        shown = [h for h in helps if code not in DIAGNOSE_EXIT_MEANINGS or h != commands["diagnose"].format_help()]
        assert all(f"{int(code)} {' '.join(meaning.split())}" in " ".join(h.split()) for h in shown)
        assert table[str(int(code))].split(" (`diagnose`: ")[0] == meaning
    assert set(EXIT_MEANINGS) | set(DIAGNOSE_EXIT_MEANINGS) == set(ExitCode)
    for code, meaning in DIAGNOSE_EXIT_MEANINGS.items():
        assert f"{int(code)} {' '.join(meaning.split())}" in diagnose_help
        expected = (
            f"{EXIT_MEANINGS[code]} (`diagnose`: {meaning})" if code in EXIT_MEANINGS else f"`diagnose` only: {meaning}"
        )
        assert table[str(int(code))] == expected


def test_outcomes_become_codes_in_one_place():
    assert cli.exit_code(cli.UsageError("x")) == ExitCode.USAGE
    assert cli.exit_code(FileNotFoundError("x")) == ExitCode.USAGE
    assert cli.exit_code(RuntimeError("x")) == ExitCode.FAILED
