"""AMQP 1.0 link credit per link, after every attach, flow and transfer (transport spec 2.6.7).

Endpoints name a link by their own channel and handle, so frames are first mapped to the link
name their sender attached with that (channel, handle); the two halves of a link meet on the name.
The sender's state then follows from running aggregates over the link's frames:

    delivery-count(snd) = last delivery-count the sender announced (else initial-delivery-count)
                          + new deliveries since
    link-credit(snd)    = delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)

using the receiver's last flow; serial arithmetic throughout.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.pipelines.serial import serial, serial_diff
from amqpscope.schemas.flow import LINK_CREDIT_SCHEMA

_LINK_METHODS = ("attach", "flow", "transfer")

_LINK = ("capture_id", "connection_id", "link_name", "sender_direction")

# Window specifications are built per call: PySpark needs an active session to build one.


def _endpoint_handle() -> WindowSpec:
    """One endpoint's handle on one channel, in frame order: resolves a frame to the latest attach
    that bound the handle (handles are reused after detach)."""
    return (
        Window.partitionBy("capture_id", "connection_id", "direction", "channel", "handle")
        .orderBy("frame_index")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )


def _link_so_far() -> WindowSpec:
    """One link (both endpoints' frames) in frame order: the running sender/receiver state."""
    return Window.partitionBy(*_LINK).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, Window.currentRow)


def _link_before() -> WindowSpec:
    """The same, excluding the current frame: the state a transfer finds when it arrives."""
    return Window.partitionBy(*_LINK).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, -1)


def _link_all() -> WindowSpec:
    """The whole link: attributes of the link rather than of a moment (addresses, initial count)."""
    return Window.partitionBy(*_LINK)


def _last(col: Column, window: WindowSpec | None = None) -> Column:
    return F.last(col, ignorenulls=True).over(window if window is not None else _link_so_far())


def link_credit_timeline(frames: DataFrame) -> DataFrame:
    """The link_credit table (``schemas.flow.LINK_CREDIT_SCHEMA``) from the frames table."""
    events = frames.filter(
        (F.col("protocol") == "amqp-1.0") & F.col("method").isin(*_LINK_METHODS) & F.col("handle").isNotNull()
    )
    is_attach = F.col("method") == "attach"
    bound = events.withColumn("link_name", _last(F.when(is_attach, F.col("name")), _endpoint_handle())).withColumn(
        "endpoint_role", _last(F.when(is_attach, F.col("role")), _endpoint_handle())
    )
    flipped = F.when(F.col("direction") == "c2s", "s2c").otherwise("c2s")
    linked = bound.filter(F.col("link_name").isNotNull()).withColumn(
        "sender_direction", F.when(F.col("endpoint_role") == "sender", F.col("direction")).otherwise(flipped)
    )

    from_sender = F.col("endpoint_role") == "sender"
    sender_attach = is_attach & from_sender
    is_transfer = (F.col("method") == "transfer") & from_sender
    receiver_flow = (F.col("method") == "flow") & ~from_sender
    sender_flow = (F.col("method") == "flow") & from_sender & F.col("delivery_count").isNotNull()

    state = (
        linked.withColumn("initial_delivery_count", F.first(F.when(sender_attach, F.col("initial_delivery_count")), True).over(_link_all()))
        .withColumn("target_address", F.first(F.when(is_attach, F.col("target_address")), True).over(_link_all()))
        .withColumn("source_address", F.first(F.when(is_attach, F.col("source_address")), True).over(_link_all()))
        # A delivery starts with a transfer whose predecessor on the link did not say more=true.
        .withColumn("_prev_more", _last(F.when(is_transfer, F.coalesce(F.col("more"), F.lit(False))), _link_before()))
        .withColumn("is_new_delivery", is_transfer & ~F.coalesce(F.col("_prev_more"), F.lit(False)))
        .withColumn("_deliveries", F.sum(F.col("is_new_delivery").cast("long")).over(_link_so_far()))
        # The sender's own flows (e.g. after a drain) restate its delivery-count.
        .withColumn("_base_count", _last(F.when(sender_flow, F.col("delivery_count"))))
        .withColumn("_base_deliveries", _last(F.when(sender_flow, F.col("_deliveries"))))
        .withColumn(
            "delivery_count_snd",
            serial(
                F.coalesce(F.col("_base_count"), F.col("initial_delivery_count"))
                + F.col("_deliveries")
                - F.coalesce(F.col("_base_deliveries"), F.lit(0))
            ),
        )
        # If the receiver's flow carries no delivery-count it had not seen the sender's attach:
        # the initial-delivery-count applies (2.7.4).
        .withColumn("_dc_rcv", _last(F.when(receiver_flow, F.coalesce(F.col("delivery_count"), F.col("initial_delivery_count")))))
        .withColumn("link_credit_rcv", _last(F.when(receiver_flow, F.col("link_credit"))))
        .withColumn("drain", _last(F.when(receiver_flow, F.coalesce(F.col("drain"), F.lit(False)))))
        .withColumn("available", _last(F.when(F.col("method") == "flow", F.col("available"))))
        .withColumn(
            "link_credit_snd",
            # Until the receiver's first flow the sender has no credit (2.6.7: initially 0).
            serial_diff(
                F.coalesce(F.col("_dc_rcv"), F.col("initial_delivery_count")) + F.coalesce(F.col("link_credit_rcv"), F.lit(0)),
                F.col("delivery_count_snd"),
            ),
        )
        .withColumn(
            "link_credit_snd_before",
            F.when(F.col("is_new_delivery"), F.col("link_credit_snd") + 1),
        )
        .withColumn("sender_side", F.when(F.col("sender_direction") == "c2s", "client").otherwise("server"))
    )
    return state.select(*[F.col(f.name).cast(f.dataType) for f in LINK_CREDIT_SCHEMA.fields])
