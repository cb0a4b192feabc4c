"""Link, IP and TCP headers of captured packets: just enough to get TCP segments out, fast.

Dissecting every packet into Scapy layer objects would cost ~50 µs a packet, so the fixed-layout
headers below TCP are parsed here with ``struct`` instead (link types from the tcpdump LINKTYPE
registry), with a fast path for the common case, Ethernet + IPv4 (about 1 µs a packet).
"""

from __future__ import annotations

import socket
import struct
from typing import Final, NamedTuple

# tcpdump.org LINKTYPE values handled here.
LINKTYPE_NULL: Final = 0  # BSD loopback, family in host byte order
LINKTYPE_ETHERNET: Final = 1
LINKTYPE_RAW: Final = 101
LINKTYPE_LOOP: Final = 108  # OpenBSD loopback, family in network byte order
LINKTYPE_LINUX_SLL: Final = 113
LINKTYPE_IPV4: Final = 228
LINKTYPE_IPV6: Final = 229
LINKTYPE_LINUX_SLL2: Final = 276
LINK_TYPE_NAMES: Final = {
    LINKTYPE_NULL: "null",
    LINKTYPE_ETHERNET: "ethernet",
    LINKTYPE_RAW: "raw",
    LINKTYPE_LOOP: "loop",
    LINKTYPE_LINUX_SLL: "linux_sll",
    LINKTYPE_IPV4: "ipv4",
    LINKTYPE_IPV6: "ipv6",
    LINKTYPE_LINUX_SLL2: "linux_sll2",
}

_ETHERTYPE_IPV4: Final = 0x0800
_ETHERTYPE_IPV6: Final = 0x86DD
_ETHERTYPE_VLAN: Final = (0x8100, 0x88A8, 0x9100)
_BSD_AF_INET6: Final = (24, 28, 30)  # AF_INET6 differs between the BSDs
_IPV6_EXTENSIONS: Final = (0, 43, 60)  # hop-by-hop, routing, destination options

TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10

# TCP options (IANA "TCP Option Kind Numbers"): end of list, no-operation, window scale (RFC 7323 2.2),
# SACK (RFC 2018 3).
_TCPOPT_EOL, _TCPOPT_NOP, _TCPOPT_WSCALE, _TCPOPT_SACK = 0, 1, 3, 5
# The shortest options that can hold a SACK block: kind, length and one block of two edges (RFC 2018 3).
_SACK_MIN_OPTIONS: Final = 10
# RFC 7323 2.3: a shift count above 14 is treated as 14.
MAX_WINDOW_SCALE: Final = 14


class Segment(NamedTuple):
    """A TCP segment as captured (a tuple: one is made for every packet, so it must be cheap)."""

    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    ack: int
    flags: int
    window: int
    payload: bytes  # the payload bytes the capture holds
    # Payload bytes on the wire that the capture does not hold (cut by the snapshot length): the
    # payload's length on the wire is len(payload) + missing, from the IP total / payload length.
    missing: int = 0
    window_scale: int | None = None  # shift count of a SYN's window scale option; None without one
    # A D-SACK (RFC 2883): the sequence numbers [left, right) the sender received twice, reported
    # in the first block of its SACK option; None when the segment reports none.
    dsack: tuple[int, int] | None = None

    @property
    def truncated(self) -> bool:
        """Whether the snapshot length cut the payload short."""
        return self.missing > 0


_new_segment: Final = tuple.__new__  # Segment's fields positionally, without NamedTuple's keyword-handling __new__
_IPV4: Final = struct.Struct(">BxHxxHxB2x4s4s")  # version/IHL, total length, flags/fragment offset, protocol, addresses
_IPV6: Final = struct.Struct(">4xHBx16s16s")  # payload length, next header, addresses
_TCP: Final = struct.Struct(">HHIIHH")  # ports, sequence and acknowledgement numbers, offset/flags, window
_ETHERTYPE_IPV4_BYTES: Final = b"\x08\x00"
# Address texts by their bytes: a capture has few addresses and millions of packets.
_ADDRESS_TEXT: Final[dict[bytes, str]] = {}
_ADDRESS_CACHE_LIMIT: Final = 1 << 16


