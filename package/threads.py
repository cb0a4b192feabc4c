"""Work on a background thread of a process whose main thread drives Spark through Py4J.

Every Py4J call waits for the JVM's answer with the GIL released, then has to take the GIL back.
A thread running pure Python (Great Expectations) holds it for the whole switch interval (5 ms by
default) before handing it over, so each call of the main thread waits that long: measured here,
3,000 calls took 4 s alone and 413 s beside a busy thread (34 s at a 0.5 ms interval). While
background work runs, the interval is shortened so the main thread's calls go on at nearly their
own pace.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")

# Seconds a thread may hold the GIL while another waits for it, as long as background work runs.
SWITCH_INTERVAL_S = 0.0005

_lock = threading.Lock()
_running = 0
_default_interval = sys.getswitchinterval()


def in_background(work: Callable[[], T], name: str) -> Future[T]:
    """Run ``work`` on a thread of its own (not a daemon: the process waits for it); its result, or
    what it raised, comes through the returned future."""
    future: Future[T] = Future()

    def run() -> None:
        global _running, _default_interval
        with _lock:
            if _running == 0:
                _default_interval = sys.getswitchinterval()
                sys.setswitchinterval(min(_default_interval, SWITCH_INTERVAL_S))
            _running += 1
        try:
            if future.set_running_or_notify_cancel():
                future.set_result(work())
        except BaseException as exc:  # handed to whoever waits for the result
            future.set_exception(exc)
        finally:
            with _lock:
                _running -= 1
                if _running == 0:
                    sys.setswitchinterval(_default_interval)

    threading.Thread(target=run, name=name).start()
    return future
