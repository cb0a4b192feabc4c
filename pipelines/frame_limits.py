"""The frame size and channel limits in force on every frame that could break them (docs/FLOW_CONTROL.md section 6).

AMQP 0-9-1 (connection.tune / tune-ok, RabbitMQ's definition and the 0-9-1 spec's rules):

- until the client's connection.tune-ok, a frame is at most FRAME-MIN-SIZE (4096) octets, header and
  frame-end included; from then on at most the tune-ok's frame-max, in both directions (0: no limit);
- channel.open names a channel from 1 to the tune-ok's channel-max (0: no limit);
- the tune-ok's frame-max and channel-max must not exceed the server's connection.tune offer, and
  must not be 0 (no limit) when the offer sets one; a non-zero frame-max below FRAME-MIN-SIZE is
  refused too (RabbitMQ's ``rabbit_reader:validate_negotiated_integer_value``).

AMQP 1.0 (transport 2.7.1, open; 2.4.1): a peer announces in its open the largest frame it accepts
(max-frame-size, default 2^32-1) and the highest channel it accepts (channel-max, default 65535).
After that open has arrived, a larger frame or a begin on a higher channel breaks the limit.
Before it, the limits in force are unknown (null): a peer may pipeline its open with a begin,
attach and more (2.4.2, "pipelined open") as long as the frames are "known a priori to conform to
the capabilities and limitations of its partner", which only the partner knows. Every peer accepts
frames of 512 octets (MIN-MAX-FRAME-SIZE): ``peer_opened`` says whether the other peer's open had
arrived, so a rule can call a larger pipelined frame a risk, not a breach.

The limits follow frames in capture order. A connection picked up mid-stream (its protocol
header not captured) has no known limits: null, and no rule can flag its frames.

One row per frame that could break a limit: those larger than the protocol's minimum, every
channel.open and begin, and the tune-ok and open frames that set the limits. Windows are keyed by
connection: one shuffle (``pipelines.partitioning``).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from amqpscope.ingest.specs import amqp091, amqp10
from amqpscope.pipelines.columns import with_columns
from amqpscope.pipelines.partitioning import CONNECTION, by_connection
from amqpscope.schemas.flow import FRAME_LIMITS_SCHEMA

AMQP091 = "amqp-0-9-1"
AMQP10 = "amqp-1.0"
# 0-9-1: FRAME-MIN-SIZE, the frame size in force until tune-ok (RabbitMQ's definition).
FRAME_MIN_SIZE_091 = amqp091().constants["FRAME-MIN-SIZE"]
# 1.0: MIN-MAX-FRAME-SIZE, in force until the peer's open is received (transport 2.4.1: "Prior to
# any explicit negotiation, the maximum frame size is 512 (MIN-MAX-FRAME-SIZE) and the maximum
# channel number is 0.");
# then the open's max-frame-size and channel-max, or their defaults (2^32-1: no limit; 65535).
MIN_MAX_FRAME_SIZE_10 = int(amqp10().definitions["MIN-MAX-FRAME-SIZE"])
_OPEN_DEFAULTS = {
    f.name: int(f.default)
    for f in amqp10().described_by_symbol["amqp:open:list"].fields
    if f.name in ("max-frame-size", "channel-max") and f.default is not None
}
NO_FRAME_SIZE_LIMIT_10 = _OPEN_DEFAULTS["max-frame-size"]
DEFAULT_CHANNEL_MAX_10 = _OPEN_DEFAULTS["channel-max"]


def _before_this_frame() -> WindowSpec:
    """A connection's frames before this one, in order: the limits this frame is sent under."""
    return Window.partitionBy(*CONNECTION).orderBy("frame_index").rowsBetween(Window.unboundedPreceding, -1)


def _seen(condition: Column) -> Column:
    """Whether a frame before this one met ``condition``."""
    return F.coalesce(F.max(condition.cast("int")).over(_before_this_frame()) == 1, F.lit(False))


def _last(condition: Column, value: str) -> Column:
    """``value`` of the last frame before this one that met ``condition``."""
    return F.last(F.when(condition, F.col(value)), ignorenulls=True).over(_before_this_frame())


def _no_limit_if(value: Column, unlimited: int) -> Column:
    return F.when(value != unlimited, value)


def _from_peer(value_c2s: Column, value_s2c: Column) -> Column:
    """Of two values, one per direction, the one the other peer sent: what limits this frame."""
    return F.when(F.col("direction") == "c2s", value_s2c).otherwise(value_c2s)


def frame_limits_timeline(frames: DataFrame) -> DataFrame:
    """The frame_limits table (``schemas.flow.FRAME_LIMITS_SCHEMA``) from the frames table."""
    method, direction, size = F.col("method"), F.col("direction"), F.col("frame_size")
    is_091, is_10 = F.col("protocol") == AMQP091, F.col("protocol") == AMQP10
    header = (F.col("frame_type") == "protocol-header") & (direction == "c2s")
    tune = is_091 & (method == "connection.tune") & (direction == "s2c")
    tune_ok = is_091 & (method == "connection.tune-ok") & (direction == "c2s")
    opens = {d: is_10 & (method == "open") & (direction == d) for d in ("c2s", "s2c")}
    candidate = (
        tune_ok
        | opens["c2s"]
        | opens["s2c"]
        | (is_091 & ((method == "channel.open") | (size > FRAME_MIN_SIZE_091)))
        | (is_10 & ((method == "begin") | (size > MIN_MAX_FRAME_SIZE_10)))
    )
    # The client's protocol header starts the connection: without it, what was negotiated is unknown.
    started = _seen(header)
    tuned = _seen(tune_ok)
    peer_opened = _from_peer(_seen(opens["c2s"]), _seen(opens["s2c"]))
    peer_max_frame_size = _from_peer(_last(opens["c2s"], "max_frame_size"), _last(opens["s2c"], "max_frame_size"))
    peer_channel_max = _from_peer(_last(opens["c2s"], "channel_max"), _last(opens["s2c"], "channel_max"))
    frame_size_limit = (
        F.when(~started, F.lit(None))
        .when(is_091 & tuned, _no_limit_if(_last(tune_ok, "frame_max"), 0))
        .when(is_091, F.lit(FRAME_MIN_SIZE_091))
        .when(
            peer_opened,
            _no_limit_if(F.coalesce(peer_max_frame_size, F.lit(NO_FRAME_SIZE_LIMIT_10)), NO_FRAME_SIZE_LIMIT_10),
        )
    )
    channel_limit = (
        F.when(~started, F.lit(None))
        .when(is_091 & tuned, _no_limit_if(_last(tune_ok, "channel_max"), 0))
        .when(is_10 & peer_opened, F.coalesce(peer_channel_max, F.lit(DEFAULT_CHANNEL_MAX_10)))
    )
    # Only the frames that set limits or could break them enter the window.
    limits = with_columns(
        by_connection(frames.filter((is_091 | is_10) & (header | tune | candidate))),
        [
            ("frame_size_limit", frame_size_limit.cast("long")),
            ("channel_limit", channel_limit.cast("long")),
            ("offered_frame_max", F.when(tune_ok, _last(tune, "frame_max"))),
            ("offered_channel_max", F.when(tune_ok, _last(tune, "channel_max"))),
            ("tuned_frame_max", F.when(tune_ok, F.col("frame_max"))),
            ("tuned_channel_max", F.when(tune_ok, F.col("channel_max"))),
            ("peer_opened", F.when(is_10 & started, peer_opened)),
        ],
    ).filter(candidate)
    return limits.select(*[F.col(f.name).cast(f.dataType) for f in FRAME_LIMITS_SCHEMA.fields])
