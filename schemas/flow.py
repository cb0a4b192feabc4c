"""Flow-state timelines rebuilt from the frames table (DOMAIN.md sections 2 and 4)."""

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
# reject and qos (DOMAIN.md section 4).
CHANNEL_UNACKED_SCHEMA = StructType(
    _EVENT_KEY
    + [
        StructField("consumer_tag", StringType(), True),
        StructField("delivery_tag", LongType(), True),
        StructField("multiple", BooleanType(), True),
        StructField("unacked", LongType(), False),  # on the channel, after this event
        StructField("prefetch_count", IntegerType(), True),  # 0 or null: unlimited
        StructField("prefetch_global", BooleanType(), True),
    ]
)
