"""``amqpscope watch``: rounds of ingest, derive and report in one process, each capture taken once.

The rows a watch writes are checked against the digests the code before the speed work wrote for
the same captures (tests/data/table_digests.json, as tests/test_same_rows.py reads them).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.stages import landing as landing_module
from amqpscope.jobs.stages import watch as watch_module
from amqpscope.jobs.stages.landing import landing_files
from amqpscope.jobs.stages.watch import stop_requests, watch
from testbed.processes import descendants, kill_all, wait_gone, watch_process
from tests.table_digests import table_digests
from tests.test_same_rows import EXPECTED, differences

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
FIRST, SECOND = SAMPLES / "amqp091-qos-confirms.pcap", SAMPLES / "amqp10-credit.pcap"


def test_each_capture_is_taken_once_and_a_failed_round_is_done_again(spark, tmp_path, monkeypatch):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    config = AnalyzeConfig(lake=lake, data_docs=tmp_path / "docs")
    shutil.copy(FIRST, landing / FIRST.name)
    (landing / "notes.pcap").write_text("not a capture")
    first, second = capture_id(FIRST), capture_id(SECOND)

    hashed: list[str] = []
    real_capture_id = landing_module.capture_id
    monkeypatch.setattr(
        landing_module, "capture_id", lambda path: hashed.append(Path(path).name) or real_capture_id(path)
    )
    real_derive = watch_module.derive_lake
    derives = []

    def derive_failing_first(*args, **kwargs):
        derives.append(1)
        if len(derives) == 1:
            raise RuntimeError("the disk went away")
        return real_derive(*args, **kwargs)

    monkeypatch.setattr(watch_module, "derive_lake", derive_failing_first)
    rounds = []
    before = persisted(spark)  # other tests' in this session
    kept_after = []  # the RDDs kept in the JVM after each round (local checkpoints, persisted rows)

    def each(done):
        rounds.append(done)
        kept_after.append(persisted(spark) - before)
        if done.number == 2:  # a capture lands between two rounds
            shutil.copy(SECOND, landing / SECOND.name)

    answers = []  # (rounds ended before, the captures answered), as soon as their diagnosis is written

    def answered(diagnoses):
        answers.append((len(rounds), [d["capture_id"] for d in diagnoses]))

    kept = watch(spark, landing, config, interval=0, settle=0, rounds=4, each=each, answered=answered)

    assert [r.number for r in rounds] == [1, 2, 3, 4]
    one, two, three, four = rounds
    # Round 1 ingested the first capture, recorded the bad file, and failed in derive.
    assert one.ingested.ingested == (first,)
    assert one.ingested.failed == (("notes.pcap", "not a pcap or pcapng file"),)
    assert str(one.error) == "the disk went away" and one.derived is None and one.report is None
    # Round 2 did what round 1 left: the derive and the report of the first capture.
    assert two.error is None and two.ingested.ingested == () and two.derived.derived == (first,)
    assert two.report.captures == (first,) and two.report.report.is_file()
    assert [d["capture_id"] for d in two.diagnoses] == [first]
    # Round 3 took the capture that landed after round 2, and only it.
    assert three.error is None and three.ingested.ingested == (second,) and three.derived.derived == (second,)
    assert three.report.captures == (second,)
    assert [d["capture_id"] for d in three.diagnoses] == [second]
    # Round 4 found nothing new.
    assert four.error is None and four.ingested.ingested == () and four.derived.derived == ()
    assert four.report is None and four.diagnoses == ()
    assert answers == [(1, [first]), (2, [second])]  # during rounds 2 and 3
    assert kept == [one, two, three]  # the rounds that failed or took a capture
    # What a round kept in the JVM is gone once the next has ended: a watch of weeks does not grow.
    # (Rounds 2 and 3 checkpoint their shared results; round 4 has nothing to derive.)
    assert kept_after[1] & kept_after[2] == set() and kept_after[3] == set()
    # Each file was read once in four rounds: unchanged files are remembered from round to round.
    assert sorted(hashed) == sorted([FIRST.name, SECOND.name, "notes.pcap"])

    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))["tables"]

    def of_both(digests: dict) -> dict:  # the bad file's rows (captures, quarantine) are not in the digests
        return {
            t: {c: d for c, d in by.items() if c in (first, second)} for t, by in digests.items() if t != "captures"
        }

    got, want = of_both(table_digests(spark, lake, tuple(t for t in expected if t != "captures"))), of_both(expected)
    assert all(want[t] for t in ("frames", "flow_intervals", "diagnosis"))  # the digests cover both
    assert differences(got, want) == []


def persisted(spark) -> set[int]:
    """The ids of the RDDs Spark keeps (``SparkContext.getPersistentRDDs``)."""
    return set(spark.sparkContext._jsc.getPersistentRDDs().keys())


def test_a_file_is_taken_once_it_has_settled(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    capture = landing / "rotating.pcap"
    shutil.copy(FIRST, capture)
    assert landing_files(landing, settled_for=60) == []  # just written: tcpdump may still be at it
    past = time.time() - 120
    os.utime(capture, (past, past))
    assert landing_files(landing, settled_for=60) == [capture]
    capture.write_bytes(capture.read_bytes() + b"\0")  # written to again
    assert landing_files(landing, settled_for=60) == []
    assert landing_files(landing) == [capture]  # no settling asked: every file


def test_a_signal_asks_for_a_stop_and_a_second_one_stops_at_once():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with stop_requests() as stop:
        assert not stop.is_set()
        signal.raise_signal(signal.SIGTERM)
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _line(stream, proc: subprocess.Popen, seconds: float) -> str:
    """The next line of ``stream``, waiting at most ``seconds`` (the process must still run)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 1.0)
        if ready:
            return stream.readline()
        assert proc.poll() is None, f"watch ended (exit {proc.returncode}) before its first round ended"
    pytest.fail(f"no round ended in {seconds} s")


def test_the_command_answers_each_round_and_ends_on_sigterm(tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    shutil.copy(SECOND, landing / SECOND.name)
    proc = watch_process(landing, lake, interval=3600)
    below: set = set()
    try:
        first_round = json.loads(_line(proc.stdout, proc, 600))
        below = descendants(proc.pid)
        assert below, "the watch's JVM is a process below it"
        os.kill(proc.pid, signal.SIGTERM)  # while it waits for the next round
        assert proc.wait(timeout=300) == 0
        stderr = proc.stderr.read()
        # The JVM exits once its standard input closes with the watch: soon after it, not with it.
        outlived = wait_gone(below, timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        kill_all(below)
        proc.stdout.close()
        proc.stderr.close()
    cid = capture_id(SECOND)
    assert first_round["round"] == 1 and first_round["error"] is None
    assert first_round["ingested"] == [cid] and first_round["derived"] == [cid]
    assert Path(first_round["report"]).is_file()
    headline = first_round["diagnosis"][cid]["headline"]
    assert f"{cid[:12]}: {headline}" in stderr.splitlines()
    assert "SIGTERM: stopping after this round" in stderr
    assert outlived == set(), "a process of the watch outlived it"
