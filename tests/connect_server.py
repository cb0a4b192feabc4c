"""Spark's own Spark Connect server, the one the pyspark package ships, started as a process of its
own on a free loopback port: what the tests run amqpscope's jobs on as a Spark Connect session.

It is a process of its own, not ``SparkSession.builder.remote("local[2]")`` in the test process:
PySpark 4.0 chooses between its classic and its Connect functions (``F.col``, ``F.udf``) for the
whole process (SPARK_CONNECT_MODE_ENABLED), and the suite's classic session lives in that process.
The jobs run on it from processes of their own, with ``--remote`` or SPARK_REMOTE.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyspark

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 600  # a JVM start on a loaded two-core machine


@dataclass(frozen=True)
class ConnectServer:
    pid: int
    port: int
    log: Path

    @property
    def remote(self) -> str:
        """The server's address as --remote and SPARK_REMOTE take it."""
        return f"sc://127.0.0.1:{self.port}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start(log: Path, memory: str = "2g") -> ConnectServer:
    """Start a Connect server on local[2] (its Python workers: this interpreter), logging to ``log``;
    returns once it accepts connections. Stop it with ``stop``."""
    port = _free_port()
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("SPARK_REMOTE", None)
    command = [
        str(spark_submit),
        "--master",
        "local[2]",
        "--class",
        SERVER_CLASS,
        "--name",
        "amqpscope-tests-connect",
        "--driver-memory",
        memory,
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.python.authenticate.socketTimeout=180s",
        "spark-internal",
    ]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=out, env=env, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _listening(port):
        if process.poll() is not None or time.monotonic() > deadline:
            stop(ConnectServer(process.pid, port, log))
            raise RuntimeError(f"the Spark Connect server did not start (its log: {log})")
        time.sleep(0.5)
    return ConnectServer(process.pid, port, log)


def stop(server: ConnectServer) -> None:
    """Stop the server's process group (spark-submit's shell and its JVM), by its PID."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(server.pid, signal.SIGKILL)
