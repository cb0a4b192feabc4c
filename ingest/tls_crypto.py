"""TLS record protection: the cipher suites amqpscope decrypts, their key schedules, and AEAD.

Nothing here is hand-written cryptography: the ciphers are the ``cryptography`` package's AEAD
classes, and both key schedules are built on its HMAC and HKDF-Expand.

- TLS 1.2 (RFC 5246 5 and 6.3): ``key_block = PRF(master_secret, "key expansion", server_random +
  client_random)``, cut into the client and server write keys and IVs (no MAC keys for AEAD suites).
  The key log's ``CLIENT_RANDOM`` line gives the master secret, so the key exchange (ECDHE, DHE, RSA)
  does not matter.
- AES-GCM in TLS 1.2 (RFC 5288 3): a 4-byte salt from the key block and an 8-byte explicit nonce
  at the start of each record; ChaCha20-Poly1305 (RFC 7905 2): a 12-byte IV XORed with the record's
  sequence number. Additional data: ``seq_num + type + version + length`` (RFC 5246 6.2.3.3).
- TLS 1.3 (RFC 8446 7.1 and 7.3): ``key`` and ``iv`` by HKDF-Expand-Label of a traffic secret; the
  nonce is the IV XORed with the sequence number (5.3), the additional data the record header
  (5.2); a key update derives the next secret with label "traffic upd" (7.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, hmac
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

from amqpscope.ingest.tls_handshake import TLS12, TLS13

AES_GCM, CHACHA20_POLY1305 = "AES-GCM", "ChaCha20-Poly1305"
TAG_BYTES: Final = 16  # both AEADs (RFC 5116 5.1, RFC 8439 2.8)
_GCM_EXPLICIT_NONCE: Final = 8  # RFC 5288 3: record_iv_length
_MAX_SEQUENCE: Final = (1 << 64) - 1


@dataclass(frozen=True)
class CipherSuite:
    code: int
    name: str  # as IANA's TLS Cipher Suites registry names it
    version: str  # the TLS version it belongs to: TLS12 or TLS13
    aead: str  # AES_GCM or CHACHA20_POLY1305
    key_bytes: int
    hash_name: str  # the PRF's (1.2) or HKDF's (1.3) hash: "sha256" or "sha384"

    @property
    def fixed_iv_bytes(self) -> int:
        """The IV the key schedule makes: AES-GCM in TLS 1.2 takes a 4-byte salt (RFC 5288 3), the others 12."""
        return 4 if self.version == TLS12 and self.aead == AES_GCM else 12


def _suites(*suites: tuple[int, str, str, str, int, str]) -> dict[int, CipherSuite]:
    return {code: CipherSuite(code, *rest) for code, *rest in suites}  # type: ignore[arg-type]


# The suites decrypted (RFC 8446 B.4; RFC 5288 3 and RFC 5289 3.2 for AES-GCM; RFC 7905 2 for ChaCha20-Poly1305).
SUITES: Final = _suites(
    (0x1301, "TLS_AES_128_GCM_SHA256", TLS13, AES_GCM, 16, "sha256"),
    (0x1302, "TLS_AES_256_GCM_SHA384", TLS13, AES_GCM, 32, "sha384"),
    (0x1303, "TLS_CHACHA20_POLY1305_SHA256", TLS13, CHACHA20_POLY1305, 32, "sha256"),
    (0xC02B, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", TLS12, AES_GCM, 16, "sha256"),
    (0xC02C, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", TLS12, AES_GCM, 32, "sha384"),
    (0xC02F, "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", TLS12, AES_GCM, 16, "sha256"),
    (0xC030, "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", TLS12, AES_GCM, 32, "sha384"),
    (0xCCA8, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", TLS12, CHACHA20_POLY1305, 32, "sha256"),
    (0xCCA9, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", TLS12, CHACHA20_POLY1305, 32, "sha256"),
    (0x009E, "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256", TLS12, AES_GCM, 16, "sha256"),
    (0x009F, "TLS_DHE_RSA_WITH_AES_256_GCM_SHA384", TLS12, AES_GCM, 32, "sha384"),
    (0xCCAA, "TLS_DHE_RSA_WITH_CHACHA20_POLY1305_SHA256", TLS12, CHACHA20_POLY1305, 32, "sha256"),
    (0x009C, "TLS_RSA_WITH_AES_128_GCM_SHA256", TLS12, AES_GCM, 16, "sha256"),
    (0x009D, "TLS_RSA_WITH_AES_256_GCM_SHA384", TLS12, AES_GCM, 32, "sha384"),
)
# Names of common suites that are not decrypted (CBC, CCM), for the quarantine's reason.
OTHER_SUITE_NAMES: Final = {
    0x1304: "TLS_AES_128_CCM_SHA256",
    0x1305: "TLS_AES_128_CCM_8_SHA256",
    0xC009: "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    0xC00A: "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    0xC013: "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    0xC014: "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    0xC023: "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    0xC024: "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA384",
    0xC027: "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    0xC028: "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384",
    0x002F: "TLS_RSA_WITH_AES_128_CBC_SHA",
    0x0035: "TLS_RSA_WITH_AES_256_CBC_SHA",
    0x003C: "TLS_RSA_WITH_AES_128_CBC_SHA256",
    0x003D: "TLS_RSA_WITH_AES_256_CBC_SHA256",
    0xC0AC: "TLS_ECDHE_ECDSA_WITH_AES_128_CCM",
    0xC0AD: "TLS_ECDHE_ECDSA_WITH_AES_256_CCM",
}


def suite_name(code: int) -> str:
    suite = SUITES.get(code)
    return suite.name if suite is not None else OTHER_SUITE_NAMES.get(code, f"0x{code:04X}")


def _hash(name: str) -> hashes.HashAlgorithm:
    return hashes.SHA384() if name == "sha384" else hashes.SHA256()


def _hmac(hash_name: str, key: bytes, data: bytes) -> bytes:
    mac = hmac.HMAC(key, _hash(hash_name))
    mac.update(data)
    return mac.finalize()


def prf(hash_name: str, secret: bytes, label: bytes, seed: bytes, length: int) -> bytes:
    """The TLS 1.2 PRF (RFC 5246 5): P_hash(secret, label + seed) cut to ``length`` bytes."""
    seed = label + seed
    out = bytearray()
    a = seed  # A(0)
    while len(out) < length:
        a = _hmac(hash_name, secret, a)  # A(i) = HMAC_hash(secret, A(i-1))
        out += _hmac(hash_name, secret, a + seed)
    return bytes(out[:length])


def hkdf_expand_label(hash_name: str, secret: bytes, label: bytes, context: bytes, length: int) -> bytes:
    """HKDF-Expand-Label (RFC 8446 7.1): HKDF-Expand(secret, HkdfLabel, length)."""
    full = b"tls13 " + label
    info = length.to_bytes(2, "big") + bytes([len(full)]) + full + bytes([len(context)]) + context
    return HKDFExpand(_hash(hash_name), length, info).derive(secret)


class RecordKeys:
    """One direction's record protection under one key: opens the records of that epoch."""

    __slots__ = ("suite", "_aead", "_iv")

    def __init__(self, suite: CipherSuite, key: bytes, iv: bytes) -> None:
        self.suite = suite
        self._aead = AESGCM(key) if suite.aead == AES_GCM else ChaCha20Poly1305(key)
        self._iv = iv

    def __repr__(self) -> str:
        return f"RecordKeys({self.suite.name})"  # never the key

    def _nonce(self, seq: int) -> bytes:
        """The per-record nonce of RFC 8446 5.3 and RFC 7905 2: the IV XORed with the sequence number."""
        return (int.from_bytes(self._iv, "big") ^ seq).to_bytes(len(self._iv), "big")

    def open(self, seq: int, header: bytes, body: bytes) -> bytes | None:
        """The plaintext of the record (``header`` its 5 bytes, ``body`` the rest) sent as number
        ``seq`` under this key; None when it does not authenticate (another key, another number,
        or damage). TLS 1.3: the inner plaintext, content type and padding included."""
        if not 0 <= seq <= _MAX_SEQUENCE:
            return None
        suite = self.suite
        try:
            if suite.version == TLS13:
                if len(body) < TAG_BYTES:
                    return None
                return self._aead.decrypt(self._nonce(seq), body, header)
            if suite.aead == AES_GCM:
                if len(body) < _GCM_EXPLICIT_NONCE + TAG_BYTES:
                    return None
                nonce, sealed = self._iv + body[:_GCM_EXPLICIT_NONCE], body[_GCM_EXPLICIT_NONCE:]
            else:
                if len(body) < TAG_BYTES:
                    return None
                nonce, sealed = self._nonce(seq), body
            # RFC 5246 6.2.3.3: seq_num + TLSCompressed.type + version + length (of the plaintext).
            aad = seq.to_bytes(8, "big") + header[:3] + (len(sealed) - TAG_BYTES).to_bytes(2, "big")
            return self._aead.decrypt(nonce, sealed, aad)
        except InvalidTag:
            return None


