"""A private RabbitMQ node on loopback, built from the Debian ``rabbitmq-server`` package.

Everything the node writes (mnesia, logs, config, enabled plugins, Erlang cookie) lives in a
temporary directory, the node has its own name, its own epmd on a private port and listens on
127.0.0.1 only, so it neither touches nor depends on a packaged RabbitMQ service that may
already run on this machine (even on 5672).

Running as root: ``/usr/sbin/rabbitmq-server`` and ``/usr/sbin/rabbitmqctl`` are Debian
wrappers that ``su rabbitmq`` (and ``cd /var/lib/rabbitmq``); the real scripts in
``/usr/lib/rabbitmq/bin`` run fine as any user, so we call those directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType

from testbed.processes import (
    ProcessRef,
    descendants,
    free_port,
    kill_all,
    port_is_free,
    wait_gone,
)
from testbed.tls import Certificates, make_certificates

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
LOOPBACK = "127.0.0.1"
AMQP091_PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
AMQP091_METHOD_FRAME = 1
PLUGINS = ("rabbitmq_amqp1_0",)

# Settings for every private node; callers' extra settings override these key by key.
BASE_SETTINGS: Mapping[str, str] = {
    # Default guest/guest (loopback only) is also the AMQP 1.0 plugin's anonymous user.
    "loopback_users.guest": "true",
    "log.file.level": "info",
    "log.console": "false",
}

# Environment that would make the scripts read system-wide files or another node's settings.
_INHERITED_PREFIXES = ("RABBITMQ_", "ERL_", "CONF_ENV_FILE")


class BrokerError(RuntimeError):
    """The private broker failed to start, stop, or answer a control command."""


class PrivateBroker:
    """A throw-away RabbitMQ 3.x node speaking AMQP 0-9-1 and 1.0 on ``127.0.0.1:port``.

    Use as a context manager; ``port=None`` picks a free port. ``config`` holds extra
    ``rabbitmq.conf`` settings, e.g. ``{"vm_memory_high_watermark.relative": "0.0001"}``.
    With ``tls=True`` it also listens for AMQP over TLS (both versions) on ``tls_port`` (``tls_port=None``
    picks a free port), with a certificate of a throwaway CA made by ``openssl`` in the node's
    temporary directory at start (``testbed.tls.make_certificates``; ``certificates`` afterwards):
    TLS 1.2 and 1.3, no client certificate. ``ssl_options.*`` keys in ``config`` add to that.
    """

    def __init__(
        self,
        port: int | None = None,
        config: Mapping[str, object] | None = None,
        *,
        start_timeout: float = 90.0,
        stop_timeout: float = 30.0,
        keep_dir: bool = False,
        tls: bool = False,
        tls_port: int | None = None,
    ) -> None:
        self.host = LOOPBACK
        self.port = port if port is not None else free_port()
        self.tls_port: int | None = (tls_port if tls_port is not None else free_port()) if tls else None
        self.certificates: Certificates | None = None
        self.settings: dict[str, str] = {**BASE_SETTINGS}
        self.settings.update({key: str(value) for key, value in (config or {}).items()})
        self.nodename = f"amqpscope-{os.getpid()}-{self.port}@localhost"
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.keep_dir = keep_dir
        self.base_dir: Path | None = None
        self.dist_port: int | None = None
        self.epmd_port: int | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self._epmd: subprocess.Popen[bytes] | None = None
        self._tracked: set[ProcessRef] = set()
        self._epmd_refs: set[ProcessRef] = set()
        self._versions: dict[str, str] | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> PrivateBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Write the node's files, start epmd and the node, wait until AMQP is served."""
        if self._server is not None:
            raise BrokerError("broker already started")
        for port in (self.port, self.tls_port):
            if port is not None and not port_is_free(port, self.host):
                raise BrokerError(f"port {self.host}:{port} is already in use")
        self.base_dir = Path(tempfile.mkdtemp(prefix="amqpscope-rabbitmq-"))
        self.dist_port = free_port()
        self.epmd_port = free_port()
        try:
            self._write_files()
            self._start_epmd()
            self._start_server()
            self._wait_until_ready()
        except BaseException as error:
            try:
                self.stop()
            except BrokerError as stop_error:
                error.add_note(f"while cleaning up: {stop_error}")
            raise

    def stop(self) -> None:
        """Stop the node and epmd by PID, then check that nothing we started survived."""
        leftovers: set[ProcessRef] = set()
        if self._server is not None:
            self._track(self._server.pid)
            # The wrapper script traps TERM, forwards it to beam.smp (RabbitMQ's graceful
            # shutdown) and waits for it.
            self._server.send_signal(signal.SIGTERM)
            try:
                self._server.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                pass
            server_tree = self._tracked - self._epmd_refs
            leftovers |= kill_all(wait_gone(server_tree, self.stop_timeout))
            self._reap(self._server)
            self._server = None
        if self._epmd is not None:
            self._epmd.terminate()
            self._reap(self._epmd)
            self._epmd = None
        leftovers |= kill_all({ref for ref in self._tracked if ref.is_running()})
        if self.base_dir is not None and not self.keep_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
        if leftovers:
            raise BrokerError(f"processes survived SIGKILL: {sorted(leftovers)}")

    @property
    def started_processes(self) -> frozenset[ProcessRef]:
        """Every process this broker has started that we have seen (epmd, wrapper, beam...)."""
        if self._server is not None:
            self._track(self._server.pid)
        return frozenset(self._tracked)

    # -- control -------------------------------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """Run ``rabbitmqctl -n <node> ARGS`` against this node and return its stdout."""
        return self._run_tool("rabbitmqctl", *args, timeout=timeout)

    def set_vm_memory_high_watermark(self, fraction: float) -> None:
        """Change the memory alarm threshold at run time (a tiny value raises the alarm)."""
        self.ctl("set_vm_memory_high_watermark", repr(float(fraction)))

    def version(self) -> str:
        """The RabbitMQ version the node reports, e.g. ``3.10.8``."""
        return self.versions()["rabbitmq"]

    def versions(self) -> dict[str, str]:
        """RabbitMQ and Erlang/OTP versions as reported by the running node."""
        if self._versions is None:
            status = json.loads(self.ctl("status", "--formatter", "json"))
            self._versions = {
                "rabbitmq": str(status["rabbitmq_version"]),
                "erlang": str(status["erlang_version"]).strip(),
            }
        return dict(self._versions)

    def log_tail(self, lines: int = 30) -> str:
        """First error lines and last ``lines`` lines of the node log and the script's output.

        Boot failures put the cause first and pages of supervisor reports after it.
        """
        if self.base_dir is None:
            return ""
        parts = []
        for path in (self._log_file, self.base_dir / "server.out"):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()
                errors = [line for line in text if "[error]" in line][:10]
                parts.append(f"--- {path} (first errors)\n" + "\n".join(errors))
                parts.append(f"--- {path} (last {lines} lines)\n" + "\n".join(text[-lines:]))
        return "\n".join(parts)

    # -- internals -----------------------------------------------------------------------------

    @property
    def _log_file(self) -> Path:
        assert self.base_dir is not None
        return self.base_dir / "log" / f"{self.nodename}.log"

    def _environment(self) -> dict[str, str]:
        assert self.base_dir is not None
        base = self.base_dir
        env = {key: value for key, value in os.environ.items() if not key.startswith(_INHERITED_PREFIXES)}
        # Bind Erlang distribution to loopback too, and never let erl spawn a daemonised
        # epmd we could not stop by PID: ours is already listening on ERL_EPMD_PORT.
        erl_args = "-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}"
        env.update(
            HOME=str(base / "home"),  # where Erlang keeps the node's cookie
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS=LOOPBACK,
            RABBITMQ_NODENAME=self.nodename,
            RABBITMQ_USE_LONGNAME="false",
            RABBITMQ_NODE_IP_ADDRESS=LOOPBACK,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(base / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(base / "rabbitmq.pid"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=erl_args,
            RABBITMQ_CTL_ERL_ARGS=erl_args,
        )
        return env

    def _write_files(self) -> None:
        assert self.base_dir is not None
        for sub in ("home", "mnesia", "log"):
            (self.base_dir / sub).mkdir()
        settings = {"listeners.tcp.1": f"{LOOPBACK}:{self.port}", **self._tls_settings(), **self.settings}
        (self.base_dir / "rabbitmq.conf").write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
        (self.base_dir / "enabled_plugins").write_text(f"[{','.join(PLUGINS)}].\n")
        # An empty env file shadows /etc/rabbitmq/rabbitmq-env.conf.
        (self.base_dir / "rabbitmq-env.conf").write_text("")

    def _tls_settings(self) -> dict[str, str]:
        """The TLS listener (rabbitmq.com/docs/ssl: listeners.ssl, ssl_options), with a new throwaway CA."""
        if self.tls_port is None:
            return {}
        assert self.base_dir is not None
        self.certificates = make_certificates(self.base_dir / "tls")
        return {
            "listeners.ssl.1": f"{LOOPBACK}:{self.tls_port}",
            "ssl_options.cacertfile": str(self.certificates.ca_certificate),
            "ssl_options.certfile": str(self.certificates.server_certificate),
            "ssl_options.keyfile": str(self.certificates.server_key),
            "ssl_options.verify": "verify_none",
            "ssl_options.fail_if_no_peer_cert": "false",
            "ssl_options.versions.1": "tlsv1.3",
            "ssl_options.versions.2": "tlsv1.2",
        }

    def _start_epmd(self) -> None:
        assert self.base_dir is not None and self.epmd_port is not None
        with open(self.base_dir / "epmd.out", "wb") as out:
            self._epmd = subprocess.Popen(
                ["epmd", "-port", str(self.epmd_port), "-address", LOOPBACK],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self._environment(),
            )
        self._track(self._epmd.pid)
        self._epmd_refs = {ref for ref in self._tracked if ref.pid == self._epmd.pid}
        self._wait_for(lambda: _accepts_connections(self.epmd_port), 10.0, "epmd did not start listening")

    def _start_server(self) -> None:
        assert self.base_dir is not None
        with open(self.base_dir / "server.out", "wb") as out:
            self._server = subprocess.Popen(
                [str(RABBITMQ_BIN / "rabbitmq-server")],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.base_dir,
                start_new_session=True,
                env=self._environment(),
            )
        self._track(self._server.pid)

    def _wait_until_ready(self) -> None:
        self._wait_for(
            lambda: _serves_amqp091(self.port),
            self.start_timeout,
            f"RabbitMQ did not accept AMQP on {LOOPBACK}:{self.port}",
        )
        # The listener can open before every boot step and plugin has run; await_startup
        # returns once the node (AMQP 1.0 plugin included) is fully up.
        # The CLI's own start (an Erlang VM) comes on top: on a loaded machine it took over 60 s.
        self.ctl("await_startup", "--timeout", str(int(self.start_timeout)), timeout=self.start_timeout + 60)
        if self.tls_port is not None:
            self._wait_for(
                lambda: _accepts_connections(self.tls_port),
                self.start_timeout,
                f"RabbitMQ did not listen for TLS on {LOOPBACK}:{self.tls_port}",
            )
        assert self._server is not None
        self._track(self._server.pid)

    def _wait_for(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._server is not None and self._server.poll() is not None:
                raise BrokerError(f"{what}: rabbitmq-server exited with {self._server.returncode}\n" + self.log_tail())
            if self._epmd is not None and self._epmd.poll() is not None:
                raise BrokerError(f"{what}: epmd exited with {self._epmd.returncode}")
            if ready():
                return
            time.sleep(0.2)
        raise BrokerError(f"{what} within {timeout:.0f} s\n" + self.log_tail())

    def _track(self, pid: int) -> None:
        ref = ProcessRef.of(pid)
        if ref is not None:
            self._tracked.add(ref)
            self._tracked |= descendants(pid)

    def _run_tool(self, tool: str, *args: str, timeout: float) -> str:
        if self._server is None:
            raise BrokerError("broker not running")
        result = subprocess.run(
            [str(RABBITMQ_BIN / tool), "-n", self.nodename, *args],
            env=self._environment(),
            cwd=self.base_dir,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise BrokerError(
                f"{tool} {' '.join(args)} failed ({result.returncode}): "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        return result.stdout

    @staticmethod
    def _reap(process: subprocess.Popen[bytes]) -> None:
        try:
            process.wait(5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5.0)


def _accepts_connections(port: int | None) -> bool:
    if port is None:
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((LOOPBACK, port)) == 0


def _serves_amqp091(port: int) -> bool:
    """True once the port answers an AMQP 0-9-1 header with a method frame (connection.start)."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=2.0) as sock:
            sock.sendall(AMQP091_PROTOCOL_HEADER)
            first = sock.recv(1)
    except OSError:
        return False
    return first == bytes([AMQP091_METHOD_FRAME])


# -- the memory alarm, lent to scenarios --------------------------------------------------------
# Scenarios get (host, port), not the broker; one that needs the memory alarm asks for the switch of
# the broker on its port, which the capturing code lends while the scenario runs.

AlarmSwitch = Callable[[bool], None]
_ALARM_SWITCHES: dict[int, AlarmSwitch] = {}
NORMAL_WATERMARK = 0.4  # RabbitMQ's default vm_memory_high_watermark


@contextlib.contextmanager
def alarm_switch(broker: PrivateBroker, alarm_watermark: float) -> Iterator[None]:
    """Let scenarios raise (watermark ``alarm_watermark``) and clear ``broker``'s memory alarm."""

    def switch(on: bool) -> None:
        broker.set_vm_memory_high_watermark(alarm_watermark if on else NORMAL_WATERMARK)

    _ALARM_SWITCHES[broker.port] = switch
    try:
        yield
    finally:
        _ALARM_SWITCHES.pop(broker.port, None)
        switch(False)


def memory_alarm_switch(port: int) -> AlarmSwitch | None:
    """The alarm switch lent for the broker on ``port``, if any."""
    return _ALARM_SWITCHES.get(port)
