"""How a key log is given: ``--tls-keylog`` (repeatable) on the commands that decode, ``tls_keylog:`` in
the YAML; a missing or empty one is a usage error naming it, before any work."""

from __future__ import annotations

import pytest

from amqpscope.conf.settings import AnalyzeConfig, load_yaml
from amqpscope.jobs.cli import cli
from amqpscope.jobs.cli.diagnose import exit_code
from tests.paths import SAMPLES

KEYLOG = SAMPLES / "tls" / "amqp10-credit-tls13-chacha20.keylog"
CAPTURE = SAMPLES / "tls" / "amqp10-credit-tls13-chacha20.pcap"


def test_the_flag_is_repeatable_and_on_every_command_that_decodes():
    parser = cli.build_parser()
    args = parser.parse_args(["analyze", str(CAPTURE), "--lake", "l", "--tls-keylog", str(KEYLOG), "--tls-keylog", "b"])
    assert [str(p) for p in args.tls_keylog] == [str(KEYLOG), "b"]
    for command in (["ingest", "landing", "--lake", "l"], ["diagnose", str(CAPTURE)]):
        assert parser.parse_args([*command, "--tls-keylog", str(KEYLOG)]).tls_keylog == [KEYLOG]
    for command in ("analyze", "ingest", "diagnose"):
        assert "--tls-keylog" in parser._subparsers._group_actions[0].choices[command].format_help()


def test_yaml_and_flags_give_paths(tmp_path):
    settings = tmp_path / "analyze.yml"
    settings.write_text(f"lake: {tmp_path}/lake\ntls_keylog: [{KEYLOG}]\n")
    config = AnalyzeConfig(**load_yaml(settings))
    assert config.tls_keylog == (KEYLOG,)
    assert AnalyzeConfig(lake=tmp_path, tls_keylog=str(KEYLOG)).tls_keylog == (KEYLOG,)
    assert AnalyzeConfig(lake=tmp_path).tls_keylog == ()
    assert 5671 in AnalyzeConfig(lake=tmp_path).ports


def test_a_missing_or_empty_key_log_is_a_usage_error_naming_it(tmp_path, capsys):
    missing = tmp_path / "absent.keylog"
    assert cli.main(["analyze", str(CAPTURE), "--lake", str(tmp_path / "l"), "--tls-keylog", str(missing)]) == 2
    assert capsys.readouterr().err == f"amqpscope analyze: error: TLS key log {missing}: no such file\n"
    empty = tmp_path / "empty.keylog"
    empty.write_text("# nothing logged\n")
    assert cli.main(["diagnose", str(CAPTURE), "--tls-keylog", str(empty)]) == 2
    assert "no CLIENT_RANDOM or TLS 1.3 traffic secret lines" in capsys.readouterr().err
    assert not (tmp_path / "l").exists()  # nothing was started


@pytest.mark.parametrize(
    "bottlenecks, code",
    [
        (["encrypted"], 4),
        (["encrypted", "no_amqp"], 4),
        (["encrypted", "none"], 0),
        (["none"], 0),
        ([], 0),
    ],
)
def test_diagnose_exits_4_when_no_capture_could_be_judged(bottlenecks, code):
    assert exit_code([{"bottleneck": b} for b in bottlenecks]) == code
