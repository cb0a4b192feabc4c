"""Gold tables of the report: what its charts draw (``pipelines/report/chart_series.py``) and every other row
it shows (``pipelines/report/sections.py``), computed by derive so that the report reads them with
delta-rs, no Spark query.

In the chart series, times are seconds since the capture's first packet (Wireshark's ``frame.time_relative``). Each
capture has one bucket width, chosen from its span so that a chart has a few hundred points
(``pipelines.report.chart_series.bucket_width``); counts are the events in a bucket, zero when nothing
happened; states are step series (the value holds until the next point).
"""

from __future__ import annotations

from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

# One row per point of a chart series, bar of the timeline or violation marker. A chart's series
# are its busiest ones (at most 12 a chart, 60 timeline lanes), ranked; series_total says how many
# the capture has. The report draws each chart from its rows as they are.
CHART_SERIES_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        # queue_rates | connection_rates | churn | consumer_unacked | consumer_utilisation |
        # channel_unacked | link_credit | link_deliveries | confirms | tcp_window | timeline | violations
        StructField("chart", StringType(), False),
        StructField("series_rank", IntegerType(), False),  # 1 = the chart's busiest series in the capture
        StructField("series_total", IntegerType(), False),  # the chart's series in the capture, drawn or not
        StructField("connection_id", StringType(), True),
        StructField("channel", IntegerType(), True),
        # The series' entity: the queue's address (/queues/<name>), the consumer tag, the link name,
        # the rule id (violations), the lane's entity name (timeline)
        StructField("name", StringType(), True),
        StructField("direction", StringType(), True),  # c2s | s2c: of the messages, or of the side advertising
        # Timeline: the lane's entity (connection, channel, consumer, link, session, tcp).
        StructField("entity", StringType(), True),
        # What value measures: publish | deliver | redeliver | ack (queue_rates, messages a bucket),
        # messages | bytes (connection_rates), connections_opened |
        # connections_closed | channels_opened | channels_closed (churn), unacked | prefetch,
        # utilisation and utilisation_overall (0..1, the latter once at x = 0), link_credit, deliveries,
        # outstanding, window, zero_windows; the flow_intervals cause (timeline); the severity (violations)
        StructField("metric", StringType(), False),
        StructField("bucket_s", DoubleType(), False),  # the capture's bucket width in seconds
        # Seconds since the capture's first packet: a count's bucket start, a state's time (the first
        # in its bucket when a long series is cut into buckets), a bar's start
        StructField("x", DoubleType(), False),
        StructField("x_end", DoubleType(), True),  # timeline bars: the interval's end (the capture's end if open)
        StructField("value", DoubleType(), True),  # a count, a state, a fraction; null for bars and markers
        StructField("packet_number", LongType(), True),  # bars and markers: the packet they start at
        StructField("end_packet_number", LongType(), True),  # bars: the packet that ended the interval
        StructField("detail", StringType(), True),  # bars: the interval's detail (blocked reason, prefetch ...)
    ]
)

# One row per row of a section of a capture's report page, ranked in the section's order
# (``pipelines.report.sections``): the capture's own line, its connections, frame kinds, rule
# counts and first violations, operator context (connections, queues, consumers, links), the
# quarantine's causes, the byte accounting and the frames the bottleneck findings point at. Each
# section keeps its busiest rows; ``total`` says how many it has in all. The row's columns differ
# from section to section, so they are kept as one JSON object; what the page shows of a time is
# text in derive's session time zone, what a chart places of it epoch microseconds.
REPORT_SECTIONS_SCHEMA = StructType(
    [
        StructField("capture_id", StringType(), False),
        # capture | connections | frames | counts | examples | context | queues | consumers | links |
        # quarantine | accounting | finding_frames
        StructField("section", StringType(), False),
        StructField("position", IntegerType(), False),  # 1 = the first row in the section's order
        StructField("total", LongType(), False),  # the section's rows in the capture, kept or not
        StructField("row", StringType(), False),  # the row's columns as a JSON object (nulls kept)
    ]
)
