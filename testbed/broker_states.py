"""The broker's own view of its connections, channels, queues and alarms, sampled every 0.25 s.

One ``rabbitmqctl eval`` runs a loop inside the node that calls the functions behind
``rabbitmqctl list_connections / list_channels / list_queues`` and ``rabbit_alarm:get_alarms/0``,
plus the node's running totals (``rabbit_global_counters:overview/0``: messages received, confirmed,
returned unroutable, delivered, redelivered, acknowledged...; and the ``connection_churn_metrics``
table: connections and channels opened and closed), and writes one JSON line per sample to a file, stamped with the node's wall clock in microseconds since
the epoch (``os:system_time(microsecond)``: the clock tcpdump stamps packets with on the same
machine). ``rabbitmqctl`` itself takes ~1.8 s a call and the management API refreshes every
~5 s, both far too slow to see credit flow, which comes and goes within a second.

A sample starts every 0.25 s, or as soon as the previous one is complete when that took longer:
under heavy credit flow the queue processes, with long mailboxes, answer info calls late and a
sample took up to ~1.4 s here (``took_us`` records it; ``ts_us`` is when it started).

The loop runs in the process the eval started on the node and checks after every sample that
the ``rabbitmqctl`` node that started it is still connected: when that process is stopped (by
PID, at the end of the sampling) the loop ends; it also ends by itself after ``max_seconds``.

States as RabbitMQ 3.10.8 reported them here: a connection is ``running``, ``flow`` (its reader
is out of credit: credit flow), ``blocking`` (a resource alarm is in force and the connection has
not published since) or ``blocked`` (it published during the alarm and is no longer read), plus
``opening`` / ``tuning`` / ``closing`` around its life; channels and classic queues are
``running`` or ``flow``. AMQP 1.0 connections of the ``rabbitmq_amqp1_0`` plugin are *not* listed
by ``connection_info_all`` in 3.10; what the broker shows of them is the plugin's internal 0-9-1
channel (one per session, carrying a consumer per receiving link, prefetch 65535), named after the
client's address and port, and the queues' consumers and consumer utilisation.
"""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from testbed.broker import RABBITMQ_BIN, PrivateBroker
from testbed.processes import ProcessRef, descendants, kill_all, wait_gone

SAMPLE_INTERVAL_MS = 250
DEFAULT_MAX_SECONDS = 120
POLL_SECONDS = 0.1
STOP_TIMEOUT = 10.0

CONNECTION_ITEMS = ("pid", "name", "peer_host", "peer_port", "protocol", "state", "client_properties")
CHANNEL_ITEMS = (
    "pid",
    "connection",
    "number",
    "name",
    "state",
    "consumer_count",
    "messages_unacknowledged",
    "messages_unconfirmed",
    "prefetch_count",
    "global_prefetch_count",
)
QUEUE_ITEMS = (
    "name",
    "state",
    "messages_ready",
    "messages_unacknowledged",
    "consumers",
    "consumer_utilisation",
    "durable",
)