def tls12_keys(
    suite: CipherSuite, master_secret: bytes, client_random: bytes, server_random: bytes
) -> tuple[RecordKeys, RecordKeys]:
    """The client's and the server's record keys of a TLS 1.2 session (RFC 5246 6.3)."""
    key, iv = suite.key_bytes, suite.fixed_iv_bytes
    block = prf(suite.hash_name, master_secret, b"key expansion", server_random + client_random, 2 * (key + iv))
    client_key, server_key = block[:key], block[key : 2 * key]
    client_iv, server_iv = block[2 * key : 2 * key + iv], block[2 * key + iv :]
    return RecordKeys(suite, client_key, client_iv), RecordKeys(suite, server_key, server_iv)


def tls13_keys(suite: CipherSuite, secret: bytes) -> RecordKeys:
    """The record keys of a TLS 1.3 traffic secret (RFC 8446 7.3)."""
    key = hkdf_expand_label(suite.hash_name, secret, b"key", b"", suite.key_bytes)
    iv = hkdf_expand_label(suite.hash_name, secret, b"iv", b"", 12)
    return RecordKeys(suite, key, iv)


def tls13_next_secret(suite: CipherSuite, secret: bytes) -> bytes:
    """application_traffic_secret_N+1 after a KeyUpdate (RFC 8446 7.2)."""
    size = 48 if suite.hash_name == "sha384" else 32
    return hkdf_expand_label(suite.hash_name, secret, b"traffic upd", b"", size)
