"""benchmarks/end_to_end.py splits a run's CPU into its steps by reading the CPU of the run's
process tree at each step's start and end. Spark ends a Python worker idle for a minute: a sum
over the processes alive at the end of a step would lose the worker's CPU in that step, and the
step's share would come out short by what the worker used before (at 10 M frames, the decode's
168 CPU seconds went missing that way). What a child used must stay counted after it exits."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.benchmark_scripts import benchmark_script

BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n"


@pytest.fixture(scope="module")
def end_to_end():
    with benchmark_script("end_to_end") as module:
        yield module


def test_a_child_that_ended_keeps_its_cpu_counted(end_to_end):
    before = end_to_end._tree_cpu()
    child = subprocess.Popen([sys.executable, "-c", BURN])
    child.wait()  # ended and waited for, as the PySpark daemon waits for its workers
    after = end_to_end._tree_cpu()
    assert after - before >= 0.4


def test_a_running_child_is_counted_once(end_to_end):
    """Its CPU moves from its own entry to this process's (the children it waited for) as it ends:
    the same sum before and after. Read for this process and the child alone: the tree may hold a
    JVM of the test session, busy on its own."""

    def this_and(table: dict, pid: int) -> float:
        return table[os.getpid()][2] + (table[pid][2] if pid in table else 0.0)

    child = subprocess.Popen([sys.executable, "-c", BURN + "import sys; sys.stdin.read()\n"], stdin=subprocess.PIPE)
    try:
        for _ in range(100):  # until it has burnt its CPU and waits, alive
            table = end_to_end._proc_table(reaped=True)
            if child.pid in table and table[child.pid][2] >= 0.45:
                break
            time.sleep(0.05)
        alive = this_and(end_to_end._proc_table(reaped=True), child.pid)
        child.stdin.close()
        child.wait()
        ended = this_and(end_to_end._proc_table(reaped=True), child.pid)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert alive >= 0.45
    assert ended - alive == pytest.approx(0.0, abs=0.15)