# The sampling loop, evaluated inside the node. Values are reduced to JSON-able terms in Erlang
# (pids and addresses to text, queue resources to their name); rabbit_json encodes the sample.
_LOOP = """
Items = fun(L) -> [list_to_atom(I) || I <- L] end,
Text = fun(V) -> unicode:characters_to_binary(io_lib:format("~0p", [V])) end,
Value = fun
    (_, V) when is_binary(V); is_number(V); is_boolean(V) -> V;
    (_, V) when is_pid(V) -> list_to_binary(pid_to_list(V));
    (_, {resource, _VHost, _Kind, Name}) -> Name;
    (peer_host, V) when is_tuple(V) -> list_to_binary(inet:ntoa(V));
    (client_properties, V) when is_list(V) ->
        case lists:keyfind(<<"connection_name">>, 1, V) of
            {_, longstr, N} -> N;
            _ -> null
        end;
    (client_properties, _) -> null;
    (_, V) when is_atom(V) -> atom_to_binary(V);
    (_, V) -> Text(V)
end,
Row = fun(Info) -> maps:from_list([{atom_to_binary(K), Value(K, V)} || {K, V} <- Info]) end,
Alarm = fun
    ({{resource_limit, Resource, Node}, _}) ->
        #{<<"resource">> => atom_to_binary(Resource), <<"node">> => atom_to_binary(Node)};
    ({Other, _}) -> #{<<"resource">> => Text(Other), <<"node">> => null}
end,
Counter = fun(Name, V, Acc) -> maps:update_with(atom_to_binary(Name), fun(X) -> X + V end, V, Acc) end,
Counters = fun() ->
    Global = maps:fold(fun(_Labels, Map, Acc) -> maps:fold(Counter, Acc, Map) end, #{},
                       rabbit_global_counters:overview()),
    case ets:lookup(connection_churn_metrics, node()) of
        [{_, ConnCreated, ConnClosed, ChanCreated, ChanClosed, _, _, _}] ->
            Global#{<<"connection_created">> => ConnCreated, <<"connection_closed">> => ConnClosed,
                    <<"channel_created">> => ChanCreated, <<"channel_closed">> => ChanClosed};
        _ -> Global
    end
end,
Sample = fun() ->
    Ts = os:system_time(microsecond),
    Conns = [Row(I) || I <- rabbit_networking:connection_info_all(Items(ConnectionItems))],
    Chans = [Row(I) || I <- rabbit_channel:info_all(Items(ChannelItems))],
    Queues = [Row(I) || I <- rabbit_amqqueue:info_all(<<"/">>, Items(QueueItems))],
    Consumers = [Row([{K, V} || {K, V} <- I, K =/= arguments])
                 || I <- rabbit_amqqueue:consumers_all(<<"/">>)],
    Alarms = [Alarm(A) || A <- rabbit_alarm:get_alarms()],
    #{<<"ts_us">> => Ts, <<"took_us">> => os:system_time(microsecond) - Ts,
      <<"alarms">> => Alarms, <<"connections">> => Conns, <<"channels">> => Chans,
      <<"queues">> => Queues, <<"consumers">> => Consumers, <<"counters">> => Counters()}
end,
{ok, Out} = file:open(OutPath, [append, raw, binary]),
Cli = node(group_leader()),
Loop = fun Loop(0) -> done;
           Loop(N) ->
    Started = erlang:monotonic_time(millisecond),
    ok = file:write(Out, [rabbit_json:encode(Sample()), $\n]),
    Spent = erlang:monotonic_time(millisecond) - Started,
    timer:sleep(max(0, Interval - Spent)),
    case lists:member(Cli, nodes(hidden)) of
        true -> Loop(N - 1);
        false -> cli_gone
    end
end,
Result = Loop(Samples), file:close(Out), Result.
"""


def sampling_expression(
    out_path: Path, interval_ms: int = SAMPLE_INTERVAL_MS, max_seconds: float = DEFAULT_MAX_SECONDS
) -> str:
    """The Erlang expression ``rabbitmqctl eval`` runs: the loop with its parameters bound.

    Samples go to ``out_path`` (one JSON line each), not to the CLI's standard output: printing
    through the CLI's group leader took ~0.5 s a line on a loaded machine and slowed the loop.
    """
    samples = max(1, int(max_seconds * 1000 / interval_ms))

    def strings(items: Iterable[str]) -> str:
        return "[" + ", ".join(f'"{item}"' for item in items) + "]"

    bindings = (
        f'OutPath = "{out_path}", Interval = {interval_ms}, Samples = {samples},\n'
        f"ConnectionItems = {strings(CONNECTION_ITEMS)},\n"
        f"ChannelItems = {strings(CHANNEL_ITEMS)},\n"
        f"QueueItems = {strings(QUEUE_ITEMS)},\n"
    )
    return bindings + _LOOP.strip()


# -- parsed samples ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ConnectionState:
    """One connection as the broker saw it in one sample."""

    peer_host: str
    peer_port: int
    name: str
    protocol: str
    state: str
    connection_name: str | None
    pid: str


@dataclass(frozen=True)
class ChannelState:
    """One channel (0-9-1, or the 1.0 plugin's internal one) in one sample."""

    peer_port: int | None  # the client port of its connection (for 1.0: from the channel's name)
    number: int
    name: str
    state: str
    consumer_count: int
    messages_unacknowledged: int
    messages_unconfirmed: int
    prefetch_count: int
    global_prefetch_count: int
    connection_pid: str
    pid: str


@dataclass(frozen=True)
class QueueState:
    """One queue of the default virtual host in one sample."""

    name: str
    state: str
    messages_ready: int
    messages_unacknowledged: int
    consumers: int
    consumer_utilisation: float | None
    durable: bool


@dataclass(frozen=True)
class ConsumerState:
    """One consumer of a queue (``rabbitmqctl list_consumers``) in one sample."""

    queue: str
    consumer_tag: str
    channel_pid: str
    ack_required: bool
    prefetch_count: int
    active: bool


