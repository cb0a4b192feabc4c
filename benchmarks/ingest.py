"""Ingestion throughput and memory: the real ingest job on big captures, local and on a cluster.

One command:

    .venv/bin/python benchmarks/ingest.py [--frames 1000000] [--out out/bench] [--only throughput|memory]
                                          [--memory-sizes 256,2048] [--memory-conf KEY=VALUE] [--memory-derive]
                                          [--keep]

1. The capture is ``benchmarks/decode.py``'s (``build_capture``): the bundled real captures
   replicated with a distinct client address per copy until it holds ``--frames`` AMQP frames.
   "Four copies" are that file and three more of the same traffic recorded 1, 2 and 3 seconds
   later (every record's timestamp moved, nothing else): ingestion keys captures by content hash,
   so four identical files would be one capture. Their names differ in letters (``capture-a.pcap``
   ... ``capture-d.pcap``) and their times overlap, so none is taken for a rotated part of another.
2. Throughput: ``jobs.stages.landing.ingest_landing`` (what ``amqpscope ingest LANDING_DIR`` runs) on a
   landing directory of one capture and of the four, each into a fresh lake, in its own process
   (its own JVM), on ``local[2]`` and on a standalone cluster on loopback
   (``testbed.spark_cluster``) with one and with two 1-core workers; every JVM that runs tasks gets
   a 4 GiB heap (``THROUGHPUT_CONF``). Timed is the call alone
   (hashing, planning, decoding, every bronze table written); the frames are then counted from the
   written frames table and must be what the capture holds.
3. Memory: captures of ``--memory-sizes`` MiB (same method) ingested on ``local[2]`` with Spark's
   default driver memory, while the process tree is sampled every 0.5 s from ``/proc``: peak RSS
   of the driver's JVM (which runs the tasks in local mode), of the Python workers, and of the
   driver's Python process. ``--memory-conf`` adds Spark settings to these runs (never driver memory).
   With ``--memory-derive`` each run's lake is then derived (``jobs.stages.derive.derive_lake``, what
   ``amqpscope derive --lake`` runs: every table after the bronze ones) in a process of its own, with
   the same default driver memory, measured the same way as a run of its own.

Besides wall clock, every run records the CPU seconds of its processes (and of which the JVMs and the
Python workers) and the CPU seconds the rest of the machine used meanwhile (``/proc/stat``), since
the machine may be shared. Results go to
``OUT/ingest.json`` and are printed as markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyspark

sys.path.append(str(Path(__file__).resolve().parent.parent))  # the repository's root: testbed (not installed)
from testbed.spark_cluster import StandaloneCluster

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/decode.py builds the capture
from decode import DEFAULT_SEEDS, broker_port, build_capture

ROOT = Path(__file__).resolve().parent.parent
APP_NAME = "amqpscope-bench-ingest"
COPY_NAMES = ("capture-a.pcap", "capture-b.pcap", "capture-c.pcap", "capture-d.pcap")
# A 4 GiB heap for every JVM that runs tasks in the throughput runs (local[2]'s driver, each 1-core
# executor), so that the heap does not bound the throughput measured. The memory runs keep Spark's
# default 1 GiB, which ingests and derives a 2 GB capture since 4160885 (docs/BENCHMARKS.md, "Memory").
THROUGHPUT_CONF = {"local": {"spark.driver.memory": "4g"}, "standalone": {"spark.executor.memory": "4g"}}
WORKER_MEMORY = "5g"  # what a worker offers: the executor's 4 GiB heap and room for its Python worker
RUN_TIMEOUT_S = 3 * 3600
SAMPLE_EVERY_S = 0.5

_PCAP_MAGIC_US = 0xA1B2C3D4
_PCAP_HEADER_BYTES = 24
_RECORD = struct.Struct("<IIII")  # ts_sec, ts_usec, incl_len, orig_len (decode.py writes little-endian)
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
_MB = 1e6


# --- captures ----------------------------------------------------------------------------------


def shifted_copy(capture: Path, out: Path, seconds: int) -> None:
    """The same capture as if recorded ``seconds`` later: every record's timestamp moved, nothing else."""
    with open(capture, "rb", buffering=1 << 22) as source, open(out, "wb", buffering=1 << 22) as sink:
        header = source.read(_PCAP_HEADER_BYTES)
        if struct.unpack_from("<I", header)[0] != _PCAP_MAGIC_US:
            raise ValueError(f"{capture}: not a little-endian microsecond pcap (as decode.build_capture writes)")
        sink.write(header)
        while head := source.read(_RECORD.size):
            ts_sec, ts_usec, incl_len, orig_len = _RECORD.unpack(head)
            sink.write(_RECORD.pack(ts_sec + seconds, ts_usec, incl_len, orig_len))
            sink.write(source.read(incl_len))


