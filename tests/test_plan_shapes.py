"""The shape of the flow-state plans: how often each pipeline sorts and shuffles its rows.

A window over a key needs the rows sorted by that key; windows over one key next to each other
share one sort, and a table evaluated twice in one plan sorts twice. Sorts of a million frames
are what the 0-9-1 tables spend their time on (docs/BENCHMARKS.md, "What is set": fewer sorts in the
0-9-1 pipelines), so these tests pin down the sorts the pipelines were rid of, and the shuffles that
ingest's partitioning of its decoded rows spares them. The plans are read, not run; only a persisted
input is computed first, as a real run has it in place before planning on it.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from pyspark.sql import Window
from pyspark.sql import functions as F

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.jobs.lake.lake import Lake
from amqpscope.jobs.stages.decode import decode_captures, decode_tables, resolve_captures, write_bronze
from amqpscope.pipelines.channel_unacked import consumer_unacked_timeline, unacked_ledger
from amqpscope.pipelines.channels import channel_pass
from amqpscope.pipelines.confirms import channel_confirms_timeline
from amqpscope.pipelines.lifecycle_091 import lifecycle_091_timeline
from amqpscope.pipelines.lifecycle_10 import lifecycle_10_timeline
from amqpscope.pipelines.link_credit import link_state_timeline
from amqpscope.pipelines.messages import deliveries_10, messages_091, settlement_times
from amqpscope.pipelines.partitioning import by_connection, checkpointed
from amqpscope.pipelines.sessions import session_map, session_window_timeline
from amqpscope.pipelines.tables import STORED_FRAMES, Build, no_rows
from amqpscope.pipelines.tcp_flow import tcp_flow_timeline
from amqpscope.schemas.frames import FRAMES_SCHEMA
from amqpscope.schemas.tcp import TCP_SEGMENTS_SCHEMA
from tests.paths import SAMPLES

# A channel number's frames in order: the sort that numbers a 0-9-1 channel's incarnations.
CHANNEL_NUMBER_ORDER = ("capture_id", "connection_id", "channel", "frame_index")


def plan_of(df) -> str:
    """``df``'s physical plan, as text."""
    return df._jdf.queryExecution().executedPlan().toString()


def sorts(df) -> list[tuple[str, ...]]:
    """The sort orders in ``df``'s physical plan, one per Sort operator: column names in order."""
    plan = plan_of(df)
    return [
        tuple(re.sub(r"#\d+L?", "", key).split()[0] for key in keys.split(", "))
        for keys in re.findall(r"Sort \[([^\]]*)\]", plan)
    ]


def plan_nodes(df):
    """The operators of ``df``'s physical plan, depth first: the plan's own, not those of persisted
    inputs it reads (already done)."""

    def walk(node):
        if node.nodeName() == "AdaptiveSparkPlan":  # adaptive execution's plan as it stands before running
            node = node.executedPlan()
        yield node
        children = node.children()
        for i in range(children.size()):
            yield from walk(children.apply(i))

    return list(walk(df._jdf.queryExecution().executedPlan()))


def shuffles(df) -> list[str]:
    """The shuffles ``df``'s plan would run, each as its partitioning."""
    return [
        re.sub(r"#\d+L?", "", node.outputPartitioning().toString())
        for node in plan_nodes(df)
        if node.nodeName() == "Exchange"
    ]


def persisted_reads(df) -> int:
    """How many times ``df``'s plan reads persisted rows (ingest's decoded rows: each read takes them whole)."""
    return sum(node.nodeName() == "InMemoryTableScan" for node in plan_nodes(df))


def frames(spark):
    """An empty frames table, hash-partitioned by connection as ingest hands it over."""
    return by_connection(spark.createDataFrame([], FRAMES_SCHEMA))


def sessions_of(rows):
    """The session map of ``rows`` as derive hands it to the 1.0 timelines: a shared result, kept."""
    return checkpointed(session_map(rows))


