"""Rotated captures (tcpdump -C / -G / -W, editcap -c): the parts decode as one capture, exactly as
the unrotated file does, and a capture that grows by a part replaces what was stored of it."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.pcap import capture_id
from amqpscope.ingest.ranges import read_container, read_range, split
from amqpscope.ingest.rotation import describe_part, resolve_parts, rotation_key
from amqpscope.jobs.cli.cli import main as cli_main
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.decode import decode_tables, resolve_captures
from amqpscope.jobs.stages.landing import ingest_landing
from amqpscope.jobs.stages.progress import Progress
from amqpscope.pipelines.accounting import assert_bytes_accounted, byte_accounting

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
SAMPLE = SAMPLES / "amqp091-qos-confirms.pcap"


def rotate_like_tcpdump_c(capture: Path, out: Path, part_bytes: int) -> list[Path]:
    """Cut a pcap into files of about ``part_bytes`` on record boundaries, each with the file header,
    named as ``tcpdump -C`` names them: NAME, NAME1, NAME2, ..."""
    data = capture.read_bytes()
    header = data[: read_container(capture).data_start]
    paths = []
    for index, (start, end) in enumerate(split(capture, part_bytes)):
        path = out / (capture.name + (str(index) if index else ""))
        path.write_bytes(header + data[start:end])
        paths.append(path)
    return paths


def editcap_split(capture: Path, out: Path, packets: int) -> list[Path]:
    """Wireshark's own splitter: ``editcap -c N`` writes out_00000_<time>.ext, out_00001_<time>.ext, ..."""
    subprocess.run(["editcap", "-c", str(packets), str(capture), str(out / f"part{capture.suffix}")], check=True)
    return sorted(out.glob(f"part_*{capture.suffix}"))


def tcpdump_rotate(capture: Path, out: Path, megabytes: int = 1) -> list[Path]:
    """tcpdump's own rotation: ``tcpdump -r CAPTURE -w cap.pcap -C N`` writes cap.pcap, cap.pcap1, ...
    (-Z root: tcpdump would otherwise write as its own user, who cannot write in the test's folder)."""
    subprocess.run(
        ["tcpdump", "-r", str(capture), "-w", str(out / "cap.pcap"), "-C", str(megabytes), "-Z", "root"],
        check=True,
        capture_output=True,
    )
    return sorted(out.glob("cap.pcap*"), key=lambda p: int(p.name.removeprefix("cap.pcap") or 0))


def shifted(capture: Path, out: Path, seconds: float) -> Path:
    """A copy of ``capture`` in its own format with every packet's time moved by ``seconds`` (``editcap -t``)."""
    kind = read_container(capture).kind
    subprocess.run(["editcap", "-F", kind, "-t", f"{seconds:.6f}", str(capture), str(out)], check=True)
    return out


def without_capture_id(df: DataFrame) -> DataFrame:
    return df.drop("capture_id")


def test_rotation_key_matches_tcpdump_and_editcap_names():
    assert rotation_key("/d/cap.pcap") == rotation_key("/d/cap.pcap1") == rotation_key("/d/cap.pcap12")
    assert rotation_key("/d/cap-20261121-101500.pcap") == rotation_key("/d/cap-20261121-101600.pcap")
    assert rotation_key("/d/out_00000_20261121.pcapng") == rotation_key("/d/out_00001_20261121.pcapng")
    assert rotation_key("/d/cap.pcap") != rotation_key("/e/cap.pcap1")  # other directory
    assert rotation_key("/d/a.pcap") != rotation_key("/d/b.pcap")


def test_parts_are_grouped_in_time_order(tmp_path):
    parts = rotate_like_tcpdump_c(SAMPLE, tmp_path, 40_000)
    assert len(parts) >= 5
    # Name order puts cap.pcap10 before cap.pcap2; time order must not.
    [group] = resolve_parts(reversed(parts)).captures
    assert [Path(p.path).name for p in group] == [p.name for p in parts]
    assert [p.content_hash for p in group] == [capture_id(p) for p in parts]
    assert all(a.last_ts_us <= b.first_ts_us for a, b in zip(group, group[1:]))
    # Asked not to, every file stays a capture of its own.
    assert len(resolve_parts(parts, group_rotated=False).captures) == len(parts)


