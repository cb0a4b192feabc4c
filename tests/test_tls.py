"""TLS: records decrypted with the clients' key log decode to the frames of the plain traffic they carry.

The sessions are real OpenSSL sessions (Python's ``ssl`` over memory BIOs, or ``openssl s_client``
and ``s_server``) carrying the AMQP bytes of the bundled plain samples, write for write; the
references are those samples' own frames and tshark with the same key log. The key schedules are
checked against RFC 8448's published values and OpenSSL's own TLS 1.2 PRF (``openssl kdf``).
"""

from __future__ import annotations

import subprocess
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from amqpscope.ingest.capture import decode_capture
from amqpscope.ingest.tls_crypto import SUITES, hkdf_expand_label, prf, tls13_keys
from amqpscope.ingest.tls_keylog import KeyLog, KeyLogError, check_key_logs
from testbed.tls import dh_parameters, make_certificates, new_client_context, new_server_context
from testbed.tshark import decoded_frames, tshark_available
from tests.paths import SAMPLES
from tests.test_tshark_fields import compare_frames
from tests.tls_traffic import conversation, memory_session, openssl_session, write_capture

SAMPLE_091, SAMPLE_10 = SAMPLES / "amqp091-qos-confirms.pcap", SAMPLES / "amqp10-credit.pcap"
PORT = 5671
needs_tshark = pytest.mark.skipif(not tshark_available(), reason="tshark not installed")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    folder = tmp_path_factory.mktemp("throwaway-ca")
    return {
        "ec": make_certificates(folder / "ec", "ec"),
        "rsa": make_certificates(folder / "rsa", "rsa"),
        "dh": dh_parameters(folder),
    }


def decode(pcap: Path, keylog: Path | None = None, segments: bool = False) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for kind, row in decode_capture(pcap, "c", segments=segments, tls_keylog=[keylog] if keylog else ()):
        out[kind].append(row)
    return out


def essence(frames: list[dict]) -> list[tuple]:
    """What a frame is, whatever carried it: every decoded column, not where the capture put it."""
    where = {
        "capture_id",
        "connection_id",
        "frame_index",
        "ts",
        "ts_us",
        "packet_number",
        "tls_record_number",
        "stream_offset",
    }
    return sorted(
        (f["direction"], f["stream_offset"], sorted((k, repr(v)) for k, v in f.items() if k not in where))
        for f in frames
    )


def assert_accounted(out: dict[str, list[dict]]) -> None:
    """payload = framed + quarantined + TLS's own bytes, and the gaps are the missing bytes, each way."""
    framed: Counter = Counter()
    quarantined: Counter = Counter()
    gaps: Counter = Counter()
    for f in out["frames"]:
        framed[f["direction"]] += f["frame_size"]
    for q in out["quarantine"]:
        (gaps if q["missing"] else quarantined)[q["direction"]] += q["byte_count"]
    (connection,) = out["connections"]
    for d in ("c2s", "s2c"):
        assert connection[f"{d}_bytes"] == framed[d] + quarantined[d] + connection[f"{d}_tls_bytes"], d
        assert connection[f"{d}_missing_bytes"] == gaps[d], d


def plain_frames(sample: Path) -> list[dict]:
    return [r for k, r in decode_capture(sample, "plain") if k == "frames"]


def session_capture(
    tmp_path: Path,
    certificates,
    version: str,
    ciphers: str | None,
    key: str,
    sample: Path,
    name: str = "tls",
    **capture,
) -> tuple[Path, Path]:
    keylog = tmp_path / f"{name}.keylog"
    client = new_client_context(certificates[key].ca_certificate, keylog, version, ciphers)
    server = new_server_context(
        certificates[key], ciphers, certificates["dh"] if ciphers and "DHE-" in ciphers else None
    )
    session = memory_session(client, server, conversation(sample, limit=capture.pop("limit", None)))
    return write_capture(tmp_path / f"{name}.pcap", session.transcript, **capture), keylog