def _address(raw: bytes) -> str:
    """The text of an IPv4 or IPv6 address, remembered (callers look in ``_ADDRESS_TEXT`` first)."""
    if len(_ADDRESS_TEXT) >= _ADDRESS_CACHE_LIMIT:
        _ADDRESS_TEXT.clear()
    text = _ADDRESS_TEXT[raw] = socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)
    return text


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
    if linktype == LINKTYPE_ETHERNET and frame[12:14] == _ETHERTYPE_IPV4_BYTES:
        ip, version = 14, 4  # by far the most common case: skip the general link-layer walk
    else:
        located = _network_offset(linktype, frame)
        if located is None:
            return None
        ip, version = located
    size = len(frame)
    if version == 4:
        if size < ip + 20:
            return None
        version_ihl, total_length, frag, proto, src, dst = _IPV4.unpack_from(frame, ip)
        if proto != 6 or frag & 0x3FFF:  # not TCP, or a fragment (more-fragments flag or an offset)
            return None
        tcp = ip + (version_ihl & 0x0F) * 4
        # The IP total length trims Ethernet padding and tells the payload's length on the wire however
        # short the capture cut the packet (bounded by the frame's own wire length: bytes a bad header
        # claims beyond it were never sent). TSO on capture hosts gives 0: the frame's length then.
        ip_end = min(ip + total_length, max(wirelen, size)) if total_length else wirelen
    elif version == 6:
        if size < ip + 40:
            return None
        payload_length, next_header, src, dst = _IPV6.unpack_from(frame, ip)
        tcp = ip + 40
        while next_header in _IPV6_EXTENSIONS and size >= tcp + 2:
            next_header, ext_len = frame[tcp], (frame[tcp + 1] + 1) * 8
            tcp += ext_len
        if next_header != 6:
            return None
        # As for IPv4; a payload length of 0 is a jumbogram or TSO.
        ip_end = min(ip + 40 + payload_length, max(wirelen, size)) if payload_length else wirelen
    else:
        return None
    if size < tcp + 20:
        return None
    sport, dport, seq, ack, offset_flags, window = _TCP.unpack_from(frame, tcp)
    start = tcp + (offset_flags >> 12) * 4
    flags = offset_flags & 0x3F
    payload = frame[start:ip_end]
    missing = ip_end - start - len(payload) if ip_end > start else 0
    # Only a SYN may carry the window scale option (RFC 7323 2.2); other segments skip the walk.
    scale = _window_scale(frame[tcp + 20 : min(start, size)]) if flags & TCP_SYN else None
    # A SACK block needs 10 option bytes: segments with fewer (no options) skip the walk.
    dsack = None
    if flags & TCP_ACK and min(start, size) - tcp - 20 >= _SACK_MIN_OPTIONS:
        dsack = _dsack(frame[tcp + 20 : min(start, size)], ack)
    src = _ADDRESS_TEXT.get(src) or _address(src)
    dst = _ADDRESS_TEXT.get(dst) or _address(dst)
    return _new_segment(Segment, (src, sport, dst, dport, seq, ack, flags, window, payload, missing, scale, dsack))


def _option_at(options: bytes, wanted: int) -> int:
    """Where the first TCP option of kind ``wanted`` starts in ``options``; -1 when there is none
    before the end of the list or a malformed length (stop rather than guess)."""
    pos = 0
    while pos < len(options):
        kind = options[pos]
        if kind == _TCPOPT_EOL:
            return -1
        if kind == _TCPOPT_NOP:
            pos += 1
            continue
        if pos + 1 >= len(options) or options[pos + 1] < 2:
            return -1
        if kind == wanted:
            return pos
        pos += options[pos + 1]
    return -1


def _window_scale(options: bytes) -> int | None:
    """The shift count of the window scale option (kind 3, length 3) in a SYN's options, if any."""
    pos = _option_at(options, _TCPOPT_WSCALE)
    if pos < 0 or options[pos + 1] != 3 or pos + 2 >= len(options):
        return None
    return min(options[pos + 2], MAX_WINDOW_SCALE)


def _dsack(options: bytes, ack: int) -> tuple[int, int] | None:
    """The duplicate range [left, right) a SACK option reports (RFC 2883 4): its first block, when
    that block lies below the cumulative acknowledgement or within the second block; else None."""
    pos = _option_at(options, _TCPOPT_SACK)
    if pos < 0:
        return None
    length = options[pos + 1]
    if length < 10 or pos + length > len(options):
        return None
    left, right = struct.unpack_from(">II", options, pos + 2)
    # Sequence numbers wrap (RFC 9293 3.4): "below" is a signed 32-bit difference.
    if (left - ack) & 0xFFFFFFFF >= 0x80000000:
        return left, right
    if length >= 18:
        left2, right2 = struct.unpack_from(">II", options, pos + 10)
        if (left - left2) & 0xFFFFFFFF < 0x80000000 and (right2 - right) & 0xFFFFFFFF < 0x80000000:
            return left, right
    return None
