"""Flow-state timelines rebuilt from the frames table (docs/FLOW_CONTROL.md sections 2 and 4)."""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

_EVENT_KEY = [
    StructField("capture_id", StringType(), False),
    StructField("connection_id", StringType(), False),
    StructField("channel", IntegerType(), False),
    StructField("frame_index", LongType(), False),
    StructField("ts", TimestampType(), False),
    StructField("direction", StringType(), False),
    StructField("method", StringType(), False),
]

# AMQP 1.0 link state after every attach, flow and transfer of a link (spec 2.6.7), as the
# sender endpoint sees it. Sequence numbers are RFC-1982 serial numbers modulo 2^32.
LINK_CREDIT_SCHEMA = StructType(
    _EVENT_KEY
    + [
        StructField("handle", LongType(), False),  # the sender's handle for the link
        StructField("link_name", StringType(), True),
        # false: the link was attached before the capture (its name is made of its sender's channel
        # and handle; its counts and credit are unknown until a flow states them)
        StructField("attach_seen", BooleanType(), False),
        StructField("sender_side", StringType(), True),  # "client" or "server": who sends messages
        StructField("target_address", StringType(), True),
        StructField("source_address", StringType(), True),
        StructField("is_new_delivery", BooleanType(), False),  # first transfer frame of a delivery
        StructField("delivery_count_snd", LongType(), True),  # after this event
        StructField("link_credit_snd", LongType(), True),  # after this event; negative = over-sent
        StructField("link_credit_snd_before", LongType(), True),  # credit the delivery consumed
        StructField("link_credit_rcv", LongType(), True),  # last credit the receiver granted
        StructField("drain", BooleanType(), True),
        StructField("available", LongType(), True),
    ]
)

# AMQP 0-9-1 unacknowledged deliveries per channel after every deliver, get-ok, ack, nack,
# reject and qos (docs/FLOW_CONTROL.md section 4).
CHANNEL_UNACKED_SCHEMA = StructType(
    _EVENT_KEY
    + [
        StructField("consumer_tag", StringType(), True),
        StructField("delivery_tag", LongType(), True),
        StructField("multiple", BooleanType(), True),
        StructField("unacked", LongType(), False),  # on the channel, after this event
        StructField("prefetch_count", IntegerType(), True),  # 0 or null: unlimited
        StructField("prefetch_global", BooleanType(), True),
        # The highest delivery tag sent on the channel so far (tags run 1, 2, 3 ...); null when the
        # capture missed the channel's channel.open, so tags sent before it began are unknown.
        StructField("delivered", LongType(), True),
        StructField("settled", LongType(), True),  # ack / nack / reject rows: the deliveries it settled
    ]
)

# --- Tables added for the full flow-state reconstruction (docs/FLOW_STATE.md) -------------------

_FRAME_POSITION = [StructField("packet_number", LongType(), False)]  # where Wireshark shows the frame

# AMQP 1.0 link state after every attach, flow, transfer and detach of a link (spec 2.6.7), and
# after every disposition that settled deliveries of the link (one row per such link): the
# link_credit columns plus the receiver's side, echo, deliveries in flight and unsettled deliveries.
# link_credit is this table's projection onto LINK_CREDIT_SCHEMA (its link frames).
LINK_STATE_SCHEMA = StructType(
    _EVENT_KEY
    + _FRAME_POSITION
    + [
        # The handle of the endpoint sending this frame (a disposition: that endpoint's handle of the link).
        StructField("handle", LongType(), False),
        StructField("link_name", StringType(), False),
        # false: the link was attached before the capture (as in link_credit)
        StructField("attach_seen", BooleanType(), False),
        StructField("role", StringType(), True),  # role of the endpoint sending this frame: "sender" / "receiver"
        StructField("sender_side", StringType(), False),  # "client" or "server": who sends messages
        StructField("source_address", StringType(), True),
        StructField("target_address", StringType(), True),
        StructField("delivery_id", LongType(), True),  # transfer frames: the delivery-id, if the frame carries it
        StructField("is_new_delivery", BooleanType(), False),  # first transfer frame of a delivery
        StructField("payload_size", LongType(), True),  # transfer frames: payload bytes
        StructField("delivery_count_snd", LongType(), True),  # after this event
        StructField("link_credit_snd", LongType(), True),  # after this event; negative = over-sent
        StructField("link_credit_snd_before", LongType(), True),  # credit the delivery consumed
        StructField("delivery_count_rcv", LongType(), True),  # receiver's last flow (else initial-delivery-count)
        StructField("link_credit_rcv", LongType(), True),  # last credit the receiver granted
        StructField("available", LongType(), True),  # sender's last flow
        StructField("drain", BooleanType(), True),  # receiver's last flow
        StructField("echo", BooleanType(), True),  # this flow asks the peer for its link state
        # delivery-count(snd) - delivery-count(rcv): deliveries (and credit drained) the sender has
        # counted that the receiver's last flow had not: the credit "in flight" of 2.6.7.
        StructField("deliveries_in_flight", LongType(), True),
        # Deliveries sent unsettled and not settled since by a settled transfer or a settled
        # disposition of either endpoint (2.6.12): the link's unsettled map, as seen on the wire.
        StructField("unsettled", LongType(), False),
        # Appended for the link rules (expectations/rules.yml; lakes widen by appended columns):
        StructField("link_credit", LongType(), True),  # flow frames: the link-credit this flow carries
        StructField("delivery_count", LongType(), True),  # flow frames: the delivery-count this flow carries
        # The sender's last flow since the receiver's last flow announced link-credit 0: the
        # sender said it has no credit (e.g. its answer to a drain), so it may not start a delivery.
        StructField("sender_announced_no_credit", BooleanType(), True),
        # Transfer frames: the delivery-id the delivery's first transfer carried (2.7.5).
        StructField("delivery_first_id", LongType(), True),
        StructField("delivery_count_snd_before", LongType(), True),  # delivery_count_snd of the link's previous row
    ]
)