# -- decrypted: the same frames as plain, and as tshark's ----------------------------------------------

CASES = [
    ("1.3", None, "ec", SAMPLE_091, "TLS_AES_256_GCM_SHA384"),
    ("1.3", None, "rsa", SAMPLE_10, "TLS_AES_256_GCM_SHA384"),
    ("1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", "ec", SAMPLE_10, "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"),
    ("1.2", "ECDHE-ECDSA-AES256-GCM-SHA384", "ec", SAMPLE_091, "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"),
    ("1.2", "ECDHE-ECDSA-CHACHA20-POLY1305", "ec", SAMPLE_091, "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("1.2", "ECDHE-RSA-AES256-GCM-SHA384", "rsa", SAMPLE_10, "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"),
    ("1.2", "ECDHE-RSA-CHACHA20-POLY1305", "rsa", SAMPLE_10, "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"),
    ("1.2", "DHE-RSA-AES128-GCM-SHA256", "rsa", SAMPLE_10, "TLS_DHE_RSA_WITH_AES_128_GCM_SHA256"),
    ("1.2", "AES128-GCM-SHA256", "rsa", SAMPLE_10, "TLS_RSA_WITH_AES_128_GCM_SHA256"),
]


@needs_tshark
@pytest.mark.tshark
@pytest.mark.parametrize("version, ciphers, key, sample, suite", CASES, ids=lambda v: getattr(v, "name", v))
def test_decrypted_sessions_give_the_plain_frames_and_tsharks(
    tmp_path, certificates, version, ciphers, key, sample, suite
):
    pcap, keylog = session_capture(tmp_path, certificates, version, ciphers, key, sample)
    out = decode(pcap, keylog)
    assert essence(out["frames"]) == essence(plain_frames(sample))
    assert out["quarantine"] == []
    assert_accounted(out)
    (connection,) = out["connections"]
    assert (
        connection["tls_version"],
        connection["tls_cipher_suite"],
        connection["tls_sni"],
        connection["tls_status"],
    ) == (f"TLS {version}", suite, "localhost", "decrypted")
    assert connection["protocol"] == out["frames"][0]["protocol"]
    result = compare_frames(out["frames"], decoded_frames(pcap, PORT, keylog))
    assert result.mismatches == []
    assert result.frames > 200 and result.values > 5 * result.frames


@needs_tshark
@pytest.mark.tshark
def test_each_frame_names_a_record_tshark_shows_completing_in_its_packet(tmp_path, certificates):
    pcap, keylog = session_capture(
        tmp_path, certificates, "1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", "ec", SAMPLE_10, mss=300
    )
    fields = subprocess.run(
        [
            "tshark",
            "-r",
            str(pcap),
            "-o",
            f"tls.keylog_file:{keylog}",
            "-d",
            f"tcp.port=={PORT},tls",
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "tcp.srcport",
            "-e",
            "tls.record.content_type",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    through: dict[tuple[str, int], int] = {}  # records of a direction completed by the end of a packet
    seen: Counter = Counter()
    for line in fields.splitlines():
        number, sport, types = line.split("\t")
        direction = "s2c" if int(sport) == PORT else "c2s"
        seen[direction] += len(types.split(",")) if types else 0
        through[direction, int(number)] = seen[direction]
    frames = decode(pcap, keylog)["frames"]
    assert len(frames) > 200
    for f in frames:
        before = max((n for (d, p), n in through.items() if d == f["direction"] and p < f["packet_number"]), default=0)
        assert before < f["tls_record_number"] <= through[f["direction"], f["packet_number"]], f


@pytest.mark.parametrize("mss", [1, 7, 16_000, 65_000])
def test_records_span_segments_and_segments_hold_records(tmp_path, certificates, mss):
    """Segments of 1 byte to 65 KB (records of up to 16 KB cut anywhere, or many in one segment)."""
    options = {"limit": 40} if mss < 100 else {}
    reference, keylog = session_capture(tmp_path, certificates, "1.3", None, "ec", SAMPLE_10, name="ref", **options)
    want = decode(reference, keylog)["frames"]
    recut = write_capture(tmp_path / "recut.pcap", _transcript_of(reference), mss=mss)
    got = decode(recut, keylog)
    assert essence(got["frames"]) == essence(want) and len(want) > 20
    assert [f["tls_record_number"] for f in got["frames"]] == [f["tls_record_number"] for f in want]
    assert_accounted(got)


def _transcript_of(pcap: Path) -> list[tuple[str, bytes]]:
    from tests.tls_traffic import SERVER

    return conversation(pcap, server_port=SERVER[1])


# -- not decrypted: recorded, quarantined with the reason, accounted ------------------------------------


def test_without_a_key_log_the_connection_is_recorded_and_its_bytes_quarantined(tmp_path, certificates):
    pcap, _ = session_capture(tmp_path, certificates, "1.3", None, "ec", SAMPLE_091)
    out = decode(pcap, segments=True)
    assert out["frames"] == []
    (connection,) = out["connections"]
    assert (
        connection["protocol"],
        connection["tls_version"],
        connection["tls_cipher_suite"],
        connection["tls_sni"],
        connection["tls_status"],
    ) == ("tls", "TLS 1.3", "TLS_AES_256_GCM_SHA384", "localhost", "tls.no_key")
    assert (connection["client_port"], connection["server_port"]) == (40001, 5671)
    reasons = {(q["reason_id"], q["reason"]) for q in out["quarantine"]}
    assert reasons == {
        (
            "tls.no_key",
            "encrypted, not decoded: the key log has no secret for this TLS session "
            "(give --tls-keylog) (no key log given)",
        )
    }
    assert len(out["quarantine"]) == 2  # one run a direction
    assert_accounted(out)
    # Its TCP is still there for the TCP-level findings: every packet of the connection.
    assert len(out["tcp_segments"]) == sum(1 for _ in open_records(pcap))


def _segment(record):
    from amqpscope.ingest.packets import parse_tcp

    return parse_tcp(record.linktype, record.data, record.wirelen)


def open_records(pcap: Path):
    from amqpscope.ingest.pcap import read_records

    return read_records(pcap)


def test_keys_of_another_session_fail_to_decrypt(tmp_path, certificates):
    pcap, _ = session_capture(
        tmp_path, certificates, "1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", "ec", SAMPLE_10, name="one", limit=30
    )
    _, other_keylog = session_capture(
        tmp_path, certificates, "1.2", "ECDHE-ECDSA-AES128-GCM-SHA256", "ec", SAMPLE_10, name="two", limit=30
    )
    # The other session's master secret filed under this session's client random: keys that do not match.
    this = decode(pcap, tmp_path / "one.keylog")["connections"][0]
    assert this["tls_status"] == "decrypted"
    (_, random_hex, _), (_, _, other_secret) = _key_lines(tmp_path / "one.keylog") + _key_lines(other_keylog)
    wrong = tmp_path / "wrong.keylog"
    wrong.write_text(f"CLIENT_RANDOM {random_hex} {other_secret}\n")
    out = decode(pcap, wrong)
    assert out["frames"] == [] and out["connections"][0]["tls_status"] == "tls.decrypt_failed"
    assert {q["reason_id"] for q in out["quarantine"]} == {"tls.decrypt_failed"}
    assert_accounted(out)


def _key_lines(keylog: Path) -> list[list[str]]:
    return [line.split() for line in keylog.read_text().splitlines() if line and not line.startswith("#")]


def test_a_suite_not_decrypted_is_named(tmp_path, certificates):
    pcap, keylog = session_capture(tmp_path, certificates, "1.2", "ECDHE-ECDSA-AES128-SHA", "ec", SAMPLE_10, limit=30)
    out = decode(pcap, keylog)
    assert out["frames"] == []
    assert out["connections"][0]["tls_status"] == "tls.cipher_unsupported"
    assert {(q["reason_id"], q["reason"]) for q in out["quarantine"]} == {
        (
            "tls.cipher_unsupported",
            "encrypted, not decoded: the cipher suite is not one amqpscope decrypts (AES-GCM or "
            "ChaCha20-Poly1305) (TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA)",
        )
    }
    assert_accounted(out)


def test_a_missing_segment_loses_its_records_and_decoding_goes_on(tmp_path, certificates):
    whole, keylog = session_capture(
        tmp_path, certificates, "1.2", "ECDHE-ECDSA-CHACHA20-POLY1305", "ec", SAMPLE_091, name="whole", mss=50
    )
    want = decode(whole, keylog)["frames"]
    # A packet in the middle of a run of full ones of one direction: its bytes cut a record.
    sizes = [(seg.sport, len(seg.payload)) for seg in map(_segment, open_records(whole))]
    lost = (
        next(
            n
            for n in range(len(sizes) // 2, len(sizes) - 1)
            if sizes[n - 2] == sizes[n - 1] == sizes[n] == (sizes[n - 1][0], 50)
        )
        + 1
    )
    damaged = write_capture(tmp_path / "lost.pcap", _transcript_of(whole), mss=50, drop=[lost])
    out = decode(damaged, keylog)
    assert_accounted(out)
    reasons = Counter(q["reason_id"] for q in out["quarantine"])
    assert reasons["tcp.gap"] == 1 and reasons["tls.segment_missing"] >= 1
    # Offsets after the gap count the bytes decrypted, so frames are compared by what they are.
    got = Counter((e[0], repr(e[2])) for e in essence(out["frames"]))
    expected = Counter((e[0], repr(e[2])) for e in essence(want))
    # The frames of the records the gap cut (and a frame they split) are gone: only a few.
    assert not got - expected and 0 < sum((expected - got).values()) <= 6
    # Every frame completed after the gap in the lost direction is decoded: decoding went on.
    lost_direction = next(q["direction"] for q in out["quarantine"] if q["missing"])
    gap_at = next(q["stream_offset"] for q in out["quarantine"] if q["reason_id"] == "tls.segment_missing")
    last = [f["method"] for f in out["frames"] if f["direction"] == lost_direction][-3:]
    assert last == [f["method"] for f in want if f["direction"] == lost_direction][-3:] and gap_at > 0


def test_a_capture_cut_inside_a_record(tmp_path, certificates):
    whole, keylog = session_capture(
        tmp_path, certificates, "1.3", None, "ec", SAMPLE_10, name="whole", mss=100, limit=80
    )
    records = list(open_records(whole))
    cut = tmp_path / "cut.pcap"
    from tests.test_damaged_captures import write_pcap

    write_pcap(cut, records[: len(records) - 7])  # the FINs and the last segments of a record
    out = decode(cut, keylog)
    truncated = [q for q in out["quarantine"] if q["reason_id"] == "tls.record_truncated"]
    assert len(truncated) == 1 and " bytes)" in truncated[0]["reason"]
    assert_accounted(out)
    assert len(out["frames"]) > 20


def test_a_capture_started_after_the_handshake(tmp_path, certificates):
    whole, keylog = session_capture(tmp_path, certificates, "1.3", None, "ec", SAMPLE_10, name="whole", limit=80)
    transcript = _transcript_of(whole)
    # From the first application-data record on: the handshake (both hellos) is not in the capture.
    first = next(i for i, (d, data) in enumerate(transcript) if i > 4 and d == "c2s" and data[0] == 23)
    late = write_capture(tmp_path / "late.pcap", transcript[first:])
    out = decode(late, keylog)
    assert out["frames"] == []
    assert out["connections"][0]["protocol"] == "tls"
    assert {q["reason_id"] for q in out["quarantine"]} == {"tls.no_handshake"}
    assert_accounted(out)


# -- TLS 1.3 in full: ChaCha20 and AES-128, key updates; AMQP 1.0's TLS header ----------------------------


@needs_tshark
@pytest.mark.tshark
@pytest.mark.parametrize("suite", ["TLS_CHACHA20_POLY1305_SHA256", "TLS_AES_128_GCM_SHA256"])
def test_tls13_suites_and_key_updates_each_way(tmp_path, certificates, suite):
    """openssl s_client sends a KeyUpdate ("k"), then one asking for the server's too ("K")."""
    keylog = tmp_path / "k.keylog"
    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    transcript = openssl_session(
        certificates["ec"],
        keylog,
        suite,
        [b"AMQP\x00\x00\x09\x01", 0.3, heartbeat * 3, 0.3, b"k\n", 0.3, heartbeat * 2, 0.3, b"K\n", 0.3, heartbeat],
    )
    pcap = write_capture(tmp_path / "ku.pcap", transcript)
    out = decode(pcap, keylog)
    assert [(f["direction"], f["frame_type"]) for f in out["frames"]] == [("c2s", "protocol-header")] + [
        ("c2s", "heartbeat")
    ] * 6
    records = [f["tls_record_number"] for f in out["frames"]]
    assert len(set(records)) == 4  # before, between and after the two key updates
    assert out["connections"][0]["tls_cipher_suite"] == suite and out["quarantine"] == []
    assert_accounted(out)
    result = compare_frames(out["frames"], decoded_frames(pcap, PORT, keylog))
    assert result.mismatches == [] and result.frames == 6


def test_amqp10_tls_protocol_header_then_the_handshake(tmp_path, certificates):
    """AMQP 1.0 part 5.2.1: ``AMQP 2 1 0 0`` each way, then TLS, then the AMQP inside it."""
    keylog = tmp_path / "h.keylog"
    header = b"AMQP\x02\x01\x00\x00"
    session = memory_session(
        new_client_context(certificates["ec"].ca_certificate, keylog, "1.3"),
        new_server_context(certificates["ec"]),
        conversation(SAMPLE_10),
    )
    pcap = write_capture(
        tmp_path / "h.pcap", [("c2s", header), ("s2c", header), *session.transcript], server=("10.1.0.2", 5672)
    )
    out = decode(pcap, keylog)
    assert essence(out["frames"]) == essence(plain_frames(SAMPLE_10))
    assert out["connections"][0]["tls_status"] == "decrypted" and out["quarantine"] == []
    assert_accounted(out)
    # On a port not known to carry AMQP the header alone says it is AMQP over TLS.
    elsewhere = write_capture(
        tmp_path / "e.pcap", [("c2s", header), ("s2c", header), *session.transcript], server=("10.1.0.2", 15000)
    )
    assert essence(decode(elsewhere, keylog)["frames"]) == essence(out["frames"])


# -- secrets stay secret ---------------------------------------------------------------------------------


def test_no_secret_reaches_a_row(tmp_path, certificates):
    pcap, keylog = session_capture(tmp_path, certificates, "1.3", None, "ec", SAMPLE_10, limit=60)
    secrets = [secret for _, _, secret in _key_lines(keylog)]
    assert len(secrets) == 5  # client and server handshake and traffic secrets, exporter secret
    text = repr(decode(pcap, keylog)).lower()
    for secret in secrets:
        assert secret.lower() not in text
        assert repr(bytes.fromhex(secret)).lower() not in text


def test_key_log_problems_name_the_file_and_line_never_the_content(tmp_path):
    secret = "ab" * 48
    log = tmp_path / "k.keylog"
    log.write_text(f"# comment\nCLIENT_RANDOM {'00' * 32} {secret}\nCLIENT_RANDOM nothex {secret}\ngarbage\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = KeyLog([str(log)])
        assert keys.secret(bytes(32), "CLIENT_RANDOM") == bytes.fromhex(secret)
    (warning,) = [w for w in caught if "key log" in str(w.message)]
    assert str(warning.message) == f"TLS key log {log}: 2 malformed line(s) skipped (first: line 3)"
    assert secret not in repr(keys) and "1 file" in repr(keys)
    with pytest.raises(FileNotFoundError, match="no such file"):
        check_key_logs([tmp_path / "absent.keylog"])
    empty = tmp_path / "empty.keylog"
    empty.write_text("# nothing\n")
    with pytest.raises(KeyLogError, match="no CLIENT_RANDOM or TLS 1.3 traffic secret lines"):
        check_key_logs([empty])


# -- key schedules against their references ----------------------------------------------------------------


def test_tls13_traffic_keys_are_rfc8448s():
    """RFC 8448 section 3 (TLS_AES_128_GCM_SHA256): the handshake traffic secrets and the key and
    IV it lists for each; the application secret's "traffic upd" is RFC 8446 7.2's label."""
    suite = SUITES[0x1301]
    server = bytes.fromhex("b67b7d690cc16c4e75e54213cb2d37b4e9c912bcded9105d42befd59d391ad38")
    client = bytes.fromhex("b3eddb126e067f35a780b3abf45e2d8f3b1a950738f52e9600746a0e27a55a21")
    assert hkdf_expand_label("sha256", server, b"key", b"", 16).hex() == "3fce516009c21727d0f2e4e86ee403bc"
    assert hkdf_expand_label("sha256", server, b"iv", b"", 12).hex() == "5d313eb2671276ee13000b30"
    assert hkdf_expand_label("sha256", client, b"key", b"", 16).hex() == "dbfaa693d1762c5b666af5d950258d01"
    assert hkdf_expand_label("sha256", client, b"iv", b"", 12).hex() == "5bd3c71b836e0b76bb73265f"
    assert repr(tls13_keys(suite, server)) == "RecordKeys(TLS_AES_128_GCM_SHA256)"


@pytest.mark.parametrize("digest, hash_name, length", [("SHA2-256", "sha256", 100), ("SHA2-384", "sha384", 148)])
def test_tls12_prf_is_openssls(digest, hash_name, length):
    secret, seed = bytes.fromhex("9bbe436ba940f017b17652849a71db35"), bytes.fromhex("a0ba9f936cda311827a6f796ffd5198c")
    reference = (
        subprocess.run(
            [
                "openssl",
                "kdf",
                "-keylen",
                str(length),
                "-kdfopt",
                f"digest:{digest}",
                "-kdfopt",
                f"hexsecret:{secret.hex()}",
                "-kdfopt",
                f"hexseed:{(b'test label' + seed).hex()}",
                "TLS1-PRF",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.strip()
        .replace(":", "")
        .lower()
    )
    assert prf(hash_name, secret, b"test label", seed, length).hex() == reference
    if hash_name == "sha256":  # and the vector circulated on the TLS working group's list
        assert reference.startswith("e3f229ba727be17b8d122620557cd453c2aab21d07c3d495329b52d4e61edb5a")


@pytest.mark.parametrize("junk", [b"\x41", b"\x03", b"\x17\x03\x03"], ids=["letters", "threes", "header-starts"])
def test_bytes_that_are_no_records_are_quarantined_as_they_come_not_held(junk):
    """Megabytes with no record boundary (or a header start every 3 bytes whose records never chain)
    after a real record: each feed quarantines what it ruled out, and keeps a handful of bytes."""
    from amqpscope.ingest.tcp import Data
    from amqpscope.ingest.tls_stream import Problem, TlsSession

    session = TlsSession(None)
    session.feed("c2s", Data(0, bytes([22, 3, 1, 0, 5, 1, 0, 0, 1, 0]), 1, 0))
    chunk = (junk * (65536 // len(junk) + 1))[:65536]
    offset, quarantined = 10, 0
    for number in range(2, 82):  # 5 MiB
        for _direction, item in session.feed("c2s", Data(offset, chunk, number, 0)):
            quarantined += item.size if isinstance(item, Problem) else 0
        offset += len(chunk)
        assert len(session.sides["c2s"].buf) < 20_000  # at most one record's worth waits to be told
    quarantined += sum(item.size for _d, item in session.finish("c2s", 99) if isinstance(item, Problem))
    assert quarantined + session.tls_bytes("c2s") == offset
