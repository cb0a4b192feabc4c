"""Rule-state tables: where each frame stands in its sender's connection, session, link and channel
lifecycle (pipelines/lifecycle_10.py, pipelines/lifecycle_091.py), for the rules that need it
(expectations/rules.yml).

State columns are null where the capture cannot tell (it began after the connection started).
"""

from __future__ import annotations

from pyspark.sql.types import BooleanType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

_FRAME = [
    StructField("capture_id", StringType(), False),
    StructField("connection_id", StringType(), False),
    StructField("frame_index", LongType(), False),
    StructField("ts", TimestampType(), False),
    StructField("packet_number", LongType(), False),
    StructField("direction", StringType(), False),  # the frame's sender
    StructField("frame_type", StringType(), False),
    StructField("channel", IntegerType(), True),
    StructField("method", StringType(), True),
]

# AMQP 1.0: the open / close / begin / end / attach / detach frames, and every frame sent outside its
# sender's open..close, session or link attachment (transport 2.4, 2.5, 2.6).
LIFECYCLE_10_SCHEMA = StructType(
    _FRAME
    + [
        StructField("handle", LongType(), True),
        StructField("remote_channel", IntegerType(), True),  # begin rows
        # The sender's AMQP protocol header was captured: its lifecycle is known from the start.
        StructField("started", BooleanType(), False),
        StructField("opened_before", BooleanType(), True),  # the sender had sent its open
        StructField("closed_before", BooleanType(), True),  # the sender had sent its close
        # The sender had a session on this channel (a begin, no end since); frames on channel 0
        # before any begin included.
        StructField("session_begun", BooleanType(), True),
        # The sender's handle was attached (its attach, no detach since) in the current session.
        StructField("handle_attached", BooleanType(), True),
        # Attach rows: the handle-max of the peer's begin of the session (4294967295 when it set
        # none); null before that begin arrived (a pipelined attach) or when the session is unknown.
        StructField("peer_handle_max", LongType(), True),
        # Answering begin rows (remote-channel set): whether the peer had sent a begin on that channel.
        StructField("remote_channel_begun", BooleanType(), True),
    ]
)

# AMQP 0-9-1: the connection and channel lifecycle methods (connection.start-ok, close, close-ok,
# blocked; channel.open, close, close-ok, flow, flow-ok), and every method sent outside its
# channel's or connection's lifecycle (spec 1.5.2 and 4.2).
LIFECYCLE_091_SCHEMA = StructType(
    _FRAME
    + [
        StructField("delivery_tag", LongType(), True),  # basic.deliver / get-ok rows
        StructField("started", BooleanType(), False),  # the client's protocol header was captured
        StructField("channel_open", BooleanType(), True),  # a channel.open and no close-ok since, before this frame
        # The sender had sent channel.close on this channel (close-ok not yet seen), before this frame.
        StructField("channel_closing", BooleanType(), True),
        StructField("connection_closing", BooleanType(), True),  # the same for connection.close
        # The sender had confirmed a channel.flow(active=false) with flow-ok and the peer had not
        # sent channel.flow(active=true) since: it may not send content (basic.publish / deliver ...).
        StructField("flow_stopped", BooleanType(), True),
        # The highest delivery tag the broker used on this channel incarnation before this frame.
        StructField("delivered_before", LongType(), True),
        # connection.blocked rows: whether the client's connection.start-ok announced the
        # capability "connection.blocked" (null: start-ok not captured).
        StructField("client_blocked_capability", BooleanType(), True),
    ]
)
