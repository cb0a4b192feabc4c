"""Process bookkeeping through /proc: find what a child spawned and make sure it is gone.

Erlang detaches some of its helpers (``erl_child_setup`` calls ``setsid``, ``inet_gethost``
starts its own group), so killing one process group is not enough: we track the whole tree
by parent PID and identify each process by (pid, start time) so a recycled PID is never
mistaken for ours.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# The repository's root, where ``testbed`` is found: it is not installed (the wheel does not hold it).
REPOSITORY_ROOT = Path(__file__).resolve().parent.parent


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with the repository's root first on PYTHONPATH: a
    Python process started with it imports ``testbed`` as this one does, from any directory."""
    env = dict(os.environ if environ is None else environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPOSITORY_ROOT]
    env["PYTHONPATH"] = os.pathsep.join([str(REPOSITORY_ROOT), *paths])
    return env


@dataclass(frozen=True, order=True)
class ProcessRef:
    """A process identified by PID plus kernel start time (immune to PID reuse)."""

    pid: int
    start_time: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        """Reference to the running process ``pid``, or None if there is none."""
        stat = _read_stat(pid)
        return None if stat is None else cls(pid, stat.start_time)

    def is_running(self) -> bool:
        """True while the same process exists and is not a zombie."""
        stat = _read_stat(self.pid)
        return stat is not None and stat.start_time == self.start_time and stat.state not in "ZX"

    def signal(self, signum: int) -> None:
        """Send ``signum`` if the process is still the one we recorded."""
        if self.is_running():
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


@dataclass(frozen=True)
class _Stat:
    state: str
    ppid: int
    start_time: int


def _read_stat(pid: int) -> _Stat | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is parenthesised and may itself contain spaces or ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    # proc(5): fields[0] is field 3 (state), [1] is ppid, [19] is field 22 (starttime).
    return _Stat(state=fields[0], ppid=int(fields[1]), start_time=int(fields[19]))


def descendants(root: int) -> set[ProcessRef]:
    """Every running process whose parent chain leads to ``root`` (``root`` excluded)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _read_stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat.ppid, []).append(int(entry.name))
    found: set[ProcessRef] = set()
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        ref = ProcessRef.of(pid)
        if ref is not None and ref not in found:
            found.add(ref)
            stack.extend(children.get(pid, []))
    return found


def wait_gone(refs: set[ProcessRef], timeout: float) -> set[ProcessRef]:
    """Wait until none of ``refs`` runs; return the ones still running at the timeout."""
    deadline = time.monotonic() + timeout
    alive = {ref for ref in refs if ref.is_running()}
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {ref for ref in alive if ref.is_running()}
    return alive


def kill_all(refs: set[ProcessRef], timeout: float = 5.0) -> set[ProcessRef]:
    """SIGKILL every process of ``refs`` still running; return any that survived."""
    for ref in refs:
        ref.signal(signal.SIGKILL)
    return wait_gone(refs, timeout)


def watch_process(landing: Path, lake: Path, *, interval: float, cwd: Path | None = None) -> subprocess.Popen:
    """``amqpscope watch LANDING --lake LAKE`` started in a session of its own (files taken at once,
    no progress), its stdout and stderr piped as text: the caller stops it, and what it started, by PID."""
    command = [sys.executable, "-m", "amqpscope", "watch", str(landing), "--lake", str(lake)]
    return subprocess.Popen(
        [*command, "--interval", str(interval), "--settle", "0", "--progress", "never"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=cwd,
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it; racy but good enough here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if ``port`` can be bound on ``host`` (and nothing accepts connections on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        if probe.connect_ex((host, port)) == 0:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