def test_sorts_reads_a_plans_sort_orders(spark):
    df = frames(spark).sortWithinPartitions("connection_id", "frame_index")
    assert sorts(df) == [("connection_id", "frame_index")]
    assert sorts(frames(spark)) == []


def test_lifecycle_091_sorts_its_rows_once_per_window_key(spark):
    # The connection's windows, the channel number's and the incarnation's: three keys, three sorts.
    found = sorts(lifecycle_091_timeline(frames(spark)))
    assert sorted(found) == sorted(
        [
            ("capture_id", "connection_id", "frame_index"),
            CHANNEL_NUMBER_ORDER,
            ("capture_id", "connection_id", "channel", "incarnation", "frame_index"),
        ]
    )


def test_messages_091_evaluates_its_channel_windows_once(spark):
    # Incarnations are numbered once: the settlement is found on the messages' own rows, not on a
    # second evaluation of the channel's windows joined back.
    found = Counter(sorts(messages_091(frames(spark))))
    assert found[CHANNEL_NUMBER_ORDER] == 1
    assert found[("capture_id", "connection_id", "channel", "incarnation", "_pair_kind", "_pair_n")] == 1
    # Confirm mode and publish numbers are found over the same sort as the consumers' first windows.
    assert found[("capture_id", "connection_id", "channel", "incarnation", "frame_index")] == 1


def test_the_unacked_tables_share_one_ledger(spark):
    # Apart, consumer_unacked replays the ledger's windows; built from the table graph it reads
    # the ledger computed once (a shared result, a local checkpoint): only its consumer windows are left.
    alone = sorts(consumer_unacked_timeline(frames(spark)))
    assert CHANNEL_NUMBER_ORDER in alone
    timelines = Build({"frames": frames(spark)}).build(["consumer_unacked", "channel_unacked"])
    for table in ("consumer_unacked", "channel_unacked"):
        shared = sorts(timelines[table])
        assert CHANNEL_NUMBER_ORDER not in shared, table
        assert len(shared) < len(alone), table
    # Its three consumer windows share one sort: the one ordered by (frame_index, delivery_tag) first.
    assert [keys[:6] for keys in sorts(timelines["consumer_unacked"])] == [
        ("capture_id", "connection_id", "channel", "incarnation", "consumer_tag", "frame_index")
    ]


def test_a_settlement_sorts_its_numbering_by_number_named_once(spark):
    # The lag and the lead over the rows naming one number run on one sort of them.
    found = Counter(sorts(channel_confirms_timeline(frames(spark))))
    named = [keys for keys in found if "_named" in keys]
    assert named == [("capture_id", "connection_id", "channel", "incarnation", "_named", "frame_index")]
    assert found[named[0]] == 1


def test_link_state_sorts_its_settlement_rows_once_for_the_running_state_and_the_dispositions(spark):
    # After the settlement rows are added, one sort (frame, then delivery) serves the running
    # state, the unsettled count and the first row of each disposition.
    link = ("capture_id", "connection_id", "link_name", "sender_direction")
    found = Counter(sorts(link_state_timeline(frames(spark))))
    assert found[(*link, "frame_index", "_delivery_start")] == 1
    assert found[(*link, "frame_index")] == 1  # the credit state's, before the settlement rows


def test_shuffles_reads_a_plans_own_shuffles(spark):
    rows = spark.range(4).selectExpr("CAST(id % 2 AS STRING) AS capture_id", "CAST(id AS STRING) AS connection_id")
    rows = rows.repartition(8, "capture_id", "connection_id")
    assert shuffles(rows) == ["hashpartitioning(capture_id, connection_id, 8)"]
    kept = rows.persist()
    try:
        # Adaptive execution settles a persisted plan's partitioning when it runs: until then Spark
        # plans a shuffle after it (ingest's persisted rows are in place before anything is derived).
        assert shuffles(kept.groupBy("capture_id", "connection_id").count()) != []
        kept.count()
        assert shuffles(kept.filter("connection_id = '1'")) == []
        assert shuffles(kept.groupBy("capture_id", "connection_id").count()) == []
        assert shuffles(kept.groupBy("connection_id").count()) == ["hashpartitioning(connection_id, 8)"]
    finally:
        kept.unpersist()


