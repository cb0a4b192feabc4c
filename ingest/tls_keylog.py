"""TLS session secrets from NSS key log files (``SSLKEYLOGFILE``, ``ssl.SSLContext.keylog_filename``).

One line a secret: ``LABEL <client random, 64 hex digits> <secret, hex>``; ``#`` starts a comment.
The format is NSS's ("NSS Key Log Format", firefox-source-docs.mozilla.org/security/nss/legacy/
key_log_format); the TLS 1.3 labels are the secrets of RFC 8446 7.1:

- ``CLIENT_RANDOM``: a TLS 1.2 session's 48-byte master secret;
- ``CLIENT_HANDSHAKE_TRAFFIC_SECRET`` / ``SERVER_HANDSHAKE_TRAFFIC_SECRET``: TLS 1.3 handshake keys;
- ``CLIENT_TRAFFIC_SECRET_0`` / ``SERVER_TRAFFIC_SECRET_0``: TLS 1.3 application keys (later ones
  follow from them by key update, RFC 8446 7.2).

Other labels (``EXPORTER_SECRET``, ``CLIENT_EARLY_TRAFFIC_SECRET``, ``RSA`` ...) are not needed and
skipped. The files are read from their paths when a TLS session first asks for a secret, in the
process that decodes (a Spark executor reads them where it runs), and never copied anywhere: no
secret is put in a row, a log line or an error message. Errors name the file and the line number,
never the line.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

LABELS: Final = frozenset(
    {
        "CLIENT_RANDOM",
        "CLIENT_HANDSHAKE_TRAFFIC_SECRET",
        "SERVER_HANDSHAKE_TRAFFIC_SECRET",
        "CLIENT_TRAFFIC_SECRET_0",
        "SERVER_TRAFFIC_SECRET_0",
    }
)
_RANDOM_HEX: Final = 64  # a ClientHello.random: 32 bytes
_MAX_SECRET_HEX: Final = 128  # the largest secret: 64 bytes (a SHA-512 based suite); TLS 1.2 master secrets are 48
# A key log of this size holds millions of sessions: more is not a key log.
MAX_FILE_BYTES: Final = 1 << 30

Secrets = dict[bytes, dict[str, bytes]]  # client random -> label -> secret

# Parsed files by (path, modification time, size): the decode tasks of one Python worker read a
# key log once.
_PARSED: dict[tuple[str, int, int], tuple[Secrets, int]] = {}


class KeyLogError(ValueError):
    """A key log that cannot be read; the message names the file, never its content."""


def _parse(lines: Iterable[str], source: str) -> tuple[Secrets, int]:
    """The secrets of some key log lines, and how many lines were malformed (they are skipped)."""
    secrets: Secrets = {}
    malformed = 0
    first_bad: int | None = None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3:
            malformed += 1
            first_bad = first_bad or number
            continue
        label, random_hex, secret_hex = parts
        if label not in LABELS:
            continue
        if len(random_hex) != _RANDOM_HEX or not 0 < len(secret_hex) <= _MAX_SECRET_HEX or len(secret_hex) % 2:
            malformed += 1
            first_bad = first_bad or number
            continue
        try:
            client_random, secret = bytes.fromhex(random_hex), bytes.fromhex(secret_hex)
        except ValueError:
            malformed += 1
            first_bad = first_bad or number
            continue
        secrets.setdefault(client_random, {})[label] = secret
    if malformed:
        warnings.warn(
            f"TLS key log {source}: {malformed} malformed line(s) skipped (first: line {first_bad})",
            RuntimeWarning,
            stacklevel=3,
        )
    return secrets, malformed


def read_key_log(path: str) -> Secrets:
    """The secrets of one key log file (cached per process while the file is unchanged)."""
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise KeyLogError(
            f"TLS key log {path}: cannot be read here ({exc.strerror}); on a cluster the key log must be at "
            "this path on every executor (a shared volume), as it is read where the capture is decoded"
        ) from None
    if stat.st_size > MAX_FILE_BYTES:
        raise KeyLogError(f"TLS key log {path}: {stat.st_size} bytes, more than a key log holds ({MAX_FILE_BYTES})")
    key = (path, stat.st_mtime_ns, stat.st_size)
    cached = _PARSED.get(key)
    if cached is None:
        try:
            with open(path, encoding="ascii", errors="replace") as lines:
                cached = _parse(lines, path)
        except OSError as exc:
            raise KeyLogError(f"TLS key log {path}: cannot be read ({exc.strerror})") from None
        for older in [k for k in _PARSED if k[0] == path]:
            del _PARSED[older]  # a file's latest version only: a long-lived worker keeps no stale copies
        _PARSED[key] = cached
    return cached[0]


def check_key_logs(paths: Sequence[str | Path]) -> None:
    """Fail early (on the driver) for a key log that is missing, unreadable or holds no secret."""
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"TLS key log {path}: no such file")
        secrets = read_key_log(str(path))
        if not secrets:
            raise KeyLogError(f"TLS key log {path}: no CLIENT_RANDOM or TLS 1.3 traffic secret lines in it")


class KeyLog:
    """The secrets of the key log files given, read on first use.

    Only paths are held until a TLS session asks for a secret, so a decoder made with a key log
    costs nothing on captures without TLS. ``repr`` shows the number of files, never a secret.
    """

    def __init__(self, paths: Sequence[str] = ()) -> None:
        self.paths = tuple(str(p) for p in paths)
        self._secrets: Secrets | None = None

    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> KeyLog:
        """A key log from lines already in memory (tests and fuzzing)."""
        log = cls()
        log._secrets = _parse(lines, "(in memory)")[0]
        return log

    def __repr__(self) -> str:
        return f"KeyLog({len(self.paths)} file(s))"

    @property
    def given(self) -> bool:
        """Whether any key log was given at all (a session without keys then says why)."""
        return bool(self.paths) or bool(self._secrets)

    def secret(self, client_random: bytes, label: str) -> bytes | None:
        """The secret logged for the session of ``client_random`` under ``label``, if any."""
        secrets = self._secrets
        if secrets is None:
            secrets = {}
            for path in self.paths:
                for random, labels in read_key_log(path).items():
                    secrets.setdefault(random, {}).update(labels)
            self._secrets = secrets
        return secrets.get(client_random, {}).get(label)
