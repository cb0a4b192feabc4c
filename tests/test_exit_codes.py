"""Exit codes of every command: 0 ok, 1 a failure inside a stage, 2 a usage error or an unreadable
input; said in --help and the README, mapped in one place (``jobs.cli.outcomes.ExitCode``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amqpscope.jobs.cli import cli
from amqpscope.jobs.cli.cli import build_parser, main
from amqpscope.jobs.cli.outcomes import COMMAND_EXIT_MEANINGS, EXIT_MEANINGS, ExitCode
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
    from amqpscope.jobs.stages import analyze
    from amqpscope.jobs.stages.stages import StageFailed

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
    commands = parser._subparsers._group_actions[0].choices
    helps = {"amqpscope": parser.format_help(), **{name: p.format_help() for name, p in commands.items()}}
    helps = {name: " ".join(text.split()) for name, text in helps.items()}
    readme = README.read_text(encoding="utf-8")
    table = dict(re.findall(r"^\s*\| `(\d+)` \| (.+?) \|$", readme, flags=re.MULTILINE))
    assert {int(code) for code in table} == {int(code) for code in ExitCode}
    assert set(EXIT_MEANINGS).union(*COMMAND_EXIT_MEANINGS.values()) == set(ExitCode)
    for code, meaning in EXIT_MEANINGS.items():
        # Every help says what the code means, but a command's own meaning of it replaces the common one.
        shown = [text for name, text in helps.items() if code not in COMMAND_EXIT_MEANINGS.get(name, {})]
        assert all(f"{int(code)} {' '.join(meaning.split())}" in text for text in shown)
        assert table[str(int(code))].split(" (`")[0] == meaning
    for command, meanings in COMMAND_EXIT_MEANINGS.items():
        for code, meaning in meanings.items():
            assert f"{int(code)} {' '.join(meaning.split())}" in helps[command]
            own = f"`{command}`: {meaning}"
            expected = f"{EXIT_MEANINGS[code]} ({own})" if code in EXIT_MEANINGS else f"`{command}` only: {meaning}"
            assert table[str(int(code))] == expected


def test_outcomes_become_codes_in_one_place():
    assert cli.exit_code(cli.UsageError("x")) == ExitCode.USAGE
    assert cli.exit_code(FileNotFoundError("x")) == ExitCode.USAGE
    assert cli.exit_code(RuntimeError("x")) == ExitCode.FAILED
