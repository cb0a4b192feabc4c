"""The text of docs/DIAGNOSIS.md: the bottleneck rule catalogue (bottlenecks.yml), the thresholds'
defaults, and the rows of the scenario captures' comparison it is given (``ScenarioRow``).

``render`` formats them; the rows come from the testbed's scenarios and their broker truth,
which are not part of the product: ``python -m testbed.diagnosis_doc [OUT]`` builds them and
writes the page (default: docs/DIAGNOSIS.md). tests/test_diagnosis_doc.py checks that the
committed file is what it renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from amqpscope.conf.diagnosis import DiagnosisThresholds
from amqpscope.expectations.bottleneck_rules import (
    PARENT,
    UNITS,
    BottleneckRule,
    Template,
    Value,
)
from amqpscope.schemas.diagnosis import COMPONENTS, EFFECTS


@dataclass(frozen=True)
class ScenarioRow:
    """One scenario capture of the page's comparison table: the capture (its file name's stem),
    what it was built to be, the bottleneck its broker's truth names, and what the diagnosis says."""

    capture: str
    built_to_be: str
    truth: str
    diagnosis: str


COMPONENT_MEANINGS: Mapping[str, str] = {
    "none": "nothing was held back beyond the thresholds",
    "connection": "RabbitMQ's reader process is the slow stage (reserved: the wire cannot tell a reader short of "
    "CPU from one held by the stages after it, so no rule names it)",
    "channel": "the channel process (routing) is the slow stage: the connection is in credit flow, its channels are not",
    "queue": "a queue process is the slow stage: connections and channels in flow, the queue not keeping up",
    "message_store": "persistent messages large enough to be written to the message store (disk)",
    "memory_alarm": "RabbitMQ's memory alarm blocks every publisher",
    "disk_alarm": "RabbitMQ's disk alarm blocks every publisher",
    "alarm": "a resource alarm whose kind the wire does not say",
    "consumer": "a slow consumer: its prefetch full (0-9-1) or its link credit at 0 (1.0) while messages wait",
    "client": "the client sets the pace: it does not read its socket, or its own round trips bound it (one "
    "confirm at a time, one delivery at a time)",
    "network": "segments lost and sent again",
}

EFFECT_MEANINGS: Mapping[str, str] = {
    "publisher_throttled": "the broker reads a publisher's socket slower than it sends",
    "blocked": "publishing stopped by an alarm (connection.blocked, or a 1.0 session's incoming-window 0)",
    "consumer_starved": "reserved for a consumer waiting on an upstream stage (no rule yet)",
    "head_of_line": "a consumer slowed because it shares a throttled 0-9-1 connection with a publisher",
    "credit_starved": "a 1.0 link's sender out of credit while it has messages",
    "deliveries_wait_for_acks": "the broker releases deliveries only as the consumer acks",
    "deliveries_never_acked": "a manual-ack consumer holds its deliveries and acks none of them",
    "redelivery_loop": "a message requeued and redelivered again and again while others wait behind it",
    "settlement_delayed": "the broker settles a 1.0 sender's transfers seconds after they were written",
    "backlog_unconsumed": "a queue fills with no consumer in the capture",
    "client_not_reading": "the broker cannot send: the client's window is full or closed",
    "retransmission": "segments lost and sent again: the time lost recovering",
    "consumer_round_trip_bound": "a consumer takes one message per round trip (prefetch or link credit 1)",
    "publisher_waits_for_confirms": "a publisher waits for each confirm before its next publish",
    "publishes_refused": "the broker basic.nack'ed publishes: messages it did not take",
    "messages_returned": "basic.return: mandatory messages no queue took, sent back to the publisher",
    "closed_with_error": "a channel or connection closed with an error reply code (300 or more)",
    "connection_churn": "connections opened and closed for a few messages each",
    "channel_churn": "channels opened and closed for a few messages each",
    "request_reply_latency": "a caller waits for each reply before its next request",
    "bandwidth_limited": "throughput held at the link's ceiling, with segments lost",
}

