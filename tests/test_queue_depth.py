"""pipelines.queue_depth.depth_at: a queue's ready count just before each point, each point answered
in its own row (no key joins the answers back, so points that share a queue and a moment, or carry
no id at all, are each answered once)."""

from __future__ import annotations

from pyspark.testing import assertDataFrameEqual

from amqpscope.pipelines.queue_depth import depth_at

SET, CHANGE = 0, 1  # the kinds of pipelines.queue_depth.depth_events


def test_each_point_gets_the_ready_count_just_before_it(spark):
    events = spark.createDataFrame(
        [
            # q: declared with 5 ready, one publish, two deliveries in one microsecond; purged, one publish.
            ("c", "q", 100, SET, 5),
            ("c", "q", 200, CHANGE, 1),
            ("c", "q", 300, CHANGE, -1),
            ("c", "q", 300, CHANGE, -1),
            ("c", "q", 400, SET, 0),
            ("c", "q", 450, CHANGE, 1),
            # never: its count was never set in the capture.
            ("c", "never", 20, CHANGE, 1),
            # short: a delivery the capture cannot account for (a publisher it does not hold).
            ("c", "short", 10, SET, 0),
            ("c", "short", 20, CHANGE, -1),
            # the same queue name in another capture is another queue.
            ("d", "q", 100, SET, 9),
        ],
        "capture_id string, queue string, ts_us long, kind int, value long",
    )
    points = spark.createDataFrame(
        [
            ("c", "q", 50, "before the count was set"),
            ("c", "q", 300, "consumer A"),
            ("c", "q", 300, "consumer B, the same moment"),
            ("c", "q", 500, "after the purge"),
            ("c", "never", 100, "never set"),
            ("c", "short", 15, "before it went below zero"),
            ("d", "q", 300, "other capture"),
        ],
        "capture_id string, queue string, ts_us long, owner string",
    )
    expected = spark.createDataFrame(
        [
            ("c", "q", 50, "before the count was set", None),
            ("c", "q", 300, "consumer A", 4),
            ("c", "q", 300, "consumer B, the same moment", 4),
            ("c", "q", 500, "after the purge", 1),
            ("c", "never", 100, "never set", None),
            ("c", "short", 15, "before it went below zero", None),
            ("d", "q", 300, "other capture", 9),
        ],
        "capture_id string, queue string, ts_us long, owner string, ready long",
    )
    assertDataFrameEqual(depth_at(points, events), expected)


def test_a_queues_timeline_is_buffered_by_one_window_operator_for_its_running_values(spark):
    # Each window operator buffers a whole partition, here a queue's timeline (a run's largest):
    # the running set count, base and changes in one, the changes at the latest set (which reads
    # the changes) in a second, the whole-queue check in a third.
    events = spark.createDataFrame(
        [("c", "q", 100, SET, 5)], "capture_id string, queue string, ts_us long, kind int, value long"
    )
    points = spark.createDataFrame([("c", "q", 300)], "capture_id string, queue string, ts_us long")
    plan = depth_at(points, events)._jdf.queryExecution().executedPlan().toString()
    windows = [line for line in plan.splitlines() if line.lstrip(" :+-").startswith("Window ")]
    assert len(windows) == 3, plan
    running = [w for w in windows if "unboundedpreceding$(), currentrow$()" in w]
    assert [w.count("windowspecdefinition") for w in running] == [1, 3], plan
