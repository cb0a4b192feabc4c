"""Scenarios captured over TLS (AMQPS), each with the key log its clients wrote: ``samples/tls/``.

A private broker listens for TLS too (``PrivateBroker(tls=True)``: a throwaway CA made by ``openssl``
at start, thrown away at stop). Each capture lends its clients a context for the broker's TLS port
that speaks one TLS version and logs the session secrets to ``NAME.keylog`` beside ``NAME.pcap``
(Python's ``ssl.SSLContext.keylog_filename``): pika and the raw 0-9-1 client through ``ssl``, and the
AMQP 1.0 client as python-qpid-proton's engine over a Python ``ssl`` socket
(``testbed.amqp10_tls``), since proton's own TLS cannot log keys. TLS 1.2 suites are the client's
choice (``ciphers``); TLS 1.3's are the broker's, so a second broker offering only
TLS_CHACHA20_POLY1305_SHA256 makes that capture.

The bottleneck scenarios (a slow consumer, a memory alarm) sample the broker's own states while
they run, as ``testbed.bottleneck_scenarios`` does over plain TCP, so their truth files carry the
expected bottleneck from the broker's view.

    python -m testbed.tls_scenarios --out samples/tls   # root: tcpdump on lo
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import bottleneck_scenarios
from testbed.amqp10_tls import amqp10_credit_tls
from testbed.broker import PrivateBroker
from testbed.capture import capture_scenario, truth_path
from testbed.processes import port_is_free
from testbed.scenarios import CLIENT_SCENARIOS, SCENARIOS, Truth
from testbed.tls import lend_client_context, new_client_context

IANA_AMQPS_PORT = 5671
# The broker of TLS 1.3 with ChaCha20-Poly1305: the only TLS 1.3 suite it offers (Erlang's name, as
# rabbitmq.conf takes it), TLS 1.2 suites for the handshake to be configurable at all.
CHACHA_BROKER = {
    "ssl_options.ciphers.1": "TLS_CHACHA20_POLY1305_SHA256",
    "ssl_options.ciphers.2": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ssl_options.honor_cipher_order": "true",
}


@dataclass(frozen=True)
class TlsCapture:
    scenario: str
    version: str  # "1.2" / "1.3"
    ciphers: str | None = None  # the client's TLS 1.2 suites (OpenSSL names)
    chacha_broker: bool = False  # run against the broker offering only ChaCha20-Poly1305
    bottleneck: bool = False  # sample the broker's states (testbed.bottleneck_scenarios)


CAPTURES: Mapping[str, TlsCapture] = {
    "amqp091-qos-confirms-tls12-ecdhe-aes256gcm": TlsCapture(
        "amqp091_qos_confirms", "1.2", "ECDHE-ECDSA-AES256-GCM-SHA384"
    ),
    "amqp091-qos-confirms-tls13-aes256gcm": TlsCapture("amqp091_qos_confirms", "1.3"),
    "amqp10-credit-tls12-ecdhe-chacha20": TlsCapture("amqp10_credit_tls", "1.2", "ECDHE-ECDSA-CHACHA20-POLY1305"),
    "amqp10-credit-tls13-chacha20": TlsCapture("amqp10_credit_tls", "1.3", chacha_broker=True),
    "slow-consumer-tls13": TlsCapture("slow_consumer", "1.3", bottleneck=True),
    "memory-alarm-tls12": TlsCapture("memory_alarm", "1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", bottleneck=True),
    # bottlenecks/slow-reader with one 512 KiB message instead of two of 1 MiB (a smaller capture).
    "slow-reader-tls13": TlsCapture("slow_reader_small", "1.3", bottleneck=True),
}


def slow_reader_small(host: str, port: int) -> Truth:
    """``bottleneck_scenarios.slow_reader`` with one message of 512 KiB."""
    truth = bottleneck_scenarios.slow_reader(host, port, messages=1, size=512 << 10)
    return {**truth, "scenario": "slow_reader_small"}


def capture_tls(name: str, out_dir: Path, broker: PrivateBroker) -> Path:
    """Capture ``CAPTURES[name]`` on ``broker``'s TLS port: NAME.pcap, NAME.keylog, NAME.truth.json."""
    spec = CAPTURES[name]
    assert broker.tls_port is not None and broker.certificates is not None, "a broker with tls=True"
    out_dir.mkdir(parents=True, exist_ok=True)
    keylog = out_dir / f"{name}.keylog"
    keylog.write_text("")
    context = new_client_context(broker.certificates.ca_certificate, keylog, spec.version, spec.ciphers)

    def afresh() -> None:  # a retried capture keeps only its own sessions' secrets
        keylog.write_text("")

    options: dict[str, Any] = {"port": broker.tls_port, "file_stem": name, "on_attempt": afresh}
    with lend_client_context(broker.tls_port, context):
        if spec.bottleneck:
            capture = bottleneck_scenarios.capture_bottleneck(spec.scenario, out_dir, broker, **options)
        else:
            capture = capture_scenario(spec.scenario, out_dir, broker=broker, **options)
    path = truth_path(capture)
    truth = json.loads(path.read_text())
    truth["tls"] = {
        "version": f"TLS {spec.version}",
        "client_ciphers": spec.ciphers,
        "broker_ciphers": CHACHA_BROKER if spec.chacha_broker else "RabbitMQ 3.10's defaults",
        "keylog": keylog.name,
        "ca": "throwaway, made with openssl when the broker started",
    }
    path.write_text(json.dumps(truth, indent=1) + "\n")
    return capture


def capture_all(out_dir: Path, names: tuple[str, ...] = tuple(CAPTURES)) -> list[Path]:
    """Capture each of ``names``, with one broker (and a second for the ChaCha20 TLS 1.3 ones)."""
    extra = {"amqp10_credit_tls": amqp10_credit_tls, "slow_reader_small": slow_reader_small}
    for scenario, run in extra.items():
        SCENARIOS[scenario] = (scenario,)  # type: ignore[index]
        CLIENT_SCENARIOS[scenario] = run  # type: ignore[index]
    bottleneck_scenarios.INTENDED["slow_reader_small"] = "client"  # type: ignore[index]
    try:
        paths = []
        for chacha in (False, True):
            chosen = [n for n in names if CAPTURES[n].chacha_broker == chacha]
            if not chosen:
                continue
            # On 5671 when free (as the plain samples are on 5672), so that no --ports is needed to read them.
            tls_port = IANA_AMQPS_PORT if port_is_free(IANA_AMQPS_PORT) else None
            with (
                PrivateBroker(tls=True, tls_port=tls_port, config=CHACHA_BROKER if chacha else None) as broker,
                bottleneck_scenarios.registered(broker),
            ):
                paths += [capture_tls(name, out_dir, broker) for name in chosen]
        return paths
    finally:
        for scenario in extra:
            SCENARIOS.pop(scenario, None)  # type: ignore[attr-defined]
            CLIENT_SCENARIOS.pop(scenario, None)  # type: ignore[attr-defined]
        bottleneck_scenarios.INTENDED.pop("slow_reader_small", None)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.tls_scenarios", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("samples/tls"), help="output directory (default: samples/tls)")
    parser.add_argument("--capture", action="append", choices=sorted(CAPTURES), help="repeatable (default: all)")
    args = parser.parse_args(argv)
    for path in capture_all(args.out, tuple(args.capture or CAPTURES)):
        print(f"{path} ({path.stat().st_size} bytes) + {path.stem}.keylog + {truth_path(path).name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