_INTRO = """\
# Bottleneck diagnosis: what is slow, where, since when and why

Generated from `expectations/bottlenecks.yml` by `python -m testbed.diagnosis_doc`; do not edit.

`analyze` (and `amqpscope diagnose`) turns the flow-state tables into two gold tables:

- **`bottlenecks`**: one row per finding: the entity held back (`entity_kind`: connection,
  channel, consumer, session, link; `entity`: what an operator recognises: consumer tag, link
  name, the client's `connection_name` with its address and port), its `queue`, `channel`,
  `consumer_tag` and `link_name` where they apply, the **component** that is the bottleneck, its
  **effect** on traffic, start and end (times and packet numbers), the time held back and its
  share of the time the entity was active, a confidence, the measured figures it rests on
  (`evidence`), up to 20 packet numbers with a Wireshark display filter that matches exactly those
  packets, and one sentence.
- **`diagnosis`**: one row per capture: the top bottleneck's component (`bottleneck`, or `none`),
  the headline an operator reads first, the ranked findings and how many are problems.

**Bottlenecks and problems.** A rule's findings are of one `kind`: a **bottleneck** names where
traffic is held back, and the top-ranked one is the capture's verdict; a **problem** is something
wrong or an anti-pattern that is not the verdict (publishes the broker refused, messages it
returned, closes with an error, connection or channel churn that does not bound the client).
Each has a `severity`: `warning` (it costs throughput or messages) or `info`. Findings rank
bottlenecks first, then warnings before infos. The headline states the verdict, then names the
problems in rank order with their severity and component ("Also found 2 problems: (warning,
channel) ..."). A capture with no bottleneck says what was measured ("No bottleneck: 3 AMQP
connections, 1,200 messages published, 1,150 delivered to 2 consumers; none of the diagnosis's
rules found traffic held back long enough to matter.") and claims nothing more: the problems
follow it.

`amqpscope diagnose` exits 0 when no capture has a bottleneck, 3 when one has, 4 when no capture
could be judged (no AMQP decoded, or all of it encrypted and not decoded), 1 on an error and 2 on a
usage error or an unreadable capture; `--json` gives every finding, its evidence typed (numbers as
numbers) by the units below.

**No AMQP, no verdict.** A capture in which no AMQP connection was decoded has nothing to judge:
its `bottleneck` is `no_amqp` (never `none`), and its headline says what it holds instead, so that
an operator is not reassured by a capture of the wrong port: "No AMQP traffic found: 200 packets,
3 TCP connections on other ports; try --ports." (connections on the AMQP ports that are not AMQP
are counted too; `captures.tcp_connections` and `connections` hold the figures). A capture without
a single packet is answered before Spark starts and writes nothing to the lake: "No AMQP traffic
found: the capture has no packets."
"""

