"""AMQP 0-9-1 consumers and gets: which deliveries of a channel need an acknowledgement.

Requests and their synchronous replies are paired in order on a channel incarnation (the n-th
basic.consume-ok answers the n-th basic.consume, spec 1.8.3.3; likewise basic.get and its
get-ok / get-empty). That gives a consumer its tag, queue, no-ack flag and prefetch, and says
which basic.get-ok answered a no-ack basic.get. A delivery to a no-ack consumer, or a no-ack get,
is settled on sending: it carries a delivery tag, but no ack may name it (spec 1.8.3.3 no-ack).
"""

from __future__ import annotations

from pyspark.sql import Column, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.partitioning import CHANNEL, channel_so_far

# Window specifications are built per call: PySpark needs an active session to build one.


def _request_and_reply() -> WindowSpec:
    """The n-th request of a kind and the n-th reply to that kind on a channel (other rows alone)."""
    return Window.partitionBy(*CHANNEL, "_pair_kind", "_pair_n")


def _consumer_so_far() -> WindowSpec:
    """One consumer's rows in frame order: what its consume-ok said applies from then on."""
    return (
        Window.partitionBy(*CHANNEL, "consumer_tag")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def method_sent(method: str, direction: str) -> Column:
    """True on the frames of ``method`` sent in ``direction`` (c2s: by the client)."""
    return (F.col("method") == method) & (F.col("direction") == direction)


def consumer_columns() -> list[tuple[str, Column]]:
    """The columns, in order, that give 0-9-1 frames (with ``incarnation``) ``_request`` on
    requests and their replies (the request's no_ack, queue, and the consumer prefetch then in
    force), ``_consumer`` on a consumer's rows from its consume-ok on, and ``_no_ack``: on
    deliveries, whether they need no ack (null where the capture missed the consume or get that
    tells). Added with ``columns.with_columns``: the first ones are running values over the channel
    incarnation, so ``channels.channel_windows`` adds them beside its own windows of that key."""
    is_qos = method_sent("basic.qos", "c2s")
    is_global = F.coalesce(F.col("global"), F.lit(False))
    consume, consume_ok = method_sent("basic.consume", "c2s"), method_sent("basic.consume-ok", "s2c")
    get, get_reply = (
        method_sent("basic.get", "c2s"),
        F.col("method").isin("basic.get-ok", "basic.get-empty") & (F.col("direction") == "s2c"),
    )

    def running_count(condition: Column) -> Column:
        return F.sum(condition.cast("long")).over(channel_so_far())

    delivery = F.col("method").isin("basic.deliver", "basic.get-ok") & (F.col("direction") == "s2c")
    no_ack = F.when(F.col("method") == "basic.get-ok", F.col("_request.no_ack")).otherwise(F.col("_consumer.no_ack"))
    return [
        (
            "_consumer_prefetch",
            F.last(F.when(is_qos & ~is_global, F.col("prefetch_count")), True).over(channel_so_far()),
        ),
        ("_pair_kind", F.when(consume | consume_ok, "consume").when(get | get_reply, "get")),
        (
            "_pair_n",
            F.when(consume, running_count(consume))
            .when(consume_ok, running_count(consume_ok))
            .when(get, running_count(get))
            .when(get_reply, running_count(get_reply))
            .otherwise(-1 - F.col("frame_index")),
        ),
        (
            "_request",
            F.first(
                F.when(
                    consume | get,
                    F.struct(
                        F.coalesce(F.col("no_ack"), F.lit(False)).alias("no_ack"),
                        "queue",
                        F.col("_consumer_prefetch").cast("int").alias("prefetch_count"),
                    ),
                ),
                ignorenulls=True,
            ).over(_request_and_reply()),
        ),
        # A consumer is what the consume-ok answering its basic.consume says, from then on.
        ("_consumer", F.last(F.when(consume_ok, F.col("_request")), True).over(_consumer_so_far())),
        ("_no_ack", F.when(delivery, no_ack)),
    ]