def capture_of_size(seeds: list[Path], megabytes: int, out: Path) -> tuple[int, int]:
    """A capture of at least ``megabytes`` MiB, built as ``build_capture`` builds; (frames, copies)."""
    probe = out.with_suffix(".probe")
    frames_per_round, _ = build_capture(seeds, 1, probe)
    round_bytes = probe.stat().st_size - _PCAP_HEADER_BYTES
    probe.unlink()
    rounds = -(-(megabytes * 2**20 - _PCAP_HEADER_BYTES) // round_bytes)
    return build_capture(seeds, rounds * frames_per_round, out)


def landing_dir(path: Path, captures: list[Path]) -> Path:
    """A landing directory holding ``captures`` (hard links: no copying)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for capture in captures:
        os.link(capture, path / capture.name)
    return path


# --- sampling the processes of a run ------------------------------------------------------------


@dataclass
class Usage:
    """Peaks over a run's processes (MB of RSS) and the CPU they and the rest of the machine used."""

    driver_jvm_mb: float = 0.0  # local mode: the JVM that runs the tasks too
    executor_jvm_mb: float = 0.0  # standalone: the largest executor JVM
    python_worker_mb: float = 0.0  # the largest single Python worker (pyspark.daemon and its forks)
    python_workers_mb: float = 0.0  # all Python workers together (forks share pages: an upper bound)
    python_driver_mb: float = 0.0  # the driver's Python process
    cpu_seconds: float = 0.0  # user + system of every process of the run
    jvm_cpu_seconds: float = 0.0  # of which the JVMs (driver, executors)
    python_worker_cpu_seconds: float = 0.0  # of which the Python workers
    other_cpu_seconds: float = 0.0  # what the rest of the machine used meanwhile
    samples: int = 0


def _proc_table() -> dict[int, tuple[int, float, float]]:
    """pid -> (parent pid, RSS in MB, CPU seconds) for every process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone since the listing
        fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
        ppid, utime, stime, rss = int(fields[1]), int(fields[11]), int(fields[12]), int(fields[21])
        table[int(entry.name)] = (ppid, rss * _PAGE / _MB, (utime + stime) / _TICK)
    return table


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _machine_busy_seconds() -> float:
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


class Sampler(threading.Thread):
    """Samples the descendants of ``roots`` (the run's process; the cluster's workers) every
    ``every`` seconds, keeping each process's highest CPU reading: a process that ended stays
    counted (PySpark's daemon ignores SIGCHLD, so the kernel reaps its Python workers and their CPU
    is left in no process), less at most its last interval."""

    def __init__(self, driver: int, cluster_roots: tuple[int, ...] = (), every: float = SAMPLE_EVERY_S) -> None:
        super().__init__(daemon=True)
        self.driver, self.cluster_roots, self.every = driver, cluster_roots, every
        self.usage = Usage()
        self._cpu: dict[int, float] = {}
        self._kinds: dict[int, str] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._busy_at_start = _machine_busy_seconds()

    def run(self) -> None:
        while not self._done.is_set():
            self._sample()
            self._done.wait(self.every)
        self._sample()

    def cpu_so_far(self) -> float:
        """The CPU seconds of the sampled processes so far, those that ended included (sampled now)."""
        self._sample()
        with self._lock:
            return sum(self._cpu.values())

    def stop(self) -> Usage:
        self._done.set()
        self.join()
        self.usage.cpu_seconds = round(sum(self._cpu.values()), 1)
        by_kind: dict[str, float] = {}
        for pid, cpu in self._cpu.items():
            kind = self._kinds.get(pid, "other")
            by_kind[kind] = by_kind.get(kind, 0.0) + cpu
        self.usage.jvm_cpu_seconds = round(by_kind.get("driver_jvm", 0.0) + by_kind.get("executor_jvm", 0.0), 1)
        self.usage.python_worker_cpu_seconds = round(by_kind.get("python_worker", 0.0), 1)
        busy = _machine_busy_seconds() - self._busy_at_start
        self.usage.other_cpu_seconds = round(max(0.0, busy - self.usage.cpu_seconds), 1)
        return self.usage

    def _kind(self, pid: int) -> str:
        if pid in self._kinds:
            return self._kinds[pid]
        command = _cmdline(pid)
        if pid == self.driver:
            kind = "python_driver"
        elif "pyspark.daemon" in command or "pyspark.worker" in command:
            kind = "python_worker"
        elif "CoarseGrainedExecutorBackend" in command:
            kind = "executor_jvm"
        elif command.split(" ", 1)[0].endswith("/java") and "org.apache.spark.deploy.SparkSubmit" in command:
            kind = "driver_jvm"
        else:
            # Not known yet: spark-submit is a shell script that execs the JVM under the same pid.
            return "other"
        self._kinds[pid] = kind
        return kind

    def _sample(self) -> None:
        with self._lock:  # the thread's samples and cpu_so_far's
            self._sample_now()

    def _sample_now(self) -> None:
        table = _proc_table()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _rss, _cpu) in table.items():
            children.setdefault(ppid, []).append(pid)
        # The run's process and everything under it; under the cluster's workers, only what they start.
        pending = [self.driver] + [child for root in self.cluster_roots for child in children.get(root, [])]
        rss: dict[str, list[float]] = {}
        while pending:
            pid = pending.pop()
            if pid not in table:
                continue
            pending.extend(children.get(pid, []))
            _ppid, mb, cpu = table[pid]
            self._cpu[pid] = max(self._cpu.get(pid, 0.0), cpu)
            rss.setdefault(self._kind(pid), []).append(mb)
        u = self.usage
        u.samples += 1
        u.driver_jvm_mb = max(u.driver_jvm_mb, *rss.get("driver_jvm", [0.0]))
        u.executor_jvm_mb = max(u.executor_jvm_mb, *rss.get("executor_jvm", [0.0]))
        u.python_worker_mb = max(u.python_worker_mb, *rss.get("python_worker", [0.0]))
        u.python_workers_mb = max(u.python_workers_mb, sum(rss.get("python_worker", [])))
        u.python_driver_mb = max(u.python_driver_mb, *rss.get("python_driver", [0.0]))


# --- one ingest, in its own process -------------------------------------------------------------


def ingest_once(landing: Path, lake: Path, master: str, ports: tuple[int, ...], conf: dict[str, str]) -> dict:
    """Time ``ingest_landing`` on ``landing`` into ``lake``; count the frames written (runs in the child)."""
    from amqpscope.conf.settings import AnalyzeConfig
    from amqpscope.jobs.engine.session import build_session
    from amqpscope.jobs.lake.lake import Lake
    from amqpscope.jobs.stages.landing import ingest_landing

    spark = build_session(master, APP_NAME, conf, remember_py4j_lookups=True)
    try:
        config = AnalyzeConfig(lake=lake, master=master, ports=ports, spark_conf=conf)
        started = time.perf_counter()
        result = ingest_landing(spark, landing, config)
        seconds = time.perf_counter() - started
        frames = Lake(spark, lake).read("frames").count()
    finally:
        spark.stop()
    return {
        "seconds": round(seconds, 2),
        "frames": frames,
        "captures": len(result.ingested),
        "failed": [list(f) for f in result.failed],
    }


def derive_once(lake: Path, master: str, ports: tuple[int, ...], conf: dict[str, str]) -> dict:
    """Time ``derive_lake`` (what ``amqpscope derive --lake LAKE`` runs) over every capture ingested into
    ``lake``; count the frames it derived from (runs in the child)."""
    from amqpscope.conf.settings import AnalyzeConfig
    from amqpscope.jobs.engine.session import build_session
    from amqpscope.jobs.lake.lake import Lake
    from amqpscope.jobs.stages.derive import derive_lake

    spark = build_session(master, APP_NAME, conf, remember_py4j_lookups=True)
    try:
        config = AnalyzeConfig(lake=lake, master=master, ports=ports, spark_conf=conf)
        started = time.perf_counter()
        result = derive_lake(spark, config)
        seconds = time.perf_counter() - started
        frames = Lake(spark, lake).read("frames").count()
    finally:
        spark.stop()
    return {"seconds": round(seconds, 2), "frames": frames, "captures": len(result.derived), "failed": []}


@dataclass
class Run:
    name: str  # what was measured: setup and input
    master: str
    captures: int
    file_megabytes: float
    expected_frames: int
    conf: dict[str, str]
    frames: int = 0  # counted from the written frames table
    seconds: float = 0.0  # the ingest_landing call
    process_seconds: float = 0.0  # the whole process: JVM start, session, ingest, count, stop
    frames_per_second: float = 0.0
    megabytes_per_second: float = 0.0
    frames_per_cpu_second: float = 0.0
    executors: int = 0  # standalone: executors the master launched for the run
    usage: Usage = field(default_factory=Usage)
    error: str | None = None


def run_ingest(
    run: Run,
    landing: Path | None,
    lake: Path,
    ports: tuple[int, ...],
    log: Path,
    cluster: StandaloneCluster | None = None,
    keep_lake: bool = False,
) -> Run:
    """One ``ingest_once`` of ``landing`` into a fresh ``lake`` in a child process, sampled; fills ``run``
    in. Without ``landing``: one ``derive_once`` of the captures already in ``lake``."""
    if landing is not None:
        shutil.rmtree(lake, ignore_errors=True)
    command = [
        sys.executable,
        __file__,
        *(("one", str(landing)) if landing is not None else ("one-derive",)),
        str(lake),
        run.master,
        "--ports",
        ",".join(map(str, ports)),
        *(f"--conf={k}={v}" for k, v in run.conf.items()),
    ]
    master_log = cluster.work_dir / "master.log" if cluster else None
    launched_before = _executors_launched(master_log)
    print(f"[{time.strftime('%H:%M:%S')}] {run.name} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(log, "wb") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, start_new_session=True, cwd=ROOT)
        sampler = Sampler(child.pid, tuple(cluster.worker_pids()) if cluster else ())
        sampler.start()
        try:
            stdout, _ = child.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)  # the run's own process group: its JVM and workers
            stdout, _ = child.communicate()
        finally:
            run.usage = sampler.stop()
    run.process_seconds = round(time.perf_counter() - started, 2)
    run.executors = _executors_launched(master_log) - launched_before
    if child.returncode != 0:
        run.error = f"exit {child.returncode}: " + _failure_lines(log)
    else:
        result = json.loads(stdout.decode().strip().splitlines()[-1])
        run.frames, run.seconds = result["frames"], result["seconds"]
        run.frames_per_second = round(run.frames / run.seconds)
        run.megabytes_per_second = round(run.file_megabytes / run.seconds, 2)
        run.frames_per_cpu_second = round(run.frames / run.usage.cpu_seconds) if run.usage.cpu_seconds else 0
        if run.frames != run.expected_frames or result["captures"] != run.captures or result["failed"]:
            run.error = (
                f"wrote {run.frames} frames of {result['captures']} captures "
                f"(expected {run.expected_frames} of {run.captures}); failed: {result['failed']}"
            )
        elif cluster is not None and run.executors < cluster.workers:
            run.error = f"the master launched {run.executors} executors for {cluster.workers} workers"
    if not keep_lake:
        shutil.rmtree(lake, ignore_errors=True)
    print(f"[{time.strftime('%H:%M:%S')}] {run.name}: {_summary(run)}", file=sys.stderr, flush=True)
    return run


def _executors_launched(master_log: Path | None) -> int:
    if master_log is None or not master_log.exists():
        return 0
    return master_log.read_text(errors="replace").count("Launching executor")


def _failure_lines(log: Path) -> str:
    """What a failed run's log says first: the failed task and stage, the JVM error and where it was thrown
    (the first Spark frame below it), and the Python side's last word."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    picked = []
    for n, line in enumerate(lines):
        if "ERROR" in line and "Exception in task" in line:
            picked.append(line)
            error = next((x for x in lines[n + 1 : n + 3] if x.startswith("java.")), None)
            spark = [
                x
                for x in lines[n + 1 : n + 40]
                if x.startswith(("at org.apache.spark.sql", "at org.apache.spark.storage"))
            ]
            picked += ([error] if error else []) + spark[:2]
            break
    picked += [line for line in lines if line.startswith(("py4j.", "pyspark.", "RuntimeError", "ValueError"))][-1:]
    return " | ".join(picked or lines[-5:])[:2000]


def _summary(run: Run) -> str:
    if run.error:
        return f"FAILED {run.error[:300]}"
    u = run.usage
    return (
        f"{run.frames:,} frames in {run.seconds:.1f} s: {run.frames_per_second:,} frames/s, "
        f"{run.megabytes_per_second} MB/s; CPU {u.cpu_seconds} s (others {u.other_cpu_seconds} s); "
        f"peak RSS JVM {max(u.driver_jvm_mb, u.executor_jvm_mb):.0f} MB, Python worker {u.python_worker_mb:.0f} MB"
    )


# --- the benchmark ------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    memory_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal"))
    java = subprocess.run(["java", "-version"], capture_output=True, text=True, check=True).stderr.splitlines()[0]
    os_name = next(
        (
            line.split("=", 1)[1].strip('"')
            for line in Path("/etc/os-release").read_text().splitlines()
            if line.startswith("PRETTY_NAME=")
        ),
        platform.platform(),
    )
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / 2**20, 1),
        "os": os_name,
        "python": platform.python_version(),
        "java": java,
        "pyspark": pyspark.__version__,
    }