_REASONING = """\
## The reasoning, from the wire alone

Inside RabbitMQ, a message goes reader → channel (0-9-1) or session (1.0) → queue → message store,
and each process grants its upstream credit (`credit_flow_default_credit`, {400, 200} in current
releases, {200, 50} in 3.5.5; the message store's `msg_store_credit_disc_bound`). A process out of
credit is in state `flow` and blocks its upstream, so **the bottleneck is the first stage downstream
of the last one in flow** (RabbitMQ, "Finding bottlenecks with RabbitMQ 3.3" and "New Credit Flow
Settings on RabbitMQ 3.5.5"; docs/FLOW_CONTROL.md section 5). None of those states is on the wire:
each rule infers one from its effects and shows the figures it used.

**Time held back** is the union of the intervals that held the entity back (a full or nearly full
window, a zero window, a blocked connection, a prefetch at its limit), counted once where they
overlap and within the time the entity was active, so it is never more than that span and its
share never more than 1. A zero window's time is the same union of `tcp.analysis.zero_window`
intervals Wireshark shows (checked with tshark on the scenario captures).

**Wireshark filters** name the connection by its client port and the packets by a field filter
where one names exactly the packets listed (`amqp.method.class == 10 && amqp.method.method in
{60,61}`: connection.blocked / unblocked), else by number (`frame.number in {562,564,566}`:
Wireshark 4 sets, members separated by commas). tests/test_wireshark_filters.py runs every filter
of the scenario captures through tshark 4 and checks it matches exactly the packets listed.

**Names** come from the capture: a queue from the `queue.declare` / `queue.bind` / `basic.consume`
frames or a 1.0 link's address (`pipelines/addresses.py`), a queue's type from its `queue.declare`
arguments (`x-queue-type`, `x-queue-mode`, `x-max-length`); `connection_name` only from what the
client called the connection (0-9-1 client-properties `connection_name`; 1.0 the open's
`connection_name` property, else its container-id); the client library it says it is goes to the
evidence as `client_product`.

Findings are ranked per capture by the rule's priority (the finding an operator acts on first:
an alarm, then head-of-line blocking, which a separate connection fixes, then the throttling
behind it, then consumers and clients, then the network), then by time held back weighted by
confidence; the top one is the headline.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _value(value: Value) -> str:
    return value.column if value.unit == "text" else f"{value.unit}({value.column})"


def _template(template: Template) -> str:
    return "".join(
        p if isinstance(p, str) and p != "because" else "{because}" if p == "because" else "{" + _value(p) + "}"
        for p in template.parts
    )


def _components(rule: BottleneckRule) -> str:
    names = [c.component if c.component != PARENT else "as the finding it follows" for c in rule.cases]
    return " / ".join(f"`{n}`" if n in COMPONENTS else n for n in dict.fromkeys(names))


def _rules(rules: Sequence[BottleneckRule]) -> list[str]:
    lines = [
        "## Rules",
        "",
        f"{len(rules)} rules, run in this order by `pipelines/diagnosis/findings.py` on the measures of "
        "`pipelines/diagnosis/measures.py`.",
        "",
        "| rule | component → effect | priority | what the wire shows | test |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| `{r.id}` | {_components(r)} → `{r.effect}` | {r.priority} | {_cell(r.description)} | `{_cell(r.test)}` |"
        for r in rules
    ]
    for rule in rules:
        lines += [
            "",
            f"### `{rule.id}`",
            "",
            _cell(rule.description),
            "",
            f"- measure: `{rule.measure}`"
            + (f" where `{_cell(rule.where)}`" if rule.where else "")
            + (f", after `{rule.after}`" if rule.after else ""),
            f"- entity: {rule.entity_kind}; effect `{rule.effect}`; priority {rule.priority}",
            f"- test: `{_cell(rule.test)}`",
        ]
        if len(rule.cases) > 1:
            lines.append("- component, the first case that holds:")
            for case in rule.cases:
                when = f"when `{_cell(case.when)}`" if case.when else "otherwise"
                confidence = f", confidence `{case.confidence}`" if case.confidence else ""
                because = f': "{_cell(_template(case.because))}"' if case.because else ""
                lines.append(f"  - `{case.component}` {when}{confidence}{because}")
        else:
            lines.append(f"- component: {_components(rule)}")
        if rule.confidence:
            lines.append(f"- confidence: `{_cell(rule.confidence)}`")
        lines.append("- evidence: " + ", ".join(f"`{k}` ({v.unit})" for k, v in rule.evidence))
        lines.append(f'- sentence: "{_cell(_template(rule.sentence))}"')
        lines.append("- documented at: " + ", ".join(f"<{d}>" for d in rule.docs))
    return lines


def _thresholds(rules: Sequence[BottleneckRule]) -> list[str]:
    defaults = DiagnosisThresholds()
    lines = [
        "## Thresholds",
        "",
        "In `conf/diagnosis.py` (why each value), settable under `diagnosis:` in the analyze YAML.",
        "",
        "| threshold | default | read by |",
        "|---|---|---|",
    ]
    for f in fields(DiagnosisThresholds):
        users = [f"`{r.id}`" for r in rules if f.name in r.thresholds()]
        if f.name == "together_bucket_ms":
            users.append("the `publisher_pressure` measure")
        if f.name == "refill_ms":
            users.append("the `consumer_window` and `head_of_line` measures")
        lines.append(f"| `{f.name}` | {getattr(defaults, f.name)} | {', '.join(users) or '-'} |")
    lines += ["", "Evidence units, as `--json` types them:", "", "| unit | the column holds | JSON |", "|---|---|---|"]
    lines += [f"| `{unit}` | {holds} | {kind} |" for unit, (holds, kind) in UNITS.items()]
    return lines


_TLS = """\
## TLS without the key log