@pytest.mark.parametrize("range_bytes", [64 << 20, 16_384])  # one byte range, and ranges decoded apart
def test_ingest_hands_frames_and_segments_over_partitioned_by_connection(spark, range_bytes):
    # The decoded rows are persisted hash-partitioned by connection and split by kind keeping that
    # partitioning: the frames' and the segments' pipelines, and joins of tables derived from them
    # on the connection and more, shuffle nothing (jobs.engine.session: requireAllClusterKeysForCoPartition).
    tables, persisted = decode_tables(
        spark, resolve_captures([SAMPLES / "mixed.pcapng"]), (5672,), range_bytes=range_bytes
    )
    try:
        tables["connections"].count()  # decoded and persisted, as the bronze tables' writes do
        assert shuffles(tcp_flow_timeline(tables["tcp_segments"])) == []
        assert shuffles(lifecycle_091_timeline(tables["frames"])) == []
        assert shuffles(tables["frames"].join(tables["tcp_segments"], ["capture_id", "connection_id"])) == []
        # A join on the connection and more (messages_091's, on channel, direction and frame) keeps
        # that partitioning too: a sort-merge join, as big captures have, sorts and does not shuffle.
        # deliveries_10 finds its sessions in one pass over the begins (a union of two lost it).
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
        assert shuffles(messages_091(tables["frames"])) == []
        assert shuffles(deliveries_10(tables["frames"])) == []
    finally:
        spark.conf.unset("spark.sql.autoBroadcastJoinThreshold")
        for df in persisted:
            df.unpersist()


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory):
    """The mixed sample's bronze tables as a large run hands them on: written by Spark, nothing kept."""
    captures = resolve_captures([SAMPLES / "mixed.pcapng"])
    bronze = write_bronze(spark, Lake(spark, tmp_path_factory.mktemp("lake")), captures, (5672,))
    yield bronze
    bronze.release()


def test_written_bronze_hands_on_the_stored_captures_table(spark, written):
    # The captures table aggregates every packet read. Once written, the steps after ingest read
    # its stored rows (a scan of one small file a capture) rather than aggregate the packets again.
    computed = decode_captures(spark, resolve_captures([SAMPLES / "mixed.pcapng"]), (5672,))
    try:
        plan = plan_of(written.captures)
        assert "Aggregate" not in plan and "InMemoryTableScan" not in plan
        assert written.captures.collect() == computed.captures.collect()
    finally:
        computed.release()


def test_written_bronze_hands_on_the_stored_frames_for_lookups(written):
    # Written by Spark (a large run), the frames derive reads are the persisted decoded rows,
    # partitioned by connection for the windows; the stored frames, the same rows, are what the
    # tables that pick a few kinds of frame read: a columnar scan of the Parquet files.
    persisted, stored = written.frames, written.table(STORED_FRAMES)
    assert "InMemoryTableScan" in plan_of(persisted) and "InMemoryTableScan" not in plan_of(stored)
    assert sorted(stored.collect()) == sorted(persisted.collect())
    # Each table built from its inputs stored without rows: its plan's own reads are what is left.
    rows = {}

    def store(table, built):
        rows[table.name] = built
        return no_rows(stored, table)

    build = Build(written.tables, {"limits": DiagnosisThresholds(), "spoken": None}, store)
    lookups, windows = (
        ("connection_blocked", "channel_flow", "events", "bottlenecks"),
        ("frame_limits", "idle_gaps"),
    )
    build.build([*lookups, *windows, "deliveries_10"])
    for table in lookups:
        assert persisted_reads(rows[table]) == 0, table
    for table in windows:
        assert persisted_reads(rows[table]) > 0, table
    # deliveries_10 reads the persisted frames for the transfers and the dispositions, the stored
    # ones for the begins; given the persisted frames alone it reads them for the begins too.
    assert persisted_reads(rows["deliveries_10"]) == 2
    assert persisted_reads(deliveries_10(persisted)) > 2
    # The rules test each frame alone: derive hands them the stored frames.
    assert build.stored_frames() is stored


