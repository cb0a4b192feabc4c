"""benchmarks/end_to_end.py splits a run's CPU into its steps by reading the CPU of the run's
process tree (``ingest.Sampler``) at each step's start and end. PySpark's daemon ignores SIGCHLD, so the kernel reaps a
Python worker that ends and its CPU is counted in no process left: a sum over the processes alive
at the end of a step lost it (at 10 M frames the steps came 168 CPU s short of the whole, the
decode's). What a process used must stay counted after it ends, and be counted once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.benchmark_scripts import benchmark_script

BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
# A parent that ignores SIGCHLD, as PySpark's daemon does, and a worker it forks that burns CPU and
# ends, reaped by the kernel; the parent says so and stays until its stdin closes.
DAEMON = f"""
import os, signal, sys, time
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
pid = os.fork()
if pid == 0:
{"".join("    " + line + chr(10) for line in BURN.splitlines())}    os._exit(0)
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.02)
print("ended", flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def ingest():
    with benchmark_script("ingest") as module:
        yield module


@pytest.fixture
def tree(ingest):
    """This process's tree sampled as end_to_end.py samples an analyze's (more often, for speed)."""
    sampler = ingest.Sampler(os.getpid(), every=0.05)
    sampler.start()
    yield sampler
    sampler.stop()


def _own(ingest, *pids: int) -> float:
    table = ingest._proc_table()
    return sum(table[pid][2] for pid in pids if pid in table)


def test_a_worker_reaped_by_the_kernel_stays_counted(ingest, tree):
    before = tree.cpu_so_far()
    daemon = subprocess.Popen([sys.executable, "-c", DAEMON], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert daemon.stdout.readline().strip() == b"ended"
        # The worker is gone and counted nowhere in /proc: not in the daemon's own times.
        assert _own(ingest, daemon.pid) < 0.3
        counted = tree.cpu_so_far() - before
    finally:
        daemon.stdin.close()
        daemon.wait()
    # Its 0.6 s less at most one interval of the reading (and whatever the test session's JVM used).
    assert counted >= 0.5


def test_a_child_is_counted_once(ingest, tree):
    child = subprocess.Popen([sys.executable, "-c", BURN + "import sys; sys.stdin.read()\n"], stdin=subprocess.PIPE)
    try:
        for _ in range(100):  # until it has burnt its CPU and waits, alive
            if _own(ingest, child.pid) >= 0.55:
                break
            time.sleep(0.05)
        alive = tree.cpu_so_far()
        child.stdin.close()
        child.wait()
        ended = tree.cpu_so_far()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # Read for the whole tree: only a test session's JVM could add anything between the two.
    assert ended - alive == pytest.approx(0.0, abs=0.3)
