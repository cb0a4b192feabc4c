"""The events table: what an operator wants listed even when nobody broke the spec (issue 14).

A violation says a peer broke a rule; an event says something worth knowing happened: an endpoint
closed with an error condition, RabbitMQ closed a channel or connection with a 0-9-1 reply code of
300 or more, a delivery was aborted, a message could not be decoded, a link was attached again.
Values in ``condition`` and ``text`` come from the wire as they are (a report escapes them).
"""

from __future__ import annotations

from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

EVENTS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        # Stable, dotted like a rule id (expectations/events.yml lists them): amqp10.link.detached_with_error ...
        StructField("event_id", StringType(), False),
        StructField("severity", StringType(), False),  # info
        StructField("direction", StringType(), False),  # who sent the frame
        StructField("protocol", StringType(), False),
        StructField("channel", IntegerType(), True),
        StructField("handle", LongType(), True),
        StructField("method", StringType(), True),
        StructField("frame_index", LongType(), False),
        StructField("ts", TimestampType(), False),
        StructField("packet_number", LongType(), False),
        # 1.0: the error condition (amqp:internal-error ...); 0-9-1: the reply code; undecodable
        # message: the decoder's message.
        StructField("condition", StringType(), True),
        StructField("text", StringType(), True),  # 1.0 error description; 0-9-1 reply-text
        StructField("link_name", StringType(), True),  # attach rows: the name of the link
    ]
)