@dataclass(frozen=True)
class BrokerSample:
    """Everything one turn of the loop saw, at ``ts_us`` (µs since the epoch, node clock)."""

    ts_us: int
    took_us: int
    alarms: tuple[str, ...]  # resources in alarm: "memory", "disk"
    connections: tuple[ConnectionState, ...] = field(default_factory=tuple)
    channels: tuple[ChannelState, ...] = field(default_factory=tuple)
    queues: tuple[QueueState, ...] = field(default_factory=tuple)
    consumers: tuple[ConsumerState, ...] = field(default_factory=tuple)
    # The node's running totals (``rabbit_global_counters:overview/0`` summed over protocol and
    # queue type, e.g. ``messages_redelivered_total``, and ``connection_churn_metrics``:
    # ``connection_created`` / ``_closed``, ``channel_created`` / ``_closed``). Counted since the
    # node started: a capture's figure is the difference between its last and first sample.
    counters: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The sample as written into a truth file."""
        return asdict(self)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _protocol(text: str) -> str:
    """The broker's protocol term as text: ``{0,9,1}`` -> ``AMQP 0-9-1``, ``{'AMQP',{1,0}}`` -> ``AMQP 1-0``."""
    digits = [part.strip() for part in text.replace("{", ",").replace("}", ",").split(",") if part.strip().isdigit()]
    return f"AMQP {'-'.join(digits)}" if digits else text


def _peer_port_of_name(name: str) -> int | None:
    """``127.0.0.1:60520 -> 127.0.0.1:5672 (1)`` -> 60520: the AMQP 1.0 plugin's internal channels
    are named after the client's network connection, which ``connection_info_all`` does not list."""
    client = name.split(" -> ", 1)[0]
    port = client.rsplit(":", 1)[-1]
    return int(port) if " -> " in name and port.isdigit() else None


def parse_sample(line: str) -> BrokerSample:
    """One line written by the loop as a ``BrokerSample``."""
    raw = json.loads(line)
    connections = tuple(
        ConnectionState(
            peer_host=str(row.get("peer_host")),
            peer_port=_int(row.get("peer_port")),
            name=str(row.get("name")),
            protocol=_protocol(str(row.get("protocol"))),
            state=str(row.get("state")),
            connection_name=row.get("client_properties"),
            pid=str(row.get("pid")),
        )
        for row in raw["connections"]
    )
    port_of = {connection.pid: connection.peer_port for connection in connections}
    channels = tuple(
        ChannelState(
            peer_port=port_of.get(str(row.get("connection"))) or _peer_port_of_name(str(row.get("name"))),
            number=_int(row.get("number")),
            name=str(row.get("name")),
            state=str(row.get("state")),
            consumer_count=_int(row.get("consumer_count")),
            messages_unacknowledged=_int(row.get("messages_unacknowledged")),
            messages_unconfirmed=_int(row.get("messages_unconfirmed")),
            prefetch_count=_int(row.get("prefetch_count")),
            global_prefetch_count=_int(row.get("global_prefetch_count")),
            connection_pid=str(row.get("connection")),
            pid=str(row.get("pid")),
        )
        for row in raw["channels"]
    )
    queues = tuple(
        QueueState(
            name=str(row.get("name")),
            state=str(row.get("state")),
            messages_ready=_int(row.get("messages_ready")),
            messages_unacknowledged=_int(row.get("messages_unacknowledged")),
            consumers=_int(row.get("consumers")),
            consumer_utilisation=(
                float(row["consumer_utilisation"])
                if isinstance(row.get("consumer_utilisation"), (int, float))
                else None
            ),
            durable=row.get("durable") is True,
        )
        for row in raw["queues"]
    )
    consumers = tuple(
        ConsumerState(
            queue=str(row.get("queue_name")),
            consumer_tag=str(row.get("consumer_tag")),
            channel_pid=str(row.get("channel_pid")),
            ack_required=row.get("ack_required") is True,
            prefetch_count=_int(row.get("prefetch_count")),
            active=row.get("active") is not False,
        )
        for row in raw.get("consumers", [])
    )
    return BrokerSample(
        ts_us=int(raw["ts_us"]),
        took_us=int(raw["took_us"]),
        alarms=tuple(sorted(alarm["resource"] for alarm in raw["alarms"])),
        connections=tuple(sorted(connections, key=lambda c: c.peer_port)),
        channels=tuple(sorted(channels, key=lambda c: (c.peer_port or 0, c.number, c.name))),
        queues=tuple(sorted(queues, key=lambda q: q.name)),
        consumers=tuple(sorted(consumers, key=lambda c: (c.queue, c.consumer_tag))),
        counters={str(k): _int(v) for k, v in sorted(raw.get("counters", {}).items())},
    )


