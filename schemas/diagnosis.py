"""Gold tables of the bottleneck diagnosis (docs/DIAGNOSIS.md): findings and one headline per capture.

``bottlenecks`` has one row per finding: which entity is held back, by which component of the
path a message takes (the credit-flow chain inside RabbitMQ, a resource alarm, a slow consumer, a
client not reading, the network), what that does to traffic, when, and the measured figures the
verdict rests on. ``diagnosis`` has one row per capture: the top finding as the sentence an
operator reads first, and the ranked list.
"""

from __future__ import annotations

from enum import StrEnum

from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)


class Component(StrEnum):
    """The bottleneck, named by the stage that holds traffic back (docs/DIAGNOSIS.md, "Components")."""

    NONE = "none"
    CONNECTION = "connection"  # RabbitMQ's reader process (credit flow): a connection in flow, its channels not
    CHANNEL = "channel"  # a channel process (routing): connection in flow, queues not
    QUEUE = "queue"  # a queue process: connection and channels in flow, the queue not keeping up
    MESSAGE_STORE = "message_store"  # persistent messages of at least the embed threshold, written to disk
    MEMORY_ALARM = "memory_alarm"
    DISK_ALARM = "disk_alarm"
    ALARM = "alarm"  # a resource alarm whose reason the wire does not say
    CONSUMER = "consumer"  # a slow consumer: unacked held at prefetch / link credit held at 0 while messages wait
    CLIENT = "client"  # the client sets the pace: not reading its socket, or bound by its own round trips
    NETWORK = "network"  # loss and retransmission between the peers


# The bottlenecks table's component and effect columns hold these values (plain strings).
COMPONENTS = tuple(member.value for member in Component)


class Effect(StrEnum):
    """What a finding does to traffic."""

    PUBLISHER_THROTTLED = "publisher_throttled"  # the broker reads a publisher's socket slower than it sends
    BLOCKED = "blocked"  # connection.blocked / incoming-window 0: publishing stopped by an alarm
    CONSUMER_STARVED = "consumer_starved"  # a consumer waits for deliveries the broker holds back
    HEAD_OF_LINE = "head_of_line"  # a consumer slowed because it shares a throttled connection with a publisher
    CREDIT_STARVED = "credit_starved"  # an AMQP 1.0 link's sender out of credit while it has messages for it
    DELIVERIES_WAIT_FOR_ACKS = "deliveries_wait_for_acks"  # 0-9-1: deliveries released only as the consumer acks
    DELIVERIES_NEVER_ACKED = "deliveries_never_acked"  # 0-9-1: a manual-ack consumer holds its deliveries and acks none
    REDELIVERY_LOOP = "redelivery_loop"  # a message requeued and redelivered again and again
    # AMQP 1.0: the broker settles a sender's transfers seconds after they were written
    SETTLEMENT_DELAYED = "settlement_delayed"
    BACKLOG_UNCONSUMED = "backlog_unconsumed"  # a queue filling with no consumer in the capture
    CLIENT_NOT_READING = "client_not_reading"  # the client's receive window closed: the broker cannot send
    RETRANSMISSION = "retransmission"  # segments lost and sent again: time lost to recovery
    # a consumer taking one message per round trip (prefetch / credit 1)
    CONSUMER_ROUND_TRIP_BOUND = "consumer_round_trip_bound"
    # a publisher waiting for each confirm before its next publish
    PUBLISHER_WAITS_FOR_CONFIRMS = "publisher_waits_for_confirms"
    PUBLISHES_REFUSED = "publishes_refused"  # the broker basic.nack'ed publishes: messages it did not take
    MESSAGES_RETURNED = "messages_returned"  # basic.return: mandatory messages no queue took, sent back
    CLOSED_WITH_ERROR = "closed_with_error"  # a channel or connection closed with an error reply code
    CONNECTION_CHURN = "connection_churn"  # a connection opened and closed for a few messages
    CHANNEL_CHURN = "channel_churn"  # a channel opened and closed for a few messages
    REQUEST_REPLY_LATENCY = "request_reply_latency"  # a caller waiting for each reply before its next request
    BANDWIDTH_LIMITED = "bandwidth_limited"  # throughput held at the link's ceiling, with loss


EFFECTS = tuple(member.value for member in Effect)

# What a finding is: a bottleneck holds traffic back (the top one is the capture's verdict); a problem
# is wrong or an anti-pattern without being the verdict (returns, refused publishes, churn, a slow
# consumer a faster one hides), listed beside it.
FINDING_KINDS = ("bottleneck", "problem")
# warning: it costs throughput or messages; info: worth knowing, costs little now. Listed in this order.
FINDING_SEVERITIES = ("warning", "info")

# diagnosis.bottleneck of a capture with nothing to judge: no AMQP connection was decoded in it.
NO_AMQP = "no_amqp"
# ... and of one whose AMQP-port connections were all encrypted and not decrypted.
ENCRYPTED = "encrypted"

ENTITY_KINDS = ("connection", "channel", "consumer", "queue", "session", "link", "node")