def test_a_settlement_is_joined_by_a_sort_merge_join(written):
    # The settlements are a fifth of the frames: read from the stored frames, their few columns look
    # small to the planner (compressed, the filter's effect unknown), which would broadcast them.
    messages = checkpointed(messages_091(written.frames))  # its own joins done: the plan below is the one join
    joined = messages.join(
        settlement_times(written.table(STORED_FRAMES), "ts", "_settled_ts"),
        ["capture_id", "connection_id", "settled_frame_index"],
        "left",
    )
    assert "SortMergeJoin" in plan_of(joined) and "BroadcastHashJoin" not in plan_of(joined)


def window_operators(df) -> Counter:
    """The Window operators in ``df``'s physical plan, counted by their partition keys (column names)."""
    plan = plan_of(df)
    found = Counter()
    for line in plan.splitlines():
        if line.lstrip(" :+-").startswith("Window "):
            # Window [expressions], [partition keys] and, but for a whole partition, [order]
            partition = re.search(r"\], \[([^\]]*)\](?:, \[[^\]]*\])?\s*$", line).group(1)
            found[tuple(re.sub(r"#\d+L?", "", key) for key in partition.split(", "))] += 1
    return found


CONNECTION = ("capture_id", "connection_id")


def test_window_operators_reads_a_plans_windows_by_key(spark):
    rows = frames(spark)
    by_channel = Window.partitionBy(*CONNECTION, "channel").orderBy("frame_index")
    apart = rows.withColumn("a", F.lag("method").over(by_channel)).withColumn("b", F.lead("method").over(by_channel))
    together = rows.withColumns({"a": F.lag("method").over(by_channel), "b": F.lead("method").over(by_channel)})
    assert window_operators(together) == {(*CONNECTION, "channel"): 1}
    assert window_operators(apart.select("a", F.col("b").alias("c"))) == {(*CONNECTION, "channel"): 1}
    assert window_operators(
        rows.withColumn("a", F.lag("method").over(by_channel)).withColumn("b", F.lead("a").over(by_channel))
    ) == {(*CONNECTION, "channel"): 2}


# Each window operator buffers its partitions whole and passes over them: the windows of one key go
# in one operator, but for those reading another window's result (docs/BENCHMARKS.md, "Fewer window
# operators").
def test_session_map_reads_the_begins_once(spark):
    # Windows, not joins of the begins with themselves: one scan of the frames, no join, and no
    # shuffle of the frames as ingest hands them over (kept, partitioned by connection).
    rows = checkpointed(frames(spark))
    plan = session_map(rows)
    assert window_operators(plan) == {
        (*CONNECTION, "sender", "on"): 1,  # the latest begin each answer names
        (*CONNECTION, "session_id"): 1,  # the session's channels on both ends
    }
    assert "Join" not in plan_of(plan)
    assert shuffles(plan) == []


def test_session_window_runs_each_endpoints_state_in_two_window_operators(spark):
    # Transfers and the announced values so far, then the transfer count at the latest announce.
    rows = frames(spark)
    assert window_operators(session_window_timeline(rows, sessions_of(rows))) == {
        (*CONNECTION, "session_id"): 2,
        (*CONNECTION, "direction", "channel"): 1,  # the frame's begin (bind_sessions)
    }


def test_tcp_flow_runs_one_window_operator_per_order(spark):
    segments = spark.createDataFrame([], TCP_SEGMENTS_SCHEMA)
    assert window_operators(tcp_flow_timeline(segments)) == {
        # Both sides' windows, acks and data so far; the shift each side's window is proved to
        # have (the whole connection, without an order); the next D-SACK (descending).
        CONNECTION: 3,
        (*CONNECTION, "direction"): 1,  # the window before, the data sent before
    }


