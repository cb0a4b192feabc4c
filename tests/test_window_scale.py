"""The window scale of a connection whose handshake is not in the capture: inferred from the bytes
in flight as a lower bound (pipelines/tcp_flow.py), and the room in such a window never judged
(pipelines/tcp_pressure.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyspark.sql.functions as F
from pyspark.testing import assertDataFrameEqual

from amqpscope.pipelines.tcp_flow import tcp_flow_timeline
from amqpscope.pipelines.tcp_pressure import unjudged_windows, window_limited_gaps
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA

T0 = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
# The broker advertises a raw window of 64 throughout; the client has up to 6,000 bytes in flight.
# (direction, seq_offset, ack_offset, raw window, payload)
TRAFFIC = [
    ("c2s", 0, 0, 500, 2000),
    ("c2s", 2000, 0, 500, 2000),
    ("s2c", 0, 4000, 64, 0),
    ("c2s", 4000, 0, 500, 2000),
    ("c2s", 6000, 0, 500, 2000),
    ("c2s", 8000, 0, 500, 2000),
    ("s2c", 0, 10000, 64, 0),
]


def segments(spark, scale: int | None, connection: str = "conn"):
    """``TRAFFIC`` as tcp_segments rows: ``scale`` the shift the handshake gave (None: not captured,
    the window raw, as the ingest stores it then)."""
    rows = [
        (
            "cap",
            connection,
            d,
            n + 1,
            T0 + timedelta(milliseconds=n),
            int((T0 + timedelta(milliseconds=n)).timestamp() * 1e6),
            seq,
            ack,
            0x18,
            window,
            scale,
            window << (scale or 0),
            payload,
            0,
            None,
            None,
        )
        for n, (d, seq, ack, window, payload) in enumerate(TRAFFIC)
    ]
    return spark.createDataFrame(rows, TCP_SEGMENTS_SCHEMA)


def test_a_shift_not_captured_is_the_least_the_bytes_in_flight_prove(spark):
    flow = tcp_flow_timeline(segments(spark, None))
    actual = flow.select("packet_number", "window_scale", "window_scale_source", "effective_window", "peer_window")
    # The client had 6,000 bytes in flight against the broker's raw 64 (packet 5): 64 << 7 = 8,192
    # is the least shifted window that holds them (64 << 6 = 4,096 does not). Nothing the broker
    # sent was in flight: the client's shift stays unknown (0, the raw window).
    expected = spark.createDataFrame(
        [
            (1, 0, "unknown", 500, None),
            (2, 0, "unknown", 500, None),
            (3, 7, "inferred", 8192, 500),
            (4, 0, "unknown", 500, 8192),
            (5, 0, "unknown", 500, 8192),
            (6, 0, "unknown", 500, 8192),
            (7, 7, "inferred", 8192, 500),
        ],
        "packet_number long, window_scale int, window_scale_source string, effective_window long, peer_window long",
    )
    assertDataFrameEqual(actual, expected)
    # A window whose shift is a lower bound is never flagged full.
    assert flow.filter("is_window_full").count() == 0


def test_a_shift_from_the_handshake_is_kept(spark):
    flow = tcp_flow_timeline(segments(spark, 7))
    actual = flow.select("packet_number", "window_scale", "window_scale_source", "effective_window")
    expected = spark.createDataFrame(
        [(n + 1, 7, "handshake", w << 7) for n, (_, _, _, w, _) in enumerate(TRAFFIC)],
        "packet_number long, window_scale int, window_scale_source string, effective_window long",
    )
    assertDataFrameEqual(actual, expected)


def test_the_room_in_a_window_is_judged_only_with_the_handshake(spark):
    # With the raw 64 taken as the broker's window in bytes, every segment of the client would
    # wait for room; shifted by 7 (8,192 bytes), the segments after the broker's acknowledgement
    # at 4,000 fill it (6,000 + 2,000 = 8,000 in flight, then 10,000 > 4,000 + 8,192).
    unscaled = segments(spark, None, "late").withColumn("window_scale", F.lit(0))
    raw = window_limited_gaps(tcp_flow_timeline(unscaled), "c2s").select("connection_id", "start_packet_number")
    assert raw.count() > 0  # what the diagnosis took for a throttled publisher
    late = tcp_flow_timeline(segments(spark, None, "late"))
    assert window_limited_gaps(late, "c2s").count() == 0
    assertDataFrameEqual(
        unjudged_windows(late),
        spark.createDataFrame(
            [("cap", "late", "inferred")], "capture_id string, connection_id string, window_scale_source string"
        ),
    )
    known = tcp_flow_timeline(segments(spark, 0, "known"))
    assert unjudged_windows(known).count() == 0