def _commit() -> str:
    """The code measured: HEAD, marked when the work tree differs from it."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False).stdout
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=False
    ).stdout
    return f"{head.strip()}{' (modified)' if dirty.strip() else ''}" or "unknown"


def throughput(
    seeds: list[Path], target_frames: int, ports: tuple[int, ...], out: Path, runs: list[Run], save: Callable[[], None]
) -> None:
    """The 1 M-frame capture and four copies, on local[2] and on 1- and 2-worker clusters; into ``runs``."""
    captures = out / "captures"
    captures.mkdir(parents=True, exist_ok=True)
    base = captures / COPY_NAMES[0]
    frames, copies = build_capture(seeds, target_frames, base)
    for n, name in enumerate(COPY_NAMES[1:], start=1):
        shifted_copy(base, captures / name, n)
    files = [captures / name for name in COPY_NAMES]
    inputs = {1: landing_dir(out / "landing-1", files[:1]), 4: landing_dir(out / "landing-4", files)}
    megabytes = {n: round(sum(f.stat().st_size for f in files[:n]) / _MB, 1) for n in inputs}
    print(
        f"capture: {base} ({megabytes[1]} MB, {frames:,} AMQP frames, {copies} copies of {len(seeds)} seeds) "
        f"and 3 time-shifted copies",
        file=sys.stderr,
    )

    def measure(setup: str, master: str, conf: dict[str, str], cluster: StandaloneCluster | None = None) -> None:
        for n, landing in inputs.items():
            run = Run(f"{setup}, {n} capture{'s' if n > 1 else ''}", master, n, megabytes[n], n * frames, conf)
            log = out / "logs" / f"{setup.replace(' ', '').replace(',', '-')}-{n}.log"
            runs.append(run_ingest(run, landing, out / "lake", ports, log, cluster))
            save()

    measure("local[2]", "local[2]", THROUGHPUT_CONF["local"])
    for workers in (1, 2):
        with StandaloneCluster(
            out / f"cluster-{workers}", workers=workers, worker_cores=1, worker_memory=WORKER_MEMORY
        ) as cluster:
            measure(
                f"standalone, {workers} worker{'s' if workers > 1 else ''}",
                cluster.master_url,
                THROUGHPUT_CONF["standalone"],
                cluster,
            )
        if cluster.alive():
            raise RuntimeError(f"cluster processes still running: {cluster.alive()}")
    for landing in inputs.values():
        shutil.rmtree(landing)


def memory(
    seeds: list[Path],
    sizes_mib: list[int],
    ports: tuple[int, ...],
    conf: dict[str, str],
    out: Path,
    runs: list[Run],
    save: Callable[[], None],
    derive: bool = False,
) -> None:
    """A capture of each size ingested on local[2] with default driver memory (and ``conf``); into ``runs``.
    With ``derive``, its lake then derived (``amqpscope derive``) in a process of its own, as a run of its own."""
    for size in sizes_mib:
        capture = out / "captures" / f"memory-{size}mib.pcap"
        capture.parent.mkdir(parents=True, exist_ok=True)
        frames, copies = capture_of_size(seeds, size, capture)
        landing = landing_dir(out / f"landing-memory-{size}", [capture])
        megabytes = round(capture.stat().st_size / _MB, 1)
        print(f"capture: {capture} ({megabytes} MB, {frames:,} AMQP frames, {copies} copies)", file=sys.stderr)
        settings = "".join(f", {k}={v}" for k, v in conf.items())
        run = Run(
            f"local[2], default driver memory{settings}, {megabytes:,.0f} MB capture",
            "local[2]",
            1,
            megabytes,
            frames,
            conf,
        )
        lake = out / "lake"
        runs.append(run_ingest(run, landing, lake, ports, out / "logs" / f"memory-{size}.log", keep_lake=derive))
        save()
        shutil.rmtree(landing)
        if derive and not run.error:
            derived = Run(f"{run.name}: derive", "local[2]", 1, megabytes, frames, conf)
            runs.append(run_ingest(derived, None, lake, ports, out / "logs" / f"memory-{size}-derive.log"))
            save()


def ratios(runs: list[Run]) -> dict[str, float]:
    rate = {r.name: r.frames_per_second for r in runs if not r.error}
    out = {}
    for label in ("1 capture", "4 captures"):
        one, two = rate.get(f"standalone, 1 worker, {label}"), rate.get(f"standalone, 2 workers, {label}")
        if one and two:
            out[f"2 workers / 1 worker, {label}"] = round(two / one, 2)
    for setup in ("local[2]", "standalone, 1 worker", "standalone, 2 workers"):
        one, four = rate.get(f"{setup}, 1 capture"), rate.get(f"{setup}, 4 captures")
        if one and four:
            out[f"4 captures / 1 capture, {setup}"] = round(four / one, 2)
    return out


def markdown(result: dict) -> str:
    lines = [
        (
            "| run | frames (read back) | MB | ingest s | frames/s | MB/s | CPU s (JVM / Python) | frames/CPU s "
            "| others' CPU s "
            "| peak RSS MB: driver JVM / executor JVM / Python worker |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["throughput"]:
        u = r["usage"]
        lines.append(
            f"| {r['name']} | {r['frames']:,} | {r['file_megabytes']:,} | {r['seconds']} | "
            f"{r['frames_per_second']:,} | {r['megabytes_per_second']} | {u['cpu_seconds']} "
            f"({u.get('jvm_cpu_seconds', 0)} / {u.get('python_worker_cpu_seconds', 0)}) | "
            f"{r['frames_per_cpu_second']:,} | {u['other_cpu_seconds']} | {u['driver_jvm_mb']:,.0f} / "
            f"{u['executor_jvm_mb']:,.0f} / {u['python_worker_mb']:,.0f} |"
            + (f" FAILED: {r['error'][:200]}" if r["error"] else "")
        )
    lines += ["", "| ratio of frames/s | |", "|---|---|"]
    lines += [f"| {k} | {v}x |" for k, v in result["ratios"].items()]
    lines += [
        "",
        (
            "| run | capture MB | frames (read back) | ingest (derive) s | frames/s | peak RSS driver JVM MB | "
            "peak RSS one Python worker MB | peak RSS all Python workers MB | peak RSS driver Python MB |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["memory"]:
        u = r["usage"]
        lines.append(
            f"| {r['name']} | {r['file_megabytes']:,} | {r['frames']:,} | {r['seconds']} | {r['frames_per_second']:,} | "
            f"{u['driver_jvm_mb']:,.0f} | {u['python_worker_mb']:,.0f} | {u['python_workers_mb']:,.0f} | "
            f"{u['python_driver_mb']:,.0f} |" + (f" FAILED: {r['error'][:300]}" if r["error"] else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["one"], ["one-derive"]):
        return _one(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000, help="AMQP frames in the capture (default 1 M)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench", help="captures, lakes, logs, ingest.json")
    parser.add_argument("--seed", type=Path, action="append", help="seed capture with its truth JSON (repeatable)")
    parser.add_argument("--only", choices=("throughput", "memory"), help="run one half only")
    parser.add_argument("--memory-sizes", default="256,2048", help="capture sizes in MiB for the memory runs")
    parser.add_argument(
        "--memory-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the memory runs (repeatable; driver memory stays the default)",
    )
    parser.add_argument(
        "--memory-derive",
        action="store_true",
        help="derive each memory run's lake too (amqpscope derive, its own process), measured the same way",
    )
    parser.add_argument("--keep", action="store_true", help="keep the captures")
    args = parser.parse_args(argv)
    seeds = args.seed or list(DEFAULT_SEEDS)
    ports = tuple(sorted({broker_port(seed) for seed in seeds}))
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    header = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": _commit(),
        "machine": machine(),
        "seeds": [s.name for s in seeds],
    }
    throughput_runs: list[Run] = []
    memory_runs: list[Run] = []

    def save() -> dict:
        result = {
            **header,
            "throughput": [asdict(r) for r in throughput_runs],
            "ratios": ratios(throughput_runs),
            "memory": [asdict(r) for r in memory_runs],
        }
        (args.out / "ingest.json").write_text(json.dumps(result, indent=2) + "\n")
        return result

    try:
        if args.only in (None, "throughput"):
            throughput(seeds, args.frames, ports, args.out, throughput_runs, save)
        if args.only in (None, "memory"):
            sizes = [int(s) for s in args.memory_sizes.split(",") if s]
            conf = dict(item.split("=", 1) for item in args.memory_conf)
            if "spark.driver.memory" in conf:
                parser.error(
                    "the memory runs are about the default driver memory: no --memory-conf spark.driver.memory"
                )
            memory(seeds, sizes, ports, conf, args.out, memory_runs, save, derive=args.memory_derive)
    finally:
        if not args.keep:
            shutil.rmtree(args.out / "captures", ignore_errors=True)
    print(markdown(save()))
    return 0


def _one(argv: list[str]) -> int:
    """A child run: ``one LANDING LAKE MASTER`` ingests, ``one-derive LAKE MASTER`` derives; prints its JSON."""
    derive = argv[:1] == ["one-derive"]
    parser = argparse.ArgumentParser(
        prog=f"ingest.py {argv[0]}", description=f"one timed {'derive' if derive else 'ingest'} (the benchmark runs it)"
    )
    if not derive:
        parser.add_argument("landing", type=Path)
    parser.add_argument("lake", type=Path)
    parser.add_argument("master")
    parser.add_argument("--ports", required=True)
    parser.add_argument("--conf", action="append", default=[], help="KEY=VALUE Spark setting")
    args = parser.parse_args(argv[1:])
    conf = dict(item.split("=", 1) for item in args.conf)
    ports = tuple(int(p) for p in args.ports.split(","))
    if derive:
        result = derive_once(args.lake, args.master, ports, conf)
    else:
        result = ingest_once(args.landing, args.lake, args.master, ports, conf)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
