"""The frames table: one row per AMQP frame (or protocol header) seen on the wire.

Typed columns carry every field that flow state and rules use, named as in the specs
(AMQP 1.0 transport.xml, RabbitMQ's 0-9-1 JSON) and snake_cased. Every other argument of the
frame is kept, rendered as text, in the ``arguments`` map, so nothing decoded is thrown away.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# Identity and position of the frame: which capture, which TCP connection, which direction,
# where in the byte stream and in which packet it completed.
FRAME_KEY_FIELDS = [
    StructField("capture_id", StringType(), False),
    StructField("connection_id", StringType(), False),
    StructField("direction", StringType(), False),  # "c2s" client to server, "s2c" server to client
    StructField("frame_index", LongType(), False),  # order within the connection, both directions
    StructField("ts", TimestampType(), False),  # capture time of the packet completing the frame
    StructField("ts_us", LongType(), False),  # the same, microseconds since the epoch
    StructField("packet_number", LongType(), False),  # 1-based record number, as tshark's frame.number
    StructField("stream_offset", LongType(), False),  # first byte of the frame in its direction's stream
    StructField("frame_size", LongType(), False),  # bytes on the wire, header and frame-end included
]

FRAME_KIND_FIELDS = [
    StructField("protocol", StringType(), False),  # "amqp-0-9-1" or "amqp-1.0"
    # 0-9-1: protocol-header, method, header, body, heartbeat.
    # 1.0: protocol-header, amqp, sasl, empty (a heartbeat).
    StructField("frame_type", StringType(), False),
    StructField("channel", IntegerType(), True),
    # 0-9-1 "class.method" (basic.publish); 1.0 performative or SASL frame (flow, sasl-init).
    StructField("method", StringType(), True),
    StructField("class_id", IntegerType(), True),
    StructField("method_id", IntegerType(), True),
]

# AMQP 1.0 fields used by session / link flow state and rules (transport.xml).
AMQP10_FIELDS = [
    StructField("container_id", StringType(), True),
    StructField("hostname", StringType(), True),
    StructField("max_frame_size", LongType(), True),
    StructField("channel_max", IntegerType(), True),  # also 0-9-1 connection.tune(-ok)
    StructField("idle_time_out", LongType(), True),
    StructField("remote_channel", IntegerType(), True),
    StructField("next_incoming_id", LongType(), True),
    StructField("incoming_window", LongType(), True),
    StructField("next_outgoing_id", LongType(), True),
    StructField("outgoing_window", LongType(), True),
    StructField("handle_max", LongType(), True),
    StructField("name", StringType(), True),
    StructField("handle", LongType(), True),
    StructField("role", StringType(), True),  # "sender" / "receiver"
    StructField("snd_settle_mode", StringType(), True),
    StructField("rcv_settle_mode", StringType(), True),
    StructField("source_address", StringType(), True),
    StructField("target_address", StringType(), True),
    StructField("initial_delivery_count", LongType(), True),
    StructField("max_message_size", LongType(), True),
    StructField("delivery_count", LongType(), True),
    StructField("link_credit", LongType(), True),
    StructField("available", LongType(), True),
    StructField("drain", BooleanType(), True),
    StructField("echo", BooleanType(), True),
    StructField("delivery_id", LongType(), True),
    StructField("delivery_tag_bytes", BinaryType(), True),  # 1.0 delivery-tag is binary
    StructField("message_format", LongType(), True),
    StructField("settled", BooleanType(), True),
    StructField("more", BooleanType(), True),
    StructField("aborted", BooleanType(), True),
    StructField("resume", BooleanType(), True),
    StructField("batchable", BooleanType(), True),
    StructField("first", LongType(), True),
    StructField("last", LongType(), True),
    StructField("state", StringType(), True),  # delivery state descriptor name, e.g. "accepted"
    StructField("closed", BooleanType(), True),
    StructField("error_condition", StringType(), True),
    StructField("error_description", StringType(), True),
    StructField("mechanism", StringType(), True),  # SASL; the initial response is never kept
    StructField("sasl_code", StringType(), True),  # sasl-outcome code by its spec choice name (ok, auth, ...)
    StructField("payload_size", LongType(), True),  # transfer payload bytes after the performative
    # On the transfer completing a delivery (ingest.messages): the whole message, every frame's payload.
    StructField("delivery_frames", IntegerType(), True),  # transfers the delivery took
    StructField("message_size", LongType(), True),  # bytes of the message (all its sections)
    StructField("section_sizes", MapType(StringType(), LongType()), True),  # section name -> encoded bytes
    StructField("body_kind", StringType(), True),  # data | amqp-sequence | amqp-value
    StructField("to_address", StringType(), True),  # properties "to"
    StructField("subject", StringType(), True),
]

# Message properties both versions have (0-9-1 basic properties on the content header, 1.0
# header and properties sections); ids are rendered as text (1.0 allows ulong, uuid, binary).
MESSAGE_FIELDS = [
    StructField("message_id", StringType(), True),
    StructField("correlation_id", StringType(), True),
    StructField("content_type", StringType(), True),
    StructField("content_encoding", StringType(), True),
    StructField("reply_to", StringType(), True),
    StructField("priority", IntegerType(), True),
    StructField("delivery_mode", IntegerType(), True),  # 0-9-1 only: 2 = persistent
]

# AMQP 0-9-1 arguments used by channel / consumer flow state and rules (amqp-rabbitmq-0.9.1.json).
AMQP091_FIELDS = [
    StructField("frame_max", LongType(), True),
    StructField("heartbeat", IntegerType(), True),
    StructField("delivery_tag", LongType(), True),
    StructField("multiple", BooleanType(), True),
    StructField("requeue", BooleanType(), True),
    StructField("prefetch_size", LongType(), True),
    StructField("prefetch_count", IntegerType(), True),
    StructField("global", BooleanType(), True),
    StructField("active", BooleanType(), True),
    StructField("reason", StringType(), True),
    StructField("exchange", StringType(), True),
    StructField("routing_key", StringType(), True),
    StructField("queue", StringType(), True),
    StructField("consumer_tag", StringType(), True),
    StructField("no_ack", BooleanType(), True),
    StructField("redelivered", BooleanType(), True),
    StructField("mandatory", BooleanType(), True),
    StructField("message_count", LongType(), True),
    StructField("reply_code", IntegerType(), True),
    StructField("reply_text", StringType(), True),
    StructField("body_size", LongType(), True),  # content header
]

# Where a frame carried over TLS came from (appended to the table: rows written before read null).
FRAME_TLS_FIELDS = [
    # The TLS record whose decryption completed the frame: its number among the records of its
    # direction (handshake records included), from 1. Null for a frame not carried over TLS. Such a
    # frame's stream_offset counts decrypted bytes, and its packet_number is the packet that
    # completed that record.
    StructField("tls_record_number", LongType(), True),
]

# The frames table: one row per AMQP frame (or protocol header) seen on the wire.
FRAMES_SCHEMA = StructType(
    FRAME_KEY_FIELDS
    + FRAME_KIND_FIELDS
    + AMQP10_FIELDS
    + AMQP091_FIELDS
    + MESSAGE_FIELDS
    + [StructField("arguments", MapType(StringType(), StringType()), True)]
    + FRAME_TLS_FIELDS
)

FRAMES_COLUMNS = tuple(FRAMES_SCHEMA.fieldNames())

# A TLS connection (ingest/tls_stream.py): what its handshake showed and how its records went.
# Appended to the connections table; null on a connection without TLS.
TLS_CONNECTION_FIELDS = [
    StructField("tls_version", StringType(), True),  # negotiated in the ServerHello: "TLS 1.2", "TLS 1.3"
    StructField("tls_cipher_suite", StringType(), True),  # the ServerHello's, IANA name (TLS_AES_128_GCM_SHA256)
    StructField("tls_sni", StringType(), True),  # server name the client asked for (ClientHello server_name)
    StructField("tls_alpn", StringType(), True),  # ALPN protocol the server selected, when the capture shows it
    StructField("tls_alpn_offered", ArrayType(StringType()), True),  # ALPN protocols the client offered
    # "decrypted": every record decrypted; "handshake": no encrypted record seen; else the first
    # quarantine reason id met (tls.no_key: no key for the session, tls.decrypt_failed, ...).
    StructField("tls_status", StringType(), True),
    # TLS's own bytes each way (record headers, nonces, tags, padding, handshake, alerts): a TLS
    # connection's payload = framed + quarantined + these (pipelines/accounting.py).
    StructField("c2s_tls_bytes", LongType(), True),
    StructField("s2c_tls_bytes", LongType(), True),  # the same, server to client
]

# The connections table: one row per TCP connection carrying AMQP, or TLS on an AMQP port
# (protocol "tls" when its records were not decrypted: no key, wrong keys, no handshake).
CONNECTIONS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), False),
        StructField("client_address", StringType(), False),
        StructField("client_port", IntegerType(), False),
        StructField("server_address", StringType(), False),
        StructField("server_port", IntegerType(), False),
        StructField("protocol", StringType(), True),  # amqp-0-9-1, amqp-1.0; tls: TLS not decrypted; not-amqp
        StructField("protocol_inferred", BooleanType(), False),  # no protocol header in the capture
        StructField("first_ts", TimestampType(), True),
        StructField("last_ts", TimestampType(), True),
        StructField("frames", LongType(), False),
        StructField("c2s_bytes", LongType(), False),  # TCP payload bytes client to server (each once)
        StructField("s2c_bytes", LongType(), False),
        StructField("c2s_missing_bytes", LongType(), False),  # lost by the capture (gaps)
        StructField("s2c_missing_bytes", LongType(), False),
        StructField("retransmitted_bytes", LongType(), False),
        *TLS_CONNECTION_FIELDS,
    ]
)

# Bytes that could not be decoded, with the reason: nothing is lost silently. One cause is one
# reason_id however many places it was met at; what differs between them is in the columns after it.
QUARANTINE_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("connection_id", StringType(), True),
        StructField("direction", StringType(), True),
        # First byte of the run in its direction's stream (for capture.* reasons: in the capture file).
        StructField("stream_offset", LongType(), True),
        StructField("byte_count", LongType(), False),  # bytes in the run
        StructField("packet_number", LongType(), True),  # the packet that completed (or showed) the run
        StructField("missing", BooleanType(), False),  # true: a capture gap, the bytes never seen
        StructField("reason", StringType(), False),  # the reason in words, with its place
        # Stable id of the reason (ingest/reasons.py: REASONS; docs/RULES.md lists them), e.g. tcp.gap.
        StructField("reason_id", StringType(), True),
        # Where exactly: the byte a decoder stopped at, a frame-end octet (a file offset for capture.*).
        StructField("error_offset", LongType(), True),
        StructField("error_length", LongType(), True),  # a length the reason is about: declared, claimed or held
        StructField("expected", StringType(), True),  # what the spec or the format wants there, as text
        StructField("found", StringType(), True),  # what the bytes hold there, as text
    ]
)

# One file of a capture.
CAPTURE_PART = StructType(
    [
        StructField("file_name", StringType(), True),
        StructField("file_size", LongType(), True),
        StructField("content_hash", StringType(), True),
    ]
)

# The captures table: one row per capture ingested (a file, or the rotated parts of one), and one per
# file that is not a readable capture (status failed: reason).
CAPTURES_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        StructField("file_name", StringType(), False),  # the first part's name
        StructField("file_size", LongType(), False),  # all parts
        # The files of the capture in time order: one, or the rotated parts of one (ingest.rotation).
        StructField("parts", ArrayType(CAPTURE_PART), True),
        StructField("packets", LongType(), False),
        StructField("first_ts", TimestampType(), True),
        StructField("last_ts", TimestampType(), True),
        StructField("link_types", StringType(), True),
        # "ok"; "damaged: <place>: <reason>" when part of the file could not be read (the rest was);
        # "failed: <reason>" when none of it could (``amqpscope ingest`` records those too).
        StructField("status", StringType(), True),
        # TCP connections seen, on any port (one a pair of endpoints): with connections, what a
        # capture without AMQP traffic holds instead (diagnosis no_amqp); null when not read.
        StructField("tcp_connections", LongType(), True),
    ]
)
