"""The least-work run of benchmarks/end_to_end.py stands for analyze's ingest with a decoder that
costs nothing: its stand-in decode task must hand Spark exactly the rows analyze decoded, or the
floor it measures is not the floor of analyze's work."""

from __future__ import annotations

import shutil

import pytest
from pyspark import cloudpickle

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.expectations.catalogue import load_rules
from amqpscope.jobs.lake import runs
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages import decode as decode_job
from amqpscope.jobs.stages.decode import decode_tables, resolve_captures
from amqpscope.schemas.runs import OUTCOME_OK
from tests.benchmark_scripts import benchmark_script
from tests.paths import SAMPLE_CAPTURES
from tests.table_digests import sorted_rows


@pytest.fixture(scope="module")
def end_to_end():
    with benchmark_script("end_to_end") as module:
        cloudpickle.register_pickle_by_value(module)  # the Python workers cannot import it by name
        yield module
        cloudpickle.unregister_pickle_by_value(module)


def test_stand_in_decoder_gives_the_rows_analyze_decoded(spark, samples_lake, end_to_end, monkeypatch):
    root, config, _ = samples_lake
    stored = Lake(spark, root)
    captures = resolve_captures([str(c) for c in SAMPLE_CAPTURES], config.group_rotated)
    ids = [c.capture_id for c in captures]
    monkeypatch.setattr(decode_job, "_decode_connections", end_to_end._stored_rows_decoder(str(root)))
    # Two byte ranges a capture at least (the shuffled path a large capture takes) and one a capture.
    for range_bytes in (decode_job.DEFAULT_RANGE_BYTES, 64 * 1024):
        decoded, persisted = decode_tables(spark, captures, config.ports, range_bytes=range_bytes)
        try:
            for name in ("frames", "connections", "tcp_segments", "quarantine"):
                table = stored.read(name)
                columns = table.columns
                expected = table.filter(table.capture_id.isin(ids))
                assert sorted_rows(decoded[name], columns) == sorted_rows(expected, columns), (name, range_bytes)
            assert decoded["frames"].count() > 1000
        finally:
            for df in persisted:
                df.unpersist()


def test_python_work_validates_every_suite_and_reports_every_capture(samples_lake, end_to_end, tmp_path):
    # The sample's CPU floor adds this run's CPU to the least work's: it must do analyze's work
    # outside Spark whole (every table's suite, the report of every capture), on a copy of the lake.
    root, _, _ = samples_lake
    catalogue = load_rules()
    done = end_to_end._child_python(str(root), str(tmp_path / "lake"))
    assert done["rules"] == len(catalogue)
    assert done["suites"] == len({rule.table for rule in catalogue})
    page = (tmp_path / "lake" / "report.html").read_text(encoding="utf-8")
    for capture in SAMPLE_CAPTURES:
        assert capture.name in page
    # Each figure is rounded to 0.01 s on its own: the three roundings may take up to 0.015 s apart
    # (5.51 against 5.23 + 0.28 = 5.510000000000001 was seen).
    assert done["work_cpu_s"] >= done["gx_validation_cpu_s"] + done["report_cpu_s"] - 0.015
    assert not (root / "_bench_data_docs").exists()  # the analysed lake is left as it was


def test_the_answer_floor_validates_every_suite_reports_every_capture_and_marks_the_run(
    spark, samples_lake, end_to_end, tmp_path
):
    # The least work with the answer's work (one-answer-floor) must do all of it after the tables
    # are written: every table's suite in the Data Docs, every capture reported, the run marked.
    root, _, _ = samples_lake
    shutil.copytree(root, tmp_path / "lake")
    config = AnalyzeConfig(lake=tmp_path / "lake", report=tmp_path / "report.html")
    run_id = runs.new_run_id()
    lake = Lake.of(spark, config, run_id=run_id)
    ids = [c.capture_id for c in resolve_captures([str(c) for c in SAMPLE_CAPTURES], config.group_rotated)]
    end_to_end._answer_without_work(lake, run_id, ids, config)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    for capture in SAMPLE_CAPTURES:
        assert capture.name in page
    index = next(config.data_docs_dir.rglob("index.html")).read_text(encoding="utf-8")
    for table in {rule.table for rule in load_rules()}:
        assert f"amqpscope.{table}" in index
    marked = runs.stage_runs(lake, ids)
    for cid in ids:
        for stage in ("derive", "report"):
            assert (marked[cid, stage].run_id, marked[cid, stage].outcome) == (run_id, OUTCOME_OK), (cid, stage)
