"""Message tables rebuilt from the frames table (``pipelines.messages``): one row per message.

Names follow the frames table (and so the specs); ``*_frame_index`` columns point back at frames.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from amqpscope.schemas.frames import MESSAGE_FIELDS

# The message properties both versions have, as the frames table declares them (0-9-1's
# delivery_mode is added where it applies).
_PROPERTIES = [f for f in MESSAGE_FIELDS if f.name != "delivery_mode"]
_DELIVERY_MODE = next(f for f in MESSAGE_FIELDS if f.name == "delivery_mode")

# AMQP 0-9-1: a content method (basic.publish / deliver / get-ok / return) with its content header
# and body frames (spec 4.2.6), the publisher confirm or consumer acknowledgement that settled it.
MESSAGES_091_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        StructField("channel", IntegerType(), False),
        StructField("direction", StringType(), False),
        StructField("method", StringType(), False),  # basic.publish | basic.deliver | basic.get-ok | basic.return
        StructField("frame_index", LongType(), False),  # the method frame
        StructField("ts", TimestampType(), False),
        StructField("last_frame_index", LongType(), False),  # the frame completing the message
        StructField("exchange", StringType(), True),
        StructField("routing_key", StringType(), True),
        StructField("consumer_tag", StringType(), True),
        StructField("delivery_tag", LongType(), True),  # deliver / get-ok
        StructField("redelivered", BooleanType(), True),
        StructField("no_ack", BooleanType(), True),  # deliver / get-ok: no ack needed (no-ack consume or get)
        StructField("body_size", LongType(), True),  # as the content header declares it
        StructField("body_bytes", LongType(), False),  # in the body frames that followed
        StructField("body_frames", IntegerType(), False),
        StructField("complete", BooleanType(), False),  # header seen and body_bytes == body_size
        *_PROPERTIES,
        _DELIVERY_MODE,
        StructField("properties", MapType(StringType(), StringType()), True),  # the header's other properties
        # Publisher confirms: the publish's sequence number after confirm.select (1, 2, ...) and the
        # broker basic.ack / basic.nack that confirmed it (multiple included).
        StructField("publish_seq", LongType(), True),
        # Settlement: for a publish its confirm, for a delivery the consumer's ack / nack / reject.
        StructField("settled_by", StringType(), True),  # basic.ack | basic.nack | basic.reject
        StructField("settled_frame_index", LongType(), True),
        StructField("settled_multiple", BooleanType(), True),
        StructField("requeue", BooleanType(), True),
        # The next method frame on the channel in this direction (null: none captured): content
        # still incomplete then was cut off by it (0-9-1 spec 4.2.6).
        StructField("next_method_frame_index", LongType(), True),
    ]
)

# AMQP 1.0: a delivery (transport 2.6.12), its transfer frames made one (more=true on all but the
# last, 2.6.14), the message's sections, and the disposition that settled it (first..last, 2.7.6).
DELIVERIES_10_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        StructField("direction", StringType(), False),  # of the transfers
        StructField("channel", IntegerType(), False),  # the sending endpoint's channel
        StructField("session_channel", IntegerType(), True),  # the client's channel of the session
        StructField("handle", LongType(), False),
        StructField("delivery_id", LongType(), True),
        StructField("delivery_tag_bytes", StringType(), True),  # hex
        StructField("frame_index", LongType(), False),  # first transfer
        StructField("ts", TimestampType(), False),
        StructField("last_frame_index", LongType(), False),
        StructField("last_ts", TimestampType(), False),
        StructField("transfers", IntegerType(), False),
        StructField("payload_bytes", LongType(), False),  # all transfers' payloads: the message's size
        StructField("aborted", BooleanType(), False),
        StructField("complete", BooleanType(), False),  # last transfer seen with more=false, not aborted
        StructField("settled_by_sender", BooleanType(), False),  # a transfer had settled=true
        StructField("message_size", LongType(), True),  # as decoded on the frame completing it
        StructField("section_sizes", MapType(StringType(), LongType()), True),
        StructField("body_kind", StringType(), True),
        StructField("subject", StringType(), True),
        StructField("to_address", StringType(), True),
        *_PROPERTIES,
        # The first disposition covering the delivery, from either end.
        StructField("disposition_frame_index", LongType(), True),
        StructField("disposition_role", StringType(), True),  # sender | receiver: who sent it
        StructField("disposition_settled", BooleanType(), True),
        StructField("state", StringType(), True),  # accepted | rejected | released | modified | received
    ]
)
