"""Background work beside the Py4J-driving main thread (amqpscope.threads)."""

from __future__ import annotations

import sys
import threading

import pytest

from amqpscope.threads import SWITCH_INTERVAL_S, in_background


def test_the_result_and_the_interval_while_it_runs():
    before = sys.getswitchinterval()
    started, release = threading.Event(), threading.Event()

    def work() -> float:
        started.set()
        release.wait(10)
        return sys.getswitchinterval()

    future = in_background(work, "test-work")
    assert started.wait(10)
    assert sys.getswitchinterval() == pytest.approx(min(before, SWITCH_INTERVAL_S))
    release.set()
    assert future.result(10) == pytest.approx(min(before, SWITCH_INTERVAL_S))
    for thread in threading.enumerate():  # the interval is restored before the thread ends
        if thread.name == "test-work":
            thread.join(10)
    assert sys.getswitchinterval() == before


def test_what_the_work_raised_reaches_whoever_waits():
    def work() -> None:
        raise ValueError("broken")

    with pytest.raises(ValueError, match="broken"):
        in_background(work, "test-fail").result(10)