# -- the sampler ------------------------------------------------------------------------------


class SamplerError(RuntimeError):
    """The sampling eval failed to start or printed something that is not a sample."""


class BrokerStateSampler:
    """Sample ``broker`` every 0.25 s while the context is open; ``samples`` afterwards.

    Starts one ``rabbitmqctl eval`` in the background and stops it (and everything it spawned)
    by PID on exit. The loop inside the node notices the CLI is gone and ends.
    """

    def __init__(
        self,
        broker: PrivateBroker,
        interval_ms: int = SAMPLE_INTERVAL_MS,
        max_seconds: float = DEFAULT_MAX_SECONDS,
    ) -> None:
        if broker.base_dir is None:
            raise SamplerError("the broker is not running")
        self.broker = broker
        self.interval_ms = interval_ms
        self.max_seconds = max_seconds
        self.samples: list[BrokerSample] = []
        self.errors: list[str] = []
        self._process: subprocess.Popen[str] | None = None
        self._refs: set[ProcessRef] = set()
        self._out: Path | None = None

    def command(self, out_path: Path) -> list[str]:
        expression = sampling_expression(out_path, self.interval_ms, self.max_seconds)
        return [str(RABBITMQ_BIN / "rabbitmqctl"), "-n", self.broker.nodename, "eval", expression]

    def __enter__(self) -> BrokerStateSampler:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, first_sample_timeout: float = 30.0) -> None:
        """Start the eval; return once the first sample is written (the CLI takes ~2 s to start)."""
        assert self.broker.base_dir is not None
        self._out = Path(tempfile.mkstemp(prefix="broker-states-", suffix=".jsonl", dir=self.broker.base_dir)[1])
        self._process = subprocess.Popen(
            self.command(self._out),
            env=self.broker._environment(),
            cwd=self.broker.base_dir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._track()
        deadline = time.monotonic() + first_sample_timeout
        while not self._out.read_bytes().count(b"\n"):
            if self._process.poll() is not None or time.monotonic() > deadline:
                output = self._process.communicate()[0] if self._process.poll() is not None else ""
                self.stop()
                raise SamplerError(f"no broker sample within {first_sample_timeout:.0f} s: {output.strip()[-500:]}")
            time.sleep(POLL_SECONDS)
        self._track()

    def stop(self) -> None:
        """Stop the eval by PID (SIGTERM, then SIGKILL for anything left of its process tree)."""
        if self._process is None:
            return
        self._track()
        ended_early = self._process.poll() is not None
        if not ended_early:
            self._process.send_signal(signal.SIGTERM)
        try:
            output = self._process.communicate(timeout=STOP_TIMEOUT)[0]
        except subprocess.TimeoutExpired:
            self._process.kill()
            output = self._process.communicate(timeout=STOP_TIMEOUT)[0]
        leftovers = kill_all(wait_gone(self._refs, STOP_TIMEOUT))
        self._process = None
        if ended_early and output.strip() != "done":
            # The loop failed, or the CLI could not reach the node (what it printed says why).
            self.errors.append(output.strip()[-500:])
        if self._out is not None:
            self._read(self._out)
            self._out.unlink(missing_ok=True)
            self._out = None
        if leftovers:
            raise SamplerError(f"sampler processes survived SIGKILL: {sorted(leftovers)}")

    @property
    def started_processes(self) -> frozenset[ProcessRef]:
        """Every process of the eval seen (the CLI script and its Erlang VM)."""
        return frozenset(self._refs)

    def _track(self) -> None:
        if self._process is None:
            return
        ref = ProcessRef.of(self._process.pid)
        if ref is not None:
            self._refs.add(ref)
        self._refs |= descendants(self._process.pid)

    def _read(self, path: Path) -> None:
        # The loop may be cut in the middle of a line when the CLI stops; a partial last line is dropped.
        for line in path.read_text().splitlines():
            try:
                self.samples.append(parse_sample(line))
            except (ValueError, KeyError) as error:
                self.errors.append(f"unparsable sample: {error}: {line[:200]}")
