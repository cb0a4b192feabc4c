"""No AMQP, no verdict: a capture with no packets, or no AMQP connection, is told so, never "No bottleneck".

A capture without a single packet is answered before Spark starts (the commands here run with no
Java to start it with); one with other traffic goes through analyze and its diagnosis says what it
holds instead, figures checked against tshark's.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap

from amqpscope.conf.settings import AnalyzeConfig
from amqpscope.ingest.pcap import capture_id
from amqpscope.jobs.cli.diagnose import exit_code
from amqpscope.jobs.cli.outcomes import ExitCode
from amqpscope.jobs.stages.analyze import analyze
from testbed.tshark import tshark_available

NO_PACKETS = "No AMQP traffic found: the capture has no packets."


def empty_pcap(path: Path) -> Path:
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, 1))  # the file header alone
    return path


def empty_pcapng(path: Path) -> Path:
    """A section header and one Ethernet interface, no packet block."""
    shb = struct.pack("<IIIHHqI", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1, 28)
    idb = struct.pack("<IIHHII", 1, 20, 1, 0, 262144, 20)
    path.write_bytes(shb + idb)
    return path


def without_java() -> dict[str, str]:
    """The environment with no java to start Spark's JVM with: a command that tried would fail."""
    env = dict(os.environ, JAVA_HOME="/nonexistent")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "java").exists())
    return env


def amqpscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "amqpscope", *args], capture_output=True, text=True, env=without_java(), timeout=300
    )


@pytest.mark.parametrize("make", [empty_pcap, empty_pcapng], ids=["pcap", "pcapng"])
def test_a_capture_without_packets_is_answered_before_spark_starts(tmp_path, make):
    capture = make(tmp_path / f"empty.{make.__name__.removeprefix('empty_')}")
    answer = amqpscope("diagnose", str(capture))
    assert answer.returncode == ExitCode.NOTHING_TO_JUDGE, answer.stderr
    assert answer.stdout == f"{capture} (capture {capture_id(capture)[:12]})\n  {NO_PACKETS}\n"

    lake = tmp_path / "lake"
    run = amqpscope("analyze", str(capture), "--lake", str(lake), "--progress", "never")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["diagnosis"] == {capture_id(capture): {"bottleneck": "no_amqp", "headline": NO_PACKETS}}
    assert out["report"] is None and out["tables"] == {}
    assert run.stderr == f"{capture_id(capture)[:12]}: {NO_PACKETS}\n"
    assert list(lake.iterdir()) == []  # nothing written to the lake


ETHER = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def http_connection(port: int, client_port: int, exchanges: int) -> list:
    """A TCP connection carrying HTTP: handshake, ``exchanges`` request/response pairs each acked, close."""
    c, s = ETHER / IP(src="10.1.0.1", dst="10.1.0.2"), ETHER / IP(src="10.1.0.2", dst="10.1.0.1")
    request, response = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    seq_c, seq_s = 1, 1
    out = [
        c / TCP(sport=client_port, dport=port, flags="S", seq=0),
        s / TCP(sport=port, dport=client_port, flags="SA", seq=0, ack=1),
        c / TCP(sport=client_port, dport=port, flags="A", seq=1, ack=1),
    ]
    for _ in range(exchanges):
        out.append(c / TCP(sport=client_port, dport=port, flags="PA", seq=seq_c, ack=seq_s) / request)
        seq_c += len(request)
        out.append(s / TCP(sport=port, dport=client_port, flags="A", seq=seq_s, ack=seq_c))
        out.append(s / TCP(sport=port, dport=client_port, flags="PA", seq=seq_s, ack=seq_c) / response)
        seq_s += len(response)
        out.append(c / TCP(sport=client_port, dport=port, flags="A", seq=seq_c, ack=seq_s))
    out += [
        c / TCP(sport=client_port, dport=port, flags="FA", seq=seq_c, ack=seq_s),
        s / TCP(sport=port, dport=client_port, flags="A", seq=seq_s, ack=seq_c + 1),
        s / TCP(sport=port, dport=client_port, flags="FA", seq=seq_s, ack=seq_c + 1),
        c / TCP(sport=client_port, dport=port, flags="A", seq=seq_c + 1, ack=seq_s + 1),
    ]
    return out


def dns(n: int) -> list:
    return [
        ETHER / IP(src="10.1.0.1", dst="10.1.0.53") / UDP(sport=40000 + i, dport=53) / (b"\x00" * 12) for i in range(n)
    ]


def tshark_counts(capture: Path) -> tuple[int, int, int]:
    """(packets, TCP conversations, AMQP frames with port 5672 decoded as AMQP) as tshark counts them."""

    def run(*args: str) -> str:
        return subprocess.run(["tshark", "-r", str(capture), *args], capture_output=True, text=True, check=True).stdout

    packets = len(run("-T", "fields", "-e", "frame.number").split())
    conversations = sum(1 for line in run("-q", "-z", "conv,tcp").splitlines() if "<->" in line)
    amqp = len(run("-d", "tcp.port==5672,amqp", "-Y", "amqp", "-T", "fields", "-e", "frame.number").split())
    return packets, conversations, amqp


@pytest.mark.tshark
@pytest.mark.skipif(not tshark_available(), reason="needs tshark")
def test_a_capture_without_amqp_gets_no_verdict(spark, tmp_path):
    web = tmp_path / "web.pcap"  # 200 packets: 3 HTTP connections on port 80, 3 DNS queries
    wrpcap(
        str(web),
        http_connection(80, 50001, 10) + http_connection(80, 50002, 14) + http_connection(8080, 50003, 20) + dns(3),
    )
    misplaced = tmp_path / "misplaced.pcap"  # the same, and HTTP on the AMQP port
    wrpcap(
        str(misplaced),
        http_connection(80, 50001, 10)
        + http_connection(80, 50002, 14)
        + http_connection(8080, 50003, 20)
        + http_connection(5672, 50004, 2)
        + dns(3),
    )
    assert tshark_counts(web) == (200, 3, 0)
    assert tshark_counts(misplaced) == (215, 4, 0)

    root = tmp_path / "lake"
    result = analyze(spark, [str(web), str(misplaced)], AnalyzeConfig(lake=root, report=root / "r.html"))
    answers = {a["capture_id"]: a for a in result.diagnoses}
    assert {cid: (a["bottleneck"], a["headline"], a["findings"]) for cid, a in answers.items()} == {
        capture_id(web): (
            "no_amqp",
            "No AMQP traffic found: 200 packets, 3 TCP connections on other ports; try --ports.",
            [],
        ),
        capture_id(misplaced): (
            "no_amqp",
            "No AMQP traffic found: 215 packets, 3 TCP connections on other ports, "
            "1 connection on the AMQP ports not AMQP (see connections.protocol); "
            "try --ports.",
            [],
        ),
    }
    assert exit_code(result.diagnoses) == ExitCode.NOTHING_TO_JUDGE
