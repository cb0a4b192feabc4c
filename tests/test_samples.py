"""The bundled real captures, analysed end to end and checked against tshark and the ground truth.

tshark (Wireshark 4.0's AMQP dissector) is the reference decoder; the ground truth is what the
clients that made the capture did (``samples/*.truth.json``).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.lake.read import read_table
from amqpscope.jobs.stages.analyze import analyze
from amqpscope.pipelines import tables as lake_tables
from testbed import tshark
from tests.paths import SAMPLE_CAPTURES as CAPTURES
from tests.paths import SAMPLES

ALL_TABLES = (*lake_tables.BRONZE, *lake_tables.DERIVED)


def truth(capture: Path) -> dict:
    return json.loads(capture.with_name(capture.name.rsplit(".", 1)[0] + ".truth.json").read_text())


@pytest.fixture(scope="module")
def lake(samples_lake):
    """All samples analysed once into one lake (conftest.samples_lake); the run's result is kept."""
    return samples_lake


def our_frames(spark, config, capture: Path) -> list:
    frames = Lake(spark, config.lake).read("frames").filter(F.col("capture_id") == capture_id(capture))
    return frames.orderBy("connection_id", "frame_index").collect()


def frame_name(row) -> str:
    """Our frame named the way testbed.tshark names tshark's: method, else the frame type."""
    if row.frame_type in ("method", "amqp", "sasl"):
        return row.method
    return row.frame_type


def test_samples_exist_with_ground_truth():
    assert [c.name for c in CAPTURES] == ["amqp091-qos-confirms.pcap", "amqp10-credit.pcap", "mixed.pcapng"]
    assert all(truth(c)["ground_truth"] for c in CAPTURES)
    assert sum(c.stat().st_size for c in SAMPLES.iterdir()) <= 3 * 1024 * 1024


@pytest.mark.tshark
@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_frames_match_tshark_packet_by_packet(spark, lake, capture):
    _root, config, _result = lake
    port = truth(capture)["broker"]["port"]
    reference = tshark.decoded_frames(capture, port)
    ours = our_frames(spark, config, capture)
    sender = {"c2s": "client", "s2c": "broker"}
    # tshark 4.0 shows no 0-9-1 protocol header as an AMQP frame: left out of the comparison.
    ours_seq = sorted(
        (r.packet_number, sender[r.direction], frame_name(r))
        for r in ours
        if not (r.protocol == "amqp-0-9-1" and r.frame_type == "protocol-header")
    )
    theirs_seq = sorted((f.frame_number, f.sender, f.name) for f in reference)
    assert ours_seq == theirs_seq
    # Frames per type, the acceptance view: the same counts, and not empty.
    assert Counter((s, n) for _p, s, n in ours_seq) == tshark.frame_counts(reference)
    assert len(ours_seq) > 100


@pytest.mark.tshark
@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_flow_control_fields_match_tshark(spark, lake, capture):
    _root, config, _result = lake
    reference = tshark.decoded_frames(capture, truth(capture)["broker"]["port"])
    ours = our_frames(spark, config, capture)
    # (frame name, our column, tshark field): compared in capture order, value by value.
    fields = [
        ("basic.ack", "delivery_tag", "amqp.method.arguments.delivery_tag"),
        ("basic.ack", "multiple", "amqp.method.arguments.multiple"),
        ("basic.deliver", "delivery_tag", "amqp.method.arguments.delivery_tag"),
        ("basic.qos", "prefetch_count", "amqp.method.arguments.prefetch_count"),
        ("flow", "link_credit", "amqp.performative.arguments.linkCredit"),
        ("flow", "delivery_count", "amqp.performative.arguments.deliveryCount"),
        ("transfer", "delivery_id", "amqp.performative.arguments.deliveryId"),
        ("transfer", "handle", "amqp.performative.arguments.handle"),
    ]
    for name, column, field in fields:
        mine = [
            _as_text(getattr(r, column))
            for r in sorted(ours, key=lambda r: (r.packet_number, r.stream_offset))
            if frame_name(r) == name
        ]
        theirs = [f.fields.get(field) for f in reference if f.name == name]
        assert mine == [_tshark_text(v) for v in theirs], f"{name}.{column}"