# The bottlenecks table: one row per finding, ranked: which entity is held back, by which component
# of the path, what that does to traffic, when, and the measured figures the verdict rests on.
BOTTLENECKS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("rank", IntegerType(), False),  # 1 = the headline; ordered by severity of impact
        StructField("finding_id", StringType(), False),  # stable: capture, rule, entity and start
        StructField("rule_id", StringType(), False),  # the inference rule, e.g. diagnosis.consumer.prefetch_bound
        StructField("connection_id", StringType(), True),  # null for a finding about a queue across connections
        StructField("entity_kind", StringType(), False),  # ENTITY_KINDS
        # What an operator recognises: queue, consumer tag, link, client:port.
        StructField("entity", StringType(), False),
        StructField("connection_name", StringType(), True),  # client-properties connection_name / 1.0 container-id
        StructField("client", StringType(), True),  # client address:port
        StructField("channel", IntegerType(), True),
        StructField("consumer_tag", StringType(), True),
        StructField("link_name", StringType(), True),
        StructField("queue", StringType(), True),  # 0-9-1 queue or 1.0 address
        StructField("component", StringType(), False),  # COMPONENTS
        StructField("effect", StringType(), False),  # EFFECTS
        StructField("severity", StringType(), False),  # warning | info
        StructField("start_ts", TimestampType(), False),
        StructField("end_ts", TimestampType(), True),  # null: still so when the capture ends
        StructField("start_packet_number", LongType(), False),
        StructField("end_packet_number", LongType(), True),
        StructField("duration_us", LongType(), False),  # time the entity spent held back
        StructField("lifetime_share", DoubleType(), False),  # duration over the entity's captured lifetime
        StructField("confidence", DoubleType(), False),  # 0..1
        StructField("evidence", MapType(StringType(), StringType()), False),  # measured figures, as text
        StructField("packet_numbers", ArrayType(LongType()), False),  # up to 20 frames to look at, in order
        StructField("wireshark_filter", StringType(), False),  # ready to paste into Wireshark
        StructField("explanation", StringType(), False),  # one sentence
        StructField("kind", StringType(), True),  # FINDING_KINDS (appended column)
    ]
)

# One finding as listed in diagnosis.findings.
# Every field nullable: Delta stores nested fields so, and a cast must not narrow them.
FINDING_SUMMARY = StructType(
    [
        StructField("rank", IntegerType(), True),
        StructField("component", StringType(), True),
        StructField("effect", StringType(), True),
        StructField("entity_kind", StringType(), True),
        StructField("entity", StringType(), True),
        StructField("connection_id", StringType(), True),
        StructField("start_ts", TimestampType(), True),
        StructField("end_ts", TimestampType(), True),
        StructField("start_packet_number", LongType(), True),
        StructField("confidence", DoubleType(), True),
        StructField("explanation", StringType(), True),
        StructField("kind", StringType(), True),
        StructField("severity", StringType(), True),
    ]
)

# The diagnosis table: one row per capture, its top finding as the sentence an operator reads first.
DIAGNOSIS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        # The top finding's component, or "none"; "encrypted" when TLS connections were not decrypted
        # and nothing else could be judged (no AMQP decoded, no TCP finding); "no_amqp" when no AMQP
        # connection was decoded and none was encrypted (nothing to judge).
        StructField("bottleneck", StringType(), False),
        StructField("effect", StringType(), True),
        StructField("entity_kind", StringType(), True),
        StructField("entity", StringType(), True),
        StructField("connection_id", StringType(), True),
        StructField("start_packet_number", LongType(), True),
        StructField("headline", StringType(), False),  # the sentence an operator reads first
        StructField("findings_count", IntegerType(), False),
        StructField("findings", ArrayType(FINDING_SUMMARY), False),  # ranked
        # TLS connections on AMQP ports whose records were not decrypted (no key log, or keys of other
        # sessions): their AMQP is not in the diagnosis, only their TCP (appended column).
        StructField("encrypted_connections", IntegerType(), True),
        # Findings of kind problem (beside the verdict, FINDING_KINDS): appended column.
        StructField("problems_count", IntegerType(), True),
        # What could not be judged in the capture and why, one sentence each (appended column): the
        # room in the TCP windows of connections begun before the capture (window scale unknown) and
        # the credit of AMQP 1.0 links attached before it whose halves could not be paired.
        StructField("not_judged", ArrayType(StringType()), True),
    ]
)

# The round_trips table: one row per round trip a client (or the broker) waited on: a request/reply
# call (a request published with reply_to and correlation_id, answered by a reply with the same
# correlation_id), a synchronous 0-9-1 method and its reply, a publish and its confirm
# (pipelines/diagnosis/round_trips.py).
ROUND_TRIPS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),  # the asker's connection (a call's caller)
        StructField("channel", IntegerType(), True),
        StructField("kind", StringType(), False),  # request_reply | method | confirm
        StructField("asked_by", StringType(), False),  # client | broker
        StructField("request", StringType(), False),  # the method asked: basic.publish, queue.declare ...
        StructField("response", StringType(), True),  # its answer: basic.deliver, queue.declare-ok, basic.ack ...
        StructField("correlation_id", StringType(), True),  # a call's correlation_id
        StructField("request_ts", TimestampType(), False),
        StructField("response_ts", TimestampType(), True),  # null: not answered in the capture
        StructField("round_trip_us", LongType(), True),  # request to answer
        StructField("request_packet_number", LongType(), True),
        StructField("response_packet_number", LongType(), True),
        StructField("responder_connection_id", StringType(), True),  # a call's responder
        StructField("broker_in_us", LongType(), True),  # a call: request published to delivered to the responder
        StructField("responder_us", LongType(), True),  # a call: request delivered to reply published
        StructField("broker_out_us", LongType(), True),  # a call: reply published to delivered to the caller
        StructField("caller_us", LongType(), True),  # a call: reply delivered to the caller's next request
    ]
)
