"""Queue and exchange names from AMQP 1.0 addresses, so that one queue has one name in every table.

AMQP 0-9-1 names a queue (``queue.declare``, ``basic.consume``) and an exchange (``basic.publish``)
directly; an AMQP 1.0 link names them by address, and RabbitMQ has two address formats:

- v1 (the ``rabbitmq_amqp1_0`` plugin of RabbitMQ 3.x): ``/queue/Q``, ``/amq/queue/Q``,
  ``/exchange/X`` and ``/exchange/X/RK``, ``/topic/RK`` (the ``amq.topic`` exchange); an address
  without a leading ``/`` is a queue's name.
- v2 (RabbitMQ 4): ``/queues/Q``, ``/exchanges/X`` and ``/exchanges/X/RK``, each name
  percent-encoded (RFC 3986).

Sources: RabbitMQ's "AMQP 1.0" guide, section "Address" (v2 and v1 formats), and the
rabbitmq-amqp1.0 plugin README of RabbitMQ 3.x ("Routing and Addressing").

Every function takes a Spark column holding an address and returns a column: the queue (or
exchange) it names, or null when it names none.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

# Address prefixes that name a queue, and whether the name after them is percent-encoded.
_QUEUE_PREFIXES = (("/queues/", True), ("/amq/queue/", False), ("/queue/", False))
# Address prefixes that name an exchange (the exchange name ends at the next "/").
_EXCHANGE_PREFIXES = (("/exchanges/", True), ("/exchange/", False))
_TOPIC_PREFIX = "/topic/"
_TOPIC_EXCHANGE = "amq.topic"


def _after(address: Column, prefix: str) -> Column:
    return F.substring(address, len(prefix) + 1, 1 << 30)


def _decoded(name: Column, percent_encoded: bool) -> Column:
    # url_decode would also turn "+" into a space (form encoding): only "%XX" escapes are undone.
    if not percent_encoded:
        return name
    return F.when(name.contains("%"), F.url_decode(F.regexp_replace(name, r"\+", "%2B"))).otherwise(name)


def queue_of_address(address: Column) -> Column:
    """The queue a 1.0 address names (``/queues/q``, ``/queue/q``, ``/amq/queue/q`` or ``q``), else null."""
    named: Column = F.when(~address.startswith("/"), address)
    for prefix, encoded in _QUEUE_PREFIXES:
        named = named.when(address.startswith(prefix), _decoded(_after(address, prefix), encoded))
    return F.when(address.isNotNull() & (address != ""), named)


def exchange_of_address(address: Column) -> Column:
    """The exchange a 1.0 address names (``/exchanges/x[/rk]``, ``/exchange/x[/rk]``; ``/topic/rk``
    is ``amq.topic``), else null."""
    named: Column = F.when(address.startswith(_TOPIC_PREFIX), F.lit(_TOPIC_EXCHANGE))
    for prefix, encoded in _EXCHANGE_PREFIXES:
        named = named.when(
            address.startswith(prefix), _decoded(F.substring_index(_after(address, prefix), "/", 1), encoded)
        )
    return named


def queue_address(queue: Column) -> Column:
    """The one address amqpscope shows for a queue, whichever protocol named it: ``/queues/<name>``."""
    return F.concat(F.lit(_QUEUE_PREFIXES[0][0]), queue)


def canonical_address(address: Column) -> Column:
    """A 1.0 address (or a 0-9-1 ``/queues/q`` / ``/exchanges/x/rk`` name) in the one form shown for
    it: every queue address as ``/queues/<name>``, every exchange address as ``/exchanges/<name>``
    with its routing key, others unchanged."""
    queue = queue_of_address(address)
    exchange = exchange_of_address(address)
    after_exchange = F.coalesce(
        F.when(address.startswith("/exchanges/"), _after(address, "/exchanges/")), _after(address, "/exchange/")
    )
    routing_key = F.regexp_extract(after_exchange, r"^[^/]*(/.*)$", 1)  # "/rk", or "" when there is none
    return (
        F.when(queue.isNotNull(), queue_address(queue))
        .when(
            address.startswith(_TOPIC_PREFIX),
            F.concat(F.lit(f"/exchanges/{_TOPIC_EXCHANGE}/"), _after(address, _TOPIC_PREFIX)),
        )
        .when(exchange.isNotNull(), F.concat(F.lit("/exchanges/"), exchange, routing_key))
        .otherwise(address)
    )