# One endpoint's session state: columns client_<name> and server_<name> of session_window.
_SESSION_ENDPOINT = [
    "next_incoming_id",  # the peer's next-outgoing-id: the transfer-id expected next
    "incoming_window",  # as the endpoint last announced it (begin / flow)
    "next_outgoing_id",  # announced in begin / flow, + 1 per transfer frame sent since
    "outgoing_window",  # as the endpoint last announced it
    "remote_incoming_window",  # peer's next-incoming-id + incoming-window - own next-outgoing-id
]

# AMQP 1.0 session flow control after every begin, flow, transfer and end of a session (spec
# 2.5.6), both endpoints' state on every row. Transfer ids are RFC-1982 serial numbers modulo 2^32.
SESSION_WINDOW_SCHEMA = StructType(
    _EVENT_KEY
    + _FRAME_POSITION
    + [
        StructField("session_id", LongType(), False),  # frame_index of the begin that opened the session
        StructField("client_channel", IntegerType(), True),
        StructField("server_channel", IntegerType(), True),
    ]
    + [StructField(f"{side}_{name}", LongType(), True) for side in ("client", "server") for name in _SESSION_ENDPOINT]
    + [
        # Transfer frames: the sender's remote-incoming-window when it sent the frame (this frame
        # used one of it); <= 0 means the frame went beyond the receiver's incoming window.
        StructField("remote_incoming_window", LongType(), True),
    ]
)

# AMQP 0-9-1 unacknowledged deliveries per consumer after every delivery to it, every settlement of
# its deliveries and its consume-ok / cancel-ok (docs/FLOW_CONTROL.md section 4). Consumers with no-ack are left out.
CONSUMER_UNACKED_SCHEMA = StructType(
    _EVENT_KEY
    + _FRAME_POSITION
    + [
        StructField("consumer_tag", StringType(), False),
        StructField("queue", StringType(), True),  # from the basic.consume
        StructField("delivery_tag", LongType(), True),
        StructField("multiple", BooleanType(), True),
        StructField("settled", LongType(), False),  # this consumer's deliveries this event settled
        StructField("unacked", LongType(), False),  # the consumer's, after this event
        # basic.qos(global=false) in effect when the consumer was created: RabbitMQ's per-consumer
        # limit (0 or null: unlimited).
        StructField("prefetch_count", IntegerType(), True),
        # basic.qos(global=true) in effect now: RabbitMQ's limit shared by the channel's consumers.
        StructField("channel_prefetch_count", IntegerType(), True),
        StructField("channel_unacked", LongType(), False),  # the channel's unacked, after this event
        # Appended: the consumer (its basic.consume-ok) or its channel (channel.open) began before the
        # capture: deliveries before the first packet are not counted, so unacked is a lower bound
        # and prefetch_count null unless a basic.qos was captured.
        StructField("began_before_capture", BooleanType(), True),
    ]
)

# AMQP 0-9-1 publisher confirms per channel after confirm.select, every publish and every broker
# basic.ack / basic.nack (docs/FLOW_CONTROL.md section 4): the n-th publish has sequence number n.
CHANNEL_CONFIRMS_SCHEMA = StructType(
    _EVENT_KEY
    + _FRAME_POSITION
    + [
        StructField("publish_seq", LongType(), True),  # basic.publish: its sequence number
        StructField("delivery_tag", LongType(), True),  # basic.ack / basic.nack: the sequence number confirmed
        StructField("multiple", BooleanType(), True),
        StructField("published", LongType(), False),  # publishes since confirm.select, after this event
        StructField("confirmed", LongType(), False),  # sequence numbers this ack / nack settled (first time)
        StructField("outstanding", LongType(), False),  # published and not yet confirmed, after this event
    ]
)

_INTERVAL_BOUNDS = [
    StructField("start_frame_index", LongType(), False),
    StructField("start_ts", TimestampType(), False),
    StructField("start_packet_number", LongType(), False),
    StructField("end_frame_index", LongType(), True),  # null: still open when the capture ends
    StructField("end_ts", TimestampType(), True),
    StructField("end_packet_number", LongType(), True),
    StructField("duration_us", LongType(), True),
]

