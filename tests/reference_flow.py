"""Reference flow-control state machines in plain Python, one frame at a time, written from the specs.

The Spark pipelines rebuild the same state with window functions; the property tests
(tests/test_flow_reference.py) feed both the same generated frames and compare them row for row.
Nothing here is shared with the pipelines: this is the spec read a second time.

- AMQP 1.0 link flow control, transport spec 2.6.7 (``LinkMachine``)
- AMQP 1.0 session flow control, transport spec 2.5.6 (``SessionMachine``)
- AMQP 0-9-1 unacknowledged deliveries and publisher confirms, docs/FLOW_CONTROL.md section 4 (``ChannelMachine``)

Input frames are frames-table rows (dicts) of one connection in frame order. Like the pipelines,
the machines see the connection from the capture point: a frame is applied when it is captured.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Frame = dict[str, Any]
Row = dict[str, Any]

SERIAL_MOD = 1 << 32
_HALF = 1 << 31


def serial_add(a: int, n: int) -> int:
    return (a + n) % SERIAL_MOD


def serial_diff(a: int, b: int) -> int:
    """a - b for RFC-1982 serial numbers, in (-2^31, 2^31]."""
    d = (a - b) % SERIAL_MOD
    return d - SERIAL_MOD if d > _HALF else d


def flip(direction: str) -> str:
    return "s2c" if direction == "c2s" else "c2s"


# --- AMQP 1.0 sessions (2.5.1: begin / remote-channel; 2.5.6: session flow control) --------------


class SessionBinder:
    """Which session a frame belongs to: the latest begin its sender sent on its channel.

    A session is named by the frame_index of the begin that opened it; an answering begin
    (remote-channel set) joins the session of the latest begin the peer sent on that channel.
    """

    def __init__(self) -> None:
        self._endpoint: dict[tuple[str, int], int] = {}  # (direction, channel) -> begin frame_index
        self._session_of_begin: dict[int, int] = {}

    def see(self, f: Frame) -> int | None:
        key = (f["direction"], f["channel"])
        if f["method"] == "begin":
            peer_begin = None
            if f.get("remote_channel") is not None:
                peer_begin = self._endpoint.get((flip(f["direction"]), f["remote_channel"]))
            self._endpoint[key] = f["frame_index"]
            self._session_of_begin[f["frame_index"]] = peer_begin if peer_begin is not None else f["frame_index"]
        begin = self._endpoint.get(key)
        return None if begin is None else self._session_of_begin[begin]


@dataclass
class _SessionEndpoint:
    next_outgoing_id: int | None = None
    initial_outgoing_id: int | None = None  # next-outgoing-id of the endpoint's begin
    incoming_window: int | None = None
    outgoing_window: int | None = None
    # next-incoming-id the endpoint's latest begin / flow carried: None if it carried none
    announced_incoming_id: int | None = None
    announced: bool = False


class SessionMachine:
    """2.5.6 per session, both endpoints; rows like the session_window table."""

    SIDES = {"c2s": "client", "s2c": "server"}

    def __init__(self) -> None:
        self.binder = SessionBinder()
        self.sessions: dict[int, dict[str, _SessionEndpoint]] = {}
        self.channels: dict[int, dict[str, int]] = {}

    def feed(self, frames: Iterable[Frame]) -> list[Row]:
        rows = []
        for f in frames:
            if f.get("protocol") != "amqp-1.0" or f.get("frame_type") != "amqp":
                continue
            sid = self.binder.see(f)
            if sid is None or f["method"] not in ("begin", "flow", "transfer", "end"):
                continue
            endpoints = self.sessions.setdefault(sid, {"c2s": _SessionEndpoint(), "s2c": _SessionEndpoint()})
            if f["method"] == "begin":
                self.channels.setdefault(sid, {})[f["direction"]] = f["channel"]
            me = endpoints[f["direction"]]
            if f["method"] in ("begin", "flow"):
                # A begin or flow announces the endpoint's own state.
                if f.get("next_outgoing_id") is not None:
                    me.next_outgoing_id = f["next_outgoing_id"]
                    if f["method"] == "begin":
                        me.initial_outgoing_id = f["next_outgoing_id"]
                if f.get("incoming_window") is not None:
                    me.incoming_window = f["incoming_window"]
                if f.get("outgoing_window") is not None:
                    me.outgoing_window = f["outgoing_window"]
                me.announced_incoming_id = f.get("next_incoming_id") if f["method"] == "flow" else None
                me.announced = True
            elif f["method"] == "transfer" and me.next_outgoing_id is not None:
                # "When the endpoint sends a transfer frame, it MUST increment its next-outgoing-id."
                me.next_outgoing_id = serial_add(me.next_outgoing_id, 1)
            row = self._row(f, sid, endpoints)
            if f["method"] == "transfer":
                window = row[f"{self.SIDES[f['direction']]}_remote_incoming_window"]
                row["remote_incoming_window"] = None if window is None else window + 1
            else:
                row["remote_incoming_window"] = None
            rows.append(row)
        # The channels are attributes of the session, known once both begins have been seen.
        for row in rows:
            channels = self.channels.get(row["session_id"], {})
            row["client_channel"], row["server_channel"] = channels.get("c2s"), channels.get("s2c")
        return rows

    def _row(self, f: Frame, sid: int, endpoints: dict[str, _SessionEndpoint]) -> Row:
        row: Row = {
            "connection_id": f["connection_id"],
            "frame_index": f["frame_index"],
            "method": f["method"],
            "session_id": sid,
        }
        for direction, side in self.SIDES.items():
            me, peer = endpoints[direction], endpoints[flip(direction)]
            row[f"{side}_next_outgoing_id"] = me.next_outgoing_id
            # next-incoming-id is set from the peer's begin / flow and incremented per transfer
            # received: the peer's next-outgoing-id as the capture sees it.
            row[f"{side}_next_incoming_id"] = peer.next_outgoing_id
            row[f"{side}_incoming_window"] = me.incoming_window
            row[f"{side}_outgoing_window"] = me.outgoing_window
            # remote-incoming-window = next-incoming-id(flow) + incoming-window(flow) - next-outgoing-id,
            # with initial-outgoing-id(endpoint) when the flow carries no next-incoming-id.
            granted_from = (
                peer.announced_incoming_id if peer.announced_incoming_id is not None else me.initial_outgoing_id
            )
            if peer.announced and None not in (peer.incoming_window, granted_from, me.next_outgoing_id):
                row[f"{side}_remote_incoming_window"] = peer.incoming_window - serial_diff(
                    me.next_outgoing_id, granted_from
                )
            else:
                row[f"{side}_remote_incoming_window"] = None
        return row


# --- AMQP 1.0 links (2.6.7 flow control, 2.7.5 transfer, 2.7.6 disposition) ----------------------


@dataclass
class _Link:
    name: str
    sender_direction: str
    source_address: str | None = None
    target_address: str | None = None
    initial_delivery_count: int | None = None
    delivery_count: int | None = None  # the sender's
    receiver_flowed: bool = False
    receiver_delivery_count: int | None = None  # of the receiver's last flow; None: it had none
    link_credit_rcv: int | None = None
    drain: bool | None = None
    available: int | None = None
    in_delivery: bool = False  # the last transfer said more=true
    deliveries: int = 0
    unsettled: set[int] = field(default_factory=set)  # ordinals of unsettled deliveries


class LinkMachine:
    """2.6.7 per link; rows like the link_state table."""

    def __init__(self) -> None:
        self.binder = SessionBinder()
        self.bound: dict[tuple[str, int, int], tuple[str, str]] = {}  # (direction, channel, handle) -> (name, role)
        self.links: dict[tuple[str, str], _Link] = {}
        # Deliveries per (session, sending direction): delivery-id -> (link, ordinal), ids in order.
        self.sent: dict[tuple[int, str], list[tuple[int | None, _Link, int]]] = {}

    def feed(self, frames: Iterable[Frame]) -> list[Row]:
        rows = []
        for f in frames:
            if f.get("protocol") != "amqp-1.0" or f.get("frame_type") != "amqp":
                continue
            sid = self.binder.see(f)
            if f["method"] == "disposition":
                if sid is not None and f.get("settled"):
                    # A row on every link the disposition settled deliveries of, its state as of then.
                    rows.extend(self._row(f, link, f["role"], False) for link in self._disposition(f, sid))
                continue
            if f["method"] not in ("attach", "flow", "transfer", "detach") or f.get("handle") is None:
                continue
            key = (f["direction"], f["channel"], f["handle"])
            if f["method"] == "attach":
                self.bound[key] = (f["name"], f["role"])
            if key not in self.bound:
                continue
            name, role = self.bound[key]
            sender_direction = f["direction"] if role == "sender" else flip(f["direction"])
            link = self.links.setdefault((name, sender_direction), _Link(name, sender_direction))
            new_delivery = self._apply(f, link, role == "sender", sid)
            rows.append(self._row(f, link, role, new_delivery))
        return rows

    def _apply(self, f: Frame, link: _Link, from_sender: bool, sid: int | None) -> bool:
        method = f["method"]
        if method == "attach":
            if link.source_address is None:
                link.source_address = f.get("source_address")
            if link.target_address is None:
                link.target_address = f.get("target_address")
            if from_sender and f.get("initial_delivery_count") is not None:
                link.initial_delivery_count = f["initial_delivery_count"]
                link.delivery_count = f["initial_delivery_count"]
        elif method == "flow" and not from_sender:
            link.receiver_flowed = True
            link.receiver_delivery_count = f.get("delivery_count")
            if f.get("link_credit") is not None:
                link.link_credit_rcv = f["link_credit"]
            link.drain = bool(f.get("drain"))
        elif method == "flow":
            # The sender's own flow states its delivery-count (after a drain it has advanced it).
            if f.get("delivery_count") is not None:
                link.delivery_count = f["delivery_count"]
            if f.get("available") is not None:
                link.available = f["available"]
        elif method == "transfer" and from_sender:
            new = not link.in_delivery
            if new:
                # "The sender MUST increment delivery-count for each delivery sent" (one per delivery, not frame).
                link.deliveries += 1
                if link.delivery_count is not None:
                    link.delivery_count = serial_add(link.delivery_count, 1)
                link.unsettled.add(link.deliveries)
                if sid is not None:
                    self.sent.setdefault((sid, link.sender_direction), []).append(
                        (f.get("delivery_id"), link, link.deliveries)
                    )
            # An aborted transfer ends its delivery (2.7.5).
            link.in_delivery = bool(f.get("more")) and not bool(f.get("aborted"))
            if f.get("settled"):
                link.unsettled.discard(link.deliveries)
            return new
        return False

    def _disposition(self, f: Frame, sid: int) -> list[_Link]:
        """Settle what the disposition names; the links it settled deliveries of, in order of their first."""
        # role=receiver: about deliveries sent towards the disposition's sender; role=sender: its own.
        sender_direction = flip(f["direction"]) if f["role"] == "receiver" else f["direction"]
        sent = self.sent.get((sid, sender_direction), [])
        known_ids = [d for d, _link, _n in sent if d is not None]
        first = f.get("first")
        if first is None or not known_ids:
            return []
        last = f["last"] if f.get("last") is not None else first
        # Only ids already sent can be settled: at most from first to the last id sent.
        span = min(serial_diff(last, first) + 1, serial_diff(known_ids[-1], first) + 1, len(sent))
        named = {serial_add(first, k) for k in range(max(span, 0))}
        settled: list[_Link] = []
        for delivery_id, link, ordinal in sent:
            if delivery_id in named and ordinal in link.unsettled:
                link.unsettled.discard(ordinal)
                if all(link is not other for other in settled):
                    settled.append(link)
        return settled

    @staticmethod
    def _row(f: Frame, link: _Link, role: str, new_delivery: bool) -> Row:
        if link.receiver_flowed and link.receiver_delivery_count is not None:
            count_rcv = link.receiver_delivery_count
        else:
            # A flow without delivery-count (the receiver had not seen the sender's attach):
            # the initial-delivery-count applies (2.7.4).
            count_rcv = link.initial_delivery_count
        in_flight = None
        credit = None
        if link.delivery_count is not None and count_rcv is not None:
            in_flight = serial_diff(link.delivery_count, count_rcv)
            # link-credit(snd) := delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)
            credit = (link.link_credit_rcv or 0) - in_flight
        return {
            "connection_id": f["connection_id"],
            "frame_index": f["frame_index"],
            "method": f["method"],
            "link_name": link.name,
            "role": role,
            "sender_side": "client" if link.sender_direction == "c2s" else "server",
            "source_address": link.source_address,
            "target_address": link.target_address,
            "is_new_delivery": new_delivery,
            "delivery_count_snd": link.delivery_count,
            "link_credit_snd": credit,
            "link_credit_snd_before": credit + 1 if new_delivery and credit is not None else None,
            "delivery_count_rcv": count_rcv,
            "link_credit_rcv": link.link_credit_rcv,
            "available": link.available,
            "drain": link.drain,
            "echo": bool(f.get("echo")) if f["method"] == "flow" else None,
            "deliveries_in_flight": in_flight,
            "unsettled": len(link.unsettled),
        }


# --- AMQP 0-9-1 channels: unacked deliveries per channel and consumer, publisher confirms --------


@dataclass
class _Consumer:
    no_ack: bool
    queue: str | None
    prefetch_count: int | None


@dataclass
class _Channel:
    prefetch_count: int | None = None
    prefetch_global: bool | None = None
    consumer_prefetch: int | None = None  # last qos(global=false): applies to consumers created after it
    channel_prefetch: int | None = None  # last qos(global=true): shared by the channel's consumers
    consume_requests: list[tuple[bool, str | None, int | None]] = field(default_factory=list)
    get_requests: list[bool] = field(default_factory=list)
    consumers: dict[str, _Consumer] = field(default_factory=dict)
    outstanding: dict[int, str | None] = field(default_factory=dict)  # delivery tag -> consumer tag
    confirming: bool = False
    published: int = 0
    unconfirmed: set[int] = field(default_factory=set)
    opened: bool = False  # its channel.open captured: the tags it delivered are all known
    delivered: int = 0  # the highest delivery tag sent


class ChannelMachine:
    """docs/FLOW_CONTROL.md section 4 per channel; rows like channel_unacked, consumer_unacked and channel_confirms."""

    def __init__(self) -> None:
        self.channels: dict[int, _Channel] = {}
        self.unacked_rows: list[Row] = []
        self.consumer_rows: list[Row] = []
        self.confirm_rows: list[Row] = []

    def feed(self, frames: Iterable[Frame]) -> ChannelMachine:
        for f in frames:
            if f.get("protocol") == "amqp-0-9-1" and f.get("frame_type") == "method":
                self._frame(f)
        return self

    def _frame(self, f: Frame) -> None:
        method, c2s = f["method"], f["direction"] == "c2s"
        if method == "channel.open":
            self.channels[f["channel"]] = _Channel(opened=True)  # a new incarnation: tags and counts start again
        ch = self.channels.setdefault(f["channel"], _Channel())
        if method == "basic.qos" and c2s:
            if f.get("prefetch_count") is not None:
                ch.prefetch_count = f["prefetch_count"]
            if f.get("global") is not None:
                ch.prefetch_global = f["global"]
            if f.get("global"):
                ch.channel_prefetch = f["prefetch_count"]
            else:
                ch.consumer_prefetch = f["prefetch_count"]
            self._unacked_row(f, ch)
        elif method == "basic.consume" and c2s:
            ch.consume_requests.append((bool(f.get("no_ack")), f.get("queue"), ch.consumer_prefetch))
        elif method == "basic.consume-ok" and not c2s and ch.consume_requests:
            no_ack, queue, prefetch = ch.consume_requests.pop(0)
            ch.consumers[f["consumer_tag"]] = _Consumer(no_ack, queue, prefetch)
            if not no_ack:
                self._consumer_row(f, ch, f["consumer_tag"], settled=0)
        elif method == "basic.cancel-ok" and not c2s:
            consumer = ch.consumers.get(f.get("consumer_tag"))
            if consumer is not None and not consumer.no_ack:
                self._consumer_row(f, ch, f["consumer_tag"], settled=0)
        elif method == "basic.get" and c2s:
            ch.get_requests.append(bool(f.get("no_ack")))
        elif method == "basic.get-empty" and not c2s and ch.get_requests:
            ch.get_requests.pop(0)
        elif method in ("basic.deliver", "basic.get-ok") and not c2s:
            self._delivery(f, ch)
        elif method in ("basic.ack", "basic.nack", "basic.reject") and c2s:
            settled = self._settle(ch.outstanding, f)
            self._unacked_row(f, ch, settled=len(settled))
            for tag in sorted({t for t in settled.values() if t is not None}):
                self._consumer_row(f, ch, tag, settled=sum(1 for t in settled.values() if t == tag))
        elif method == "confirm.select" and c2s:
            ch.confirming = True
            self._confirm_row(f, ch, confirmed=0)
        elif method == "basic.publish" and c2s and ch.confirming:
            # After confirm.select the n-th publish on the channel has sequence number n.
            ch.published += 1
            ch.unconfirmed.add(ch.published)
            self._confirm_row(f, ch, confirmed=0, publish_seq=ch.published)
        elif method in ("basic.ack", "basic.nack") and not c2s and ch.confirming:
            pending = {seq: None for seq in ch.unconfirmed}
            settled = self._settle(pending, f)
            ch.unconfirmed -= set(settled)
            self._confirm_row(f, ch, confirmed=len(settled))

    def _delivery(self, f: Frame, ch: _Channel) -> None:
        tag = f["delivery_tag"]
        ch.delivered = max(ch.delivered, tag)
        if f["method"] == "basic.get-ok":
            no_ack = ch.get_requests.pop(0) if ch.get_requests else False
            consumer_tag = None
        else:
            consumer_tag = f.get("consumer_tag")
            consumer = ch.consumers.get(consumer_tag)
            no_ack = consumer is not None and consumer.no_ack
        if not no_ack:  # a no-ack delivery takes a tag but is never acknowledged
            ch.outstanding[tag] = consumer_tag
        self._unacked_row(f, ch)
        if f["method"] == "basic.deliver" and not no_ack:
            self._consumer_row(f, ch, consumer_tag, settled=0)

    @staticmethod
    def _settle(outstanding: dict[int, str | None], f: Frame) -> dict[int, str | None]:
        """Remove and return what an ack / nack / reject settles, as RabbitMQ's collect_acks does:
        tag 0 with multiple, everything outstanding; a tag outstanding, itself and with multiple
        every outstanding tag below it; any other tag (never sent, already settled, a no-ack
        delivery's) nothing: a channel exception, 406 precondition-failed (0-9-1 basic.ack
        ``multiple``, rule "exists")."""
        tag = f.get("delivery_tag")
        if f.get("multiple") and tag == 0:
            settled = dict(outstanding)
        elif tag not in outstanding:
            return {}
        elif f.get("multiple"):
            settled = {t: c for t, c in outstanding.items() if t <= tag}
        else:
            settled = {tag: outstanding[tag]}
        for t in settled:
            del outstanding[t]
        return settled

    def _unacked_row(self, f: Frame, ch: _Channel, settled: int | None = None) -> None:
        self.unacked_rows.append(
            {
                "connection_id": f["connection_id"],
                "channel": f["channel"],
                "frame_index": f["frame_index"],
                "method": f["method"],
                "unacked": len(ch.outstanding),
                "prefetch_count": ch.prefetch_count,
                "prefetch_global": ch.prefetch_global,
                "delivered": ch.delivered if ch.opened else None,
                "settled": settled,
            }
        )

    def _consumer_row(self, f: Frame, ch: _Channel, consumer_tag: str | None, settled: int) -> None:
        consumer = ch.consumers.get(consumer_tag)
        self.consumer_rows.append(
            {
                "connection_id": f["connection_id"],
                "channel": f["channel"],
                "frame_index": f["frame_index"],
                "method": f["method"],
                "consumer_tag": consumer_tag,
                "settled": settled,
                "unacked": sum(1 for c in ch.outstanding.values() if c == consumer_tag),
                "queue": consumer.queue if consumer else None,
                "prefetch_count": consumer.prefetch_count if consumer else None,
                "channel_prefetch_count": ch.channel_prefetch,
                "channel_unacked": len(ch.outstanding),
            }
        )

    def _confirm_row(self, f: Frame, ch: _Channel, confirmed: int, publish_seq: int | None = None) -> None:
        self.confirm_rows.append(
            {
                "connection_id": f["connection_id"],
                "channel": f["channel"],
                "frame_index": f["frame_index"],
                "method": f["method"],
                "publish_seq": publish_seq,
                "published": ch.published,
                "confirmed": confirmed,
                "outstanding": len(ch.unconfirmed),
            }
        )