def _as_text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _tshark_text(value: str | None) -> str | None:
    if value in ("True", "False"):
        return "1" if value == "True" else "0"
    return value


def test_ground_truth_holds_in_the_tables(spark, lake):
    _root, config, _result = lake
    store = Lake(spark, config.lake)
    frames = store.read("frames")
    for capture in CAPTURES:
        cid = capture_id(capture)
        counts = {
            (r.direction, r.method): r["count"]
            for r in frames.filter(F.col("capture_id") == cid).groupBy("direction", "method").count().collect()
        }
        for gt in truth(capture)["ground_truth"].values():
            if gt["protocol"] == "amqp-0-9-1":
                assert counts[("c2s", "basic.publish")] == gt["messages_published"]
                assert counts[("s2c", "basic.deliver")] == gt["deliveries_received"]
                assert counts[("c2s", "basic.ack")] == gt["acks_sent"]
                assert counts[("c2s", "basic.nack")] == gt["nacks_sent"]
                assert counts[("s2c", "basic.ack")] == gt["confirms_acked"]
                [tune_ok] = frames.filter(
                    (F.col("capture_id") == cid) & (F.col("method") == "connection.tune-ok")
                ).collect()
                assert (tune_ok.frame_max, tune_ok.heartbeat, tune_ok.channel_max) == (
                    gt["frame_max"],
                    gt["heartbeat"],
                    gt["channel_max"],
                )
                unacked = store.read("channel_unacked").filter(F.col("capture_id") == cid)
                top = unacked.agg(F.max("unacked"), F.max("prefetch_count")).first()
                # The broker never exceeds the consumer's prefetch, and the consumer filled it.
                assert top[0] == gt["prefetch_count"] and top[1] == gt["prefetch_count"]
            else:
                assert counts[("c2s", "transfer")] == gt["messages_sent"]
                assert counts[("s2c", "transfer")] == gt["messages_received"]
                grants = store.read("link_credit").filter(
                    (F.col("capture_id") == cid)
                    & (F.col("method") == "flow")
                    & (F.col("sender_side") == "server")
                    & (F.col("direction") == "c2s")
                )
                assert [r.link_credit_rcv for r in grants.collect()] == [gt["credit_window"]] * gt["credit_grants"]
                deliveries = store.read("link_credit").filter(
                    (F.col("capture_id") == cid) & F.col("is_new_delivery") & (F.col("sender_side") == "server")
                )
                # The broker used the receiver's credit down to 0 and never below.
                assert deliveries.agg(F.min("link_credit_snd")).first()[0] == 0
                assert deliveries.count() == gt["messages_received"]


def test_no_protocol_violations_in_clean_traffic(spark, lake):
    _root, config, result = lake
    assert Lake(spark, config.lake).read("violations").count() == 0
    assert result.suites_passed


def test_tables_are_delta_and_rerun_changes_nothing(spark, lake):
    root, config, first = lake
    for table in ALL_TABLES:
        assert read_table(str(root / table)).num_rows == first.row_counts[table]
    again = analyze(spark, [str(c) for c in CAPTURES], config)
    assert again.row_counts == first.row_counts
    assert first.row_counts["frames"] > 3000


def test_report_and_data_docs_written(lake):
    _root, config, result = lake
    html = result.report.read_text()
    assert "basic.publish" in html and "transfer" in html
    assert result.data_docs_index is not None and Path(result.data_docs_index).is_file()


def test_no_credentials_reach_any_table(spark, lake):
    _root, config, _result = lake
    # guest/guest are the testbed's credentials: the password must be nowhere in the lake.
    frames = Lake(spark, config.lake).read("frames")
    leaked = frames.filter(F.to_json(F.struct(*frames.columns)).contains("\\u0000guest")).count()
    assert leaked == 0
    start_ok = frames.filter(F.col("method").isin("connection.start-ok", "sasl-init")).collect()
    assert {r.mechanism for r in start_ok} == {"PLAIN"}
    assert all("response" not in r.arguments and "initial-response" not in r.arguments for r in start_ok)