# AMQP 0-9-1 connection.blocked / connection.unblocked intervals (RabbitMQ's resource alarms).
CONNECTION_BLOCKED_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        StructField("reason", StringType(), True),  # of the connection.blocked that started the interval
    ]
    + _INTERVAL_BOUNDS
    + [
        StructField("notifications", LongType(), False),  # connection.blocked frames in the interval
        # Appended: the block was in force when the capture began (its first notice on a connection
        # opened before the capture is connection.unblocked): the interval starts at the
        # connection's first frame in the capture, and lasted at least that long.
        StructField("began_before_capture", BooleanType(), True),
    ]
)

# AMQP 0-9-1 channel.flow(active=false) ... channel.flow(active=true) intervals, per requesting side.
CHANNEL_FLOW_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        StructField("channel", IntegerType(), False),
        StructField("direction", StringType(), False),  # who sent channel.flow(active=false)
    ]
    + _INTERVAL_BOUNDS
)

# One row per interval in which an entity is starved or blocked, whatever the cause.
FLOW_INTERVALS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        StructField("entity", StringType(), False),  # link | session | consumer | channel | connection | tcp
        # link_credit_exhausted | session_window_closed | prefetch_full | confirms_outstanding |
        # channel_flow | connection_blocked | tcp_zero_window
        StructField("cause", StringType(), False),
        StructField("channel", IntegerType(), True),
        StructField("link_name", StringType(), True),
        StructField("consumer_tag", StringType(), True),
        StructField("direction", StringType(), True),  # the direction that cannot send
        StructField("start_ts", TimestampType(), False),
        StructField("end_ts", TimestampType(), True),  # null: still open when the capture ends
        StructField("duration_us", LongType(), True),
        StructField("start_frame_index", LongType(), True),  # null for TCP intervals
        StructField("end_frame_index", LongType(), True),
        StructField("start_packet_number", LongType(), False),
        StructField("end_packet_number", LongType(), True),
        StructField("detail", StringType(), True),  # e.g. the blocked reason, the prefetch count
    ]
)

# The frame size and channel limits in force on each frame that could break them
# (docs/FLOW_CONTROL.md section 6; pipelines/frame_limits.py): frames larger than the protocol's minimum frame size,
# channel.open and begin, and the tune-ok and open frames that set the limits.
FRAME_LIMITS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        StructField("frame_index", LongType(), False),
        StructField("ts", TimestampType(), False),
        StructField("packet_number", LongType(), False),
        StructField("direction", StringType(), False),
        StructField("protocol", StringType(), False),
        StructField("channel", IntegerType(), True),
        StructField("frame_type", StringType(), False),
        StructField("method", StringType(), True),
        StructField("frame_size", LongType(), False),  # the whole frame, header included
        # In force for this frame's sender; null: no limit, or unknown (negotiation not captured).
        StructField("frame_size_limit", LongType(), True),
        StructField("channel_limit", LongType(), True),
        # 0-9-1 connection.tune-ok rows: the server's offer and the client's choice (0: no limit).
        StructField("offered_frame_max", LongType(), True),
        StructField("offered_channel_max", LongType(), True),
        StructField("tuned_frame_max", LongType(), True),
        StructField("tuned_channel_max", LongType(), True),
        # 1.0 rows of a connection whose start was captured: whether the other peer's open had
        # arrived (before it the limits are unknown: a pipelined open, transport 2.4.2).
        StructField("peer_opened", BooleanType(), True),
    ]
)

# Silences of one direction of a connection longer than its heartbeat interval (0-9-1 tune-ok
# heartbeat; 1.0 the receiving peer's idle-time-out): the frame ending each (pipelines/idle_gaps.py).
IDLE_GAPS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        StructField("direction", StringType(), False),  # the side that was silent
        StructField("protocol", StringType(), False),
        StructField("frame_index", LongType(), False),  # the frame ending the silence
        StructField("ts", TimestampType(), False),
        StructField("packet_number", LongType(), False),
        StructField("frame_type", StringType(), False),
        StructField("method", StringType(), True),
        StructField("gap_start_ts", TimestampType(), False),  # the direction's frame before
        StructField("gap_us", LongType(), False),
        StructField("interval_us", LongType(), False),  # a frame is due at least this often
        StructField("allowed_us", LongType(), False),  # silence after which the receiver may close
    ]
)

# Messages and bytes per second (1-second buckets with traffic) per connection, channel, link and
# queue / address. A message is a 0-9-1 basic.publish / basic.deliver / basic.get-ok (bytes: its
# content header's body-size) or a 1.0 delivery (bytes: the transfer payloads).
THROUGHPUT_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("scope", StringType(), False),  # connection | channel | link | address
        StructField("connection_id", StringType(), True),  # null for scope address (all connections)
        StructField("protocol", StringType(), True),
        StructField("direction", StringType(), False),
        StructField("channel", IntegerType(), True),
        StructField("link_name", StringType(), True),
        StructField("address", StringType(), True),
        StructField("second", TimestampType(), False),  # start of the 1-second bucket
        StructField("messages", LongType(), False),
        StructField("bytes", LongType(), False),
    ]
)
