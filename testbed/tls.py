"""TLS for the testbed: a throwaway CA made with ``openssl`` at test time, and client contexts that
write NSS key logs.

Nothing here is committed key material that matters: each run makes a new CA and server key in a
temporary folder (``make_certificates``) and throws them away with it. The clients write the
session secrets they negotiate to a key log (Python's ``ssl.SSLContext.keylog_filename``, OpenSSL's
``SSL_CTX_set_keylog_callback`` underneath), which is what a capture is decrypted with.

The scenarios get ``(host, port)`` only; a TLS listener's client context is lent by port
(``lend_client_context``), the way the memory alarm switch is (``testbed.broker.alarm_switch``), and
the clients ask ``client_context(port)`` for it.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TLS_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
HOSTNAME = "localhost"


@dataclass(frozen=True)
class Certificates:
    """A throwaway CA and a server certificate it signed (for ``localhost`` and 127.0.0.1)."""

    ca_certificate: Path
    server_certificate: Path
    server_key: Path


def make_certificates(folder: Path, key_type: str = "ec") -> Certificates:
    """A new CA and server key pair in ``folder`` (``key_type`` "ec": P-256, or "rsa": 2048 bits)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"] if key_type == "ec" else ["-newkey", "rsa:2048"]
    ca_key, ca_cert = folder / "ca.key", folder / "ca.pem"
    server_key, server_csr, server_cert = folder / "server.key", folder / "server.csr", folder / "server.pem"
    extensions = folder / "server.ext"
    extensions.write_text(f"subjectAltName=DNS:{HOSTNAME},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "req",
        "-x509",
        *key,
        "-nodes",
        "-keyout",
        ca_key,
        "-out",
        ca_cert,
        "-days",
        "2",
        "-subj",
        "/CN=amqpscope throwaway test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    )
    _openssl("req", *key, "-nodes", "-keyout", server_key, "-out", server_csr, "-subj", f"/CN={HOSTNAME}")
    _openssl(
        "x509",
        "-req",
        "-in",
        server_csr,
        "-CA",
        ca_cert,
        "-CAkey",
        ca_key,
        "-CAcreateserial",
        "-out",
        server_cert,
        "-days",
        "2",
        "-extfile",
        extensions,
    )
    return Certificates(ca_cert, server_cert, server_key)


def _openssl(*args: object) -> None:
    result = subprocess.run(
        ["openssl", *map(str, args)], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed ({result.returncode}): {result.stderr.strip()[-500:]}")


def new_client_context(ca_certificate: Path, keylog: Path, version: str, ciphers: str | None = None) -> ssl.SSLContext:
    """A client context that trusts the test CA, speaks only TLS ``version`` ("1.2" or "1.3"),
    and logs its session secrets to ``keylog`` (NSS key log format, appended)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(ca_certificate))
    context.minimum_version = context.maximum_version = TLS_VERSIONS[version]
    if ciphers is not None:
        context.set_ciphers(ciphers)  # TLS 1.2 suites; TLS 1.3's are the server's choice here
    context.keylog_filename = str(keylog)
    return context


def dh_parameters(folder: Path) -> Path:
    """Finite-field DH parameters (RFC 7919 ffdhe2048, a named group: nothing to generate) for DHE suites."""
    path = folder / "dh.pem"
    if not path.exists():
        _openssl("genpkey", "-genparam", "-algorithm", "DH", "-pkeyopt", "dh_param:ffdhe2048", "-out", path)
    return path


def new_server_context(
    certificates: Certificates, ciphers: str | None = None, dh_params: Path | None = None
) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certificates.server_certificate), str(certificates.server_key))
    if ciphers is not None:
        context.set_ciphers(ciphers)
    if dh_params is not None:
        context.load_dh_params(str(dh_params))
    return context


# -- client contexts lent to scenarios by the broker's port ---------------------------------------

_CLIENT_CONTEXTS: dict[int, ssl.SSLContext] = {}


@contextlib.contextmanager
def lend_client_context(port: int, context: ssl.SSLContext) -> Iterator[None]:
    """While the block runs, clients of ``port`` connect with TLS through ``context``."""
    _CLIENT_CONTEXTS[port] = context
    try:
        yield
    finally:
        _CLIENT_CONTEXTS.pop(port, None)


def client_context(port: int) -> ssl.SSLContext | None:
    """The TLS context lent for ``port``; None: the port speaks plain AMQP."""
    return _CLIENT_CONTEXTS.get(port)


def pika_ssl_options(port: int) -> object | None:
    """``pika.SSLOptions`` with the context lent for ``port`` (None: plain AMQP on it)."""
    context = client_context(port)
    if context is None:
        return None
    import pika

    return pika.SSLOptions(context, HOSTNAME)


def connect(host: str, port: int, timeout: float | None = None) -> socket.socket:
    """A connected socket to ``host:port``: wrapped in TLS (handshake done) when a context is lent for the port."""
    sock = socket.create_connection((host, port), timeout=timeout)
    context = client_context(port)
    if context is None:
        return sock
    return context.wrap_socket(sock, server_hostname=HOSTNAME)
