"""The same AMQP conversation under every container and link layer amqpscope reads.

Scapy writes the captures (pcap µs and ns, pcapng; Ethernet with VLAN tags, Linux cooked SLL and
SLL2 as from ``tcpdump -i any``, raw IP, BSD loopback; IPv4 and IPv6); the decoded frames must be
identical to the plain Ethernet/IPv4 decode wherever the bytes are the same.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether, Loopback
from scapy.utils import PcapNgWriter, PcapWriter

from amqpscope.ingest.capture import decode_capture
from tests import amqp_bytes as b

# Explicit addresses: a bare Ether() makes Scapy resolve the destination MAC (ARP, with timeouts).
ETHER = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")

C2S = b.HEADER_091 + b.basic_qos(5) + b.basic_ack(1) + b.basic_ack(3, multiple=True)
S2C = b.basic_deliver(1) + b.content_header(4) + b.frame091(3, 1, b"body") + b.HEARTBEAT_091


def conversation(ip_c2s, ip_s2c, chunk: int = 9):
    """SYN, SYN-ACK, then both streams in small segments, alternating."""
    sport, dport, isn_c, isn_s = 41000, 5672, 100, 900
    out = [
        ip_c2s / TCP(sport=sport, dport=dport, flags="S", seq=isn_c),
        ip_s2c / TCP(sport=dport, dport=sport, flags="SA", seq=isn_s, ack=isn_c + 1),
    ]
    for i in range(0, max(len(C2S), len(S2C)), chunk):
        if i < len(C2S):
            out.append(ip_c2s / TCP(sport=sport, dport=dport, flags="PA", seq=isn_c + 1 + i) / C2S[i : i + chunk])
        if i < len(S2C):
            out.append(ip_s2c / TCP(sport=dport, dport=sport, flags="PA", seq=isn_s + 1 + i) / S2C[i : i + chunk])
    return out


V4 = (IP(src="192.0.2.1", dst="192.0.2.9"), IP(src="192.0.2.9", dst="192.0.2.1"))
V6 = (IPv6(src="2001:db8::1", dst="2001:db8::9"), IPv6(src="2001:db8::9", dst="2001:db8::1"))


def write(path: Path, packets, *, nano: bool = False, linktype: int | None = None) -> Path:
    with PcapWriter(str(path), nano=nano, linktype=linktype) as w:
        for p in timed(packets):
            w.write(p)
    return path


def timed(packets):
    """Fixed capture times, one millisecond apart (wrapping a packet in a layer resets its time)."""
    for n, p in enumerate(packets):
        p.time = Decimal(1_700_000_000) + Decimal(n) / 1000  # exact: a float would round the ns forms
    return packets


def essence(path: Path) -> tuple[list[tuple], list[dict]]:
    frames, conns = [], []
    for kind, row in decode_capture(path, "c"):
        if kind == "frames":
            frames.append(
                (
                    row["direction"],
                    row["stream_offset"],
                    row["frame_size"],
                    row["frame_type"],
                    row["method"],
                    row["ts_us"],
                    row["packet_number"],
                )
            )
        elif kind == "connections":
            conns.append(row)
    return frames, conns


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> list[tuple]:
    path = write(tmp_path_factory.mktemp("base") / "eth.pcap", [ETHER / p for p in conversation(*V4)])
    frames, [conn] = essence(path)
    assert len(frames) == 8 and conn["protocol"] == "amqp-0-9-1"
    # The SYN is packet 1 at +0 ms; the protocol header arrives in packet 3, at +2 ms.
    assert (frames[0][5], frames[0][6]) == (1_700_000_000_002_000, 3)

    return frames


LINK_LAYERS = {
    "vlan": lambda ip: ETHER / Dot1Q(vlan=10) / ip,
    "qinq": lambda ip: ETHER / Dot1AD(vlan=20) / Dot1Q(vlan=10) / ip,
    "linux_sll": lambda ip: CookedLinux(pkttype=0, lladdrtype=772, lladdrlen=6) / ip,
    "linux_sll2": lambda ip: CookedLinuxV2(proto=0x0800, pkttype=0, lladdrtype=772, lladdrlen=6) / ip,
    "bsd_loopback": lambda ip: Loopback(type=2) / ip,
}


@pytest.mark.parametrize("layer", sorted(LINK_LAYERS))
def test_link_layers_decode_identically(tmp_path, baseline, layer):
    wrap = LINK_LAYERS[layer]
    path = write(tmp_path / f"{layer}.pcap", [wrap(p) for p in conversation(*V4)])
    frames, [conn] = essence(path)
    assert frames == baseline
    assert conn["client_address"] == "192.0.2.1" and conn["server_port"] == 5672


def test_raw_ip_link_type(tmp_path, baseline):
    path = write(tmp_path / "raw.pcap", conversation(*V4), linktype=101)
    assert essence(path)[0] == baseline


def test_ipv6(tmp_path, baseline):
    path = write(tmp_path / "v6.pcap", [ETHER / p for p in conversation(*V6)])
    frames, [conn] = essence(path)
    assert frames == baseline
    assert (conn["client_address"], conn["server_address"]) == ("2001:db8::1", "2001:db8::9")


def test_nanosecond_pcap_keeps_microsecond_timestamps(tmp_path, baseline):
    path = write(tmp_path / "ns.pcap", [ETHER / p for p in conversation(*V4)], nano=True)
    assert essence(path)[0] == baseline


def test_pcapng(tmp_path, baseline):
    path = tmp_path / "eth.pcapng"
    with PcapNgWriter(str(path)) as w:
        for p in timed([ETHER / p for p in conversation(*V4)]):
            w.write(p)
    assert essence(path)[0] == baseline
