"""The AMQPS captures of ``samples/tls`` (RabbitMQ 3.10.8 over TLS 1.2 and 1.3, AMQP 0-9-1 and 1.0)
with the key logs their clients wrote: every frame and field as tshark decrypts and decodes them
with the same key log, and the counts the clients' own truth gives."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.rotation import resolve_parts
from testbed.tls_scenarios import CAPTURES
from testbed.tshark import decoded_frames, tshark_available
from tests.paths import SAMPLES
from tests.test_tshark_fields import compare_frames

TLS_SAMPLES = sorted((SAMPLES / "tls").glob("*.pcap"))


def truth_of(capture: Path) -> dict:
    return json.loads(capture.with_name(f"{capture.stem}.truth.json").read_text())


def rows(capture: Path, keys: bool = True) -> dict[str, list[dict]]:
    truth = truth_of(capture)
    out: dict[str, list[dict]] = {}
    keylog = [capture.with_suffix(".keylog")] if keys else []
    for kind, row in decode_capture(capture, "s", (truth["broker"]["port"],), tls_keylog=keylog):
        out.setdefault(kind, []).append(row)
    return out


def test_every_tls_capture_is_there_with_its_key_log_and_truth():
    assert {p.stem for p in TLS_SAMPLES} == set(CAPTURES)
    # Names that differ in more than digits: no two of them are taken for the parts of one rotated capture.
    assert len(resolve_parts(TLS_SAMPLES).captures) == len(TLS_SAMPLES)
    for capture in TLS_SAMPLES:
        truth = truth_of(capture)
        assert capture.with_suffix(".keylog").read_text().count("\n") >= 1
        assert truth["broker"]["tls"] and truth["tls"]["version"] == f"TLS {CAPTURES[capture.stem].version}"


@pytest.mark.tshark
@pytest.mark.skipif(not tshark_available(), reason="tshark not installed")
@pytest.mark.parametrize("capture", TLS_SAMPLES, ids=lambda p: p.stem)
def test_tls_samples_match_tshark_with_the_same_key_log(capture):
    port = truth_of(capture)["broker"]["port"]
    out = rows(capture)
    result = compare_frames(out["frames"], decoded_frames(capture, port, capture.with_suffix(".keylog")))
    assert result.mismatches == [] and result.known_wrong == []
    assert result.frames > 50 and result.values > 10 * result.frames
    assert out.get("quarantine", []) == []
    assert {(c["protocol"], c["tls_version"], c["tls_status"]) for c in out["connections"]} == {
        (out["frames"][0]["protocol"], truth_of(capture)["tls"]["version"], "decrypted")
    }
    if "amqp10" in capture.stem:
        assert result.deliveries == 200  # 100 sent, 100 received: each message's properties compared


def _methods(frames: list[dict]) -> Counter:
    return Counter((f["direction"], f["method"]) for f in frames if f["frame_type"] in ("method", "amqp"))


@pytest.mark.parametrize("capture", [p for p in TLS_SAMPLES if "qos-confirms" in p.stem], ids=lambda p: p.stem)
def test_the_091_samples_carry_what_the_client_did(capture):
    (facts,) = truth_of(capture)["ground_truth"].values()
    methods = _methods(rows(capture)["frames"])
    assert methods["c2s", "basic.publish"] == facts["messages_published"]
    assert methods["s2c", "basic.deliver"] == facts["deliveries_received"]
    assert methods["c2s", "basic.ack"] == facts["acks_sent"]
    assert methods["c2s", "basic.nack"] == facts["nacks_sent"]
    assert methods["s2c", "basic.ack"] >= 1  # confirms (several settled at once with multiple)


@pytest.mark.parametrize("capture", [p for p in TLS_SAMPLES if "amqp10" in p.stem], ids=lambda p: p.stem)
def test_the_10_samples_carry_what_the_client_did(capture):
    (facts,) = truth_of(capture)["ground_truth"].values()
    frames = rows(capture)["frames"]
    methods = _methods(frames)
    assert methods["c2s", "transfer"] == facts["messages_sent"]
    assert methods["s2c", "transfer"] == facts["messages_received"]
    grants = [f for f in frames if f["method"] == "flow" and f["direction"] == "c2s" and f.get("handle") is not None]
    assert len(grants) == facts["credit_grants"]
    assert {f["link_credit"] for f in grants} == {facts["credit_window"]}
    assert [f["mechanism"] for f in frames if f["method"] == "sasl-init"] == [facts["sasl_mechanism"]]


@pytest.mark.parametrize("capture", TLS_SAMPLES, ids=lambda p: p.stem)
def test_without_the_key_log_each_connection_is_recorded_not_decoded(capture):
    out = rows(capture, keys=False)
    assert "frames" not in out
    spec = CAPTURES[capture.stem]
    connections = out["connections"]
    assert {(c["protocol"], c["tls_version"], c["tls_sni"], c["tls_status"]) for c in connections} == {
        ("tls", f"TLS {spec.version}", "localhost", "tls.no_key")
    }
    for c in connections:
        assert c["c2s_bytes"] > 0 and c["s2c_bytes"] > 0
    assert {q["reason_id"] for q in out["quarantine"]} == {"tls.no_key"}
