"""A real Spark standalone cluster on loopback: one master and N workers from pyspark's own launcher.

Started with ``bin/spark-class`` of the installed pyspark (which ``exec``s the JVM, so the PID we
hold is the JVM's), stopped by PID, every process checked gone. Used by the cluster test
(``tests/test_cluster.py``) and the ingestion benchmark (``benchmarks/ingest.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[2]} exited with {process.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout} s: {log.read_text()[-2000:]}")


@dataclass
class StandaloneCluster:
    work_dir: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    processes: list[subprocess.Popen] = field(default_factory=list)  # the master first, then the workers
    master_url: str = ""

    def _launch(self, name: str, *args: str) -> subprocess.Popen:
        log = self.work_dir / f"{name}.log"
        env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.work_dir,
        )
        self.processes.append(process)
        return process

    def __enter__(self) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        port, ui = free_port(), free_port()
        try:
            master = self._launch(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
            )
            _wait_for_port(port, master, self.work_dir / "master.log")
            self.master_url = f"spark://127.0.0.1:{port}"
            for n in range(self.workers):
                worker_port = free_port()
                worker = self._launch(
                    f"worker{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    self.master_url,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(worker_port),
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--work-dir",
                    str(self.work_dir / f"worker{n}"),
                )
                _wait_for_port(worker_port, worker, self.work_dir / f"worker{n}.log")
            self._wait_registered()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_registered(self, timeout: float = 60) -> None:
        """Workers listen before the master has accepted them: wait for the master's word."""
        deadline = time.monotonic() + timeout
        log = self.work_dir / "master.log"
        while time.monotonic() < deadline:
            if log.read_text(errors="replace").count("Registering worker") >= self.workers:
                return
            time.sleep(0.3)
        raise TimeoutError(f"workers did not register: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        # Workers first, so the master does not log them as lost; SIGKILL whatever ignores SIGTERM.
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def worker_pids(self) -> list[int]:
        """The workers' JVMs: the executors of an application are their children."""
        return [p.pid for p in self.processes[1:]]

    def alive(self) -> list[int]:
        return [p.pid for p in self.processes if p.poll() is None]