def test_files_overlapping_in_time_are_not_a_rotation(tmp_path):
    data = SAMPLE.read_bytes()
    c = read_container(SAMPLE)
    header, cuts = data[: c.data_start], split(SAMPLE, 20_000)
    # Two files with the same name pattern, each holding every other chunk: their times interleave.
    for n in (1, 2):
        (tmp_path / f"run{n}.pcap").write_bytes(header + b"".join(data[s:e] for s, e in cuts[n - 1 :: 2]))
    grouping = resolve_parts(sorted(tmp_path.iterdir()))
    assert len(grouping.captures) == 2
    [boundary] = grouping.boundaries
    assert not boundary.joined and "before" in boundary.why


def test_unrelated_numbered_files_are_separate_captures(tmp_path):
    """Four captures of four days copied as cap0.pcap ... cap3.pcap: names that differ only in digits,
    times that do not overlap, and yet four captures: none starts where the one before ended."""
    day = 86_400
    files = [shifted(SAMPLE, tmp_path / f"cap{n}.pcap", n * day) for n in range(4)]
    grouping = resolve_parts(files)
    assert [[p.name for p in c] for c in grouping.captures] == [[f.name] for f in files]
    assert [(b.earlier.name, b.later.name, b.joined) for b in grouping.boundaries] == [
        (f"cap{n}.pcap", f"cap{n + 1}.pcap", False) for n in range(3)
    ]
    # Every connection of the sample is closed at its end: only a pause that traffic could make would do.
    assert all(
        "no connection was open at the end" in b.why and "more than 1.000000 s" in b.why for b in grouping.boundaries
    )
    assert grouping.explain()[0].startswith("cap0.pcap and cap1.pcap: separate captures: ")


def test_a_users_test1_and_test2_are_not_merged(tmp_path):
    """Two captures of two clients taken one after the other, five seconds apart."""
    first = tmp_path / "test1.pcap"
    shutil.copy(SAMPLE, first)
    other = SAMPLES / "amqp10-credit.pcap"
    [a, b] = [describe_part(first), describe_part(other)]
    second = shifted(other, tmp_path / "test2.pcap", (a.last_ts_us - b.first_ts_us) / 1e6 + 5)
    grouping = resolve_parts([first, second])
    assert len(grouping.captures) == 2
    [boundary] = grouping.boundaries
    assert not boundary.joined
    assert "test2.pcap starts 5.0000" in boundary.why


def test_a_part_that_is_missing_breaks_the_run(tmp_path):
    """cap.pcap and cap.pcap2 of one run without cap.pcap1: close in time, but the connections that
    were open at the end of cap.pcap skip the bytes cap.pcap1 held."""
    parts = rotate_like_tcpdump_c(SAMPLE, tmp_path, 40_000)
    parts[1].unlink()
    grouping = resolve_parts([parts[0], *parts[2:]])
    assert [len(c) for c in grouping.captures] == [1, len(parts) - 2]
    cut = next(b for b in grouping.boundaries if not b.joined)
    assert (cut.earlier.name, cut.later.name) == (parts[0].name, parts[2].name)
    assert "none runs on into" in cut.why and "skips" in cut.why
    assert all(b.joined for b in grouping.boundaries if b is not cut)


def test_a_connection_that_runs_on_after_too_long_a_pause_is_not_a_rotation(tmp_path):
    parts = rotate_like_tcpdump_c(SAMPLE, tmp_path, 40_000)
    moved = tmp_path / "moved"
    moved.mkdir()
    first = shutil.copy(parts[0], moved / parts[0].name)
    second = shifted(parts[1], moved / parts[1].name, 120)  # two minutes later
    grouping = resolve_parts([first, second])
    [boundary] = grouping.boundaries
    assert not boundary.joined and "more than 60.000000 s" in boundary.why
    # The same two files in their own time are one capture.
    assert [len(c) for c in resolve_parts(parts[:2]).captures] == [2]


def test_another_snapshot_length_is_another_run(tmp_path):
    parts = rotate_like_tcpdump_c(SAMPLE, tmp_path, 40_000)
    data = bytearray(parts[1].read_bytes())
    data[16:20] = (96).to_bytes(4, "little")  # the pcap header's snaplen (the sample is little-endian)
    parts[1].write_bytes(bytes(data))
    grouping = resolve_parts(parts[:2])
    [boundary] = grouping.boundaries
    assert not boundary.joined and "snaplen 262144" in boundary.why and "snaplen 96" in boundary.why


