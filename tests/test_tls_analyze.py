"""AMQPS captures through the command a user runs: with the clients' key logs a slow consumer and a
memory alarm over TLS are diagnosed as over plain TCP (and as the broker's own states say); without
them each connection is recorded and the headline says it is encrypted; and no secret of the key
logs reaches the lake, the logs or the report.

The commands run on the embedded engine (``--engine sail``), as the suite's whole captures end to
end do (docs/TESTING.md). Decryption is ingest's Python decode, the same code on either engine:
tests/test_rules_samples.py decodes the TLS samples with their key logs on classic Spark.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.cli.outcomes import ExitCode
from testbed.tls_scenarios import CAPTURES
from testbed.truth import expected_bottleneck
from tests.paths import SAMPLES

TLS = SAMPLES / "tls"
CAPTURE_FILES = sorted(TLS.glob("*.pcap"))
KEYLOGS = [c.with_suffix(".keylog") for c in CAPTURE_FILES]
# The same scenarios over plain TCP (samples/bottlenecks), for comparison.
PLAIN = {
    "slow-consumer-tls13": SAMPLES / "bottlenecks" / "slow-consumer.pcap",
    "memory-alarm-tls12": SAMPLES / "bottlenecks" / "memory-alarm.pcap",
}
# The slow reader over plain TCP (4 MB, not analysed again here): its top finding's rule, as
# tests/test_bottleneck_scenarios.py asserts it.
PLAIN_SLOW_READER_RULE = "diagnosis.client.not_reading"
HEALTHY = [c for c in CAPTURE_FILES if "qos-confirms" in c.stem or "credit" in c.stem]


def amqpscope(*args: str) -> subprocess.CompletedProcess[str]:
    """``amqpscope ARGS --engine sail`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "amqpscope.jobs.cli.cli", *args, "--engine", "sail"],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )


def truth_of(capture: Path) -> dict:
    return json.loads(capture.with_name(f"{capture.stem}.truth.json").read_text())


def table(lake: Path, name: str) -> list[dict]:
    return DeltaTable(str(lake / name)).to_pyarrow_table().to_pylist()


@pytest.fixture(scope="module")
def decrypted(tmp_path_factory) -> dict:
    """``amqpscope -v analyze`` of every TLS sample with every key log, and the plain twins."""
    root = tmp_path_factory.mktemp("tls-lake")
    keys = [arg for keylog in KEYLOGS for arg in ("--tls-keylog", str(keylog))]
    run = amqpscope(
        "-v",
        "analyze",
        *map(str, CAPTURE_FILES),
        *map(str, PLAIN.values()),
        "--lake",
        str(root / "lake"),
        "--report",
        str(root / "report.html"),
        "--data-docs",
        str(root / "docs"),
        "--progress",
        "never",
        *keys,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return {"root": root, "run": run, "diagnosis": {d["capture_id"]: d for d in table(root / "lake", "diagnosis")}}


@pytest.fixture(scope="module")
def undecrypted(tmp_path_factory) -> dict:
    """``amqpscope diagnose --json`` of every TLS sample without a key log."""
    root = tmp_path_factory.mktemp("tls-lake-no-keys")
    run = amqpscope("diagnose", *map(str, CAPTURE_FILES), "--lake", str(root), "--json", "--progress", "never")
    # The slow reader's client is seen in its TCP window without the keys: a bottleneck, exit 3.
    assert run.returncode == ExitCode.BOTTLENECK, run.stderr[-4000:]
    return {"root": root, "run": run, "answers": {a["capture_id"]: a for a in json.loads(run.stdout)["captures"]}}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_over_tls_the_bottleneck_is_the_one_over_plain_tcp_and_the_brokers(decrypted, name):
    tls, plain = TLS / f"{name}.pcap", PLAIN[name]
    expected, _entity = expected_bottleneck(truth_of(tls))  # from the broker's own states while it ran
    over_tls, over_tcp = decrypted["diagnosis"][capture_id(tls)], decrypted["diagnosis"][capture_id(plain)]
    assert over_tls["bottleneck"] == over_tcp["bottleneck"] == expected, over_tls["headline"]
    assert (over_tls["effect"], over_tls["entity_kind"]) == (over_tcp["effect"], over_tcp["entity_kind"])
    assert over_tls["encrypted_connections"] == 0 and "encrypted" not in over_tls["headline"]
    findings = {f["capture_id"]: f for f in table(decrypted["root"] / "lake", "bottlenecks") if f["rank"] == 1}
    assert findings[capture_id(tls)]["rule_id"] == findings[capture_id(plain)]["rule_id"]


def test_over_tls_the_slow_reader_is_the_client_as_over_plain_tcp(decrypted):
    capture = TLS / "slow-reader-tls13.pcap"
    expected, entity = expected_bottleneck(truth_of(capture))  # the client's own behaviour (broker_blind)
    diagnosis = decrypted["diagnosis"][capture_id(capture)]
    assert (diagnosis["bottleneck"], expected) == ("client", "client"), diagnosis["headline"]
    top = next(
        f
        for f in table(decrypted["root"] / "lake", "bottlenecks")
        if f["capture_id"] == capture_id(capture) and f["rank"] == 1
    )
    assert (top["rule_id"], top["client"]) == (PLAIN_SLOW_READER_RULE, entity)


@pytest.mark.parametrize("capture", [c for c in HEALTHY if "credit" in c.stem], ids=lambda p: p.stem)
def test_decrypted_healthy_traffic_has_no_bottleneck(decrypted, capture):
    diagnosis = decrypted["diagnosis"][capture_id(capture)]
    assert (diagnosis["bottleneck"], diagnosis["findings_count"], diagnosis["encrypted_connections"]) == ("none", 0, 0)


@pytest.mark.parametrize("capture", [c for c in HEALTHY if "qos-confirms" in c.stem], ids=lambda p: p.stem)
def test_decrypted_confirms_publisher_is_bound_by_its_own_confirm_waits_and_nothing_else(decrypted, capture):
    """The scenario's publisher is pika's BlockingChannel with confirms on: each basic_publish
    returns only once its confirm is back (testbed.scenarios.amqp091_qos_confirms), one message in
    flight, the client_scenarios.confirm_bound publisher. Over TLS its 200 publishes take 0.4-0.5 s,
    about half of it waiting, past the diagnosis's min_held_ms: the client's own confirm round trips
    are named, and nothing of the broker. (Over plain TCP the same 200 take under 0.03 s: too short
    to matter, no finding.)"""
    (facts,) = truth_of(capture)["ground_truth"].values()
    assert (facts["client_library"], facts["publisher_confirms"]) == ("pika", True)
    diagnosis = decrypted["diagnosis"][capture_id(capture)]
    assert (diagnosis["bottleneck"], diagnosis["encrypted_connections"]) == ("client", 0), diagnosis["headline"]
    findings = [f for f in table(decrypted["root"] / "lake", "bottlenecks") if f["capture_id"] == capture_id(capture)]
    assert [(f["rule_id"], f["channel"], f["queue"]) for f in findings] == [
        ("diagnosis.client.confirm_bound", facts["publish_channel"], facts["queue"])
    ]
    evidence = dict(findings[0]["evidence"])  # a Delta map reads as (key, value) pairs
    assert (int(evidence["publishes"]), int(evidence["in_flight_max"])) == (facts["messages_published"], 1)


def test_decrypted_connections_carry_their_tls_and_frames_their_records(decrypted):
    lake = decrypted["root"] / "lake"
    connections = [c for c in table(lake, "connections") if c["capture_id"] in {capture_id(p) for p in CAPTURE_FILES}]
    assert connections and {c["tls_status"] for c in connections} == {"decrypted"}
    assert {c["protocol"] for c in connections} == {"amqp-0-9-1", "amqp-1.0"}
    frames = DeltaTable(str(lake / "frames")).to_pyarrow_table(columns=["capture_id", "tls_record_number"]).to_pylist()
    tls_ids = {capture_id(p) for p in CAPTURE_FILES}
    assert all((f["tls_record_number"] is not None) == (f["capture_id"] in tls_ids) for f in frames)


@pytest.mark.parametrize("capture", HEALTHY, ids=lambda p: p.stem)
def test_without_keys_the_headline_says_encrypted(undecrypted, capture):
    answer = undecrypted["answers"][capture_id(capture)]
    version = f"TLS {CAPTURES[capture.stem].version}"
    assert answer["bottleneck"] == "encrypted"
    assert answer["headline"] == (
        f"1 connection is encrypted ({version}) and was not decoded: give --tls-keylog. "
        "No AMQP was decoded, and TCP showed no finding: nothing else could be judged."
    )
    assert answer["encrypted_connections"] == 1


@pytest.mark.parametrize("name", [*sorted(PLAIN), "slow-reader-tls13"])
def test_without_keys_the_bottleneck_captures_say_encrypted_and_what_tcp_shows(undecrypted, name):
    capture = TLS / f"{name}.pcap"
    answer = undecrypted["answers"][capture_id(capture)]
    count = answer["encrypted_connections"]
    # Every client connection of the scenario (fillers, publishers, consumers, setup and teardown).
    (facts,) = truth_of(capture)["ground_truth"].values()
    assert count >= len(facts["clients"]) >= 2
    sentence = (
        f"{count} connections are encrypted (TLS {CAPTURES[name].version}) and were not decoded: give --tls-keylog."
    )
    assert sentence in answer["headline"]
    # Only TCP can be judged: the AMQP-level verdicts (consumer, alarm) are not there without the keys;
    # a client that does not read is seen in its TCP window all the same.
    assert all(f["rule_id"].startswith(("diagnosis.encrypted.", "diagnosis.network.")) for f in answer["findings"])
    if name == "slow-reader-tls13":
        expected, entity = expected_bottleneck(truth_of(capture))
        assert (answer["bottleneck"], expected) == ("client", "client")
        top = answer["findings"][0]
        assert top["rule_id"] == "diagnosis.encrypted.client_not_reading" and top["client"] == entity
    else:
        assert answer["bottleneck"] in ("encrypted", "client", "connection", "network")


def test_every_tls_connection_is_recorded_without_keys(undecrypted):
    connections = table(undecrypted["root"], "connections")
    assert connections and {c["protocol"] for c in connections} == {"tls"}
    assert {c["tls_status"] for c in connections} == {"tls.no_key"}
    assert {c["server_port"] for c in connections} == {truth_of(p)["broker"]["port"] for p in CAPTURE_FILES}
    accounting = table(undecrypted["root"], "dq_summary")
    assert all(r["bytes_accounted"] for r in accounting) and sum(r["tls_connections"] for r in accounting) == len(
        connections
    )


def test_a_key_log_given_later_decrypts_what_was_answered_encrypted(undecrypted, tmp_path):
    capture = TLS / "amqp10-credit-tls13-chacha20.pcap"
    run = amqpscope(
        "diagnose",
        str(capture),
        "--lake",
        str(undecrypted["root"]),
        "--json",
        "--progress",
        "never",
        "--tls-keylog",
        str(capture.with_suffix(".keylog")),
    )
    assert run.returncode == 0, run.stderr[-4000:]
    (answer,) = json.loads(run.stdout)["captures"]
    assert (answer["bottleneck"], answer["encrypted_connections"]) == ("none", 0)


# -- no secret in the lake, the logs or the report ----------------------------------------------------


def _secrets() -> list[bytes]:
    found = []
    for keylog in KEYLOGS:
        for line in keylog.read_text().splitlines():
            if line and not line.startswith("#"):
                found.append(bytes.fromhex(line.split()[2]))
    return found


def _forms(secret: bytes) -> list[bytes]:
    """The ways a secret could be written: raw, hex either case, colon-separated hex."""
    text = secret.hex()
    return [secret, text.encode(), text.upper().encode(), ":".join(f"{b:02x}" for b in secret).encode()]


def _values(value: object) -> list[str]:
    """Every scalar of nested rows as text, binaries in hex."""
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (*_values(k), *_values(v))]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _values(v)]
    return [value.hex() if isinstance(value, bytes) else str(value)]


def test_no_secret_reaches_the_lake_the_logs_or_the_report(decrypted):
    secrets = _secrets()
    assert len(secrets) >= 2 * len(KEYLOGS)
    root = decrypted["root"]
    files = [p for p in root.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files) and (root / "report.html").exists()
    assert any("_delta_log" in p.parts for p in files)
    texts = {
        "stdout": decrypted["run"].stdout.encode(),
        "stderr (python and JVM logs)": decrypted["run"].stderr.encode(),
    }
    texts.update({str(p.relative_to(root)): p.read_bytes() for p in files})
    # And every value of every table, decompressed: a parquet page would hide a secret from a byte search.
    for folder in sorted((root / "lake").iterdir()):
        if (folder / "_delta_log").is_dir():
            texts[f"table {folder.name}"] = "\n".join(
                _values(DeltaTable(str(folder)).to_pyarrow_table().to_pylist())
            ).encode()
    assert b"localhost" in texts["table connections"]  # the search reads decoded values (the SNI is there)
    for where, content in texts.items():
        for secret in secrets:
            for form in _forms(secret):
                assert form not in content and form not in content.lower(), f"a key log secret in {where}"
