"""Capture real AMQP traffic: private broker + tcpdump on ``lo`` + a client scenario.

Each capture ``NAME.pcap`` (or ``NAME.pcapng``) gets a ``NAME.truth.json`` beside it holding
what the clients did (the ground truth) and how the capture was made. Every process started
here is stopped by PID in ``finally`` blocks, also when a scenario raises.

    python -m testbed capture --out samples --scenario mixed --pcapng   # from the repository's root
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version as distribution_version
from pathlib import Path
from types import TracebackType
from typing import Any

from testbed.broker import PLUGINS, PrivateBroker
from testbed.processes import port_is_free
from testbed.scenarios import SCENARIOS, run_scenario

IANA_AMQP_PORT = 5672
INTERFACE = "lo"
TRUTH_FORMAT_VERSION = 1
LISTEN_TIMEOUT = 10.0
CAPTURE_ATTEMPTS = 3
RING_BUFFER_KIB = 65536
# tcpdump's packet buffer timeout (its -B ring hands over a partly filled block after it).
BLOCK_TIMEOUT = 1.0
# Time for the last segments (close-ok, FIN/ACK) to reach the capture after the clients return.
DRAIN_SECONDS = BLOCK_TIMEOUT + 0.5
CLIENT_DISTRIBUTIONS = ("pika", "python-qpid-proton")
PCAP_MAGICS = {
    0xA1B2C3D4: "pcap (microsecond timestamps)",
    0xA1B23C4D: "pcap (nanosecond timestamps)",
}


class CaptureError(RuntimeError):
    """tcpdump or editcap failed."""


@dataclass
class _TcpdumpStats:
    """What tcpdump reports on stderr when it stops."""

    lines: list[str] = field(default_factory=list)
    listening: threading.Event = field(default_factory=threading.Event)

    def counter(self, label: str) -> int | None:
        for line in self.lines:
            if line.endswith(label):
                return int(line.split()[0])
        return None


class Tcpdump:
    """``tcpdump -i lo -U -w FILE 'tcp port PORT'`` as a context manager, stopped with SIGINT."""

    def __init__(self, output: Path, port: int, interface: str = INTERFACE) -> None:
        self.output = output
        self.port = port
        self.interface = interface
        self.filter = f"tcp port {port}"
        self.process: subprocess.Popen[str] | None = None
        self.stats = _TcpdumpStats()
        self._reader: threading.Thread | None = None

    def command(self) -> list[str]:
        # No --immediate-mode: with it libpcap cuts the ring into slots of the snapshot
        # length (8 packets in the default 2 MiB) and a busy machine drops bursts. Without
        # it the kernel packs packets into blocks and hands a block over when full or after
        # the timeout, so the capture must keep running BLOCK_TIMEOUT after the last packet.
        command = [
            "tcpdump",
            "-i",
            self.interface,
            "-n",
            "-U",
            "-B",
            str(RING_BUFFER_KIB),
            "-w",
            str(self.output),
        ]
        if os.geteuid() == 0:
            # As root tcpdump drops to user "tcpdump", which may not write to the output dir.
            command += ["-Z", "root"]
        return [*command, self.filter]

    def __enter__(self) -> Tcpdump:
        self.process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()
        # tcpdump prints "listening on lo ..." once the socket and filter are in place.
        if not self.stats.listening.wait(LISTEN_TIMEOUT):
            self.stop()
            raise CaptureError(f"tcpdump did not start listening: {' '.join(self.stats.lines[-5:])}")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGINT (tcpdump flushes and prints its counters), SIGKILL if it does not exit."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5.0)
        if self._reader is not None:
            self._reader.join(5.0)

    def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            self.stats.lines.append(line.strip())
            if "listening on" in line:
                self.stats.listening.set()


def default_capture_port() -> int | None:
    """5672 when free, so tshark decodes the samples as AMQP without ``-d``; else any port."""
    return IANA_AMQP_PORT if port_is_free(IANA_AMQP_PORT) else None


def capture_file_name(scenario: str, pcapng: bool) -> str:
    """``amqp091_qos_confirms`` -> ``amqp091-qos-confirms.pcap`` (or ``.pcapng``)."""
    return scenario.replace("_", "-") + (".pcapng" if pcapng else ".pcap")


def truth_path(capture: Path) -> Path:
    """``samples/x.pcap`` -> ``samples/x.truth.json``."""
    return capture.with_name(capture.name.rsplit(".", 1)[0] + ".truth.json")


def capture_scenario(
    scenario: str,
    out_dir: Path,
    *,
    port: int | None = None,
    pcapng: bool = False,
    broker: PrivateBroker | None = None,
    file_stem: str | None = None,
    on_attempt: Callable[[], None] | None = None,
) -> Path:
    """Capture ``scenario`` into ``out_dir``; return the capture path (truth JSON beside it).

    Starts (and stops) its own PrivateBroker on ``port`` (None: a free port) unless ``broker``
    is given, in which case ``port`` must be None, the broker's port, or its TLS port (the scenario
    then runs and is captured there: ``testbed.tls_scenarios``). ``file_stem`` names the files
    (default: the scenario's); ``on_attempt`` runs before each attempt (a TLS key log starts afresh).
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {sorted(SCENARIOS)}")
    if broker is None:
        with PrivateBroker(port=port) as own_broker:
            return capture_scenario(scenario, out_dir, pcapng=pcapng, broker=own_broker, file_stem=file_stem)
    if port is not None and port not in (broker.port, broker.tls_port):
        raise ValueError(f"port {port} given but the broker listens on {broker.port}")
    listener = port if port is not None else broker.port

    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / capture_file_name(file_stem or scenario, pcapng)
    # tcpdump (libpcap) only writes pcap; pcapng is converted afterwards with editcap.
    raw = final.with_name(f".{final.name}.partial.pcap") if pcapng else final
    try:
        for attempt in range(1, CAPTURE_ATTEMPTS + 1):
            if on_attempt is not None:
                on_attempt()
            truth, capture_meta = _capture_once(scenario, broker, raw, listener)
            dropped = capture_meta["packets_dropped_by_kernel"]
            if dropped == 0:
                break
            # Under CPU starvation the kernel ring can overflow; a golden capture with holes
            # would teach the decoders wrong things, so run the scenario again.
            if attempt == CAPTURE_ATTEMPTS:
                raise CaptureError(
                    f"{scenario}: no complete capture in {CAPTURE_ATTEMPTS} attempts "
                    f"(last attempt: packets dropped by kernel = {dropped})"
                )
        capture_meta["attempt"] = attempt
        if pcapng:
            capture_meta.update(_convert_to_pcapng(raw, final, capture_meta["format"]))
    except BaseException:
        # A capture without its ground truth must not look like a finished sample.
        final.unlink(missing_ok=True)
        raise
    finally:
        if pcapng:
            raw.unlink(missing_ok=True)
    capture_meta["file"] = final.name
    record = {
        "truth_format_version": TRUTH_FORMAT_VERSION,
        "scenario": scenario,
        "ground_truth": truth,
        "capture": capture_meta,
        "broker": _broker_metadata(broker, listener),
        "clients": _client_metadata(),
    }
    truth_path(final).write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    return final


def _capture_once(scenario: str, broker: PrivateBroker, raw: Path, port: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run ``scenario`` under tcpdump once: the clients' ground truth and capture metadata."""
    started = datetime.now(UTC)
    with Tcpdump(raw, port) as tcpdump:
        truth = run_scenario(scenario, broker.host, port)
        time.sleep(DRAIN_SECONDS)
    finished = datetime.now(UTC)
    return truth, _capture_metadata(raw, tcpdump, started, finished)


def _capture_metadata(raw: Path, tcpdump: Tcpdump, started: datetime, finished: datetime) -> dict[str, Any]:
    magic, snaplen, linktype = _pcap_header(raw)
    return {
        "format": PCAP_MAGICS.get(magic, f"unknown magic {magic:#x}"),
        "linktype": linktype,
        "snaplen": snaplen,
        "interface": tcpdump.interface,
        "filter": tcpdump.filter,
        "tool": _first_line(["tcpdump", "--version"]),
        # The output path is machine-specific; record the command with the file name only.
        "command": " ".join(tcpdump.command()).replace(str(tcpdump.output), raw.name),
        "packets_captured": tcpdump.stats.counter("packets captured"),
        "packets_dropped_by_kernel": tcpdump.stats.counter("packets dropped by kernel"),
        "started_utc": started.isoformat(timespec="milliseconds"),
        "finished_utc": finished.isoformat(timespec="milliseconds"),
    }


def _pcap_header(path: Path) -> tuple[int, int, int]:
    """Magic, snaplen and link type from a pcap global header (tcpdump writes host order)."""
    header = path.read_bytes()[:24]
    if len(header) < 24:
        raise CaptureError(f"{path} has no pcap header ({len(header)} bytes)")
    for order in ("<", ">"):
        magic, _major, _minor, _zone, _sigfigs, snaplen, linktype = struct.unpack(order + "IHHiIII", header)
        if magic in PCAP_MAGICS:
            return magic, snaplen, linktype
    raise CaptureError(f"{path} is not a pcap file (magic {header[:4].hex()})")


def _convert_to_pcapng(raw: Path, final: Path, raw_format: str) -> dict[str, Any]:
    editcap = shutil.which("editcap")
    if editcap is None:
        raise CaptureError("--pcapng needs editcap (Debian package wireshark-common)")
    command = [editcap, "-F", "pcapng", str(raw), str(final)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise CaptureError(f"editcap failed: {result.stderr.strip()}")
    return {
        "format": "pcapng",
        "converted_from": f"{raw_format} written by tcpdump",
        "converted_with": _first_line([editcap, "--version"]),
    }


def _broker_metadata(broker: PrivateBroker, port: int) -> dict[str, Any]:
    versions = broker.versions()
    return {
        "product": "RabbitMQ",
        "version": versions["rabbitmq"],
        "erlang": versions["erlang"],
        "host": broker.host,
        "port": port,
        "tls": port == broker.tls_port,  # the TLS listener (a throwaway CA's certificate)
        "plugins": list(PLUGINS),
        "config": dict(broker.settings),
    }


def _client_metadata() -> dict[str, str]:
    clients = {name: distribution_version(name) for name in CLIENT_DISTRIBUTIONS}
    clients["python"] = platform.python_version()
    return clients


def _first_line(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    return (result.stdout or result.stderr).strip().splitlines()[0]


# -- command line ---------------------------------------------------------------------------


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``python -m testbed capture``."""
    parser.add_argument("--out", type=Path, default=Path("samples"), help="output directory (default: samples)")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted(SCENARIOS),
        help="scenario to capture; repeatable (default: all)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"broker AMQP port (default: {IANA_AMQP_PORT} if free, else a free port)",
    )
    parser.add_argument("--pcapng", action="store_true", help="write pcapng (converted with editcap)")


def run_from_args(args: argparse.Namespace) -> int:
    """Capture the chosen scenarios with one private broker; print each file written."""
    scenarios: list[str] = args.scenario or list(SCENARIOS)
    port = args.port if args.port is not None else default_capture_port()
    with PrivateBroker(port=port) as broker:
        print(f"RabbitMQ {broker.version()} on {broker.host}:{broker.port}", file=sys.stderr)
        for scenario in scenarios:
            path = capture_scenario(scenario, args.out, pcapng=args.pcapng, broker=broker)
            print(f"{path} ({path.stat().st_size} bytes) + {truth_path(path).name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.capture", description=__doc__.splitlines()[0])
    configure_parser(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