def test_analyze_prints_which_files_were_grouped_and_why(tmp_path, capsys):
    """Before anything else: the grouping is said as the files are checked (here the lake then fails)."""
    parts = tcpdump_rotate(SAMPLES / "bottlenecks" / "channel-routing.pcap", tmp_path)
    assert len(parts) >= 3
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert cli_main(["analyze", *map(str, parts), "--lake", str(blocker / "lake")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{', '.join(p.name for p in parts)}: one capture, the rotated parts of one capture run")
    assert [line.split(":")[0].strip() for line in err[1 : len(parts)]] == [
        f"{b.name} follows {a.name}" for a, b in zip(parts, parts[1:])
    ]
    assert all(" runs on" in line for line in err[1 : len(parts)])


@pytest.mark.parametrize("splitter", ["tcpdump-names", "editcap", "tcpdump"])
def test_rotated_parts_decode_as_the_whole_file(spark, tmp_path, splitter):
    capture = SAMPLES / "mixed.pcapng" if splitter == "editcap" else SAMPLE
    if splitter == "editcap":
        if shutil.which("editcap") is None:
            pytest.fail("editcap (wireshark-common, installed with tshark by .ci/system-deps.sh) is missing")
        parts = editcap_split(capture, tmp_path, 300)
    elif splitter == "tcpdump":
        capture = SAMPLES / "bottlenecks" / "channel-routing.pcap"  # tcpdump rotates by the million bytes
        parts = tcpdump_rotate(capture, tmp_path)
    else:
        parts = rotate_like_tcpdump_c(capture, tmp_path, 30_000)
    assert len(parts) >= 3

    [rotated] = resolve_captures(parts)
    [whole] = resolve_captures([capture])
    assert rotated.capture_id == capture_id(parts[0]) and len(rotated.parts) == len(parts)
    got, persisted = decode_tables(spark, [rotated], (5672,), range_bytes=16_384)
    want, persisted_whole = decode_tables(spark, [whole], (5672,))
    try:
        for table in ("frames", "connections", "quarantine", "tcp_segments"):
            assertDataFrameEqual(without_capture_id(got[table]), without_capture_id(want[table]))
        # Connections run on across the parts: some connection has frames completed in two parts.
        c = read_container(parts[0])
        boundary = sum(1 for _ in read_range(parts[0], c, c.data_start, parts[0].stat().st_size))
        spanning = (
            got["frames"]
            .groupBy("connection_id")
            .agg(F.min("packet_number").alias("lo"), F.max("packet_number").alias("hi"))
            .filter((F.col("lo") <= boundary) & (F.col("hi") > boundary))
        )
        assert spanning.count() >= 1
        assert_bytes_accounted(byte_accounting(got["connections"], got["frames"], got["quarantine"]))
        [row] = got["captures"].collect()
        assert row.file_name == parts[0].name
        assert row.file_size == sum(p.stat().st_size for p in parts)
        assert [p.file_name for p in row.parts] == [p.name for p in parts]
        assert row.packets == want["captures"].first().packets
        assert row.status == "ok"
    finally:
        for df in (*persisted, *persisted_whole):
            df.unpersist()


def test_landing_replaces_a_capture_that_grew_by_a_part(spark, tmp_path):
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    parts = rotate_like_tcpdump_c(SAMPLE, tmp_path, 60_000)
    config = AnalyzeConfig(lake=lake)
    store = Lake(spark, lake)

    # The second part lands first, alone: a capture of its own for now.
    shutil.copy(parts[1], landing / parts[1].name)
    assert ingest_landing(spark, landing, config).ingested == (capture_id(parts[1]),)

    # Then the whole rotation: one capture, keyed by its first part, and the stray is gone; the
    # job says which files it took as one capture, and why.
    for p in parts:
        shutil.copy(p, landing / p.name)
    said = io.StringIO()
    with Progress(spark, stream=said, mode="never") as progress:
        run = ingest_landing(spark, landing, config, progress)
    assert run.ingested == (capture_id(parts[0]),)
    lines = said.getvalue().splitlines()
    assert lines[0].startswith(f"{', '.join(p.name for p in parts)}: one capture, the rotated parts")
    assert [line.split(":")[0].strip() for line in lines[1 : len(parts)]] == [
        f"{b.name} follows {a.name}" for a, b in zip(parts, parts[1:])
    ]
    assert [r.capture_id for r in store.read("captures").collect()] == [capture_id(parts[0])]
    [whole] = resolve_captures([SAMPLE])
    want, persisted = decode_tables(spark, [whole], (5672,))
    try:
        assertDataFrameEqual(without_capture_id(store.read("frames")), without_capture_id(want["frames"]))
    finally:
        for df in persisted:
            df.unpersist()

    # Nothing new: nothing decoded, nothing changed.
    frames = store.read("frames").count()
    again = ingest_landing(spark, landing, config)
    assert again.ingested == () and again.skipped == (capture_id(parts[0]),)
    assert store.read("frames").count() == frames
