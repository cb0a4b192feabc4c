"""Queue and exchange names from AMQP 1.0 addresses (pipelines/addresses.py), both RabbitMQ formats."""

from __future__ import annotations

import pyspark.sql.functions as F
import pytest

from amqpscope.pipelines.addresses import canonical_address, exchange_of_address, queue_of_address

CASES = [
    # address, queue, exchange, canonical
    ("/queues/orders", "orders", None, "/queues/orders"),
    ("/queues/a%2Fb%20c", "a/b c", None, "/queues/a/b c"),
    ("/queues/x+y", "x+y", None, "/queues/x+y"),
    ("/queue/orders", "orders", None, "/queues/orders"),
    ("/amq/queue/orders", "orders", None, "/queues/orders"),
    ("orders", "orders", None, "/queues/orders"),
    ("/exchanges/events/a/b", None, "events", "/exchanges/events/a/b"),
    ("/exchanges/ev%2Fx", None, "ev/x", "/exchanges/ev/x"),
    ("/exchange/events/key", None, "events", "/exchanges/events/key"),
    ("/exchange/events", None, "events", "/exchanges/events"),
    ("/topic/a.b", None, "amq.topic", "/exchanges/amq.topic/a.b"),
    ("/other/thing", None, None, "/other/thing"),
    ("", None, None, ""),
    (None, None, None, None),
]


@pytest.fixture(scope="module")
def named(spark):
    df = spark.createDataFrame([(c[0],) for c in CASES], "address string")
    address = F.col("address")
    rows = df.select(
        "address",
        queue_of_address(address).alias("queue"),
        exchange_of_address(address).alias("exchange"),
        canonical_address(address).alias("canonical"),
    ).collect()
    return [(r.address, r.queue, r.exchange, r.canonical) for r in rows]


def test_each_address_names_its_queue_and_exchange_in_both_formats(named):
    assert sorted(named, key=repr) == sorted(CASES, key=repr)
