"""Link, IP and TCP headers of captured packets: just enough to get TCP segments out, fast.

Scapy reads the capture containers (``ingest.pcap``); dissecting every packet into Scapy layer
objects would cost ~50 µs a packet, so the fixed-layout headers below TCP are parsed here with
``struct`` instead (link types from the tcpdump LINKTYPE registry).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

# tcpdump.org LINKTYPE values handled here.
LINKTYPE_NULL = 0  # BSD loopback, family in host byte order
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108  # OpenBSD loopback, family in network byte order
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
LINK_TYPE_NAMES = {
    LINKTYPE_NULL: "null",
    LINKTYPE_ETHERNET: "ethernet",
    LINKTYPE_RAW: "raw",
    LINKTYPE_LOOP: "loop",
    LINKTYPE_LINUX_SLL: "linux_sll",
    LINKTYPE_IPV4: "ipv4",
    LINKTYPE_IPV6: "ipv6",
    LINKTYPE_LINUX_SLL2: "linux_sll2",
}

_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_ETHERTYPE_VLAN = (0x8100, 0x88A8, 0x9100)
_BSD_AF_INET6 = (24, 28, 30)  # AF_INET6 differs between the BSDs
_IPV6_EXTENSIONS = (0, 43, 60)  # hop-by-hop, routing, destination options

TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10

# TCP options (IANA "TCP Option Kind Numbers"): end of list, no-operation, window scale (RFC 7323 2.2).
_TCPOPT_EOL, _TCPOPT_NOP, _TCPOPT_WSCALE = 0, 1, 3
# RFC 7323 2.3: a shift count above 14 is treated as 14.
MAX_WINDOW_SCALE = 14


@dataclass(frozen=True, slots=True)
class Segment:
    """A TCP segment as captured."""

    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    ack: int
    flags: int
    window: int
    payload: bytes
    truncated: bool  # snaplen cut the payload short
    window_scale: int | None = None  # shift count of a SYN's window scale option; None without one


def _network_offset(linktype: int, frame: bytes) -> tuple[int, int] | None:
    """(offset of the IP header, IP version) for a link-layer frame, None if not IP."""
    if linktype == LINKTYPE_ETHERNET:
        if len(frame) < 14:
            return None
        offset, ethertype = 14, struct.unpack_from(">H", frame, 12)[0]
        while ethertype in _ETHERTYPE_VLAN and len(frame) >= offset + 4:
            ethertype = struct.unpack_from(">H", frame, offset + 2)[0]
            offset += 4
    elif linktype == LINKTYPE_LINUX_SLL:
        if len(frame) < 16:
            return None
        offset, ethertype = 16, struct.unpack_from(">H", frame, 14)[0]
    elif linktype == LINKTYPE_LINUX_SLL2:
        if len(frame) < 20:
            return None
        offset, ethertype = 20, struct.unpack_from(">H", frame, 0)[0]
    elif linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        if len(frame) < 4:
            return None
        family = struct.unpack_from("<I" if linktype == LINKTYPE_NULL else ">I", frame, 0)[0]
        if family > 0xFFFF:  # written by a host of the other byte order
            family = struct.unpack_from(">I" if linktype == LINKTYPE_NULL else "<I", frame, 0)[0]
        ethertype = _ETHERTYPE_IPV4 if family == 2 else _ETHERTYPE_IPV6 if family in _BSD_AF_INET6 else 0
        offset = 4
    elif linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6):
        if not frame:
            return None
        return 0, frame[0] >> 4
    else:
        return None
    if ethertype == _ETHERTYPE_IPV4:
        return offset, 4
    if ethertype == _ETHERTYPE_IPV6:
        return offset, 6
    return None


def parse_tcp(linktype: int, frame: bytes, wirelen: int) -> Segment | None:
    """The TCP segment inside a captured frame, or None when the frame carries no TCP."""
    located = _network_offset(linktype, frame)
    if located is None:
        return None
    ip, version = located
    if version == 4:
        if len(frame) < ip + 20:
            return None
        ihl = (frame[ip] & 0x0F) * 4
        total_length, frag, proto = struct.unpack_from(">H2xHxB", frame, ip + 2)
        if proto != 6 or frag & 0x1FFF or frag & 0x2000:  # not TCP, or a fragment
            return None
        src, dst = socket.inet_ntoa(frame[ip + 12 : ip + 16]), socket.inet_ntoa(frame[ip + 16 : ip + 20])
        tcp = ip + ihl
        # TSO on capture hosts gives total_length 0; otherwise it trims Ethernet padding.
        ip_end = ip + total_length if total_length else ip + (wirelen - ip)
    elif version == 6:
        if len(frame) < ip + 40:
            return None
        payload_length, next_header = struct.unpack_from(">HB", frame, ip + 4)
        src = socket.inet_ntop(socket.AF_INET6, frame[ip + 8 : ip + 24])
        dst = socket.inet_ntop(socket.AF_INET6, frame[ip + 24 : ip + 40])
        tcp = ip + 40
        while next_header in _IPV6_EXTENSIONS and len(frame) >= tcp + 2:
            next_header, ext_len = frame[tcp], (frame[tcp + 1] + 1) * 8
            tcp += ext_len
        if next_header != 6:
            return None
        ip_end = ip + 40 + payload_length if payload_length else ip + (wirelen - ip)
    else:
        return None
    if len(frame) < tcp + 20:
        return None
    sport, dport, seq, ack, offset_flags, window = struct.unpack_from(">HHIIHH", frame, tcp)
    data_offset = (offset_flags >> 12) * 4
    flags = offset_flags & 0x3F
    start = tcp + data_offset
    wire_end = ip_end
    captured_end = min(len(frame), wire_end)
    payload = frame[start:captured_end] if captured_end > start else b""
    # Only a SYN may carry the window scale option (RFC 7323 2.2); other segments skip the walk.
    scale = _window_scale(frame[tcp + 20 : min(start, len(frame))]) if flags & TCP_SYN else None
    return Segment(src, sport, dst, dport, seq, ack, flags, window, payload, captured_end < wire_end, scale)


def _window_scale(options: bytes) -> int | None:
    """The shift count of the window scale option (kind 3, length 3) in a SYN's options, if any."""
    pos = 0
    while pos < len(options):
        kind = options[pos]
        if kind == _TCPOPT_EOL:
            return None
        if kind == _TCPOPT_NOP:
            pos += 1
            continue
        if pos + 1 >= len(options) or options[pos + 1] < 2:
            return None  # malformed length: stop rather than guess
        length = options[pos + 1]
        if kind == _TCPOPT_WSCALE and length == 3 and pos + 2 < len(options):
            return min(options[pos + 2], MAX_WINDOW_SCALE)
        pos += length
    return None
