"""Traffic that is not AMQP is classified, never decoded as nonsense; AMQP is found on any port."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from amqpscope.ingest.capture import decode_capture
from tests import amqp_bytes as b

ETHER = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def conversation(c2s: bytes, s2c: bytes, dport: int, sport: int = 50000):
    ip_c, ip_s = ETHER / IP(src="10.1.0.1", dst="10.1.0.2"), ETHER / IP(src="10.1.0.2", dst="10.1.0.1")
    return [
        ip_c / TCP(sport=sport, dport=dport, flags="S", seq=0),
        ip_s / TCP(sport=dport, dport=sport, flags="SA", seq=0, ack=1),
        ip_c / TCP(sport=sport, dport=dport, flags="PA", seq=1) / c2s,
        ip_s / TCP(sport=dport, dport=sport, flags="PA", seq=1) / s2c,
    ]


def decode(tmp_path: Path, packets, ports=(5672,)) -> dict[str, list[dict]]:
    path = tmp_path / "t.pcap"
    wrpcap(str(path), packets)
    out: dict[str, list[dict]] = defaultdict(list)
    for kind, row in decode_capture(path, "c", tuple(ports)):
        out[kind].append(row)
    return out


AMQP_C2S = b.HEADER_091 + b.basic_qos(1)
AMQP_S2C = b.basic_deliver(1)


def test_amqp_found_by_its_protocol_header_on_any_port(tmp_path):
    out = decode(tmp_path, conversation(AMQP_C2S, AMQP_S2C, dport=15999))
    [conn] = out["connections"]
    assert (conn["server_port"], conn["protocol"], conn["protocol_inferred"]) == (15999, "amqp-0-9-1", False)
    assert [f["method"] for f in out["frames"]] == ["amqp-0-9-1", "basic.qos", "basic.deliver"]


def test_http_on_the_amqp_port_is_quarantined_not_decoded(tmp_path):
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4
    out = decode(tmp_path, conversation(request, b"HTTP/1.1 200 OK\r\n\r\n", dport=5672))
    assert out["frames"] == []
    [conn] = out["connections"]
    assert (conn["protocol"], conn["c2s_bytes"], conn["s2c_bytes"]) == ("not-amqp", len(request), 19)
    # Every byte accounted: one quarantined run a direction, with the classification as reason.
    assert sorted((q["direction"], q["byte_count"], q["reason"]) for q in out["quarantine"]) == [
        ("c2s", len(request), "not decoded: not AMQP"),
        ("s2c", 19, "not decoded: not AMQP"),
    ]


def test_tls_is_recorded_with_its_handshake_bytes_as_tls(tmp_path):
    """Handshake records without a hello amqpscope can read: TLS's own bytes, nothing to decrypt (tests/test_tls.py decrypts)."""
    hello = bytes([0x16, 0x03, 0x01, 0x00, 0x40]) + bytes(0x40)
    out = decode(tmp_path, conversation(hello, bytes([0x16, 0x03, 0x03, 0x00, 0x02, 0, 0]), dport=5671), ports=(5671,))
    assert out["frames"] == [] and out["quarantine"] == []
    [conn] = out["connections"]
    assert (conn["protocol"], conn["tls_status"], conn["c2s_tls_bytes"], conn["s2c_tls_bytes"]) == (
        "tls",
        "handshake",
        69,
        7,
    )


def test_amqp_over_tls_header_starts_tls_on_any_port(tmp_path):
    out = decode(
        tmp_path,
        conversation(
            b"AMQP\x02\x01\x00\x00" + bytes([0x16, 3, 1, 0, 4, 1, 2, 3, 4]), b"AMQP\x02\x01\x00\x00", dport=15671
        ),
    )
    assert out["frames"] == [] and out["quarantine"] == []
    [conn] = out["connections"]
    assert (conn["protocol"], conn["c2s_tls_bytes"], conn["s2c_tls_bytes"]) == ("tls", 17, 8)


def test_tls_on_a_port_not_known_to_carry_amqp_is_ignored(tmp_path):
    hello = bytes([0x16, 0x03, 0x01, 0x00, 0x40]) + bytes(0x40)
    out = decode(tmp_path, conversation(hello, bytes([0x16, 0x03, 0x03, 0x00, 0x02, 0, 0]), dport=443))
    assert out["frames"] == [] and out["quarantine"] == [] and out["connections"] == []


def test_other_traffic_on_other_ports_is_ignored(tmp_path):
    out = decode(tmp_path, conversation(b"SSH-2.0-OpenSSH_9.2\r\n", b"SSH-2.0-OpenSSH_9.2\r\n", dport=22))
    assert out["frames"] == [] and out["quarantine"] == [] and out["connections"] == []
    assert out["captures"][0]["packets"] == 4
