"""The fuzz target (``tests.fuzzing.run``) for a bounded, deterministic run, and every input a fuzz
run ever kept (``tests/fuzz_crashes/``), replayed as a regression test.

``run`` raises when anything escapes the decoder, when bytes go unaccounted for, or when a row
does not fit its Arrow schema. The long run is ``make fuzz`` (``tests/fuzz.py``).
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.analyze import analyze
from tests import amqp_bytes as b
from tests.cuts import packet_count
from tests.fuzzing import CRASHES, ISSUE_CASES, Case, corpus, generated, generated_tls, mutated, run, tls_seeds
from tests.paths import BOTTLENECK_SCENARIOS, HEALTHY_SAMPLES

# Derandomized (the same examples every run), no per-example deadline (never a timing assertion in
# a unit test: ``make fuzz`` measures time per input), about a minute in all.
BOUNDED = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=250,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
HEADERS = [b.HEADER_091, b.HEADER_10, b.HEADER_10_SASL, b"AMQP\x00\x00\x09", b""]


@BOUNDED
@given(st.sampled_from(HEADERS), st.binary(max_size=4000), st.binary(max_size=600), st.integers(1, 1460), st.booleans())
def test_any_bytes_after_a_protocol_header(header, c2s, s2c, segment, handshake):
    run(Case(header + c2s, s2c, segment, handshake))


# The generators draw many numbers an input: from a plain seeded generator (Hypothesis picks the seed),
# as recording each draw for shrinking would cost more than the decode.
SEEDS = st.integers(0, 2**32 - 1)


@BOUNDED
@given(SEEDS)
def test_mutated_real_streams(seed: int):
    run(mutated(random.Random(seed)))


@BOUNDED
@given(SEEDS)
def test_structure_aware_frames_of_both_type_systems(seed: int):
    run(generated(random.Random(seed)))


@BOUNDED
@given(SEEDS)
def test_damaged_and_made_up_tls_records(seed: int):
    run(generated_tls(random.Random(seed)))


def test_the_tls_seeds_decrypt_whole():
    for case in tls_seeds():
        out = run(case)
        assert out["quarantine"] == [] and len(out["frames"]) > 20
        assert out["connections"][0]["tls_status"] == "decrypted"


def test_the_seed_corpus_decodes_cleanly_where_it_is_real_traffic():
    seeds = corpus()
    real = seeds[: len(seeds) - len(ISSUE_CASES)]
    assert len(real) >= 6  # both directions of the samples' connections
    for case in real:
        out = run(case)
        # The streams are cut at a few kilobytes: only the frame the cut falls in may be left over.
        assert len(out["quarantine"]) <= 2
        assert all(q["reason"] == "unframeable bytes: stream ended inside a frame" for q in out["quarantine"])
        assert len(out["frames"]) > 10


KEPT = sorted(CRASHES.glob("*.json"))


@pytest.mark.parametrize("path", KEPT + list(ISSUE_CASES), ids=lambda p: p.stem if isinstance(p, Path) else p)
def test_kept_findings_and_issue_cases_decode_within_the_invariants(path):
    if isinstance(path, Path):
        case = Case.from_json(json.dumps(json.loads(path.read_text())["case"]))
    else:
        case = ISSUE_CASES[path]
    run(case)


def test_cut_and_truncated_real_captures_are_diagnosed(spark, tmp_path):
    # The diagnosis of captures that begin mid-connection (issue 62), seeded: three real captures
    # cut at a random packet, and one of them with every packet truncated to 96 bytes as well
    # (snapshot length: payload missing). Every one gets its diagnosis row; no stage fails.
    chance = random.Random("62:cuts")
    chosen = chance.sample([*HEALTHY_SAMPLES, *BOTTLENECK_SCENARIOS], 3)
    files = []
    for n, capture in enumerate(chosen):
        first = chance.randrange(2, packet_count(capture))
        out = tmp_path / f"cut-{n}.pcap"
        subprocess.run(["editcap", "-F", "pcap", "-r", str(capture), str(out), f"{first}-{10**9}"], check=True)
        files.append(out)
    short = tmp_path / "cut-0-truncated.pcap"
    subprocess.run(["editcap", "-s", "96", str(files[0]), str(short)], check=True)
    files.append(short)
    lake = tmp_path / "lake"
    config = AnalyzeConfig(lake=lake, report=lake / "report.html", data_docs=lake / "data_docs", group_rotated=False)
    analyze(spark, [str(f) for f in files], config)
    diagnosed = {r.capture_id: r.bottleneck for r in Lake(spark, lake).read("diagnosis").collect()}
    assert sorted(diagnosed) == sorted(capture_id(f) for f in files)
    assert all(diagnosed.values())