def test_lifecycle_10_runs_its_endpoints_windows_together(spark):
    rows = frames(spark)
    assert window_operators(lifecycle_10_timeline(rows, sessions_of(rows))) == {
        # Header, open and close seen before: once for the performatives, once for the empty
        # frames (the union at the end reads both).
        (*CONNECTION, "direction"): 2,
        (*CONNECTION, "direction", "channel"): 2,  # the frame's begin (bind_sessions); sessions begun
        (*CONNECTION, "direction", "channel", "_session", "handle"): 1,  # attached
        (*CONNECTION, "session_id"): 1,  # each endpoint's begin's handle-max
    }


def test_link_state_runs_the_links_windows_in_five_operators(spark):
    link = (*CONNECTION, "link_name", "sender_direction")
    rows = frames(spark)
    assert window_operators(link_state_timeline(rows, sessions_of(rows))) == {
        (*CONNECTION, "direction", "channel"): 1,  # the frame's begin (bind_sessions)
        (*CONNECTION, "direction", "channel", "handle"): 1,  # the attach that bound the handle
        # Over the handles used before their first attach (one row each): the halves of a link
        # attached before the capture, paired by their numbers or as their connection's only ones.
        (*CONNECTION, "channel", "handle"): 1,
        CONNECTION: 1,
        # What the frames say; then what reads it: the deliveries so far, the count at the sender's
        # last stated delivery-count, the count before; then the settlement rows' carried state.
        link: 5,
        (*CONNECTION, "session_id", "_id_direction"): 1,  # delivery-ids sent so far
        (*CONNECTION, "session_id", "_id_direction", "_id"): 1,  # the disposition naming one
        (*link, "_delivery_start"): 1,  # a settled transfer of the delivery
        (*link, "frame_index"): 1,  # a disposition's first row
    }


def test_the_channel_pass_runs_each_keys_windows_together(spark):
    channel = (*CONNECTION, "channel")
    assert window_operators(channel_pass(frames(spark))) == {
        CONNECTION: 1,  # the client's header, start-ok and closes seen before
        channel: 1,  # the channel number's open, close and flow states, and its incarnation
        # Confirm mode; then the publishes it numbers, the tags delivered before and the consumers'
        # prefetch and request numbers (none of these reads another).
        (*channel, "incarnation"): 2,
        (*channel, "incarnation", "_pair_kind", "_pair_n"): 1,  # a request's reply
        (*channel, "incarnation", "consumer_tag"): 1,  # the consumer from its consume-ok on
    }


def test_the_unacked_ledger_reads_the_channel_after_each_frame_in_one_operator(spark):
    # Drawn from the channels' pass (as derive's shared result), the ledger's own windows are left:
    # the settlement's, then the unacked count, the highest tag and the prefetch after each frame in
    # one operator, and what a frame settled beside it.
    channels = channel_pass(frames(spark)).localCheckpoint()
    found = window_operators(unacked_ledger(frames(spark), channels))
    incarnation = (*CONNECTION, "channel", "incarnation")
    assert found[incarnation] == 3  # the highest tag sent so far, the first multiple above; after each frame
    assert found[(*incarnation, "frame_index")] == 1


def test_a_shared_result_stays_partitioned_by_connection_under_adaptive_execution(spark):
    # A checkpoint keeps the partitioning its plan states, and adaptive execution's plan states
    # none: the tables drawn from the channels' pass then shuffle its rows again, messages_091 on
    # every key it windows or joins on.
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"
    rows = frames(spark)
    assert shuffles(messages_091(rows, channel_pass(rows).localCheckpoint())) != []
    kept = checkpointed(channel_pass(rows))
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"  # put back
    assert shuffles(messages_091(rows, kept)) == []
    assert shuffles(channel_confirms_timeline(rows, kept)) == []