A TLS connection whose records were not decrypted (docs/TLS.md) has no frames, so only its TCP is
judged: `diagnosis.encrypted.client_not_reading` and `diagnosis.encrypted.broker_not_reading` (the
`encrypted_window_pressure` measure: the same window-limited gaps and zero windows as the decoded
rules, from the segments alone), besides `diagnosis.network.retransmission` for every connection.
The headline names those connections ("2 connections are encrypted (TLS 1.3) and were not decoded:
give --tls-keylog"); with nothing else to judge the bottleneck is `encrypted` and `diagnose` exits
4. The TLS slow reader (`samples/tls/slow-reader-tls13.pcap`) is diagnosed `client` with and
without its key log (`tests/test_tls_analyze.py`).
"""

_MID_STREAM = """\
## Captures that begin mid-connection

On a production broker connections live for days, and tcpdump starts long after they opened: the
SYN and SYN-ACK, which alone agree the window scale (RFC 7323 2), are not in the capture. Without
them a segment's raw 16-bit window has an unknown shift; `tcp_flow` infers the least shift the
bytes in flight prove (`window_scale_source` `inferred`, else `unknown`; `handshake` when the SYNs
were captured). That is a lower bound, which can show a sender was not held back by its peer's
window but never that it was: on such connections the window-limited gaps of
`diagnosis.publisher.credit_flow`, `diagnosis.client.not_reading` and the encrypted rules are not
judged (zero windows are: a zero window is zero at any scale). The diagnosis lists it in
`not_judged`, and the headline ends "Not judged: whether a TCP window held a sender back on 2
connections begun before the capture, whose window scale it does not show."

What began before the first packet is not counted as beginning at it: a connection.unblocked with
no connection.blocked before it, on a connection opened before the capture, is a block in force
when the capture began (`connection_blocked.began_before_capture`; its reason is not in the
capture, so its component is `alarm`); an acknowledgement of a delivery tag never seen delivered
settles nothing.

An AMQP 1.0 link attached before the capture has no attach in it: its name, its roles and its
initial delivery-count are not there, and its endpoints' handles bind to nothing. The endpoint
that sends transfers on such a handle is the link's sender; the one that only sends flows on a
handle in the other direction is its receiver; the two halves are one link when they are the only
ones with their channel and handle numbers (RabbitMQ answers an attach with the client's handle)
or the only ones of their connection (`link_state.attach_seen` false, the link named after its
sender's channel and handle). Its counts and credit are unknown, not 0, until a flow states them
(transport spec 2.6.7: a flow carries the delivery-count and the credit), and are judged from
there on. A half left without its other half is listed in `not_judged`: "link credit of 1 AMQP 1.0
link attached before the capture".

A cut's verdict is its full capture's wherever the problem lies inside the cut
(`tests/test_cut_verdicts.py`: every bundled capture cut after a quarter, a third, a half and two
thirds of its packets).
"""

_CHECKED = """\
## How it is checked

- **Hand-timed traffic** (`tests/test_bottlenecks.py`): each rule on frames and TCP segments whose
  timing is worked out by hand, run through the real flow-state pipelines, with its near miss.
- **Real captures with the broker's own states** (`samples/bottlenecks/`, made by
  `testbed/bottleneck_scenarios.py`: a private RabbitMQ 3.10.8, real pika / qpid-proton clients
  and raw 0-9-1 sockets, tcpdump on loopback): while each capture runs, one `rabbitmqctl eval`
  loop inside the node samples every connection, channel, queue and consumer state and the
  alarms every 0.25 s on the capture's clock; `testbed/truth.py` reads the expected bottleneck
  from those states alone (and, where the broker cannot see the cause, from what the client
  did: `broker_blind`). `tests/test_bottleneck_scenarios.py` compares the diagnosis of every
  scenario with it; every near miss must give no finding. The table below is that comparison.
- **tshark** (`tests/test_wireshark_filters.py`): every filter of the scenario findings matches
  exactly the packets listed; zero-window time and retransmissions agree with tshark's own
  analysis.
"""

_BLIND = """\
## What the wire cannot tell apart

- A credit-flow stall too short to fill the broker's receive buffer. In the channel-routing
  capture RabbitMQ showed both publishers' connections in `flow` in 43 % of its samples, yet the
  kernel's receive buffers (grown to 2.5 MB) absorbed every stall: no window filled or closed and
  the publishers never waited. Without TCP backpressure the wire says nothing; the diagnosis says
  none rather than guess.
- The reader (`connection`) from the stages after it: a reader starved of CPU and a reader held by
  a channel's credit both stop reading the socket. No rule names `connection`.
- `channel` from `queue` with a single publisher to a classic queue nobody else feeds: the queue is
  inferred only from other publishers held back at the same time, from the queue's type (quorum,
  stream) or from persistence.
- A queue's type and durability are on the wire only when its `queue.declare` was captured; a
  queue declared before the capture started is of unknown type.
- Whether a message waited in the queue when a consumer freed a slot: the capture counts a queue's
  ready messages only when it saw the count set (`queue.declare-ok`, `queue.purge`) and holds every
  publisher and consumer of the queue since; otherwise a delivery within `refill_ms` of the ack
  stands for it, and a fast neighbour consumer taking every message can make a slow one look fed.
- An application that publishes at a pace of its own from one that could publish faster: a
  publisher whose broker takes everything at once looks the same whether its code sleeps or its
  demand is that rate, so no rule calls a paced publisher a bottleneck; a publisher waiting for
  each confirm is named, because it waits for the broker.
- A spurious retransmission the receiver does not D-SACK (an old stack, SACK off): it counts as
  lost unless the acknowledgement came before it.
- An alarm on a 0-9-1 client that did not announce the `connection.blocked` capability: RabbitMQ
  then just stops reading, which looks like credit flow.
"""


def render(rules: Sequence[BottleneckRule], scenarios: Sequence[ScenarioRow]) -> str:
    """The text of docs/DIAGNOSIS.md: ``rules`` (in their order) and the ``scenarios`` compared."""
    lines = [_INTRO, "## Components and effects", "", "| component | meaning |", "|---|---|"]
    lines += [f"| `{c}` | {_cell(COMPONENT_MEANINGS[c])} |" for c in COMPONENTS]
    lines += ["", "| effect | what it does to traffic |", "|---|---|"]
    lines += [f"| `{e}` | {_cell(EFFECT_MEANINGS[e])} |" for e in EFFECTS]
    lines += ["", _REASONING.rstrip(), ""]
    lines += _rules(rules)
    lines += [""] + _thresholds(rules)
    lines += [
        "",
        _TLS.rstrip(),
        _MID_STREAM.rstrip(),
        "",
        _CHECKED.rstrip(),
        "",
        "| scenario (`samples/bottlenecks/`) | built to be | broker's truth (`testbed/truth.py`) | diagnosis (the test asserts it) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {row.capture} | {row.built_to_be} | {row.truth} | {row.diagnosis} |" for row in scenarios]
    lines += ["", _BLIND.rstrip()]
    return "\n".join(lines) + "\n"
